//! A quick load: `cargo run --release -p fencelog-wal --example throughput -- WRITERS SECONDS [DIR]`
//! Durable 100-byte appends from WRITERS threads, each waiting for its sync.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fencelog_wal::{FsStorage, Preallocation, Wal, WalError, WalOptions};

fn main() -> Result<(), WalError> {
    let args: Vec<String> = std::env::args().collect();
    let writers: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let secs: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3);
    let dir =
        tempfile::tempdir_in(args.get(3).map(String::as_str).unwrap_or(".")).map_err(|e| {
            WalError::Io {
                op: "tempdir",
                path: ".".into(),
                source: e,
            }
        })?;
    let opts = WalOptions {
        preallocation: match std::env::var("PREALLOC").as_deref() {
            Ok("reserve") => Preallocation::Reserve,
            Ok("none") => Preallocation::None,
            _ => Preallocation::Fill,
        },
        ..WalOptions::default()
    };
    let (wal, _) = Wal::open(Arc::new(FsStorage), dir.path(), opts, |_| Ok(()))?;
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                let payload = [7u8; 100];
                while !stop.load(Ordering::Relaxed) {
                    let t = wal
                        .submit(|w| {
                            w.append(100, |b| b.copy_from_slice(&payload))?;
                            Ok::<_, WalError>(w.ticket())
                        })
                        .and_then(|r| r);
                    if t.and_then(|t| t.wait()).is_err() {
                        return;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = start.elapsed().as_secs_f64();
    let stats = wal.stats();
    let n = done.load(Ordering::Relaxed);
    println!(
        "{writers} writers: {:.0} entries/s, {:.1} entries per sync, sync p50 <= {} us",
        n as f64 / elapsed,
        stats.batch_entries.mean(),
        stats.sync_micros.quantile_upper_bound(0.5)
    );
    Ok(())
}
