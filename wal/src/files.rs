//! Budgets for what reading old segments holds: open files, and footer
//! payloads in memory. A log of a hundred thousand segments serves under
//! the default limit of 1024 open files, because a segment's file is open
//! only while it is among the most recently read.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;

use crate::error::WalError;
use crate::segment::{self, SegmentHandle};
use crate::storage::{Storage, StorageFile};

/// Open segment files, most recently used kept, at most `capacity`.
///
/// A file evicted while a reader still uses it stays open until that read
/// ends (the reader holds an `Arc`), so the count can pass the budget by
/// the number of reads in flight, never by the number of segments.
pub(crate) struct FileCache {
    files: Mutex<LruCache<u64, Arc<dyn StorageFile>>>,
    /// Files opened so far (for the statistics).
    pub opened: AtomicU64,
}

impl FileCache {
    pub(crate) fn new(capacity: usize) -> FileCache {
        FileCache {
            files: Mutex::new(LruCache::new(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            )),
            opened: AtomicU64::new(0),
        }
    }

    /// The open file of `seg`, opening it (and checking its header) if it
    /// is not among the cached ones.
    pub(crate) fn get(
        &self,
        storage: &dyn Storage,
        seg: &SegmentHandle,
    ) -> Result<Arc<dyn StorageFile>, WalError> {
        if let Some(f) = self.files.lock().get(&seg.seq) {
            return Ok(Arc::clone(f));
        }
        // Opened outside the lock: a slow disk delays only this reader.
        let file: Arc<dyn StorageFile> = Arc::from(
            storage
                .open(&seg.path)
                .map_err(|e| WalError::io("open", &seg.path, e))?,
        );
        segment::check_header(file.as_ref(), &seg.path, seg.seq)?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        let mut files = self.files.lock();
        // Another reader may have opened it meanwhile: keep one.
        if let Some(f) = files.get(&seg.seq) {
            return Ok(Arc::clone(f));
        }
        files.put(seg.seq, Arc::clone(&file));
        Ok(file)
    }

    /// Forgets segment `seq`'s file (it is being removed).
    pub(crate) fn forget(&self, seq: u64) {
        self.files.lock().pop(&seq);
    }

    /// How many files the cache holds open.
    pub(crate) fn len(&self) -> usize {
        self.files.lock().len()
    }
}

/// Footer payloads read from disk, most recently used kept, within a byte
/// budget (a footer larger than the whole budget is answered, not kept).
pub(crate) struct FooterCache {
    inner: Mutex<Footers>,
}

struct Footers {
    lru: LruCache<u64, Bytes>,
    bytes: usize,
    budget: usize,
}

impl FooterCache {
    pub(crate) fn new(budget_bytes: usize) -> FooterCache {
        FooterCache {
            inner: Mutex::new(Footers {
                lru: LruCache::unbounded(),
                bytes: 0,
                budget: budget_bytes,
            }),
        }
    }

    pub(crate) fn get(&self, seq: u64) -> Option<Bytes> {
        self.inner.lock().lru.get(&seq).cloned()
    }

    pub(crate) fn put(&self, seq: u64, footer: Bytes) {
        let mut f = self.inner.lock();
        if footer.len() > f.budget {
            return;
        }
        if let Some(old) = f.lru.put(seq, footer.clone()) {
            f.bytes -= old.len();
        }
        f.bytes += footer.len();
        while f.bytes > f.budget {
            match f.lru.pop_lru() {
                Some((_, old)) => f.bytes -= old.len(),
                None => break,
            }
        }
    }

    pub(crate) fn forget(&self, seq: u64) {
        let mut f = self.inner.lock();
        if let Some(old) = f.lru.pop(&seq) {
            f.bytes -= old.len();
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}
