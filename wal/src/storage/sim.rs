//! A crash-simulating, fault-injecting in-memory file system.
//!
//! Each file keeps two images: what the process sees (every write) and what
//! would survive a power cut (only what `sync_data` made durable). Directory
//! entries are likewise durable only after `sync_dir`. [`SimStorage::cut_power`]
//! freezes the old instance (every later call fails, as on a dead machine) and
//! returns the image the disk would hold afterwards, per [`CrashMode`].
//!
//! This is how a missing fsync is caught: a SIGKILL test alone cannot catch
//! it, because the page cache outlives a killed process.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::blocks::BlockLayout;
use super::{DirLock, Storage, StorageFile};

/// What a power cut leaves of writes that were not synced yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Everything written survives, synced or not, with every directory
    /// change: what a killed process (not a dead machine) leaves behind.
    ProcessCrash,
    /// Only synced data and synced directory entries survive.
    LoseUnsynced,
    /// Synced data survives, plus an arbitrary subset of the 512-byte sectors
    /// of unsynced writes, chosen by the seed: the page cache writes back
    /// dirty pages in any order, so a batch can reach the disk with holes.
    Torn {
        /// Chooses which sectors survive; the same seed gives the same image.
        seed: u64,
    },
    /// Synced data survives, plus only the last unsynced write of each file:
    /// the disk reordered the writes and the earlier ones never landed.
    LastWriteOnly,
    /// Synced data survives, plus an arbitrary subset of the unsynced
    /// writes of each file, each whole or not at all, chosen by the seed: a
    /// later write can survive while an earlier one is lost (LazyFS's
    /// `torn-seq`). [`CrashMode::LastWriteOnly`] is one such subset.
    TornSequence {
        /// Chooses which writes survive; the same seed gives the same image.
        seed: u64,
    },
    /// Synced data survives, plus the unsynced writes of each file in the
    /// order they were made, up to `bytes` bytes of them: the write that
    /// crosses that count is cut at that byte, and later ones are lost. A
    /// test sweeping `bytes` cuts a batch at every byte.
    Prefix {
        /// How many bytes of each file's unsynced writes reach the disk.
        bytes: u64,
    },
}

/// Faults to inject, shared by a [`SimStorage`] and all its files.
///
/// Counters count down on each call of that kind; the call that finds the
/// counter at zero fails (once), and the counter then disarms.
#[derive(Debug)]
pub struct Faults {
    fail_sync_in: AtomicU64,
    fail_write_in: AtomicU64,
    syncs: AtomicU64,
    writes: AtomicU64,
    writebacks_started: AtomicU64,
    writebacks_finished: AtomicU64,
    /// Faults hit only files whose name (at open) ends with this.
    only_on: Mutex<Option<String>>,
    /// Every `sync_data` of a file faults apply to first sleeps this long.
    sync_delay_micros: AtomicU64,
    /// Every read of a file faults apply to fails (a dying disk).
    fail_reads: std::sync::atomic::AtomicBool,
    /// The name of the file the last injected write fault hit.
    failed_write_on: Mutex<Option<PathBuf>>,
}

const DISARMED: u64 = u64::MAX;

impl Default for Faults {
    fn default() -> Self {
        Faults {
            fail_sync_in: AtomicU64::new(DISARMED),
            fail_write_in: AtomicU64::new(DISARMED),
            syncs: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            writebacks_started: AtomicU64::new(0),
            writebacks_finished: AtomicU64::new(0),
            only_on: Mutex::new(None),
            sync_delay_micros: AtomicU64::new(0),
            fail_reads: std::sync::atomic::AtomicBool::new(false),
            failed_write_on: Mutex::new(None),
        }
    }
}

impl Faults {
    /// The `n`-th next `sync_data` (0 = the very next) fails with EIO and,
    /// like Linux after a failed fsync, forgets the writes it should have
    /// made durable.
    pub fn fail_sync_after(&self, n: u64) {
        self.fail_sync_in.store(n, Ordering::SeqCst);
    }

    /// The `n`-th next write (0 = the very next) fails with EIO and writes
    /// nothing.
    pub fn fail_write_after(&self, n: u64) {
        self.fail_write_in.store(n, Ordering::SeqCst);
    }

    /// Makes faults hit only files whose name ends with `suffix` (say
    /// `".wal"`, to spare segments still being created as `.wal.tmp`).
    pub fn only_on(&self, suffix: &str) {
        *self.only_on.lock() = Some(suffix.to_string());
    }

    /// Whether faults apply to the file with inode `ino` under its current
    /// names.
    fn applies_to(&self, fs: &SimFs, ino: u64) -> bool {
        match &*self.only_on.lock() {
            Some(suffix) => fs
                .names
                .iter()
                .any(|(p, &i)| i == ino && p.to_string_lossy().ends_with(suffix.as_str())),
            None => true,
        }
    }

    /// Makes every `sync_data` (of files faults apply to) take at least
    /// `delay`: a slow disk, so that tests can act while a sync is in flight.
    pub fn delay_syncs(&self, delay: std::time::Duration) {
        self.sync_delay_micros
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// While `on`, every read of a file faults apply to fails with EIO: a
    /// medium that went bad under the log.
    pub fn fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }

    /// Disarms every pending fault.
    pub fn clear(&self) {
        self.fail_reads.store(false, Ordering::SeqCst);
        self.fail_sync_in.store(DISARMED, Ordering::SeqCst);
        self.fail_write_in.store(DISARMED, Ordering::SeqCst);
        self.sync_delay_micros.store(0, Ordering::SeqCst);
        *self.failed_write_on.lock() = None;
    }

    /// `sync_data` calls so far (failed ones included).
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::SeqCst)
    }

    /// Writes so far (failed ones included).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// `start_writeback` calls so far: hints, which the simulated disk
    /// takes for nothing (like the kernel, it may write unsynced bytes in
    /// any order anyway: see [`CrashMode`]).
    pub fn writebacks_started(&self) -> u64 {
        self.writebacks_started.load(Ordering::SeqCst)
    }

    /// `finish_writeback` calls so far.
    pub fn writebacks_finished(&self) -> u64 {
        self.writebacks_finished.load(Ordering::SeqCst)
    }

    /// The name the file had when an injected write fault hit it, if one
    /// did: a test can tell a segment made ahead of need (`.wal.tmp`) from
    /// a batch, a footer or the marks.
    pub fn failed_write_on(&self) -> Option<PathBuf> {
        self.failed_write_on.lock().clone()
    }

    fn trip(counter: &AtomicU64) -> bool {
        let mut current = counter.load(Ordering::SeqCst);
        loop {
            if current == DISARMED {
                return false;
            }
            let next = if current == 0 { DISARMED } else { current - 1 };
            match counter.compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return current == 0,
                Err(seen) => current = seen,
            }
        }
    }
}

/// The crash-simulating storage backend. Cloning shares the same file system.
///
/// # Examples
///
/// ```
/// use fencelog_wal::{CrashMode, SimStorage, Storage};
/// use std::path::Path;
/// let sim = SimStorage::new();
/// let dir = Path::new("/data");
/// sim.create_dir_all(dir).unwrap();
/// let f = sim.create_new(&dir.join("a")).unwrap();
/// f.write_all_at(b"synced", 0).unwrap();
/// f.sync_data().unwrap();
/// sim.sync_dir(dir).unwrap();
/// f.write_all_at(b"lost", 6).unwrap();
///
/// let after = sim.cut_power(CrashMode::LoseUnsynced);
/// let f = after.open(&dir.join("a")).unwrap();
/// assert_eq!(f.len().unwrap(), 6);
/// ```
#[derive(Clone, Default)]
pub struct SimStorage {
    fs: Arc<Mutex<SimFs>>,
    faults: Arc<Faults>,
}

#[derive(Default)]
struct SimFs {
    /// Set by a power cut: this instance is the dead machine.
    dead: bool,
    inodes: HashMap<u64, Arc<Mutex<Inode>>>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: Vec<PathBuf>,
    locked: Vec<PathBuf>,
    next_inode: u64,
    /// Mutating calls so far, and the armed power cut (at that count).
    mutations: u64,
    cut_at: Option<(u64, CrashMode)>,
    /// The disk's image once an armed power cut happened.
    image: Option<SimStorage>,
}

#[derive(Default, Clone)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, in order: (position, bytes).
    unsynced: Vec<(u64, Vec<u8>)>,
}

fn dead() -> io::Error {
    io::Error::other("simulated power loss: the machine is off")
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated I/O error on {what}"))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} does not exist", path.display()),
    )
}

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

const SECTOR: u64 = 512;

fn write_into(image: &mut Vec<u8>, pos: u64, bytes: &[u8]) {
    let Ok(start) = usize::try_from(pos) else {
        return;
    };
    let end = start + bytes.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(bytes);
}

impl SimStorage {
    /// An empty file system with no faults armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The fault switches of this file system.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Cuts the power: this instance (and every file opened through it) fails
    /// every later call, and the returned instance holds what the disk would
    /// hold, per `mode`. The new instance has fresh faults and no locks.
    pub fn cut_power(&self, mode: CrashMode) -> SimStorage {
        let mut fs = self.fs.lock();
        fs.dead = true;
        fs.image_after(mode)
    }

    /// A deep copy of this file system as it is, synced and unsynced state
    /// alike, that evolves independently (faults are not copied).
    pub fn fork(&self) -> SimStorage {
        let fs = self.fs.lock();
        let fork = fs.image_after(CrashMode::ProcessCrash);
        fork.fs.lock().dead = fs.dead;
        fork
    }

    /// Arms a power cut at the `n`-th next mutating call (write, sync,
    /// set_len, create, rename, remove, directory sync; 0 = the very next):
    /// that call fails as if the machine died before it, and so does every
    /// later one. [`SimStorage::image`] then answers the disk's image.
    pub fn cut_power_after(&self, n: u64, mode: CrashMode) {
        let mut fs = self.fs.lock();
        fs.cut_at = Some((fs.mutations + n, mode));
    }

    /// The disk's image after a power cut armed by
    /// [`SimStorage::cut_power_after`], once it happened.
    pub fn image(&self) -> Option<SimStorage> {
        self.fs.lock().image.clone()
    }

    /// Flips bit `bit` (0..8) of byte `pos` of `path` in both the visible
    /// and the durable image: damage at rest, as a bad disk would do it.
    pub fn flip_bit(&self, path: &Path, pos: u64, bit: u8) -> io::Result<()> {
        let fs = self.fs.lock();
        let ino = *fs.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = fs.inodes.get(&ino).ok_or_else(|| not_found(path))?;
        let mut guard = inode.lock();
        let inode = &mut *guard;
        let idx = usize::try_from(pos).map_err(|_| io::Error::other("position too large"))?;
        let mask = 1u8 << (bit % 8);
        for image in [&mut inode.data, &mut inode.durable] {
            if let Some(b) = image.get_mut(idx) {
                *b ^= mask;
            }
        }
        Ok(())
    }

    /// The bytes the process currently sees in `path`.
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let fs = self.fs.lock();
        let ino = *fs.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = fs.inodes.get(&ino).ok_or_else(|| not_found(path))?;
        Ok(inode.lock().data.clone())
    }

    /// The most bytes written and not yet synced to any one file (by
    /// durable name): how far a [`CrashMode::Prefix`] sweep must go to cover
    /// every byte a power cut could tear now.
    pub fn unsynced_bytes(&self) -> u64 {
        let fs = self.fs.lock();
        fs.durable_names
            .values()
            .filter_map(|ino| fs.inodes.get(ino))
            .map(|inode| {
                inode
                    .lock()
                    .unsynced
                    .iter()
                    .map(|(_, b)| b.len() as u64)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }

    fn file(&self, ino: u64, inode: Arc<Mutex<Inode>>) -> Box<dyn StorageFile> {
        Box::new(SimFile {
            fs: Arc::clone(&self.fs),
            faults: Arc::clone(&self.faults),
            ino,
            inode,
            layout: Mutex::new(BlockLayout::default()),
        })
    }
}

impl SimFs {
    /// Counts a mutating call, cutting the power first if it is the one
    /// armed; an error if the machine is (now) off.
    fn mutate(&mut self) -> io::Result<()> {
        if self.dead {
            return Err(dead());
        }
        if let Some((at, mode)) = self.cut_at
            && self.mutations >= at
        {
            self.dead = true;
            self.image = Some(self.image_after(mode));
            return Err(dead());
        }
        self.mutations += 1;
        Ok(())
    }

    fn image_after(&self, mode: CrashMode) -> SimStorage {
        if mode == CrashMode::ProcessCrash {
            return self.page_cache_image();
        }
        let mut rng = SplitMix(match mode {
            CrashMode::Torn { seed } | CrashMode::TornSequence { seed } => seed,
            _ => 0,
        });
        let names = self.durable_names.clone();
        let mut inodes = HashMap::new();
        for &ino in names.values() {
            if inodes.contains_key(&ino) {
                continue;
            }
            let Some(inode) = self.inodes.get(&ino) else {
                continue;
            };
            let image = disk_after(&inode.lock(), mode, &mut rng);
            inodes.insert(
                ino,
                Arc::new(Mutex::new(Inode {
                    data: image.clone(),
                    durable: image,
                    unsynced: Vec::new(),
                })),
            );
        }
        let after = SimFs {
            inodes,
            names: names.clone(),
            durable_names: names,
            dirs: self.dirs.clone(),
            next_inode: self.next_inode,
            ..SimFs::default()
        };
        SimStorage {
            fs: Arc::new(Mutex::new(after)),
            faults: Arc::new(Faults::default()),
        }
    }

    /// After a process crash the machine stays up: the page cache (and what
    /// is still unsynced in it) survives the process, durable or not.
    fn page_cache_image(&self) -> SimStorage {
        let inodes = self
            .inodes
            .iter()
            .map(|(&ino, inode)| (ino, Arc::new(Mutex::new(inode.lock().clone()))))
            .collect();
        SimStorage {
            fs: Arc::new(Mutex::new(SimFs {
                inodes,
                names: self.names.clone(),
                durable_names: self.durable_names.clone(),
                dirs: self.dirs.clone(),
                next_inode: self.next_inode,
                ..SimFs::default()
            })),
            faults: Arc::new(Faults::default()),
        }
    }
}

/// What a file's bytes are on disk after a power cut of kind `mode`: the
/// durable bytes, and of the unsynced writes what `mode` lets through.
fn disk_after(inode: &Inode, mode: CrashMode, rng: &mut SplitMix) -> Vec<u8> {
    let mut image = inode.durable.clone();
    match mode {
        CrashMode::ProcessCrash | CrashMode::LoseUnsynced => {}
        CrashMode::LastWriteOnly => {
            if let Some((pos, bytes)) = inode.unsynced.last() {
                write_into(&mut image, *pos, bytes);
            }
        }
        CrashMode::TornSequence { .. } => {
            for (pos, bytes) in &inode.unsynced {
                if rng.next().is_multiple_of(2) {
                    write_into(&mut image, *pos, bytes);
                }
            }
        }
        CrashMode::Prefix { bytes: budget } => {
            let mut left = budget;
            for (pos, bytes) in &inode.unsynced {
                if left == 0 {
                    break;
                }
                let n = (bytes.len() as u64).min(left) as usize;
                write_into(&mut image, *pos, &bytes[..n]);
                left -= n as u64;
            }
        }
        CrashMode::Torn { .. } => {
            for (pos, bytes) in &inode.unsynced {
                write_torn(&mut image, *pos, bytes, rng);
            }
        }
    }
    image
}

/// A write torn at sector boundaries: each sector's piece of it lands or
/// not, at random.
fn write_torn(image: &mut Vec<u8>, pos: u64, bytes: &[u8], rng: &mut SplitMix) {
    let end = pos + bytes.len() as u64;
    let mut sector_start = pos;
    while sector_start < end {
        let sector_end = ((sector_start / SECTOR) + 1) * SECTOR;
        let piece_end = sector_end.min(end);
        if rng.next().is_multiple_of(2) {
            let from = (sector_start - pos) as usize;
            let to = (piece_end - pos) as usize;
            write_into(image, sector_start, &bytes[from..to]);
        }
        sector_start = piece_end;
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        if fs.dead {
            return Err(dead());
        }
        if !fs.dirs.iter().any(|d| d == dir) {
            fs.dirs.push(dir.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let fs = self.fs.lock();
        if fs.dead {
            return Err(dead());
        }
        if !fs.dirs.iter().any(|d| d == dir) {
            return Err(not_found(dir));
        }
        Ok(fs
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn open(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let fs = self.fs.lock();
        if fs.dead {
            return Err(dead());
        }
        let ino = *fs.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = Arc::clone(fs.inodes.get(&ino).ok_or_else(|| not_found(path))?);
        drop(fs);
        Ok(self.file(ino, inode))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let mut fs = self.fs.lock();
        fs.mutate()?;
        let parent_exists = path
            .parent()
            .is_some_and(|parent| fs.dirs.iter().any(|d| d == parent));
        if !parent_exists {
            return Err(not_found(path));
        }
        if fs.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", path.display()),
            ));
        }
        fs.next_inode += 1;
        let ino = fs.next_inode;
        let inode = Arc::new(Mutex::new(Inode::default()));
        fs.inodes.insert(ino, Arc::clone(&inode));
        fs.names.insert(path.to_path_buf(), ino);
        drop(fs);
        Ok(self.file(ino, inode))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        fs.mutate()?;
        fs.names.remove(path).ok_or_else(|| not_found(path))?;
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        fs.mutate()?;
        let ino = fs.names.remove(from).ok_or_else(|| not_found(from))?;
        fs.names.insert(to.to_path_buf(), ino);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        fs.mutate()?;
        // Faults aimed at some files (`only_on`) spare directories.
        if self.faults.only_on.lock().is_none() && Faults::trip(&self.faults.fail_sync_in) {
            return Err(eio("directory sync"));
        }
        let SimFs {
            names,
            durable_names,
            ..
        } = &mut *fs;
        durable_names.retain(|p, _| p.parent() != Some(dir));
        for (p, ino) in names.iter() {
            if p.parent() == Some(dir) {
                durable_names.insert(p.clone(), *ino);
            }
        }
        Ok(())
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn DirLock>> {
        let mut fs = self.fs.lock();
        if fs.dead {
            return Err(dead());
        }
        if fs.locked.iter().any(|d| d == dir) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the directory is locked by another holder",
            ));
        }
        fs.locked.push(dir.to_path_buf());
        Ok(Box::new(SimLock {
            fs: Arc::clone(&self.fs),
            dir: dir.to_path_buf(),
        }))
    }
}

struct SimLock {
    fs: Arc<Mutex<SimFs>>,
    dir: PathBuf,
}

impl DirLock for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.fs.lock().locked.retain(|d| d != &self.dir);
    }
}

struct SimFile {
    fs: Arc<Mutex<SimFs>>,
    faults: Arc<Faults>,
    ino: u64,
    inode: Arc<Mutex<Inode>>,
    /// Appends laid out as the real files write them around the page
    /// cache ([`StorageFile::append_at`]), whole blocks again.
    layout: Mutex<BlockLayout>,
}

impl SimFile {
    fn alive(&self) -> io::Result<()> {
        if self.fs.lock().dead {
            Err(dead())
        } else {
            Ok(())
        }
    }
}

impl StorageFile for SimFile {
    fn len(&self) -> io::Result<u64> {
        self.alive()?;
        Ok(self.inode.lock().data.len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.alive()?;
        if self.faults.fail_reads.load(Ordering::SeqCst)
            && self.faults.applies_to(&self.fs.lock(), self.ino)
        {
            return Err(eio("read"));
        }
        let inode = self.inode.lock();
        let start = usize::try_from(pos).map_err(|_| io::Error::other("position too large"))?;
        let end = start
            .checked_add(buf.len())
            .filter(|&end| end <= inode.data.len())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of file")
            })?;
        buf.copy_from_slice(&inode.data[start..end]);
        Ok(())
    }

    /// The blocks a direct write would send, as one unsynced write: a
    /// power cut tears or loses them as it does any write, the block's
    /// earlier (durable) bytes with them.
    fn append_at(&self, buf: &[u8], pos: u64) -> io::Result<bool> {
        let mut layout = self.layout.lock();
        let read = |block: &mut [u8], at: u64| self.read_exact_at(block, at);
        match layout.lay(buf, pos, self.len()?, read)? {
            Some((start, area)) => self.write_all_at(area, start).map(|()| true),
            None => self.write_all_at(buf, pos).map(|()| false),
        }
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        // Hold the file-system lock across the write so that a power cut is
        // atomic with respect to it: the write is either before or after.
        let mut fs = self.fs.lock();
        fs.mutate()?;
        self.faults.writes.fetch_add(1, Ordering::SeqCst);
        if self.faults.applies_to(&fs, self.ino) && Faults::trip(&self.faults.fail_write_in) {
            let name = fs.names.iter().find(|&(_, &i)| i == self.ino);
            *self.faults.failed_write_on.lock() = name.map(|(p, _)| p.clone());
            return Err(eio("write"));
        }
        let mut inode = self.inode.lock();
        write_into(&mut inode.data, pos, buf);
        inode.unsynced.push((pos, buf.to_vec()));
        drop(fs);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut fs = self.fs.lock();
        fs.mutate()?;
        let len = usize::try_from(len).map_err(|_| io::Error::other("length too large"))?;
        let mut inode = self.inode.lock();
        inode.data.resize(len, 0);
        // Unsynced writes beyond the new end can no longer reach the disk.
        let len64 = len as u64;
        inode.unsynced.retain(|(pos, _)| *pos < len64);
        for (pos, bytes) in inode.unsynced.iter_mut() {
            let keep = (len64 - *pos).min(bytes.len() as u64) as usize;
            bytes.truncate(keep);
        }
        drop(fs);
        Ok(())
    }

    fn preallocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let delay = self.faults.sync_delay_micros.load(Ordering::SeqCst);
        if delay > 0 && self.faults.applies_to(&self.fs.lock(), self.ino) {
            // Outside the file-system lock: other files stay usable.
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        let mut fs = self.fs.lock();
        fs.mutate()?;
        self.faults.syncs.fetch_add(1, Ordering::SeqCst);
        let mut inode = self.inode.lock();
        if self.faults.applies_to(&fs, self.ino) && Faults::trip(&self.faults.fail_sync_in) {
            // Linux marks the pages clean after a failed writeback: the data
            // never reaches the disk, and a retried fsync reports success.
            inode.unsynced.clear();
            return Err(eio("fdatasync"));
        }
        // Apply only what was written since the last sync: a sync costs what
        // it writes, not the file's size.
        let Inode {
            data,
            durable,
            unsynced,
        } = &mut *inode;
        for (pos, bytes) in unsynced.drain(..) {
            write_into(durable, pos, &bytes);
        }
        durable.resize(data.len(), 0);
        drop(fs);
        Ok(())
    }

    fn start_writeback(&self, _pos: u64, _len: u64) -> io::Result<()> {
        self.faults
            .writebacks_started
            .fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn finish_writeback(&self, _pos: u64, _len: u64) -> io::Result<()> {
        self.faults
            .writebacks_finished
            .fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_unsynced_writes() -> (SimStorage, PathBuf) {
        let sim = SimStorage::new();
        let dir = Path::new("/d");
        sim.create_dir_all(dir).unwrap();
        let path = dir.join("f");
        let f = sim.create_new(&path).unwrap();
        f.write_all_at(b"synced", 0).unwrap();
        f.sync_data().unwrap();
        sim.sync_dir(dir).unwrap();
        f.write_all_at(b"AAAA", 6).unwrap();
        f.write_all_at(b"BBBB", 10).unwrap();
        (sim, path)
    }

    /// A torn sequence keeps any subset of whole writes, a later one
    /// without an earlier one among them; every subset turns up.
    #[test]
    fn torn_sequence_keeps_whole_writes_in_any_subset() {
        let (sim, path) = two_unsynced_writes();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let after = sim.cut_power(CrashMode::TornSequence { seed });
            let bytes = after.contents(&path).unwrap();
            let kept = (
                bytes.get(6..10) == Some(b"AAAA"),
                bytes.get(10..14) == Some(b"BBBB"),
            );
            assert!(bytes.starts_with(b"synced"));
            assert!(kept.0 || bytes.get(6..10).is_none_or(|b| b == [0; 4]));
            seen.insert(kept);
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    /// A prefix keeps the unsynced writes in order up to a byte count,
    /// cutting the write that crosses it.
    #[test]
    fn prefix_keeps_the_writes_in_order_up_to_a_byte() {
        let (sim, path) = two_unsynced_writes();
        assert_eq!(sim.unsynced_bytes(), 8);
        let at = |bytes| {
            sim.cut_power(CrashMode::Prefix { bytes })
                .contents(&path)
                .unwrap()
        };
        assert_eq!(at(0), b"synced");
        assert_eq!(at(3), b"syncedAAA");
        assert_eq!(at(6), b"syncedAAAABB");
        assert_eq!(at(8), b"syncedAAAABBBB");
        assert_eq!(at(100), b"syncedAAAABBBB");
    }
}
