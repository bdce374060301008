//! One node of a cluster: its Raft log (fencelog's WAL), its state machine
//! (the fencelog engine in cluster mode), the peer listener, and what the
//! server asks of them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelog::Command;
use openraft::{ChangeMembers, Config, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::batcher::Batcher;
use crate::log_store::{Io, LogStore};
use crate::network::{self, Network};
use crate::state_machine::{Engine, StateMachine};
use crate::types::{Member, NodeId, Raft, Response};

/// How a node is started.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id (1 and up; the same across restarts).
    pub id: NodeId,
    /// Its data directory: `raft/` (the Raft log) and `sm/` (the engine).
    pub dir: PathBuf,
    /// Where it listens for its peers' Raft messages.
    pub raft_listen: SocketAddr,
    /// This node as its peers and clients reach it.
    pub member: Member,
    /// The engine's options (cluster mode is set on them).
    pub engine: fencelog::Options,
    /// Segment size of the Raft log.
    pub raft_segment_bytes: u64,
    /// A follower that hears nothing from a leader for a time in this
    /// range starts an election (ms).
    pub election_timeout_ms: (u64, u64),
    /// How often a leader sends heartbeats (ms).
    pub heartbeat_ms: u64,
    /// A snapshot after this many entries applied since the last one.
    pub snapshot_every_entries: u64,
    /// A snapshot also once this node's Raft log has written this many
    /// bytes since the last one this rule asked for (checked every second;
    /// 0: by entries only). Entries vary from one write to thousands: this
    /// bounds the log on disk where a count of entries cannot.
    pub snapshot_every_bytes: u64,
    /// The secret every member shares; peers prove it to each other
    /// before any Raft message is read (docs/CLUSTER.md, "Security").
    /// `None` (the default) only on loopback.
    pub cluster_secret: Option<network::ClusterSecret>,
    /// The most bytes (encoded) of writes the leader's queue holds while
    /// they wait for an entry; past it a write is refused (`Busy`). The
    /// server makes it its client memory budget (`--maxmemory-clients`).
    pub max_queued_bytes: u64,
    /// Entries a leader keeps proposed and not yet answered, at most
    /// (1 to [`crate::MAX_ENTRIES_IN_FLIGHT`]): writes that arrive
    /// meanwhile wait and go out together in the next entry.
    pub entries_in_flight: usize,
    /// With one entry in flight, whether the leader waits (briefly, see
    /// `comeback.rs`) for the writers it just answered to write again
    /// before it proposes the next entry.
    pub batch_wait: bool,
}

impl NodeConfig {
    /// Defaults for a node: 8 MiB Raft segments, elections after 300–600 ms
    /// of silence, heartbeats every 100 ms, a snapshot every 50 000 entries
    /// or 256 MiB of Raft log, a queue of writes of at most 512 MiB, one
    /// entry in flight, and the wait for the writers it answered.
    pub fn new(id: NodeId, dir: PathBuf, raft_listen: SocketAddr, member: Member) -> NodeConfig {
        NodeConfig {
            id,
            dir,
            raft_listen,
            member,
            engine: fencelog::Options::default(),
            raft_segment_bytes: 8 << 20,
            election_timeout_ms: (300, 600),
            heartbeat_ms: 100,
            snapshot_every_entries: 50_000,
            snapshot_every_bytes: 256 << 20,
            cluster_secret: None,
            max_queued_bytes: 512 << 20,
            entries_in_flight: crate::DEFAULT_ENTRIES_IN_FLIGHT,
            batch_wait: true,
        }
    }
}

/// A node's monotonic clock as a reading since any fixed origin (see
/// [`Hooks::local_clock`]).
pub type LocalClock = Arc<dyn Fn() -> Duration + Send + Sync>;

/// What a node can be given instead of the real thing: the hooks of the
/// deterministic simulation (`fencelog-sim`), used with
/// [`Node::start_on_current_runtime`]. Every field's `None` (the default)
/// is the production behaviour. Not for production: the simulated
/// storage and transport keep nothing on a real disk or network.
#[derive(Clone, Default)]
pub struct Hooks {
    /// The storage of the Raft log and of the replica engine's log (the
    /// simulated disk), which then run with inline I/O
    /// (`WalOptions::inline_io`: no sync, allocator or collector threads)
    /// and no preallocation. The incarnation file, the generation pointer
    /// and the snapshot store stay on real files in the node's directory;
    /// snapshots do not work on it (set `snapshot_every_entries` high; no
    /// snapshot is asked for by bytes).
    pub storage: Option<Arc<dyn fencelog_wal::Storage>>,
    /// The peer transport instead of TCP: no peer listener is bound, and
    /// peers reach this node through [`Node::peer_endpoint`].
    pub transport: Option<Arc<dyn network::Transport>>,
    /// The seed of the election's random spread instead of the OS.
    pub election_seed: Option<u64>,
    /// The incarnation a fresh data directory gets, instead of a random one.
    pub fresh_incarnation: Option<u64>,
    /// This node's monotonic clock as the group's clock reads it while it
    /// leads (skew, pauses), instead of tokio's.
    pub local_clock: Option<LocalClock>,
}

/// Why a node could not start or act.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// This node is not the leader; the leader, if known.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The leader's id and member, if this node knows one.
        leader: Option<(NodeId, Member)>,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] fencelog::Error),
    /// The Raft log failed.
    #[error(transparent)]
    Log(#[from] fencelog_wal::WalError),
    /// Raft failed or refused (shutting down, a membership change under
    /// way, …).
    #[error("raft: {0}")]
    Raft(String),
    /// The write was proposed but its fate is unknown: the leader stopped
    /// or lost its place before it could tell (the entry may yet commit
    /// under the next leader, or may be gone). Not retried blindly: a
    /// retry of an append may append twice (`LOG.APPENDAT` retries
    /// safely).
    #[error("the outcome of the write is unknown: {0}")]
    Uncertain(String),
    /// A request too large for one entry of the Raft log.
    #[error("a request of {len} bytes (at most {max} in one replicated entry)")]
    TooLarge {
        /// Its encoded size.
        len: u64,
        /// The largest an entry holds.
        max: u64,
    },
    /// This leader's queue of writes waiting for an entry is full: the
    /// write was not proposed (try again, or elsewhere).
    #[error(
        "{queued} writes ({bytes} bytes) are waiting for replication already; the write was not \
         proposed"
    )]
    Busy {
        /// Writes in the queue.
        queued: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// The write waited in the leader's queue past its client's deadline
    /// and was dropped there, never proposed: it did not happen.
    #[error("the write waited too long for replication and was dropped, not applied")]
    Dropped,
    /// This node is not a member of the group (it was removed, or is
    /// still being added and replays a history from before) and knows no
    /// leader to send its client to. It does not campaign.
    #[error(
        "this node was removed from the group (or is not yet added to it) and knows no leader: \
         ask another member"
    )]
    Removed,
    /// This node leads but no quorum has answered it for longer than an
    /// election timeout: it is about to step down (CheckQuorum), and
    /// answers no client as the leader meanwhile; or it stepped down for
    /// that and has heard from no leader since (it is cut off).
    #[error(
        "this node led but no quorum has answered it for {ms} ms (it is cut off, or its peers \
         are down): ask another member"
    )]
    NoQuorum {
        /// How long since a quorum last answered it (or since it led).
        ms: u64,
    },
    /// An I/O error (binding the peer listener, …).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl ClusterError {
    /// A write's answer lost with the node: it stopped (or its batching
    /// task ended) before the write's entry was decided.
    pub(crate) fn stopped_undecided() -> ClusterError {
        ClusterError::Uncertain("this node stopped before the write was decided".into())
    }

    /// The same error for another waiter of one entry (an I/O error
    /// travels as its text).
    pub(crate) fn duplicate(&self) -> ClusterError {
        match self {
            ClusterError::NotLeader { leader } => ClusterError::NotLeader {
                leader: leader.clone(),
            },
            ClusterError::Uncertain(s) => ClusterError::Uncertain(s.clone()),
            ClusterError::Busy { queued, bytes } => ClusterError::Busy {
                queued: *queued,
                bytes: *bytes,
            },
            ClusterError::Dropped => ClusterError::Dropped,
            ClusterError::Removed => ClusterError::Removed,
            ClusterError::NoQuorum { ms } => ClusterError::NoQuorum { ms: *ms },
            ClusterError::TooLarge { len, max } => ClusterError::TooLarge {
                len: *len,
                max: *max,
            },
            other => ClusterError::Raft(other.to_string()),
        }
    }
}

/// A running node.
pub struct Node {
    id: NodeId,
    /// Its data directory's incarnation (`incarnation.rs`).
    incarnation: u64,
    /// Its peer network (to probe a peer's incarnation).
    network: Network,
    raft: Raft,
    /// Raft's metrics, kept: each client request asks whether this node
    /// serves as the leader, and a receiver made per ask costs shared
    /// atomics on every connection thread.
    metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, Member>>,
    engine: Engine,
    log_store: LogStore,
    max_request: u64,
    batcher: Batcher,
    reads: Arc<crate::reads::Reads>,
    /// When this node last heard from a leader, and the election timeout.
    election: Arc<crate::election::Election>,
    /// When each peer last answered this node.
    answers: Arc<crate::health::PeerAnswers>,
    listener: parking_lot::Mutex<Option<JoinHandle<()>>>,
    /// What peers over a [`network::Transport`] reach.
    endpoint: network::PeerEndpoint,
    /// Stops Raft's runtime, and its thread.
    runtime: parking_lot::Mutex<Option<RuntimeHandle>>,
    /// Where a replicated write's time goes on this node (`timings.rs`).
    timings: Arc<crate::timings::Timings>,
}

/// A node's own Raft thread: what stops its runtime, and the thread.
type RuntimeHandle = (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
);

/// Opens the logs and starts Raft and the peer listener on the runtime
/// this runs on: the node, with no runtime of its own yet (the caller
/// hands it the one it started, if any).
async fn start_here(cfg: NodeConfig, hooks: Hooks) -> Result<Node, ClusterError> {
    let log_store = open_raft_log(&cfg, &hooks).await?;
    let (incarnation, unrecorded) = incarnation_of(&cfg, &hooks, &log_store)?;
    let max_request = log_store.max_request_bytes() as u64;
    let timings = log_store.timings();
    let sm = open_state_machine(&cfg, &hooks, max_request)
        .await?
        .timed_in(Arc::clone(&timings));
    let engine = sm.engine();
    let network = peer_network(&cfg, &hooks, incarnation);
    let (raft, answers) = start_raft(&cfg, &network, log_store.clone(), sm, &timings).await?;
    if unrecorded {
        record_incarnation(&raft, &cfg, incarnation).await?;
    }
    let election = crate::election::Election::new(
        cfg.election_timeout_ms.0,
        cfg.election_timeout_ms.1,
        hooks.election_seed,
    );
    let endpoint = network::PeerEndpoint {
        raft: raft.clone(),
        auth: network.auth(),
        election: Arc::clone(&election),
        log: log_store.clone(),
    };
    let listener = match hooks.transport {
        Some(_) => None,
        None => Some(listen_for_peers(&cfg, &endpoint).await?),
    };
    if cfg.snapshot_every_bytes > 0 && hooks.storage.is_none() {
        tokio::spawn(snapshot_by_bytes(
            raft.clone(),
            log_store.clone(),
            cfg.snapshot_every_bytes,
        ));
    }
    // The pre-votes share the pooled connections.
    tokio::spawn(crate::election::drive(
        Arc::clone(&election),
        raft.clone(),
        log_store.clone(),
        network.clone(),
        cfg.id,
    ));
    // An entry holds at most half of what one may (its writes' framing and
    // the rest of the entry fit in the other half).
    let batcher = Batcher::spawn(
        raft.clone(),
        engine.clone(),
        crate::batcher::Rules {
            max_bytes: max_request / 2,
            max_queued_bytes: cfg.max_queued_bytes,
            in_flight: cfg.entries_in_flight,
            batch_wait: cfg.batch_wait,
        },
        hooks.local_clock.clone(),
        Arc::clone(&timings),
    );
    Ok(Node {
        id: cfg.id,
        incarnation,
        network,
        metrics: raft.metrics(),
        raft,
        engine,
        log_store,
        max_request,
        batcher,
        reads: Arc::default(),
        election,
        answers,
        listener: parking_lot::Mutex::new(listener),
        endpoint,
        runtime: parking_lot::Mutex::new(None),
        timings,
    })
}

/// Asks Raft for a snapshot each time this node's Raft log has written
/// `every` bytes since the last ask: building one costs links, not a copy
/// of the engine, and lets Raft purge the log behind it. Ends with Raft.
async fn snapshot_by_bytes(raft: Raft, log: LogStore, every: u64) {
    let mut asked_at = log.bytes_written();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if raft.metrics().borrow().running_state.is_err() {
            return;
        }
        let written = log.bytes_written();
        if written.saturating_sub(asked_at) < every {
            continue;
        }
        asked_at = written;
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// Raft on this node, and what its peers last answered: Raft's messages go
/// through a network that notes each peer's answers (the leader's view of
/// its members' health, `health.rs`).
async fn start_raft(
    cfg: &NodeConfig,
    network: &Network,
    log_store: LogStore,
    sm: StateMachine,
    timings: &Arc<crate::timings::Timings>,
) -> Result<(Raft, Arc<crate::health::PeerAnswers>), ClusterError> {
    let answers = Arc::new(crate::health::PeerAnswers::default());
    let watched = crate::health::Watched {
        inner: network.clone(),
        answers: Arc::clone(&answers),
        timings: Arc::clone(timings),
    };
    let raft = Raft::new(cfg.id, Arc::new(raft_config(cfg)?), watched, log_store, sm)
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    Ok((raft, answers))
}

/// The network this node reaches its peers through, as `incarnation`:
/// TCP from the Raft address's IP, or a simulation's transport.
fn peer_network(cfg: &NodeConfig, hooks: &Hooks, incarnation: u64) -> Network {
    let source = Some(cfg.raft_listen.ip()).filter(|ip| !ip.is_unspecified());
    let auth = network::PeerAuth {
        id: cfg.id,
        incarnation,
        secret: cfg.cluster_secret.clone(),
    };
    match hooks.transport.clone() {
        None => Network::new(auth, source),
        Some(t) => Network::over(auth, t),
    }
}

/// The node's Raft log, opened on a blocking thread (or, simulated, on the
/// caller's task: its I/O is in memory).
async fn open_raft_log(cfg: &NodeConfig, hooks: &Hooks) -> Result<LogStore, ClusterError> {
    let raft_dir = cfg.dir.join("raft");
    let segment = cfg.raft_segment_bytes;
    // The engine's flag: its own log is not synced per batch in a group,
    // so it is the Raft log's alone.
    let direct_io = cfg.engine.wal.direct_io;
    Ok(match hooks.storage.clone() {
        None => tokio::task::spawn_blocking(move || LogStore::open(&raft_dir, segment, direct_io))
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))??
            .of_node(cfg.id),
        Some(storage) => LogStore::open_with(storage, &raft_dir, segment, Io::Inline)?,
    })
}

/// The directory's incarnation, and whether it still has to be recorded:
/// made (durably) when the directory is first initialized, before Raft
/// writes anything. A Raft log with state and no incarnation is checked
/// once the membership is known ([`record_incarnation`]).
fn incarnation_of(
    cfg: &NodeConfig,
    hooks: &Hooks,
    log_store: &LogStore,
) -> Result<(u64, bool), ClusterError> {
    let fresh = || match hooks.fresh_incarnation {
        Some(n) => Ok(n),
        None => crate::incarnation::fresh(),
    };
    Ok(match crate::incarnation::read(&cfg.dir)? {
        Some(n) => (n, false),
        None if !log_store.has_state() => {
            let n = fresh()?;
            crate::incarnation::write(&cfg.dir, n)?;
            tracing::info!(
                event = "cluster_incarnation",
                incarnation = format!("{n:016x}"),
                "a new data directory: a new incarnation"
            );
            (n, false)
        }
        None => (fresh()?, true),
    })
}

/// The replica's engine: every Raft entry, wrapped, fits one of its
/// entries.
async fn open_state_machine(
    cfg: &NodeConfig,
    hooks: &Hooks,
    max_request: u64,
) -> Result<StateMachine, ClusterError> {
    let sm_dir = cfg.dir.clone();
    let engine_opts = cfg.engine.clone();
    let min_entry = u32::try_from(max_request + (64 << 10)).unwrap_or(u32::MAX);
    Ok(match hooks.storage.clone() {
        None => tokio::task::spawn_blocking(move || {
            StateMachine::open(&sm_dir, &engine_opts, min_entry)
        })
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))??,
        Some(storage) => {
            let mut opts = engine_opts;
            opts.wal.inline_io = true;
            opts.wal.preallocation = fencelog_wal::Preallocation::None;
            StateMachine::open_on(Some(storage), &sm_dir, &opts, min_entry)?
        }
    })
}

/// openraft's configuration for this node.
fn raft_config(cfg: &NodeConfig) -> Result<Config, ClusterError> {
    Config {
        cluster_name: "fencelog".into(),
        election_timeout_min: cfg.election_timeout_ms.0,
        election_timeout_max: cfg.election_timeout_ms.1,
        heartbeat_interval: cfg.heartbeat_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every_entries),
        max_in_snapshot_log_to_keep: 1000,
        max_payload_entries: 1024,
        // Elections are started by `election.rs`, after a pre-vote.
        enable_elect: false,
        ..Config::default()
    }
    .validate()
    .map_err(|e| ClusterError::Raft(e.to_string()))
}

/// Raft state but no incarnation file: a directory from before
/// incarnations gets one and goes on; one whose membership admitted an
/// incarnation of its own lost the file (damage, or a copy of another
/// node's directory): refused, it cannot prove it is the replica the group
/// admitted (Raft is shut down first).
async fn record_incarnation(
    raft: &Raft,
    cfg: &NodeConfig,
    incarnation: u64,
) -> Result<(), ClusterError> {
    let id = cfg.id;
    let admitted = raft
        .with_raft_state(move |st| {
            st.membership_state
                .effective()
                .membership()
                .get_node(&id)
                .map_or(0, |m| m.incarnation)
        })
        .await
        .map_err(|e| ClusterError::Raft(e.to_string()))?;
    if admitted != 0 {
        let _ = raft.shutdown().await;
        return Err(ClusterError::Io {
            what: format!("open {}", cfg.dir.display()),
            source: std::io::Error::other(format!(
                "its Raft log holds state but its `{}` file is missing, and the group admitted \
                 this node as incarnation {admitted:016x}: the directory is damaged or not this \
                 node's. Start it empty (a new incarnation) and re-add it: --cluster-join",
                crate::incarnation::FILE
            )),
        });
    }
    crate::incarnation::write(&cfg.dir, incarnation)?;
    tracing::warn!(
        event = "cluster_incarnation",
        incarnation = format!("{incarnation:016x}"),
        "a data directory from before incarnations: it has one now (the group checks it once it re-adds this node)"
    );
    Ok(())
}

/// Binds the Raft port and serves peers on it.
async fn listen_for_peers(
    cfg: &NodeConfig,
    endpoint: &network::PeerEndpoint,
) -> Result<JoinHandle<()>, ClusterError> {
    let listener = TcpListener::bind(cfg.raft_listen)
        .await
        .map_err(|e| ClusterError::Io {
            what: format!("listen for peers on {}", cfg.raft_listen),
            source: e,
        })?;
    Ok(tokio::spawn(network::serve(
        listener,
        endpoint.raft.clone(),
        endpoint.auth.clone(),
        Arc::clone(&endpoint.election),
        endpoint.log.clone(),
    )))
}

/// A write proposed, its answer to come (see [`Node::propose`]): a future
/// of its own type, not a boxed one (one allocation fewer per write).
#[derive(Debug)]
pub struct Proposal(tokio::sync::oneshot::Receiver<Result<Response, ClusterError>>);

impl Future for Proposal {
    type Output = Result<Response, ClusterError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|answer| answer.unwrap_or_else(|_| Err(ClusterError::stopped_undecided())))
    }
}

/// Writes proposed together, their answers to come (see
/// [`Node::propose_many`]): one per write, in order.
#[derive(Debug)]
pub struct Proposals(Vec<Part>);

/// Some of [`Proposals`]' writes: queued together, or refused.
#[derive(Debug)]
enum Part {
    Queued(usize, crate::batcher::ManyAnswer),
    Failed(usize, ClusterError),
}

impl Proposals {
    /// Each write's outcome, in the order proposed, once all have come.
    pub async fn answers(self) -> Vec<Result<Response, ClusterError>> {
        let mut out = Vec::new();
        for part in self.0 {
            let (n, failed) = match part {
                Part::Queued(n, answer) => match answer.await {
                    Ok(Ok(responses)) if responses.len() == n => {
                        out.extend(responses.into_iter().map(Ok));
                        continue;
                    }
                    Ok(Ok(responses)) => (
                        n,
                        ClusterError::Raft(format!(
                            "{n} writes proposed together answered {}",
                            responses.len()
                        )),
                    ),
                    Ok(Err(e)) => (n, e),
                    Err(_) => (n, ClusterError::stopped_undecided()),
                },
                Part::Failed(n, e) => (n, e),
            };
            out.extend((0..n).map(|_| Err(failed.duplicate())));
        }
        out
    }
}

/// What `fencelog cluster status` shows of a node.
#[derive(Debug, Clone)]
pub struct Status {
    /// This node.
    pub id: NodeId,
    /// Leader, follower, candidate, learner.
    pub state: String,
    /// The current term.
    pub term: u64,
    /// The leader, if known.
    pub leader: Option<NodeId>,
    /// The last entry of its log.
    pub last_log_index: u64,
    /// The last entry it knows committed.
    pub committed: u64,
    /// The last entry applied to its state machine.
    pub last_applied: u64,
    /// On the leader: ms since a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// On the leader: every member's last matched entry (lag = last log
    /// index − matched).
    pub matched: BTreeMap<NodeId, u64>,
    /// The members: voters and learners, with their addresses.
    pub members: BTreeMap<NodeId, (Member, bool)>,
    /// The last entry in this node's snapshot.
    pub snapshot_index: Option<u64>,
    /// Snapshots installed since this node started.
    pub snapshots_installed: u64,
    /// Linearizable reads since this node started, and the ReadIndex
    /// rounds they took (reads that arrive while a round runs share the
    /// next).
    pub reads: u64,
    /// See [`Status::reads`].
    pub read_rounds: u64,
    /// The members whose health this node can judge, and how: on the
    /// leader every other member (from when each last answered it), on a
    /// follower its leader (from when it last heard from it). A member
    /// not listed is not known to have failed.
    pub health: BTreeMap<NodeId, Health>,
    /// This node leads but has heard from no quorum for an election
    /// timeout (it is stepping down and answers no client as the leader),
    /// or it stepped down for that and has heard from no leader since.
    pub quorum_lost: bool,
    /// This node knows a membership of the group, and it is not in it:
    /// removed (or still being added, replaying a history from before).
    pub removed: bool,
    /// Writes waiting in this leader's queue for an entry, and their bytes
    /// (see [`Node::queued`]).
    pub queued: Queued,
}

/// A member's health as one node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// Heard from within an election timeout.
    pub online: bool,
    /// How long ago it was last heard from (ms), if ever since this node
    /// started.
    pub heard_ms: Option<u64>,
}

/// The leader's queue of writes waiting for an entry: what it holds and
/// its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Queued {
    /// Writes waiting now.
    pub writes: u64,
    /// Their encoded bytes.
    pub bytes: u64,
    /// The most writes it holds (past it a write is refused: `Busy`).
    pub max_writes: u64,
    /// The most bytes it holds.
    pub max_bytes: u64,
    /// Since the node started: items the queue gave to entries (a write,
    /// or a connection's pipelined writes proposed together), and the
    /// writes they held.
    pub taken_items: u64,
    /// See [`Queued::taken_items`].
    pub taken_writes: u64,
    /// The leader's waits before an entry for the writers it just
    /// answered.
    pub comeback: crate::ComebackWaits,
}

impl Node {
    /// Opens the node's logs and starts Raft and the peer listener, on a
    /// thread and runtime of their own: clients' connections on the
    /// server's runtime can never delay a heartbeat (a leader whose
    /// heartbeats wait behind fifty busy connections loses its followers).
    pub async fn start(cfg: NodeConfig) -> Result<Node, ClusterError> {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let id = cfg.id;
        let thread = std::thread::Builder::new()
            .name(format!("fencelog-raft-{id}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = started_tx.send(Err(ClusterError::Io {
                            what: "start the Raft runtime".into(),
                            source: e,
                        }));
                        return;
                    }
                };
                rt.block_on(async move {
                    let started = start_here(cfg, Hooks::default()).await;
                    let ok = started.is_ok();
                    let _ = started_tx.send(started);
                    if ok {
                        // Until the node shuts down or is dropped.
                        let _ = stop_rx.await;
                    }
                });
            })
            .map_err(|e| ClusterError::Io {
                what: "start the Raft thread".into(),
                source: e,
            })?;
        let node = match started_rx.await {
            Ok(Ok(node)) => node,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ClusterError::Raft(
                    "the Raft thread stopped while starting".into(),
                ));
            }
        };
        *node.runtime.lock() = Some((stop_tx, thread));
        Ok(node)
    }

    /// Opens the node's logs and starts Raft on the runtime this is called
    /// on (no thread of its own), with `hooks` in place of the real disk,
    /// network, randomness and clock where given: the deterministic
    /// simulation runs every node of a group on one current-thread runtime
    /// with paused time. [`Node::start`] is the production path.
    pub async fn start_on_current_runtime(
        cfg: NodeConfig,
        hooks: Hooks,
    ) -> Result<Node, ClusterError> {
        start_here(cfg, hooks).await
    }

    /// What a [`network::Transport`] delivers this node's peer messages to.
    pub fn peer_endpoint(&self) -> network::PeerEndpoint {
        self.endpoint.clone()
    }

    /// Makes a new cluster of `members` (run once, on one node of a fresh
    /// cluster; a node already initialized answers an error). A member
    /// listed with incarnation 0 is admitted with the one it has: it is
    /// asked (see [`Node::admit`]; this waits until every member answers).
    pub async fn initialize(&self, members: BTreeMap<NodeId, Member>) -> Result<(), ClusterError> {
        let members = self.admit(members).await;
        self.raft
            .initialize(members)
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()))
    }

    /// `members` with the incarnation each has now filled in where it is 0
    /// (this node's own; the others' asked over the peer protocol, again
    /// every 200 ms until each answers): what a group forming admits.
    pub fn admit(
        &self,
        mut members: BTreeMap<NodeId, Member>,
    ) -> impl std::future::Future<Output = BTreeMap<NodeId, Member>> + Send + 'static {
        let (me, mine, network) = (self.id, self.incarnation, self.network.clone());
        async move {
            for (id, m) in members.iter_mut().filter(|(_, m)| m.incarnation == 0) {
                if *id == me {
                    m.incarnation = mine;
                    continue;
                }
                for attempt in 0u64.. {
                    match network
                        .probe(*id, &m.raft_addr, Duration::from_secs(2))
                        .await
                    {
                        Ok(n) => {
                            m.incarnation = n;
                            break;
                        }
                        Err(e) => {
                            if attempt % 25 == 0 {
                                tracing::info!(event = "cluster_waiting_for_member", node = *id, addr = %m.raft_addr, error = %e, "forming: waiting for a member to answer (its incarnation)");
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
            members
        }
    }

    /// This node's incarnation (its data directory's).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The incarnation node `id` at `raft_addr` has now (asked over the
    /// peer protocol, authenticated).
    pub async fn probe(&self, id: NodeId, raft_addr: &str) -> Result<u64, ClusterError> {
        self.network
            .probe(id, raft_addr, Duration::from_secs(5))
            .await
            .map_err(|e| ClusterError::Raft(format!("node {id} at {raft_addr}: {e}")))
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The engine in use (reads go there, after [`Node::linearizable`]).
    pub fn log(&self) -> fencelog::Log {
        self.engine.log()
    }

    /// Proposes a write; answers once a majority holds it and it is applied
    /// here (the leader's own decision), or says who leads.
    pub async fn write(&self, cmd: Command) -> Result<Response, ClusterError> {
        self.propose(cmd, Instant::now() + Duration::from_secs(10))
            .await?
            .await
    }

    /// The group's clock (ms) as this node carries it on while it leads
    /// and has taken over its term; `None` otherwise. Lease time: at or
    /// above every time an applied entry carried.
    pub fn group_now_ms(&self) -> Option<u64> {
        let term = {
            let m = self.metrics.borrow();
            (m.state == ServerState::Leader).then_some(m.current_term)?
        };
        self.batcher.now_ms(term)
    }

    /// Hands a write to Raft now, in the order of the calls (a
    /// connection's pipelined writes keep their order), and answers a
    /// future of its outcome: writes proposed together share an entry
    /// and a round of replication (see `batcher.rs`). A write still
    /// waiting for its entry at `deadline` (when its client is answered)
    /// is dropped, never proposed.
    pub async fn propose(&self, cmd: Command, deadline: Instant) -> Result<Proposal, ClusterError> {
        self.propose_now(cmd, deadline)
    }

    /// [`Node::propose`], without a future to take the proposal (it never
    /// waits): queued now.
    pub fn propose_now(&self, cmd: Command, deadline: Instant) -> Result<Proposal, ClusterError> {
        // Refused here: an entry the log cannot hold would stop Raft.
        // With its length in the entry's list of commands.
        let len = 4 + cmd.encoded_len() as u64;
        if len > self.max_request {
            return Err(ClusterError::TooLarge {
                len,
                max: self.max_request,
            });
        }
        // Not proposed at all unless this node leads (and has its quorum):
        // a follower's answer is certain (the write did not happen).
        if let Some(refused) = self.refusal() {
            return Err(refused);
        }
        Ok(Proposal(self.batcher.queue(cmd, len, deadline)?))
    }

    /// [`Node::propose`] for a connection's pipelined writes, in order, as
    /// one item of the leader's queue (one answer for all of them, not a
    /// channel, a queue slot and a timer per write): they go into one
    /// entry, unless together they pass what an entry holds, then into as
    /// few as fit. Each write is answered on its own: one too large for
    /// any entry is refused ([`ClusterError::TooLarge`]) and the others
    /// go. Refused as a whole, and nothing proposed, when this node does
    /// not serve ([`Node::refusal`]).
    pub fn propose_many(
        &self,
        cmds: Vec<Command>,
        deadline: Instant,
    ) -> Result<Proposals, ClusterError> {
        if let Some(refused) = self.refusal() {
            return Err(refused);
        }
        // As the batcher fills an entry: half the largest entry, so that
        // such a group shares its entry with other writes.
        let room = self.max_request / 2;
        // Mostly one part holding them all: made that large at once.
        let mut parts = Vec::with_capacity(1);
        let mut chunk = Vec::with_capacity(cmds.len().min(crate::batcher::MAX_WRITES));
        let mut chunk_bytes = 0;
        let queue = |chunk: Vec<Command>, bytes: u64, parts: &mut Vec<Part>| {
            if chunk.is_empty() {
                return;
            }
            let n = chunk.len();
            parts.push(match self.batcher.queue_many(chunk, bytes, deadline) {
                Ok(answer) => Part::Queued(n, answer),
                Err(e) => Part::Failed(n, e),
            });
        };
        for cmd in cmds {
            // With its length in the entry's list of commands.
            let len = 4 + cmd.encoded_len() as u64;
            if len > self.max_request {
                queue(std::mem::take(&mut chunk), chunk_bytes, &mut parts);
                chunk_bytes = 0;
                let max = self.max_request;
                parts.push(Part::Failed(1, ClusterError::TooLarge { len, max }));
                continue;
            }
            if !chunk.is_empty()
                && (chunk_bytes + len > room || chunk.len() == crate::batcher::MAX_WRITES)
            {
                queue(std::mem::take(&mut chunk), chunk_bytes, &mut parts);
                chunk_bytes = 0;
            }
            chunk.push(cmd);
            chunk_bytes += len;
        }
        queue(chunk, chunk_bytes, &mut parts);
        Ok(Proposals(parts))
    }

    /// Waits until this node, as the leader, has applied every write
    /// committed before now, confirmed by a quorum (Raft's ReadIndex: no
    /// clock is trusted). A read after it misses no committed write.
    /// Concurrent reads share one round (see `reads.rs`).
    pub async fn linearizable(&self) -> Result<(), ClusterError> {
        if let Some(refused) = self.refusal() {
            return Err(refused);
        }
        self.reads
            .join(&self.raft, &self.engine, 1)
            .await
            .map(|_| ())
    }

    /// [`Node::linearizable`], joined now: the round the returned future
    /// waits for starts after this call, whenever the future is first
    /// polled (a pipelined read is answered in its connection's order,
    /// after the answers before it, yet shares the round of its arrival).
    /// It answers the engine to read, shared by the round's reads. A node
    /// that does not serve refuses at once ([`Node::refusal`]). `reads`:
    /// how many reads wait for it (1, or a connection's pipelined reads).
    pub fn read_round(
        &self,
        reads: usize,
    ) -> Result<
        impl Future<Output = Result<fencelog::Log, ClusterError>> + Send + 'static + use<>,
        ClusterError,
    > {
        match self.refusal() {
            Some(refused) => Err(refused),
            None => Ok(self.reads.join(&self.raft, &self.engine, reads)),
        }
    }

    /// Why this node does not serve a client as the leader now, or `None`
    /// if it does: [`ClusterError::NotLeader`] with the leader to send the
    /// client to (another member, as this node knows it) or none (an
    /// election is in progress); [`ClusterError::Removed`] when this node
    /// is no longer a member and knows no leader (a removed leader); or
    /// [`ClusterError::NoQuorum`] when it leads but has heard from no
    /// quorum for an election timeout (CheckQuorum is stepping it down),
    /// or stepped down for that and has heard from no leader since.
    /// Data commands ask this first (`propose`, `linearizable`).
    pub fn refusal(&self) -> Option<ClusterError> {
        let m = self.metrics.borrow();
        let membership = m.membership_config.membership();
        let member = membership.get_node(&self.id).is_some();
        let removed = !member && crate::election::any_voter(membership);
        if m.state == ServerState::Leader {
            if removed {
                // Its own removal is in its log: it leads only until that
                // commits, then steps down.
                return Some(ClusterError::Removed);
            }
            if crate::election::quorum_silent(&m, self.election.silence()) {
                return Some(ClusterError::NoQuorum {
                    ms: m.millis_since_quorum_ack.unwrap_or(0),
                });
            }
            return None;
        }
        let leader = m
            .current_leader
            .filter(|id| *id != self.id)
            .and_then(|id| Some((id, membership.get_node(&id)?.clone())));
        if leader.is_none() && removed {
            return Some(ClusterError::Removed);
        }
        if leader.is_none() && self.election.stepped_down() {
            // Cut off: TRYAGAIN would keep its clients here for as long as
            // the cut lasts.
            return Some(ClusterError::NoQuorum {
                ms: self.election.silent_for().as_millis() as u64,
            });
        }
        Some(ClusterError::NotLeader { leader })
    }

    /// Whether this node knows a membership of the group and is not in it:
    /// it was removed (or is still being added and replays a history from
    /// before it was). It does not campaign, and answers clients `MOVED`
    /// to the leader it knows, or [`ClusterError::Removed`].
    pub fn removed(&self) -> bool {
        let m = self.metrics.borrow();
        let membership = m.membership_config.membership();
        membership.get_node(&self.id).is_none() && crate::election::any_voter(membership)
    }

    /// The leader's queue of writes waiting for an entry: writes and bytes
    /// now, and its bounds. Each write's bytes also count, while its client
    /// waits for the answer, in that client's share of the server's client
    /// memory budget.
    pub fn queued(&self) -> Queued {
        self.batcher.queued()
    }

    /// Where a replicated write's time went on this node since it
    /// started: entry rounds and replications (as a leader), Raft log
    /// syncs and applies (see [`crate::Steps`]).
    pub fn timings(&self) -> crate::Steps {
        self.timings.read()
    }

    /// The leader as this node knows it.
    pub fn leader(&self) -> Option<(NodeId, Member)> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        let member = m.membership_config.membership().get_node(&id).cloned()?;
        Some((id, member))
    }

    /// What this node knows of the cluster.
    pub fn status(&self) -> Status {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members: BTreeMap<NodeId, (Member, bool)> = membership
            .nodes()
            .map(|(id, n)| (*id, (n.clone(), voters.contains(id))))
            .collect();
        let silence = self.election.silence();
        let (reads, read_rounds) = self.reads.counts();
        let judge = |since: Option<Duration>| Health {
            online: since.is_some_and(|d| d <= silence),
            heard_ms: since.map(|d| d.as_millis() as u64),
        };
        let mut health = BTreeMap::new();
        if m.state == ServerState::Leader {
            for id in members.keys().filter(|id| **id != self.id) {
                health.insert(*id, judge(self.answers.since(*id)));
            }
        } else if let Some(leader) = m.current_leader.filter(|l| *l != self.id) {
            health.insert(leader, judge(Some(self.election.silent_for())));
        }
        let removed = !members.contains_key(&self.id) && !voters.is_empty();
        Status {
            health,
            quorum_lost: crate::election::quorum_silent(&m, silence)
                || (m.current_leader.is_none() && self.election.stepped_down()),
            removed,
            queued: self.batcher.queued(),
            id: self.id,
            state: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            }
            .into(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index.unwrap_or(0),
            committed: self.log_store.committed().unwrap_or(0),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            matched: m
                .replication
                .map(|r| {
                    r.into_iter()
                        .map(|(id, l)| (id, l.map_or(0, |l| l.index)))
                        .collect()
                })
                .unwrap_or_default(),
            members,
            snapshot_index: m.snapshot.map(|l| l.index),
            snapshots_installed: self.engine.snapshots_installed(),
            reads,
            read_rounds,
        }
    }

    /// Adds a node as a learner (it catches up, by snapshot if it is far
    /// behind), waiting until it has.
    ///
    /// A member given with incarnation 0 is asked its incarnation first
    /// (the group admits the one it has).
    pub async fn add_learner(&self, id: NodeId, mut member: Member) -> Result<(), ClusterError> {
        if member.incarnation == 0 {
            member.incarnation = self.probe(id, &member.raft_addr).await?;
        }
        self.raft
            .add_learner(id, member, true)
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::Raft(e.to_string()))
    }

    /// Applies one incremental membership change (joint consensus
    /// underneath); nodes no longer voters are removed, not kept as
    /// learners. Incremental changes (add these voters, remove those) do
    /// not undo a concurrent change, as replacing the whole set would.
    pub async fn change_members(
        &self,
        change: ChangeMembers<NodeId, Member>,
    ) -> Result<(), ClusterError> {
        self.raft
            .change_membership(change, false)
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::Raft(e.to_string()))
    }

    /// Makes `voters` the voting members (joint consensus underneath).
    pub async fn change_membership(&self, voters: BTreeSet<NodeId>) -> Result<(), ClusterError> {
        self.raft
            .change_membership(voters, false)
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::Raft(e.to_string()))
    }

    /// The Raft handle (for what this API does not cover).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Stops Raft and the peer listener.
    pub async fn shutdown(&self) -> Result<(), ClusterError> {
        let listener = self.listener.lock().take();
        if let Some(listener) = listener {
            listener.abort();
            let _ = listener.await;
        }
        let stopped = self
            .raft
            .shutdown()
            .await
            .map_err(|e| ClusterError::Raft(e.to_string()));
        let runtime = self.runtime.lock().take();
        if let Some((stop, thread)) = runtime {
            let _ = stop.send(());
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        stopped
    }
}

/// Waits until `node` sees a leader, up to `timeout`.
pub async fn wait_for_leader(node: &Node, timeout: Duration) -> Option<NodeId> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some((id, _)) = node.leader() {
            return Some(id);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
