//! The engine's state inside the log's serialized section: the fencing rule
//! is decided here, in queue order, against every accepted write (durable or
//! still in flight), and the decision, its token and its effect go into one
//! log entry.
//!
//! The `apply_*` functions are the only way state changes, both when a
//! decision is made and when recovery replays the log, so the two cannot
//! drift apart.
//!
//! Memory: per stream a fixed-size [`StreamCore`] and its name once (shared
//! with the readers' view); per entry of the segment being written, 24
//! bytes of index until the segment is sealed. Nothing grows with history.

use std::sync::Arc;

use bytes::Bytes;
use fencelog_wal::{Appended, Durable, EntryKind, FooterPayload, Replay, Sequencer, WalError};
use hashbrown::{HashMap, HashTable};

use crate::checkpoint::{self, Row};
use crate::footer::{self, StreamPart};
use crate::gc::GcHandle;
use crate::lease::{Clock, Leases};
use crate::op::{self, Acquire, Op};
use crate::options::Options;
use crate::replicated::{GroupLimits, LogPosition, ReplState, ReplicatedClock};
use crate::token::MAX_TOKEN;
use crate::view::{Effect, IndexEntry, Key, OpenEntry, Rise, StreamView, Views};

/// A stream as the serialized section knows it: every accepted write
/// counts, synced or not.
pub(crate) struct StreamCore {
    pub view: Arc<StreamView>,
    /// The highest token accepted on this stream itself (the floor is
    /// applied on top, see [`Core::highest`]).
    pub highest: u64,
    /// LSN of the entry that raised `highest` to its value: a STALE answer
    /// waits for it to be durable.
    pub highest_lsn: u64,
    pub next_offset: u64,
    pub start_offset: u64,
    pub total_bytes: u64,
    /// LSN of the newest entry that changed this stream.
    pub last_lsn: u64,
    /// The newest sealed segment with records of this stream (0: none):
    /// the footer of the next segment it is in links back to it.
    pub last_sealed: u64,
}

/// The index of the segment being written: each stream's entries in it,
/// turned into the segment's footer when it is sealed.
#[derive(Default)]
struct Building {
    segment: u64,
    /// By stream id.
    parts: HashMap<u64, Part>,
    /// Bytes the footer will take.
    index_bytes: u64,
}

struct Part {
    view: Arc<StreamView>,
    entries: Vec<IndexEntry>,
    end_offset: u64,
}

/// How far above a token the ceiling of the token marks is raised when a
/// token passes it: large enough that the marks file is written rarely
/// (once per 65 536 tokens issued one by one, or per millionth of the
/// token's size for tokens taken from clocks), small enough that after a
/// salvage cut the floor lies close to the last token acknowledged.
pub(crate) fn ceiling_for(token: u64) -> u64 {
    token
        .saturating_add((1u64 << 16).max(token >> 20))
        .min(MAX_TOKEN)
}

pub(crate) struct Core {
    /// Keyed by the stream's name (its view's, not a copy), hashed with
    /// the views' hasher: a decision hashes a name once for both (see
    /// [`Key`]).
    pub streams: HashTable<StreamCore>,
    next_stream_id: u64,
    pub views: Arc<Views>,
    gc: GcHandle,
    building: Building,
    /// Every stream's highest token is at least this (see [`Views::floor`]).
    pub floor: u64,
    /// The largest token any entry carries: what the token marks' ceiling
    /// must cover before an entry is acknowledged.
    pub max_token: u64,
    /// Streams at most (a checkpoint must stay a modest entry).
    max_streams: u64,
    /// Bytes of all stream names.
    names_bytes: u64,
    /// The first segment recovery replayed (older ones were not read).
    pub replayed_from: u64,
    pub leases: Leases,
    /// Cluster mode: the replicated log's position, clock and membership.
    pub repl: Option<ReplState>,
    /// While a replicated entry is applied: the header every entry written
    /// carries (see `replicated::write_op`).
    pub wrap: Option<[u8; op::REPLICATED_HEADER]>,
}

impl Core {
    /// The state a log opens on before replay: a replica's leases follow
    /// the leader's clock, carried by entries, and it decides with the
    /// group's limits (from its log), never its own options: until the log
    /// sets them, the defaults.
    pub(crate) fn for_options(
        views: Arc<Views>,
        gc: GcHandle,
        clock: Arc<dyn Clock>,
        opts: &Options,
    ) -> Core {
        let (clock, repl) = if opts.replicated {
            let c = Arc::new(ReplicatedClock::default());
            (Arc::clone(&c) as Arc<dyn Clock>, Some(ReplState::new(c)))
        } else {
            (clock, None)
        };
        let max_streams = if opts.replicated {
            crate::replicated::GroupLimits::default().max_streams
        } else {
            opts.max_streams
        };
        let mut core = Core::new(views, gc, Leases::new(clock), max_streams);
        core.repl = repl;
        core
    }

    pub(crate) fn new(views: Arc<Views>, gc: GcHandle, leases: Leases, max_streams: u64) -> Core {
        Core {
            streams: HashTable::new(),
            next_stream_id: 1,
            views,
            gc,
            building: Building::default(),
            floor: 0,
            max_token: 0,
            max_streams,
            names_bytes: 0,
            replayed_from: 0,
            leases,
            repl: None,
            wrap: None,
        }
    }

    /// `name` with its hash, for the lookups of one decision.
    pub(crate) fn key<'a>(&self, name: &'a [u8]) -> Key<'a> {
        self.views.key(name)
    }

    /// The stream `key`, if it was ever written.
    pub(crate) fn stream(&self, key: Key<'_>) -> Option<&StreamCore> {
        self.streams.find(key.hash, |s| *s.view.name == *key.name)
    }

    /// The highest token of a stream as decisions see it: its own, or the
    /// floor. A stream never seen has the floor.
    pub(crate) fn highest(&self, key: Key<'_>) -> (u64, u64) {
        match self.stream(key) {
            Some(s) if s.highest >= self.floor => (s.highest, s.highest_lsn),
            // The floor is durable (in the marks file): nothing to wait for.
            _ => (self.floor, 0),
        }
    }

    /// Whether a stream may be created (it exists, or there is room).
    pub(crate) fn room_for(&self, key: Key<'_>) -> Result<(), u64> {
        if (self.streams.len() as u64) < self.max_streams || self.stream(key).is_some() {
            Ok(())
        } else {
            Err(self.max_streams)
        }
    }

    /// The stream `key`, created (with a new id and view) if it is new.
    /// Only accepted writes call this, so recovery assigns the same ids.
    fn stream_mut(&mut self, key: Key<'_>) -> &mut StreamCore {
        let views = &self.views;
        let entry = self.streams.entry(
            key.hash,
            |s| *s.view.name == *key.name,
            |s| views.hash(&s.view.name),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(s) => s.into_mut(),
            hashbrown::hash_table::Entry::Vacant(place) => {
                let id = self.next_stream_id;
                self.next_stream_id += 1;
                self.names_bytes += key.name.len() as u64;
                let view = Arc::new(StreamView::new(id, Bytes::copy_from_slice(key.name)));
                views.insert(Arc::clone(&view));
                place
                    .insert(StreamCore {
                        view,
                        highest: 0,
                        highest_lsn: 0,
                        next_offset: 0,
                        start_offset: 0,
                        total_bytes: 0,
                        last_lsn: 0,
                        last_sealed: 0,
                    })
                    .into_mut()
            }
        }
    }

    fn raise(s: &mut StreamCore, token: u64, lsn: u64) {
        if token > s.highest {
            s.highest = token;
            s.highest_lsn = lsn;
        }
        s.last_lsn = lsn;
    }

    fn advance(s: &StreamCore, entry: Option<OpenEntry>) -> Effect {
        Effect::Advance {
            view: Arc::clone(&s.view),
            rise: Rise {
                highest: s.highest,
                next: s.next_offset,
                total_bytes: s.total_bytes,
            },
            start: s.start_offset,
            entry,
        }
    }

    /// Checks the fencing rule once more where an entry is applied (a
    /// decision that broke it would be a bug; a replayed entry that breaks
    /// it is damage).
    fn check_token(&self, key: Key<'_>, token: u64) -> Result<(), String> {
        let (highest, _) = self.highest(key);
        if token < highest {
            return Err(format!(
                "token {token} is below the highest {highest} of stream {:?}",
                key.name
            ));
        }
        Ok(())
    }

    /// An accepted append of `count` records (`bytes` payload bytes) whose
    /// entry landed at `at`.
    pub(crate) fn apply_append(
        &mut self,
        key: Key<'_>,
        token: u64,
        first_offset: u64,
        count: u32,
        bytes: u64,
        at: Appended,
    ) -> Result<Effect, String> {
        self.max_token = self.max_token.max(token);
        if self.building.segment != at.segment {
            self.building = Building {
                segment: at.segment,
                ..Building::default()
            };
        }
        let floor = self.floor;
        let s = self.stream_mut(key);
        if token < s.highest.max(floor) {
            return Err(format!(
                "token {token} is below the highest {} of stream {:?}",
                s.highest.max(floor),
                key.name
            ));
        }
        if first_offset != s.next_offset || count == 0 {
            return Err(format!(
                "an append at offset {first_offset} does not follow the stream (next offset {})",
                s.next_offset
            ));
        }
        let entry = IndexEntry {
            first_offset,
            cum_bytes: s.total_bytes,
            position: at.position,
        };
        s.next_offset += u64::from(count);
        s.total_bytes += bytes;
        Self::raise(s, token, at.lsn);
        let effect = Self::advance(
            s,
            Some(OpenEntry {
                segment: at.segment,
                entry,
            }),
        );
        let (id, view, end) = (s.view.id, Arc::clone(&s.view), s.next_offset);
        let b = &mut self.building;
        b.index_bytes += (footer::encoded_len(0, 1) - footer::encoded_len(0, 0)) as u64;
        let part = b.parts.entry(id).or_insert_with(|| {
            b.index_bytes += (footer::encoded_len(1, 0) - footer::encoded_len(0, 0)) as u64;
            Part {
                view,
                entries: Vec::new(),
                end_offset: end,
            }
        });
        part.entries.push(entry);
        part.end_offset = end;
        Ok(effect)
    }

    /// An accepted fence.
    pub(crate) fn apply_fence(
        &mut self,
        key: Key<'_>,
        token: u64,
        lsn: u64,
    ) -> Result<Effect, String> {
        self.check_token(key, token)?;
        self.max_token = self.max_token.max(token);
        let s = self.stream_mut(key);
        Self::raise(s, token, lsn);
        Ok(Self::advance(s, None))
    }

    /// An accepted trim (or, with `before` = next offset, delete).
    pub(crate) fn apply_trim(
        &mut self,
        key: Key<'_>,
        token: u64,
        before: u64,
        lsn: u64,
    ) -> Result<Effect, String> {
        self.check_token(key, token)?;
        self.max_token = self.max_token.max(token);
        let gc = self.gc.clone();
        let s = self.stream_mut(key);
        if before > s.next_offset {
            return Err(format!(
                "a trim before {before} beyond the next offset {}",
                s.next_offset
            ));
        }
        Self::raise(s, token, lsn);
        let moved = before > s.start_offset;
        if moved {
            s.start_offset = before;
        }
        let advance = Self::advance(s, None);
        if moved {
            Ok(Effect::Many(vec![
                advance,
                Effect::Trimmed {
                    view: Arc::clone(&s.view),
                    start: before,
                    gc,
                },
            ]))
        } else {
            Ok(advance)
        }
    }

    /// An accepted lease acquisition (with `fence`, a fence of the stream
    /// of the same name at its token).
    fn apply_acquire(&mut self, a: &Acquire<'_>, lsn: u64) -> Result<Effect, String> {
        self.max_token = self.max_token.max(a.token);
        let fenced = if a.fence {
            Some(self.apply_fence(self.key(a.name), a.token, lsn)?)
        } else {
            None
        };
        self.leases.apply_acquire(a, lsn)?;
        Ok(fenced.unwrap_or(Effect::Many(Vec::new())))
    }

    /// The group's membership as its log last changed it (cluster mode).
    fn set_membership(&mut self, config: &[u8]) {
        if let Some(repl) = &mut self.repl {
            repl.membership = Bytes::copy_from_slice(config);
        }
    }

    /// The group's limits, which only a cluster's log carries.
    fn set_limits(&mut self, limits: GroupLimits) -> Result<(), String> {
        let Some(repl) = &mut self.repl else {
            return Err("group limits in a log not opened in cluster mode".into());
        };
        repl.limits = limits;
        self.max_streams = limits.max_streams;
        Ok(())
    }

    /// A replica's entry at `position` of the group's log: the group's
    /// clock moves, then the op inside (none for a blank entry) applies.
    fn apply_replicated(
        &mut self,
        position: LogPosition,
        time_ms: u64,
        inner: &[u8],
        at: Appended,
    ) -> Result<Effect, String> {
        let Some(repl) = &mut self.repl else {
            return Err("a replicated entry in a log not opened in cluster mode".into());
        };
        repl.enter(position, time_ms);
        if inner.is_empty() {
            return Ok(Effect::Many(Vec::new()));
        }
        let inner = op::decode(inner)?;
        self.apply_op(&inner, at)
    }

    /// Replays one op entry.
    pub(crate) fn apply_op(&mut self, op: &Op<'_>, at: Appended) -> Result<Effect, String> {
        match *op {
            Op::Append(a) => self.apply_append(
                self.key(a.stream),
                a.token,
                a.first_offset,
                a.count,
                a.payload_bytes(),
                at,
            ),
            Op::Fence { stream, token } => self.apply_fence(self.key(stream), token, at.lsn),
            Op::Trim {
                stream,
                token,
                before,
            } => self.apply_trim(self.key(stream), token, before, at.lsn),
            Op::Delete { stream, token } => {
                let key = self.key(stream);
                let next = self.stream(key).map_or(0, |s| s.next_offset);
                self.apply_trim(key, token, next, at.lsn)
            }
            Op::Acquire(a) => self.apply_acquire(&a, at.lsn),
            Op::Release { name, owner, token } => {
                self.leases.apply_release(name, owner, token);
                Ok(Effect::Many(Vec::new()))
            }
            Op::Renew {
                name,
                owner,
                token,
                ttl_ms,
            } => {
                self.leases.apply_renew(name, owner, token, ttl_ms, at.lsn);
                Ok(Effect::Many(Vec::new()))
            }
            Op::Batch { ops, .. } => {
                let mut effects = Vec::new();
                for op in op::batch_ops(ops) {
                    effects.push(self.apply_op(&op, at)?);
                }
                Ok(Effect::Many(effects))
            }
            Op::Replicated {
                term,
                node,
                index,
                time_ms,
                inner,
            } => self.apply_replicated(LogPosition { term, node, index }, time_ms, inner, at),
            Op::Membership { config } => {
                self.set_membership(config);
                Ok(Effect::Many(Vec::new()))
            }
            Op::TakeOver => {
                self.leases.restart_all();
                Ok(Effect::Many(Vec::new()))
            }
            Op::Limits { limits } => {
                self.set_limits(limits)?;
                Ok(Effect::Many(Vec::new()))
            }
        }
    }

    /// Turns the index of segment `segment` into its footer: at seal time,
    /// and after recovery for segments already sealed on disk (whose
    /// footer is then not written again).
    fn seal_segment(&mut self, segment: u64) -> (FooterPayload, Effect) {
        let building = if self.building.segment == segment {
            std::mem::take(&mut self.building)
        } else {
            Building::default()
        };
        // Under the log's lock only what the next segment depends on: each
        // stream's link to its previous sealed segment. The index itself
        // (an entry per record: megabytes in a full segment) is encoded by
        // the sync thread when it writes the footer.
        let mut parts: Vec<(u64, u64, Part)> = Vec::with_capacity(building.parts.len());
        let mut streams = Vec::with_capacity(building.parts.len());
        for (id, part) in building.parts {
            let hash = self.views.hash(&part.view.name);
            let Some(s) = self
                .streams
                .find_mut(hash, |s| s.view.name == part.view.name)
            else {
                continue;
            };
            let prev_segment = s.last_sealed;
            s.last_sealed = segment;
            streams.push((Arc::clone(&part.view), part.end_offset));
            parts.push((id, prev_segment, part));
        }
        let footer = FooterPayload::Later(Box::new(move |b: &mut Vec<u8>| {
            parts.sort_unstable_by_key(|(id, _, _)| *id);
            let encoded: Vec<StreamPart<'_>> = parts
                .iter()
                .map(|(id, prev_segment, part)| StreamPart {
                    stream_id: *id,
                    end_offset: part.end_offset,
                    prev_segment: *prev_segment,
                    entries: &part.entries,
                })
                .collect();
            footer::encode_into(&encoded, b);
        }));
        (
            footer,
            Effect::Sealed {
                segment,
                streams,
                gc: self.gc.clone(),
            },
        )
    }

    /// Rebuilds the state from a checkpoint.
    fn restore(&mut self, c: checkpoint::Checkpoint) -> Result<(), String> {
        self.streams.clear();
        self.building = Building::default();
        self.next_stream_id = c.next_stream_id;
        self.names_bytes = 0;
        for rec in c.streams {
            let name = Bytes::from(rec.name);
            let view = Arc::new(StreamView::new(rec.id, name.clone()));
            {
                use std::sync::atomic::Ordering::Release;
                view.highest.store(rec.highest, Release);
                view.next.store(rec.next_offset, Release);
                view.start.store(rec.start_offset, Release);
                view.total_bytes.store(rec.total_bytes, Release);
                let mut ix = view.index.write();
                // At a checkpoint every record is in a sealed segment.
                ix.sealed_end = rec.next_offset;
                ix.last_sealed = rec.last_sealed;
            }
            self.max_token = self.max_token.max(rec.highest);
            self.names_bytes += name.len() as u64;
            self.views.insert(Arc::clone(&view));
            let views = &self.views;
            self.streams.insert_unique(
                views.hash(&name),
                StreamCore {
                    view,
                    highest: rec.highest,
                    highest_lsn: 0,
                    next_offset: rec.next_offset,
                    start_offset: rec.start_offset,
                    total_bytes: rec.total_bytes,
                    last_lsn: 0,
                    last_sealed: rec.last_sealed,
                },
                |s| views.hash(&s.view.name),
            );
        }
        self.max_token = self.max_token.max(c.last_token);
        // The clock first: the leases restored expire on it.
        if let (Some(repl), Some(rec)) = (&mut self.repl, c.repl) {
            self.max_streams = rec.limits.max_streams;
            repl.restore(rec);
        }
        self.leases.restore(c.last_token, c.leases);
        Ok(())
    }

    /// Rebuilds the state from what recovery replays: the newest checkpoint
    /// and every entry after it (through links into later segments).
    pub(crate) fn recover(mut self, replay: Replay<'_>) -> Result<Core, WalError> {
        let mut current: Option<u64> = None;
        self.replayed_from = replay.entries().next().map_or(0, |e| e.segment);
        for e in replay.entries() {
            if current != Some(e.segment) {
                // A segment behind the replayed one is sealed on disk: only
                // the in-memory side of sealing is left to do.
                if let Some(prev) = current {
                    let (_, effect) = self.seal_segment(prev);
                    effect.durable();
                }
                current = Some(e.segment);
            }
            match e.kind {
                EntryKind::Checkpoint => {
                    let c = checkpoint::decode(&e.payload).map_err(|why| {
                        e.corrupt(format!("a checkpoint that does not decode: {why}"))
                    })?;
                    self.restore(c).map_err(|why| e.corrupt(why))?;
                }
                EntryKind::Link => {}
                EntryKind::Record => {
                    let op = op::decode(&e.payload).map_err(|why| {
                        e.corrupt(format!("an entry that does not decode: {why}"))
                    })?;
                    let at = Appended {
                        lsn: e.lsn,
                        segment: e.segment,
                        position: e.position,
                    };
                    if let (Some(repl), Op::Replicated { index, .. }) = (&mut self.repl, &op) {
                        // The digest of a replayed replica goes on from the
                        // checkpoint's, as it went while the entries were
                        // first applied.
                        repl.digest = crate::replicated::fold(repl.digest, &e.payload);
                        repl.keep_digest(*index);
                    }
                    // Everything replayed is durable: its effects apply now.
                    self.apply_op(&op, at)
                        .map_err(|why| {
                            e.corrupt(format!("an entry that breaks the fencing rule: {why}"))
                        })?
                        .durable();
                }
            }
        }
        if let Some(last) = current
            && replay.is_sealed(last)
        {
            let (_, effect) = self.seal_segment(last);
            effect.durable();
        }
        // The token floor: raised only by a salvage cut (a torn tail was
        // never acknowledged and raises nothing), after which every stream's
        // highest token and the token counter start at or above it. (A
        // replica keeps no marks: the replicated log holds whatever a cut
        // of its own log takes.)
        self.floor = if self.repl.is_some() {
            0
        } else {
            replay.report().marks.floor
        };
        self.views
            .floor
            .store(self.floor, std::sync::atomic::Ordering::Release);
        self.leases.raise_last_token(self.floor);
        self.max_token = self.max_token.max(self.floor);
        Ok(self)
    }

    /// Every stream's start offset, by id (for garbage collection).
    pub(crate) fn starts(&self) -> HashMap<u64, u64> {
        self.streams
            .iter()
            .map(|s| (s.view.id, s.start_offset))
            .collect()
    }
}

impl Sequencer for Core {
    type Effect = Effect;

    /// A checkpoint when the log written since the last one is at least
    /// eight times its size (or a segment's worth), else a link: checkpoints
    /// stay at most an eighth of the log, and replay at most eight
    /// checkpoints' worth of it, whatever the number of streams.
    fn checkpoint(&mut self, _segment: u64, since_checkpoint: u64) -> Option<Vec<u8>> {
        let estimate = checkpoint::row_bytes(self.streams.len(), self.names_bytes as usize) as u64;
        if since_checkpoint > 0 && since_checkpoint < estimate.saturating_mul(8) {
            return None;
        }
        let rows = self
            .streams
            .iter()
            .map(|s| Row {
                id: s.view.id,
                name: &s.view.name,
                highest: s.highest,
                next_offset: s.next_offset,
                start_offset: s.start_offset,
                total_bytes: s.total_bytes,
                last_sealed: s.last_sealed,
            })
            .collect();
        let last_token = self.leases.last_token();
        let repl = self.repl.as_ref().map(ReplState::record);
        let leases = self.leases.for_checkpoint();
        Some(checkpoint::encode(
            self.next_stream_id,
            last_token,
            rows,
            leases.into_iter(),
            repl.as_ref(),
        ))
    }

    fn seal(&mut self, segment: u64) -> (FooterPayload, Option<Effect>) {
        let (footer, effect) = self.seal_segment(segment);
        (footer, Some(effect))
    }

    fn seal_len_hint(&self) -> u64 {
        self.building.index_bytes + footer::encoded_len(0, 0) as u64
    }
}
