//! Pipelined writes through a 3-node group go to the leader's queue
//! together: a connection's writes taken in one turn are one item of the
//! queue with one answer, not one item, channel and timer per write. What
//! must not change: each write is answered in its place with its own
//! offset or refusal, a stale write in the middle refuses alone, and a
//! follower sends each write of a pipeline to the leader.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::cluster::{Cluster, Reply, Resp, cluster_info, fields};

/// One cluster at a time: several on two cores would time out each
/// other's elections.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_connections_pipelined_writes_are_proposed_together_and_answered_in_place() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let addr = cluster.nodes[&leader].client;
    let mut c = Resp::connect(addr, Duration::from_secs(10)).unwrap();
    let counts = || {
        let info = cluster_info(addr).expect("CLUSTER INFO");
        let n = |k: &str| info[k].parse::<u64>().unwrap();
        (n("raft_proposals"), n("raft_proposed_writes"))
    };
    // Token 5 first: the pipeline's token-4 write below is stale.
    assert_eq!(
        c.cmd(&[b"LOG.APPEND", b"s", b"5", b"first"]).unwrap(),
        Reply::Int(0)
    );
    let (items, writes) = counts();

    // 200 appends in one pipeline, one of them stale (the 100th).
    let mut pipeline: Vec<Vec<&[u8]>> = Vec::new();
    for i in 0..200 {
        let token: &[u8] = if i == 99 { b"4" } else { b"5" };
        pipeline.push(vec![b"LOG.APPEND", b"s", token, b"x"]);
    }
    let replies = c.pipeline(&pipeline).unwrap();
    assert_eq!(replies.len(), 200);
    let mut offset = 1;
    for (i, r) in replies.iter().enumerate() {
        if i == 99 {
            assert!(
                matches!(r, Reply::Error(e) if e.starts_with("STALE")),
                "the stale write answered {r:?}"
            );
        } else {
            assert_eq!(*r, Reply::Int(offset), "write {i}");
            offset += 1;
        }
    }
    let (items_after, writes_after) = counts();
    assert_eq!(writes_after - writes, 199, "writes proposed");
    // A turn of the connection takes at most 64 requests, and the stale
    // write splits the one it is in: at least 4 items; one per write would
    // be 199. (More if the pipeline's bytes came in many reads.)
    let taken = items_after - items;
    assert!(
        (4..=20).contains(&taken),
        "199 pipelined writes took {taken} items of the queue"
    );

    // Through a follower, each write of a pipeline is sent on.
    let follower = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let mut f = Resp::connect(cluster.nodes[&follower].client, Duration::from_secs(10)).unwrap();
    let replies = f
        .pipeline(&vec![vec![b"LOG.APPEND" as &[u8], b"t", b"1", b"y"]; 20])
        .unwrap();
    assert_eq!(replies.len(), 20);
    for r in &replies {
        assert!(
            matches!(r, Reply::Error(e) if e.starts_with("MOVED ")),
            "a follower answered {r:?}"
        );
    }
}

/// The first element of a `LEASE.ACQUIRE` reply: the token.
fn token(r: &Reply) -> i64 {
    match r {
        Reply::Array(items) => match items.first() {
            Some(Reply::Int(t)) => *t,
            other => panic!("LEASE.ACQUIRE's token is {other:?}"),
        },
        other => panic!("LEASE.ACQUIRE answered {other:?}"),
    }
}

/// Writes taken together reach the log before a lease command sent after
/// them on the same connection: an append under the old token lands, the
/// acquisition that fences the stream comes next, and an append under the
/// old token sent after it is stale.
#[test]
fn writes_taken_together_keep_their_place_before_a_lease_command() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let mut c = Resp::connect(cluster.nodes[&leader].client, Duration::from_secs(10)).unwrap();
    let first = c
        .cmd(&[b"LEASE.ACQUIRE", b"jobs", b"a", b"10000", b"FENCE"])
        .unwrap();
    let old = token(&first).to_string();
    assert_eq!(
        c.cmd(&[b"LEASE.RELEASE", b"jobs", b"a", old.as_bytes()])
            .unwrap(),
        Reply::Int(1)
    );
    let old: &[u8] = old.as_bytes();
    let replies = c
        .pipeline(&[
            vec![b"LOG.APPEND", b"jobs", old, b"1"],
            vec![b"LOG.APPEND", b"jobs", old, b"2"],
            vec![b"LEASE.ACQUIRE", b"jobs", b"b", b"10000", b"FENCE"],
            vec![b"LOG.APPEND", b"jobs", old, b"3"],
        ])
        .unwrap();
    assert_eq!(replies[0], Reply::Int(0), "{replies:?}");
    assert_eq!(replies[1], Reply::Int(1), "{replies:?}");
    assert!(token(&replies[2]) > token(&first), "{replies:?}");
    assert!(
        matches!(&replies[3], Reply::Error(e) if e.starts_with("STALE")),
        "{replies:?}"
    );
}

/// `INFO replication` as numbers.
fn replication(addr: std::net::SocketAddr) -> std::collections::BTreeMap<String, f64> {
    fields(addr, &[b"INFO", b"replication"])
        .expect("INFO replication")
        .into_iter()
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect()
}

/// Each node times the steps of a replicated write (`INFO replication`):
/// the leader its entries' rounds and its AppendEntries to followers, every
/// node its Raft log syncs and its applies; a follower proposes nothing,
/// so it times no round and no replication.
#[test]
fn each_node_times_the_steps_of_a_replicated_write() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let addr = |id: &u64| cluster.nodes[id].client;
    let mut c = Resp::connect(addr(&leader), Duration::from_secs(10)).unwrap();
    // Whatever the group wrote as it started (a take-over, the membership).
    assert_eq!(
        c.cmd(&[b"LOG.APPEND", b"s", b"1", b"first"]).unwrap(),
        Reply::Int(0)
    );
    let before: std::collections::BTreeMap<u64, _> = cluster
        .nodes
        .keys()
        .map(|id| (*id, replication(addr(id))))
        .collect();
    // One at a time: each write its own entry.
    for i in 1..=30 {
        assert_eq!(
            c.cmd(&[b"LOG.APPEND", b"s", b"1", b"x"]).unwrap(),
            Reply::Int(i)
        );
    }
    cluster.converge(Duration::from_secs(20));
    for id in cluster.nodes.keys() {
        let after = replication(addr(id));
        let grew = |k: &str| after[k] - before[id][k];
        // (`INFO` shows seconds to the hundredth: thirty rounds of a
        // fraction of a millisecond may not move them. The means since the
        // node started, in whole microseconds, are never 0 once timed.)
        if *id == leader {
            assert!(grew("raft_entry_rounds") >= 30.0, "node {id}: {after:?}");
            // Each entry goes to both followers.
            assert!(grew("raft_replications") >= 30.0, "node {id}: {after:?}");
            assert!(
                after["raft_entry_round_mean_us"] > 0.0,
                "node {id}: {after:?}"
            );
            assert!(
                after["raft_replication_mean_us"] > 0.0,
                "node {id}: {after:?}"
            );
        } else {
            for k in ["raft_entry_rounds", "raft_replications"] {
                assert_eq!(grew(k), 0.0, "node {id} is a follower: {k} {after:?}");
            }
        }
        // Every node wrote and applied the 30 entries (a follower may take
        // several in one append, and apply several in one call).
        assert!(grew("raft_log_syncs") >= 1.0, "node {id}: {after:?}");
        assert!(after["raft_log_sync_mean_us"] > 0.0, "node {id}: {after:?}");
        assert!(grew("raft_applies") >= 1.0, "node {id}: {after:?}");
        assert!(after["raft_apply_mean_us"] > 0.0, "node {id}: {after:?}");
    }
}

/// Clients that wait for each answer before they write again share
/// entries: with one entry in flight the leader waits, briefly, for the
/// writers it just answered before it proposes the next entry
/// (`raft_comeback_*` in `CLUSTER INFO`); with `--cluster-no-batch-wait`
/// it never does. Either way each write is answered in its place.
#[test]
fn the_leader_waits_for_the_writers_it_answered_unless_told_not_to() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (extra, waits) in [(&[][..], true), (&["--cluster-no-batch-wait"][..], false)] {
        let cluster = Cluster::start(3, extra);
        let leader = cluster.leader(Duration::from_secs(10));
        let addr = cluster.nodes[&leader].client;
        let counts = || {
            let info = cluster_info(addr).expect("CLUSTER INFO");
            let n = |k: &str| info[k].parse::<u64>().unwrap();
            (n("raft_comeback_waits"), n("raft_comeback_ran_out"))
        };
        let (waited, ran_out) = counts();
        // Eight writers, each waiting for every answer before its next.
        std::thread::scope(|s| {
            for w in 0..8 {
                s.spawn(move || {
                    let mut c = Resp::connect(addr, Duration::from_secs(10)).unwrap();
                    let stream = format!("w{w}");
                    for i in 0..100 {
                        assert_eq!(
                            c.cmd(&[b"LOG.APPEND", stream.as_bytes(), b"1", b"x"])
                                .unwrap(),
                            Reply::Int(i),
                            "writer {w}, write {i}"
                        );
                    }
                });
            }
        });
        let (waited_after, ran_out_after) = counts();
        let ended_by_return = (waited_after - waited) - (ran_out_after - ran_out);
        if waits {
            assert!(
                ended_by_return >= 1,
                "800 writes: {} waits, {} ran out",
                waited_after - waited,
                ran_out_after - ran_out
            );
        } else {
            assert_eq!((waited_after, ran_out_after), (0, 0), "told not to wait");
        }
    }
}

/// Every replica's engine log, which is not synced per batch, hands its
/// written bytes to the disk a MiB at a time (`WalOptions::writeback_bytes`),
/// so that a seal's sync does not write a whole segment at once: 2.5 MiB
/// written through the leader make at least two hand-overs on every node,
/// none refused, and the records read back.
#[test]
fn every_replicas_engine_log_hands_its_bytes_to_the_disk_as_it_goes() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let addr = cluster.nodes[&leader].client;
    let mut c = Resp::connect(addr, Duration::from_secs(10)).unwrap();
    let record = vec![b'r'; 64 << 10];
    for i in 0..40 {
        assert_eq!(
            c.cmd(&[b"LOG.APPEND", b"big", b"1", &record]).unwrap(),
            Reply::Int(i)
        );
    }
    for (id, node) in &cluster.nodes {
        let handed = || {
            let info = fields(node.client, &[b"INFO", b"commit"]).expect("INFO commit");
            let n = |k: &str| info[k].parse::<u64>().unwrap();
            (n("log_writebacks_started"), n("log_writebacks_failed"))
        };
        // A follower applies what the leader committed a moment later.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = handed();
        while seen.0 < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            seen = handed();
        }
        assert!(seen.0 >= 2, "node {id}: {seen:?} for 2.5 MiB");
        assert_eq!(seen.1, 0, "node {id}");
    }
    match c
        .cmd(&[b"LOG.READ", b"big", b"0", b"COUNT", b"100"])
        .unwrap()
    {
        Reply::Array(records) => {
            assert_eq!(records.len(), 40);
            for (i, rec) in records.iter().enumerate() {
                match rec {
                    Reply::Array(f) => match f.as_slice() {
                        [Reply::Int(o), Reply::Int(1), Reply::Bulk(p)] => {
                            assert_eq!((*o, p.len()), (i as i64, 64 << 10));
                        }
                        other => panic!("record {i}: {other:?}"),
                    },
                    other => panic!("record {i}: {other:?}"),
                }
            }
        }
        other => panic!("LOG.READ answered {other:?}"),
    }
}
