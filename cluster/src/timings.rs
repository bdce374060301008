//! Where a replicated write's time goes, on this node: four steps timed
//! as they happen, each a count and a sum of microseconds since the node
//! started. A reader takes the difference of two readings for the mean
//! over an interval (`INFO replication`, `/metrics`,
//! `scripts/cluster-timings.sh`).
//!
//! - **entry rounds** (a leader): an entry from its proposal to its answer
//!   (replicated to a quorum, committed, applied here). With one entry in
//!   flight this is what a write waits for once its entry leaves.
//! - **replications** (a leader): an AppendEntries that carries entries,
//!   from send to a follower's answer (the network both ways, the
//!   follower's check, append and sync). Heartbeats are not counted.
//! - **log syncs** (every node): entries handed to this node's Raft log
//!   until they are durable.
//! - **applies** (every node): one call of the state machine's apply (a
//!   batch of committed entries decided by the engine, its writes
//!   written to the engine's log).
//!
//! Every step is timed once per entry or per batch, never per write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One step: how many times it was timed, and their total.
#[derive(Default)]
pub(crate) struct Timing {
    count: AtomicU64,
    micros: AtomicU64,
}

impl Timing {
    /// Counts one step that began at `started`.
    pub(crate) fn since(&self, started: Instant) {
        self.record(started.elapsed());
    }

    /// Counts one step that took `took`.
    pub(crate) fn record(&self, took: Duration) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Its count and total so far.
    pub(crate) fn total(&self) -> Timed {
        Timed {
            count: self.count.load(Ordering::Relaxed),
            micros: self.micros.load(Ordering::Relaxed),
        }
    }
}

/// The steps of one node, shared by the parts that time them.
#[derive(Default)]
pub(crate) struct Timings {
    /// Timed by the batcher (a leader's proposals).
    pub(crate) entry_rounds: Timing,
    /// Timed by the network wrapper Raft sends through (`health.rs`).
    pub(crate) replications: Timing,
    /// Timed by the Raft log store's append.
    pub(crate) log_syncs: Timing,
    /// Timed by the state machine's apply.
    pub(crate) applies: Timing,
}

impl Timings {
    /// A reading of every step.
    pub(crate) fn read(&self) -> Steps {
        Steps {
            entry_rounds: self.entry_rounds.total(),
            replications: self.replications.total(),
            log_syncs: self.log_syncs.total(),
            applies: self.applies.total(),
        }
    }
}

/// One step's count and total time since the node started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timed {
    /// Times the step was timed.
    pub count: u64,
    /// Their total, in microseconds.
    pub micros: u64,
}

impl Timed {
    /// The mean in microseconds, if the step was timed at all.
    pub fn mean_micros(&self) -> Option<u64> {
        self.micros.checked_div(self.count)
    }
}

/// A reading of a node's steps (see the module's documentation for what
/// each times).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Steps {
    /// A leader's entries from proposal to answer.
    pub entry_rounds: Timed,
    /// A leader's AppendEntries with entries, send to answer.
    pub replications: Timed,
    /// This node's Raft log appends until durable.
    pub log_syncs: Timed,
    /// This node's state machine applies.
    pub applies: Timed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_sums_what_was_timed_and_its_mean_divides_it() {
        let t = Timings::default();
        assert_eq!(t.read(), Steps::default());
        assert_eq!(t.read().applies.mean_micros(), None);
        t.applies.record(Duration::from_micros(100));
        t.applies.record(Duration::from_micros(300));
        t.log_syncs.record(Duration::from_millis(2));
        let r = t.read();
        assert_eq!(
            r.applies,
            Timed {
                count: 2,
                micros: 400
            }
        );
        assert_eq!(r.applies.mean_micros(), Some(200));
        assert_eq!(r.log_syncs.mean_micros(), Some(2000));
        assert_eq!(r.entry_rounds.count, 0);
        assert_eq!(r.replications.count, 0);
    }
}
