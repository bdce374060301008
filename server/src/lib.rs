//! # fencelog-server
//!
//! fencelog over the Redis protocol (RESP2 and RESP3), so that `redis-cli`,
//! `redis-benchmark` and every Redis client library are its clients; and the
//! `fencelog` command line (`serve`, `verify`, `repair`, `dump`, `cluster`).
//! The load generator behind `fencelog bench` is the `fencelog-bench`
//! crate: the binary dispatches to it, this library never imports it.
//!
//! The contract is SPEC.md §6–7. A connection's pipelined writes are decided
//! in the order they arrive and answered once durable, so a burst of
//! pipelined appends shares one group commit.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod budget;
pub mod clients;
pub mod clock;
pub mod cluster;
pub mod cmd;
pub mod command_table;
pub mod config;
pub mod connection;
pub mod context;
pub mod dump;
pub mod fds;
pub mod glob;
pub mod info;
pub mod logging;
pub mod metrics;
pub mod outcome;
pub mod protocol;
mod read_round;
pub mod repair;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod store;
pub mod verify;
pub mod wake_gate;
