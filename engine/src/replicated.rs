//! Cluster mode: the engine as a replica's state machine.
//!
//! In cluster mode a write is not decided when a client sends it: it is
//! proposed to the replicated log (Raft, in the `fencelog-cluster` crate),
//! and once a majority holds it, every replica applies it here, in log
//! order, with [`Log::apply_replicated`]. The decision is taken then, by the
//! same `decide_*` functions as on a single node, so every replica reaches
//! the same highest tokens, offsets and lease counter.
//!
//! Two things differ from a single node:
//!
//! - **Time.** Lease expiry must not depend on which replica's clock
//!   applies an entry, so entries carry the proposing leader's clock, and
//!   the state machine's clock follows it: within a term as the leader's
//!   clock moves, across terms continuing where the last term left off (a
//!   new leader's clock has nothing to do with the old one's). When a new
//!   leader takes over (its first entry, [`Command::TakeOver`]), every live
//!   lease restarts its full ttl: the old leader's clock cannot be trusted.
//! - **Durability.** The replicated log is what makes a write durable; the
//!   state machine's own log (this engine's) is written without a sync per
//!   batch (`WalOptions::sync_every_batch = false`) and records, in every
//!   entry, the position of the replicated entry it applied. After a crash
//!   the engine recovers what reached its disk, says up to where
//!   ([`Log::applied`]), and the replicated log applies the rest again. No
//!   token marks are kept: a cut of this log loses nothing the replicated
//!   log does not hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use fencelog_wal::{Appended, WalError, Writer};

use crate::checkpoint::ReplRecord;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::lease::Clock;
use crate::log::Log;
use crate::op;
use crate::token::{Offset, Token};
use crate::tx::TxOp;

/// The position of an entry in the replicated log: the term and node of
/// the leader that wrote it, and its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogPosition {
    /// The leader's term.
    pub term: u64,
    /// The leader's node id.
    pub node: u64,
    /// The entry's index in the replicated log.
    pub index: u64,
}

/// A write as the replicated log carries it, decided when applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// As [`Log::append`].
    Append {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
        /// The records.
        payloads: Vec<Bytes>,
    },
    /// As [`Log::append_at`] (a retry of one that succeeded answers its
    /// offset).
    AppendAt {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
        /// The offset the first record must get.
        expected_offset: Offset,
        /// The records.
        payloads: Vec<Bytes>,
    },
    /// As [`Log::fence`].
    Fence {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
    },
    /// As [`Log::trim`].
    Trim {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
        /// Records below this offset are trimmed.
        before: Offset,
    },
    /// As [`Log::delete`].
    Delete {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
    },
    /// As [`Log::transact`].
    Transact(Vec<TxOp>),
    /// As [`Log::acquire`] without waiting (the caller retries while held).
    Acquire {
        /// The lease.
        name: Bytes,
        /// Its owner.
        owner: Bytes,
        /// How long it lasts, in ms of the leader's clock.
        ttl_ms: u64,
        /// Also fence the stream of the same name.
        fence: bool,
    },
    /// As [`Log::renew`].
    Renew {
        /// The lease.
        name: Bytes,
        /// Its owner.
        owner: Bytes,
        /// Its token.
        token: Token,
        /// The new ttl, in ms.
        ttl_ms: u64,
    },
    /// As [`Log::release`].
    Release {
        /// The lease.
        name: Bytes,
        /// Its owner.
        owner: Bytes,
        /// Its token.
        token: Token,
    },
    /// A new leader took over: every live lease restarts its full ttl.
    TakeOver,
    /// The cluster's membership changed: kept, opaque, for the replication
    /// layer (it is part of the state a snapshot carries).
    Membership(Bytes),
    /// Changes nothing but the applied position.
    Blank,
}

/// What applying a [`Command`] answered.
#[derive(Debug)]
pub enum Applied {
    /// An append's first offset, a fence's highest token, a trim's new
    /// start, a delete's count, a renewal's ttl in ms.
    Value(u64),
    /// A transaction's answers, one per op.
    Values(Vec<u64>),
    /// A lease granted.
    Grant {
        /// Its token.
        token: Token,
        /// Its ttl in ms.
        ttl_ms: u64,
    },
    /// Whether a release released.
    Released(bool),
    /// Nothing to answer (a take-over, a membership change, a blank).
    Done,
    /// Rejected (STALE, MISMATCH, HELD, LOST, …): nothing changed.
    Rejected(Error),
}

/// The state machine's clock: the leader's, carried by the entries.
#[derive(Debug, Default)]
pub(crate) struct ReplicatedClock {
    now: AtomicU64,
}

impl Clock for ReplicatedClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }
}

impl ReplicatedClock {
    fn set(&self, ms: u64) {
        self.now.fetch_max(ms, Ordering::AcqRel);
    }
}

/// What the serialized section keeps of replication.
pub(crate) struct ReplState {
    pub clock: Arc<ReplicatedClock>,
    /// The last replicated entry applied (in memory; its entry may not be
    /// on disk yet).
    pub applied: Option<LogPosition>,
    pub membership: Bytes,
    /// The term whose clock the state machine follows, that term's first
    /// timestamp, and the state machine's time then.
    clock_term: u64,
    clock_first_ms: u64,
    clock_base_ms: u64,
}

impl ReplState {
    pub(crate) fn new(clock: Arc<ReplicatedClock>) -> ReplState {
        ReplState {
            clock,
            applied: None,
            membership: Bytes::new(),
            clock_term: 0,
            clock_first_ms: 0,
            clock_base_ms: 0,
        }
    }

    /// Moves to entry `at`, stamped `time_ms` by its leader: the state
    /// machine's clock continues from where the last term left it.
    /// An entry stamped 0 (a blank, a take-over) carries no time: it
    /// neither moves the clock nor anchors its term's clock, which the
    /// term's first timed entry does.
    pub(crate) fn enter(&mut self, at: LogPosition, time_ms: u64) {
        if time_ms != 0 {
            if at.term != self.clock_term {
                self.clock_term = at.term;
                self.clock_first_ms = time_ms;
                self.clock_base_ms = self.clock.now_ms();
            }
            let t = self
                .clock_base_ms
                .saturating_add(time_ms.saturating_sub(self.clock_first_ms));
            self.clock.set(t);
        }
        if self.applied.is_none_or(|a| at.index >= a.index) {
            self.applied = Some(at);
        }
    }

    pub(crate) fn record(&self) -> ReplRecord {
        let a = self.applied.unwrap_or_default();
        ReplRecord {
            term: a.term,
            node: a.node,
            index: a.index,
            clock_ms: self.clock.now_ms(),
            clock_term: self.clock_term,
            clock_first_ms: self.clock_first_ms,
            clock_base_ms: self.clock_base_ms,
            membership: self.membership.to_vec(),
        }
    }

    pub(crate) fn restore(&mut self, r: ReplRecord) {
        self.clock.set(r.clock_ms);
        self.applied = (r.index > 0).then_some(LogPosition {
            term: r.term,
            node: r.node,
            index: r.index,
        });
        self.clock_term = r.clock_term;
        self.clock_first_ms = r.clock_first_ms;
        self.clock_base_ms = r.clock_base_ms;
        self.membership = Bytes::from(r.membership);
    }
}

/// Appends an op entry, wrapped as a Replicated entry when the engine is
/// applying one: every write path goes through here.
pub(crate) fn write_op(
    w: &mut Writer<'_, Core>,
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> std::result::Result<Appended, WalError> {
    match w.state().wrap {
        None => w.append(len, fill),
        Some(header) => w.append(op::REPLICATED_HEADER + len, |buf| {
            let (h, rest) = buf.split_at_mut(op::REPLICATED_HEADER);
            h.copy_from_slice(&header);
            fill(rest);
        }),
    }
}

impl Log {
    /// Applies entry `at` of the replicated log: `cmd`, proposed by a
    /// leader whose clock read `time_ms`. Decided here, in log order, by the
    /// same rules as on a single node, so every replica answers the same.
    /// The answer does not wait for this engine's disk (the replicated log
    /// is durable already); entries at or below [`Log::applied`] must not be
    /// applied again.
    pub async fn apply_replicated(
        &self,
        at: LogPosition,
        time_ms: u64,
        cmd: &Command,
    ) -> Result<Applied> {
        if !self.options().replicated {
            return Err(Error::invalid(
                "mode",
                "apply_replicated needs a log opened with Options::replicated",
            ));
        }
        crate::replicated_apply::apply(self, at, time_ms, cmd).await
    }

    /// Applies entries of the replicated log in order, as
    /// [`Log::apply_replicated`] one by one would, answering alike; their
    /// writes go out together, so a batch costs one write, not one per
    /// entry.
    pub async fn apply_replicated_many(
        &self,
        entries: &[(LogPosition, u64, Command)],
    ) -> Result<Vec<Applied>> {
        if !self.options().replicated {
            return Err(Error::invalid(
                "mode",
                "apply_replicated needs a log opened with Options::replicated",
            ));
        }
        crate::replicated_apply::apply_many(self, entries).await
    }

    /// The last replicated entry applied: `None` before the first. After an
    /// open, what reached this engine's disk.
    pub fn applied(&self) -> Option<LogPosition> {
        self.inner()
            .wal
            .with_state(|c| c.repl.as_ref().and_then(|r| r.applied))
    }

    /// The membership last applied (opaque bytes of the replication layer).
    pub fn membership(&self) -> Bytes {
        self.inner().wal.with_state(|c| {
            c.repl
                .as_ref()
                .map(|r| r.membership.clone())
                .unwrap_or_default()
        })
    }
}
