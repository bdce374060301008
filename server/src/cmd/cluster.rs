//! The cluster commands: `CLUSTER …` (slots, nodes, membership) and
//! `READONLY`, `READWRITE`, `ASKING`, which cluster clients send. The
//! store answers them: a group describes itself; a single node answers
//! that cluster support is disabled, in Redis' words.

use std::sync::Arc;

use bytes::Bytes;

use crate::command_table::*;
use crate::context::Context;
use crate::outcome::Outcome;
use crate::protocol::{ArgRef, Reply};
use crate::store::CLUSTER_DISABLED;

/// The cluster commands' specs, in the order `docs/COMMANDS.md` lists
/// them.
pub static SPECS: &[CommandSpec] = &[
    with_subcommands(
        cmd(
            "CLUSTER",
            -2,
            &[],
            NO_KEYS,
            &["@slow"],
            "cluster",
            "The cluster: its slots, nodes and Raft state, and membership changes (a single node answers that cluster support is disabled)",
            "Depends on subcommand",
            &[],
        ),
        &[
            cmd(
                "CLUSTER|SLOTS",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The slot ranges and the nodes serving them (one group owns all 16384 slots; the leader first)",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|SHARDS",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The shard: every slot, and every node with its role and replication offset",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|NODES",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "Every node in Redis' line format",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|INFO",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The cluster's state, and this node's Raft state: term, leader, log, commit and applied indexes, lag per replica",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|MYID",
                2,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "This node's id (40 hex digits)",
                "O(N) where N is the number of nodes",
                &[],
            ),
            cmd(
                "CLUSTER|KEYSLOT",
                3,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow"],
                "cluster",
                "The hash slot of a key",
                "O(N) where N is the number of nodes",
                &[string("key")],
            ),
            cmd(
                "CLUSTER|ADDNODE",
                5,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@admin", "@dangerous"],
                "cluster",
                "Adds a node: a learner until it has caught up, then a voter (on the leader)",
                "O(N) where N is the number of nodes",
                &[
                    integer("node_id"),
                    string("raft_addr"),
                    string("client_addr"),
                ],
            ),
            cmd(
                "CLUSTER|REMOVENODE",
                3,
                &["loading", "stale"],
                NO_KEYS,
                &["@slow", "@admin", "@dangerous"],
                "cluster",
                "Removes a node from the cluster (on the leader)",
                "O(N) where N is the number of nodes",
                &[integer("node_id")],
            ),
        ],
    ),
    cmd(
        "READONLY",
        1,
        &["loading", "stale", "fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "cluster",
        "Accepted for cluster clients; reads are always served by the leader",
        "O(1)",
        &[],
    ),
    cmd(
        "READWRITE",
        1,
        &["loading", "stale", "fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "cluster",
        "Accepted for cluster clients (the default)",
        "O(1)",
        &[],
    ),
    cmd(
        "ASKING",
        1,
        &["fast"],
        NO_KEYS,
        &["@fast", "@connection"],
        "cluster",
        "Accepted for cluster clients (no slot ever migrates)",
        "O(1)",
        &[],
    ),
];

/// `CLUSTER subcommand …`
pub async fn cluster(ctx: &Arc<Context>, a: &[ArgRef<'_>]) -> Outcome {
    let a: Vec<Bytes> = a.iter().map(ArgRef::to_bytes).collect();
    Outcome::Reply(ctx.store.cluster(&a).await)
}

/// `READONLY`, `READWRITE`, `ASKING`: accepted by a group (reads always
/// go to the leader, no slot ever migrates).
pub fn client_mode(ctx: &Context, a: &[ArgRef<'_>]) -> Outcome {
    if a.is_empty() {
        Outcome::Reply(ctx.store.cluster_client())
    } else {
        Outcome::Reply(Reply::Error(CLUSTER_DISABLED.into()))
    }
}
