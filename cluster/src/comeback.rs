//! The leader's wait, before its next entry, for the writers it just
//! answered to come back.
//!
//! With one entry in flight (the default, `batcher.rs`), the writes that
//! arrive while an entry is on its way go out together in the next one.
//! Clients that wait for each answer before they write again (most do)
//! then split into two halves that take turns: the entry's writers are
//! answered just as the next entry leaves with the others, so they wait a
//! whole round for a place. At pipeline 1 with 50 clients every entry held
//! 24 writes. Proposing the next entry only once the writers just answered
//! are back (or most of them: [`WriterWaits::back`]) lets every entry hold everyone:
//! the same sync, messages and wake-ups per entry carry twice the writes.
//!
//! The wait is bounded so that writers who do not come back (a client that
//! reads next, or stopped) cost little: it ends after the last entry's
//! round at most (and [`MAX_WAIT`]), and a wait that ran out makes the
//! next entries go without one, twice as many after each that runs out in
//! a row (up to [`WriterWaits::MAX_SKIP`]), so that a load of such clients
//! pays for one wait in many entries. A lone writer never waits: its write
//! is back as soon as it is answered. These rules are the single node's
//! sync thread's too: [`WriterWaits`] holds them for both.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fencelog_wal::WriterWaits;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::timings::{Timed, Timing};
// tokio's clock: the simulation's when it runs one (`sim/`).
use tokio::time::Instant;

/// The longest wait, in rounds of the last entry: writers who come back
/// do within one round or so (measured on two shared cores: 0.35–0.45 ms
/// at pipeline 1 against rounds of 0.7–0.9 ms); with one round only, a
/// third of the waits ran out first.
const ROUNDS: u32 = 2;

/// The longest wait, whatever the last round took.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(2);

/// The wait's state, shared by the connection threads (which count what
/// arrives) and the batching task (which waits).
pub(crate) struct Comeback {
    /// Whether this leader waits at all (`--cluster-no-batch-wait`).
    enabled: bool,
    /// Queued writes (the queue's own count) at which the wait ends; 0:
    /// no wait armed.
    target: AtomicU64,
    /// When it ends anyway: ns since `epoch`.
    until_ns: AtomicU64,
    epoch: Instant,
    notify: Notify,
    /// Which entries go without a wait after waits that ran out. Taken
    /// once per entry by the task answering it, and once per wait by the
    /// batching task: never contended for long.
    schedule: Mutex<WriterWaits>,
    /// Since the node started: the waits and the time they took, and
    /// how many of them ran out.
    waits: Timing,
    ran_out: AtomicU64,
}

/// What the waits came to since the node started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Waits {
    /// Every wait, and the time they took.
    pub all: Timed,
    /// Those whose time ran out before the writers came back.
    pub ran_out: u64,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// No wait was armed.
    NotArmed,
    /// Enough writers came back.
    Back,
    /// Its time ran out first.
    RanOut,
}

impl Comeback {
    /// The wait's state; with `enabled` false, [`Comeback::arm`] never
    /// arms it.
    pub(crate) fn new(enabled: bool) -> Self {
        Comeback {
            enabled,
            target: AtomicU64::new(0),
            until_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            notify: Notify::new(),
            schedule: Mutex::new(WriterWaits::new()),
            waits: Timing::default(),
            ran_out: AtomicU64::new(0),
        }
    }

    /// An entry of `answered` writes is about to be answered, after a
    /// round of `round`, with `queued` writes waiting: arms the wait for
    /// the next entry, unless waits are being skipped.
    pub(crate) fn arm(&self, answered: u64, queued: u64, round: Duration) {
        if !self.enabled || answered == 0 {
            return;
        }
        if !self.schedule.lock().due() {
            return;
        }
        let back = WriterWaits::back(answered);
        let until = self.now_ns() + (round * ROUNDS).min(MAX_WAIT).as_nanos() as u64;
        self.until_ns.store(until, Ordering::Relaxed);
        self.target.store(queued + back, Ordering::Release);
    }

    /// Writes arrived: the queue holds `queued` now. Wakes the wait if
    /// that ends it.
    pub(crate) fn arrived(&self, queued: u64) {
        let target = self.target.load(Ordering::Acquire);
        if target != 0
            && (queued >= target || self.now_ns() >= self.until_ns.load(Ordering::Relaxed))
        {
            self.notify.notify_one();
        }
    }

    /// Waits, if a wait is armed, until `queued()` reaches its target or
    /// its time runs out; then disarms it.
    pub(crate) async fn wait(&self, queued: impl Fn() -> u64) -> Ended {
        let target = self.target.load(Ordering::Acquire);
        if target == 0 {
            return Ended::NotArmed;
        }
        let until_ns = self.until_ns.load(Ordering::Relaxed);
        let until = self.epoch + Duration::from_nanos(until_ns);
        let started = self.now_ns();
        let ended = loop {
            if queued() >= target {
                break Ended::Back;
            }
            if self.now_ns() >= until_ns {
                break Ended::RanOut;
            }
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if queued() >= target {
                break Ended::Back;
            }
            // The timer is tokio's (1 ms ticks): it ends the wait only when
            // nothing arrives; arrivals check the time themselves.
            if tokio::time::timeout_at(until, notified).await.is_err() {
                break Ended::RanOut;
            }
        };
        self.target.store(0, Ordering::Release);
        self.waits
            .record(Duration::from_nanos(self.now_ns().saturating_sub(started)));
        self.ended(ended == Ended::RanOut);
        ended
    }

    /// After a wait: one that ran out makes the next entries skip theirs
    /// (twice as many as last time), one that ended by returns resets that.
    fn ended(&self, ran_out: bool) {
        if ran_out {
            self.ran_out.fetch_add(1, Ordering::Relaxed);
        }
        self.schedule.lock().ended(ran_out);
    }

    /// What the waits came to so far.
    pub(crate) fn waits(&self) -> Waits {
        Waits {
            all: self.waits.total(),
            ran_out: self.ran_out.load(Ordering::Relaxed),
        }
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    #[tokio::test]
    async fn a_wait_ends_once_three_in_four_are_back() {
        let c = Arc::new(Comeback::new(true));
        let queued = Arc::new(AtomicU64::new(5));
        // 8 answered, 5 waiting already: the wait ends at 5 + 6.
        c.arm(8, 5, Duration::from_secs(1));
        let waiter = {
            let (c, q) = (Arc::clone(&c), Arc::clone(&queued));
            tokio::spawn(async move { c.wait(|| q.load(Ordering::Acquire)).await })
        };
        for _ in 0..5 {
            queued.fetch_add(1, Ordering::AcqRel);
            c.arrived(queued.load(Ordering::Acquire));
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "10 of 11 is not enough");
        queued.fetch_add(1, Ordering::AcqRel);
        c.arrived(queued.load(Ordering::Acquire));
        let ended = tokio::time::timeout(Duration::from_millis(500), waiter)
            .await
            .expect("the sixth return ends the wait")
            .unwrap();
        assert_eq!(ended, Ended::Back);
        // Disarmed: the next wait returns at once.
        assert_eq!(c.wait(|| 0).await, Ended::NotArmed);
    }

    #[tokio::test]
    async fn a_lone_writer_never_waits() {
        let c = Comeback::new(true);
        c.arm(1, 0, Duration::from_secs(1));
        // Its next write is what the batching task found first.
        assert_eq!(c.wait(|| 1).await, Ended::Back);
    }

    #[tokio::test]
    async fn a_wait_runs_out_after_the_round_and_then_waits_are_skipped() {
        let c = Comeback::new(true);
        let started = Instant::now();
        c.arm(10, 0, Duration::from_millis(3));
        assert_eq!(c.wait(|| 0).await, Ended::RanOut);
        let took = started.elapsed();
        assert!(took >= MAX_WAIT, "it ran out after {took:?}");
        // One entry goes without a wait, then one waits again; after it
        // runs out too, two go without, then four.
        for skipped in [1, 2, 4] {
            for _ in 0..skipped {
                assert_eq!(next_entry(&c, 0).await, Ended::NotArmed);
            }
            assert_eq!(next_entry(&c, 0).await, Ended::RanOut);
        }
        for _ in 0..8 {
            next_entry(&c, 0).await;
        }
        // A wait that ends by returns makes the next run-out skip one again.
        assert_eq!(next_entry(&c, 100).await, Ended::Back);
        let then: Vec<Ended> = [
            next_entry(&c, 0).await,
            next_entry(&c, 0).await,
            next_entry(&c, 0).await,
        ]
        .into();
        assert_eq!(then, [Ended::RanOut, Ended::NotArmed, Ended::RanOut]);
    }

    /// The next entry after one of 10 writes answered: a wait (if armed)
    /// that runs out at once, with `queued` writes queued.
    async fn next_entry(c: &Comeback, queued: u64) -> Ended {
        c.arm(10, 0, Duration::ZERO);
        c.wait(|| queued).await
    }

    #[tokio::test]
    async fn a_leader_told_not_to_wait_never_does() {
        let c = Comeback::new(false);
        c.arm(10, 0, Duration::from_secs(1));
        assert_eq!(c.wait(|| 0).await, Ended::NotArmed);
        assert_eq!(c.waits(), Waits::default());
    }

    #[test]
    fn skips_are_bounded() {
        let c = Comeback::new(true);
        for _ in 0..20 {
            c.ended(true);
        }
        assert_eq!(c.schedule.lock().skipping(), WriterWaits::MAX_SKIP);
    }
}
