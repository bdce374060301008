//! Recovery: find where replay starts, scan the tail, classify damage, then
//! (and only then) change anything on disk.
//!
//! Writes reach the disk in sync epochs: an entry records (as
//! `epoch_first_lsn`) an LSN below which everything was durable before the
//! entry was written: with a sync per batch, the first LSN of its batch (the
//! sync thread writes a batch only after the previous one's `fdatasync`
//! returned); without one, the first LSN after the last sync that really
//! completed. So at any crash only what follows the last completed sync can
//! be partly on disk, and each entry says where that boundary was.
//!
//! Scanning stops at the first position that is not the expected next entry.
//! What lies beyond decides what that stop means:
//! - nothing but zeros: the clean end of the log;
//! - non-zero bytes, and every valid entry among them belongs to the same
//!   epoch as the stop: a **torn tail**, what followed the last sync, never
//!   acknowledged; it is cut off, and that raises nothing (a stream's
//!   highest token is what its surviving entries carry);
//! - a valid entry of a *later* epoch, or a later segment (readable or
//!   not): the stop's epoch was synced (a later one was written after it),
//!   so acknowledged data is damaged: **corruption**, and open refuses
//!   unless asked to salvage.
//!
//! The work is done in two phases. [`plan`] reads and classifies, and
//! changes nothing (`fencelog repair` shows it before asking). Applying the
//! plan first raises the token floor ([`crate::marks`]) when salvage cuts
//! acknowledged data, then copies a damaged segment aside before anything
//! is sealed over or removed, and only then renames and removes files.
//!
//! Replay starts at the newest segment that opens with a checkpoint (some
//! segments open with a link instead, see [`EntryKind::Link`]), so open time
//! depends on the tail, not on history.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::WalError;
use crate::format::{self, ALIGN, EntryKind, HEADER_LEN, Invalid, Probe, TRAILER_LEN};
use crate::marks::{Marks, MarksFile};
use crate::options::{RecoveryMode, WalOptions};
use crate::segment::{self, SealedInfo, SegmentHandle};
use crate::storage::{self, Storage, StorageFile};

/// What recovery found and did.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Segment files in the log after recovery.
    pub segments: usize,
    /// Segments whose entries were scanned (the tail).
    pub scanned_segments: usize,
    /// Bytes of entries scanned.
    pub scanned_bytes: u64,
    /// Entries handed to replay.
    pub entries_replayed: u64,
    /// The LSN the next entry gets.
    pub next_lsn: u64,
    /// What was cut off the end of the log, if anything.
    pub cut: Option<Cut>,
    /// The token marks after recovery (see [`Marks`]): after a salvage
    /// cut, the floor is at or above every value that may have been
    /// acknowledged.
    pub marks: Marks,
    /// The floor raised by this recovery (only a [`CutKind::Salvaged`] cut
    /// raises it; a torn tail raises nothing).
    pub floor_raised: Option<FloorRaise>,
}

/// A raise of the token floor by a salvage cut: every value at or below
/// `to` is refused from now on, on every stream, and the token counter
/// restarts above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorRaise {
    /// The floor before the cut.
    pub from: u64,
    /// The floor after it: the marks' ceiling, at or above every value
    /// that was acknowledged before the cut.
    pub to: u64,
}

/// A part of the log that recovery cut off (or, in a plan, would cut).
#[derive(Debug, Clone)]
pub struct Cut {
    /// Why: a torn tail (never acknowledged) or salvage of damage.
    pub kind: CutKind,
    /// The segment file where the valid log ends.
    pub file: PathBuf,
    /// Byte position in it where the valid log ends.
    pub position: u64,
    /// What was found there.
    pub reason: String,
    /// Bytes cut from `file` (from `position` to the end of what was
    /// written there, as far as it can be told).
    pub bytes_cut: u64,
    /// Valid entries found after `position` that were cut with it (in that
    /// file and in later ones).
    pub entries_cut: u64,
    /// Files kept aside (`*.damaged`): a copy of `file` when acknowledged
    /// data was cut there, and every later segment, renamed.
    pub moved_aside: Vec<PathBuf>,
    /// Later segment files removed because they held no valid entry.
    pub removed: Vec<PathBuf>,
}

/// The kind of a [`Cut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutKind {
    /// What followed the last sync that can be proven is incomplete on
    /// disk and was cut: a write torn by a power cut, ENOSPC or an I/O
    /// error before its sync returned, never acknowledged, so the cut
    /// raises nothing. Damage at rest to the very last synced epoch, with
    /// nothing written after it, looks the same (no later entry proves it
    /// was synced): that is what recovery cannot know, and why the cut is
    /// always reported (see `docs/DESIGN.md`, "What a cut raises").
    TornTail,
    /// Damage to acknowledged entries, cut because the caller asked for
    /// [`RecoveryMode::Salvage`]; entries after the damage were dropped
    /// (kept in `*.damaged` files). It raises the token floor to the
    /// marks' ceiling first ([`RecoveryReport::floor_raised`]).
    Salvaged,
}

/// An entry found by the scan, before replay.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scanned {
    pub seq: u64,
    pub pos: u64,
    pub lsn: u64,
    pub kind: EntryKind,
    pub len: u32,
}

/// Where new entries go after recovery.
pub(crate) enum Tail {
    /// Keep appending to this unsealed segment at `pos`.
    Continue {
        seq: u64,
        pos: u64,
        first_lsn: u64,
        file: Box<dyn StorageFile>,
    },
    /// Seal this segment at `pos` (everything after is junk), then start a
    /// new segment.
    SealThenRotate {
        seq: u64,
        pos: u64,
        first_lsn: u64,
        file: Box<dyn StorageFile>,
    },
    /// Start a new segment (the log is empty, or its last segment is sealed).
    Rotate,
}

pub(crate) struct Recovered {
    /// Every segment kept, in order; the tail's file is in `tail`.
    pub segments: Vec<u64>,
    /// Sealed segments read during the scan, with their footers.
    pub sealed: HashMap<u64, (SealedInfo, Bytes)>,
    pub entries: Vec<Scanned>,
    /// The scanned segments' bytes (their entries), for replay.
    pub data: HashMap<u64, Bytes>,
    pub tail: Tail,
    /// The sequence number the next new segment gets.
    pub next_seq: u64,
    pub next_lsn: u64,
    pub report: RecoveryReport,
}

struct Seg {
    seq: u64,
    path: PathBuf,
    file: Box<dyn StorageFile>,
    len: u64,
    sealed: Option<(SealedInfo, Bytes)>,
    /// The file's bytes: up to the footer of a sealed segment, all of an
    /// unsealed one.
    data: Bytes,
}

impl Seg {
    fn open(storage: &dyn Storage, dir: &Path, seq: u64) -> Result<Seg, WalError> {
        let path = dir.join(format::segment_file_name(seq));
        let file = storage
            .open(&path)
            .map_err(|e| WalError::io("open", &path, e))?;
        segment::check_header(file.as_ref(), &path, seq)?;
        let len = file.len().map_err(|e| WalError::io("stat", &path, e))?;
        let sealed = segment::load_sealed(file.as_ref(), &path, seq, len)?;
        let end = sealed.as_ref().map_or(len, |(v, _)| v.footer_pos);
        let data =
            storage::read_prefix(file.as_ref(), end).map_err(|e| WalError::io("read", &path, e))?;
        Ok(Seg {
            seq,
            path,
            file,
            len,
            sealed,
            data: Bytes::from(data),
        })
    }

    /// Where this segment's entries end: its footer if sealed, else its end.
    fn entries_end(&self) -> u64 {
        self.sealed.as_ref().map_or(self.len, |(v, _)| v.footer_pos)
    }

    /// Whether replay can start here: the first entry is a checkpoint.
    fn opens_with_checkpoint(&self) -> bool {
        let end = self.entries_end().min(self.data.len() as u64);
        if end <= HEADER_LEN {
            return false;
        }
        matches!(
            format::probe_entry(&self.data[HEADER_LEN as usize..end as usize], self.seq, u32::MAX),
            Probe::Entry(h) if h.kind == EntryKind::Checkpoint
        )
    }
}

/// A segment salvage could not read at all (damaged header or footer).
struct Unreadable {
    seq: u64,
    path: PathBuf,
    error: WalError,
}

/// A valid entry found beyond the stop.
struct Beyond {
    seg_index: usize,
    pos: u64,
    lsn: u64,
    epoch_first_lsn: u64,
}

/// The valid entries of segment `seq` in `data[from..end]` (at aligned
/// positions, with an LSN at or above `expected`) that matter to the
/// classification: the first one of a sync epoch begun after `expected` if
/// there is one, else the first one at all; and whether any byte in that
/// range is non-zero. Every position is looked at: a same-epoch entry right
/// after the damage must not hide a later-epoch one behind it.
pub(crate) fn first_valid_after(
    data: &[u8],
    seq: u64,
    from: u64,
    end: u64,
    expected: u64,
) -> (Option<(u64, format::EntryHeader)>, bool) {
    let end = end.min(data.len() as u64);
    let mut nonzero = false;
    let mut first: Option<(u64, format::EntryHeader)> = None;
    let mut pos = from;
    while pos + ALIGN <= end {
        let at = pos as usize;
        // A preallocated segment's tail is megabytes of zeros: skip them a
        // block at a time (positions stay aligned: BLOCK is a multiple of ALIGN).
        if pos + BLOCK <= end && all_zero(&data[at..at + BLOCK as usize]) {
            pos += BLOCK;
            continue;
        }
        if data[at..at + ALIGN as usize] == [0u8; ALIGN as usize] {
            pos += ALIGN;
            continue;
        }
        nonzero = true;
        if let Probe::Entry(h) = format::probe_entry(&data[at..end as usize], seq, u32::MAX)
            && h.lsn >= expected
        {
            if h.epoch_first_lsn > expected {
                return (Some((pos, h)), true);
            }
            first.get_or_insert((pos, h));
        }
        pos += ALIGN;
    }
    if pos < end && data[pos as usize..end as usize].iter().any(|&b| b != 0) {
        nonzero = true;
    }
    (first, nonzero)
}

/// Counts the valid entries (LSN at or above `expected`) at aligned
/// positions of `data[from..end]`: what a cut takes with it, for the report.
fn count_valid(data: &[u8], seq: u64, from: u64, end: u64, expected: u64) -> u64 {
    let end = end.min(data.len() as u64);
    let mut n = 0;
    let mut pos = from;
    while pos + ALIGN <= end {
        if pos + BLOCK <= end && all_zero(&data[pos as usize..(pos + BLOCK) as usize]) {
            pos += BLOCK;
            continue;
        }
        match format::probe_entry(&data[pos as usize..end as usize], seq, u32::MAX) {
            Probe::Entry(h) if h.lsn >= expected => {
                n += 1;
                pos += h.encoded_len();
            }
            _ => pos += ALIGN,
        }
    }
    n
}

/// Bytes skipped at once when a scan crosses zeros.
const BLOCK: u64 = 512;

/// Whether every byte is zero (an OR over the slice, which compiles to
/// vector instructions, rather than a compare per byte).
fn all_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |acc, &x| acc | x) == 0
}

/// Where the non-zero bytes of `data[from..]` end (what a cut takes).
fn written_end(data: &[u8], from: u64) -> u64 {
    let from = (from as usize).min(data.len());
    let mut end = data.len();
    // Zero blocks from the end first: the tail of a preallocated segment.
    while end - from >= BLOCK as usize && all_zero(&data[end - BLOCK as usize..end]) {
        end -= BLOCK as usize;
    }
    data[from..end]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(from as u64, |i| (from + i + 1) as u64)
}

/// Looks at everything after the stop: the first valid entry (with an LSN
/// at or above `expected`), and whether any non-zero byte follows the stop in
/// its own segment.
fn look_beyond(
    segs: &[Seg],
    stop_index: usize,
    stop_pos: u64,
    expected: u64,
) -> (Option<Beyond>, bool) {
    let mut nonzero_here = false;
    // A valid entry of the stop's own epoch, kept while looking further for
    // one that proves the epoch was synced.
    let mut same_epoch: Option<Beyond> = None;
    for (i, seg) in segs.iter().enumerate().skip(stop_index) {
        // The entry at the stop itself is not "beyond" it.
        let from = if i == stop_index {
            stop_pos + ALIGN
        } else {
            HEADER_LEN
        };
        let end = seg.entries_end();
        let (found, nonzero) = first_valid_after(&seg.data, seg.seq, from, end, expected);
        if i == stop_index {
            let at_stop = seg
                .data
                .get(stop_pos as usize..(stop_pos + ALIGN).min(seg.data.len() as u64) as usize);
            nonzero_here = nonzero || at_stop.is_some_and(|b| b.iter().any(|&x| x != 0));
        }
        if let Some((pos, h)) = found {
            let beyond = Beyond {
                seg_index: i,
                pos,
                lsn: h.lsn,
                epoch_first_lsn: h.epoch_first_lsn,
            };
            // A later epoch, or any valid entry in a later segment (each
            // segment starts a new epoch): proof of a completed sync.
            if h.epoch_first_lsn > expected || i != stop_index {
                return (Some(beyond), nonzero_here);
            }
            same_epoch.get_or_insert(beyond);
        }
    }
    (same_epoch, nonzero_here)
}

fn describe(probe: Probe, expected: Option<u64>, at_start: bool) -> String {
    match probe {
        Probe::Zeros => "the entries end here".into(),
        Probe::Invalid(Invalid::Truncated) => "a truncated entry header".into(),
        Probe::Invalid(Invalid::BadLength(len)) => {
            format!("an entry header claiming {len} bytes that do not fit")
        }
        Probe::Invalid(Invalid::BadHeader) => "an invalid entry header".into(),
        Probe::Invalid(Invalid::Checksum) => "an entry whose checksum does not match".into(),
        Probe::Entry(h) if at_start && !h.kind.opens_segment() => {
            "a segment that does not open with a checkpoint or a link".into()
        }
        Probe::Entry(h) if !at_start && h.kind.opens_segment() => {
            "a checkpoint or link in the middle of a segment".into()
        }
        Probe::Entry(h) => format!(
            "an entry with LSN {} where LSN {} was expected",
            h.lsn,
            expected.unwrap_or(0)
        ),
    }
}

fn aside_path(path: &Path) -> PathBuf {
    let mut aside = path.to_path_buf().into_os_string();
    aside.push(".damaged");
    PathBuf::from(aside)
}

/// What recovery will do, decided before anything on disk changes.
struct Plan {
    tmp_files: Vec<PathBuf>,
    /// Readable tail segments kept, in order.
    keep: Vec<Seg>,
    /// The stop segment, copied aside (acknowledged data is cut in it).
    copy_aside: Option<usize>,
    /// Renamed aside: later readable segments after a salvage cut.
    rename_aside: Vec<PathBuf>,
    /// Removed: later segments holding no valid entry.
    remove: Vec<PathBuf>,
    cut: Option<Cut>,
    /// The segment the log ends in holds junk past its last entry, so it
    /// must be sealed rather than appended to.
    rotate_after_junk: bool,
    entries: Vec<Scanned>,
    expected: Option<u64>,
    older: Vec<u64>,
    next_seq: u64,
    report: RecoveryReport,
}

/// Reads the log in `dir` and decides what opening it in `opts.recovery`
/// mode would cut, without changing anything. `fencelog repair` shows this
/// before it asks.
pub fn plan_recovery(
    storage: &dyn Storage,
    dir: &Path,
    opts: &WalOptions,
) -> Result<RecoveryReport, WalError> {
    let p = plan(storage, dir, opts)?;
    let mut report = p.report;
    report.cut = p.cut;
    report.next_lsn = p.expected.unwrap_or(1);
    report.entries_replayed = p.entries.len() as u64;
    report.segments = p.older.len() + p.keep.len();
    Ok(report)
}

fn plan(storage: &dyn Storage, dir: &Path, opts: &WalOptions) -> Result<Plan, WalError> {
    let (seqs, tmp_files) = list_segments(storage, dir)?;
    let next_seq = seqs.last().map_or(1, |s| s + 1);
    let (tail, unreadable, first_opened) = open_tail(storage, dir, &seqs, opts)?;
    let scan = Scan::run(&tail, &unreadable)?;
    let mut plan = Plan {
        tmp_files,
        keep: tail,
        copy_aside: None,
        rename_aside: Vec::new(),
        remove: Vec::new(),
        cut: None,
        rotate_after_junk: false,
        entries: scan.entries,
        expected: scan.expected,
        // Older segments are sealed and are read only on demand: open
        // reads the tail only.
        older: seqs[..first_opened].to_vec(),
        next_seq,
        report: scan.report,
    };
    if let Some(stop) = scan.stop {
        plan.cut_at(stop, &unreadable, opts)?;
    }
    if plan.keep.is_empty() && !unreadable.is_empty() {
        plan.nothing_readable(&unreadable);
    }
    plan.drop_empty_tail_segments();
    if let Some(c) = &mut plan.cut {
        c.removed = plan.remove.clone();
    }
    Ok(plan)
}

/// The segment files in `dir`, in order, and the `.wal.tmp` files of
/// segments whose creation never finished.
pub(crate) fn list_segments(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<(Vec<u64>, Vec<PathBuf>), WalError> {
    let names = storage
        .list(dir)
        .map_err(|e| WalError::io("list", dir, e))?;
    let mut seqs = Vec::new();
    let mut tmp_files = Vec::new();
    for name in names {
        if let Some(seq) = format::parse_segment_file_name(&name) {
            seqs.push(seq);
        } else if name.ends_with(".wal.tmp") {
            // A segment whose creation never finished: it was never renamed
            // into place, so it holds nothing.
            tmp_files.push(dir.join(&name));
        }
    }
    seqs.sort_unstable();
    Ok((seqs, tmp_files))
}

/// Opens segments from the newest back to the newest one that opens with a
/// valid checkpoint: replay starts there. Salvage notes segments it cannot
/// read at all and carries on with older ones; nothing is moved before the
/// whole picture is known. Answers the opened segments and the unreadable
/// ones, both in order, and the index in `seqs` of the oldest one looked at.
fn open_tail(
    storage: &dyn Storage,
    dir: &Path,
    seqs: &[u64],
    opts: &WalOptions,
) -> Result<(Vec<Seg>, Vec<Unreadable>, usize), WalError> {
    let mut tail: Vec<Seg> = Vec::new();
    let mut unreadable: Vec<Unreadable> = Vec::new();
    let mut first_opened = seqs.len();
    for (i, &seq) in seqs.iter().enumerate().rev() {
        first_opened = i;
        match Seg::open(storage, dir, seq) {
            Ok(seg) => {
                let is_start = seg.opens_with_checkpoint();
                tail.push(seg);
                if is_start {
                    break;
                }
            }
            Err(e) if opts.recovery == RecoveryMode::Salvage && e.is_corruption() => {
                unreadable.push(Unreadable {
                    seq,
                    path: dir.join(format::segment_file_name(seq)),
                    error: e,
                });
            }
            Err(e) => return Err(e),
        }
    }
    tail.reverse();
    unreadable.reverse();
    Ok((tail, unreadable, first_opened))
}

/// Where the valid log stops.
struct Stop {
    /// The segment (an index in the opened tail).
    index: usize,
    /// The byte position in it.
    pos: u64,
    /// What was found there.
    reason: String,
    /// The stop is where an unreadable segment begins (not damage found
    /// inside the stop segment itself).
    at_unreadable: bool,
}

impl Stop {
    fn before_unreadable(index: usize, pos: u64, u: &Unreadable) -> Stop {
        Stop {
            index,
            pos,
            reason: format!("segment {} cannot be read ({})", u.seq, u.error),
            at_unreadable: true,
        }
    }
}

/// The scan of the opened tail: its valid entries, in order, and where
/// they stop.
struct Scan {
    entries: Vec<Scanned>,
    /// The LSN the next valid entry must carry.
    expected: Option<u64>,
    stop: Option<Stop>,
    report: RecoveryReport,
}

impl Scan {
    fn run(tail: &[Seg], unreadable: &[Unreadable]) -> Result<Scan, WalError> {
        let mut scan = Scan {
            entries: Vec::new(),
            expected: None,
            stop: None,
            report: RecoveryReport::default(),
        };
        for (i, seg) in tail.iter().enumerate() {
            if let Some(u) = unreadable.iter().find(|u| u.seq < seg.seq) {
                // Scanning stops before the first segment that cannot be read.
                let (index, pos) = match i.checked_sub(1) {
                    Some(p) => (p, tail[p].entries_end()),
                    None => (0, HEADER_LEN),
                };
                scan.stop = Some(Stop::before_unreadable(index, pos, u));
                return Ok(scan);
            }
            scan.report.scanned_segments += 1;
            if let Some(stop) = scan.segment(i, seg)? {
                scan.stop = Some(stop);
                return Ok(scan);
            }
        }
        if let Some(last) = tail.len().checked_sub(1)
            && let Some(u) = unreadable.iter().find(|u| u.seq > tail[last].seq)
        {
            scan.stop = Some(Stop::before_unreadable(last, tail[last].entries_end(), u));
        }
        Ok(scan)
    }

    /// Scans one segment's entries; answers where the valid log stops in
    /// it, if it does.
    fn segment(&mut self, i: usize, seg: &Seg) -> Result<Option<Stop>, WalError> {
        let end = seg.entries_end();
        let mut pos = HEADER_LEN;
        let first_in_seg = self.entries.len();
        let mut stop = None;
        while pos < end {
            let probe =
                format::probe_entry(&seg.data[pos as usize..end as usize], seg.seq, u32::MAX);
            let at_start = pos == HEADER_LEN;
            match probe {
                Probe::Entry(h)
                    if h.kind.opens_segment() == at_start
                        && self.expected.is_none_or(|e| h.lsn == e)
                        // Replay starts with a checkpoint, never a link.
                        && (self.expected.is_some() || h.kind == EntryKind::Checkpoint) =>
                {
                    self.entries.push(Scanned {
                        seq: seg.seq,
                        pos,
                        lsn: h.lsn,
                        kind: h.kind,
                        len: h.len,
                    });
                    self.expected = Some(h.lsn + 1);
                    pos += h.encoded_len();
                }
                other => {
                    stop = Some(describe(other, self.expected, at_start));
                    break;
                }
            }
        }
        self.report.scanned_bytes += pos - HEADER_LEN;
        let reason = match (stop, &seg.sealed) {
            (Some(reason), _) => reason,
            (None, Some((view, _))) => {
                self.check_footer(seg, view, first_in_seg)?;
                return Ok(None);
            }
            // An unsealed segment that runs to its very end: the log stops
            // here; anything in later segments is examined later.
            (None, None) => "the segment file ends here".into(),
        };
        Ok(Some(Stop {
            index: i,
            pos,
            reason,
            at_unreadable: false,
        }))
    }

    /// A sealed segment's footer must name the LSNs its entries hold.
    fn check_footer(
        &self,
        seg: &Seg,
        view: &SealedInfo,
        first_in_seg: usize,
    ) -> Result<(), WalError> {
        let (first, last) = match (self.entries.get(first_in_seg), self.entries.last()) {
            (Some(f), Some(l)) if self.entries.len() > first_in_seg => (f.lsn, l.lsn),
            _ => (0, 0),
        };
        if (first, last) != (view.first_lsn, view.last_lsn) {
            return Err(WalError::Corrupt {
                file: seg.path.clone(),
                position: view.footer_pos,
                reason: format!(
                    "the footer says LSNs {}..={} but the entries hold {first}..={last}",
                    view.first_lsn, view.last_lsn
                ),
            });
        }
        Ok(())
    }
}

/// What lies after the stop, and what it says about the stop.
struct AfterStop {
    /// A footer right after the last entry, whose trailer never became
    /// durable: a seal was interrupted.
    interrupted_seal: bool,
    /// A valid entry found beyond the stop.
    beyond: Option<Beyond>,
    /// Something other than zeros follows the stop.
    nonzero: bool,
    /// Why acknowledged data is damaged, if it is.
    damage: Option<String>,
}

impl Plan {
    /// Decides what to cut at `stop`: refuses, salvages damage, redoes an
    /// interrupted seal or cuts a torn tail. Keeps the tail up to the stop
    /// segment.
    fn cut_at(
        &mut self,
        stop: Stop,
        unreadable: &[Unreadable],
        opts: &WalOptions,
    ) -> Result<(), WalError> {
        let after = self.look_after(&stop, unreadable)?;
        let written_end = self.written_end(&stop);
        let seg_path = self.keep[stop.index].path.clone();
        let corrupt = |reason: String| WalError::Corrupt {
            file: seg_path.clone(),
            position: stop.pos,
            reason,
        };
        let later: Vec<PathBuf> = self.keep[stop.index + 1..]
            .iter()
            .map(|s| s.path.clone())
            .collect();
        if let Some(damage) = after.damage {
            if opts.recovery != RecoveryMode::Salvage {
                return Err(corrupt(damage));
            }
            self.salvage(&stop, damage, written_end, later, unreadable);
        } else if after.interrupted_seal && after.beyond.is_none() {
            // Not damage: the seal is redone after recovery.
            self.rotate_after_junk = true;
            self.remove.extend(later);
        } else {
            if after.beyond.is_some() || after.nonzero {
                if opts.recovery == RecoveryMode::AbsoluteConsistency {
                    return Err(corrupt(format!(
                        "{}: a torn tail, refused by AbsoluteConsistency",
                        stop.reason
                    )));
                }
                self.cut = Some(Cut {
                    kind: CutKind::TornTail,
                    file: seg_path.clone(),
                    position: stop.pos,
                    // Honest about what cannot be known: nothing after
                    // this proves a sync covered it (a torn write looks
                    // like this; so would damage at rest to the newest
                    // synced epoch, with nothing written after it).
                    reason: format!(
                        "{}: no later write proves a sync completed here, so it was \
                         never acknowledged",
                        stop.reason
                    ),
                    bytes_cut: written_end.saturating_sub(stop.pos),
                    entries_cut: self.entries_cut(&stop),
                    moved_aside: Vec::new(),
                    removed: Vec::new(),
                });
                self.rotate_after_junk = true;
            }
            // Segments after the one the log ends in hold no valid entry.
            self.remove.extend(later);
        }
        self.keep.truncate(stop.index + 1);
        Ok(())
    }

    /// Salvages damage at `stop`: keeps what was written past it aside
    /// (a copy of its segment, the later and the unreadable segments
    /// renamed), to be sealed over.
    fn salvage(
        &mut self,
        stop: &Stop,
        damage: String,
        written_end: u64,
        later: Vec<PathBuf>,
        unreadable: &[Unreadable],
    ) {
        let seg_path = self.keep[stop.index].path.clone();
        let mut moved = Vec::new();
        if written_end > stop.pos {
            self.copy_aside = Some(stop.index);
            moved.push(aside_path(&seg_path));
        }
        let aside = later
            .into_iter()
            .chain(unreadable.iter().map(|u| u.path.clone()));
        for path in aside {
            moved.push(aside_path(&path));
            self.rename_aside.push(path);
        }
        self.cut = Some(Cut {
            kind: CutKind::Salvaged,
            file: seg_path,
            position: stop.pos,
            reason: damage,
            bytes_cut: written_end.saturating_sub(stop.pos),
            entries_cut: self.entries_cut(stop),
            moved_aside: moved,
            removed: Vec::new(),
        });
        self.rotate_after_junk = true;
    }

    /// Looks past the stop: an interrupted seal, a valid entry of a later
    /// sync, an unreadable later segment.
    fn look_after(&self, stop: &Stop, unreadable: &[Unreadable]) -> Result<AfterStop, WalError> {
        let tail = &self.keep;
        let seg = &tail[stop.index];
        let exp = self.expected.unwrap_or(1);
        let reason = &stop.reason;
        if let Some((view, _)) = &seg.sealed
            && stop.pos < view.footer_pos
            && !stop.at_unreadable
        {
            // A sealed segment's entries were all synced before its footer.
            return Err(WalError::Corrupt {
                file: seg.path.clone(),
                position: stop.pos,
                reason: format!("{reason} inside a sealed segment"),
            });
        }
        // A footer right after the last entry, whose trailer never became
        // durable: a seal was interrupted. Nothing was lost; seal again.
        // (The last entry's padding may run past the end of the file, so the
        // stop can lie beyond it.)
        let footer_at_stop = seg
            .data
            .get(stop.pos as usize..)
            .and_then(|rest| format::decode_footer(rest, seg.seq));
        let interrupted_seal = seg.sealed.is_none()
            && footer_at_stop.is_some_and(|f| {
                self.expected
                    .is_some_and(|e| f.last_lsn.checked_add(1) == Some(e))
            });
        let (beyond, nonzero) = if stop.at_unreadable {
            // Damage whatever follows: nothing more to learn from it.
            (None, true)
        } else if interrupted_seal {
            let footer_len =
                footer_at_stop.map_or(0, |f| format::FOOTER_HEADER_LEN as u64 + u64::from(f.len));
            let after = format::align_up(stop.pos + footer_len);
            let (b, _) = look_beyond(tail, stop.index, after.saturating_sub(ALIGN), exp);
            (b, true)
        } else {
            look_beyond(tail, stop.index, stop.pos, exp)
        };
        // An unreadable segment anywhere in the tail: a later segment
        // exists, so the stop's epoch was synced and something is lost.
        let damage = match (&beyond, unreadable.first()) {
            // A valid entry of an epoch that began after the stop: the stop's
            // epoch had been synced, so acknowledged data is damaged.
            (Some(b), _) if b.epoch_first_lsn > exp || b.seg_index != stop.index => Some(format!(
                "{reason}, yet a valid entry (LSN {}) of a later sync follows at byte {} of {}",
                b.lsn,
                b.pos,
                tail[b.seg_index].path.display()
            )),
            (_, Some(u)) => Some(format!(
                "{reason}, and the later segment {} cannot be read ({})",
                u.path.display(),
                u.error
            )),
            _ => None,
        };
        Ok(AfterStop {
            interrupted_seal,
            beyond,
            nonzero,
            damage,
        })
    }

    /// The end of what was written in the stop segment.
    fn written_end(&self, stop: &Stop) -> u64 {
        let seg = &self.keep[stop.index];
        match &seg.sealed {
            Some((view, _)) if stop.pos >= view.footer_pos => stop.pos,
            _ => written_end(&seg.data, stop.pos),
        }
    }

    /// The valid entries a cut at `stop` drops, in its segment and later
    /// ones.
    fn entries_cut(&self, stop: &Stop) -> u64 {
        let exp = self.expected.unwrap_or(1);
        self.keep
            .iter()
            .enumerate()
            .skip(stop.index)
            .map(|(i, s)| {
                let from = if i == stop.index {
                    stop.pos
                } else {
                    HEADER_LEN
                };
                count_valid(&s.data, s.seq, from, s.entries_end(), exp)
            })
            .sum()
    }

    /// Salvage found no segment it could read at all: every one goes aside.
    fn nothing_readable(&mut self, unreadable: &[Unreadable]) {
        let first = &unreadable[0];
        let moved: Vec<PathBuf> = unreadable.iter().map(|u| aside_path(&u.path)).collect();
        self.rename_aside
            .extend(unreadable.iter().map(|u| u.path.clone()));
        self.cut = Some(Cut {
            kind: CutKind::Salvaged,
            file: first.path.clone(),
            position: 0,
            reason: format!("no segment can be read ({})", first.error),
            bytes_cut: 0,
            entries_cut: 0,
            moved_aside: moved,
            removed: Vec::new(),
        });
    }

    /// A trailing segment without a single valid entry holds nothing (a
    /// pre-created segment, or one whose first sync was torn): drop it. A
    /// salvaged stop segment with nothing valid was copied aside first.
    fn drop_empty_tail_segments(&mut self) {
        while let Some(last) = self.keep.last() {
            if self.entries.iter().any(|e| e.seq == last.seq) {
                break;
            }
            if self.copy_aside == Some(self.keep.len() - 1) {
                self.copy_aside = None;
                // Renaming keeps every byte: no copy needed.
                self.rename_aside.push(last.path.clone());
                if let Some(c) = &mut self.cut
                    && !c.moved_aside.contains(&aside_path(&last.path))
                {
                    c.moved_aside.push(aside_path(&last.path));
                }
            } else {
                self.remove.push(last.path.clone());
            }
            self.keep.pop();
            self.rotate_after_junk = false;
        }
    }
}

/// Recovers the log in `dir`: plans, raises the token floor if salvage cuts
/// acknowledged data, then carries the plan out.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    opts: &WalOptions,
    marks: &mut MarksFile,
) -> Result<Recovered, WalError> {
    let mut plan = plan(storage, dir, opts)?;
    raise_floor_before_salvage(&mut plan, marks, dir)?;
    move_and_remove(storage, dir, &plan)?;
    let next_lsn = plan.expected.unwrap_or(1);
    let kept = open_kept(plan.keep, &plan.entries, plan.rotate_after_junk, next_lsn)?;
    let mut segments = plan.older;
    segments.extend(kept.seqs);
    let mut report = plan.report;
    report.segments = segments.len();
    report.entries_replayed = plan.entries.len() as u64;
    report.next_lsn = next_lsn;
    report.cut = plan.cut;
    report.marks = marks.get();
    Ok(Recovered {
        segments,
        sealed: kept.sealed,
        entries: plan.entries,
        data: kept.data,
        tail: kept.tail,
        next_seq: plan.next_seq,
        next_lsn,
        report,
    })
}

/// A salvage cut drops acknowledged entries on purpose, and with them
/// values up to the ceiling: the floor rises, durably, before the first
/// byte of them is gone. A torn tail followed the last sync: it was never
/// acknowledged, and cutting it raises nothing.
fn raise_floor_before_salvage(
    plan: &mut Plan,
    marks: &mut MarksFile,
    dir: &Path,
) -> Result<(), WalError> {
    if !plan
        .cut
        .as_ref()
        .is_some_and(|c| c.kind == CutKind::Salvaged)
    {
        return Ok(());
    }
    let m = marks.get();
    if m.floor < m.ceiling {
        marks
            .set(Marks {
                ceiling: m.ceiling,
                floor: m.ceiling,
            })
            .map_err(|e| WalError::io("write token marks in", dir, e))?;
        plan.report.floor_raised = Some(FloorRaise {
            from: m.floor,
            to: m.ceiling,
        });
    }
    Ok(())
}

/// Carries out the plan's file changes: copies the damaged segment aside
/// (durable before anything is sealed over or removed), renames aside,
/// removes, then syncs the directory.
fn move_and_remove(storage: &dyn Storage, dir: &Path, plan: &Plan) -> Result<(), WalError> {
    let mut dir_changed = false;
    if let Some(i) = plan.copy_aside {
        let seg = &plan.keep[i];
        let aside = aside_path(&seg.path);
        let _ = storage.remove(&aside);
        let f = storage
            .create_new(&aside)
            .map_err(|e| WalError::io("create", &aside, e))?;
        // The whole file, footer area included: what was there is kept.
        let whole = storage::read_prefix(seg.file.as_ref(), seg.len)
            .map_err(|e| WalError::io("read", &seg.path, e))?;
        f.write_all_at(&whole, 0)
            .map_err(|e| WalError::io("write", &aside, e))?;
        f.sync_data()
            .map_err(|e| WalError::io("fdatasync", &aside, e))?;
        dir_changed = true;
    }
    for path in &plan.rename_aside {
        let aside = aside_path(path);
        storage
            .rename(path, &aside)
            .map_err(|e| WalError::io("rename", path, e))?;
        dir_changed = true;
    }
    for path in plan.remove.iter().chain(&plan.tmp_files) {
        storage
            .remove(path)
            .map_err(|e| WalError::io("remove", path, e))?;
        dir_changed = true;
    }
    if dir_changed {
        storage
            .sync_dir(dir)
            .map_err(|e| WalError::io("sync directory", dir, e))?;
    }
    Ok(())
}

/// The segments recovery keeps, as the log opens on them.
struct Kept {
    /// Their sequence numbers, in order.
    seqs: Vec<u64>,
    /// The sealed ones, with their footers.
    sealed: HashMap<u64, (SealedInfo, Bytes)>,
    /// Every one's bytes, for replay.
    data: HashMap<u64, Bytes>,
    /// How to go on writing after the last.
    tail: Tail,
}

/// Syncs the kept segments and sorts them into sealed ones and the tail.
fn open_kept(
    keep: Vec<Seg>,
    entries: &[Scanned],
    rotate_after_junk: bool,
    next_lsn: u64,
) -> Result<Kept, WalError> {
    let mut seqs = Vec::with_capacity(keep.len());
    let mut data = HashMap::new();
    let mut sealed = HashMap::new();
    let mut tail = Tail::Rotate;
    let count = keep.len();
    for (i, seg) in keep.into_iter().enumerate() {
        // After a killed process the page cache may hold what recovery just
        // read (entries, a footer, a trailer) without any sync having covered
        // it: make it durable before anything is decided on top of it.
        seg.file
            .sync_data()
            .map_err(|e| WalError::io("fdatasync", &seg.path, e))?;
        seqs.push(seg.seq);
        data.insert(seg.seq, seg.data.clone());
        let last = i + 1 == count;
        match (seg.sealed, last) {
            (Some(view), _) => {
                sealed.insert(seg.seq, view);
            }
            (None, true) => {
                let pos = entries
                    .iter()
                    .rev()
                    .find(|e| e.seq == seg.seq)
                    .map_or(HEADER_LEN, |e| e.pos + format::entry_len(e.len as usize));
                let first_lsn = entries
                    .iter()
                    .find(|e| e.seq == seg.seq)
                    .map_or(next_lsn, |e| e.lsn);
                let (seq, file) = (seg.seq, seg.file);
                tail = if rotate_after_junk {
                    Tail::SealThenRotate {
                        seq,
                        pos,
                        first_lsn,
                        file,
                    }
                } else {
                    Tail::Continue {
                        seq,
                        pos,
                        first_lsn,
                        file,
                    }
                };
            }
            (None, false) => {
                return Err(WalError::Corrupt {
                    file: seg.path.clone(),
                    position: seg.len.saturating_sub(TRAILER_LEN),
                    reason: "a segment before the log's last one is not sealed".into(),
                });
            }
        }
    }
    Ok(Kept {
        seqs,
        sealed,
        data,
        tail,
    })
}

impl Recovered {
    pub(crate) fn handles(&self, dir: &Path) -> Vec<std::sync::Arc<SegmentHandle>> {
        self.segments
            .iter()
            .map(|&seq| {
                let h = SegmentHandle::new(seq, dir);
                if let Some((view, _)) = self.sealed.get(&seq) {
                    h.set_sealed(*view);
                }
                std::sync::Arc::new(h)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The block-skipping scans answer as a byte-by-byte scan would,
        /// wherever the non-zero bytes sit relative to the blocks.
        #[test]
        fn zero_skipping_scans_match_a_byte_scan(
            len in 0usize..3000,
            marks in proptest::collection::vec((0usize..3000, 1u8..=255), 0..4),
            from in 0u64..3100,
        ) {
            let mut data = vec![0u8; len];
            for (at, b) in marks {
                if at < len {
                    data[at] = b;
                }
            }
            let f = (from as usize).min(len);
            let naive_end = data[f..]
                .iter()
                .rposition(|&b| b != 0)
                .map_or(f as u64, |i| (f + i + 1) as u64);
            prop_assert_eq!(written_end(&data, from), naive_end);
            let from = from & !(ALIGN - 1);
            let end = len as u64;
            // No valid entry in these bytes: only where non-zero bytes are seen.
            let naive_nonzero = (from as usize) < len && data[from as usize..].iter().any(|&b| b != 0);
            let (found, nonzero) = first_valid_after(&data, 1, from, end, 0);
            prop_assert!(found.is_none());
            prop_assert_eq!(nonzero, naive_nonzero);
        }
    }
}
