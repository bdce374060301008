//! No stranger joins a group (issue 19): whoever reaches a node's Raft port
//! without the cluster secret (garbage, a huge length prefix, a forged
//! vote or AppendEntries the way the unauthenticated protocol framed them,
//! a hello with a made-up proof, a node with another secret) changes
//! nothing: no term, no leader, no entry; its connection is closed, its
//! memory bounded, and it can hold no more than the connection cap. And
//! the pooled connections: a storm of reads opens no new connections.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencelog::{Command, Token, TxOp};
use fencelog_cluster::types::TypeConfig;
use fencelog_cluster::{ClusterSecret, Member, Node, NodeConfig, Response};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, LogId, Vote};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::{free_addr, sockets_dialing};

const SECRET: &[u8] = b"the group's secret";

fn config(id: u64, dir: &Path, secret: &[u8]) -> NodeConfig {
    let addr = free_addr();
    let member = Member {
        raft_addr: addr.to_string(),
        client_addr: format!("127.0.0.1:{}", 7000 + id),
        // Asked of the node when the group forms.
        incarnation: 0,
    };
    let mut cfg = NodeConfig::new(id, dir.join(format!("n{id}")), addr, member);
    cfg.raft_segment_bytes = 256 << 10;
    cfg.engine.wal.segment_bytes = 256 << 10;
    cfg.engine.wal.max_entry_bytes = 64 << 10;
    cfg.engine.max_payload_bytes = 16 << 10;
    cfg.cluster_secret = Some(ClusterSecret::new(secret.to_vec()).unwrap());
    cfg
}

fn append(token: u64) -> Command {
    Command::Write(TxOp::Append {
        stream: Bytes::from_static(b"s"),
        token: Token::new(token).unwrap(),
        payloads: vec![Bytes::from_static(b"x")].into(),
    })
}

struct Group {
    nodes: BTreeMap<u64, Node>,
    cfgs: BTreeMap<u64, NodeConfig>,
    _tmp: tempfile::TempDir,
}

impl Group {
    async fn start() -> Group {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let tmp = tempfile::tempdir().unwrap();
        let cfgs: BTreeMap<u64, NodeConfig> = (1..=3)
            .map(|id| (id, config(id, tmp.path(), SECRET)))
            .collect();
        let mut nodes = BTreeMap::new();
        for (id, cfg) in &cfgs {
            nodes.insert(*id, Node::start(cfg.clone()).await.unwrap());
        }
        let members = cfgs.iter().map(|(id, c)| (*id, c.member.clone())).collect();
        nodes[&1].initialize(members).await.unwrap();
        let g = Group {
            nodes,
            cfgs,
            _tmp: tmp,
        };
        let r = g.leader_node().await.write(append(1)).await.unwrap();
        assert_eq!(r, Response::Value(0));
        g
    }

    async fn leader_node(&self) -> &Node {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for node in self.nodes.values() {
                if node.status().state == "leader" {
                    return node;
                }
            }
            assert!(Instant::now() < deadline, "no leader in 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// (term, leader, state) of every node.
    fn view(&self) -> Vec<(u64, Option<u64>, String)> {
        self.nodes
            .values()
            .map(|n| {
                let s = n.status();
                (s.term, s.leader, s.state)
            })
            .collect()
    }

    async fn stop(self) {
        for node in self.nodes.into_values() {
            node.shutdown().await.unwrap();
        }
    }
}

/// Waits until the peer closes `s` (EOF or reset): the bytes it sent
/// before, or `None` if it is still open after `within`.
async fn closed_after(s: &mut TcpStream, within: Duration) -> Option<usize> {
    let mut buf = [0u8; 256];
    let mut got = 0;
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got += n,
        }
    }
}

/// Whether the peer closes `s` within `within`, having sent nothing.
async fn closed(s: &mut TcpStream, within: Duration) -> bool {
    match closed_after(s, within).await {
        None => false,
        // The node says nothing to a stranger: not even its hello.
        Some(0) => true,
        Some(n) => panic!("a stranger was sent {n} bytes"),
    }
}

/// The messages as the unauthenticated protocol framed them:
/// `{ len: u32 LE | bincode(Rpc) }`.
#[derive(Serialize)]
enum OldRpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
}

fn old_frame(rpc: &OldRpc) -> Vec<u8> {
    use bincode::Options;
    let body = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .serialize(rpc)
        .unwrap();
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&body);
    f
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strangers_on_the_raft_port_change_nothing_and_are_cut_off() {
    let g = Group::start().await;
    let before = g.view();
    let term = before[0].0;
    let forged_vote = old_frame(&OldRpc::Vote(VoteRequest {
        vote: Vote::new(term + 100, 9),
        last_log_id: Some(LogId::new(CommittedLeaderId::new(term + 99, 9), 1_000_000)),
    }));
    let forged_append = old_frame(&OldRpc::Append(AppendEntriesRequest {
        vote: Vote::new_committed(term + 100, 9),
        prev_log_id: None,
        leader_commit: None,
        entries: vec![],
    }));
    // A hello with the right magic, version and "has a secret", then a
    // proof made up without the secret.
    let mut made_up = b"FLRP".to_vec();
    made_up.extend_from_slice(&[fencelog_cluster::network::PROTOCOL_VERSION, 1]);
    made_up.extend_from_slice(&9u64.to_le_bytes());
    // Its incarnation, and none expected of the node.
    made_up.extend_from_slice(&7u64.to_le_bytes());
    made_up.extend_from_slice(&0u64.to_le_bytes());
    made_up.extend_from_slice(&[7u8; 32]);
    made_up.extend_from_slice(&[0u8; 32]);
    let mut huge = u32::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(&[0u8; 60]);
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();

    let rss = rss_bytes();
    // What the node sends back: nothing, but its hello (62 bytes) to a
    // well-formed hello.
    for (what, bytes, answer) in [
        ("garbage", &garbage, 0),
        ("a huge length prefix", &huge, 0),
        ("a forged vote of a higher term", &forged_vote, 0),
        ("a forged AppendEntries of a higher term", &forged_append, 0),
        ("a made-up proof", &made_up, 62),
    ] {
        // Twenty at once to every node, each sending the same: memory
        // stays bounded.
        let mut conns = Vec::new();
        for cfg in g.cfgs.values() {
            for _ in 0..20 {
                let mut s = TcpStream::connect(&cfg.member.raft_addr).await.unwrap();
                // The node may already have closed after the hello's worth.
                let _ = s.write_all(bytes).await;
                conns.push((cfg.id, s));
            }
        }
        for (id, s) in &mut conns {
            assert_eq!(
                closed_after(s, Duration::from_secs(3)).await,
                Some(answer),
                "{what}: node {id} kept the connection open or answered",
            );
        }
    }
    let grown = rss_bytes().saturating_sub(rss);
    assert!(grown < 64 << 20, "memory grew by {grown} bytes");

    // Several election timeouts later: the same terms, the same leader.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(g.view(), before, "a stranger changed the group");
    let r = g.leader_node().await.write(append(2)).await.unwrap();
    assert_eq!(r, Response::Value(1));
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_with_another_secret_neither_catches_up_nor_wins_a_vote() {
    let g = Group::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let rogue_cfg = config(4, tmp.path(), b"another group's secret");
    let rogue = Node::start(rogue_cfg.clone()).await.unwrap();
    let before = g.view();

    // Added as a learner: the leader cannot reach it, so it gets nothing.
    let leader = g.leader_node().await;
    leader
        .raft()
        .add_learner(4, rogue_cfg.member.clone(), false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(rogue.status().last_log_index, 0, "the rogue got entries");
    assert_eq!(leader.status().matched.get(&4).copied().unwrap_or(0), 0);

    // It believes itself a member and campaigns, term after term: no vote
    // request of it is read, so no term of the group moves.
    let mut members: BTreeMap<u64, Member> = g
        .cfgs
        .iter()
        .map(|(id, c)| {
            // The incarnations the group has (it cannot ask: another
            // secret).
            let mut m = c.member.clone();
            m.incarnation = g.nodes[id].incarnation();
            (*id, m)
        })
        .collect();
    members.insert(4, rogue_cfg.member.clone());
    rogue.initialize(members).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while rogue.status().term < before[0].0 + 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(rogue.status().state, "leader");
    let after: Vec<(u64, Option<u64>)> = g.view().into_iter().map(|v| (v.0, v.1)).collect();
    let before: Vec<(u64, Option<u64>)> = before.into_iter().map(|v| (v.0, v.1)).collect();
    assert_eq!(after, before, "the rogue moved the group's term or leader");
    assert!(
        !g.leader_node()
            .await
            .status()
            .members
            .get(&4)
            .is_some_and(|(_, voter)| *voter)
    );
    rogue.shutdown().await.unwrap();
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_connection_cap_holds_and_idle_handshakes_time_out() {
    let g = Group::start().await;
    let target = &g.cfgs[&1].member.raft_addr;
    let cap = fencelog_cluster::network::MAX_PEER_CONNECTIONS;
    let mut idle = Vec::new();
    for _ in 0..cap + 8 {
        idle.push(TcpStream::connect(target).await.unwrap());
    }
    // Those over the cap are closed at once (node 1's peers may hold a
    // slot or two of their own); the rest wait for their handshake.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut cut = 0;
    for s in &mut idle {
        // Closed ones read EOF at once; checked well within the 5 s the
        // others have left.
        if closed(s, Duration::from_millis(5)).await {
            cut += 1;
        }
    }
    assert!(
        (8..=12).contains(&cut),
        "{cut} of {} connections closed at once (cap {cap})",
        cap + 8
    );
    // Established peer connections are not touched: the group writes.
    let r = g.leader_node().await.write(append(2)).await.unwrap();
    assert_eq!(r, Response::Value(1));
    // The rest are dropped once the handshake timeout passes.
    let started = Instant::now();
    for s in &mut idle {
        assert!(closed(s, Duration::from_secs(8)).await);
    }
    assert!(started.elapsed() < Duration::from_secs(7));
    // Their slots are free again: a new stranger is read (and refused).
    let mut s = TcpStream::connect(target).await.unwrap();
    s.write_all(&[0u8; 64]).await.unwrap();
    assert!(closed(&mut s, Duration::from_secs(1)).await);
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_reads_and_heartbeats_reuses_one_connection_per_peer() {
    let g = Group::start().await;
    let ports: BTreeSet<u16> = g.cfgs.values().map(|c| c.raft_listen.port()).collect();
    let count = || -> usize { ports.iter().map(|&p| sockets_dialing(p)).sum() };
    let leader = g.leader_node().await;
    // Settle: every pair that will talk has talked.
    for _ in 0..20 {
        leader.linearizable().await.unwrap();
    }
    let before = count();
    // Each ReadIndex is a heartbeat round to both followers: openraft asks
    // for a client per round, and each used to open a connection.
    for _ in 0..500 {
        leader.linearizable().await.unwrap();
    }
    for t in 2..52 {
        leader.write(append(t)).await.unwrap();
    }
    let after = count();
    eprintln!("sockets dialing a Raft port: {before} before, {after} after 500 reads");
    assert!(
        after <= before + 1,
        "{} new connections for 500 reads and 50 writes",
        after - before
    );
    assert!(before <= 6, "{before} connections among 3 nodes");
    g.stop().await;
}
