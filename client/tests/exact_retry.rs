//! A write whose reply is lost must land exactly once. A proxy between the
//! client and the server swallows the reply to the first `LOG.APPENDAT`
//! (closing the connection, or holding it open until the client times
//! out): `Lease::append` must retry once at the same offset and answer that
//! offset, and the stream must hold the record once. A plain `append`
//! through the same proxy shows what the retry guards against.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use fencelog_client::{Client, Config, Error, LeaseOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the proxy does to the reply of the next request naming `LOG.APPEND`.
const PASS: u8 = 0;
const DROP_AND_CLOSE: u8 = 1;
const DROP_AND_HOLD: u8 = 2;

struct Proxy {
    addr: String,
    mode: Arc<AtomicU8>,
    swallowed: Arc<AtomicUsize>,
}

async fn proxy(upstream: String) -> Proxy {
    // A port the kernel picks, kept bound: no window for another test.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let mode = Arc::new(AtomicU8::new(PASS));
    let swallowed = Arc::new(AtomicUsize::new(0));
    let (m, sw) = (mode.clone(), swallowed.clone());
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (m, sw) = (m.clone(), sw.clone());
            tokio::spawn(async move {
                let (mut crd, mut cwr) = client.into_split();
                let (mut srd, mut swr) = server.into_split();
                // This connection's pending action for the next reply.
                let armed = Arc::new(AtomicU8::new(PASS));
                let armed2 = armed.clone();
                let up = async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match crd.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        // The client has one request in flight per
                        // connection, so the next bytes from the server
                        // are this request's reply.
                        if buf[..n].windows(10).any(|w| w == b"LOG.APPEND") {
                            armed2.store(m.swap(PASS, Ordering::SeqCst), Ordering::SeqCst);
                        }
                        if swr.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match srd.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        match armed.swap(PASS, Ordering::SeqCst) {
                            DROP_AND_CLOSE => {
                                sw.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            DROP_AND_HOLD => {
                                sw.fetch_add(1, Ordering::SeqCst);
                                // Keep the client's socket open and silent.
                                tokio::time::sleep(Duration::from_secs(60)).await;
                                return;
                            }
                            _ => {}
                        }
                        if cwr.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                };
                tokio::select! { _ = up => {}, _ = down => {} }
            });
        }
    });
    Proxy {
        addr: format!("127.0.0.1:{port}"),
        mode,
        swallowed,
    }
}

#[tokio::test]
async fn a_lost_reply_is_retried_exactly_once() {
    let server = server_or_skip!(&[]);
    let direct = server.client().await;
    let p = proxy(server.addr.clone()).await;
    let c = Client::connect(Config {
        request_timeout: Duration::from_millis(500),
        ..Config::new(p.addr.clone())
    })
    .await
    .unwrap();
    let lease = c
        .lease(
            "x",
            "me",
            Duration::from_secs(30),
            LeaseOptions {
                fence: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();

    for (i, mode) in [DROP_AND_CLOSE, DROP_AND_HOLD].into_iter().enumerate() {
        let before = p.swallowed.load(Ordering::SeqCst);
        p.mode.store(mode, Ordering::SeqCst);
        let payload = format!("exactly once {i}");
        let offset = lease.append("x", &[payload.as_str()]).await.unwrap();
        assert_eq!(offset, i as u64, "mode {mode}");
        assert_eq!(
            p.swallowed.load(Ordering::SeqCst),
            before + 1,
            "the first reply was swallowed"
        );
        let records = direct.read("x", 0, 100).await.unwrap();
        assert_eq!(records.len(), i + 1, "mode {mode}: {records:?}");
        assert_eq!(records[i].payload, payload.as_bytes());
        assert_eq!(records[i].token, lease.token());
    }

    // The same loss under a plain LOG.APPEND: the caller learns only that
    // the outcome is unknown, and the record did land.
    p.mode.store(DROP_AND_CLOSE, Ordering::SeqCst);
    let r = c.append("x", lease.token(), &["plain"]).await;
    assert!(matches!(&r, Err(e) if e.outcome_unknown()), "{r:?}");
    assert_eq!(direct.stat("x").await.unwrap().records, 3);

    // A write refused for a stale token is not retried, and ends the lease.
    direct.fence("x", lease.token() + 1).await.unwrap();
    assert!(matches!(
        lease.append("x", &["late"]).await,
        Err(Error::Stale { .. })
    ));
    assert!(lease.is_lost());
    assert_eq!(direct.stat("x").await.unwrap().records, 3);
}
