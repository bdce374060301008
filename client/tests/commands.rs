//! Every typed command against the real server, and every refusal arriving
//! as its own `Error` variant with the server's numbers: a client that
//! turned `STALE` into a generic error would let callers treat a fenced-out
//! writer like a flaky network and retry.

mod common;

use std::time::Duration;

use fencelog_client::{Client, Config, Error, LeaseOptions};

#[tokio::test]
async fn streams_answer_typed_values_and_errors() {
    let server = server_or_skip!(&["--max-payload", "1KiB"]);
    let c = server.client().await;

    assert_eq!(c.append("s", 5, &["a", "b"]).await.unwrap(), 0);
    assert_eq!(c.append_at("s", 5, 2, &["c"]).await.unwrap(), 2);
    match c.append_at("s", 5, 1, &["x"]).await {
        Err(Error::Mismatch {
            expected: 1,
            next: 3,
        }) => {}
        other => panic!("{other:?}"),
    }
    match c.append("s", 4, &["late"]).await {
        Err(Error::Stale {
            presented: 4,
            highest: 5,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(c.fence("s", 7).await.unwrap(), 7);
    match c.fence("s", 6).await {
        Err(Error::Stale {
            presented: 6,
            highest: 7,
        }) => {}
        other => panic!("{other:?}"),
    }

    let records = c.read("s", 0, 10).await.unwrap();
    let got: Vec<(u64, u64, &[u8])> = records
        .iter()
        .map(|r| (r.offset, r.token, r.payload.as_ref()))
        .collect();
    assert_eq!(got, vec![(0, 5, &b"a"[..]), (1, 5, b"b"), (2, 5, b"c")]);
    assert_eq!(c.read("s", 1, 1).await.unwrap().len(), 1);
    assert!(c.read("s", 3, 10).await.unwrap().is_empty());

    let stat = c.stat("s").await.unwrap();
    assert_eq!(
        (
            stat.highest_token,
            stat.next_offset,
            stat.start_offset,
            stat.records,
            stat.bytes
        ),
        (7, 3, 0, 3, 3)
    );

    assert_eq!(c.trim("s", 7, 2).await.unwrap(), 2);
    match c.read("s", 1, 10).await {
        Err(Error::Trimmed {
            requested: 1,
            start: 2,
        }) => {}
        other => panic!("{other:?}"),
    }
    match c.append("s", 7, &[vec![0u8; 2048]]).await {
        Err(Error::TooBig(msg)) => assert!(msg.starts_with("TOOBIG"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // The connection stays usable after TOOBIG.
    assert_eq!(c.delete("s", 7).await.unwrap(), 1);
    let stat = c.stat("s").await.unwrap();
    assert_eq!(
        (stat.highest_token, stat.next_offset, stat.records),
        (7, 3, 0)
    );

    c.append("t", 1, &["x"]).await.unwrap();
    let names = c.streams().await.unwrap();
    assert_eq!(
        names,
        vec![
            bytes::Bytes::from_static(b"s"),
            bytes::Bytes::from_static(b"t")
        ]
    );

    match c.append("s", 0, &["zero"]).await {
        Err(Error::Server(msg)) => assert!(msg.starts_with("ERR"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.append::<&str>("s", 7, &[]).await,
        Err(Error::Invalid(_))
    ));
}

#[tokio::test]
async fn leases_answer_typed_values_and_errors() {
    let server = server_or_skip!(&[]);
    let c = server.client().await;
    let ttl = Duration::from_secs(10);
    assert_eq!(c.lease_info("job").await.unwrap(), None);
    let g = c
        .acquire(
            "job",
            "a",
            ttl,
            &LeaseOptions {
                fence: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(g.ttl, ttl);
    assert_eq!(
        c.stat("job").await.unwrap().highest_token,
        g.token,
        "FENCE fenced the stream"
    );
    match c.acquire("job", "b", ttl, &LeaseOptions::default()).await {
        Err(Error::Held { remaining }) => assert!(
            remaining > Duration::from_secs(5) && remaining <= ttl,
            "{remaining:?}"
        ),
        other => panic!("{other:?}"),
    }
    let info = c.lease_info("job").await.unwrap().unwrap();
    assert_eq!((info.owner.as_str(), info.token), ("a", g.token));
    assert_eq!(c.renew("job", "a", g.token, ttl).await.unwrap(), ttl);
    assert!(matches!(
        c.renew("job", "a", g.token + 100, ttl).await,
        Err(Error::Lost)
    ));
    assert!(matches!(
        c.renew("job", "b", g.token, ttl).await,
        Err(Error::Lost)
    ));
    assert!(c.release("job", "a", g.token).await.unwrap());
    assert!(!c.release("job", "a", g.token).await.unwrap());

    // WAIT: b gets it once a's short lease expires, with a newer token.
    let short = c
        .acquire(
            "job2",
            "a",
            Duration::from_millis(300),
            &LeaseOptions::default(),
        )
        .await
        .unwrap();
    let waited = c
        .acquire(
            "job2",
            "b",
            ttl,
            &LeaseOptions {
                wait: Some(Duration::from_secs(5)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(waited.token > short.token);
}

#[tokio::test]
async fn tail_follows_new_records_with_block() {
    let server = server_or_skip!(&[]);
    let c = server.client().await;
    let mut tail = c.tail("log", 0, Duration::from_millis(200));
    assert_eq!(
        tail.next_record().await.unwrap(),
        None,
        "nothing yet: one BLOCK interval, then None"
    );
    let writer = c.clone();
    let w = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.append("log", 1, &["r0", "r1"]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        writer.append("log", 1, &["r2"]).await.unwrap();
    });
    let mut got = Vec::new();
    for _ in 0..50 {
        if let Some(r) = tail.next_record().await.unwrap() {
            got.push((r.offset, r.payload));
        }
        if got.len() == 3 {
            break;
        }
    }
    w.await.unwrap();
    let want: Vec<(u64, bytes::Bytes)> = (0..3)
        .map(|i| (i, bytes::Bytes::from(format!("r{i}"))))
        .collect();
    assert_eq!(got, want);
    assert_eq!(tail.position(), 3);
}

#[tokio::test]
async fn auth_over_resp3_and_resp2() {
    let server = server_or_skip!(&["--requirepass", "sesame"]);
    let wrong = Client::connect(Config {
        password: Some("nope".into()),
        ..server.config()
    })
    .await;
    match wrong {
        Err(Error::Server(msg)) => assert!(msg.starts_with("WRONGPASS"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let none = Client::connect(server.config()).await;
    match none {
        Err(Error::Server(msg)) => assert!(msg.starts_with("NOAUTH"), "{msg}"),
        other => panic!("{other:?}"),
    }
    for resp3 in [true, false] {
        for user in [None, Some("default".to_string())] {
            let c = Client::connect(Config {
                password: Some("sesame".into()),
                user: user.clone(),
                resp3,
                ..server.config()
            })
            .await
            .unwrap();
            // LOG.STAT is a map under RESP3 and a flat array under RESP2:
            // both read the same.
            c.append("a", 1, &["x"]).await.unwrap();
            assert_eq!(
                c.stat("a").await.unwrap().highest_token,
                1,
                "resp3={resp3} user={user:?}"
            );
            assert_eq!(c.lease_info("nobody").await.unwrap(), None, "resp3={resp3}");
        }
    }
}

#[test]
fn the_blocking_client_is_the_async_one() {
    let Some(server) = common::Server::start(&[]) else {
        return;
    };
    let c = fencelog_client::blocking::Client::connect(server.config()).unwrap();
    c.ping().unwrap();
    // A first grant, so the lease's token has an older one below it.
    c.acquire(
        "other",
        "w",
        Duration::from_secs(10),
        &LeaseOptions::default(),
    )
    .unwrap();
    let lease = c
        .lease(
            "b",
            "w",
            Duration::from_millis(600),
            LeaseOptions {
                fence: true,
                ..Default::default()
            },
        )
        .unwrap();
    // The keeper runs on the client's own runtime while this thread sleeps.
    std::thread::sleep(Duration::from_millis(2000));
    assert!(!lease.is_lost());
    assert_eq!(lease.append("b", &["one"]).unwrap(), 0);
    match c.append("b", lease.token() - 1, &["stale"]) {
        Err(Error::Stale { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(c.read("b", 0, 10).unwrap().len(), 1);
    let token = lease.token();
    assert!(lease.release().unwrap());
    assert_eq!(c.lease_info("b").unwrap(), None);
    assert!(!c.release("b", "w", token).unwrap());
}

/// A server that refuses `HELLO` (as Redis before 6 does) gets RESP2.
#[tokio::test]
async fn falls_back_to_resp2_when_hello_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Bound to a port the kernel picks, kept: a port found free and bound
    // later can be taken in between by another test (seen in CI).
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let replies: [&[u8]; 3] = [
            b"-ERR unknown command 'HELLO', with args beginning with: '3'\r\n",
            b"-ERR This instance has cluster support disabled\r\n",
            b"*10\r\n$13\r\nhighest_token\r\n:9\r\n$11\r\nnext_offset\r\n:1\r\n$12\r\nstart_offset\r\n:0\r\n$7\r\nrecords\r\n:1\r\n$5\r\nbytes\r\n:3\r\n",
        ];
        for reply in replies {
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            s.write_all(reply).await.unwrap();
        }
        seen
    });
    let c = Client::connect(Config::new(format!("127.0.0.1:{port}")))
        .await
        .unwrap();
    let stat = c.stat("x").await.unwrap();
    assert_eq!(
        (stat.highest_token, stat.next_offset, stat.bytes),
        (9, 1, 3)
    );
    let seen = fake.await.unwrap();
    assert!(
        seen[0].contains("HELLO") && seen[1].contains("CLUSTER") && seen[2].contains("LOG.STAT"),
        "{seen:?}"
    );
}

/// The blocking client dropped inside an async runtime (a plain tokio
/// runtime drop would panic there), and its tail.
#[tokio::test]
async fn the_blocking_client_can_be_dropped_anywhere() {
    let server = server_or_skip!(&[]);
    let addr = server.addr.clone();
    let c = tokio::task::spawn_blocking(move || {
        let c = fencelog_client::blocking::Client::connect(Config::new(addr)).unwrap();
        c.append("bt", 1, &["x"]).unwrap();
        let mut tail = c.tail("bt", 0, Duration::from_millis(50));
        assert_eq!(tail.next_record().unwrap().map(|r| r.offset), Some(0));
        assert_eq!(tail.next_record().unwrap(), None);
        c
    })
    .await
    .unwrap();
    drop(c);
}
