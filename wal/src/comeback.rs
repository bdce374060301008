//! The sync thread's wait, before a sync, for the writers it just answered.
//!
//! The sync thread syncs whatever is pending as soon as the sync before
//! returned. Writers that wait for each answer before they submit again
//! (a server's clients nearly all do) then split into two halves that take
//! turns: a batch's writers are answered just as the next sync starts with
//! the others, so they wait a whole sync for a place. At pipeline 1 with
//! 50 clients every sync held 23–25 records. Syncing only once the writers
//! just answered are back (or most of them: [`WriterWaits::back`]) lets one sync hold
//! nearly all of them (47–48): half the syncs, and half the wake-ups of the
//! sync thread and of the threads it answers, for the same records.
//!
//! The wait is bounded so that writers who do not come back (a client that
//! reads next, or stopped) cost little: it ends after [`SYNCS`] times the
//! last sync's time at most (and [`MAX_WAIT`]), and a wait that ran out
//! makes the next batches go without one, twice as many after each that
//! runs out in a row (up to [`WriterWaits::MAX_SKIP`]). A lone writer never waits: its
//! entry is back as soon as it is answered.
//!
//! Nor does a batch wait once the last two held [`MAX_ENTRIES`] or more:
//! there the sync is already shared widely, and the time the disk stands
//! idle during a wait costs more than the syncs it saves. Measured on this
//! project's VM (2 cores, `fencelog bench`, 50 clients, event-loop
//! generator): at pipeline 1, 87.5 → 90.2 k appends/s for 10.3 → 9.3 CPU
//! s per M; at pipeline 16 with a wait before every sync (390 records per
//! sync without it, 750 with it), 702–731 → 553–655 k/s for no less CPU
//! (docs/DESIGN.md, "Waiting for the writers").

use std::time::{Duration, Instant};

/// The longest wait, in times the last sync took: writers coming back
/// took 230–270 µs at pipeline 1 with 50 clients against syncs of
/// 110–130 µs, so a bound of two syncs ran out in four waits of ten.
const SYNCS: u32 = 8;

/// The longest wait, whatever the last sync took.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(1);

/// Entries in the last two batches from which the next one does not wait.
pub(crate) const MAX_ENTRIES: u64 = 256;

/// The rules a wait for the writers just answered follows, wherever it is
/// made: here before a sync, and in a cluster leader before its next entry
/// (`fencelog-cluster`'s `comeback.rs`). How long a wait may last is the
/// maker's: each bounds it by its own round.
///
/// - A wait ends once three in four of the writers answered are back
///   ([`WriterWaits::back`]), so that one slow writer does not hold every
///   other.
/// - A wait that ran out makes the next batches go without one, twice as
///   many after each that runs out in a row, up to
///   [`WriterWaits::MAX_SKIP`], so that a load of writers who do not come
///   back (a client that reads next, or stopped) pays for one wait in
///   many batches.
/// - A wait that ended by returns resets that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterWaits {
    /// Batches still to go without a wait.
    skipping: u32,
    /// How many the next wait that runs out makes skip theirs.
    next_skip: u32,
}

impl Default for WriterWaits {
    fn default() -> Self {
        WriterWaits::new()
    }
}

impl WriterWaits {
    /// Batches that go without a wait after waits that ran out, at most.
    pub const MAX_SKIP: u32 = 64;

    /// No wait ran out yet: the next batch waits.
    pub const fn new() -> Self {
        WriterWaits {
            skipping: 0,
            next_skip: 1,
        }
    }

    /// How many of `answered` writers ends a wait once back: three in
    /// four, rounded up.
    pub fn back(answered: u64) -> u64 {
        (answered * 3).div_ceil(4)
    }

    /// Whether the next batch waits; one that does not (waits are being
    /// skipped after run-outs) counts itself off.
    pub fn due(&mut self) -> bool {
        if self.skipping > 0 {
            self.skipping -= 1;
            return false;
        }
        true
    }

    /// A wait ended: its time ran out before the writers came back, or
    /// not.
    pub fn ended(&mut self, ran_out: bool) {
        if ran_out {
            self.skipping = self.next_skip;
            self.next_skip = (self.next_skip * 2).min(Self::MAX_SKIP);
        } else {
            self.next_skip = 1;
        }
    }

    /// Batches still to go without a wait.
    pub fn skipping(&self) -> u32 {
        self.skipping
    }
}

/// A batch synced and answered, as the wait needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answered {
    /// Entries the batch held.
    pub(crate) entries: u64,
    /// Entries pending when its sync returned, before any writer of it
    /// was answered.
    pub(crate) queued: u64,
    /// Its write and sync.
    pub(crate) took: Duration,
}

/// A wait to make before the next sync: until `entries` are pending, or
/// `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) entries: u64,
    pub(crate) until: Instant,
}

/// The sync thread's state for the wait (it alone holds it).
#[derive(Debug)]
pub(crate) struct Comeback {
    /// Whether this log waits at all ([`crate::WalOptions::wait_for_writers`]).
    enabled: bool,
    /// Entries of the batch before the last.
    before_last: u64,
    armed: Option<Wait>,
    schedule: WriterWaits,
}

impl Comeback {
    /// The wait's state; with `enabled` false it never waits.
    pub(crate) fn new(enabled: bool) -> Self {
        Comeback {
            enabled,
            before_last: 0,
            armed: None,
            schedule: WriterWaits::new(),
        }
    }

    /// A batch was synced and is about to be answered (at `now`): arms the
    /// wait for the next, unless no wait is due.
    pub(crate) fn answered(&mut self, batch: Answered, now: Instant) {
        let two = batch.entries + std::mem::replace(&mut self.before_last, batch.entries);
        self.armed = None;
        if !self.enabled || batch.entries < 2 || two >= MAX_ENTRIES {
            return;
        }
        if !self.schedule.due() {
            return;
        }
        self.armed = Some(Wait {
            entries: batch.queued + WriterWaits::back(batch.entries),
            until: now + (batch.took * SYNCS).min(MAX_WAIT),
        });
    }

    /// The wait due before the next sync, if any (once: it is disarmed).
    pub(crate) fn take(&mut self) -> Option<Wait> {
        self.armed.take()
    }

    /// The wait taken ended: its time ran out before the writers came
    /// back, or not ([`WriterWaits::ended`]).
    pub(crate) fn ended(&mut self, ran_out: bool) {
        self.schedule.ended(ran_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(entries: u64, queued: u64) -> Answered {
        Answered {
            entries,
            queued,
            took: Duration::from_micros(100),
        }
    }

    #[test]
    fn three_in_four_of_the_batch_come_back_on_top_of_what_was_queued() {
        let now = Instant::now();
        let mut c = Comeback::new(true);
        c.answered(batch(24, 20), now);
        let wait = c.take().expect("a batch of 24 waits for its writers");
        assert_eq!(wait.entries, 20 + 18);
        assert_eq!(wait.until, now + Duration::from_micros(800));
        assert_eq!(c.take(), None, "a wait is taken once");
        // The bound is capped, whatever the sync took.
        c.answered(
            Answered {
                took: Duration::from_millis(5),
                ..batch(3, 0)
            },
            now,
        );
        assert_eq!(
            c.take().map(|w| (w.entries, w.until)),
            Some((3, now + MAX_WAIT))
        );
    }

    #[test]
    fn a_lone_writer_large_batches_and_a_disabled_log_never_wait() {
        let now = Instant::now();
        let mut c = Comeback::new(true);
        c.answered(batch(1, 0), now);
        assert_eq!(c.take(), None, "a lone writer's entry is the one awaited");
        c.answered(batch(200, 0), now);
        assert!(
            c.take().is_some(),
            "1 + 200 entries in the last two batches"
        );
        c.answered(batch(60, 0), now);
        assert_eq!(c.take(), None, "200 + 60 in the last two batches");
        c.answered(batch(60, 0), now);
        assert!(c.take().is_some());
        let mut off = Comeback::new(false);
        off.answered(batch(24, 0), now);
        assert_eq!(off.take(), None);
    }

    #[test]
    fn waits_that_run_out_make_1_2_4_batches_skip_and_a_return_resets_that() {
        let now = Instant::now();
        let mut c = Comeback::new(true);
        // Batches synced until one waits: how many skipped the wait.
        let skipped = |c: &mut Comeback| {
            let mut n = 0;
            loop {
                c.answered(batch(24, 0), now);
                if c.take().is_some() {
                    return n;
                }
                n += 1;
            }
        };
        assert_eq!(skipped(&mut c), 0);
        let mut after_run_outs = Vec::new();
        for _ in 0..8 {
            c.ended(true);
            after_run_outs.push(skipped(&mut c));
        }
        assert_eq!(
            after_run_outs,
            [1, 2, 4, 8, 16, 32, 64, WriterWaits::MAX_SKIP]
        );
        // A wait that ends by returns: the next run-out skips one again.
        c.ended(false);
        assert_eq!(skipped(&mut c), 0);
        c.ended(true);
        assert_eq!(skipped(&mut c), 1);
    }
}
