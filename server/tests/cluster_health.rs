//! What the `CLUSTER` commands say about the group's health, with real
//! processes. What was wrong: `CLUSTER SHARDS` called every member
//! `online` and `CLUSTER NODES` every member `connected`, a dead one too; a
//! leader cut off from its quorum went on naming itself the primary in
//! `CLUSTER SLOTS`; a removed leader answered `TRYAGAIN … an election is
//! in progress` for ever (redis-py's RedisCluster gives up after 16) and
//! still named itself; `raft_voters` said 1 on a node that knew no member.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Reply, Resp, cluster_info};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The default election timeout (ms) of the nodes the harness starts.
const ELECTION_TIMEOUT: Duration = Duration::from_millis(300);

fn name(id: u64) -> String {
    format!("{id:040x}")
}

fn cmd(cluster: &Cluster, id: u64, args: &[&[u8]]) -> Result<Reply, String> {
    Resp::connect(cluster.nodes[&id].client, Duration::from_secs(2))?.cmd(args)
}

fn text(r: &Reply) -> Option<String> {
    match r {
        Reply::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Reply::Simple(s) => Some(s.clone()),
        _ => None,
    }
}

/// Every text in a reply, flattened (the node names in `CLUSTER SLOTS`).
fn texts(r: &Reply) -> Vec<String> {
    match r {
        Reply::Array(items) => items.iter().flat_map(texts).collect(),
        other => text(other).into_iter().collect(),
    }
}

/// The primary (first node of the first range) `CLUSTER SLOTS` names.
fn slots_primary(r: &Reply) -> Option<String> {
    let Reply::Array(ranges) = r else { return None };
    let Some(Reply::Array(range)) = ranges.first() else {
        return None;
    };
    let Some(Reply::Array(node)) = range.get(2) else {
        return None;
    };
    node.get(2).and_then(text)
}

/// `CLUSTER SHARDS` of node `at`: each member's id and health.
fn shard_health(cluster: &Cluster, at: u64) -> Option<Vec<(String, String)>> {
    let Ok(Reply::Array(shards)) = cmd(cluster, at, &[b"CLUSTER", b"SHARDS"]) else {
        return None;
    };
    let Some(Reply::Array(shard)) = shards.first() else {
        return None;
    };
    let nodes = shard
        .chunks(2)
        .find(|kv| text(&kv[0]).as_deref() == Some("nodes"))?;
    let Reply::Array(nodes) = &nodes[1] else {
        return None;
    };
    let mut out = Vec::new();
    for n in nodes {
        let Reply::Array(fields) = n else { return None };
        let get = |k: &str| {
            fields
                .chunks(2)
                .find(|kv| text(&kv[0]).as_deref() == Some(k))
                .and_then(|kv| text(&kv[1]))
        };
        out.push((get("id")?, get("health")?));
    }
    Some(out)
}

/// `CLUSTER NODES` of node `at`: each member's id and flags.
fn node_flags(cluster: &Cluster, at: u64) -> Option<Vec<(String, String, String)>> {
    let Ok(Reply::Bulk(b)) = cmd(cluster, at, &[b"CLUSTER", b"NODES"]) else {
        return None;
    };
    Some(
        String::from_utf8_lossy(&b)
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f[0].to_string(), f[2].to_string(), f[7].to_string())
            })
            .collect(),
    )
}

/// Whether node `at`'s SHARDS and NODES both show member `id` failed
/// (`Some(true)`), both online (`Some(false)`), or disagree / do not
/// answer (`None`).
fn shown_failed(cluster: &Cluster, at: u64, id: u64) -> Option<bool> {
    let health = shard_health(cluster, at)?;
    let (_, h) = health.iter().find(|(n, _)| *n == name(id))?;
    let nodes = node_flags(cluster, at)?;
    let (_, flags, link) = nodes.iter().find(|(n, _, _)| *n == name(id))?;
    let failed = flags.split(',').any(|f| f == "fail");
    match (h.as_str(), failed, link.as_str()) {
        ("failed", true, "disconnected") => Some(true),
        ("online", false, "connected") => Some(false),
        _ => None,
    }
}

/// Polls until `f` holds, answering when it first did; panics after
/// `timeout`.
fn until(
    what: &str,
    cluster: &Cluster,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "{what}: not within {timeout:?}\n{:?}\n{}",
            cluster
                .nodes
                .keys()
                .map(|&id| (id, shard_health(cluster, id), node_flags(cluster, id)))
                .collect::<Vec<_>>(),
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every node's `raft_voters` is the number of voters its membership
/// lists (0 while it knows none).
fn assert_voters_true(cluster: &Cluster) {
    for (id, info) in cluster.infos() {
        let listed = info
            .iter()
            .filter(|(k, v)| k.starts_with("raft_member_") && v.ends_with("voter=1"))
            .count();
        assert_eq!(
            info.get("raft_voters").map(String::as_str),
            Some(listed.to_string().as_str()),
            "node {id}: {info:?}"
        );
    }
}

#[test]
fn a_dead_follower_is_shown_failed_by_the_leader_and_online_again_once_back() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let follower = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    let other = *cluster
        .nodes
        .keys()
        .find(|&&id| id != leader && id != follower)
        .unwrap();
    until(
        "every member online",
        &cluster,
        Duration::from_secs(5),
        || {
            cluster
                .nodes
                .keys()
                .all(|&id| shown_failed(&cluster, leader, id) == Some(false))
        },
    );
    // A follower sees its leader online.
    until(
        "a follower shows its leader online",
        &cluster,
        Duration::from_secs(5),
        || shown_failed(&cluster, follower, leader) == Some(false),
    );

    cluster.kill(follower);
    let took = until(
        "the leader shows the dead follower failed",
        &cluster,
        Duration::from_secs(5),
        || shown_failed(&cluster, leader, follower) == Some(true),
    );
    // Heard from for the last time up to a heartbeat (½ T) before the
    // kill; failed after the top of the timeout range (1.5 T).
    assert!(took < 2 * ELECTION_TIMEOUT + ELECTION_TIMEOUT, "{took:?}");
    assert_eq!(shown_failed(&cluster, leader, other), Some(false));
    assert_eq!(shown_failed(&cluster, leader, leader), Some(false));
    let info = cluster_info(cluster.nodes[&leader].client).unwrap();
    assert!(
        info[&format!("raft_health_{follower}")].starts_with("failed,"),
        "{info:?}"
    );
    // The group still serves: a quorum is there.
    assert_eq!(info["cluster_state"], "ok");

    cluster.restart(follower);
    until(
        "the leader shows the restarted follower online",
        &cluster,
        Duration::from_secs(10),
        || shown_failed(&cluster, leader, follower) == Some(false),
    );
    cluster.assert_replicas_agree(Duration::from_secs(20));
}

#[test]
fn a_leader_cut_off_from_its_quorum_names_no_primary_and_sends_clients_away() {
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let slots = |id: u64| cmd(&cluster, id, &[b"CLUSTER", b"SLOTS"]);
    // Before the cut it names itself.
    let before = slots(leader).unwrap();
    assert_eq!(slots_primary(&before), Some(name(leader)), "{before:?}");
    let at = Instant::now();
    cluster.isolate(leader);
    // Within two election timeouts of the cut (its last heartbeat round
    // answered up to ½ T before), it names no primary.
    let took = until(
        "the cut-off leader stops naming itself",
        &cluster,
        Duration::from_secs(5),
        || matches!(slots(leader), Ok(Reply::Error(e)) if e.starts_with("CLUSTERDOWN")),
    );
    assert!(took < 3 * ELECTION_TIMEOUT, "{took:?}");
    // And goes on naming none, through its stepping down, until a leader
    // reaches it; it answers data commands with no write attempted.
    let until_at = at + Duration::from_secs(3);
    while Instant::now() < until_at {
        match slots(leader) {
            Ok(Reply::Error(e)) if e.starts_with("CLUSTERDOWN") => {}
            other => panic!("CLUSTER SLOTS on the cut-off node: {other:?}"),
        }
        let r = cmd(&cluster, leader, &[b"LOG.FENCE", b"s", b"5"]).unwrap();
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("CLUSTERDOWN this node led but no quorum")),
            "{r:?}"
        );
        let r = cmd(&cluster, leader, &[b"LOG.READ", b"s", b"0"]).unwrap();
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("CLUSTERDOWN this node led but no quorum")),
            "{r:?}"
        );
        let info = cluster_info(cluster.nodes[&leader].client).unwrap();
        assert_eq!(info["cluster_state"], "fail", "{info:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The majority elected another, which its members name.
    let others: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|&id| id != leader)
        .collect();
    let mut new_leader = None;
    until(
        "the majority names a new leader",
        &cluster,
        Duration::from_secs(5),
        || {
            new_leader = others.iter().copied().find(|&id| {
                cluster_info(cluster.nodes[&id].client)
                    .is_some_and(|i| i.get("raft_state").is_some_and(|s| s == "leader"))
            });
            new_leader.is_some()
        },
    );
    let new_leader = new_leader.unwrap();
    // It sees the cut-off node failed.
    until(
        "the new leader shows the cut-off node failed",
        &cluster,
        Duration::from_secs(5),
        || shown_failed(&cluster, new_leader, leader) == Some(true),
    );
    cluster.heal();
    // Healed, the old leader follows and names the new one.
    until(
        "the healed node names the new leader",
        &cluster,
        Duration::from_secs(10),
        || slots(leader).is_ok_and(|r| slots_primary(&r) == Some(name(new_leader))),
    );
    cluster.assert_replicas_agree(Duration::from_secs(20));
}

/// The reply node `id` gives a data command now.
fn data_reply(cluster: &Cluster, id: u64) -> Reply {
    cmd(cluster, id, &[b"LOG.STAT", b"jobs"]).unwrap_or_else(|e| Reply::Error(format!("io: {e}")))
}

#[test]
fn a_removed_leader_sends_its_clients_on_and_never_campaigns() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let client_of = |id: u64| cluster.nodes[&id].client.to_string();
    let ok = cmd(
        &cluster,
        leader,
        &[b"CLUSTER", b"REMOVENODE", leader.to_string().as_bytes()],
    )
    .unwrap();
    assert_eq!(ok, Reply::Simple("OK".into()), "{}", cluster.logs());
    let removed_at = Instant::now();
    let others: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|&id| id != leader)
        .collect();
    // For several election timeouts the removed node answers every data
    // command with MOVED (to a leader that is not itself) or a clear
    // CLUSTERDOWN; never TRYAGAIN, never itself.
    while removed_at.elapsed() < Duration::from_secs(4) {
        match data_reply(&cluster, leader) {
            Reply::Error(e) if e.starts_with("MOVED") => {
                let to = e.rsplit(' ').next().unwrap().to_string();
                assert_ne!(to, client_of(leader), "{e}");
            }
            Reply::Error(e) if e.starts_with("CLUSTERDOWN this node was removed") => {}
            other => panic!("the removed node answered {other:?}\n{}", cluster.logs()),
        }
        match cmd(&cluster, leader, &[b"CLUSTER", b"SLOTS"]).unwrap() {
            Reply::Error(e) => assert!(e.starts_with("CLUSTERDOWN this node was removed"), "{e}"),
            other => assert!(!texts(&other).contains(&name(leader)), "{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let info = cluster_info(cluster.nodes[&leader].client).unwrap();
    assert_eq!(info["raft_removed"], "1", "{info:?}");
    assert_ne!(info["raft_state"], "leader", "{info:?}");
    assert_ne!(info["raft_state"], "candidate", "{info:?}");
    let term: u64 = info["raft_term"].parse().unwrap();
    // The two left elected one of themselves.
    let mut new_leader = None;
    until(
        "the two left elect a leader",
        &cluster,
        Duration::from_secs(10),
        || {
            new_leader = others.iter().copied().find(|&id| {
                cluster_info(cluster.nodes[&id].client)
                    .is_some_and(|i| i.get("raft_state").is_some_and(|s| s == "leader"))
            });
            new_leader.is_some()
        },
    );
    let new_leader = new_leader.unwrap();
    // The removed node does not campaign: its term stays.
    std::thread::sleep(4 * ELECTION_TIMEOUT);
    let info = cluster_info(cluster.nodes[&leader].client).unwrap();
    assert_eq!(info["raft_term"].parse::<u64>().unwrap(), term, "{info:?}");
    let ninfo = cluster_info(cluster.nodes[&new_leader].client).unwrap();
    assert_eq!(ninfo["raft_voters"], "2", "{ninfo:?}");
    assert!(!ninfo.contains_key(&format!("raft_member_{leader}")));

    // redis-py's RedisCluster that knows the removed node first is sent on.
    if let Some(python) = common::python_with_redis_py() {
        let mut nodes = vec![client_of(leader)];
        nodes.extend(others.iter().map(|&id| client_of(id)));
        let script = format!(
            r#"
import sys, time
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterDownError, ClusterError, ConnectionError, TimeoutError, TryAgainError
nodes = [ClusterNode(a.rsplit(':', 1)[0], int(a.rsplit(':', 1)[1])) for a in {nodes:?}]
rc = RedisCluster(startup_nodes=nodes, socket_timeout=5)
deadline = time.monotonic() + 20
while True:
    try:
        print(rc.execute_command('LOG.FENCE', 'jobs', 7))
        break
    except (ConnectionError, TimeoutError, ClusterDownError, TryAgainError, ClusterError) as e:
        if time.monotonic() > deadline:
            raise
        print(type(e).__name__, e, file=sys.stderr)
        time.sleep(0.1)
print(rc.get_node_from_key('jobs').port)
"#
        );
        let out = common::run_python(&python, &script);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.first(), Some(&"7"), "{out}");
        assert_eq!(
            lines.get(1).copied(),
            Some(
                cluster.nodes[&new_leader]
                    .client
                    .port()
                    .to_string()
                    .as_str()
            ),
            "{out}"
        );
    }
    // The removed node stays behind for good: the two left agree.
    cluster.kill(leader);
    cluster.assert_replicas_agree(Duration::from_secs(20));
}

#[test]
fn a_removed_follower_sends_its_clients_to_the_leader() {
    let _serial = serial();
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let follower = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    let term = cluster_info(cluster.nodes[&leader].client).unwrap()["raft_term"].clone();
    let ok = cmd(
        &cluster,
        leader,
        &[b"CLUSTER", b"REMOVENODE", follower.to_string().as_bytes()],
    )
    .unwrap();
    assert_eq!(ok, Reply::Simple("OK".into()));
    let to = format!(" {}", cluster.nodes[&leader].client);
    let start = Instant::now();
    let mut seen_moved = false;
    while start.elapsed() < Duration::from_secs(3) {
        match data_reply(&cluster, follower) {
            Reply::Error(e) if e.starts_with("MOVED ") && e.ends_with(&to) => seen_moved = true,
            Reply::Error(e) if e.starts_with("CLUSTERDOWN this node was removed") => {}
            other => panic!("the removed follower answered {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen_moved, "{}", cluster.logs());
    // It may not know it was removed (the leader stops replicating to it
    // once the change commits, perhaps before it had the change), so
    // it follows the leader it knows; it never stands: its term stays.
    let info = cluster_info(cluster.nodes[&follower].client).unwrap();
    assert_eq!(info["raft_term"], term, "{info:?}");
    assert_eq!(info["raft_leader"], leader.to_string(), "{info:?}");
    let linfo = cluster_info(cluster.nodes[&leader].client).unwrap();
    assert_eq!(linfo["raft_voters"], "2", "{linfo:?}");
    assert_eq!(linfo["cluster_state"], "ok", "{linfo:?}");
}

#[test]
fn raft_voters_tells_the_truth_while_a_wiped_node_rejoins() {
    let _serial = serial();
    let mut cluster = Cluster::start(3, &[]);
    let leader = cluster.leader(Duration::from_secs(10));
    let follower = *cluster.nodes.keys().find(|&&id| id != leader).unwrap();
    assert_voters_true(&cluster);
    cluster.wipe_and_rejoin(follower);
    // While it rejoins (taken out of the voters, added back as a learner,
    // caught up, promoted), every node's count matches its membership.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        assert_voters_true(&cluster);
        std::thread::sleep(Duration::from_millis(20));
    }
    until(
        "the wiped node is a voter again",
        &cluster,
        Duration::from_secs(30),
        || {
            cluster_info(cluster.nodes[&follower].client)
                .is_some_and(|i| i.get("raft_voters").map(String::as_str) == Some("3"))
        },
    );
    assert_voters_true(&cluster);
    cluster.assert_replicas_agree(Duration::from_secs(20));
}
