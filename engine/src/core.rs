//! The engine's state inside the log's serialized section: the fencing rule
//! is decided here, in queue order, against every accepted write (durable or
//! still in flight), and the decision, its token and its effect go into one
//! log entry.
//!
//! The `apply_*` functions are the only way state changes, both when a
//! decision is made and when recovery replays the log, so the two cannot
//! drift apart.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use fencelog_wal::{Appended, Durable, EntryKind, Replay, Sequencer, WalError};
use hashbrown::HashMap;

use crate::checkpoint::{self, Encoder};
use crate::footer::{self, StreamPart};
use crate::lease::Leases;
use crate::op::{self, Op};
use crate::view::{Effect, GcQueue, IndexEntry, OpenEntry, Run, StreamView, Views};

/// A stream as the serialized section knows it: every accepted write
/// counts, synced or not.
pub(crate) struct StreamCore {
    pub view: Arc<StreamView>,
    pub highest: u64,
    /// LSN of the entry that raised `highest` to its value: a STALE answer
    /// waits for it to be durable.
    pub highest_lsn: u64,
    pub next_offset: u64,
    pub start_offset: u64,
    pub total_bytes: u64,
    /// LSN of the newest entry that changed this stream.
    pub last_lsn: u64,
    /// The segment of the newest entry with records (to list the stream
    /// once per segment).
    last_segment: u64,
    /// Sealed segments with this stream's records, in offset order.
    pub runs: VecDeque<Run>,
}

pub(crate) struct Core {
    pub streams: HashMap<Box<[u8]>, StreamCore>,
    next_stream_id: u64,
    pub views: Arc<Views>,
    gc: Arc<GcQueue>,
    /// Unsealed segments and the streams with records in each.
    open_segments: BTreeMap<u64, Vec<Arc<StreamView>>>,
    /// Sealed segments and how many streams still have live records there.
    live_segments: BTreeMap<u64, u32>,
    /// Bytes the current segment's footer index will take.
    index_bytes: u64,
    pub leases: Leases,
}

impl Core {
    pub(crate) fn new(views: Arc<Views>, gc: Arc<GcQueue>, leases: Leases) -> Core {
        Core {
            streams: HashMap::new(),
            next_stream_id: 1,
            views,
            gc,
            open_segments: BTreeMap::new(),
            live_segments: BTreeMap::new(),
            index_bytes: 0,
            leases,
        }
    }

    /// The stream `name`, created (with a new id and view) if it is new.
    /// Only accepted writes call this, so recovery assigns the same ids.
    fn stream_mut(&mut self, name: &[u8]) -> &mut StreamCore {
        if !self.streams.contains_key(name) {
            let id = self.next_stream_id;
            self.next_stream_id += 1;
            let view = Arc::new(StreamView::new(id, Bytes::copy_from_slice(name)));
            self.views.insert(Arc::clone(&view));
            self.streams.insert(
                name.to_vec().into_boxed_slice(),
                StreamCore {
                    view,
                    highest: 0,
                    highest_lsn: 0,
                    next_offset: 0,
                    start_offset: 0,
                    total_bytes: 0,
                    last_lsn: 0,
                    last_segment: 0,
                    runs: VecDeque::new(),
                },
            );
        }
        // Present: inserted just above if it was missing.
        self.streams
            .get_mut(name)
            .unwrap_or_else(|| unreachable!("stream {name:?} was just inserted"))
    }

    fn raise(s: &mut StreamCore, token: u64, lsn: u64) {
        if token > s.highest {
            s.highest = token;
            s.highest_lsn = lsn;
        }
        s.last_lsn = lsn;
    }

    fn advance(s: &StreamCore) -> Effect {
        Effect::Advance {
            view: Arc::clone(&s.view),
            highest: s.highest,
            next: s.next_offset,
            start: s.start_offset,
            total_bytes: s.total_bytes,
        }
    }

    /// An accepted append of `count` records (`bytes` payload bytes) whose
    /// entry landed at `at`.
    pub(crate) fn apply_append(
        &mut self,
        name: &[u8],
        token: u64,
        first_offset: u64,
        count: u32,
        bytes: u64,
        at: Appended,
    ) -> Result<Effect, String> {
        let s = self.stream_mut(name);
        if token < s.highest || first_offset != s.next_offset || count == 0 {
            return Err(format!(
                "an append at offset {first_offset} with token {token} does not follow the stream \
                 (next offset {}, highest token {})",
                s.next_offset, s.highest
            ));
        }
        let entry = IndexEntry {
            first_offset,
            cum_bytes: s.total_bytes,
            position: at.position,
        };
        s.view.index.write().open.push_back(OpenEntry {
            segment: at.segment,
            entry,
        });
        let new_in_segment = s.last_segment != at.segment;
        s.last_segment = at.segment;
        s.next_offset += u64::from(count);
        s.total_bytes += bytes;
        Self::raise(s, token, at.lsn);
        let effect = Self::advance(s);
        let view = Arc::clone(&s.view);
        self.index_bytes += footer::encoded_len(0, 1) as u64 - footer::encoded_len(0, 0) as u64;
        if new_in_segment {
            self.index_bytes += footer::encoded_len(1, 0) as u64 - footer::encoded_len(0, 0) as u64;
            self.open_segments.entry(at.segment).or_default().push(view);
        }
        Ok(effect)
    }

    /// An accepted fence.
    pub(crate) fn apply_fence(
        &mut self,
        name: &[u8],
        token: u64,
        lsn: u64,
    ) -> Result<Effect, String> {
        let s = self.stream_mut(name);
        if token < s.highest {
            return Err(format!(
                "a fence with token {token} below the highest {}",
                s.highest
            ));
        }
        Self::raise(s, token, lsn);
        Ok(Self::advance(s))
    }

    /// An accepted trim (or, with `before` = next offset, delete).
    pub(crate) fn apply_trim(
        &mut self,
        name: &[u8],
        token: u64,
        before: u64,
        lsn: u64,
    ) -> Result<Effect, String> {
        let s = self.stream_mut(name);
        if token < s.highest || before > s.next_offset {
            return Err(format!(
                "a trim before {before} with token {token} does not fit the stream \
                 (next offset {}, highest token {})",
                s.next_offset, s.highest
            ));
        }
        Self::raise(s, token, lsn);
        let mut retired = Vec::new();
        if before > s.start_offset {
            s.start_offset = before;
            while s.runs.front().is_some_and(|r| r.end_offset <= before) {
                if let Some(r) = s.runs.pop_front() {
                    retired.push(r.segment);
                }
            }
        }
        let advance = Self::advance(s);
        let mut collect = Vec::new();
        for segment in retired {
            if let Some(live) = self.live_segments.get_mut(&segment) {
                *live -= 1;
                if *live == 0 {
                    self.live_segments.remove(&segment);
                    collect.push(Effect::Collect {
                        segment,
                        gc: Arc::clone(&self.gc),
                    });
                }
            }
        }
        if collect.is_empty() {
            Ok(advance)
        } else {
            collect.insert(0, advance);
            Ok(Effect::Many(collect))
        }
    }

    /// Replays one op entry.
    pub(crate) fn apply_op(&mut self, op: &Op<'_>, at: Appended) -> Result<Effect, String> {
        match *op {
            Op::Append {
                stream,
                token,
                first_offset,
                count,
                records,
            } => {
                let bytes: u64 = op::records(records).map(|(s, e)| (e - s) as u64).sum();
                self.apply_append(stream, token, first_offset, count, bytes, at)
            }
            Op::Fence { stream, token } => self.apply_fence(stream, token, at.lsn),
            Op::Trim {
                stream,
                token,
                before,
            } => self.apply_trim(stream, token, before, at.lsn),
            Op::Delete { stream, token } => {
                let next = self.streams.get(stream).map_or(0, |s| s.next_offset);
                self.apply_trim(stream, token, next, at.lsn)
            }
            Op::Acquire {
                name,
                owner,
                token,
                ttl_ms,
                fence,
            } => {
                let fenced = if fence {
                    Some(self.apply_fence(name, token, at.lsn)?)
                } else {
                    None
                };
                self.leases
                    .apply_acquire(name, owner, token, ttl_ms, at.lsn)?;
                Ok(fenced.unwrap_or(Effect::Many(Vec::new())))
            }
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
        }
    }

    /// Turns the records of unsealed segment `segment` into runs: at seal
    /// time, and after recovery for segments already sealed on disk.
    fn seal_segment(&mut self, segment: u64) -> (Vec<u8>, Effect) {
        let views = self.open_segments.remove(&segment).unwrap_or_default();
        let mut parts: Vec<(u64, u64, Vec<IndexEntry>)> = Vec::with_capacity(views.len());
        let mut runs = Vec::with_capacity(views.len());
        let mut live = 0u32;
        for view in views {
            let Some(s) = self.streams.get_mut(&view.name[..]) else {
                continue;
            };
            let (entries, end_offset) = {
                let ix = view.index.read();
                let entries: Vec<IndexEntry> = ix
                    .open
                    .iter()
                    .filter(|e| e.segment == segment)
                    .map(|e| e.entry)
                    .collect();
                let end = ix
                    .open
                    .iter()
                    .find(|e| e.segment > segment)
                    .map_or(s.next_offset, |e| e.entry.first_offset);
                (entries, end)
            };
            let Some(first) = entries.first() else {
                continue;
            };
            let run = Run {
                segment,
                first_offset: first.first_offset,
                end_offset,
                cum_bytes: first.cum_bytes,
            };
            if end_offset > s.start_offset {
                s.runs.push_back(run);
                live += 1;
            }
            runs.push((Arc::clone(&view), run));
            parts.push((view.id, end_offset, entries));
        }
        parts.sort_unstable_by_key(|p| p.0);
        let parts: Vec<StreamPart<'_>> = parts
            .iter()
            .map(|(id, end, entries)| StreamPart {
                stream_id: *id,
                end_offset: *end,
                entries,
            })
            .collect();
        let footer = footer::encode(&parts);
        let sealed = Effect::Sealed { segment, runs };
        let effect = if live > 0 {
            self.live_segments.insert(segment, live);
            sealed
        } else {
            Effect::Many(vec![
                sealed,
                Effect::Collect {
                    segment,
                    gc: Arc::clone(&self.gc),
                },
            ])
        };
        self.index_bytes = 0;
        (footer, effect)
    }

    /// Rebuilds the state from a checkpoint.
    fn restore(&mut self, c: checkpoint::Checkpoint) -> Result<(), String> {
        self.streams.clear();
        self.open_segments.clear();
        self.live_segments.clear();
        self.next_stream_id = c.next_stream_id;
        for rec in c.streams {
            let view = Arc::new(StreamView::new(rec.id, Bytes::from(rec.name.clone())));
            {
                use std::sync::atomic::Ordering::Release;
                view.highest.store(rec.highest, Release);
                view.next.store(rec.next_offset, Release);
                view.start.store(rec.start_offset, Release);
                view.total_bytes.store(rec.total_bytes, Release);
                view.index.write().runs = rec.runs.iter().copied().collect();
            }
            for r in &rec.runs {
                *self.live_segments.entry(r.segment).or_default() += 1;
            }
            self.views.insert(Arc::clone(&view));
            self.streams.insert(
                rec.name.into_boxed_slice(),
                StreamCore {
                    view,
                    highest: rec.highest,
                    highest_lsn: 0,
                    next_offset: rec.next_offset,
                    start_offset: rec.start_offset,
                    total_bytes: rec.total_bytes,
                    last_lsn: 0,
                    last_segment: 0,
                    runs: rec.runs.into_iter().collect(),
                },
            );
        }
        self.leases.restore(c.last_token, c.leases);
        Ok(())
    }

    /// Rebuilds the state from what recovery replays: the newest checkpoint
    /// and every entry after it.
    pub(crate) fn recover(mut self, replay: Replay<'_>) -> Result<Core, WalError> {
        let mut segments = Vec::new();
        for e in replay.entries() {
            if segments.last() != Some(&e.segment) {
                segments.push(e.segment);
            }
            match e.kind {
                EntryKind::Checkpoint => {
                    let c = checkpoint::decode(&e.payload).map_err(|why| {
                        e.corrupt(format!("a checkpoint that does not decode: {why}"))
                    })?;
                    self.restore(c).map_err(|why| e.corrupt(why))?;
                }
                EntryKind::Record => {
                    let op = op::decode(&e.payload).map_err(|why| {
                        e.corrupt(format!("an entry that does not decode: {why}"))
                    })?;
                    let at = Appended {
                        lsn: e.lsn,
                        segment: e.segment,
                        position: e.position,
                    };
                    // Everything replayed is durable: its effects apply now.
                    self.apply_op(&op, at)
                        .map_err(|why| {
                            e.corrupt(format!("an entry that breaks the fencing rule: {why}"))
                        })?
                        .durable();
                }
            }
        }
        // Replayed segments that are sealed on disk already have their
        // footer: only the in-memory side of sealing is left to do.
        for segment in segments {
            if replay.is_sealed(segment) {
                let (_, effect) = self.seal_segment(segment);
                effect.durable();
            }
        }
        Ok(self)
    }

    /// Segments no stream needs any more, found at recovery.
    pub(crate) fn dead_segments(&self, all: &[u64]) -> Vec<u64> {
        let active = all.last().copied();
        all.iter()
            .copied()
            .filter(|s| Some(*s) != active)
            .filter(|s| !self.live_segments.contains_key(s) && !self.open_segments.contains_key(s))
            .collect()
    }
}

impl Sequencer for Core {
    type Effect = Effect;

    fn checkpoint(&mut self, _segment: u64) -> Vec<u8> {
        let mut e = Encoder::new(self.next_stream_id, self.leases.last_token());
        for (name, s) in &self.streams {
            e.stream(
                s.view.id,
                name,
                s.highest,
                s.next_offset,
                s.start_offset,
                s.total_bytes,
                s.runs.iter(),
            );
        }
        self.leases.checkpoint_into(e)
    }

    fn seal(&mut self, segment: u64) -> (Vec<u8>, Option<Effect>) {
        let (footer, effect) = self.seal_segment(segment);
        (footer, Some(effect))
    }

    fn seal_len_hint(&self) -> u64 {
        self.index_bytes + footer::encoded_len(0, 0) as u64
    }
}
