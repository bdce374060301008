//! Open time of a log holding 64 MiB vs 1 GiB of records: sealed segments
//! carry a checkpoint and their index, so open reads the tail only and the
//! ratio stays near 1. Baseline in the same run: opening an empty log.
//!
//! Building the 1 GiB log takes a while (it is written durably, like any
//! other); set FENCELOG_BENCH_DIR to put it on the disk under test.
//!
//! `cargo bench -p fencelog-benches --bench recovery`

use std::path::Path;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use fencelog::{Log, Options, Token};

const RECORD: usize = 4096;

/// Fills a log with `bytes` of 4 KiB records over 8 streams and 8 writers,
/// then closes it.
fn fill(dir: &Path, bytes: u64) {
    let log = Log::open(dir, Options::default()).expect("open");
    let records = bytes / RECORD as u64;
    let per = records / 8;
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..8u64 {
            let log = &log;
            s.spawn(move || {
                let payload = vec![w as u8; RECORD];
                let token = Token::new(1).expect("token");
                let stream = format!("stream-{w}");
                let mut sent = 0;
                while sent < per {
                    // 16 records an append: fewer, larger entries.
                    let n = (per - sent).min(16) as usize;
                    let batch: Vec<&[u8]> = vec![&payload; n];
                    log.append(stream.as_str(), token, &batch).expect("append");
                    sent += n as u64;
                }
            });
        }
    });
    eprintln!(
        "filled {} MiB in {:.1} s ({} segments)",
        bytes >> 20,
        start.elapsed().as_secs_f64(),
        log.segments().len()
    );
}

fn bench(c: &mut Criterion) {
    let root =
        tempfile::tempdir_in(std::env::var("FENCELOG_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .expect("a directory for the logs");
    let mut group = c.benchmark_group("recovery");
    group.sample_size(20);
    for (name, bytes) in [("empty", 0u64), ("64MiB", 64 << 20), ("1GiB", 1 << 30)] {
        let dir = root.path().join(name);
        if bytes > 0 {
            fill(&dir, bytes);
        }
        group.bench_function(format!("open_{name}"), |b| {
            b.iter(|| {
                let log = Log::open(&dir, Options::default()).expect("open");
                assert!(log.recovery_report().scanned_segments <= 2);
                drop(log);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
