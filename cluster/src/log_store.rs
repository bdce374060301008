//! The Raft log, on fencelog's write-ahead log: group commit kept (one
//! `fdatasync` per batch of entries, on every replica), the vote synced
//! before Raft goes on, truncation and purge as entries of the same log.
//!
//! ```text
//! // record: { kind: u8 | version: u8 (RECORD_VERSION = 1) | … }
//! //   1 Entry:     { index: u64 | term: u64 | node: u64 | entry: bincode(openraft Entry<Request>) }
//! //   2 Vote:      { vote: bincode(Vote) }
//! //   3 Truncate:  { from_index: u64 }          entries from this index on are gone
//! //   4 Purge:     { upto: bincode(LogId) }     entries up to this id are no longer needed
//! //   5 Committed: { committed: bincode(Option<LogId>) }
//! // checkpoint: { magic: b"FLRC" | version: u8 (1) | bincode(RaftLogState) }
//! //   (vote, committed, last purged, and where every live entry is)
//! ```
//!
//! Every body is decoded within its own length (docs/FORMAT.md,
//! "Cluster"). A log from before the records carried a version is refused
//! at open (its checkpoint has no magic): its records cannot be told from
//! versioned ones, so its node's data is re-created.
//!
//! The log is append-only: a truncation is an entry saying so, and replay
//! forgets what it truncates. What memory holds is where each entry not yet
//! purged is (a few dozen bytes each); Raft purges entries once a snapshot
//! holds them, so that stays bounded. Segments whose entries are all purged
//! are removed once a newer checkpoint is durable.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use fencelog_wal::{
    EntryKind, FooterPayload, FsStorage, Replay, Sequencer, Wal, WalError, WalOptions,
};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, StorageError, StorageIOError, Vote};
use serde::{Deserialize, Serialize};

use crate::codec::{self, FormatError, Tagged};
use crate::types::{NodeId, TypeConfig};

const ENTRY: u8 = 1;
const VOTE: u8 = 2;
const TRUNCATE: u8 = 3;
const PURGE: u8 = 4;
const COMMITTED: u8 = 5;
/// The format version of every Raft log record (its second byte).
pub const RECORD_VERSION: u8 = 1;
/// kind + version + index + term + node.
const ENTRY_HEADER: usize = 26;

/// The Raft log's checkpoint.
// checkpoint: { magic: b"FLRC" | version: u8 (1) | bincode(RaftLogState) }
const CHECKPOINT: Tagged = Tagged {
    what: "a Raft log checkpoint",
    magic: *b"FLRC",
    version: 1,
};

/// A Raft log record, decoded (an entry's openraft `Entry` is left where
/// it is: replay needs only its id).
// record: { kind: u8 | version: u8 (1) | body }
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    // 1: { index: u64 | term: u64 | node: u64 | bincode(Entry) }
    Entry { index: u64, term: u64, node: u64 },
    // 2: { bincode(Vote) }
    Vote(Vote<NodeId>),
    // 3: { from_index: u64 }
    Truncate(u64),
    // 4: { bincode(LogId) }
    Purge(LogId<NodeId>),
    // 5: { bincode(Option<LogId>) }
    Committed(Option<LogId<NodeId>>),
}

const RECORD: &str = "a Raft log record";

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

impl Record {
    /// The record's bytes (not for an entry: [`encode_entry`]).
    fn encode(&self) -> Result<Vec<u8>, bincode::Error> {
        let (kind, body) = match self {
            Record::Entry { .. } => {
                return Err(Box::new(bincode::ErrorKind::Custom(
                    "an entry's record is encoded with its Entry".into(),
                )));
            }
            Record::Vote(v) => (VOTE, codec::encode(v)?),
            Record::Truncate(from) => (TRUNCATE, from.to_le_bytes().to_vec()),
            Record::Purge(upto) => (PURGE, codec::encode(upto)?),
            Record::Committed(c) => (COMMITTED, codec::encode(c)?),
        };
        let mut rec = Vec::with_capacity(2 + body.len());
        rec.push(kind);
        rec.push(RECORD_VERSION);
        rec.extend_from_slice(&body);
        Ok(rec)
    }

    /// Decodes a record: its version first, then its kind, then a body of
    /// exactly the kind's length (an entry's openraft `Entry` is not
    /// decoded here: [`decode_entry`]).
    pub(crate) fn decode(payload: &[u8]) -> Result<Record, FormatError> {
        let (&kind, rest) = payload
            .split_first()
            .ok_or_else(|| FormatError::invalid(RECORD, "empty"))?;
        let (&version, body) = rest
            .split_first()
            .ok_or_else(|| FormatError::invalid(RECORD, "truncated before its version"))?;
        if version != RECORD_VERSION {
            return Err(FormatError::UnknownVersion {
                what: RECORD,
                version,
                known: RECORD_VERSION,
            });
        }
        Ok(match kind {
            ENTRY => {
                if body.len() < ENTRY_HEADER - 2 {
                    return Err(FormatError::invalid(RECORD, "a truncated entry"));
                }
                Record::Entry {
                    index: le_u64(body),
                    term: le_u64(&body[8..]),
                    node: le_u64(&body[16..]),
                }
            }
            VOTE => Record::Vote(codec::decode("a Raft log vote", body)?),
            TRUNCATE => {
                if body.len() != 8 {
                    return Err(FormatError::invalid(
                        RECORD,
                        format!("a truncation of {} bytes (8)", body.len()),
                    ));
                }
                Record::Truncate(le_u64(body))
            }
            PURGE => Record::Purge(codec::decode("a Raft log purge", body)?),
            COMMITTED => Record::Committed(codec::decode("a Raft log committed mark", body)?),
            other => {
                return Err(FormatError::invalid(
                    RECORD,
                    format!("unknown kind {other}"),
                ));
            }
        })
    }
}

/// An entry's record: `{ 1 | version | index | term | node | bincode(Entry) }`.
#[cfg(any(test, feature = "fuzzing"))]
fn encode_entry(e: &Entry<TypeConfig>) -> Result<Vec<u8>, bincode::Error> {
    let body = codec::encode(e)?;
    let mut rec = vec![0; ENTRY_HEADER + body.len()];
    put_entry_record(&mut rec, &e.log_id, &body);
    Ok(rec)
}

/// Writes the record of the entry `id` whose bincode is `body` into `buf`
/// (exactly `ENTRY_HEADER + body.len()` bytes).
fn put_entry_record(buf: &mut [u8], id: &LogId<NodeId>, body: &[u8]) {
    let (header, rest) = buf.split_at_mut(ENTRY_HEADER);
    header[0] = ENTRY;
    header[1] = RECORD_VERSION;
    header[2..10].copy_from_slice(&id.index.to_le_bytes());
    header[10..18].copy_from_slice(&id.leader_id.term.to_le_bytes());
    header[18..26].copy_from_slice(&id.leader_id.node_id.to_le_bytes());
    rest.copy_from_slice(body);
}

/// Decodes an entry's record in full: its header, then its openraft
/// `Entry` within the record's length, whose id must be the header's.
pub(crate) fn decode_entry(payload: &[u8]) -> Result<Entry<TypeConfig>, FormatError> {
    let Record::Entry { index, term, node } = Record::decode(payload)? else {
        return Err(FormatError::invalid(RECORD, "not an entry"));
    };
    let entry: Entry<TypeConfig> = codec::decode("a Raft log entry", &payload[ENTRY_HEADER..])?;
    let id = entry.log_id;
    if (id.index, id.leader_id.term, id.leader_id.node_id) != (index, term, node) {
        return Err(FormatError::invalid(
            RECORD,
            format!("an entry {id} under the header {term}-{node}-{index}"),
        ));
    }
    Ok(entry)
}

#[cfg(feature = "fuzzing")]
impl Record {
    pub(crate) fn encode_for_fuzzing(&self) -> Result<Vec<u8>, bincode::Error> {
        self.encode()
    }
}

/// Replays `rec` over `state` (a checkpoint's, or an empty one), as open
/// does, and answers the last log id.
#[cfg(feature = "fuzzing")]
pub(crate) fn replay_for_fuzzing(
    state: Option<RaftLogState>,
    rec: &Record,
) -> Option<LogId<NodeId>> {
    let mut s = state.unwrap_or_default();
    s.apply(rec, 1, 64);
    s.last_log_id()
}

#[cfg(feature = "fuzzing")]
pub(crate) fn encode_entry_for_fuzzing(e: &Entry<TypeConfig>) -> Result<Vec<u8>, bincode::Error> {
    encode_entry(e)
}

/// A checkpoint with a vote, marks and two entries (a fuzz seed).
#[cfg(feature = "fuzzing")]
pub(crate) fn sample_checkpoint_for_fuzzing() -> Vec<u8> {
    let mut s = RaftLogState::default();
    s.apply(&Record::Vote(Vote::new(3, 1)), 1, 64);
    for index in [1, 2] {
        s.apply(
            &Record::Entry {
                index,
                term: 3,
                node: 1,
            },
            1,
            64 * (index + 1),
        );
    }
    s.purge(LogId::new(openraft::CommittedLeaderId::new(3, 1), 1));
    s.committed = Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 2));
    CHECKPOINT.encode(&s).unwrap_or_default()
}

/// Decodes a checkpoint.
pub(crate) fn decode_checkpoint(payload: &[u8]) -> Result<RaftLogState, FormatError> {
    CHECKPOINT.decode(payload)
}

/// Where an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Loc {
    term: u64,
    node: u64,
    segment: u64,
    position: u64,
}

/// The Raft log's state, inside the WAL's serialized section.
#[derive(Default, Serialize, Deserialize)]
pub(crate) struct RaftLogState {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
    entries: BTreeMap<u64, Loc>,
    /// Each segment's highest entry index (for removal once purged).
    segment_max: BTreeMap<u64, u64>,
}

fn log_id(index: u64, loc: &Loc) -> LogId<NodeId> {
    LogId::new(openraft::CommittedLeaderId::new(loc.term, loc.node), index)
}

impl RaftLogState {
    fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.entries
            .iter()
            .next_back()
            .map(|(i, loc)| log_id(*i, loc))
            .or(self.last_purged)
    }

    fn truncate(&mut self, from: u64) {
        self.entries.split_off(&from);
    }

    fn purge(&mut self, upto: LogId<NodeId>) {
        // (A purge up to u64::MAX, which Raft never writes, keeps nothing.)
        let keep = match upto.index.checked_add(1) {
            Some(after) => self.entries.split_off(&after),
            None => BTreeMap::new(),
        };
        self.entries = keep;
        if self.last_purged.is_none_or(|p| p.index < upto.index) {
            self.last_purged = Some(upto);
        }
        // Nothing at or below a purge is kept, and the purged id never
        // moves back.
        debug_assert!(self.entries.keys().next().is_none_or(|i| *i > upto.index));
        debug_assert!(self.last_purged.is_some_and(|p| p.index >= upto.index));
    }

    /// Applies one record (a decision, or replay).
    fn apply(&mut self, rec: &Record, segment: u64, position: u64) {
        match *rec {
            Record::Entry { index, term, node } => {
                // A new entry at an index replaces whatever was there and
                // after (Raft appends only after truncating a conflict).
                self.truncate(index);
                self.entries.insert(
                    index,
                    Loc {
                        term,
                        node,
                        segment,
                        position,
                    },
                );
                let m = self.segment_max.entry(segment).or_default();
                *m = (*m).max(index);
            }
            Record::Vote(v) => self.vote = Some(v),
            Record::Truncate(from) => self.truncate(from),
            Record::Purge(upto) => self.purge(upto),
            Record::Committed(c) => self.committed = c,
        }
    }
}

impl Sequencer for RaftLogState {
    type Effect = ();

    /// A checkpoint when the log since the last one is at least eight times
    /// its size, else a link (as the engine does).
    fn checkpoint(&mut self, _segment: u64, since: u64) -> Option<Vec<u8>> {
        let estimate = 64 + 40 * self.entries.len() as u64;
        if since > 0 && since < estimate.saturating_mul(8) {
            return None;
        }
        CHECKPOINT.encode(self).ok()
    }

    fn seal(&mut self, _segment: u64) -> (FooterPayload, Option<()>) {
        (Vec::new().into(), None)
    }
}

fn build(replay: Replay<'_>) -> Result<RaftLogState, WalError> {
    let mut state = RaftLogState::default();
    for e in replay.entries() {
        match e.kind {
            EntryKind::Checkpoint => {
                state = decode_checkpoint(&e.payload).map_err(|why| e.corrupt(why.to_string()))?;
            }
            EntryKind::Link => {}
            EntryKind::Record => {
                let rec = Record::decode(&e.payload).map_err(|why| e.corrupt(why.to_string()))?;
                state.apply(&rec, e.segment, e.position);
            }
        }
    }
    Ok(state)
}

/// The Raft log store: a handle on the WAL (clones share it).
#[derive(Clone)]
pub struct LogStore {
    wal: Arc<Wal<RaftLogState>>,
    max_request: usize,
    recent: Arc<parking_lot::Mutex<Recent>>,
    /// This node's id, once known: entries of another leader are a
    /// follower's appends.
    node: Option<NodeId>,
    /// How long appends take to be durable (`timings.rs`).
    timings: Arc<crate::timings::Timings>,
}

/// Durable entries leave the [`Recent`] cache once it holds more than this
/// (encoded; the unsynced ones stay whatever their size: at most the
/// batches in flight). Enough for the entries between an append and their
/// apply, a few at a time. Small on purpose: an entry's payloads are
/// slices of the buffer they arrived in (a client's request, a peer's
/// frame), which it keeps alive, and a leader's entry also keeps its
/// commands' encoding (made once for its log and its followers), so the
/// memory it holds is more than its encoding; at 32 MiB the nodes'
/// resident memory doubled (68 to 134-168 MB after 10 s of appends at
/// pipeline 16).
const RECENT_BYTES: usize = 4 << 20;

/// Entries appended lately, as Raft gave them, by index: replication and
/// the state machine read them here rather than read back and decode what
/// was just written. An entry not yet durable is always here, so a leader
/// sends a batch to its followers while its own sync of that batch runs
/// (the two syncs overlap instead of following each other). Raft allows
/// it: the leader counts itself towards a majority only once its own sync
/// is done. Durable entries stay while the cache holds at most
/// [`RECENT_BYTES`] (encoded), oldest out first; a truncation or a purge
/// takes its entries out at once.
#[derive(Default)]
struct Recent {
    /// By index: the entry, its encoded length, whether it is durable.
    entries: BTreeMap<u64, (Entry<TypeConfig>, usize, bool)>,
    /// The sum of the encoded lengths.
    bytes: usize,
}

impl Recent {
    /// An entry just appended (not yet durable, so it stays: nothing is
    /// shed here, under the log's lock; [`Recent::durable`] sheds).
    fn insert(&mut self, entry: Entry<TypeConfig>, len: usize) {
        if let Some((_, old, _)) = self.entries.insert(entry.log_id.index, (entry, len, false)) {
            self.bytes -= old;
        }
        self.bytes += len;
    }

    /// `ids` are durable; an index taken since by a newer entry (after a
    /// truncation) is not.
    fn durable(&mut self, ids: &[LogId<NodeId>]) {
        for id in ids {
            if let Some((e, _, durable)) = self.entries.get_mut(&id.index)
                && e.log_id == *id
            {
                *durable = true;
            }
        }
        self.shed();
    }

    /// The oldest durable entries out while over the bound.
    fn shed(&mut self) {
        while self.bytes > RECENT_BYTES {
            let Some(first) = self.entries.first_entry() else {
                return;
            };
            if !first.get().2 {
                return;
            }
            self.bytes -= first.remove().1;
        }
    }

    /// Clones of the entries `start..end`, if the cache holds every one.
    fn whole(&self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
        let want = usize::try_from(end.checked_sub(start)?).ok()?;
        let out: Vec<Entry<TypeConfig>> = self
            .entries
            .range(start..end)
            .map(|(_, (e, ..))| e.clone())
            .collect();
        (out.len() == want).then_some(out)
    }

    /// Takes out every entry from index `from` on.
    fn truncate(&mut self, from: u64) {
        let gone = self.entries.split_off(&from);
        self.bytes -= gone.values().map(|(_, len, _)| len).sum::<usize>();
    }

    /// Takes out every entry up to index `upto`.
    fn purge(&mut self, upto: u64) {
        let kept = self.entries.split_off(&upto.saturating_add(1));
        let gone = std::mem::replace(&mut self.entries, kept);
        self.bytes -= gone.values().map(|(_, len, _)| len).sum::<usize>();
    }
}

/// An entry is at most half a segment, and at most 64 MiB.
fn opts_max_entry(segment_bytes: u64) -> u32 {
    u32::try_from((segment_bytes / 2).min(64 << 20)).unwrap_or(u32::MAX)
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<NodeId> {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

/// How a Raft log does its I/O.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Io {
    /// With threads of its own (sync, allocator); `direct`: its batches are
    /// written around the page cache (`WalOptions::direct_io`).
    Threads { direct: bool },
    /// Deterministic simulation only: no threads of its own and no
    /// preallocation (`WalOptions::inline_io`).
    Inline,
}

impl LogStore {
    /// Opens (or creates) the Raft log in `dir`; with `direct_io`, its
    /// batches are written around the page cache
    /// (`WalOptions::direct_io`).
    pub fn open(dir: &Path, segment_bytes: u64, direct_io: bool) -> Result<LogStore, WalError> {
        let io = Io::Threads { direct: direct_io };
        Self::open_with(Arc::new(FsStorage), dir, segment_bytes, io)
    }

    /// As [`LogStore::open`], on any storage (the simulated one).
    #[cfg(test)]
    fn open_on(
        storage: Arc<dyn fencelog_wal::Storage>,
        dir: &Path,
        segment_bytes: u64,
    ) -> Result<LogStore, WalError> {
        Self::open_with(storage, dir, segment_bytes, Io::Threads { direct: true })
    }

    /// As [`LogStore::open_on`], doing its I/O as `io` says.
    pub(crate) fn open_with(
        storage: Arc<dyn fencelog_wal::Storage>,
        dir: &Path,
        segment_bytes: u64,
        io: Io,
    ) -> Result<LogStore, WalError> {
        let mut opts = WalOptions {
            segment_bytes,
            max_entry_bytes: opts_max_entry(segment_bytes),
            // Appends, votes and purges are awaited (and start their batch
            // then); a commit mark or a truncation rides with the next:
            // one wake-up and one write per entry, not two.
            flush_on_wait: true,
            // Recent entries are read from memory (`Recent`) or the segment
            // being written, a sealed segment only by a follower far
            // behind: a sealed segment's pages are let go. On this
            // project's VM a page the page cache takes from fresh memory
            // costs the most of a replicated append once the log has grown
            // (docs/CLUSTER.md, "The Raft log's page cache"); reused pages
            // do not.
            uncache_sealed: true,
            // One writer (the Raft thread), whose next entries follow from
            // the network, not from the answer to its last: a wait for it
            // to submit again would only delay the acknowledgement.
            wait_for_writers: false,
            // Synced every batch, read back from memory: nothing gains
            // from its pages (docs/CLUSTER.md, "The Raft log's page
            // cache").
            direct_io: matches!(io, Io::Threads { direct: true }),
            ..WalOptions::default()
        };
        if let Io::Inline = io {
            opts.inline_io = true;
            opts.preallocation = fencelog_wal::Preallocation::None;
        }
        let (wal, report) = Wal::open(storage, dir, opts, build)?;
        if let Some(cut) = &report.cut {
            // Raft assumes what it acknowledged stays: a cut here is a
            // damaged disk, said loudly (the replica catches up again from
            // the leader, but a vote or an entry it acknowledged is gone).
            tracing::error!(?cut, dir = %dir.display(), "the Raft log was damaged and cut");
        }
        // A node that led before it stopped comes back a follower: openraft
        // 0.9 would resume leading its old term at once, with no first
        // entry of its own, so no take-over of the leases, while another
        // node may lead a newer term. Only the vote's "committed" mark is
        // dropped, in memory: the node still voted for that candidate in
        // that term (it never votes twice), and it leads again only by
        // winning an election, whose first entries take over.
        wal.with_state_mut(|s, _| {
            if let Some(v) = &mut s.vote {
                v.committed = false;
            }
        });
        Ok(LogStore {
            wal: Arc::new(wal),
            max_request: (opts_max_entry(segment_bytes) as usize)
                .saturating_sub(ENTRY_HEADER + 256),
            recent: Arc::default(),
            node: None,
            timings: Arc::default(),
        })
    }

    /// The log of node `id`: a follower's small appends are then written
    /// and synced on the Raft thread (see [`Wal::flush_small_here`]).
    pub(crate) fn of_node(mut self, id: NodeId) -> LogStore {
        self.node = Some(id);
        self
    }

    /// The node's timings, which this log's appends count in.
    pub(crate) fn timings(&self) -> Arc<crate::timings::Timings> {
        Arc::clone(&self.timings)
    }

    /// The last entry of this log (or the last purged, if none is left).
    pub(crate) fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.wal.with_state(|s| s.last_log_id())
    }

    /// Bytes this log has written since it was opened (entries, their
    /// framing, checkpoints): what a snapshot lets Raft purge grows with it.
    pub fn bytes_written(&self) -> u64 {
        self.wal.stats().bytes_written
    }

    /// The last entry this node knows committed (as Raft last told it).
    pub fn committed(&self) -> Option<u64> {
        self.wal.with_state(|s| s.committed.map(|c| c.index))
    }

    /// Whether this log holds any Raft state (a vote, an entry, a purge):
    /// a directory that does was initialized before.
    pub fn has_state(&self) -> bool {
        self.wal
            .with_state(|s| s.vote.is_some() || s.last_purged.is_some() || !s.entries.is_empty())
    }

    /// The largest request (encoded) an entry of this log holds.
    pub fn max_request_bytes(&self) -> usize {
        self.max_request
    }

    /// Writes a record (not waiting for it to be durable).
    async fn record(&self, rec: Record) -> Result<fencelog_wal::Ticket, WalError> {
        let bytes = rec.encode().map_err(|e| WalError::Io {
            op: "encode a Raft log record",
            path: Default::default(),
            source: io_err(e),
        })?;
        self.wal
            .submit_async(|w| {
                let at = w.append(bytes.len(), |buf| buf.copy_from_slice(&bytes))?;
                w.state().apply(&rec, at.segment, at.position);
                Ok::<_, WalError>(w.ticket())
            })
            .await?
    }

    /// Writes entries as one batch (synced once); the ticket resolves when
    /// they are durable.
    async fn append_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<(fencelog_wal::Ticket, Vec<LogId<NodeId>>), StorageError<NodeId>> {
        // Encoded before the lock; written as one batch, synced once.
        let mut encoded = Vec::new();
        let mut last: Option<u64> = None;
        for e in entries {
            // Raft appends a run of consecutive entries.
            debug_assert!(last.is_none_or(|l| l + 1 == e.log_id.index));
            last = Some(e.log_id.index);
            let body = codec::encode(&e).map_err(|e| write_err(*e))?;
            encoded.push((e, body));
        }
        let ids: Vec<LogId<NodeId>> = encoded.iter().map(|(e, _)| e.log_id).collect();
        let recent = &self.recent;
        let ticket = self
            .wal
            .submit_async(move |w| {
                // Readable by replication from the moment the log's state
                // names them (both under the log's lock).
                let mut cache = recent.lock();
                for (entry, body) in encoded {
                    let log_id = entry.log_id;
                    let id = Record::Entry {
                        index: log_id.index,
                        term: log_id.leader_id.term,
                        node: log_id.leader_id.node_id,
                    };
                    let len = ENTRY_HEADER + body.len();
                    let at = w.append(len, |buf| put_entry_record(buf, &log_id, &body))?;
                    w.state().apply(&id, at.segment, at.position);
                    cache.insert(entry, len);
                }
                Ok::<_, WalError>(w.ticket())
            })
            .await
            .map_err(write_err)?
            .map_err(write_err)?;
        Ok((ticket, ids))
    }

    /// Removes segments whose every entry is purged (once recovery no
    /// longer needs them), off the async runtime.
    fn collect(&self) {
        let wal = Arc::clone(&self.wal);
        let purged = wal.with_state(|s| s.last_purged.map(|p| p.index));
        let Some(purged) = purged else { return };
        let dead: Vec<u64> = wal.with_state(|s| {
            s.segment_max
                .iter()
                .filter(|&(_, &max)| max <= purged)
                .map(|(&seg, _)| seg)
                .collect()
        });
        if dead.is_empty() {
            return;
        }
        tokio::task::spawn_blocking(move || {
            for seg in dead {
                match wal.remove_segment(seg) {
                    Ok(fencelog_wal::Removal::NotYet) => break,
                    Ok(_) => {
                        wal.with_state_mut(|s, _| {
                            s.segment_max.remove(&seg);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(segment = seg, error = %e, "removing a purged Raft log segment");
                        break;
                    }
                }
            }
        });
    }

    /// Reads the entries `start..end` this log holds. Raft replicates
    /// entries it has appended before its own sync of them is done (a
    /// leader's flush is reported apart), and the WAL reads only durable
    /// entries: a read that meets one not yet durable waits for everything
    /// appended so far to be, then reads again. Answering an error instead
    /// stops Raft on this node for good (seen under a partition: the
    /// isolated leader's next replication read came within the sync).
    async fn read_entries(
        &self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        match self.read_durable(start, end) {
            Err(Miss::NoEntry(_)) => {
                let ticket = self
                    .wal
                    .submit_async(|w| w.ticket())
                    .await
                    .map_err(read_err)?;
                ticket.await.map_err(read_err)?;
                self.read_durable(start, end).map_err(Miss::into_storage)
            }
            other => other.map_err(Miss::into_storage),
        }
    }

    fn read_durable(&self, start: u64, end: u64) -> Result<Vec<Entry<TypeConfig>>, Miss> {
        // The common case, replication of what was just appended: all of
        // it in the cache, taken without the log's lock. That lock is the
        // sync thread's too, and a sync thread preempted while holding it
        // (two cores, a dozen busy threads) kept the leader's Raft thread
        // yielding for milliseconds. The cache never holds an index the
        // log's state does not (an append fills both under the log's
        // lock; a truncation or a purge empties the cache first), and an
        // index's entry there is the newest appended.
        if let Some(all) = self.recent.lock().whole(start, end) {
            return Ok(all);
        }
        let locs: Vec<(u64, Loc)> = self
            .wal
            .with_state(|s| s.entries.range(start..end).map(|(i, l)| (*i, *l)).collect());
        // Recent entries (always those whose sync may still run) as Raft
        // gave them, taken under one lock.
        let cached: Vec<Option<Entry<TypeConfig>>> = {
            let recent = self.recent.lock();
            locs.iter()
                .map(|(index, _)| recent.entries.get(index).map(|(e, ..)| e.clone()))
                .collect()
        };
        let mut out = Vec::with_capacity(locs.len());
        for ((index, loc), cached) in locs.into_iter().zip(cached) {
            let decoded = match cached {
                Some(entry) => Ok(entry),
                None => match self.wal.read_entry(loc.segment, loc.position) {
                    Ok(e) => decode_entry(&e.payload),
                    Err(e @ WalError::NoEntry { .. }) => return Err(Miss::NoEntry(e)),
                    Err(e) => return Err(Miss::Storage(Box::new(read_err(e)))),
                },
            };
            let entry = decoded.map_err(|why| {
                let at = format!("segment {} at byte {}: {why}", loc.segment, loc.position);
                Miss::Storage(Box::new(StorageError::from(
                    StorageIOError::read_log_at_index(index, AnyError::error(at)),
                )))
            })?;
            if entry.log_id.index != index {
                return Err(Miss::Storage(Box::new(StorageError::from(
                    StorageIOError::read_log_at_index(
                        index,
                        AnyError::error(format!("found entry {} there", entry.log_id)),
                    ),
                ))));
            }
            out.push(entry);
        }
        Ok(out)
    }
}

/// Why a read of entries came back without them.
enum Miss {
    /// No durable entry where the map says one is: appended but not yet
    /// durable (or gone, which the read after the sync tells).
    NoEntry(WalError),
    /// Anything else.
    Storage(Box<StorageError<NodeId>>),
}

impl Miss {
    fn into_storage(self) -> StorageError<NodeId> {
        match self {
            // Still missing after a sync: the WAL's own words.
            Miss::NoEntry(e) => read_err(e),
            Miss::Storage(e) => *e,
        }
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    use std::ops::Bound;
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e + 1,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let (start, end) = bounds(&range);
        self.read_entries(start, end).await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        Ok(self.wal.with_state(|s| LogState {
            last_purged_log_id: s.last_purged,
            last_log_id: s.last_log_id(),
        }))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        // A vote never goes back (Raft saves only a vote at least as new).
        debug_assert!(
            self.wal
                .with_state(|s| s.vote)
                .is_none_or(|old| vote.partial_cmp(&old) != Some(std::cmp::Ordering::Less))
        );
        let ticket = self
            .record(Record::Vote(*vote))
            .await
            .map_err(|e| StorageError::from(StorageIOError::write_vote(AnyError::new(&e))))?;
        // A vote is durable before Raft acts on it.
        ticket
            .await
            .map_err(|e| StorageError::from(StorageIOError::write_vote(AnyError::new(&e))))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.wal.with_state(|s| s.vote))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        // Not waited for: a committed id lost in a crash is learned again.
        let _unwaited = self
            .record(Record::Committed(committed))
            .await
            .map_err(write_err)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.wal.with_state(|s| s.committed))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let started = std::time::Instant::now();
        let (ticket, ids) = self.append_entries(entries).await?;
        // A follower appends another leader's entries, and acknowledges
        // them once synced: with nothing else to do meanwhile (at
        // pipeline 1 an entry is a few KiB), it writes and syncs a small
        // batch itself rather than hand it to the sync thread and be woken
        // back. A leader never does: its sync runs while it replicates.
        let follower = self
            .node
            .is_some_and(|me| ids.first().is_some_and(|id| id.leader_id.node_id != me));
        if follower && self.wal.flush_small_here() && ticket.is_durable() {
            self.timings.log_syncs.since(started);
            self.recent.lock().durable(&ids);
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        let recent = Arc::clone(&self.recent);
        let timings = Arc::clone(&self.timings);
        tokio::spawn(async move {
            let result = ticket.await.map_err(io_err);
            if result.is_ok() {
                timings.log_syncs.since(started);
                // Durable: may leave the cache from now on.
                recent.lock().durable(&ids);
            }
            callback.log_io_completed(result);
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        // Entries from `log_id` on are gone: none may be sent again.
        self.recent.lock().truncate(log_id.index);
        // Not waited for: the WAL syncs in order, so any later entry that
        // becomes durable carries this truncation with it.
        let _unwaited = self
            .record(Record::Truncate(log_id.index))
            .await
            .map_err(write_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.recent.lock().purge(log_id.index);
        // Waited for: segments are removed only once the purge is durable.
        self.record(Record::Purge(log_id))
            .await
            .map_err(write_err)?
            .await
            .map_err(write_err)?;
        self.collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::time::Duration;

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(3, 1), index)
    }

    #[test]
    fn records_round_trip_and_another_version_is_refused_by_number() {
        let mut vote = Vote::new(3, 1);
        vote.commit();
        for rec in [
            Record::Vote(vote),
            Record::Truncate(17),
            Record::Purge(id(9)),
            Record::Committed(Some(id(12))),
            Record::Committed(None),
        ] {
            let bytes = rec.encode().unwrap();
            assert_eq!(bytes[1], RECORD_VERSION);
            assert_eq!(Record::decode(&bytes), Ok(rec));
            let mut other = bytes.clone();
            other[1] = 2;
            assert_eq!(
                Record::decode(&other),
                Err(FormatError::UnknownVersion {
                    what: RECORD,
                    version: 2,
                    known: RECORD_VERSION
                })
            );
            // Every truncation, and a byte left over, is refused.
            for n in 0..bytes.len() {
                assert!(Record::decode(&bytes[..n]).is_err(), "{rec:?} cut to {n}");
            }
            assert!(Record::decode(&[&bytes[..], &[0]].concat()).is_err());
        }
        let e = blank(5);
        let bytes = encode_entry(&e).unwrap();
        assert_eq!(decode_entry(&bytes).unwrap(), e);
        // An entry under another entry's header is refused.
        let mut moved = bytes.clone();
        moved[2] = 6;
        assert!(decode_entry(&moved).is_err());
        let mut other = bytes;
        other[1] = 0;
        let err = decode_entry(&other).unwrap_err().to_string();
        assert!(err.contains("format version 0"), "{err}");
    }

    /// Found while making the `raft_record` fuzz target replay what it
    /// decodes: a purge up to index u64::MAX overflowed.
    #[test]
    fn a_purge_up_to_the_last_index_keeps_nothing() {
        let mut s = RaftLogState::default();
        s.apply(
            &Record::Entry {
                index: 7,
                term: 3,
                node: 1,
            },
            1,
            64,
        );
        s.apply(&Record::Purge(id(u64::MAX)), 1, 128);
        assert!(s.entries.is_empty());
        assert_eq!(s.last_log_id(), Some(id(u64::MAX)));
    }

    /// What the build before versions wrote: the checkpoint as bare
    /// bincode of the state.
    struct Unversioned(RaftLogState);

    impl Sequencer for Unversioned {
        type Effect = ();
        fn checkpoint(&mut self, _segment: u64, _since: u64) -> Option<Vec<u8>> {
            bincode::serialize(&self.0).ok()
        }
        fn seal(&mut self, _segment: u64) -> (fencelog_wal::FooterPayload, Option<()>) {
            (Vec::new().into(), None)
        }
    }

    #[test]
    fn a_log_from_before_versions_is_refused_with_where_and_why() {
        let sim = fencelog_wal::SimStorage::new();
        let dir = Path::new("/raft");
        let opts = WalOptions {
            segment_bytes: 1 << 20,
            max_entry_bytes: opts_max_entry(1 << 20),
            ..WalOptions::default()
        };
        let (wal, _) = Wal::open(Arc::new(sim.clone()), dir, opts, |_| {
            Ok(Unversioned(RaftLogState::default()))
        })
        .unwrap();
        drop(wal);
        let err = LogStore::open_on(Arc::new(sim), dir, 1 << 20)
            .err()
            .expect("refused");
        let text = err.to_string();
        assert!(text.contains("re-create"), "{text}");
        assert!(text.contains("00000000000000000001.wal"), "{text}");
    }

    #[test]
    fn a_checkpoint_round_trips_through_a_reopen() {
        let sim = fencelog_wal::SimStorage::new();
        let dir = Path::new("/raft");
        let mut vote = Vote::new(3, 1);
        {
            let mut store = LogStore::open_on(Arc::new(sim.clone()), dir, 1 << 20).unwrap();
            futures_block(store.save_vote(&vote)).unwrap();
            let (t, _) = futures_block(store.append_entries((1..=3).map(blank))).unwrap();
            futures_block(t).unwrap();
            futures_block(store.purge(id(1))).unwrap();
        }
        let mut store = LogStore::open_on(Arc::new(sim), dir, 1 << 20).unwrap();
        vote.committed = false;
        assert_eq!(futures_block(store.read_vote()).unwrap(), Some(vote));
        let read = futures_block(store.try_get_log_entries(2..4)).unwrap();
        assert_eq!(read.len(), 2);
    }

    fn futures_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// A leader replicates entries it appended before its own sync of them
    /// is done: they are read as encoded, at once, while the sync runs (so
    /// the leader's sync and its followers' overlap), and leave the cache
    /// once durable. Before, the read waited for the leader's sync.
    #[tokio::test]
    async fn entries_not_yet_durable_are_read_without_waiting_for_their_sync() {
        let sim = fencelog_wal::SimStorage::new();
        let dir = Path::new("/raft");
        let store = LogStore::open_on(Arc::new(sim.clone()), dir, 1 << 20).unwrap();
        let before = sim.faults().syncs();
        sim.faults().delay_syncs(Duration::from_millis(300));
        let (ticket, _) = store.append_entries((1..=3).map(blank)).await.unwrap();
        let mut reader = store.clone();
        let read = reader.try_get_log_entries(1..4).await.unwrap();
        assert_eq!(
            read.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(sim.faults().syncs(), before, "the read waited for the sync");
        assert_eq!(store.recent.lock().entries.len(), 3);
        ticket.await.unwrap();
        // A truncation takes its entries out of the cache too: none is
        // sent again.
        let (_, _) = store.append_entries((4..=6).map(blank)).await.unwrap();
        let mut s = store.clone();
        s.truncate(id(5)).await.unwrap();
        assert_eq!(
            store
                .recent
                .lock()
                .entries
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
    }

    /// The cache of recent entries stays within its bound by letting the
    /// oldest durable entries go, never one not yet durable (replication
    /// could not read it from the log), and counts what truncations and
    /// purges take out.
    #[test]
    fn recent_entries_shed_only_durable_ones_and_keep_count() {
        let quarter = RECENT_BYTES / 4;
        let mut r = Recent::default();
        for i in 1..=8 {
            r.insert(blank(i), quarter);
        }
        // Twice the bound, none durable: all stay.
        assert_eq!(r.entries.len(), 8);
        assert_eq!(r.bytes, 8 * quarter);
        // An id that is not the cached entry's marks nothing.
        r.durable(&[LogId::new(CommittedLeaderId::new(9, 1), 1)]);
        assert_eq!(r.entries.len(), 8);
        let ids: Vec<_> = (1..=6).map(|i| blank(i).log_id).collect();
        r.durable(&ids);
        assert_eq!(r.entries.keys().copied().collect::<Vec<_>>(), [5, 6, 7, 8]);
        assert_eq!(r.bytes, 4 * quarter);
        r.truncate(7);
        assert_eq!(r.entries.keys().copied().collect::<Vec<_>>(), [5, 6]);
        assert_eq!(r.bytes, 2 * quarter);
        r.purge(5);
        assert_eq!(r.entries.keys().copied().collect::<Vec<_>>(), [6]);
        assert_eq!(r.bytes, quarter);
        // A newer entry at an index takes the old one's place and count.
        r.insert(blank(6), 10);
        assert_eq!(r.bytes, 10);
    }

    /// Replication reads what was just appended from the cache without the
    /// log's lock, which the sync thread takes too: a read of cached
    /// entries answers while another thread holds that lock. A read that
    /// needs the log (an entry no longer cached) still goes through it and
    /// finds every entry. Before, every read took the lock first, and a
    /// preempted holder kept the leader's Raft thread yielding.
    #[test]
    fn cached_entries_are_read_without_the_logs_lock() {
        let sim = fencelog_wal::SimStorage::new();
        let store = LogStore::open_on(Arc::new(sim), Path::new("/raft"), 1 << 20).unwrap();
        let (t, _) = futures_block(store.append_entries((1..=4).map(blank))).unwrap();
        futures_block(t).unwrap();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let wal = Arc::clone(&store.wal);
        let holder = std::thread::spawn(move || {
            wal.with_state(|_| {
                held_tx.send(()).unwrap();
                // Held until the test says, or 10 s at most.
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
            });
        });
        held_rx.recv().unwrap();
        let (read_tx, read_rx) = std::sync::mpsc::channel();
        let reader = store.clone();
        let read = std::thread::spawn(move || {
            let got = reader.read_durable(2, 5).map(|v| v.len()).ok();
            let _ = read_tx.send(got);
        });
        let answered = read_rx.recv_timeout(Duration::from_secs(5));
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        read.join().unwrap();
        assert_eq!(
            answered.ok(),
            Some(Some(3)),
            "a read of cached entries waited for the log's lock"
        );
        // Entry 1 leaves the cache: a read that includes it goes to the
        // log, and still finds all four.
        store.recent.lock().purge(1);
        let read = store.read_durable(1, 5).ok().unwrap_or_default();
        assert_eq!(
            read.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
    }
}
