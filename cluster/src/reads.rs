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

#[derive(Default)]
struct State {
    running: bool,
    /// The round reads join now: it starts once the one running ends.
    next: Option<Arc<Round>>,
    /// Reads that joined a round, and rounds run, since the node started.
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
    /// round ended).
    pub(crate) fn join(
        self: &Arc<Self>,
        raft: &Raft,
        engine: &Engine,
    ) -> impl Future<Output = Result<Log, ClusterError>> + Send + 'static + use<> {
        let (round, start) = {
            let mut s = self.state.lock();
            s.joined += 1;
            let round = Arc::clone(s.next.get_or_insert_with(Arc::default));
            (round, !std::mem::replace(&mut s.running, true))
        };
        if start {
            // Spawned, not driven by this read: a client that goes away
            // must not strand the others.
            tokio::spawn(Arc::clone(self).rounds(raft.clone(), engine.clone()));
        }
        async move { round.wait().await }
    }

    /// Reads that joined a round and rounds run since the node started.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.joined, s.rounds)
    }

    /// Runs rounds while reads wait; each round answers the reads that
    /// joined it before it started.
    async fn rounds(self: Arc<Self>, raft: Raft, engine: Engine) {
        loop {
            let round = {
                let mut s = self.state.lock();
                match s.next.take() {
                    Some(round) => {
                        s.rounds += 1;
                        Finishing(round)
                    }
                    None => {
                        s.running = false;
                        return;
                    }
                }
            };
            round.0.finish(run(&raft).await.map(|()| engine.log()));
        }
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
