//! Linearizable reads share ReadIndex rounds.
//!
//! A read must see every write committed before it arrived, so it waits
//! for a round of Raft's ReadIndex (the leader confirms with a quorum that
//! it still leads, then applies up to its commit index) that *starts after
//! it arrived*. One round at a time runs; every read that arrives while it
//! runs joins the next, so a storm of reads costs one round per round
//! trip, not one round (and one message to each follower) per read. The
//! reads of a round share one outcome, the engine to read once the round
//! is done: joining costs a reference count, not a channel.
//!
//! A second round may run beside the first, once at least [`EARLY`] reads
//! wait for it: under a storm of pipelined reads the next round's reads
//! then start their round trip while the first's are answered, instead of
//! every connection waiting for the same round at once (the node idle
//! between). Fewer waiting reads wait for the round running: a round costs
//! a message to every follower, worth it only when shared widely.

use std::sync::{Arc, OnceLock};

use fencelog::Log;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::node::ClusterError;
use crate::state_machine::Engine;
use crate::types::Raft;

/// Reads waiting for a round, and whether one runs.
#[derive(Default)]
pub(crate) struct Reads {
    state: Mutex<State>,
}

/// Reads waiting for the next round that let it start beside a running one.
pub(crate) const EARLY: usize = 64;

/// Rounds that may run at once.
const AT_ONCE: usize = 2;

#[derive(Default)]
struct State {
    /// Rounds running (tasks that run them), at most [`AT_ONCE`].
    running: usize,
    /// The round reads join now: it starts once a task is free to run it.
    next: Option<Arc<Round>>,
    /// Reads waiting for `next` (as their joins told).
    waiting: usize,
    /// Joins of a round (a read, or a connection's pipelined reads
    /// together), and rounds run, since the node started.
    joined: u64,
    rounds: u64,
}

/// One round's outcome, shared by every read that joined it.
#[derive(Default)]
struct Round {
    outcome: OnceLock<Result<Log, ClusterError>>,
    done: Notify,
}

impl Round {
    fn finish(&self, outcome: Result<Log, ClusterError>) {
        let _ = self.outcome.set(outcome);
        self.done.notify_waiters();
    }

    async fn wait(&self) -> Result<Log, ClusterError> {
        loop {
            // Most of a round's reads are first polled after it ended (a
            // connection answers its pipelined reads in order): those take
            // the outcome without joining the `Notify`'s list under its lock.
            if let Some(outcome) = self.outcome() {
                return outcome;
            }
            let notified = self.done.notified();
            tokio::pin!(notified);
            // Registered before the check: a finish in between wakes it.
            notified.as_mut().enable();
            if let Some(outcome) = self.outcome() {
                return outcome;
            }
            notified.await;
        }
    }

    fn outcome(&self) -> Option<Result<Log, ClusterError>> {
        self.outcome.get().map(|outcome| match outcome {
            Ok(log) => Ok(log.clone()),
            Err(e) => Err(e.duplicate()),
        })
    }
}

/// Ends a round with an error if its task is dropped before it did (the
/// node stopping): its reads are answered, not stranded.
struct Finishing(Arc<Round>);

impl Drop for Finishing {
    fn drop(&mut self) {
        if self.0.outcome.get().is_none() {
            self.0.finish(Err(ClusterError::Raft(
                "the node stopped during a read round".into(),
            )));
        }
    }
}

impl Reads {
    /// Joins the next round now (not when first polled): the returned
    /// future completes once a round that started after this call has.
    /// A connection's pipelined reads each join at once, so they share
    /// one round instead of taking one round trip apiece.
    /// The future answers the engine to read (the one in use when the
    /// round ended). `reads`: how many reads wait for it (a connection
    /// joins once for its pipelined reads), for the second round's rule.
    pub(crate) fn join(
        self: &Arc<Self>,
        raft: &Raft,
        engine: &Engine,
        reads: usize,
    ) -> impl Future<Output = Result<Log, ClusterError>> + Send + 'static + use<> {
        let round = self.join_with(reads, || {
            let (raft, engine) = (raft.clone(), engine.clone());
            move || {
                let (raft, engine) = (raft.clone(), engine.clone());
                async move { run(&raft).await.map(|()| engine.log()) }
            }
        });
        async move { round.wait().await }
    }

    /// [`Reads::join`] with what a round runs (`runner` makes that, asked
    /// only when this read starts a task that runs rounds): the round
    /// joined.
    fn join_with<R, F>(self: &Arc<Self>, reads: usize, runner: impl FnOnce() -> R) -> Arc<Round>
    where
        R: FnMut() -> F + Send + 'static,
        F: Future<Output = Result<Log, ClusterError>> + Send + 'static,
    {
        let (round, start) = {
            let mut s = self.state.lock();
            s.joined += 1;
            s.waiting += reads;
            let round = Arc::clone(s.next.get_or_insert_with(Arc::default));
            let start = s.may_start();
            s.running += usize::from(start);
            (round, start)
        };
        if start {
            // Spawned, not driven by this read: a client that goes away
            // must not strand the others.
            tokio::spawn(Arc::clone(self).rounds(runner()));
        }
        round
    }

    /// Joins of a round and rounds run since the node started.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.joined, s.rounds)
    }

    /// Runs rounds while reads wait; each round answers the reads that
    /// joined it before it started.
    async fn rounds<F>(self: Arc<Self>, mut runner: impl FnMut() -> F)
    where
        F: Future<Output = Result<Log, ClusterError>>,
    {
        loop {
            let round = {
                let mut s = self.state.lock();
                // This task's turn ends when no read waits, or when too few
                // wait to be worth a round beside the other task's.
                s.running -= 1;
                if !s.may_start() {
                    return;
                }
                let Some(round) = s.next.take() else {
                    return;
                };
                s.running += 1;
                s.rounds += 1;
                s.waiting = 0;
                Finishing(round)
            };
            round.0.finish(runner().await);
        }
    }
}

impl State {
    /// Whether the reads waiting for `next` may start a round now: none
    /// runs, or one does and enough wait.
    fn may_start(&self) -> bool {
        self.running == 0 || (self.running < AT_ONCE && self.waiting >= EARLY)
    }
}

async fn run(raft: &Raft) -> Result<(), ClusterError> {
    use openraft::error::{CheckIsLeaderError, RaftError};
    match raft.ensure_linearizable().await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
            Err(ClusterError::NotLeader {
                leader: f.leader_id.zip(f.leader_node),
            })
        }
        Err(e) => Err(ClusterError::Raft(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner whose rounds the test ends: each round sends the test a
    /// sender, and the round ends when the test answers it.
    type RoundRun = std::pin::Pin<Box<dyn Future<Output = Result<Log, ClusterError>> + Send>>;

    fn gated(
        log: Log,
    ) -> (
        impl FnMut() -> RoundRun + Send + 'static,
        tokio::sync::mpsc::UnboundedReceiver<tokio::sync::oneshot::Sender<()>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let runner = move || {
            let (tx, log) = (tx.clone(), log.clone());
            Box::pin(async move {
                let (end, ended) = tokio::sync::oneshot::channel();
                let _ = tx.send(end);
                let _ = ended.await;
                Ok(log)
            }) as RoundRun
        };
        (runner, rx)
    }

    #[tokio::test]
    async fn a_second_round_starts_beside_the_first_only_once_enough_reads_wait() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), fencelog::Options::default()).unwrap();
        let reads = Arc::new(Reads::default());
        let (runner, mut started) = gated(log);
        let mut runner = Some(runner);
        let mut join = |reads: &Arc<Reads>| {
            let round = reads.join_with(1, || runner.take().expect("a second task asked for"));
            tokio::spawn(async move { round.wait().await.map(|_| ()) })
        };
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };

        // One read starts a round; reads that join meanwhile wait for the next.
        let first = join(&reads);
        settle().await;
        let end_first = started.try_recv().expect("the first read starts a round");
        let mut second: Vec<_> = (1..EARLY).map(|_| join(&reads)).collect();
        settle().await;
        assert!(
            started.try_recv().is_err(),
            "{} reads waiting started a second round",
            EARLY - 1
        );
        assert_eq!(reads.state.lock().running, 1);
        // The EARLY-th waiting read lets the next round run beside the first
        // (the same task-starting path: a second task, so the runner made
        // once would be asked again; it is made again for it here).
        let (runner2, mut started2) =
            gated(Log::open(dir.path().join("b"), fencelog::Options::default()).unwrap());
        let mut runner2 = Some(runner2);
        let round = reads.join_with(1, || runner2.take().expect("asked once"));
        second.push(tokio::spawn(async move { round.wait().await.map(|_| ()) }));
        settle().await;
        let end_second = started2
            .try_recv()
            .expect("a second round beside the first");
        assert_eq!(reads.state.lock().running, AT_ONCE);
        // No third beside them, however many wait.
        let third: Vec<_> = (0..2 * EARLY)
            .map(|_| {
                let round = reads.join_with(1, || -> Box<dyn FnMut() -> RoundRun + Send> {
                    panic!("a third round started")
                });
                tokio::spawn(async move { round.wait().await.map(|_| ()) })
            })
            .collect();
        settle().await;
        assert_eq!(reads.state.lock().running, AT_ONCE);

        // The rounds end in either order; every read is answered, the waiting
        // ones by a round that started after they joined.
        end_second.send(()).unwrap();
        for r in second {
            r.await.unwrap().unwrap();
        }
        // That task found 2 × EARLY waiting beside the first: it ran them.
        settle().await;
        let end_third = started2.try_recv().expect("the waiting reads' round");
        assert!(!first.is_finished());
        end_first.send(()).unwrap();
        first.await.unwrap().unwrap();
        settle().await;
        // The first task found nothing waiting (the other took it) and ended.
        assert_eq!(reads.state.lock().running, 1);
        end_third.send(()).unwrap();
        for r in third {
            r.await.unwrap().unwrap();
        }
        settle().await;
        let s = reads.state.lock();
        assert_eq!((s.running, s.waiting, s.next.is_none()), (0, 0, true));
        assert_eq!((s.joined, s.rounds), (1 + 3 * EARLY as u64, 3));
    }

    #[tokio::test]
    async fn a_round_answers_every_read_that_joined_it_and_a_dropped_one_errs() {
        let round = Arc::new(Round::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let r = Arc::clone(&round);
                tokio::spawn(async move { r.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        round.finish(Err(ClusterError::NoQuorum { ms: 7 }));
        for w in waiters {
            assert!(matches!(
                w.await.unwrap(),
                Err(ClusterError::NoQuorum { ms: 7 })
            ));
        }
        // One joined after it finished gets the same outcome at once.
        assert!(round.wait().await.is_err());
        // A round whose task is dropped answers its reads.
        let dropped = Arc::new(Round::default());
        let waiter = {
            let r = Arc::clone(&dropped);
            tokio::spawn(async move { r.wait().await })
        };
        drop(Finishing(Arc::clone(&dropped)));
        let Err(err) = waiter.await.unwrap() else {
            panic!("a dropped round answered a read")
        };
        assert!(
            err.to_string().contains("stopped during a read round"),
            "{err}"
        );
    }
}
