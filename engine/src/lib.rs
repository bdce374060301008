//! # fencelog
//!
//! A fenced append-only storage engine. A distributed lock's lease can
//! expire while its holder is only paused; when the holder wakes, its late
//! write still lands. fencelog makes such writes harmless: every write
//! carries a fencing [`Token`], each stream keeps the highest token it
//! accepted, and a write with an older token is rejected
//! ([`Error::Stale`]), with the decision persisted in the same synced log
//! entry as the record, so no crash can reorder the two.
//!
//! ```
//! use fencelog::{Error, Log, Options, Token};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let log = Log::open(dir.path(), Options::default()).unwrap();
//!
//! // Owner A holds token 7 and writes.
//! let a = Token::new(7).unwrap();
//! log.append("jobs", a, &[b"step 1"]).unwrap();
//!
//! // A pauses; its lease expires; B gets token 8 and fences the stream.
//! let b = Token::new(8).unwrap();
//! log.fence("jobs", b).unwrap();
//!
//! // A wakes up and tries to write: rejected, and nothing changed.
//! assert!(matches!(
//!     log.append("jobs", a, &[b"step 2"]),
//!     Err(Error::Stale { presented: 7, highest: 8 })
//! ));
//! assert_eq!(log.stat("jobs").unwrap().next_offset, 1);
//! ```
//!
//! ## The rule
//!
//! Every operation that changes a stream — [`Log::append`],
//! [`Log::append_at`], [`Log::fence`], [`Log::trim`], [`Log::delete`], and
//! a lease acquisition with `fence` — carries a token `t`: `t` below the
//! stream's highest is rejected and changes nothing; otherwise it is
//! accepted and the highest becomes `t`. Equal tokens are accepted (one
//! owner writes many records). The caller is answered only once the entry
//! is durable; a rejection is answered only once the token it cites is
//! durable.
//!
//! ## Storage
//!
//! All streams share one write-ahead log ([`fencelog_wal`]) with group
//! commit: concurrent writers share one write and one `fdatasync`. Every
//! segment opens with a checkpoint of the engine's state, and a sealed
//! segment ends with an index of its records, so [`Log::open`] reads only
//! the log's tail. Memory: 32 bytes per
//! entry (an append of any number of records) in the segment being written,
//! plus 32 bytes per stream per sealed segment it has records in; the index
//! of sealed segments stays on disk, memory-mapped.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![warn(missing_docs)]

mod checkpoint;
mod command_codec;
mod core;
mod error;
mod footer;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod gc;
pub mod inspect;
mod lease;
mod lease_api;
mod locate;
mod log;
mod metrics;
mod op;
mod options;
mod proposal;
mod records;
mod replicated;
mod replicated_apply;
mod token;
mod tx;
mod view;

pub use command_codec::CommandDecodeError;
pub use error::{Error, Result};
pub use fencelog_wal::{self as wal, RecoveryMode, RecoveryReport, WalOptions};
pub use lease::{Clock, ManualClock, MonotonicClock};
pub use lease_api::{AcquireOptions, Grant, LeaseInfo, MAX_OWNER};
pub use log::{Deferred, Log, ReadOptions, Record, StreamStat};
pub use metrics::Metrics;
pub use options::Options;
pub use proposal::{AppendInPlace, Proposal, Proposed};
pub use replicated::{Applied, Command, GroupLimits, LogPosition, Refusal};
pub use token::{MAX_STREAM_NAME, MAX_TOKEN, Offset, Token};
pub use tx::{Payloads, TxOp};
