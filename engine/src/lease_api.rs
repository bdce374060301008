//! The lease API of [`Log`]: acquire, renew, release, inspect.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use event_listener::Listener;
use fencelog_wal::{Ticket, Writer};

use crate::core::Core;
use crate::error::{Error, Result};
use crate::log::Log;
use crate::op::{self, Acquire, Op};
use crate::token::{MAX_TOKEN, Token, check_stream_name};

/// The longest owner name in bytes.
pub const MAX_OWNER: usize = 128;

/// How to acquire a lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Also fence the stream of the same name at the new token, in the same
    /// durable entry: the new owner's first write cannot be beaten by an
    /// old owner's late one.
    pub fence: bool,
    /// While the lease is held by another owner, wait up to this long for it
    /// to be released or to expire (`Duration::MAX`: without limit). `None`:
    /// answer [`Error::Held`] at once.
    pub wait: Option<Duration>,
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: above every token this engine issued before.
    pub token: Token,
    /// How long the lease lasts, from the grant, on the engine's clock.
    pub ttl: Duration,
}

/// A live lease, as [`Log::lease_info`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Who holds it.
    pub owner: Bytes,
    /// Its token.
    pub token: Token,
    /// How long it has left.
    pub remaining: Duration,
}

/// Checks an owner: 1..=128 bytes of printable ASCII, no space.
pub(crate) fn check_owner(owner: &[u8]) -> Result<()> {
    if owner.is_empty() || owner.len() > MAX_OWNER {
        return Err(Error::invalid(
            "owner",
            format!("{} bytes is not in 1..={MAX_OWNER}", owner.len()),
        ));
    }
    if let Some(b) = owner.iter().find(|b| !b.is_ascii_graphic()) {
        return Err(Error::invalid(
            "owner",
            format!("byte 0x{b:02x} is not printable ASCII (spaces are not allowed)"),
        ));
    }
    Ok(())
}

pub(crate) enum Acquired {
    Granted {
        token: u64,
        ttl_ms: u64,
        ticket: Ticket,
        fresh: bool,
    },
    /// Answered once the grant that holds it is durable: a refusal never
    /// rests on a grant a crash could take back.
    Held { remaining_ms: u64, ticket: Ticket },
    /// A re-acquisition with `fence` whose token is below the stream's.
    Stale {
        presented: u64,
        highest: u64,
        ticket: Ticket,
    },
}

pub(crate) fn decide_acquire(
    w: &mut Writer<'_, Core>,
    name: &[u8],
    owner: &[u8],
    ttl_ms: u64,
    fence: bool,
    max_live: u64,
) -> Result<Acquired> {
    let now = w.state().leases.now_ms();
    if let Some(l) = w.state().leases.live(name) {
        if &*l.owner != owner {
            let (remaining_ms, lsn) = (l.expires_at_ms.saturating_sub(now), l.lsn);
            return Ok(Acquired::Held {
                remaining_ms,
                ticket: w.ticket_for(lsn),
            });
        }
        let held = (l.token, l.lsn, l.durable_ttl_ms);
        return reacquire(w, name, owner, ttl_ms, fence, held);
    }
    let leases = &mut w.state().leases;
    // At the limit, expired leases are let go first; the decision rests on
    // the leases live now, never on how many expired ones a sweep found (a
    // replica restored from its log keeps a different set of those).
    if leases.len() as u64 >= max_live {
        leases.sweep();
    }
    if leases.len() as u64 >= max_live {
        return Err(Error::TooManyLeases {
            live: leases.len() as u64,
            max: max_live,
        });
    }
    let mut token = leases.last_token() + 1;
    if fence {
        let key = w.state().key(name);
        crate::log::room_for(w, key)?;
        let (highest, _) = w.state().highest(key);
        token = token.max(highest + 1);
    }
    if token > MAX_TOKEN {
        return Err(Error::invalid(
            "token",
            format!("the token counter is exhausted ({MAX_TOKEN})"),
        ));
    }
    let entry = op::encode(&Op::Acquire(Acquire {
        name,
        owner,
        token,
        ttl_ms,
        fence,
    }));
    let at = crate::replicated::write_op(w, entry.len(), |buf| buf.copy_from_slice(&entry))?;
    let acquire = op::decode(&entry)
        .map_err(|_| Error::invalid("internal state", "an acquisition that does not decode"))?;
    let effect = w
        .state()
        .apply_op(&acquire, at)
        .map_err(|why| Error::invalid("internal state", why))?;
    w.on_durable(effect);
    Ok(Acquired::Granted {
        token,
        ttl_ms,
        ticket: w.ticket(),
        fresh: true,
    })
}

/// The live holder acquires again: the same token, the new ttl; with
/// `fence`, the stream is fenced at the token unless tokens from elsewhere
/// passed it. `held` is the lease's token, LSN and durable ttl.
fn reacquire(
    w: &mut Writer<'_, Core>,
    name: &[u8],
    owner: &[u8],
    ttl_ms: u64,
    fence: bool,
    (token, lsn, durable_ttl): (u64, u64, u64),
) -> Result<Acquired> {
    let key = w.state().key(name);
    let (highest, highest_lsn) = w.state().highest(key);
    if fence && highest > token {
        // Tokens from elsewhere passed this lease's on the stream: it
        // cannot fence, and its writes would be rejected. Say so.
        return Ok(Acquired::Stale {
            presented: token,
            highest,
            ticket: w.ticket_for(highest_lsn),
        });
    }
    let mut ticket = extend(w, name, owner, token, ttl_ms, durable_ttl, lsn)?;
    if fence && highest < token {
        crate::log::write_fence(w, key, token)?;
        ticket = w.ticket();
    }
    Ok(Acquired::Granted {
        token,
        ttl_ms,
        ticket,
        fresh: false,
    })
}

/// Gives the live lease `ttl_ms` from now: in memory if the log already
/// holds a ttl at least that long, else through a synced entry. Answers
/// what to wait for before answering.
fn extend(
    w: &mut Writer<'_, Core>,
    name: &[u8],
    owner: &[u8],
    token: u64,
    ttl_ms: u64,
    durable_ttl_ms: u64,
    lsn: u64,
) -> Result<Ticket> {
    // A replica writes every renewal: its effect must replay the same on
    // every replica, and after a restart.
    if ttl_ms > durable_ttl_ms || w.state().wrap.is_some() {
        let entry = op::encode(&Op::Renew {
            name,
            owner,
            token,
            ttl_ms,
        });
        let at = crate::replicated::write_op(w, entry.len(), |buf| buf.copy_from_slice(&entry))?;
        w.state()
            .leases
            .apply_renew(name, owner, token, ttl_ms, at.lsn);
        return Ok(w.ticket());
    }
    w.state().leases.retime(name, ttl_ms);
    // The grant itself must be durable before it is answered again.
    Ok(w.ticket_for(lsn))
}

/// Renews the live lease held by exactly this owner and token; `None` if
/// there is none (expired, released, or another's).
pub(crate) fn decide_renew(
    w: &mut Writer<'_, Core>,
    name: &[u8],
    owner: &[u8],
    token: u64,
    ttl_ms: u64,
) -> Result<Option<Ticket>> {
    let lease = w
        .state()
        .leases
        .live(name)
        .filter(|l| &*l.owner == owner && l.token == token)
        .map(|l| (l.durable_ttl_ms, l.lsn));
    match lease {
        Some((durable_ttl, lsn)) => {
            extend(w, name, owner, token, ttl_ms, durable_ttl, lsn).map(Some)
        }
        None => Ok(None),
    }
}

/// Writes the release if this owner holds the lease with this token;
/// answers whether it did.
pub(crate) fn decide_release(
    w: &mut Writer<'_, Core>,
    name: &[u8],
    owner: &[u8],
    token: u64,
) -> Result<bool> {
    let holds = w
        .state()
        .leases
        .live(name)
        .is_some_and(|l| &*l.owner == owner && l.token == token);
    if !holds {
        return Ok(false);
    }
    let entry = op::encode(&Op::Release { name, owner, token });
    crate::replicated::write_op(w, entry.len(), |buf| buf.copy_from_slice(&entry))?;
    Ok(w.state().leases.apply_release(name, owner, token))
}

/// A granted acquisition as decided, before its entry is durable.
struct Granting {
    token: u64,
    ttl_ms: u64,
    /// A new lease, not the live holder's own again.
    fresh: bool,
}

/// What one acquisition attempt leads to.
enum Attempt {
    /// Wait for the ticket, then answer: the grant, or the refusal.
    Answer {
        ticket: Ticket,
        answer: Result<Granting>,
    },
    /// The lease is held and the caller waits: look again at this instant,
    /// or on a release.
    Retry(Instant),
}

/// Releases a lease whose grant nobody will receive (its caller went away).
struct Abandon<'a> {
    log: &'a Log,
    name: &'a [u8],
    owner: &'a [u8],
    token: u64,
    armed: bool,
}

impl<'a> Abandon<'a> {
    /// Armed for a new lease only: a refusal or the holder's own lease
    /// again leaves nothing to give back.
    fn for_answer(
        log: &'a Log,
        name: &'a [u8],
        owner: &'a [u8],
        answer: &Result<Granting>,
    ) -> Self {
        let (token, armed) = match answer {
            Ok(g) => (g.token, g.fresh),
            Err(_) => (0, false),
        };
        Abandon {
            log,
            name,
            owner,
            token,
            armed,
        }
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            // A waiter that gives up takes nothing. A destructor cannot
            // await: the release joins the batch without waiting for room
            // (it is a few bytes), so it never blocks a runtime thread.
            let released = self.log.inner().wal.submit_now(|w| {
                crate::log::reserving(w, |w| decide_release(w, self.name, self.owner, self.token))
            });
            if let Ok(Ok(released)) = released {
                self.log.freed(released);
            }
        }
    }
}

impl Log {
    fn check_lease_args(&self, name: &[u8], owner: &[u8], ttl: Duration) -> Result<u64> {
        check_stream_name(name)?;
        check_owner(owner)?;
        let opts = self.options();
        if ttl < opts.lease_ttl_min || ttl > opts.lease_ttl_max {
            return Err(Error::invalid(
                "ttl",
                format!(
                    "{} ms is not in {}..={} ms",
                    ttl.as_millis(),
                    opts.lease_ttl_min.as_millis(),
                    opts.lease_ttl_max.as_millis()
                ),
            ));
        }
        Ok(ttl.as_millis() as u64)
    }

    /// Acquires the lease `name` for `owner` for `ttl`, answering a fencing
    /// token above every token issued before, once it is durable.
    ///
    /// Answers [`Error::Held`] (with the time left) while another owner
    /// holds a live lease, unless `opts.wait` says to wait. Re-acquiring a
    /// lease one holds answers the same token with the new ttl. With
    /// `opts.fence`, the stream `name` is fenced at the new token in the same
    /// entry.
    ///
    /// # Examples
    ///
    /// ```
    /// use fencelog::{AcquireOptions, Log, Options};
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let log = Log::open(dir.path(), Options::default()).unwrap();
    /// let fenced = AcquireOptions { fence: true, ..Default::default() };
    /// let grant = log.acquire("jobs", "worker-1", Duration::from_secs(10), fenced).unwrap();
    /// // The new owner's token is already the stream's highest.
    /// assert_eq!(log.stat("jobs").unwrap().highest_token, grant.token.get());
    /// log.append("jobs", grant.token, &["started"]).unwrap();
    /// ```
    pub fn acquire(
        &self,
        name: impl AsRef<[u8]>,
        owner: impl AsRef<[u8]>,
        ttl: Duration,
        opts: AcquireOptions,
    ) -> Result<Grant> {
        let (name, owner) = (name.as_ref(), owner.as_ref());
        let ttl_ms = self.check_lease_args(name, owner, ttl)?;
        let deadline = opts.wait.and_then(|w| Instant::now().checked_add(w));
        let mut waiting = WaitingGauge::new(self);
        loop {
            let listener = self.inner().lease_freed.listen();
            let decided = self.submit_acquire(name, owner, ttl_ms, opts.fence)?;
            match self.attempt(decided, opts.wait, deadline) {
                Attempt::Answer { ticket, answer } => {
                    ticket.wait()?;
                    return self.answer(answer);
                }
                Attempt::Retry(wake) => {
                    waiting.start();
                    // Woken by a release, or at the lease's expiry.
                    let _ = listener.wait_deadline(wake);
                }
            }
        }
    }

    /// The async form of [`Log::acquire`]. Dropping the future gives up:
    /// a lease granted to a dropped caller is released at once.
    pub async fn acquire_async(
        &self,
        name: impl AsRef<[u8]>,
        owner: impl AsRef<[u8]>,
        ttl: Duration,
        opts: AcquireOptions,
    ) -> Result<Grant> {
        let (name, owner) = (name.as_ref(), owner.as_ref());
        let ttl_ms = self.check_lease_args(name, owner, ttl)?;
        let deadline = opts.wait.and_then(|w| Instant::now().checked_add(w));
        let max_live = self.options().max_live_leases;
        let mut waiting = WaitingGauge::new(self);
        loop {
            let listener = self.inner().lease_freed.listen();
            let decided = self
                .decide_async(|w| decide_acquire(w, name, owner, ttl_ms, opts.fence, max_live))
                .await?;
            match self.attempt(decided, opts.wait, deadline) {
                Attempt::Answer { ticket, answer } => {
                    let mut abandon = Abandon::for_answer(self, name, owner, &answer);
                    let result = ticket.await;
                    abandon.armed = false;
                    result?;
                    return self.answer(answer);
                }
                Attempt::Retry(wake) => {
                    waiting.start();
                    let _ = tokio::time::timeout_at(wake.into(), listener).await;
                }
            }
        }
    }

    fn submit_acquire(
        &self,
        name: &[u8],
        owner: &[u8],
        ttl_ms: u64,
        fence: bool,
    ) -> Result<Acquired> {
        let max_live = self.options().max_live_leases;
        self.decide(|w| decide_acquire(w, name, owner, ttl_ms, fence, max_live))
    }

    /// When to look again at a held lease: at its expiry, or at the end of
    /// the wait; `None` when not waiting (any more).
    fn wait_until(
        &self,
        wait: Option<Duration>,
        deadline: Option<Instant>,
        remaining_ms: u64,
    ) -> Option<Instant> {
        wait?;
        let now = Instant::now();
        // Expiry is on the engine's clock; a real-time wait until then is
        // the soonest it can change without a release.
        let expiry = now + Duration::from_millis(remaining_ms.max(1));
        match deadline {
            Some(d) if now >= d => None,
            Some(d) => Some(expiry.min(d)),
            None => Some(expiry),
        }
    }

    /// What a decided acquisition leads to: an answer once its ticket is
    /// durable, or, for a held lease the caller waits for, another look.
    fn attempt(
        &self,
        decided: Acquired,
        wait: Option<Duration>,
        deadline: Option<Instant>,
    ) -> Attempt {
        match decided {
            Acquired::Granted {
                token,
                ttl_ms,
                ticket,
                fresh,
            } => Attempt::Answer {
                ticket,
                answer: Ok(Granting {
                    token,
                    ttl_ms,
                    fresh,
                }),
            },
            Acquired::Held {
                remaining_ms,
                ticket,
            } => match self.wait_until(wait, deadline, remaining_ms) {
                Some(wake) => Attempt::Retry(wake),
                None => Attempt::Answer {
                    ticket,
                    answer: Err(Error::Held { remaining_ms }),
                },
            },
            Acquired::Stale {
                presented,
                highest,
                ticket,
            } => Attempt::Answer {
                ticket,
                answer: Err(Error::Stale { presented, highest }),
            },
        }
    }

    /// Answers a decided acquisition whose ticket is durable, and counts it.
    fn answer(&self, answer: Result<Granting>) -> Result<Grant> {
        let c = &self.inner().counters;
        match answer {
            Ok(Granting {
                token,
                ttl_ms,
                fresh,
            }) => {
                if fresh {
                    c.leases_acquired.add(1);
                } else {
                    c.leases_renewed.add(1);
                }
                Ok(Grant {
                    token: Token::new(token)?,
                    ttl: Duration::from_millis(ttl_ms),
                })
            }
            Err(e) => {
                if matches!(e, Error::Held { .. }) {
                    c.leases_held.add(1);
                }
                Err(e)
            }
        }
    }

    /// Extends the live lease held by exactly this owner and token to `ttl`
    /// from now; answers the ttl. A lease that expired is never revived:
    /// [`Error::Lost`], even if nobody else acquired it.
    pub fn renew(
        &self,
        name: impl AsRef<[u8]>,
        owner: impl AsRef<[u8]>,
        token: Token,
        ttl: Duration,
    ) -> Result<Duration> {
        let (name, owner) = (name.as_ref(), owner.as_ref());
        let ttl_ms = self.check_lease_args(name, owner, ttl)?;
        let renewed = self.decide(|w| decide_renew(w, name, owner, token.get(), ttl_ms))?;
        self.lost_unless(renewed)?.wait()?;
        self.inner().counters.leases_renewed.add(1);
        Ok(ttl)
    }

    /// The async form of [`Log::renew`].
    pub async fn renew_async(
        &self,
        name: impl AsRef<[u8]>,
        owner: impl AsRef<[u8]>,
        token: Token,
        ttl: Duration,
    ) -> Result<Duration> {
        let (name, owner) = (name.as_ref(), owner.as_ref());
        let ttl_ms = self.check_lease_args(name, owner, ttl)?;
        let renewed = self
            .decide_async(|w| decide_renew(w, name, owner, token.get(), ttl_ms))
            .await?;
        self.lost_unless(renewed)?.await?;
        self.inner().counters.leases_renewed.add(1);
        Ok(ttl)
    }

    fn lost_unless(&self, renewed: Option<Ticket>) -> Result<Ticket> {
        renewed.ok_or_else(|| {
            self.inner().counters.leases_lost.add(1);
            Error::Lost
        })
    }

    /// Releases the lease if this owner holds it with this token; answers
    /// whether it did. Idempotent: another owner or token changes nothing.
    /// The release is written to the log but not waited for.
    pub fn release(
        &self,
        name: impl AsRef<[u8]>,
        owner: impl AsRef<[u8]>,
        token: Token,
    ) -> Result<bool> {
        let (name, owner) = (name.as_ref(), owner.as_ref());
        check_stream_name(name)?;
        check_owner(owner)?;
        let released = self.decide(|w| decide_release(w, name, owner, token.get()))?;
        Ok(self.count_release(self.freed(released)))
    }

    /// The async form of [`Log::release`]: waits asynchronously for room in
    /// the batch.
    pub async fn release_async(
        &self,
        name: impl AsRef<[u8]>,
        owner: impl AsRef<[u8]>,
        token: Token,
    ) -> Result<bool> {
        let (name, owner) = (name.as_ref(), owner.as_ref());
        check_stream_name(name)?;
        check_owner(owner)?;
        let released = self
            .decide_async(|w| decide_release(w, name, owner, token.get()))
            .await?;
        Ok(self.count_release(self.freed(released)))
    }

    fn count_release(&self, released: bool) -> bool {
        if released {
            self.inner().counters.leases_released.add(1);
        }
        released
    }

    /// Wakes waiting acquirers if a lease was released.
    pub(crate) fn freed(&self, released: bool) -> bool {
        if released {
            self.inner().lease_freed.notify(usize::MAX);
        }
        released
    }

    /// Waits until a lease may have been freed (a release, or an entry that
    /// let expired leases go), at most `max`: a waiting acquirer in cluster
    /// mode asks again then, instead of polling the log.
    pub async fn lease_freed(&self, max: Duration) {
        let listener = self.inner().lease_freed.listen();
        let _ = tokio::time::timeout(max, listener).await;
    }

    /// The live lease on `name`: owner, token, time left; `None` if free.
    /// Only durable grants are shown: a grant still on its way to the disk
    /// is answered once it is there (a token a crash could still take back
    /// is never shown).
    pub fn lease_info(&self, name: impl AsRef<[u8]>) -> Result<Option<LeaseInfo>> {
        let (info, ticket) = self.lease_info_decided(name.as_ref())?;
        ticket.wait()?;
        info.transpose()
    }

    /// The async form of [`Log::lease_info`].
    pub async fn lease_info_async(&self, name: impl AsRef<[u8]>) -> Result<Option<LeaseInfo>> {
        let (info, ticket) = self.lease_info_decided(name.as_ref())?;
        ticket.await?;
        info.transpose()
    }

    /// The live lease as the serialized section knows it, and what to wait
    /// for before showing it.
    fn lease_info_decided(&self, name: &[u8]) -> Result<(Option<Result<LeaseInfo>>, Ticket)> {
        check_stream_name(name)?;
        let (lease, ticket) = self.inner().wal.with_state_mut(|core, ticket_for| {
            let now = core.leases.now_ms();
            match core.leases.live(name) {
                Some(l) => (
                    Some((
                        Bytes::copy_from_slice(&l.owner),
                        l.token,
                        l.expires_at_ms.saturating_sub(now),
                    )),
                    ticket_for(l.lsn),
                ),
                None => (None, ticket_for(0)),
            }
        });
        let info = lease.map(|(owner, token, remaining_ms)| {
            Ok(LeaseInfo {
                owner,
                token: Token::new(token)?,
                remaining: Duration::from_millis(remaining_ms),
            })
        });
        Ok((info, ticket))
    }
}

/// Counts an acquisition as waiting while it waits.
struct WaitingGauge<'a> {
    log: &'a Log,
    counted: bool,
}

impl<'a> WaitingGauge<'a> {
    fn new(log: &'a Log) -> Self {
        WaitingGauge {
            log,
            counted: false,
        }
    }

    fn start(&mut self) {
        if !self.counted {
            self.counted = true;
            self.log
                .inner()
                .counters
                .lease_waiting
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for WaitingGauge<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.log
                .inner()
                .counters
                .lease_waiting
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}
