//! Segment files as the reader sees them: opened lazily, sealed ones mapped.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::error::WalError;
use crate::format::{
    self, ENTRY_HEADER_LEN, EntryHeader, EntryKind, FOOTER_HEADER_LEN, HEADER_LEN, HeaderError,
    Probe, TRAILER_LEN,
};
use crate::storage::{Storage, StorageFile};

/// A sealed segment, mapped: its entries, and its footer's payload.
pub(crate) struct SealedView {
    /// Bytes `[0, footer end)` of the file.
    pub data: Bytes,
    /// Where the entries end and the footer begins.
    pub footer_pos: u64,
    /// The footer's payload (what the layer above stored there).
    pub footer: Bytes,
    pub first_lsn: u64,
    pub last_lsn: u64,
}

/// One segment file. Files of old sealed segments are opened on first use,
/// so that opening a log touches only its tail.
pub(crate) struct SegmentHandle {
    pub seq: u64,
    pub path: PathBuf,
    file: OnceLock<Box<dyn StorageFile>>,
    sealed: OnceLock<Arc<SealedView>>,
    /// Serializes the lazy open-and-map so that two readers do not map twice.
    loading: Mutex<()>,
}

impl SegmentHandle {
    pub(crate) fn new(seq: u64, dir: &Path) -> SegmentHandle {
        SegmentHandle {
            seq,
            path: dir.join(format::segment_file_name(seq)),
            file: OnceLock::new(),
            sealed: OnceLock::new(),
            loading: Mutex::new(()),
        }
    }

    pub(crate) fn with_file(seq: u64, dir: &Path, file: Box<dyn StorageFile>) -> SegmentHandle {
        let handle = SegmentHandle::new(seq, dir);
        let _ = handle.file.set(file);
        handle
    }

    pub(crate) fn file(&self, storage: &dyn Storage) -> Result<&dyn StorageFile, WalError> {
        if let Some(f) = self.file.get() {
            return Ok(f.as_ref());
        }
        let _guard = self.loading.lock();
        if let Some(f) = self.file.get() {
            return Ok(f.as_ref());
        }
        let f = storage
            .open(&self.path)
            .map_err(|e| WalError::io("open", &self.path, e))?;
        check_header(f.as_ref(), &self.path, self.seq)?;
        Ok(self.file.get_or_init(|| f).as_ref())
    }

    pub(crate) fn set_sealed(&self, view: Arc<SealedView>) {
        let _ = self.sealed.set(view);
    }

    pub(crate) fn sealed_now(&self) -> Option<&Arc<SealedView>> {
        self.sealed.get()
    }

    /// The mapped view of a segment known to be sealed, loading it if needed.
    pub(crate) fn sealed_view(&self, storage: &dyn Storage) -> Result<&Arc<SealedView>, WalError> {
        if let Some(v) = self.sealed.get() {
            return Ok(v);
        }
        let file = self.file(storage)?;
        let _guard = self.loading.lock();
        if let Some(v) = self.sealed.get() {
            return Ok(v);
        }
        let len = file
            .len()
            .map_err(|e| WalError::io("stat", &self.path, e))?;
        let view =
            load_sealed(file, &self.path, self.seq, len)?.ok_or_else(|| WalError::Corrupt {
                file: self.path.clone(),
                position: len.saturating_sub(TRAILER_LEN),
                reason: "a segment older than the log's tail has no valid trailer".into(),
            })?;
        Ok(self.sealed.get_or_init(|| Arc::new(view)))
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
    match format::decode_header(&header) {
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
        Err(HeaderError::Short) => Err(corrupt("the segment header is truncated")),
        Err(HeaderError::Checksum) => Err(corrupt("the segment header's checksum does not match")),
    }
}

/// Reads a segment's trailer and footer. `Ok(None)` when there is no valid
/// trailer (the segment is not sealed); an error when a valid trailer points
/// at a footer that does not check out (the trailer is written only after the
/// footer is durable, so that is damage, not a crash).
pub(crate) fn load_sealed(
    file: &dyn StorageFile,
    path: &Path,
    seq: u64,
    len: u64,
) -> Result<Option<SealedView>, WalError> {
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
    let footer_end = trailer
        .footer_pos
        .checked_add(u64::from(trailer.footer_len))
        .filter(|&end| {
            trailer.footer_pos >= HEADER_LEN
                && trailer.footer_pos % format::ALIGN == 0
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
    let data = file
        .map_readonly(footer_end)
        .map_err(|e| WalError::io("mmap", path, e))?;
    let footer_bytes = &data[trailer.footer_pos as usize..];
    let header = format::decode_footer(footer_bytes, seq)
        .filter(|h| FOOTER_HEADER_LEN as u64 + u64::from(h.len) == u64::from(trailer.footer_len))
        .ok_or_else(|| {
            corrupt(
                trailer.footer_pos,
                "the footer's checksum or length does not match its trailer".into(),
            )
        })?;
    let footer_start = trailer.footer_pos as usize + FOOTER_HEADER_LEN;
    let footer = data.slice(footer_start..footer_start + header.len as usize);
    Ok(Some(SealedView {
        data,
        footer_pos: trailer.footer_pos,
        footer,
        first_lsn: header.first_lsn,
        last_lsn: header.last_lsn,
    }))
}

/// An entry read back from the log.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its log sequence number.
    pub lsn: u64,
    /// What it is for.
    pub kind: EntryKind,
    /// Its payload; a slice of a memory map for sealed segments.
    pub payload: Bytes,
}

/// Decodes the entry at `pos` of a mapped sealed segment, without copying.
pub(crate) fn entry_in_view(view: &SealedView, seq: u64, pos: u64) -> Option<Entry> {
    if pos < HEADER_LEN || pos >= view.footer_pos || !pos.is_multiple_of(format::ALIGN) {
        return None;
    }
    let bytes = &view.data[pos as usize..view.footer_pos as usize];
    match format::probe_entry(bytes, seq, u32::MAX) {
        Probe::Entry(h) => Some(Entry {
            lsn: h.lsn,
            kind: h.kind,
            payload: payload_of(&view.data, pos, &h),
        }),
        _ => None,
    }
}

fn payload_of(data: &Bytes, pos: u64, h: &EntryHeader) -> Bytes {
    let start = pos as usize + ENTRY_HEADER_LEN;
    data.slice(start..start + h.len as usize)
}

/// Reads and checks the entry at `pos` of an unsealed segment by positional
/// reads (never a map: the tail may still be sealed over or grow).
pub(crate) fn read_entry_at(
    file: &dyn StorageFile,
    path: &Path,
    seq: u64,
    pos: u64,
    max_len: u32,
) -> Result<Option<Entry>, WalError> {
    let mut header = [0u8; ENTRY_HEADER_LEN];
    match file.read_exact_at(&mut header, pos) {
        Ok(()) => {}
        // Past the end of the file: there is no entry there.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(WalError::io("read", path, e)),
    }
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > max_len {
        return Ok(None);
    }
    let mut buf = vec![0u8; ENTRY_HEADER_LEN + len as usize];
    file.read_exact_at(&mut buf, pos)
        .map_err(|e| WalError::io("read", path, e))?;
    match format::probe_entry(&buf, seq, max_len) {
        Probe::Entry(h) => {
            let data = Bytes::from(buf);
            Ok(Some(Entry {
                lsn: h.lsn,
                kind: h.kind,
                payload: data.slice(ENTRY_HEADER_LEN..),
            }))
        }
        _ => Ok(None),
    }
}
