//! `MULTI` / `EXEC` / `DISCARD` / `WATCH` / `UNWATCH`: the writes of a
//! transaction are decided together and reach the log as one durable
//! entry, all or none.
//!
//! Client libraries wrap pipelines in `MULTI … EXEC` by default (redis-py
//! `pipeline()`, redis-rs `atomic()`, ioredis and node-redis `multi()`), so
//! this must mean what it says: if any queued write would be rejected
//! (STALE, MISMATCH, TRIMMED, TOOBIG, …) nothing is applied, and `EXEC`
//! answers that command's error at its place and `EXECABORT` at every other.
//!
//! What runs when (the store decides the writes as one entry, so they
//! cannot interleave with the other commands):
//!
//! - commands queued before the first write run first, before the entry is
//!   decided (they see the streams as they were);
//! - the writes are decided together (`Store::transact`) and waited for
//!   until durable (or applied by the group);
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
use fencelog::Error;

use super::parse::{arity_error, unknown_command};
use super::{leases, streams};
use crate::command_table::*;
use crate::context::{Context, note_error};
use crate::outcome::{BoxFuture, Outcome, error_reply, number};
use crate::protocol::{ArgRef, Reply, Request};
use crate::session::{Multi, Queued, Session};
use crate::store::Failure;

/// The transaction commands' specs, in the order `docs/COMMANDS.md` lists
/// them.
pub static SPECS: &[CommandSpec] = &[
    cmd(
        "MULTI",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NO_KEYS,
        &["@fast", "@transaction"],
        "transactions",
        "Starts a transaction: commands are queued until EXEC",
        "O(1)",
        &[],
    ),
    cmd(
        "EXEC",
        1,
        &["noscript", "loading", "stale", "skip_slowlog"],
        NO_KEYS,
        &["@slow", "@transaction"],
        "transactions",
        "Runs the queued commands; their writes reach the log as one durable entry, all or none",
        "O(N) in the queued commands",
        &[],
    ),
    cmd(
        "DISCARD",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NO_KEYS,
        &["@fast", "@transaction"],
        "transactions",
        "Forgets the queued commands",
        "O(N) in the queued commands",
        &[],
    ),
    cmd(
        "WATCH",
        -2,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        (1, -1, 1),
        &["@fast", "@transaction"],
        "transactions",
        "Not supported: answers an error, so that no client believes it holds a watch",
        "O(1)",
        &[multiple(key("key"))],
    ),
    cmd(
        "UNWATCH",
        1,
        &["noscript", "loading", "stale", "fast", "allow_busy"],
        NO_KEYS,
        &["@fast", "@transaction"],
        "transactions",
        "Answers OK: nothing is ever watched",
        "O(1)",
        &[],
    ),
];

/// The answer at every place of a rejected transaction but the rejected
/// command's own.
pub const EXECABORT_NOT_APPLIED: &str = "EXECABORT the transaction was not applied";

/// Commands that act at once inside `MULTI` instead of being queued.
pub fn runs_at_once(cmd: &str) -> bool {
    matches!(cmd, "MULTI" | "EXEC" | "DISCARD" | "WATCH" | "QUIT")
}

/// `MULTI`
pub fn multi(a: &[ArgRef<'_>], session: &mut Session) -> Reply {
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
pub fn discard(a: &[ArgRef<'_>], session: &mut Session) -> Reply {
    if !a.is_empty() {
        return arity_error("discard");
    }
    match session.multi.take() {
        Some(_) => Reply::ok(),
        None => Reply::Error("ERR DISCARD without MULTI".into()),
    }
}

/// `WATCH key …`: refused, so that no client believes it holds a watch.
pub fn watch(a: &[ArgRef<'_>], session: &mut Session) -> Reply {
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

/// `UNWATCH`: nothing is watched, so nothing is unwatched; clients send it
/// when they reset a pipeline.
pub fn unwatch(a: &[ArgRef<'_>]) -> Reply {
    if a.is_empty() {
        Reply::ok()
    } else {
        arity_error("UNWATCH")
    }
}

/// Queues one command of a transaction (or refuses it, which discards the
/// transaction at `EXEC`, as in Redis). `cmd` is the upper-cased name,
/// `spec` its entry in the registry.
pub fn queue(
    cmd: &str,
    spec: Option<&CommandSpec>,
    request: &Request,
    session: &mut Session,
) -> Reply {
    let Some(multi) = session.multi.as_mut() else {
        return Reply::Error("ERR not in a transaction".into());
    };
    let args = request.args();
    let refused = match spec {
        None => Some(unknown_command(&args.refs())),
        Some(spec) if !spec.arity_fits(args.len()) => Some(arity_error(&cmd.to_ascii_lowercase())),
        _ if leases::WRITES.contains(&cmd) => Some(Reply::Error(format!(
            "ERR {cmd} is not allowed inside a transaction: leases are not part of its \
             atomic entry; send it before MULTI or after EXEC"
        ))),
        _ if matches!(cmd, "AUTH" | "HELLO") => Some(Reply::Error(
            "ERR Command not allowed inside a transaction".into(),
        )),
        _ => None,
    };
    if let Some(reply) = refused {
        multi.refuse();
        return reply;
    }
    match streams::parse_write(cmd, args.from(1)) {
        Some(Ok(op)) => multi.push(Queued::Write(op)),
        Some(Err(reply)) => {
            multi.refuse();
            return reply;
        }
        None => multi.push(Queued::Other(request.clone())),
    }
    Reply::Simple("QUEUED".into())
}

/// How `EXEC` runs a queued command that is not a write: the dispatcher's
/// (handed in, so that this file does not name the dispatcher).
pub type RunQueued =
    for<'a> fn(&'a Arc<Context>, &'a mut Session, &'a Request) -> BoxFuture<'a, Outcome>;

/// `EXEC`: runs the queued commands; the writes as one entry.
pub async fn exec(
    ctx: &Arc<Context>,
    a: &[ArgRef<'_>],
    session: &mut Session,
    run: RunQueued,
) -> Outcome {
    if !a.is_empty() {
        return Outcome::Reply(arity_error("exec"));
    }
    let Some(multi) = session.multi.take() else {
        return Outcome::Reply(Reply::Error("ERR EXEC without MULTI".into()));
    };
    if multi.is_dirty() {
        return Outcome::Reply(Reply::Error(
            "EXECABORT Transaction discarded because of previous errors.".into(),
        ));
    }
    let plan = Plan::of(multi);
    let n = plan.len;
    let mut replies: Vec<Option<Reply>> = (0..n).map(|_| None).collect();
    let mut held = Held::new(ctx, session.proto);
    // Queued commands answer at once: BLOCK does not wait here.
    let waits = std::mem::replace(&mut session.waits, false);
    let ran = run_all(ctx, session, run, plan.before, &mut held, &mut replies).await;
    session.waits = waits;
    if let Err(over) = ran {
        return over.outcome(false);
    }
    let applied = !plan.ops.is_empty();
    if applied
        && let Err(answer) = decide(ctx, session, plan.ops, &plan.op_places, &mut replies).await
    {
        return answer;
    }
    let waits = std::mem::replace(&mut session.waits, false);
    let ran = run_all(ctx, session, run, plan.after, &mut held, &mut replies).await;
    session.waits = waits;
    if let Err(over) = ran {
        return over.outcome(applied);
    }
    Outcome::Reply(Reply::Array(
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Reply::Error(EXECABORT_NOT_APPLIED.into())))
            .collect(),
    ))
}

/// A transaction's commands, sorted by when they run.
struct Plan {
    /// Commands queued.
    len: usize,
    /// Commands queued before the first write, with their places.
    before: Vec<(usize, Request)>,
    /// The writes, one entry.
    ops: Vec<fencelog::TxOp>,
    /// Each write's place.
    op_places: Vec<usize>,
    /// Commands queued after the first write, with their places.
    after: Vec<(usize, Request)>,
}

impl Plan {
    fn of(multi: Multi) -> Plan {
        let queued = multi.into_queued();
        let mut plan = Plan {
            len: queued.len(),
            before: Vec::new(),
            ops: Vec::new(),
            op_places: Vec::new(),
            after: Vec::new(),
        };
        for (place, queued) in queued.into_iter().enumerate() {
            match queued {
                Queued::Write(op) => {
                    plan.op_places.push(place);
                    plan.ops.push(op);
                }
                Queued::Other(args) if plan.ops.is_empty() => plan.before.push((place, args)),
                Queued::Other(args) => plan.after.push((place, args)),
            }
        }
        debug_assert_eq!(
            plan.before.len() + plan.ops.len() + plan.after.len(),
            plan.len
        );
        plan
    }
}

/// Runs queued commands that are not writes, holding their replies.
async fn run_all(
    ctx: &Arc<Context>,
    session: &mut Session,
    run: RunQueued,
    commands: Vec<(usize, Request)>,
    held: &mut Held,
    replies: &mut [Option<Reply>],
) -> Result<(), OverLimit> {
    for (place, args) in commands {
        let reply = run(ctx, session, &args).await.into_reply().await;
        held.add(&reply)?;
        debug_assert!(replies[place].is_none());
        replies[place] = Some(reply);
    }
    Ok(())
}

/// Decides the writes as one entry and puts their answers at their
/// places; `Err`: `EXEC`'s whole answer (rejected, or not decided here).
async fn decide(
    ctx: &Arc<Context>,
    session: &Session,
    ops: Vec<fencelog::TxOp>,
    op_places: &[usize],
    replies: &mut [Option<Reply>],
) -> Result<(), Outcome> {
    ctx.stats.transactions.fetch_add(1, Ordering::Relaxed);
    let op_streams: Vec<Bytes> = ops.iter().map(|op| op.stream().clone()).collect();
    let n_ops = ops.len();
    match ctx.store.transact(ops).await {
        Ok(values) => {
            debug_assert_eq!(values.len(), n_ops, "one answer per op");
            for (place, value) in op_places.iter().zip(values) {
                replies[*place] = Some(number(value));
            }
            Ok(())
        }
        Err(Failure::Refused(Error::Aborted { index, cause })) => {
            ctx.stats
                .transactions_aborted
                .fetch_add(1, Ordering::Relaxed);
            if let Some(stream) = op_streams.get(index) {
                note_error(ctx, &session.tag(), stream, &cause);
            }
            let rejected = op_places.get(index).copied();
            Err(Outcome::Reply(Reply::Array(
                (0..replies.len())
                    .map(|place| {
                        if Some(place) == rejected {
                            error_reply(&cause)
                        } else {
                            Reply::Error(EXECABORT_NOT_APPLIED.into())
                        }
                    })
                    .collect(),
            )))
        }
        // Not one command's fault (the whole entry too large, the log
        // stopped after an I/O failure): the transaction's answer.
        Err(Failure::Refused(e)) => {
            ctx.stats
                .transactions_aborted
                .fetch_add(1, Ordering::Relaxed);
            Err(Outcome::Reply(error_reply(&e)))
        }
        // Not the leader (MOVED, TRYAGAIN) or the fate unknown.
        Err(Failure::Elsewhere(reply)) => Err(Outcome::Reply(reply)),
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
