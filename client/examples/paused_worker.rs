//! The failure fencelog exists for, through the client: two workers, one
//! lease.
//!
//! Worker A takes the lease (short ttl, `FENCE`) and writes. Then it is
//! paused past its ttl (a GC pause, a stopped VM: here its keeper is
//! suspended and it sleeps), so its lease expires on the server. Worker B
//! acquires with `FENCE` and writes. A wakes up and tries to go on: its
//! write is refused (locally, because its lease can no longer be trusted,
//! and by the server, `STALE`, if sent anyway) and its `lost()` has fired.
//!
//! ```sh
//! fencelog serve --dir /tmp/fl &
//! cargo run -p fencelog-client --example paused_worker -- 127.0.0.1:7379
//! # or against a cluster, any of its nodes as seeds:
//! fencelog cluster local --nodes 3 --port 7379 --dir /tmp/flc &
//! cargo run -p fencelog-client --example paused_worker -- 127.0.0.1:7379 127.0.0.1:7380 127.0.0.1:7381
//! ```

use std::time::Duration;

use fencelog_client::{Client, Config, Error, LeaseLoss, LeaseOptions, Record};

/// What happened, for the test that runs this scenario.
#[derive(Debug)]
pub struct Outcome {
    /// A's token and B's.
    pub tokens: (u64, u64),
    /// A's first write after waking, through its lease.
    pub late_write: Result<u64, Error>,
    /// Whether A's `lost()` had completed right after that first call, and
    /// why.
    pub lost_after_first_call: Option<LeaseLoss>,
    /// A's old token sent anyway, without the lease's check.
    pub raw_late_write: Result<u64, Error>,
    /// The offset of B's first record.
    pub takeover_offset: u64,
    /// The whole stream at the end.
    pub records: Vec<Record>,
}

/// Runs the scenario on `stream` against the server or cluster that
/// `seeds` (one address or several nodes') lead to.
pub async fn run(seeds: &[String], stream: &str) -> Result<Outcome, Error> {
    let client = Client::connect(Config {
        seeds: seeds.to_vec(),
        // A cluster just started may still be electing its first leader.
        retry_total: Duration::from_secs(20),
        ..Config::default()
    })
    .await?;
    let ttl = Duration::from_millis(500);
    let fence = LeaseOptions {
        fence: true,
        ..Default::default()
    };

    // Worker A: acquires, writes, then stalls for three ttls.
    let a = client.lease(stream, "worker-a", ttl, fence).await?;
    a.append(stream, &["A: step 1"]).await?;
    let a_lost = a.lost();
    a.pause_keeper_for_test(ttl * 4);
    let a_wakes = tokio::time::Instant::now() + ttl * 3;

    // Worker B: waits for A's lease to expire, fences the stream, writes.
    let b = client
        .lease(
            stream,
            "worker-b",
            ttl * 10,
            LeaseOptions {
                wait: Some(Duration::from_secs(10)),
                ..fence
            },
        )
        .await?;
    let takeover_offset = b.append(stream, &["B: step 1"]).await?;
    b.append(stream, &["B: step 2"]).await?;

    // A wakes up and carries on as if nothing happened.
    tokio::time::sleep_until(a_wakes).await;
    let late_write = a.append(stream, &["A: step 2, late"]).await;
    let lost_after_first_call = tokio::time::timeout(Duration::ZERO, a_lost).await.ok();
    let raw_late_write = client
        .append(stream, a.token(), &["A: step 2, sent anyway"])
        .await;

    let records = client.read(stream, 0, 100).await?;
    let tokens = (a.token(), b.token());
    b.release().await?;
    Ok(Outcome {
        tokens,
        late_write,
        lost_after_first_call,
        raw_late_write,
        takeover_offset,
        records,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut seeds: Vec<String> = std::env::args().skip(1).collect();
    if seeds.is_empty() {
        seeds.push("127.0.0.1:7379".to_string());
    }
    let stream = format!("paused-worker-{}", std::process::id());
    let o = run(&seeds, &stream).await?;
    println!("tokens: A {} B {}", o.tokens.0, o.tokens.1);
    println!("A's late write through its lease: {:?}", o.late_write);
    println!("A's lost() after that call: {:?}", o.lost_after_first_call);
    println!("A's late write sent anyway: {:?}", o.raw_late_write);
    println!("stream {stream}:");
    for r in &o.records {
        println!(
            "  {} token {} {}",
            r.offset,
            r.token,
            String::from_utf8_lossy(&r.payload)
        );
    }
    Ok(())
}
