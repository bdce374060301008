//! Durable appends of 100-byte entries with 1, 4, 16 and 64 concurrent
//! writers, beside baselines measured in the same run: one thread doing
//! write + fdatasync per entry, and the same bytes written with one
//! fdatasync per batch of the size group commit achieved.
//!
//! Then the same load through the engine: fenced appends (`Log::append`,
//! token checked inside the serialized section) at 1/4/16/64 writers, each
//! writer on its own stream, beside the raw log's numbers of this run.
//!
//! `cargo bench -p fencelog-benches --bench append`

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fencelog_benches::{raw_batch_write_sync, raw_write_sync_per_entry};
use fencelog_wal::{FsStorage, Wal, WalError, WalOptions};

const ENTRY_BYTES: usize = 100;

fn open(dir: &Path) -> Wal<()> {
    let (wal, _) = Wal::open(Arc::new(FsStorage), dir, WalOptions::default(), |_| Ok(()))
        .expect("open the log");
    wal
}

/// `total` durable appends spread over `writers` threads, each waiting for
/// its entry's sync before the next: answers the elapsed time.
fn appends(wal: &Wal<()>, writers: u64, total: u64) -> Duration {
    let per = total.div_ceil(writers);
    let payload = [7u8; ENTRY_BYTES];
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                for _ in 0..per {
                    let ticket = wal
                        .submit(|w| {
                            w.append(ENTRY_BYTES, |b| b.copy_from_slice(&payload))?;
                            Ok::<_, WalError>(w.ticket())
                        })
                        .expect("submit")
                        .expect("append");
                    ticket.wait().expect("sync");
                }
            });
        }
    });
    start.elapsed()
}

/// `total` fenced appends over `writers` threads, one stream each.
fn fenced_appends(log: &fencelog::Log, writers: u64, total: u64) -> Duration {
    let per = total.div_ceil(writers);
    let payload = [7u8; ENTRY_BYTES];
    let token = fencelog::Token::new(1).expect("token");
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            s.spawn(move || {
                let stream = format!("stream-{w}");
                for _ in 0..per {
                    log.append(stream.as_str(), token, &[&payload])
                        .expect("append");
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let dir =
        tempfile::tempdir_in(std::env::var("FENCELOG_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .expect("a directory on the disk under test");
    let mut group = c.benchmark_group("append");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));

    for prealloc in [false, true] {
        let name = if prealloc {
            "raw_write_fdatasync_per_entry_prealloc"
        } else {
            "raw_write_fdatasync_per_entry_grow"
        };
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                raw_write_sync_per_entry(dir.path(), iters, ENTRY_BYTES, prealloc).expect("raw")
            })
        });
    }

    let wal_dir = dir.path().join("wal");
    let wal = open(&wal_dir);
    let mut batches = Vec::new();
    for writers in [1u64, 4, 16, 64] {
        let before = wal.stats();
        group.bench_function(format!("wal_{writers}_writers"), |b| {
            b.iter_custom(|iters| appends(&wal, writers, iters.max(writers)))
        });
        let after = wal.stats();
        let syncs = after.syncs - before.syncs;
        let entries = after.entries - before.entries;
        let batch = entries as f64 / syncs.max(1) as f64;
        eprintln!(
            "wal_{writers}_writers: {entries} entries in {syncs} syncs, {batch:.1} entries per sync"
        );
        batches.push((writers, batch));
    }
    drop(wal);

    let log = fencelog::Log::open(dir.path().join("engine"), fencelog::Options::default())
        .expect("open the engine");
    for writers in [1u64, 4, 16, 64] {
        group.bench_function(format!("fenced_{writers}_writers"), |b| {
            b.iter_custom(|iters| fenced_appends(&log, writers, iters.max(writers)))
        });
    }
    drop(log);

    // The ceiling at each achieved batch size: the same bytes, one write and
    // one fdatasync per batch, no threads.
    for (writers, batch) in batches {
        let batch = batch.round().max(1.0) as u64;
        group.bench_function(format!("raw_batch_of_{batch}_for_{writers}_writers"), |b| {
            b.iter_custom(|iters| {
                raw_batch_write_sync(dir.path(), iters.max(batch), 128, batch).expect("raw batch")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
