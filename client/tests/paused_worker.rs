//! The seed scenario (`examples/paused_worker.rs`, run as is) against one
//! server and against a 3-node cluster (`fencelog cluster local`): a worker
//! paused past its ttl wakes up after another took the lease. Its write
//! must be refused, its `lost()` must have fired by its first call after
//! waking, and the stream must hold only the new holder's records from the
//! takeover on. On the cluster every step goes through the Raft log, the
//! ttl runs on the leader's clock and the client finds the leader itself.

mod common;

#[allow(dead_code)]
#[path = "../examples/paused_worker.rs"]
mod paused_worker;

use fencelog_client::{Error, LeaseLoss};

#[tokio::test]
async fn the_paused_worker_is_fenced_out() {
    let server = server_or_skip!(&[]);
    let o = paused_worker::run(std::slice::from_ref(&server.addr), "jobs")
        .await
        .unwrap();
    check(o);
}

#[tokio::test]
async fn the_paused_worker_is_fenced_out_on_a_three_node_cluster() {
    let Some(cluster) = common::Server::start_cluster(3) else {
        return;
    };
    let base: u16 = cluster.addr.rsplit(':').next().unwrap().parse().unwrap();
    let nodes: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    let o = paused_worker::run(&nodes, "jobs").await.unwrap();
    check(o);
}

fn check(o: paused_worker::Outcome) {
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
