//! The lock of the log's serialized section and the condition variables
//! that wait on it.
//!
//! `parking_lot`'s mutex, contended, spins a few rounds and then calls
//! `sched_yield` up to seven times before it sleeps. On a machine with
//! fewer cores than busy threads each yield hands the core to another
//! thread for a time slice, while the holder, on the other core, lets the
//! lock go microseconds later. A single node at pipeline 16 made 2 700
//! such yields a second on this lock (its connection threads and its sync
//! thread), a 3-node leader's Raft thread about 900. The standard
//! library's mutex spins briefly and then sleeps in the kernel until the
//! holder wakes it as it unlocks: no yield. This wraps it with the
//! interface the log used (no poisoning: a panic under the lock leaves the
//! state as it was, as `parking_lot` did; the log latches a failure of its
//! own before anything can panic there).

use std::ops::{Deref, DerefMut};
use std::sync::PoisonError;
use std::time::{Duration, Instant};

/// A mutual exclusion lock that sleeps rather than yields when contended.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

/// The guard of a [`Mutex`]: the lock is held while it lives.
pub(crate) struct MutexGuard<'a, T>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    pub(crate) const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    /// Takes the lock, waiting for it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    /// Takes the lock if nobody holds it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(MutexGuard(Some(g))),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(MutexGuard(Some(p.into_inner()))),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Taken out only inside `Condvar::wait_*`, which puts it back.
        self.0.as_deref().expect("a guard is whole outside a wait")
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0
            .as_deref_mut()
            .expect("a guard is whole outside a wait")
    }
}

/// What a timed wait answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// Whether the wait ended because its time ran out.
    pub(crate) fn timed_out(self) -> bool {
        self.0
    }
}

/// A condition variable that waits on a [`Mutex`].
#[derive(Debug, Default)]
pub(crate) struct Condvar(std::sync::Condvar);

impl Condvar {
    pub(crate) const fn new() -> Condvar {
        Condvar(std::sync::Condvar::new())
    }

    /// Wakes one waiter.
    pub(crate) fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiter.
    pub(crate) fn notify_all(&self) {
        self.0.notify_all();
    }

    /// Releases the lock and waits for a notification (or a spurious
    /// wake-up); holds the lock again on return.
    pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let inner = guard.0.take().expect("a guard is whole outside a wait");
        guard.0 = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
    }

    /// As [`Condvar::wait`], for at most `timeout`.
    pub(crate) fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        let inner = guard.0.take().expect("a guard is whole outside a wait");
        let (inner, result) = self
            .0
            .wait_timeout(inner, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        guard.0 = Some(inner);
        WaitTimeoutResult(result.timed_out())
    }

    /// As [`Condvar::wait`], until `deadline` at the latest.
    pub(crate) fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        let now = Instant::now();
        if deadline <= now {
            return WaitTimeoutResult(true);
        }
        self.wait_for(guard, deadline - now)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_wait_is_woken_and_times_out() {
        let pair = Arc::new((Mutex::new(false), Condvar::new()));
        let other = Arc::clone(&pair);
        let t = std::thread::spawn(move || {
            *other.0.lock() = true;
            other.1.notify_all();
        });
        let mut g = pair.0.lock();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !*g {
            assert!(
                !pair.1.wait_until(&mut g, deadline).timed_out(),
                "never woken"
            );
        }
        drop(g);
        t.join().unwrap();
        let mut g = pair.0.lock();
        let started = Instant::now();
        assert!(
            pair.1
                .wait_for(&mut g, Duration::from_millis(20))
                .timed_out()
        );
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(*g, "the state is whole after a wait");
        assert!(
            pair.1
                .wait_until(&mut g, Instant::now() - Duration::from_millis(1))
                .timed_out()
        );
    }

    #[test]
    fn a_panic_under_the_lock_leaves_it_usable() {
        let m = Arc::new(Mutex::new(1));
        let other = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut g = other.lock();
            *g = 2;
            panic!("under the lock");
        })
        .join();
        assert_eq!(*m.lock(), 2);
    }
}
