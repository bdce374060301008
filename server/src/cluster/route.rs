//! Data commands in cluster mode.
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
//!   leadership with a quorum (Raft's ReadIndex): a deposed leader never
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
use fencelog::{Error, TxOp};
use fencelog_cluster::{ClusterError, Response, WireCommand, WireTxOp};

use super::Cluster;
use super::slots::key_slot;
use crate::commands::{self, Blocking, ClientTag, Context, Outcome};
use crate::connection::Session;
use crate::protocol::Reply;

/// A write's answer to come.
pub type ReplyFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

/// How long a proposed write may wait for its answer: longer means the
/// node is cut off from its quorum, and the client is told the outcome is
/// unknown rather than kept waiting.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A write still waiting in the leader's queue this long after it was
/// sent is dropped there, never proposed, and its client told so for
/// certain: before [`WRITE_TIMEOUT`], so that an answer of "unknown"
/// is given only for a write that really went out.
const QUEUE_DEADLINE: Duration = Duration::from_millis(9_500);

/// Runs `cmd` if cluster mode answers it differently (`None`: the
/// standalone handler runs, against the cluster's engine).
pub(crate) async fn run(
    ctx: &Arc<Context>,
    c: &Arc<Cluster>,
    session: &mut Session,
    cmd: &str,
    args: &[Bytes],
) -> Option<Outcome> {
    let a = &args[1..];
    if let Some(parsed) = commands::parse_write(cmd, a) {
        return Some(match parsed {
            Ok(op) => {
                let key = commands::op_stream(&op).clone();
                if let Some(stale) = stale_now(ctx, c, session, &op) {
                    return Some(stale);
                }
                propose(ctx, c, session.tag(), key, WireCommand::from_op(&op)).await
            }
            Err(reply) => Outcome::Reply(reply),
        });
    }
    match cmd {
        "LEASE.ACQUIRE" => Some(acquire(ctx, c, session, cmd, a).await),
        "LEASE.RENEW" | "LEASE.RELEASE" => Some(renew_or_release(ctx, c, session, cmd, a).await),
        "LEASE.INFO" => {
            if a.len() != 1 {
                return Some(commands::wrong_arity(cmd));
            }
            Some(lease_info(c, a[0].clone()))
        }
        _ if commands::READS.contains(&cmd) => read(ctx, c, session, args).await,
        "CLUSTER" => Some(Outcome::Reply(super::slots::cluster(c, a).await)),
        // Cluster clients send these; reads always go to the leader here.
        "READONLY" | "READWRITE" | "ASKING" if a.is_empty() => Some(Outcome::Reply(Reply::ok())),
        _ => None,
    }
}

/// A read (`LOG.READ`, `LOG.STAT`, `LOG.STREAMS`, `DBSIZE`) after a
/// ReadIndex round that starts now. A read that may wait (`BLOCK`) waits
/// for its round here, then runs as on one node (`None`); any other is
/// answered later, in the connection's order, so a connection's pipelined
/// reads share one round instead of a round trip apiece.
async fn read(
    ctx: &Arc<Context>,
    c: &Arc<Cluster>,
    session: &Session,
    args: &[Bytes],
) -> Option<Outcome> {
    let key = args.get(1).cloned().unwrap_or_default();
    let round = c.node().read_round();
    if commands::pipelining(session, args, true) != commands::Pipelining::Read {
        return match round.await {
            Ok(()) => None,
            Err(e) => Some(Outcome::Reply(redirect(c, &key, &e))),
        };
    }
    let (ctx, c, args) = (Arc::clone(ctx), Arc::clone(c), args.to_vec());
    Some(Outcome::Replicated(Box::pin(async move {
        if let Err(e) = round.await {
            return redirect(&c, &key, &e);
        }
        let name = commands::upper(&args[0]);
        let engine = ctx.engine();
        match commands::stream_read(&ctx, &engine, name.as_str(), &args[1..]) {
            Some(Outcome::Reply(reply)) => reply,
            Some(Outcome::Blocking(read)) => read.run(engine.into_owned()).await,
            // Every read answers one of those two ways.
            _ => Reply::Error(format!(
                "ERR internal: {} did not answer as a read",
                name.as_str()
            )),
        }
    })))
}

/// A stale write answered without the log: a stream's highest token only
/// grows, and what this replica applied is committed, so a token below it
/// is rejected now and by every later decision (on any node, leader or
/// not, deposed or not). `LOG.APPENDAT` is left to the log: its exact
/// retry is answered with the original offset even after a newer token.
fn stale_now(ctx: &Context, c: &Cluster, session: &Session, op: &TxOp) -> Option<Outcome> {
    let (stream, token) = match op {
        TxOp::Append { stream, token, .. }
        | TxOp::Fence { stream, token }
        | TxOp::Trim { stream, token, .. }
        | TxOp::Delete { stream, token } => (stream, token.get()),
        _ => return None,
    };
    let highest = c.log().highest_token(stream).ok()?;
    if token >= highest {
        return None;
    }
    let e = Error::Stale {
        presented: token,
        highest,
    };
    commands::note_error(ctx, &session.tag(), stream, &e);
    Some(Outcome::Reply(commands::error_reply(&e)))
}

/// Where to send the client, or why its command failed.
pub(crate) fn redirect(c: &Cluster, key: &[u8], e: &ClusterError) -> Reply {
    match e {
        ClusterError::NotLeader {
            leader: Some((id, m)),
        } if *id != c.config().node_id => {
            Reply::Error(format!("MOVED {} {}", key_slot(key), m.client_addr))
        }
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

/// The answer of an applied entry, as the standalone server words it.
fn answer(ctx: &Context, client: &ClientTag, key: &[u8], r: Response) -> Reply {
    let int = |n: u64| Reply::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    match r {
        Response::Value(v) => int(v),
        Response::Values(v) => Reply::Array(v.into_iter().map(int).collect()),
        Response::Grant { token, ttl_ms } => Reply::Array(vec![int(token), int(ttl_ms)]),
        Response::Released(r) => Reply::Integer(i64::from(r)),
        Response::Done => Reply::ok(),
        Response::Rejected(e) => {
            let e = e.to_engine();
            commands::note_error(ctx, client, key, &e);
            commands::error_reply(&e)
        }
    }
}

/// Waits for a proposal's outcome, at most [`WRITE_TIMEOUT`].
async fn settle(
    c: &Cluster,
    proposal: fencelog_cluster::Proposal,
) -> Result<Response, ClusterError> {
    match tokio::time::timeout(WRITE_TIMEOUT, proposal).await {
        Ok(r) => r,
        Err(_) => Err(ClusterError::Uncertain(format!(
            "no quorum answered node {} in {} s",
            c.config().node_id,
            WRITE_TIMEOUT.as_secs()
        ))),
    }
}

/// Proposes a write now (keeping the connection's order) and answers it
/// once applied.
async fn propose(
    ctx: &Arc<Context>,
    c: &Arc<Cluster>,
    client: ClientTag,
    key: Bytes,
    cmd: WireCommand,
) -> Outcome {
    match c.node().propose(cmd, Instant::now() + QUEUE_DEADLINE).await {
        Ok(proposal) => {
            let (ctx, c) = (Arc::clone(ctx), Arc::clone(c));
            Outcome::Replicated(Box::pin(async move {
                match settle(&c, proposal).await {
                    Ok(r) => answer(&ctx, &client, &key, r),
                    Err(e) => redirect(&c, &key, &e),
                }
            }))
        }
        Err(e) => Outcome::Reply(redirect(c, &key, &e)),
    }
}

/// Proposes and waits (the lease commands, one at a time).
async fn write(c: &Cluster, cmd: WireCommand) -> Result<Response, ClusterError> {
    let proposal = c
        .node()
        .propose(cmd, Instant::now() + QUEUE_DEADLINE)
        .await?;
    settle(c, proposal).await
}

/// `LEASE.ACQUIRE`: parsed as on one node; with `WAIT`, tried again while
/// the lease is held, until the wait runs out.
async fn acquire(
    ctx: &Arc<Context>,
    c: &Arc<Cluster>,
    session: &Session,
    cmd: &str,
    a: &[Bytes],
) -> Outcome {
    let Outcome::Blocking(Blocking::Acquire {
        name,
        owner,
        ttl,
        opts,
        ..
    }) = commands::acquire(cmd, a, ctx, session)
    else {
        // A parse error: its answer.
        return commands::acquire(cmd, a, ctx, session);
    };
    let (ctx, c) = (Arc::clone(ctx), Arc::clone(c));
    let client = session.tag();
    let deadline = opts.wait.and_then(|w| Instant::now().checked_add(w));
    let waits = opts.wait.is_some();
    let wire = WireCommand::Acquire {
        name: name.to_vec(),
        owner: owner.to_vec(),
        ttl_ms: ttl.as_millis() as u64,
        fence: opts.fence,
    };
    // The first try is proposed now, in the connection's order: pipelined
    // acquisitions share entries like any write (one entry each made a
    // flood of them cost an fsync apiece).
    let first = c
        .node()
        .propose(wire.clone(), Instant::now() + QUEUE_DEADLINE)
        .await;
    Outcome::Replicated(Box::pin(async move {
        let mut next = Some(first);
        loop {
            let outcome = match next.take() {
                Some(Ok(proposal)) => settle(&c, proposal).await,
                Some(Err(e)) => Err(e),
                None => write(&c, wire.clone()).await,
            };
            match outcome {
                Ok(Response::Rejected(fencelog_cluster::WireError::Held { remaining_ms }))
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
                Ok(r) => return answer(&ctx, &client, &name, r),
                Err(e) => return redirect(&c, &name, &e),
            }
        }
    }))
}

/// `LEASE.RENEW name owner token ttl_ms` and `LEASE.RELEASE name owner
/// token`, through the log.
async fn renew_or_release(
    ctx: &Arc<Context>,
    c: &Arc<Cluster>,
    session: &Session,
    cmd: &str,
    a: &[Bytes],
) -> Outcome {
    let renew = cmd == "LEASE.RENEW";
    let wire = if renew {
        let (token, ttl_ms) = match commands::parse_renew(cmd, a) {
            Ok(parsed) => parsed,
            Err(o) => return o,
        };
        WireCommand::Renew {
            name: a[0].to_vec(),
            owner: a[1].to_vec(),
            token: token.get(),
            ttl_ms,
        }
    } else {
        let token = match commands::parse_release(cmd, a) {
            Ok(t) => t,
            Err(o) => return o,
        };
        WireCommand::Release {
            name: a[0].to_vec(),
            owner: a[1].to_vec(),
            token: token.get(),
        }
    };
    propose(ctx, c, session.tag(), a[0].clone(), wire).await
}

/// `LEASE.INFO name`: a read. After a ReadIndex (this node leads and has
/// applied every committed entry), the lease as applied here, its time
/// left on the group's clock as this leader carries it on. Nothing is
/// written and nothing changes: an expiry the log has not seen is only
/// shown, never decided, here.
fn lease_info(c: &Arc<Cluster>, name: Bytes) -> Outcome {
    let c = Arc::clone(c);
    Outcome::Replicated(Box::pin(async move {
        if let Err(e) = c.node().linearizable().await {
            return redirect(&c, &name, &e);
        }
        let Some(now) = c.node().group_now_ms() else {
            return redirect(&c, &name, &ClusterError::NotLeader { leader: None });
        };
        match c.log().lease_info_at(&name, now) {
            Ok(Some(info)) => Reply::Array(vec![
                Reply::Bulk(info.owner),
                Reply::Integer(i64::try_from(info.token.get()).unwrap_or(i64::MAX)),
                Reply::Integer(info.remaining.as_millis() as i64),
            ]),
            Ok(None) => Reply::Null,
            Err(e) => commands::error_reply(&e),
        }
    }))
}

/// `EXEC`'s writes as one replicated entry: their answers, the engine's
/// rejection (`Error::Aborted`), or the reply for a node that cannot take
/// them (MOVED, TRYAGAIN, UNCERTAIN).
pub(crate) async fn transact(
    c: &Cluster,
    ops: Vec<TxOp>,
) -> Result<Result<Vec<u64>, Error>, Reply> {
    let key = ops
        .first()
        .map(|op| commands::op_stream(op).clone())
        .unwrap_or_default();
    let wire = WireCommand::Transact(ops.iter().map(WireTxOp::from_engine).collect());
    match write(c, wire).await {
        Ok(Response::Values(v)) => Ok(Ok(v)),
        Ok(Response::Rejected(e)) => Ok(Err(e.to_engine())),
        Ok(other) => Err(Reply::Error(format!(
            "ERR internal: a transaction answered {other:?}"
        ))),
        Err(e) => Err(redirect(c, &key, &e)),
    }
}
