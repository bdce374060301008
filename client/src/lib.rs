//! A client for fencelog: typed commands over RESP3 (or RESP2), cluster
//! routing, and leases that renew themselves and signal their loss.
//!
//! fencelog rejects a write whose fencing token is older than the newest
//! its stream has accepted. This crate makes carrying that token correct by
//! default: a [`Lease`] renews itself at a third of its ttl, its
//! [`Lease::lost`] future completes as soon as the lease can no longer be
//! trusted, its writes carry its token and are refused locally once it is
//! lost, and a write whose reply was lost is retried exactly once through
//! `LOG.APPENDAT` (which the server answers with the original offset if the
//! first try landed).
//!
//! Against a cluster the client asks `CLUSTER SLOTS` for the leader, follows
//! `-MOVED` and waits out `-TRYAGAIN` / `-CLUSTERDOWN` with a capped
//! exponential backoff. It asks a read again after a lost reply, but never
//! resends a write that may have reached the server: such a failure is
//! [`Error::Io`] or [`Error::Uncertain`] ([`Error::outcome_unknown`]).
//!
//! [`Pipeline`] sends many requests on one connection and reads their
//! replies in order, scalars without an allocation each (`fencelog bench`
//! drives the server with it).
//!
//! [`blocking::Client`] is the same client for code without async;
//! [`blocking::Pipeline`] a pipeline on a std socket, for a thread per
//! connection.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelog_client::{Client, Config, Error, LeaseOptions};
//!
//! # async fn run() -> Result<(), Error> {
//! let client = Client::connect(Config::new("127.0.0.1:7379")).await?;
//! let lease = client
//!     .lease("jobs", "worker-a", Duration::from_secs(10), LeaseOptions { fence: true, ..Default::default() })
//!     .await?;
//! let lost = lease.lost();
//! tokio::select! {
//!     why = lost => eprintln!("lease ended ({why:?}): stop the work"),
//!     r = lease.append("jobs", &["step 1"]) => println!("step 1 at offset {}", r?),
//! }
//! // A stale token is refused by the stream, with the numbers:
//! match client.append("jobs", lease.token() - 1, &["late"]).await {
//!     Err(Error::Stale { presented, highest }) => assert!(presented < highest),
//!     other => println!("{other:?}"),
//! }
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod blocking;
mod blocking_pipeline;
mod client;
mod conn;
mod error;
mod lease;
mod pipeline;
pub mod resp;

pub use client::{Client, Config, Grant, LeaseInfo, Record, StreamStat, Tail};
pub use error::Error;
pub use lease::{Lease, LeaseLoss, LeaseOptions};
pub use pipeline::{Pipeline, Request};
pub use resp::{Reply, ReplyLimits, Value};
