//! A data directory's incarnation, in-process: a directory that lost its
//! `incarnation` file is refused, one from before incarnations gets one,
//! and a fresh disk under an old id takes nothing even from a membership
//! that admitted it before incarnations, until it is re-added.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencelog::{Command, Token, TxOp};
use fencelog_cluster::{ChangeMembers, Member, Node, NodeConfig, Response};

use common::free_addr;

fn config(id: u64, dir: &Path, addr: SocketAddr) -> NodeConfig {
    let member = Member {
        raft_addr: addr.to_string(),
        client_addr: format!("127.0.0.1:{}", 7000 + id),
        incarnation: 0,
    };
    let mut cfg = NodeConfig::new(id, dir.join(format!("n{id}")), addr, member);
    cfg.raft_segment_bytes = 256 << 10;
    cfg.engine.wal.segment_bytes = 256 << 10;
    cfg.engine.wal.max_entry_bytes = 64 << 10;
    cfg.engine.max_payload_bytes = 16 << 10;
    // Roomy on a shared, loaded machine.
    cfg.election_timeout_ms = (1000, 1500);
    cfg.heartbeat_ms = 200;
    cfg
}

fn append(token: u64) -> Command {
    Command::Write(TxOp::Append {
        stream: Bytes::from_static(b"s"),
        token: Token::new(token).unwrap(),
        payloads: vec![Bytes::from_static(b"x")].into(),
    })
}

async fn leader(nodes: &BTreeMap<u64, Node>) -> &Node {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(n) = nodes.values().find(|n| n.status().state == "leader") {
            return n;
        }
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn incarnation_file(cfg: &NodeConfig) -> std::path::PathBuf {
    cfg.dir.join(fencelog_cluster::incarnation::FILE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_incarnation_file_is_refused_and_a_directory_from_before_gets_one() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(1, tmp.path(), free_addr());
    let node = Node::start(cfg.clone()).await.unwrap();
    let first = node.incarnation();
    assert!(
        incarnation_file(&cfg).exists(),
        "made when the directory is"
    );
    // Formed here: the membership admits this node's incarnation.
    node.initialize(BTreeMap::from([(1, cfg.member.clone())]))
        .await
        .unwrap();
    fencelog_cluster::wait_for_leader(&node, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(node.status().members[&1].0.incarnation, first);
    node.shutdown().await.unwrap();
    drop(node);

    // The same directory comes back with it.
    let node = Node::start(cfg.clone()).await.unwrap();
    assert_eq!(node.incarnation(), first);
    node.shutdown().await.unwrap();
    drop(node);

    // Its file lost: refused, with the reason.
    std::fs::remove_file(incarnation_file(&cfg)).unwrap();
    let e = Node::start(cfg.clone()).await.err().expect("refused");
    let text = e.to_string();
    assert!(
        text.contains("incarnation") && text.contains("missing"),
        "{text}"
    );

    // A directory from before incarnations: admitted with 0, no file.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(1, tmp.path(), free_addr());
    let node = Node::start(cfg.clone()).await.unwrap();
    node.raft()
        .initialize(BTreeMap::from([(1, cfg.member.clone())]))
        .await
        .unwrap();
    fencelog_cluster::wait_for_leader(&node, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(node.write(append(1)).await.unwrap(), Response::Value(0));
    node.shutdown().await.unwrap();
    drop(node);
    std::fs::remove_file(incarnation_file(&cfg)).unwrap();
    let node = Node::start(cfg.clone()).await.unwrap();
    assert!(incarnation_file(&cfg).exists(), "it has one now");
    fencelog_cluster::wait_for_leader(&node, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(node.write(append(1)).await.unwrap(), Response::Value(1));
    node.shutdown().await.unwrap();
}

/// A group formed before incarnations lists its members with 0. A member
/// wiped and started empty under its old id takes no entry from it (the
/// leader would see a follower's log go back, which openraft refuses
/// without `loosen-follower-log-revert`) until it is re-added, which
/// admits its incarnation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_disk_listed_without_an_incarnation_takes_nothing_until_re_added() {
    let tmp = tempfile::tempdir().unwrap();
    let cfgs: BTreeMap<u64, NodeConfig> = (1..=3)
        .map(|id| (id, config(id, tmp.path(), free_addr())))
        .collect();
    let mut nodes = BTreeMap::new();
    for (id, cfg) in &cfgs {
        nodes.insert(*id, Node::start(cfg.clone()).await.unwrap());
    }
    let members: BTreeMap<u64, Member> =
        cfgs.iter().map(|(id, c)| (*id, c.member.clone())).collect();
    nodes[&1].initialize(members.clone()).await.unwrap();
    // As a group from before incarnations: every member listed with 0
    // (what an old membership decodes as).
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = leader(&nodes)
        .await
        .change_members(ChangeMembers::SetNodes(members.clone()))
        .await
    {
        // The first election may still move the leader.
        let view: Vec<_> = nodes
            .values()
            .map(|n| {
                let s = n.status();
                (s.id, s.state, s.term, s.leader)
            })
            .collect();
        assert!(Instant::now() < deadline, "{e}: {view:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for n in nodes.values() {
        let deadline = Instant::now() + Duration::from_secs(10);
        while n.status().members.values().any(|(m, _)| m.incarnation != 0) {
            assert!(
                Instant::now() < deadline,
                "the old membership did not arrive"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for t in 1..=5 {
        leader(&nodes).await.write(append(t)).await.unwrap();
    }
    let lead = leader(&nodes).await.id();
    let wiped = if lead == 3 { 2 } else { 3 };
    let node = nodes.remove(&wiped).unwrap();
    node.shutdown().await.unwrap();
    drop(node);
    std::fs::remove_dir_all(&cfgs[&wiped].dir).unwrap();
    nodes.insert(wiped, Node::start(cfgs[&wiped].clone()).await.unwrap());
    for t in 6..=8 {
        leader(&nodes).await.write(append(t)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let st = nodes[&wiped].status();
    assert_eq!(
        (st.last_log_index, st.term),
        (0, 0),
        "the fresh disk took entries or a vote"
    );
    // The leader lives on (no reverted follower log stopped it).
    leader(&nodes).await.write(append(9)).await.unwrap();

    // Re-added: out first, then a learner with its incarnation, then a
    // voter.
    let l = leader(&nodes).await;
    l.change_members(ChangeMembers::RemoveVoters(BTreeSet::from([wiped])))
        .await
        .unwrap();
    l.add_learner(wiped, cfgs[&wiped].member.clone())
        .await
        .unwrap();
    l.change_members(ChangeMembers::AddVoterIds(BTreeSet::from([wiped])))
        .await
        .unwrap();
    let (admitted, voter) = l.status().members[&wiped].clone();
    assert!(voter);
    assert_eq!(admitted.incarnation, nodes[&wiped].incarnation());
    let deadline = Instant::now() + Duration::from_secs(20);
    while nodes[&wiped].status().last_applied < l.status().last_applied {
        assert!(
            Instant::now() < deadline,
            "the re-added node did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for n in nodes.values() {
        n.shutdown().await.unwrap();
    }
}
