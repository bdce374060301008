//! The log's errors. Every variant carries what a person needs to act on it:
//! the file, the position, the numbers.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong in the write-ahead log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WalError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done ("write", "fdatasync", "open", …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },

    /// A segment holds damaged bytes where acknowledged data should be.
    #[error(
        "{file}: corrupt at byte {position}: {reason}; open with RecoveryMode::Salvage to keep what precedes it"
    )]
    Corrupt {
        /// The segment file.
        file: PathBuf,
        /// Byte position of the damage in that file.
        position: u64,
        /// What is wrong there.
        reason: String,
    },

    /// A segment was written by a format version this build cannot read.
    #[error(
        "{file}: format version {found} is not supported (this build reads version {supported})"
    )]
    UnknownVersion {
        /// The segment file.
        file: PathBuf,
        /// The version in its header.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },

    /// An earlier write or sync failed: the log accepts no more writes until
    /// it is reopened. A failed sync is never retried (its data may be gone).
    #[error(
        "the log stopped accepting writes after an I/O failure ({cause}); reopen it to recover"
    )]
    Failed {
        /// The failure that stopped the log.
        #[source]
        cause: Arc<io::Error>,
    },

    /// An entry over the configured limit.
    #[error("an entry of {len} bytes is over the limit of {max} bytes")]
    TooLarge {
        /// The entry's payload length.
        len: u64,
        /// The configured `max_entry_bytes`.
        max: u64,
    },

    /// The data directory is in use by another process or handle.
    #[error("{dir} is in use by another process (it holds {dir}/LOCK)")]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },

    /// An option is out of range.
    #[error("invalid option {name}: {reason}")]
    InvalidOptions {
        /// The option's name.
        name: &'static str,
        /// Why it was refused.
        reason: String,
    },

    /// A read asked for an entry that is not (or not yet) in the log.
    #[error("no durable entry at byte {position} of segment {segment}")]
    NoEntry {
        /// The segment's sequence number.
        segment: u64,
        /// The position asked for.
        position: u64,
    },

    /// The log was closed.
    #[error("the log is closed")]
    Closed,
}

impl WalError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> WalError {
        WalError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Whether this is damage on disk (as opposed to an environment problem).
    pub fn is_corruption(&self) -> bool {
        matches!(self, WalError::Corrupt { .. })
    }
}
