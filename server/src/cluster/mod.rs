//! Cluster mode in the server: a `fencelog serve` started with
//! `--cluster-node-id` is one replica of a group replicated through Raft
//! (the `fencelog-cluster` crate). Clients find the leader as Redis Cluster
//! clients expect: `CLUSTER SLOTS`/`SHARDS`/`NODES` describe one group
//! owning every slot, with the leader as its primary; a follower answers a
//! data command `-MOVED slot leader`, and while no leader is known,
//! `-TRYAGAIN`. A node that cannot serve and should not keep its clients
//! (a leader that has heard from no quorum for an election timeout, or
//! stepped down for it; a removed node that knows no leader) answers
//! `-CLUSTERDOWN` and names no primary ([`fencelog_cluster::Node::refusal`]).
//!
//! - `route.rs`: data commands in cluster mode (writes proposed to Raft,
//!   reads after a ReadIndex, leases through the log).
//! - `slots.rs`: the `CLUSTER` commands and the key slot.
//! - `cli.rs`: `fencelog cluster local`, `status`, `add`, `remove`.

pub mod cli;
pub mod route;
pub mod slots;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fencelog::Log;
use fencelog_client::{Error as ClientError, Value};
use fencelog_cluster::{ClusterSecret, Member, Node, NodeConfig, NodeId};

/// What `fencelog serve` is told about its cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id (1 and up, the same across restarts).
    pub node_id: NodeId,
    /// Where peers' Raft messages arrive.
    pub raft_addr: SocketAddr,
    /// This node as peers and clients reach it.
    pub member: Member,
    /// The first members, to form a new cluster (`--cluster-initial`):
    /// the one with the lowest id forms it, once.
    pub initial: BTreeMap<NodeId, Member>,
    /// A member to ask to add this node (`--cluster-join`), when it starts
    /// with no state of its own.
    pub join: Option<String>,
    /// Elections after this much silence from a leader (the upper bound is
    /// 1.5 times it); heartbeats at half of it.
    pub election_timeout: Duration,
    /// A snapshot after this many entries.
    pub snapshot_every: u64,
    /// A snapshot also after this many bytes of Raft log (0: never).
    pub snapshot_every_bytes: u64,
    /// Entries the leader keeps in flight, at most (`NodeConfig`'s).
    pub entries_in_flight: usize,
    /// Whether the leader waits for the writers it answered before its
    /// next entry (`NodeConfig`'s).
    pub batch_wait: bool,
    /// The Raft log's segment size.
    pub raft_segment_bytes: u64,
    /// The secret peers prove to each other (`--cluster-secret-file`);
    /// required unless the Raft address is loopback.
    pub secret: Option<ClusterSecret>,
    /// The password `--cluster-join` gives the member it asks (the
    /// cluster's `--requirepass`, the same on every member).
    pub join_password: Option<String>,
}

/// Reads `--cluster-secret-file`: its bytes, less one trailing newline
/// (`\n` or `\r\n`, as an editor or `echo` leaves), 1 to 4096 bytes.
pub fn read_secret_file(path: &Path) -> Result<ClusterSecret, String> {
    let flag = "--cluster-secret-file";
    let mut bytes = std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    let max = fencelog_cluster::network::MAX_SECRET_BYTES;
    if bytes.is_empty() {
        return Err(format!(
            "{flag} {}: the file is empty (make one with: head -c 32 /dev/urandom | base64 > FILE)",
            path.display()
        ));
    }
    if bytes.len() > max {
        return Err(format!(
            "{flag} {}: a secret of {} bytes (at most {max})",
            path.display(),
            bytes.len()
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                event = "cluster_secret_readable",
                path = %path.display(),
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "the cluster secret file can be read by other users (chmod 600 it)"
            );
        }
    }
    ClusterSecret::new(bytes).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

/// Parses `--cluster-initial`: `ID=RAFT_ADDR/CLIENT_ADDR,…`.
pub fn parse_members(text: &str) -> Result<BTreeMap<NodeId, Member>, String> {
    let mut members = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addrs) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected ID=RAFT_ADDR/CLIENT_ADDR"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{part:?}: the node id must be an integer from 1"))?;
        let (raft, client) = addrs
            .split_once('/')
            .ok_or_else(|| format!("{part:?}: expected ID=RAFT_ADDR/CLIENT_ADDR"))?;
        for a in [raft, client] {
            if a.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return Err(format!("{part:?}: {a:?} is not HOST:PORT"));
            }
        }
        let member = Member {
            raft_addr: raft.to_string(),
            client_addr: client.to_string(),
            // Asked of each member when the group forms.
            incarnation: 0,
        };
        if members.insert(id, member).is_some() {
            return Err(format!("node {id} is listed twice"));
        }
    }
    Ok(members)
}

/// Proposes the group's first limits, once this (forming) node leads.
async fn set_limits(
    raft: fencelog_cluster::types::Raft,
    id: NodeId,
    limits: fencelog::GroupLimits,
) {
    for _ in 0..600 {
        let leads = raft.metrics().borrow().current_leader == Some(id);
        if leads {
            let req = fencelog_cluster::Request::new(0, vec![fencelog::Command::SetLimits(limits)]);
            match raft.client_write(req).await {
                Ok(_) => {
                    tracing::info!(
                        event = "cluster_limits",
                        ?limits,
                        "the group's limits are set"
                    );
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "setting the group's limits failed; retrying"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::warn!("the group's limits were not set: it decides with the defaults");
}

/// A running replica: its Raft node and how it was started.
pub struct Cluster {
    node: Node,
    config: ClusterConfig,
}

impl Cluster {
    /// Starts the node in `dir` (its `raft/`, `sm/` and `snap/`) and, on a
    /// node with no state yet, forms the cluster or asks to join it. The
    /// leader's queue of writes waiting for an entry holds at most
    /// `max_queued_bytes` (the server's client memory budget,
    /// `--maxmemory-clients`: the writes are its clients').
    pub async fn start(
        config: ClusterConfig,
        dir: &Path,
        engine: fencelog::Options,
        max_queued_bytes: u64,
    ) -> Result<Cluster, String> {
        let timeout = config.election_timeout.as_millis() as u64;
        let mut cfg = NodeConfig::new(
            config.node_id,
            dir.to_path_buf(),
            config.raft_addr,
            config.member.clone(),
        );
        let cfg_engine = engine.clone();
        cfg.engine = engine;
        // openraft 0.9 makes a follower wait the old leader's lease (the
        // top of the range) plus its own draw, and a candidate that meets a
        // longer log twice the top more: a narrow range keeps a failover
        // near 3 × the timeout (about a second at 300 ms), still wide
        // enough that two candidates rarely collide.
        cfg.election_timeout_ms = (timeout, timeout * 3 / 2);
        // openraft gives an AppendEntries a heartbeat interval to answer:
        // half the election timeout leaves a follower's fsync under load
        // room, and still two heartbeats per timeout.
        cfg.heartbeat_ms = (timeout / 2).max(10);
        cfg.snapshot_every_entries = config.snapshot_every;
        cfg.snapshot_every_bytes = config.snapshot_every_bytes;
        cfg.raft_segment_bytes = config.raft_segment_bytes;
        cfg.cluster_secret = config.secret.clone();
        cfg.max_queued_bytes = max_queued_bytes;
        cfg.entries_in_flight = config.entries_in_flight;
        cfg.batch_wait = config.batch_wait;
        let node = Node::start(cfg)
            .await
            .map_err(|e| format!("cannot start cluster node {}: {e}", config.node_id))?;
        let pristine = !node
            .raft()
            .is_initialized()
            .await
            .map_err(|e| format!("raft: {e}"))?;
        if pristine {
            if let Some(join) = &config.join {
                tracing::info!(event = "cluster_join", via = %join, "asking the cluster to add this node");
            } else if config.initial.keys().next() == Some(&config.node_id) {
                // The group admits each member's incarnation (its data
                // directory's), asked of it first: forming waits, in the
                // background, until every initial member answers.
                let admit = node.admit(config.initial.clone());
                // The limits the group decides with are its own state, set
                // once from the forming node's flags (a node's flags never
                // decide at apply).
                let limits = fencelog::GroupLimits::from_options(&cfg_engine);
                let raft = node.raft().clone();
                let id = config.node_id;
                tokio::spawn(async move {
                    let members = admit.await;
                    let count = members.len();
                    match raft.initialize(members).await {
                        Ok(()) => {
                            tracing::info!(
                                event = "cluster_formed",
                                members = count,
                                "a new cluster was formed"
                            );
                            set_limits(raft, id, limits).await;
                        }
                        Err(e) => {
                            tracing::error!(event = "cluster_form_failed", error = %e, "cannot form the cluster")
                        }
                    }
                });
            } else {
                tracing::info!(
                    event = "cluster_waiting",
                    "waiting to be reached by the cluster's leader"
                );
            }
        }
        Ok(Cluster { node, config })
    }

    /// Asks the member at `--cluster-join` to add this node, until one
    /// does (in the background: the server serves meanwhile, answering
    /// TRYAGAIN). With `--requirepass`, it authenticates first (every
    /// member has the same password).
    pub async fn join(&self) {
        let Some(via) = self.config.join.clone() else {
            return;
        };
        if self.node.raft().is_initialized().await.unwrap_or(true) {
            return;
        }
        let id = self.config.node_id.to_string();
        let member = self.config.member.clone();
        let password = self.config.join_password.as_deref();
        // Adding a node waits while it catches up; TRYAGAIN (no leader
        // yet) is waited out by the client, then asked again here.
        let timeout = Duration::from_secs(120);
        let retry_total = Duration::from_secs(10);
        let args: [&[u8]; 5] = [
            b"CLUSTER",
            b"ADDNODE",
            id.as_bytes(),
            member.raft_addr.as_bytes(),
            member.client_addr.as_bytes(),
        ];
        for attempt in 0u32.. {
            // A fresh client each attempt, through `--cluster-join` again:
            // the member that redirected last time may be gone.
            let client = match cli::connect(&via, password, timeout, retry_total).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(via = %via, error = %e, attempt, "join failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let reply = client.execute(&args, timeout).await;
            // The member that answered: the leader, after any -MOVED.
            let target = client.leader().unwrap_or_else(|| via.clone());
            match reply {
                Ok(Value::Simple(ok)) if ok == "OK" => {
                    tracing::info!(event = "cluster_joined", via = %target, "added to the cluster");
                    return;
                }
                Ok(other) => {
                    tracing::warn!(via = %target, reply = ?other, attempt, "join refused")
                }
                Err(e @ ClientError::Io(_)) => {
                    tracing::warn!(via = %target, error = %e, attempt, "join failed")
                }
                Err(e) => tracing::warn!(via = %target, error = %e, attempt, "join refused"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The engine in use (a snapshot installed later replaces it).
    pub fn log(&self) -> Log {
        self.node.log()
    }

    /// The Raft node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// How it was started.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Stops Raft and the peer listener.
    pub async fn shutdown(&self) {
        if let Err(e) = self.node.shutdown().await {
            tracing::warn!(error = %e, "stopping the cluster node");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_bad_ones_say_why() {
        let m = parse_members("1=127.0.0.1:17379/127.0.0.1:7379, 2=h:2/h:3").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[&1].raft_addr, "127.0.0.1:17379");
        assert_eq!(m[&2].client_addr, "h:3");
        for bad in [
            "1=a:1",
            "x=a:1/b:2",
            "0=a:1/b:2",
            "1=a/b:2",
            "1=a:1/b:2,1=c:1/d:2",
        ] {
            assert!(parse_members(bad).is_err(), "{bad}");
        }
    }
}
