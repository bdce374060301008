//! Routing against fake nodes that misbehave on purpose: `-TRYAGAIN`
//! forever must end within the retry time with a bounded number of
//! attempts, and a `-MOVED` loop must end after the redirect limit. A
//! client without those bounds would hang its caller (and a lease keeper)
//! for as long as a cluster stays without a leader.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencelog_client::{Client, Config, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A node that answers each request (one per read: the client waits for
/// every answer) with `answer(request)`; counts the requests.
async fn fake_node(answer: fn(&str, u16) -> String) -> (String, Arc<AtomicUsize>) {
    // A port the kernel picks, kept bound: no window for another test.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let n = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let n = n.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let len = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(len) => len,
                    };
                    let req = String::from_utf8_lossy(&buf[..len]).into_owned();
                    n.fetch_add(1, Ordering::SeqCst);
                    if s.write_all(answer(&req, port).as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("127.0.0.1:{port}"), count)
}

fn config(addr: &str) -> Config {
    Config {
        retry_total: Duration::from_millis(400),
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        ..Config::new(addr)
    }
}

#[tokio::test]
async fn tryagain_forever_ends_within_the_retry_time() {
    let (addr, count) = fake_node(|req, _| {
        if req.contains("HELLO") {
            "%1\r\n$6\r\nserver\r\n$8\r\nfencelog\r\n".into()
        } else if req.contains("CLUSTER") {
            "-ERR This instance has cluster support disabled\r\n".into()
        } else {
            "-TRYAGAIN no leader yet\r\n".into()
        }
    })
    .await;
    let c = Client::connect(config(&addr)).await.unwrap();
    let before = count.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    let r = c.stat("s").await;
    let took = started.elapsed();
    match r {
        Err(Error::Server(msg)) => assert!(msg.starts_with("TRYAGAIN"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(took <= Duration::from_millis(400 + 200), "{took:?}");
    // 10, 20, 40, 80, 100, 100 ms: a handful of tries, not a spin.
    let tries = count.load(Ordering::SeqCst) - before;
    assert!((3..=10).contains(&tries), "{tries} tries");
}

#[tokio::test]
async fn a_moved_loop_ends_after_the_redirect_limit() {
    let (addr, count) = fake_node(|req, port| {
        if req.contains("HELLO") {
            "%1\r\n$6\r\nserver\r\n$8\r\nfencelog\r\n".into()
        } else if req.contains("CLUSTER") {
            "-ERR This instance has cluster support disabled\r\n".into()
        } else {
            format!("-MOVED 1234 127.0.0.1:{port}\r\n")
        }
    })
    .await;
    let c = Client::connect(Config {
        max_redirects: 3,
        ..config(&addr)
    })
    .await
    .unwrap();
    let before = count.load(Ordering::SeqCst);
    match c.append("s", 1, &["x"]).await {
        Err(Error::Server(msg)) => assert!(msg.starts_with("MOVED"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        count.load(Ordering::SeqCst) - before,
        4,
        "the first try and 3 redirects"
    );
    // What has no typed method goes through the same routing.
    assert!(matches!(
        c.execute(&[b"INFO"], Duration::from_secs(1)).await,
        Err(Error::Server(_))
    ));
    match c
        .execute_on(&addr, &[b"INFO"], Duration::from_secs(1))
        .await
    {
        Err(Error::Server(msg)) => assert!(msg.starts_with("MOVED"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn no_node_listening_ends_within_the_retry_time() {
    let port = common::free_ports(&[0]);
    let started = std::time::Instant::now();
    let r = Client::connect(config(&format!("127.0.0.1:{port}"))).await;
    assert!(matches!(r, Err(Error::Io(_))), "{r:?}");
    assert!(
        started.elapsed() <= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
}

/// `UNCERTAIN` (a leader stepped down with the command in flight) on an
/// acquire is asked again: an acquire by the owner that holds the lease
/// answers its token again, so the retry cannot take a second one. An
/// append that met it is not sent again: it could land twice.
#[tokio::test]
async fn an_uncertain_acquire_is_asked_again_and_an_uncertain_append_is_not() {
    static ACQUIRES: AtomicUsize = AtomicUsize::new(0);
    let (addr, count) = fake_node(|req, _| {
        if req.contains("HELLO") {
            "%1\r\n$6\r\nserver\r\n$8\r\nfencelog\r\n".into()
        } else if req.contains("CLUSTER") {
            "-ERR This instance has cluster support disabled\r\n".into()
        } else if req.contains("LEASE.ACQUIRE") && ACQUIRES.fetch_add(1, Ordering::SeqCst) < 2 {
            "-UNCERTAIN the leader stepped down with it in flight\r\n".into()
        } else if req.contains("LEASE.ACQUIRE") {
            "*2\r\n:7\r\n:1000\r\n".into()
        } else {
            "-UNCERTAIN the leader stepped down with it in flight\r\n".into()
        }
    })
    .await;
    let c = Client::connect(config(&addr)).await.unwrap();
    let options = fencelog_client::LeaseOptions::default();
    let grant = c
        .acquire("l", "me", Duration::from_secs(1), &options)
        .await
        .unwrap();
    assert_eq!((grant.token, grant.ttl), (7, Duration::from_secs(1)));
    assert_eq!(
        ACQUIRES.load(Ordering::SeqCst),
        3,
        "two UNCERTAIN, then the grant"
    );

    let before = count.load(Ordering::SeqCst);
    assert!(matches!(
        c.append("s", 1, &["x"]).await,
        Err(Error::Uncertain)
    ));
    assert_eq!(count.load(Ordering::SeqCst) - before, 1, "sent once");
}
