//! The read side of a stream: its durable state and where its records are,
//! shared with readers without the write lock. The serialized section never
//! touches it: the durable numbers and the index move only when the sync
//! thread applies an [`Effect`] after the sync, so readers never see a
//! record a crash could take back, and a reader never holds up a writer.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use event_listener::Event;
use fencelog_wal::Durable;
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};

use crate::gc::GcHandle;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenEntry {
    pub segment: u64,
    pub entry: IndexEntry,
}

/// Where a stream's durable records are. Records below `sealed_end` are in
/// sealed segments, found through checkpoints and footers on disk (see
/// `locate.rs`); memory holds only the entries of segments not sealed yet.
#[derive(Debug, Default)]
pub(crate) struct StreamIndex {
    /// Records below this offset are in durably sealed segments.
    pub sealed_end: u64,
    /// The newest sealed segment holding records of the stream (0: none).
    pub last_sealed: u64,
    /// Entries in segments not durably sealed yet, in offset order.
    pub open: VecDeque<OpenEntry>,
}

impl StreamIndex {
    /// Forgets entries wholly below `start`.
    fn drop_below(&mut self, start: u64) {
        while self.open.len() > 1 && self.open[1].entry.first_offset <= start {
            self.open.pop_front();
        }
    }
}

/// The last sealed segment a read of the stream found its records in,
/// kept so that the next read, which usually goes on from there, finds them
/// at once.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Hint {
    pub segment: u64,
    pub first_offset: u64,
    pub end_offset: u64,
}

/// A stream as readers see it.
pub(crate) struct StreamView {
    /// Engine-assigned, stable: the key of the stream in segment footers.
    pub id: u64,
    /// The stream's name: the one copy (the stream tables share it).
    pub name: Bytes,
    /// Durable highest token, next offset, start offset, total payload bytes.
    pub highest: AtomicU64,
    pub next: AtomicU64,
    pub start: AtomicU64,
    pub total_bytes: AtomicU64,
    pub index: RwLock<StreamIndex>,
    pub hint: Mutex<Hint>,
    /// Notified when `next` grows, for blocked readers.
    pub grown: Event,
    /// Whether a reader ever waited on `grown`. Until one does, a durable
    /// record does not notify: `event_listener` takes a lock (and a
    /// `SeqCst` fence) on every notification, listeners or not, and a
    /// notification per record cost a single node 2-3 % of its
    /// instructions per append. A reader listens, then sets it (release)
    /// and looks again; a writer moves `next`, then reads it (acquire),
    /// with a `SeqCst` fence on each side between the two: either the
    /// reader sees the new `next`, or the writer sees the flag, and then
    /// the listener was registered before its notification.
    pub watched: AtomicBool,
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
            hint: Mutex::new(Hint::default()),
            grown: Event::new(),
            watched: AtomicBool::new(false),
        }
    }
}

/// Shards of the stream map: threads rejecting (or reading) different
/// streams take different locks, so they do not fight over one cache line.
const SHARDS: usize = 64;

/// One shard of the stream map: views by their name, hashed once by
/// [`Views::shard`] for both the shard and the place in it (a map per
/// shard hashed the name a second time, which for a name of 17 bytes or
/// more was 40 % of a stale rejection's lookup).
///
/// Each on cache lines of its own: even a read lock writes the lock's
/// word, and with shards packed two or three to a line, two threads
/// looking up streams in different shards took the line from each other
/// (`perf`: the lookup cost twice its share of a rejection's instructions).
#[repr(align(128))]
struct Shard(RwLock<HashTable<Arc<StreamView>>>);

impl std::ops::Deref for Shard {
    type Target = RwLock<HashTable<Arc<StreamView>>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// A stream's name with its hash, made once per decision by
/// [`Views::key`] and used for both tables that know streams by name (the
/// views here and the serialized section's stream table, which share one
/// hasher): an append used to hash its stream's name five times.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key<'a> {
    pub name: &'a [u8],
    pub hash: u64,
}

/// Every stream's view, by name.
pub(crate) struct Views {
    shards: [Shard; SHARDS],
    hasher: hashbrown::DefaultHashBuilder,
    /// Every stream's highest token is at least this: raised after a
    /// salvage cut acknowledged entries that may have carried tokens up to
    /// it (a torn tail, never acknowledged, raises nothing).
    pub floor: AtomicU64,
    /// Notified when a stream is created, for readers blocked on a stream
    /// that does not exist yet.
    pub created: Event,
    /// The same views in name order, so that listing a page of names costs
    /// the page, not a sort of every stream (a million streams took 0.7 s
    /// of a server thread per `LOG.STREAMS`). The name is shared with the
    /// view's, not copied.
    ordered: RwLock<BTreeMap<Bytes, Arc<StreamView>>>,
}

impl Default for Views {
    fn default() -> Self {
        Views {
            shards: std::array::from_fn(|_| Shard(RwLock::new(HashTable::new()))),
            hasher: hashbrown::DefaultHashBuilder::default(),
            floor: AtomicU64::new(0),
            created: Event::new(),
            ordered: RwLock::new(BTreeMap::new()),
        }
    }
}

impl Views {
    /// The name's hash and its shard. The shard is taken from bits the
    /// table does not use to place or tag an entry (its low bits, up to
    /// 2^32 buckets, and its top seven), so that the entries of one shard
    /// do not all start their probes in a 64th of its buckets.
    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[((hash >> 32) % SHARDS as u64) as usize]
    }

    /// The hash of a stream's name, for this table and the serialized
    /// section's.
    pub(crate) fn hash(&self, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(name)
    }

    /// `name` with its hash.
    pub(crate) fn key<'a>(&self, name: &'a [u8]) -> Key<'a> {
        Key {
            name,
            hash: self.hash(name),
        }
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<Arc<StreamView>> {
        let hash = self.hash(name);
        self.shard(hash)
            .read()
            .find(hash, |v| *v.name == *name)
            .cloned()
    }

    /// The durable highest token of a stream (the floor for one never
    /// seen): the fast path that rejects stale writes without the write
    /// lock.
    pub(crate) fn durable_highest(&self, key: Key<'_>) -> u64 {
        let own = self
            .shard(key.hash)
            .read()
            .find(key.hash, |v| *v.name == *key.name)
            .map_or(0, |v| v.highest.load(Ordering::Acquire));
        own.max(self.floor.load(Ordering::Acquire))
    }

    pub(crate) fn insert(&self, view: Arc<StreamView>) {
        self.ordered
            .write()
            .insert(view.name.clone(), Arc::clone(&view));
        let hash = self.hash(&view.name);
        // As a map's insert: a view of the same name is replaced.
        match self
            .shard(hash)
            .write()
            .entry(hash, |v| v.name == view.name, |v| self.hash(&v.name))
        {
            hashbrown::hash_table::Entry::Occupied(mut old) => *old.get_mut() = view,
            hashbrown::hash_table::Entry::Vacant(place) => {
                place.insert(view);
            }
        }
        self.created.notify(usize::MAX);
    }

    /// Up to `count` names in byte order, strictly after `after` (from the
    /// first without it), of the streams that hold records or a token.
    pub(crate) fn names_after(&self, after: Option<&[u8]>, count: usize) -> Vec<Bytes> {
        use std::ops::Bound;
        let ordered = self.ordered.read();
        let from = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        ordered
            .range::<[u8], _>((from, Bound::Unbounded))
            .filter(|(_, v)| v.highest.load(Ordering::Acquire) > 0)
            .take(count)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// What becomes visible once a batch is durable.
pub(crate) enum Effect {
    /// A stream's new durable state, and the entry an append added.
    Advance {
        view: Arc<StreamView>,
        rise: Rise,
        start: u64,
        entry: Option<OpenEntry>,
    },
    /// A segment's footer is durable: these streams find their records
    /// there now, up to the given end offsets. Garbage collection counts
    /// the segment's live streams.
    Sealed {
        segment: u64,
        streams: Vec<(Arc<StreamView>, u64)>,
        gc: GcHandle,
    },
    /// A stream's start moved: garbage collection looks at the segments
    /// it left.
    Trimmed {
        view: Arc<StreamView>,
        start: u64,
        gc: GcHandle,
    },
    /// Several effects of one decision.
    Many(Vec<Effect>),
}

impl Durable for Effect {
    fn durable(self) {
        match self {
            Effect::Advance {
                view,
                rise,
                start,
                entry,
            } => advance(&view, rise, start, entry, || None),
            Effect::Sealed {
                segment,
                streams,
                gc,
            } => {
                let mut ends = Vec::with_capacity(streams.len());
                for (view, end) in streams {
                    {
                        let mut ix = view.index.write();
                        ix.open.retain(|e| e.segment != segment);
                        ix.sealed_end = ix.sealed_end.max(end);
                        ix.last_sealed = ix.last_sealed.max(segment);
                    }
                    ends.push((view.id, end));
                }
                gc.sealed(segment, ends);
            }
            Effect::Trimmed { view, start, gc } => gc.trimmed(view, start),
            Effect::Many(effects) => {
                for e in effects {
                    e.durable();
                }
            }
        }
    }

    /// A row of appends' advances of one stream with one start (a client's
    /// pipeline) runs as one: every number of the stream's view only rises
    /// (`fetch_max`), so the highest of each is what the row in turn
    /// leaves, and the row's index entries go in, in order, under one
    /// lock. One lock of the index and one lock-prefixed update of each
    /// number serve the row instead of each append. Only appends (an
    /// entry each) join a row: a trim's advance may drop entries below its
    /// start, which must happen before later entries come.
    fn durable_all(effects: Vec<Effect>) {
        let mut effects = effects.into_iter().peekable();
        while let Some(effect) = effects.next() {
            let Effect::Advance {
                view,
                rise,
                start,
                entry: entry @ Some(_),
            } = effect
            else {
                effect.durable();
                continue;
            };
            // The next advance, if it is an append's of this stream with
            // this start: what it raises and its entry.
            let more = || {
                let joins = |e: &Effect| {
                    matches!(e, Effect::Advance { view: v, start: s, entry: Some(_), .. }
                        if Arc::ptr_eq(v, &view) && *s == start)
                };
                match effects.next_if(joins)? {
                    Effect::Advance {
                        rise,
                        entry: Some(e),
                        ..
                    } => Some((rise, e)),
                    _ => None,
                }
            };
            advance(&view, rise, start, entry, more);
        }
    }
}

#[cfg(test)]
thread_local! {
    /// How often this thread took a stream's index lock to advance it.
    static INDEX_LOCKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The numbers of a stream's view an advance raises (each only rises).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rise {
    pub highest: u64,
    pub next: u64,
    pub total_bytes: u64,
}

impl Rise {
    /// What raising to `self` and then to `other` leaves.
    fn max(self, other: Rise) -> Rise {
        Rise {
            highest: self.highest.max(other.highest),
            next: self.next.max(other.next),
            total_bytes: self.total_bytes.max(other.total_bytes),
        }
    }
}

/// Makes a stream's new numbers (`rise`, and its `start`) and index entry
/// visible to readers, with those of the appends `more` hands out (a row
/// of appends at the same start), the entries before `next` moves, since
/// a reader that sees `next` looks them up.
fn advance(
    view: &StreamView,
    mut rise: Rise,
    start: u64,
    entry: Option<OpenEntry>,
    mut more: impl FnMut() -> Option<(Rise, OpenEntry)>,
) {
    let old_start = view.start.fetch_max(start, Ordering::AcqRel);
    if entry.is_some() || start > old_start {
        let mut ix = view.index.write();
        #[cfg(test)]
        INDEX_LOCKS.with(|n| n.set(n.get() + 1));
        if let Some(e) = entry {
            ix.open.push_back(e);
            while let Some((later, e)) = more() {
                ix.open.push_back(e);
                rise = rise.max(later);
            }
        }
        if start > old_start {
            ix.drop_below(start);
        }
    }
    view.highest.fetch_max(rise.highest, Ordering::AcqRel);
    view.total_bytes
        .fetch_max(rise.total_bytes, Ordering::AcqRel);
    let old_next = view.next.fetch_max(rise.next, Ordering::AcqRel);
    if rise.next > old_next {
        std::sync::atomic::fence(Ordering::SeqCst);
        if view.watched.load(Ordering::Acquire) {
            view.grown.notify(usize::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One stream's durable state as readers see it.
    fn state(v: &StreamView) -> (u64, u64, u64, u64, Vec<OpenEntry>) {
        (
            v.highest.load(Ordering::Acquire),
            v.next.load(Ordering::Acquire),
            v.start.load(Ordering::Acquire),
            v.total_bytes.load(Ordering::Acquire),
            v.index.read().open.iter().copied().collect(),
        )
    }

    /// What the serialized section would hand the sync thread for a run
    /// of appends and trims (`steps`: stream, append or trim, a number
    /// that picks the token's rise, the records and the trim's place, and
    /// the segment): the advances, with the numbers each one leaves
    /// (`Core::advance`).
    fn advances(views: &[Arc<StreamView>], steps: &[(usize, bool, u8, u8)]) -> Vec<Effect> {
        let mut s = vec![(0u64, 0u64, 0u64, 0u64); views.len()];
        let mut position = 0;
        steps
            .iter()
            .map(|&(which, append, n, segment)| {
                let (highest, next, start, total) = &mut s[which];
                *highest += u64::from(n % 3);
                let mut entry = None;
                if append {
                    position += 100;
                    entry = Some(OpenEntry {
                        segment: u64::from(segment % 2),
                        entry: IndexEntry {
                            first_offset: *next,
                            cum_bytes: *total,
                            position,
                        },
                    });
                    *next += u64::from(n % 4) + 1;
                    *total += u64::from(n);
                } else {
                    // A trim: to anywhere up to the end, the end included.
                    *start = (*start).max(*next - u64::from(n) % (*next + 1 - *start));
                }
                Effect::Advance {
                    view: Arc::clone(&views[which]),
                    rise: Rise {
                        highest: *highest,
                        next: *next,
                        total_bytes: *total,
                    },
                    start: *start,
                    entry,
                }
            })
            .collect()
    }

    fn fresh(n: usize) -> Vec<Arc<StreamView>> {
        (0..n as u64)
            .map(|id| Arc::new(StreamView::new(id, Bytes::from(format!("s{id}")))))
            .collect()
    }

    proptest! {
        /// A batch's advances run together (`durable_all`) leave every
        /// stream as running them one by one does: the same numbers and
        /// the same open entries, in order, whatever the mix of appends
        /// and trims of two streams and wherever the batches split.
        #[test]
        fn a_batch_run_together_leaves_what_one_by_one_leaves(
            steps in proptest::collection::vec((0usize..2, proptest::bool::weighted(0.8), any::<u8>(), any::<u8>()), 1..60),
            cut in 0usize..60,
        ) {
            let (one_by_one, together) = (fresh(2), fresh(2));
            for e in advances(&one_by_one, &steps) {
                e.durable();
            }
            // Two batches: the views have entries and a start of their own
            // when the second runs.
            let mut first = advances(&together, &steps);
            let second = first.split_off(cut.min(steps.len()));
            Effect::durable_all(first);
            Effect::durable_all(second);
            for (a, b) in one_by_one.iter().zip(&together) {
                prop_assert_eq!(state(a), state(b));
            }
        }
    }

    /// A row of appends to one stream takes its index lock once; a trim
    /// or another stream ends the row.
    #[test]
    fn a_row_of_appends_takes_the_index_lock_once() {
        let views = fresh(2);
        let steps = [
            (0, true, 1, 0),
            (0, true, 1, 0),
            (0, true, 1, 0),
            (1, true, 1, 0),
            (0, false, 0, 0),
            (0, true, 1, 0),
            (0, true, 1, 0),
        ];
        INDEX_LOCKS.with(|n| n.set(0));
        Effect::durable_all(advances(&views, &steps));
        // The row of three, stream 1's append, the trim (its start moved),
        // the row of two.
        assert_eq!(INDEX_LOCKS.with(std::cell::Cell::get), 4);
        // Two records an append; the trim to the end (6) left the last
        // entry below it, then came entries at 6 and 8.
        let firsts: Vec<u64> = views[0]
            .index
            .read()
            .open
            .iter()
            .map(|e| e.entry.first_offset)
            .collect();
        assert_eq!(firsts, [4, 6, 8]);
        assert_eq!(views[0].next.load(Ordering::Acquire), 10);
    }

    /// Appends' advances that carry different starts do not run as one
    /// row (the serialized section makes none without a trim's advance
    /// between them, but a row that ignored the start would keep entries
    /// the later start drops).
    #[test]
    fn appends_with_another_start_run_apart() {
        let (one_by_one, together) = (fresh(1), fresh(1));
        let make = |views: &[Arc<StreamView>]| {
            let mut e = advances(views, &[(0, true, 1, 0), (0, true, 1, 0)]);
            if let Some(Effect::Advance { start, .. }) = e.last_mut() {
                *start = 2;
            }
            e
        };
        for e in make(&one_by_one) {
            e.durable();
        }
        INDEX_LOCKS.with(|n| n.set(0));
        Effect::durable_all(make(&together));
        assert_eq!(INDEX_LOCKS.with(std::cell::Cell::get), 2);
        assert_eq!(state(&one_by_one[0]), state(&together[0]));
    }
}
