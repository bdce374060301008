//! The engine's errors. Each variant carries the numbers a caller needs: a
//! stale write names the token it presented and the highest one accepted.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use fencelog_wal::WalError;

/// What the engine answers when an operation does not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The token is below the stream's highest accepted token: a newer owner
    /// exists. Nothing changed. `highest` is durable.
    #[error("token {presented} is below the highest accepted token {highest}")]
    Stale {
        /// The token the caller presented.
        presented: u64,
        /// The stream's highest accepted token (durable).
        highest: u64,
    },

    /// A conditional append expected another next offset. Nothing changed.
    #[error("expected offset {expected} but the next offset is {next}")]
    OffsetMismatch {
        /// The offset the caller expected.
        expected: u64,
        /// The stream's next offset.
        next: u64,
    },

    /// A read started below the stream's start offset: those records were
    /// trimmed or deleted.
    #[error("offset {requested} is below the start offset {start}")]
    Trimmed {
        /// The offset the caller asked for.
        requested: u64,
        /// The stream's start offset.
        start: u64,
    },

    /// A trim past the end of the stream.
    #[error("cannot trim before offset {before}: the next offset is {next}")]
    TrimBeyondEnd {
        /// The offset the caller asked to trim before.
        before: u64,
        /// The stream's next offset.
        next: u64,
    },

    /// A payload, entry, name or request over a configured limit.
    #[error("{what} of {len} is over the limit of {max}")]
    TooLarge {
        /// What was too large ("payload bytes", "records per append", …).
        what: &'static str,
        /// Its size.
        len: u64,
        /// The limit.
        max: u64,
    },

    /// An argument outside its valid range (a token of 0, an empty stream
    /// name, an owner with a space, …).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },

    /// A lease is held by another owner (or by this owner, expired, under
    /// another token).
    #[error("lease is held by another owner for {remaining_ms} ms")]
    Held {
        /// How long the current lease has left.
        remaining_ms: u64,
    },

    /// The lease is not held by this owner and token (expired, released or
    /// replaced): it is never revived.
    #[error("lease is not held by this owner and token")]
    Lost,

    /// Too many live leases.
    #[error("{live} live leases: the limit is {max}")]
    TooManyLeases {
        /// Live leases now.
        live: u64,
        /// The configured limit.
        max: u64,
    },

    /// Storage failed during this operation.
    #[error(transparent)]
    Io(WalError),

    /// An earlier write or sync failed: the log accepts no writes until it is
    /// reopened; durable reads go on. The outcome of writes that were
    /// pending then is unknown.
    #[error(
        "the log stopped accepting writes after an I/O failure ({cause}); reopen it to recover"
    )]
    Failed {
        /// The failure that stopped the log.
        #[source]
        cause: Arc<io::Error>,
    },

    /// Damage on disk where acknowledged data should be.
    #[error("{file}: corrupt at byte {position}: {reason}")]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// Byte position of the damage.
        position: u64,
        /// What is wrong.
        reason: String,
    },

    /// An op of a transaction was rejected, so none of the transaction's
    /// ops was applied.
    #[error("op {index} of the transaction was rejected ({cause}); nothing was applied")]
    Aborted {
        /// Which op (from 0).
        index: usize,
        /// Why it was rejected.
        cause: Box<Error>,
    },

    /// The data directory is in use by another process or handle.
    #[error("{dir} is in use by another process (it holds {dir}/LOCK)")]
    Locked {
        /// The data directory.
        dir: PathBuf,
    },

    /// Cluster mode: this replica decided differently from the leader at
    /// some entry at or before `index`: its state can no longer be trusted
    /// and it stops applying.
    #[error(
        "replica diverged: after position {index} its digest is {here:#018x}, the leader's \
         {leader:#018x}; it stops applying (rebuild it from a snapshot of the group)"
    )]
    Diverged {
        /// The engine position ([`crate::LogPosition::index`]) compared.
        index: u64,
        /// This replica's digest there.
        here: u64,
        /// The leader's.
        leader: u64,
    },
}

impl Error {
    /// Whether this is a failure of this replica's own storage (or state),
    /// not a decision: in cluster mode every other error at apply is a
    /// refusal, answered alike on every replica.
    pub fn is_local_failure(&self) -> bool {
        matches!(
            self,
            Error::Io(_)
                | Error::Failed { .. }
                | Error::Corrupt { .. }
                | Error::Locked { .. }
                | Error::Diverged { .. }
        )
    }
}

impl From<WalError> for Error {
    fn from(e: WalError) -> Self {
        match e {
            WalError::Failed { cause } => Error::Failed { cause },
            WalError::Corrupt {
                file,
                position,
                reason,
            } => Error::Corrupt {
                file,
                position,
                reason,
            },
            WalError::Locked { dir } => Error::Locked { dir },
            WalError::InvalidOptions { name, reason } => Error::Invalid { what: name, reason },
            WalError::TooLarge { len, max } => Error::TooLarge {
                what: "entry bytes",
                len,
                max,
            },
            other => Error::Io(other),
        }
    }
}

impl Error {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Error {
        Error::Invalid {
            what,
            reason: reason.into(),
        }
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
