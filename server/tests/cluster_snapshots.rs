//! Snapshots with real processes: a snapshot a node built (hard links to
//! its engine's segments, `docs/FORMAT.md`) survives every node being
//! killed with SIGKILL, and a replica that starts empty afterwards catches
//! up from it (the Raft log it would need is purged), holding what every
//! other replica holds.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, Reply, cluster_info};

#[test]
fn a_replica_catches_up_from_a_snapshot_built_before_every_node_was_killed() {
    // A snapshot every 100 entries; Raft keeps 1000 behind the last.
    let mut c = Cluster::start(3, &["--cluster-snapshot-every", "100"]);
    let payload = vec![b'p'; 200];
    // One write per entry (not pipelined): 1500 entries.
    for n in 0..1500i64 {
        match c.at_leader(&[b"LOG.APPEND", b"s", b"1", &payload]) {
            Reply::Int(offset) => assert_eq!(offset, n),
            other => panic!("append {n}: {other:?}\n{}", c.logs()),
        }
    }
    c.converge(Duration::from_secs(30));
    let mut built = Vec::new();
    for (id, info) in c.infos() {
        let at: u64 = info["raft_snapshot_index"].parse().unwrap_or(0);
        assert!(at >= 1000, "node {id}: snapshot at {at}");
        built.push((id, at, staged(&c, id)));
    }
    // Killed mid-stride, every one; the snapshots are all they have of
    // the purged history.
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    for id in &ids {
        c.kill(*id);
    }
    for id in &ids {
        c.restart(*id);
    }
    let leader = c.leader(Duration::from_secs(20));
    // Each found the snapshot it built (a restart removes only what has
    // no metadata): the same directory, at the same index.
    for (id, at, dirs) in &built {
        assert_eq!(&staged(&c, *id), dirs, "node {id}");
        let info = cluster_info(c.nodes[id].client).unwrap_or_default();
        assert_eq!(info["raft_snapshot_index"], at.to_string(), "node {id}");
    }
    let wiped = *ids.iter().find(|&&id| id != leader).unwrap();
    c.wipe_and_rejoin(wiped);
    c.assert_replicas_agree(Duration::from_secs(60));
    let info = cluster_info(c.nodes[&wiped].client).unwrap_or_default();
    assert_eq!(
        info.get("raft_snapshots_installed").map(String::as_str),
        Some("1"),
        "node {wiped} caught up by snapshot: {info:?}"
    );
    // Every acknowledged append is there, in order, and the stream goes on.
    match c.at_leader(&[b"LOG.READ", b"s", b"0", b"COUNT", b"2000"]) {
        Reply::Array(records) => assert_eq!(records.len(), 1500),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.at_leader(&[b"LOG.APPEND", b"s", b"1", b"after"]),
        Reply::Int(1500)
    ));
    c.assert_replicas_agree(Duration::from_secs(30));
}

/// The staged snapshots (`snap/<id>.d`) of node `id`'s data directory.
fn staged(c: &Cluster, id: u64) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(c.nodes[&id].dir.join("snap"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".d"))
        .collect();
    dirs.sort();
    assert_eq!(dirs.len(), 1, "node {id}: {dirs:?}");
    dirs
}
