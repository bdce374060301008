//! What the replica tests share: a replica engine (cluster mode, no sync
//! per batch, small segments so checkpoints come often) on the simulated
//! storage.

use std::path::Path;
use std::sync::Arc;

use fencelog::wal::{SimStorage, Storage};
use fencelog::{Log, ManualClock, Options};

/// A replica's options with 64 KiB segments.
pub fn opts() -> Options {
    let mut o = Options {
        replicated: true,
        ..Options::default()
    };
    o.wal.sync_every_batch = false;
    o.wal.segment_bytes = 64 << 10;
    o.wal.max_entry_bytes = 32 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

/// A replica engine on `sim`.
pub fn open(sim: &SimStorage) -> Log {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    Log::open_on(
        storage,
        Arc::new(ManualClock::default()),
        Path::new("/db"),
        opts(),
    )
    .unwrap()
}
