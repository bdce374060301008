//! The seed scenario (`examples/paused_worker.rs`, run as is): a worker
//! paused past its ttl wakes up after another took the lease. Its write must
//! be refused, its `lost()` must have fired by its first call after waking,
//! and the stream must hold only the new holder's records from the
//! takeover on.

mod common;

#[allow(dead_code)]
#[path = "../examples/paused_worker.rs"]
mod paused_worker;

use fencelog_client::{Error, LeaseLoss};

#[tokio::test]
async fn the_paused_worker_is_fenced_out() {
    let server = server_or_skip!(&[]);
    let o = paused_worker::run(&server.addr, "jobs").await.unwrap();
    let (a, b) = o.tokens;
    assert!(b > a, "{a} {b}");
    assert!(
        matches!(o.late_write, Err(Error::Lost)),
        "{:?}",
        o.late_write
    );
    assert_eq!(o.lost_after_first_call, Some(LeaseLoss::Expired));
    match o.raw_late_write {
        Err(Error::Stale { presented, highest }) => assert_eq!((presented, highest), (a, b)),
        other => panic!("{other:?}"),
    }
    let got: Vec<(u64, u64, &[u8])> = o
        .records
        .iter()
        .map(|r| (r.offset, r.token, r.payload.as_ref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, a, &b"A: step 1"[..]),
            (1, b, b"B: step 1"),
            (2, b, b"B: step 2")
        ]
    );
    assert_eq!(o.takeover_offset, 1);
    assert!(
        o.records
            .iter()
            .filter(|r| r.offset >= o.takeover_offset)
            .all(|r| r.token == b)
    );
}
