//! `MULTI` / `EXEC` / `DISCARD`: the writes of a transaction are decided
//! together and reach the log as one durable entry, all or none.
//!
//! Client libraries wrap pipelines in `MULTI … EXEC` by default (redis-py
//! `pipeline()`, redis-rs `atomic()`, ioredis and node-redis `multi()`), so
//! this must mean what it says: if any queued write would be rejected
//! (STALE, MISMATCH, TRIMMED, TOOBIG, …) nothing is applied, and `EXEC`
//! answers that command's error at its place and `EXECABORT` at every other.
//!
//! What runs when (the engine decides the writes as one entry, so they
//! cannot interleave with the other commands):
//!
//! - commands queued before the first write run first, before the entry is
//!   decided (they see the streams as they were);
//! - the writes are decided together (`Log::transact_deferred`) and waited
//!   for until durable;
//! - commands queued after the first write run once the entry is durable
//!   (they see every write of the transaction, also those queued after
//!   them).
//!
//! A transaction is atomic, not isolated: other clients' writes may land
//! between the reads before it and its entry. Lease commands that change a
//! lease (`LEASE.ACQUIRE`, `RENEW`, `RELEASE`) are not part of the entry, so
//! they are refused while queuing (the transaction is discarded), as are
//! `AUTH` and `HELLO`, which would change the connection mid-reply. `BLOCK`
//! inside a transaction does not wait. `WATCH` is an error: nothing is
//! watched, so no client may believe it holds a watch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use fencelog::{Error, TxOp};

use crate::commands::{self, Context, Outcome};
use crate::connection::Session;
use crate::protocol::{ARG_OVERHEAD_BYTES, Reply};

/// The answer at every place of a rejected transaction but the rejected
/// command's own.
pub const EXECABORT_NOT_APPLIED: &str = "EXECABORT the transaction was not applied";

/// A transaction being queued.
#[derive(Default)]
pub struct Multi {
    queued: Vec<Queued>,
    /// A command was refused while queuing: `EXEC` discards everything.
    dirty: bool,
    /// Bytes the queued commands hold (they count against the query
    /// buffer, as in Redis).
    bytes: usize,
}

impl Multi {
    /// Bytes the queued commands hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Commands queued.
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

/// One queued command.
enum Queued {
    /// A write: one op of the entry.
    Write(TxOp),
    /// Anything else, run as it is at `EXEC`.
    Other(Vec<Bytes>),
}

/// Commands that act at once inside `MULTI` instead of being queued.
pub fn runs_at_once(cmd: &str) -> bool {
    matches!(cmd, "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "QUIT")
}

/// What `args` hold in memory.
fn request_bytes(args: &[Bytes]) -> usize {
    args.iter().map(|a| a.len() + ARG_OVERHEAD_BYTES).sum()
}

/// `MULTI`
pub fn multi(a: &[Bytes], session: &mut Session) -> Reply {
    if !a.is_empty() {
        return arity_error("multi");
    }
    if session.multi.is_some() {
        // Redis' words; the transaction goes on.
        return Reply::Error("ERR MULTI calls can not be nested".into());
    }
    session.multi = Some(Multi::default());
    Reply::ok()
}

/// `DISCARD`
pub fn discard(a: &[Bytes], session: &mut Session) -> Reply {
    if !a.is_empty() {
        return arity_error("discard");
    }
    match session.multi.take() {
        Some(_) => Reply::ok(),
        None => Reply::Error("ERR DISCARD without MULTI".into()),
    }
}

/// `WATCH key …`: refused, so that no client believes it holds a watch.
pub fn watch(a: &[Bytes], session: &mut Session) -> Reply {
    if a.is_empty() {
        return arity_error("watch");
    }
    if session.multi.is_some() {
        return Reply::Error("ERR WATCH inside MULTI is not allowed".into());
    }
    Reply::Error(
        "ERR WATCH is not supported by fencelog: nothing would be watched. A transaction's \
         writes are checked when EXEC decides them (LOG.APPENDAT answers MISMATCH if the \
         stream moved, a stale token answers STALE), and then nothing is applied"
            .into(),
    )
}

fn arity_error(cmd: &str) -> Reply {
    Reply::Error(format!("ERR wrong number of arguments for '{cmd}' command"))
}

/// Queues one command of a transaction (or refuses it, which discards the
/// transaction at `EXEC`, as in Redis). `cmd` is the upper-cased name.
pub fn queue(cmd: &str, args: Vec<Bytes>, session: &mut Session) -> Reply {
    let Some(multi) = session.multi.as_mut() else {
        return Reply::Error("ERR not in a transaction".into());
    };
    let refused = if commands::arity(cmd).is_none() {
        Some(commands::unknown_command(&args))
    } else if !commands::arity_fits(cmd, args.len()) {
        Some(arity_error(&cmd.to_ascii_lowercase()))
    } else if matches!(cmd, "LEASE.ACQUIRE" | "LEASE.RENEW" | "LEASE.RELEASE") {
        Some(Reply::Error(format!(
            "ERR {cmd} is not allowed inside a transaction: leases are not part of its \
             atomic entry; send it before MULTI or after EXEC"
        )))
    } else if matches!(cmd, "AUTH" | "HELLO") {
        Some(Reply::Error(
            "ERR Command not allowed inside a transaction".into(),
        ))
    } else {
        None
    };
    if let Some(reply) = refused {
        multi.dirty = true;
        // Nothing queued will run: give the memory back now.
        multi.queued = Vec::new();
        multi.bytes = 0;
        return reply;
    }
    let queued = match commands::parse_write(cmd, &args[1..]) {
        Some(Ok(op)) => Queued::Write(op),
        Some(Err(reply)) => {
            multi.dirty = true;
            multi.queued = Vec::new();
            multi.bytes = 0;
            return reply;
        }
        None => Queued::Other(args),
    };
    if !multi.dirty {
        multi.bytes += match &queued {
            Queued::Write(op) => op_bytes(op),
            Queued::Other(args) => request_bytes(args),
        };
        multi.queued.push(queued);
    }
    Reply::Simple("QUEUED".into())
}

/// What one queued op holds.
fn op_bytes(op: &TxOp) -> usize {
    let (stream, payloads): (&Bytes, &[Bytes]) = match op {
        TxOp::Append {
            stream, payloads, ..
        }
        | TxOp::AppendAt {
            stream, payloads, ..
        } => (stream, payloads),
        TxOp::Fence { stream, .. } | TxOp::Trim { stream, .. } | TxOp::Delete { stream, .. } => {
            (stream, &[])
        }
    };
    // Name and token arguments too: as many as the command had.
    request_bytes(payloads) + stream.len() + 3 * ARG_OVERHEAD_BYTES
}

/// `EXEC`: runs the queued commands; the writes as one entry.
pub async fn exec(ctx: &Arc<Context>, a: &[Bytes], session: &mut Session) -> Outcome {
    if !a.is_empty() {
        return Outcome::Reply(arity_error("exec"));
    }
    let Some(multi) = session.multi.take() else {
        return Outcome::Reply(Reply::Error("ERR EXEC without MULTI".into()));
    };
    if multi.dirty {
        return Outcome::Reply(Reply::Error(
            "EXECABORT Transaction discarded because of previous errors.".into(),
        ));
    }
    let n = multi.queued.len();
    let mut before = Vec::new();
    let mut after = Vec::new();
    let mut ops = Vec::new();
    let mut op_places = Vec::new();
    let mut op_streams: Vec<Bytes> = Vec::new();
    for (place, queued) in multi.queued.into_iter().enumerate() {
        match queued {
            Queued::Write(op) => {
                op_places.push(place);
                op_streams.push(commands::op_stream(&op).clone());
                ops.push(op);
            }
            Queued::Other(args) if ops.is_empty() => before.push((place, args)),
            Queued::Other(args) => after.push((place, args)),
        }
    }
    let mut replies: Vec<Option<Reply>> = (0..n).map(|_| None).collect();
    let mut held = Held::new(ctx, session.proto);
    for (place, args) in before {
        let reply = run_queued(ctx, session, &args).await;
        if let Err(over) = held.add(&reply) {
            return over.outcome(false);
        }
        replies[place] = Some(reply);
    }
    let applied = !ops.is_empty();
    if applied {
        ctx.stats.transactions.fetch_add(1, Ordering::Relaxed);
        let decided = match &ctx.cluster {
            Some(cluster) => match crate::cluster::route::transact(cluster, ops).await {
                Ok(decided) => decided,
                // Not the leader (MOVED, TRYAGAIN) or the fate unknown.
                Err(reply) => return Outcome::Reply(reply),
            },
            None => match ctx.log.transact_deferred(ops).await {
                Ok(answer) => answer.await,
                Err(e) => Err(e),
            },
        };
        match decided {
            Ok(values) => {
                for (place, value) in op_places.into_iter().zip(values) {
                    replies[place] = Some(Reply::Integer(i64::try_from(value).unwrap_or(i64::MAX)));
                }
            }
            Err(Error::Aborted { index, cause }) => {
                ctx.stats
                    .transactions_aborted
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(stream) = op_streams.get(index) {
                    commands::note_error(ctx, &session.tag(), stream, &cause);
                }
                let rejected = op_places.get(index).copied();
                return Outcome::Reply(Reply::Array(
                    (0..n)
                        .map(|place| {
                            if Some(place) == rejected {
                                commands::error_reply(&cause)
                            } else {
                                Reply::Error(EXECABORT_NOT_APPLIED.into())
                            }
                        })
                        .collect(),
                ));
            }
            // Not one command's fault (the whole entry too large, the log
            // stopped after an I/O failure): the transaction's answer.
            Err(e) => {
                ctx.stats
                    .transactions_aborted
                    .fetch_add(1, Ordering::Relaxed);
                return Outcome::Reply(commands::error_reply(&e));
            }
        }
    }
    for (place, args) in after {
        let reply = run_queued(ctx, session, &args).await;
        if let Err(over) = held.add(&reply) {
            return over.outcome(applied);
        }
        replies[place] = Some(reply);
    }
    Outcome::Reply(Reply::Array(
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Reply::Error(EXECABORT_NOT_APPLIED.into())))
            .collect(),
    ))
}

/// Runs one queued command that is not a write: waits for nothing.
async fn run_queued(ctx: &Arc<Context>, session: &mut Session, args: &[Bytes]) -> Reply {
    match commands::run(ctx, session, args).await {
        Outcome::Reply(r) | Outcome::Close(r) => r,
        Outcome::Blocking(b) => b.without_wait().run(ctx.engine().into_owned()).await,
        Outcome::Later(later) => later.reply().await,
        Outcome::Replicated(answer) => answer.await,
        Outcome::OverOutputLimit { .. } => {
            Reply::Error("ERR the reply is over the client output buffer limit".into())
        }
    }
}

/// The replies an `EXEC` gathers, counted against the output limit: they
/// are held until the whole array can be answered.
struct Held {
    bytes: usize,
    limit: usize,
    proto: u8,
}

/// An `EXEC` whose replies went over the output limit.
struct OverLimit {
    bytes: usize,
    limit: usize,
}

impl OverLimit {
    fn outcome(self, applied: bool) -> Outcome {
        Outcome::OverOutputLimit {
            reply_bytes: self.bytes,
            limit_bytes: self.limit,
            transaction_applied: applied,
        }
    }
}

impl Held {
    fn new(ctx: &Context, proto: u8) -> Held {
        Held {
            bytes: 0,
            limit: ctx.config.client_output_buffer_limit_bytes,
            proto,
        }
    }

    fn add(&mut self, reply: &Reply) -> Result<(), OverLimit> {
        self.bytes += reply.encoded_len(self.proto);
        if self.bytes > self.limit {
            return Err(OverLimit {
                bytes: self.bytes,
                limit: self.limit,
            });
        }
        Ok(())
    }
}
