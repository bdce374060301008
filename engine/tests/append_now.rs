//! `Log::append_now`, the way a server takes an append still in its
//! request's arguments: decided at once when the pending batch has room
//! (what it allocates: `allocations.rs`); left untouched when the batch is
//! full, for the waiting form to take in order.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fencelog::wal::SimStorage;
use fencelog::{Error, Log, MonotonicClock, Options, Token};

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

fn small() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 1 << 20;
    o.wal.max_entry_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A full batch leaves the append untouched (`None`, nothing decided);
/// the waiting form then takes it, after the appends taken before it.
/// Syncs are slowed so that a batch fills behind the one being synced.
#[test]
fn a_full_batch_leaves_the_append_to_the_waiting_form() {
    let sim = SimStorage::new();
    let mut opts = small();
    opts.wal.max_batch_bytes = 16 << 10;
    let log = Log::open_on(
        Arc::new(sim.clone()),
        Arc::new(MonotonicClock::default()),
        Path::new("/db"),
        opts,
    )
    .unwrap();
    runtime().block_on(async {
        sim.faults().delay_syncs(Duration::from_millis(300));
        let payload = vec![7u8; 1024];
        let mut answers = Vec::new();
        let mut left = None;
        for i in 0..200u64 {
            match log.append_now(b"s", t(1), &[&payload[..]]).unwrap() {
                Some(answer) => answers.push((i, answer)),
                None => {
                    left = Some(i);
                    break;
                }
            }
        }
        let left = left.expect("a batch of 16 KiB fills within 200 appends of 1 KiB");
        assert!(left > 0, "the first append had room");
        let waiting = log.append_deferred(b"s", t(1), vec![payload.clone().into()]);
        sim.faults().delay_syncs(Duration::ZERO);
        let offset = waiting.await.unwrap().await.unwrap();
        // Nothing was decided for the append left over: the next offset
        // is the waiting one's.
        assert_eq!(offset, left, "the waiting append comes after those taken");
        for (i, answer) in answers {
            assert_eq!(answer.await.unwrap(), i);
        }
        // A stale token is refused before the log's lock, as
        // `check_append` refuses it; an invalid append is an error.
        log.fence(b"s", t(5)).unwrap();
        assert!(matches!(
            log.append_now(b"s", t(4), &[b"late"]),
            Err(Error::Stale {
                presented: 4,
                highest: 5
            })
        ));
        assert!(matches!(
            log.append_now(b"", t(5), &[b"x"]),
            Err(Error::Invalid { .. })
        ));
        let none: [&[u8]; 0] = [];
        assert!(log.append_now(b"s", t(5), &none).is_err());
    });
}
