//! Snapshots on disk. A snapshot this node builds is a directory of hard
//! links to the engine's segment files (sealed ones never change again;
//! the one being written only grows past the offset recorded in `TAIL`)
//! plus a copy of `MARKS`: building one copies no records, whatever the
//! engine's size. Only when a lagging replica needs it is it packed into
//! one archive, which is streamed in chunks and unpacked there into a
//! fresh engine directory. A snapshot received from a leader is kept as
//! the archive it came in. Nothing is held in memory but one block.
//!
//! ```text
//! // snapshot: { magic: b"FLSNAP" | version: u8 (b'2') | 0u8 | [File]* | 0u16 }
//! // File:     { name_len: u16 (≥ 1) | name | len: u64 | [Run]* | at: u64, 0u32 }
//! // Run:      { at: u64 | run_len: u32 (≥ 1) | bytes }   bytes not in a run are zeros
//! ```
//!
//! ```text
//! // meta: { magic: b"FLSM" | version: u8 (1) | bincode(openraft SnapshotMeta) }
//! // TAIL: "<segment> <end>\n" (decimal)   bytes of that segment from `end` on are left out
//! ```
//!
//! `<node>/snap/` holds at most one finished snapshot, `<id>.d/` (built
//! here) or `<id>.snap` (received) with its Raft metadata in `<id>.meta`,
//! plus a staging directory or an incoming file while those are in use,
//! and `<id>.snap` beside `<id>.d/` once a send packed it (kept for the
//! next send until a newer snapshot replaces both); what an interrupted
//! process left, and such an archive, is removed at start. A snapshot
//! being packed for a replica when a newer one is saved stays until the
//! packing ends.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::future::Future;
use std::io::{BufReader, BufWriter, Read, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use fencelog::wal::SegmentEnd;
use openraft::SnapshotMeta;
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

use crate::codec::{FormatError, Tagged};
use crate::types::{Member, NodeId};

/// An archive's first 8 bytes: `FLSNAP`, then its version, then a zero.
// { magic: b"FLSNAP" | version: u8 | 0u8 }
const MAGIC: &[u8; 6] = b"FLSNAP";
/// The archive's format version, an ASCII digit (the first archives were
/// written as the 8-byte magic `FLSNAP2\0`: the same bytes).
pub(crate) const ARCHIVE_VERSION: u8 = b'2';
/// A snapshot's Raft metadata (`<id>.meta`).
// meta: { magic: b"FLSM" | version: u8 (1) | bincode(SnapshotMeta) }
const META: Tagged = Tagged {
    what: "a snapshot's metadata",
    magic: *b"FLSM",
    version: 1,
};
/// No meta file is larger (the membership's addresses are short).
const MAX_META: u64 = 1 << 20;

/// Encodes a snapshot's metadata (the `.meta` file).
pub(crate) fn encode_meta(meta: &SnapshotMeta<NodeId, Member>) -> Result<Vec<u8>, bincode::Error> {
    META.encode(meta)
}

/// Decodes a snapshot's metadata (the `.meta` file).
pub(crate) fn decode_meta(bytes: &[u8]) -> Result<SnapshotMeta<NodeId, Member>, FormatError> {
    META.decode(bytes)
}
const BLOCK: usize = 64 << 10;
/// No engine file is larger (segments are at most 1 GiB, plus slack).
const MAX_FILE: u64 = 2 << 30;

pub(crate) fn bad(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

fn is_engine_file(name: &str) -> bool {
    name == "MARKS" || segment_seq(name).is_some()
}

/// The sequence number of the engine segment file `name`, if it is one.
fn segment_seq(name: &str) -> Option<u64> {
    name.strip_suffix(".wal")
        .filter(|n| !n.starts_with('.'))
        .and_then(|n| n.parse::<u64>().ok())
}

/// In a staged snapshot, the file that says where the entries of its last
/// segment end (that segment is a link to one the engine goes on writing).
const TAIL: &str = "TAIL";

fn write_tail(dir: &Path, end: SegmentEnd) -> std::io::Result<()> {
    let mut f = File::create(dir.join(TAIL))?;
    f.write_all(format!("{} {}\n", end.segment, end.end).as_bytes())?;
    f.sync_all()
}

fn read_tail(dir: &Path) -> std::io::Result<Option<SegmentEnd>> {
    let path = dir.join(TAIL);
    let mut text = String::new();
    match File::open(&path) {
        Ok(f) => f.take(64).read_to_string(&mut text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let parsed = text
        .strip_suffix('\n')
        .and_then(|l| l.split_once(' '))
        .and_then(|(seg, end)| Some((seg.parse().ok()?, end.parse().ok()?)));
    match parsed {
        Some((segment, end)) => Ok(Some(SegmentEnd { segment, end })),
        None => Err(bad(format!(
            "{}: {text:?} is not `<segment> <end>`",
            path.display()
        ))),
    }
}

/// Makes the names in `dir` durable (renames, creations, removals).
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Where a finished snapshot's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// An archive (a snapshot received from a leader).
    Packed(PathBuf),
    /// A directory of the engine's files (a snapshot built here), packed
    /// when first read.
    Staged(PathBuf),
}

/// A snapshot's bytes and its metadata.
pub(crate) struct Saved {
    pub meta: SnapshotMeta<NodeId, Member>,
    pub source: Source,
}

/// Staged snapshots being packed for a replica, and those of them a newer
/// snapshot replaced (removed when their packing ends).
#[derive(Default)]
struct Pins {
    count: HashMap<PathBuf, usize>,
    replaced: HashSet<PathBuf>,
}

/// The snapshots of one node.
pub(crate) struct Store {
    dir: PathBuf,
    /// A build and an install may finish together: one saves at a time,
    /// and the newer snapshot stays.
    saving: parking_lot::Mutex<()>,
    pins: parking_lot::Mutex<Pins>,
    /// One send packs at a time (on a blocking thread): a second send of
    /// the same snapshot, to another replica, waits and opens the archive
    /// the first packed instead of reading the whole engine again.
    packing: parking_lot::Mutex<()>,
}

impl Store {
    /// Opens `<node>/snap`, removing what an interrupted build, receive or
    /// send left, and snapshots whose metadata is gone.
    pub fn open(dir: PathBuf) -> std::io::Result<Store> {
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            // A snapshot without its metadata, or an archive packed for
            // sending beside a directory (never synced: not trusted after
            // a restart; the next send packs it again).
            let orphan = (name.ends_with(".d") || name.ends_with(".snap"))
                && (!path.with_extension("meta").exists()
                    || (name.ends_with(".snap") && path.with_extension("d").is_dir()));
            if name.starts_with("staging") || (orphan && path.is_dir()) {
                std::fs::remove_dir_all(path)?;
            } else if name.starts_with("incoming") || name.ends_with(".tmp") || orphan {
                std::fs::remove_file(path)?;
            }
        }
        // A process killed between `save`'s renames and its directory sync
        // leaves a snapshot whose name only the page cache holds; Raft may
        // purge its log up to a snapshot `current` reports, so the name is
        // made durable before anything is decided on it.
        sync_dir(&dir)?;
        Ok(Store {
            dir,
            saving: parking_lot::Mutex::new(()),
            pins: parking_lot::Mutex::new(Pins::default()),
            packing: parking_lot::Mutex::new(()),
        })
    }

    fn name(meta: &SnapshotMeta<NodeId, Member>) -> String {
        let (term, index) = meta
            .last_log_id
            .map_or((0, 0), |l| (l.leader_id.term, l.index));
        format!("{term:020}-{index:020}")
    }

    /// The finished snapshot, if any (the newest, should a crash have left
    /// two).
    pub fn current(&self) -> std::io::Result<Option<Saved>> {
        let mut best: Option<Saved> = None;
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "meta") {
                continue;
            }
            let (packed, staged) = (path.with_extension("snap"), path.with_extension("d"));
            let source = if staged.is_dir() {
                Source::Staged(staged)
            } else if packed.is_file() {
                Source::Packed(packed)
            } else {
                continue;
            };
            let mut bytes = Vec::new();
            File::open(&path)?
                .take(MAX_META + 1)
                .read_to_end(&mut bytes)?;
            if bytes.len() as u64 > MAX_META {
                return Err(bad(format!(
                    "{}: over {MAX_META} bytes, not a snapshot's metadata",
                    path.display()
                )));
            }
            let meta = decode_meta(&bytes).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            if best
                .as_ref()
                .is_none_or(|b| b.meta.last_log_id < meta.last_log_id)
            {
                best = Some(Saved { meta, source });
            }
        }
        Ok(best)
    }

    /// A fresh directory to stage an engine's files in.
    pub fn staging(&self) -> std::io::Result<PathBuf> {
        let dir = self.dir.join("staging");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// A fresh file to receive a snapshot into.
    pub fn incoming(&self) -> std::io::Result<(PathBuf, File)> {
        let path = self.dir.join(format!("incoming-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok((path, f))
    }

    /// Makes `from` the snapshot described by `meta`, durably, and removes
    /// every other: `from` is a received archive (kept as `<id>.snap`) or
    /// a staged directory whose files are durable (kept as `<id>.d`).
    pub fn save(&self, from: &Path, meta: &SnapshotMeta<NodeId, Member>) -> std::io::Result<Saved> {
        let _one = self.saving.lock();
        let staged = from.is_dir();
        // One as new (built again at the same index after a restart)
        // holds the same entries: it stays, and may be being read.
        if let Some(newer) = self.current()?
            && newer.meta.last_log_id >= meta.last_log_id
        {
            if staged {
                std::fs::remove_dir_all(from)?;
            } else {
                std::fs::remove_file(from)?;
            }
            return Ok(newer);
        }
        let name = Store::name(meta);
        let source = if staged {
            let to = self.dir.join(format!("{name}.d"));
            if to.exists() {
                // Left without its metadata (the check above keeps a
                // finished one of this name).
                std::fs::remove_dir_all(&to)?;
            }
            std::fs::rename(from, &to)?;
            Source::Staged(to)
        } else {
            File::open(from)?.sync_all()?;
            let to = self.dir.join(format!("{name}.snap"));
            std::fs::rename(from, &to)?;
            Source::Packed(to)
        };
        let tmp = self.dir.join(format!("{name}.meta.tmp"));
        let bytes = encode_meta(meta).map_err(std::io::Error::other)?;
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(format!("{name}.meta")))?;
        sync_dir(&self.dir)?;
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let old = file.ends_with(".snap") || file.ends_with(".meta") || file.ends_with(".d");
            if old && !file.starts_with(&name) {
                // A reader of an old archive keeps its open file; an old
                // directory being packed stays until the packing ends.
                self.remove_snapshot(&e.path())?;
            }
        }
        Ok(Saved {
            meta: meta.clone(),
            source,
        })
    }

    /// Removes an old snapshot's archive, metadata or directory, unless the
    /// directory is being packed.
    fn remove_snapshot(&self, path: &Path) -> std::io::Result<()> {
        if !path.is_dir() {
            return std::fs::remove_file(path);
        }
        {
            let mut pins = self.pins.lock();
            if pins.count.contains_key(path) {
                pins.replaced.insert(path.to_path_buf());
                return Ok(());
            }
        }
        // Not pinned, and `save` (the caller) holds off `open_current`:
        // nobody pins it now.
        std::fs::remove_dir_all(path)
    }

    /// The finished snapshot, if any, and its bytes to read (as
    /// [`Store::open_snapshot`]). Under the lock `save` holds: a snapshot
    /// being replaced is either pinned before the save removes it (then
    /// kept until it is packed) or not seen at all, never found and then
    /// gone before it is opened.
    pub fn open_current(
        self: &Arc<Self>,
    ) -> std::io::Result<Option<(SnapshotMeta<NodeId, Member>, SnapshotFile)>> {
        let _one = self.saving.lock();
        let Some(saved) = self.current()? else {
            return Ok(None);
        };
        let file = self.open_snapshot(&saved)?;
        Ok(Some((saved.meta, file)))
    }

    /// The bytes of `saved`, to read: an archive is opened; a staged
    /// directory is packed when first read or sought (most snapshots are
    /// never sent), and kept until then.
    pub fn open_snapshot(self: &Arc<Self>, saved: &Saved) -> std::io::Result<SnapshotFile> {
        match &saved.source {
            Source::Packed(path) => Ok(SnapshotFile::open(File::open(path)?)),
            Source::Staged(dir) => {
                *self.pins.lock().count.entry(dir.clone()).or_default() += 1;
                Ok(SnapshotFile(State::Staged {
                    pin: Pinned {
                        store: Arc::clone(self),
                        dir: dir.clone(),
                    },
                    seek: None,
                }))
            }
        }
    }

    /// The staged snapshot in `dir` as an archive: packed by its first
    /// send into `<id>.snap` beside it, which later sends open (openraft
    /// starts a failed transfer over, and packing reads the whole engine).
    /// Not synced: `open` removes it after a restart, and the directory
    /// stays the durable snapshot.
    fn pack_for_sending(&self, dir: &Path) -> std::io::Result<File> {
        let packed = dir.with_extension("snap");
        let _one = self.packing.lock();
        match File::open(&packed) {
            Ok(file) => return Ok(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let tmp = self.dir.join("sending.tmp");
        // Opened before the rename: a newer snapshot saved meanwhile may
        // remove the name, never the open file.
        let file = pack(dir, &tmp)
            .and_then(|_| File::open(&tmp))
            .and_then(|file| std::fs::rename(&tmp, &packed).map(|()| file));
        let Ok(file) = file else {
            let _ = std::fs::remove_file(&tmp);
            return file;
        };
        if !dir.with_extension("meta").exists() {
            // Replaced before it was packed: nothing would remove it later.
            std::fs::remove_file(&packed)?;
        }
        Ok(file)
    }
}

/// A staged snapshot kept from removal while a reader may pack it.
struct Pinned {
    store: Arc<Store>,
    dir: PathBuf,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let replaced = {
            let mut pins = self.store.pins.lock();
            let Some(n) = pins.count.get_mut(&self.dir) else {
                return;
            };
            *n -= 1;
            if *n > 0 {
                return;
            }
            pins.count.remove(&self.dir);
            pins.replaced.remove(&self.dir)
        };
        // Outside the lock; a replaced snapshot is never current again, so
        // nobody pins it meanwhile.
        if replaced && let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove a replaced snapshot");
        }
    }
}

/// A snapshot's bytes as Raft reads and writes them (openraft's
/// `SnapshotData`): an open archive, or a staged snapshot that is packed
/// on a blocking thread when first read or sought.
pub struct SnapshotFile(State);

enum State {
    Open(tokio::fs::File),
    Staged {
        pin: Pinned,
        seek: Option<SeekFrom>,
    },
    Packing {
        task: tokio::task::JoinHandle<std::io::Result<File>>,
        seek: Option<SeekFrom>,
        _pin: Pinned,
    },
    /// Packing failed; every later call answers this.
    Failed(std::io::ErrorKind, String),
}

impl SnapshotFile {
    /// An archive already on disk (or being received into).
    pub(crate) fn open(file: File) -> SnapshotFile {
        SnapshotFile(State::Open(tokio::fs::File::from_std(file)))
    }

    /// Packs a staged snapshot, if not done yet; ready once the archive
    /// is open (a seek asked for before then is started on it first).
    fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            match &mut self.0 {
                State::Open(_) => return Poll::Ready(Ok(())),
                State::Failed(kind, why) => {
                    return Poll::Ready(Err(std::io::Error::new(*kind, why.clone())));
                }
                State::Staged { .. } => self.start_packing(),
                State::Packing { task, seek, .. } => {
                    let done = match ready!(Pin::new(task).poll(cx)) {
                        Ok(Ok(file)) => {
                            let mut file = tokio::fs::File::from_std(file);
                            match seek.take() {
                                Some(to) => Pin::new(&mut file).start_seek(to).map(|()| file),
                                None => Ok(file),
                            }
                        }
                        Ok(Err(e)) => Err(e),
                        Err(e) => Err(std::io::Error::other(e)),
                    };
                    self.0 = match done {
                        Ok(file) => State::Open(file),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not pack a snapshot to send");
                            State::Failed(e.kind(), format!("packing the snapshot: {e}"))
                        }
                    };
                }
            }
        }
    }

    fn start_packing(&mut self) {
        let placeholder = State::Failed(std::io::ErrorKind::Other, "being packed".into());
        self.0 = match std::mem::replace(&mut self.0, placeholder) {
            State::Staged { pin, seek } => {
                let (store, dir) = (Arc::clone(&pin.store), pin.dir.clone());
                State::Packing {
                    task: tokio::task::spawn_blocking(move || store.pack_for_sending(&dir)),
                    seek,
                    _pin: pin,
                }
            }
            other => other,
        };
    }

    /// The open archive (after [`SnapshotFile::poll_open`] answered).
    fn file(&mut self) -> std::io::Result<Pin<&mut tokio::fs::File>> {
        match &mut self.0 {
            State::Open(f) => Ok(Pin::new(f)),
            // `poll_open` leaves no other state when it answers `Ok`.
            _ => Err(std::io::Error::other(
                "a snapshot file used before it was open",
            )),
        }
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_open(cx))?;
        this.file()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_open(cx))?;
        this.file()?.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_open(cx))?;
        this.file()?.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_open(cx))?;
        this.file()?.poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> std::io::Result<()> {
        let this = self.get_mut();
        match &mut this.0 {
            State::Open(f) => Pin::new(f).start_seek(position),
            State::Staged { seek, .. } | State::Packing { seek, .. } => {
                *seek = Some(position);
                Ok(())
            }
            State::Failed(kind, why) => Err(std::io::Error::new(*kind, why.clone())),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        let this = self.get_mut();
        ready!(this.poll_open(cx))?;
        this.file()?.poll_complete(cx)
    }
}

/// Stages the engine in `engine` into `staging`, as of now, without
/// copying a record: every segment up to the one being written is
/// hard-linked (the collector may remove them from the engine meanwhile;
/// the links keep them). Sealed segments never change again; the one being
/// written ends, for this snapshot, where `end` says (written to `TAIL`),
/// and grows only past it. Segments created ahead of need hold no entries
/// and are left out; `MARKS` is copied. Called with the state machine's
/// turn held, right after the sync that answered `end` (`active` is the
/// segment being written when no segment holds entries unsealed). The
/// staged files and their names are durable when this returns.
pub(crate) fn stage(
    engine: &Path,
    active: u64,
    end: Option<SegmentEnd>,
    staging: &Path,
) -> std::io::Result<()> {
    let names: Vec<String> = std::fs::read_dir(engine)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_engine_file(n))
        .collect();
    for name in &names {
        let (from, to) = (engine.join(name), staging.join(name));
        let done = match segment_seq(name) {
            Some(seq) if end.map_or(seq < active, |e| seq <= e.segment) => {
                std::fs::hard_link(&from, &to).or_else(|_| copy_synced(&from, &to))
            }
            Some(_) => continue,
            None => copy_synced(&from, &to),
        };
        match done {
            Ok(()) => {}
            // The collector removed a dead segment since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(end) = end {
        write_tail(staging, end)?;
    }
    sync_dir(staging)
}

/// Copies `from` to `to` and syncs the copy: the snapshot is the staged
/// directory itself, so a copy (of `MARKS`, or of a segment where a hard
/// link failed) must be as durable as the linked, already synced, files.
fn copy_synced(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::copy(from, to)?;
    File::open(to)?.sync_all()
}

/// Packs the files staged in `staging` into `out` (a snapshot's `TAIL`
/// cuts its last segment).
pub(crate) fn pack(staging: &Path, out: &Path) -> std::io::Result<u64> {
    let mut names: Vec<String> = std::fs::read_dir(staging)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_engine_file(n))
        .collect();
    names.sort();
    let mut w = BufWriter::with_capacity(BLOCK * 4, File::create(out)?);
    w.write_all(MAGIC)?;
    w.write_all(&[ARCHIVE_VERSION, 0])?;
    let tail = read_tail(staging)?;
    let mut block = vec![0u8; BLOCK];
    for name in names {
        let f = File::open(staging.join(&name))?;
        let len = f.metadata()?.len();
        // The segment the engine went on writing: only what the snapshot
        // holds; the rest reads as zeros, as in a segment not written yet.
        let written = match tail {
            Some(t) if segment_seq(&name) == Some(t.segment) => t.end.min(len),
            _ => len,
        };
        let name_len = u16::try_from(name.len()).map_err(|_| bad("a file name over 64 KiB"))?;
        w.write_all(&name_len.to_le_bytes())?;
        w.write_all(name.as_bytes())?;
        w.write_all(&len.to_le_bytes())?;
        let mut at = 0u64;
        while at < written {
            let n = (written - at).min(BLOCK as u64) as usize;
            f.read_exact_at(&mut block[..n], at)?;
            // Preallocated segments are mostly zeros: left out.
            if block[..n].iter().any(|&b| b != 0) {
                w.write_all(&at.to_le_bytes())?;
                w.write_all(&(n as u32).to_le_bytes())?;
                w.write_all(&block[..n])?;
            }
            at += n as u64;
        }
        w.write_all(&len.to_le_bytes())?;
        w.write_all(&0u32.to_le_bytes())?;
    }
    w.write_all(&0u16.to_le_bytes())?;
    // Not synced: an archive is only ever sent from (a receiver syncs
    // what it keeps).
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.metadata().map(|m| m.len())
}

fn read_u16(r: &mut impl Read) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_le_bytes(b))
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Unpacks the snapshot in `file` (from a peer: every length checked)
/// into the empty directory `dir`, durably.
pub(crate) fn unpack(file: File, dir: &Path) -> std::io::Result<()> {
    let mut r = BufReader::with_capacity(BLOCK * 4, file);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic[..6] != MAGIC || magic[7] != 0 {
        return Err(bad("not a fencelog snapshot (bad magic)"));
    }
    if magic[6] != ARCHIVE_VERSION {
        return Err(bad(FormatError::UnknownVersion {
            what: "a snapshot archive",
            version: magic[6],
            known: ARCHIVE_VERSION,
        }
        .to_string()));
    }
    std::fs::create_dir_all(dir)?;
    let mut block = vec![0u8; BLOCK];
    loop {
        let name_len = read_u16(&mut r)? as usize;
        if name_len == 0 {
            break;
        }
        let mut name = vec![0u8; name_len];
        r.read_exact(&mut name)?;
        let name = String::from_utf8(name).map_err(|_| bad("a file name that is not UTF-8"))?;
        if !is_engine_file(&name) || name.contains('/') {
            return Err(bad(format!("a snapshot file named {name:?}")));
        }
        let len = read_u64(&mut r)?;
        if len > MAX_FILE {
            return Err(bad(format!("{name}: {len} bytes (at most {MAX_FILE})")));
        }
        let f = File::create(dir.join(&name))?;
        f.set_len(len)?;
        loop {
            let at = read_u64(&mut r)?;
            let n = read_u32(&mut r)? as usize;
            if n == 0 {
                break;
            }
            if n > BLOCK || at.saturating_add(n as u64) > len {
                return Err(bad(format!(
                    "{name}: a run of {n} bytes at {at} (file of {len} bytes, runs of at most {BLOCK})"
                )));
            }
            r.read_exact(&mut block[..n])?;
            f.write_all_at(&block[..n], at)?;
        }
        f.sync_all()?;
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first 8 bytes of an archive of this version.
    const HEAD: &[u8; 8] = b"FLSNAP2\0";

    #[test]
    fn an_archive_of_another_version_is_refused_by_name() {
        let dst = tempfile::tempdir().unwrap();
        let p = dst.path().join("v3");
        std::fs::write(&p, [&b"FLSNAP3\0"[..], &0u16.to_le_bytes()].concat()).unwrap();
        let err = unpack(File::open(&p).unwrap(), &dst.path().join("out")).unwrap_err();
        assert!(err.to_string().contains("format version 51"), "{err}");
    }

    #[test]
    fn meta_round_trips_and_an_unversioned_one_is_refused() {
        let meta = SnapshotMeta::<NodeId, Member> {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(3, 1),
                42,
            )),
            last_membership: Default::default(),
            snapshot_id: "3-42-7".into(),
        };
        let bytes = encode_meta(&meta).unwrap();
        assert_eq!(&bytes[..5], b"FLSM\x01");
        assert_eq!(decode_meta(&bytes).unwrap(), meta);
        // What the build before versions wrote: bincode alone.
        let old = bincode::serialize(&meta).unwrap();
        assert!(matches!(
            decode_meta(&old),
            Err(FormatError::Unversioned { .. })
        ));
        let mut v2 = bytes.clone();
        v2[4] = 2;
        assert!(matches!(
            decode_meta(&v2),
            Err(FormatError::UnknownVersion { version: 2, .. })
        ));
        // Bytes left over, and every truncation, are refused.
        assert!(decode_meta(&[&bytes[..], &[0]].concat()).is_err());
        for n in 0..bytes.len() {
            assert!(decode_meta(&bytes[..n]).is_err(), "{n} bytes accepted");
        }
    }

    #[test]
    fn packs_and_unpacks_files_with_zero_runs_left_out() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let mut seg = vec![0u8; 5 * BLOCK + 17];
        seg[3] = 1;
        seg[2 * BLOCK + 5] = 7;
        seg[5 * BLOCK + 16] = 9;
        std::fs::write(src.path().join("00000000000000000001.wal"), &seg).unwrap();
        std::fs::write(src.path().join("MARKS"), b"marks").unwrap();
        std::fs::write(src.path().join("LOCK"), b"").unwrap();
        let out = src.path().join("x.snap");
        let size = pack(src.path(), &out).unwrap();
        assert!(
            size < 4 * BLOCK as u64,
            "zero blocks left out: {size} bytes"
        );
        let target = dst.path().join("engine");
        unpack(File::open(&out).unwrap(), &target).unwrap();
        assert_eq!(
            std::fs::read(target.join("00000000000000000001.wal")).unwrap(),
            seg
        );
        assert_eq!(std::fs::read(target.join("MARKS")).unwrap(), b"marks");
        assert!(!target.join("LOCK").exists());
    }

    fn seq_name(seq: u64) -> String {
        format!("{seq:020}.wal")
    }

    fn meta_at(index: u64) -> SnapshotMeta<NodeId, Member> {
        SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                index,
            )),
            last_membership: Default::default(),
            snapshot_id: format!("1-{index}-0"),
        }
    }

    /// An engine directory: segment 1 sealed, 2 being written (entries to
    /// 1000), 3 created ahead, and `MARKS`. Answers segment 2's bytes.
    fn engine_dir(dir: &Path) -> Vec<u8> {
        let mut sealed = vec![0u8; 3 * BLOCK];
        sealed[..8].copy_from_slice(b"FENCELOG");
        sealed[2 * BLOCK + 9] = 3;
        std::fs::write(dir.join(seq_name(1)), &sealed).unwrap();
        let mut active = vec![0u8; 3 * BLOCK];
        active[..8].copy_from_slice(b"FENCELOG");
        active[999] = 5;
        std::fs::write(dir.join(seq_name(2)), &active).unwrap();
        let mut ahead = vec![0u8; 3 * BLOCK];
        ahead[..8].copy_from_slice(b"FENCELOG");
        std::fs::write(dir.join(seq_name(3)), &ahead).unwrap();
        std::fs::write(dir.join("MARKS"), b"marks").unwrap();
        active
    }

    #[test]
    fn staging_links_segments_and_packing_stops_at_the_tail() {
        use std::os::unix::fs::MetadataExt;
        let engine = tempfile::tempdir().unwrap();
        let snaps = tempfile::tempdir().unwrap();
        let active = engine_dir(engine.path());
        let staging = snaps.path().join("staging");
        std::fs::create_dir(&staging).unwrap();
        let end = SegmentEnd {
            segment: 2,
            end: 1000,
        };
        stage(engine.path(), 2, Some(end), &staging).unwrap();
        // No record copied: both segments are the engine's own files.
        for seq in [1, 2] {
            let (a, b) = (
                engine.path().join(seq_name(seq)),
                staging.join(seq_name(seq)),
            );
            let (a, b) = (a.metadata().unwrap(), b.metadata().unwrap());
            assert_eq!(
                (a.dev(), a.ino()),
                (b.dev(), b.ino()),
                "segment {seq} copied"
            );
        }
        assert!(!staging.join(seq_name(3)).exists(), "a segment made ahead");
        assert_eq!(std::fs::read(staging.join("MARKS")).unwrap(), b"marks");
        assert_eq!(read_tail(&staging).unwrap(), Some(end));
        // The engine goes on: an entry past the end, then the seal.
        let live = std::fs::OpenOptions::new()
            .write(true)
            .open(engine.path().join(seq_name(2)))
            .unwrap();
        live.write_all_at(&[7; 100], 1000).unwrap();
        live.write_all_at(b"FLSEALED", 3 * BLOCK as u64 - 32)
            .unwrap();
        std::fs::write(engine.path().join("MARKS"), b"later").unwrap();
        let out = snaps.path().join("x.snap");
        pack(&staging, &out).unwrap();
        let target = snaps.path().join("unpacked");
        unpack(File::open(&out).unwrap(), &target).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&target)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "00000000000000000001.wal",
                "00000000000000000002.wal",
                "MARKS"
            ]
        );
        assert_eq!(std::fs::read(target.join(seq_name(2))).unwrap(), active);
        assert_eq!(std::fs::read(target.join("MARKS")).unwrap(), b"marks");
        // Without a tail (no segment held entries unsealed), nothing from
        // the segment being written on is staged.
        let bare = snaps.path().join("bare");
        std::fs::create_dir(&bare).unwrap();
        stage(engine.path(), 2, None, &bare).unwrap();
        assert!(bare.join(seq_name(1)).exists());
        assert!(!bare.join(seq_name(2)).exists() && !bare.join(TAIL).exists());
    }

    #[test]
    fn a_damaged_tail_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "2\n", "2 x\n", "2 1000", "-1 3\n", "2 1000 7\n"] {
            std::fs::write(dir.path().join(TAIL), bad).unwrap();
            let err = read_tail(dir.path()).unwrap_err();
            assert!(err.to_string().contains("TAIL"), "{bad:?}: {err}");
        }
    }

    /// A staged snapshot is packed only when read; one replaced before it
    /// is packed stays until it is; a received archive
    /// replaces it; a restart removes what has no metadata.
    #[test]
    fn a_staged_snapshot_is_packed_when_read_and_kept_while_read() {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let engine = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        engine_dir(engine.path());
        let store = Arc::new(Store::open(root.path().join("snap")).unwrap());
        let staged = |index: u64| {
            let staging = store.staging().unwrap();
            let end = SegmentEnd {
                segment: 2,
                end: 1000,
            };
            stage(engine.path(), 2, Some(end), &staging).unwrap();
            store.save(&staging, &meta_at(index)).unwrap()
        };
        let first = staged(10);
        let Source::Staged(first_dir) = first.source.clone() else {
            panic!("a built snapshot is staged")
        };
        let expected = root.path().join("expected");
        pack(&first_dir, &expected).unwrap();
        let expected = std::fs::read(&expected).unwrap();
        let mut reader = store.open_snapshot(&first).unwrap();
        assert!(
            std::fs::read_dir(root.path().join("snap"))
                .unwrap()
                .all(|e| !e
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("sending")),
            "packed before it was read"
        );
        // A newer one is built while the first is (about to be) sent.
        let second = staged(20);
        assert_eq!(store.current().unwrap().unwrap().meta, second.meta);
        let (meta, unread) = store.open_current().unwrap().unwrap();
        assert_eq!(meta, second.meta);
        drop(unread);
        // Built again at the same index: the one saved stays.
        let again = staged(20);
        assert_eq!(again.source, second.source);
        assert!(!root.path().join("snap").join("staging").exists());
        assert!(first_dir.exists(), "removed while its reader may pack it");
        let read = rt.block_on(async {
            // Raft asks the size first, then reads from an offset.
            let len = reader.seek(SeekFrom::End(0)).await.unwrap();
            reader.seek(SeekFrom::Start(5)).await.unwrap();
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).await.unwrap();
            (len, rest)
        });
        assert_eq!(read.0, expected.len() as u64);
        assert_eq!(read.1, expected[5..]);
        // Packed and open: the replaced directory is no longer needed.
        assert!(!first_dir.exists(), "the replaced snapshot stayed");
        drop(reader);
        // Nothing packed is left behind (the sent archive was unlinked).
        let left: Vec<String> = std::fs::read_dir(root.path().join("snap"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.iter().all(|n| !n.starts_with("sending")), "{left:?}");
        // The current one is packed by its first send and kept for the
        // next (a transfer that failed starts over): the same archive.
        let Source::Staged(second_dir) = second.source.clone() else {
            panic!("a built snapshot is staged")
        };
        let read_all = |saved: &Saved| {
            let mut reader = store.open_snapshot(saved).unwrap();
            rt.block_on(async {
                let mut all = Vec::new();
                reader.read_to_end(&mut all).await.unwrap();
                all
            })
        };
        let sent = read_all(&second);
        let kept = second_dir.with_extension("snap");
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&p.metadata().unwrap());
        let packed_at = inode(&kept);
        assert_eq!(read_all(&second), sent);
        assert_eq!(inode(&kept), packed_at, "packed again for the second send");
        // A restart does not trust it (never synced): removed, the
        // directory stays the snapshot.
        drop(Store::open(root.path().join("snap")).unwrap());
        assert!(!kept.exists() && second_dir.exists());
        assert_eq!(read_all(&second), sent);
        // A received archive, newer, replaces the staged one.
        let incoming = root.path().join("snap").join("incoming-test");
        std::fs::write(&incoming, &expected).unwrap();
        let received = store.save(&incoming, &meta_at(30)).unwrap();
        assert!(matches!(received.source, Source::Packed(_)));
        assert!(!second_dir.exists() && !kept.exists());
        // A crash left a directory without metadata: removed at open.
        let orphan = root
            .path()
            .join("snap")
            .join("00000000000000000001-00000000000000000005.d");
        std::fs::create_dir(&orphan).unwrap();
        drop(store);
        let store = Store::open(root.path().join("snap")).unwrap();
        assert!(!orphan.exists());
        let current = store.current().unwrap().unwrap();
        assert_eq!(current.meta, meta_at(30));
        assert_eq!(current.source, received.source);
    }

    #[test]
    fn a_hostile_snapshot_is_refused() {
        let dst = tempfile::tempdir().unwrap();
        let cases: Vec<Vec<u8>> = vec![
            b"NOTASNAP".to_vec(),
            [&HEAD[..], &3u16.to_le_bytes(), b"../"].concat(),
            [
                &HEAD[..],
                &5u16.to_le_bytes(),
                b"MARKS",
                &(u64::MAX).to_le_bytes(),
            ]
            .concat(),
            [
                &HEAD[..],
                &5u16.to_le_bytes(),
                b"MARKS",
                &10u64.to_le_bytes(),
                &8u64.to_le_bytes(),
                &4u32.to_le_bytes(),
                b"abcd",
            ]
            .concat(),
            // Truncated.
            [&HEAD[..], &5u16.to_le_bytes(), b"MAR"].concat(),
        ];
        for (i, bytes) in cases.into_iter().enumerate() {
            let p = dst.path().join(format!("case{i}"));
            std::fs::write(&p, &bytes).unwrap();
            let err = unpack(File::open(&p).unwrap(), &dst.path().join(format!("out{i}")));
            assert!(err.is_err(), "case {i} accepted");
        }
    }
}
