//! A ReadIndex round asks a quorum, not every voter: in a group of three,
//! one follower answers a storm of rounds and the other sees its
//! heartbeats only; once that follower is gone, rounds go on through the
//! other (after the hedge, then at once). Messages go through an
//! in-process transport that counts them per target.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelog_cluster::{
    Hooks, Member, Node, NodeConfig, NodeId, PeerEndpoint, PeerError, PeerReply, PeerRequest,
    Transport, TransportFuture,
};
use parking_lot::Mutex;

mod common;

/// Delivers every message to its target's endpoint at once, and counts
/// the empty appends (heartbeats and rounds' confirmations) each target got.
#[derive(Default)]
struct Counting {
    endpoints: Mutex<BTreeMap<NodeId, PeerEndpoint>>,
    appends: Mutex<BTreeMap<NodeId, u64>>,
}

impl Counting {
    fn appends_to(&self, id: NodeId) -> u64 {
        self.appends.lock().get(&id).copied().unwrap_or(0)
    }
}

fn unreachable_peer() -> PeerError {
    PeerError::Io {
        what: "connecting (the node is down)",
        source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "test"),
    }
}

struct Net(Arc<Counting>);

impl Transport for Net {
    fn call(
        &self,
        _from: NodeId,
        to: NodeId,
        expected: u64,
        req: PeerRequest,
    ) -> TransportFuture<PeerReply> {
        let net = Arc::clone(&self.0);
        Box::pin(async move {
            let endpoint = net.endpoints.lock().get(&to).cloned();
            let Some(endpoint) = endpoint else {
                return Err(unreachable_peer());
            };
            if req.kind() == "heartbeat" {
                *net.appends.lock().entry(to).or_default() += 1;
            }
            endpoint.answer(expected, req).await
        })
    }

    fn probe(&self, _from: NodeId, to: NodeId) -> TransportFuture<u64> {
        let net = Arc::clone(&self.0);
        Box::pin(async move {
            let endpoint = net.endpoints.lock().get(&to).cloned();
            endpoint
                .map(|e| e.incarnation())
                .ok_or_else(unreachable_peer)
        })
    }
}

fn member(id: NodeId) -> Member {
    Member {
        raft_addr: format!("test-{id}:7000"),
        client_addr: format!("test-{id}:7379"),
        incarnation: 0,
    }
}

async fn leader(nodes: &BTreeMap<NodeId, Arc<Node>>) -> NodeId {
    common::leader_of(|| nodes.values().map(|n| &**n)).await
}

/// Runs `n` rounds one after the other on `node`, each awaited before the
/// next joins (so each is a round of its own); the time they took.
async fn rounds(node: &Node, n: usize) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        node.read_round(1).unwrap().await.unwrap();
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_round_asks_one_follower_of_two_and_the_other_once_it_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let net = Arc::new(Counting::default());
    let mut nodes = BTreeMap::new();
    for id in 1..=3 {
        let mut cfg = NodeConfig::new(
            id,
            tmp.path().join(format!("n{id}")),
            "127.0.0.1:0".parse().unwrap(),
            member(id),
        );
        cfg.raft_segment_bytes = 1 << 20;
        let hooks = Hooks {
            transport: Some(Arc::new(Net(Arc::clone(&net)))),
            ..Hooks::default()
        };
        let node = Arc::new(Node::start_on_current_runtime(cfg, hooks).await.unwrap());
        net.endpoints.lock().insert(id, node.peer_endpoint());
        nodes.insert(id, node);
    }
    let members = (1..=3).map(|id| (id, member(id))).collect();
    nodes[&1].initialize(members).await.unwrap();
    let lead = leader(&nodes).await;
    let followers: Vec<NodeId> = nodes.keys().copied().filter(|id| *id != lead).collect();

    // 1000 rounds: each costs one follower a message; the other gets the
    // leader's heartbeats only (a few per second).
    let before: Vec<u64> = followers.iter().map(|f| net.appends_to(*f)).collect();
    let took = rounds(&nodes[&lead], 1000).await;
    let got: Vec<u64> = followers
        .iter()
        .zip(&before)
        .map(|(f, b)| net.appends_to(*f) - b)
        .collect();
    let (most, least) = (got.iter().max().unwrap(), got.iter().min().unwrap());
    assert!(
        *most >= 1000,
        "1000 rounds: followers {followers:?} got {got:?} messages"
    );
    // Heartbeats while the rounds ran, at most one per 10 ms, and a few
    // rounds that waited past the hedge.
    let heartbeats = took.as_millis() as u64 / 10 + 50;
    assert!(
        *least < heartbeats,
        "1000 rounds in {took:?}: followers {followers:?} got {got:?} messages (every round asked both?)"
    );

    // The follower that answered goes away: rounds go on through the other.
    let busy = followers[got.iter().position(|g| g == most).unwrap()];
    net.endpoints.lock().remove(&busy);
    let other = *followers.iter().find(|f| **f != busy).unwrap();
    let before = net.appends_to(other);
    rounds(&nodes[&lead], 200).await;
    assert!(
        net.appends_to(other) - before >= 200,
        "with follower {busy} gone, 200 rounds sent follower {other} {} messages",
        net.appends_to(other) - before
    );

    for node in nodes.into_values() {
        if let Ok(node) = Arc::try_unwrap(node) {
            let _ = node.shutdown().await;
        }
    }
}
