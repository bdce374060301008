//! # fencelog-wal
//!
//! The write-ahead log under fencelog: segment files, entry encoding, group
//! commit, recovery, and reads through bounded caches of open files and
//! footers. It knows bytes and entries, not streams or tokens.
//!
//! - **Group commit.** Any number of threads and async tasks call
//!   [`Wal::submit`]. Inside, under one lock, the caller's [`Sequencer`]
//!   state decides each submission in queue order and encodes accepted ones
//!   straight into the next batch. A dedicated sync thread writes each batch
//!   with one write and one `fdatasync`, then completes every [`Ticket`] of
//!   the batch. Decisions never wait for a sync: the next batch fills while
//!   the current one is on its way to the disk.
//! - **Segments** are preallocated, named so they sort, and carry a magic
//!   number, a format version and their sequence number. Each opens with a
//!   checkpoint of the caller's state (or, when checkpoints are large, a
//!   link back to an older one); a sealed one ends with a footer the caller
//!   fills (an index, say), so that opening the log reads only the tail.
//! - **Recovery** checks every checksum of the tail, cuts a torn tail,
//!   refuses damage to acknowledged entries (see [`RecoveryMode`]).
//! - **Failure latch.** After a failed write or sync, every write fails until
//!   the log is reopened; a failed `fdatasync` is never retried.
//! - **Storage** goes through [`Storage`]: real files ([`FsStorage`]), or a
//!   crash-simulating in-memory file system ([`SimStorage`]) for tests.
//!
//! The byte layout is in `docs/FORMAT.md` and [`format`](mod@format).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![warn(missing_docs)]

mod comeback;
mod error;
mod files;
pub mod format;
mod lock;
pub mod marks;
mod options;
mod read_ahead;
mod recovery;
mod segment;
mod stats;
mod storage;
mod ticket;
mod turns;
mod verify;
mod wal;

pub use comeback::WriterWaits;
pub use error::WalError;
pub use format::EntryKind;
pub use marks::Marks;
pub use options::{Preallocation, RecoveryMode, WalOptions};
pub use recovery::{Cut, CutKind, FloorRaise, RecoveryReport, plan_recovery};
pub use segment::Entry;
pub use stats::{Histogram, HistogramSnapshot, StripedCounter, WalStats, WalStatsSnapshot};
pub use storage::{CrashMode, DirLock, Faults, FsStorage, SimStorage, Storage, StorageFile};
pub use ticket::Ticket;
pub use turns::{Member, Turns};
pub use verify::{SegmentReport, VerifiedEntry, VerifyReport, verify};
pub use wal::{
    Appended, Durable, FillFooter, FooterPayload, Removal, Replay, ReplayEntry, SegmentEnd,
    SegmentReader, Sequencer, Wal, Writer,
};
