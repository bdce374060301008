//! Real files: positional I/O, `fallocate`, `fdatasync`, `flock`.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
        Ok(Box::new(FsFile { file }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(FsFile { file }))
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
