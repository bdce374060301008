//! # fencelog-bench
//!
//! The load generator of `fencelog bench` (SPEC.md §7), kept out of the
//! server's library so that production code never links a benchmark:
//!
//! - [`bench`]: durable appends and stale-write rejections, in process (the
//!   engine's API) or against a server over TCP, with a summary table or
//!   JSON; `--compare-redis` runs the same load against redis-server.
//! - [`history`]: `--history`, the endurance run (segments, disk, memory,
//!   checkpoint size over time).
//!
//! The `fencelog` binary (in `server/`) dispatches `fencelog bench` here;
//! [`run`] with [`BenchArgs`] is all it needs.
//!
//! The load generator speaks RESP2 through `fencelog-client`'s
//! [`Pipeline`](fencelog_client::Pipeline): it sends P requests before
//! reading P answers, each judged where it lies in the read buffer.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod bench;
pub mod history;

pub use bench::{BenchArgs, run};
