//! Linearizable reads through a 3-node group, pipelined. What broke
//! before: a connection ran one read at a time, each waiting for its own
//! ReadIndex round inside the connection loop, so 50 connections at
//! pipeline 16 read about 16k times a second. A connection's pipelined
//! reads now wait together for one round joined when the first of them is
//! taken, and are answered in the connection's order; these tests guard
//! what that must not change: a read sees every write acknowledged before
//! it was sent, a read never sees a write sent after it on the same
//! connection, and a follower sends each pipelined read on to the leader.

mod common;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Reply, Resp, cluster_info};

/// One cluster at a time: several on two cores would time out each
/// other's elections.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new 3-node group (one at a time) and its leader's id.
fn group() -> (std::sync::MutexGuard<'static, ()>, Cluster, u64) {
    let one = serial();
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    (one, cluster, leader)
}

/// Records in a `LOG.READ` reply.
fn records(r: &Reply) -> usize {
    match r {
        Reply::Array(items) => items.len(),
        other => panic!("LOG.READ answered {other:?}"),
    }
}

/// `next_offset` in a `LOG.STAT` reply (RESP2: a flat list of pairs).
fn next_offset(r: &Reply) -> i64 {
    let Reply::Array(items) = r else {
        panic!("LOG.STAT answered {r:?}");
    };
    let at = items
        .iter()
        .position(|i| matches!(i, Reply::Bulk(b) if b == b"next_offset"))
        .unwrap_or_else(|| panic!("no next_offset in {items:?}"));
    match &items[at + 1] {
        Reply::Int(n) => *n,
        other => panic!("next_offset is {other:?}"),
    }
}

#[test]
fn pipelined_reads_keep_the_connections_order_around_writes() {
    let (_one, cluster, leader) = group();
    let mut c = Resp::connect(cluster.nodes[&leader].client, Duration::from_secs(10)).unwrap();
    let read: Vec<&[u8]> = vec![b"LOG.READ", b"s", b"0", b"COUNT", b"100000"];
    let stat: Vec<&[u8]> = vec![b"LOG.STAT", b"s"];
    let append: Vec<&[u8]> = vec![b"LOG.APPEND", b"s", b"7", b"x"];
    for round in 0..60usize {
        // Each round appends three records.
        let before = 3 * round;
        let n = |k: usize| (before + k) as i64;
        // Reads first, then a write, reads, two writes and reads again:
        // each read sees exactly the writes sent before it.
        let replies = c
            .pipeline(&[
                read.clone(),
                stat.clone(),
                append.clone(),
                read.clone(),
                read.clone(),
                stat.clone(),
                append.clone(),
                append.clone(),
                vec![b"DBSIZE"],
                read.clone(),
                stat.clone(),
            ])
            .unwrap();
        assert_eq!(records(&replies[0]), before, "round {round}: {replies:?}");
        assert_eq!(next_offset(&replies[1]), n(0));
        assert_eq!(replies[2], Reply::Int(n(0)));
        assert_eq!(records(&replies[3]), before + 1);
        assert_eq!(records(&replies[4]), before + 1);
        assert_eq!(next_offset(&replies[5]), n(1));
        assert_eq!(replies[6], Reply::Int(n(1)));
        assert_eq!(replies[7], Reply::Int(n(2)));
        assert_eq!(replies[8], Reply::Int(1));
        assert_eq!(records(&replies[9]), before + 3);
        assert_eq!(next_offset(&replies[10]), n(3));
    }
    cluster.assert_replicas_agree(Duration::from_secs(10));
}

/// Readers pipeline `LOG.STAT` on eight connections while a writer
/// appends one record at a time: every read answers at least the count the
/// writer had acknowledged before the read was sent, and a connection's
/// answers never go back.
#[test]
fn a_read_storm_sees_every_write_acknowledged_before_it() {
    let (_one, cluster, leader) = group();
    let addr = cluster.nodes[&leader].client;
    let acked = AtomicI64::new(0);
    let stop = AtomicBool::new(false);
    let reads = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let mut c = Resp::connect(addr, Duration::from_secs(10)).unwrap();
                    let stat: Vec<&[u8]> = vec![b"LOG.STAT", b"s"];
                    let batch = vec![stat; 32];
                    let (mut last, mut reads) = (0i64, 0usize);
                    while !stop.load(Ordering::SeqCst) {
                        let floor = acked.load(Ordering::SeqCst);
                        for r in c.pipeline(&batch).unwrap() {
                            let seen = next_offset(&r);
                            assert!(seen >= floor, "read {seen} after {floor} were acknowledged");
                            assert!(
                                seen >= last,
                                "a connection's reads went back: {last} then {seen}"
                            );
                            last = seen;
                            reads += 1;
                        }
                    }
                    reads
                })
            })
            .collect();
        let mut w = Resp::connect(addr, Duration::from_secs(10)).unwrap();
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            match w.cmd(&[b"LOG.APPEND", b"s", b"1", b"x"]).unwrap() {
                Reply::Int(at) => acked.store(at + 1, Ordering::SeqCst),
                other => panic!("append answered {other:?}"),
            }
        }
        stop.store(true, Ordering::SeqCst);
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .sum::<usize>()
    });
    assert!(reads > 0 && acked.load(Ordering::SeqCst) > 0);
    cluster.assert_replicas_agree(Duration::from_secs(10));
}

/// A follower sends every pipelined read on to the leader.
#[test]
fn a_follower_moves_each_pipelined_read() {
    let (_one, cluster, leader) = group();
    let follower = cluster
        .nodes
        .keys()
        .copied()
        .find(|&id| id != leader)
        .unwrap();
    let mut c = Resp::connect(cluster.nodes[&follower].client, Duration::from_secs(10)).unwrap();
    let read: Vec<&[u8]> = vec![b"LOG.READ", b"s", b"0"];
    // Until the follower has heard from the new leader it answers
    // TRYAGAIN (it knows no leader yet).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(c.cmd(&read).unwrap(), Reply::Error(e) if e.starts_with("MOVED")) {
        assert!(
            Instant::now() < deadline,
            "the follower never learned the leader"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let replies = c.pipeline(&vec![read; 20]).unwrap();
    let to = cluster.nodes[&leader].client.to_string();
    for r in &replies {
        assert!(
            matches!(r, Reply::Error(e) if e.starts_with("MOVED") && e.ends_with(&to)),
            "{r:?}"
        );
    }
}

/// A connection's pipelined reads wait for one round together: the
/// leader counts one join of a round for the whole pipeline (not one per
/// read), and every read sees the write acknowledged before it was sent.
/// A pipeline sent after the answers joins a round of its own.
#[test]
fn a_connections_pipelined_reads_share_one_join_of_a_round() {
    let (_one, cluster, leader) = group();
    let addr = cluster.nodes[&leader].client;
    let mut c = Resp::connect(addr, Duration::from_secs(10)).unwrap();
    let counts = || {
        let info = cluster_info(addr).expect("CLUSTER INFO");
        let n = |k: &str| info[k].parse::<u64>().unwrap();
        (n("raft_reads"), n("raft_read_rounds"))
    };
    let stat: Vec<&[u8]> = vec![b"LOG.STAT", b"s"];
    for pipeline in 1..=3i64 {
        assert_eq!(
            c.cmd(&[b"LOG.APPEND", b"s", b"1", b"x"]).unwrap(),
            Reply::Int(pipeline - 1)
        );
        let (joins, rounds) = counts();
        let replies = c.pipeline(&vec![stat.clone(); 200]).unwrap();
        for r in &replies {
            assert_eq!(next_offset(r), pipeline, "{r:?}");
        }
        let (joins_after, rounds_after) = counts();
        // One join, one round (two if the pipeline's bytes came in two
        // reads of the socket); one read each would be 200 joins.
        assert!(
            (1..=2).contains(&(joins_after - joins)),
            "200 pipelined reads joined {} times",
            joins_after - joins
        );
        assert!((1..=2).contains(&(rounds_after - rounds)));
    }
}
