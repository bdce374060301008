//! Counters and histograms of the log, cheap enough for every sync.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Debug, Default)]
struct Padded(AtomicU64);

/// A counter split over cache lines: threads on different cores count
/// without fighting over one line. A counter that every request adds to
/// (the engine's stale rejections, a server's commands) is written by
/// every thread serving requests; on one shared line, each add on one
/// core took the line from the other (`perf`: a rate limiter's one shared
/// add cost 5 % of a pipelined rejection's user CPU, three times its share
/// of instructions).
#[derive(Debug)]
pub struct StripedCounter {
    cells: [Padded; STRIPES],
}

impl Default for StripedCounter {
    fn default() -> Self {
        StripedCounter {
            cells: std::array::from_fn(|_| Padded::default()),
        }
    }
}

thread_local! {
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's stripe: threads take stripes round robin as they first
/// count.
fn stripe() -> usize {
    STRIPE.with(|s| {
        if s.get() == usize::MAX {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            s.set(NEXT.fetch_add(1, Ordering::Relaxed) as usize % STRIPES);
        }
        s.get()
    })
}

impl StripedCounter {
    /// Zero.
    pub fn new() -> StripedCounter {
        StripedCounter::default()
    }

    /// Adds `n` on this thread's stripe.
    pub fn add(&self, n: u64) {
        self.cells[stripe()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count: the sum of the stripes.
    pub fn get(&self) -> u64 {
        self.cells.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }

    /// The count, leaving zero: each stripe is taken whole, so an add that
    /// races with this counts either now or in the next take, never
    /// twice or not at all.
    pub fn take(&self) -> u64 {
        self.cells
            .iter()
            .map(|c| c.0.swap(0, Ordering::AcqRel))
            .sum()
    }
}

const BUCKETS: usize = 40;

/// A histogram of `u64` values in power-of-two buckets: bucket 0 holds 0,
/// bucket `i` holds values in `[2^(i-1), 2^i)`.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one value.
    pub fn record(&self, value: u64) {
        self.record_n(value, 1);
    }

    /// Records `n` occurrences of one value (each entry of a batch that
    /// waited as long).
    pub fn record_n(&self, value: u64, n: u64) {
        let bucket = ((u64::BITS - value.leading_zeros()) as usize).min(BUCKETS - 1);
        self.buckets[bucket].fetch_add(n, Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
        self.sum
            .fetch_add(value.saturating_mul(n), Ordering::Relaxed);
    }

    /// A consistent-enough copy for reporting.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A copy of a [`Histogram`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Counts per power-of-two bucket (see [`Histogram`]).
    pub buckets: [u64; BUCKETS],
    /// Number of values recorded.
    pub count: u64,
    /// Sum of the values recorded.
    pub sum: u64,
}

impl HistogramSnapshot {
    /// The mean, or 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// An upper bound of the `q`-quantile (`0.0..=1.0`): the top of the
    /// bucket that holds it.
    pub fn quantile_upper_bound(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return if i == 0 { 0 } else { (1u64 << i) - 1 };
            }
        }
        u64::MAX
    }

    /// Bucket upper bounds and cumulative counts, for Prometheus-style export.
    pub fn cumulative(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut seen = 0;
        self.buckets.iter().enumerate().map(move |(i, &n)| {
            seen += n;
            let upper = if i == 0 { 0 } else { (1u64 << i) - 1 };
            (upper, seen)
        })
    }
}

/// Live counters of a log.
#[derive(Debug, Default)]
pub struct WalStats {
    pub(crate) syncs: AtomicU64,
    pub(crate) entries: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) segments_created: AtomicU64,
    pub(crate) segments_sealed: AtomicU64,
    pub(crate) segments_removed: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
    pub(crate) links: AtomicU64,
    pub(crate) last_checkpoint_bytes: AtomicU64,
    pub(crate) marks_writes: AtomicU64,
    pub(crate) oversized_checkpoints: AtomicU64,
    pub(crate) sync_micros: Histogram,
    pub(crate) batch_entries: Histogram,
    pub(crate) sync_idle_micros: AtomicU64,
    pub(crate) pass_waits: AtomicU64,
    pub(crate) pass_wait_micros: AtomicU64,
    pub(crate) comeback_waits: AtomicU64,
    pub(crate) comeback_wait_micros: AtomicU64,
    pub(crate) comeback_ran_out: AtomicU64,
    pub(crate) writebacks_started: AtomicU64,
    pub(crate) writebacks_failed: AtomicU64,
    pub(crate) direct_writes: AtomicU64,
    pub(crate) footers_read: AtomicU64,
    pub(crate) commit_micros: Histogram,
}

/// A copy of a log's counters.
#[derive(Debug, Clone)]
pub struct WalStatsSnapshot {
    /// Group commits completed (one write and one `fdatasync` each, plus the
    /// syncs of a segment seal).
    pub syncs: u64,
    /// Entries made durable.
    pub entries: u64,
    /// Bytes written to segments (entries, footers, trailers, headers).
    pub bytes_written: u64,
    /// Segment files created.
    pub segments_created: u64,
    /// Segments sealed.
    pub segments_sealed: u64,
    /// Segments removed by garbage collection.
    pub segments_removed: u64,
    /// Segments opened with a checkpoint (replay can start there).
    pub checkpoints: u64,
    /// Segments opened with a link instead (see [`crate::EntryKind::Link`]).
    pub links: u64,
    /// Bytes of the last checkpoint written.
    pub last_checkpoint_bytes: u64,
    /// Durable writes of the token marks (see `MARKS` in `docs/FORMAT.md`).
    pub marks_writes: u64,
    /// Checkpoints too large for one entry, written as links instead.
    pub oversized_checkpoints: u64,
    /// Segment files open now for reading (within the file budget).
    pub open_segment_files: u64,
    /// Segment files opened for reading so far.
    pub segment_files_opened: u64,
    /// Bytes of footers held in memory now (within their budget).
    pub footer_cache_bytes: u64,
    /// Footers read from disk so far (those the cache did not hold).
    pub footers_read: u64,
    /// Latency of each group commit's write + sync, in microseconds.
    pub sync_micros: HistogramSnapshot,
    /// Entries per group commit.
    pub batch_entries: HistogramSnapshot,
    /// Time the sync thread spent waiting for work, in microseconds: the
    /// rest of its time it was writing, syncing or waking waiters.
    pub sync_idle_micros: u64,
    /// Times the sync thread, with work pending, waited for the passes of
    /// event loops under way to end before it synced (see
    /// [`Turns`](crate::Turns)).
    pub pass_waits: u64,
    /// Time it spent in those waits, in microseconds.
    pub pass_wait_micros: u64,
    /// Times the sync thread, before a batch, waited for the writers of
    /// the batch before it to come back (see `comeback.rs`).
    pub comeback_waits: u64,
    /// Time it spent in those waits, in microseconds.
    pub comeback_wait_micros: u64,
    /// Those waits that ran out before enough writers came back.
    pub comeback_ran_out: u64,
    /// Without a sync per batch: times written bytes were handed to the
    /// disk ahead of a sync (`WalOptions::writeback_bytes`).
    pub writebacks_started: u64,
    /// Times the kernel refused such a hand-over (a hint lost, nothing
    /// else: the next sync writes the bytes).
    pub writebacks_failed: u64,
    /// Batches written around the page cache (`WalOptions::direct_io`);
    /// with the option on and none counted while batches are synced, the
    /// file system refused direct I/O and batches are written plainly.
    pub direct_writes: u64,
    /// Commit latency of each entry, in microseconds: from the moment the
    /// first entry of its group commit was submitted until that commit's
    /// sync returned (an upper bound of each entry's own wait; every entry
    /// of a batch counts once).
    pub commit_micros: HistogramSnapshot,
}

impl WalStats {
    /// A copy of every counter.
    pub fn snapshot(&self) -> WalStatsSnapshot {
        WalStatsSnapshot {
            syncs: self.syncs.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            segments_created: self.segments_created.load(Ordering::Relaxed),
            segments_sealed: self.segments_sealed.load(Ordering::Relaxed),
            segments_removed: self.segments_removed.load(Ordering::Relaxed),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            links: self.links.load(Ordering::Relaxed),
            last_checkpoint_bytes: self.last_checkpoint_bytes.load(Ordering::Relaxed),
            marks_writes: self.marks_writes.load(Ordering::Relaxed),
            oversized_checkpoints: self.oversized_checkpoints.load(Ordering::Relaxed),
            open_segment_files: 0,
            segment_files_opened: 0,
            footer_cache_bytes: 0,
            footers_read: self.footers_read.load(Ordering::Relaxed),
            sync_micros: self.sync_micros.snapshot(),
            batch_entries: self.batch_entries.snapshot(),
            sync_idle_micros: self.sync_idle_micros.load(Ordering::Relaxed),
            pass_waits: self.pass_waits.load(Ordering::Relaxed),
            pass_wait_micros: self.pass_wait_micros.load(Ordering::Relaxed),
            comeback_waits: self.comeback_waits.load(Ordering::Relaxed),
            comeback_wait_micros: self.comeback_wait_micros.load(Ordering::Relaxed),
            comeback_ran_out: self.comeback_ran_out.load(Ordering::Relaxed),
            writebacks_started: self.writebacks_started.load(Ordering::Relaxed),
            writebacks_failed: self.writebacks_failed.load(Ordering::Relaxed),
            direct_writes: self.direct_writes.load(Ordering::Relaxed),
            commit_micros: self.commit_micros.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_quantiles() {
        let h = Histogram::default();
        for v in [0, 1, 2, 3, 100, 1000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 6);
        assert_eq!(s.sum, 1106);
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[2], 2);
        assert_eq!(s.quantile_upper_bound(0.5), 3);
        assert_eq!(s.quantile_upper_bound(1.0), 1023);
        assert_eq!(s.cumulative().last(), Some(((1u64 << 39) - 1, 6)));
        h.record_n(5000, 10);
        let s = h.snapshot();
        assert_eq!((s.count, s.sum), (16, 51_106));
        assert_eq!(s.quantile_upper_bound(0.99), 8191);
    }

    /// Adds from several threads, each on a stripe of its own, all count:
    /// what the takes made meanwhile took plus what is left is every add,
    /// none twice.
    #[test]
    fn a_striped_counter_counts_every_add_once_across_threads_and_takes() {
        let c = std::sync::Arc::new(StripedCounter::new());
        let adders: Vec<_> = (0..4)
            .map(|t| {
                let c = std::sync::Arc::clone(&c);
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        c.add(1 + (i + t) % 3);
                    }
                })
            })
            .collect();
        let mut taken = 0;
        while !adders.iter().all(|a| a.is_finished()) {
            taken += c.take();
        }
        for a in adders {
            a.join().unwrap();
        }
        let want: u64 = (0..4u64)
            .map(|t| (0..10_000u64).map(|i| 1 + (i + t) % 3).sum::<u64>())
            .sum();
        assert_eq!(taken + c.get(), want);
        assert_eq!(c.take() + taken, want);
        assert_eq!(c.get(), 0);
    }
}
