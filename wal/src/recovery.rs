//! Recovery: find where replay starts, scan the tail, classify damage.
//!
//! Writes reach the disk in sync epochs: the sync thread writes every entry
//! of an epoch, then issues one `fdatasync`, and only then writes the next
//! epoch. So at any crash at most the last epoch can be partly on disk, and
//! each entry records (as `epoch_first_lsn`) which epoch it belongs to.
//!
//! Scanning stops at the first position that is not the expected next entry.
//! What lies beyond decides what that stop means:
//! - nothing but zeros: the clean end of the log;
//! - non-zero bytes, and every valid entry among them belongs to the same
//!   epoch as the stop: a **torn tail**, an epoch that never finished its
//!   sync and so was never acknowledged; it is cut off;
//! - a valid entry of a *later* epoch: the stop's epoch was synced (a later
//!   one was written after it), so acknowledged data is damaged:
//!   **corruption**, and open refuses unless asked to salvage.
//!
//! Replay starts at the newest segment whose first entry (always a
//! checkpoint) is valid, so open time depends on the tail, not on history.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::error::WalError;
use crate::format::{self, ALIGN, EntryKind, HEADER_LEN, Invalid, Probe, TRAILER_LEN};
use crate::options::{RecoveryMode, WalOptions};
use crate::segment::{self, SealedView, SegmentHandle};
use crate::storage::{Storage, StorageFile};

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
}

/// A part of the log that recovery cut off.
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
    /// Files moved aside (`*.damaged`) by salvage.
    pub moved_aside: Vec<PathBuf>,
}

/// The kind of a [`Cut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutKind {
    /// The last sync epoch is incomplete on disk and was cut. Almost always
    /// a write torn by a crash before its sync returned, so never
    /// acknowledged. Damage at rest to the very last synced epoch looks the
    /// same (no later entry proves it was synced), which is why the cut is
    /// always reported.
    TornTail,
    /// Damage to acknowledged entries, cut because the caller asked for
    /// [`RecoveryMode::Salvage`]; entries after the damage were dropped.
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
    /// Sealed segments already mapped during the scan.
    pub sealed: HashMap<u64, Arc<SealedView>>,
    pub entries: Vec<Scanned>,
    pub maps: HashMap<u64, Bytes>,
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
    sealed: Option<Arc<SealedView>>,
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
        let sealed = segment::load_sealed(file.as_ref(), &path, seq, len)?.map(Arc::new);
        let data = file
            .map_readonly(len)
            .map_err(|e| WalError::io("mmap", &path, e))?;
        Ok(Seg {
            seq,
            path,
            file,
            len,
            sealed,
            data,
        })
    }

    /// Where this segment's entries end: its footer if sealed, else its end.
    fn entries_end(&self) -> u64 {
        self.sealed.as_ref().map_or(self.len, |v| v.footer_pos)
    }

    fn first_entry_is_checkpoint(&self) -> bool {
        let end = self.entries_end();
        if end <= HEADER_LEN {
            return false;
        }
        matches!(
            format::probe_entry(&self.data[HEADER_LEN as usize..end as usize], self.seq, u32::MAX),
            Probe::Entry(h) if h.kind == EntryKind::Checkpoint
        )
    }
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
        let end = seg
            .len
            .saturating_sub(if seg.sealed.is_some() { TRAILER_LEN } else { 0 });
        let (found, nonzero) = first_valid_after(&seg.data, seg.seq, from, end, expected);
        if i == stop_index {
            let at_stop = seg
                .data
                .get(stop_pos as usize..(stop_pos + ALIGN).min(seg.len) as usize);
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
        Probe::Entry(h) if at_start && h.kind != EntryKind::Checkpoint => {
            "a segment that does not open with a checkpoint".into()
        }
        Probe::Entry(h) if !at_start && h.kind == EntryKind::Checkpoint => {
            "a checkpoint in the middle of a segment".into()
        }
        Probe::Entry(h) => format!(
            "an entry with LSN {} where LSN {} was expected",
            h.lsn,
            expected.unwrap_or(0)
        ),
    }
}

/// Moves a file aside as `<name>.damaged`, copying it when it must stay.
fn set_aside(storage: &dyn Storage, seg: &Seg, copy: bool) -> Result<PathBuf, WalError> {
    let mut aside = seg.path.clone().into_os_string();
    aside.push(".damaged");
    let aside = PathBuf::from(aside);
    if copy {
        let _ = storage.remove(&aside);
        let f = storage
            .create_new(&aside)
            .map_err(|e| WalError::io("create", &aside, e))?;
        f.write_all_at(&seg.data, 0)
            .map_err(|e| WalError::io("write", &aside, e))?;
        f.sync_data()
            .map_err(|e| WalError::io("fdatasync", &aside, e))?;
    } else {
        storage
            .rename(&seg.path, &aside)
            .map_err(|e| WalError::io("rename", &seg.path, e))?;
    }
    Ok(aside)
}

pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    opts: &WalOptions,
) -> Result<Recovered, WalError> {
    let names = storage
        .list(dir)
        .map_err(|e| WalError::io("list", dir, e))?;
    let mut seqs = Vec::new();
    let mut dir_changed = false;
    for name in names {
        if let Some(seq) = format::parse_segment_file_name(&name) {
            seqs.push(seq);
        } else if name.ends_with(".wal.tmp") {
            // A segment whose creation never finished: it was never renamed
            // into place, so it holds nothing.
            let path = dir.join(&name);
            storage
                .remove(&path)
                .map_err(|e| WalError::io("remove", &path, e))?;
            dir_changed = true;
        }
    }
    seqs.sort_unstable();
    let next_seq = seqs.last().map_or(1, |s| s + 1);

    // Open segments from the newest back to the newest one that opens with
    // a valid checkpoint: replay starts there.
    let mut tail_segs: Vec<Seg> = Vec::new();
    let mut first_opened = seqs.len();
    // Segments salvage set aside whole (unreadable header or footer), with
    // the damage that made it.
    let mut set_aside_whole: Vec<(PathBuf, WalError)> = Vec::new();
    for (i, &seq) in seqs.iter().enumerate().rev() {
        let seg = match Seg::open(storage, dir, seq) {
            Ok(seg) => seg,
            Err(e) if opts.recovery != RecoveryMode::Salvage || !e.is_corruption() => {
                return Err(e);
            }
            Err(e) => {
                // Salvage: a segment whose header or footer is damaged cannot
                // be read at all; set it aside and carry on with the older
                // ones. The report says so.
                let path = dir.join(format::segment_file_name(seq));
                let mut aside = path.clone().into_os_string();
                aside.push(".damaged");
                let aside = PathBuf::from(aside);
                storage
                    .rename(&path, &aside)
                    .map_err(|e| WalError::io("rename", &path, e))?;
                dir_changed = true;
                first_opened = i;
                set_aside_whole.push((aside, e));
                continue;
            }
        };
        let is_start = seg.first_entry_is_checkpoint();
        tail_segs.push(seg);
        first_opened = i;
        if is_start {
            break;
        }
    }
    tail_segs.reverse();
    // Older segments are sealed and are read only on demand: open reads the
    // tail only. Their format version is that of the tail or older (a build
    // writes its own version, and versions only grow), so a tail this build
    // can read means older segments it can read too.
    let older: Vec<u64> = seqs[..first_opened].to_vec();

    let mut report = RecoveryReport::default();
    let mut entries: Vec<Scanned> = Vec::new();
    let mut expected: Option<u64> = None;
    // (segment index in tail_segs, position, description)
    let mut stop: Option<(usize, u64, String)> = None;
    for (i, seg) in tail_segs.iter().enumerate() {
        report.scanned_segments += 1;
        let end = seg.entries_end();
        let mut pos = HEADER_LEN;
        let first_in_seg = entries.len();
        while pos < end {
            let probe =
                format::probe_entry(&seg.data[pos as usize..end as usize], seg.seq, u32::MAX);
            let at_start = pos == HEADER_LEN;
            match probe {
                Probe::Entry(h)
                    if (h.kind == EntryKind::Checkpoint) == at_start
                        && expected.is_none_or(|e| h.lsn == e) =>
                {
                    entries.push(Scanned {
                        seq: seg.seq,
                        pos,
                        lsn: h.lsn,
                        kind: h.kind,
                        len: h.len,
                    });
                    expected = Some(h.lsn + 1);
                    pos += h.encoded_len();
                }
                other => {
                    stop = Some((i, pos, describe(other, expected, at_start)));
                    break;
                }
            }
        }
        report.scanned_bytes += pos - HEADER_LEN;
        if stop.is_some() {
            break;
        }
        match &seg.sealed {
            Some(view) => {
                let (first, last) = match (entries.get(first_in_seg), entries.last()) {
                    (Some(f), Some(l)) if entries.len() > first_in_seg => (f.lsn, l.lsn),
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
            }
            None => {
                // An unsealed segment that runs to its very end: the log
                // stops here; anything in later segments is examined below.
                stop = Some((i, pos, "the segment file ends here".into()));
                break;
            }
        }
    }

    let mut cut: Option<Cut> = None;
    // Whether the segment the log ends in holds junk past its last entry, so
    // that it must be sealed rather than appended to.
    let mut rotate_after_junk = false;
    if let Some((stop_index, stop_pos, reason)) = stop {
        let seg = &tail_segs[stop_index];
        let exp = expected.unwrap_or(1);
        if seg.sealed.is_some() {
            // A sealed segment's entries were all synced before its footer.
            return Err(WalError::Corrupt {
                file: seg.path.clone(),
                position: stop_pos,
                reason: format!("{reason} inside a sealed segment"),
            });
        }
        // A footer right after the last entry, whose trailer never became
        // durable: a seal was interrupted. Nothing was lost; seal again.
        // (The last entry's padding may run past the end of the file, so the
        // stop can lie beyond it.)
        let footer_at_stop = seg
            .data
            .get(stop_pos as usize..)
            .and_then(|rest| format::decode_footer(rest, seg.seq));
        let interrupted_seal = footer_at_stop
            .is_some_and(|f| expected.is_some_and(|e| f.last_lsn.checked_add(1) == Some(e)));
        let (beyond, nonzero) = if interrupted_seal {
            let footer_len =
                footer_at_stop.map_or(0, |f| format::FOOTER_HEADER_LEN as u64 + u64::from(f.len));
            let after = format::align_up(stop_pos + footer_len);
            let (b, _) = look_beyond(&tail_segs, stop_index, after.saturating_sub(ALIGN), exp);
            (b, true)
        } else {
            look_beyond(&tail_segs, stop_index, stop_pos, exp)
        };
        let damage = match &beyond {
            // A valid entry of an epoch that began after the stop: the stop's
            // epoch had been synced, so acknowledged data is damaged.
            Some(b) if b.epoch_first_lsn > exp || b.seg_index != stop_index => Some(format!(
                "{reason}, yet a valid entry (LSN {}) of a later sync follows at byte {} of {}",
                b.lsn,
                b.pos,
                tail_segs[b.seg_index].path.display()
            )),
            _ => None,
        };
        if let Some(damage) = damage {
            if opts.recovery != RecoveryMode::Salvage {
                return Err(WalError::Corrupt {
                    file: seg.path.clone(),
                    position: stop_pos,
                    reason: damage,
                });
            }
            let mut moved = vec![set_aside(storage, seg, true)?];
            for later in tail_segs.drain(stop_index + 1..) {
                moved.push(set_aside(storage, &later, false)?);
            }
            dir_changed = true;
            cut = Some(Cut {
                kind: CutKind::Salvaged,
                file: tail_segs[stop_index].path.clone(),
                position: stop_pos,
                reason: damage,
                moved_aside: moved,
            });
            rotate_after_junk = true;
        } else if interrupted_seal && beyond.is_none() {
            // Not damage: the seal is redone after recovery.
            rotate_after_junk = true;
        } else if beyond.is_some() || nonzero {
            if opts.recovery == RecoveryMode::AbsoluteConsistency {
                return Err(WalError::Corrupt {
                    file: seg.path.clone(),
                    position: stop_pos,
                    reason: format!("{reason}: a torn tail, refused by AbsoluteConsistency"),
                });
            }
            cut = Some(Cut {
                kind: CutKind::TornTail,
                file: seg.path.clone(),
                position: stop_pos,
                reason: format!("{reason}: the last sync never completed"),
                moved_aside: Vec::new(),
            });
            rotate_after_junk = true;
        }
        // Segments after the one the log ends in hold no valid entry.
        for later in tail_segs.drain(stop_index + 1..) {
            storage
                .remove(&later.path)
                .map_err(|e| WalError::io("remove", &later.path, e))?;
            dir_changed = true;
        }
    }
    // A trailing segment without a single valid entry holds nothing (a
    // pre-created segment, or one whose first sync was torn): drop it.
    while let Some(last) = tail_segs.last() {
        if entries.iter().any(|e| e.seq == last.seq) {
            break;
        }
        storage
            .remove(&last.path)
            .map_err(|e| WalError::io("remove", &last.path, e))?;
        dir_changed = true;
        tail_segs.pop();
        rotate_after_junk = false;
    }
    if dir_changed {
        storage
            .sync_dir(dir)
            .map_err(|e| WalError::io("sync directory", dir, e))?;
    }

    if !set_aside_whole.is_empty() && cut.is_none() {
        let reason = set_aside_whole
            .iter()
            .map(|(_, e)| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        let last_kept = tail_segs.last().map(|s| (s.path.clone(), s.entries_end()));
        cut = Some(Cut {
            kind: CutKind::Salvaged,
            file: last_kept
                .as_ref()
                .map_or_else(|| dir.to_path_buf(), |k| k.0.clone()),
            position: last_kept.map_or(0, |k| k.1),
            reason,
            moved_aside: set_aside_whole.into_iter().map(|(p, _)| p).collect(),
        });
    }
    let next_lsn = expected.unwrap_or(1);
    let mut maps = HashMap::new();
    let mut sealed = HashMap::new();
    let mut segments = older;
    let mut tail = Tail::Rotate;
    let count = tail_segs.len();
    for (i, seg) in tail_segs.into_iter().enumerate() {
        // After a killed process the page cache may hold what recovery just
        // read (entries, a footer, a trailer) without any sync having covered
        // it: make it durable before anything is decided on top of it.
        seg.file
            .sync_data()
            .map_err(|e| WalError::io("fdatasync", &seg.path, e))?;
        segments.push(seg.seq);
        maps.insert(seg.seq, seg.data.clone());
        let last = i + 1 == count;
        match (&seg.sealed, last) {
            (Some(view), _) => {
                sealed.insert(seg.seq, Arc::clone(view));
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
                tail = if rotate_after_junk {
                    Tail::SealThenRotate {
                        seq: seg.seq,
                        pos,
                        first_lsn,
                        file: seg.file,
                    }
                } else {
                    Tail::Continue {
                        seq: seg.seq,
                        pos,
                        first_lsn,
                        file: seg.file,
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
    report.segments = segments.len();
    report.entries_replayed = entries.len() as u64;
    report.next_lsn = next_lsn;
    report.cut = cut;
    Ok(Recovered {
        segments,
        sealed,
        entries,
        maps,
        tail,
        next_seq,
        next_lsn,
        report,
    })
}

impl Recovered {
    pub(crate) fn handles(&self, dir: &Path) -> Vec<Arc<SegmentHandle>> {
        self.segments
            .iter()
            .map(|&seq| {
                let h = SegmentHandle::new(seq, dir);
                if let Some(view) = self.sealed.get(&seq) {
                    h.set_sealed(Arc::clone(view));
                }
                Arc::new(h)
            })
            .collect()
    }
}
