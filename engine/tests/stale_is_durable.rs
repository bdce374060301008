//! A STALE answer cites the highest token, and is given only once that
//! token is durable: a rejection must never rest on a write a crash could
//! still undo.
//!
//! The disk is made slow and then failing, so that a fence with token 10 is
//! still in flight when an append with token 9 is decided, and never becomes
//! durable. The append must not be answered STALE citing 10.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fencelog::wal::{SimStorage, Storage};
use fencelog::{Error, Log, ManualClock, Options, Token};

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

#[test]
fn a_rejection_waits_for_the_token_it_cites() {
    let sim = SimStorage::new();
    sim.faults().only_on(".wal");
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let log = Log::open_on(
        storage,
        Arc::new(ManualClock::default()),
        Path::new("/db"),
        small(),
    )
    .unwrap();
    log.append("s", t(5), &[b"before"]).unwrap();

    sim.faults().delay_syncs(Duration::from_millis(300));
    sim.faults().fail_sync_after(0);
    let fencer = {
        let log = log.clone();
        std::thread::spawn(move || log.fence("s", t(10)))
    };
    // Let the fence be decided and its sync start.
    std::thread::sleep(Duration::from_millis(100));
    let late = log.append("s", t(9), &[b"late"]);
    assert!(matches!(fencer.join().unwrap(), Err(Error::Failed { .. })));
    match late {
        Err(Error::Failed { .. }) => {}
        Err(Error::Stale { highest: 10, .. }) => {
            panic!("STALE cited token 10, which never became durable")
        }
        other => panic!("unexpected answer {other:?}"),
    }
    // The durable state never saw token 10.
    assert_eq!(log.stat("s").unwrap().highest_token, 5);
}

#[test]
fn a_rejection_citing_a_durable_token_is_immediate() {
    let sim = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let log = Log::open_on(
        storage,
        Arc::new(ManualClock::default()),
        Path::new("/db"),
        small(),
    )
    .unwrap();
    log.fence("s", t(10)).unwrap();
    let syncs = log.metrics().wal.syncs;
    assert!(matches!(
        log.append("s", t(9), &[b"late"]),
        Err(Error::Stale {
            presented: 9,
            highest: 10
        })
    ));
    assert_eq!(
        log.metrics().wal.syncs,
        syncs,
        "a rejection touches no disk"
    );
    assert_eq!(log.metrics().stale_rejections, 1);
}

/// Small segments: opening writes little.
fn small() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 256 << 10;
    o.wal.max_entry_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}
