//! Typed errors: the server's refusals by code, and the client's own.

use std::time::Duration;

/// What a call can fail with.
///
/// The server's refusals (`STALE`, `MISMATCH`, `TRIMMED`, `HELD`, `LOST`,
/// `TOOBIG`, `UNCERTAIN`) have their own variants with the numbers they
/// name; every other server error is [`Error::Server`] with its text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The token is below the stream's highest accepted token: a newer
    /// owner exists. Stop writing.
    #[error("stale token: {presented} is below the highest accepted token {highest}")]
    Stale {
        /// The token this client sent.
        presented: u64,
        /// The stream's highest accepted token.
        highest: u64,
    },
    /// `append_at`'s expected offset is not the stream's next offset.
    #[error("offset mismatch: expected offset {expected} but the next offset is {next}")]
    Mismatch {
        /// The offset this client expected.
        expected: u64,
        /// The stream's next offset.
        next: u64,
    },
    /// A read from below the stream's start offset.
    #[error("offset {requested} is below the start offset {start}")]
    Trimmed {
        /// The offset this client asked for.
        requested: u64,
        /// The stream's start offset.
        start: u64,
    },
    /// The lease is held by another owner.
    #[error("lease is held by another owner for {remaining:?}")]
    Held {
        /// How long the other owner's lease has left, on the server's clock.
        remaining: Duration,
    },
    /// The lease is not held by this owner and token (expired, replaced,
    /// released), or a [`crate::Lease`] knows it can no longer be sure it
    /// holds it.
    #[error("lease lost: not held by this owner and token")]
    Lost,
    /// A payload, an entry or a request over a server limit.
    #[error("too big: {0}")]
    TooBig(String),
    /// The outcome of a write is unknown: it may or may not be in the log
    /// (the cluster node stopped leading with it in flight, or a lease was
    /// lost before its write could be retried).
    #[error("outcome unknown: the write may or may not have been applied")]
    Uncertain,
    /// The connection failed or timed out (`ErrorKind::TimedOut`). For a
    /// write sent before the failure the outcome is unknown.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The server's reply broke the protocol or a reply limit; the
    /// connection was dropped.
    #[error("protocol: {0}")]
    Protocol(String),
    /// An argument this client refuses before sending (an empty append,
    /// a ttl below 10 ms, a configuration that cannot work).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Any other error the server answered, with its text (`ERR …`,
    /// `NOAUTH …`, `WRONGPASS …`, `IOERR …`, `TRYAGAIN` once the retry
    /// time ran out).
    #[error("server: {0}")]
    Server(String),
}

impl Error {
    /// The typed form of an error reply's text.
    pub(crate) fn from_server(text: &str) -> Error {
        let code = text.split_whitespace().next().unwrap_or("");
        let numbers = numbers(text);
        let two = |f: fn(u64, u64) -> Error| match numbers.as_slice() {
            [a, b, ..] => f(*a, *b),
            _ => Error::Server(text.to_string()),
        };
        match code {
            "STALE" => two(|presented, highest| Error::Stale { presented, highest }),
            "MISMATCH" => two(|expected, next| Error::Mismatch { expected, next }),
            "TRIMMED" => two(|requested, start| Error::Trimmed { requested, start }),
            "HELD" => match numbers.first() {
                Some(&ms) => Error::Held {
                    remaining: Duration::from_millis(ms),
                },
                None => Error::Server(text.to_string()),
            },
            "LOST" => Error::Lost,
            "TOOBIG" => Error::TooBig(text.to_string()),
            "UNCERTAIN" => Error::Uncertain,
            _ => Error::Server(text.to_string()),
        }
    }

    /// Whether a write that failed so may still have been applied: its
    /// reply was lost (I/O error, timeout) or the server said `UNCERTAIN`.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Error::Io(_) | Error::Uncertain)
    }

    pub(crate) fn timed_out(what: &str) -> Error {
        Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            what.to_string(),
        ))
    }
}

/// The decimal numbers in a message, in order (those too long for a u64
/// are skipped).
fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_words_become_typed_errors() {
        assert!(matches!(
            Error::from_server("STALE token 41 is below the highest accepted token 42"),
            Error::Stale {
                presented: 41,
                highest: 42
            }
        ));
        assert!(matches!(
            Error::from_server("MISMATCH expected offset 5 but the next offset is 7"),
            Error::Mismatch {
                expected: 5,
                next: 7
            }
        ));
        assert!(matches!(
            Error::from_server("TRIMMED offset 3 is below the start offset 10"),
            Error::Trimmed {
                requested: 3,
                start: 10
            }
        ));
        match Error::from_server("HELD lease is held by another owner for 1200 ms") {
            Error::Held { remaining } => assert_eq!(remaining, Duration::from_millis(1200)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Error::from_server("LOST lease is not held by this owner and token"),
            Error::Lost
        ));
        assert!(matches!(
            Error::from_server("UNCERTAIN x"),
            Error::Uncertain
        ));
        assert!(matches!(
            Error::from_server("TOOBIG payload"),
            Error::TooBig(_)
        ));
        assert!(matches!(
            Error::from_server("STALE garbled"),
            Error::Server(_)
        ));
        assert!(matches!(
            Error::from_server("ERR syntax error"),
            Error::Server(_)
        ));
    }
}
