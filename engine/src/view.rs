//! The read side of a stream: its durable state and its index, shared with
//! readers without the write lock. Writers update the index inside the
//! serialized section; the durable numbers move only when the sync thread
//! applies an [`Effect`] after the sync, so readers never see a record a
//! crash could take back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use event_listener::Event;
use fencelog_wal::Durable;
use hashbrown::HashMap;
use parking_lot::{Mutex, RwLock};

/// Where one entry of a stream is, inside its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    /// Offset of the entry's first record.
    pub first_offset: u64,
    /// The stream's payload bytes before that record.
    pub cum_bytes: u64,
    /// Byte position of the entry in its segment.
    pub position: u64,
}

/// An entry in a segment that is not (durably) sealed yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenEntry {
    pub segment: u64,
    pub entry: IndexEntry,
}

/// A stream's records in one sealed segment; their index is in the
/// segment's footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub segment: u64,
    pub first_offset: u64,
    pub end_offset: u64,
    pub cum_bytes: u64,
}

/// Where a stream's records are.
#[derive(Debug, Default)]
pub(crate) struct StreamIndex {
    /// Sealed segments, in offset order.
    pub runs: VecDeque<Run>,
    /// Entries in segments not durably sealed yet, in offset order.
    pub open: VecDeque<OpenEntry>,
}

impl StreamIndex {
    /// Forgets what lies wholly below `start`.
    fn drop_below(&mut self, start: u64) {
        while self.runs.front().is_some_and(|r| r.end_offset <= start) {
            self.runs.pop_front();
        }
        while self.open.len() > 1 && self.open[1].entry.first_offset <= start {
            self.open.pop_front();
        }
    }
}

/// A stream as readers see it.
pub(crate) struct StreamView {
    /// Engine-assigned, stable: the key of the stream in segment footers.
    pub id: u64,
    pub name: Bytes,
    /// Durable highest token, next offset, start offset, total payload bytes.
    pub highest: AtomicU64,
    pub next: AtomicU64,
    pub start: AtomicU64,
    pub total_bytes: AtomicU64,
    pub index: RwLock<StreamIndex>,
    /// Notified when `next` grows, for blocked readers.
    pub grown: Event,
}

impl StreamView {
    pub(crate) fn new(id: u64, name: Bytes) -> StreamView {
        StreamView {
            id,
            name,
            highest: AtomicU64::new(0),
            next: AtomicU64::new(0),
            start: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            index: RwLock::new(StreamIndex::default()),
            grown: Event::new(),
        }
    }
}

/// Shards of the stream map: threads rejecting (or reading) different
/// streams take different locks, so they do not fight over one cache line.
const SHARDS: usize = 32;

/// One shard of the stream map.
type Shard = RwLock<HashMap<Box<[u8]>, Arc<StreamView>>>;

/// Every stream's view, by name.
pub(crate) struct Views {
    shards: [Shard; SHARDS],
    hasher: hashbrown::DefaultHashBuilder,
    /// Notified when a stream is created, for readers blocked on a stream
    /// that does not exist yet.
    pub created: Event,
}

impl Default for Views {
    fn default() -> Self {
        Views {
            shards: std::array::from_fn(|_| RwLock::new(HashMap::new())),
            hasher: hashbrown::DefaultHashBuilder::default(),
            created: Event::new(),
        }
    }
}

impl Views {
    fn shard(&self, name: &[u8]) -> &Shard {
        use std::hash::BuildHasher;
        &self.shards[(self.hasher.hash_one(name) % SHARDS as u64) as usize]
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<Arc<StreamView>> {
        self.shard(name).read().get(name).cloned()
    }

    /// The durable highest token of `name` (0 for a stream never seen):
    /// the fast path that rejects stale writes without the write lock.
    pub(crate) fn durable_highest(&self, name: &[u8]) -> u64 {
        self.shard(name)
            .read()
            .get(name)
            .map_or(0, |v| v.highest.load(Ordering::Acquire))
    }

    pub(crate) fn insert(&self, view: Arc<StreamView>) {
        self.shard(&view.name)
            .write()
            .insert(view.name.to_vec().into_boxed_slice(), view);
        self.created.notify(usize::MAX);
    }

    pub(crate) fn all(&self) -> Vec<Arc<StreamView>> {
        self.shards
            .iter()
            .flat_map(|s| s.read().values().cloned().collect::<Vec<_>>())
            .collect()
    }
}

/// Segments waiting to be removed once nothing needs them.
#[derive(Default)]
pub(crate) struct GcQueue {
    pub pending: Mutex<Vec<u64>>,
    pub any: AtomicBool,
}

impl GcQueue {
    pub(crate) fn push(&self, segment: u64) {
        self.pending.lock().push(segment);
        self.any.store(true, Ordering::Release);
    }
}

/// What becomes visible once a batch is durable.
pub(crate) enum Effect {
    /// A stream's new durable state.
    Advance {
        view: Arc<StreamView>,
        highest: u64,
        next: u64,
        start: u64,
        total_bytes: u64,
    },
    /// A segment's footer is durable: these streams find their entries there.
    Sealed {
        segment: u64,
        runs: Vec<(Arc<StreamView>, Run)>,
    },
    /// A segment holds no live record any more.
    Collect { segment: u64, gc: Arc<GcQueue> },
    /// Several effects of one decision.
    Many(Vec<Effect>),
}

impl Durable for Effect {
    fn durable(self) {
        match self {
            Effect::Advance {
                view,
                highest,
                next,
                start,
                total_bytes,
            } => {
                view.highest.fetch_max(highest, Ordering::AcqRel);
                view.total_bytes.fetch_max(total_bytes, Ordering::AcqRel);
                let old_start = view.start.fetch_max(start, Ordering::AcqRel);
                if start > old_start {
                    view.index.write().drop_below(start);
                }
                let old_next = view.next.fetch_max(next, Ordering::AcqRel);
                if next > old_next {
                    view.grown.notify(usize::MAX);
                }
            }
            Effect::Sealed { segment, runs } => {
                for (view, run) in runs {
                    let mut ix = view.index.write();
                    ix.open.retain(|e| e.segment != segment);
                    let start = view.start.load(Ordering::Acquire);
                    if run.end_offset > start {
                        ix.runs.push_back(run);
                    }
                }
            }
            Effect::Collect { segment, gc } => gc.push(segment),
            Effect::Many(effects) => {
                for e in effects {
                    e.durable();
                }
            }
        }
    }
}
