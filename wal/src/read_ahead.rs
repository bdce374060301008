//! Reading a segment's entries ahead of the ones asked for.
//!
//! A read of a range of records goes through one stream's entries in
//! position order. Where they lie close together (a stream written alone,
//! or in large batches) one `pread` per entry costs a system call for a
//! few hundred bytes each: 100 records of 100 bytes took 100. A
//! [`ReadAhead`] notices entries asked for one shortly after the other
//! and reads the next ones in windows, from 8 KiB doubling up to 64 KiB, so
//! that a long read takes one system call per 64 KiB. A lone entry, or
//! entries far apart, are read as before, about their own size.
//!
//! An entry found in a window is checked (length, checksum, segment) like
//! any other, and its payload is copied out: a reply that keeps one record
//! must not keep the whole window. Anything the window does not hold
//! whole and valid (its end, an entry written after it was read) is read
//! directly.

use std::path::Path;

use bytes::Bytes;

use crate::error::WalError;
use crate::format::{self, ALIGN, ENTRY_HEADER_LEN, HEADER_LEN, Probe};
use crate::segment::{self, Entry, ReadSize};
use crate::storage::StorageFile;

/// An entry starting at most this far after the end of the one read last
/// is read through a window.
const NEAR: u64 = 16 << 10;
/// The first window; each one after is twice the last, up to [`MAX_WINDOW`].
const FIRST_WINDOW: usize = 8 << 10;
const MAX_WINDOW: usize = 64 << 10;

/// One reader's window over its segment (see the module's doc).
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    /// The window: `valid` bytes of the file from `at`.
    buf: Vec<u8>,
    valid: usize,
    at: u64,
    /// Where the entry read last ends (0: none read yet).
    last_end: u64,
    /// The size of the next window read.
    next: usize,
}

impl ReadAhead {
    /// Reads and checks the entry at `pos` of segment `seq` whose entries
    /// end at `end`, through the window when it holds the entry or the
    /// entry follows the last one closely; as
    /// [`segment::read_entry_at`] otherwise.
    pub(crate) fn read_entry(
        &mut self,
        file: &dyn StorageFile,
        path: &Path,
        seq: u64,
        pos: u64,
        end: u64,
        size: &ReadSize,
    ) -> Result<Option<Entry>, WalError> {
        let mut found = self.in_window(seq, pos);
        if found.is_none() && self.follows(pos) && self.fill(file, pos, end) {
            found = self.in_window(seq, pos);
            if found.is_none() && self.at + self.valid as u64 == end {
                // The window read from `pos` to `end` and holds no valid
                // entry there: a direct read of the same bytes would not
                // either (the caller may look again past a newer end).
                return Ok(None);
            }
        }
        let entry = match found {
            Some(entry) => Some(entry),
            None => segment::read_entry_at(file, path, seq, pos, end, u32::MAX, size)?,
        };
        if let Some(e) = &entry {
            self.last_end = pos + (ENTRY_HEADER_LEN + e.payload.len()) as u64;
        }
        Ok(entry)
    }

    /// Whether an entry at `pos` follows the last one read closely.
    fn follows(&self, pos: u64) -> bool {
        self.last_end != 0 && pos >= self.last_end && pos - self.last_end <= NEAR
    }

    /// Reads a window from `pos` (within `end`); false if there is none to
    /// read, or the read failed (the direct read then says why).
    fn fill(&mut self, file: &dyn StorageFile, pos: u64, end: u64) -> bool {
        if pos < HEADER_LEN || !pos.is_multiple_of(ALIGN) || pos >= end {
            return false;
        }
        let len = self.next.clamp(FIRST_WINDOW, MAX_WINDOW);
        let len = len.min(usize::try_from(end - pos).unwrap_or(len));
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
        self.valid = 0;
        if file.read_exact_at(&mut self.buf[..len], pos).is_err() {
            return false;
        }
        (self.valid, self.at, self.next) = (len, pos, len.saturating_mul(2));
        true
    }

    /// The valid entry at `pos` if the window holds all of it, its payload
    /// copied out.
    fn in_window(&self, seq: u64, pos: u64) -> Option<Entry> {
        let from = usize::try_from(pos.checked_sub(self.at)?).ok()?;
        let rest = self.buf[..self.valid].get(from..)?;
        if rest.len() < ENTRY_HEADER_LEN {
            return None;
        }
        let whole = ENTRY_HEADER_LEN.checked_add(format::u32_at(rest, 4) as usize)?;
        let bytes = rest.get(..whole)?;
        match format::probe_entry(bytes, seq, u32::MAX) {
            Probe::Entry(h) => Some(Entry {
                lsn: h.lsn,
                kind: h.kind,
                payload: Bytes::copy_from_slice(&bytes[ENTRY_HEADER_LEN..]),
            }),
            _ => None,
        }
    }
}
