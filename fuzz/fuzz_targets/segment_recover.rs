//! Recovery of a log directory built from the fuzz input.
//!
//! The input is a little program (see [`Builder`]) that writes one to three
//! segment files: each may open with a valid segment header and holds a mix
//! of valid entries (encoded with `format::encode_entry_header`, so that
//! recovery gets past the checksums), raw bytes, zeros, footers and
//! trailers, bit flips and truncations. All-zero bytes already describe a
//! valid log (one segment, a checkpoint, then records), so the fuzzer starts
//! deep and mutates from there. The files are written to an in-memory
//! `SimStorage` and made durable, then:
//!
//! - `verify` runs over the directory;
//! - `Wal::open` runs in each `RecoveryMode` on its own fork of the storage.
//!
//! Nothing may panic, and errors are fine, but when an open succeeds:
//!
//! - replay hands over consecutive LSNs ending just below the next LSN;
//! - one appended record becomes durable and reads back;
//! - after the log is dropped (or, chosen by the input, after a power cut
//!   that loses everything unsynced), reopening in the same mode succeeds
//!   and replays more records than before, the new one included;
//! - the modes are ordered: what `AbsoluteConsistency` opens,
//!   `TolerateTornTail` opens the same way, and what `TolerateTornTail`
//!   opens, `Salvage` opens the same way (they differ only in which damage
//!   they refuse).
//!
//! Set `FENCELOG_FUZZ_STATS=1` and run the target on a corpus with
//! `-runs=0` to print, per input, what each mode opened; set
//! `FENCELOG_FUZZ_DUMP=1` to print the segment files an input builds (hex).

#![no_main]

use std::path::Path;
use std::sync::Arc;

use fencelog_wal::format::{self, ENTRY_HEADER_LEN, EntryKind, HEADER_LEN, Probe};
use fencelog_wal::{
    CrashMode, Cut, CutKind, Preallocation, RecoveryMode, Replay, Sequencer, SimStorage, Storage,
    Wal, WalError, WalOptions,
};
use libfuzzer_sys::fuzz_target;

const DIR: &str = "/db";
/// Bounds that keep one input cheap.
const MAX_SEGMENTS: usize = 3;
const MAX_SEGMENT_BYTES: usize = 128 << 10;
const MAX_OPS: usize = 256;

/// Reads the input front to back; past its end every byte reads as zero.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
}

/// What the input asks for besides the files.
struct Plan {
    /// Cut the power (losing everything unsynced) instead of dropping the
    /// log before reopening it.
    power_cut: bool,
    /// Payload of the record appended after a successful open.
    append: Vec<u8>,
    /// Junk for a `<next segment>.wal.tmp` file, as a crashed segment
    /// creation leaves.
    stray_tmp: Option<Vec<u8>>,
    /// (sequence number, bytes) of each segment file.
    files: Vec<(u64, Vec<u8>)>,
}

/// One segment file being written.
struct Seg {
    seq: u64,
    bytes: Vec<u8>,
    /// First and last LSN of the valid entries written into it.
    lsns: Option<(u64, u64)>,
    /// First LSN of the current sync epoch.
    epoch: Option<u64>,
    sealed: bool,
}

/// Turns the input into segment files.
///
/// ```text
/// input   = flags:u8 first_lsn:u16 append_len:u8 op*
///   flags: bit 0 power cut before reopening; bit 1 a stray .wal.tmp file;
///          bits 4..8 the first segment's sequence number - 1
/// op (opcode % 8):
///   0 ENTRY    kind lsn epoch len:u8 payload[len]
///              kind % 4: 0,3 checkpoint if first in segment else record;
///                        1 checkpoint; 2 record
///              lsn: 0 next; 1 repeat last; 2 absolute (u64 follows);
///                   3..=127 next + (lsn - 2); 128..=255 last - (lsn - 127)
///              epoch: 0 same as the previous entry's; 1 new (this LSN);
///                     n lsn - n
///   1 SEGMENT  mode   start the next segment; mode bit 0: leave the current
///                     one unsealed (else it is sealed as the log does it);
///                     bits 1..3: 0,3 valid header, 1 header naming another
///                     segment, 2 no header; bit 3: skip a sequence number
///   2 RAW      len:u8 bytes[len]
///   3 ZEROS    n:u8   8n zero bytes
///   4 SPACE    n:u8   512n zero bytes (preallocated space)
///   5 SEAL     mode pad:u8 [first:u64 last:u64]   footer then trailer now;
///                     mode bit 0: footer's first LSN off by one; bit 1:
///                     trailer points 8 bytes off; bit 2: the footer's LSNs
///                     follow (else those of the segment's entries); bit 3:
///                     no trailer (an interrupted seal); 8*pad zeros between
///                     footer and trailer
///   6 FLIP     pos:u16 bit:u8   flip a bit (pos modulo the length)
///   7 TRUNCATE len:u16          cut to len modulo (length + 1)
/// ```
///
/// The first segment starts implicitly with a valid header; the last one is
/// left unsealed unless SEAL says otherwise.
struct Builder {
    files: Vec<(u64, Vec<u8>)>,
    seg: Seg,
    last_lsn: u64,
}

impl Builder {
    fn new(seq: u64, first_lsn: u64) -> Builder {
        Builder {
            files: Vec::new(),
            seg: Builder::start(seq, 0),
            last_lsn: first_lsn,
        }
    }

    fn start(seq: u64, header: u8) -> Seg {
        let bytes = match header {
            1 => format::encode_header(seq ^ 1).to_vec(),
            2 => Vec::new(),
            _ => format::encode_header(seq).to_vec(),
        };
        Seg {
            seq,
            bytes,
            lsns: None,
            epoch: None,
            sealed: false,
        }
    }

    fn full(&self) -> bool {
        self.seg.bytes.len() >= MAX_SEGMENT_BYTES
    }

    fn entry(&mut self, r: &mut Reader<'_>) {
        let kind = r.u8();
        let lsn = match r.u8() {
            0 => self.last_lsn.wrapping_add(1),
            1 => self.last_lsn,
            2 => r.u64(),
            n @ 3..=127 => self.last_lsn.wrapping_add(u64::from(n) - 2),
            n => self.last_lsn.saturating_sub(u64::from(n) - 127),
        };
        let epoch = match r.u8() {
            0 => self.seg.epoch.unwrap_or(lsn),
            1 => lsn,
            n => lsn.saturating_sub(u64::from(n)).max(1),
        };
        // Keep within what the encoder accepts: at or below the LSN, and at
        // most u32::MAX back.
        let epoch = if epoch > lsn || lsn - epoch > u64::from(u32::MAX) {
            lsn
        } else {
            epoch
        };
        let len = usize::from(r.u8());
        let payload = r.bytes(len);
        let first = self.seg.lsns.is_none();
        let kind = match kind % 4 {
            1 => EntryKind::Checkpoint,
            2 => EntryKind::Record,
            _ if first => EntryKind::Checkpoint,
            _ => EntryKind::Record,
        };
        let b = &mut self.seg.bytes;
        b.resize(format::align_up(b.len() as u64) as usize, 0);
        let at = b.len();
        b.resize(at + format::entry_len(len) as usize, 0);
        b[at + ENTRY_HEADER_LEN..][..len].copy_from_slice(&payload);
        format::encode_entry_header(
            &mut b[at..at + ENTRY_HEADER_LEN],
            self.seg.seq,
            lsn,
            epoch,
            kind,
            &payload,
        );
        self.seg.lsns = Some((self.seg.lsns.map_or(lsn, |(f, _)| f), lsn));
        self.seg.epoch = Some(epoch);
        self.last_lsn = lsn;
    }

    /// Writes a footer and a trailer, as the log seals a segment.
    fn seal(&mut self, mode: u8, pad: u8, lsns: Option<(u64, u64)>) {
        let seg = &mut self.seg;
        let b = &mut seg.bytes;
        let footer_pos = format::align_up(b.len() as u64);
        b.resize(footer_pos as usize, 0);
        let (mut first, last) = lsns.or(seg.lsns).unwrap_or((0, 0));
        if mode & 1 != 0 {
            first = first.wrapping_add(1);
        }
        let payload = format!("footer of segment {}", seg.seq).into_bytes();
        let footer = format::encode_footer(seg.seq, first, last, &payload)
            .expect("a short footer payload fits");
        b.extend_from_slice(&footer);
        let trailer_pos = format::align_up(b.len() as u64) + 8 * u64::from(pad);
        b.resize(trailer_pos as usize, 0);
        if mode & 8 != 0 {
            return;
        }
        let trailer = format::encode_trailer(
            seg.seq,
            format::Trailer {
                footer_pos: if mode & 2 != 0 {
                    footer_pos + 8
                } else {
                    footer_pos
                },
                footer_len: footer.len() as u32,
            },
        );
        b.extend_from_slice(&trailer);
        seg.sealed = true;
    }

    fn next_segment(&mut self, mode: u8) {
        if self.files.len() + 1 >= MAX_SEGMENTS {
            return;
        }
        if mode & 1 == 0 && !self.seg.sealed {
            self.seal(0, 0, None);
        }
        let seq = self.seg.seq + 1 + u64::from(mode >> 3 & 1);
        let next = Builder::start(seq, mode >> 1 & 3);
        let done = std::mem::replace(&mut self.seg, next);
        self.files.push((done.seq, done.bytes));
    }

    fn finish(mut self) -> Vec<(u64, Vec<u8>)> {
        self.files.push((self.seg.seq, self.seg.bytes));
        self.files
    }
}

fn plan(data: &[u8]) -> Plan {
    let mut r = Reader { data, at: 0 };
    let flags = r.u8();
    let first_lsn = u64::from(r.u16());
    let append_len = usize::from(r.u8());
    let append = (0..append_len).map(|i| i as u8 ^ 0x5a).collect();
    let mut b = Builder::new(1 + u64::from(flags >> 4), first_lsn);
    for _ in 0..MAX_OPS {
        if r.done() || b.full() {
            break;
        }
        match r.u8() % 8 {
            0 => b.entry(&mut r),
            1 => {
                let mode = r.u8();
                b.next_segment(mode);
            }
            2 => {
                let n = usize::from(r.u8());
                let raw = r.bytes(n);
                b.seg.bytes.extend_from_slice(&raw);
            }
            3 => {
                let n = 8 * usize::from(r.u8());
                b.seg.bytes.resize(b.seg.bytes.len() + n, 0);
            }
            4 => {
                let n = 512 * usize::from(r.u8());
                b.seg.bytes.resize(b.seg.bytes.len() + n, 0);
            }
            5 => {
                let (mode, pad) = (r.u8(), r.u8());
                let lsns = (mode & 4 != 0).then(|| (r.u64(), r.u64()));
                b.seal(mode, pad, lsns);
            }
            6 => {
                let (pos, bit) = (usize::from(r.u16()), r.u8());
                let bytes = &mut b.seg.bytes;
                if !bytes.is_empty() {
                    let i = pos % bytes.len();
                    bytes[i] ^= 1 << (bit % 8);
                }
            }
            _ => {
                let len = usize::from(r.u16());
                let bytes = &mut b.seg.bytes;
                let keep = len % (bytes.len() + 1);
                bytes.truncate(keep);
            }
        }
    }
    let files = b.finish();
    let stray_tmp = (flags & 2 != 0).then(|| data.iter().rev().take(64).copied().collect());
    Plan {
        power_cut: flags & 1 != 0,
        append,
        stray_tmp,
        files,
    }
}

/// The layer above: counts records; a checkpoint holds the count (16 bytes,
/// so that any count read from a fuzzed checkpoint round-trips; counts wrap).
struct Counter {
    records: u128,
    /// Entries replayed and the last LSN among them, at open.
    replayed: u64,
    last_lsn: u64,
}

impl Sequencer for Counter {
    type Effect = ();

    /// Every segment opens with a checkpoint (never a link).
    fn checkpoint(&mut self, _segment: u64, _since_checkpoint: u64) -> Option<Vec<u8>> {
        Some(self.records.to_le_bytes().to_vec())
    }

    fn seal(&mut self, segment: u64) -> (fencelog_wal::FooterPayload, Option<()>) {
        let footer = format!("segment {segment} sealed after {} records", self.records);
        (footer.into_bytes().into(), None)
    }
}

/// Accepts any checkpoint: its first 16 bytes (or fewer) are the count.
fn build(replay: Replay<'_>) -> Result<Counter, WalError> {
    let mut c = Counter {
        records: 0,
        replayed: 0,
        last_lsn: 0,
    };
    let mut prev: Option<u64> = None;
    for (i, e) in replay.entries().enumerate() {
        if let Some(p) = prev {
            assert_eq!(Some(e.lsn), p.checked_add(1), "replay skips from LSN {p}");
        }
        prev = Some(e.lsn);
        match e.kind {
            EntryKind::Checkpoint => {
                let mut b = [0u8; 16];
                let n = e.payload.len().min(16);
                b[..n].copy_from_slice(&e.payload[..n]);
                c.records = u128::from_le_bytes(b);
            }
            EntryKind::Record => {
                assert!(i > 0, "replay does not start with a checkpoint");
                c.records = c.records.wrapping_add(1);
            }
            // A segment that opens without a checkpoint: nothing to count.
            EntryKind::Link => assert!(i > 0, "replay starts with a link"),
        }
        c.replayed += 1;
        c.last_lsn = e.lsn;
    }
    Ok(c)
}

fn options(recovery: RecoveryMode) -> WalOptions {
    WalOptions {
        segment_bytes: 64 << 10,
        max_entry_bytes: 16 << 10,
        max_batch_bytes: 32 << 10,
        preallocation: Preallocation::Reserve,
        recovery,
        ..WalOptions::default()
    }
}

/// What a successful open found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Opened {
    records: u128,
    replayed: u64,
    last_lsn: u64,
    next_lsn: u64,
}

/// A torn tail is the last sync epoch, never acknowledged, reaching the
/// disk partly. Entries of an epoch are written only after the previous
/// epoch's sync, so a valid entry beyond the cut whose epoch starts after the
/// cut's LSN proves that the epoch holding the cut was synced: the cut then
/// drops acknowledged entries and must have been refused as damage.
fn check_torn_tail(plan: &Plan, mode: RecoveryMode, cut: &Cut, next_lsn: u64) {
    let cut_seq = cut
        .file
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(format::parse_segment_file_name)
        .unwrap_or_else(|| panic!("{mode:?}: cut in a file that is no segment: {cut:?}"));
    // Files whose header is not their own are refused or set aside whole
    // (salvage): their entries are not evidence.
    let readable = |(s, b): &&(u64, Vec<u8>)| *s >= cut_seq && format::decode_header(b) == Ok(*s);
    for (seq, bytes) in plan.files.iter().filter(readable) {
        let mut pos = if *seq == cut_seq {
            cut.position + format::ALIGN
        } else {
            HEADER_LEN
        };
        while pos as usize + ENTRY_HEADER_LEN <= bytes.len() {
            if let Probe::Entry(h) = format::probe_entry(&bytes[pos as usize..], *seq, u32::MAX)
                && h.lsn >= next_lsn
                && h.epoch_first_lsn > next_lsn
            {
                panic!(
                    "{mode:?}: recovery cut a torn tail at byte {} of segment {cut_seq} \
                     (LSN {next_lsn} on), yet segment {seq} holds a valid entry at byte {pos} \
                     (LSN {}) of a later sync epoch (starting at LSN {}): acknowledged \
                     entries were dropped. Cut: {cut:?}",
                    cut.position, h.lsn, h.epoch_first_lsn
                );
            }
            pos += format::ALIGN;
        }
    }
}

/// Opens the log in `mode` on a fork of `sim`; if that works, appends one
/// record, closes (or cuts the power), reopens and checks the record is
/// still there.
fn open_append_reopen(sim: &SimStorage, mode: RecoveryMode, plan: &Plan) -> Option<Opened> {
    let dir = Path::new(DIR);
    let fork = sim.fork();
    let storage: Arc<dyn Storage> = Arc::new(fork.clone());
    let (wal, report) = Wal::open(Arc::clone(&storage), dir, options(mode), build).ok()?;
    let opened = wal.with_state(|c| Opened {
        records: c.records,
        replayed: c.replayed,
        last_lsn: c.last_lsn,
        next_lsn: report.next_lsn,
    });
    assert_eq!(opened.replayed, report.entries_replayed, "{mode:?}");
    if let Some(cut) = &report.cut {
        assert!(
            mode != RecoveryMode::AbsoluteConsistency,
            "AbsoluteConsistency opened the log with a cut: {cut:?}"
        );
        assert!(
            cut.kind == CutKind::TornTail || mode == RecoveryMode::Salvage,
            "{mode:?}: a salvage cut outside Salvage: {cut:?}"
        );
        if cut.kind == CutKind::TornTail {
            check_torn_tail(plan, mode, cut, report.next_lsn);
        }
    }
    assert!(
        opened.replayed == 0 || opened.last_lsn.checked_add(1) == Some(report.next_lsn),
        "{mode:?}: replay ends at LSN {} but the next LSN is {}",
        opened.last_lsn,
        report.next_lsn
    );

    let payload = &plan.append[..];
    let (at, ticket) = wal
        .submit(|w| {
            let at = w.append(payload.len(), |buf| buf.copy_from_slice(payload))?;
            let c = w.state();
            c.records = c.records.wrapping_add(1);
            Ok::<_, WalError>((at, w.ticket()))
        })
        .unwrap_or_else(|e| panic!("{mode:?}: submit after open failed: {e}"))
        .unwrap_or_else(|e| panic!("{mode:?}: append after open failed: {e}"));
    ticket
        .wait()
        .unwrap_or_else(|e| panic!("{mode:?}: sync after open failed: {e}"));
    assert!(
        at.lsn >= report.next_lsn,
        "{mode:?}: appended LSN {} below the recovered next LSN {}",
        at.lsn,
        report.next_lsn
    );
    let entry = wal
        .read_entry(at.segment, at.position)
        .unwrap_or_else(|e| panic!("{mode:?}: the appended record does not read back: {e}"));
    assert_eq!(&entry.payload[..], payload, "{mode:?}");
    assert_eq!(entry.lsn, at.lsn, "{mode:?}");

    let storage: Arc<dyn Storage> = if plan.power_cut {
        let after = fork.cut_power(CrashMode::LoseUnsynced);
        drop(wal);
        Arc::new(after)
    } else {
        drop(wal);
        storage
    };
    let (wal, report2) = Wal::open(storage, dir, options(mode), build).unwrap_or_else(|e| {
        panic!(
            "{mode:?}: reopen after an acknowledged append failed (power cut: {}): {e}",
            plan.power_cut
        )
    });
    let (records, last_lsn) = wal.with_state(|c| (c.records, c.last_lsn));
    let added = records.wrapping_sub(opened.records);
    assert!(
        (1..1 << 64).contains(&added),
        "{mode:?}: {records} records after reopen, {} before the append",
        opened.records
    );
    assert!(
        last_lsn >= at.lsn && report2.next_lsn > at.lsn,
        "{mode:?}: the appended LSN {} is gone after reopen (replay ends at {last_lsn})",
        at.lsn
    );
    let entry = wal.read_entry(at.segment, at.position).unwrap_or_else(|e| {
        panic!("{mode:?}: the appended record does not read back after reopen: {e}")
    });
    assert_eq!(&entry.payload[..], payload, "{mode:?}");
    drop(wal);
    Some(opened)
}

fuzz_target!(|data: &[u8]| {
    let plan = plan(data);
    if std::env::var_os("FENCELOG_FUZZ_DUMP").is_some() {
        for (seq, bytes) in &plan.files {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            eprintln!(
                "DUMP {} ({} bytes): {hex}",
                format::segment_file_name(*seq),
                bytes.len()
            );
        }
    }
    let dir = Path::new(DIR);
    let sim = SimStorage::new();
    sim.create_dir_all(dir).expect("mkdir");
    for (seq, bytes) in &plan.files {
        let f = sim
            .create_new(&dir.join(format::segment_file_name(*seq)))
            .expect("create");
        if !bytes.is_empty() {
            f.write_all_at(bytes, 0).expect("write");
        }
        f.sync_data().expect("sync");
    }
    if let Some(junk) = &plan.stray_tmp {
        let next = plan.files.last().map_or(1, |(s, _)| s + 1);
        let name = format!("{}.tmp", format::segment_file_name(next));
        let f = sim.create_new(&dir.join(name)).expect("create tmp");
        if !junk.is_empty() {
            f.write_all_at(junk, 0).expect("write tmp");
        }
        f.sync_data().expect("sync tmp");
    }
    sim.sync_dir(dir).expect("sync dir");

    // Offline verification reads everything and must not panic.
    let mut seen = 0u64;
    let mut last_progress = 0u64;
    let verified = fencelog_wal::verify(
        &sim.fork(),
        dir,
        |e| {
            seen += 1;
            assert!(e.position >= HEADER_LEN && e.position % format::ALIGN == 0);
            assert!(e.lsn >= 1);
        },
        |done, total| {
            assert!(done >= last_progress && done <= total);
            last_progress = done;
        },
    );
    if let Ok(report) = &verified {
        assert_eq!(report.entries, seen);
        assert_eq!(report.segments.len(), plan.files.len());
        let bytes: u64 = plan.files.iter().map(|(_, b)| b.len() as u64).sum();
        assert_eq!(report.bytes, bytes);
    }

    let absolute = open_append_reopen(&sim, RecoveryMode::AbsoluteConsistency, &plan);
    let tolerate = open_append_reopen(&sim, RecoveryMode::TolerateTornTail, &plan);
    let salvage = open_append_reopen(&sim, RecoveryMode::Salvage, &plan);
    if std::env::var_os("FENCELOG_FUZZ_STATS").is_some() {
        let files: Vec<usize> = plan.files.iter().map(|(_, b)| b.len()).collect();
        let verified = verified.as_ref().map(|r| (r.entries, r.is_damaged()));
        eprintln!(
            "STATS files={files:?} verify={verified:?} absolute={absolute:?} \
             tolerate={tolerate:?} salvage={salvage:?}"
        );
    }
    if let Some(a) = absolute {
        assert_eq!(
            Some(a),
            tolerate,
            "AbsoluteConsistency opened the log, TolerateTornTail differently"
        );
    }
    if let Some(t) = tolerate {
        assert_eq!(
            Some(t),
            salvage,
            "TolerateTornTail opened the log, Salvage differently"
        );
    }
});
