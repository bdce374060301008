//! Commands, one file per family, each holding its commands' specs, their
//! parsing, their checks and their execution:
//!
//! | file | commands |
//! |---|---|
//! | `streams.rs` | `LOG.APPEND`, `LOG.APPENDAT`, `LOG.FENCE`, `LOG.READ`, `LOG.TRIM`, `LOG.DELETE`, `LOG.STAT`, `LOG.STREAMS` |
//! | `leases.rs` | `LEASE.ACQUIRE`, `LEASE.RENEW`, `LEASE.RELEASE`, `LEASE.INFO` |
//! | `transactions.rs` | `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH` |
//! | `connection.rs` | `PING`, `ECHO`, `QUIT`, `AUTH`, `HELLO`, `SELECT` |
//! | `introspection.rs` | `CLIENT`, `INFO`, `DBSIZE`, `COMMAND`, `CONFIG` |
//! | `cluster.rs` | `CLUSTER`, `READONLY`, `READWRITE`, `ASKING` |
//!
//! Every command runs against the one [`Store`](crate::store::Store) of the
//! context, in either mode alike. This file is the dispatcher (a `match`
//! that only names them) and the registry that collects the specs.

pub mod cluster;
pub mod connection;
pub mod introspection;
pub mod leases;
pub mod parse;
pub mod streams;
pub mod transactions;

use std::sync::Arc;

use crate::command_table::Registry;
use crate::context::Context;
use crate::outcome::{BoxFuture, Outcome};
use crate::protocol::{Args, Request};
use crate::session::Session;
use parse::{Upper, err, unknown_command, upper};

/// Every command, in the order `docs/COMMANDS.md` lists them: each
/// family's specs, declared next to its code.
pub static REGISTRY: Registry = Registry::new(&[
    streams::SPECS,
    leases::SPECS,
    transactions::SPECS,
    connection::SPECS,
    introspection::SPECS,
    cluster::SPECS,
]);

/// Runs one request. Writes are taken now and answered later, so that a
/// connection's pipelined writes share one group commit (or round of
/// replication); inside a transaction, commands are queued.
pub async fn execute(ctx: &Arc<Context>, session: &mut Session, request: &Request) -> Outcome {
    match request.get(0) {
        Some(first) => execute_named(ctx, session, request, &upper(first)).await,
        None => err("ERR empty command"),
    }
}

/// [`execute`] for a request whose name the caller has upper-cased
/// already ([`upper`] of argument 0): a connection asks for it once per
/// request, for the pipelining rule, the HTTP check and this.
pub async fn execute_named(
    ctx: &Arc<Context>,
    session: &mut Session,
    request: &Request,
    upper_cmd: &Upper,
) -> Outcome {
    let cmd = upper_cmd.as_str();
    ctx.stats.commands.add(1);
    let spec = match session.last_spec {
        Some(last) if last.name == cmd => Some(last),
        _ => {
            let spec = REGISTRY.lookup(cmd);
            session.last_spec = spec.or(session.last_spec);
            spec
        }
    };
    if let (Some(r), Some(spec)) = (&session.registration, spec) {
        // `CLIENT LIST` shows subcommands as Redis does: `client|list`.
        let sub = request
            .get(1)
            .filter(|_| !spec.subcommands.is_empty())
            .and_then(|s| {
                let s = upper(s);
                spec.subcommands
                    .iter()
                    .find(|c| c.name.split_once('|').is_some_and(|(_, n)| n == s.as_str()))
            });
        r.command(sub.unwrap_or(spec).name);
    }
    if ctx.config.requirepass.is_some()
        && !session.authenticated
        && !connection::allowed_unauthenticated(cmd)
    {
        return err("NOAUTH Authentication required.");
    }
    if session.multi.is_some() && !transactions::runs_at_once(cmd) {
        return Outcome::Reply(transactions::queue(cmd, spec, request, session));
    }
    let args = request.args();
    match cmd {
        "MULTI" | "EXEC" | "DISCARD" | "WATCH" => {
            let refs = args.refs();
            let a = &refs[1..];
            match cmd {
                "MULTI" => Outcome::Reply(transactions::multi(a, session)),
                "EXEC" => transactions::exec(ctx, a, session, run_queued).await,
                "DISCARD" => Outcome::Reply(transactions::discard(a, session)),
                _ => Outcome::Reply(transactions::watch(a, session)),
            }
        }
        _ => run_named(ctx, session, args, cmd).await,
    }
}

/// Runs one command of an `EXEC` (`request` is the whole request, name
/// first).
fn run_queued<'a>(
    ctx: &'a Arc<Context>,
    session: &'a mut Session,
    request: &'a Request,
) -> BoxFuture<'a, Outcome> {
    Box::pin(async move {
        let Some(first) = request.get(0) else {
            return err("ERR empty command");
        };
        let upper_cmd = upper(first);
        run_named(ctx, session, request.args(), upper_cmd.as_str()).await
    })
}

/// Runs `cmd` (its name in upper case; `args` the whole request).
async fn run_named(
    ctx: &Arc<Context>,
    session: &mut Session,
    args: Args<'_>,
    cmd: &str,
) -> Outcome {
    if cmd == "LOG.APPEND"
        && let Some(outcome) = streams::append_now(ctx, session, args.from(1))
    {
        return outcome;
    }
    if let Some(parsed) = streams::parse_write(cmd, args.from(1)) {
        return match parsed {
            Ok(op) if session.together => streams::together(ctx, session, op),
            Ok(op) => streams::write(ctx, session.tag(), op).await,
            Err(reply) => Outcome::Reply(reply),
        };
    }
    // The other commands match on a slice of the arguments: gathered here,
    // off the path of the writes.
    let args = args.refs();
    let a = &args[1..];
    match cmd {
        "LOG.READ" => streams::read(ctx, a, session.waits, session.round.take()).await,
        "LOG.STAT" => streams::stat(ctx, a, session.round.take()).await,
        "LOG.STREAMS" => streams::streams(ctx, a, session.round.take()).await,
        "LEASE.ACQUIRE" => leases::acquire(ctx, session.tag(), a, session.waits).await,
        "LEASE.RENEW" => leases::renew(ctx, session.tag(), a).await,
        "LEASE.RELEASE" => leases::release(ctx, session.tag(), a).await,
        "LEASE.INFO" => leases::info(ctx, a),
        "UNWATCH" => Outcome::Reply(transactions::unwatch(a)),
        "PING" => connection::ping(a),
        "ECHO" => connection::echo(a),
        "QUIT" => connection::quit(),
        "AUTH" => connection::auth(a, ctx, session),
        "HELLO" => connection::hello(a, ctx, session),
        "SELECT" => connection::select(a),
        "CLIENT" => introspection::client(a, ctx, session),
        "INFO" => introspection::info(ctx, a),
        "DBSIZE" => introspection::dbsize(ctx, a, session.round.take()).await,
        "COMMAND" => introspection::command(a, &REGISTRY),
        "CONFIG" => introspection::config(a, ctx),
        "CLUSTER" => cluster::cluster(ctx, a).await,
        "READONLY" | "READWRITE" | "ASKING" => cluster::client_mode(ctx, a),
        _ => Outcome::Reply(unknown_command(&args)),
    }
}

/// How a request may be pipelined behind the answers still to come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipelining {
    /// It runs once every answer before it is out (it sees them).
    InOrder,
    /// A write: taken now, answered once durable (or, in a group,
    /// applied), while later writes are taken. It may follow writes,
    /// never a read still waiting (that read must not see it).
    Write,
    /// A read that waits for a round (in a group): it joins a round now
    /// and is answered, in order, once the round is done. It may follow
    /// reads, never a write still waiting (it must see that write).
    Read,
}

/// How `request` may be pipelined; `rounds`: the store orders reads and
/// lease writes in rounds ([`Store::orders_rounds`](crate::store::Store::orders_rounds)).
/// Inside a transaction nothing is (writes are queued).
pub fn pipelining(session: &Session, request: &Request, rounds: bool) -> Pipelining {
    match request.get(0) {
        Some(first) => pipelining_named(session, request, &upper(first), rounds),
        None => Pipelining::InOrder,
    }
}

/// Whether a pipelined `upper_cmd` is a stream write, which a group's
/// connection takes together with the ones next to it (see
/// `Session::together`).
pub fn takes_together(upper_cmd: &Upper) -> bool {
    streams::WRITES.contains(&upper_cmd.as_str())
}

/// [`pipelining`] for a request whose name the caller has upper-cased
/// already ([`upper`] of argument 0).
pub fn pipelining_named(
    session: &Session,
    request: &Request,
    upper_cmd: &Upper,
    rounds: bool,
) -> Pipelining {
    if session.multi.is_some() {
        return Pipelining::InOrder;
    }
    // Names are ASCII and at most `Upper::MAX` long: one that is not
    // upper-cases to "", which is none of them.
    let cmd = upper_cmd.as_str();
    let is = |names: &[&str]| names.contains(&cmd);
    let has = |word: &[u8]| request.iter().skip(1).any(|a| a.eq_ignore_ascii_case(word));
    // A lease command that does not wait is a write proposed in the
    // connection's order, like a stream write: pipelined ones share
    // entries (one entry each made a flood of them cost a round of
    // replication apiece: 1,500 acquisitions/s where fences went ten
    // times faster).
    let lease_write =
        || is(&["LEASE.RENEW", "LEASE.RELEASE"]) || (is(&["LEASE.ACQUIRE"]) && !has(b"WAIT"));
    if is(streams::WRITES) || (rounds && lease_write()) {
        Pipelining::Write
    } else if rounds && is(streams::READS) && !has(b"BLOCK") {
        Pipelining::Read
    } else {
        Pipelining::InOrder
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command_table::{CommandSpec, NO_KEYS, ONE_KEY};

    #[test]
    fn syntax_lines_read_as_redis_writes_them() {
        let s = |n| REGISTRY.lookup(n).unwrap().syntax();
        assert_eq!(
            s("LOG.APPEND"),
            "LOG.APPEND stream token payload [payload ...]"
        );
        assert_eq!(
            s("LOG.READ"),
            "LOG.READ stream from [COUNT count] [BLOCK milliseconds]"
        );
        assert_eq!(
            s("LEASE.ACQUIRE"),
            "LEASE.ACQUIRE name owner ttl_ms [FENCE] [WAIT milliseconds]"
        );
        assert_eq!(s("CONFIG|GET"), "CONFIG GET parameter [parameter ...]");
    }

    /// What `COMMAND GETKEYS` answers, and so where a cluster client
    /// that asks sends each command: the stream or lease name.
    #[test]
    fn keys_are_the_stream_or_lease_name() {
        let keys = |line: &'static str| -> Option<Vec<&'static str>> {
            let args: Vec<&'static str> = line.split(' ').collect();
            REGISTRY
                .lookup(&args[0].to_ascii_uppercase())
                .unwrap()
                .keys_of(&args)
                .map(|k| k.into_iter().copied().collect())
        };
        assert_eq!(keys("LOG.APPEND jobs 7 a b c"), Some(vec!["jobs"]));
        assert_eq!(keys("LOG.APPENDAT jobs 7 0 a"), Some(vec!["jobs"]));
        assert_eq!(keys("LOG.READ jobs 0 COUNT 5"), Some(vec!["jobs"]));
        assert_eq!(keys("LEASE.ACQUIRE jobs w 1000 FENCE"), Some(vec!["jobs"]));
        assert_eq!(keys("LEASE.RELEASE jobs w 3"), Some(vec!["jobs"]));
        assert_eq!(keys("LOG.STREAMS"), Some(vec![]));
        assert_eq!(keys("LOG.APPEND jobs 7"), None, "too few arguments");
        assert_eq!(keys("LOG.STAT jobs more"), None, "too many arguments");
        // A negative last key counts from the end.
        assert_eq!(keys("WATCH a b"), Some(vec!["a", "b"]));
        // Every stream and lease command names one key, its first
        // argument: a cluster client that takes the first argument as the
        // key (the `redis` crate does, for commands it does not know)
        // routes alike.
        for c in REGISTRY
            .iter()
            .filter(|c| c.name.starts_with("LOG.") || c.name.starts_with("LEASE."))
        {
            assert!(
                c.keys == NO_KEYS || c.keys == ONE_KEY,
                "{} has keys {:?}",
                c.name,
                c.keys
            );
        }
    }

    /// docs/COMMANDS.md documents every command of the registry, with the
    /// syntax line the specs (and so redis-cli's hints) gives.
    #[test]
    fn the_command_reference_matches_the_table() {
        let doc = include_str!("../../../docs/COMMANDS.md");
        let mut all: Vec<&CommandSpec> = Vec::new();
        for c in REGISTRY.iter() {
            if c.subcommands.is_empty() || c.name == "COMMAND" {
                all.push(c);
            }
            all.extend(c.subcommands.iter());
        }
        for c in all {
            let heading = format!("### {}\n", c.name.replace('|', " "));
            assert!(doc.contains(&heading), "no section {heading:?}");
            let syntax = format!("```text\n{}\n```", c.syntax());
            assert!(
                doc.contains(&syntax),
                "{} is not documented as {syntax}",
                c.name
            );
        }
    }

    #[test]
    fn names_fit_the_matcher_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in REGISTRY.iter() {
            assert!(c.name.len() <= 24, "{}", c.name);
            assert!(seen.insert(c.name), "{} twice", c.name);
            assert_eq!(c.name, c.name.to_ascii_uppercase());
            // `Registry::lookup` tries a name as a command's first.
            assert!(!c.name.contains('|'), "{}", c.name);
            for sub in c.subcommands {
                assert!(
                    sub.name.starts_with(&format!("{}|", c.name)),
                    "{}",
                    sub.name
                );
            }
        }
    }
}
