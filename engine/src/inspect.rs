//! Log entries as tools see them (`fencelog verify`, `fencelog dump`): what
//! an entry of the write-ahead log means to the engine, decoded and checked
//! the way recovery decodes it: a checkpoint, a link, or the engine's own
//! [`Op`].
//!
//! # Examples
//!
//! ```
//! use fencelog::inspect::{EntryView, Op, describe};
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
//!     if let Ok(EntryView::Op(Op::Append(a))) = describe(e.kind, e.payload) {
//!         appends.push((a.stream.to_vec(), a.token, a.payloads().map(<[u8]>::to_vec).collect::<Vec<_>>()));
//!     }
//! }, |_, _| {}).unwrap();
//! assert_eq!(appends, vec![(b"s".to_vec(), 3, vec![b"a".to_vec(), b"b".to_vec()])]);
//! ```

use fencelog_wal::EntryKind;

use crate::checkpoint;
use crate::op;
pub use crate::op::{Acquire, Append, Op};

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
    /// An op the engine wrote (a record entry).
    Op(Op<'a>),
}

impl EntryView<'_> {
    /// Whether the entry concerns stream or lease `name` (see
    /// [`Op::concerns`]; never a checkpoint or a link).
    pub fn concerns(&self, name: &[u8]) -> bool {
        matches!(self, EntryView::Op(op) if op.concerns(name))
    }

    /// The stream or lease the entry concerns, if one (see [`Op::name`];
    /// `None` for a checkpoint and a link).
    pub fn name(&self) -> Option<&[u8]> {
        match self {
            EntryView::Op(op) => op.name(),
            EntryView::Checkpoint { .. } | EntryView::Link => None,
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
        EntryKind::Record => Ok(EntryView::Op(op::decode(payload)?)),
    }
}
