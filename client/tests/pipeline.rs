//! `Pipeline` against the real server: many requests on one connection,
//! their replies in the order sent (a stale write in the middle refuses
//! only itself), a batch whose replies are far over what the server keeps
//! unread (64 KiB) does not deadlock, and a call dropped midway leaves the
//! pipeline refusing further use instead of handing a late reply to the
//! next request.

mod common;

use std::time::Duration;

use fencelog_client::{Error, Reply, Request, Value};

#[tokio::test]
async fn replies_come_back_in_order_each_judged_in_place() {
    let server = server_or_skip!(&[]);
    let client = server.client().await;
    client.fence("p", 5).await.unwrap();
    let mut p = client.pipeline().await.unwrap();
    assert_eq!(p.addr(), server.addr);

    // 1000 appends, every third with a stale token.
    let valid = Request::new(&[b"LOG.APPEND", b"p", b"5", b"ok"]);
    for i in 0..1000 {
        if i % 3 == 2 {
            p.queue(&[b"LOG.APPEND", b"p", b"4", b"late"]);
        } else {
            p.queue_request(&valid);
        }
    }
    assert_eq!((p.queued(), p.in_flight()), (1000, 0));
    let mut got = Vec::new();
    p.exchange(|r| {
        got.push(match r {
            Reply::Int(n) => Ok(n),
            Reply::Error(e) => Err(String::from_utf8_lossy(e).into_owned()),
            other => panic!("{other}"),
        })
    })
    .await
    .unwrap();
    assert_eq!((p.queued(), p.in_flight()), (0, 0));
    let mut next = 0;
    for (i, r) in got.iter().enumerate() {
        if i % 3 == 2 {
            assert!(matches!(r, Err(e) if e.starts_with("STALE ")), "{i}: {r:?}");
        } else {
            assert_eq!(r, &Ok(next), "{i}");
            next += 1;
        }
    }
    assert_eq!(client.stat("p").await.unwrap().next_offset, next as u64);

    // The halves on their own: send, then read one at a time; aggregates
    // arrive whole.
    p.queue(&[b"LOG.READ", b"p", b"0", b"COUNT", b"2"]);
    p.queue(&[b"PING"]);
    p.send().await.unwrap();
    assert_eq!(p.in_flight(), 2);
    assert!(matches!(
        p.request(&[b"PING"]).await,
        Err(Error::Invalid(_))
    ));
    match p.read().await.unwrap() {
        Value::Array(records) => assert_eq!(records.len(), 2),
        other => panic!("{other:?}"),
    }
    let pong = p
        .read_with(|r| matches!(r, Reply::Simple(b"PONG")))
        .await
        .unwrap();
    assert!(pong);
    assert!(matches!(p.read().await, Err(Error::Invalid(_))));
    let e = p.request(&[b"LOG.APPEND", b"p", b"4", b"x"]).await.unwrap();
    assert!(matches!(
        Reply::Other(Box::new(e)).error(),
        Some(Error::Stale {
            presented: 4,
            highest: 5
        })
    ),);
}

#[tokio::test]
async fn a_batch_far_over_the_unread_reply_budget_completes() {
    let server = server_or_skip!(&[]);
    let client = server.client().await;
    let mut p = client.pipeline().await.unwrap();
    // 40 000 PINGs: 280 KB of replies, over four times what the server
    // keeps waiting for a reader before it stops reading.
    for _ in 0..40_000 {
        p.queue(&[b"PING"]);
    }
    let mut pongs = 0;
    tokio::time::timeout(
        Duration::from_secs(30),
        p.exchange(|r| pongs += usize::from(r == Reply::Simple(b"PONG"))),
    )
    .await
    .expect("no deadlock")
    .unwrap();
    assert_eq!(pongs, 40_000);
}

#[tokio::test]
async fn a_call_dropped_midway_leaves_the_pipeline_refusing() {
    let server = server_or_skip!(&[]);
    let client = server.client().await;
    let mut p = client.pipeline().await.unwrap();
    p.queue(&[b"LOG.READ", b"empty", b"0", b"BLOCK", b"2000"]);
    let cut = tokio::time::timeout(Duration::from_millis(100), p.exchange(|_| {})).await;
    assert!(cut.is_err(), "the blocked read answered: {cut:?}");
    // Its reply may still come: it must not answer the next request.
    assert!(matches!(p.exchange(|_| {}).await, Err(Error::Protocol(_))));
    assert!(matches!(p.send().await, Err(Error::Protocol(_))));
}
