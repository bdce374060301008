//! Real files: positional I/O, `fallocate`, `fdatasync`, `flock`.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use parking_lot::Mutex;

use super::blocks::{BLOCK, BlockLayout};
use super::{DirLock, Storage, StorageFile};

/// The real file system.
///
/// # Examples
///
/// ```
/// use fencelog_wal::{FsStorage, Storage};
/// let dir = tempfile::tempdir().unwrap();
/// let storage = FsStorage;
/// let file = storage.create_new(&dir.path().join("a")).unwrap();
/// file.write_all_at(b"hello", 0).unwrap();
/// file.sync_data().unwrap();
/// assert_eq!(file.len().unwrap(), 5);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FsStorage;

const LOCK_FILE: &str = "LOCK";

struct FsLock {
    _file: File,
}

impl DirLock for FsLock {}

impl Storage for FsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file()
                && let Ok(name) = entry.file_name().into_string()
            {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Box::new(FsFile::new(file)))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(FsFile::new(file)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn DirLock>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(FsLock { _file: file })),
            Err(TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the directory is locked by another process",
            )),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

struct FsFile {
    file: File,
    /// Appends around the page cache ([`StorageFile::append_at`]): opened
    /// at the first, used by one writer at a time (the log's sync thread).
    direct: Mutex<Direct>,
}

impl FsFile {
    fn new(file: File) -> FsFile {
        FsFile {
            file,
            direct: Mutex::new(Direct::Unopened),
        }
    }
}

impl StorageFile for FsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, pos)
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.file.write_all_at(buf, pos)
    }

    fn append_at(&self, buf: &[u8], pos: u64) -> io::Result<bool> {
        let mut direct = self.direct.lock();
        if let Direct::Unopened = *direct {
            *direct = match DirectWriter::open(&self.file) {
                Ok(writer) => Direct::Open(Box::new(writer)),
                Err(_) => Direct::Unavailable,
            };
        }
        let plain = || self.file.write_all_at(buf, pos).map(|()| false);
        let Direct::Open(writer) = &mut *direct else {
            return plain();
        };
        match writer.append(buf, pos) {
            Ok(true) => Ok(true),
            // Past the file's end (a segment's last block): a plain write.
            Ok(false) => plain(),
            // The file system refuses direct I/O (or its alignment): plain
            // writes from now on. The refusal comes before any byte moves.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                *direct = Direct::Unavailable;
                plain()
            }
            Err(e) => Err(e),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        let len_signed = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        // SAFETY: fallocate only reads its integer arguments; the descriptor
        // is owned by `self.file` and open for writing.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len_signed) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // File systems without fallocate: extend with a sparse hole instead.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                if self.len()? < len {
                    self.file.set_len(len)?;
                }
                Ok(())
            }
            _ => Err(err),
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn drop_cached(&self) -> io::Result<()> {
        // SAFETY: posix_fadvise only reads its integer arguments; the
        // descriptor is owned by `self.file`.
        let rc =
            unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        match rc {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        self.sync_file_range(pos, len, libc::SYNC_FILE_RANGE_WRITE)
    }

    fn finish_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        self.sync_file_range(
            pos,
            len,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    }
}

impl FsFile {
    fn sync_file_range(&self, pos: u64, len: u64, flags: libc::c_uint) -> io::Result<()> {
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "range too large");
        let pos = i64::try_from(pos).map_err(|_| too_large())?;
        let len = i64::try_from(len).map_err(|_| too_large())?;
        // SAFETY: sync_file_range only reads its integer arguments; the
        // descriptor is owned by `self.file`.
        let rc = unsafe { libc::sync_file_range(self.file.as_raw_fd(), pos, len, flags) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// A file's appends around the page cache.
enum Direct {
    /// Not tried yet.
    Unopened,
    Open(Box<DirectWriter>),
    /// The file system has no direct I/O (tmpfs, say): plain writes.
    Unavailable,
}

/// Appends with `O_DIRECT`, laid out in whole blocks ([`BlockLayout`]).
struct DirectWriter {
    /// The same file, opened again (its own open file description, so
    /// that the plain descriptor's reads and writes keep the page cache).
    file: File,
    /// The file's length as last read: a write never passes it (a
    /// segment's space is made before its entries are written).
    len: u64,
    layout: BlockLayout,
}

impl DirectWriter {
    fn open(file: &File) -> io::Result<DirectWriter> {
        // Through /proc: the file's path may have changed since it was
        // opened (a segment is created under a temporary name).
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let len = direct.metadata()?.len();
        Ok(DirectWriter {
            file: direct,
            len,
            layout: BlockLayout::default(),
        })
    }

    /// Writes `buf` at `pos` (see [`StorageFile::append_at`]); answers
    /// false, having written nothing, when the write would pass the file's
    /// end.
    fn append(&mut self, buf: &[u8], pos: u64) -> io::Result<bool> {
        let end = pos + buf.len() as u64;
        if end.div_ceil(BLOCK as u64) * BLOCK as u64 > self.len {
            self.len = self.file.metadata()?.len();
        }
        let file = &self.file;
        let read = |block: &mut [u8], at: u64| file.read_exact_at(block, at);
        match self.layout.lay(buf, pos, self.len, read)? {
            Some((start, area)) => file.write_all_at(area, start).map(|()| true),
            None => Ok(false),
        }
    }
}
