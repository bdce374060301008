//! A future polled again only once its own waker has fired.
//!
//! A connection waits on many things at once in one `select!`, which
//! polls every branch each time the task runs. A branch that is almost
//! never ready (eviction, `CLIENT KILL`, shutdown) still costs its poll
//! every time: tokio's `Notified` takes its `Notify`'s lock on each poll.
//! [`WakeGated`] answers `Pending` without polling its future until that
//! future's wakers have fired.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// A boxed future behind a gate that opens when the future's waker fires.
pub struct WakeGated<T> {
    future: Pin<Box<dyn Future<Output = T> + Send>>,
    gate: Arc<Gate>,
    /// The gate as the waker handed to `future`.
    waker: Waker,
}

/// Whether the future was woken since its last poll, and the task to wake.
struct Gate {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Set before the task is woken: its next poll sees it.
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<T> WakeGated<T> {
    /// Gates `future`; its first poll goes through.
    pub fn new(future: Pin<Box<dyn Future<Output = T> + Send>>) -> WakeGated<T> {
        let gate = Arc::new(Gate {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&gate));
        WakeGated {
            future,
            gate,
            waker,
        }
    }
}

impl<T> Future for WakeGated<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        // The task to wake is registered before `woken` is read: a wake in
        // between is then either seen here or wakes the task (the pattern
        // `AtomicWaker` documents).
        this.gate.task.register(cx.waker());
        if !this.gate.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.future
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn polls_its_future_only_after_a_wake() {
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let notify = Arc::new(tokio::sync::Notify::new());
        let (p, n) = (Arc::clone(&polls), Arc::clone(&notify));
        let mut gated = WakeGated::new(Box::pin(async move {
            let mut notified = std::pin::pin!(n.notified());
            std::future::poll_fn(|cx| {
                p.fetch_add(1, Ordering::Relaxed);
                notified.as_mut().poll(cx)
            })
            .await;
            7
        }));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..5 {
            assert!(Pin::new(&mut gated).poll(&mut cx).is_pending());
        }
        // Polled once, then held back until woken.
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        notify.notify_one();
        assert_eq!(Pin::new(&mut gated).poll(&mut cx), Poll::Ready(7));
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }
}
