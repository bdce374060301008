//! Partitions that leave a majority connected, with real processes and a
//! proxy on every Raft link. What broke: a leader that could send but not
//! hear acknowledged nothing for a whole 12.6 s cut (its followers kept
//! getting heartbeats and never elected, and it never stepped down); a
//! follower cut off for 10 s came back at term ~22 and deposed a healthy
//! leader; writes sent to an isolated leader hung until the heal. Now:
//! PreVote keeps a cut-off node's term where it was, and CheckQuorum makes
//! a leader that hears no quorum step down.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Reply, Resp, cluster_info};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The term and leader node `id` reports.
fn term_and_state(cluster: &Cluster, id: u64) -> Option<(u64, String)> {
    let info = cluster_info(cluster.nodes[&id].client)?;
    Some((
        info.get("raft_term")?.parse().ok()?,
        info.get("raft_state")?.clone(),
    ))
}

/// Time until a write is acknowledged by a node other than `not`,
/// trying each in turn (as a client that follows MOVED would).
fn time_to_write_elsewhere(cluster: &Cluster, not: u64, from: Instant) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for n in cluster.nodes.values().filter(|n| n.id != not) {
            if let Ok(mut c) = Resp::connect(n.client, Duration::from_millis(500))
                && let Ok(Reply::Int(_)) = c.cmd(&[b"LOG.FENCE", b"probe", b"1"])
            {
                return from.elapsed();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no write acknowledged by the majority in 20 s\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_follower_cut_off_for_a_while_does_not_depose_the_healthy_leader() {
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let (term, _) = term_and_state(&cluster, leader).expect("the leader answers");
    let follower = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    // Many election timeouts (300 ms) cut off.
    cluster.isolate(follower);
    std::thread::sleep(Duration::from_secs(4));
    let (cut_term, _) = term_and_state(&cluster, follower).expect("the follower answers");
    assert_eq!(
        cut_term, term,
        "a node cut off raised its term (no pre-vote)"
    );
    cluster.heal();
    // Well past a heartbeat and an election timeout after the heal: the
    // same leader, the same term.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let (t, state) = term_and_state(&cluster, leader).expect("the leader answers");
        assert_eq!(
            (t, state.as_str()),
            (term, "leader"),
            "the healed follower deposed the leader\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.assert_replicas_agree(Duration::from_secs(20));
}

#[test]
fn an_isolated_leader_steps_down_and_the_majority_writes_within_two_seconds() {
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let at = Instant::now();
    cluster.isolate(leader);
    let took = time_to_write_elsewhere(&cluster, leader, at);
    assert!(
        took < Duration::from_secs(2),
        "the majority acknowledged its first write {took:?} after the cut"
    );
    // The isolated node answers its clients at once, and no longer leads
    // within two election timeouts (600 ms) of having heard no quorum.
    let until = at + Duration::from_secs(3);
    let mut stepped_down = None;
    while Instant::now() < until {
        if let Some((_, state)) = term_and_state(&cluster, leader)
            && state != "leader"
        {
            stepped_down = Some(at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stepped_down = stepped_down.expect("the isolated leader still leads 3 s later");
    assert!(
        stepped_down < Duration::from_millis(1_500),
        "{stepped_down:?}"
    );
    let mut c = Resp::connect(cluster.nodes[&leader].client, Duration::from_secs(2)).unwrap();
    let asked = Instant::now();
    let r = c.cmd(&[b"LOG.FENCE", b"s", b"5"]).unwrap();
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("TRYAGAIN") || e.starts_with("MOVED") || e.starts_with("CLUSTERDOWN")),
        "{r:?}"
    );
    assert!(asked.elapsed() < Duration::from_millis(500));
    cluster.heal();
    cluster.assert_replicas_agree(Duration::from_secs(20));
}

#[test]
fn a_leader_that_can_send_but_not_hear_is_replaced_within_two_seconds() {
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let at = Instant::now();
    cluster.deafen(leader);
    let took = time_to_write_elsewhere(&cluster, leader, at);
    assert!(
        took < Duration::from_secs(2),
        "the majority acknowledged its first write {took:?} after a one-way cut\n{}",
        cluster.logs()
    );
    cluster.heal();
    let new_leader = cluster.leader(Duration::from_secs(10));
    let (term, _) = term_and_state(&cluster, new_leader).unwrap();
    // The old leader, healed, follows: it deposes no one.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        term_and_state(&cluster, new_leader),
        Some((term, "leader".to_string())),
        "\n{}",
        cluster.logs()
    );
    cluster.assert_replicas_agree(Duration::from_secs(20));
}
