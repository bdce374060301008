//! Configuration, checked once at open.

use crate::error::WalError;
use std::sync::Arc;

use crate::format::{HEADER_LEN, TRAILER_LEN};
use crate::turns::Turns;

/// What `open` does with damage it finds while recovering the log's tail.
///
/// Whatever the mode, an entry whose sync completed is never dropped
/// silently: either open fails, or the [`RecoveryReport`](crate::RecoveryReport)
/// says what was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoveryMode {
    /// Refuse to open on any damage, even a torn tail left by a power cut.
    AbsoluteConsistency,
    /// Cut a torn tail (entries of the last, never-acknowledged sync that
    /// reached the disk partly); refuse to open on anything else. The default.
    #[default]
    TolerateTornTail,
    /// Keep the valid prefix and cut at the first damage, even damage to
    /// acknowledged entries. The damaged segment is copied aside first
    /// (`<name>.damaged`), later segments are renamed to `<name>.damaged`,
    /// and the report names what was cut.
    Salvage,
}

/// How new segments are prepared. Segments are created ahead of need by a
/// background thread, so this never delays a sync; it decides what the
/// syncs that later write into the segment cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preallocation {
    /// Write zeros over the whole segment once, so that every later sync
    /// overwrites space that exists and is already written: no extent
    /// conversion or size change to journal. The fastest syncs, for one more
    /// sequential write of each segment. The default.
    #[default]
    Fill,
    /// Reserve the space with `fallocate`: no extra write, but the first
    /// write to each block converts an unwritten extent, which the file
    /// system journals with the sync.
    Reserve,
    /// Grow the file as entries are written.
    None,
}

/// Options of the write-ahead log. Every field documents its default.
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// Target size of a segment file in bytes; a segment is sealed once its
    /// entries pass it. Default 64 MiB. At least 64 KiB.
    pub segment_bytes: u64,
    /// Largest payload of one entry in bytes. Default 16 MiB.
    pub max_entry_bytes: u32,
    /// Bytes queued for the next sync beyond which submitters wait for the
    /// current sync to finish (backpressure). Default 4 MiB.
    pub max_batch_bytes: u64,
    /// How a new segment's space is made ready before entries go there.
    /// Default [`Preallocation::Fill`].
    pub preallocation: Preallocation,
    /// What to do with damage found at open. Default
    /// [`RecoveryMode::TolerateTornTail`].
    pub recovery: RecoveryMode,
    /// Most segment files kept open for reading at once (the file being
    /// written is extra). Default 64; at least 1. Reads of other segments
    /// open (and later close) their file.
    pub max_open_segments: usize,
    /// Most bytes of sealed segments' footers (their indexes) kept in
    /// memory. Default 32 MiB. A footer larger than this is read again
    /// at each use.
    pub footer_cache_bytes: usize,
    /// Sync every batch before it is acknowledged. Default true: an
    /// acknowledged entry is durable. False only where something else makes
    /// entries durable (a replica's state machine, whose replicated log
    /// does): batches are then acknowledged once written, and made durable
    /// by `Wal::sync_all`, by seals, and when the log closes. Such batches
    /// start no sync epoch (only a completed sync does), so after a power
    /// cut everything past the last completed sync is a torn tail, cut,
    /// whatever order its writes reached the disk in.
    pub sync_every_batch: bool,
    /// Without a sync per batch: once this many bytes of a segment are
    /// written and not yet handed to the disk, they are handed to it
    /// (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`, which starts the
    /// writes and does not wait for them), so that the page cache never
    /// holds a whole segment's worth of dirty pages for its seal's
    /// `fdatasync` (or `Wal::sync_all`) to write at once. That sync would
    /// otherwise hold the disk, and every other log's sync on it, for the
    /// time it takes to write the segment (about 100 ms for 64 MiB on this
    /// project's VM), and this log's writers for as long. Nothing is made
    /// durable by it. Default 1 MiB; 0: never. Unused with a sync per
    /// batch.
    pub writeback_bytes: u64,
    /// With a sync per batch and [`Preallocation::Fill`]: write batches
    /// around the page cache (`O_DIRECT`, where the file system has it), so
    /// that the kernel copies no entry into a page and the sync that follows
    /// writes nothing more. Each write then begins at the start of the disk
    /// block the batch begins in (its earlier bytes written again as they
    /// are, as the page cache would) and ends at the end of a block, in
    /// zeros. Reads go through the page cache as before; the kernel keeps
    /// the two coherent. Default true.
    pub direct_io: bool,
    /// Once a segment is sealed (synced, never written again), tell the
    /// kernel its pages may leave the page cache (`POSIX_FADV_DONTNEED`,
    /// as PostgreSQL does with WAL files nothing will read), on the
    /// allocator's thread: it takes milliseconds for a large segment. For a
    /// log read back only at recovery or by a reader far behind (a Raft log):
    /// its cache stays about two segments (the one being written and the
    /// next, made ahead), and the pages a seal frees are
    /// soon the ones the next segment is written into, instead of fresh
    /// memory. Reads of a sealed segment then come from the disk. Default
    /// false.
    pub uncache_sealed: bool,
    /// For deterministic simulation only (with the simulated storage):
    /// no sync thread and no segment allocator; the submitter that decides
    /// an entry writes and syncs its batch itself before it returns, and
    /// new segments are created when they are needed. Every file operation
    /// then happens on the caller's thread, in an order the caller alone
    /// decides. Default false (it gives up group commit and the
    /// preallocation ahead of need).
    pub inline_io: bool,
    /// Start writing a batch when the first of its tickets is awaited (or
    /// a submitter waits for room), not at every submit. Default false.
    /// For a caller that submits many entries before it waits for any (a
    /// replica's apply: one submit per write of a Raft entry), or whose
    /// entries nobody waits for ride with the next batch (a Raft log's
    /// commit marks): one wake-up of the sync thread and one write per
    /// wait instead of one per submit. Entries nobody waits for are
    /// written within 100 ms.
    pub flush_on_wait: bool,
    /// The event-loop threads that submit to this log, if they say when
    /// their passes begin and end: the sync thread then lets the passes
    /// under way finish before it syncs, so that one sync covers a pass
    /// (see [`Turns`]). Default none: a batch is synced as soon as the
    /// sync before it returned.
    pub turns: Option<Arc<Turns>>,
    /// With a sync per batch: after a sync, the sync thread waits before
    /// the next until most of the writers it just answered (three in four
    /// of the batch's entries) have submitted again, so that writers who
    /// wait for each answer share one sync instead of taking turns. The
    /// wait ends after eight times the last sync's time at most (and 1
    /// ms); a lone writer, and a log whose last two batches held 256
    /// entries or more, never wait; waits that run out make the next
    /// batches go without (see `comeback.rs`). While it waits, a blocked
    /// [`Ticket::wait`](crate::Ticket::wait) leaves the batch to it
    /// instead of writing it on its own thread. Default true.
    pub wait_for_writers: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            max_entry_bytes: 16 << 20,
            max_batch_bytes: 4 << 20,
            preallocation: Preallocation::default(),
            recovery: RecoveryMode::default(),
            max_open_segments: 64,
            footer_cache_bytes: 32 << 20,
            sync_every_batch: true,
            direct_io: true,
            writeback_bytes: 1 << 20,
            uncache_sealed: false,
            inline_io: false,
            flush_on_wait: false,
            turns: None,
            wait_for_writers: true,
        }
    }
}

impl WalOptions {
    /// Checks every option; `open` calls this.
    pub fn validate(&self) -> Result<(), WalError> {
        let invalid = |name, reason: String| Err(WalError::InvalidOptions { name, reason });
        if self.segment_bytes < 64 << 10 {
            return invalid(
                "segment_bytes",
                format!("{} is below the minimum of 65536", self.segment_bytes),
            );
        }
        // A footer indexes a segment's entries: kept well below the 4 GiB
        // its length field can say.
        if self.segment_bytes > 1 << 30 {
            return invalid(
                "segment_bytes",
                format!("{} is above the maximum of 1 GiB", self.segment_bytes),
            );
        }
        if self.max_open_segments == 0 {
            return invalid("max_open_segments", "must be at least 1".into());
        }
        if self.max_entry_bytes == 0 {
            return invalid("max_entry_bytes", "must be at least 1".into());
        }
        if u64::from(self.max_entry_bytes) > self.segment_bytes - HEADER_LEN - TRAILER_LEN {
            return invalid(
                "max_entry_bytes",
                format!(
                    "{} does not fit in a segment of {} bytes",
                    self.max_entry_bytes, self.segment_bytes
                ),
            );
        }
        if self.max_batch_bytes == 0 {
            return invalid("max_batch_bytes", "must be at least 1".into());
        }
        Ok(())
    }
}
