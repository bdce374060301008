//! What one small request costs must not grow with the whole log: INFO and
//! every metrics scrape listed and sorted every stream name just to count
//! them (100 ms of CPU for a 4-byte request at a million streams).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelog::wal::{SimStorage, Storage};
use fencelog::{Log, ManualClock, Options, Token};

#[test]
fn metrics_count_streams_without_listing_them() {
    let storage: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let log = Log::open_on(
        storage,
        Arc::new(ManualClock::default()),
        Path::new("/db"),
        Options::default(),
    )
    .unwrap();
    const STREAMS: usize = 50_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut pending = Vec::with_capacity(STREAMS);
        for i in 0..STREAMS {
            let name = format!("stream-{i}");
            let d = log
                .fence_deferred(name.as_bytes(), Token::new(1).unwrap())
                .await;
            pending.push(d.unwrap());
        }
        for d in pending {
            d.await.unwrap();
        }
    });
    assert_eq!(log.metrics().streams, STREAMS as u64);
    let started = Instant::now();
    for _ in 0..1000 {
        assert_eq!(log.metrics().streams, STREAMS as u64);
    }
    // Listing and sorting 50 000 names a thousand times takes seconds.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "{took:?}");
}
