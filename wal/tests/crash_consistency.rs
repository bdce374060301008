//! A power cut at any point must never lose an entry whose sync completed,
//! and never invent one: after recovery the log is a prefix of what was
//! decided, in decision order, holding every acknowledged entry.
//!
//! Writers on several threads append while the simulated disk loses power
//! at a random mutating call; unsynced writes are dropped or torn sector by
//! sector. The page cache outlives a killed process, so only this kind of
//! test catches a missing fsync.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use fencelog_wal::{CrashMode, SimStorage, Storage, WalOptions};
use parking_lot::Mutex;
use proptest::prelude::*;

fn mode_strategy() -> impl Strategy<Value = CrashMode> {
    prop_oneof![
        Just(CrashMode::LoseUnsynced),
        Just(CrashMode::ProcessCrash),
        Just(CrashMode::LastWriteOnly),
        any::<u64>().prop_map(|seed| CrashMode::Torn { seed }),
        any::<u64>().prop_map(|seed| CrashMode::TornSequence { seed }),
    ]
}

struct Outcome {
    /// Every record the log decided on: lsn -> payload.
    decided: BTreeMap<u64, Vec<u8>>,
    /// LSNs whose ticket resolved Ok before the power went.
    acked: Vec<u64>,
}

fn write_until_cut(
    wal: &fencelog_wal::Wal<Counter>,
    threads: u32,
    per_thread: u32,
    max_len: usize,
) -> Outcome {
    let decided = Mutex::new(BTreeMap::new());
    let acked = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let decided = &decided;
            let acked = &acked;
            s.spawn(move || {
                for n in 0..per_thread {
                    let p = payload(t, n, (n as usize * 31 + t as usize * 7) % (max_len + 1));
                    let submitted = wal.submit(|w| {
                        let at = w.append(p.len(), |buf| buf.copy_from_slice(&p))?;
                        w.state().records += 1;
                        // Inside the serialized section: this is decision order.
                        decided.lock().insert(at.lsn, p.clone());
                        Ok::<_, fencelog_wal::WalError>((at, w.ticket()))
                    });
                    let Ok(Ok((at, ticket))) = submitted else {
                        return;
                    };
                    if ticket.wait().is_err() {
                        return;
                    }
                    acked.lock().push(at.lsn);
                }
            });
        }
    });
    Outcome {
        decided: decided.into_inner(),
        acked: acked.into_inner(),
    }
}

/// Recovers `image` and checks the prefix property; answers the number of
/// records recovered.
fn check_recovered(image: &SimStorage, dir: &Path, opts: &WalOptions, outcome: &Outcome) -> usize {
    let fork = image.fork();
    let storage: Arc<dyn Storage> = Arc::new(image.clone());
    let (wal, report) = open(&storage, dir, opts)
        .unwrap_or_else(|e| panic!("a power cut must never leave an unopenable log: {e}"));
    let counted = wal.with_state(|c| c.records);
    wal.close().unwrap();

    let records = all_records(storage.as_ref(), dir);
    assert_eq!(
        counted,
        records.len() as u64,
        "the state rebuilt from the checkpoint disagrees with the log ({report:?})"
    );
    let recovered: BTreeMap<u64, &Vec<u8>> = records.iter().map(|(l, p)| (*l, p)).collect();
    for (lsn, bytes) in &recovered {
        let decided = outcome
            .decided
            .get(lsn)
            .unwrap_or_else(|| panic!("recovered LSN {lsn} was never decided: invented"));
        assert_eq!(decided, *bytes, "LSN {lsn} came back with other bytes");
    }
    // A prefix: no decided record below the last recovered one is missing.
    if let Some((&last, _)) = recovered.iter().next_back() {
        for lsn in outcome.decided.range(..=last).map(|(l, _)| l) {
            assert!(
                recovered.contains_key(lsn),
                "hole at LSN {lsn} below {last}"
            );
        }
    }
    for lsn in &outcome.acked {
        assert!(
            recovered.contains_key(lsn),
            "acknowledged LSN {lsn} was lost ({report:?})"
        );
    }

    // What recovery accepted must be durable once open returns, even if it
    // was only in the page cache (a killed process): cut the power on a copy
    // right after open and look again. Entries acknowledged after the open
    // must survive that cut too: they may land in a segment whose name only
    // the page cache held (created just before the kill).
    let storage: Arc<dyn Storage> = Arc::new(fork.clone());
    let (wal, _) = open(&storage, dir, opts).unwrap();
    let mut want = records.clone();
    for n in 0..3 {
        let p = payload(77, n, 40);
        let at = append_durable(&wal, &p).unwrap();
        want.push((at.lsn, p));
    }
    let after_cut = fork.cut_power(CrashMode::LoseUnsynced);
    drop(wal);
    let again = all_records(&after_cut, dir);
    assert_eq!(
        again, want,
        "recovery built on entries or names it had not made durable"
    );
    records.len()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), ..ProptestConfig::default() })]

    #[test]
    fn power_cut_at_any_point_keeps_every_synced_entry(
        threads in 1u32..5,
        per_thread in 1u32..80,
        max_len in 0usize..600,
        cut_after in 0u64..400,
        mode in mode_strategy(),
        tiny_batches in any::<bool>(),
    ) {
        let sim = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let dir = Path::new("/db");
        let mut opts = small_opts();
        if tiny_batches {
            opts.max_batch_bytes = 1;
        }
        let (wal, _) = open(&storage, dir, &opts).unwrap();
        sim.cut_power_after(cut_after, mode);
        let outcome = write_until_cut(&wal, threads, per_thread, max_len);
        let image = match sim.image() {
            Some(image) => image,
            None => sim.cut_power(mode),
        };
        drop(wal);
        check_recovered(&image, dir, &opts, &outcome);

        // The recovered log takes new writes, and a second recovery keeps them.
        let storage: Arc<dyn Storage> = Arc::new(image.clone());
        let (wal, _) = open(&storage, dir, &opts).unwrap();
        let before = wal.with_state(|c| c.records);
        let mut more = Vec::new();
        for n in 0..20 {
            let p = payload(99, n, 100);
            let (at, t) = append(&wal, &p).unwrap();
            t.wait().unwrap();
            more.push((at.lsn, p));
        }
        drop(wal);
        let after = image.cut_power(CrashMode::LoseUnsynced);
        let (wal, _) = open(&(Arc::new(after.clone()) as Arc<dyn Storage>), dir, &opts).unwrap();
        prop_assert_eq!(wal.with_state(|c| c.records), before + 20);
        drop(wal);
        let records = all_records(&after, dir);
        prop_assert_eq!(&records[records.len() - 20..], &more[..]);
    }

    #[test]
    fn power_cut_during_open_leaves_an_openable_log(
        cut_after in 0u64..12,
        mode in mode_strategy(),
    ) {
        let sim = SimStorage::new();
        sim.cut_power_after(cut_after, mode);
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let dir = Path::new("/db");
        let opened = open(&storage, dir, &small_opts());
        let image = match sim.image() {
            Some(image) => image,
            None => {
                prop_assert!(opened.is_ok());
                sim.cut_power(mode)
            }
        };
        drop(opened);
        let empty = Outcome { decided: BTreeMap::new(), acked: Vec::new() };
        prop_assert_eq!(check_recovered(&image, dir, &small_opts(), &empty), 0);
    }
}

#[test]
fn repeated_cuts_and_recoveries_never_lose_acknowledged_entries() {
    let dir = Path::new("/db");
    let opts = small_opts();
    let mut image = SimStorage::new();
    let mut acked_payloads: Vec<(u64, Vec<u8>)> = Vec::new();
    for round in 0..40u32 {
        let storage: Arc<dyn Storage> = Arc::new(image.clone());
        let (wal, _) = open(&storage, dir, &opts).unwrap();
        image.cut_power_after(
            u64::from(round * 7 % 53),
            CrashMode::Torn {
                seed: u64::from(round),
            },
        );
        let outcome = write_until_cut(&wal, 3, 40, 300);
        for lsn in &outcome.acked {
            acked_payloads.push((*lsn, outcome.decided[lsn].clone()));
        }
        let next = image
            .image()
            .unwrap_or_else(|| image.cut_power(CrashMode::LoseUnsynced));
        drop(wal);
        image = next;
        let storage: Arc<dyn Storage> = Arc::new(image.clone());
        drop(open(&storage, dir, &opts).unwrap());
        let records: BTreeMap<u64, Vec<u8>> = all_records(&image, dir).into_iter().collect();
        for (lsn, p) in &acked_payloads {
            assert_eq!(records.get(lsn), Some(p), "round {round}: LSN {lsn} lost");
        }
    }
}

/// One writer makes the sequence of file operations deterministic, so the
/// power can be cut at every single one of them in turn, with several tear
/// patterns each: no crash point of a seal, a segment creation or a batch
/// is left untried.
#[test]
fn power_cut_at_every_operation_of_a_run() {
    let dir = Path::new("/db");
    let opts = small_opts();
    let run = |cut: Option<(u64, CrashMode)>| {
        let sim = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let (wal, _) = open(&storage, dir, &opts).unwrap();
        let start = sim.faults().writes() + sim.faults().syncs();
        if let Some((n, mode)) = cut {
            sim.cut_power_after(n, mode);
        }
        let outcome = write_until_cut(&wal, 1, 120, 1800);
        let ops = sim.faults().writes() + sim.faults().syncs() - start;
        let image = sim.image();
        drop(wal);
        (sim, image, outcome, ops)
    };
    let (_, _, full, _) = run(None);
    assert_eq!(full.acked.len(), 120);
    // Count every mutating call of the run (writes, syncs, creations, …) by
    // cutting later and later until the run completes untouched.
    let mut cut = 0;
    loop {
        let mut tried_any = false;
        for variant in 0..7 {
            let mode = match variant {
                0 => CrashMode::LoseUnsynced,
                1 => CrashMode::LastWriteOnly,
                2 => CrashMode::ProcessCrash,
                3 => CrashMode::TornSequence { seed: cut },
                // Somewhere inside the batch's write (entries are 8-aligned,
                // the prime makes the byte wander across their headers).
                4 => CrashMode::Prefix {
                    bytes: cut * 37 % 1801,
                },
                _ => CrashMode::Torn {
                    seed: cut * 31 + variant,
                },
            };
            let (_, image, outcome, _) = run(Some((cut, mode)));
            let Some(image) = image else {
                continue;
            };
            tried_any = true;
            check_recovered(&image, dir, &opts, &outcome);
        }
        if !tried_any {
            break;
        }
        cut += 1;
    }
    assert!(cut > 250, "only {cut} crash points were tried");
}

/// The segment allocator works in the background while the sync thread
/// rotates: whichever creates the next segment, it must be created once.
/// (A request left pending once made the allocator rename an empty file
/// over a live segment, dropping acknowledged entries without an error.)
/// Entries of half a segment make every rotation follow right after the
/// allocator was asked for the next one.
#[test]
fn the_allocator_never_replaces_a_live_segment() {
    let dir = Path::new("/db");
    let opts = small_opts();
    for round in 0..60u32 {
        let sim = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let (wal, _) = open(&storage, dir, &opts).unwrap();
        let outcome = write_until_cut(&wal, 2, 12, 15_000 + (round as usize % 7) * 100);
        assert_eq!(outcome.acked.len(), 24);
        let image = sim.cut_power(CrashMode::LoseUnsynced);
        drop(wal);
        check_recovered(&image, dir, &opts, &outcome);
    }
}

/// Without a sync per batch (a replica's state machine: its Raft log is the
/// durable copy), batches are written one after another with no
/// `fdatasync` between them, and a power cut can keep a later write while
/// losing an earlier one. Such a log must always open: what follows the
/// last sync that really completed is a torn tail, cut, never refused.
/// (Every flush used to begin a new sync epoch, so a surviving later write
/// "proved" the lost earlier one synced and open refused, as a replica did
/// after LazyFS `torn-seq`.) What `sync_all` made durable survives, and
/// what comes back is a prefix of what was decided.
#[test]
fn without_a_sync_per_batch_a_power_cut_at_every_operation_opens() {
    let dir = Path::new("/db");
    let mut opts = small_opts();
    opts.sync_every_batch = false;
    let mut cut = 0;
    loop {
        let sim = SimStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(sim.clone());
        let (wal, _) = open(&storage, dir, &opts).unwrap();
        sim.cut_power_after(cut, CrashMode::ProcessCrash);
        let first = write_until_cut(&wal, 1, 40, 1800);
        let synced = if first.acked.len() == 40 && wal.sync_all().is_ok() {
            first.acked.last().copied().unwrap_or(0)
        } else {
            0
        };
        let second = write_until_cut(&wal, 1, 40, 1800);
        let Some(image) = sim.image() else {
            assert_eq!(second.acked.len(), 40);
            break;
        };
        drop(wal);
        let mut decided = first.decided;
        decided.extend(second.decided);
        let mut modes = vec![
            CrashMode::ProcessCrash,
            CrashMode::LoseUnsynced,
            CrashMode::LastWriteOnly,
        ];
        for seed in 0..4 {
            modes.push(CrashMode::Torn { seed });
            modes.push(CrashMode::TornSequence { seed });
        }
        let unsynced = image.unsynced_bytes();
        modes.extend(
            (0..=unsynced)
                .step_by(1000)
                .map(|bytes| CrashMode::Prefix { bytes }),
        );
        for mode in modes {
            let after = image.cut_power(mode);
            let storage: Arc<dyn Storage> = Arc::new(after.clone());
            let (wal, report) = open(&storage, dir, &opts).unwrap_or_else(|e| {
                panic!("cut at operation {cut}, {mode:?}: a log without a sync per batch refused to open: {e}")
            });
            assert!(report.floor_raised.is_none(), "{report:?}");
            wal.close().unwrap();
            let records = all_records(&after, dir);
            for (i, (lsn, bytes)) in records.iter().enumerate() {
                assert_eq!(
                    decided.get(lsn),
                    Some(bytes),
                    "cut {cut}, {mode:?}: LSN {lsn}"
                );
                if let Some(&(prev, _)) = i.checked_sub(1).and_then(|p| records.get(p)) {
                    assert!(prev < *lsn);
                }
            }
            let last = records.last().map_or(0, |r| r.0);
            for lsn in decided.range(..=last).map(|(l, _)| l) {
                assert!(
                    records.iter().any(|r| r.0 == *lsn),
                    "cut {cut}, {mode:?}: hole at LSN {lsn} below {last}"
                );
            }
            assert!(
                last >= synced,
                "cut {cut}, {mode:?}: synced LSN {synced} lost"
            );
        }
        cut += 1;
    }
    assert!(cut > 40, "only {cut} crash points were tried");
}
