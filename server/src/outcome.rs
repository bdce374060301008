//! What running a command gives: a reply now, or an answer to come, and
//! how the engine's errors are worded on the wire.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fencelog::{Deferred, Error};

use crate::protocol::{Reply, STALE_HEAD, STALE_MIDDLE};

/// A boxed future that may move between threads.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A decided write's answer to come, once durable (a single node's): an
/// offset, a count or a token, as [`fencelog::Log::write_deferred`] says.
pub struct Later(pub Deferred<u64>);

impl Later {
    /// The answer, if it has come (polled in place: a connection keeps its
    /// answers in a queue without boxing each again).
    pub fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<fencelog::Result<u64>> {
        Pin::new(&mut self.0).poll(cx)
    }

    /// Waits for the answer.
    pub async fn result(mut self) -> fencelog::Result<u64> {
        std::future::poll_fn(|cx| self.poll_result(cx)).await
    }
}

/// An answer to come, in the connection's order.
pub type ReplyFuture = BoxFuture<'static, Reply>;

/// Told the payload bytes a read has gathered so far, between its steps
/// (the connection reports them to the budget over all clients).
pub type ReadProgress = Arc<dyn Fn(usize) + Send + Sync>;

/// How a command is answered.
pub enum Outcome {
    /// Now.
    Reply(Reply),
    /// When the decided write is durable (polled through the connection's
    /// relay: one wake-up per thread and group commit).
    Later(Later),
    /// Later, in order behind the answers before it (a replicated write,
    /// a read after its round).
    Pending(ReplyFuture),
    /// Now, then the connection closes.
    Close(Reply),
    /// A write taken together with the pipelined writes next to it: the
    /// connection proposes them as one (`Store::write_together`) and
    /// answers each in its place. Only for a request the connection runs
    /// with `Session::together` set.
    Together(fencelog::TxOp),
    /// A command that may wait (LOG.READ BLOCK, LEASE.ACQUIRE WAIT) or
    /// reads in steps: run while watching the connection, so that a client
    /// that goes away takes nothing.
    Blocking(Blocking),
    /// A reply too large for the client's output limit (an `EXEC` of many
    /// reads): the client is disconnected, as Redis does past
    /// `client-output-buffer-limit`.
    OverOutputLimit {
        /// Bytes of the reply gathered so far.
        reply_bytes: usize,
        /// `--client-output-buffer-limit`.
        limit_bytes: usize,
        /// Whether a transaction's writes were applied before (they are
        /// durable; only their answer is lost).
        transaction_applied: bool,
    },
}

impl Outcome {
    /// Its reply, once it has come; a command that could wait answers at
    /// once (`EXEC` runs its queued commands this way).
    pub async fn into_reply(self) -> Reply {
        match self {
            Outcome::Reply(r) | Outcome::Close(r) => r,
            Outcome::Blocking(b) => b.run(None).await,
            Outcome::Later(later) => match later.result().await {
                Ok(n) => number(n),
                Err(e) => error_reply(&e),
            },
            Outcome::Pending(answer) => answer.await,
            // Never: only a connection's pipelined writes are taken
            // together, and it answers them itself.
            Outcome::Together(op) => Reply::Error(format!(
                "ERR internal: a write to {} was taken with others where it is answered alone",
                String::from_utf8_lossy(op.stream())
            )),
            Outcome::OverOutputLimit { .. } => {
                Reply::Error("ERR the reply is over the client output buffer limit".into())
            }
        }
    }
}

/// A command that may take a while.
pub struct Blocking {
    /// Runs it to its answer; a read tells the progress what it gathers.
    run: Box<dyn FnOnce(Option<ReadProgress>) -> ReplyFuture + Send>,
    /// What a client waiting in it is told when the server shuts down
    /// (`None`: it does not wait, and finishes).
    on_shutdown: Option<Reply>,
}

impl Blocking {
    /// A command run by `run`, answering `on_shutdown` if the server stops
    /// while it waits.
    pub fn new(
        on_shutdown: Option<Reply>,
        run: impl FnOnce(Option<ReadProgress>) -> ReplyFuture + Send + 'static,
    ) -> Blocking {
        Blocking {
            run: Box::new(run),
            on_shutdown,
        }
    }

    /// Runs it to its answer. Dropping the future gives up the wait and
    /// takes nothing (an acquisition decided meanwhile is released).
    pub fn run(self, progress: Option<ReadProgress>) -> ReplyFuture {
        (self.run)(progress)
    }

    /// What a client waiting in this command is told when the server shuts
    /// down; `None`: it finishes.
    pub fn shutdown_reply(&self) -> Option<Reply> {
        self.on_shutdown.clone()
    }
}

/// An integer reply (saturating: the wire's integers are signed).
pub fn number(n: u64) -> Reply {
    Reply::Integer(crate::protocol::saturated(n))
}

/// `STALE token 41 is below the highest accepted token 42`, in one
/// allocation of the right size: the reply of every rejection, so without
/// the formatting machinery.
fn stale_text(presented: u64, highest: u64) -> String {
    const HEAD: &str = STALE_HEAD;
    const MIDDLE: &str = STALE_MIDDLE;
    let (mut p, mut h) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (p, h) = (p.format(presented), h.format(highest));
    let mut text = String::with_capacity(HEAD.len() + p.len() + MIDDLE.len() + h.len());
    text.push_str(HEAD);
    text.push_str(p);
    text.push_str(MIDDLE);
    text.push_str(h);
    debug_assert_eq!(text.len(), text.capacity());
    text
}

/// A stale write's error, as [`error_reply`] words it, in the form that
/// is encoded without building its text: the answer of every refusal on
/// the fast path.
pub fn stale_reply(presented: u64, highest: u64) -> Reply {
    debug_assert!(presented < highest, "a STALE answer cites a higher token");
    Reply::Stale { presented, highest }
}

/// The engine's errors on the wire: a code, then a sentence with the numbers.
/// The first number of STALE, MISMATCH and TRIMMED is the client's.
pub fn error_reply(e: &Error) -> Reply {
    let text = match e {
        Error::Stale { presented, highest } => {
            debug_assert!(presented < highest, "a STALE answer cites a higher token");
            stale_text(*presented, *highest)
        }
        Error::OffsetMismatch { expected, next } => {
            format!("MISMATCH expected offset {expected} but the next offset is {next}")
        }
        Error::Trimmed { requested, start } => {
            format!("TRIMMED offset {requested} is below the start offset {start}")
        }
        Error::Held { remaining_ms } => {
            format!("HELD lease is held by another owner for {remaining_ms} ms")
        }
        Error::Lost => "LOST lease is not held by this owner and token".into(),
        Error::TooLarge { .. } => format!("TOOBIG {e}"),
        Error::Io(_) | Error::Failed { .. } | Error::Corrupt { .. } | Error::Locked { .. } => {
            format!("IOERR {e}")
        }
        _ => format!("ERR {e}"),
    };
    Reply::Error(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stale error encoded from its numbers is, byte for byte, the
    /// error its text would be.
    #[test]
    fn a_stale_reply_encodes_as_its_text() {
        for (presented, highest) in [(1, 2), (41, 42), (0, u64::MAX), (u64::MAX - 1, u64::MAX)] {
            let fast = stale_reply(presented, highest);
            let text = error_reply(&Error::Stale { presented, highest });
            for proto in [2, 3] {
                let (mut a, mut b) = (bytes::BytesMut::new(), bytes::BytesMut::new());
                fast.encode(proto, &mut a);
                text.encode(proto, &mut b);
                assert_eq!(a, b);
                assert_eq!(fast.encoded_len(proto), a.len());
            }
        }
    }

    #[test]
    fn error_codes_lead_with_the_clients_number() {
        let r = error_reply(&Error::Stale {
            presented: 41,
            highest: 42,
        });
        assert_eq!(
            r,
            Reply::Error("STALE token 41 is below the highest accepted token 42".into())
        );
        let r = error_reply(&Error::OffsetMismatch {
            expected: 5,
            next: 7,
        });
        assert_eq!(
            r,
            Reply::Error("MISMATCH expected offset 5 but the next offset is 7".into())
        );
        let r = error_reply(&Error::Trimmed {
            requested: 3,
            start: 10,
        });
        assert_eq!(
            r,
            Reply::Error("TRIMMED offset 3 is below the start offset 10".into())
        );
        let r = error_reply(&Error::Held { remaining_ms: 1200 });
        assert_eq!(
            r,
            Reply::Error("HELD lease is held by another owner for 1200 ms".into())
        );
    }
}
