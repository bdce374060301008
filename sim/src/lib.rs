//! Deterministic simulation of a fencelog Raft group (issue 20).
//!
//! Three or five real cluster [`Node`]s (openraft, the replica engine, the
//! Raft log store) run in one process, on one current-thread tokio runtime
//! whose time is paused and advances by itself whenever every task waits.
//! Everything a node touches outside its own code is simulated and seeded:
//!
//! - the network ([`net::SimNet`], through `fencelog_cluster::Transport`):
//!   drops, delays (so reordering), partitions, one-way cuts;
//! - the disks: each node's Raft log and engine live on a
//!   [`SimStorage`] with inline I/O (no background threads), cut with any
//!   [`CrashMode`] (process crash, power cut, torn writes, …);
//! - clocks: each node's monotonic clock as its group clock reads it
//!   runs at its own rate (never faster than real time) and may stand
//!   still (a pause);
//! - processes: crashes and restarts, whole-group power cuts, a disk
//!   replaced (a new incarnation, re-added later), membership changes;
//! - clients: appends, fences, lease acquisitions and renewals, and
//!   linearizable reads, recorded into a history that
//!   `fencelog_tests::history` checks at the end, after the faults heal
//!   and the replicas' digests are compared.
//!
//! One seed gives one run; [`Report::trace_hash`] summarizes everything
//! that happened (messages, faults, answers) so a replay can be compared.

pub mod net;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use fencelog::{Command, Token, TxOp};
use fencelog_cluster::{
    ChangeMembers, ClusterError, Hooks, LocalClock, Member, Node, NodeConfig, NodeId, Response,
};
use fencelog_tests::history::{self, Event, Op, Outcome, Record, Violation};
use fencelog_wal::{CrashMode, SimStorage};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::net::SimNet;

/// SplitMix64: small, seedable, the same on every machine.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 if `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The run's event trace: each line is folded into a hash (FNV-1a), and
/// kept if asked for (to diff two replays).
#[derive(Clone)]
pub struct Trace(Arc<Mutex<TraceInner>>);

struct TraceInner {
    /// The run's temporary directory, written `<dir>` in the trace (its
    /// name is random: error messages that name a file would differ).
    root: String,
    hash: u64,
    lines: Option<Vec<String>>,
    count: u64,
    start: Instant,
}

impl Trace {
    fn new(keep: bool, root: &std::path::Path) -> Trace {
        Trace(Arc::new(Mutex::new(TraceInner {
            root: root.display().to_string(),
            hash: 0xcbf2_9ce4_8422_2325,
            lines: keep.then(Vec::new),
            count: 0,
            start: Instant::now(),
        })))
    }

    /// Adds one event, stamped with the simulated time.
    pub(crate) fn note(&self, what: std::fmt::Arguments<'_>) {
        let mut t = self.0.lock();
        let mut line = String::new();
        let _ = write!(line, "{} {what}", t.start.elapsed().as_micros());
        if !t.root.is_empty() && line.contains(&t.root) {
            line = line.replace(&t.root, "<dir>");
        }
        for b in line.bytes().chain([b'\n']) {
            t.hash ^= u64::from(b);
            t.hash = t.hash.wrapping_mul(0x0100_0000_01b3);
        }
        t.count += 1;
        if let Some(lines) = &mut t.lines {
            lines.push(line);
        }
    }

    fn ns(&self) -> u64 {
        self.0.lock().start.elapsed().as_nanos() as u64
    }
}

/// What one run does.
#[derive(Debug, Clone)]
pub struct Config {
    /// The seed: everything random in the run is drawn from it.
    pub seed: u64,
    /// Replicas: 3 or 5.
    pub nodes: u64,
    /// Faults injected, one after another, while the clients run.
    pub faults: u32,
    /// Clients, each running one operation at a time.
    pub clients: u32,
    /// Keep the trace's lines (for a diff of two replays).
    pub keep_trace: bool,
    /// The scenario: random faults, or a named one.
    pub scenario: Scenario,
}

/// A run's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Random faults from the seed.
    Random,
    /// A follower's disk is replaced (a new incarnation), the leader is
    /// killed before the group re-added it, with the other follower
    /// lagging (cut off while writes went on).
    WipeThenKillLeader,
    /// `n` whole-group power cuts: every node's disk cut at once with the
    /// seed's crash modes, then every node restarted.
    GroupPowerCuts(u32),
}

impl Config {
    /// A random run of `seed`: 3 or 5 nodes by the seed.
    pub fn random(seed: u64) -> Config {
        let nodes = if Rng::new(seed).below(3) == 0 { 5 } else { 3 };
        Config {
            seed,
            nodes,
            faults: 12,
            clients: 4,
            keep_trace: false,
            scenario: Scenario::Random,
        }
    }
}

/// What one run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Replicas.
    pub nodes: u64,
    /// The hash of every traced event.
    pub trace_hash: u64,
    /// Events traced.
    pub trace_events: u64,
    /// The trace's lines if kept.
    pub trace: Vec<String>,
    /// Client operations run.
    pub ops: u64,
    /// Appends acknowledged.
    pub appends_acked: u64,
    /// Leases granted.
    pub grants: u64,
    /// Faults injected (each named in the trace).
    pub faults: Vec<String>,
    /// Every way the run went wrong.
    pub violations: Vec<String>,
    /// Simulated time the run took.
    pub simulated: Duration,
}

/// The lease ttl every client asks for.
const TTL_MS: u64 = 1_000;
/// How long a client waits for an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// Streams and leases the clients share.
const STREAMS: [&str; 3] = ["s0", "s1", "s2"];
const LEASES: [&str; 2] = ["l0", "l1"];

/// A simulated machine: its disk, its directory of real files (the
/// incarnation file and the state machine's generation pointer), its
/// clock, and the node running on it, if any.
struct Machine {
    id: NodeId,
    disk: SimStorage,
    dir: PathBuf,
    clock: Arc<SimClock>,
    node: Option<Arc<Node>>,
    /// Starts so far (each draws the election seed from it).
    starts: u64,
}

/// A node's monotonic clock: runs at `rate` per mille of real time
/// (simulated), 0 while paused.
struct SimClock {
    state: Mutex<(Instant, Duration, u64)>,
}

impl SimClock {
    fn new() -> SimClock {
        SimClock {
            state: Mutex::new((Instant::now(), Duration::ZERO, 1000)),
        }
    }

    fn read(&self) -> Duration {
        let (at, base, rate) = *self.state.lock();
        base + at.elapsed() * rate as u32 / 1000
    }

    fn set_rate(&self, rate: u64) {
        let now = self.read();
        *self.state.lock() = (Instant::now(), now, rate.min(1000));
    }
}

/// One simulated group and its clients.
struct World {
    cfg: Config,
    rng: Rng,
    net: SimNet,
    trace: Trace,
    machines: BTreeMap<NodeId, Machine>,
    /// Nodes up, for the clients.
    live: Arc<Mutex<BTreeMap<NodeId, Arc<Node>>>>,
    /// Nodes whose disk was replaced and that the group has not re-added.
    to_readd: BTreeSet<NodeId>,
    history: Arc<Mutex<Vec<Event>>>,
    violations: Vec<String>,
    faults: Vec<String>,
    _root: tempfile::TempDir,
}

fn member(id: NodeId, incarnation: u64) -> Member {
    Member {
        raft_addr: format!("sim-{id}:7000"),
        client_addr: format!("sim-{id}:7379"),
        incarnation,
    }
}

impl World {
    fn new(cfg: Config) -> World {
        let root = tempfile::tempdir().expect("a temporary directory");
        let trace = Trace::new(cfg.keep_trace, root.path());
        let machines = (1..=cfg.nodes)
            .map(|id| {
                let dir = root.path().join(format!("n{id}"));
                std::fs::create_dir_all(&dir).expect("a node directory");
                let m = Machine {
                    id,
                    disk: SimStorage::new(),
                    dir,
                    clock: Arc::new(SimClock::new()),
                    node: None,
                    starts: 0,
                };
                (id, m)
            })
            .collect();
        World {
            rng: Rng::new(cfg.seed),
            net: SimNet::new(cfg.seed, trace.clone()),
            trace,
            machines,
            live: Arc::default(),
            to_readd: BTreeSet::new(),
            history: Arc::default(),
            violations: Vec::new(),
            faults: Vec::new(),
            _root: root,
            cfg,
        }
    }

    fn fault(&mut self, what: String) {
        self.trace.note(format_args!("fault {what}"));
        self.faults.push(what);
    }

    /// Starts the node of machine `id` on its disk as it is.
    async fn start(&mut self, id: NodeId, why: &str) {
        let seed = self.cfg.seed;
        let fresh = self.rng.next_u64() | 1;
        let m = self.machines.get_mut(&id).expect("a machine");
        m.starts += 1;
        let mut cfg = NodeConfig::new(
            id,
            m.dir.clone(),
            "127.0.0.1:0".parse().expect("an address"),
            member(id, 0),
        );
        cfg.raft_segment_bytes = 1 << 20;
        cfg.snapshot_every_entries = u64::MAX / 2;
        cfg.engine.wal.segment_bytes = 4 << 20;
        cfg.engine.wal.max_entry_bytes = 1 << 20;
        cfg.engine.max_payload_bytes = 64 << 10;
        let clock = Arc::clone(&m.clock);
        let local: LocalClock = Arc::new(move || clock.read());
        let hooks = Hooks {
            storage: Some(Arc::new(m.disk.clone())),
            transport: Some(Arc::new(self.net.clone())),
            election_seed: Some(seed ^ (id << 32) ^ m.starts),
            fresh_incarnation: Some(fresh),
            local_clock: Some(local),
        };
        match Node::start_on_current_runtime(cfg, hooks).await {
            Ok(node) => {
                let node = Arc::new(node);
                self.trace.note(format_args!(
                    "start {id} ({why}) incarnation {:x}",
                    node.incarnation()
                ));
                self.net
                    .links
                    .lock()
                    .endpoints
                    .insert(id, node.peer_endpoint());
                self.live.lock().insert(id, Arc::clone(&node));
                m.node = Some(node);
            }
            Err(e) => {
                self.trace.note(format_args!("start {id} failed"));
                self.violations
                    .push(format!("node {id} did not start ({why}): {e}"));
            }
        }
    }

    /// Stops node `id` as its disk is cut with `mode` (a process crash
    /// keeps what was written; a power cut what was synced, per the mode).
    async fn crash(&mut self, id: NodeId, mode: CrashMode) {
        let m = self.machines.get_mut(&id).expect("a machine");
        let Some(node) = m.node.take() else {
            return;
        };
        // The disk first: nothing the dying node does reaches it any more.
        m.disk = m.disk.cut_power(mode);
        self.net.links.lock().endpoints.remove(&id);
        self.live.lock().remove(&id);
        let _ = node.shutdown().await;
        self.trace.note(format_args!("crash {id} {mode:?}"));
    }

    /// Replaces node `id`'s disk: it comes back empty, a new incarnation.
    async fn wipe(&mut self, id: NodeId) {
        self.crash(id, CrashMode::LoseUnsynced).await;
        let m = self.machines.get_mut(&id).expect("a machine");
        m.disk = SimStorage::new();
        let _ = std::fs::remove_dir_all(&m.dir);
        std::fs::create_dir_all(&m.dir).expect("a node directory");
        self.to_readd.insert(id);
        self.start(id, "new disk").await;
    }

    fn crash_mode(&mut self) -> CrashMode {
        let seed = self.rng.next_u64();
        match self.rng.below(6) {
            0 => CrashMode::ProcessCrash,
            1 => CrashMode::LoseUnsynced,
            2 => CrashMode::Torn { seed },
            3 => CrashMode::LastWriteOnly,
            4 => CrashMode::TornSequence { seed },
            _ => CrashMode::Prefix {
                bytes: self.rng.below(8192),
            },
        }
    }

    fn leader(&self) -> Option<Arc<Node>> {
        let live = self.live.lock();
        live.values()
            .find(|n| n.status().state == "leader")
            .cloned()
    }

    /// Whether the group can lose one replica's disk: a leader whose
    /// membership is one configuration (no change under way) with every
    /// node a voter, and no replaced disk waiting to be re-added. (Losing
    /// a disk beyond that is losing a majority, which no group survives.)
    fn settled(&self) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let m = leader.raft().metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        self.to_readd.is_empty()
            && membership.get_joint_config().len() == 1
            && voters.len() == self.machines.len()
    }

    async fn wait_leader(&self, within: Duration) -> Option<Arc<Node>> {
        let until = Instant::now() + within;
        loop {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Forms the group: every node started, node 1 initializes it.
    async fn form(&mut self) -> bool {
        let ids: Vec<NodeId> = self.machines.keys().copied().collect();
        for id in &ids {
            self.start(*id, "first").await;
        }
        let members = ids.iter().map(|&id| (id, member(id, 0))).collect();
        let Some(first) = self.machines[&1].node.clone() else {
            return false;
        };
        if let Err(e) = first.initialize(members).await {
            self.violations.push(format!("initialize: {e}"));
            return false;
        }
        self.wait_leader(Duration::from_secs(10)).await.is_some()
    }

    /// Re-adds every node whose disk was replaced, through the leader (as
    /// `CLUSTER ADDNODE` does): the old incarnation out of the voters,
    /// the new one a learner, then a voter. False if the group could not.
    async fn readd(&mut self) -> bool {
        let pending: Vec<NodeId> = self.to_readd.iter().copied().collect();
        for id in pending {
            if self.machines[&id].node.is_none() {
                continue;
            }
            let Some(leader) = self.leader() else {
                return false;
            };
            if leader.id() == id {
                continue;
            }
            let ok = tokio::time::timeout(Duration::from_secs(10), async {
                let status = leader.status();
                let inc = leader.probe(id, &member(id, 0).raft_addr).await?;
                match status.members.get(&id) {
                    Some((m, true)) if m.incarnation == inc => return Ok(()),
                    Some((m, _)) if m.incarnation == inc => {}
                    Some((_, voter)) => {
                        let ids = BTreeSet::from([id]);
                        let change = if *voter {
                            ChangeMembers::RemoveVoters(ids)
                        } else {
                            ChangeMembers::RemoveNodes(ids)
                        };
                        leader.change_members(change).await?;
                    }
                    None => {}
                }
                leader.add_learner(id, member(id, inc)).await?;
                leader
                    .change_members(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                    .await
            })
            .await;
            let done = matches!(ok, Ok(Ok(())));
            self.trace.note(format_args!("readd {id} {done}"));
            if done {
                self.to_readd.remove(&id);
            } else {
                return false;
            }
        }
        true
    }

    /// One random fault.
    async fn random_fault(&mut self) {
        let ids: Vec<NodeId> = self.machines.keys().copied().collect();
        let n = ids.len() as u64;
        let pick = self.rng.below(100);
        match pick {
            // A partition: a minority cut off both ways.
            0..=11 => {
                let k = 1 + self.rng.below(n / 2);
                let mut side = BTreeSet::new();
                while (side.len() as u64) < k {
                    side.insert(self.rng.pick(&ids));
                }
                let mut links = self.net.links.lock();
                for &a in &side {
                    for &b in ids.iter().filter(|b| !side.contains(b)) {
                        links.cut.insert((a, b));
                        links.cut.insert((b, a));
                    }
                }
                drop(links);
                self.fault(format!("partition {side:?}"));
            }
            // A one-way cut.
            12..=19 => {
                let a = self.rng.pick(&ids);
                let b = self.rng.pick(&ids);
                if a != b {
                    self.net.links.lock().cut.insert((a, b));
                    self.fault(format!("cut {a}>{b}"));
                }
            }
            20..=31 => {
                self.net.links.lock().cut.clear();
                self.fault("heal links".into());
            }
            // Lossy, slow links.
            32..=41 => {
                let drop = self.rng.below(300);
                let lo = self.rng.below(20);
                let hi = lo + self.rng.below(200);
                let mut links = self.net.links.lock();
                links.drop_per_mille = drop;
                links.delay_ms = (lo, hi);
                drop_guard(links);
                self.fault(format!("links drop {drop}/1000 delay {lo}..{hi} ms"));
            }
            // A node crashes (any crash mode) and comes back.
            42..=61 => {
                let id = self.rng.pick(&ids);
                let mode = self.crash_mode();
                let down = Duration::from_millis(self.rng.below(2_000));
                self.fault(format!("crash {id} {mode:?} for {down:?}"));
                self.crash(id, mode).await;
                tokio::time::sleep(down).await;
                self.start(id, "restart").await;
            }
            // The leader crashes.
            62..=71 => {
                if let Some(l) = self.leader() {
                    let id = l.id();
                    drop(l);
                    let mode = self.crash_mode();
                    let down = Duration::from_millis(self.rng.below(2_000));
                    self.fault(format!("crash leader {id} {mode:?} for {down:?}"));
                    self.crash(id, mode).await;
                    tokio::time::sleep(down).await;
                    self.start(id, "restart").await;
                }
            }
            // A clock runs slow, or stands still for a while (a pause).
            72..=79 => {
                let id = self.rng.pick(&ids);
                let m = &self.machines[&id];
                if self.rng.chance(500) {
                    let rate = 900 + self.rng.below(101);
                    m.clock.set_rate(rate);
                    self.fault(format!("clock {id} rate {rate}/1000"));
                } else {
                    let pause = Duration::from_millis(self.rng.below(1_500));
                    let clock = Arc::clone(&m.clock);
                    clock.set_rate(0);
                    self.fault(format!("clock {id} paused for {pause:?}"));
                    tokio::spawn(async move {
                        tokio::time::sleep(pause).await;
                        clock.set_rate(1000);
                    });
                }
            }
            // A disk replaced: a new incarnation, re-added a little later.
            80..=87 => {
                let id = self.rng.pick(&ids);
                if self.settled() {
                    self.fault(format!("disk of {id} replaced"));
                    self.wipe(id).await;
                    tokio::time::sleep(Duration::from_millis(self.rng.below(2_000))).await;
                    self.readd().await;
                }
            }
            // A membership change: a voter removed, then added back.
            88..=93 => {
                let id = self.rng.pick(&ids);
                if let Some(l) = self.leader()
                    && l.id() != id
                    && self.settled()
                {
                    self.fault(format!("member {id} removed and added back"));
                    let out = tokio::time::timeout(
                        Duration::from_secs(10),
                        l.change_members(ChangeMembers::RemoveVoters(BTreeSet::from([id]))),
                    )
                    .await;
                    self.trace.note(format_args!("remove {id} {}", ok(&out)));
                    tokio::time::sleep(Duration::from_millis(self.rng.below(1_000))).await;
                    if let Some(l) = self.leader() {
                        // Removed from the members altogether: back as a
                        // learner (it catches up), then a voter.
                        let back = tokio::time::timeout(Duration::from_secs(10), async {
                            let inc = l.probe(id, &member(id, 0).raft_addr).await?;
                            if !l.status().members.contains_key(&id) {
                                l.add_learner(id, member(id, inc)).await?;
                            }
                            l.change_members(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                                .await
                        })
                        .await;
                        self.trace.note(format_args!("add back {id} {}", ok(&back)));
                    }
                }
            }
            // Everything at once: a whole-group power cut.
            _ => self.group_power_cut().await,
        }
    }

    async fn group_power_cut(&mut self) {
        let ids: Vec<NodeId> = self.machines.keys().copied().collect();
        let modes: Vec<CrashMode> = ids.iter().map(|_| self.crash_mode()).collect();
        self.fault(format!("group power cut {modes:?}"));
        // Every disk is cut at the same instant, before any node stops.
        for (id, mode) in ids.iter().zip(&modes) {
            let m = self.machines.get_mut(id).expect("a machine");
            if m.node.is_some() {
                m.disk = m.disk.cut_power(*mode);
            }
        }
        for id in &ids {
            let m = self.machines.get_mut(id).expect("a machine");
            if let Some(node) = m.node.take() {
                self.net.links.lock().endpoints.remove(id);
                self.live.lock().remove(id);
                let _ = node.shutdown().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(self.rng.below(500))).await;
        for id in ids {
            self.start(id, "after group power cut").await;
        }
    }

    /// Heals every fault, restarts every node, re-adds replaced disks and
    /// waits until every replica has applied the same entries.
    async fn heal(&mut self) -> Result<(), String> {
        self.net.links.lock().heal();
        for m in self.machines.values() {
            m.clock.set_rate(1000);
        }
        let down: Vec<NodeId> = self
            .machines
            .values()
            .filter(|m| m.node.is_none())
            .map(|m| m.id)
            .collect();
        for id in down {
            self.start(id, "heal").await;
        }
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if Instant::now() >= until {
                let statuses: Vec<String> = self
                    .live
                    .lock()
                    .values()
                    .map(|n| {
                        let s = n.status();
                        format!(
                            "{}: {} term {} applied {} log {} voters {:?}",
                            s.id,
                            s.state,
                            s.term,
                            s.last_applied,
                            s.last_log_index,
                            s.members
                                .iter()
                                .filter(|(_, (_, v))| *v)
                                .map(|(id, _)| *id)
                                .collect::<Vec<_>>()
                        )
                    })
                    .collect();
                return Err(format!("the group did not converge in 60 s: {statuses:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if !self.readd().await {
                continue;
            }
            let Some(leader) = self.leader() else {
                continue;
            };
            let status = leader.status();
            let voters: BTreeSet<NodeId> = status
                .members
                .iter()
                .filter(|(_, (_, v))| *v)
                .map(|(id, _)| *id)
                .collect();
            let all: BTreeSet<NodeId> = self.machines.keys().copied().collect();
            if voters != all {
                // A member removed and not added back (its change failed).
                let missing: Vec<NodeId> = all.difference(&voters).copied().collect();
                for id in missing {
                    let _ = tokio::time::timeout(Duration::from_secs(5), async {
                        let inc = leader.probe(id, &member(id, 0).raft_addr).await?;
                        if !status.members.contains_key(&id) {
                            leader.add_learner(id, member(id, inc)).await?;
                        }
                        leader
                            .change_members(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                            .await
                    })
                    .await;
                }
                continue;
            }
            if leader.linearizable().await.is_err() {
                continue;
            }
            let target = leader.log().applied();
            let live = self.live.lock().clone();
            if live.len() as u64 == self.cfg.nodes
                && live.values().all(|n| n.log().applied() == target)
            {
                return Ok(());
            }
        }
    }

    /// Compares the replicas' digests (all at the same position).
    fn compare_digests(&mut self) {
        let live = self.live.lock().clone();
        let digests: BTreeMap<NodeId, (Option<u64>, u64)> = live
            .iter()
            .map(|(id, n)| {
                let (at, d) = n.log().digest();
                (*id, (at.map(|p| p.index), d))
            })
            .collect();
        self.trace.note(format_args!("digests {digests:?}"));
        let distinct: BTreeSet<&(Option<u64>, u64)> = digests.values().collect();
        if distinct.len() > 1 {
            self.violations
                .push(format!("replicas differ after healing: {digests:?}"));
        }
    }

    /// Reads every stream in full from the leader (again, for up to 20 s,
    /// if leadership moves meanwhile).
    async fn final_streams(&mut self) -> Option<BTreeMap<String, Vec<Record>>> {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            let read = async {
                let leader = self.wait_leader(Duration::from_secs(10)).await?;
                leader.linearizable().await.ok()?;
                let mut out = BTreeMap::new();
                for s in STREAMS {
                    out.insert(s.to_string(), read_all(&leader, s, 0).ok()?);
                }
                Some(out)
            };
            if let Some(out) = read.await {
                return Some(out);
            }
            self.trace.note(format_args!("final read failed: again"));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        None
    }

    async fn stop_all(&mut self) {
        let ids: Vec<NodeId> = self.machines.keys().copied().collect();
        for id in ids {
            let m = self.machines.get_mut(&id).expect("a machine");
            if let Some(node) = m.node.take() {
                self.net.links.lock().endpoints.remove(&id);
                self.live.lock().remove(&id);
                let _ = node.shutdown().await;
            }
        }
    }
}

fn drop_guard<T>(_: T) {}

fn ok<T, E>(r: &Result<Result<T, E>, tokio::time::error::Elapsed>) -> &'static str {
    match r {
        Ok(Ok(_)) => "ok",
        Ok(Err(_)) => "refused",
        Err(_) => "timeout",
    }
}

fn read_all(node: &Node, stream: &str, from: u64) -> Result<Vec<Record>, fencelog::Error> {
    let mut out = Vec::new();
    let mut at = from;
    loop {
        let page = node.log().read(stream, at, 10_000)?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        at = last.offset + 1;
        out.extend(page.into_iter().map(|r| Record {
            offset: r.offset,
            token: r.token.get(),
            payload: r.payload.to_vec(),
        }));
    }
}

/// A client: runs one operation at a time on the node it thinks leads.
struct Client {
    id: u32,
    rng: Rng,
    live: Arc<Mutex<BTreeMap<NodeId, Arc<Node>>>>,
    history: Arc<Mutex<Vec<Event>>>,
    trace: Trace,
    tokens: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    hint: Option<NodeId>,
    sent: u64,
    /// Leases this client holds (name → token).
    held: BTreeMap<&'static str, u64>,
}

/// A client's token as the engine takes it: one out of range is refused
/// before it is proposed (as the server does).
fn token_of(n: u64) -> Result<Token, Outcome> {
    Token::new(n).map_err(|e| Outcome::Refused(e.to_string()))
}

fn refusal(e: &ClusterError) -> Option<String> {
    match e {
        ClusterError::NotLeader { .. } => Some("MOVED".into()),
        ClusterError::Busy { .. } => Some("BUSY".into()),
        ClusterError::Dropped => Some("DROPPED".into()),
        ClusterError::TooLarge { .. } => Some("TOOBIG".into()),
        _ => None,
    }
}

impl Client {
    fn node(&mut self) -> Option<Arc<Node>> {
        let live = self.live.lock();
        if let Some(n) = self.hint.and_then(|h| live.get(&h)) {
            return Some(Arc::clone(n));
        }
        let ids: Vec<NodeId> = live.keys().copied().collect();
        if ids.is_empty() {
            return None;
        }
        let id = self.rng.pick(&ids);
        live.get(&id).cloned()
    }

    async fn write(&mut self, node: &Node, cmd: Command) -> Result<Response, Outcome> {
        // A deadline in the OS's time far away: the simulation's own
        // timeout (simulated time) is the client's.
        let deadline = std::time::Instant::now() + Duration::from_secs(3_600);
        let proposal = match node.propose(cmd, deadline).await {
            Ok(p) => p,
            Err(e) => return Err(self.failed(&e)),
        };
        match proposal.await {
            Ok(Response::Rejected(e)) => Err(Outcome::Refused(format!("{e:?}"))),
            Ok(r) => Ok(r),
            Err(e) => Err(self.failed(&e)),
        }
    }

    fn failed(&mut self, e: &ClusterError) -> Outcome {
        if let ClusterError::NotLeader { leader } = e {
            self.hint = leader.as_ref().map(|(id, _)| *id);
        }
        match refusal(e) {
            Some(r) => Outcome::Refused(r),
            None => Outcome::Unknown(e.to_string()),
        }
    }

    async fn one(&mut self, node: &Node, op: &Op) -> Outcome {
        match op {
            Op::Append {
                stream,
                token,
                payload,
            } => {
                let cmd = match token_of(*token) {
                    Ok(token) => Command::Write(TxOp::Append {
                        stream: Bytes::copy_from_slice(stream.as_bytes()),
                        token,
                        payloads: [Bytes::copy_from_slice(payload)].into(),
                    }),
                    Err(o) => return o,
                };
                match self.write(node, cmd).await {
                    Ok(Response::Value(o)) => Outcome::Appended(o),
                    Ok(r) => Outcome::Unknown(format!("unexpected {r:?}")),
                    Err(o) => o,
                }
            }
            Op::Fence { stream, token } => {
                let cmd = match token_of(*token) {
                    Ok(token) => Command::Write(TxOp::Fence {
                        stream: Bytes::copy_from_slice(stream.as_bytes()),
                        token,
                    }),
                    Err(o) => return o,
                };
                match self.write(node, cmd).await {
                    Ok(Response::Value(t)) => Outcome::Fenced(t),
                    Ok(r) => Outcome::Unknown(format!("unexpected {r:?}")),
                    Err(o) => o,
                }
            }
            Op::Acquire { name, owner } => {
                let cmd = Command::Acquire {
                    name: Bytes::copy_from_slice(name.as_bytes()),
                    owner: Bytes::copy_from_slice(owner.as_bytes()),
                    ttl_ms: TTL_MS,
                    fence: false,
                };
                match self.write(node, cmd).await {
                    Ok(Response::Grant { token, .. }) => Outcome::Granted(token),
                    Ok(r) => Outcome::Unknown(format!("unexpected {r:?}")),
                    Err(o) => o,
                }
            }
            Op::Renew { name, owner, token } => {
                let cmd = match token_of(*token) {
                    Ok(token) => Command::Renew {
                        name: Bytes::copy_from_slice(name.as_bytes()),
                        owner: Bytes::copy_from_slice(owner.as_bytes()),
                        token,
                        ttl_ms: TTL_MS,
                    },
                    Err(o) => return o,
                };
                match self.write(node, cmd).await {
                    Ok(_) => Outcome::Renewed,
                    Err(o) => o,
                }
            }
            Op::Read { stream, from } => {
                if let Err(e) = node.linearizable().await {
                    return self.failed(&e);
                }
                match read_all(node, stream, *from) {
                    Ok(r) => Outcome::Records(r),
                    Err(e) => Outcome::Refused(e.to_string()),
                }
            }
        }
    }

    fn next_op(&mut self) -> Op {
        let stream = self.rng.pick(&STREAMS).to_string();
        let fresh = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
        // Mostly the newest token; sometimes an older one (a stale writer).
        let token = if self.rng.chance(800) {
            fresh
        } else {
            fresh.saturating_sub(1 + self.rng.below(6)).max(1)
        };
        match self.rng.below(100) {
            0..=49 => {
                self.sent += 1;
                Op::Append {
                    stream,
                    token,
                    payload: format!("c{}-{}", self.id, self.sent).into_bytes(),
                }
            }
            50..=59 => Op::Fence { stream, token },
            60..=74 => Op::Read { stream, from: 0 },
            _ => {
                let name = self.rng.pick(&LEASES);
                let owner = format!("o{}", self.id);
                match self.held.get(name) {
                    Some(&token) if self.rng.chance(700) => Op::Renew {
                        name: name.to_string(),
                        owner,
                        token,
                    },
                    _ => Op::Acquire {
                        name: name.to_string(),
                        owner,
                    },
                }
            }
        }
    }

    async fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(self.rng.below(60))).await;
            let op = self.next_op();
            let invoked = self.trace.ns();
            let outcome = match self.node() {
                None => Outcome::Refused("no node up".into()),
                Some(node) => tokio::time::timeout(CLIENT_TIMEOUT, self.one(&node, &op))
                    .await
                    .unwrap_or_else(|_| Outcome::Unknown("timeout".into())),
            };
            let completed = self.trace.ns();
            match (&op, &outcome) {
                (Op::Acquire { name, .. }, Outcome::Granted(t)) => {
                    let name = LEASES.iter().find(|l| **l == name.as_str()).copied();
                    if let Some(name) = name {
                        self.held.insert(name, *t);
                    }
                }
                (Op::Renew { name, .. }, Outcome::Refused(_)) => {
                    self.held.retain(|l, _| *l != name.as_str());
                }
                (_, Outcome::Unknown(_)) => self.hint = None,
                _ => {}
            }
            self.trace.note(format_args!(
                "client {} {op:?} -> {}",
                self.id,
                short(&outcome)
            ));
            self.history.lock().push(Event {
                client: self.id,
                op,
                invoked,
                completed,
                outcome,
            });
        }
    }
}

fn short(o: &Outcome) -> String {
    match o {
        Outcome::Records(r) => format!("{} records", r.len()),
        other => format!("{other:?}"),
    }
}

thread_local! {
    /// Panics on this thread (a node's task panicking inside the runtime
    /// is caught by tokio; the simulation counts it as a failure).
    static PANICS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|p| p.set(p.get() + 1));
            previous(info);
        }));
    });
}

/// Runs one simulation on a fresh current-thread runtime with paused time.
pub fn run(cfg: Config) -> Report {
    count_panics();
    let before = PANICS.with(|p| p.get());
    let mut report = run_on_runtime(cfg);
    let panics = PANICS.with(|p| p.get()) - before;
    if panics > 0 {
        report.violations.push(format!(
            "{panics} panics in the nodes' tasks (see the test's output)"
        ));
    }
    report
}

fn run_on_runtime(cfg: Config) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(run_here(cfg))
}

async fn run_here(cfg: Config) -> Report {
    let started = Instant::now();
    let mut w = World::new(cfg.clone());
    let mut report = Report {
        seed: cfg.seed,
        nodes: cfg.nodes,
        ..Report::default()
    };
    if !w.form().await {
        w.violations.push("the group did not form".into());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..cfg.clients {
        let client = Client {
            id: c,
            rng: Rng::new(cfg.seed ^ (0xc11e_0000 + u64::from(c))),
            live: Arc::clone(&w.live),
            history: Arc::clone(&w.history),
            trace: w.trace.clone(),
            tokens: Arc::clone(&tokens),
            stop: Arc::clone(&stop),
            hint: None,
            sent: 0,
            held: BTreeMap::new(),
        };
        clients.push(tokio::spawn(client.run()));
    }
    match cfg.scenario {
        Scenario::Random => {
            for _ in 0..cfg.faults {
                let gap = Duration::from_millis(100 + w.rng.below(900));
                tokio::time::sleep(gap).await;
                w.random_fault().await;
            }
        }
        Scenario::WipeThenKillLeader => wipe_then_kill_leader(&mut w).await,
        Scenario::GroupPowerCuts(n) => {
            for _ in 0..n {
                tokio::time::sleep(Duration::from_millis(200 + w.rng.below(800))).await;
                w.group_power_cut().await;
                if w.wait_leader(Duration::from_secs(20)).await.is_none() {
                    w.violations
                        .push("no leader within 20 s of a group power cut".into());
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    match w.heal().await {
        Ok(()) => w.compare_digests(),
        Err(e) => w.violations.push(e),
    }
    let history = w.history.lock().clone();
    match w.final_streams().await {
        None => w
            .violations
            .push("the final streams could not be read".into()),
        Some(streams) => {
            let mut found: Vec<Violation> = history::check(&history, &streams);
            found.extend(history::check_lease_exclusion(&history, TTL_MS));
            for v in found {
                w.violations.push(v.to_string());
            }
        }
    }
    w.stop_all().await;
    report.ops = history.len() as u64;
    report.appends_acked = history
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Appended(_)))
        .count() as u64;
    report.grants = history
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Granted(_)))
        .count() as u64;
    report.simulated = started.elapsed();
    for v in &w.violations {
        w.trace.note(format_args!("violation {v}"));
    }
    {
        let t = w.trace.0.lock();
        report.trace_hash = t.hash;
        report.trace_events = t.count;
        report.trace = t.lines.clone().unwrap_or_default();
    }
    report.violations = std::mem::take(&mut w.violations);
    report.faults = std::mem::take(&mut w.faults);
    report
}

/// The named scenario: a follower's disk replaced, the other follower
/// lagging (cut off while writes go on), and the leader killed before
/// the group re-added the replaced one. The lagging follower and the new
/// incarnation together are a majority of three by count, but the new
/// incarnation must not vote: the group waits for the old leader (or
/// elects nobody) rather than lose what it acknowledged.
async fn wipe_then_kill_leader(w: &mut World) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Some(leader) = w.wait_leader(Duration::from_secs(10)).await else {
        w.violations.push("no leader to begin with".into());
        return;
    };
    let lid = leader.id();
    drop(leader);
    let followers: Vec<NodeId> = w.machines.keys().copied().filter(|&i| i != lid).collect();
    let (wiped, lagging) = (followers[0], followers[1]);
    // The lagging follower hears nothing while writes go on.
    {
        let mut links = w.net.links.lock();
        for &o in w.machines.keys() {
            if o != lagging {
                links.cut.insert((o, lagging));
                links.cut.insert((lagging, o));
            }
        }
    }
    w.fault(format!("follower {lagging} lagging"));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    w.fault(format!("disk of follower {wiped} replaced"));
    w.wipe(wiped).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The leader dies before it re-added the new incarnation; the lagging
    // follower comes back.
    w.fault(format!(
        "leader {lid} killed before the re-add; {lagging} back"
    ));
    let mode = w.crash_mode();
    w.crash(lid, mode).await;
    w.net.links.lock().cut.clear();
    // The lagging follower needs the new incarnation's vote, which it
    // must not get: no leader until the old one is back.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Some(l) = w.leader() {
            w.violations.push(format!(
                "node {} leads without the old leader while the replaced disk of {wiped} is not re-added",
                l.id()
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Neither the lagging follower nor the new incarnation may lead a
    // group that lost acknowledged writes: the history check says so at
    // the end. The old leader restarts, the group re-adds the new disk.
    w.start(lid, "restart").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// The seeds of a run: `FENCELOG_SIM_SEED=n` replays one, else
/// `FENCELOG_SIM_SEEDS=n` (default `default_count`) seeds from
/// `FENCELOG_SIM_FIRST` (default 1).
pub fn seeds_from_env(default_count: u64) -> Vec<u64> {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(s) = var("FENCELOG_SIM_SEED") {
        return vec![s];
    }
    let first = var("FENCELOG_SIM_FIRST").unwrap_or(1);
    let n = var("FENCELOG_SIM_SEEDS").unwrap_or(default_count);
    (first..first + n).collect()
}
