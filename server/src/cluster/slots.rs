//! The `CLUSTER` commands, in Redis Cluster's shapes: one group owns all
//! 16384 slots, the leader is its primary and the other voters its
//! replicas. Node ids are Redis' 40 hex digits (the node number, padded).
//! `CLUSTER ADDNODE` and `CLUSTER REMOVENODE` are fencelog's own: the
//! membership changes of Raft, run by the leader.
//!
//! Health: a member is `fail` (`NODES`) / `failed` (`SHARDS`) when this
//! node can tell it is not answering: on the leader, any member that has
//! not answered it for an election timeout; on a follower, its leader when
//! it has heard nothing from it for as long. A follower cannot see the
//! other followers (they do not talk to each other): it shows them online.
//! A node that cannot serve as the primary it would name (a leader that
//! has heard from no quorum for an election timeout, or stepped down for
//! it and heard from no leader since; a removed node that knows no
//! leader) names none: `SLOTS` and `SHARDS` answer `-CLUSTERDOWN …`, so a
//! cluster client asks another member.

use std::collections::BTreeSet;

use bytes::Bytes;
use fencelog_cluster::{ChangeMembers, ClusterError, Member, NodeId, Status};

use super::Cluster;
use crate::protocol::Reply;

/// Redis Cluster's slot count.
pub const SLOTS: u16 = 16384;

const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// The slot of a key, as Redis Cluster computes it: CRC16 (XMODEM) of the
/// key, or of its hash tag (the part between the first `{` and the next
/// `}`, if not empty), mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    CRC16.checksum(hashed) % SLOTS
}

/// A node's id as Redis clients expect it: 40 hex digits.
pub fn node_name(id: NodeId) -> String {
    format!("{id:040x}")
}

/// `host` and `port` of a `host:port` address.
fn host_port(addr: &str) -> (String, i64) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse().unwrap_or(0),
        ),
        None => (addr.to_string(), 0),
    }
}

fn error(text: impl Into<String>) -> Reply {
    Reply::Error(text.into())
}

/// The primary clients should use: the leader if known, else this node (a
/// command sent here then answers TRYAGAIN until there is a leader); or
/// why this node names none (a `-CLUSTERDOWN` error).
fn primary(c: &Cluster, status: &Status) -> Result<NodeId, String> {
    let me = c.config().node_id;
    if status.removed {
        // A removed follower still knows the leader it followed; a removed
        // leader (stepped down) knows none.
        return status
            .leader
            .filter(|l| *l != me && status.members.contains_key(l))
            .ok_or_else(|| {
                "CLUSTERDOWN this node was removed from the group (or is not yet added to it) \
                 and knows no leader: ask another member"
                    .to_string()
            });
    }
    if status.quorum_lost {
        return Err(format!(
            "CLUSTERDOWN this node led but no quorum has answered it for {} ms (it is cut off, \
             or its peers are down): ask another member",
            status.millis_since_quorum_ack.map_or_else(
                || "an election timeout or more".to_string(),
                |ms| ms.to_string()
            )
        ));
    }
    Ok(status.leader.unwrap_or(me))
}

/// Whether member `id` answers, as far as this node can tell.
fn online(status: &Status, id: NodeId) -> bool {
    status.health.get(&id).is_none_or(|h| h.online)
}

/// Voters first (the primary leading), then learners.
fn ordered_members(c: &Cluster, status: &Status) -> Vec<(NodeId, Member, bool)> {
    let primary = primary(c, status).ok();
    let mut out: Vec<(NodeId, Member, bool)> = status
        .members
        .iter()
        .map(|(id, (m, voter))| (*id, m.clone(), *voter))
        .collect();
    if out.is_empty() {
        // Not part of a cluster yet: only this node is known.
        out.push((c.config().node_id, c.config().member.clone(), true));
    }
    out.sort_by_key(|(id, _, voter)| (Some(*id) != primary, !*voter, *id));
    out
}

/// `CLUSTER <subcommand> …`
pub async fn cluster(c: &Cluster, a: &[Bytes]) -> Reply {
    let Some(sub) = a.first() else {
        return error("ERR wrong number of arguments for 'cluster' command");
    };
    let sub = String::from_utf8_lossy(sub).to_ascii_uppercase();
    let status = c.node().status();
    match (sub.as_str(), &a[1..]) {
        ("SLOTS" | "SHARDS", []) if status.members.is_empty() => not_a_member_yet(),
        ("SLOTS" | "SHARDS", []) if primary(c, &status).is_err() => primary(c, &status)
            .err()
            .map(error)
            .unwrap_or_else(not_a_member_yet),
        ("SLOTS", []) => slots(c, &status),
        ("SHARDS", []) => shards(c, &status),
        ("NODES", []) => Reply::Verbatim(nodes(c, &status)),
        ("INFO", []) => Reply::Verbatim(info(c, &status)),
        ("MYID", []) => Reply::text(node_name(c.config().node_id)),
        ("KEYSLOT", [key]) => Reply::Integer(i64::from(key_slot(key))),
        ("ADDNODE", [id, raft, client]) => add_node(c, id, raft, client).await,
        ("REMOVENODE", [id]) => remove_node(c, id).await,
        (
            "SLOTS" | "SHARDS" | "NODES" | "INFO" | "MYID" | "KEYSLOT" | "ADDNODE" | "REMOVENODE",
            _,
        ) => error(format!(
            "ERR wrong number of arguments for 'cluster|{}' command",
            sub.to_ascii_lowercase()
        )),
        _ => error(format!(
            "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
            String::from_utf8_lossy(&a[0])
        )),
    }
}

/// The slot map of a node that no leader has reached yet (started with
/// `--cluster-initial` but not the one forming the cluster, or joining):
/// it knows no member, not even itself, so it claims no slot. It used to
/// answer itself as the primary of every slot, with no replica: ioredis
/// took that for the cluster's whole topology when it asked this node
/// first. An error makes a cluster client (redis-py, ioredis) ask the next
/// node it knows.
fn not_a_member_yet() -> Reply {
    error(
        "CLUSTERDOWN this node is not part of a cluster yet (no leader has reached it): \
         ask another member",
    )
}

/// `CLUSTER SLOTS`: `[[0, 16383, [host, port, id], …]]`.
fn slots(c: &Cluster, status: &Status) -> Reply {
    let mut range = vec![Reply::Integer(0), Reply::Integer(i64::from(SLOTS - 1))];
    for (id, m, voter) in ordered_members(c, status) {
        if !voter {
            continue;
        }
        let (host, port) = host_port(&m.client_addr);
        range.push(Reply::Array(vec![
            Reply::text(host),
            Reply::Integer(port),
            Reply::text(node_name(id)),
        ]));
    }
    Reply::Array(vec![Reply::Array(range)])
}

/// `CLUSTER SHARDS`: one shard with every slot and every member, each
/// with its health (`online`, or `failed` when this node can tell it does
/// not answer).
fn shards(c: &Cluster, status: &Status) -> Reply {
    let primary = primary(c, status).ok();
    let nodes = ordered_members(c, status)
        .into_iter()
        .map(|(id, m, _)| {
            let (host, port) = host_port(&m.client_addr);
            let offset = if id == c.config().node_id {
                status.last_applied
            } else {
                status.matched.get(&id).copied().unwrap_or(0)
            };
            Reply::Map(vec![
                (Reply::text("id"), Reply::text(node_name(id))),
                (Reply::text("port"), Reply::Integer(port)),
                (Reply::text("ip"), Reply::text(host.clone())),
                (Reply::text("endpoint"), Reply::text(host)),
                (
                    Reply::text("role"),
                    Reply::text(if Some(id) == primary {
                        "master"
                    } else {
                        "replica"
                    }),
                ),
                (
                    Reply::text("replication-offset"),
                    crate::outcome::number(offset),
                ),
                (
                    Reply::text("health"),
                    Reply::text(if online(status, id) {
                        "online"
                    } else {
                        "failed"
                    }),
                ),
            ])
        })
        .collect();
    Reply::Array(vec![Reply::Map(vec![
        (
            Reply::text("slots"),
            Reply::Array(vec![
                Reply::Integer(0),
                Reply::Integer(i64::from(SLOTS - 1)),
            ]),
        ),
        (Reply::text("nodes"), Reply::Array(nodes)),
    ])])
}

/// `CLUSTER NODES`: Redis' line format. A member this node can tell does
/// not answer is flagged `fail` and `disconnected`. With no primary to
/// name (see [`primary`]), no member holds the slots: each voter is shown
/// as a master without slots.
fn nodes(c: &Cluster, status: &Status) -> String {
    let primary = primary(c, status).ok();
    let mut out = String::new();
    for (id, m, voter) in ordered_members(c, status) {
        let (_, raft_port) = host_port(&m.raft_addr);
        let mut flags = Vec::new();
        if id == c.config().node_id {
            flags.push("myself");
        }
        let is_primary = Some(id) == primary || (primary.is_none() && voter);
        flags.push(if is_primary { "master" } else { "slave" });
        let up = online(status, id);
        if !up {
            flags.push("fail");
        }
        if !voter {
            flags.push("nofailover");
        }
        let master = match primary {
            Some(p) if !is_primary => node_name(p),
            _ => "-".to_string(),
        };
        let slots = if Some(id) == primary { " 0-16383" } else { "" };
        out.push_str(&format!(
            "{} {}@{} {} {} 0 0 {} {}{}\n",
            node_name(id),
            m.client_addr,
            raft_port,
            flags.join(","),
            master,
            status.term,
            if up { "connected" } else { "disconnected" },
            slots
        ));
    }
    out
}

/// `CLUSTER INFO`: Redis' fields, then Raft's.
fn info(c: &Cluster, status: &Status) -> String {
    // The voters of the membership this node knows: 0 while it knows none
    // (a node just started empty, or joining, before a leader reaches it).
    let voters = status.members.values().filter(|(_, v)| *v).count();
    let serving = status.leader.is_some() && primary(c, status).is_ok();
    let state = if serving { "ok" } else { "fail" };
    let mut s = format!(
        "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:{SLOTS}\r\n\
         cluster_slots_ok:{}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:{}\r\n\
         cluster_known_nodes:{}\r\ncluster_size:1\r\ncluster_current_epoch:{}\r\n\
         cluster_my_epoch:{}\r\n",
        if serving { SLOTS } else { 0 },
        if serving { 0 } else { SLOTS },
        status.members.len().max(1),
        status.term,
        status.term,
    );
    s.push_str(&format!(
        "raft_node_id:{}\r\nraft_incarnation:{:016x}\r\nraft_state:{}\r\nraft_term:{}\r\nraft_leader:{}\r\n\
         raft_voters:{voters}\r\nraft_last_log_index:{}\r\nraft_committed:{}\r\n\
         raft_last_applied:{}\r\nraft_snapshot_index:{}\r\nraft_snapshots_installed:{}\r\n\
         raft_ms_since_quorum_ack:{}\r\nraft_reads:{}\r\nraft_read_rounds:{}\r\n",
        c.config().node_id,
        c.node().incarnation(),
        status.state,
        status.term,
        status
            .leader
            .map_or_else(|| "none".to_string(), |l| l.to_string()),
        status.last_log_index,
        status.committed,
        status.last_applied,
        status
            .snapshot_index
            .map_or_else(|| "none".to_string(), |i| i.to_string()),
        status.snapshots_installed,
        status
            .millis_since_quorum_ack
            .map_or_else(|| "none".to_string(), |m| m.to_string()),
        status.reads,
        status.read_rounds,
    ));
    for (id, matched) in &status.matched {
        s.push_str(&format!(
            "raft_replica_{id}:matched={matched},lag={}\r\n",
            status.last_log_index.saturating_sub(*matched)
        ));
    }
    s.push_str(&format!(
        "raft_quorum_lost:{}\r\nraft_removed:{}\r\n",
        u8::from(status.quorum_lost),
        u8::from(status.removed)
    ));
    // What this node can tell of its members' health: on the leader every
    // other member, on a follower its leader.
    for (id, h) in &status.health {
        s.push_str(&format!(
            "raft_health_{id}:{},heard_ms={}\r\n",
            if h.online { "online" } else { "failed" },
            h.heard_ms
                .map_or_else(|| "never".to_string(), |ms| ms.to_string())
        ));
    }
    let q = status.queued;
    s.push_str(&format!(
        "raft_queued_writes:{}\r\nraft_queued_bytes:{}\r\nraft_queue_max_writes:{}\r\n\
         raft_queue_max_bytes:{}\r\nraft_proposals:{}\r\nraft_proposed_writes:{}\r\n",
        q.writes, q.bytes, q.max_writes, q.max_bytes, q.taken_items, q.taken_writes
    ));
    s.push_str(&format!(
        "raft_comeback_waits:{}\r\nraft_comeback_ran_out:{}\r\nraft_comeback_wait_us:{}\r\n",
        q.comeback.all.count, q.comeback.ran_out, q.comeback.all.micros
    ));
    // The membership as this node knows it: each member's incarnation
    // (the data directory the group admitted) and whether it votes.
    for (id, (m, voter)) in &status.members {
        s.push_str(&format!(
            "raft_member_{id}:incarnation={:016x},voter={}\r\n",
            m.incarnation,
            u8::from(*voter)
        ));
    }
    // What this replica applied and its digest after it: two replicas at
    // the same position with different digests decided differently.
    let log = c.log();
    let (applied, digest) = log.digest();
    let limits = log.group_limits();
    s.push_str(&format!(
        "replica_position:{}\r\nreplica_digest:{digest:016x}\r\nreplica_clock_ms:{}\r\n\
         group_max_payload_bytes:{}\r\ngroup_max_records_per_append:{}\r\n\
         group_lease_ttl_min_ms:{}\r\ngroup_lease_ttl_max_ms:{}\r\ngroup_max_live_leases:{}\r\n\
         group_max_streams:{}\r\n",
        applied.map_or(0, |a| a.index),
        log.group_clock_ms(),
        limits.max_payload_bytes,
        limits.max_records_per_append,
        limits.lease_ttl_min_ms,
        limits.lease_ttl_max_ms,
        limits.max_live_leases,
        limits.max_streams,
    ));
    s
}

fn parse_id(b: &[u8]) -> Option<NodeId> {
    std::str::from_utf8(b).ok()?.parse().ok().filter(|&n| n > 0)
}

/// The leader's answer to a membership command sent elsewhere (or to a
/// leader that cannot serve: removed, or without its quorum).
fn not_leader(c: &Cluster) -> Option<Reply> {
    Some(match c.node().refusal()? {
        ClusterError::NotLeader {
            leader: Some((_, m)),
        } => error(format!("MOVED 0 {}", m.client_addr)),
        ClusterError::NotLeader { leader: None } => {
            error("TRYAGAIN no leader yet: an election is in progress")
        }
        other => error(format!("CLUSTERDOWN {other}")),
    })
}

/// `CLUSTER ADDNODE id raft_addr client_addr`: adds a node as a learner,
/// waits until it has caught up (by snapshot when far behind), then makes
/// it a voter.
///
/// The node is asked its incarnation first (its data directory's, over the
/// peer protocol), and the group admits that one. A member of the same id
/// and another incarnation (its disk was replaced or wiped, and it starts
/// again empty) is taken out first — out of the voters and the members —
/// so the new disk never uses the old voter's place: peers that still
/// list the old incarnation are refused by it, and it votes only once the
/// group has made the new incarnation a voter, after it caught up. Every
/// step is an incremental change (remove this voter, add this voter), so a
/// concurrent change is never undone. Asking again for a node that is a
/// voter with this incarnation already answers OK.
async fn add_node(c: &Cluster, id: &[u8], raft: &[u8], client: &[u8]) -> Reply {
    if let Some(r) = not_leader(c) {
        return r;
    }
    let Some(id) = parse_id(id) else {
        return error("ERR the node id must be an integer from 1");
    };
    let node = c.node();
    let raft_addr = String::from_utf8_lossy(raft).into_owned();
    let incarnation = match node.probe(id, &raft_addr).await {
        Ok(n) => n,
        Err(e) => return error(format!("ERR asking node {id} its incarnation: {e}")),
    };
    let member = Member {
        raft_addr,
        client_addr: String::from_utf8_lossy(client).into_owned(),
        incarnation,
    };
    let status = node.status();
    match status.members.get(&id) {
        Some((m, true)) if *m == member => return Reply::ok(),
        Some((m, _)) if *m == member => {}
        Some((old, voter)) => {
            if id == c.config().node_id {
                return error("ERR this node leads: it cannot add itself again");
            }
            tracing::info!(
                event = "cluster_node_replaced",
                node = id,
                old = format!("{:016x}", old.incarnation),
                new = format!("{incarnation:016x}"),
                "a member comes back as another incarnation (or address): taken out first"
            );
            let ids = BTreeSet::from([id]);
            let change = if *voter {
                ChangeMembers::RemoveVoters(ids)
            } else {
                ChangeMembers::RemoveNodes(ids)
            };
            if let Err(e) = node.change_members(change).await {
                return error(format!("ERR taking node {id} out first: {e}"));
            }
        }
        None => {}
    }
    if let Err(e) = node.add_learner(id, member).await {
        return error(format!("ERR adding node {id} as a learner: {e}"));
    }
    match node
        .change_members(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
        .await
    {
        Ok(()) => {
            tracing::info!(
                event = "cluster_node_added",
                node = id,
                incarnation = format!("{incarnation:016x}"),
                "node added as a voter"
            );
            Reply::ok()
        }
        Err(e) => error(format!("ERR making node {id} a voter: {e}")),
    }
}

/// `CLUSTER REMOVENODE id`: takes a node out of the cluster (an
/// incremental change: concurrent ones are not undone).
async fn remove_node(c: &Cluster, id: &[u8]) -> Reply {
    if let Some(r) = not_leader(c) {
        return r;
    }
    let Some(id) = parse_id(id) else {
        return error("ERR the node id must be an integer from 1");
    };
    let status = c.node().status();
    let Some((_, voter)) = status.members.get(&id) else {
        return error(format!("ERR node {id} is not a member"));
    };
    let others = status
        .members
        .iter()
        .filter(|(m, (_, v))| *v && **m != id)
        .count();
    if others == 0 {
        return error("ERR the last voter cannot be removed");
    }
    let ids = BTreeSet::from([id]);
    let change = if *voter {
        ChangeMembers::RemoveVoters(ids)
    } else {
        ChangeMembers::RemoveNodes(ids)
    };
    match c.node().change_members(change).await {
        Ok(()) => {
            tracing::info!(event = "cluster_node_removed", node = id, "node removed");
            Reply::ok()
        }
        Err(e) => error(format!("ERR removing node {id}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis() {
        // Values from Redis' CLUSTER KEYSLOT.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b""), 0);
    }
}
