//! Linearizable reads share ReadIndex rounds.
//!
//! A read must see every write committed before it arrived, so it waits
//! for a round of Raft's ReadIndex (the leader confirms with a quorum that
//! it still leads, then applies up to its commit index) that *starts after
//! it arrived*. One round at a time runs; every read that arrives while it
//! runs joins the next, so a storm of reads costs one round per round
//! trip, not one round (and one message to each follower) per read.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::node::ClusterError;
use crate::types::Raft;

type Waiter = oneshot::Sender<Result<(), ClusterError>>;

/// Reads waiting for a round, and whether one runs.
#[derive(Default)]
pub(crate) struct Reads {
    state: Mutex<State>,
    /// Reads that joined a round, and rounds run, since the node started.
    joined: AtomicU64,
    rounds: AtomicU64,
}

#[derive(Default)]
struct State {
    running: bool,
    waiting: Vec<Waiter>,
}

impl Reads {
    /// Joins the next round now (not when first polled): the returned
    /// future completes once a round that started after this call has.
    /// A connection's pipelined reads each join at once, so they share
    /// one round instead of taking one round trip apiece.
    pub(crate) fn join(
        self: &Arc<Self>,
        raft: &Raft,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send + 'static + use<> {
        let (tx, rx) = oneshot::channel();
        self.joined.fetch_add(1, Ordering::Relaxed);
        let start = {
            let mut s = self.state.lock();
            s.waiting.push(tx);
            !std::mem::replace(&mut s.running, true)
        };
        if start {
            // Spawned, not driven by this read: a client that goes away
            // must not strand the others.
            tokio::spawn(Arc::clone(self).rounds(raft.clone()));
        }
        async move {
            rx.await.unwrap_or_else(|_| {
                Err(ClusterError::Raft(
                    "the node stopped during a read round".into(),
                ))
            })
        }
    }

    /// Reads that joined a round and rounds run since the node started.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.joined.load(Ordering::Relaxed),
            self.rounds.load(Ordering::Relaxed),
        )
    }

    /// Runs rounds while reads wait; each round answers the reads that were
    /// waiting when it started.
    async fn rounds(self: Arc<Self>, raft: Raft) {
        loop {
            let batch = {
                let mut s = self.state.lock();
                if s.waiting.is_empty() {
                    s.running = false;
                    return;
                }
                std::mem::take(&mut s.waiting)
            };
            self.rounds.fetch_add(1, Ordering::Relaxed);
            let outcome = round(&raft).await;
            for w in batch {
                let _ = w.send(match &outcome {
                    Ok(()) => Ok(()),
                    Err(e) => Err(e.duplicate()),
                });
            }
        }
    }
}

async fn round(raft: &Raft) -> Result<(), ClusterError> {
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
