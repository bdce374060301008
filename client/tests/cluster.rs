//! Three real nodes (`fencelog cluster local --nodes 3`): the client finds
//! the leader with `CLUSTER SLOTS`, and a client that only knows a follower
//! follows its `-MOVED` to the leader and remembers it. A client that did
//! not would see every write refused by the followers.

mod common;

use std::time::Duration;

use fencelog_client::{Client, Config, Error, LeaseOptions};

#[tokio::test]
async fn the_client_finds_and_follows_the_leader() {
    let Some(cluster) = common::Server::start_cluster(3) else {
        return;
    };
    let base: u16 = cluster.addr.rsplit(':').next().unwrap().parse().unwrap();
    let nodes: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();

    // Seeds are every node; the first writes wait out the election
    // (TRYAGAIN) within the retry time.
    let config = Config {
        seeds: nodes.clone(),
        retry_total: Duration::from_secs(20),
        ..Config::default()
    };
    let a = Client::connect(config.clone()).await.unwrap();
    // A first grant, so the lease's token has an older one below it.
    a.acquire(
        "other",
        "worker-a",
        Duration::from_secs(5),
        &LeaseOptions::default(),
    )
    .await
    .unwrap();
    let lease = a
        .lease(
            "jobs",
            "worker-a",
            Duration::from_secs(5),
            LeaseOptions {
                fence: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(lease.append("jobs", &["a1"]).await.unwrap(), 0);
    let leader = a.leader().expect("a leader is known");
    assert!(nodes.contains(&leader), "{leader} {nodes:?}");

    // A client that knows only a follower, and does not ask CLUSTER SLOTS:
    // its first command gets -MOVED and goes on to the leader.
    let follower = nodes.iter().find(|n| **n != leader).unwrap().clone();
    let b = Client::connect(Config {
        seeds: vec![follower.clone()],
        discover_leader: false,
        ..config
    })
    .await
    .unwrap();
    assert_eq!(b.leader(), None);
    assert_eq!(b.stat("jobs").await.unwrap().records, 1);
    assert_eq!(
        b.leader().as_deref(),
        Some(leader.as_str()),
        "MOVED was remembered"
    );
    match b.append("jobs", lease.token() - 1, &["stale"]).await {
        Err(Error::Stale { presented, highest }) => {
            assert_eq!((presented + 1, highest), (lease.token(), lease.token()))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.append_at("jobs", lease.token(), 1, &["a2"])
            .await
            .unwrap(),
        1
    );
    let records = a.read("jobs", 0, 10).await.unwrap();
    assert_eq!(records.len(), 2);
    assert!(lease.release().await.unwrap());
}

/// The pid of the `cluster local` node serving clients on `addr`.
fn node_pid(parent: u32, addr: &str) -> u32 {
    let out = std::process::Command::new("pgrep")
        .args(["-P", &parent.to_string()])
        .output()
        .unwrap();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if args
            .windows(2)
            .any(|w| w[0] == b"--addr" && w[1] == addr.as_bytes())
        {
            return pid.parse().unwrap();
        }
    }
    panic!("no node of {parent} serves {addr}");
}

/// The leader is killed (SIGKILL) while a lease is held: the same client
/// finds the new leader (refused connections, TRYAGAIN, MOVED), the keeper
/// holds the lease through the change, and writes go on with its token.
#[tokio::test]
async fn a_lease_survives_a_leader_kill() {
    let Some(cluster) = common::Server::start_cluster(3) else {
        return;
    };
    let base: u16 = cluster.addr.rsplit(':').next().unwrap().parse().unwrap();
    let nodes: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    let config = Config {
        seeds: nodes.clone(),
        retry_total: Duration::from_secs(20),
        ..Config::default()
    };
    let c = Client::connect(config).await.unwrap();
    let lease = c
        .lease(
            "jobs",
            "worker-a",
            Duration::from_secs(6),
            LeaseOptions {
                fence: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(lease.append("jobs", &["before"]).await.unwrap(), 0);
    let old = c.leader().unwrap();

    let pid = node_pid(cluster.child.id(), &old);
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    assert_eq!(lease.append("jobs", &["after"]).await.unwrap(), 1);
    let new = c.leader().unwrap();
    assert_ne!(new, old, "the write went to a new leader");
    // Two more ttl thirds: the keeper renews through the new leader.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!lease.is_lost(), "{:?}", lease.loss());
    let info = c.lease_info("jobs").await.unwrap().unwrap();
    assert_eq!(info.token, lease.token());
    let records = c.read("jobs", 0, 10).await.unwrap();
    let payloads: Vec<&[u8]> = records.iter().map(|r| r.payload.as_ref()).collect();
    assert_eq!(payloads, vec![&b"before"[..], b"after"]);
    assert!(lease.release().await.unwrap());
}
