//! Writes batched into entries of the replicated log.
//!
//! openraft 0.9's leader waits for each entry it appends to its own log to
//! be synced before it takes the next one: one entry per write would cost
//! one `fdatasync` per write, one after the other (about 850 writes/s here
//! with 800 in flight). So writes queue here, in the order they were
//! proposed, and go out as one entry holding every write that arrived while
//! the entries before were on their way: at most [`IN_FLIGHT`] entries wait
//! for their answers at a time, so under load an entry carries what a round
//! of replication let pile up, and a lone write still goes out at once.

use std::sync::Arc;
use std::time::Instant;

use openraft::error::ClientWriteError;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::node::ClusterError;
use crate::types::{Raft, Request, Response, WireCommand};

/// Entries proposed and not yet answered, at most.
const IN_FLIGHT: usize = 2;

/// Writes in one entry, at most (the state machine numbers an entry's
/// writes within 16 bits; see `state_machine.rs`).
pub(crate) const MAX_WRITES: usize = 4096;

/// A write waiting for its entry.
struct Queued {
    cmd: WireCommand,
    bytes: u64,
    answer: oneshot::Sender<Result<Response, ClusterError>>,
}

/// Where writes are queued for the batching task.
#[derive(Clone)]
pub(crate) struct Batcher {
    tx: mpsc::UnboundedSender<Queued>,
}

impl Batcher {
    /// Starts the batching task on the current runtime (Raft's).
    pub(crate) fn spawn(raft: Raft, started: Instant, max_bytes: u64) -> Batcher {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx, started, max_bytes));
        Batcher { tx }
    }

    /// Queues `cmd` (of `bytes` encoded) behind every write queued before
    /// it; the receiver answers once its entry is applied here.
    pub(crate) fn queue(
        &self,
        cmd: WireCommand,
        bytes: u64,
    ) -> Result<oneshot::Receiver<Result<Response, ClusterError>>, ClusterError> {
        let (answer, rx) = oneshot::channel();
        self.tx
            .send(Queued { cmd, bytes, answer })
            .map_err(|_| ClusterError::Raft("the node is shutting down".into()))?;
        Ok(rx)
    }
}

/// The leader's clock for an entry: ms since the node started, never 0
/// (0 means "no time" to the state machine).
pub(crate) fn now_ms(started: Instant) -> u64 {
    started.elapsed().as_millis() as u64 + 1
}

async fn run(
    raft: Raft,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    started: Instant,
    max_bytes: u64,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut carried: Option<Queued> = None;
    loop {
        let first = match carried.take() {
            Some(q) => q,
            None => match rx.recv().await {
                Some(q) => q,
                None => return,
            },
        };
        // Waiting for a slot is what lets the next entry fill up.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_WRITES {
            match rx.try_recv() {
                Ok(q) if bytes + q.bytes <= max_bytes => {
                    bytes += q.bytes;
                    batch.push(q);
                }
                Ok(q) => {
                    carried = Some(q);
                    break;
                }
                Err(_) => break,
            }
        }
        let (cmds, answers): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|q| (q.cmd, q.answer)).unzip();
        let req = Request {
            time_ms: now_ms(started),
            cmds,
        };
        match raft.client_write_ff(req).await {
            Ok(pending) => {
                tokio::spawn(async move {
                    let outcome = pending.await;
                    drop(slot);
                    answer(outcome, answers);
                });
            }
            Err(e) => {
                for a in answers {
                    let _ = a.send(Err(ClusterError::Raft(e.to_string())));
                }
            }
        }
    }
}

type Outcome = Result<
    Result<
        openraft::raft::ClientWriteResponse<crate::types::TypeConfig>,
        ClientWriteError<crate::types::NodeId, crate::types::Member>,
    >,
    oneshot::error::RecvError,
>;

/// Hands each write its answer from its entry's.
fn answer(outcome: Outcome, answers: Vec<oneshot::Sender<Result<Response, ClusterError>>>) {
    let err = |e: &ClusterError| match e {
        ClusterError::Uncertain(s) => ClusterError::Uncertain(s.clone()),
        other => ClusterError::Raft(other.to_string()),
    };
    let failed = match outcome {
        Ok(Ok(r)) if r.data.0.len() == answers.len() => {
            for (a, resp) in answers.into_iter().zip(r.data.0) {
                let _ = a.send(Ok(resp));
            }
            return;
        }
        Ok(Ok(r)) => ClusterError::Raft(format!(
            "an entry of {} writes answered {}",
            answers.len(),
            r.data.0.len()
        )),
        // Refused by a leader deposed a moment ago, or appended and then
        // cut from this log by a newer leader. In the second case another
        // replica may still hold it and a later leader commit it (in a
        // group of five): not certain.
        Ok(Err(ClientWriteError::ForwardToLeader(_))) => {
            ClusterError::Uncertain("this node stopped leading with the write in flight".into())
        }
        Ok(Err(e)) => ClusterError::Raft(e.to_string()),
        Err(_) => ClusterError::Uncertain("this node stopped before the write was decided".into()),
    };
    for a in answers {
        let _ = a.send(Err(err(&failed)));
    }
}
