//! The README's lock workflow through the cluster clients of Redis client
//! libraries, unmodified, against a 3-node cluster of real processes, and
//! across a leader change (SIGKILL): redis-py's `RedisCluster`, the `redis`
//! crate's `ClusterClient` and ioredis' `Cluster`.
//!
//! Each one acquires a lease with FENCE, appends with its token, sees a
//! stale token rejected (`STALE`); then the leader is killed and the same
//! client object goes on: the lease that was held survives the change and
//! is renewed, a newer token is granted and appends, and the tokens from
//! before the failover are still rejected. The records are read back.
//!
//! What could break: a client that cannot route our commands (redis-py
//! finds a command's keys in `COMMAND`'s output), that cannot parse
//! `CLUSTER SLOTS`, or that never finds the new leader after the old one
//! died. Every failure prints the cluster's logs. Every wait is bounded.
//!
//! redis-py and ioredis are installed by `.ci/run` under the target
//! directory; a test whose library is missing fails in CI and is skipped,
//! with the reason printed, elsewhere.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{Cluster, Reply, Resp};

/// One cluster at a time: several on two cores would time out each
/// other's elections.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long a whole client workflow may take.
const WORKFLOW_TIMEOUT: Duration = Duration::from_secs(120);

/// Prints every node's log if the test fails while it is alive.
struct LogsOnFailure(Vec<(u64, Arc<Mutex<String>>)>);

impl LogsOnFailure {
    fn new(c: &Cluster) -> LogsOnFailure {
        LogsOnFailure(c.nodes.values().map(|n| (n.id, n.log.clone())).collect())
    }
}

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (id, log) in &self.0 {
                eprintln!("--- node {id} ---\n{}", log.lock().unwrap());
            }
        }
    }
}

/// A 3-node cluster whose every node has applied the leader's log (so
/// each knows the members and the leader before a client asks it).
fn start_cluster() -> (Cluster, LogsOnFailure) {
    let cluster = Cluster::start(3, &[]);
    let logs = LogsOnFailure::new(&cluster);
    cluster.converge(Duration::from_secs(20));
    (cluster, logs)
}

fn client_addrs(c: &Cluster) -> Vec<SocketAddr> {
    c.nodes.values().map(|n| n.client).collect()
}

/// Kills the leader (SIGKILL) and answers its id and client address.
fn kill_leader(c: &mut Cluster) -> (u64, SocketAddr) {
    let leader = c.leader(Duration::from_secs(10));
    let addr = c.nodes[&leader].client;
    c.kill(leader);
    eprintln!("killed node {leader} ({addr}), the leader");
    (leader, addr)
}

/// The stream `jobs` as the current leader has it: `[offset, token,
/// payload]` each, read with a plain RESP client.
fn records_on_leader(c: &Cluster) -> Vec<(i64, i64, String)> {
    let leader = c.leader(Duration::from_secs(10));
    let mut r = Resp::connect(c.nodes[&leader].client, Duration::from_secs(5)).unwrap();
    match r.cmd(&[b"LOG.READ", b"jobs", b"0", b"COUNT", b"100"]) {
        Ok(Reply::Array(records)) => records
            .iter()
            .map(|rec| match rec {
                Reply::Array(f) => match f.as_slice() {
                    [Reply::Int(o), Reply::Int(t), Reply::Bulk(p)] => {
                        (*o, *t, String::from_utf8_lossy(p).to_string())
                    }
                    other => panic!("a record: {other:?}"),
                },
                other => panic!("a record: {other:?}"),
            })
            .collect(),
        other => panic!("LOG.READ on the leader: {other:?}"),
    }
}

/// What every client's workflow leaves in `jobs`, given its tokens.
fn expected_records(ta: i64, tb: i64, tc: i64) -> Vec<(i64, i64, String)> {
    vec![
        (0, ta, "a1".to_string()),
        (1, tb, "b1".to_string()),
        (2, tb, "b2".to_string()),
        (3, tc, "c1".to_string()),
    ]
}

/// A client script's process: its stdout line by line, its stderr kept
/// for a failure's message; killed on drop.
struct Script {
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    deadline: Instant,
}

impl Script {
    fn spawn(mut cmd: Command) -> Script {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the client script starts");
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let (err, stream) = (stderr.clone(), child.stderr.take().unwrap());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let mut e = err.lock().unwrap();
                    e.push_str(&line);
                    e.push('\n');
                }
            });
        }
        Script {
            child,
            lines,
            stderr,
            deadline: Instant::now() + WORKFLOW_TIMEOUT,
        }
    }

    /// The next line it prints; panics (with its stderr) if it exits or
    /// the workflow's time runs out first.
    fn line(&mut self) -> String {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                panic!(
                    "the client script is silent past {WORKFLOW_TIMEOUT:?}:\n{}",
                    self.err()
                )
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait();
                panic!("the client script ended ({status:?}):\n{}", self.err())
            }
        }
    }

    fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for a successful exit.
    fn finish(&mut self) {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "the client script failed:\n{}",
                    self.err()
                );
                return;
            }
            assert!(
                Instant::now() < self.deadline,
                "the client script did not exit:\n{}",
                self.err()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn err(&self) -> String {
        // Let the reader thread take in the last lines.
        std::thread::sleep(Duration::from_millis(100));
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Drives a script that runs phase 1, prints `KILL <primary host:port>`,
/// waits for `KILLED`, runs phase 2 and prints a JSON summary last; checks
/// the summary and the leader's copy of the stream.
fn drive_script(cluster: &mut Cluster, cmd: Command) {
    let mut script = Script::spawn(cmd);
    let line = script.line();
    let primary = line
        .strip_prefix("KILL ")
        .unwrap_or_else(|| panic!("expected KILL, got {line:?}:\n{}", script.err()));
    let (_, killed) = kill_leader(cluster);
    assert_eq!(
        primary,
        killed.to_string(),
        "the client's primary is not the leader"
    );
    script.tell("KILLED");
    let summary = script.line();
    script.finish();
    eprintln!("client log:\n{}", script.err());
    let summary: serde_json::Value =
        serde_json::from_str(&summary).unwrap_or_else(|e| panic!("the summary {summary:?}: {e}"));
    let (ta, tb, tc) = (
        summary["ta"].as_i64().unwrap(),
        summary["tb"].as_i64().unwrap(),
        summary["tc"].as_i64().unwrap(),
    );
    assert!(ta < tb && tb < tc, "{summary}");
    let read: Vec<(i64, i64, String)> = summary["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap(),
                r[1].as_i64().unwrap(),
                r[2].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(read, expected_records(ta, tb, tc), "what the client read");
    assert_eq!(
        records_on_leader(cluster),
        expected_records(ta, tb, tc),
        "what the new leader holds"
    );
}

#[test]
fn redis_py_redis_cluster_runs_the_lock_workflow_across_a_leader_change() {
    let Some(python) = common::python_with_redis_py() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut cluster, _logs) = start_cluster();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/redis_py_cluster.py");
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .args(client_addrs(&cluster).iter().map(|a| a.to_string()));
    drive_script(&mut cluster, cmd);
}

/// Runs `f` until it answers something other than a transient error, for
/// at most 30 s; only for calls whose retry is harmless (reads,
/// `LOG.APPENDAT`, renewals, acquisitions by the same owner, a stale
/// write). Transient: no connection, a timeout, `TRYAGAIN`,
/// `CLUSTERDOWN`, `MOVED` past the client's own retries, `UNCERTAIN`.
///
/// The `redis` crate's synchronous cluster connection keeps routing a
/// slot to the address its slot map names, and refreshes that map only on
/// `MOVED`: once the leader is dead, every retry goes to the dead address.
/// A connection error therefore makes a new connection from the client
/// (which reads `CLUSTER SLOTS` again), as an application would.
fn retrying<T>(
    what: &str,
    client: &redis::cluster::ClusterClient,
    con: &mut redis::cluster::ClusterConnection,
    mut f: impl FnMut(&mut redis::cluster::ClusterConnection) -> redis::RedisResult<T>,
) -> redis::RedisResult<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let e = match f(con) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let transient = match e.code() {
            None => true,
            Some(code) => matches!(code, "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "UNCERTAIN"),
        };
        if !transient {
            return Err(e);
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no answer within 30 s, last: {e}"
        );
        eprintln!("{what}: attempt {attempt}: {e} ({:?}); again", e.kind());
        if e.is_io_error() || e.code().is_none() {
            match client.get_connection() {
                Ok(fresh) => *con = fresh,
                Err(e) => eprintln!("{what}: a new connection: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_redis_crate_cluster_client_runs_the_lock_workflow_across_a_leader_change() {
    use redis::RedisResult;
    use redis::cluster::{ClusterClient, ClusterConnection};

    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut cluster, _logs) = start_cluster();
    let urls: Vec<String> = client_addrs(&cluster)
        .iter()
        .map(|a| format!("redis://{a}/"))
        .collect();
    let client = ClusterClient::builder(urls)
        .retries(8)
        .min_retry_wait(20)
        .max_retry_wait(500)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut con = client.get_connection().unwrap();

    let acquire =
        |con: &mut ClusterConnection, owner: &str, ttl_ms: i64| -> RedisResult<(i64, i64)> {
            redis::cmd("LEASE.ACQUIRE")
                .arg("jobs")
                .arg(owner)
                .arg(ttl_ms)
                .arg("FENCE")
                .query(con)
        };
    let append = |con: &mut ClusterConnection, token: i64, p: &str| -> RedisResult<i64> {
        redis::cmd("LOG.APPEND")
            .arg("jobs")
            .arg(token)
            .arg(p)
            .query(con)
    };
    let append_at =
        |con: &mut ClusterConnection, token: i64, at: i64, p: &str| -> RedisResult<i64> {
            redis::cmd("LOG.APPENDAT")
                .arg("jobs")
                .arg(token)
                .arg(at)
                .arg(p)
                .query(con)
        };
    let expect_stale = |r: RedisResult<i64>, token: i64, highest: i64| {
        let e = r.expect_err("a stale append was accepted");
        assert_eq!(e.code(), Some("STALE"), "{e}");
        assert!(
            e.to_string().contains(&format!(
                "token {token} is below the highest accepted token {highest}"
            )),
            "{e}"
        );
    };

    // The key the server names for a command (COMMAND GETKEYS) is the one
    // this client routes by: the first argument.
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("LEASE.ACQUIRE")
        .arg("jobs")
        .arg("worker-a")
        .arg(500)
        .arg("FENCE")
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["jobs"]);

    // Phase 1: A holds the lease, writes, stalls past its ttl; B takes over.
    let (ta, ttl) = acquire(&mut con, "worker-a", 500).unwrap();
    assert_eq!(ttl, 500);
    assert_eq!(append(&mut con, ta, "a1").unwrap(), 0);
    std::thread::sleep(Duration::from_millis(700));
    let (tb, _) = acquire(&mut con, "worker-b", 30_000).unwrap();
    assert!(tb > ta);
    assert_eq!(append(&mut con, tb, "b1").unwrap(), 1);
    expect_stale(append(&mut con, ta, "a2 late"), ta, tb);
    let lost: RedisResult<i64> = redis::cmd("LEASE.RENEW")
        .arg("jobs")
        .arg("worker-a")
        .arg(ta)
        .arg(500)
        .query(&mut con);
    assert_eq!(lost.unwrap_err().code(), Some("LOST"));

    let (old_leader, _) = kill_leader(&mut cluster);

    // Phase 2, the same client.
    expect_stale(
        retrying("A's append", &client, &mut con, |c| {
            append(c, ta, "a3 later")
        }),
        ta,
        tb,
    );
    let renewed: i64 = retrying("B's renewal", &client, &mut con, |c| {
        redis::cmd("LEASE.RENEW")
            .arg("jobs")
            .arg("worker-b")
            .arg(tb)
            .arg(30_000)
            .query(c)
    })
    .unwrap();
    assert_eq!(renewed, 30_000, "B's lease survived the leader change");
    assert_eq!(
        retrying("B's append", &client, &mut con, |c| append_at(
            c, tb, 2, "b2"
        ))
        .unwrap(),
        2
    );
    let released: i64 = retrying("B's release", &client, &mut con, |c| {
        redis::cmd("LEASE.RELEASE")
            .arg("jobs")
            .arg("worker-b")
            .arg(tb)
            .query(c)
    })
    .unwrap();
    assert_eq!(released, 1);
    let (tc, _) = retrying("C's acquire", &client, &mut con, |c| {
        acquire(c, "worker-c", 30_000)
    })
    .unwrap();
    assert!(
        tc > tb,
        "tokens grow across the leader change: {tb} then {tc}"
    );
    assert_eq!(
        retrying("C's append", &client, &mut con, |c| append_at(
            c, tc, 3, "c1"
        ))
        .unwrap(),
        3
    );
    expect_stale(append(&mut con, ta, "late"), ta, tc);
    expect_stale(append(&mut con, tb, "late"), tb, tc);
    let info: (String, i64, i64) = redis::cmd("LEASE.INFO")
        .arg("jobs")
        .query(&mut con)
        .unwrap();
    assert_eq!((info.0.as_str(), info.1), ("worker-c", tc));
    let read: Vec<(i64, i64, String)> = retrying("read", &client, &mut con, |c| {
        redis::cmd("LOG.READ")
            .arg("jobs")
            .arg(0)
            .arg("COUNT")
            .arg(100)
            .query(c)
    })
    .unwrap();
    assert_eq!(read, expected_records(ta, tb, tc), "what the client read");
    assert_ne!(cluster.leader(Duration::from_secs(10)), old_leader);
    assert_eq!(records_on_leader(&cluster), expected_records(ta, tb, tc));
}

#[test]
fn ioredis_cluster_runs_the_lock_workflow_across_a_leader_change() {
    let Some(node_path) = common::node_with_ioredis() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (mut cluster, _logs) = start_cluster();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ioredis_cluster.js");
    let mut cmd = Command::new("node");
    cmd.arg(script)
        .args(client_addrs(&cluster).iter().map(|a| a.to_string()))
        .env("NODE_PATH", node_path);
    drive_script(&mut cluster, cmd);
}

/// A node that no leader has reached yet (here: started with
/// `--cluster-initial`, not the lowest id, and nobody else running) knows
/// no member. It answered `CLUSTER SLOTS` with itself as the primary of
/// every slot and no replica, and ioredis, asking it first, took that for
/// the whole cluster. Now it claims nothing, and a client asks another
/// node.
#[test]
fn a_node_no_leader_reached_yet_claims_no_slot() {
    use common::Value;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (raft1, client1, raft2, client2) = (free(), free(), free(), free());
    let dir = tempfile::tempdir().unwrap();
    let initial = format!("1={raft1}/{client1},2={raft2}/{client2}");
    let server = common::ServerProcess::start(
        dir.path(),
        &[
            "--cluster-node-id",
            "2",
            "--cluster-raft-addr",
            &raft2.to_string(),
            "--cluster-initial",
            &initial,
        ],
    );
    server.wait_for_log("cluster_waiting");
    let mut c = server.client();
    for sub in ["SLOTS", "SHARDS"] {
        let reply = c.cmd(&["CLUSTER", sub]);
        assert!(
            matches!(&reply, Value::Error(e) if e.starts_with("CLUSTERDOWN this node is not part of a cluster yet")),
            "CLUSTER {sub}: {reply:?}"
        );
    }
    // CLUSTER NODES still shows the node itself, as a new Redis node does.
    match c.cmd(&["CLUSTER", "NODES"]) {
        Value::Bulk(b) => assert!(String::from_utf8_lossy(&b).contains("myself"), "{b:?}"),
        other => panic!("CLUSTER NODES: {other:?}"),
    }
    let write = c.cmd(&["LOG.APPEND", "jobs", "1", "x"]);
    assert!(
        matches!(&write, Value::Error(e) if e.starts_with("TRYAGAIN")),
        "a write on a node without a leader: {write:?}"
    );
}
