//! Offline verification of every segment, for `fencelog verify` and `dump`.

use std::path::{Path, PathBuf};

use crate::error::WalError;
use crate::format::{self, EntryKind, HEADER_LEN, Probe};
use crate::recovery::first_valid_after;
use crate::segment;
use crate::storage;
use crate::storage::Storage;

/// What verification found in one segment.
#[derive(Debug, Clone)]
pub struct SegmentReport {
    /// The segment's sequence number.
    pub seq: u64,
    /// Its file.
    pub path: PathBuf,
    /// Its length in bytes.
    pub len: u64,
    /// Whether it carries a valid footer and trailer.
    pub sealed: bool,
    /// Valid entries read.
    pub entries: u64,
    /// LSN of its first valid entry.
    pub first_lsn: Option<u64>,
    /// LSN of its last valid entry.
    pub last_lsn: Option<u64>,
    /// Damage: the byte position and what is wrong there.
    pub damage: Option<(u64, String)>,
    /// A torn tail (an unfinished last sync): where it starts.
    pub torn_tail_at: Option<u64>,
}

/// What verification found in a whole log.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// One report per segment, oldest first.
    pub segments: Vec<SegmentReport>,
    /// Valid entries in all segments.
    pub entries: u64,
    /// Bytes of all segment files.
    pub bytes: u64,
}

impl VerifyReport {
    /// Whether any segment is damaged (a torn tail is not damage).
    pub fn is_damaged(&self) -> bool {
        self.segments.iter().any(|s| s.damage.is_some())
    }
}

/// One valid entry, as verification visits it.
#[derive(Debug)]
pub struct VerifiedEntry<'a> {
    /// The segment it is in.
    pub segment: u64,
    /// Its byte position there.
    pub position: u64,
    /// Its log sequence number.
    pub lsn: u64,
    /// What it is for.
    pub kind: EntryKind,
    /// Its payload.
    pub payload: &'a [u8],
}

/// Reads every segment of the log in `dir` and checks every entry, footer
/// and trailer, calling `on_entry` for each valid entry in log order and
/// `on_progress(bytes_done, bytes_total)` as it goes.
///
/// Takes the directory's lock: a log in use by another process is refused.
pub fn verify(
    storage: &dyn Storage,
    dir: &Path,
    mut on_entry: impl FnMut(&VerifiedEntry<'_>),
    mut on_progress: impl FnMut(u64, u64),
) -> Result<VerifyReport, WalError> {
    let _lock = crate::wal::lock_dir(storage, dir)?;
    let (seqs, _) = crate::recovery::list_segments(storage, dir)?;
    // Sizes first, for the progress report: one file open at a time.
    let mut total = 0;
    for &seq in &seqs {
        let path = dir.join(format::segment_file_name(seq));
        let len = storage
            .open(&path)
            .and_then(|f| f.len())
            .map_err(|e| WalError::io("open", &path, e))?;
        total += len;
    }
    let mut report = VerifyReport {
        bytes: total,
        ..VerifyReport::default()
    };
    let mut done = 0;
    let mut expected: Option<u64> = None;
    for &seq in &seqs {
        let seg = verify_segment(storage, dir, seq, &mut expected, &mut on_entry)?;
        report.entries += seg.entries;
        done += seg.len;
        on_progress(done, total);
        report.segments.push(seg);
    }
    // Only the last segment with entries may be unsealed; empty segments
    // after it were created ahead of need.
    let last_with_entries = report.segments.iter().rposition(|s| s.entries > 0);
    if let Some(last) = last_with_entries {
        for seg in &mut report.segments[..last] {
            if !seg.sealed && seg.damage.is_none() {
                let at = seg.len;
                seg.damage = Some((at, "a segment before the last one is not sealed".into()));
            }
        }
    }
    Ok(report)
}

/// Verifies segment `seq`, whose first entry must carry `expected` (or,
/// after removed segments, a later LSN); moves `expected` past its last.
/// One segment open and in memory at a time, whatever the log's size.
fn verify_segment(
    storage: &dyn Storage,
    dir: &Path,
    seq: u64,
    expected: &mut Option<u64>,
    on_entry: &mut impl FnMut(&VerifiedEntry<'_>),
) -> Result<SegmentReport, WalError> {
    let path = dir.join(format::segment_file_name(seq));
    let file = storage
        .open(&path)
        .map_err(|e| WalError::io("open", &path, e))?;
    let len = file.len().map_err(|e| WalError::io("stat", &path, e))?;
    let mut seg = SegmentReport {
        seq,
        path: path.clone(),
        len,
        sealed: false,
        entries: 0,
        first_lsn: None,
        last_lsn: None,
        damage: None,
        torn_tail_at: None,
    };
    if let Err(e) = segment::check_header(file.as_ref(), &path, seq) {
        if let WalError::UnknownVersion { .. } = e {
            return Err(e);
        }
        seg.damage = Some((0, e.to_string()));
        return Ok(seg);
    }
    let sealed = match segment::load_sealed(file.as_ref(), &path, seq, len) {
        Ok(v) => v.map(|(info, _)| info),
        Err(e) => {
            seg.damage = Some((len.saturating_sub(format::TRAILER_LEN), e.to_string()));
            None
        }
    };
    seg.sealed = sealed.is_some();
    let data =
        storage::read_prefix(file.as_ref(), len).map_err(|e| WalError::io("read", &path, e))?;
    drop(file);
    let end = sealed.as_ref().map_or(len, |v| v.footer_pos);
    if let Some((at, what)) = scan_entries(&mut seg, &data, end, expected, on_entry) {
        judge_stop(&mut seg, &data, at, &what, expected.unwrap_or(1));
    }
    if let Some(view) = &sealed
        && (seg.first_lsn, seg.last_lsn) != (Some(view.first_lsn), Some(view.last_lsn))
        && seg.damage.is_none()
    {
        seg.damage = Some((
            view.footer_pos,
            format!(
                "the footer says LSNs {}..={}, the entries hold {:?}..={:?}",
                view.first_lsn, view.last_lsn, seg.first_lsn, seg.last_lsn
            ),
        ));
    }
    Ok(seg)
}

/// Walks the segment's entries up to `end`, visiting each valid one;
/// answers where and why the valid entries stop before `end`, if they do.
fn scan_entries(
    seg: &mut SegmentReport,
    data: &[u8],
    end: u64,
    expected: &mut Option<u64>,
    on_entry: &mut impl FnMut(&VerifiedEntry<'_>),
) -> Option<(u64, String)> {
    let mut pos = HEADER_LEN;
    while pos < end {
        match format::probe_entry(&data[pos as usize..end as usize], seg.seq, u32::MAX) {
            // Every segment opens with a checkpoint or a link, and only
            // there.
            Probe::Entry(h) if h.kind.opens_segment() != (pos == HEADER_LEN) => {
                let what = if pos == HEADER_LEN {
                    "a segment that does not open with a checkpoint or a link"
                } else {
                    "a checkpoint or link in the middle of a segment"
                };
                return Some((pos, what.into()));
            }
            // A segment's first entry may skip LSNs forward: the segments
            // between were removed once nothing in them was needed.
            Probe::Entry(h)
                if expected.is_none_or(|e| h.lsn == e || (pos == HEADER_LEN && h.lsn > e)) =>
            {
                let start = pos as usize + format::ENTRY_HEADER_LEN;
                on_entry(&VerifiedEntry {
                    segment: seg.seq,
                    position: pos,
                    lsn: h.lsn,
                    kind: h.kind,
                    payload: &data[start..start + h.len as usize],
                });
                seg.entries += 1;
                seg.first_lsn.get_or_insert(h.lsn);
                seg.last_lsn = Some(h.lsn);
                *expected = Some(h.lsn + 1);
                pos += h.encoded_len();
            }
            Probe::Zeros => return Some((pos, "zeros".into())),
            Probe::Entry(h) => {
                return Some((
                    pos,
                    format!(
                        "an entry with LSN {} where LSN {} was expected",
                        h.lsn,
                        expected.unwrap_or(0)
                    ),
                ));
            }
            Probe::Invalid(why) => return Some((pos, format!("an invalid entry ({why:?})"))),
        }
    }
    None
}

/// Says what a stop at `at` is: damage (inside a sealed segment, or with
/// a valid entry of a later sync after it), a torn tail, an interrupted
/// seal or the plain end of the entries. `exp` is the LSN the next valid
/// entry would carry.
fn judge_stop(seg: &mut SegmentReport, data: &[u8], at: u64, what: &str, exp: u64) {
    if seg.sealed {
        seg.damage
            .get_or_insert((at, format!("{what} inside a sealed segment")));
        return;
    }
    // A footer right after the last entry with no trailer: a seal
    // interrupted by a crash, which recovery redoes. Not damage.
    let interrupted_seal = data
        .get(at as usize..)
        .and_then(|rest| format::decode_footer(rest, seg.seq))
        .is_some_and(|f| f.last_lsn.checked_add(1) == Some(exp));
    let (found, nonzero) = first_valid_after(data, seg.seq, at + 8, seg.len, exp);
    match found {
        Some((p, h)) if h.epoch_first_lsn > exp => {
            seg.damage = Some((
                at,
                format!(
                    "{what}, yet a valid entry (LSN {}) of a later sync follows at byte {p}",
                    h.lsn
                ),
            ));
        }
        None if interrupted_seal => {}
        Some(_) => seg.torn_tail_at = Some(at),
        None if nonzero || what != "zeros" => seg.torn_tail_at = Some(at),
        None => {}
    }
}
