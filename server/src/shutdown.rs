//! The shutdown signal every task of the server listens for (as in
//! mini-redis): one `watch` channel, set once by the accept loop when
//! SIGINT or SIGTERM arrives.

use tokio::sync::watch;

/// Sets the signal: every [`Shutdown`] made from it sees it.
pub struct Trigger(watch::Sender<bool>);

/// A task's view of the signal.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// A trigger and the first listener.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

impl Trigger {
    /// Tells every listener to stop.
    pub fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// Whether shutdown has begun.
    pub fn is_shutdown(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once shutdown has begun (at once if it has). Cancel-safe.
    pub async fn recv(&mut self) {
        // An error means the trigger is gone: the server is going away.
        let _ = self.0.wait_for(|&stop| stop).await;
    }
}
