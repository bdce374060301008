//! Completion of submitted entries: a [`Ticket`] resolves once the sync that
//! carries its entries returns, by blocking or by awaiting.
//!
//! Waking is the expensive part of group commit on few cores: every waiter
//! is a thread to schedule. So the sync thread wakes only two blocked
//! waiters of a batch; each waiter, once awake, wakes two more (a binary
//! tree), so the wake-ups spread over every core while the sync thread is
//! already writing the next batch. Async waiters are cheap to wake (a task
//! is queued, no thread switch) and a cancelled future would break a chain,
//! so the sync thread wakes those itself.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::Thread;

use parking_lot::Mutex;

use crate::error::WalError;
use crate::wal::InlineFlush;

const PENDING: u8 = 0;
const DURABLE: u8 = 1;
const FAILED: u8 = 2;

/// Everything submitted between two syncs shares one `Batch`: the sync thread
/// completes it once, and every waiter on it wakes.
pub(crate) struct Batch {
    state: AtomicU8,
    cause: OnceLock<Arc<io::Error>>,
    waiters: Mutex<Waiters>,
    /// The log, to flush the batch from a waiting thread when no flush is
    /// under way. Held here, once per batch, not in each ticket: a ticket
    /// per write cloned and dropped the log's own reference count, a
    /// cache line every writing thread shares (dropping tickets was 8 % of
    /// a replica's apply thread under `perf`).
    flush: Weak<dyn InlineFlush>,
}

#[derive(Default)]
struct Waiters {
    threads: Vec<Thread>,
    tasks: Vec<Waker>,
    /// Blocked threads at completion, in registration order: thread `i`
    /// wakes `2i + 1` and `2i + 2`.
    cascade: Option<Arc<[Thread]>>,
}

impl Batch {
    /// A batch of the log `flush` (a dangling handle: none to flush).
    pub(crate) fn new(flush: Weak<dyn InlineFlush>) -> Arc<Batch> {
        Arc::new(Batch {
            state: AtomicU8::new(PENDING),
            cause: OnceLock::new(),
            waiters: Mutex::new(Waiters::default()),
            flush,
        })
    }

    /// The log this batch is written by, for the next batch.
    pub(crate) fn log(&self) -> Weak<dyn InlineFlush> {
        Weak::clone(&self.flush)
    }

    pub(crate) fn complete(&self) {
        self.finish(DURABLE);
    }

    pub(crate) fn fail(&self, cause: Arc<io::Error>) {
        let _ = self.cause.set(cause);
        self.finish(FAILED);
    }

    fn finish(&self, state: u8) {
        let (first, tasks) = {
            let mut w = self.waiters.lock();
            // Set under the lock: a waiter either registered before (and is
            // in the lists taken here) or sees the final state.
            self.state.store(state, Ordering::Release);
            let threads: Arc<[Thread]> = std::mem::take(&mut w.threads).into();
            let first: Vec<Thread> = threads.iter().take(2).cloned().collect();
            w.cascade = Some(threads);
            (first, std::mem::take(&mut w.tasks))
        };
        for t in first {
            t.unpark();
        }
        for t in tasks {
            t.wake();
        }
    }

    fn result(&self) -> Option<Result<(), WalError>> {
        match self.state.load(Ordering::Acquire) {
            PENDING => None,
            DURABLE => Some(Ok(())),
            _ => Some(Err(failed(self.cause.get()))),
        }
    }

    /// Registers the calling thread; `None` if the batch is finished.
    fn register_thread(&self) -> Option<usize> {
        let mut w = self.waiters.lock();
        if self.state.load(Ordering::Acquire) != PENDING {
            return None;
        }
        w.threads.push(std::thread::current());
        Some(w.threads.len() - 1)
    }

    fn register_task(&self, waker: &Waker) -> bool {
        let mut w = self.waiters.lock();
        if self.state.load(Ordering::Acquire) != PENDING {
            return false;
        }
        // Many waiters may share one waker (a server's connections on one
        // thread all wait through that thread's relay): one registered
        // lately is not cloned, kept and woken again. Only the last two are
        // looked at, so that many tasks with wakers of their own do not
        // make registering quadratic.
        if !w.tasks.iter().rev().take(2).any(|t| t.will_wake(waker)) {
            w.tasks.push(waker.clone());
        }
        true
    }

    /// Passes the wake-up on to this waiter's two children in the cascade.
    fn wake_children(&self, index: usize) {
        // Taking the lock orders this after `finish` stored the cascade.
        let cascade = self.waiters.lock().cascade.clone();
        if let Some(cascade) = cascade {
            for child in [2 * index + 1, 2 * index + 2] {
                if let Some(t) = cascade.get(child) {
                    t.unpark();
                }
            }
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
        /// The waker registered last, so that repeated polls by the same
        /// task do not register it again.
        registered: Option<Waker>,
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
                registered: None,
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
            Inner::Waiting { batch, .. } => {
                if let Some(result) = batch.result() {
                    return result;
                }
                let flush = batch.flush.upgrade();
                // With the sync thread idle, writing and syncing the batch
                // here spares a thread switch each way (a lone writer's
                // whole overhead over a plain write + fdatasync).
                if let Some(flush) = &flush {
                    flush.try_flush();
                    if let Some(result) = batch.result() {
                        return result;
                    }
                }
                let Some(index) = batch.register_thread() else {
                    return batch.result().unwrap_or(Ok(()));
                };
                // As a task does once registered: under `flush_on_wait` no
                // submit woke the sync thread, and the flush this thread
                // could not take (another thread's) may not hold its batch.
                if let Some(flush) = flush {
                    flush.waiting();
                }
                loop {
                    if let Some(result) = batch.result() {
                        batch.wake_children(index);
                        return result;
                    }
                    std::thread::park();
                }
            }
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
            Inner::Waiting { batch, registered } => {
                if let Some(result) = batch.result() {
                    return Poll::Ready(result);
                }
                // Not on every poll: upgrading touches the log's count.
                let flush = registered
                    .is_none()
                    .then(|| batch.flush.upgrade())
                    .flatten();
                if let Some(flush) = &flush {
                    flush.try_flush_unsynced();
                    if let Some(result) = batch.result() {
                        return Poll::Ready(result);
                    }
                }
                if registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    return Poll::Pending;
                }
                if !batch.register_task(cx.waker()) {
                    // Finished between the check and the registration.
                    return Poll::Ready(batch.result().unwrap_or(Ok(())));
                }
                // Registered first: the batch cannot finish unseen.
                if let Some(flush) = flush {
                    flush.waiting();
                }
                *registered = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Counted(AtomicUsize);

    /// A batch of no log.
    struct NoFlush;

    impl InlineFlush for NoFlush {
        fn try_flush(&self) {}
        fn waiting(&self) {}
        fn try_flush_unsynced(&self) {}
    }

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waiters that share a waker (a server's connections through their
    /// thread's relay) register it once: it is kept and woken once. Tasks
    /// with wakers of their own are each kept and woken.
    #[test]
    fn a_waker_registered_again_is_kept_once_and_woken_once() {
        let batch = Batch::new(Weak::<NoFlush>::new());
        let shared = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&shared));
        for _ in 0..100 {
            assert!(batch.register_task(&waker));
        }
        let own: Vec<_> = (0..5)
            .map(|_| Arc::new(Counted(AtomicUsize::new(0))))
            .collect();
        assert_eq!(batch.waiters.lock().tasks.len(), 1);
        for o in &own {
            // A task polled twice while it waits registers twice.
            let own_waker = Waker::from(Arc::clone(o));
            assert!(batch.register_task(&own_waker));
            assert!(batch.register_task(&own_waker));
        }
        assert_eq!(batch.waiters.lock().tasks.len(), 6);
        batch.complete();
        assert_eq!(shared.0.load(Ordering::Relaxed), 1);
        for o in &own {
            assert_eq!(o.0.load(Ordering::Relaxed), 1);
        }
        assert!(!batch.register_task(&waker), "a finished batch takes none");
    }
}
