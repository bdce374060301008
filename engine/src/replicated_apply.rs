//! Applying one replicated command: the same decisions as a single node,
//! taken inside the serialized section with the entry's position and clock
//! (see `replicated.rs`).

use fencelog_wal::Writer;

use crate::core::Core;
use crate::error::{Error, Result};
use crate::lease_api::{Acquired, decide_acquire, decide_release, decide_renew};
use crate::log::{
    Decided, Decision, Log, check_payloads_within, decide_append, decide_fence, decide_trim,
};
use crate::op::{self, Op};
use crate::proposal::{Proposal, Proposed};
use crate::records::Records;
use crate::replicated::{Applied, Command, GroupLimits, LogPosition, write_op, write_position};
use crate::token::{Token, check_stream_name};
use crate::tx::{self, TxDecision, TxOp};

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

/// Checks what a single node checks before its write lock, with the
/// group's limits (replicated state, never this node's options); a failure
/// is a refusal every replica reaches alike.
fn precheck(limits: &GroupLimits, cmd: &Command) -> Result<()> {
    let ttl_ok = |ttl_ms: u64| {
        if ttl_ms < limits.lease_ttl_min_ms || ttl_ms > limits.lease_ttl_max_ms {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{ttl_ms} ms is not in {}..={} ms",
                    limits.lease_ttl_min_ms, limits.lease_ttl_max_ms
                ),
            ));
        }
        Ok(())
    };
    // A stream op's name, then an append's records.
    let op_ok = |op: &TxOp| match op {
        TxOp::Append {
            stream, payloads, ..
        }
        | TxOp::AppendAt {
            stream, payloads, ..
        } => append_ok(limits, stream, payloads.as_slice()),
        TxOp::Fence { .. } | TxOp::Trim { .. } | TxOp::Delete { .. } => {
            check_stream_name(op.stream())
        }
    };
    match cmd {
        Command::Write(op) => op_ok(op),
        Command::Transact(ops) => {
            if ops.is_empty() {
                return Err(Error::invalid("transaction", "no ops"));
            }
            for (index, tx_op) in ops.iter().enumerate() {
                op_ok(tx_op).map_err(|cause| Error::Aborted {
                    index,
                    cause: Box::new(cause),
                })?;
            }
            Ok(())
        }
        Command::Acquire {
            name,
            owner,
            ttl_ms,
            ..
        }
        | Command::Renew {
            name,
            owner,
            ttl_ms,
            ..
        } => {
            check_stream_name(name)?;
            crate::lease_api::check_owner(owner)?;
            ttl_ok(*ttl_ms)
        }
        Command::Release { name, owner, .. } => {
            check_stream_name(name)?;
            crate::lease_api::check_owner(owner)
        }
        Command::SetLimits(new) => new.check(),
        Command::Refused(r) => Err(r.error()),
        Command::TakeOver | Command::Membership(_) | Command::Blank | Command::Check { .. } => {
            Ok(())
        }
    }
}

/// An append's checks before its decision: its stream's name, then its
/// records against the group's limits (for an append decoded and one read
/// in place alike).
fn append_ok<R: Records + ?Sized>(limits: &GroupLimits, stream: &[u8], records: &R) -> Result<()> {
    check_stream_name(stream)?;
    check_payloads_within(
        limits.max_records_per_append,
        limits.max_payload_bytes,
        records,
    )
}

/// Decides an append without an expected offset (for an append decoded and
/// one read in place alike).
fn decide_plain_append<R: Records + ?Sized>(
    w: &mut Writer<'_, Core>,
    stream: &[u8],
    token: Token,
    records: &R,
) -> Result<Decision> {
    let key = w.state().key(stream);
    decide_append(w, key, token.get(), records, None)
}

fn decide_command(
    w: &mut Writer<'_, Core>,
    limits: &GroupLimits,
    cmd: &Command,
) -> Result<Pending> {
    Ok(match cmd {
        Command::Write(op) => Pending::Op(decide_write(w, op)?),
        Command::Transact(ops) => Pending::Tx(tx::decide(w, ops)?),
        Command::Acquire {
            name,
            owner,
            ttl_ms,
            fence,
        } => Pending::Acquire(decide_acquire(
            w,
            name,
            owner,
            *ttl_ms,
            *fence,
            limits.max_live_leases,
        )?),
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
        Command::SetLimits(new) => {
            let entry = op::encode(&Op::Limits { limits: *new });
            let at = write_op(w, entry.len(), |b| b.copy_from_slice(&entry))?;
            w.state()
                .apply_op(&Op::Limits { limits: *new }, at)
                .map_err(crate::log::internal)?;
            Pending::Done(w.ticket())
        }
        Command::Check { index, digest } => {
            let here = w.state().repl.as_ref().and_then(|r| r.digest_at(*index));
            if let Some(here) = here
                && here != *digest
            {
                return Err(Error::Diverged {
                    index: *index,
                    here,
                    leader: *digest,
                });
            }
            Pending::Done(w.ticket_for(0))
        }
        // Nothing changes but the position (and the clock), which `decide`
        // writes (a position-only entry). Leases the clock has passed are
        // let go, so the next expiry a leader watches for is exact.
        Command::Blank => {
            w.state().leases.sweep();
            Pending::Done(w.ticket_for(0))
        }
        // Refused by `precheck`, never decided.
        Command::Refused(r) => return Err(r.error()),
    })
}

/// Decides one stream write as a single node does (an `AppendAt` with its
/// retry rule, settled in [`finish`]).
fn decide_write(w: &mut Writer<'_, Core>, op: &TxOp) -> Result<Decision> {
    match op {
        TxOp::Append {
            stream,
            token,
            payloads,
        } => decide_plain_append(w, stream, *token, payloads.as_slice()),
        TxOp::AppendAt {
            stream,
            token,
            expected_offset,
            payloads,
        } => {
            let key = w.state().key(stream);
            decide_append(
                w,
                key,
                token.get(),
                payloads.as_slice(),
                Some(*expected_offset),
            )
        }
        TxOp::Fence { stream, token } => decide_fence(w, stream, token.get()),
        TxOp::Trim {
            stream,
            token,
            before,
        } => decide_trim(w, stream, token.get(), *before, false),
        TxOp::Delete { stream, token } => decide_trim(w, stream, token.get(), 0, true),
    }
}

/// Decides `cmd` with every entry it writes wrapped in `header`. Every
/// error but a failure of this replica's own storage is a refusal, the
/// same on every replica (a rule, a limit, an exhausted counter): one
/// committed entry must never stop the group.
fn decide_wrapped(
    w: &mut Writer<'_, Core>,
    proposal: &Proposal<'_>,
    header: [u8; op::REPLICATED_HEADER],
) -> Result<Pending> {
    let limits = w
        .state()
        .repl
        .as_ref()
        .map(|r| r.limits)
        .unwrap_or_default();
    let checked = match proposal {
        Proposal::Command(cmd) => precheck(&limits, cmd),
        Proposal::Decoded(cmd) => precheck(&limits, cmd),
        Proposal::Append(a) => append_ok(&limits, a.stream, &a.records),
    };
    if let Err(e) = checked {
        return Ok(Pending::Rejected(e));
    }
    w.state().wrap = Some(header);
    let decided = match proposal {
        Proposal::Command(cmd) => decide_command(w, &limits, cmd),
        Proposal::Decoded(cmd) => decide_command(w, &limits, cmd),
        Proposal::Append(a) => {
            decide_plain_append(w, a.stream, a.token, &a.records).map(Pending::Op)
        }
    };
    w.state().wrap = None;
    match decided {
        Ok(p) => Ok(p),
        Err(e) if e.is_local_failure() => Err(e),
        Err(e) => Ok(Pending::Rejected(e)),
    }
}

pub(crate) async fn apply(
    log: &Log,
    at: LogPosition,
    time_ms: u64,
    cmd: &Command,
) -> Result<Applied> {
    let proposal = cmd.proposal();
    let pending = decide(log, at, time_ms, &proposal).await?;
    finish(log, &proposal, pending).await
}

/// Decides every entry in order, then waits for their answers: a batch of
/// entries is written out together instead of one write (and one wake-up
/// of the sync thread) per entry.
pub(crate) async fn apply_many<C: Proposed + Sync>(
    log: &Log,
    entries: &[(LogPosition, u64, C)],
) -> Result<Vec<Applied>> {
    // Both sized once: an entry may hold thousands of writes, and growing
    // these by doubling copied them (a tenth of a replica's apply under
    // callgrind).
    let mut out = Vec::with_capacity(entries.len());
    let mut pending = Vec::with_capacity(entries.len());
    for (at, time_ms, cmd) in entries {
        let proposal = cmd.proposal();
        // An exact retry's answer reads the stream when it is settled:
        // settled at once, as alone, so it cannot depend on where a
        // replica's batch of entries ends.
        let alone = matches!(
            proposal.decoded(),
            Some(Command::Write(TxOp::AppendAt { .. }))
        );
        if alone {
            settle(log, &mut pending, &mut out).await?;
        }
        let decided = decide(log, *at, *time_ms, &proposal).await?;
        pending.push((proposal, decided));
        if alone {
            settle(log, &mut pending, &mut out).await?;
        }
    }
    settle(log, &mut pending, &mut out).await?;
    Ok(out)
}

async fn settle(
    log: &Log,
    pending: &mut Vec<(Proposal<'_>, Pending)>,
    out: &mut Vec<Applied>,
) -> Result<()> {
    for (proposal, p) in pending.drain(..) {
        out.push(finish(log, &proposal, p).await?);
    }
    Ok(())
}

/// Decides one entry in the serialized section; its answer may wait for
/// the batch to be written ([`finish`]).
async fn decide(
    log: &Log,
    at: LogPosition,
    time_ms: u64,
    proposal: &Proposal<'_>,
) -> Result<Pending> {
    log.inner()
        .wal
        .submit_async(|w| {
            let core = w.state();
            let Some(repl) = core.repl.as_mut() else {
                return Err(Error::invalid("mode", "not a replica"));
            };
            repl.enter(at, time_ms);
            let header = op::replicated_header(at.term, at.node, at.index, time_ms);
            let before = w.next_lsn();
            let pending = decide_wrapped(w, proposal, header);
            // Every entry applied leaves an entry on disk, even one that
            // changed nothing (a blank, a rejection): a snapshot of this
            // engine then holds exactly the position and clock the replicas
            // that applied the entry have.
            if w.next_lsn() == before && pending.is_ok() {
                write_position(w, &header)?;
            }
            if let Some(repl) = w.state().repl.as_mut() {
                repl.keep_digest(at.index);
            }
            pending
        })
        .await?
}

/// The answer of an entry [`decide`]d.
async fn finish(log: &Log, proposal: &Proposal<'_>, pending: Pending) -> Result<Applied> {
    let cmd = proposal.decoded();
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
                    Some(Command::Write(TxOp::AppendAt {
                        stream,
                        token,
                        payloads,
                        ..
                    })),
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
        Pending::Release(released) => Applied::Released(log.freed(released)),
        Pending::Done(ticket) => {
            ticket.await?;
            // A tick or a take-over may have let leases go.
            if matches!(cmd, Some(Command::Blank | Command::TakeOver)) {
                log.freed(true);
            }
            Applied::Done
        }
    })
}
