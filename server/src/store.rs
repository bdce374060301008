//! The one interface commands run against: a [`Store`]. Two implement
//! it: a single node's [`fencelog::Log`] (below), and a replicated group
//! (`cluster/route.rs`: writes proposed through Raft, reads after a
//! ReadIndex round). A command parses its arguments, calls the store and
//! words the answer; it never knows which of the two it talks to.
//!
//! How an answer comes is the store's to say ([`Written`], [`Ticket`],
//! [`Barrier`]): a local write is decided now and answered once durable; a
//! replicated one is proposed now and answered once applied; a local read
//! is answered now, a replicated one once its round is done. The
//! connection keeps every answer in request order.

use std::time::Duration;

use bytes::Bytes;
use fencelog::{AcquireOptions, Error, LeaseInfo, Log, Token, TxOp};

use crate::outcome::error_reply;
pub use crate::outcome::{BoxFuture, Later};
use crate::protocol::{ArgRef, Reply};

/// An answer to come, or why there is none.
pub type Pending<T> = BoxFuture<'static, Result<T, Failure>>;

/// Why a command did not get its answer.
#[derive(Debug)]
pub enum Failure {
    /// The engine decided against it (STALE, MISMATCH, HELD, an I/O
    /// failure, …): worded by `outcome::error_reply`.
    Refused(Error),
    /// It was not decided here: the reply says where to go or what is
    /// known (`MOVED`, `TRYAGAIN`, `UNCERTAIN`, `CLUSTERDOWN`).
    Elsewhere(Reply),
}

impl Failure {
    /// Its reply (a refusal worded as the engine's errors are).
    pub fn into_reply(self) -> Reply {
        match self {
            Failure::Refused(e) => error_reply(&e),
            Failure::Elsewhere(reply) => reply,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure::Refused(e)
    }
}

/// A write the store took: its answer comes later, in the caller's order.
pub enum Written {
    /// Decided here; answered once durable.
    Durable(Later),
    /// Proposed; answered once applied.
    Applied(Pending<u64>),
}

/// How a command other than a stream write is answered.
pub enum Ticket<T> {
    /// Now.
    Ready(Result<T, Failure>),
    /// Later, in the connection's order (taken in that order now).
    InOrder(Pending<T>),
    /// When polled, and it may wait long (`WAIT`): the connection runs it
    /// while it watches the client, so a client that leaves takes nothing.
    Waits(Pending<T>),
}

/// When a read may look at the engine.
pub enum Barrier {
    /// Now: the engine's state is the truth.
    Now(Log),
    /// Once a round that confirms leadership is done (joined when the read
    /// arrived: pipelined reads share one round); answered in order.
    After(Pending<Log>),
}

/// A lease as this node's state shows it now (the `lease_expired` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Held under `token` for `remaining` more.
    Live { token: u64, remaining: Duration },
    /// Free, or held under another token.
    Free,
    /// This node cannot tell (it does not lead the group now).
    Unknown,
}

impl LeaseState {
    /// The state of a lease this node's engine shows (`None`: free).
    pub fn of(info: Option<LeaseInfo>) -> LeaseState {
        match info {
            Some(info) => LeaseState::Live {
                token: info.token.get(),
                remaining: info.remaining,
            },
            None => LeaseState::Free,
        }
    }
}

/// A lease granted: its token and ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub token: u64,
    pub ttl_ms: u64,
}

/// What a lease command asks.
#[derive(Debug, Clone)]
pub struct LeaseArgs {
    pub name: Bytes,
    pub owner: Bytes,
}

/// The operations every command needs, in either mode.
pub trait Store: Send + Sync {
    /// The engine whose state reads show (in a group, this replica's
    /// current one: a snapshot installed replaces it).
    fn log(&self) -> Log;

    /// Whether reads wait for a round and lease writes are proposed in
    /// order, so that both may pipeline (the connection's rule, `cmd::
    /// pipelining`).
    fn orders_rounds(&self) -> bool;

    /// A write's refusal known at once, without deciding it: a token below
    /// a highest that only grows. `None`: the write must be decided. A
    /// plain append is not asked again here: `LOG.APPEND` met
    /// [`Store::append_now`] before it was built into an op.
    fn refuse_now(&self, op: &TxOp) -> Option<Error>;

    /// An append still in its arguments, before any op is built from it
    /// (no copy of its payloads, no future): `Some(Err)` refused at once
    /// (a stale token, the most frequent refusal there is, as
    /// [`Store::refuse_now`] would); `Some(Ok)` taken now, answered once
    /// durable (a single node with room in its batch decides it here);
    /// `None` when it must go the way of every write, built into an op
    /// and given to [`Store::write`] (which also reports any other error
    /// it has).
    fn append_now(
        &self,
        stream: &[u8],
        token: Token,
        payloads: &[ArgRef<'_>],
    ) -> Option<Result<Later, Error>>;

    /// Takes a write now, in the caller's order.
    fn write(&self, op: TxOp) -> BoxFuture<'_, Result<Written, Failure>>;

    /// Whether a connection proposes its pipelined writes together
    /// ([`Store::write_together`]) instead of one by one ([`Store::write`]):
    /// a group's leader answers a write once its entry is applied, and
    /// writes that travel together cost one queue item and one answer.
    fn batches_writes(&self) -> bool {
        false
    }

    /// Writes a connection sent one after the other, taken now in that
    /// order, each answered on its own once all are answered (a write that
    /// fails fails alone). What [`Store::write`] does for each, with one
    /// future for all.
    fn write_together(&self, ops: Vec<TxOp>) -> BoxFuture<'static, Vec<Result<u64, Failure>>>;

    /// A transaction's writes as one entry, all or none; a rejection is
    /// `Error::Aborted` naming the op.
    fn transact(&self, ops: Vec<TxOp>) -> BoxFuture<'_, Result<Vec<u64>, Failure>>;

    /// When a read of `key` may look at the engine, decided now (a
    /// round is joined as the read arrives). Answered without a future: a
    /// read costs no allocation where no round is needed. The key is
    /// shared, not copied: a read kept for its round keeps it to say where
    /// the key lives should the round find another leader.
    fn read(&self, key: &Bytes) -> Result<Barrier, Failure>;

    /// A round joined now for the pipelined reads of one connection that
    /// have arrived (see `read_round.rs`): the engine they may read once
    /// it is done, or `None` if it failed. `None` here: no round for the
    /// connection (a single node, whose reads look at the engine at once,
    /// or a node that does not serve). Either way each read then goes
    /// through [`Store::read`] and answers its own way. `reads`: about how
    /// many reads will wait for it (the rule for a second round beside
    /// the first counts them).
    fn read_round(&self, _reads: usize) -> Option<BoxFuture<'static, Option<Log>>> {
        None
    }

    /// `LEASE.ACQUIRE`.
    fn acquire(
        &self,
        lease: LeaseArgs,
        ttl: Duration,
        opts: AcquireOptions,
    ) -> BoxFuture<'_, Ticket<Granted>>;

    /// `LEASE.RENEW`: the new ttl in ms.
    fn renew(&self, lease: LeaseArgs, token: Token, ttl_ms: u64) -> BoxFuture<'_, Ticket<u64>>;

    /// `LEASE.RELEASE`: whether it released.
    fn release(&self, lease: LeaseArgs, token: Token) -> BoxFuture<'_, Ticket<bool>>;

    /// `LEASE.INFO`.
    fn lease_info(&self, name: Bytes) -> Ticket<Option<LeaseInfo>>;

    /// A lease as this node's state shows it now.
    fn lease_state(&self, name: &[u8]) -> LeaseState;

    /// `CLUSTER …` (`args` after the name).
    fn cluster(&self, args: &[Bytes]) -> BoxFuture<'_, Reply>;

    /// `READONLY`, `READWRITE`, `ASKING` without arguments.
    fn cluster_client(&self) -> Reply;

    /// The writes waiting in a group leader's proposal queue (`None` on a
    /// single node: it has no such queue).
    fn queued(&self) -> Option<fencelog_cluster::Queued> {
        None
    }

    /// Where a replicated write's time went on this node (`None` on a
    /// single node: nothing is replicated).
    fn timings(&self) -> Option<fencelog_cluster::Steps> {
        None
    }
}

/// The answer of a node without cluster support, in Redis' words.
pub const CLUSTER_DISABLED: &str = "ERR This instance has cluster support disabled";

/// A single node: the engine decides, and its state is the truth.
impl Store for Log {
    fn log(&self) -> Log {
        self.clone()
    }

    fn orders_rounds(&self) -> bool {
        false
    }

    fn refuse_now(&self, _op: &TxOp) -> Option<Error> {
        // A stale append was refused from its arguments (`append_now`);
        // every other write meets the same check in its decision, in the
        // serialized section, at no extra cost.
        None
    }

    fn append_now(
        &self,
        stream: &[u8],
        token: Token,
        payloads: &[ArgRef<'_>],
    ) -> Option<Result<Later, Error>> {
        match Log::append_now(self, stream, token, payloads) {
            Ok(Some(answer)) => Some(Ok(Later(answer))),
            // A full batch: the write waits for room, as an op.
            Ok(None) => None,
            Err(e @ Error::Stale { .. }) => Some(Err(e)),
            // Any other error is the write's to report, as for every op.
            Err(_) => None,
        }
    }

    fn write(&self, op: TxOp) -> BoxFuture<'_, Result<Written, Failure>> {
        Box::pin(async move { Ok(Written::Durable(Later(self.write_deferred(op).await?))) })
    }

    fn transact(&self, ops: Vec<TxOp>) -> BoxFuture<'_, Result<Vec<u64>, Failure>> {
        Box::pin(async move { Ok(self.transact_deferred(ops).await?.await?) })
    }

    fn write_together(&self, ops: Vec<TxOp>) -> BoxFuture<'static, Vec<Result<u64, Failure>>> {
        // Decided in order, then each waits for its sync (one group
        // commit takes most of them).
        let log = self.clone();
        Box::pin(async move {
            let mut decided = Vec::with_capacity(ops.len());
            for op in ops {
                decided.push(log.write_deferred(op).await);
            }
            let mut answers = Vec::with_capacity(decided.len());
            for d in decided {
                answers.push(match d {
                    Ok(durable) => Later(durable).result().await.map_err(Failure::from),
                    Err(e) => Err(Failure::from(e)),
                });
            }
            answers
        })
    }

    fn read(&self, _key: &Bytes) -> Result<Barrier, Failure> {
        Ok(Barrier::Now(self.clone()))
    }

    fn acquire(
        &self,
        lease: LeaseArgs,
        ttl: Duration,
        opts: AcquireOptions,
    ) -> BoxFuture<'_, Ticket<Granted>> {
        // Decided when the connection polls it: the connection watches the
        // client while it waits, and dropping it takes nothing.
        let log = self.clone();
        Box::pin(std::future::ready(Ticket::Waits(Box::pin(async move {
            let g = log
                .acquire_async(&lease.name, &lease.owner, ttl, opts)
                .await?;
            Ok(Granted {
                token: g.token.get(),
                ttl_ms: g.ttl.as_millis() as u64,
            })
        }))))
    }

    fn renew(&self, lease: LeaseArgs, token: Token, ttl_ms: u64) -> BoxFuture<'_, Ticket<u64>> {
        Box::pin(async move {
            let ttl = Duration::from_millis(ttl_ms);
            let renewed = self
                .renew_async(&lease.name, &lease.owner, token, ttl)
                .await;
            Ticket::Ready(
                renewed
                    .map(|ttl| ttl.as_millis() as u64)
                    .map_err(Failure::from),
            )
        })
    }

    fn release(&self, lease: LeaseArgs, token: Token) -> BoxFuture<'_, Ticket<bool>> {
        Box::pin(async move {
            let released = self.release_async(&lease.name, &lease.owner, token).await;
            Ticket::Ready(released.map_err(Failure::from))
        })
    }

    fn lease_info(&self, name: Bytes) -> Ticket<Option<LeaseInfo>> {
        Ticket::Ready(Log::lease_info(self, &name).map_err(Failure::from))
    }

    fn lease_state(&self, name: &[u8]) -> LeaseState {
        LeaseState::of(Log::lease_info(self, name).ok().flatten())
    }

    fn cluster(&self, _args: &[Bytes]) -> BoxFuture<'_, Reply> {
        Box::pin(std::future::ready(Reply::Error(CLUSTER_DISABLED.into())))
    }

    fn cluster_client(&self) -> Reply {
        Reply::Error(CLUSTER_DISABLED.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn append(stream: &str, token: u64) -> TxOp {
        TxOp::Append {
            stream: Bytes::copy_from_slice(stream.as_bytes()),
            token: Token::new(token).unwrap(),
            payloads: vec![Bytes::from_static(b"x")].into(),
        }
    }

    /// A single node's writes taken together are decided in order, each
    /// answered on its own: a stale one in the middle refuses alone.
    #[tokio::test]
    async fn writes_taken_together_are_decided_in_order_and_answered_each() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), fencelog::Options::default()).unwrap();
        let ops = vec![
            append("a", 5),
            append("b", 1),
            append("a", 4),
            append("a", 5),
        ];
        let answers = log.write_together(ops).await;
        assert_eq!(answers.len(), 4);
        assert!(matches!(answers[0], Ok(0)));
        assert!(matches!(answers[1], Ok(0)));
        assert!(
            matches!(
                &answers[2],
                Err(Failure::Refused(Error::Stale {
                    presented: 4,
                    highest: 5
                }))
            ),
            "{:?}",
            answers[2]
        );
        assert!(matches!(answers[3], Ok(1)));
        assert_eq!(log.stat(b"a").unwrap().next_offset, 2);
    }
}
