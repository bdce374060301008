//! The lease keeper: it must hold a lease across many ttls, and signal its
//! loss when it cannot confirm a renewal in time — a keeper that only
//! renewed, or only noticed loss on the next write, would let a paused or
//! partitioned holder go on believing it owns the stream.

mod common;

use std::time::Duration;

use fencelog_client::{Client, Config, Error, LeaseLoss, LeaseOptions};
use tokio::time::Instant;

#[tokio::test]
async fn the_keeper_holds_a_lease_across_many_ttls() {
    let server = server_or_skip!(&[]);
    let c = server.client().await;
    let ttl = Duration::from_millis(600);
    let lease = c
        .lease("held", "keeper", ttl, LeaseOptions::default())
        .await
        .unwrap();
    let lost = lease.lost();
    tokio::pin!(lost);
    let until = Instant::now() + ttl * 8;
    let mut checks = 0;
    while Instant::now() < until {
        tokio::select! {
            why = &mut lost => panic!("the lease ended ({why:?}) while its keeper should hold it"),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let info = c.lease_info("held").await.unwrap().expect("still held");
        assert_eq!((info.owner.as_str(), info.token), ("keeper", lease.token()));
        checks += 1;
    }
    assert!(checks >= 15, "{checks}");
    assert!(matches!(
        c.acquire("held", "other", ttl, &LeaseOptions::default())
            .await,
        Err(Error::Held { .. })
    ));
    assert_eq!(lease.append("held", &["still mine"]).await.unwrap(), 0);
    let token = lease.token();
    assert!(lease.release().await.unwrap());
    assert!(
        !c.release("held", "keeper", token).await.unwrap(),
        "released once already"
    );
    c.acquire("held", "other", ttl, &LeaseOptions::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_refused_renewal_ends_the_lease_and_dropping_releases() {
    let server = server_or_skip!(&[]);
    let c = server.client().await;
    let ttl = Duration::from_millis(600);
    let lease = c
        .lease("r", "me", ttl, LeaseOptions::default())
        .await
        .unwrap();
    // Someone with the token releases it behind the keeper's back: the next
    // renewal answers LOST.
    assert!(c.release("r", "me", lease.token()).await.unwrap());
    let why = tokio::time::timeout(ttl, lease.lost())
        .await
        .expect("loss signalled within a ttl");
    assert_eq!(why, LeaseLoss::Refused);
    assert!(matches!(lease.append("r", &["x"]).await, Err(Error::Lost)));
    assert_eq!(c.stat("r").await.unwrap().records, 0);

    let dropped = c
        .lease("d", "me", Duration::from_secs(30), LeaseOptions::default())
        .await
        .unwrap();
    let lost = dropped.lost();
    drop(dropped);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), lost)
            .await
            .unwrap(),
        LeaseLoss::Released
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.lease_info("d").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the drop never released the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server is stopped (SIGSTOP) past the ttl: the keeper's renewal gets
/// no answer, `lost()` fires by the ttl less its margin, and every write
/// attempted after that is refused locally — none reaches the server when
/// it resumes.
#[tokio::test]
async fn a_silent_server_past_the_ttl_is_a_lost_lease() {
    let server = server_or_skip!(&[]);
    let config = Config {
        request_timeout: Duration::from_secs(1),
        ..server.config()
    };
    let c = Client::connect(config).await.unwrap();
    let ttl = Duration::from_millis(600);
    let lease = std::sync::Arc::new(
        c.lease(
            "w",
            "me",
            ttl,
            LeaseOptions {
                fence: true,
                ..Default::default()
            },
        )
        .await
        .unwrap(),
    );

    // A worker writing through the lease until it is refused.
    let worker = {
        let lease = lease.clone();
        tokio::spawn(async move {
            let mut ok = Vec::new();
            for i in 0..10_000 {
                match lease.append("w", &[format!("before {i}")]).await {
                    Ok(offset) => ok.push(offset),
                    Err(e) => return (ok, e),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the worker was never refused");
        })
    };
    tokio::time::sleep(ttl / 2).await;
    server.signal("STOP");
    let stopped = Instant::now();
    let why = tokio::time::timeout(ttl * 3, lease.lost())
        .await
        .expect("lost() fired while the server was stopped");
    let after = stopped.elapsed();
    assert_eq!(why, LeaseLoss::Expired);
    // Measured from the last renewal sent (before the stop): never later
    // than a ttl after the stop, whatever the scheduling.
    assert!(
        after <= ttl,
        "lost() fired {after:?} after the stop, ttl {ttl:?}"
    );

    for i in 0..3 {
        let t = Instant::now();
        let r = lease.append("w", &[format!("after {i}")]).await;
        assert!(matches!(r, Err(Error::Lost)), "{r:?}");
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "refused locally, not after a round trip"
        );
    }
    server.signal("CONT");
    let (ok, last) = worker.await.unwrap();
    assert!(!ok.is_empty());
    // The worker's last write was in flight at the stop: either refused
    // locally, or its reply lost and not retried after the loss.
    assert!(matches!(last, Error::Lost | Error::Uncertain), "{last:?}");

    let records = c.read("w", 0, 10_000).await.unwrap();
    assert!(
        records.iter().all(|r| r.payload.starts_with(b"before ")),
        "a write after the loss landed"
    );
    let in_flight = usize::from(matches!(last, Error::Uncertain));
    assert!(
        records.len() == ok.len() || records.len() == ok.len() + in_flight,
        "{} records, {} acknowledged, last {last:?}",
        records.len(),
        ok.len()
    );
}

/// A lease that waited (`WAIT`) longer than its own ttl is confirmed at
/// once, not taken as expired: the wait must not eat the ttl.
#[tokio::test]
async fn a_lease_acquired_after_a_long_wait_is_held() {
    let server = server_or_skip!(&[]);
    let c = server.client().await;
    let first = c
        .acquire(
            "w",
            "first",
            Duration::from_millis(600),
            &LeaseOptions::default(),
        )
        .await
        .unwrap();
    let ttl = Duration::from_millis(300);
    let waited = Instant::now();
    let lease = c
        .lease(
            "w",
            "second",
            ttl,
            LeaseOptions {
                wait: Some(Duration::from_secs(5)),
                fence: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(
        waited.elapsed() > ttl,
        "it waited for the first lease to expire"
    );
    assert!(lease.token() > first.token);
    assert!(!lease.is_lost(), "{:?}", lease.loss());
    tokio::time::sleep(ttl * 3).await;
    assert!(!lease.is_lost(), "{:?}", lease.loss());
    assert_eq!(lease.append("w", &["mine"]).await.unwrap(), 0);
}
