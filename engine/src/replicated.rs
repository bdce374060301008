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
use crate::token::Token;
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

/// A write as the replicated log carries it, decided when applied. Its
/// bytes in the log are [`Command::encode`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// One stream write, as [`Log::append`], [`Log::append_at`] (a retry
    /// of one that succeeded answers its offset), [`Log::fence`],
    /// [`Log::trim`] or [`Log::delete`].
    Write(TxOp),
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
    /// A new leader took over: every live lease still live on the group's
    /// clock restarts its full ttl (the old leader's clock cannot be
    /// trusted). Proposed by each leader before its first write.
    TakeOver,
    /// The group's limits change (refused, alike everywhere, if they
    /// cannot be decided with).
    SetLimits(GroupLimits),
    /// The leader's digest after position `index`: a replica whose own
    /// digest there differs has decided differently and stops.
    Check {
        /// An engine position ([`LogPosition::index`]).
        index: u64,
        /// The leader's digest after it.
        digest: u64,
    },
    /// The cluster's membership changed: kept, opaque, for the replication
    /// layer (it is part of the state a snapshot carries).
    Membership(Bytes),
    /// Changes nothing but the applied position (and the clock, to the
    /// entry's time: a leader's tick lets leases expire in the log).
    Blank,
    /// What an entry carried that is refused without being decided (a
    /// token of 0 decoded from the log, a name too long to encode):
    /// answered alike on every replica, and only the position moves.
    Refused(Refusal),
}

/// Why a [`Command::Refused`] is refused: the engine's
/// [`Error::Invalid`], inside [`Error::Aborted`] when it concerns one op of
/// a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The transaction op it concerns, if any.
    pub op: Option<u32>,
    /// What is refused (a token, a stream name, an owner, …).
    pub what: &'static str,
    /// Why.
    pub reason: String,
}

impl Refusal {
    /// The refusal of `e` (a rejection named by kind and reason), for
    /// the transaction op `op` if any.
    pub fn of(e: &Error, op: Option<u32>) -> Refusal {
        match e {
            Error::Invalid { what, reason } => Refusal {
                op,
                what,
                reason: reason.clone(),
            },
            Error::Aborted { index, cause } => {
                Refusal::of(cause, Some(u32::try_from(*index).unwrap_or(u32::MAX)))
            }
            other => Refusal {
                op,
                what: "argument",
                reason: other.to_string(),
            },
        }
    }

    /// The engine's name for what an error concerns, as bytes from the
    /// log or a peer carry it (the engine's errors name it with static
    /// strings); one it does not use reads as "argument".
    pub fn what_of(b: &[u8]) -> &'static str {
        [
            "token",
            "stream name",
            "owner",
            "ttl",
            "payload bytes",
            "records per append",
            "payloads",
            "entry bytes",
            "streams",
            "transaction",
            "limits",
            "mode",
        ]
        .into_iter()
        .find(|w| w.as_bytes() == b)
        .unwrap_or("argument")
    }

    /// The answer every replica gives.
    pub fn error(&self) -> Error {
        let e = Error::invalid(self.what, self.reason.clone());
        match self.op {
            Some(index) => Error::Aborted {
                index: index as usize,
                cause: Box::new(e),
            },
            None => e,
        }
    }
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

/// The limits a group decides with. In cluster mode they are part of the
/// replicated state (set by an entry, kept in checkpoints and snapshots),
/// never a node's own flags: a rolling change of one node's flags must not
/// make it accept what another refuses.
///
/// ```text
/// // GroupLimits (40 B): { max_payload_bytes: u32 | max_records_per_append: u32 | lease_ttl_min_ms: u64 |
/// //                       lease_ttl_max_ms: u64 | max_live_leases: u64 | max_streams: u64 }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLimits {
    /// Largest payload of one record, in bytes.
    pub max_payload_bytes: u32,
    /// Most records in one append.
    pub max_records_per_append: u32,
    /// Shortest lease ttl, in ms.
    pub lease_ttl_min_ms: u64,
    /// Longest lease ttl, in ms.
    pub lease_ttl_max_ms: u64,
    /// Most leases alive at once.
    pub max_live_leases: u64,
    /// Most streams.
    pub max_streams: u64,
}

impl Default for GroupLimits {
    /// The engine's defaults ([`Options::default`](crate::Options)).
    fn default() -> Self {
        GroupLimits::from_options(&crate::Options::default())
    }
}

impl GroupLimits {
    /// Bytes of the encoded form.
    pub(crate) const ENCODED: usize = 40;

    /// The limits a node's options name (what a group is formed with).
    pub fn from_options(o: &crate::Options) -> GroupLimits {
        GroupLimits {
            max_payload_bytes: o.max_payload_bytes,
            max_records_per_append: o.max_records_per_append,
            lease_ttl_min_ms: o.lease_ttl_min.as_millis() as u64,
            lease_ttl_max_ms: o.lease_ttl_max.as_millis() as u64,
            max_live_leases: o.max_live_leases,
            max_streams: o.max_streams,
        }
    }

    /// Whether these limits can be decided with: a refusal (the same on
    /// every replica) names the first that cannot.
    pub fn check(&self) -> Result<()> {
        let bad = |what: &'static str, reason: String| Err(Error::invalid(what, reason));
        if self.max_payload_bytes == 0 || self.max_records_per_append == 0 {
            return bad(
                "limits",
                "payload and records per append must be at least 1".into(),
            );
        }
        if self.lease_ttl_min_ms == 0 || self.lease_ttl_min_ms > self.lease_ttl_max_ms {
            return bad(
                "limits",
                format!(
                    "the ttl range {}..={} ms is empty or starts at 0",
                    self.lease_ttl_min_ms, self.lease_ttl_max_ms
                ),
            );
        }
        if self.max_live_leases == 0 || self.max_streams == 0 || self.max_streams > 12_000_000 {
            return bad(
                "limits",
                format!(
                    "live leases {} and streams {} must be at least 1 (streams at most 12 000 000)",
                    self.max_live_leases, self.max_streams
                ),
            );
        }
        Ok(())
    }

    pub(crate) fn encode(&self) -> [u8; Self::ENCODED] {
        let mut b = [0u8; Self::ENCODED];
        b[0..4].copy_from_slice(&self.max_payload_bytes.to_le_bytes());
        b[4..8].copy_from_slice(&self.max_records_per_append.to_le_bytes());
        b[8..16].copy_from_slice(&self.lease_ttl_min_ms.to_le_bytes());
        b[16..24].copy_from_slice(&self.lease_ttl_max_ms.to_le_bytes());
        b[24..32].copy_from_slice(&self.max_live_leases.to_le_bytes());
        b[32..40].copy_from_slice(&self.max_streams.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> std::result::Result<GroupLimits, String> {
        if b.len() != Self::ENCODED {
            return Err(format!(
                "limits of {} bytes (not {})",
                b.len(),
                Self::ENCODED
            ));
        }
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        Ok(GroupLimits {
            max_payload_bytes: u32_at(0),
            max_records_per_append: u32_at(4),
            lease_ttl_min_ms: u64_at(8),
            lease_ttl_max_ms: u64_at(16),
            max_live_leases: u64_at(24),
            max_streams: u64_at(32),
        })
    }
}

/// The state machine's clock: the group's, carried by the entries. It
/// never moves back: an entry stamped below it leaves it where it is.
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

/// Digests kept for comparison with the leader's (see [`Command::Check`]):
/// the last this many replicated entries applied.
const DIGESTS_KEPT: usize = 4096;

/// Folds `bytes`, an entry this replica wrote while applying a replicated
/// entry, into the running digest. Two replicas that decided alike wrote
/// the same bytes, so their digests agree at every position; one differing
/// decision makes every later digest differ. (Not cryptographic: it
/// detects divergence, it does not resist an adversary.)
pub(crate) fn fold(digest: u64, bytes: &[u8]) -> u64 {
    let lo = digest as u32;
    let hi = (digest >> 32) as u32;
    let mut a = crc32fast::Hasher::new_with_initial(lo);
    a.update(bytes);
    let lo = a.finalize();
    let mut b = crc32fast::Hasher::new_with_initial(hi ^ 0x9e37_79b9);
    b.update(bytes);
    b.update(&lo.to_le_bytes());
    (u64::from(b.finalize()) << 32) | u64::from(lo)
}

/// What the serialized section keeps of replication.
pub(crate) struct ReplState {
    pub clock: Arc<ReplicatedClock>,
    /// The last replicated entry applied (in memory; its entry may not be
    /// on disk yet).
    pub applied: Option<LogPosition>,
    pub membership: Bytes,
    /// The limits the group decides with.
    pub limits: GroupLimits,
    /// The running digest of every entry written for replicated entries.
    pub digest: u64,
    /// The digest after each of the last [`DIGESTS_KEPT`] positions.
    digests: std::collections::VecDeque<(u64, u64)>,
}

impl ReplState {
    pub(crate) fn new(clock: Arc<ReplicatedClock>) -> ReplState {
        ReplState {
            clock,
            applied: None,
            membership: Bytes::new(),
            limits: GroupLimits::default(),
            digest: 0,
            digests: std::collections::VecDeque::new(),
        }
    }

    /// Moves to entry `at`, stamped `time_ms` by its leader: the clock
    /// moves to the entry's time unless it is there already (it never goes
    /// back). An entry stamped 0 carries no time.
    pub(crate) fn enter(&mut self, at: LogPosition, time_ms: u64) {
        if time_ms != 0 {
            self.clock.set(time_ms);
        }
        if let Some(a) = self.applied {
            // Raft applies in order, once: a position moving back is a bug
            // in the layer above, and would apply an entry twice.
            debug_assert!(at.index >= a.index, "applied {a:?}, then {at:?}");
        }
        if self.applied.is_none_or(|a| at.index >= a.index) {
            self.applied = Some(at);
        }
    }

    /// Records the digest after position `index`.
    pub(crate) fn keep_digest(&mut self, index: u64) {
        // One position may write several entries (a renewal and a fence):
        // the digest after the last is the position's.
        if let Some(last) = self.digests.back_mut()
            && last.0 == index
        {
            last.1 = self.digest;
            return;
        }
        if self.digests.len() == DIGESTS_KEPT {
            self.digests.pop_front();
        }
        self.digests.push_back((index, self.digest));
    }

    /// The digest after position `index`, if it is among those kept.
    pub(crate) fn digest_at(&self, index: u64) -> Option<u64> {
        let i = self.digests.partition_point(|(at, _)| *at < index);
        self.digests
            .get(i)
            .filter(|(at, _)| *at == index)
            .map(|(_, d)| *d)
    }

    pub(crate) fn record(&self) -> ReplRecord {
        let a = self.applied.unwrap_or_default();
        ReplRecord {
            term: a.term,
            node: a.node,
            index: a.index,
            clock_ms: self.clock.now_ms(),
            digest: self.digest,
            limits: self.limits,
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
        self.membership = Bytes::from(r.membership);
        self.limits = r.limits;
        self.digest = r.digest;
        self.digests.clear();
    }
}

/// Appends an op entry, wrapped as a Replicated entry when the engine is
/// applying one: every write path goes through here. A wrapped entry is
/// folded into the replica's digest.
pub(crate) fn write_op(
    w: &mut Writer<'_, Core>,
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> std::result::Result<Appended, WalError> {
    match w.state().wrap {
        None => w.append(len, fill),
        Some(header) => {
            let before = w.state().repl.as_ref().map_or(0, |r| r.digest);
            let mut after = before;
            let at = w.append(op::REPLICATED_HEADER + len, |buf| {
                let (h, rest) = buf.split_at_mut(op::REPLICATED_HEADER);
                h.copy_from_slice(&header);
                fill(rest);
                after = fold(before, buf);
            })?;
            if let Some(r) = w.state().repl.as_mut() {
                r.digest = after;
            }
            Ok(at)
        }
    }
}

/// Appends the entry of a replicated entry that changed nothing but the
/// position (a blank, a tick, a refusal), folded into the digest.
pub(crate) fn write_position(
    w: &mut Writer<'_, Core>,
    header: &[u8; op::REPLICATED_HEADER],
) -> std::result::Result<Appended, WalError> {
    let at = w.append(op::REPLICATED_HEADER, |b| b.copy_from_slice(header))?;
    if let Some(r) = w.state().repl.as_mut() {
        r.digest = fold(r.digest, header);
    }
    Ok(at)
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
    /// entry. A command may be given owned or borrowed (`&Command`, a
    /// `Cow`), or as a [`Proposal`](crate::Proposal) read from its entry's
    /// bytes ([`Proposal::read_each`](crate::Proposal::read_each), which
    /// reads appends in place): a replica applies entries it holds shared
    /// without copying or decoding their appends.
    pub async fn apply_replicated_many<C: crate::Proposed + Sync>(
        &self,
        entries: &[(LogPosition, u64, C)],
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

    /// The group's clock as this replica applied it (ms): the highest time
    /// an applied entry carried. 0 on a single node.
    pub fn group_clock_ms(&self) -> u64 {
        self.inner()
            .wal
            .with_state(|c| c.repl.as_ref().map_or(0, |r| r.clock.now_ms()))
    }

    /// When the first live lease runs out on the group's clock (a lower
    /// bound: a lease renewed since may last longer), if any is live: a
    /// leader puts its clock in the log then, so the log knows the lease
    /// expired and no take-over revives it.
    pub fn next_lease_expiry_ms(&self) -> Option<u64> {
        self.inner().wal.with_state(|c| c.leases.earliest_expiry())
    }

    /// The limits the group decides with (cluster mode; on a single node,
    /// its options').
    pub fn group_limits(&self) -> GroupLimits {
        self.inner().wal.with_state(|c| {
            c.repl
                .as_ref()
                .map_or_else(|| GroupLimits::from_options(self.options()), |r| r.limits)
        })
    }

    /// The last replicated entry applied and this replica's digest after it
    /// (see [`Command::Check`]).
    pub fn digest(&self) -> (Option<LogPosition>, u64) {
        self.inner()
            .wal
            .with_state(|c| c.repl.as_ref().map_or((None, 0), |r| (r.applied, r.digest)))
    }

    /// This replica's digest after position `index`, if it still keeps it.
    pub fn digest_at(&self, index: u64) -> Option<u64> {
        self.inner()
            .wal
            .with_state(|c| c.repl.as_ref().and_then(|r| r.digest_at(index)))
    }

    /// The live lease on `name` as of `now_ms` on the group's clock (a
    /// leader's reading of it, at or above what it applied), without
    /// changing anything: a read must never decide an expiry the log has not.
    pub fn lease_info_at(
        &self,
        name: impl AsRef<[u8]>,
        now_ms: u64,
    ) -> Result<Option<crate::LeaseInfo>> {
        let name = name.as_ref();
        crate::token::check_stream_name(name)?;
        let lease = self.inner().wal.with_state(|c| {
            c.leases
                .peek(name)
                .filter(|l| l.expires_at_ms > now_ms)
                .map(|l| {
                    (
                        Bytes::copy_from_slice(&l.owner),
                        l.token,
                        l.expires_at_ms - now_ms,
                    )
                })
        });
        lease
            .map(|(owner, token, remaining_ms)| {
                Ok(crate::LeaseInfo {
                    owner,
                    token: Token::new(token)?,
                    remaining: std::time::Duration::from_millis(remaining_ms),
                })
            })
            .transpose()
    }
}
