//! The storage backend: every byte the log reads or writes goes through here.
//!
//! Two backends implement it: [`FsStorage`] (real files, real `fdatasync`,
//! read-only memory maps) and [`SimStorage`] (an in-memory file system that
//! keeps what was written apart from what was synced, so a test can produce
//! the image a power cut would leave and inject I/O errors).
//!
//! The trait is deliberately small, after redb's `StorageBackend`: the log
//! needs positional reads and writes, `set_len`, preallocation, `sync_data`,
//! directory listing and syncing. There are no memory maps: a mapped read
//! of a file that a dead disk or an outside truncation took away kills the
//! process with SIGBUS, where a positional read answers an error.

mod blocks;
mod fs;
mod sim;

use std::io;
use std::path::Path;

pub use fs::FsStorage;
pub use sim::{CrashMode, Faults, SimStorage};

/// A directory of files, as the log sees it.
///
/// Paths handed to these methods are always a directory given at open time
/// joined with a plain file name; backends need not support anything else.
pub trait Storage: Send + Sync + 'static {
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Names of the regular files directly in `dir`, in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;

    /// Opens an existing file for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;

    /// Creates a new, empty file; fails if it exists.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;

    /// Removes a file. The removal is durable only after [`Storage::sync_dir`].
    fn remove(&self, path: &Path) -> io::Result<()>;

    /// Atomically renames a file, replacing `to` if it exists. Durable only
    /// after [`Storage::sync_dir`].
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes the directory's entries (creations, removals, renames) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Takes an exclusive lock on `dir` for this process, held until the
    /// returned guard is dropped. Fails with [`io::ErrorKind::WouldBlock`]
    /// when another holder has it.
    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn DirLock>>;
}

/// An exclusive lock on a data directory; released on drop.
pub trait DirLock: Send + Sync {}

/// One open file.
#[allow(clippy::len_without_is_empty)] // a file's length is data, not a collection's
pub trait StorageFile: Send + Sync {
    /// The file's current length in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Fills `buf` from position `pos`; an error if the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;

    /// Writes all of `buf` at position `pos`, extending the file if needed.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;

    /// Writes all of `buf` at `pos` as the new end of the log's bytes in
    /// the file: nothing after `pos + buf.len()` is the log's yet (in a
    /// segment filled ahead of its entries, zeros), and the rest of the
    /// disk block the write ends in may be written as zeros. Where the
    /// backend can, around the page cache (`O_DIRECT`): the bytes go from
    /// memory to the disk, the kernel copies them into no page, and the
    /// sync after has no pages to write. Durable only after
    /// [`StorageFile::sync_data`], as any write. Answers whether the bytes
    /// went around the page cache. The default is
    /// [`StorageFile::write_all_at`].
    fn append_at(&self, buf: &[u8], pos: u64) -> io::Result<bool> {
        self.write_all_at(buf, pos).map(|()| false)
    }

    /// Sets the file's length, truncating or extending with zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Reserves space so that writes below `len` never need to grow the file.
    /// The file's length becomes at least `len`; the new bytes read as zeros.
    fn preallocate(&self, len: u64) -> io::Result<()>;

    /// `fdatasync`: makes written data and the length durable.
    fn sync_data(&self) -> io::Result<()>;

    /// Tells the page cache that the file's clean pages may go (a hint:
    /// nothing is lost; the default does nothing).
    fn drop_cached(&self) -> io::Result<()> {
        Ok(())
    }

    /// Starts writing bytes `[pos, pos + len)` to the disk without waiting
    /// for them (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`): a hint
    /// that makes a later [`StorageFile::sync_data`] shorter. It makes
    /// nothing durable, and the default does nothing.
    fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        let _ = (pos, len);
        Ok(())
    }

    /// Waits until bytes `[pos, pos + len)` handed to the disk (and any
    /// still dirty there, which it hands over first) are written
    /// (`sync_file_range` with `SYNC_FILE_RANGE_WAIT_BEFORE`, `_WRITE` and
    /// `_WAIT_AFTER`): pacing, not durability. Unlike `fdatasync` it
    /// commits no metadata and flushes no disk cache, so the syncs of
    /// other files do not queue behind it. The default does nothing.
    fn finish_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        let _ = (pos, len);
        Ok(())
    }
}

/// Reads bytes `[0, len)` of `file` into memory.
pub(crate) fn read_prefix(file: &dyn StorageFile, len: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large to read"))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}
