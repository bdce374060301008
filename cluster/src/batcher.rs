//! Writes batched into entries of the replicated log, stamped with the
//! group's clock.
//!
//! Every entry costs a sync on each node (and, before the patch described
//! in `third_party/openraft/PATCHED.md`, openraft 0.9's leader synced each
//! entry before it replicated it): one entry per write would cost one
//! `fdatasync` per write (about 850 writes/s here with 800 in flight).
//! So writes queue here, in the order they were
//! proposed, and go out as one entry holding every write that arrived while
//! the entries before were on their way: at most [`IN_FLIGHT`] entries wait
//! for their answers at a time, so under load an entry carries what a round
//! of replication let pile up, and a lone write still goes out at once.
//! With one entry in flight, the next also waits (briefly, bounded) for
//! most of the writers just answered to write again, so that clients who
//! wait for each answer share entries instead of taking turns
//! (`comeback.rs`).
//!
//! **Time.** Lease decisions take their time from the entry, so every
//! replica decides alike. The time an entry carries is the group's clock
//! as this leader carries it on ([`GroupClock`]): when a node starts to
//! lead a term it first waits until it has applied everything committed
//! (Raft's ReadIndex), reads the highest time the log has carried, and
//! counts on from there with its own monotonic clock. So the group's clock
//! never runs back: not across a restart of one node or of all of them,
//! nor a change of leader. The leader's first entry is a take-over
//! ([`Command::TakeOver`]): every lease still live on the group's clock
//! is held for its full ttl from then, because how long the old leader was
//! gone cannot be known. While it leads, the leader puts its clock in the
//! log whenever a lease runs out on it ([`Command::Blank`], a tick), so the log
//! knows the lease expired and no later take-over revives it.
//!
//! **Bounds.** The queue holds at most [`MAX_QUEUED`] writes and at most
//! `max_queued_bytes` of them encoded (the server's client memory budget,
//! `--maxmemory-clients`): past either a write is refused at once
//! ([`ClusterError::Busy`], `TRYAGAIN`). A write that waited past its
//! client's deadline is answered and dropped, never proposed (its client
//! was told it failed). What the queue holds is counted ([`Batcher::queued`]:
//! `CLUSTER INFO`, `INFO memory`); each write's bytes also count in its
//! client's share of the budget while the client waits for the answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::error::ClientWriteError;
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::comeback::Comeback;
use crate::node::{ClusterError, Queued as QueueStats};
use crate::state_machine::Engine;
use fencelog::Command;

use crate::types::{Raft, Request, Response};

/// Entries proposed and not yet answered, at most, unless the node is
/// told otherwise ([`crate::NodeConfig::entries_in_flight`]). Every entry
/// costs each replica a sync, a round of messages and a few wake-ups,
/// whatever it holds; fewer entries in flight make each hold more, more
/// hide more of a round trip. One: openraft 0.9 sends a follower one
/// AppendEntries at a time, so a second entry proposed meanwhile does not
/// travel any sooner; it only splits the writes into smaller entries.
/// Measured against two (docs/CLUSTER.md, "Entries in flight"): a twelfth
/// to a sixth less CPU per write and as many or more writes a second, at
/// pipeline 1 and 16, on fresh groups and on one that ran a while.
pub const IN_FLIGHT: usize = 1;

/// The most entries in flight a node may be told to keep.
pub const MAX_IN_FLIGHT: usize = 8;

/// Writes in one entry, at most (the state machine numbers an entry's
/// writes within 16 bits; see `state_machine.rs`).
pub(crate) const MAX_WRITES: usize = 4096;

/// Writes waiting for an entry, at most: past it a write is refused at
/// once (`TRYAGAIN`), so a leader cut off from its quorum holds a bounded
/// backlog, not whatever its clients send.
pub(crate) const MAX_QUEUED: usize = 65_536;

/// How often a leader looks whether a lease ran out on its clock, and
/// whether to send its digest.
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// How often a leader sends its digest for the replicas to compare.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A write waiting for its entry, or a connection's pipelined writes
/// together (they go into one entry, in order, with one answer).
struct Queued {
    cmds: Cmds,
    bytes: u64,
    /// Its client is answered by then: past it the writes are dropped.
    deadline: Instant,
    answer: Answer,
}

/// One write, or several that travel together.
enum Cmds {
    One(Command),
    Many(Vec<Command>),
}

/// Where a queued item's answer goes (for several writes, how many).
enum Answer {
    One(oneshot::Sender<Result<Response, ClusterError>>),
    Many(usize, oneshot::Sender<Result<Vec<Response>, ClusterError>>),
}

/// The answer to a queued item of several writes: one response per write,
/// in order, or why none was decided.
pub(crate) type ManyAnswer = oneshot::Receiver<Result<Vec<Response>, ClusterError>>;

impl Queued {
    fn writes(&self) -> usize {
        self.answer.writes()
    }
}

impl Answer {
    fn writes(&self) -> usize {
        match self {
            Answer::One(_) => 1,
            Answer::Many(n, _) => *n,
        }
    }

    fn fail(self, e: ClusterError) {
        match self {
            Answer::One(a) => {
                let _ = a.send(Err(e));
            }
            Answer::Many(_, a) => {
                let _ = a.send(Err(e));
            }
        }
    }
}

/// The group's clock as this node, leading, carries it on: ms, the highest
/// time the log carried when this node's term began, plus the time since
/// on this node's monotonic clock.
#[derive(Default)]
pub(crate) struct GroupClock {
    anchor: Mutex<Option<Anchor>>,
    /// This node's monotonic clock if not the OS's (a simulation's, with
    /// skew and pauses): see [`crate::node::Hooks::local_clock`].
    local: Option<crate::node::LocalClock>,
}

#[derive(Clone, Copy)]
struct Anchor {
    term: u64,
    /// tokio's clock: the OS monotonic clock, but for a runtime whose time
    /// is paused (the deterministic simulation).
    at: tokio::time::Instant,
    /// The local clock's reading then, if it has one.
    local_at: Duration,
    base_ms: u64,
}

impl GroupClock {
    /// The group's time now, if this node leads `term` and has taken it
    /// over.
    pub(crate) fn now_ms(&self, term: u64) -> Option<u64> {
        let a = (*self.anchor.lock())?;
        (a.term == term).then(|| {
            let elapsed = match &self.local {
                Some(local) => local().saturating_sub(a.local_at),
                None => a.at.elapsed(),
            };
            a.base_ms + elapsed.as_millis() as u64
        })
    }

    fn anchor(&self, term: u64, base_ms: u64) -> u64 {
        // Never below 1: 0 means "no time" to the state machine.
        let base_ms = base_ms.max(1);
        *self.anchor.lock() = Some(Anchor {
            term,
            at: tokio::time::Instant::now(),
            local_at: self.local.as_ref().map_or(Duration::ZERO, |l| l()),
            base_ms,
        });
        base_ms
    }
}

/// What the queue holds now: writes, and their encoded bytes.
struct Counts {
    writes: AtomicU64,
    bytes: AtomicU64,
    max_bytes: u64,
    /// Since the node started: items taken from the queue into entries (a
    /// write, or writes queued together), and the writes they held.
    taken_items: AtomicU64,
    taken_writes: AtomicU64,
    /// Where each entry's round, proposal to answer, is timed.
    timings: Arc<crate::timings::Timings>,
    /// The wait before an entry for the writers just answered.
    comeback: Comeback,
}

impl Counts {
    /// Writes of `bytes` in all left the queue.
    fn left(&self, writes: u64, bytes: u64) {
        self.writes.fetch_sub(writes, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// How a leader makes its entries.
pub(crate) struct Rules {
    /// The most bytes of writes an entry holds.
    pub max_bytes: u64,
    /// The most bytes of writes the queue holds.
    pub max_queued_bytes: u64,
    /// Entries proposed and not yet answered, at most.
    pub in_flight: usize,
    /// With one entry in flight, whether to wait for the writers just
    /// answered before the next entry (`comeback.rs`).
    pub batch_wait: bool,
}

/// Where writes are queued for the batching task.
#[derive(Clone)]
pub(crate) struct Batcher {
    tx: mpsc::Sender<Queued>,
    clock: Arc<GroupClock>,
    counts: Arc<Counts>,
}

impl Batcher {
    /// Starts the batching task and the leader's watch on the current
    /// runtime (Raft's), making entries by `rules`.
    pub(crate) fn spawn(
        raft: Raft,
        engine: Engine,
        rules: Rules,
        local: Option<crate::node::LocalClock>,
        timings: Arc<crate::timings::Timings>,
    ) -> Batcher {
        let in_flight = rules.in_flight.clamp(1, MAX_IN_FLIGHT);
        let (tx, rx) = mpsc::channel(MAX_QUEUED);
        let clock = Arc::new(GroupClock {
            anchor: Mutex::default(),
            local,
        });
        let counts = Arc::new(Counts {
            writes: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            max_bytes: rules.max_queued_bytes,
            taken_items: AtomicU64::new(0),
            taken_writes: AtomicU64::new(0),
            timings,
            // With several entries in flight, an entry leaves while others
            // are answered: no moment comes at which its writers are back.
            comeback: Comeback::new(rules.batch_wait && in_flight == 1),
        });
        tokio::spawn(run(
            raft.clone(),
            engine.clone(),
            Arc::clone(&clock),
            rx,
            rules.max_bytes,
            in_flight,
            Arc::clone(&counts),
        ));
        let batcher = Batcher { tx, clock, counts };
        tokio::spawn(watch(raft, engine, batcher.clone()));
        batcher
    }

    /// The group's time now, if this node leads `term` and has taken it
    /// over.
    pub(crate) fn now_ms(&self, term: u64) -> Option<u64> {
        self.clock.now_ms(term)
    }

    /// What the queue holds now, and its bounds.
    pub(crate) fn queued(&self) -> QueueStats {
        QueueStats {
            writes: self.counts.writes.load(Ordering::Acquire),
            bytes: self.counts.bytes.load(Ordering::Acquire),
            max_writes: MAX_QUEUED as u64,
            max_bytes: self.counts.max_bytes,
            taken_items: self.counts.taken_items.load(Ordering::Relaxed),
            taken_writes: self.counts.taken_writes.load(Ordering::Relaxed),
            comeback: self.counts.comeback.waits(),
        }
    }

    /// Queues `cmd` (of `bytes` encoded) behind every write queued before
    /// it; the receiver answers once its entry is applied here. A write
    /// still queued at `deadline` is dropped, never proposed. Refused
    /// ([`ClusterError::Busy`]) when the queue holds [`MAX_QUEUED`] writes,
    /// or would hold more than its bytes' bound with this one (a write is
    /// taken into an empty queue whatever its size: it fits an entry).
    pub(crate) fn queue(
        &self,
        cmd: Command,
        bytes: u64,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Result<Response, ClusterError>>, ClusterError> {
        let (answer, rx) = oneshot::channel();
        self.send(Cmds::One(cmd), bytes, deadline, Answer::One(answer))?;
        Ok(rx)
    }

    /// [`Batcher::queue`] for several writes that go into one entry, in
    /// order, and are answered together (one response per write). The
    /// caller keeps them within one entry's bounds ([`MAX_WRITES`], the
    /// entry's bytes).
    pub(crate) fn queue_many(
        &self,
        cmds: Vec<Command>,
        bytes: u64,
        deadline: Instant,
    ) -> Result<ManyAnswer, ClusterError> {
        debug_assert!(!cmds.is_empty() && cmds.len() <= MAX_WRITES);
        let (answer, rx) = oneshot::channel();
        let n = cmds.len();
        self.send(Cmds::Many(cmds), bytes, deadline, Answer::Many(n, answer))?;
        Ok(rx)
    }

    fn send(
        &self,
        cmds: Cmds,
        bytes: u64,
        deadline: Instant,
        answer: Answer,
    ) -> Result<(), ClusterError> {
        let counts = &self.counts;
        let n = answer.writes() as u64;
        // Counted before it is sent (the batching task may take it at once
        // and count it out).
        let held = counts.bytes.fetch_add(bytes, Ordering::AcqRel);
        let writes = counts.writes.fetch_add(n, Ordering::AcqRel);
        if writes > 0 && held + bytes > counts.max_bytes {
            counts.left(n, bytes);
            return Err(ClusterError::Busy {
                queued: writes,
                bytes: held,
            });
        }
        let q = Queued {
            cmds,
            bytes,
            deadline,
            answer,
        };
        match self.tx.try_send(q) {
            Ok(()) => {
                // Perhaps a writer the leader waits for (`comeback.rs`).
                counts.comeback.arrived(writes + n);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                counts.left(n, bytes);
                Err(ClusterError::Busy {
                    queued: MAX_QUEUED as u64,
                    bytes: held,
                })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                counts.left(n, bytes);
                Err(ClusterError::Raft("the node is shutting down".into()))
            }
        }
    }
}

/// Whether this node leads, and in which term.
fn leading(raft: &Raft) -> Option<u64> {
    let m = raft.metrics();
    let m = m.borrow();
    (m.state == ServerState::Leader).then_some(m.current_term)
}

/// Takes over `term`: waits until everything committed is applied here,
/// then starts the group's clock from the highest time the log carried,
/// and proposes the take-over of the leases. Answers the clock's start.
async fn take_over(
    raft: &Raft,
    engine: &Engine,
    clock: &GroupClock,
    term: u64,
) -> Result<u64, ClusterError> {
    raft.ensure_linearizable().await.map_err(|e| match e {
        openraft::error::RaftError::APIError(
            openraft::error::CheckIsLeaderError::ForwardToLeader(_),
        ) => ClusterError::NotLeader { leader: None },
        other => ClusterError::Raft(other.to_string()),
    })?;
    let base = clock.anchor(term, engine.log().group_clock_ms());
    let req = Request::new(base, vec![Command::TakeOver]);
    let pending = raft
        .client_write_ff(req)
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    tokio::spawn(async move {
        if let Ok(Err(e)) = pending.await {
            tracing::debug!(error = %e, "the take-over entry was not committed");
        }
    });
    tracing::info!(term, clock_ms = base, "took over the leases");
    Ok(base)
}

async fn run(
    raft: Raft,
    engine: Engine,
    clock: Arc<GroupClock>,
    mut rx: mpsc::Receiver<Queued>,
    max_bytes: u64,
    in_flight: usize,
    counts: Arc<Counts>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
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
        // With one entry in flight, the writers of the last one come back
        // first (`comeback.rs`).
        counts
            .comeback
            .wait(|| counts.writes.load(Ordering::Acquire))
            .await;
        let mut bytes = first.bytes;
        let mut writes = first.writes();
        let mut batch = vec![first];
        while writes < MAX_WRITES {
            match rx.try_recv() {
                Ok(q) if bytes + q.bytes <= max_bytes && writes + q.writes() <= MAX_WRITES => {
                    bytes += q.bytes;
                    writes += q.writes();
                    batch.push(q);
                }
                Ok(q) => {
                    carried = Some(q);
                    break;
                }
                Err(_) => break,
            }
        }
        // Out of the queue: an entry's writes are Raft's to hold now (at
        // most `in_flight` entries of them), the late ones are answered.
        counts.left(writes as u64, bytes);
        counts
            .taken_items
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        counts
            .taken_writes
            .fetch_add(writes as u64, Ordering::Relaxed);
        // Writes whose clients were answered already are never proposed.
        let now = Instant::now();
        let (late, batch): (Vec<_>, Vec<_>) = batch.into_iter().partition(|q| q.deadline <= now);
        for q in late {
            q.answer.fail(ClusterError::Dropped);
        }
        if batch.is_empty() {
            continue;
        }
        let stamped = match leading(&raft) {
            None => Err(ClusterError::NotLeader { leader: None }),
            Some(term) => match clock.now_ms(term) {
                Some(t) => Ok(t),
                None => take_over(&raft, &engine, &clock, term).await.and_then(|_| {
                    clock
                        .now_ms(term)
                        .ok_or(ClusterError::NotLeader { leader: None })
                }),
            },
        };
        let mut cmds = Vec::with_capacity(writes);
        let mut answers = Vec::with_capacity(batch.len());
        for q in batch {
            match q.cmds {
                Cmds::One(cmd) => cmds.push(cmd),
                Cmds::Many(many) => cmds.extend(many),
            }
            answers.push(q.answer);
        }
        let time_ms = match stamped {
            Ok(t) => t,
            Err(e) => {
                // Never proposed: certain.
                for a in answers {
                    a.fail(e.duplicate());
                }
                continue;
            }
        };
        let proposed = Instant::now();
        // The round again on tokio's clock, for the wait's bound: the
        // simulation's clock when it runs one (`sim/`), whose replays must
        // not depend on how long a round took in real time (a seed ran
        // differently twice on a loaded machine when the bound came from
        // this one's clock). Elsewhere the two clocks are one.
        let proposed_here = tokio::time::Instant::now();
        match raft.client_write_ff(Request::packed(time_ms, cmds)).await {
            Ok(pending) => {
                let counts = Arc::clone(&counts);
                tokio::spawn(async move {
                    let outcome = pending.await;
                    if outcome.as_ref().is_ok_and(Result::is_ok) {
                        counts.timings.entry_rounds.since(proposed);
                        let queued = counts.writes.load(Ordering::Acquire);
                        counts
                            .comeback
                            .arm(writes as u64, queued, proposed_here.elapsed());
                    }
                    drop(slot);
                    answer(outcome, answers);
                });
            }
            Err(e) => {
                for a in answers {
                    a.fail(ClusterError::Raft(e.to_string()));
                }
            }
        }
    }
}

/// The leader's watch: a tick when a lease runs out on the group's clock,
/// and the digest every [`CHECK_EVERY`]. Both go through the queue, so
/// they are stamped and ordered like any write.
async fn watch(raft: Raft, engine: Engine, batcher: Batcher) {
    let mut checked = tokio::time::Instant::now();
    // The Raft index of the last position a digest was sent for.
    let mut last_checked = 0;
    let mut tick: Option<oneshot::Receiver<Result<Response, ClusterError>>> = None;
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        if raft.metrics().borrow().state == ServerState::Shutdown {
            return;
        }
        // One tick at a time: the next is sent once this one is answered.
        if let Some(rx) = &mut tick {
            match rx.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => {}
                _ => tick = None,
            }
        }
        let Some(term) = leading(&raft) else {
            continue;
        };
        let Some(now) = batcher.now_ms(term) else {
            // Leading, not taken over yet: a tick makes the batching task
            // take over now, not at the first client's write (until then
            // the group's clock is not carried on, and a lease read waits).
            if tick.is_none() {
                let deadline = Instant::now() + Duration::from_secs(10);
                tick = batcher.queue(Command::Blank, 16, deadline).ok();
            }
            continue;
        };
        let log = engine.log();
        if tick.is_none()
            && let Some(expiry) = log.next_lease_expiry_ms()
            && expiry <= now
        {
            let deadline = Instant::now() + Duration::from_secs(10);
            tick = batcher.queue(Command::Blank, 16, deadline).ok();
        }
        if checked.elapsed() >= CHECK_EVERY {
            checked = tokio::time::Instant::now();
            let (applied, digest) = log.digest();
            // Not for a position only the last check itself moved past:
            // an idle group sends none.
            if let Some(at) = applied
                && (at.index >> 16) > last_checked + 1
            {
                last_checked = at.index >> 16;
                let deadline = Instant::now() + Duration::from_secs(10);
                let _ = batcher.queue(
                    Command::Check {
                        index: at.index,
                        digest,
                    },
                    32,
                    deadline,
                );
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

/// Hands each write its answer from its entry's (several writes queued
/// together take theirs together, in order).
fn answer(outcome: Outcome, answers: Vec<Answer>) {
    let writes: usize = answers.iter().map(Answer::writes).sum();
    let failed = match outcome {
        Ok(Ok(r)) if r.data.0.len() == writes => {
            let mut responses = r.data.0.into_iter();
            for a in answers {
                match a {
                    Answer::One(a) => {
                        // As many responses as writes: one is there.
                        if let Some(resp) = responses.next() {
                            let _ = a.send(Ok(resp));
                        }
                    }
                    Answer::Many(n, a) => {
                        let _ = a.send(Ok(responses.by_ref().take(n).collect()));
                    }
                }
            }
            return;
        }
        Ok(Ok(r)) => ClusterError::Raft(format!(
            "an entry of {} writes answered {}",
            writes,
            r.data.0.len()
        )),
        // Refused by a leader deposed a moment ago, or appended and then
        // cut from this log by a newer leader. In the second case another
        // replica may still hold it and a later leader commit it: not
        // certain.
        Ok(Err(ClientWriteError::ForwardToLeader(_))) => {
            ClusterError::Uncertain("this node stopped leading with the write in flight".into())
        }
        Ok(Err(e)) => ClusterError::Raft(e.to_string()),
        Err(_) => ClusterError::stopped_undecided(),
    };
    for a in answers {
        a.fail(failed.duplicate());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batcher whose queue nobody takes from (no Raft behind it).
    fn idle(max_queued_bytes: u64) -> (Batcher, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel(MAX_QUEUED);
        let counts = Arc::new(Counts {
            writes: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            max_bytes: max_queued_bytes,
            taken_items: AtomicU64::new(0),
            taken_writes: AtomicU64::new(0),
            timings: Arc::default(),
            comeback: Comeback::new(false),
        });
        let batcher = Batcher {
            tx,
            clock: Arc::default(),
            counts,
        };
        (batcher, rx)
    }

    #[test]
    fn the_queue_counts_its_writes_and_bytes_and_refuses_past_its_byte_bound() {
        let (b, mut rx) = idle(100);
        let deadline = Instant::now() + Duration::from_secs(10);
        // Into an empty queue a write goes whatever its size (it fits an
        // entry: the caller checked), so a bound below one write never
        // stops the group.
        let _first = b.queue(Command::Blank, 150, deadline).unwrap();
        assert_eq!(
            b.queued(),
            QueueStats {
                writes: 1,
                bytes: 150,
                max_writes: MAX_QUEUED as u64,
                max_bytes: 100,
                taken_items: 0,
                taken_writes: 0,
                comeback: Default::default(),
            }
        );
        match b.queue(Command::Blank, 1, deadline) {
            Err(ClusterError::Busy { queued, bytes }) => assert_eq!((queued, bytes), (1, 150)),
            other => panic!("{other:?}"),
        }
        // The refused write is not counted.
        assert_eq!((b.queued().writes, b.queued().bytes), (1, 150));
        // Taken out (as the batching task does), the room comes back.
        let q = rx.try_recv().unwrap();
        b.counts.left(1, q.bytes);
        let _a = b.queue(Command::Blank, 60, deadline).unwrap();
        let _b = b.queue(Command::Blank, 40, deadline).unwrap();
        assert!(matches!(
            b.queue(Command::Blank, 1, deadline),
            Err(ClusterError::Busy {
                queued: 2,
                bytes: 100
            })
        ));
        assert_eq!((b.queued().writes, b.queued().bytes), (2, 100));
    }
}
