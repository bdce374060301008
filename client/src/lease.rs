//! A lease that renews itself and says when it is gone.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{Client, Error};

/// How [`Client::lease`] and [`Client::acquire`] ask for a lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseOptions {
    /// Wait up to this long for the holder to release or expire (`WAIT`);
    /// `None` answers [`Error::Held`] at once. Default `None`.
    pub wait: Option<Duration>,
    /// Fence the stream of the lease's name at the new token in the same
    /// durable entry (`FENCE`), so older holders are shut out before any
    /// work. Default `false`.
    pub fence: bool,
    /// How long before the ttl runs out (counted from when the last renewal
    /// was *sent*) the lease is taken as lost: room for the server's clock
    /// running a little faster and for scheduling. `None`: a fifth of the
    /// ttl. Must be below two thirds of the ttl.
    pub safety_margin: Option<Duration>,
}

/// Why a [`Lease`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseLoss {
    /// Released by this client (or the [`Lease`] was dropped).
    Released,
    /// The server refused it: a renewal answered `LOST`, or a write
    /// through it `STALE`.
    Refused,
    /// No renewal was confirmed before the ttl, less the safety margin,
    /// ran out: the server may have handed it to someone else.
    Expired,
}

/// What the lease, its keeper and its loss futures share.
#[derive(Debug)]
struct Shared {
    loss: watch::Sender<Option<LeaseLoss>>,
    /// Until when this client may believe it holds the lease: the send time
    /// of the last confirmed acquire or renewal, plus the ttl, less the
    /// safety margin (the client's monotonic clock).
    valid_until: Mutex<Instant>,
    /// Test hook: the keeper does nothing until then.
    keeper_paused_until: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Records the first reason the lease ended; later ones change nothing.
    fn lose(&self, why: LeaseLoss) {
        self.loss.send_if_modified(|s| {
            if s.is_none() {
                *s = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// `Ok` while the lease can be believed held. Reads the clock itself, so
    /// a process that was paused past its ttl learns it at its first call,
    /// whether or not the keeper has run since.
    fn check(&self) -> Result<(), Error> {
        if self.loss.borrow().is_some() {
            return Err(Error::Lost);
        }
        if Instant::now() >= *lock(&self.valid_until) {
            self.lose(LeaseLoss::Expired);
            return Err(Error::Lost);
        }
        Ok(())
    }
}

/// A held lease: a keeper task renews it at a third of its ttl, and
/// [`Lease::lost`] completes once it can no longer be trusted.
///
/// Writes through [`Lease::append`] carry its token, are refused locally
/// once it is lost, and are retried exactly once (through `LOG.APPENDAT`)
/// when their reply is lost. Dropping a lease releases it in the
/// background (best effort); [`Lease::release`] waits for the answer.
#[derive(Debug)]
pub struct Lease {
    client: Client,
    name: Bytes,
    owner: String,
    token: u64,
    ttl: Duration,
    shared: Arc<Shared>,
    keeper: Option<JoinHandle<()>>,
}

/// The shortest ttl the server grants.
const MIN_TTL: Duration = Duration::from_millis(10);

impl Lease {
    pub(crate) async fn acquire(
        client: Client,
        name: Bytes,
        owner: &str,
        ttl: Duration,
        options: LeaseOptions,
    ) -> Result<Lease, Error> {
        if ttl < MIN_TTL {
            return Err(Error::Invalid(format!("a ttl under {MIN_TTL:?}")));
        }
        let margin = options.safety_margin.unwrap_or(ttl / 5);
        if margin >= ttl * 2 / 3 {
            return Err(Error::Invalid(format!(
                "a safety margin of {margin:?} leaves no time to renew a ttl of {ttl:?}"
            )));
        }
        let mut sent = Instant::now();
        let grant = client.acquire(&name, owner, ttl, &options).await?;
        // The server may grant less than asked; never believe more.
        let mut ttl = grant.ttl.min(ttl);
        // The grant happened somewhere between the send and the answer: only
        // the send time is safe to count from. After a long WAIT that
        // would leave little or nothing of the ttl, so confirm it at once
        // with a renewal, whose send time is recent.
        if sent.elapsed() >= ttl / 3 {
            sent = Instant::now();
            let renewed = client.renew(&name, owner, grant.token, ttl).await;
            match renewed {
                Ok(granted) => ttl = granted.min(ttl),
                Err(e) => {
                    // Best effort: do not leave a lease behind that nobody
                    // keeps.
                    let _ = client.release(&name, owner, grant.token).await;
                    return Err(e);
                }
            }
        }
        let margin = margin.min(ttl / 2);
        let (loss, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            loss,
            valid_until: Mutex::new(sent + ttl.saturating_sub(margin)),
            keeper_paused_until: Mutex::new(None),
        });
        let keeper = tokio::spawn(keep(
            client.clone(),
            name.clone(),
            owner.to_string(),
            grant.token,
            ttl,
            margin,
            sent,
            shared.clone(),
        ));
        Ok(Lease {
            client,
            name,
            owner: owner.to_string(),
            token: grant.token,
            ttl,
            shared,
            keeper: Some(keeper),
        })
    }

    /// The fencing token: every write through this lease carries it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The ttl the server granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease's name (also the stream `FENCE` fences).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Whether the lease is gone or can no longer be trusted (checks the
    /// clock, as a write would).
    pub fn is_lost(&self) -> bool {
        self.shared.check().is_err()
    }

    /// Why the lease ended, once it has.
    pub fn loss(&self) -> Option<LeaseLoss> {
        let _ = self.shared.check();
        *self.shared.loss.borrow()
    }

    /// Completes when the lease is released, refused by the server, or
    /// cannot be confirmed in time: cancel the work it guards. Owns what it
    /// needs, so it can be moved into another task or a `select!`.
    pub fn lost(&self) -> impl Future<Output = LeaseLoss> + Send + 'static {
        let mut rx = self.shared.loss.subscribe();
        async move {
            match rx.wait_for(Option::is_some).await {
                Ok(why) => (*why).unwrap_or(LeaseLoss::Released),
                // Lease and keeper are gone: it was dropped, so released.
                Err(_) => LeaseLoss::Released,
            }
        }
    }

    /// Appends `records` to `stream` with this lease's token, exactly once.
    ///
    /// Learns the stream's next offset (`LOG.STAT`) and sends the write as
    /// `LOG.APPENDAT` at that offset. If its reply is lost (I/O error,
    /// timeout, `UNCERTAIN`) it sends the identical request once more: the
    /// server answers a retry of an append that succeeded with its original
    /// offset, and applies one that did not. Refused with [`Error::Lost`]
    /// before sending once the lease is lost; a `STALE` answer marks the
    /// lease lost. [`Error::Mismatch`] means another writer appended since
    /// the `LOG.STAT`: read the stream, then decide.
    ///
    /// If the lease is lost between a lost reply and its retry, the answer
    /// is [`Error::Uncertain`]: the first try may or may not have landed,
    /// and a write after the loss is not sent.
    pub async fn append<R: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        records: &[R],
    ) -> Result<u64, Error> {
        let stream = stream.as_ref();
        self.shared.check()?;
        let next = self.client.stat(stream).await?.next_offset;
        self.shared.check()?;
        let first = self
            .client
            .append_at(stream, self.token, next, records)
            .await;
        let result = match first {
            Err(e) if e.outcome_unknown() => {
                if self.shared.check().is_err() {
                    return Err(Error::Uncertain);
                }
                self.client
                    .append_at(stream, self.token, next, records)
                    .await
            }
            other => other,
        };
        if let Err(Error::Stale { .. }) = &result {
            self.shared.lose(LeaseLoss::Refused);
        }
        result
    }

    /// Stops the keeper and releases the lease; whether the server still
    /// held it for this owner and token.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop(LeaseLoss::Released);
        self.client
            .release(&self.name, &self.owner, self.token)
            .await
    }

    fn stop(&mut self, why: LeaseLoss) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        self.shared.lose(why);
    }

    /// Test hook: the keeper neither renews nor watches the clock for `d`,
    /// as if this process were paused. Writes still check the clock.
    #[doc(hidden)]
    pub fn pause_keeper_for_test(&self, d: Duration) {
        *lock(&self.shared.keeper_paused_until) = Some(Instant::now() + d);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.keeper.is_none() {
            return; // released already
        }
        self.stop(LeaseLoss::Released);
        // Best effort: without a runtime (or after it shut down) the lease
        // simply expires on the server.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (client, name, owner, token) = (
                self.client.clone(),
                self.name.clone(),
                self.owner.clone(),
                self.token,
            );
            handle.spawn(async move {
                let _ = client.release(&name, &owner, token).await;
            });
        }
    }
}

/// The keeper: renews at a third of the ttl; marks the lease lost when a
/// renewal is refused or none is confirmed before `valid_until`. Ends then,
/// or when the lease is released (the task is aborted).
#[allow(clippy::too_many_arguments)]
async fn keep(
    client: Client,
    name: Bytes,
    owner: String,
    token: u64,
    ttl: Duration,
    margin: Duration,
    acquired_sent: Instant,
    shared: Arc<Shared>,
) {
    let period = ttl / 3;
    // After a failed renewal (a refused connection, a leader change), try
    // again soon rather than a full period later.
    let retry = (ttl / 10).max(Duration::from_millis(5));
    let mut next = acquired_sent + period;
    // Every turn either sleeps until a renewal time that moves forward or
    // returns; the watchdog bounds how long that can go on without success.
    loop {
        let deadline = *lock(&shared.valid_until);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                shared.lose(LeaseLoss::Expired);
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let paused = lock(&shared.keeper_paused_until).take();
        if let Some(until) = paused {
            tokio::time::sleep_until(until).await;
            continue;
        }
        if shared.check().is_err() {
            return;
        }
        let sent = Instant::now();
        let deadline = *lock(&shared.valid_until);
        // The routing's backoff steps are capped at the keeper's own retry
        // interval (a tenth of the ttl) rather than `Config::backoff_max`
        // (500 ms): during a failover the renewal retries TRYAGAIN and
        // refused connections inside one call, and a 500 ms step taken
        // just before the new leader answers could carry it past the
        // deadline. Issue 22: with a 3 s ttl, a leader killed just before
        // a renewal was due (failover 0.95 s, the lease never at risk on
        // the server) was lost this way; with 300 ms steps it is not.
        let renewal = client.renew_with(&name, &owner, token, ttl, retry);
        match tokio::time::timeout_at(deadline, renewal).await {
            Err(_) => {
                shared.lose(LeaseLoss::Expired);
                return;
            }
            Ok(Ok(granted)) => {
                let granted = granted.min(ttl);
                *lock(&shared.valid_until) = sent + granted.saturating_sub(margin);
                next = sent + period;
            }
            Ok(Err(Error::Lost | Error::Stale { .. })) => {
                shared.lose(LeaseLoss::Refused);
                return;
            }
            Ok(Err(_)) => next = Instant::now() + retry,
        }
    }
}
