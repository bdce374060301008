//! The engine's options, checked once at open.

use std::time::Duration;

use fencelog_wal::WalOptions;

use crate::error::{Error, Result};

/// Options of a [`Log`](crate::Log). Every field documents its default.
#[derive(Debug, Clone)]
pub struct Options {
    /// The write-ahead log's options (segment size, entry limit, batch limit,
    /// preallocation, recovery mode). Defaults: 64 MiB segments, 16 MiB
    /// entries, 4 MiB batches, zero-filled segments, torn tails cut.
    pub wal: WalOptions,
    /// Largest payload of one record in bytes. Default 1 MiB.
    pub max_payload_bytes: u32,
    /// Most records in one append. Default 10 000.
    pub max_records_per_append: u32,
    /// Most records one read answers. Default 10 000.
    pub max_read_records: u32,
    /// Shortest lease ttl. Default 10 ms.
    pub lease_ttl_min: Duration,
    /// Longest lease ttl. Default 1 day.
    pub lease_ttl_max: Duration,
    /// Most leases alive at once. Default 1 000 000.
    pub max_live_leases: u64,
    /// Most streams (every name ever written keeps its highest token
    /// forever). Default 1 000 000; a write that would create one more is
    /// refused with [`Error::TooLarge`]. Bounds the checkpoint's size, which
    /// grows with the number of streams (about 60 bytes each plus the name).
    pub max_streams: u64,
    /// Memory for the index of sealed segments that reads use (parsed
    /// footers and checkpoint tables), most recently used kept. Default
    /// 64 MiB. More only speeds up reads of old records.
    pub index_cache_bytes: usize,
    /// Cluster mode: the log is a replica's state machine. Writes come only
    /// through [`Log::apply_replicated`](crate::Log::apply_replicated), in
    /// the replicated log's order; leases follow the leader's clock; no
    /// token marks are kept. Default false (a single node).
    pub replicated: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            wal: WalOptions::default(),
            max_payload_bytes: 1 << 20,
            max_records_per_append: 10_000,
            max_read_records: 10_000,
            lease_ttl_min: Duration::from_millis(10),
            lease_ttl_max: Duration::from_secs(24 * 3600),
            max_live_leases: 1_000_000,
            max_streams: 1_000_000,
            index_cache_bytes: 64 << 20,
            replicated: false,
        }
    }
}

impl Options {
    /// Checks every option; [`Log::open`](crate::Log::open) calls this.
    pub fn validate(&self) -> Result<()> {
        self.wal.validate()?;
        let invalid = |what, reason: String| Err(Error::Invalid { what, reason });
        if self.max_payload_bytes == 0 {
            return invalid("max_payload_bytes", "must be at least 1".into());
        }
        // One record of the largest payload must fit one entry with room for
        // the stream name and headers.
        let needed = u64::from(self.max_payload_bytes) + 512;
        if u64::from(self.wal.max_entry_bytes) < needed {
            return invalid(
                "max_payload_bytes",
                format!(
                    "{} does not fit in an entry of wal.max_entry_bytes = {} (needs {needed})",
                    self.max_payload_bytes, self.wal.max_entry_bytes
                ),
            );
        }
        if self.max_streams == 0 {
            return invalid("max_streams", "must be at least 1".into());
        }
        // A checkpoint row takes 56 bytes plus the name: keep the whole
        // checkpoint well below the 4 GiB an entry can hold.
        if self.max_streams > 12_000_000 {
            return invalid(
                "max_streams",
                format!("{} is above the maximum of 12 000 000", self.max_streams),
            );
        }
        if self.max_records_per_append == 0 || self.max_read_records == 0 {
            return invalid(
                "max_records_per_append / max_read_records",
                "must be at least 1".into(),
            );
        }
        if self.lease_ttl_min.is_zero() || self.lease_ttl_min > self.lease_ttl_max {
            return invalid(
                "lease_ttl_min / lease_ttl_max",
                format!(
                    "need 0 < min <= max, got {:?} and {:?}",
                    self.lease_ttl_min, self.lease_ttl_max
                ),
            );
        }
        Ok(())
    }
}
