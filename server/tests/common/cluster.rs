//! A cluster of real `fencelog serve` processes on loopback, each node on
//! an address of its own (127.0.0.x), with its peers' Raft traffic through
//! proxies this process controls: a node can be killed (SIGKILL), paused
//! (SIGSTOP/SIGCONT), cut off from its peers while clients still reach it,
//! restarted, or wiped and rejoined.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bin;

/// A free port on `ip` (bound, then released for the node to take).
fn free_port(ip: &str) -> u16 {
    super::free_ports(ip, &[0])
}

/// The peers' side of one node: connections to it pass through here,
/// unless the node is cut off (nothing in or out) or the connection comes
/// from a node that is.
struct Proxy {
    cut: Arc<Mutex<HashSet<IpAddr>>>,
    deaf: Arc<Mutex<HashSet<IpAddr>>>,
    conns: Arc<Mutex<Vec<(IpAddr, TcpStream)>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(
        listen: SocketAddr,
        target: SocketAddr,
        me: IpAddr,
        cut: Arc<Mutex<HashSet<IpAddr>>>,
        deaf: Arc<Mutex<HashSet<IpAddr>>>,
    ) -> Proxy {
        let listener = TcpListener::bind(listen).expect("bind a proxy");
        listener.set_nonblocking(true).unwrap();
        let conns: Arc<Mutex<Vec<(IpAddr, TcpStream)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (cut, conns, stop) = (cut.clone(), conns.clone(), stop.clone());
            let deaf = deaf.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let (inbound, peer) = match listener.accept() {
                        Ok(x) => x,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                    };
                    // A deaf node hears nothing: no connection reaches it.
                    let blocked = {
                        let cut = cut.lock().unwrap();
                        cut.contains(&me)
                            || cut.contains(&peer.ip())
                            || deaf.lock().unwrap().contains(&me)
                    };
                    if blocked {
                        continue;
                    }
                    let _ = inbound.set_nonblocking(false);
                    let Ok(outbound) = TcpStream::connect(target) else {
                        continue;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    {
                        let mut c = conns.lock().unwrap();
                        c.retain(|(_, s)| s.peer_addr().is_ok());
                        c.push((peer.ip(), inbound.try_clone().unwrap()));
                        c.push((peer.ip(), outbound.try_clone().unwrap()));
                    }
                    pump(
                        inbound.try_clone().unwrap(),
                        outbound.try_clone().unwrap(),
                        None,
                    );
                    // Answers to a deaf dialer are lost on the way back.
                    pump(outbound, inbound, Some((deaf.clone(), peer.ip())));
                }
            });
        }
        Proxy {
            cut,
            deaf,
            conns,
            stop,
        }
    }

    /// Ends the connections that are cut now (or touch a deaf node).
    fn enforce(&self, me: IpAddr) {
        let mut cut = self.cut.lock().unwrap().clone();
        cut.extend(self.deaf.lock().unwrap().iter().copied());
        let mut conns = self.conns.lock().unwrap();
        conns.retain(|(peer, s)| {
            if cut.contains(&me) || cut.contains(peer) {
                let _ = s.shutdown(Shutdown::Both);
                false
            } else {
                true
            }
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for (_, s) in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to`; with `deaf`, bytes are dropped while the
/// dialer's address is in that set (it sends, but hears nothing back).
type Deaf = Option<(Arc<Mutex<HashSet<IpAddr>>>, IpAddr)>;

fn pump(mut from: TcpStream, mut to: TcpStream, deaf: Deaf) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let lost = deaf
                        .as_ref()
                        .is_some_and(|(set, ip)| set.lock().unwrap().contains(ip));
                    if lost {
                        continue;
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// One node: its process (if running) and addresses.
pub struct Node {
    pub id: u64,
    pub ip: IpAddr,
    /// Where clients connect.
    pub client: SocketAddr,
    /// Where it listens for peers (behind its proxy).
    pub raft: SocketAddr,
    /// What peers are told (its proxy).
    pub raft_advertised: SocketAddr,
    pub dir: PathBuf,
    child: Option<Child>,
    pub paused: bool,
    pub log: Arc<Mutex<String>>,
    proxy: Proxy,
}

/// A cluster of processes.
pub struct Cluster {
    pub nodes: BTreeMap<u64, Node>,
    cut: Arc<Mutex<HashSet<IpAddr>>>,
    deaf: Arc<Mutex<HashSet<IpAddr>>>,
    initial: String,
    extra: Vec<String>,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n on 127.0.0.(10+id)), forming a new
    /// cluster; waits for a leader.
    pub fn start(n: u64, extra: &[&str]) -> Cluster {
        let tmp = tempfile::tempdir().unwrap();
        let cut: Arc<Mutex<HashSet<IpAddr>>> = Arc::default();
        let deaf: Arc<Mutex<HashSet<IpAddr>>> = Arc::default();
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            let ip_text = format!("127.0.0.{}", 10 + id);
            let ip: IpAddr = ip_text.parse().unwrap();
            let client = SocketAddr::new(ip, free_port(&ip_text));
            let raft = SocketAddr::new(ip, free_port(&ip_text));
            let raft_advertised = SocketAddr::new(ip, free_port(&ip_text));
            let proxy = Proxy::start(raft_advertised, raft, ip, cut.clone(), deaf.clone());
            nodes.insert(
                id,
                Node {
                    id,
                    ip,
                    client,
                    raft,
                    raft_advertised,
                    dir: tmp.path().join(format!("n{id}")),
                    child: None,
                    paused: false,
                    log: Arc::default(),
                    proxy,
                },
            );
        }
        let initial = nodes
            .values()
            .map(|n| format!("{}={}/{}", n.id, n.raft_advertised, n.client))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Cluster {
            nodes,
            cut,
            deaf,
            initial,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _tmp: tmp,
        };
        let ids: Vec<u64> = c.nodes.keys().copied().collect();
        for id in ids {
            c.launch(id, None);
        }
        c.leader(Duration::from_secs(20));
        c
    }

    /// Starts node `id`'s process: with the initial members, or joining
    /// through `join` (a member's client address).
    fn launch(&mut self, id: u64, join: Option<SocketAddr>) {
        let node = self.nodes.get_mut(&id).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--dir")
            .arg(&node.dir)
            .args(["--addr", &node.client.to_string()])
            .args(["--cluster-node-id", &id.to_string()])
            .args(["--cluster-raft-addr", &node.raft.to_string()])
            .args([
                "--cluster-advertise-raft",
                &node.raft_advertised.to_string(),
            ])
            .args(["--segment-bytes", "1MiB"])
            .args(["--log-level", "info"]);
        match join {
            Some(via) => cmd.args(["--cluster-join", &via.to_string()]),
            None => cmd.args(["--cluster-initial", &self.initial]),
        };
        cmd.args(&self.extra);
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fencelog serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut tx = Some(tx);
        super::capture_lines(stderr, node.log.clone(), move |line| {
            if line.contains("serving")
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(());
            }
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = child.kill();
            panic!("node {id} did not start: {}", node.log.lock().unwrap());
        }
        node.child = Some(child);
        node.paused = false;
    }

    /// The node that leads the newest term among those that answer, once
    /// one does (within `timeout`).
    pub fn leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut best: Option<(u64, u64)> = None;
            for n in self
                .nodes
                .values()
                .filter(|n| n.child.is_some() && !n.paused)
            {
                if let Some(info) = cluster_info(n.client)
                    && info.get("raft_state").is_some_and(|s| s == "leader")
                {
                    let term: u64 = info["raft_term"].parse().unwrap_or(0);
                    if best.is_none_or(|(t, _)| term > t) {
                        best = Some((term, n.id));
                    }
                }
            }
            if let Some((_, id)) = best {
                return id;
            }
            assert!(Instant::now() < deadline, "no leader within {timeout:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A command at the leader, sent again (TRYAGAIN, MOVED, a connection
    /// refused) until it is answered with something else, for 30 s.
    pub fn at_leader(&self, args: &[&[u8]]) -> Reply {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leader = self.leader(Duration::from_secs(20));
            match Resp::connect(self.nodes[&leader].client, Duration::from_secs(2))
                .and_then(|mut c| c.cmd(args))
            {
                Ok(Reply::Error(e)) if e.starts_with("TRYAGAIN") || e.starts_with("MOVED") => {}
                Ok(r) => return r,
                Err(_) => {}
            }
            assert!(Instant::now() < deadline, "{args:?} never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, and wait for it.
    pub fn kill(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        node.paused = false;
    }

    /// Starts a killed node again on its data.
    pub fn restart(&mut self, id: u64) {
        self.launch(id, None);
    }

    /// SIGSTOP or SIGCONT.
    pub fn pause(&mut self, id: u64, paused: bool) {
        let node = self.nodes.get_mut(&id).unwrap();
        if let Some(child) = &mut node.child {
            // A node that ended has no process to signal, and once reaped
            // (`process_state`) its pid may be another's (pids wrap at
            // 32 768 here): a resume has nothing to do, a pause is the
            // test's mistake, said with how the node ended.
            match child.try_wait() {
                Ok(None) => {}
                ended => {
                    node.paused = false;
                    assert!(!paused, "pause node {id}: it has ended ({ended:?})");
                    return;
                }
            }
            let sig = if paused { "-STOP" } else { "-CONT" };
            let ok = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} node {id}");
            node.paused = paused;
        }
    }

    /// Cuts node `id` off from its peers (both ways); clients still reach
    /// it.
    pub fn isolate(&self, id: u64) {
        self.cut.lock().unwrap().insert(self.nodes[&id].ip);
        for n in self.nodes.values() {
            n.proxy.enforce(n.ip);
        }
    }

    /// Node `id` still sends to its peers, but hears nothing back (a
    /// one-way cut): its messages arrive, their answers and its peers' own
    /// messages to it are lost.
    pub fn deafen(&self, id: u64) {
        self.deaf.lock().unwrap().insert(self.nodes[&id].ip);
        for n in self.nodes.values() {
            n.proxy.enforce(n.ip);
        }
    }

    /// Undoes every cut.
    pub fn heal(&self) {
        self.cut.lock().unwrap().clear();
        self.deaf.lock().unwrap().clear();
    }

    /// Kills node `id`, deletes its data and starts it empty, joining
    /// through another member.
    pub fn wipe_and_rejoin(&mut self, id: u64) {
        self.kill(id);
        let dir = self.nodes[&id].dir.clone();
        let _ = std::fs::remove_dir_all(&dir);
        let via = self
            .nodes
            .values()
            .find(|n| n.id != id && n.child.is_some() && !n.paused)
            .map(|n| n.client)
            .expect("another live member");
        self.launch(id, Some(via));
    }

    /// Kills node `id` and deletes its data (a replaced disk).
    pub fn wipe(&mut self, id: u64) {
        self.kill(id);
        let _ = std::fs::remove_dir_all(&self.nodes[&id].dir);
    }

    /// Starts node `id` (killed) on its data, asking the member at `via`
    /// (a client address) to add it: `--cluster-join`.
    pub fn launch_joining(&mut self, id: u64, via: SocketAddr) {
        self.launch(id, Some(via));
    }

    /// Whether node `id` runs (not killed).
    pub fn running(&self, id: u64) -> bool {
        self.nodes[&id].child.is_some()
    }

    /// Every running node's `CLUSTER INFO`.
    pub fn infos(&self) -> BTreeMap<u64, BTreeMap<String, String>> {
        self.nodes
            .values()
            .filter(|n| n.child.is_some() && !n.paused)
            .filter_map(|n| Some((n.id, cluster_info(n.client)?)))
            .collect()
    }

    /// Waits until every running node has applied what the leader has.
    pub fn converge(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let infos = self.infos();
            let running = self.nodes.values().filter(|n| n.child.is_some()).count();
            if caught_up(infos.values(), running) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no convergence in {timeout:?}: {infos:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every running replica, once all stand at the same position, has
    /// the same digest there: none decided differently. (Each replica's
    /// digest folds in every entry it wrote for the replicated log.)
    pub fn assert_replicas_agree(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.converge(timeout);
            let infos = self.infos();
            let at: Vec<(u64, String, String)> = infos
                .iter()
                .filter_map(|(id, i)| {
                    Some((
                        *id,
                        i.get("replica_position")?.clone(),
                        i.get("replica_digest")?.clone(),
                    ))
                })
                .collect();
            let running = self.nodes.values().filter(|n| n.child.is_some()).count();
            if at.len() == running && at.iter().all(|(_, p, _)| *p == at[0].1) {
                assert!(
                    at.iter().all(|(_, _, d)| *d == at[0].2),
                    "replicas at position {} disagree: {at:?}\n{}",
                    at[0].1,
                    self.logs()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replicas never stood at one position: {at:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether node `id`'s process runs, its state (`/proc`), and how it
    /// ended if it did, for a failure's message.
    pub fn process_state(&mut self, id: u64) -> String {
        let Some(child) = self.nodes.get_mut(&id).and_then(|n| n.child.as_mut()) else {
            return "not running".into();
        };
        let state = std::fs::read_to_string(format!("/proc/{}/status", child.id()))
            .map(|s| {
                s.lines()
                    .filter(|l| l.starts_with("State:") || l.starts_with("Threads:"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|e| format!("no /proc entry: {e}"));
        match child.try_wait() {
            Ok(Some(status)) => format!("{state}, ended: {status:?}"),
            Ok(None) => state,
            Err(e) => format!("{state}, wait: {e}"),
        }
    }

    /// Every node's log so far (for a failure's message).
    pub fn logs(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("--- node {} ---\n{}", n.id, n.log.lock().unwrap()))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            if self.nodes[&id].paused {
                self.pause(id, false);
            }
            self.kill(id);
        }
    }
}

/// `CLUSTER INFO` of the node at `addr`, or `None` if it does not answer
/// within a second.
/// Whether `running` nodes answered (`infos`, their CLUSTER INFO) and each
/// has applied every entry the longest log among them holds.
pub fn caught_up<'a>(
    infos: impl Iterator<Item = &'a BTreeMap<String, String>>,
    running: usize,
) -> bool {
    let (mut answered, mut min_applied, mut max_log) = (0, u64::MAX, 0);
    for i in infos {
        let field = |k: &str| i.get(k).and_then(|v| v.parse::<u64>().ok());
        let (Some(applied), Some(log)) = (field("raft_last_applied"), field("raft_last_log_index"))
        else {
            continue;
        };
        answered += 1;
        min_applied = min_applied.min(applied);
        max_log = max_log.max(log);
    }
    answered == running && min_applied >= max_log
}

pub fn cluster_info(addr: SocketAddr) -> Option<BTreeMap<String, String>> {
    fields(addr, &[b"CLUSTER", b"INFO"])
}

/// The `name:value` lines of what `command` answers at `addr` (`INFO`,
/// `CLUSTER INFO`), or `None` if it does not answer within a second.
pub fn fields(addr: SocketAddr, command: &[&[u8]]) -> Option<BTreeMap<String, String>> {
    let mut c = Resp::connect(addr, Duration::from_secs(1)).ok()?;
    match c.cmd(command).ok()? {
        Reply::Bulk(text) => Some(
            String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect(),
        ),
        _ => None,
    }
}

/// A reply, as a fault test needs it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
}

/// A RESP client that never panics: a timeout or a dropped connection is an
/// `Err` (the outcome of what was sent is then unknown).
pub struct Resp {
    stream: BufReader<TcpStream>,
    pub addr: SocketAddr,
}

impl Resp {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Resp, String> {
        let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        Ok(Resp {
            stream: BufReader::new(s),
            addr,
        })
    }

    pub fn cmd(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        let mut replies = self.pipeline(&[args.to_vec()])?;
        Ok(replies.remove(0))
    }

    /// Sends every command in one write, then reads their replies.
    pub fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Result<Vec<Reply>, String> {
        let mut out = Vec::new();
        for args in cmds {
            out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.stream
            .get_mut()
            .write_all(&out)
            .map_err(|e| e.to_string())?;
        cmds.iter().map(|_| self.read()).collect()
    }

    fn read(&mut self) -> Result<Reply, String> {
        let mut line = Vec::new();
        let n = self
            .stream
            .read_until(b'\n', &mut line)
            .map_err(|e| e.to_string())?;
        if n < 3 {
            return Err("connection closed".into());
        }
        let text = String::from_utf8_lossy(&line[1..line.len() - 2]).to_string();
        let num = || text.parse::<i64>().map_err(|e| format!("{text:?}: {e}"));
        Ok(match line[0] {
            b'+' => Reply::Simple(text.clone()),
            b'-' => Reply::Error(text.clone()),
            b':' => Reply::Int(num()?),
            b'_' => Reply::Null,
            b'$' | b'=' => {
                let len = num()?;
                if len < 0 {
                    return Ok(Reply::Null);
                }
                let mut buf = vec![0u8; len as usize + 2];
                self.stream
                    .read_exact(&mut buf)
                    .map_err(|e| e.to_string())?;
                buf.truncate(len as usize);
                Reply::Bulk(buf)
            }
            b'*' => {
                let len = num()?;
                if len < 0 {
                    return Ok(Reply::Null);
                }
                let mut items = Vec::new();
                for _ in 0..len {
                    items.push(self.read()?);
                }
                Reply::Array(items)
            }
            other => return Err(format!("unexpected reply type {:?}", char::from(other))),
        })
    }
}
