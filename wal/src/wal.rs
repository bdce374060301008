//! The write-ahead log: a serialized section where the caller decides and
//! encodes, and a sync thread that writes and syncs whole batches.
//!
//! ```text
//!  submitters (threads, tasks)           sync thread
//!  ───────────────────────────           ───────────
//!  lock ─ decide ─ encode into pending   wait for pending
//!  unlock, wait on the batch's ticket    take pending (one swap under the lock)
//!                                        write it, fdatasync once
//!                                        apply effects, advance durable LSN
//!                                        complete the batch: wake its waiters
//! ```
//!
//! Decisions happen in queue order inside the lock, before encoding, and
//! never wait for a sync: while one batch is being synced the next one fills
//! up. Order in the file is order of decision.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use std::{io, mem};

use bytes::Bytes;
use event_listener::{Event, EventListener, Listener};
use parking_lot::RwLock;

use crate::lock::{Condvar, Mutex, MutexGuard};

use crate::comeback::{self, Answered, Comeback};
use crate::error::WalError;
use crate::files::{FileCache, FooterCache};
use crate::format::{
    self, ENTRY_HEADER_LEN, EntryKind, FOOTER_HEADER_LEN, HEADER_LEN, TRAILER_LEN, Trailer,
};
use crate::marks::{Marks, MarksFile};
use crate::options::{Preallocation, WalOptions};
use crate::read_ahead::ReadAhead;
use crate::recovery::{self, RecoveryReport, Scanned, Tail};
use crate::segment::{self, Entry, SealedInfo, SegmentHandle};
use crate::stats::{WalStats, WalStatsSnapshot};
use crate::storage::{DirLock, Storage, StorageFile};
use crate::ticket::{Batch, Ticket};

/// The state of the layer above, kept inside the log's serialized section.
///
/// The log calls these while holding its lock, in entry order, so what they
/// produce is consistent with the entries around them.
pub trait Sequencer: Send + 'static {
    /// Work to do once the entries of a batch are durable (on the sync
    /// thread, before any waiter of that batch wakes).
    type Effect: Durable;

    /// What opens segment `segment`: a checkpoint (`Some`: everything
    /// recovery needs to rebuild the state as of this point; recovery
    /// replays from the newest intact one), or `None` for a link (replay
    /// reaches this segment from an older checkpoint). `since_checkpoint`
    /// is how many bytes the log has written since the last checkpoint, so
    /// the layer above can keep checkpoints a small share of the log.
    fn checkpoint(&mut self, segment: u64, since_checkpoint: u64) -> Option<Vec<u8>>;

    /// The footer payload of segment `segment`, sealed now: its last entry
    /// has been appended. The effect, if any, runs once the footer is
    /// durable. A large payload is best made later
    /// ([`FooterPayload::Later`]): this runs under the log's lock, where
    /// every writer waits.
    fn seal(&mut self, segment: u64) -> (FooterPayload, Option<Self::Effect>);

    /// How many bytes the next footer will take, so that segments are sealed
    /// before it overflows them. The default, 0, lets the footer grow the
    /// file past `segment_bytes`.
    fn seal_len_hint(&self) -> u64 {
        0
    }
}

/// A sealed segment's footer payload, as [`Sequencer::seal`] gives it.
pub enum FooterPayload {
    /// The bytes, made under the log's lock.
    Bytes(Vec<u8>),
    /// Made by the sync thread when it writes the footer, off the log's
    /// lock: the function appends the payload to the buffer it is given.
    /// A footer indexing every record of a 64 MiB segment is megabytes,
    /// and making it under the lock held every writer for milliseconds.
    Later(FillFooter),
}

/// Appends a footer's payload to the buffer it is given.
pub type FillFooter = Box<dyn FnOnce(&mut Vec<u8>) + Send>;

impl From<Vec<u8>> for FooterPayload {
    fn from(bytes: Vec<u8>) -> FooterPayload {
        FooterPayload::Bytes(bytes)
    }
}

impl FooterPayload {
    /// The footer of segment `seq` (entries `first_lsn..=last_lsn`), framed.
    fn frame(self, seq: u64, first_lsn: u64, last_lsn: u64) -> Result<Vec<u8>, WalError> {
        match self {
            FooterPayload::Bytes(payload) => {
                format::encode_footer(seq, first_lsn, last_lsn, &payload)
            }
            FooterPayload::Later(fill) => {
                let mut b = vec![0; format::FOOTER_HEADER_LEN];
                fill(&mut b);
                format::frame_footer(seq, first_lsn, last_lsn, b)
            }
        }
    }
}

/// A segment to seal after a chunk is written.
struct PendingSeal {
    first_lsn: u64,
    last_lsn: u64,
    payload: FooterPayload,
}

/// An effect of a batch, applied once the batch is durable.
pub trait Durable: Send + 'static {
    /// Called exactly once, on the sync thread, after the sync returned
    /// (or at once, where everything appended is durable already).
    fn durable(self);

    /// Runs the effects of one batch, in the order they were queued, each
    /// exactly once, on the sync thread after the sync returned. The
    /// default runs each on its own; a layer may run a row of its effects
    /// together where that leaves what running them in turn would (the
    /// engine: a client's pipeline of appends to one stream).
    fn durable_all(effects: Vec<Self>)
    where
        Self: Sized,
    {
        for effect in effects {
            effect.durable();
        }
    }
}

/// A log that keeps no state of its own: no checkpoints, no footers (raw
/// appends, as in benchmarks and examples).
impl Sequencer for () {
    type Effect = ();
    fn checkpoint(&mut self, _segment: u64, _since: u64) -> Option<Vec<u8>> {
        Some(Vec::new())
    }
    fn seal(&mut self, _segment: u64) -> (FooterPayload, Option<()>) {
        (Vec::new().into(), None)
    }
}

impl Durable for () {
    fn durable(self) {}
}

/// What [`Wal::remove_segment`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The segment's file is gone, durably.
    Removed,
    /// There is no such segment (removed before).
    Absent,
    /// Recovery may still need it; try again after the next checkpoint is
    /// durable.
    NotYet,
}

/// Where an appended entry landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The entry's log sequence number.
    pub lsn: u64,
    /// The segment it is in.
    pub segment: u64,
    /// Its byte position in that segment.
    pub position: u64,
}

/// An entry handed to the layer above during recovery, in log order.
pub struct ReplayEntry {
    /// Its log sequence number.
    pub lsn: u64,
    /// What it is for.
    pub kind: EntryKind,
    /// The segment it is in.
    pub segment: u64,
    /// Its byte position in that segment.
    pub position: u64,
    /// Its payload (a slice of a map of the segment).
    pub payload: Bytes,
    path: PathBuf,
}

impl ReplayEntry {
    /// An error naming this entry's file and position, for a payload the
    /// layer above cannot decode although its checksum matched.
    pub fn corrupt(&self, reason: impl Into<String>) -> WalError {
        WalError::Corrupt {
            file: self.path.clone(),
            position: self.position,
            reason: reason.into(),
        }
    }
}

/// What recovery hands to the layer above to rebuild its state.
pub struct Replay<'a> {
    dir: &'a Path,
    entries: &'a [Scanned],
    data: &'a std::collections::HashMap<u64, Bytes>,
    segments: &'a [u64],
    sealed: &'a std::collections::HashMap<u64, (SealedInfo, Bytes)>,
    report: &'a RecoveryReport,
}

impl<'a> Replay<'a> {
    /// What recovery kept in `dir`, for the caller to rebuild its state.
    fn of(recovered: &'a recovery::Recovered, dir: &'a Path) -> Self {
        Replay {
            dir,
            entries: &recovered.entries,
            data: &recovered.data,
            segments: &recovered.segments,
            sealed: &recovered.sealed,
            report: &recovered.report,
        }
    }
}

impl Replay<'_> {
    /// Every entry from the newest intact checkpoint on, in order. The first
    /// is a checkpoint unless the log is empty.
    pub fn entries(&self) -> impl Iterator<Item = ReplayEntry> + '_ {
        self.entries.iter().filter_map(|e| {
            let data = self.data.get(&e.seq)?;
            let start = e.pos as usize + ENTRY_HEADER_LEN;
            Some(ReplayEntry {
                lsn: e.lsn,
                kind: e.kind,
                segment: e.seq,
                position: e.pos,
                payload: data.slice(start..start + e.len as usize),
                path: self.dir.join(format::segment_file_name(e.seq)),
            })
        })
    }

    /// Sequence numbers of every segment in the log, in order.
    pub fn segments(&self) -> &[u64] {
        self.segments
    }

    /// Whether segment `segment` is sealed (its footer is durable). Replayed
    /// entries can sit in a sealed segment when the segment after it never
    /// got its first sync.
    pub fn is_sealed(&self, segment: u64) -> bool {
        // Segments older than the first replayed one are sealed too.
        self.sealed.contains_key(&segment) || self.entries.first().is_some_and(|e| segment < e.seq)
    }

    /// What recovery found and did so far: in particular whether it cut
    /// anything, and the token marks after it.
    pub fn report(&self) -> &RecoveryReport {
        self.report
    }
}

/// One pending write: bytes for one segment at one position.
struct Chunk {
    seq: u64,
    pos: u64,
    buf: Vec<u8>,
    /// The segment must be created before this chunk is written.
    create: bool,
    /// The segment opens with a checkpoint (replay can start there).
    opens_checkpoint: bool,
    /// Seal the segment after this chunk, with this footer.
    seal: Option<PendingSeal>,
}

/// The largest batch a task awaiting its ticket writes itself, without a
/// sync per batch (see `InlineFlush::try_flush_unsynced`), and the largest
/// [`Wal::flush_small_here`] writes and syncs. Copying a few
/// KiB into the page cache costs less than handing the batch to the sync
/// thread and being woken by it; a large batch would hold the awaiting
/// task (a replica's Raft thread) while it copies, most of all into
/// fresh pages (the replica's apply measured slower with no bound: a
/// 60 KiB entry at pipeline 16).
const INLINE_WRITE_BYTES: u64 = 16 << 10;

/// Whether a submit may append now ([`Shared::with_room`]).
enum Room<'a, S: Sequencer> {
    /// The log's lock, with room in the pending batch.
    Now(MutexGuard<'a, Locked<S>>),
    /// No room: what wakes once the batch is written, if asked for.
    Later(Option<EventListener>),
}

/// Everything to be made durable by the next sync.
struct Pending<E> {
    chunks: Vec<Chunk>,
    effects: Vec<E>,
    batch: Arc<Batch>,
    first_lsn: Option<u64>,
    bytes: u64,
    entries: u64,
    /// When its first entry was submitted (for the commit latency).
    opened: Option<Instant>,
    /// The ceiling this batch needs durable before it is acknowledged, and
    /// what to raise it to (see [`Writer::reserve`]).
    reserve: Option<(u64, u64)>,
}

impl<E> Pending<E> {
    /// An empty batch of the log `flush`.
    fn new(flush: Weak<dyn InlineFlush>) -> Self {
        Self::sized(0, 0, flush)
    }

    /// The batch after `self`, with room for as many chunks and effects
    /// (up to 1 024: a burst's batch does not size every one after it):
    /// batches in a run are of about one size, and growing the effects one
    /// push at a time from empty reallocated them about five times a batch
    /// (3 % of an append's instructions at pipeline 1).
    fn next(&self) -> Self {
        const MOST: usize = 1024;
        Self::sized(
            self.chunks.len().min(MOST),
            self.effects.len().min(MOST),
            self.batch.log(),
        )
    }

    fn sized(chunks: usize, effects: usize, flush: Weak<dyn InlineFlush>) -> Self {
        Pending {
            chunks: Vec::with_capacity(chunks),
            effects: Vec::with_capacity(effects),
            batch: Batch::new(flush),
            first_lsn: None,
            bytes: 0,
            entries: 0,
            opened: None,
            reserve: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Whether writing this batch is only a small write into the open
    /// segment: at most [`INLINE_WRITE_BYTES`], no segment to create or
    /// seal, and no ceiling above `ceiling` to make durable first.
    fn is_plain(&self, ceiling: u64) -> bool {
        self.bytes <= INLINE_WRITE_BYTES
            && self.chunks.iter().all(|c| !c.create && c.seal.is_none())
            && self.reserve.is_none_or(|(needed, _)| needed <= ceiling)
    }
}

/// The segment allocator's state: it creates the next segment ahead of need.
#[derive(Default)]
struct Alloc {
    /// The segment to create next.
    wanted: Option<u64>,
    /// A creation is under way.
    creating: bool,
    /// A created segment, ready to be written.
    ready: Option<(Arc<SegmentHandle>, Arc<dyn StorageFile>)>,
    /// Sealed segments whose pages are to leave the page cache
    /// (`WalOptions::uncache_sealed`).
    uncache: Vec<Arc<dyn StorageFile>>,
    shutdown: bool,
}

/// What the lock protects.
struct Locked<S: Sequencer> {
    state: S,
    next_lsn: u64,
    /// The segment new entries go to, and where.
    seg_seq: u64,
    seg_pos: u64,
    /// LSN of the current segment's first entry (its checkpoint or link).
    seg_first_lsn: u64,
    /// Where the current segment's records start (after its opening entry).
    seg_records_start: u64,
    /// Bytes written since the last checkpoint.
    since_checkpoint: u64,
    /// First LSN of the epoch being filled in the current segment.
    epoch_first_lsn: Option<u64>,
    pending: Pending<S::Effect>,
    /// The batch being written and synced right now.
    inflight: Option<Arc<Batch>>,
    /// Buffers returned by the sync thread, reused to avoid reallocation.
    spare: Vec<Vec<u8>>,
    sync_thread_waiting: bool,
    /// While the sync thread waits for the writers it answered: the
    /// pending entries at which a submit wakes it (0: no such wait).
    wake_at: u64,
    shutdown: bool,
    /// Set inside the lock when writing cannot go on (a footer that cannot
    /// be encoded); the log latches as failed once the lock is released.
    broken: Option<String>,
}

/// Reads entries of one segment (see [`Wal::segment_reader`]). It holds the
/// segment's file open: an evicted file stays open until the reader is
/// dropped, like any read in flight. Entries asked for one shortly after
/// the other are read ahead, in windows of up to 64 KiB.
pub struct SegmentReader<'w, S: Sequencer> {
    wal: &'w Wal<S>,
    handle: Arc<SegmentHandle>,
    file: Arc<dyn StorageFile>,
    ahead: ReadAhead,
}

impl<S: Sequencer> SegmentReader<'_, S> {
    /// The segment read.
    pub fn segment(&self) -> u64 {
        self.handle.seq
    }

    /// Reads the durable entry at `position`, as [`Wal::read_entry`].
    pub fn read_entry(&mut self, position: u64) -> Result<Entry, WalError> {
        let (handle, file, ahead) = (&self.handle, self.file.as_ref(), &mut self.ahead);
        let segment = handle.seq;
        let no_entry = || WalError::NoEntry { segment, position };
        let read_size = &self.wal.shared.read_size;
        let mut read =
            |end: u64| ahead.read_entry(file, &handle.path, segment, position, end, read_size);
        let entry = match self.wal.sealed_info(handle, file)? {
            Some(info) => read(info.footer_pos)?,
            // The segment being written: within the length last asked no
            // `stat` is needed (a file never shrinks); past it, ask again.
            None => match read(handle.known_len())? {
                Some(entry) => Some(entry),
                None => {
                    let len = file
                        .len()
                        .map_err(|e| WalError::io("stat", &handle.path, e))?;
                    handle.set_known_len(len);
                    read(len)?
                }
            },
        }
        .ok_or_else(no_entry)?;
        if entry.lsn > self.wal.durable_lsn() {
            return Err(no_entry());
        }
        Ok(entry)
    }
}

struct Shared<S: Sequencer> {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    locked: Mutex<Locked<S>>,
    work: Condvar,
    /// Signalled whenever the pending batch is taken: submitters held back
    /// by `max_batch_bytes` retry.
    space: Event,
    durable_lsn: AtomicU64,
    /// The newest segment whose opening checkpoint is durable: replay
    /// starts there or later, so older sealed segments are not needed by
    /// recovery.
    durable_checkpoint_seq: AtomicU64,
    /// The segment the sync thread writes to.
    active_seq: AtomicU64,
    failed: AtomicBool,
    /// The sync thread waits for the writers it answered (see
    /// `comeback.rs`): a blocked waiter leaves the batch to it.
    waiting_for_writers: AtomicBool,
    failure: OnceLock<Arc<io::Error>>,
    segments: RwLock<std::collections::BTreeMap<u64, Arc<SegmentHandle>>>,
    alloc: Mutex<Alloc>,
    alloc_ready: Condvar,
    /// Held by whoever writes and syncs a batch (see [`FlushState`]).
    flush: Mutex<FlushState>,
    /// Open files of segments being read, within a budget.
    files: FileCache,
    /// Footers of sealed segments, within a budget.
    footers: FooterCache,
    /// How much a read of an entry asks for first.
    read_size: segment::ReadSize,
    /// The token marks file (written by whoever flushes, or by
    /// [`Wal::raise_marks`]).
    marks: Mutex<MarksFile>,
    /// A copy of the marks' ceiling, readable without the lock.
    ceiling: AtomicU64,
    opts: WalOptions,
    stats: WalStats,
    _lock: Box<dyn DirLock>,
}

/// A durable, group-committed, segmented write-ahead log whose serialized
/// section holds the caller's state `S`.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use fencelog_wal::{FsStorage, Wal, WalOptions};
///
/// // The simplest state, `()`: nothing to checkpoint, nothing to seal. A
/// // real caller implements `Sequencer` for the state it rebuilds on replay.
/// let dir = tempfile::tempdir().unwrap();
/// let (wal, _report) =
///     Wal::open(Arc::new(FsStorage), dir.path(), WalOptions::default(), |_replay| Ok(()))
///         .unwrap();
/// let (appended, ticket) = wal
///     .submit(|w| {
///         let at = w.append(5, |buf| buf.copy_from_slice(b"hello"))?;
///         Ok::<_, fencelog_wal::WalError>((at, w.ticket()))
///     })
///     .unwrap()
///     .unwrap();
/// ticket.wait().unwrap(); // durable now
/// let entry = wal.read_entry(appended.segment, appended.position).unwrap();
/// assert_eq!(&entry.payload[..], b"hello");
/// ```
pub struct Wal<S: Sequencer> {
    shared: Arc<Shared<S>>,
    sync_thread: Option<JoinHandle<()>>,
    allocator: Option<JoinHandle<()>>,
}

/// The caller's handle inside the serialized section.
pub struct Writer<'a, S: Sequencer> {
    locked: &'a mut Locked<S>,
    shared: &'a Arc<Shared<S>>,
}

impl<S: Sequencer> Writer<'_, S> {
    /// The state of the layer above.
    pub fn state(&mut self) -> &mut S {
        &mut self.locked.state
    }

    /// The LSN the next entry gets.
    pub fn next_lsn(&self) -> u64 {
        self.locked.next_lsn
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> u64 {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// Appends a record entry of exactly `len` payload bytes, written by
    /// `fill` straight into the batch buffer.
    pub fn append(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Appended, WalError> {
        let max = self.shared.opts.max_entry_bytes;
        if len > max as usize {
            return Err(WalError::TooLarge {
                len: len as u64,
                max: u64::from(max),
            });
        }
        Ok(self.locked.append_entry(EntryKind::Record, len, fill))
    }

    /// Promises that no entry of the pending batch is acknowledged before
    /// the marks' ceiling is at least `needed`: if it is below, the flush
    /// raises it to `target` (durably, in the marks file) before it
    /// completes the batch. The layer above calls this for every value it
    /// must never see lowered by a cut (the engine: tokens).
    pub fn reserve(&mut self, needed: u64, target: u64) {
        if needed <= self.shared.ceiling.load(Ordering::Acquire) {
            return;
        }
        if self.locked.pending.is_empty() {
            // Nothing pending: an empty chunk makes the next batch exist.
            self.locked.current_chunk();
        }
        let r = &mut self.locked.pending.reserve;
        *r = Some(match *r {
            Some((n, t)) => (n.max(needed), t.max(target)),
            None => (needed, target.max(needed)),
        });
    }

    /// The marks' ceiling as last made durable.
    pub fn ceiling(&self) -> u64 {
        self.shared.ceiling.load(Ordering::Acquire)
    }

    /// Runs `effect` once everything appended so far is durable: at once if
    /// it is already, else on the sync thread after the batch's sync.
    pub fn on_durable(&mut self, effect: S::Effect) {
        if self.locked.next_lsn - 1 <= self.durable_lsn() {
            effect.durable();
            return;
        }
        if self.locked.pending.is_empty() {
            // What must be durable first is in flight: an empty chunk makes
            // the next batch exist, and it completes after the one in flight.
            self.locked.current_chunk();
        }
        self.locked.pending.effects.push(effect);
    }

    /// A ticket that resolves once everything appended so far is durable.
    pub fn ticket(&self) -> Ticket {
        self.ticket_for(self.locked.next_lsn - 1)
    }

    /// A ticket that resolves once the entry `lsn` (and all before) is durable.
    pub fn ticket_for(&self, lsn: u64) -> Ticket {
        self.locked.ticket_for(lsn, self.shared)
    }
}

impl<S: Sequencer> Locked<S> {
    fn current_chunk(&mut self) -> &mut Chunk {
        let need_new = self
            .pending
            .chunks
            .last()
            .is_none_or(|c| c.seq != self.seg_seq || c.seal.is_some());
        if need_new {
            let buf = self.spare.pop().unwrap_or_default();
            self.pending.chunks.push(Chunk {
                seq: self.seg_seq,
                pos: self.seg_pos,
                buf,
                create: false,
                opens_checkpoint: false,
                seal: None,
            });
        }
        let last = self.pending.chunks.len() - 1;
        &mut self.pending.chunks[last]
    }

    fn append_entry(
        &mut self,
        kind: EntryKind,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Appended {
        let lsn = self.next_lsn;
        let seq = self.seg_seq;
        let position = self.seg_pos;
        let epoch = *self.epoch_first_lsn.get_or_insert(lsn);
        let total = format::entry_len(len) as usize;
        let chunk = self.current_chunk();
        debug_assert_eq!(chunk.pos + chunk.buf.len() as u64, position);
        let at = chunk.buf.len();
        chunk.buf.resize(at + total, 0);
        let entry = &mut chunk.buf[at..at + ENTRY_HEADER_LEN + len];
        let (header, payload) = entry.split_at_mut(ENTRY_HEADER_LEN);
        fill(payload);
        // The checksum is computed by whoever flushes, outside this lock.
        // `len` fits: entries are bounded by max_entry_bytes (u32), and
        // the opening entry by the check in `start_segment`.
        format::encode_entry_fields(header, lsn, epoch, kind, len as u32);
        self.next_lsn += 1;
        self.since_checkpoint += total as u64;
        self.seg_pos += total as u64;
        self.pending.first_lsn.get_or_insert(lsn);
        self.pending.opened.get_or_insert_with(Instant::now);
        self.pending.bytes += total as u64;
        self.pending.entries += 1;
        Appended {
            lsn,
            segment: seq,
            position,
        }
    }

    fn ticket_for(&self, lsn: u64, shared: &Arc<Shared<S>>) -> Ticket {
        locked_ticket(&self.pending, &self.inflight, lsn, shared)
    }

    /// Seals the current segment after its last entry and opens `next` (the
    /// next number, except after recovery removed junk segments) with a
    /// checkpoint or a link.
    fn rotate_to(&mut self, next: u64, stats: &WalStats) {
        let seq = self.seg_seq;
        let (payload, effect) = self.state.seal(seq);
        let seal = PendingSeal {
            first_lsn: self.seg_first_lsn,
            last_lsn: self.next_lsn - 1,
            payload,
        };
        self.current_chunk().seal = Some(seal);
        self.pending.effects.extend(effect);
        self.start_segment(next, stats);
    }

    /// Starts segment `seq` (to be created by the sync thread) with a
    /// checkpoint of the state, or a link.
    fn start_segment(&mut self, seq: u64, stats: &WalStats) {
        self.seg_seq = seq;
        self.seg_pos = HEADER_LEN;
        self.seg_first_lsn = self.next_lsn;
        self.epoch_first_lsn = None;
        let buf = self.spare.pop().unwrap_or_default();
        let checkpoint = match self.state.checkpoint(seq, self.since_checkpoint) {
            // An entry's length is a u32: a checkpoint that does not fit
            // becomes a link (replay then starts further back), counted.
            Some(c) if c.len() > MAX_CHECKPOINT_BYTES => {
                stats.oversized_checkpoints.fetch_add(1, Ordering::Relaxed);
                None
            }
            other => other,
        };
        self.pending.chunks.push(Chunk {
            seq,
            pos: HEADER_LEN,
            buf,
            create: true,
            opens_checkpoint: checkpoint.is_some(),
            seal: None,
        });
        match checkpoint {
            Some(c) => {
                stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                stats
                    .last_checkpoint_bytes
                    .store(c.len() as u64, Ordering::Relaxed);
                self.append_entry(EntryKind::Checkpoint, c.len(), |buf| {
                    buf.copy_from_slice(&c)
                });
                self.since_checkpoint = 0;
            }
            None => {
                stats.links.fetch_add(1, Ordering::Relaxed);
                self.append_entry(EntryKind::Link, 0, |_| {});
            }
        }
        self.seg_records_start = self.seg_pos;
    }
}

/// Takes the directory's lock: one handle at a time.
pub(crate) fn lock_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn DirLock>, WalError> {
    storage.lock_dir(dir).map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            WalError::Locked {
                dir: dir.to_path_buf(),
            }
        } else {
            WalError::io("lock", dir.join("LOCK"), e)
        }
    })
}

/// The recovered tail segment and its file, which the first flush writes
/// (or seals).
type TailFile = Option<(u64, Arc<dyn StorageFile>)>;

impl<S: Sequencer> Locked<S> {
    /// The serialized section over the replayed `state`, before any
    /// segment is open for writing.
    fn recovered(state: S, recovered: &recovery::Recovered) -> Self {
        let next_lsn = recovered.next_lsn;
        Locked {
            state,
            next_lsn,
            seg_seq: 0,
            seg_pos: 0,
            seg_first_lsn: next_lsn,
            seg_records_start: HEADER_LEN,
            // The replayed entries after the checkpoint replay started at.
            since_checkpoint: recovered
                .entries
                .iter()
                .skip(1)
                .map(|e| format::entry_len(e.len as usize))
                .sum(),
            epoch_first_lsn: None,
            // Of no log yet: `open` gives it its log's handle.
            pending: Pending::new(Weak::<Shared<S>>::new()),
            inflight: None,
            spare: Vec::new(),
            sync_thread_waiting: false,
            wake_at: 0,
            shutdown: false,
            broken: None,
        }
    }

    /// Goes on writing where recovery left off: in the recovered tail
    /// segment, or (after sealing it) in a new one. Answers the segment the
    /// sync thread writes to and the tail's file, which the first flush
    /// writes (or seals).
    fn resume(
        &mut self,
        tail: Tail,
        entries: &[Scanned],
        next_seq: u64,
        handles: &[Arc<SegmentHandle>],
        stats: &WalStats,
    ) -> (u64, TailFile) {
        let seal = matches!(tail, Tail::SealThenRotate { .. });
        match tail {
            Tail::Continue {
                seq,
                pos,
                first_lsn,
                file,
            }
            | Tail::SealThenRotate {
                seq,
                pos,
                first_lsn,
                file,
            } => {
                self.seg_seq = seq;
                self.seg_pos = pos;
                self.seg_first_lsn = first_lsn;
                // The records start after the segment's opening entry.
                self.seg_records_start = entries
                    .iter()
                    .find(|e| e.seq == seq)
                    .map_or(HEADER_LEN, |e| e.pos + format::entry_len(e.len as usize));
                if seal {
                    self.rotate_to(next_seq, stats);
                }
                (seq, Some((seq, Arc::from(file))))
            }
            Tail::Rotate => {
                self.start_segment(next_seq, stats);
                (handles.last().map_or(0, |last| last.seq + 1), None)
            }
        }
    }
}

/// The largest checkpoint written as one entry.
const MAX_CHECKPOINT_BYTES: usize = (u32::MAX - 64) as usize;

impl<S: Sequencer> Wal<S> {
    /// Opens (or creates) the log in `dir`, recovers its tail, and rebuilds
    /// the caller's state with `build` from the replayed entries.
    ///
    /// Fails if another handle holds the directory, if a segment is damaged
    /// beyond a torn tail (unless `opts.recovery` says to salvage), or if a
    /// segment has an unknown format version.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        opts: WalOptions,
        build: impl FnOnce(Replay<'_>) -> Result<S, WalError>,
    ) -> Result<(Wal<S>, RecoveryReport), WalError> {
        opts.validate()?;
        storage
            .create_dir_all(dir)
            .map_err(|e| WalError::io("create directory", dir, e))?;
        let lock = lock_dir(storage.as_ref(), dir)?;
        let mut marks = MarksFile::open(storage.as_ref(), dir)?;
        let recovered = recovery::recover(storage.as_ref(), dir, &opts, &mut marks)?;
        let state = build(Replay::of(&recovered, dir))?;
        let handles = recovered.handles(dir);
        let stats = WalStats::default();
        let mut locked = Locked::recovered(state, &recovered);
        let (active_seq, tail_file) = locked.resume(
            recovered.tail,
            &recovered.entries,
            recovered.next_seq,
            &handles,
            &stats,
        );
        if let Some(why) = locked.broken.take() {
            return Err(WalError::io(
                "seal the recovered tail of",
                dir,
                io::Error::other(why),
            ));
        }
        let flush = FlushState::recovered(&handles, tail_file, locked.seg_pos);
        let footers = FooterCache::new(opts.footer_cache_bytes);
        for (&seq, (_, footer)) in &recovered.sealed {
            footers.put(seq, footer.clone());
        }
        let shared = Arc::new_cyclic(|me: &Weak<Shared<S>>| {
            // Its batches flush through the log (see `Ticket::wait`); the
            // first holds what resuming wrote, and no ticket yet.
            debug_assert_eq!(Arc::strong_count(&locked.pending.batch), 1);
            locked.pending.batch = Batch::new(Weak::clone(me) as Weak<dyn InlineFlush>);
            Shared {
                dir: dir.to_path_buf(),
                storage,
                work: Condvar::new(),
                space: Event::new(),
                durable_lsn: AtomicU64::new(recovered.next_lsn - 1),
                // Replay started at the newest checkpoint: its segment is needed.
                durable_checkpoint_seq: AtomicU64::new(
                    recovered.entries.first().map_or(0, |e| e.seq),
                ),
                active_seq: AtomicU64::new(active_seq),
                failed: AtomicBool::new(false),
                waiting_for_writers: AtomicBool::new(false),
                failure: OnceLock::new(),
                segments: RwLock::new(handles.into_iter().map(|h| (h.seq, h)).collect()),
                alloc: Mutex::new(Alloc::default()),
                alloc_ready: Condvar::new(),
                flush: Mutex::new(flush),
                locked: Mutex::new(locked),
                files: FileCache::new(opts.max_open_segments),
                footers,
                read_size: segment::ReadSize::new(),
                ceiling: AtomicU64::new(marks.get().ceiling),
                marks: Mutex::new(marks),
                opts,
                stats,
                _lock: lock,
            }
        });
        let wal = Wal::start(shared, dir)?;
        wal.flush_recovered()?;
        let mut report = recovered.report;
        report.marks = wal.marks();
        Ok((wal, report))
    }

    /// Starts the sync thread and the segment allocator (none with
    /// `inline_io`: the submitters flush).
    fn start(shared: Arc<Shared<S>>, dir: &Path) -> Result<Wal<S>, WalError> {
        if shared.opts.inline_io {
            return Ok(Wal {
                shared,
                sync_thread: None,
                allocator: None,
            });
        }
        let thread_shared = Arc::clone(&shared);
        let sync_thread = std::thread::Builder::new()
            .name("fencelog-wal-sync".into())
            .spawn(move || {
                thread_shared.maybe_request_next(&mut thread_shared.flush.lock());
                thread_shared.run_sync_thread()
            })
            .map_err(|e| WalError::io("spawn the sync thread for", dir, e))?;
        let alloc_shared = Arc::clone(&shared);
        let allocator = std::thread::Builder::new()
            .name("fencelog-wal-alloc".into())
            .spawn(move || alloc_shared.run_allocator())
            .map_err(|e| WalError::io("spawn the segment allocator for", dir, e))?;
        Ok(Wal {
            shared,
            sync_thread: Some(sync_thread),
            allocator: Some(allocator),
        })
    }

    /// Makes whatever recovery queued (a seal, a new segment's checkpoint)
    /// durable, before the log is handed out.
    fn flush_recovered(&self) -> Result<(), WalError> {
        if self.shared.opts.inline_io {
            let mut fs = self.shared.flush.lock();
            if self.shared.flush_pending(&mut fs) == Flushed::Failed {
                drop(fs);
                return Err(self.failed_error());
            }
        }
        let ticket = {
            let mut locked = self.shared.locked.lock();
            let lsn = locked.next_lsn - 1;
            self.shared.wake_sync_thread(&mut locked);
            locked.ticket_for(lsn, &self.shared)
        };
        ticket.wait()
    }

    /// Runs `f` inside the serialized section, blocking while the pending
    /// batch is over `max_batch_bytes`. Fails without running `f` once the
    /// log has failed.
    pub fn submit<R>(&self, f: impl FnOnce(&mut Writer<'_, S>) -> R) -> Result<R, WalError> {
        loop {
            match self.shared.with_room(true)? {
                Room::Now(locked) => return Ok(self.shared.run(locked, f)),
                Room::Later(Some(listener)) => listener.wait(),
                Room::Later(None) => {}
            }
        }
    }

    /// As [`Wal::submit`], but waits for room asynchronously.
    pub async fn submit_async<R>(
        &self,
        f: impl FnOnce(&mut Writer<'_, S>) -> R,
    ) -> Result<R, WalError> {
        loop {
            // Out of the match before the await: the guard is never held
            // across it (and the future stays `Send`).
            let listener = match self.shared.with_room(true)? {
                Room::Now(locked) => return Ok(self.shared.run(locked, f)),
                Room::Later(listener) => listener,
            };
            if let Some(listener) = listener {
                listener.await;
            }
        }
    }

    /// As [`Wal::submit`] when there is room now; `None` (without running
    /// `f`) when the pending batch is over `max_batch_bytes`, the batch
    /// then started. For a caller with a cheaper path when nothing waits
    /// (no future to keep), and [`Wal::submit_async`] for the rest.
    pub fn try_submit<R>(
        &self,
        f: impl FnOnce(&mut Writer<'_, S>) -> R,
    ) -> Result<Option<R>, WalError> {
        Ok(match self.shared.with_room(false)? {
            Room::Now(locked) => Some(self.shared.run(locked, f)),
            Room::Later(_) => None,
        })
    }

    /// As [`Wal::submit`], but never waits for room: for small bookkeeping
    /// entries that must not block (a release from a destructor, say). The
    /// batch may pass `max_batch_bytes` by what `f` appends.
    pub fn submit_now<R>(&self, f: impl FnOnce(&mut Writer<'_, S>) -> R) -> Result<R, WalError> {
        let locked = self.shared.locked.lock();
        self.shared.check_usable(&locked)?;
        Ok(self.shared.run(locked, f))
    }

    /// Runs `f` on the state inside the serialized section without writing
    /// (for reads that must see every decision so far). Works after a
    /// failure too.
    pub fn with_state<R>(&self, f: impl FnOnce(&S) -> R) -> R {
        f(&self.shared.locked.lock().state)
    }

    /// Runs `f` on the state inside the serialized section, for changes
    /// that need no entry (in-memory bookkeeping), with the means to wait
    /// for what it saw to be durable. Works after a failure too.
    pub fn with_state_mut<R>(&self, f: impl FnOnce(&mut S, &dyn Fn(u64) -> Ticket) -> R) -> R {
        let mut locked = self.shared.locked.lock();
        let locked = &mut *locked;
        let ticket_for =
            |lsn: u64| locked_ticket(&locked.pending, &locked.inflight, lsn, &self.shared);
        f(&mut locked.state, &ticket_for)
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> u64 {
        self.shared.durable_lsn.load(Ordering::Acquire)
    }

    /// The segment the sync thread writes to now; older ones are sealed.
    pub fn active_segment(&self) -> u64 {
        self.shared.active_seq.load(Ordering::Acquire)
    }

    /// Whether an earlier write or sync failed (the log accepts no writes).
    pub fn has_failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The options the log was opened with.
    pub fn options(&self) -> &WalOptions {
        &self.shared.opts
    }

    /// Counters and histograms.
    pub fn stats(&self) -> WalStatsSnapshot {
        let mut s = self.shared.stats.snapshot();
        s.open_segment_files = self.shared.files.len() as u64;
        s.segment_files_opened = self.shared.files.opened.load(Ordering::Relaxed);
        s.footer_cache_bytes = self.shared.footers.bytes() as u64;
        s
    }

    /// The token marks as last made durable (see [`Marks`]).
    pub fn marks(&self) -> Marks {
        self.shared.marks.lock().get()
    }

    /// Writes (and, with a sync per batch, syncs) the pending batch on
    /// the calling thread, if no flush is under way and the batch is a
    /// small write into the open segment (at most 16 KiB; no segment to
    /// create or seal, no mark to raise). Answers whether it did. It
    /// blocks for the sync: for a caller whose next step waits for that
    /// sync anyway (a Raft follower acknowledging entries), to whom the
    /// sync thread's hand-over and wake-up are only two thread switches
    /// more.
    pub fn flush_small_here(&self) -> bool {
        self.shared.flush_plain_here()
    }

    /// Raises the marks to at least `marks` (each field separately),
    /// durably, before it returns.
    pub fn raise_marks(&self, marks: Marks) -> Result<Marks, WalError> {
        let mut file = self.shared.marks.lock();
        let old = file.get();
        let new = Marks {
            ceiling: old.ceiling.max(marks.ceiling),
            floor: old.floor.max(marks.floor),
        };
        if new != old {
            file.set(new)
                .map_err(|e| WalError::io("write token marks in", &self.shared.dir, e))?;
            self.shared
                .stats
                .marks_writes
                .fetch_add(1, Ordering::Relaxed);
            self.shared.ceiling.fetch_max(new.ceiling, Ordering::AcqRel);
        }
        Ok(new)
    }

    /// Reads the durable entry at `position` of `segment`, checking its
    /// checksum. The payload is read into memory the caller then owns
    /// (slices of it never copy); a failing disk answers an error.
    pub fn read_entry(&self, segment: u64, position: u64) -> Result<Entry, WalError> {
        self.segment_reader(segment)?.read_entry(position)
    }

    /// A reader of `segment`'s entries: the segment and its open file are
    /// looked up once, not once per entry (a read of many records in one
    /// segment took two shared locks and two shared reference counts per
    /// entry, which two threads reading contended on).
    pub fn segment_reader(&self, segment: u64) -> Result<SegmentReader<'_, S>, WalError> {
        let handle = self.shared.handle(segment)?;
        let file = self
            .shared
            .files
            .get(self.shared.storage.as_ref(), &handle)?;
        Ok(SegmentReader {
            wal: self,
            handle,
            file,
            ahead: ReadAhead::default(),
        })
    }

    /// The footer payload of a sealed segment, or `None` while it is not
    /// sealed (or does not exist).
    pub fn footer(&self, segment: u64) -> Result<Option<Bytes>, WalError> {
        if let Some(f) = self.shared.footers.get(segment) {
            return Ok(Some(f));
        }
        let handle = match self.shared.handle(segment) {
            Ok(h) => h,
            Err(_) => return Ok(None),
        };
        if handle.sealed_now().is_none() && !self.is_sealed_older(segment) {
            return Ok(None);
        }
        let file = self
            .shared
            .files
            .get(self.shared.storage.as_ref(), &handle)?;
        let Some(info) = self.sealed_info(&handle, file.as_ref())? else {
            return Ok(None);
        };
        let footer = segment::read_footer(file.as_ref(), &handle.path, segment, info)?;
        self.shared
            .stats
            .footers_read
            .fetch_add(1, Ordering::Relaxed);
        self.shared.footers.put(segment, footer.clone());
        Ok(Some(footer))
    }

    /// Where a segment's footer is, if the segment is sealed: known for
    /// segments sealed or scanned since open, read from the trailer for
    /// older ones (their footer goes to the cache on the way).
    fn sealed_info(
        &self,
        handle: &SegmentHandle,
        file: &dyn StorageFile,
    ) -> Result<Option<SealedInfo>, WalError> {
        if let Some(info) = handle.sealed_now() {
            return Ok(Some(info));
        }
        if !self.is_sealed_older(handle.seq) {
            return Ok(None);
        }
        let len = file
            .len()
            .map_err(|e| WalError::io("stat", &handle.path, e))?;
        match segment::load_sealed(file, &handle.path, handle.seq, len)? {
            Some((info, footer)) => {
                handle.set_sealed(info);
                self.shared.footers.put(handle.seq, footer);
                Ok(Some(info))
            }
            None => Err(WalError::Corrupt {
                file: handle.path.clone(),
                position: len.saturating_sub(TRAILER_LEN),
                reason: "a segment older than the log's tail has no valid trailer".into(),
            }),
        }
    }

    /// Sequence numbers of the segments in the log, oldest first.
    pub fn segments(&self) -> Vec<u64> {
        self.shared.segments.read().keys().copied().collect()
    }

    /// How many segments the log has.
    pub fn segment_count(&self) -> usize {
        self.shared.segments.read().len()
    }

    /// The oldest segment.
    pub fn first_segment(&self) -> Option<u64> {
        self.shared.segments.read().keys().next().copied()
    }

    /// The newest segment numbered `seq` or less.
    pub fn segment_at_or_before(&self, seq: u64) -> Option<u64> {
        self.shared
            .segments
            .read()
            .range(..=seq)
            .next_back()
            .map(|(&k, _)| k)
    }

    /// The oldest segment numbered above `seq`.
    pub fn segment_after(&self, seq: u64) -> Option<u64> {
        let next = seq.checked_add(1)?;
        self.shared
            .segments
            .read()
            .range(next..)
            .next()
            .map(|(&k, _)| k)
    }

    /// Removes sealed segment `segment`, whose entries the layer above no
    /// longer needs. Refused ([`Removal::NotYet`]) while recovery could still
    /// need it: unless a newer segment's checkpoint is durable.
    pub fn remove_segment(&self, segment: u64) -> Result<Removal, WalError> {
        if segment >= self.shared.durable_checkpoint_seq.load(Ordering::Acquire) {
            return Ok(Removal::NotYet);
        }
        let handle = {
            let mut segments = self.shared.segments.write();
            match segments.remove(&segment) {
                Some(h) => h,
                None => return Ok(Removal::Absent),
            }
        };
        self.shared.files.forget(segment);
        self.shared.footers.forget(segment);
        let storage = self.shared.storage.as_ref();
        if let Err(e) = storage.remove(&handle.path) {
            // Still there: keep it known, so that a later call tries again.
            let path = handle.path.clone();
            self.shared.segments.write().insert(segment, handle);
            return Err(WalError::io("remove", path, e));
        }
        storage
            .sync_dir(&self.shared.dir)
            .map_err(|e| WalError::io("sync directory", &self.shared.dir, e))?;
        self.shared
            .stats
            .segments_removed
            .fetch_add(1, Ordering::Relaxed);
        Ok(Removal::Removed)
    }

    /// Writes what is pending and syncs the segment being written: with
    /// `sync_every_batch` off, everything acknowledged so far is durable
    /// when this returns, and (if nothing new was submitted meanwhile) the
    /// next entry starts a new sync epoch.
    pub fn sync_all(&self) -> Result<(), WalError> {
        self.sync_to_end().map(|_| ())
    }

    /// As [`Wal::sync_all`], and answers where the durable entries end:
    /// the segment being written and the offset its entries end at, or
    /// `None` when no segment holds entries not yet sealed. Bytes before
    /// that offset never change again; the segment only grows past it
    /// (entries, then its footer and trailer when sealed). A snapshot
    /// hard-links the segment and keeps this offset instead of copying it.
    pub fn sync_to_end(&self) -> Result<Option<SegmentEnd>, WalError> {
        let mut fs = self.shared.flush.lock();
        if self.shared.flush_pending(&mut fs) == Flushed::Failed {
            return Err(self.failed_error());
        }
        if fs.unsynced
            && let Some((seg, file)) = &fs.current
        {
            if let Err(e) = file.sync_data() {
                let e = annotate(e, "fdatasync", &seg.path);
                drop(fs);
                self.shared.fail_with(Arc::new(e));
                return Err(self.failed_error());
            }
            fs.unsynced = false;
        }
        // Everything written so far is durable now. If nothing was encoded
        // since (the pending batch is empty), the next entry may start a new
        // epoch: every LSN below it was synced before it is written. If
        // something was, it keeps the old epoch: it may be written in one
        // write with later entries, and a torn write of that must stay a
        // torn tail.
        let mut locked = self.shared.locked.lock();
        if locked.pending.is_empty() {
            locked.epoch_first_lsn = None;
        }
        Ok(fs.current.as_ref().map(|(seg, _)| SegmentEnd {
            segment: seg.seq,
            end: fs.written_to,
        }))
    }

    fn failed_error(&self) -> WalError {
        crate::ticket::failed(self.shared.failure.get())
    }

    /// Waits until everything submitted so far is durable, then stops the
    /// sync thread. Dropping the log does the same.
    pub fn close(mut self) -> Result<(), WalError> {
        self.shutdown();
        match self.shared.failure.get() {
            Some(cause) => Err(crate::ticket::failed(Some(cause))),
            None => Ok(()),
        }
    }

    fn shutdown(&mut self) {
        {
            let mut locked = self.shared.locked.lock();
            locked.shutdown = true;
            self.shared.work.notify_all();
        }
        if let Some(t) = self.sync_thread.take() {
            let _ = t.join();
        }
        if !self.shared.opts.sync_every_batch && !self.shared.failed.load(Ordering::Acquire) {
            let _ = self.sync_all();
        }
        {
            let mut alloc = self.shared.alloc.lock();
            alloc.shutdown = true;
            self.shared.alloc_ready.notify_all();
        }
        if let Some(t) = self.allocator.take() {
            let _ = t.join();
        }
    }

    /// Segments older than the one being written are sealed: the sync
    /// thread seals a segment before it writes the next.
    fn is_sealed_older(&self, segment: u64) -> bool {
        segment < self.shared.active_seq.load(Ordering::Acquire)
    }
}

impl<S: Sequencer> Drop for Wal<S> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A ticket for entry `lsn` given what is pending and in flight (see
/// [`Locked::ticket_for`]).
fn locked_ticket<S: Sequencer>(
    pending: &Pending<S::Effect>,
    inflight: &Option<Arc<Batch>>,
    lsn: u64,
    shared: &Arc<Shared<S>>,
) -> Ticket {
    if let Some(cause) = shared.failure.get() {
        return Ticket::failed(Arc::clone(cause));
    }
    if lsn <= shared.durable_lsn.load(Ordering::Acquire) {
        return Ticket::ready();
    }
    match (pending.first_lsn, inflight) {
        (Some(first), _) if lsn >= first => Ticket::on(Arc::clone(&pending.batch)),
        (_, Some(inflight)) => Ticket::on(Arc::clone(inflight)),
        // Not durable, not in flight: it can only be in the pending batch.
        _ => Ticket::on(Arc::clone(&pending.batch)),
    }
}

impl<S: Sequencer> Shared<S> {
    fn check_usable(&self, locked: &Locked<S>) -> Result<(), WalError> {
        if let Some(cause) = self.failure.get() {
            return Err(crate::ticket::failed(Some(cause)));
        }
        if locked.shutdown {
            return Err(WalError::Closed);
        }
        Ok(())
    }

    /// The log's lock if the pending batch has room (under
    /// `max_batch_bytes`); else the batch is started, and, if `listen`, a
    /// listener registered under the lock for the room its write makes.
    fn with_room(&self, listen: bool) -> Result<Room<'_, S>, WalError> {
        let mut locked = self.locked.lock();
        self.check_usable(&locked)?;
        if locked.pending.bytes < self.opts.max_batch_bytes {
            return Ok(Room::Now(locked));
        }
        // Room comes once the batch is written: start it now.
        self.wake_sync_thread(&mut locked);
        Ok(Room::Later(listen.then(|| self.space.listen())))
    }

    fn run<R>(
        self: &Arc<Self>,
        mut locked: MutexGuard<'_, Locked<S>>,
        f: impl FnOnce(&mut Writer<'_, S>) -> R,
    ) -> R {
        let result = f(&mut Writer {
            locked: &mut locked,
            shared: self,
        });
        // A segment is full when its records (not what opens it: a large
        // checkpoint) fill it; at least half of every segment is records.
        let reserve = locked.state.seal_len_hint() + (FOOTER_HEADER_LEN as u64) + TRAILER_LEN;
        let records = locked.seg_pos - locked.seg_records_start;
        let room = self
            .opts
            .segment_bytes
            .saturating_sub(locked.seg_records_start)
            .max(self.opts.segment_bytes / 2);
        if records + reserve >= room {
            let next = locked.seg_seq + 1;
            locked.rotate_to(next, &self.stats);
        }
        if let Some(why) = locked.broken.take() {
            drop(locked);
            self.fail_with(Arc::new(io::Error::other(why)));
            return result;
        }
        if self.opts.inline_io {
            // No sync thread: this submitter writes and syncs the batch
            // (a failure is latched and answered by the entry's ticket).
            drop(locked);
            let mut fs = self.flush.lock();
            let _ = self.flush_pending(&mut fs);
            return result;
        }
        if !self.opts.flush_on_wait {
            self.wake_sync_thread_for_submit(&mut locked);
        }
        result
    }

    /// Wakes the sync thread for a pending batch, ending a wait for
    /// writers too (someone needs the batch written now).
    fn wake_sync_thread(&self, locked: &mut Locked<S>) {
        locked.wake_at = 0;
        if locked.sync_thread_waiting && !locked.pending.is_empty() {
            locked.sync_thread_waiting = false;
            self.work.notify_one();
        }
    }

    /// As [`Shared::wake_sync_thread`] after a submit: during a wait for
    /// the writers, only once enough of them are back.
    fn wake_sync_thread_for_submit(&self, locked: &mut Locked<S>) {
        if locked.sync_thread_waiting
            && !locked.pending.is_empty()
            && locked.pending.entries >= locked.wake_at
        {
            locked.sync_thread_waiting = false;
            self.work.notify_one();
        }
    }

    fn handle(&self, segment: u64) -> Result<Arc<SegmentHandle>, WalError> {
        self.segments
            .read()
            .get(&segment)
            .cloned()
            .ok_or(WalError::NoEntry {
                segment,
                position: 0,
            })
    }
}

/// Sealed segments waiting for the allocator to let their pages go, at
/// most (one is sealed per segment written: more than a few queue only
/// while a fill is slow).
const MAX_UNCACHE_QUEUED: usize = 16;

/// How much of a new segment's zero fill is handed to the disk at a time;
/// the fill waits for the piece before to be written before it goes on.
const FILL_WRITEBACK_BYTES: u64 = 1 << 20;

/// How much of a new segment's zero fill one write covers, and at most
/// what one write of a batch covers where no fill ran before it.
const FILL_WRITE_BYTES: usize = 64 << 10;

/// What whoever makes the pending batch durable needs to know: the segment
/// being written and how far. Behind [`Shared::flush`]: the sync thread
/// holds it while it flushes, and so may a thread waiting for its own entry
/// when the sync thread is idle (it then writes and syncs the batch itself,
/// sparing a thread switch each way).
struct FlushState {
    /// The segment being written, and its file.
    current: Option<(Arc<SegmentHandle>, Arc<dyn StorageFile>)>,
    /// Whether it opens with a checkpoint.
    current_opens_checkpoint: bool,
    /// Where the entries written to it end.
    written_to: u64,
    /// Whether the allocator was asked for the segment after it.
    next_requested: bool,
    /// Written and not synced (only without `sync_every_batch`).
    unsynced: bool,
    /// Where in the segment being written the bytes not yet handed to
    /// the disk begin (only without `sync_every_batch`; see
    /// `WalOptions::writeback_bytes`).
    writeback_from: u64,
}

impl FlushState {
    /// The first flush writes to the recovered tail segment, if it exists
    /// already, from `written_to`.
    fn recovered(
        handles: &[Arc<SegmentHandle>],
        tail_file: TailFile,
        written_to: u64,
    ) -> FlushState {
        let current = tail_file.and_then(|(seq, file)| {
            handles
                .iter()
                .find(|h| h.seq == seq)
                .map(|h| (Arc::clone(h), file))
        });
        FlushState {
            current,
            current_opens_checkpoint: false,
            written_to,
            next_requested: false,
            unsynced: false,
            writeback_from: written_to,
        }
    }
}

/// Where the entries of the segment being written end, as
/// [`Wal::sync_to_end`] answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEnd {
    /// The segment's sequence number (its file is `<segment>.wal`).
    pub segment: u64,
    /// The offset its entries end at; every byte before it is durable.
    pub end: u64,
}

/// Lets a blocked [`Ticket`] flush its own batch when nobody else is.
pub(crate) trait InlineFlush: Send + Sync {
    /// Flushes the pending batch if no flush is under way; never waits.
    fn try_flush(&self);
    /// A task waits for a ticket: with `flush_on_wait`, wakes the sync
    /// thread for the pending batch (without it, the submit did).
    fn waiting(&self);
    /// A task is about to wait: without a sync per batch (a replica's
    /// engine log), writes the pending batch on the task's thread if no
    /// flush is under way and the batch is only a small write into the
    /// segment being written (at most [`INLINE_WRITE_BYTES`]; no segment
    /// to create or seal, no mark to raise: those may sync, and stay the
    /// sync thread's). It spares the two thread switches of handing a
    /// page-cache write to the sync thread and being woken by it.
    fn try_flush_unsynced(&self);
}

impl<S: Sequencer> InlineFlush for Shared<S> {
    fn try_flush(&self) {
        // Writing the batch now would end the sync thread's wait for the
        // batch's other writers.
        if self.waiting_for_writers.load(Ordering::Acquire) {
            return;
        }
        if let Some(mut fs) = self.flush.try_lock() {
            self.flush_pending(&mut fs);
        }
    }

    fn try_flush_unsynced(&self) {
        if !self.opts.sync_every_batch {
            self.flush_plain_here();
        }
    }

    fn waiting(&self) {
        if self.opts.flush_on_wait {
            self.wake_sync_thread_for_submit(&mut self.locked.lock());
        }
    }
}

/// What one flush did.
#[derive(PartialEq, Eq)]
enum Flushed {
    Nothing,
    Batch(Answered),
    Failed,
}

impl<S: Sequencer> Shared<S> {
    /// The sync thread: waits for pending work and flushes it, until
    /// shutdown with nothing left or a failure.
    fn run_sync_thread(&self) {
        let mut in_pass = Vec::new();
        let mut comeback = Comeback::new(self.waits_for_writers());
        loop {
            {
                let mut locked = self.locked.lock();
                while locked.pending.is_empty() && !locked.shutdown {
                    locked.sync_thread_waiting = true;
                    // Idle time is counted in slices of at most 100 ms, so
                    // that a reading during a long wait is at most that
                    // much behind.
                    let idle_since = Instant::now();
                    self.work
                        .wait_for(&mut locked, std::time::Duration::from_millis(100));
                    self.stats
                        .sync_idle_micros
                        .fetch_add(idle_since.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                locked.sync_thread_waiting = false;
                if locked.pending.is_empty() {
                    return; // shut down with nothing left to write
                }
            }
            if let Some(wait) = comeback.take() {
                comeback.ended(self.wait_for_writers(wait));
            }
            if let Some(turns) = &self.opts.turns {
                let started = Instant::now();
                if turns.wait_for_passes(&mut in_pass) {
                    self.stats.pass_waits.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .pass_wait_micros
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
            }
            // A waiting thread may be flushing inline: take turns.
            let mut fs = self.flush.lock();
            match self.flush_pending(&mut fs) {
                Flushed::Failed => return,
                Flushed::Batch(batch) => comeback.answered(batch, Instant::now()),
                Flushed::Nothing => {}
            }
        }
    }

    /// Whether the sync thread waits for the writers it answered: asked
    /// for, and with a sync per batch (without one, nobody waits for it).
    fn waits_for_writers(&self) -> bool {
        self.opts.wait_for_writers && self.opts.sync_every_batch && !self.opts.inline_io
    }

    /// Waits until `wait.entries` are pending (the writers just answered
    /// are back), its time runs out, or someone needs the batch written
    /// now (room, a sync to the end, shutdown). Answers whether it ran out.
    fn wait_for_writers(&self, wait: comeback::Wait) -> bool {
        let started = Instant::now();
        let mut locked = self.locked.lock();
        locked.wake_at = wait.entries;
        self.waiting_for_writers.store(true, Ordering::Release);
        let ran_out = loop {
            if locked.pending.entries >= wait.entries || locked.wake_at == 0 || locked.shutdown {
                break false;
            }
            locked.sync_thread_waiting = true;
            if self.work.wait_until(&mut locked, wait.until).timed_out() {
                break locked.pending.entries < wait.entries;
            }
        };
        locked.sync_thread_waiting = false;
        locked.wake_at = 0;
        self.waiting_for_writers.store(false, Ordering::Release);
        drop(locked);
        let stats = &self.stats;
        stats.comeback_waits.fetch_add(1, Ordering::Relaxed);
        stats
            .comeback_wait_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        if ran_out {
            stats.comeback_ran_out.fetch_add(1, Ordering::Relaxed);
        }
        ran_out
    }

    /// Takes the whole pending batch, writes it, syncs once, then makes it
    /// visible and wakes its waiters. The caller holds the flush lock.
    fn flush_pending(&self, fs: &mut FlushState) -> Flushed {
        self.flush_pending_if(fs, false)
    }

    /// Flushes the pending batch on the calling thread if no flush is under
    /// way and the batch [`Pending::is_plain`]; answers whether it did.
    fn flush_plain_here(&self) -> bool {
        self.flush
            .try_lock()
            .is_some_and(|mut fs| matches!(self.flush_pending_if(&mut fs, true), Flushed::Batch(_)))
    }

    /// As [`Shared::flush_pending`]; with `plain_only`, only a batch that
    /// [`Pending::is_plain`] (otherwise nothing is taken).
    fn flush_pending_if(&self, fs: &mut FlushState, plain_only: bool) -> Flushed {
        if self.failed.load(Ordering::Acquire) {
            return Flushed::Failed;
        }
        let (pending, last_lsn) = {
            let mut locked = self.locked.lock();
            if locked.pending.is_empty() {
                return Flushed::Nothing;
            }
            if plain_only
                && !locked
                    .pending
                    .is_plain(self.ceiling.load(Ordering::Acquire))
            {
                return Flushed::Nothing;
            }
            let next = locked.pending.next();
            let pending = mem::replace(&mut locked.pending, next);
            // With a sync per batch, the next batch is written only after
            // this one's `fdatasync` returned: entries encoded from now on
            // start a new epoch. Without one, nothing will have been synced
            // when they are written, so the epoch goes on (until a real sync,
            // see `sync_all`, or a seal): recovery must never take a later
            // unsynced write for proof that an earlier one was synced.
            if self.opts.sync_every_batch {
                locked.epoch_first_lsn = None;
            }
            locked.inflight = Some(Arc::clone(&pending.batch));
            (pending, locked.next_lsn - 1)
        };
        self.space.notify(usize::MAX);

        let started = Instant::now();
        let Pending {
            mut chunks,
            effects,
            batch,
            entries,
            reserve,
            opened,
            ..
        } = pending;
        // The marks first: a failure there leaves none of the batch written,
        // so a failed batch never turns up after a restart because of them.
        let result = self
            .raise_ceiling(reserve)
            .and_then(|()| self.write_and_sync(fs, &mut chunks));
        match result {
            Ok(()) => {
                let took = started.elapsed();
                self.count_synced_batch(took, entries, opened);
                // The sync returned: the entries are durable, and the
                // durable LSN says so before any effect wakes a reader
                // that will read them back.
                self.durable_lsn.store(last_lsn, Ordering::Release);
                self.note_durable_checkpoint(fs);
                // What is queued before any writer of this batch hears back
                // (for the sync thread's wait for them, if it waits).
                let queued = if self.waits_for_writers() {
                    self.locked.lock().pending.entries
                } else {
                    0
                };
                S::Effect::durable_all(effects);
                batch.complete();
                self.recycle(chunks);
                self.maybe_request_next(fs);
                Flushed::Batch(Answered {
                    entries,
                    queued,
                    took,
                })
            }
            Err(e) => {
                drop(effects);
                self.fail_batch(e, &batch);
                Flushed::Failed
            }
        }
    }

    /// Counts a batch of `entries` synced: its write and sync took
    /// `took`, the batch opened at `opened`.
    fn count_synced_batch(&self, took: Duration, entries: u64, opened: Option<Instant>) {
        let stats = &self.stats;
        stats.sync_micros.record(took.as_micros() as u64);
        stats.batch_entries.record(entries);
        if let Some(opened) = opened {
            stats
                .commit_micros
                .record_n(opened.elapsed().as_micros() as u64, entries);
        }
        stats.syncs.fetch_add(1, Ordering::Relaxed);
        stats.entries.fetch_add(entries, Ordering::Relaxed);
    }

    /// Makes the marks' ceiling cover what the batch needs, before the
    /// batch is acknowledged.
    fn raise_ceiling(&self, reserve: Option<(u64, u64)>) -> io::Result<()> {
        let Some((needed, target)) = reserve else {
            return Ok(());
        };
        let mut file = self.marks.lock();
        let m = file.get();
        if m.ceiling >= needed {
            return Ok(());
        }
        file.set(Marks {
            ceiling: target.max(needed),
            floor: m.floor,
        })?;
        self.stats.marks_writes.fetch_add(1, Ordering::Relaxed);
        self.ceiling.fetch_max(target.max(needed), Ordering::AcqRel);
        Ok(())
    }

    /// Asks the allocator for the next segment once the current one is half
    /// full: early enough that rotation finds it ready, late enough that a
    /// short-lived or idle log never writes a segment it will not use.
    fn maybe_request_next(&self, fs: &mut FlushState) {
        let Some((current, _)) = &fs.current else {
            return;
        };
        if self.opts.inline_io || fs.next_requested || fs.written_to < self.opts.segment_bytes / 2 {
            return;
        }
        fs.next_requested = true;
        let mut alloc = self.alloc.lock();
        alloc.wanted = Some(current.seq + 1);
        self.alloc_ready.notify_all();
    }

    fn recycle(&self, chunks: Vec<Chunk>) {
        let mut locked = self.locked.lock();
        for mut chunk in chunks {
            // Keep moderate buffers only: a huge one-off batch should not pin
            // its memory forever.
            if chunk.buf.capacity() <= 8 << 20 && locked.spare.len() < 4 {
                chunk.buf.clear();
                locked.spare.push(chunk.buf);
            }
        }
    }

    /// Latches the failure first, then fails the batch: a waiter that wakes
    /// with an error finds the log failed.
    fn fail_batch(&self, e: io::Error, batch: &Batch) {
        let cause = Arc::new(e);
        self.fail_with(Arc::clone(&cause));
        batch.fail(cause);
    }

    /// Latches the failure: every pending and later write fails; reads of
    /// durable entries go on.
    fn fail_with(&self, cause: Arc<io::Error>) {
        let _ = self.failure.set(Arc::clone(&cause));
        self.failed.store(true, Ordering::Release);
        // Submitters check the latch under the lock, so once the pending batch
        // is taken here nothing joins it any more.
        let pending = {
            let mut locked = self.locked.lock();
            let next = Pending::new(locked.pending.batch.log());
            mem::replace(&mut locked.pending, next)
        };
        pending.batch.fail(cause);
        self.space.notify(usize::MAX);
    }

    fn write_and_sync(&self, fs: &mut FlushState, chunks: &mut [Chunk]) -> io::Result<()> {
        // The segment written to since its last sync, if any.
        let mut unsynced: Option<Arc<dyn StorageFile>> = None;
        for chunk in chunks.iter_mut() {
            if chunk.create {
                if let Some(prev) = unsynced.take() {
                    self.sync(prev.as_ref(), fs)?;
                }
                fs.current = Some(self.take_or_create(fs, chunk.seq)?);
                fs.current_opens_checkpoint = chunk.opens_checkpoint;
                // A new file: its bytes wait for the disk from its start.
                fs.writeback_from = 0;
                self.active_seq.store(chunk.seq, Ordering::Release);
            }
            let (seg, file) = match &fs.current {
                Some((seg, file)) if seg.seq == chunk.seq => (Arc::clone(seg), Arc::clone(file)),
                _ => {
                    return Err(io::Error::other(format!(
                        "internal error: no open file for segment {}",
                        chunk.seq
                    )));
                }
            };
            fs.written_to = chunk.pos + chunk.buf.len() as u64;
            if !chunk.buf.is_empty() {
                // Checksums here, outside the lock where entries were
                // decided and encoded.
                format::fill_checksums(&mut chunk.buf, chunk.seq);
                self.write_batch(file.as_ref(), &chunk.buf, chunk.pos)
                    .map_err(|e| annotate(e, "write", &seg.path))?;
                self.stats
                    .bytes_written
                    .fetch_add(chunk.buf.len() as u64, Ordering::Relaxed);
                if !self.opts.sync_every_batch {
                    self.start_writeback(fs, file.as_ref());
                }
                unsynced = Some(Arc::clone(&file));
            }
            if let Some(seal) = chunk.seal.take() {
                self.seal(&seg, &file, chunk.pos + chunk.buf.len() as u64, seal)?;
                unsynced = None;
            }
        }
        if let Some(file) = unsynced {
            if self.opts.sync_every_batch {
                self.sync(file.as_ref(), fs)?;
            } else {
                fs.unsynced = true;
            }
        }
        Ok(())
    }

    /// Without a sync per batch: hands the segment's written whole pages to
    /// the disk once `writeback_bytes` of them wait (the page being written
    /// stays, or it would be written twice). A failure is only counted:
    /// it makes nothing less durable, and the next sync reports an error
    /// of the disk's.
    fn start_writeback(&self, fs: &mut FlushState, file: &dyn StorageFile) {
        const PAGE: u64 = 4096;
        let every = self.opts.writeback_bytes;
        let end = fs.written_to / PAGE * PAGE;
        if every == 0 || end < fs.writeback_from.saturating_add(every) {
            return;
        }
        let from = fs.writeback_from;
        fs.writeback_from = end;
        let counter = match file.start_writeback(from, end - from) {
            Ok(()) => &self.stats.writebacks_started,
            Err(_) => &self.stats.writebacks_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Writes a batch's bytes at `pos`. Into space that was not zero-filled
    /// (`Reserve`, `None`) the page cache allocates pages as the write goes:
    /// one write per 64 KiB-aligned piece keeps them small folios (see
    /// `FILL_WRITE_BYTES`), where one large write would ask for large ones.
    /// A zero-filled segment's pages exist already: one write.
    fn write_batch(&self, file: &dyn StorageFile, buf: &[u8], pos: u64) -> io::Result<()> {
        if self.opts.preallocation == Preallocation::Fill {
            if self.writes_direct() {
                if file.append_at(buf, pos)? {
                    self.stats.direct_writes.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(());
            }
            return file.write_all_at(buf, pos);
        }
        let piece = FILL_WRITE_BYTES as u64;
        let mut at = 0usize;
        while at < buf.len() {
            let offset = pos + at as u64;
            let room = (piece - offset % piece) as usize;
            let end = buf.len().min(at + room);
            file.write_all_at(&buf[at..end], offset)?;
            at = end;
        }
        Ok(())
    }

    /// Whether batches go around the page cache ([`WalOptions::direct_io`]):
    /// only where each is synced at once (a log synced later would make
    /// its writers wait for the disk at every write instead).
    fn writes_direct(&self) -> bool {
        self.opts.direct_io
            && self.opts.sync_every_batch
            && self.opts.preallocation == Preallocation::Fill
    }

    fn sync(&self, file: &dyn StorageFile, fs: &FlushState) -> io::Result<()> {
        file.sync_data().map_err(|e| {
            let path = fs
                .current
                .as_ref()
                .map_or_else(|| self.dir.clone(), |(h, _)| h.path.clone());
            annotate(e, "fdatasync", &path)
        })
    }

    /// Frames the footer (here, off the log's lock), writes it, syncs, then
    /// writes the trailer that points at it and syncs again: a valid
    /// trailer always means a durable footer.
    fn seal(
        &self,
        seg: &Arc<SegmentHandle>,
        file: &Arc<dyn StorageFile>,
        entries_end: u64,
        seal: PendingSeal,
    ) -> io::Result<()> {
        let PendingSeal {
            first_lsn,
            last_lsn,
            payload,
        } = seal;
        // A footer too large for its length field cannot come from a
        // segment of at most 1 GiB; sealed without one, the segment would
        // be refused by recovery, so the log stops instead.
        let footer = payload
            .frame(seg.seq, first_lsn, last_lsn)
            .map_err(|e| io::Error::other(format!("segment {}'s footer: {e}", seg.seq)))?;
        let footer_pos = format::align_up(entries_end);
        file.write_all_at(&footer, footer_pos)
            .map_err(|e| annotate(e, "write footer", &seg.path))?;
        file.sync_data()
            .map_err(|e| annotate(e, "fdatasync", &seg.path))?;
        let footer_end = footer_pos + footer.len() as u64;
        let len = file.len().map_err(|e| annotate(e, "stat", &seg.path))?;
        let trailer_pos = format::align_up(footer_end).max(len.saturating_sub(TRAILER_LEN));
        let footer_len = u32::try_from(footer.len())
            .map_err(|_| io::Error::other("a footer of 4 GiB or more"))?;
        let written = Trailer {
            footer_pos,
            footer_len,
        };
        let trailer = format::encode_trailer(seg.seq, written);
        file.write_all_at(&trailer, trailer_pos)
            .map_err(|e| annotate(e, "write trailer", &seg.path))?;
        file.sync_data()
            .map_err(|e| annotate(e, "fdatasync", &seg.path))?;
        let stats = &self.stats;
        stats
            .bytes_written
            .fetch_add(footer.len() as u64 + TRAILER_LEN, Ordering::Relaxed);
        stats.segments_sealed.fetch_add(1, Ordering::Relaxed);
        // The trailer reads back as the one recovery will find. The footer
        // is not read back: it is in hand, and reading and checking
        // megabytes here held every writer of the next batch.
        let mut back = [0u8; TRAILER_LEN as usize];
        file.read_exact_at(&mut back, trailer_pos)
            .map_err(|e| annotate(e, "read trailer", &seg.path))?;
        if format::decode_trailer(&back, seg.seq) != Some(written) {
            return Err(io::Error::other(
                "a freshly written trailer does not read back",
            ));
        }
        seg.set_sealed(SealedInfo {
            footer_pos,
            footer_payload_len: footer_len - format::FOOTER_HEADER_LEN as u32,
            first_lsn,
            last_lsn,
        });
        self.footers.put(
            seg.seq,
            Bytes::from(footer).slice(format::FOOTER_HEADER_LEN..),
        );
        if self.opts.uncache_sealed {
            self.uncache(file);
        }
        Ok(())
    }

    /// Lets a sealed segment's pages leave the page cache: on the
    /// allocator's thread, since dropping 64 MiB of pages took 6-9 ms
    /// (`strace` of a Raft log's thread at pipeline 16), which the next
    /// commit's sync would wait for here. With `inline_io` (no allocator),
    /// here.
    fn uncache(&self, file: &Arc<dyn StorageFile>) {
        if self.opts.inline_io {
            // A hint: a failure leaves the pages cached, nothing else.
            let _ = file.drop_cached();
            return;
        }
        let mut alloc = self.alloc.lock();
        // Bounded: each holds a file open, and the allocator may be busy
        // filling a segment. Past the bound the hint is dropped: the pages
        // stay cached, nothing else.
        if alloc.uncache.len() < MAX_UNCACHE_QUEUED {
            alloc.uncache.push(Arc::clone(file));
            self.alloc_ready.notify_all();
        }
    }

    /// The file of new segment `seq`: the allocator's, if it made that one,
    /// else created here (the allocator is asked for the one after once
    /// this one is half full).
    fn take_or_create(
        &self,
        fs: &mut FlushState,
        seq: u64,
    ) -> io::Result<(Arc<SegmentHandle>, Arc<dyn StorageFile>)> {
        let ready = {
            let mut alloc = self.alloc.lock();
            while alloc.creating {
                self.alloc_ready.wait(&mut alloc);
            }
            // A request the allocator has not picked up yet is withdrawn:
            // exactly one creator per segment number, or the late one would
            // rename an empty file over a live segment.
            alloc.wanted = None;
            alloc.ready.take()
        };
        let created = match ready {
            Some((h, f)) if h.seq == seq => (h, f),
            stale => {
                if let Some((h, _)) = stale {
                    // Cannot happen (rotation always takes the next number);
                    // remove it rather than leave an orphan.
                    self.segments.write().remove(&h.seq);
                    let _ = self.storage.remove(&h.path);
                }
                self.create_segment(seq, false)?
            }
        };
        fs.next_requested = false;
        Ok(created)
    }

    /// After a batch: note which checkpoint is durable, so that segments
    /// before it may be removed.
    fn note_durable_checkpoint(&self, fs: &FlushState) {
        if let Some((current, _)) = &fs.current
            && fs.current_opens_checkpoint
        {
            self.durable_checkpoint_seq
                .fetch_max(current.seq, Ordering::AcqRel);
        }
    }
}

impl<S: Sequencer> Shared<S> {
    /// The allocator thread: creates the wanted segment ahead of need.
    fn run_allocator(&self) {
        loop {
            let seq = {
                let mut alloc = self.alloc.lock();
                while alloc.wanted.is_none() && alloc.uncache.is_empty() && !alloc.shutdown {
                    self.alloc_ready.wait(&mut alloc);
                }
                if alloc.shutdown {
                    return;
                }
                let uncache = std::mem::take(&mut alloc.uncache);
                if !uncache.is_empty() {
                    drop(alloc);
                    for file in uncache {
                        // A hint: a failure leaves the pages cached.
                        let _ = file.drop_cached();
                    }
                    continue;
                }
                alloc.creating = true;
                alloc.wanted.take()
            };
            // A failure here is not the log's failure: the sync thread will
            // try the creation itself when it needs the segment, and latch if
            // that fails too.
            let created = seq.and_then(|seq| self.create_segment(seq, true).ok());
            let mut alloc = self.alloc.lock();
            alloc.creating = false;
            alloc.ready = created;
            self.alloc_ready.notify_all();
        }
    }

    /// Creates segment `seq`: header, space, sync, rename into place,
    /// directory sync. A crash at any point leaves either no segment `seq`
    /// or a complete, empty one.
    ///
    /// An `abortable` creation (the allocator's) gives up as soon as the log
    /// shuts down, so that closing never waits for a segment nobody needs.
    fn create_segment(
        &self,
        seq: u64,
        abortable: bool,
    ) -> io::Result<(Arc<SegmentHandle>, Arc<dyn StorageFile>)> {
        let storage = self.storage.as_ref();
        let path = self.dir.join(format::segment_file_name(seq));
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let _ = storage.remove(&tmp);
        let file = storage
            .create_new(&tmp)
            .map_err(|e| annotate(e, "create", &tmp))?;
        file.write_all_at(&format::encode_header(seq), 0)
            .map_err(|e| annotate(e, "write header", &tmp))?;
        let size = self.opts.segment_bytes;
        match self.opts.preallocation {
            Preallocation::Fill => {
                if !self.fill_with_zeros(file.as_ref(), &tmp, abortable)? {
                    drop(file);
                    let _ = storage.remove(&tmp);
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "the log is closing",
                    ));
                }
            }
            Preallocation::Reserve => file
                .preallocate(size)
                .map_err(|e| annotate(e, "preallocate", &tmp))?,
            Preallocation::None => {}
        }
        file.sync_data()
            .map_err(|e| annotate(e, "fdatasync", &tmp))?;
        if self.writes_direct() {
            // The zeros' pages (clean now) would otherwise be dropped a
            // batch at a time by the kernel, under the sync thread's
            // direct writes. A hint: a failure leaves them cached.
            let _ = file.drop_cached();
        }
        // Never replace a segment: a rename over a live one would drop its
        // entries with no error anywhere.
        if storage.open(&path).is_ok() || self.segments.read().contains_key(&seq) {
            drop(file);
            let _ = storage.remove(&tmp);
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("internal error: segment {} exists already", path.display()),
            ));
        }
        storage
            .rename(&tmp, &path)
            .map_err(|e| annotate(e, "rename", &tmp))?;
        storage
            .sync_dir(&self.dir)
            .map_err(|e| annotate(e, "sync directory", &self.dir))?;
        self.stats.segments_created.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(SegmentHandle::new(seq, &self.dir));
        self.segments.write().insert(seq, Arc::clone(&handle));
        Ok((handle, Arc::from(file)))
    }

    /// Writes zeros over the new segment `tmp` after its header; answers
    /// false if an `abortable` creation gave up because the log is closing.
    fn fill_with_zeros(
        &self,
        file: &dyn StorageFile,
        tmp: &Path,
        abortable: bool,
    ) -> io::Result<bool> {
        let size = self.opts.segment_bytes;
        // Written 64 KiB at a time: a larger write lets the page cache
        // allocate large folios, which cost this kernel (6.18, ext4) 20-30x
        // the CPU of small ones. Measured zero-filling 64 MiB with a sync
        // per 4 MiB: 0.31-0.45 s of system time in 128 KiB-1 MiB writes,
        // 0.013-0.017 s in 32-64 KiB writes.
        let zeros = vec![0u8; FILL_WRITE_BYTES.min(size as usize)];
        let mut at = HEADER_LEN;
        // The piece not yet handed to the disk begins here; the one handed
        // over before it, if any, is `handed`.
        let mut from = HEADER_LEN;
        let mut handed: Option<(u64, u64)> = None;
        while at < size {
            // Handed to the disk a MiB at a time, and paced by waiting for
            // the MiB before: a sync of the whole segment would make every
            // commit's sync queue behind 64 MiB of zeros. Not synced piece
            // by piece: each `fdatasync` of this growing file also commits
            // its new size and blocks to the journal, with a flush of the
            // disk's cache that every other sync waits behind. Measured
            // against an `fdatasync` per 4 MiB (2026-12-07, 50 clients at
            // pipeline 16, alternating runs; docs/DESIGN.md): a single
            // node's p99 latency 4.9-5.6 -> 2.3-2.4 ms, a 3-node group's
            // 9.4-11.8 -> 6.8-7.7 ms. The create's own sync makes the fill
            // durable; both calls are hints (an error of the disk's is that
            // sync's to report, and without them only the pacing is lost).
            if at - from >= FILL_WRITEBACK_BYTES {
                let _ = file.start_writeback(from, at - from);
                if let Some((pos, len)) = handed {
                    let _ = file.finish_writeback(pos, len);
                }
                handed = Some((from, at - from));
                from = at;
            }
            if abortable && self.alloc.lock().shutdown {
                return Ok(false);
            }
            let n = (size - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], at)
                .map_err(|e| annotate(e, "fill", tmp))?;
            at += n as u64;
        }
        Ok(true)
    }
}

fn annotate(e: io::Error, op: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}
