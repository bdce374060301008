//! Log entries as tools see them (`fencelog verify`, `fencelog dump`): what
//! an entry of the write-ahead log means to the engine, decoded and checked
//! the way recovery decodes it.
//!
//! # Examples
//!
//! ```
//! use fencelog::inspect::{EntryView, describe};
//! use fencelog::wal::{EntryKind, FsStorage, verify};
//! use fencelog::{Log, Options, Token};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let log = Log::open(dir.path(), Options::default()).unwrap();
//! log.append("s", Token::new(3).unwrap(), &["a", "b"]).unwrap();
//! drop(log);
//!
//! let mut appends = Vec::new();
//! verify(&FsStorage, dir.path(), |e| {
//!     if let Ok(EntryView::Append { stream, token, records, .. }) = describe(e.kind, e.payload) {
//!         appends.push((stream.to_vec(), token, records));
//!     }
//! }, |_, _| {}).unwrap();
//! assert_eq!(appends, vec![(b"s".to_vec(), 3, 2)]);
//! ```

use fencelog_wal::EntryKind;

use crate::checkpoint;
use crate::op::{self, Op};

/// A stream as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStream {
    /// The stream's name.
    pub name: Vec<u8>,
    /// Its highest token.
    pub highest_token: u64,
    /// Its next offset.
    pub next_offset: u64,
    /// Its start offset.
    pub start_offset: u64,
}

/// What one log entry means.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryView<'a> {
    /// The engine's state at the start of a segment.
    Checkpoint {
        /// Every stream.
        streams: Vec<CheckpointStream>,
        /// Live leases.
        leases: usize,
        /// The highest lease token issued.
        last_token: u64,
    },
    /// A segment that opens without a checkpoint (replay reaches it from
    /// an older segment's).
    Link,
    /// Records appended.
    Append {
        /// The stream.
        stream: &'a [u8],
        /// The token the append carried.
        token: u64,
        /// The offset of its first record.
        first_offset: u64,
        /// How many records.
        records: u32,
        /// Each record's payload.
        payloads: Vec<&'a [u8]>,
    },
    /// The stream's highest token raised.
    Fence {
        /// The stream.
        stream: &'a [u8],
        /// The new highest token.
        token: u64,
    },
    /// Records below `before` trimmed.
    Trim {
        /// The stream.
        stream: &'a [u8],
        /// The token.
        token: u64,
        /// The new start offset (at least).
        before: u64,
    },
    /// Every record deleted.
    Delete {
        /// The stream.
        stream: &'a [u8],
        /// The token.
        token: u64,
    },
    /// A lease granted.
    Acquire {
        /// The lease (and, with `fence`, the stream).
        name: &'a [u8],
        /// The holder.
        owner: &'a [u8],
        /// The token issued.
        token: u64,
        /// Its ttl.
        ttl_ms: u64,
        /// Whether the stream of the same name was fenced with it.
        fence: bool,
    },
    /// A lease released.
    Release {
        /// The lease.
        name: &'a [u8],
        /// The holder.
        owner: &'a [u8],
        /// Its token.
        token: u64,
    },
    /// A lease's ttl lengthened.
    Renew {
        /// The lease.
        name: &'a [u8],
        /// The holder.
        owner: &'a [u8],
        /// Its token.
        token: u64,
        /// The new ttl.
        ttl_ms: u64,
    },
    /// A transaction: stream ops (appends, fences, trims, deletes) decided
    /// together, in order, written as one entry.
    Transaction {
        /// Its ops, in order.
        ops: Vec<EntryView<'a>>,
    },
    /// A replica applied an entry of the replicated log (cluster mode).
    Replicated {
        /// The leader's term.
        term: u64,
        /// The leader's node id.
        node: u64,
        /// The entry's index in the replicated log.
        index: u64,
        /// The leader's clock when it proposed the entry, in ms.
        time_ms: u64,
        /// What it changed (none: only the position moved).
        op: Option<Box<EntryView<'a>>>,
    },
    /// The cluster's membership (opaque to the engine).
    Membership {
        /// As the replication layer encodes it.
        config: &'a [u8],
    },
    /// A new leader took over: every live lease restarted its full ttl.
    TakeOver,
    /// The group's limits changed (cluster mode).
    Limits {
        /// The new limits.
        limits: crate::GroupLimits,
    },
}

impl EntryView<'_> {
    /// Whether the entry concerns stream or lease `name` (a transaction:
    /// any of its ops).
    pub fn concerns(&self, name: &[u8]) -> bool {
        match self {
            EntryView::Transaction { ops } => ops.iter().any(|o| o.concerns(name)),
            EntryView::Replicated { op, .. } => op.as_ref().is_some_and(|o| o.concerns(name)),
            other => other.name() == Some(name),
        }
    }

    /// The stream or lease the entry concerns, if one (`None` for a
    /// checkpoint and a transaction).
    pub fn name(&self) -> Option<&[u8]> {
        match self {
            EntryView::Checkpoint { .. }
            | EntryView::Transaction { .. }
            | EntryView::Link
            | EntryView::Membership { .. }
            | EntryView::TakeOver
            | EntryView::Limits { .. } => None,
            EntryView::Replicated { op, .. } => op.as_ref().and_then(|o| o.name()),
            EntryView::Append { stream, .. }
            | EntryView::Fence { stream, .. }
            | EntryView::Trim { stream, .. }
            | EntryView::Delete { stream, .. } => Some(stream),
            EntryView::Acquire { name, .. }
            | EntryView::Release { name, .. }
            | EntryView::Renew { name, .. } => Some(name),
        }
    }
}

/// Decodes an entry's payload; an error (never a panic) on anything
/// malformed.
pub fn describe(kind: EntryKind, payload: &[u8]) -> Result<EntryView<'_>, String> {
    match kind {
        EntryKind::Checkpoint => {
            let c = checkpoint::decode(payload)?;
            Ok(EntryView::Checkpoint {
                streams: c
                    .streams
                    .into_iter()
                    .map(|s| CheckpointStream {
                        name: s.name,
                        highest_token: s.highest,
                        next_offset: s.next_offset,
                        start_offset: s.start_offset,
                    })
                    .collect(),
                leases: c.leases.len(),
                last_token: c.last_token,
            })
        }
        EntryKind::Link if payload.is_empty() => Ok(EntryView::Link),
        EntryKind::Link => Err(format!(
            "a link of {} bytes (links are empty)",
            payload.len()
        )),
        EntryKind::Record => Ok(view_of(op::decode(payload)?)),
    }
}

fn view_of(op: Op<'_>) -> EntryView<'_> {
    match op {
        Op::Replicated {
            term,
            node,
            index,
            time_ms,
            inner,
        } => EntryView::Replicated {
            term,
            node,
            index,
            time_ms,
            // Checked by the decoder when it decoded the wrapper.
            op: op::decode(inner).ok().map(|o| Box::new(view_of_op(o))),
        },
        Op::Membership { config } => EntryView::Membership { config },
        Op::TakeOver => EntryView::TakeOver,
        Op::Limits { limits } => EntryView::Limits { limits },
        other => view_of_op(other),
    }
}

fn view_of_op(op: Op<'_>) -> EntryView<'_> {
    match op {
        Op::Append {
            stream,
            token,
            first_offset,
            count,
            records,
        } => EntryView::Append {
            stream,
            token,
            first_offset,
            records: count,
            payloads: op::records(records).map(|(s, e)| &records[s..e]).collect(),
        },
        Op::Fence { stream, token } => EntryView::Fence { stream, token },
        Op::Trim {
            stream,
            token,
            before,
        } => EntryView::Trim {
            stream,
            token,
            before,
        },
        Op::Delete { stream, token } => EntryView::Delete { stream, token },
        Op::Acquire {
            name,
            owner,
            token,
            ttl_ms,
            fence,
        } => EntryView::Acquire {
            name,
            owner,
            token,
            ttl_ms,
            fence,
        },
        Op::Release { name, owner, token } => EntryView::Release { name, owner, token },
        Op::Renew {
            name,
            owner,
            token,
            ttl_ms,
        } => EntryView::Renew {
            name,
            owner,
            token,
            ttl_ms,
        },
        Op::Batch { ops, .. } => EntryView::Transaction {
            ops: op::batch_ops(ops).map(view_of).collect(),
        },
        // Handled by `view_of`; a wrapper is never inside another.
        Op::Replicated { .. } | Op::Membership { .. } | Op::TakeOver | Op::Limits { .. } => {
            view_of(op)
        }
    }
}
