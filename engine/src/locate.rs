//! Finding a stream's records in sealed segments, with memory that does
//! not grow with history: the index of sealed segments stays on disk and is
//! read on demand, through bounded caches.
//!
//! A record of stream `S` at offset `o` below the stream's `sealed_end` is
//! in some sealed segment. Every checkpoint records each stream's next
//! offset at that point of the log, and these grow with the segment number,
//! so a binary search over the segments that open with a checkpoint finds
//! the newest one at which `S` had not reached `o` yet; the record is in
//! that segment or a later one, whose footers (each an index of its
//! streams' entries) say exactly where. Checkpoints open most segments
//! (when they are large, one segment in several; see `Core::checkpoint`),
//! so the scan of footers after the search is short. A hint per stream
//! remembers where the last read ended, so that reading a stream in order
//! goes from one segment to the next without a search.

use std::num::NonZeroUsize;
use std::sync::Arc;

use fencelog_wal::{EntryKind, Wal, format::HEADER_LEN};
use lru::LruCache;
use parking_lot::Mutex;

use crate::checkpoint;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::footer::{Dir, SegmentIndex};
use crate::view::{Hint, StreamView};

/// Where a record was found: a sealed segment, its index, the stream's part
/// of it.
pub(crate) struct Found {
    pub segment: u64,
    pub index: Arc<SegmentIndex>,
    pub dir: Dir,
}

/// A cache of values that each take some bytes, within a byte budget.
struct Budgeted<V> {
    lru: LruCache<u64, (V, usize)>,
    bytes: usize,
    budget: usize,
}

impl<V: Clone> Budgeted<V> {
    fn new(budget: usize) -> Self {
        Budgeted {
            lru: LruCache::unbounded(),
            bytes: 0,
            budget,
        }
    }

    fn get(&mut self, key: u64) -> Option<V> {
        self.lru.get(&key).map(|(v, _)| v.clone())
    }

    fn put(&mut self, key: u64, value: V, size: usize) {
        if size > self.budget {
            return;
        }
        if let Some((_, old)) = self.lru.put(key, (value, size)) {
            self.bytes -= old;
        }
        self.bytes += size;
        while self.bytes > self.budget {
            match self.lru.pop_lru() {
                Some((_, (_, old))) => self.bytes -= old,
                None => break,
            }
        }
    }

    fn forget(&mut self, key: u64) {
        if let Some((_, old)) = self.lru.pop(&key) {
            self.bytes -= old;
        }
    }
}

/// Sorted (stream id, next offset) pairs of one checkpoint.
type Table = Arc<Vec<(u64, u64)>>;

/// The caches of the read path: parsed footers, checkpoint tables, and
/// which segments open with a link (no checkpoint to read there).
pub(crate) struct Locator {
    footers: Mutex<Budgeted<Arc<SegmentIndex>>>,
    tables: Mutex<Budgeted<Table>>,
    links: Mutex<LruCache<u64, ()>>,
}

/// Segments a search looks at below a probe for one that opens with a
/// checkpoint before it gives up on that probe (links come in runs no
/// longer than a few tens of segments).
const LINK_RUN_MAX: usize = 4096;

impl Locator {
    pub(crate) fn new(cache_bytes: usize) -> Locator {
        Locator {
            footers: Mutex::new(Budgeted::new(cache_bytes / 2)),
            tables: Mutex::new(Budgeted::new(cache_bytes / 2)),
            links: Mutex::new(LruCache::new(
                NonZeroUsize::new(1 << 16).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// The parsed index of sealed segment `segment` (parsed once, then
    /// kept within the budget); `None` if the segment is not sealed.
    pub(crate) fn footer(
        &self,
        wal: &Wal<Core>,
        segment: u64,
    ) -> Result<Option<Arc<SegmentIndex>>> {
        if let Some(ix) = self.footers.lock().get(segment) {
            return Ok(Some(ix));
        }
        let bytes = match wal.footer(segment) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
            // Removed by the collector since the caller saw it: it held no
            // live record, so a search goes on past it.
            Err(_) if gone(wal, segment) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let ix = Arc::new(SegmentIndex::parse(bytes).map_err(|why| damaged(wal, segment, why))?);
        let size = ix.len();
        self.footers.lock().put(segment, Arc::clone(&ix), size);
        Ok(Some(ix))
    }

    /// Each stream's next offset at the checkpoint opening `segment`, or
    /// `None` if the segment opens with a link.
    fn table(&self, wal: &Wal<Core>, segment: u64) -> Result<Option<Table>> {
        if let Some(t) = self.tables.lock().get(segment) {
            return Ok(Some(t));
        }
        if self.links.lock().get(&segment).is_some() {
            return Ok(None);
        }
        let entry = match wal.read_entry(segment, HEADER_LEN) {
            Ok(entry) => entry,
            // Removed meanwhile: searched past, as a link is (not cached).
            Err(_) if gone(wal, segment) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if entry.kind != EntryKind::Checkpoint {
            self.links.lock().put(segment, ());
            return Ok(None);
        }
        let table: Table = Arc::new(
            checkpoint::next_offsets(&entry.payload).map_err(|why| damaged(wal, segment, why))?,
        );
        let size = table.len() * 16 + 64;
        self.tables.lock().put(segment, Arc::clone(&table), size);
        Ok(Some(table))
    }

    /// Forgets what is cached of a removed segment.
    pub(crate) fn forget(&self, segment: u64) {
        self.footers.lock().forget(segment);
        self.tables.lock().forget(segment);
        self.links.lock().pop(&segment);
    }

    /// Stream `id`'s next offset at the nearest checkpoint at or below
    /// segment `at` and not below `lo`: (that segment, the offset).
    fn checkpoint_at_or_below(
        &self,
        wal: &Wal<Core>,
        id: u64,
        at: u64,
        lo: u64,
    ) -> Result<Option<(u64, u64)>> {
        let mut seg = wal.segment_at_or_before(at);
        for _ in 0..LINK_RUN_MAX {
            let Some(k) = seg.filter(|&k| k >= lo) else {
                return Ok(None);
            };
            if let Some(table) = self.table(wal, k)? {
                let next = table
                    .binary_search_by_key(&id, |&(i, _)| i)
                    .map_or(0, |i| table[i].1);
                return Ok(Some((k, next)));
            }
            seg = k.checked_sub(1).and_then(|p| wal.segment_at_or_before(p));
        }
        Ok(None)
    }

    /// The sealed segment holding record `offset` of `view`, with its index.
    pub(crate) fn locate(&self, wal: &Wal<Core>, view: &StreamView, offset: u64) -> Result<Found> {
        let (sealed_end, last_sealed) = {
            let ix = view.index.read();
            (ix.sealed_end, ix.last_sealed)
        };
        // The stream's last sealed record is in its last sealed segment
        // (a delete's trim follows the stream from there): no search.
        if last_sealed != 0
            && offset.checked_add(1) == Some(sealed_end)
            && let Some(found) = self.found_in(wal, last_sealed, view.id, offset)?
        {
            return Ok(found);
        }
        let hint = *view.hint.lock();
        if hint.segment != 0
            && hint.first_offset <= offset
            && offset < hint.end_offset
            && let Some(found) = self.found_in(wal, hint.segment, view.id, offset)?
        {
            return Ok(found);
        }
        // Going on from where the last read ended: usually the next segment
        // with records of the stream, a few segments on.
        if hint.segment != 0 && offset == hint.end_offset {
            let mut seg = wal.segment_after(hint.segment);
            for _ in 0..8 {
                let Some(k) = seg.filter(|&k| k <= last_sealed) else {
                    break;
                };
                if let Some(found) = self.found_in(wal, k, view.id, offset)? {
                    self.remember(view, &found);
                    return Ok(found);
                }
                seg = wal.segment_after(k);
            }
        }
        // The newest checkpoint at which the stream had not reached
        // `offset`: a binary search over segment numbers.
        let first = wal.first_segment().unwrap_or(0);
        let (mut lo, mut hi) = (first, last_sealed);
        let mut best: Option<u64> = None;
        while lo <= hi {
            let mid = lo + (hi - lo) / 2;
            match self.checkpoint_at_or_below(wal, view.id, mid, lo)? {
                None => lo = mid + 1,
                Some((k, next)) if next <= offset => {
                    best = Some(k);
                    lo = mid + 1;
                }
                Some((k, _)) => match k.checked_sub(1) {
                    Some(h) => hi = h,
                    None => break,
                },
            }
        }
        // From there, the footers say where.
        let mut seg = match best {
            Some(k) => Some(k),
            None => wal.first_segment(),
        };
        while let Some(k) = seg.filter(|&k| k <= last_sealed) {
            if let Some(found) = self.found_in(wal, k, view.id, offset)? {
                self.remember(view, &found);
                return Ok(found);
            }
            seg = wal.segment_after(k);
        }
        Err(Error::Corrupt {
            file: wal.dir().to_path_buf(),
            position: 0,
            reason: format!(
                "no sealed segment up to {last_sealed} holds offset {offset} of stream {:?}",
                view.name
            ),
        })
    }

    fn found_in(
        &self,
        wal: &Wal<Core>,
        segment: u64,
        id: u64,
        offset: u64,
    ) -> Result<Option<Found>> {
        let Some(index) = self.footer(wal, segment)? else {
            return Ok(None);
        };
        Ok(index
            .stream(id)
            .filter(|d| d.first_offset <= offset && offset < d.end_offset)
            .map(|dir| Found {
                segment,
                index: Arc::clone(&index),
                dir,
            }))
    }

    fn remember(&self, view: &StreamView, found: &Found) {
        *view.hint.lock() = Hint {
            segment: found.segment,
            first_offset: found.dir.first_offset,
            end_offset: found.dir.end_offset,
        };
    }
}

/// Whether `segment` is no longer in the log (the collector removed it).
fn gone(wal: &Wal<Core>, segment: u64) -> bool {
    wal.segment_at_or_before(segment) != Some(segment)
}

fn damaged(wal: &Wal<Core>, segment: u64, why: String) -> Error {
    Error::Corrupt {
        file: wal
            .dir()
            .join(fencelog_wal::format::segment_file_name(segment)),
        position: 0,
        reason: why,
    }
}
