//! Transactions: several stream writes decided together, in order, and
//! written as one entry, so that they land whole or not at all.
//!
//! Every op is decided by the same rules as on its own (the fencing rule,
//! offsets, trim bounds), against the stream as the earlier ops of the same
//! transaction leave it. If any op is rejected, nothing is written and the
//! answer names that op ([`Error::Aborted`]). Accepted, the ops go into one
//! `Batch` entry (see `op.rs`), which recovery replays op by op through the
//! same `apply` functions.

use bytes::Bytes;
use fencelog_wal::{Ticket, Writer};
use hashbrown::HashMap;

use crate::core::Core;
use crate::error::{Error, Result};
use crate::log::{Deferred, Log, check_payloads};
use crate::op::{self, Op};
use crate::token::{Offset, Token, check_stream_name};

/// An append's records. One record, the usual append, is held inline: a
/// write taken from a client (a leader's, or a transaction's) allocates
/// nothing for its list, and letting it go frees nothing either. Build it
/// with `Payloads::from_vec`, `.into()` from a `Vec`, or `collect`.
pub type Payloads = smallvec::SmallVec<[Bytes; 1]>;

/// One write of a transaction (see [`Log::transact`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxOp {
    /// As [`Log::append`]; answers the first record's offset.
    Append {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
        /// The records, at least one.
        payloads: Payloads,
    },
    /// As [`Log::append_at`], without the retry rule: an offset other than
    /// the next one is a mismatch. Answers the first record's offset.
    AppendAt {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
        /// The offset the first record must get.
        expected_offset: Offset,
        /// The records, at least one.
        payloads: Payloads,
    },
    /// As [`Log::fence`]; answers the highest token.
    Fence {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
    },
    /// As [`Log::trim`]; answers the new start offset.
    Trim {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
        /// Records below this offset are trimmed.
        before: Offset,
    },
    /// As [`Log::delete`]; answers how many records were removed.
    Delete {
        /// The stream.
        stream: Bytes,
        /// The fencing token.
        token: Token,
    },
}

impl TxOp {
    /// The stream it changes.
    pub fn stream(&self) -> &Bytes {
        match self {
            TxOp::Append { stream, .. }
            | TxOp::AppendAt { stream, .. }
            | TxOp::Fence { stream, .. }
            | TxOp::Trim { stream, .. }
            | TxOp::Delete { stream, .. } => stream,
        }
    }

    /// The fencing token it carries.
    pub fn token(&self) -> Token {
        match self {
            TxOp::Append { token, .. }
            | TxOp::AppendAt { token, .. }
            | TxOp::Fence { token, .. }
            | TxOp::Trim { token, .. }
            | TxOp::Delete { token, .. } => *token,
        }
    }

    /// The records it appends (none for a fence, trim or delete).
    pub fn payloads(&self) -> &[Bytes] {
        match self {
            TxOp::Append { payloads, .. } | TxOp::AppendAt { payloads, .. } => payloads,
            TxOp::Fence { .. } | TxOp::Trim { .. } | TxOp::Delete { .. } => &[],
        }
    }
}

/// A stream as the transaction sees it while deciding.
#[derive(Clone, Copy)]
struct Seen {
    /// The highest token the log holds, and the LSN of the entry that set
    /// it.
    logged: u64,
    logged_lsn: u64,
    /// The highest token counting the earlier ops of this transaction.
    highest: u64,
    next: u64,
    start: u64,
    last_lsn: u64,
}

/// What the serialized section decided for a transaction; the answer
/// waits for `ticket`.
pub(crate) struct TxDecision {
    pub(crate) then: Result<Vec<u64>>,
    pub(crate) ticket: Ticket,
}

impl TxDecision {
    fn rejected(index: usize, cause: Error, ticket: Ticket) -> Self {
        TxDecision {
            then: Err(Error::Aborted {
                index,
                cause: Box::new(cause),
            }),
            ticket,
        }
    }
}

pub(crate) fn decide(w: &mut Writer<'_, Core>, ops: &[TxOp]) -> Result<TxDecision> {
    let mut seen: HashMap<&[u8], Seen> = HashMap::new();
    let mut answers = Vec::with_capacity(ops.len());
    let mut encoded: Vec<Vec<u8>> = Vec::with_capacity(ops.len());
    for (index, tx_op) in ops.iter().enumerate() {
        let name: &[u8] = tx_op.stream();
        let s = match seen.get(name) {
            Some(s) => *s,
            None => {
                let key = w.state().key(name);
                crate::log::room_for(w, key).map_err(|e| Error::Aborted {
                    index,
                    cause: Box::new(e),
                })?;
                let (logged, logged_lsn) = w.state().highest(key);
                let (next, start, last_lsn) = w
                    .state()
                    .stream(key)
                    .map_or((0, 0, 0), |c| (c.next_offset, c.start_offset, c.last_lsn));
                Seen {
                    logged,
                    logged_lsn,
                    highest: logged,
                    next,
                    start,
                    last_lsn,
                }
            }
        };
        let token = tx_op.token().get();
        if token < s.logged {
            // A STALE answer waits until the token it cites is durable.
            let cause = Error::Stale {
                presented: token,
                highest: s.logged,
            };
            return Ok(TxDecision::rejected(
                index,
                cause,
                w.ticket_for(s.logged_lsn),
            ));
        }
        if token < s.highest {
            let cause = Error::invalid(
                "transaction",
                format!(
                    "token {token} is below token {} presented earlier in the same transaction",
                    s.highest
                ),
            );
            return Ok(TxDecision::rejected(index, cause, w.ticket_for(0)));
        }
        let mut after = s;
        after.highest = token;
        let (answer, bytes) = match tx_op {
            TxOp::Append { payloads, .. } | TxOp::AppendAt { payloads, .. } => {
                if let TxOp::AppendAt {
                    expected_offset, ..
                } = tx_op
                    && *expected_offset != s.next
                {
                    let cause = Error::OffsetMismatch {
                        expected: *expected_offset,
                        next: s.next,
                    };
                    return Ok(TxDecision::rejected(index, cause, w.ticket_for(s.last_lsn)));
                }
                let mut buf = vec![0u8; op::append_len(name, payloads.as_slice())];
                op::encode_append(&mut buf, name, token, s.next, payloads.as_slice());
                after.next = s.next + payloads.len() as u64;
                (s.next, buf)
            }
            TxOp::Fence { .. } => (
                after.highest,
                op::encode(&Op::Fence {
                    stream: name,
                    token,
                }),
            ),
            TxOp::Trim { before, .. } => {
                if *before > s.next {
                    let cause = Error::TrimBeyondEnd {
                        before: *before,
                        next: s.next,
                    };
                    return Ok(TxDecision::rejected(index, cause, w.ticket_for(s.last_lsn)));
                }
                after.start = s.start.max(*before);
                (
                    after.start,
                    op::encode(&Op::Trim {
                        stream: name,
                        token,
                        before: *before,
                    }),
                )
            }
            TxOp::Delete { .. } => {
                after.start = s.next;
                (
                    s.next - s.start,
                    op::encode(&Op::Delete {
                        stream: name,
                        token,
                    }),
                )
            }
        };
        seen.insert(name, after);
        answers.push(answer);
        encoded.push(bytes);
    }
    let at = crate::replicated::write_op(w, op::batch_len(&encoded), |buf| {
        op::encode_batch(buf, &encoded)
    })?;
    // Applied the way recovery applies it: decoded from what was written.
    for bytes in &encoded {
        let decoded = op::decode(bytes).map_err(internal)?;
        let effect = w.state().apply_op(&decoded, at).map_err(internal)?;
        w.on_durable(effect);
    }
    Ok(TxDecision {
        then: Ok(answers),
        ticket: w.ticket(),
    })
}

fn internal(why: String) -> Error {
    Error::invalid("internal state", why)
}

impl Log {
    /// Decides the ops of a transaction together, in order, each against
    /// the stream as the ops before it leave it, and writes them as one
    /// durable entry: all of them land, or none.
    ///
    /// Answers one value per op (an append: its first offset; a fence: the
    /// highest token; a trim: the new start offset; a delete: the records
    /// removed). If any op would be rejected, nothing is written and the
    /// answer is [`Error::Aborted`] naming that op and why (a STALE cause
    /// is answered once the token it cites is durable). A transaction too
    /// large for one entry is [`Error::TooLarge`].
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::Bytes;
    /// use fencelog::{Error, Log, Options, Token, TxOp};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// let t = |n| Token::new(n).unwrap();
    /// log.fence("b", t(9)).unwrap();
    /// let ops = vec![
    ///     TxOp::Append { stream: Bytes::from("a"), token: t(5), payloads: vec![Bytes::from("x")].into() },
    ///     TxOp::Append { stream: Bytes::from("b"), token: t(5), payloads: vec![Bytes::from("y")].into() },
    /// ];
    /// // The second op is stale: neither lands.
    /// assert!(matches!(log.transact(ops), Err(Error::Aborted { index: 1, .. })));
    /// assert_eq!(log.stat("a").unwrap().next_offset, 0);
    /// ```
    pub fn transact(&self, ops: Vec<TxOp>) -> Result<Vec<u64>> {
        self.check_tx(&ops)?;
        let d = self.decide(|w| decide(w, &ops))?;
        d.ticket.wait()?;
        self.count_tx(&ops, d.then)
    }

    /// The async form of [`Log::transact`].
    pub async fn transact_async(&self, ops: Vec<TxOp>) -> Result<Vec<u64>> {
        self.transact_deferred(ops).await?.await
    }

    /// The deferred form of [`Log::transact`] (see
    /// [`Log::append_deferred`]): decided now, answered once durable.
    pub async fn transact_deferred(&self, ops: Vec<TxOp>) -> Result<Deferred<Vec<u64>>> {
        self.check_tx(&ops)?;
        let d = self.decide_async(|w| decide(w, &ops)).await?;
        let log = self.clone();
        Ok(Deferred::new(async move {
            d.ticket.await?;
            log.count_tx(&ops, d.then)
        }))
    }

    /// Any one write, decided now as its own method decides it (not as a
    /// transaction of one) and answered once durable: an append's first
    /// offset, a fence's highest token, a trim's new start offset, a
    /// delete's count of records removed. The one place a caller that holds
    /// a [`TxOp`] (the server's commands) meets the single-op methods.
    ///
    /// Unlike [`Log::append_deferred`], an append here is not first looked
    /// at without the write lock: a caller that holds a `TxOp` has checked
    /// its arguments already, stale token included ([`Log::check_append`],
    /// as the server does before it builds the op), and would pay for that
    /// lookup twice. A stale append is still rejected, by its decision,
    /// with the same error.
    pub async fn write_deferred(&self, op: TxOp) -> Result<Deferred<u64>> {
        match op {
            TxOp::Append {
                stream,
                token,
                payloads,
            } => {
                self.append_deferred_after(false, &stream, token, payloads)
                    .await
            }
            TxOp::AppendAt {
                stream,
                token,
                expected_offset,
                payloads,
            } => {
                self.append_at_deferred(&stream, token, expected_offset, payloads)
                    .await
            }
            TxOp::Fence { stream, token } => {
                self.fence_deferred_as(&stream, token, Token::get).await
            }
            TxOp::Trim {
                stream,
                token,
                before,
            } => self.trim_deferred(&stream, token, before).await,
            TxOp::Delete { stream, token } => self.delete_deferred(&stream, token).await,
        }
    }

    /// The checks before the write lock: arguments, limits, and the fast
    /// path (a token below a durable highest rejects the whole
    /// transaction at once).
    pub(crate) fn check_tx(&self, ops: &[TxOp]) -> Result<()> {
        self.check_tx_shape(ops)?;
        for (index, tx_op) in ops.iter().enumerate() {
            let views = &self.inner().views;
            let highest = views.durable_highest(views.key(tx_op.stream()));
            let token = tx_op.token().get();
            if token < highest {
                self.inner().counters.stale.add(1);
                return Err(Error::Aborted {
                    index,
                    cause: Box::new(Error::Stale {
                        presented: token,
                        highest,
                    }),
                });
            }
        }
        Ok(())
    }

    /// The checks of arguments and limits alone (no fast path: a replica
    /// decides every token inside the serialized section).
    pub(crate) fn check_tx_shape(&self, ops: &[TxOp]) -> Result<()> {
        if ops.is_empty() {
            return Err(Error::invalid("transaction", "no ops"));
        }
        let aborted = |index, cause| Error::Aborted {
            index,
            cause: Box::new(cause),
        };
        for (index, tx_op) in ops.iter().enumerate() {
            check_stream_name(tx_op.stream()).map_err(|e| aborted(index, e))?;
            if let TxOp::Append { payloads, .. } | TxOp::AppendAt { payloads, .. } = tx_op {
                check_payloads(self.options(), payloads).map_err(|e| aborted(index, e))?;
            }
        }
        Ok(())
    }

    pub(crate) fn count_tx(&self, ops: &[TxOp], result: Result<Vec<u64>>) -> Result<Vec<u64>> {
        let c = &self.inner().counters;
        match &result {
            Ok(_) => {
                c.transactions.add(1);
                for tx_op in ops {
                    match tx_op {
                        TxOp::Append { payloads, .. } | TxOp::AppendAt { payloads, .. } => {
                            c.appends.add(1);
                            c.records.add(payloads.len() as u64);
                            c.bytes.add(payloads.iter().map(|p| p.len() as u64).sum());
                        }
                        TxOp::Fence { .. } => c.fences.add(1),
                        TxOp::Trim { .. } => c.trims.add(1),
                        TxOp::Delete { .. } => c.deletes.add(1),
                    }
                }
            }
            Err(Error::Aborted { cause, .. }) => match **cause {
                Error::Stale { .. } => c.stale.add(1),
                Error::OffsetMismatch { .. } => c.mismatches.add(1),
                _ => {}
            },
            Err(_) => {}
        }
        result
    }
}
