//! Applying one replicated command: the same decisions as a single node,
//! taken inside the serialized section with the entry's position and clock
//! (see `replicated.rs`).

use fencelog_wal::Writer;

use crate::core::Core;
use crate::error::{Error, Result};
use crate::lease_api::{Acquired, decide_acquire, decide_release, decide_renew};
use crate::log::{
    Decided, Decision, Log, check_payloads, decide_append, decide_fence, decide_trim,
};
use crate::op::{self, Op};
use crate::replicated::{Applied, Command, LogPosition, write_op};
use crate::token::{Token, check_stream_name};
use crate::tx::{self, TxDecision};

/// What was decided, before its entry (if any) is written out.
enum Pending {
    Op(Decision),
    Tx(TxDecision),
    Acquire(Acquired),
    Renew(Option<fencelog_wal::Ticket>, u64),
    Release(bool),
    Done(fencelog_wal::Ticket),
    Rejected(Error),
}

/// Checks what a single node checks before its write lock; a failure is a
/// rejection every replica reaches alike.
fn precheck(log: &Log, cmd: &Command) -> Result<()> {
    let opts = log.options();
    match cmd {
        Command::Append {
            stream, payloads, ..
        }
        | Command::AppendAt {
            stream, payloads, ..
        } => {
            check_stream_name(stream)?;
            check_payloads(opts, payloads)
        }
        Command::Fence { stream, .. }
        | Command::Trim { stream, .. }
        | Command::Delete { stream, .. } => check_stream_name(stream),
        Command::Transact(ops) => log.check_tx_shape(ops),
        Command::Acquire { name, owner, .. }
        | Command::Renew { name, owner, .. }
        | Command::Release { name, owner, .. } => {
            check_stream_name(name)?;
            crate::lease_api::check_owner(owner)
        }
        Command::TakeOver | Command::Membership(_) | Command::Blank => Ok(()),
    }
}

fn decide_command(w: &mut Writer<'_, Core>, log: &Log, cmd: &Command) -> Result<Pending> {
    Ok(match cmd {
        Command::Append {
            stream,
            token,
            payloads,
        } => Pending::Op(decide_append(w, stream, token.get(), payloads, None)?),
        Command::AppendAt {
            stream,
            token,
            expected_offset,
            payloads,
        } => Pending::Op(decide_append(
            w,
            stream,
            token.get(),
            payloads,
            Some(*expected_offset),
        )?),
        Command::Fence { stream, token } => Pending::Op(decide_fence(w, stream, token.get())?),
        Command::Trim {
            stream,
            token,
            before,
        } => Pending::Op(decide_trim(w, stream, token.get(), *before, false)?),
        Command::Delete { stream, token } => {
            Pending::Op(decide_trim(w, stream, token.get(), 0, true)?)
        }
        Command::Transact(ops) => Pending::Tx(tx::decide(w, ops)?),
        Command::Acquire {
            name,
            owner,
            ttl_ms,
            fence,
        } => {
            let max_live = log.options().max_live_leases;
            Pending::Acquire(decide_acquire(w, name, owner, *ttl_ms, *fence, max_live)?)
        }
        Command::Renew {
            name,
            owner,
            token,
            ttl_ms,
        } => Pending::Renew(decide_renew(w, name, owner, token.get(), *ttl_ms)?, *ttl_ms),
        Command::Release { name, owner, token } => {
            Pending::Release(decide_release(w, name, owner, token.get())?)
        }
        Command::TakeOver => {
            let entry = op::encode(&Op::TakeOver);
            let at = write_op(w, entry.len(), |b| b.copy_from_slice(&entry))?;
            w.state()
                .apply_op(&Op::TakeOver, at)
                .map_err(crate::log::internal)?;
            Pending::Done(w.ticket())
        }
        Command::Membership(config) => {
            let entry = op::encode(&Op::Membership { config });
            let at = write_op(w, entry.len(), |b| b.copy_from_slice(&entry))?;
            w.state()
                .apply_op(&Op::Membership { config }, at)
                .map_err(crate::log::internal)?;
            Pending::Done(w.ticket())
        }
        // Nothing changes but the position, which `apply` writes (a
        // position-only entry).
        Command::Blank => Pending::Done(w.ticket_for(0)),
    })
}

/// Decides `cmd` with every entry it writes wrapped in `header`.
fn decide_wrapped(
    w: &mut Writer<'_, Core>,
    log: &Log,
    cmd: &Command,
    checked: Result<()>,
    header: [u8; op::REPLICATED_HEADER],
) -> Result<Pending> {
    if let Err(e) = checked {
        return Ok(Pending::Rejected(e));
    }
    w.state().wrap = Some(header);
    let decided = decide_command(w, log, cmd);
    w.state().wrap = None;
    match decided {
        Ok(p) => Ok(p),
        // A rule refused it (too many streams, an exhausted counter):
        // every replica refuses it alike.
        Err(e @ (Error::TooLarge { .. } | Error::Invalid { .. })) => Ok(Pending::Rejected(e)),
        Err(e) => Err(e),
    }
}

pub(crate) async fn apply(
    log: &Log,
    at: LogPosition,
    time_ms: u64,
    cmd: &Command,
) -> Result<Applied> {
    let checked = precheck(log, cmd);
    let pending = log
        .inner()
        .wal
        .submit_async(|w| {
            let core = w.state();
            let Some(repl) = core.repl.as_mut() else {
                return Err(Error::invalid("mode", "not a replica"));
            };
            repl.enter(at, time_ms);
            let header = op::replicated_header(at.term, at.node, at.index, time_ms);
            let before = w.next_lsn();
            let pending = decide_wrapped(w, log, cmd, checked, header);
            // Every entry applied leaves an entry on disk, even one that
            // changed nothing (a blank, a rejection): a snapshot of this
            // engine then holds exactly the position and clock the replicas
            // that applied the entry have.
            if w.next_lsn() == before && pending.is_ok() {
                w.append(op::REPLICATED_HEADER, |b| b.copy_from_slice(&header))?;
            }
            pending
        })
        .await??;
    Ok(match pending {
        Pending::Rejected(e) => Applied::Rejected(e),
        Pending::Op(d) => {
            let decided = d.wait_async().await?;
            let value = match (decided, cmd) {
                (
                    Decided::Retry {
                        expected,
                        next,
                        highest,
                    },
                    Command::AppendAt {
                        stream,
                        token,
                        payloads,
                        ..
                    },
                ) => log.settle_retry(stream, *token, expected, next, highest, payloads),
                (other, _) => other.value(),
            };
            match value {
                Ok(v) => Applied::Value(v),
                Err(e) => Applied::Rejected(e),
            }
        }
        Pending::Tx(d) => {
            d.ticket.await?;
            match d.then {
                Ok(v) => Applied::Values(v),
                Err(e) => Applied::Rejected(e),
            }
        }
        Pending::Acquire(a) => match a {
            Acquired::Granted {
                token,
                ttl_ms,
                ticket,
                ..
            } => {
                ticket.await?;
                Applied::Grant {
                    token: Token::new(token)?,
                    ttl_ms,
                }
            }
            Acquired::Held {
                remaining_ms,
                ticket,
            } => {
                ticket.await?;
                Applied::Rejected(Error::Held { remaining_ms })
            }
            Acquired::Stale {
                presented,
                highest,
                ticket,
            } => {
                ticket.await?;
                Applied::Rejected(Error::Stale { presented, highest })
            }
        },
        Pending::Renew(Some(ticket), ttl_ms) => {
            ticket.await?;
            Applied::Value(ttl_ms)
        }
        Pending::Renew(None, _) => Applied::Rejected(Error::Lost),
        Pending::Release(released) => Applied::Released(released),
        Pending::Done(ticket) => {
            ticket.await?;
            Applied::Done
        }
    })
}
