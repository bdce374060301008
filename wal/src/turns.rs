//! Turns: a pass of an event loop finishes before its writes are synced.
//!
//! A server thread that runs an event loop reads every connection that is
//! ready, submits what it read, and then sleeps. Redis syncs its log once
//! per such pass, after it: one `fdatasync` covers every client served in
//! the pass. The sync thread here syncs whatever is pending as soon as the
//! last sync returned, so under load it syncs in the middle of a pass, and
//! again for the rest of it: more syncs (each a system call, a journal
//! write and a round of wake-ups) for the same entries.
//!
//! [`Turns`] lets the threads of a server say when a pass begins and ends.
//! The sync thread, finding entries pending while some of them are in a
//! pass, waits until each of those has ended the pass it was in (never for
//! a pass begun later, and never longer than [`Turns::max_wait`]), then
//! syncs everything pending at once. A thread that ends its pass wakes the
//! sync thread only when it is waiting for that.
//!
//! (Tried and dropped: the thread ending its pass writing and syncing the
//! batch itself, as Redis' loop does. It saved no CPU here: the sync
//! thread still took most batches, those left while a sync was under way.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::lock::{Condvar, Mutex};

/// The passes of a fixed set of event-loop threads (members), shared by
/// them and the write-ahead logs they submit to (through
/// [`WalOptions::turns`](crate::WalOptions::turns)).
#[derive(Debug)]
pub struct Turns {
    /// Per member, the number of times it began or ended a pass: odd while
    /// it is in one. Written only by its member.
    members: Box<[Slot]>,
    /// The sync thread waits for passes to end.
    waiting: AtomicBool,
    lock: Mutex<()>,
    ended: Condvar,
    max_wait: Duration,
}

/// One member's counter, on a cache line of its own: members write theirs
/// at every pass.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(AtomicU64);

/// A member's handle: what its thread calls as a pass begins and ends.
#[derive(Debug, Clone)]
pub struct Member {
    turns: Arc<Turns>,
    index: usize,
}

impl Turns {
    /// Turns for `members` threads; the sync thread waits at most
    /// `max_wait` for their passes.
    pub fn new(members: usize, max_wait: Duration) -> Arc<Turns> {
        Arc::new(Turns {
            members: (0..members).map(|_| Slot::default()).collect(),
            waiting: AtomicBool::new(false),
            lock: Mutex::new(()),
            ended: Condvar::new(),
            max_wait,
        })
    }

    /// The handle of member `index` (`0..members`), `None` beyond.
    pub fn member(self: &Arc<Self>, index: usize) -> Option<Member> {
        (index < self.members.len()).then(|| Member {
            turns: Arc::clone(self),
            index,
        })
    }

    /// How long the sync thread waits for passes at most.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Waits until every member that is in a pass now has ended it, or
    /// `max_wait` passed. `in_pass` is scratch space (kept by the caller so
    /// that waiting allocates nothing). Answers whether it waited at all.
    pub(crate) fn wait_for_passes(&self, in_pass: &mut Vec<(usize, u64)>) -> bool {
        in_pass.clear();
        for (i, slot) in self.members.iter().enumerate() {
            let seen = slot.0.load(Ordering::SeqCst);
            if in_a_pass(seen) {
                in_pass.push((i, seen));
            }
        }
        if in_pass.is_empty() {
            return false;
        }
        let ended = |in_pass: &[(usize, u64)]| {
            in_pass
                .iter()
                .all(|&(i, seen)| self.members[i].0.load(Ordering::SeqCst) != seen)
        };
        let deadline = Instant::now() + self.max_wait;
        let mut guard = self.lock.lock();
        // Set before the members are looked at again, under the lock: a
        // member that ends its pass after this look sees the flag and
        // notifies, and cannot do so before this thread waits.
        self.waiting.store(true, Ordering::SeqCst);
        while !ended(in_pass) {
            if self.ended.wait_until(&mut guard, deadline).timed_out() {
                break;
            }
        }
        self.waiting.store(false, Ordering::SeqCst);
        true
    }
}

/// A member's counter is odd while it is in a pass.
fn in_a_pass(count: u64) -> bool {
    count & 1 == 1
}

impl Member {
    /// The member's thread begins a pass (it woke up with work).
    pub fn begin(&self) {
        let slot = &self.turns.members[self.index].0;
        let n = slot.load(Ordering::Relaxed);
        if !in_a_pass(n) {
            slot.store(n + 1, Ordering::SeqCst);
        }
    }

    /// The member's thread ended its pass (it is about to sleep): a sync
    /// waiting for it may start.
    pub fn end(&self) {
        let turns = &self.turns;
        let slot = &turns.members[self.index].0;
        let n = slot.load(Ordering::Relaxed);
        if in_a_pass(n) {
            slot.store(n + 1, Ordering::SeqCst);
            if turns.waiting.load(Ordering::SeqCst) {
                let _guard = turns.lock.lock();
                turns.ended.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_in_a_pass_means_no_wait() {
        let turns = Turns::new(2, Duration::from_secs(10));
        let m = turns.member(0).unwrap();
        m.begin();
        m.end();
        assert!(!turns.wait_for_passes(&mut Vec::new()));
        assert!(turns.member(2).is_none());
    }

    #[test]
    fn a_wait_ends_when_the_pass_does() {
        let turns = Turns::new(2, Duration::from_secs(30));
        let m = turns.member(1).unwrap();
        m.begin();
        m.begin(); // a repeated begin is the same pass
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let turns = Arc::clone(&turns);
            std::thread::spawn(move || {
                let waited = turns.wait_for_passes(&mut Vec::new());
                tx.send(waited).unwrap();
            })
        };
        // Still in its pass: the waiter must not have returned.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        m.end();
        assert!(rx.recv_timeout(Duration::from_secs(20)).unwrap());
        waiter.join().unwrap();
    }

    #[test]
    fn a_pass_that_never_ends_is_waited_for_max_wait() {
        let turns = Turns::new(1, Duration::from_millis(20));
        turns.member(0).unwrap().begin();
        let started = Instant::now();
        assert!(turns.wait_for_passes(&mut Vec::new()));
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}
