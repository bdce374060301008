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
//! trims: a segment is never counted against a start the collector has
//! not seen, nor lowered twice for the same stream.
//!
//! **Bounded.** Trims do not queue one message each: they wait merged
//! per stream (its highest start), with one message to say that some
//! wait, so what the collector has to catch up on is at most one entry
//! per stream however many trims come while it reads footers. So a trim
//! may be followed before a seal that came before it in the log (never
//! after one that came after it: its message, or the one it merged into,
//! is sent first). That is safe: a trim's walk lowers only segments
//! already counted, and a segment counted later is counted against the
//! newer start, so the stream is left out of its count from the start
//! instead of being taken out by the walk; each segment a stream leaves
//! is still lowered once (`tests::a_trim_before_the_seal_of_a_segment_it_empties`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fencelog_wal::{Removal, Wal};
use hashbrown::HashMap;
use parking_lot::Mutex;

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
    /// Trims wait in [`Trims`] (sent when the first of them came).
    Trims,
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

/// One stream's trim being followed through its segments: its records
/// below `start` are gone, those below `old` were gone before.
#[derive(Clone, Copy)]
struct Walk {
    id: u64,
    old: u64,
    start: u64,
}

/// A stream and the highest start it moved to (durably).
type Trim = (Arc<StreamView>, u64);

/// Trims not followed yet, by stream id.
#[derive(Clone, Default)]
struct Trims(Arc<Mutex<HashMap<u64, Trim>>>);

impl Trims {
    fn take(&self) -> Vec<Trim> {
        self.0.lock().drain().map(|(_, t)| t).collect()
    }
}

/// Where the engine's effects reach the collector. Messages sent before
/// the collector starts (during recovery) wait for it.
#[derive(Clone)]
pub(crate) struct GcHandle {
    tx: Sender<Msg>,
    trims: Trims,
}

impl GcHandle {
    pub(crate) fn sealed(&self, segment: u64, ends: Vec<(u64, u64)>) {
        let _ = self.tx.send(Msg::Sealed { segment, ends });
    }

    /// A stream's start moved (durably) to `start`.
    pub(crate) fn trimmed(&self, view: Arc<StreamView>, start: u64) {
        let mut trims = self.trims.0.lock();
        let first = trims.is_empty();
        let at = trims.entry(view.id).or_insert((view, start));
        at.1 = at.1.max(start);
        // Sent under the lock: the collector takes the trims only after
        // this message, or takes them with trims whose message it has not
        // handled yet.
        if first && self.tx.send(Msg::Trims).is_err() {
            // No collector (a log with inline I/O): nothing to keep.
            trims.clear();
        }
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
    let trims = Trims::default();
    (
        GcHandle {
            tx,
            trims: trims.clone(),
        },
        GcInbox { rx, trims },
    )
}

/// The receiving end, until the collector starts.
pub(crate) struct GcInbox {
    rx: Receiver<Msg>,
    trims: Trims,
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
            trims: inbox.trims.clone(),
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
    /// Trims waiting to be followed.
    trims: Trims,
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
                Some(Msg::Trims) => {
                    // The trims that come within `TRIM_GATHER` (or until
                    // another message) are followed with these, in one walk
                    // that reads each footer once: a client that deletes
                    // fifty streams spread over every segment would
                    // otherwise have every footer read fifty times (each is
                    // about a tenth of its segment). Collection is never in
                    // a hurry.
                    let until = Instant::now() + TRIM_GATHER;
                    loop {
                        let wait = until.saturating_duration_since(Instant::now());
                        match rx.recv_timeout(wait) {
                            // Trims taken by a barrier since: these wait
                            // with the rest.
                            Ok(Msg::Trims) => {}
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.follow_trims();
                    self.remove_dead();
                }
                Some(Msg::Count(segments)) => self.uncounted.extend(segments),
                Some(Msg::Barrier(done)) => {
                    self.follow_trims();
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

    /// Follows the trims waiting.
    fn follow_trims(&mut self) {
        let trims = self.trims.take();
        if !trims.is_empty() {
            self.trimmed(trims);
        }
    }

    /// Streams' starts moved: every counted segment whose records of a
    /// stream all lie between the stream's old start and its new one loses
    /// it. Each stream's segments are linked newest to oldest by their
    /// footers; the links of every stream trimmed here are followed
    /// together, newest segment first, so that each footer is read once
    /// however many streams pass through it.
    fn trimmed(&mut self, trims: Vec<Trim>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Log, Options, Token};
    use bytes::Bytes;

    const STREAMS: usize = 6;

    /// A sealed segment, with where each stream's records there end.
    type Sealed = (u64, Vec<(u64, u64)>);

    /// A log whose streams have records spread unevenly over dozens of
    /// sealed segments; each sealed segment with its streams' ends.
    fn written(dir: &std::path::Path) -> (Log, Vec<Arc<StreamView>>, Vec<Sealed>) {
        let mut o = Options::default();
        o.wal.segment_bytes = 64 << 10;
        o.wal.max_entry_bytes = 16 << 10;
        o.max_payload_bytes = 8 << 10;
        let log = Log::open(dir, o).unwrap();
        let t = Token::new(1).unwrap();
        for round in 0..600usize {
            for i in 0..STREAMS {
                if round % (i + 1) == 0 {
                    let name = format!("s{i}");
                    log.append(name.as_bytes(), t, &[Bytes::from(vec![i as u8; 1500])])
                        .unwrap();
                }
            }
        }
        let views = (0..STREAMS)
            .map(|i| log.inner().views.get(format!("s{i}").as_bytes()).unwrap())
            .collect();
        let inner = log.inner();
        let sealed = log
            .segments()
            .into_iter()
            .filter_map(|seg| {
                let ix = inner.locator.footer(&inner.wal, seg).unwrap()?;
                Some((seg, ix.dirs().map(|(id, d)| (id, d.end_offset)).collect()))
            })
            .collect();
        (log, views, sealed)
    }

    fn collector(log: &Log) -> Collector {
        Collector {
            trims: Trims::default(),
            wal: Arc::clone(&log.inner().wal),
            locator: Arc::clone(&log.inner().locator),
            starts: HashMap::new(),
            live: BTreeMap::new(),
            uncounted: BTreeSet::new(),
            dead: BTreeSet::new(),
            stats: Arc::default(),
        }
    }

    enum Event {
        Seal(u64, Vec<(u64, u64)>),
        Trim(usize, u64),
    }

    /// Trims wait merged per stream and may be followed before seals that
    /// came before them in the log (never after later ones): for any such
    /// order, every sealed segment ends up counted with exactly the
    /// streams that still have records in it (a segment lowered twice, or
    /// counted against a start it should not have been, would differ), as
    /// when every message is handled in log order.
    #[test]
    fn a_trim_before_the_seal_of_a_segment_it_empties() {
        let dir = tempfile::tempdir().unwrap();
        let (log, views, sealed) = written(dir.path());
        assert!(sealed.len() >= 30, "{} sealed segments", sealed.len());
        let ends: Vec<u64> = views
            .iter()
            .map(|v| v.next.load(Ordering::Acquire))
            .collect();

        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n.max(1)
        };
        for seed in 0..100 {
            // The log's order: seals, with trims of every stream between
            // them, each stream's starts rising to anywhere in its records.
            let mut events = Vec::new();
            let mut start = [0u64; STREAMS];
            for (seg, e) in &sealed {
                for (i, s) in start.iter_mut().enumerate() {
                    if rand(3) == 0 && *s < ends[i] {
                        *s += 1 + rand((ends[i] - *s).min(40));
                        events.push(Event::Trim(i, *s));
                    }
                }
                events.push(Event::Seal(*seg, e.clone()));
            }
            // What the counts must come to.
            let want: BTreeMap<u64, u32> = sealed
                .iter()
                .map(|(seg, e)| {
                    let live = e
                        .iter()
                        .filter(|&&(id, end)| {
                            let i = views.iter().position(|v| v.id == id).unwrap();
                            end > start[i]
                        })
                        .count() as u32;
                    (*seg, live)
                })
                .collect();

            // In log order, one message each.
            let mut c = collector(&log);
            for ev in &events {
                match ev {
                    Event::Seal(seg, e) => c.count_from(*seg, e.iter().copied()),
                    Event::Trim(i, s) => c.trimmed(vec![(Arc::clone(&views[*i]), *s)]),
                }
            }
            assert_eq!(counts(&c, &sealed), want, "seed {seed}, log order");

            // As the handle and the collector run them: trims merged while
            // they wait, one message for them, the collector behind by a
            // random number of messages.
            let mut c = collector(&log);
            let (tx, rx) = channel();
            let handle = GcHandle {
                tx,
                trims: c.trims.clone(),
            };
            for ev in &events {
                match ev {
                    Event::Seal(seg, e) => handle.sealed(*seg, e.clone()),
                    Event::Trim(i, s) => handle.trimmed(Arc::clone(&views[*i]), *s),
                }
                for _ in 0..rand(3) {
                    match rx.try_recv() {
                        Ok(Msg::Sealed { segment, ends }) => {
                            c.count_from(segment, ends.into_iter())
                        }
                        Ok(Msg::Trims) => c.follow_trims(),
                        Ok(_) => unreachable!("only seals and trims are sent"),
                        Err(_) => break,
                    }
                }
                let waiting = handle.trims.0.lock().len();
                assert!(
                    waiting <= STREAMS,
                    "{waiting} trims wait for {STREAMS} streams"
                );
            }
            while let Ok(msg) = rx.try_recv() {
                match msg {
                    Msg::Sealed { segment, ends } => c.count_from(segment, ends.into_iter()),
                    Msg::Trims => c.follow_trims(),
                    _ => unreachable!("only seals and trims are sent"),
                }
            }
            assert_eq!(
                counts(&c, &sealed),
                want,
                "seed {seed}, trims merged and early"
            );
        }
    }

    /// However many trims come while the collector is behind (here: not
    /// started), what waits for it is one message and one trim per stream,
    /// at the highest start.
    #[test]
    fn trims_waiting_for_a_collector_behind_are_one_per_stream() {
        let (handle, inbox) = channel_for_gc();
        let views: Vec<Arc<StreamView>> = (0..4u64)
            .map(|id| Arc::new(StreamView::new(id, Bytes::from(format!("s{id}")))))
            .collect();
        for n in 1..=100_000u64 {
            let v = &views[(n % 4) as usize];
            handle.trimmed(Arc::clone(v), n);
        }
        handle.sealed(7, vec![(0, 10)]);
        let msgs: Vec<Msg> = inbox.rx.try_iter().collect();
        assert_eq!(msgs.len(), 2, "one message for the trims, one for the seal");
        assert!(matches!(msgs[0], Msg::Trims));
        let mut waiting: Vec<(u64, u64)> = inbox
            .trims
            .take()
            .into_iter()
            .map(|(v, start)| (v.id, start))
            .collect();
        waiting.sort_unstable();
        assert_eq!(
            waiting,
            [(0, 100_000), (1, 99_997), (2, 99_998), (3, 99_999)]
        );
        // Taken: the next trim says so again.
        handle.trimmed(Arc::clone(&views[1]), 100_001);
        assert!(matches!(inbox.rx.try_recv(), Ok(Msg::Trims)));
    }

    /// Every sealed segment's count of streams with records (0: dead).
    fn counts(c: &Collector, sealed: &[Sealed]) -> BTreeMap<u64, u32> {
        sealed
            .iter()
            .map(|(seg, _)| {
                let n = c.live.get(seg).copied().unwrap_or(0);
                assert_eq!(n == 0, c.dead.contains(seg), "segment {seg}: {n} live");
                (*seg, n)
            })
            .collect()
    }
}
