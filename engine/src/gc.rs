//! Garbage collection, on a thread of its own: a sealed segment is removed
//! once no stream has a readable record in it, the entry that made it so
//! is durable, and a newer checkpoint is durable (so recovery never needs
//! it). Unlinking files and syncing the directory never runs on a caller's
//! thread or an async runtime's.
//!
//! The collector counts, for every sealed segment, the streams with live
//! records there. A segment is counted when it is sealed (from what the
//! engine knew of it then), or, for segments older than the last open,
//! by reading its footer once after the open, in the background. A trim
//! walks back through the segments the stream leaves, following the links
//! its footers keep, and lowers each one's count. Counts use the
//! collector's own copy of each stream's start, moved only as it handles
//! trims, in log order: a segment is never counted against a start the
//! collector has not seen, nor lowered twice for the same stream.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fencelog_wal::{Removal, Wal};
use hashbrown::HashMap;

use crate::core::Core;
use crate::locate::Locator;
use crate::view::StreamView;

/// What the collector is told.
enum Msg {
    /// A segment's footer is durable: each stream in it, with where its
    /// records there end.
    Sealed {
        segment: u64,
        ends: Vec<(u64, u64)>,
    },
    /// A stream's start moved (durably) to `start`.
    Trimmed {
        view: Arc<StreamView>,
        start: u64,
    },
    /// Count these segments (older than the last open) from their footers.
    Count(Vec<u64>),
    /// Answer once everything before is handled, every segment counted,
    /// and every removable segment tried.
    Barrier(Sender<()>),
    Stop,
}

/// How long the collector gathers trims that come one after another before
/// it follows them (see `Collector::trimmed`).
const TRIM_GATHER: Duration = Duration::from_millis(10);

/// At most this many trims are followed in one walk.
const MAX_TRIMS_GATHERED: usize = 1 << 16;

/// One stream's trim being followed through its segments: its records
/// below `start` are gone, those below `old` were gone before.
#[derive(Clone, Copy)]
struct Walk {
    id: u64,
    old: u64,
    start: u64,
}

/// Where the engine's effects reach the collector. Messages sent before
/// the collector starts (during recovery) wait for it.
#[derive(Clone)]
pub(crate) struct GcHandle {
    tx: Sender<Msg>,
}

impl GcHandle {
    pub(crate) fn sealed(&self, segment: u64, ends: Vec<(u64, u64)>) {
        let _ = self.tx.send(Msg::Sealed { segment, ends });
    }

    pub(crate) fn trimmed(&self, view: Arc<StreamView>, start: u64) {
        let _ = self.tx.send(Msg::Trimmed { view, start });
    }
}

/// The collector's counters, read by `Log::metrics`.
#[derive(Default)]
pub(crate) struct GcStats {
    /// Sealed segments not yet counted (after an open).
    pub uncounted: AtomicU64,
    /// Segments whose footer could not be read: kept, never removed.
    pub unreadable: AtomicU64,
    /// Removals that failed (retried later).
    pub errors: AtomicU64,
}

/// The running collector.
pub(crate) struct Gc {
    handle: GcHandle,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<GcStats>,
}

/// A channel for the collector, made before recovery so that the effects
/// replay produces are queued for it.
pub(crate) fn channel_for_gc() -> (GcHandle, GcInbox) {
    let (tx, rx) = channel();
    (GcHandle { tx }, GcInbox { rx })
}

/// The receiving end, until the collector starts.
pub(crate) struct GcInbox {
    rx: Receiver<Msg>,
}

impl Gc {
    /// Starts the collector on its thread. `starts` is every stream's start
    /// offset after recovery; `uncounted` the sealed segments older than
    /// what recovery replayed.
    pub(crate) fn start(
        handle: GcHandle,
        inbox: GcInbox,
        wal: Arc<Wal<Core>>,
        locator: Arc<Locator>,
        starts: HashMap<u64, u64>,
        uncounted: Vec<u64>,
    ) -> std::io::Result<Gc> {
        let stats = Arc::new(GcStats::default());
        stats
            .uncounted
            .store(uncounted.len() as u64, Ordering::Relaxed);
        let _ = handle.tx.send(Msg::Count(uncounted));
        let inline_io = wal.options().inline_io;
        let mut collector = Collector {
            wal,
            locator,
            starts,
            live: BTreeMap::new(),
            uncounted: BTreeSet::new(),
            dead: BTreeSet::new(),
            stats: Arc::clone(&stats),
        };
        // A log with inline I/O (deterministic simulation: no thread may
        // touch the storage on its own time) runs no collector: its inbox
        // is dropped, so messages to it and barriers answer at once, and
        // no segment is ever removed.
        if inline_io {
            drop(inbox);
            return Ok(Gc {
                handle,
                thread: None,
                stats,
            });
        }
        let thread = std::thread::Builder::new()
            .name("fencelog-gc".into())
            .spawn(move || collector.run(inbox.rx))?;
        Ok(Gc {
            handle,
            thread: Some(thread),
            stats,
        })
    }

    /// Waits until the collector has handled everything sent before, has
    /// counted every segment, and has tried to remove every dead one.
    pub(crate) fn barrier(&self) {
        let (tx, rx) = channel();
        if self.handle.tx.send(Msg::Barrier(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// Stops the collector and waits for it.
    pub(crate) fn stop(&mut self) {
        let _ = self.handle.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            // A collector stopped from its own thread (the last handle of
            // the log dropped there) must not wait for itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Gc {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Collector {
    wal: Arc<Wal<Core>>,
    locator: Arc<Locator>,
    /// The collector's copy of every stream's start offset, by id.
    starts: HashMap<u64, u64>,
    /// Counted segments with live records, and how many streams have them.
    live: BTreeMap<u64, u32>,
    /// Sealed segments not counted yet.
    uncounted: BTreeSet<u64>,
    /// Segments with no live record, waiting to be removable.
    dead: BTreeSet<u64>,
    stats: Arc<GcStats>,
}

impl Collector {
    fn run(&mut self, rx: Receiver<Msg>) {
        // A message read past a run of trims, handled next.
        let mut next: Option<Msg> = None;
        loop {
            // Block while there is nothing to count; otherwise count one
            // segment between messages, so that trims are never held up by
            // a long count after open.
            let msg = if next.is_some() {
                next.take()
            } else if self.uncounted.is_empty() {
                // Dead segments not yet removable are retried now and then
                // (a newer checkpoint may have become durable).
                let wait = if self.dead.is_empty() {
                    Duration::from_secs(3600)
                } else {
                    Duration::from_millis(500)
                };
                match rx.recv_timeout(wait) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                rx.try_recv().ok()
            };
            match msg {
                Some(Msg::Stop) => return,
                Some(Msg::Sealed { segment, ends }) => {
                    self.count_from(segment, ends.into_iter());
                    self.remove_dead();
                }
                Some(Msg::Trimmed { view, start }) => {
                    // The trims that follow within `TRIM_GATHER` are
                    // followed with this one, in one walk that reads each
                    // footer once: a client that deletes fifty streams
                    // spread over every segment would otherwise have every
                    // footer read fifty times (each is about a tenth of its
                    // segment). Collection is never in a hurry.
                    let mut trims = vec![(view, start)];
                    let until = Instant::now() + TRIM_GATHER;
                    while trims.len() < MAX_TRIMS_GATHERED {
                        let wait = until.saturating_duration_since(Instant::now());
                        match rx.recv_timeout(wait) {
                            Ok(Msg::Trimmed { view, start }) => trims.push((view, start)),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.trimmed(trims);
                    self.remove_dead();
                }
                Some(Msg::Count(segments)) => self.uncounted.extend(segments),
                Some(Msg::Barrier(done)) => {
                    while self.count_next() {}
                    self.remove_dead();
                    let _ = done.send(());
                }
                None => {
                    self.count_next();
                    self.remove_dead();
                }
            }
        }
    }

    /// Counts the oldest uncounted segment from its footer; false when
    /// there is none left.
    fn count_next(&mut self) -> bool {
        let Some(segment) = self.uncounted.pop_first() else {
            return false;
        };
        self.stats
            .uncounted
            .store(self.uncounted.len() as u64, Ordering::Relaxed);
        match self.locator.footer(&self.wal, segment) {
            Ok(Some(index)) => {
                let ends: Vec<(u64, u64)> =
                    index.dirs().map(|(id, d)| (id, d.end_offset)).collect();
                self.count_from(segment, ends.into_iter());
            }
            // Removed meanwhile, or not sealed: nothing to count.
            Ok(None) => {}
            // Kept, never removed: without its footer nothing proves its
            // records dead.
            Err(e) => {
                self.stats.unreadable.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(segment, error = %e, "segment footer unreadable: the segment is kept");
            }
        }
        true
    }

    fn count_from(&mut self, segment: u64, ends: impl Iterator<Item = (u64, u64)>) {
        self.uncounted.remove(&segment);
        let live = ends
            .filter(|&(id, end)| end > self.starts.get(&id).copied().unwrap_or(0))
            .count() as u32;
        if live == 0 {
            self.dead.insert(segment);
        } else {
            self.live.insert(segment, live);
        }
    }

    /// Streams' starts moved: every counted segment whose records of a
    /// stream all lie between the stream's old start and its new one loses
    /// it. Each stream's segments are linked newest to oldest by their
    /// footers; the links of every stream trimmed here are followed
    /// together, newest segment first, so that each footer is read once
    /// however many streams pass through it.
    fn trimmed(&mut self, trims: Vec<(Arc<StreamView>, u64)>) {
        // Per stream, the span its start moved over (a stream trimmed twice
        // here moves once, from its first old start to its last new one).
        let mut moved: HashMap<u64, (Arc<StreamView>, Walk)> = HashMap::new();
        for (view, start) in trims {
            let id = view.id;
            let old = self.starts.get(&id).copied().unwrap_or(0);
            if start <= old {
                continue;
            }
            self.starts.insert(id, start);
            moved
                .entry(id)
                .and_modify(|(_, walk)| walk.start = start)
                .or_insert((view, Walk { id, old, start }));
        }
        // Segment → the walks that visit it next.
        let mut due: BTreeMap<u64, Vec<Walk>> = BTreeMap::new();
        for (view, walk) in moved.into_values() {
            let (sealed_end, last_sealed) = {
                let ix = view.index.read();
                (ix.sealed_end, ix.last_sealed)
            };
            // The newest sealed segment the trim reaches into.
            let from = if walk.start > sealed_end {
                last_sealed
            } else {
                match self.locator.locate(&self.wal, &view, walk.start - 1) {
                    Ok(found) => found.segment,
                    Err(e) => {
                        tracing::warn!(stream = ?view.name, error = %e, "cannot follow a trim: its segments stay");
                        continue;
                    }
                }
            };
            if from != 0 {
                due.entry(from).or_default().push(walk);
            }
        }
        while let Some((segment, walks)) = due.pop_last() {
            let index = match self.locator.footer(&self.wal, segment) {
                Ok(Some(index)) => index,
                // Removed before: its records were all dead already.
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(segment, error = %e, "segment footer unreadable while following a trim");
                    continue;
                }
            };
            for walk in walks {
                let Some(dir) = index.stream(walk.id) else {
                    continue;
                };
                if dir.end_offset <= walk.old {
                    continue;
                }
                if dir.end_offset <= walk.start
                    && let Some(n) = self.live.get_mut(&segment)
                {
                    *n -= 1;
                    if *n == 0 {
                        self.live.remove(&segment);
                        self.dead.insert(segment);
                    }
                }
                // Links go to older segments only; anything else ends the
                // walk rather than loop.
                if dir.prev_segment != 0 && dir.prev_segment < segment {
                    due.entry(dir.prev_segment).or_default().push(walk);
                }
            }
        }
    }

    /// Removes every dead segment recovery no longer needs.
    fn remove_dead(&mut self) {
        let dead: Vec<u64> = self.dead.iter().copied().collect();
        for segment in dead {
            match self.wal.remove_segment(segment) {
                Ok(Removal::Removed | Removal::Absent) => {
                    self.dead.remove(&segment);
                    self.locator.forget(segment);
                }
                // Needed until a newer checkpoint is durable; older ones
                // are not removable either.
                Ok(Removal::NotYet) => break,
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(segment, error = %e, "removing a dead segment failed; will retry");
                    break;
                }
            }
        }
    }
}
