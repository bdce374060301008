//! A replaced disk is a new incarnation (docs/CLUSTER.md, "A replica whose
//! disk died"): a replica restarted empty under its old id neither votes
//! nor accepts entries until the group has re-added it. Real processes on
//! loopback, peers' traffic through the test's proxies.
//!
//! The window of issue 20 (finding 3): leader A, follower B lagging (cut
//! off), a fence acknowledged by A and C; C wiped and restarted empty
//! under its old id, not yet re-added; A killed; B healed. Before
//! incarnations, C granted B its vote (B's log is at least as long as its
//! empty one) and B led without the fence. Now B cannot win, the fence
//! survives A's return, and C votes again only once `--cluster-join` has
//! re-added it with its new incarnation.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Reply, Resp, cluster_info};

fn cmd(addr: SocketAddr, args: &[&[u8]]) -> Result<Reply, String> {
    Resp::connect(addr, Duration::from_secs(2))?.cmd(args)
}

fn info(c: &Cluster, id: u64) -> std::collections::BTreeMap<String, String> {
    cluster_info(c.nodes[&id].client).unwrap_or_default()
}

#[test]
fn a_wiped_replica_neither_votes_nor_takes_entries_until_rejoined_and_the_fence_survives() {
    let mut c = Cluster::start(3, &[]);
    let a = c.leader(Duration::from_secs(20));
    // C: a follower other than node 1 (node 1 restarted empty with
    // --cluster-initial would try to form a cluster of its own: refused
    // too, but another story).
    let others: Vec<u64> = c.nodes.keys().copied().filter(|&id| id != a).collect();
    let cc = *others.iter().filter(|&&id| id != 1).max().unwrap();
    let b = *others.iter().find(|&&id| id != cc).unwrap();
    eprintln!("leader A={a}, lagging B={b}, wiped C={cc}");

    // The stream exists everywhere with token 1.
    assert_eq!(
        c.at_leader(&[b"LOG.APPEND", b"jobs", b"1", b"first"]),
        Reply::Int(0)
    );
    c.converge(Duration::from_secs(20));

    // B lags: cut off from its peers. A and C acknowledge a fence at 1000.
    c.isolate(b);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.leader(Duration::from_secs(10)), a);
    assert!(matches!(
        cmd(c.nodes[&a].client, &[b"LOG.FENCE", b"jobs", b"1000"]),
        Ok(Reply::Int(_))
    ));
    let b_log = info(&c, b)["raft_last_log_index"].parse::<u64>().unwrap();
    let a_log = info(&c, a)["raft_last_log_index"].parse::<u64>().unwrap();
    assert!(b_log < a_log, "B lags: {b_log} < {a_log}");

    // C's disk is replaced: it starts empty under its old id (no ADDNODE).
    let old_incarnation = info(&c, cc)["raft_incarnation"].clone();
    c.wipe(cc);
    c.restart(cc);
    let new_incarnation = info(&c, cc)["raft_incarnation"].clone();
    assert_ne!(old_incarnation, new_incarnation);
    // A still lists the old incarnation and dials C expecting it: refused,
    // so C takes no entries.
    std::thread::sleep(Duration::from_millis(600));
    let ci = info(&c, cc);
    assert_eq!(ci["raft_last_log_index"], "0", "C took entries: {ci:?}");
    assert_eq!(
        info(&c, a)[&format!("raft_member_{cc}")],
        format!("incarnation={old_incarnation},voter=1")
    );

    // A dies inside the window; B comes back.
    c.kill(a);
    c.heal();
    // B must not win with C's vote: several election timeouts, no leader.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        for id in [b, cc] {
            let i = info(&c, id);
            assert_ne!(
                i.get("raft_state").map(String::as_str),
                Some("leader"),
                "node {id} leads without A: {i:?}\n{}",
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // C granted no vote: it never even saw B's term, nor any entry.
    let ci = info(&c, cc);
    assert_eq!(ci["raft_term"], "0", "C voted: {ci:?}");
    assert_eq!(ci["raft_last_log_index"], "0");
    // With PreVote, B does not even campaign: no majority would vote for
    // it (A is dead, C answers nobody), so its term stays where it was.
    assert_eq!(
        info(&c, b)["raft_term"],
        "1",
        "B raised its term without a majority"
    );
    assert!(
        c.nodes[&cc].log.lock().unwrap().contains("incarnation"),
        "C said why it refused: {}",
        c.logs()
    );
    // A write with a lower token than the fence is never accepted: there
    // is no leader to accept anything.
    for id in [b, cc] {
        if let Ok(Reply::Int(o)) = cmd(c.nodes[&id].client, &[b"LOG.APPEND", b"jobs", b"5", b"x"]) {
            panic!("node {id} accepted a write below the fence at offset {o}");
        }
    }

    // A returns: the group leads again with the fence.
    c.restart(a);
    match c.at_leader(&[b"LOG.APPEND", b"jobs", b"5", b"late"]) {
        Reply::Error(e) => assert!(e.starts_with("STALE"), "{e}"),
        other => panic!("a write below the fence got {other:?}\n{}", c.logs()),
    }

    // C is re-added properly: --cluster-join (ADDNODE) takes the old
    // incarnation out, adds the new one as a learner, catches it up and
    // makes it a voter.
    c.kill(cc);
    let leader = c.leader(Duration::from_secs(20));
    c.launch_joining(cc, c.nodes[&leader].client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let leader = c.leader(Duration::from_secs(20));
        let li = info(&c, leader);
        if li.get(&format!("raft_member_{cc}"))
            == Some(&format!("incarnation={new_incarnation},voter=1"))
            && info(&c, cc).get("raft_state").map(String::as_str) == Some("follower")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "C was not re-added: {li:?}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    c.converge(Duration::from_secs(30));
    // It counts towards a majority now: with the other follower dead, the
    // leader and C still commit, and the fence holds there too.
    let leader = c.leader(Duration::from_secs(20));
    let other = *c
        .nodes
        .keys()
        .find(|&&id| id != leader && id != cc)
        .unwrap();
    c.kill(other);
    assert!(matches!(
        c.at_leader(&[b"LOG.APPEND", b"jobs", b"1000", b"after"]),
        Reply::Int(_)
    ));
    match c.at_leader(&[b"LOG.APPEND", b"jobs", b"999", b"late"]) {
        Reply::Error(e) => assert!(e.starts_with("STALE"), "{e}"),
        other => panic!("{other:?}"),
    }
    let ci = info(&c, cc);
    assert_eq!(ci["raft_incarnation"], new_incarnation);
}
