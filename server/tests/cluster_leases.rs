//! Lease time in cluster mode is the log's, with real processes. What broke
//! before: after every node restarted, the old leader resumed its term with
//! its entries' clock back near 0, so a dead holder's 300 ms lease was still
//! "held for 300 ms" 1.5 s later and its expired owner's renewal was
//! accepted; a leader change revived a lease that had already run out (the
//! log never learned it expired); one committed acquisition past the live
//! lease limit stopped every replica for good; and cluster mode skipped the
//! lease ttl bounds. Replicas are compared by their digests after each test.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Reply, Resp};

/// One cluster at a time: several on two cores would time out each
/// other's elections.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `args` to the leader, following MOVED and waiting out TRYAGAIN,
/// CLUSTERDOWN and dead nodes, up to `timeout`; answers the first other
/// reply.
fn leader_cmd(cluster: &Cluster, args: &[&[u8]], timeout: Duration) -> Reply {
    let deadline = Instant::now() + timeout;
    loop {
        let leader = cluster.leader(deadline.saturating_duration_since(Instant::now()));
        let reply = Resp::connect(cluster.nodes[&leader].client, Duration::from_secs(2))
            .and_then(|mut c| c.cmd(args));
        match reply {
            Ok(Reply::Error(e))
                if e.starts_with("MOVED")
                    || e.starts_with("TRYAGAIN")
                    || e.starts_with("CLUSTERDOWN") => {}
            Ok(r) => return r,
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "no answer to {:?} within {timeout:?}\n{}",
            String::from_utf8_lossy(args[0]),
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn acquire(cluster: &Cluster, name: &str, owner: &str, ttl_ms: u64) -> Reply {
    let ttl = ttl_ms.to_string();
    leader_cmd(
        cluster,
        &[
            b"LEASE.ACQUIRE",
            name.as_bytes(),
            owner.as_bytes(),
            ttl.as_bytes(),
            b"FENCE",
        ],
        Duration::from_secs(20),
    )
}

fn granted(r: &Reply) -> Option<u64> {
    match r {
        Reply::Array(a) => match a.first() {
            Some(Reply::Int(t)) => Some(*t as u64),
            _ => None,
        },
        _ => None,
    }
}

fn renew(cluster: &Cluster, name: &str, owner: &str, token: u64, ttl_ms: u64) -> Reply {
    let (t, ttl) = (token.to_string(), ttl_ms.to_string());
    leader_cmd(
        cluster,
        &[
            b"LEASE.RENEW",
            name.as_bytes(),
            owner.as_bytes(),
            t.as_bytes(),
            ttl.as_bytes(),
        ],
        Duration::from_secs(20),
    )
}

fn assert_replicas_agree(cluster: &Cluster) {
    cluster.assert_replicas_agree(Duration::from_secs(30));
}

#[test]
fn after_every_node_restarts_a_dead_holders_lease_frees_within_its_ttl_and_one_failover() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &[]);
    let a = granted(&acquire(&cluster, "job", "a", 300)).expect("a's grant");
    // Time passes on the group's clock before the outage.
    std::thread::sleep(Duration::from_millis(1500));
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in &ids {
        cluster.kill(*id);
    }
    for id in &ids {
        cluster.restart(*id);
    }
    cluster.leader(Duration::from_secs(20));
    let led = Instant::now();
    // Another owner asks until granted: the lease a held was live as far
    // as the log knew, so the new leader holds it a full ttl from its
    // take-over, and not longer.
    let b = loop {
        let r = acquire(&cluster, "job", "b", 5_000);
        if let Some(t) = granted(&r) {
            break t;
        }
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("HELD")),
            "{r:?}"
        );
        assert!(
            led.elapsed() < Duration::from_millis(300 + 2_000),
            "still held {:?} after a leader was known\n{}",
            led.elapsed(),
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(b > a, "tokens increase across the restart: {a} then {b}");
    // The expired owner's renewal is refused.
    let r = renew(&cluster, "job", "a", a, 300);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("LOST")),
        "{r:?}"
    );
    assert_replicas_agree(&cluster);
}

#[test]
fn a_leader_change_after_a_lease_ran_out_does_not_revive_it() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &[]);
    let a = granted(&acquire(&cluster, "job", "a", 1_000)).expect("a's grant");
    // The lease runs out on the leader's clock; the leader puts its clock
    // in the log then.
    std::thread::sleep(Duration::from_millis(1_600));
    let leader = cluster.leader(Duration::from_secs(5));
    cluster.kill(leader);
    let r = acquire(&cluster, "job", "b", 5_000);
    let b = granted(&r).unwrap_or_else(|| panic!("b refused after a's lease ran out: {r:?}"));
    assert!(b > a);
    let r = renew(&cluster, "job", "a", a, 1_000);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("LOST")),
        "{r:?}"
    );
    cluster.restart(leader);
    assert_replicas_agree(&cluster);
}

#[test]
fn a_leader_change_holds_a_live_lease_and_its_holder_renews_across_it() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &[]);
    let a = granted(&acquire(&cluster, "job", "a", 3_000)).expect("a's grant");
    let leader = cluster.leader(Duration::from_secs(5));
    cluster.kill(leader);
    // Live when the leader died: held for its full ttl from the take-over.
    let r = acquire(&cluster, "job", "b", 5_000);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("HELD")),
        "{r:?}"
    );
    let r = renew(&cluster, "job", "a", a, 3_000);
    assert!(matches!(r, Reply::Int(3_000)), "{r:?}");
    cluster.restart(leader);
    assert_replicas_agree(&cluster);
}

#[test]
fn the_live_lease_limit_is_a_refusal_the_group_keeps_serving_and_restarts_clean() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &["--max-live-leases", "200"]);
    for i in 0..200 {
        let r = acquire(&cluster, &format!("l{i}"), "o", 3_600_000);
        assert!(granted(&r).is_some(), "lease {i}: {r:?}");
    }
    let r = acquire(&cluster, "one-more", "o", 3_600_000);
    assert!(
        matches!(&r, Reply::Error(e) if e.contains("200 live leases: the limit is 200")),
        "{r:?}"
    );
    // The group goes on: writes and other lease commands are answered.
    let r = leader_cmd(
        &cluster,
        &[b"LOG.APPEND", b"s", b"1", b"after the refusal"],
        Duration::from_secs(10),
    );
    assert!(matches!(r, Reply::Int(0)), "{r:?}");
    assert_replicas_agree(&cluster);
    // Every node starts again on the same data and refuses alike.
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in &ids {
        cluster.kill(*id);
    }
    for id in &ids {
        cluster.restart(*id);
    }
    let r = acquire(&cluster, "one-more", "o", 3_600_000);
    assert!(
        matches!(&r, Reply::Error(e) if e.contains("live leases")),
        "{r:?}"
    );
    let r = leader_cmd(
        &cluster,
        &[b"LEASE.RELEASE", b"l7", b"o", b"8"],
        Duration::from_secs(10),
    );
    assert!(matches!(r, Reply::Int(_)), "{r:?}");
    assert_replicas_agree(&cluster);
}

#[test]
fn cluster_mode_checks_the_lease_ttl_bounds_as_one_node_does() {
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    for ttl in ["0", "5", "315360000000"] {
        let r = leader_cmd(
            &cluster,
            &[b"LEASE.ACQUIRE", b"job", b"a", ttl.as_bytes()],
            Duration::from_secs(10),
        );
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("ERR") && e.contains("ttl")),
            "ttl {ttl}: {r:?}"
        );
    }
    let a = granted(&acquire(&cluster, "job", "a", 1_000)).expect("a's grant");
    let r = renew(&cluster, "job", "a", a, 0);
    assert!(matches!(&r, Reply::Error(e) if e.contains("ttl")), "{r:?}");
    assert_replicas_agree(&cluster);
}
