//! A write whose token is below the stream's durable highest token is
//! answered without the write lock, the disk, or a single allocation: the
//! path a flood of late writes from paused owners takes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use fencelog::{Error, Log, Options, Token};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn stale_writes_allocate_nothing_and_sync_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small()).unwrap();
    log.fence("orders", Token::new(100).unwrap()).unwrap();
    let stale = Token::new(99).unwrap();
    let payload: [&[u8]; 1] = [b"late"];
    let syncs = log.metrics().wal.syncs;
    // Warm up thread-locals (the counter's stripe) before counting.
    assert!(log.append("orders", stale, &payload).is_err());

    // The collector's start-up work is done before counting (its thread
    // allocates; the rejections must not).
    log.collect_garbage();
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..10_000 {
        match log.append("orders", stale, &payload) {
            Err(Error::Stale {
                presented: 99,
                highest: 100,
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(log.fence("orders", stale).is_err());
        assert!(log.trim("orders", stale, 0).is_err());
        assert!(log.delete("orders", stale).is_err());
    }
    let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(
        allocated, 0,
        "40 000 rejections allocated {allocated} times"
    );
    assert_eq!(log.metrics().wal.syncs, syncs);
    assert_eq!(log.metrics().stale_rejections, 40_001);
}

/// Small segments: opening writes little.
fn small() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 256 << 10;
    o.wal.max_entry_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}
