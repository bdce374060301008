//! The real `fencelog` binary on a loopback port below the ephemeral range,
//! for the client's tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The server binary: `$FENCELOG_BIN`, else the workspace's
/// `target/ci/fencelog` (`cargo build --profile ci -p fencelog-server`).
/// `None` (with a message) if it is missing, unless `CI=true`: there a
/// missing binary fails the test instead of skipping it.
pub fn bin() -> Option<PathBuf> {
    let path = match std::env::var_os("FENCELOG_BIN") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ci/fencelog"),
    };
    if path.is_file() {
        return Some(path);
    }
    let msg = format!(
        "the fencelog binary is missing at {} (build it: cargo build --profile ci -p fencelog-server, or set FENCELOG_BIN)",
        path.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// A base port such that `base + o` is free on 127.0.0.1 for every offset,
/// below the kernel's ephemeral range (32768 and up), so an outgoing
/// connection cannot take it between this check and the server's bind.
pub fn free_ports(offsets: &[u16]) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static GIVEN: Mutex<std::collections::BTreeSet<u32>> =
        Mutex::new(std::collections::BTreeSet::new());
    // Another crate's tests use 20000 and up from their own start: this
    // range starts a little higher to meet them less often.
    const LOW: u32 = 21_000;
    const TOP: u32 = 32_768;
    let reach = u32::from(offsets.iter().copied().max().unwrap_or(0));
    let span = TOP - LOW - reach;
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let base = LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let ports: Vec<u32> = offsets.iter().map(|&o| base + u32::from(o)).collect();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        let free = ports.iter().all(|&p| {
            !given.contains(&p) && std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok()
        });
        if free {
            given.extend(ports);
            return base as u16;
        }
    }
    panic!("no free ports from {LOW} to {TOP} at offsets {offsets:?}");
}

/// A running `fencelog serve` (or `cluster local`), killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub dir: tempfile::TempDir,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// `fencelog serve --dir <tmp> --addr 127.0.0.1:<port> extra…`, once it
    /// accepts connections; `None` if the binary is missing (skipped).
    pub fn start(extra: &[&str]) -> Option<Server> {
        let bin = bin()?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_ports(&[0]);
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--dir")
            .arg(dir.path().join("data"))
            .args(["--addr", &addr])
            .args(extra);
        Some(Server::spawn(cmd, dir, addr, &[port]))
    }

    /// `fencelog cluster local --nodes 3`, once every node listens.
    pub fn start_cluster(nodes: u16) -> Option<Server> {
        let bin = bin()?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let offsets: Vec<u16> = (0..nodes).chain((0..nodes).map(|i| 10_000 + i)).collect();
        let port = free_ports(&offsets);
        let mut cmd = Command::new(bin);
        cmd.args([
            "cluster",
            "local",
            "--nodes",
            &nodes.to_string(),
            "--port",
            &port.to_string(),
        ])
        .arg("--dir")
        .arg(dir.path().join("cluster"));
        let ports: Vec<u16> = (0..nodes).map(|i| port + i).collect();
        Some(Server::spawn(cmd, dir, format!("127.0.0.1:{port}"), &ports))
    }

    fn spawn(mut cmd: Command, dir: tempfile::TempDir, addr: String, ports: &[u16]) -> Server {
        let mut child = cmd
            .env("FENCELOG_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fencelog");
        let log = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = child.stderr.take() {
            let log = log.clone();
            // Drained so the server never blocks on a full pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for &p in ports {
            while std::net::TcpStream::connect(("127.0.0.1", p)).is_err() {
                if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("fencelog did not listen on {p}: {}", log.lock().unwrap());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Server {
            child,
            addr,
            dir,
            log,
        }
    }

    /// Sends a signal (`STOP`, `CONT`, …) to the server process.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{sig} failed");
    }

    pub fn config(&self) -> fencelog_client::Config {
        fencelog_client::Config::new(self.addr.clone())
    }

    pub async fn client(&self) -> fencelog_client::Client {
        fencelog_client::Client::connect(self.config())
            .await
            .expect("connect")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A stopped process would take SIGKILL too, but its children (a
        // cluster's nodes) need their parent's SIGINT to go down.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server or returns from the test (skipped: no binary).
#[macro_export]
macro_rules! server_or_skip {
    ($extra:expr) => {
        match common::Server::start($extra) {
            Some(s) => s,
            None => return,
        }
    };
}

pub mod nodes;
