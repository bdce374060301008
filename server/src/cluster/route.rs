//! The replicated group as a [`Store`]: what the commands run against in
//! cluster mode.
//!
//! - Writes (`LOG.APPEND`, …, and `EXEC`'s entry) are proposed to Raft in
//!   the order a connection sends them and answered once a majority holds
//!   them and the leader applied them; a connection's pipelined writes
//!   share rounds of replication.
//! - Lease commands go through the log too (the decision is the state
//!   machine's, on every replica alike, with the entry's time).
//!   `LEASE.INFO` is a read: after a ReadIndex, the lease as the leader's
//!   applied state holds it, its time left on the group's clock as the
//!   leader carries it on (never a write). A waiting `LEASE.ACQUIRE` asks
//!   again when a release or the leader's tick frees a lease, or when the
//!   holder's time runs out, not on a timer.
//! - Reads (`LOG.READ`, `LOG.STAT`, `LOG.STREAMS`, `DBSIZE`) first confirm
//!   leadership with a quorum (Raft's ReadIndex, a round joined when the
//!   read arrives, so pipelined reads share it): a deposed leader never
//!   answers a read that misses a committed write.
//!
//! A node that is not the leader answers `-MOVED slot host:port` (the
//! leader's client address) when it knows the leader, `-TRYAGAIN` while an
//! election runs. A write whose fate cannot be known (the node stopped
//! leading with it in flight) answers `-UNCERTAIN`: cluster clients do not
//! retry it blindly, since an append retried could land twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencelog::{AcquireOptions, Command, Error, LeaseInfo, Log, Token, TxOp};
use fencelog_cluster::{ClusterError, NodeId, Proposal, Response, WireError};

use super::Cluster;
use super::slots::key_slot;
use crate::protocol::{ArgRef, Reply};
use crate::store::{
    Barrier, BoxFuture, Failure, Granted, Later, LeaseArgs, LeaseState, Pending, Store, Ticket,
    Written,
};

/// How long a proposed write may wait for its answer: longer means the
/// node is cut off from its quorum, and the client is told the outcome is
/// unknown rather than kept waiting.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A write still waiting in the leader's queue this long after it was
/// sent is dropped there, never proposed, and its client told so for
/// certain: before [`WRITE_TIMEOUT`], so that an answer of "unknown"
/// is given only for a write that really went out.
const QUEUE_DEADLINE: Duration = Duration::from_millis(9_500);

/// This node's replica of the group, as commands see it.
pub struct Group {
    cluster: Arc<Cluster>,
}

impl Group {
    /// `token` below the highest this replica applied to `stream`: refused
    /// now and by every later decision (the highest only grows).
    fn stale(&self, stream: &[u8], token: Token) -> Option<Error> {
        let highest = self.cluster.log().highest_token(stream).ok()?;
        (token.get() < highest).then_some(Error::Stale {
            presented: token.get(),
            highest,
        })
    }

    /// The store of `cluster`.
    pub fn new(cluster: Arc<Cluster>) -> Group {
        Group { cluster }
    }
}

/// Where to send the client, or why its command failed.
pub(crate) fn redirect(c: &Cluster, key: &[u8], e: &ClusterError) -> Reply {
    redirect_from(c.config().node_id, key, e)
}

/// [`redirect`] from the node `me`.
fn redirect_from(me: NodeId, key: &[u8], e: &ClusterError) -> Reply {
    match e {
        ClusterError::NotLeader {
            leader: Some((id, m)),
        } if *id != me => Reply::Error(format!("MOVED {} {}", key_slot(key), m.client_addr)),
        ClusterError::NotLeader { .. } => {
            Reply::Error("TRYAGAIN no leader yet: an election is in progress".into())
        }
        ClusterError::Uncertain(why) => Reply::Error(format!(
            "UNCERTAIN the write may or may not have been applied ({why}); read before \
             retrying, or retry with LOG.APPENDAT"
        )),
        ClusterError::TooLarge { len, max } => Reply::Error(format!(
            "TOOBIG a request of {len} bytes is over the limit of {max} for one replicated entry"
        )),
        ClusterError::Busy { .. } | ClusterError::Dropped => Reply::Error(format!("TRYAGAIN {e}")),
        other => Reply::Error(format!("CLUSTERDOWN {other}")),
    }
}

/// A command that failed here, as a [`Failure`].
fn elsewhere(c: &Cluster, key: &[u8], e: &ClusterError) -> Failure {
    Failure::Elsewhere(redirect(c, key, e))
}

/// An applied entry's answer as the type the command expects: `want`
/// picks it; a rejection is the engine's error; any other answer is
/// worded as it is (none is expected).
fn expect<T>(r: Response, want: impl FnOnce(&Response) -> Option<T>) -> Result<T, Failure> {
    if let Some(t) = want(&r) {
        return Ok(t);
    }
    let int = crate::outcome::number;
    Err(Failure::Elsewhere(match r {
        Response::Rejected(e) => return Err(Failure::Refused(e.to_engine())),
        Response::Value(v) => int(v),
        Response::Values(v) => Reply::Array(v.into_iter().map(int).collect()),
        Response::Grant { token, ttl_ms } => Reply::Array(vec![int(token), int(ttl_ms)]),
        Response::Released(r) => Reply::Integer(i64::from(r)),
        Response::Done => Reply::ok(),
    }))
}

/// The answer of a write or a renewal: a number.
fn value(r: Response) -> Result<u64, Failure> {
    expect(r, |r| match r {
        Response::Value(v) => Some(*v),
        _ => None,
    })
}

/// The answer of a transaction: a number per op.
fn values(r: Response) -> Result<Vec<u64>, Failure> {
    match r {
        Response::Values(v) => Ok(v),
        Response::Rejected(e) => Err(Failure::Refused(e.to_engine())),
        other => Err(Failure::Elsewhere(Reply::Error(format!(
            "ERR internal: a transaction answered {other:?}"
        )))),
    }
}

/// The answer of a release: whether it released.
fn released(r: Response) -> Result<bool, Failure> {
    expect(r, |r| match r {
        Response::Released(r) => Some(*r),
        _ => None,
    })
}

/// Waits for a proposal's outcome, at most [`WRITE_TIMEOUT`].
async fn settle(me: NodeId, proposal: Proposal) -> Result<Response, ClusterError> {
    match tokio::time::timeout(WRITE_TIMEOUT, proposal).await {
        Ok(r) => r,
        Err(_) => Err(unanswered(me)),
    }
}

/// A proposal's outcome on node `me` as the command's answer: `want`
/// takes an applied one, a failure says where to go for `key`.
fn settled<T>(
    me: NodeId,
    key: &[u8],
    outcome: Result<Response, ClusterError>,
    want: fn(Response) -> Result<T, Failure>,
) -> Result<T, Failure> {
    match outcome {
        Ok(r) => want(r),
        Err(e) => Err(Failure::Elsewhere(redirect_from(me, key, &e))),
    }
}

/// A proposal of node `me` that no quorum answered in [`WRITE_TIMEOUT`].
fn unanswered(me: NodeId) -> ClusterError {
    ClusterError::Uncertain(format!(
        "no quorum answered node {me} in {} s",
        WRITE_TIMEOUT.as_secs()
    ))
}

impl Group {
    /// Proposes `cmd` now (keeping the caller's order); the answer comes
    /// once applied, as `want` takes it.
    async fn propose<T: Send + 'static>(
        &self,
        key: Bytes,
        cmd: Command,
        want: fn(Response) -> Result<T, Failure>,
    ) -> Result<Pending<T>, Failure> {
        let c = &self.cluster;
        match c.node().propose_now(cmd, Instant::now() + QUEUE_DEADLINE) {
            Ok(proposal) => {
                // The node's id, not the cluster (a count both connection
                // threads would write per write): all a failure's answer needs.
                let me = c.config().node_id;
                Ok(Box::pin(async move {
                    settled(me, &key, settle(me, proposal).await, want)
                }))
            }
            Err(e) => Err(elsewhere(c, &key, &e)),
        }
    }
}

/// A proposal's answer to come, or its failure now, as a ticket.
fn in_order<T>(proposed: Result<Pending<T>, Failure>) -> Ticket<T> {
    match proposed {
        Ok(answer) => Ticket::InOrder(answer),
        Err(f) => Ticket::Ready(Err(f)),
    }
}

impl Store for Group {
    fn log(&self) -> Log {
        self.cluster.log()
    }

    fn orders_rounds(&self) -> bool {
        true
    }

    /// A stream's highest token only grows, and what this replica applied
    /// is committed, so a token below it is rejected now and by every
    /// later decision (on any node, leader or not, deposed or not).
    /// `LOG.APPENDAT` is left to the log: its exact retry is answered with
    /// the original offset even after a newer token.
    fn refuse_now(&self, op: &TxOp) -> Option<Error> {
        match op {
            // Asked from its arguments already (`append_now`).
            TxOp::Append { .. } | TxOp::AppendAt { .. } => None,
            _ => self.stale(op.stream(), op.token()),
        }
    }

    fn append_now(
        &self,
        stream: &[u8],
        token: Token,
        _payloads: &[ArgRef<'_>],
    ) -> Option<Result<Later, Error>> {
        // Refused if stale; else proposed as every write is.
        self.stale(stream, token).map(Err)
    }

    fn write(&self, op: TxOp) -> BoxFuture<'_, Result<Written, Failure>> {
        Box::pin(async move {
            let key = op.stream().clone();
            let answer = self.propose(key, Command::Write(op), value).await?;
            Ok(Written::Applied(answer))
        })
    }

    fn batches_writes(&self) -> bool {
        true
    }

    fn write_together(&self, mut ops: Vec<TxOp>) -> BoxFuture<'static, Vec<Result<u64, Failure>>> {
        let c = &self.cluster;
        // A write alone (pipeline 1) goes as one: no list of parts.
        if ops.len() == 1
            && let Some(op) = ops.pop()
        {
            let key = op.stream().clone();
            let me = c.config().node_id;
            let proposed = c
                .node()
                .propose_now(Command::Write(op), Instant::now() + QUEUE_DEADLINE);
            return match proposed {
                Err(e) => Box::pin(std::future::ready(vec![Err(elsewhere(c, &key, &e))])),
                Ok(proposal) => {
                    Box::pin(
                        async move { vec![settled(me, &key, settle(me, proposal).await, value)] },
                    )
                }
            };
        }
        let keys: Vec<Bytes> = ops.iter().map(|op| op.stream().clone()).collect();
        let cmds = ops.into_iter().map(Command::Write).collect();
        let me = c.config().node_id;
        match c.node().propose_many(cmds, Instant::now() + QUEUE_DEADLINE) {
            // Each write's key names its own slot in a redirect.
            Err(e) => {
                let answers = keys.iter().map(|k| Err(elsewhere(c, k, &e))).collect();
                Box::pin(std::future::ready(answers))
            }
            Ok(proposals) => Box::pin(async move {
                let answers = match tokio::time::timeout(WRITE_TIMEOUT, proposals.answers()).await {
                    Ok(answers) => answers,
                    Err(_) => keys.iter().map(|_| Err(unanswered(me))).collect(),
                };
                answers
                    .into_iter()
                    .zip(&keys)
                    .map(|(answer, key)| settled(me, key, answer, value))
                    .collect()
            }),
        }
    }

    fn transact(&self, ops: Vec<TxOp>) -> BoxFuture<'_, Result<Vec<u64>, Failure>> {
        Box::pin(async move {
            let key = ops
                .first()
                .map(|op| op.stream().clone())
                .unwrap_or_default();
            self.propose(key, Command::Transact(ops), values)
                .await?
                .await
        })
    }

    fn read(&self, key: &Bytes) -> Result<Barrier, Failure> {
        // Joined now, when the read arrives: pipelined reads share a round.
        let c = &self.cluster;
        let round = c.node().read_round(1).map_err(|e| elsewhere(c, key, &e))?;
        // The node's id, not the cluster (a count both connection threads
        // would write per read): all a failed round's answer needs.
        let (me, key) = (c.config().node_id, key.clone());
        Ok(Barrier::After(Box::pin(async move {
            round
                .await
                .map_err(|e| Failure::Elsewhere(redirect_from(me, &key, &e)))
        })))
    }

    fn read_round(&self, reads: usize) -> Option<BoxFuture<'static, Option<Log>>> {
        // Not serving: no round; each read answers where to go.
        let round = self.cluster.node().read_round(reads).ok()?;
        Some(Box::pin(async move { round.await.ok() }))
    }

    fn acquire(
        &self,
        lease: LeaseArgs,
        ttl: Duration,
        opts: AcquireOptions,
    ) -> BoxFuture<'_, Ticket<Granted>> {
        Box::pin(async move {
            let wire = Command::Acquire {
                name: lease.name.clone(),
                owner: lease.owner,
                ttl_ms: ttl.as_millis() as u64,
                fence: opts.fence,
            };
            // The first try is proposed now, in the connection's order:
            // pipelined acquisitions share entries like any write (one
            // entry each made a flood of them cost an fsync apiece).
            let c = Arc::clone(&self.cluster);
            let first = c
                .node()
                .propose(wire.clone(), Instant::now() + QUEUE_DEADLINE)
                .await;
            Ticket::InOrder(Box::pin(acquire_until(c, lease.name, wire, opts, first)))
        })
    }

    fn renew(&self, lease: LeaseArgs, token: Token, ttl_ms: u64) -> BoxFuture<'_, Ticket<u64>> {
        Box::pin(async move {
            let wire = Command::Renew {
                name: lease.name.clone(),
                owner: lease.owner,
                token,
                ttl_ms,
            };
            in_order(self.propose(lease.name, wire, value).await)
        })
    }

    fn release(&self, lease: LeaseArgs, token: Token) -> BoxFuture<'_, Ticket<bool>> {
        Box::pin(async move {
            let wire = Command::Release {
                name: lease.name.clone(),
                owner: lease.owner,
                token,
            };
            in_order(self.propose(lease.name, wire, released).await)
        })
    }

    /// A read. After a ReadIndex (this node leads and has applied every
    /// committed entry), the lease as applied here, its time left on the
    /// group's clock as this leader carries it on. Nothing is written and
    /// nothing changes: an expiry the log has not seen is only shown,
    /// never decided, here.
    fn lease_info(&self, name: Bytes) -> Ticket<Option<LeaseInfo>> {
        let c = Arc::clone(&self.cluster);
        Ticket::InOrder(Box::pin(async move {
            if let Err(e) = c.node().linearizable().await {
                return Err(elsewhere(&c, &name, &e));
            }
            let Some(now) = c.node().group_now_ms() else {
                let e = ClusterError::NotLeader { leader: None };
                return Err(elsewhere(&c, &name, &e));
            };
            Ok(c.log().lease_info_at(&name, now)?)
        }))
    }

    fn lease_state(&self, name: &[u8]) -> LeaseState {
        let Some(now) = self.cluster.node().group_now_ms() else {
            return LeaseState::Unknown;
        };
        match self.cluster.log().lease_info_at(name, now) {
            Ok(info) => LeaseState::of(info),
            Err(_) => LeaseState::Unknown,
        }
    }

    fn cluster(&self, args: &[Bytes]) -> BoxFuture<'_, Reply> {
        let args = args.to_vec();
        Box::pin(async move { super::slots::cluster(&self.cluster, &args).await })
    }

    /// Cluster clients send these; reads always go to the leader here.
    fn cluster_client(&self) -> Reply {
        Reply::ok()
    }

    fn queued(&self) -> Option<fencelog_cluster::Queued> {
        Some(self.cluster.node().queued())
    }

    fn timings(&self) -> Option<fencelog_cluster::Steps> {
        Some(self.cluster.node().timings())
    }
}

/// `LEASE.ACQUIRE` in a group: the first try as proposed; with `WAIT`,
/// tried again while the lease is held, until the wait runs out.
async fn acquire_until(
    c: Arc<Cluster>,
    name: Bytes,
    wire: Command,
    opts: AcquireOptions,
    first: Result<Proposal, ClusterError>,
) -> Result<Granted, Failure> {
    let deadline = opts.wait.and_then(|w| Instant::now().checked_add(w));
    let waits = opts.wait.is_some();
    let mut next = Some(first);
    loop {
        let outcome = match next.take() {
            Some(Ok(proposal)) => settle(c.config().node_id, proposal).await,
            Some(Err(e)) => Err(e),
            None => match c
                .node()
                .propose(wire.clone(), Instant::now() + QUEUE_DEADLINE)
                .await
            {
                Ok(proposal) => settle(c.config().node_id, proposal).await,
                Err(e) => Err(e),
            },
        };
        match outcome {
            Ok(Response::Rejected(WireError::Held { remaining_ms }))
                if waits && deadline.is_none_or(|d| Instant::now() < d) =>
            {
                // Asked again when a release or the leader's tick frees
                // a lease here, or once the holder's time has run out:
                // one write per change, not one per waiter every few ms.
                let mut pause = Duration::from_millis(remaining_ms.max(1));
                if let Some(d) = deadline {
                    pause = pause.min(d.saturating_duration_since(Instant::now()));
                }
                c.log().lease_freed(pause).await;
            }
            Ok(r) => {
                return expect(r, |r| match r {
                    Response::Grant { token, ttl_ms } => Some(Granted {
                        token: *token,
                        ttl_ms: *ttl_ms,
                    }),
                    _ => None,
                });
            }
            Err(e) => return Err(elsewhere(&c, &name, &e)),
        }
    }
}
