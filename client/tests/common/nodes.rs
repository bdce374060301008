//! A cluster of three (or five) `fencelog serve --cluster-…` processes the
//! test starts itself, so that it can kill (SIGKILL), pause (SIGSTOP /
//! SIGCONT) and restart any one node; `cluster local` restarts nothing.
//! Ports are below the ephemeral range (`free_ports`). A node may be given
//! an advertised client address (a proxy the test runs in front of it):
//! `-MOVED` and `CLUSTER SLOTS` then name the proxy, so a client that
//! starts at the proxies never reaches a node directly.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelog_client::{Client, Config, Value};
use tokio::time::Instant;

/// One node's process and addresses.
pub struct Node {
    /// 1 and up.
    pub id: usize,
    /// Where it listens for clients.
    pub addr: String,
    /// What it tells clients (its `--cluster-advertise`).
    pub advertised: String,
    pub raft: String,
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub paused: bool,
    pub log: Arc<Mutex<String>>,
}

/// The nodes of one cluster, killed on drop.
pub struct Nodes {
    pub nodes: Vec<Node>,
    bin: PathBuf,
    initial: String,
    extra: Vec<String>,
    _tmp: tempfile::TempDir,
}

impl Nodes {
    /// Starts `n` nodes forming a new cluster and waits for a leader;
    /// `None` if the binary is missing (skipped). With `proxied`, node `i`
    /// advertises `127.0.0.1:(base + n + i)`, a port left free for the
    /// test's proxy (`Nodes::advertised`).
    pub async fn start(n: usize, proxied: bool, extra: &[&str]) -> Option<Nodes> {
        let bin = super::bin()?;
        let n16 = n as u16;
        let offsets: Vec<u16> = (0..2 * n16).chain((0..n16).map(|i| 10_000 + i)).collect();
        let base = super::free_ports(&offsets);
        let tmp = tempfile::tempdir().expect("a temporary directory");
        let nodes: Vec<Node> = (0..n16)
            .map(|i| {
                let addr = format!("127.0.0.1:{}", base + i);
                Node {
                    id: usize::from(i) + 1,
                    advertised: if proxied {
                        format!("127.0.0.1:{}", base + n16 + i)
                    } else {
                        addr.clone()
                    },
                    addr,
                    raft: format!("127.0.0.1:{}", base + 10_000 + i),
                    dir: tmp.path().join(format!("n{}", i + 1)),
                    child: None,
                    paused: false,
                    log: Arc::default(),
                }
            })
            .collect();
        let initial = nodes
            .iter()
            .map(|n| format!("{}={}/{}", n.id, n.raft, n.advertised))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Nodes {
            nodes,
            bin,
            initial,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _tmp: tmp,
        };
        for i in 0..n {
            c.launch(i).await;
        }
        c.leader(Duration::from_secs(30)).await;
        Some(c)
    }

    /// Starts node index `i` (0-based) on its directory, once it serves.
    pub async fn launch(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let mut cmd = Command::new(&self.bin);
        cmd.arg("serve")
            .arg("--dir")
            .arg(&node.dir)
            .args(["--addr", &node.addr])
            .args(["--cluster-node-id", &node.id.to_string()])
            .args(["--cluster-raft-addr", &node.raft])
            .args(["--cluster-advertise", &node.advertised])
            .args(["--cluster-initial", &self.initial])
            .args(["--log-level", "info"])
            .args(&self.extra);
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fencelog serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = node.log.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("serving")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(());
                }
                let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        if tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .is_err()
        {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "node {} did not start: {}",
                node.id,
                node.log.lock().unwrap()
            );
        }
        node.child = Some(child);
        node.paused = false;
    }

    /// Every node's client address (what a client may use as seeds).
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// Every node's advertised client address.
    pub fn advertised(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.advertised.clone()).collect()
    }

    /// The index of the node leading the newest term among those that
    /// answer, and that term, once one does (within `timeout`).
    pub async fn leader(&self, timeout: Duration) -> (usize, u64) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.try_leader().await {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {timeout:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// As [`Nodes::leader`], one round.
    pub async fn try_leader(&self) -> Option<(usize, u64)> {
        let mut best: Option<(u64, usize)> = None;
        for (i, n) in self.nodes.iter().enumerate() {
            if n.child.is_none() || n.paused {
                continue;
            }
            if let Some(info) = cluster_info(&n.addr).await
                && info.get("raft_state").is_some_and(|s| s == "leader")
            {
                let term: u64 = info
                    .get("raft_term")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0);
                if best.is_none_or(|(t, _)| term > t) {
                    best = Some((term, i));
                }
            }
        }
        best.map(|(t, i)| (i, t))
    }

    /// SIGKILL node `i`, and reap it.
    pub fn kill(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        node.paused = false;
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) node `i`.
    pub fn pause(&mut self, i: usize, paused: bool) {
        let node = &mut self.nodes[i];
        if let Some(child) = &node.child {
            let sig = if paused { "-STOP" } else { "-CONT" };
            let ok = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} node {}", node.id);
            node.paused = paused;
        }
    }

    /// Waits until every running node has applied the longest log among
    /// them.
    pub async fn converge(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let mut applied = Vec::new();
            let mut logs = Vec::new();
            let running = self.nodes.iter().filter(|n| n.child.is_some()).count();
            for n in self.nodes.iter().filter(|n| n.child.is_some() && !n.paused) {
                if let Some(info) = cluster_info(&n.addr).await {
                    applied.extend(
                        info.get("raft_last_applied")
                            .and_then(|v| v.parse::<u64>().ok()),
                    );
                    logs.extend(
                        info.get("raft_last_log_index")
                            .and_then(|v| v.parse::<u64>().ok()),
                    );
                }
            }
            if applied.len() == running
                && let (Some(min), Some(max)) = (applied.iter().min(), logs.iter().max())
                && min >= max
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no convergence in {timeout:?}: applied {applied:?} logs {logs:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Every node's log so far (for a failure's message).
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- node {} ---\n{}",
                    n.id,
                    n.log.lock().unwrap_or_else(|e| e.into_inner())
                )
            })
            .collect()
    }

    /// The lines of every node's log that contain any of `needles`.
    pub fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let log = n.log.lock().unwrap_or_else(|e| e.into_inner());
            for l in log.lines() {
                if needles.iter().any(|w| l.contains(w)) {
                    out.push(format!("n{}: {l}", n.id));
                }
            }
        }
        out
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused {
                self.pause(i, false);
            }
            self.kill(i);
        }
    }
}

/// `CLUSTER INFO` of the node at `addr`, or `None` if it does not answer
/// within half a second.
pub async fn cluster_info(addr: &str) -> Option<BTreeMap<String, String>> {
    let config = Config {
        seeds: vec![addr.to_string()],
        discover_leader: false,
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(500),
        ..Config::default()
    };
    let c = Client::connect(config).await.ok()?;
    let text = match c
        .execute_on(addr, &[b"CLUSTER", b"INFO"], Duration::from_millis(500))
        .await
        .ok()?
    {
        Value::Bulk(b) | Value::Verbatim(b) => b,
        _ => return None,
    };
    Some(
        String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect(),
    )
}

/// `FENCELOG_LONG=1`: the full sizes of the "Done when"; the
/// defaults fit a CI test run.
pub fn long() -> bool {
    std::env::var("FENCELOG_LONG").is_ok_and(|v| v == "1" || v == "true")
}

/// A number from the environment, or `default`.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A seeded generator (splitmix64): the same seed, the same faults.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
