//! Completion of submitted entries: a [`Ticket`] resolves once the sync that
//! carries its entries returns, by blocking or by awaiting, never both.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use event_listener::{Event, EventListener, Listener};

use crate::error::WalError;

const PENDING: u8 = 0;
const DURABLE: u8 = 1;
const FAILED: u8 = 2;

/// Everything submitted between two syncs shares one `Batch`: the sync thread
/// completes it once, and every waiter on it wakes.
pub(crate) struct Batch {
    state: AtomicU8,
    cause: OnceLock<Arc<io::Error>>,
    event: Event,
}

impl Batch {
    pub(crate) fn new() -> Arc<Batch> {
        Arc::new(Batch {
            state: AtomicU8::new(PENDING),
            cause: OnceLock::new(),
            event: Event::new(),
        })
    }

    pub(crate) fn complete(&self) {
        self.state.store(DURABLE, Ordering::Release);
        self.event.notify(usize::MAX);
    }

    pub(crate) fn fail(&self, cause: Arc<io::Error>) {
        let _ = self.cause.set(cause);
        self.state.store(FAILED, Ordering::Release);
        self.event.notify(usize::MAX);
    }

    fn result(&self) -> Option<Result<(), WalError>> {
        match self.state.load(Ordering::Acquire) {
            PENDING => None,
            DURABLE => Some(Ok(())),
            _ => Some(Err(failed(self.cause.get()))),
        }
    }
}

pub(crate) fn failed(cause: Option<&Arc<io::Error>>) -> WalError {
    WalError::Failed {
        cause: cause
            .cloned()
            .unwrap_or_else(|| Arc::new(io::Error::other("unknown I/O failure"))),
    }
}

/// Resolves once the entries it stands for are durable, or with the error
/// that stopped the log.
///
/// Wait with [`Ticket::wait`] from a plain thread, or `.await` it from async
/// code: awaiting never blocks the runtime's thread.
#[must_use = "an entry is durable only once its ticket resolves"]
pub struct Ticket {
    inner: Inner,
}

enum Inner {
    Done(Option<Arc<io::Error>>),
    Waiting {
        batch: Arc<Batch>,
        listener: Option<EventListener>,
    },
}

impl Ticket {
    pub(crate) fn ready() -> Ticket {
        Ticket {
            inner: Inner::Done(None),
        }
    }

    pub(crate) fn failed(cause: Arc<io::Error>) -> Ticket {
        Ticket {
            inner: Inner::Done(Some(cause)),
        }
    }

    pub(crate) fn on(batch: Arc<Batch>) -> Ticket {
        Ticket {
            inner: Inner::Waiting {
                batch,
                listener: None,
            },
        }
    }

    /// Whether the entries are durable already (without waiting).
    pub fn is_durable(&self) -> bool {
        match &self.inner {
            Inner::Done(cause) => cause.is_none(),
            Inner::Waiting { batch, .. } => matches!(batch.result(), Some(Ok(()))),
        }
    }

    /// Blocks the calling thread until the entries are durable.
    ///
    /// Do not call this on an async runtime's thread; `.await` the ticket.
    pub fn wait(self) -> Result<(), WalError> {
        match self.inner {
            Inner::Done(None) => Ok(()),
            Inner::Done(Some(cause)) => Err(failed(Some(&cause))),
            Inner::Waiting { batch, .. } => loop {
                if let Some(result) = batch.result() {
                    return result;
                }
                let listener = batch.event.listen();
                // Check again: the batch may have completed before we listened.
                if let Some(result) = batch.result() {
                    return result;
                }
                listener.wait();
            },
        }
    }
}

impl Future for Ticket {
    type Output = Result<(), WalError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.inner {
            Inner::Done(None) => Poll::Ready(Ok(())),
            Inner::Done(Some(cause)) => Poll::Ready(Err(failed(Some(cause)))),
            Inner::Waiting { batch, listener } => loop {
                if let Some(result) = batch.result() {
                    return Poll::Ready(result);
                }
                match listener {
                    None => *listener = Some(batch.event.listen()),
                    Some(l) => {
                        if Pin::new(l).poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        *listener = None;
                    }
                }
            },
        }
    }
}
