//! The lease commands: `LEASE.ACQUIRE`, `LEASE.RENEW`, `LEASE.RELEASE`,
//! `LEASE.INFO`. The store decides (a single node's engine, or the
//! group's state machine at apply); this file parses, words the answers
//! and logs the events (`lease_acquired`, `lease_lost`).

use std::sync::Arc;
use std::time::Duration;

use fencelog::{AcquireOptions, Token};

use super::parse::{err, not_integer, parse_token, parse_u64, upper, wait_ms, wrong_arity};
use crate::command_table::*;
use crate::context::{ClientTag, Context, failure_reply, lease_granted};
use crate::logging::name_field;
use crate::outcome::{Blocking, Outcome, number};
use crate::protocol::{ArgRef, Reply};
use crate::store::{Failure, LeaseArgs, Ticket};

/// The lease commands' specs, in the order `docs/COMMANDS.md` lists them.
pub static SPECS: &[CommandSpec] = &[
    cmd(
        "LEASE.ACQUIRE",
        -4,
        &["write", "blocking"],
        ONE_KEY,
        &["@write", "@blocking"],
        "lease",
        "Grants a lease with a fresh fencing token (optionally fencing the stream of the same name); answers [token, ttl_ms]",
        "O(1)",
        &[
            key("name"),
            string("owner"),
            integer("ttl_ms"),
            flag("FENCE"),
            optional(token("WAIT", integer("milliseconds"))),
        ],
    ),
    cmd(
        "LEASE.RENEW",
        5,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@fast"],
        "lease",
        "Extends a live lease held by this owner and token; answers the ttl in ms",
        "O(1)",
        &[
            key("name"),
            string("owner"),
            integer("token"),
            integer("ttl_ms"),
        ],
    ),
    cmd(
        "LEASE.RELEASE",
        4,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@fast"],
        "lease",
        "Releases a lease held by this owner and token; answers 1 if released, 0 if not held",
        "O(1)",
        &[key("name"), string("owner"), integer("token")],
    ),
    cmd(
        "LEASE.INFO",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@read", "@fast"],
        "lease",
        "The holder of a live lease: [owner, token, remaining_ms], or nil",
        "O(1)",
        &[key("name")],
    ),
];

/// The commands that change a lease: not part of a transaction's entry.
pub const WRITES: &[&str] = &["LEASE.ACQUIRE", "LEASE.RENEW", "LEASE.RELEASE"];

/// What a waiting acquisition is told when the server shuts down.
const SHUTDOWN_WAIT: &str =
    "ERR the server is shutting down: the wait ended and nothing was acquired";

/// Answers a ticket as the store gives it: now, in order, or while the
/// connection watches the client.
fn answer<T: Send + 'static>(
    ticket: Ticket<T>,
    on_shutdown: Option<Reply>,
    reply: impl FnOnce(Result<T, Failure>) -> Reply + Send + 'static,
) -> Outcome {
    match ticket {
        Ticket::Ready(r) => Outcome::Reply(reply(r)),
        Ticket::InOrder(p) => Outcome::Pending(Box::pin(async move { reply(p.await) })),
        Ticket::Waits(p) => Outcome::Blocking(Blocking::new(on_shutdown, move |_| {
            Box::pin(async move { reply(p.await) })
        })),
    }
}

/// `LEASE.ACQUIRE name owner ttl_ms [FENCE] [WAIT ms]`
pub async fn acquire(
    ctx: &Arc<Context>,
    client: ClientTag,
    a: &[ArgRef<'_>],
    waits: bool,
) -> Outcome {
    if a.len() < 3 {
        return wrong_arity("LEASE.ACQUIRE");
    }
    let Some(ttl_ms) = parse_u64(&a[2]) else {
        return not_integer();
    };
    let mut opts = AcquireOptions::default();
    let mut rest = &a[3..];
    while let [opt, tail @ ..] = rest {
        match upper(opt).as_str() {
            "FENCE" => {
                opts.fence = true;
                rest = tail;
            }
            "WAIT" => {
                let [value, tail @ ..] = tail else {
                    return err("ERR syntax error");
                };
                let Some(ms) = parse_u64(value) else {
                    return not_integer();
                };
                // WAIT 0 waits without a limit, as BLOCK 0 does.
                opts.wait = waits.then(|| wait_ms(ms));
                rest = tail;
            }
            _ => return err("ERR syntax error"),
        }
    }
    let lease = LeaseArgs {
        name: a[0].to_bytes(),
        owner: a[1].to_bytes(),
    };
    let ttl = Duration::from_millis(ttl_ms);
    let ticket = ctx.store.acquire(lease.clone(), ttl, opts).await;
    let ctx = Arc::clone(ctx);
    answer(
        ticket,
        Some(Reply::Error(SHUTDOWN_WAIT.into())),
        move |r| match r {
            Ok(g) => {
                let ttl = Duration::from_millis(g.ttl_ms);
                lease_granted(
                    &ctx,
                    &client,
                    &lease.name,
                    &lease.owner,
                    g.token,
                    ttl,
                    opts.fence,
                );
                Reply::Array(vec![number(g.token), number(g.ttl_ms)])
            }
            Err(f) => failure_reply(&ctx, &client, &lease.name, f),
        },
    )
}

/// `LEASE.RENEW name owner token ttl_ms`
pub async fn renew(ctx: &Arc<Context>, client: ClientTag, a: &[ArgRef<'_>]) -> Outcome {
    let (lease, token) = match held_lease("LEASE.RENEW", 4, a) {
        Ok(held) => held,
        Err(o) => return o,
    };
    let Some(ttl_ms) = parse_u64(&a[3]) else {
        return not_integer();
    };
    let ticket = ctx.store.renew(lease.clone(), token, ttl_ms).await;
    let ctx = Arc::clone(ctx);
    answer(ticket, None, move |r| match r {
        Ok(ttl_ms) => {
            if let Some(l) = ctx.events.leases.lock().get_mut(&lease.name)
                && l.1 == token.get()
            {
                l.2 = std::time::Instant::now() + Duration::from_millis(ttl_ms);
            }
            number(ttl_ms)
        }
        Err(Failure::Refused(fencelog::Error::Lost)) => {
            lease_lost(&client, &lease, token);
            Failure::Refused(fencelog::Error::Lost).into_reply()
        }
        Err(f) => failure_reply(&ctx, &client, &lease.name, f),
    })
}

/// Logs a `lease_lost` event: a renewal refused.
fn lease_lost(client: &ClientTag, lease: &LeaseArgs, token: Token) {
    tracing::info!(
        event = "lease_lost",
        lease = %name_field(&lease.name),
        owner = %name_field(&lease.owner),
        token = token.get(),
        client_addr = %client.addr,
        client_name = %client.name_field(),
        "lease renewal refused: the lease is lost"
    );
}

/// The `name owner token` a command about a held lease starts with
/// (`LEASE.RENEW`, `LEASE.RELEASE`), in `len` arguments.
fn held_lease(command: &str, len: usize, a: &[ArgRef<'_>]) -> Result<(LeaseArgs, Token), Outcome> {
    if a.len() != len {
        return Err(wrong_arity(command));
    }
    let token = parse_token(&a[2])?;
    let lease = LeaseArgs {
        name: a[0].to_bytes(),
        owner: a[1].to_bytes(),
    };
    Ok((lease, token))
}

/// `LEASE.RELEASE name owner token`
pub async fn release(ctx: &Arc<Context>, client: ClientTag, a: &[ArgRef<'_>]) -> Outcome {
    let (lease, token) = match held_lease("LEASE.RELEASE", 3, a) {
        Ok(held) => held,
        Err(o) => return o,
    };
    let ticket = ctx.store.release(lease.clone(), token).await;
    let ctx = Arc::clone(ctx);
    answer(ticket, None, move |r| match r {
        Ok(released) => {
            if released {
                let mut leases = ctx.events.leases.lock();
                if leases.get(&lease.name).is_some_and(|l| l.1 == token.get()) {
                    leases.remove(&lease.name);
                }
            }
            Reply::Integer(i64::from(released))
        }
        Err(f) => failure_reply(&ctx, &client, &lease.name, f),
    })
}

/// `LEASE.INFO name`: the holder of a live lease, or nil.
pub fn info(ctx: &Context, a: &[ArgRef<'_>]) -> Outcome {
    if a.len() != 1 {
        return wrong_arity("LEASE.INFO");
    }
    answer(ctx.store.lease_info(a[0].to_bytes()), None, |r| match r {
        Ok(Some(info)) => Reply::Array(vec![
            Reply::Bulk(info.owner),
            number(info.token.get()),
            number(info.remaining.as_millis() as u64),
        ]),
        Ok(None) => Reply::Null,
        Err(f) => f.into_reply(),
    })
}
