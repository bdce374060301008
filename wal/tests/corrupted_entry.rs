//! Damage at rest (a flipped bit anywhere in any segment) must be detected,
//! never answered as data, and classified: damage to what was acknowledged
//! is corruption (open refuses and names the file and byte), while damage
//! confined to the last sync epoch is indistinguishable from a torn write
//! and is cut as a torn tail, which the recovery report states.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use common::*;
use fencelog_wal::{Appended, CutKind, RecoveryMode, SimStorage, Storage, WalError, format};
use proptest::prelude::*;

const DIR: &str = "/db";

struct Base {
    image: SimStorage,
    /// Every record, each synced on its own (one epoch per record).
    records: Vec<(Appended, Vec<u8>)>,
    /// (segment, file length, end of entries, footer end if sealed)
    layout: Vec<(u64, u64, u64, Option<u64>)>,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let image = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(image.clone());
        let (wal, _) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
        let mut records = Vec::new();
        // Enough segments that the oldest lie before the newest checkpoint
        // (the test log writes one every third segment): open does not read
        // them.
        for n in 0..1200u32 {
            let p = payload(1, n, 50 + (n as usize * 13) % 400);
            let (at, t) = append(&wal, &p).unwrap();
            t.wait().unwrap();
            records.push((at, p));
        }
        let mut layout = Vec::new();
        for seq in wal.segments() {
            let path = seg_path(seq);
            let len = image.contents(&path).unwrap().len() as u64;
            let entries_end = records
                .iter()
                .filter(|(a, _)| a.segment == seq)
                .map(|(a, p)| a.position + format::entry_len(p.len()))
                .max()
                .unwrap_or(format::HEADER_LEN);
            let footer_end = wal
                .footer(seq)
                .unwrap()
                .map(|f| entries_end + (format::FOOTER_HEADER_LEN + f.len()) as u64);
            layout.push((seq, len, entries_end, footer_end));
        }
        wal.close().unwrap();
        Base {
            image,
            records,
            layout,
        }
    })
}

fn seg_path(seq: u64) -> PathBuf {
    Path::new(DIR).join(format::segment_file_name(seq))
}

fn flipped(file: &Path, pos: u64, bit: u8) -> Arc<dyn Storage> {
    let fork = base().image.fork();
    fork.flip_bit(file, pos, bit).unwrap();
    Arc::new(fork)
}

/// Whether byte `pos` of segment `seq` is one that carries meaning: header,
/// entries, footer, trailer (not zeros after the tail or the gap before a
/// trailer, which nothing reads).
fn meaningful(seq: u64, pos: u64) -> bool {
    let &(_, len, entries_end, footer_end) = base().layout.iter().find(|l| l.0 == seq).unwrap();
    match footer_end {
        Some(f) => pos < f || pos >= len - format::TRAILER_LEN,
        None => pos < entries_end,
    }
}

#[test]
fn damage_in_the_middle_of_the_tail_is_corruption_naming_file_and_byte() {
    let b = base();
    let last_seg = b.records.last().unwrap().0.segment;
    let in_tail: Vec<_> = b
        .records
        .iter()
        .filter(|(a, _)| a.segment == last_seg)
        .collect();
    assert!(in_tail.len() > 3, "the tail segment holds a few records");
    let (victim, _) = in_tail[in_tail.len() / 2];
    let storage = flipped(&seg_path(last_seg), victim.position + 30, 3);
    match open(&storage, Path::new(DIR), &small_opts()) {
        Err(WalError::Corrupt {
            file,
            position,
            reason,
        }) => {
            assert_eq!(file, seg_path(last_seg));
            assert_eq!(position, victim.position, "{reason}");
            assert!(reason.contains("later sync"), "{reason}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("damage to an acknowledged entry was not refused"),
    }
    // An explicit salvage keeps the prefix, sets the damaged file aside and
    // says so.
    let mut opts = small_opts();
    opts.recovery = RecoveryMode::Salvage;
    let (wal, report) = open(&storage, Path::new(DIR), &opts).unwrap();
    let cut = report.cut.expect("salvage reports its cut");
    assert_eq!(cut.kind, CutKind::Salvaged);
    assert_eq!(cut.position, victim.position);
    assert!(!cut.moved_aside.is_empty());
    for (a, p) in &b.records {
        let read = wal.read_entry(a.segment, a.position);
        if a.lsn < victim.lsn {
            assert_eq!(&read.unwrap().payload[..], &p[..]);
        }
    }
    wal.with_state(|c| {
        assert_eq!(
            c.records,
            (b.records.iter().filter(|(a, _)| a.lsn < victim.lsn).count()) as u64
        )
    });
}

#[test]
fn damage_to_the_last_epoch_is_a_torn_tail_and_is_reported() {
    let b = base();
    let (last, _) = b.records.last().unwrap();
    let storage = flipped(&seg_path(last.segment), last.position + 40, 0);
    let (wal, report) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
    let cut = report.cut.expect("the cut is reported");
    assert_eq!(cut.kind, CutKind::TornTail);
    assert_eq!(cut.position, last.position);
    wal.with_state(|c| assert_eq!(c.records, b.records.len() as u64 - 1));
    // AbsoluteConsistency refuses even that.
    drop(wal);
    let storage = flipped(&seg_path(last.segment), last.position + 40, 0);
    let mut opts = small_opts();
    opts.recovery = RecoveryMode::AbsoluteConsistency;
    assert!(matches!(
        open(&storage, Path::new(DIR), &opts),
        Err(WalError::Corrupt { .. })
    ));
}

#[test]
fn damage_in_a_sealed_segment_fails_its_reads_and_verify() {
    let b = base();
    let first_seg = b.records[0].0.segment;
    let (victim, _) = &b.records[5];
    assert_eq!(victim.segment, first_seg);
    let storage = flipped(&seg_path(first_seg), victim.position + 25, 6);
    // Open reads only the tail, so it succeeds…
    let (wal, _) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
    // …but the damaged entry is never answered as data.
    assert!(wal.read_entry(victim.segment, victim.position).is_err());
    let (other, p) = &b.records[6];
    assert_eq!(
        &wal.read_entry(other.segment, other.position)
            .unwrap()
            .payload[..],
        &p[..]
    );
    drop(wal);
    let report = fencelog_wal::verify(storage.as_ref(), Path::new(DIR), |_| {}, |_, _| {}).unwrap();
    let seg = report.segments.iter().find(|s| s.seq == first_seg).unwrap();
    assert_eq!(seg.damage.as_ref().map(|d| d.0), Some(victim.position));
}

#[test]
fn damage_to_a_footer_or_trailer_is_detected() {
    let b = base();
    let &(seq, len, _, footer_end) = &b.layout[0];
    let footer_end = footer_end.expect("the first segment is sealed");
    for pos in [footer_end - 3, len - 5] {
        let storage = flipped(&seg_path(seq), pos, 1);
        let (wal, _) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
        let (first, _) = &b.records[0];
        assert!(matches!(
            wal.read_entry(first.segment, first.position),
            Err(WalError::Corrupt { .. })
        ));
        drop(wal);
        let report =
            fencelog_wal::verify(storage.as_ref(), Path::new(DIR), |_| {}, |_, _| {}).unwrap();
        assert!(
            report.is_damaged(),
            "flip at {pos} went unnoticed by verify"
        );
    }
}

#[test]
fn salvage_sets_aside_an_unreadable_segment_and_says_so() {
    let b = base();
    let last = b.records.last().unwrap().0.segment;
    // Damage the header of the segment the log ends in: nothing in it can
    // be read any more.
    let storage = flipped(&seg_path(last), 20, 2);
    assert!(open(&storage, Path::new(DIR), &small_opts()).is_err());
    let mut opts = small_opts();
    opts.recovery = RecoveryMode::Salvage;
    let (wal, report) = open(&storage, Path::new(DIR), &opts).unwrap();
    let cut = report.cut.expect("what salvage dropped is reported");
    assert_eq!(cut.kind, CutKind::Salvaged);
    assert!(cut.moved_aside.iter().any(|p| {
        p.to_string_lossy()
            .contains(&format::segment_file_name(last))
    }));
    // What precedes the damaged segment is intact.
    for (a, p) in b.records.iter().filter(|(a, _)| a.segment < last) {
        assert_eq!(
            &wal.read_entry(a.segment, a.position).unwrap().payload[..],
            &p[..]
        );
    }
}

#[test]
fn salvage_of_a_log_whose_only_segment_is_unreadable_opens_empty() {
    let image = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(image.clone());
    let (wal, _) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
    let (_, t) = append(&wal, b"one").unwrap();
    t.wait().unwrap();
    wal.close().unwrap();
    image.flip_bit(&seg_path(1), 3, 0).unwrap();
    let mut opts = small_opts();
    opts.recovery = RecoveryMode::Salvage;
    let (wal, report) = open(&storage, Path::new(DIR), &opts).unwrap();
    assert_eq!(report.cut.map(|c| c.kind), Some(CutKind::Salvaged));
    wal.with_state(|c| assert_eq!(c.records, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(256), ..ProptestConfig::default() })]

    /// Whatever bit flips, no read answers wrong bytes; and a flip in any
    /// byte that carries meaning is noticed by open, a read, or verify.
    #[test]
    fn a_flipped_bit_anywhere_is_never_answered_as_data(
        seg_pick in any::<prop::sample::Index>(),
        pos_frac in 0.0f64..1.0,
        bit in 0u8..8,
    ) {
        let b = base();
        let &(seq, len, _, _) = seg_pick.get(&b.layout);
        let pos = ((len as f64) * pos_frac) as u64;
        let storage = flipped(&seg_path(seq), pos, bit);
        let mut noticed = false;
        match open(&storage, Path::new(DIR), &small_opts()) {
            Err(e) => {
                prop_assert!(e.is_corruption(), "unexpected error {e}");
                noticed = true;
            }
            Ok((wal, report)) => {
                noticed |= report.cut.is_some();
                for (a, p) in &b.records {
                    match wal.read_entry(a.segment, a.position) {
                        Ok(e) => prop_assert_eq!(&e.payload[..], &p[..]),
                        Err(_) => noticed = true,
                    }
                }
                drop(wal);
                // Refusing to verify at all (a flipped version field reads as
                // an unknown format version) notices the flip too.
                match fencelog_wal::verify(storage.as_ref(), Path::new(DIR), |_| {}, |_, _| {}) {
                    Ok(report) => {
                        noticed |= report.is_damaged()
                            || report.segments.iter().any(|s| s.torn_tail_at.is_some());
                    }
                    Err(_) => noticed = true,
                }
            }
        }
        if meaningful(seq, pos) {
            prop_assert!(noticed, "a flip of bit {bit} at byte {pos} of segment {seq} went unnoticed");
        }
    }
}

/// Builds a segment by hand: a header, then entries of (lsn, epoch's first
/// lsn, kind, payload).
fn segment(seq: u64, entries: &[(u64, u64, format::EntryKind, &[u8])]) -> Vec<u8> {
    let mut b = format::encode_header(seq).to_vec();
    for &(lsn, epoch, kind, payload) in entries {
        let at = b.len();
        b.resize(at + format::entry_len(payload.len()) as usize, 0);
        b[at + format::ENTRY_HEADER_LEN..at + format::ENTRY_HEADER_LEN + payload.len()]
            .copy_from_slice(payload);
        let (h, p) = b[at..].split_at_mut(format::ENTRY_HEADER_LEN);
        format::encode_entry_header(h, seq, lsn, epoch, kind, &p[..payload.len()]);
    }
    b.resize(64 << 10, 0);
    b
}

fn write_log(files: &[(u64, Vec<u8>)]) -> Arc<dyn Storage> {
    let sim = SimStorage::new();
    sim.create_dir_all(Path::new(DIR)).unwrap();
    for (seq, bytes) in files {
        let f = sim.create_new(&seg_path(*seq)).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.sync_data().unwrap();
    }
    sim.sync_dir(Path::new(DIR)).unwrap();
    Arc::new(sim)
}

const CKPT: format::EntryKind = format::EntryKind::Checkpoint;
const REC: format::EntryKind = format::EntryKind::Record;
const ZERO: &[u8] = &[0; 8];

/// Found by the fuzzer: entries of the damaged entry's own epoch right
/// after it must not hide an entry of a later epoch further on, which proves
/// the damaged epoch was synced (acknowledged).
#[test]
fn a_later_epoch_behind_same_epoch_entries_is_still_corruption() {
    let mut seg = segment(
        1,
        &[
            (1, 1, CKPT, ZERO),
            (2, 1, REC, b"two"),
            (3, 1, REC, b"three"),
            (4, 1, REC, b"four"),
            (5, 5, REC, b"five, synced after the others"),
        ],
    );
    let lsn2 = (format::HEADER_LEN + format::entry_len(8)) as usize;
    seg[lsn2 + format::ENTRY_HEADER_LEN] ^= 1;
    let storage = write_log(&[(1, seg)]);
    match open(&storage, Path::new(DIR), &small_opts()) {
        Err(WalError::Corrupt { position, .. }) => assert_eq!(position, lsn2 as u64),
        Err(e) => panic!("wrong error {e}"),
        Ok((_, report)) => panic!("acknowledged damage cut as {:?}", report.cut),
    }
}

#[test]
fn a_valid_entry_in_a_later_segment_proves_the_damage_was_acknowledged() {
    let mut one = segment(
        1,
        &[
            (1, 1, CKPT, ZERO),
            (2, 1, REC, b"two"),
            (3, 1, REC, b"three"),
        ],
    );
    let lsn2 = (format::HEADER_LEN + format::entry_len(8)) as usize;
    one[lsn2 + format::ENTRY_HEADER_LEN] ^= 1;
    // Segment 2's checkpoint is damaged too, so replay starts at segment 1.
    let mut two = segment(2, &[(4, 4, CKPT, ZERO), (5, 4, REC, b"five")]);
    two[format::HEADER_LEN as usize + format::ENTRY_HEADER_LEN] ^= 1;
    let storage = write_log(&[(1, one), (2, two)]);
    assert!(matches!(
        open(&storage, Path::new(DIR), &small_opts()),
        Err(WalError::Corrupt { .. })
    ));
}

/// Found by the fuzzer (issue 11: `AAAAAAACABABAQEBAAAAAAMA/3RlcgE=` fed to
/// `segment_recover`): segment 1 holds one record and no checkpoint,
/// segment 2 a checkpoint and a trailer pointing beside its footer.
/// Salvage used to set segment 2 aside before looking at the rest, then
/// called what stopped in segment 1 a harmless torn tail, left segment 2
/// out of its report and sealed over segment 1 without a copy. Now: the
/// unreadable later segment makes it damage, the report names every file
/// set aside, and the damaged segment is kept before anything is removed.
#[test]
fn salvage_classifies_before_setting_aside_and_names_every_file() {
    let one = segment(1, &[(1, 1, REC, &[1])]);
    let mut two = segment(2, &[(2, 2, CKPT, &[0, 255, 116])]);
    // A footer, then a trailer that points 8 bytes past it.
    let entries_end = format::HEADER_LEN as usize + format::entry_len(3) as usize;
    let footer = format::encode_footer(2, 2, 2, b"footer of segment 2").unwrap();
    two[entries_end..entries_end + footer.len()].copy_from_slice(&footer);
    let trailer = format::encode_trailer(
        2,
        format::Trailer {
            footer_pos: entries_end as u64 + 8,
            footer_len: footer.len() as u32,
        },
    );
    let len = two.len();
    two[len - 32..].copy_from_slice(&trailer);
    let storage = write_log(&[(1, one.clone()), (2, two.clone())]);
    // Damage to what was acknowledged: refused by the ordinary modes.
    for mode in [
        RecoveryMode::AbsoluteConsistency,
        RecoveryMode::TolerateTornTail,
    ] {
        let mut opts = small_opts();
        opts.recovery = mode;
        assert!(
            matches!(open(&storage, Path::new(DIR), &opts), Err(e) if e.is_corruption()),
            "{mode:?} opened a log whose later segment is unreadable"
        );
    }
    // The plan says what salvage will do, and changes nothing.
    let mut opts = small_opts();
    opts.recovery = RecoveryMode::Salvage;
    let plan = fencelog_wal::plan_recovery(storage.as_ref(), Path::new(DIR), &opts).unwrap();
    let planned = plan.cut.expect("the plan names a cut");
    assert_eq!(planned.kind, CutKind::Salvaged);
    assert!(storage.open(&seg_path(2)).is_ok(), "planning moved a file");
    let (_wal, report) = open(&storage, Path::new(DIR), &opts).unwrap();
    let cut = report.cut.expect("salvage reports its cut");
    assert_eq!(cut.kind, CutKind::Salvaged, "{cut:?}");
    for seq in [1, 2] {
        let aside = PathBuf::from(format!("{}.damaged", seg_path(seq).display()));
        assert!(
            cut.moved_aside.contains(&aside),
            "segment {seq} is not among what was set aside: {cut:?}"
        );
        assert!(
            storage.open(&aside).is_ok(),
            "{} is missing",
            aside.display()
        );
    }
    assert_eq!(
        cut.moved_aside, planned.moved_aside,
        "the plan and the deed differ"
    );
    // Every byte of both files is kept.
    let sim = storage
        .open(&PathBuf::from(format!("{}.damaged", seg_path(1).display())))
        .unwrap();
    let mut kept = vec![0u8; one.len()];
    sim.read_exact_at(&mut kept, 0).unwrap();
    assert_eq!(kept, one);
}

/// Without a sync per batch (a replica), only a completed `sync_all`
/// starts an epoch: damage before it, with entries of a later epoch after
/// it, is still proven acknowledged and refused; damage among batches
/// written after the last sync is a torn tail, cut. (Every batch used to
/// start an epoch, so an unsynced later batch "proved" an earlier one.)
#[test]
fn without_a_sync_per_batch_only_a_completed_sync_proves_an_epoch() {
    let mut opts = small_opts();
    opts.sync_every_batch = false;
    let image = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(image.clone());
    let (wal, _) = open(&storage, Path::new(DIR), &opts).unwrap();
    let mut written = Vec::new();
    let write = |n: u32, written: &mut Vec<Appended>| {
        for i in 0..n {
            let p = payload(7, i, 100);
            let (at, t) = append(&wal, &p).unwrap();
            t.wait().unwrap();
            written.push(at);
        }
    };
    write(10, &mut written);
    wal.sync_all().unwrap();
    write(10, &mut written);
    wal.sync_all().unwrap();
    // Batches written after the last sync: one epoch, however many.
    write(10, &mut written);
    let (synced_early, unsynced, later) = (written[4], written[24], written[28]);
    // Closing makes everything durable but starts no epoch in what was
    // written: the image holds what a power cut could have kept (a later
    // batch, and perhaps not an earlier one).
    drop(wal);
    assert!(later.segment == unsynced.segment && later.position > unsynced.position);

    let damaged = image.fork();
    damaged
        .flip_bit(
            &seg_path(synced_early.segment),
            synced_early.position + 30,
            1,
        )
        .unwrap();
    let storage: Arc<dyn Storage> = Arc::new(damaged);
    match open(&storage, Path::new(DIR), &opts) {
        Err(e) => assert!(e.is_corruption(), "{e}"),
        Ok(_) => panic!("damage before a completed sync, with a later epoch after it, was cut"),
    }

    let torn = image.fork();
    torn.flip_bit(&seg_path(unsynced.segment), unsynced.position + 30, 1)
        .unwrap();
    let storage: Arc<dyn Storage> = Arc::new(torn);
    let (wal, report) = open(&storage, Path::new(DIR), &opts)
        .unwrap_or_else(|e| panic!("batches after the last sync were refused: {e}"));
    let cut = report.cut.expect("the torn tail is reported");
    assert_eq!(cut.kind, CutKind::TornTail);
    assert_eq!(cut.position, unsynced.position);
    assert!(report.floor_raised.is_none());
    drop(wal);
}
