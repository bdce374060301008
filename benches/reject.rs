//! Stale-write rejections per second, in process, on one thread and two.
//! A write whose token is below the stream's durable highest token is
//! answered without entering the write queue, touching the disk or
//! allocating. Baseline in the same run: a read of the same stream's stat,
//! the cheapest other call that looks the stream up.
//!
//! `cargo bench -p fencelog-benches --bench reject`

use std::time::Instant;

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use fencelog::{Error, Log, Options, Token};

fn bench(c: &mut Criterion) {
    let dir =
        tempfile::tempdir_in(std::env::var("FENCELOG_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .expect("a directory for the log");
    let log = Log::open(dir.path(), Options::default()).expect("open");
    // A thousand streams, each fenced at token 100, so the lookup is real.
    for i in 0..1000 {
        log.fence(format!("orders-{i}"), Token::new(100).expect("token"))
            .expect("fence");
    }
    let stale = Token::new(99).expect("token");
    let payload: [&[u8]; 1] = [b"a late write from a paused owner"];
    let syncs_before = log.metrics().wal.syncs;

    let mut group = c.benchmark_group("reject");
    group.throughput(Throughput::Elements(1));
    group.bench_function("stale_append_1_thread", |b| {
        b.iter(|| {
            let r = log.append(black_box("orders-517"), stale, &payload);
            debug_assert!(matches!(r, Err(Error::Stale { .. })));
            black_box(r.is_err())
        })
    });
    group.bench_function("stale_append_2_threads", |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(2);
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..2 {
                    let log = &log;
                    s.spawn(move || {
                        let name = format!("orders-{}", 300 + t);
                        for _ in 0..per {
                            black_box(log.append(name.as_str(), stale, &payload).is_err());
                        }
                    });
                }
            });
            // Two threads did `iters` rejections in this wall time.
            start.elapsed()
        })
    });
    group.bench_function("stale_fence_1_thread", |b| {
        b.iter(|| black_box(log.fence(black_box("orders-5"), stale).is_err()))
    });
    group.bench_function("baseline_stat_1_thread", |b| {
        b.iter(|| black_box(log.stat(black_box("orders-517")).map(|s| s.highest_token)))
    });
    group.finish();
    assert_eq!(
        log.metrics().wal.syncs,
        syncs_before,
        "rejections must not touch the disk"
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
