//! What the hot paths allocate, counted by a global allocator that counts
//! every allocation, in all and per thread:
//! - a write whose token is below the stream's durable highest token is
//!   answered without the write lock, the disk, or a single allocation:
//!   the path a flood of late writes from paused owners takes;
//! - an append taken now (`Log::append_now`, a server's path) keeps its
//!   answer in place: the appending thread allocates nothing per append.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use fencelog::{Error, Log, Options, Token};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Allocations made by this thread (the sync thread's, the
    /// collector's and the runtime's are theirs).
    static THREAD_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
    let _ = THREAD_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts, in an
// atomic and a thread-local `Cell` that need no allocation and no
// destructor.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Taken by each test: the count over all threads is one test's only
/// when the tests of this binary run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Allocations made so far by the calling thread.
fn thread_allocations() -> u64 {
    THREAD_ALLOCATIONS.with(Cell::get)
}

#[test]
fn stale_writes_allocate_nothing_and_sync_nothing() {
    let _serial = serial();
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

/// The answer of an append taken now is its decision and ticket, kept in
/// place: the appending thread allocates nothing per append (the batch's
/// buffers and the stream's index grow now and then). Before, each
/// answer was a boxed future: one allocation per append at least.
#[test]
fn an_append_taken_now_allocates_nothing_of_its_own() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = small();
    opts.wal.segment_bytes = 1 << 20;
    let log = Log::open(dir.path(), opts).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Token::new(1).unwrap();
    rt.block_on(async {
        let payload: [&[u8]; 1] = [b"a hundred bytes, more or less, as the benchmark sends them"];
        // Warm up: the stream exists, the counters' stripes are set.
        for _ in 0..100 {
            log.append_now(b"s", t, &payload)
                .unwrap()
                .unwrap()
                .await
                .unwrap();
        }
        let mut answers = Vec::with_capacity(1000);
        let mut allocated = 0;
        for round in 0..10u64 {
            let before = thread_allocations();
            for _ in 0..1000 {
                match log.append_now(b"s", t, &payload).unwrap() {
                    Some(answer) => answers.push(answer),
                    None => panic!("a batch of 100 KiB was full"),
                }
            }
            allocated += thread_allocations() - before;
            for (i, answer) in answers.drain(..).enumerate() {
                assert_eq!(answer.await.unwrap(), 100 + round * 1000 + i as u64);
            }
        }
        assert!(
            allocated < 1000,
            "10 000 appends taken now allocated {allocated} times on the appending thread"
        );
    });
}
