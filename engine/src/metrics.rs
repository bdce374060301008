//! Counters of the engine, exported by the server (INFO, /metrics).

use std::sync::atomic::AtomicU64;

use fencelog_wal::{StripedCounter as Counter, WalStatsSnapshot};

#[derive(Default)]
pub(crate) struct Counters {
    pub transactions: Counter,
    pub appends: Counter,
    pub records: Counter,
    pub bytes: Counter,
    pub stale: Counter,
    pub mismatches: Counter,
    pub fences: Counter,
    pub trims: Counter,
    pub deletes: Counter,
    pub reads: Counter,
    pub records_read: Counter,
    pub retries: Counter,
    pub leases_acquired: Counter,
    pub leases_renewed: Counter,
    pub leases_lost: Counter,
    pub leases_released: Counter,
    pub leases_held: Counter,
    pub lease_waiting: AtomicU64,
}

/// A copy of the engine's counters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Metrics {
    /// Transactions applied (their ops are counted below too).
    pub transactions: u64,
    /// Accepted appends (plain and conditional).
    pub appends: u64,
    /// Records appended.
    pub records: u64,
    /// Payload bytes appended.
    pub bytes: u64,
    /// Writes rejected because their token was stale.
    pub stale_rejections: u64,
    /// Conditional appends rejected for their expected offset.
    pub mismatches: u64,
    /// Conditional appends answered as a retry of one that succeeded.
    pub idempotent_retries: u64,
    /// Accepted fences.
    pub fences: u64,
    /// Accepted trims.
    pub trims: u64,
    /// Accepted deletes.
    pub deletes: u64,
    /// Reads answered.
    pub reads: u64,
    /// Records read.
    pub records_read: u64,
    /// Streams that hold records or a token.
    pub streams: u64,
    /// Leases granted.
    pub leases_acquired: u64,
    /// Leases renewed.
    pub leases_renewed: u64,
    /// Renewals refused because the lease was lost (expired or replaced).
    pub leases_lost: u64,
    /// Leases released.
    pub leases_released: u64,
    /// Leases that expired.
    pub leases_expired: u64,
    /// Acquisitions refused because the lease was held.
    pub leases_held: u64,
    /// Acquisitions waiting for a lease right now.
    pub lease_waiting: u64,
    /// Leases alive now.
    pub leases_live: u64,
    /// The last token the lease counter issued.
    pub last_lease_token: u64,
    /// Every stream's highest token is at least this (raised when recovery
    /// cuts entries; 0 otherwise).
    pub token_floor: u64,
    /// Every token acknowledged is at most this (durable in `MARKS`).
    pub token_ceiling: u64,
    /// Segment files in the log.
    pub segments: u64,
    /// Segments older than the last open that garbage collection has not
    /// looked at yet.
    pub segments_uncounted: u64,
    /// The write-ahead log's counters: syncs, their latency, batch sizes.
    pub wal: WalStatsSnapshot,
}
