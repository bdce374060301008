//! The state machine: the fencelog engine in cluster mode (see
//! `fencelog::Log::apply_replicated`), holding the streams, the leases and
//! the token counter, decided in log order.
//!
//! Its data lives in `<dir>/sm/<generation>`; `<dir>/sm/CURRENT` names the
//! generation in use. A snapshot is the engine's files (segments: the
//! checkpoints and the records still live), taken after a sync; installing
//! one writes them into a new generation, opens it, and switches to it, so
//! readers of the old one finish undisturbed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fencelog::{Command, Log, LogPosition, Options, Proposal};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use parking_lot::RwLock;

use crate::snapshot::{self, SnapshotFile, Store};
use crate::types::{Member, NodeId, Response, Responses, TypeConfig};

/// The current engine, shared with readers (the server reads from it).
#[derive(Clone)]
pub struct Engine {
    current: Arc<RwLock<Log>>,
    installed: Arc<std::sync::atomic::AtomicU64>,
}

impl Engine {
    /// Snapshots installed since this node started (a replica that fell
    /// behind the purged log, or a new one).
    pub fn snapshots_installed(&self) -> u64 {
        self.installed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The engine in use now (a snapshot installed later replaces it).
    pub fn log(&self) -> Log {
        self.current.read().clone()
    }
}

/// The state machine.
pub struct StateMachine {
    dir: PathBuf,
    engine: Engine,
    generation: u64,
    opts: Options,
    /// Applies and snapshots take turns: a snapshot holds exactly what
    /// was applied up to its position.
    turn: Arc<tokio::sync::Mutex<()>>,
    snaps: Arc<Store>,
    /// The file a snapshot is being received into.
    incoming: Option<PathBuf>,
    /// On a given storage (a simulation): no blocking threads.
    inline_io: bool,
    /// How long applies take (`timings.rs`).
    timings: Arc<crate::timings::Timings>,
}

fn sm_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::error(e.to_string())).into()
}

/// Bits of an engine position's index that number the writes of one
/// Raft entry (see [`position`]).
const SUB_BITS: u32 = 16;
/// The low bits of an entry's last write (or of an entry of one command).
const LAST: u64 = (1 << SUB_BITS) - 1;

/// The engine position of write `sub` of the `count` an entry holds.
///
/// An entry holds many writes (see `batcher.rs`), and the engine, not
/// synced per batch, may come back from a crash with only the first few of
/// them: so each write has a position of its own, `index << 16 | sub + 1`,
/// the entry's last `index << 16 | 0xffff`. [`log_id`] reads a position
/// back: an entry is applied once its last write is, and a write at or
/// below the engine's position is never applied again.
fn position(id: &LogId<NodeId>, sub: usize, count: usize) -> LogPosition {
    let low = if sub + 1 >= count {
        LAST
    } else {
        sub as u64 + 1
    };
    LogPosition {
        term: id.leader_id.term,
        node: id.leader_id.node_id,
        index: (id.index << SUB_BITS) | low,
    }
}

/// The last Raft entry applied whole, from the engine's position. Part of
/// an entry applied means the entry before is the last whole one: it has
/// the same leader (a leader's first entry, a blank, holds one command).
fn log_id(p: LogPosition) -> Option<LogId<NodeId>> {
    let index = p.index >> SUB_BITS;
    let whole = if p.index & LAST == LAST {
        index
    } else {
        index.checked_sub(1)?
    };
    (whole > 0).then(|| LogId::new(openraft::CommittedLeaderId::new(p.term, p.node), whole))
}

/// The engine options of a replica: cluster mode, no sync per batch, and
/// entries large enough for anything the group can accept: the largest
/// Raft entry (`min_entry_bytes`). A replica whose own `--segment-bytes`
/// were smaller would refuse a write the others accept.
pub fn engine_options(base: &Options, min_entry_bytes: u32) -> Options {
    let mut o = base.clone();
    o.replicated = true;
    o.wal.sync_every_batch = false;
    // An entry's writes are decided one submit each and awaited together:
    // one wake-up of the log's thread and one write per entry.
    o.wal.flush_on_wait = true;
    // Zeros written ahead make syncs cheaper; this log is synced only at
    // a seal or a snapshot, so the fill would be a second write of every
    // segment for nothing: the space is reserved instead.
    if o.wal.preallocation == fencelog_wal::Preallocation::Fill {
        o.wal.preallocation = fencelog_wal::Preallocation::Reserve;
    }
    if o.wal.max_entry_bytes < min_entry_bytes {
        o.wal.max_entry_bytes = min_entry_bytes;
    }
    // Room for the entry, a segment's header and trailer, and a checkpoint.
    let segment_min = u64::from(min_entry_bytes) * 2 + (64 << 10);
    if o.wal.segment_bytes < segment_min {
        o.wal.segment_bytes = segment_min;
    }
    o
}

/// Where the replica engine of the node whose data directory is `dir`
/// lives: `<dir>/sm/<generation>`, the generation `sm/CURRENT` names (for
/// the offline tools: `fencelog verify` and `dump` read it there).
pub fn replica_engine_dir(dir: &Path) -> std::io::Result<PathBuf> {
    Ok(generation_dir(dir, read_current(dir)?))
}

fn generation_dir(dir: &Path, generation: u64) -> PathBuf {
    dir.join("sm").join(format!("{generation:020}"))
}

/// The generation `sm/CURRENT` names; 1 when there is none yet. Any other
/// failure to read it fails the open: guessing would remove the
/// generation in use.
fn read_current(dir: &Path) -> std::io::Result<u64> {
    let path = dir.join("sm").join("CURRENT");
    match std::fs::read_to_string(&path) {
        Ok(s) => s.trim().parse().map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} does not name a generation: {:?}",
                    path.display(),
                    s.trim()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(1),
        Err(e) => Err(e),
    }
}

fn write_current(dir: &Path, generation: u64) -> std::io::Result<()> {
    let sm = dir.join("sm");
    let tmp = sm.join("CURRENT.tmp");
    std::fs::write(&tmp, format!("{generation}\n"))?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, sm.join("CURRENT"))?;
    snapshot::sync_dir(&sm)
}

/// The engine's I/O error for `op` on `path`, as `map_err` takes it.
fn io_error<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> fencelog::Error + 'a {
    move |source| {
        fencelog::Error::Io(fencelog_wal::WalError::Io {
            op,
            path: path.to_path_buf(),
            source,
        })
    }
}

impl StateMachine {
    /// Opens the state machine in `dir` (its engine in the current
    /// generation); removes generations no longer in use.
    pub fn open(
        dir: &Path,
        base: &Options,
        min_entry_bytes: u32,
    ) -> Result<StateMachine, fencelog::Error> {
        Self::open_on(None, dir, base, min_entry_bytes)
    }

    /// As [`StateMachine::open`], with the engine's log on `storage` if
    /// given (deterministic simulation: the simulated disk). Only the
    /// engine's log goes there: the generation pointer (`sm/CURRENT`) and
    /// the snapshot store stay on real files under `dir`, and snapshots
    /// (built from and installed into real files) do not work on it.
    pub fn open_on(
        storage: Option<Arc<dyn fencelog_wal::Storage>>,
        dir: &Path,
        base: &Options,
        min_entry_bytes: u32,
    ) -> Result<StateMachine, fencelog::Error> {
        let sm = dir.join("sm");
        std::fs::create_dir_all(&sm).map_err(io_error("create", &sm))?;
        let current = sm.join("CURRENT");
        let generation = read_current(dir).map_err(io_error("read", &current))?;
        // A process killed between `write_current`'s rename and its
        // directory sync leaves the new `CURRENT` in the page cache only:
        // make the name durable before the other generations are removed
        // on its word (a power cut could otherwise bring back a `CURRENT`
        // naming a generation already gone).
        snapshot::sync_dir(&sm).map_err(io_error("sync directory", &sm))?;
        if let Ok(entries) = std::fs::read_dir(&sm) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Ok(g) = name.parse::<u64>()
                    && g != generation
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let opts = engine_options(base, min_entry_bytes);
        let inline_io = storage.is_some();
        let log = match storage {
            None => Log::open(generation_dir(dir, generation), opts.clone())?,
            // A replica's leases follow the clock its entries carry: the
            // clock given here is not used.
            Some(storage) => Log::open_on(
                storage,
                Arc::new(fencelog::MonotonicClock::default()),
                &generation_dir(dir, generation),
                opts.clone(),
            )?,
        };
        let snap = dir.join("snap");
        let snaps =
            Store::open(snap.clone()).map_err(io_error("open the snapshot directory", &snap))?;
        Ok(StateMachine {
            dir: dir.to_path_buf(),
            engine: Engine {
                current: Arc::new(RwLock::new(log)),
                installed: Arc::default(),
            },
            generation,
            opts,
            turn: Arc::new(tokio::sync::Mutex::new(())),
            snaps: Arc::new(snaps),
            incoming: None,
            inline_io,
            timings: Arc::default(),
        })
    }

    /// This state machine with its applies counted in `timings` (the
    /// node's).
    pub(crate) fn timed_in(mut self, timings: Arc<crate::timings::Timings>) -> StateMachine {
        self.timings = timings;
        self
    }

    /// The engine handle readers use.
    pub fn engine(&self) -> Engine {
        self.engine.clone()
    }

    /// The membership the engine holds (decoded, never guessed: bytes
    /// that do not decode stop the state machine).
    fn membership(log: &Log) -> Result<StoredMembership<NodeId, Member>, StorageError<NodeId>> {
        let bytes = log.membership();
        if bytes.is_empty() {
            return Ok(StoredMembership::default());
        }
        crate::codec::MEMBERSHIP.decode(&bytes).map_err(sm_err)
    }
}

/// Builds snapshots of the state machine.
pub struct Builder {
    engine: Engine,
    turn: Arc<tokio::sync::Mutex<()>>,
    snaps: Arc<Store>,
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, StorageError<NodeId>> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(sm_err)?
        .map_err(sm_err)
}

/// A snapshot as Raft takes it: its metadata, and its bytes to read (a
/// staged one is packed only if read).
fn open_snapshot(
    snaps: &Arc<Store>,
    saved: snapshot::Saved,
) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
    let file = snaps.open_snapshot(&saved).map_err(sm_err)?;
    Ok(Snapshot {
        meta: saved.meta,
        snapshot: Box::new(file),
    })
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        // Applies wait only while the engine is synced and its files
        // staged: links, a copy of `MARKS`, no record copied.
        let (applied, membership, staging) = {
            let _turn = self.turn.lock().await;
            let log = self.engine.log();
            let snaps = Arc::clone(&self.snaps);
            let engine = log.clone();
            let staging = blocking(move || {
                let end = engine.sync_to_end().map_err(std::io::Error::other)?;
                let staging = snaps.staging()?;
                snapshot::stage(engine.dir(), engine.active_segment(), end, &staging)?;
                Ok(staging)
            })
            .await?;
            (log.applied(), StateMachine::membership(&log)?, staging)
        };
        let meta = SnapshotMeta {
            last_log_id: applied.and_then(log_id),
            last_membership: membership,
            snapshot_id: format!(
                "{}-{}-{}",
                applied.and_then(log_id).map_or(0, |a| a.leader_id.term),
                applied.and_then(log_id).map_or(0, |a| a.index),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis())
            ),
        };
        let snaps = Arc::clone(&self.snaps);
        let saved_meta = meta.clone();
        let saved = blocking(move || {
            let saved = snaps.save(&staging, &saved_meta)?;
            tracing::info!(snapshot = %saved_meta.snapshot_id, "snapshot built");
            Ok(saved)
        })
        .await?;
        open_snapshot(&self.snaps, saved)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Member>), StorageError<NodeId>>
    {
        let log = self.engine.log();
        Ok((
            log.applied().and_then(log_id),
            StateMachine::membership(&log)?,
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Responses>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let _turn = self.turn.lock().await;
        let started = std::time::Instant::now();
        let log = self.engine.log();
        // Every write of every entry, with its position; what the engine
        // applied already (before a crash) is not applied again.
        let done = log.applied().map_or(0, |p| p.index);
        // The commands of an entry are borrowed, not copied: the entry
        // (a clone of the log's) holds its bytes, and a follower's appends
        // are read from them in place; a leader's own entry, the commands
        // it was given (held here while the batch borrows them).
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let given: Vec<Option<Arc<Vec<Command>>>> = entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(req) => req.given(),
                _ => None,
            })
            .collect();
        // Grown by each entry's count (an entry may hold thousands of
        // writes); `read` is refilled for each entry.
        let mut batch: Vec<(LogPosition, u64, Proposal<'_>)> = Vec::new();
        let mut read: Vec<Proposal<'_>> = Vec::new();
        let mut last_entry: Option<u64> = None;
        // Per entry: per write, its place in `batch` or the answer it has.
        let mut shape: Vec<Vec<Result<usize, Response>>> = Vec::with_capacity(entries.len());
        for (entry, given) in entries.iter().zip(&given) {
            // Entries come in log order, each once.
            debug_assert!(last_entry.is_none_or(|l| l < entry.log_id.index));
            last_entry = Some(entry.log_id.index);
            // An entry holds its commands (as given to this leader,
            // `given`, else `read` from its bytes), or stands for one made
            // here (`own`).
            let (time_ms, own): (u64, Option<Command>) = match &entry.payload {
                // A new leader's first entry (openraft's): only a position.
                // The take-over of the leases is the leader's own first
                // entry (`Command::TakeOver`), stamped with the group's
                // clock as the leader carries it on.
                EntryPayload::Blank => (0, Some(Command::Blank)),
                // A command the entry could not carry is a
                // `Command::Refused`: decided alike on every replica.
                EntryPayload::Normal(req) => {
                    if given.is_none() {
                        req.proposals(&mut read);
                    }
                    let held = given.as_ref().map_or(read.len(), |g| g.len());
                    (req.time_ms, (held == 0).then_some(Command::Blank))
                }
                EntryPayload::Membership(m) => {
                    let stored = StoredMembership::new(Some(entry.log_id), m.clone());
                    let bytes = crate::codec::MEMBERSHIP.encode(&stored).map_err(sm_err)?;
                    (0, Some(Command::Membership(bytes.into())))
                }
            };
            let given: &[Command] = given.as_deref().map_or(&[], Vec::as_slice);
            let count = given.len() + read.len() + usize::from(own.is_some());
            batch.reserve(count);
            let cmds = own
                .map(|c| Proposal::Decoded(Box::new(c)))
                .into_iter()
                .chain(given.iter().map(Proposal::Command))
                .chain(read.drain(..));
            let mut answers = Vec::with_capacity(count);
            for (sub, cmd) in cmds.enumerate() {
                let at = position(&entry.log_id, sub, count);
                if at.index <= done {
                    answers.push(Err(Response::Done));
                    continue;
                }
                answers.push(Ok(batch.len()));
                // Positions only grow: no write is applied twice.
                debug_assert!(batch.last().is_none_or(|(p, ..)| *p < at));
                batch.push((at, time_ms, cmd));
            }
            shape.push(answers);
        }
        // Decided in order, written out together: one write for the batch.
        let applied = log.apply_replicated_many(&batch).await.map_err(sm_err)?;
        drop(batch);
        drop(read);
        drop(given);
        // A leader's commands as given go now, and the client buffers
        // their payloads are slices of with them.
        for entry in &entries {
            if let EntryPayload::Normal(req) = &entry.payload {
                req.applied();
            }
        }
        self.timings.applies.since(started);
        // The applied position never moves back.
        debug_assert!(log.applied().map_or(0, |p| p.index) >= done);
        Ok(shape
            .into_iter()
            .map(|answers| {
                Responses(
                    answers
                        .into_iter()
                        .map(|a| match a {
                            Ok(i) => applied
                                .get(i)
                                .map_or(Response::Done, Response::from_applied),
                            Err(r) => r,
                        })
                        .collect(),
                )
            })
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Builder {
            engine: self.engine.clone(),
            turn: Arc::clone(&self.turn),
            snaps: Arc::clone(&self.snaps),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<SnapshotFile>, StorageError<NodeId>> {
        let snaps = Arc::clone(&self.snaps);
        let (path, file) = blocking(move || snaps.incoming()).await?;
        self.incoming = Some(path);
        Ok(Box::new(SnapshotFile::open(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Member>,
        mut snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError<NodeId>> {
        use tokio::io::AsyncWriteExt;
        snapshot.flush().await.map_err(sm_err)?;
        drop(snapshot);
        let incoming = self
            .incoming
            .take()
            .ok_or_else(|| sm_err("a snapshot to install that was never received"))?;
        let _turn = self.turn.lock().await;
        let next = self.generation + 1;
        let dir = generation_dir(&self.dir, next);
        let opts = self.opts.clone();
        let (unpack_from, open_dir) = (incoming.clone(), dir.clone());
        let log = blocking(move || {
            if open_dir.exists() {
                std::fs::remove_dir_all(&open_dir)?;
            }
            snapshot::unpack(std::fs::File::open(&unpack_from)?, &open_dir)?;
            Log::open(open_dir, opts).map_err(std::io::Error::other)
        })
        .await?;
        if log.applied().and_then(log_id) != meta.last_log_id {
            return Err(sm_err(format!(
                "the installed snapshot holds entries up to {:?}, its meta says {:?}",
                log.applied(),
                meta.last_log_id
            )));
        }
        write_current(&self.dir, next).map_err(sm_err)?;
        let old = std::mem::replace(&mut *self.engine.current.write(), log);
        let old_dir = generation_dir(&self.dir, self.generation);
        self.generation = next;
        self.engine
            .installed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Reads go to the leader, which never installs a snapshot: nobody
        // reads the old engine now.
        let snaps = Arc::clone(&self.snaps);
        let meta = meta.clone();
        blocking(move || {
            if let Err(e) = old.close() {
                tracing::debug!(error = %e, "the replaced engine is still shared; dropped");
            }
            std::fs::remove_dir_all(&old_dir)?;
            snaps.save(&incoming, &meta).map(|_| ())
        })
        .await
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let snaps = Arc::clone(&self.snaps);
        let current = if self.inline_io {
            // Simulated: no thread (a small read of real files).
            snaps.open_current().map_err(sm_err)?
        } else {
            blocking(move || snaps.open_current()).await?
        };
        Ok(current.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(openraft::CommittedLeaderId::new(term, 2), index)
    }

    #[test]
    fn an_entry_is_applied_once_its_last_write_is() {
        // One command: its position is the entry's.
        assert_eq!(log_id(position(&id(3, 7), 0, 1)), Some(id(3, 7)));
        // Three writes: the first two leave the entry before as the last
        // whole one; the third completes it.
        assert_eq!(log_id(position(&id(3, 7), 0, 3)), Some(id(3, 6)));
        assert_eq!(log_id(position(&id(3, 7), 1, 3)), Some(id(3, 6)));
        assert_eq!(log_id(position(&id(3, 7), 2, 3)), Some(id(3, 7)));
        // Part of the first entry: nothing whole yet.
        assert_eq!(log_id(position(&id(1, 1), 0, 2)), None);
    }

    #[test]
    fn positions_grow_with_writes_and_entries() {
        let mut all = Vec::new();
        for index in 1..4 {
            for sub in 0..3 {
                all.push(position(&id(1, index), sub, 3).index);
            }
        }
        all.push(position(&id(1, 4), 0, 1).index);
        all.push(position(&id(1, 5), 0, crate::batcher::MAX_WRITES).index);
        all.push(
            position(
                &id(1, 5),
                crate::batcher::MAX_WRITES - 1,
                crate::batcher::MAX_WRITES,
            )
            .index,
        );
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    }

    fn append(payload: &str) -> Command {
        Command::Write(fencelog::TxOp::Append {
            stream: bytes::Bytes::from_static(b"s"),
            token: fencelog::Token::new(1).unwrap(),
            payloads: vec![bytes::Bytes::copy_from_slice(payload.as_bytes())].into(),
        })
    }

    fn entry(index: u64, payloads: &[&str]) -> Entry<TypeConfig> {
        Entry {
            log_id: id(1, index),
            payload: EntryPayload::Normal(crate::types::Request::new(
                10,
                payloads.iter().map(|p| append(p)).collect(),
            )),
        }
    }

    fn records(log: &Log) -> Vec<String> {
        log.read(b"s", 0, 100)
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_replica_that_kept_part_of_an_entry_applies_the_rest_once() {
        let tmp = tempfile::tempdir().unwrap();
        let base = Options::default();
        {
            let mut sm = StateMachine::open(tmp.path(), &base, 1 << 20).unwrap();
            sm.apply(vec![entry(1, &["a"])]).await.unwrap();
            // The engine's files end after the first two of entry 2's three
            // writes: what a replica killed while applying it keeps (the
            // engine is not synced per batch).
            let log = sm.engine().log();
            for (sub, p) in ["b0", "b1"].iter().enumerate() {
                let cmd = append(p);
                log.apply_replicated(position(&id(1, 2), sub, 3), 10, &cmd)
                    .await
                    .unwrap();
            }
            log.sync().unwrap();
        }
        // Opened again from its files: entry 1 is the last whole one.
        let mut sm = StateMachine::open(tmp.path(), &base, 1 << 20).unwrap();
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(id(1, 1)));
        assert_eq!(records(&sm.engine().log()), ["a", "b0", "b1"]);
        // Raft applies entry 2 again: only its third write is new.
        let answers = sm.apply(vec![entry(2, &["b0", "b1", "b2"])]).await.unwrap();
        assert_eq!(
            answers,
            vec![Responses(vec![
                Response::Done,
                Response::Done,
                Response::Value(3)
            ])]
        );
        assert_eq!(records(&sm.engine().log()), ["a", "b0", "b1", "b2"]);
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(id(1, 2)));
        // And the whole entry survives a reopen.
        drop(sm);
        let mut sm = StateMachine::open(tmp.path(), &base, 1 << 20).unwrap();
        assert_eq!(sm.applied_state().await.unwrap().0, Some(id(1, 2)));
        assert_eq!(records(&sm.engine().log()), ["a", "b0", "b1", "b2"]);
    }

    /// A snapshot built here, with the engine going on past it and the node
    /// restarted in between, still holds exactly the entries up to its
    /// index: packed when read after the restart and installed on another
    /// replica, it gives that replica those records and no later one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_built_here_installs_elsewhere_as_of_its_index_after_a_restart() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        let mut base = Options::default();
        base.wal.segment_bytes = 128 << 10;
        base.wal.max_entry_bytes = 16 << 10;
        base.max_payload_bytes = 4 << 10;
        let min_entry = 16 << 10;
        let filler = "x".repeat(1000);
        let payloads: Vec<String> = (0..500).map(|i| format!("{i:04}{filler}")).collect();
        let written = |from: usize, to: usize| -> Vec<String> { payloads[from..to].to_vec() };
        let meta = {
            let mut sm = StateMachine::open(&a, &base, min_entry).unwrap();
            apply_each(&mut sm, &payloads, 0, 300).await;
            let snap = sm
                .get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
            assert_eq!(snap.meta.last_log_id, Some(id(1, 300)));
            let at_snapshot = sm.engine().log().active_segment();
            // The engine goes on: past the snapshot's end in the segment
            // it was writing, which is sealed and followed by others.
            apply_each(&mut sm, &payloads, 300, 450).await;
            assert!(
                sm.engine().log().active_segment() > at_snapshot,
                "the segment written at the snapshot was sealed"
            );
            snap.meta
        };
        // Restarted, and more again.
        let mut sm = StateMachine::open(&a, &base, min_entry).unwrap();
        apply_each(&mut sm, &payloads, 450, 500).await;
        assert_eq!(records(&sm.engine().log()).len(), 100, "a read of 100");
        let mut snap = sm.get_current_snapshot().await.unwrap().expect("kept");
        assert_eq!(snap.meta, meta);
        let mut bytes = Vec::new();
        snap.snapshot.read_to_end(&mut bytes).await.unwrap();
        let mut other = StateMachine::open(&b, &base, min_entry).unwrap();
        let mut incoming = other.begin_receiving_snapshot().await.unwrap();
        incoming.write_all(&bytes).await.unwrap();
        other.install_snapshot(&meta, incoming).await.unwrap();
        let (applied, _) = other.applied_state().await.unwrap();
        assert_eq!(applied, Some(id(1, 300)));
        let log = other.engine().log();
        let all: Vec<String> = log
            .read(b"s", 0, 1000)
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
            .collect();
        assert_eq!(all, written(0, 300));
        // And it goes on from there.
        other
            .apply(vec![entry(301, &[payloads[300].as_str()])])
            .await
            .unwrap();
        assert_eq!(log_next(&other), 301);
    }

    /// Applies `payloads[from..to]`, one entry each (entry `i + 1`).
    async fn apply_each(sm: &mut StateMachine, payloads: &[String], from: usize, to: usize) {
        for (i, p) in payloads.iter().enumerate().take(to).skip(from) {
            sm.apply(vec![entry(i as u64 + 1, &[p.as_str()])])
                .await
                .unwrap();
        }
    }

    fn log_next(sm: &StateMachine) -> u64 {
        sm.engine().log().stat(b"s").unwrap().next_offset
    }
}
