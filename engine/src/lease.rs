//! Leases: the engine as the coordinator that issues fencing tokens.
//!
//! One counter, stored in the log, issues every token: an acquisition's
//! entry carries its token, and the token is answered only once that entry
//! is durable, so after any crash every new token is above every token
//! answered before. Expiry runs on the engine's monotonic [`Clock`], never a
//! client's. After a restart every lease the log shows live is held for its
//! full ttl from the open, because the downtime cannot be known safely.
//!
//! Renewals that keep or shorten the ttl the log holds (the common case:
//! renewing with the same ttl) stay in memory: losing one in a crash costs
//! nothing, since the restart grants the logged ttl anew. A renewal that
//! *lengthens* the ttl is written and synced before it is answered:
//! otherwise a crash would hold the lease for less than its holder was
//! promised. Releases are written but not waited for: a lost release only
//! keeps the lease held until its ttl runs out after the restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::HashMap;

use crate::checkpoint::LeaseRecord;
use crate::op::Acquire;

/// A monotonic clock, in milliseconds from an arbitrary origin.
///
/// The engine measures lease expiry with it. Tests inject a manual clock so
/// that expiry needs no sleeping.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since this clock's origin; never decreases.
    fn now_ms(&self) -> u64;
}

/// The real monotonic clock ([`Instant`]).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }
}

/// A clock that moves only when told: for tests.
///
/// # Examples
///
/// ```
/// use fencelog::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::default();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now_ms(), 1500);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock {
    now: std::sync::atomic::AtomicU64,
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now
            .fetch_add(by.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

/// One live lease.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub owner: Box<[u8]>,
    pub token: u64,
    pub ttl_ms: u64,
    /// The ttl the log holds (acquisition, lengthening renewal, checkpoint).
    pub durable_ttl_ms: u64,
    /// On the engine's clock.
    pub expires_at_ms: u64,
    /// LSN of the acquisition entry.
    pub lsn: u64,
}

/// The lease table and the token counter, inside the serialized section.
pub(crate) struct Leases {
    /// The highest token this engine has issued.
    last_token: u64,
    /// LSN of the entry that issued `last_token`.
    pub last_token_lsn: u64,
    live: HashMap<Box<[u8]>, Lease>,
    /// At or below the expiry of every lease in `live`: before then no
    /// lease can have expired, so [`Leases::sweep`] need not look. Without
    /// it, each acquisition refused at `max_live_leases` scanned the whole
    /// table inside the serialized section.
    earliest_expiry_ms: u64,
    /// Sweeps that scanned the table (for tests of the bound above).
    pub full_sweeps: u64,
    clock: Arc<dyn Clock>,
    pub expired: u64,
}

impl Leases {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Leases {
        Leases {
            last_token: 0,
            last_token_lsn: 0,
            live: HashMap::new(),
            earliest_expiry_ms: u64::MAX,
            full_sweeps: 0,
            clock,
            expired: 0,
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub(crate) fn last_token(&self) -> u64 {
        self.last_token
    }

    /// The lease on `name` if it is live now; an expired one is forgotten.
    pub(crate) fn live(&mut self, name: &[u8]) -> Option<&Lease> {
        let now = self.clock.now_ms();
        if self.live.get(name).is_some_and(|l| l.expires_at_ms <= now) {
            self.live.remove(name);
            self.expired += 1;
        }
        self.live.get(name)
    }

    pub(crate) fn live_mut(&mut self, name: &[u8]) -> Option<&mut Lease> {
        self.live(name)?;
        self.live.get_mut(name)
    }

    /// A live lease's new ttl from now, kept in memory only (the log holds
    /// a longer one).
    pub(crate) fn retime(&mut self, name: &[u8], ttl_ms: u64) {
        let now = self.clock.now_ms();
        if let Some(l) = self.live_mut(name) {
            l.ttl_ms = ttl_ms;
            l.expires_at_ms = now.saturating_add(ttl_ms);
            let at = l.expires_at_ms;
            self.earliest_expiry_ms = self.earliest_expiry_ms.min(at);
        }
    }

    /// The lease on `name`, expired or not, changing nothing.
    pub(crate) fn peek(&self, name: &[u8]) -> Option<&Lease> {
        self.live.get(name)
    }

    /// At or below the expiry of every lease in the table; `None` if it is
    /// empty.
    pub(crate) fn earliest_expiry(&self) -> Option<u64> {
        (!self.live.is_empty() && self.earliest_expiry_ms != u64::MAX)
            .then_some(self.earliest_expiry_ms)
    }

    /// Number of leases in the table (some may have expired unnoticed).
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    /// Leases whose ttl has not run out now (those expired unnoticed are
    /// still in the table until looked at or swept).
    pub(crate) fn held_now(&self) -> usize {
        let now = self.clock.now_ms();
        self.live.values().filter(|l| l.expires_at_ms > now).count()
    }

    /// Drops every expired lease; answers how many. Scans the table only
    /// once the earliest expiry has passed, so a refusal at the limit costs
    /// O(1) until a lease can have expired.
    pub(crate) fn sweep(&mut self) -> u64 {
        let now = self.clock.now_ms();
        if now < self.earliest_expiry_ms {
            return 0;
        }
        self.full_sweeps += 1;
        let before = self.live.len();
        let mut earliest = u64::MAX;
        self.live.retain(|_, l| {
            let keep = l.expires_at_ms > now;
            if keep {
                earliest = earliest.min(l.expires_at_ms);
            }
            keep
        });
        self.earliest_expiry_ms = earliest;
        let n = (before - self.live.len()) as u64;
        self.expired += n;
        n
    }

    /// An accepted acquisition: its token is issued to its owner for its
    /// ttl from now (from the open, when replayed: the restart rule). Its
    /// fence is the stream's business, not the table's.
    pub(crate) fn apply_acquire(&mut self, a: &Acquire<'_>, lsn: u64) -> Result<(), String> {
        let &Acquire {
            name,
            owner,
            token,
            ttl_ms,
            ..
        } = a;
        if token <= self.last_token {
            return Err(format!(
                "an acquisition issued token {token}, not above the last issued {}",
                self.last_token
            ));
        }
        self.last_token = token;
        self.last_token_lsn = lsn;
        let expires_at_ms = self.clock.now_ms().saturating_add(ttl_ms);
        self.earliest_expiry_ms = self.earliest_expiry_ms.min(expires_at_ms);
        self.live.insert(
            name.to_vec().into_boxed_slice(),
            Lease {
                owner: owner.to_vec().into_boxed_slice(),
                token,
                ttl_ms,
                durable_ttl_ms: ttl_ms,
                expires_at_ms,
                lsn,
            },
        );
        Ok(())
    }

    /// A renewal that lengthened the ttl, written to the log.
    pub(crate) fn apply_renew(
        &mut self,
        name: &[u8],
        owner: &[u8],
        token: u64,
        ttl_ms: u64,
        lsn: u64,
    ) {
        let now = self.clock.now_ms();
        if let Some(l) = self.live.get_mut(name)
            && &*l.owner == owner
            && l.token == token
        {
            l.ttl_ms = ttl_ms;
            l.durable_ttl_ms = l.durable_ttl_ms.max(ttl_ms);
            l.expires_at_ms = now.saturating_add(ttl_ms);
            l.lsn = lsn;
            self.earliest_expiry_ms = self.earliest_expiry_ms.min(l.expires_at_ms);
        }
    }

    /// A release: drops the lease if owner and token match.
    pub(crate) fn apply_release(&mut self, name: &[u8], owner: &[u8], token: u64) -> bool {
        let matches = self
            .live
            .get(name)
            .is_some_and(|l| &*l.owner == owner && l.token == token);
        if matches {
            self.live.remove(name);
        }
        matches
    }

    pub(crate) fn restore(&mut self, last_token: u64, leases: Vec<LeaseRecord>) {
        let now = self.clock.now_ms();
        self.last_token = last_token;
        self.last_token_lsn = 0;
        self.live.clear();
        self.earliest_expiry_ms = u64::MAX;
        for l in leases {
            // A replica's checkpoint keeps each expiry on the group's clock:
            // restored exactly, so a restarted replica decides as the others
            // do. A single node's keeps none: the restart rule, a full ttl
            // from the open.
            let expires_at_ms = l.expires_at_ms.unwrap_or(now.saturating_add(l.ttl_ms));
            self.earliest_expiry_ms = self.earliest_expiry_ms.min(expires_at_ms);
            self.live.insert(
                l.name.into_boxed_slice(),
                Lease {
                    owner: l.owner.into_boxed_slice(),
                    token: l.token,
                    ttl_ms: l.ttl_ms,
                    durable_ttl_ms: l.ttl_ms,
                    expires_at_ms,
                    lsn: 0,
                },
            );
        }
    }

    /// The live leases, for a checkpoint being encoded.
    pub(crate) fn for_checkpoint(&mut self) -> Vec<crate::checkpoint::LeaseRow<'_>> {
        self.sweep();
        // The checkpoint is durable, so it may lower the logged ttl to a
        // shorter renewal: the holder was told that one last.
        for l in self.live.values_mut() {
            l.durable_ttl_ms = l.ttl_ms;
        }
        self.live
            .iter()
            .map(|(name, l)| (&name[..], &l.owner[..], l.token, l.ttl_ms, l.expires_at_ms))
            .collect()
    }

    /// Every lease still live now is held for its full ttl from now (a new
    /// leader took over: the old leader's clock cannot be trusted). One that
    /// ran out is gone first: a take-over never revives an expired lease.
    pub(crate) fn restart_all(&mut self) {
        self.sweep();
        let now = self.clock.now_ms();
        let mut earliest = u64::MAX;
        for l in self.live.values_mut() {
            debug_assert!(l.expires_at_ms > now, "swept leases are live");
            l.expires_at_ms = l.expires_at_ms.max(now.saturating_add(l.ttl_ms));
            earliest = earliest.min(l.expires_at_ms);
        }
        self.earliest_expiry_ms = earliest;
    }

    /// Raises the counter to at least `floor` (after a cut: tokens issued
    /// before it may have been lost with it).
    pub(crate) fn raise_last_token(&mut self, floor: u64) {
        self.last_token = self.last_token.max(floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At `max_live_leases` every refused acquisition swept the whole table
    /// inside the serialized section: a client repeating LEASE.ACQUIRE kept
    /// the writer busy for O(table) per request. A sweep now looks only once
    /// a lease can have expired, and a shortened lease is still found.
    #[test]
    fn a_sweep_scans_only_once_a_lease_can_have_expired() {
        let clock = Arc::new(ManualClock::default());
        let mut leases = Leases::new(clock.clone());
        for i in 0..1000u64 {
            let name = format!("lease{i}");
            let a = Acquire {
                name: name.as_bytes(),
                owner: b"o",
                token: i + 1,
                ttl_ms: 10_000 + i,
                fence: false,
            };
            leases.apply_acquire(&a, i + 1).unwrap();
        }
        for _ in 0..10_000 {
            assert_eq!(leases.sweep(), 0);
        }
        assert_eq!(leases.full_sweeps, 0);
        // Shortened in memory (a renewal to a shorter ttl): due sooner.
        clock.advance(Duration::from_millis(100));
        leases.retime(b"lease500", 50);
        clock.advance(Duration::from_millis(49));
        assert_eq!(leases.sweep(), 0);
        assert_eq!(leases.full_sweeps, 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(leases.sweep(), 1);
        assert_eq!(leases.full_sweeps, 1);
        // Nothing else is due before the first acquisition's 10 s.
        for _ in 0..10_000 {
            assert_eq!(leases.sweep(), 0);
        }
        assert_eq!(leases.full_sweeps, 1);
        clock.advance(Duration::from_millis(10_000));
        assert_eq!(leases.sweep(), 151);
        assert_eq!(leases.len(), 848);
        // A release leaves the bound low: one scan finds nothing and
        // raises it, then none until the next expiry.
        let mut restored = Leases::new(clock.clone());
        restored.restore(
            7,
            vec![crate::checkpoint::LeaseRecord {
                name: b"x".to_vec(),
                owner: b"o".to_vec(),
                token: 7,
                ttl_ms: 5,
                expires_at_ms: None,
            }],
        );
        assert!(restored.apply_release(b"x", b"o", 7));
        clock.advance(Duration::from_millis(5));
        assert_eq!(restored.sweep(), 0);
        assert_eq!(restored.sweep(), 0);
        assert_eq!(restored.full_sweeps, 1);
    }
}
