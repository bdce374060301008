//! Segment files as the reader sees them: a header, entries, and for a
//! sealed segment a footer and a trailer. Everything is read with
//! positional reads into memory the reader owns: no memory maps, so a disk
//! that fails or a file cut short behind the log's back answers an error
//! for that read instead of killing the process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;

use crate::error::WalError;
use crate::format::{
    self, ENTRY_HEADER_LEN, EntryKind, FOOTER_HEADER_LEN, HEADER_LEN, HeaderError, Probe,
    TRAILER_LEN,
};
use crate::storage::StorageFile;

/// Where a sealed segment's footer is, and the LSNs it covers. Small and
/// kept for every segment once known; the footer's payload is read on
/// demand (and cached by the log, within a budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedInfo {
    /// Where the entries end and the footer begins.
    pub footer_pos: u64,
    /// The footer's payload length.
    pub footer_payload_len: u32,
    pub first_lsn: u64,
    pub last_lsn: u64,
}

/// One segment known to the log. Its file is opened through the log's file
/// cache, so that the number of open files does not grow with the number
/// of segments.
pub(crate) struct SegmentHandle {
    pub seq: u64,
    pub path: PathBuf,
    sealed: OnceLock<SealedInfo>,
    /// The file's length as last asked (0: not yet). A segment's file
    /// never shrinks, so a read within it needs no `stat`.
    known_len: AtomicU64,
}

impl SegmentHandle {
    pub(crate) fn new(seq: u64, dir: &Path) -> SegmentHandle {
        SegmentHandle {
            seq,
            path: dir.join(format::segment_file_name(seq)),
            sealed: OnceLock::new(),
            known_len: AtomicU64::new(0),
        }
    }

    /// The file's length as last asked, 0 if never.
    pub(crate) fn known_len(&self) -> u64 {
        self.known_len.load(Ordering::Relaxed)
    }

    /// Notes the file's length, just asked.
    pub(crate) fn set_known_len(&self, len: u64) {
        self.known_len.fetch_max(len, Ordering::Relaxed);
    }

    pub(crate) fn set_sealed(&self, info: SealedInfo) {
        let _ = self.sealed.set(info);
    }

    pub(crate) fn sealed_now(&self) -> Option<SealedInfo> {
        self.sealed.get().copied()
    }
}

/// Reads and checks a segment's header.
pub(crate) fn check_header(file: &dyn StorageFile, path: &Path, seq: u64) -> Result<(), WalError> {
    let mut header = [0u8; HEADER_LEN as usize];
    let corrupt = |reason: &str| WalError::Corrupt {
        file: path.to_path_buf(),
        position: 0,
        reason: reason.to_string(),
    };
    file.read_exact_at(&mut header, 0).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt("the segment header is missing (file shorter than 64 bytes)")
        } else {
            WalError::io("read", path, e)
        }
    })?;
    check_header_bytes(&header, path, seq)
}

/// Checks the 64 header bytes of segment `seq`.
pub(crate) fn check_header_bytes(header: &[u8], path: &Path, seq: u64) -> Result<(), WalError> {
    let corrupt = |reason: &str| WalError::Corrupt {
        file: path.to_path_buf(),
        position: 0,
        reason: reason.to_string(),
    };
    match format::decode_header(header) {
        Ok(found) if found == seq => Ok(()),
        Ok(found) => Err(corrupt(&format!(
            "the header names segment {found}, the file name segment {seq}"
        ))),
        Err(HeaderError::UnknownVersion(found)) => Err(WalError::UnknownVersion {
            file: path.to_path_buf(),
            found,
            supported: format::FORMAT_VERSION,
        }),
        Err(HeaderError::BadMagic) => Err(corrupt("not a fencelog segment (bad magic number)")),
        Err(HeaderError::Short) => Err(corrupt(
            "the segment header is missing (file shorter than 64 bytes)",
        )),
        Err(HeaderError::Checksum) => Err(corrupt("the segment header's checksum does not match")),
    }
}

/// Reads a segment's trailer and footer. `Ok(None)` when there is no valid
/// trailer (the segment is not sealed); an error when a valid trailer points
/// at a footer that does not check out (the trailer is written only after the
/// footer is durable, so that is damage, not a crash). Answers the footer's
/// payload too.
pub(crate) fn load_sealed(
    file: &dyn StorageFile,
    path: &Path,
    seq: u64,
    len: u64,
) -> Result<Option<(SealedInfo, Bytes)>, WalError> {
    if len < HEADER_LEN + FOOTER_HEADER_LEN as u64 + TRAILER_LEN {
        return Ok(None);
    }
    let mut tb = [0u8; TRAILER_LEN as usize];
    file.read_exact_at(&mut tb, len - TRAILER_LEN)
        .map_err(|e| WalError::io("read", path, e))?;
    let Some(trailer) = format::decode_trailer(&tb, seq) else {
        return Ok(None);
    };
    let corrupt = |position: u64, reason: String| WalError::Corrupt {
        file: path.to_path_buf(),
        position,
        reason,
    };
    trailer
        .footer_pos
        .checked_add(u64::from(trailer.footer_len))
        .filter(|&end| {
            trailer.footer_pos >= HEADER_LEN
                && trailer.footer_pos % format::ALIGN == 0
                && u64::from(trailer.footer_len) >= FOOTER_HEADER_LEN as u64
                && end <= len - TRAILER_LEN
        })
        .ok_or_else(|| {
            corrupt(
                len - TRAILER_LEN,
                format!(
                    "the trailer points at a footer at {}+{} outside the file of {len} bytes",
                    trailer.footer_pos, trailer.footer_len
                ),
            )
        })?;
    // Bounded by the file's length, checked just above.
    let mut footer = vec![0u8; trailer.footer_len as usize];
    file.read_exact_at(&mut footer, trailer.footer_pos)
        .map_err(|e| WalError::io("read", path, e))?;
    let header = format::decode_footer(&footer, seq)
        .filter(|h| FOOTER_HEADER_LEN as u64 + u64::from(h.len) == u64::from(trailer.footer_len))
        .ok_or_else(|| {
            corrupt(
                trailer.footer_pos,
                "the footer's checksum or length does not match its trailer".into(),
            )
        })?;
    let payload = Bytes::from(footer).slice(FOOTER_HEADER_LEN..);
    Ok(Some((
        SealedInfo {
            footer_pos: trailer.footer_pos,
            footer_payload_len: header.len,
            first_lsn: header.first_lsn,
            last_lsn: header.last_lsn,
        },
        payload,
    )))
}

/// Reads a sealed segment's footer payload (its trailer was checked when
/// `info` was made), checking its checksum again: the bytes come from disk.
pub(crate) fn read_footer(
    file: &dyn StorageFile,
    path: &Path,
    seq: u64,
    info: SealedInfo,
) -> Result<Bytes, WalError> {
    let mut footer = vec![0u8; FOOTER_HEADER_LEN + info.footer_payload_len as usize];
    file.read_exact_at(&mut footer, info.footer_pos)
        .map_err(|e| WalError::io("read", path, e))?;
    match format::decode_footer(&footer, seq) {
        Some(h) if h.len == info.footer_payload_len => {
            Ok(Bytes::from(footer).slice(FOOTER_HEADER_LEN..))
        }
        _ => Err(WalError::Corrupt {
            file: path.to_path_buf(),
            position: info.footer_pos,
            reason: "the footer's checksum does not match (it did when the segment was opened)"
                .into(),
        }),
    }
}

/// An entry read back from the log.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its log sequence number.
    pub lsn: u64,
    /// What it is for.
    pub kind: EntryKind,
    /// Its payload: a slice of a buffer read for this entry (slices of it
    /// never copy).
    pub payload: Bytes,
}

/// How much the first read of an entry takes, learned from the entries
/// read before it: a quarter more than the last entry that did not fit,
/// or that was less than half of it. Entries of about one size then take
/// one system call each, with no more copied, zeroed and held by the
/// entry's payload than a little more than the entry, and the hint is
/// written only when the size moves. A fixed 4 KiB first read cost a
/// read of a 100-byte record at pipeline 16 a third of its instructions,
/// and a reply of many small records 4 KiB of memory each (docs/DESIGN.md,
/// "Reading an entry").
pub(crate) struct ReadSize(AtomicU32);

/// The first read before any entry was read.
const FIRST_READ: u32 = 512;
/// The first read is never larger than this (a multiple of 64, as every
/// hint is): a hint from one large entry costs a later small read at most
/// this much.
const MAX_FIRST_READ: u32 = 64 << 10;

impl ReadSize {
    pub(crate) fn new() -> ReadSize {
        ReadSize(AtomicU32::new(FIRST_READ))
    }

    fn first(&self) -> u64 {
        u64::from(self.0.load(Ordering::Relaxed))
    }

    /// Notes an entry of `whole` bytes.
    fn saw(&self, whole: u64) {
        let hint = self.first();
        if whole <= hint && whole.saturating_mul(2) >= hint {
            return;
        }
        let want = whole
            .saturating_add(whole / 4)
            .clamp(ENTRY_HEADER_LEN as u64, u64::from(MAX_FIRST_READ))
            .next_multiple_of(64) as u32;
        self.0.store(want, Ordering::Relaxed);
    }
}

/// Reads and checks the entry at `pos` of segment `seq`, whose entries end
/// at `end` (a sealed segment's footer, or the file's end), with a payload
/// of at most `max_len` bytes. `Ok(None)` when there is no valid entry
/// there; an error only when the file cannot be read.
pub(crate) fn read_entry_at(
    file: &dyn StorageFile,
    path: &Path,
    seq: u64,
    pos: u64,
    end: u64,
    max_len: u32,
    size: &ReadSize,
) -> Result<Option<Entry>, WalError> {
    if pos < HEADER_LEN || !pos.is_multiple_of(format::ALIGN) || pos + ENTRY_HEADER_LEN as u64 > end
    {
        return Ok(None);
    }
    let avail = end - pos;
    let first = size.first().min(avail) as usize;
    let mut buf = vec![0u8; first];
    file.read_exact_at(&mut buf, pos).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            WalError::Corrupt {
                file: path.to_path_buf(),
                position: pos,
                reason: format!("the file ends before byte {}", pos + first as u64),
            }
        } else {
            WalError::io("read", path, e)
        }
    })?;
    let len = format::u32_at(&buf, 4);
    if len > max_len {
        return Ok(None);
    }
    let whole = ENTRY_HEADER_LEN as u64 + u64::from(len);
    if whole > avail {
        return Ok(None);
    }
    size.saw(whole);
    if whole as usize > buf.len() {
        let have = buf.len();
        buf.resize(whole as usize, 0);
        file.read_exact_at(&mut buf[have..], pos + have as u64)
            .map_err(|e| WalError::io("read", path, e))?;
    }
    buf.truncate(whole as usize);
    // The payload holds the buffer as long as any record of the entry is
    // kept (a reply of many small records holds one per entry): a first
    // read much larger than the entry gives the rest back (glibc shrinks
    // in place).
    if buf.capacity() > 2 * buf.len() {
        buf.shrink_to_fit();
    }
    match format::probe_entry(&buf, seq, max_len) {
        Probe::Entry(h) => Ok(Some(Entry {
            lsn: h.lsn,
            kind: h.kind,
            payload: Bytes::from(buf).slice(ENTRY_HEADER_LEN..),
        })),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_read_follows_the_last_entry_within_its_bounds() {
        let size = ReadSize::new();
        assert_eq!(size.first(), 512);
        size.saw(180);
        assert_eq!(size.first(), 256, "a quarter more, in 64-byte steps");
        for whole in [129, 200, 256, 170] {
            size.saw(whole);
            assert_eq!(size.first(), 256, "kept for an entry of {whole}");
        }
        size.saw(257);
        assert_eq!(size.first(), 384, "raised for one that did not fit");
        size.saw(100);
        assert_eq!(size.first(), 128, "lowered for one less than half of it");
        size.saw(3);
        assert_eq!(size.first(), 64, "never below a header");
        size.saw(10 << 20);
        assert_eq!(size.first(), 64 << 10, "never past the ceiling");
        size.saw(u64::MAX);
        assert_eq!(size.first(), 64 << 10);
    }
}
