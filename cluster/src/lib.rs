//! # fencelog-cluster
//!
//! Cluster mode: a group of 3 (or 5) fencelog replicas that replicate one
//! log through Raft ([openraft](https://docs.rs/openraft)), so that losing a
//! machine loses nothing and a lock holder's late write stays fenced across
//! leader changes.
//!
//! - The **Raft log** is fencelog's write-ahead log ([`log_store`]): group
//!   commit kept, one `fdatasync` per batch on every replica.
//! - The **state machine** is the fencelog engine in cluster mode
//!   ([`state_machine`]): the stream and lease tables, every fencing
//!   decision taken when an entry is applied, in log order, so every
//!   replica reaches the same highest tokens, offsets and lease counter.
//! - A write is answered once a majority holds it and the leader applied
//!   it; a read first confirms leadership with a quorum (ReadIndex), so a
//!   deposed leader never answers a read that misses a committed write.
//! - A new leader's first entry takes over the leases: every live lease is
//!   held for its full ttl from then (the old leader's clock cannot be
//!   trusted).

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![warn(missing_docs)]
// openraft's storage traits answer its own (large) StorageError.
#![allow(clippy::result_large_err)]

mod batcher;
mod codec;
mod comeback;
mod election;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod health;
pub mod incarnation;
pub mod log_store;
pub mod network;
pub mod node;
mod reads;
mod request_v1;
mod slices;
mod snapshot;
pub mod state_machine;
mod timings;
pub mod types;

pub use batcher::{IN_FLIGHT as DEFAULT_ENTRIES_IN_FLIGHT, MAX_IN_FLIGHT as MAX_ENTRIES_IN_FLIGHT};
pub use codec::FormatError;
pub use comeback::Waits as ComebackWaits;
pub use network::{
    ClusterSecret, PeerEndpoint, PeerError, PeerReply, PeerRequest, Transport, TransportFuture,
};
pub use node::{
    ClusterError, Health, Hooks, LocalClock, Node, NodeConfig, Proposal, Proposals, Queued, Status,
    wait_for_leader,
};
pub use openraft::ChangeMembers;
pub use snapshot::SnapshotFile;
pub use timings::{Steps, Timed};
pub use types::{Member, NodeId, REQUEST_VERSION, Request, Response, Responses, WireError};
