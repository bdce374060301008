//! Issue 22, "Done when" item 3: many clients contend for one lock on a
//! real 3-node cluster, through proxies that lose replies and cut
//! connections at random (seeded).
//!
//! Every client loops: take the lease `lock` (fencing the stream `lock` at
//! its token), append a few records through it, release. Each record's
//! payload names its client, token and sequence number, so the stream can
//! be checked record by record at the end:
//!
//! - tokens strictly increase from one holder to the next: no two grants
//!   share a token, and the stream's tokens never go down (no write under
//!   an older token lands after a newer one);
//! - every acknowledged write is in the stream exactly once, at the offset
//!   it was answered with; no refused write is; none is there twice;
//! - every write whose reply the proxy lost (the request cut before the
//!   node saw it, or its reply swallowed and the connection closed) and
//!   that `Lease::append` then acknowledged (its one exact retry through
//!   `LOG.APPENDAT`) lands exactly once.
//!
//! The nodes advertise the proxies' addresses (`--cluster-advertise`), so
//! `CLUSTER SLOTS` and `-MOVED` keep the clients behind them.
//!
//! Defaults fit a CI run (20 clients, 15 s); `FENCELOG_LONG=1` runs the
//! full sizes (100 clients, 60 s). `FENCELOG_CLIENTS`, `FENCELOG_SECS` and
//! `FENCELOG_SEED` override them.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::nodes::{Nodes, Rng, env_num, long};
use fencelog_client::{Client, Config, Error, LeaseOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// What the proxies did, and to which writes.
#[derive(Default)]
struct Chaos {
    seed: u64,
    connections: AtomicU64,
    requests: AtomicU64,
    /// Requests never forwarded: the connection was closed instead.
    cut_requests: AtomicU64,
    /// Requests forwarded whose reply was swallowed, closing the
    /// connection.
    cut_replies: AtomicU64,
    /// The payloads (`wr-…`) of the writes whose request or reply was cut.
    lost: Mutex<HashSet<String>>,
}

/// In `0..1000`: how often a request naming `LOG.APPENDAT` has its request
/// cut, and how often its reply; other commands (`LEASE.*`, `LOG.STAT`)
/// lose either with `OTHER_CUT` each.
const APPENDAT_CUT: u64 = 50;
const OTHER_CUT: u64 = 10;

/// The `wr-…` payloads in a request's bytes.
fn payloads(buf: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = buf[i..].windows(3).position(|w| w == b"wr-") {
        let start = i + p;
        let end = buf[start..]
            .iter()
            .position(|&b| b == b'\r')
            .map_or(buf.len(), |e| start + e);
        out.push(String::from_utf8_lossy(&buf[start..end]).into_owned());
        i = end;
    }
    out
}

/// A proxy on `listen` in front of the node at `upstream`. Each connection
/// draws its faults from its own generator, seeded from the chaos seed and
/// the connection's number.
async fn proxy(listen: String, upstream: String, chaos: Arc<Chaos>) {
    let listener = tokio::net::TcpListener::bind(&listen).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let n = chaos.connections.fetch_add(1, Ordering::SeqCst);
            let mut rng = Rng(chaos.seed ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d));
            let chaos = chaos.clone();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut crd, mut cwr) = client.into_split();
                let (mut srd, mut swr) = server.into_split();
                // Set when the reply to the request just forwarded is to be
                // swallowed (one request in flight per client connection).
                let swallow = Arc::new(AtomicBool::new(false));
                let swallow_up = swallow.clone();
                let chaos_up = chaos.clone();
                let up = async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match crd.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let req = &buf[..n];
                        chaos_up.requests.fetch_add(1, Ordering::Relaxed);
                        let odds = if req.windows(12).any(|w| w == b"LOG.APPENDAT") {
                            APPENDAT_CUT
                        } else if req.windows(6).any(|w| w == b"LEASE.")
                            || req.windows(8).any(|w| w == b"LOG.STAT")
                        {
                            OTHER_CUT
                        } else {
                            0
                        };
                        let roll = rng.below(1000);
                        if roll < odds {
                            chaos_up.cut_requests.fetch_add(1, Ordering::Relaxed);
                            chaos_up.lost.lock().unwrap().extend(payloads(req));
                            return;
                        }
                        if roll < 2 * odds {
                            chaos_up.cut_replies.fetch_add(1, Ordering::Relaxed);
                            chaos_up.lost.lock().unwrap().extend(payloads(req));
                            swallow_up.store(true, Ordering::SeqCst);
                        }
                        if swr.write_all(req).await.is_err() {
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
                        if swallow.load(Ordering::SeqCst) {
                            // The node has answered (and so applied the
                            // write): close without passing it on.
                            return;
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
}

/// A grant, as its client saw it.
#[derive(Debug, Clone)]
struct Granted {
    client: usize,
    token: u64,
    sent: Instant,
    answered: Instant,
}

/// One write through a lease.
#[derive(Debug, Clone)]
struct Write {
    payload: String,
    token: u64,
    result: Result<u64, String>,
    unknown: bool,
}

#[derive(Default)]
struct Log {
    grants: Vec<Granted>,
    writes: Vec<Write>,
    lost_leases: u64,
    acquire_errors: BTreeMap<String, u64>,
    held: u64,
}

fn kind(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split(['(', ' ', '{']).next().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_contend_for_one_lock_through_lost_replies() {
    let clients = env_num("FENCELOG_CLIENTS", if long() { 100 } else { 20 }) as usize;
    let secs = env_num("FENCELOG_SECS", if long() { 60 } else { 15 });
    let seed = env_num("FENCELOG_SEED", 22);
    let Some(nodes) = Nodes::start(3, true, &[]).await else {
        return;
    };
    let chaos = Arc::new(Chaos {
        seed,
        ..Chaos::default()
    });
    for (addr, adv) in nodes.addrs().into_iter().zip(nodes.advertised()) {
        proxy(adv, addr, chaos.clone()).await;
    }
    let config = Config {
        seeds: nodes.advertised(),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        retry_total: Duration::from_secs(10),
        ..Config::default()
    };
    let log: Arc<Mutex<Log>> = Arc::default();
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let ttl = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (config, log) = (config.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let c = loop {
                match Client::connect(config.clone()).await {
                    Ok(c) => break c,
                    Err(e) => {
                        assert!(Instant::now() < end, "client {i} never connected: {e:?}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            };
            let owner = format!("c{i}");
            let mut holds = 0u64;
            while Instant::now() < end {
                let sent = Instant::now();
                let lease = match c
                    .lease(
                        "lock",
                        &owner,
                        ttl,
                        LeaseOptions {
                            fence: true,
                            wait: Some(Duration::from_secs(1)),
                            ..Default::default()
                        },
                    )
                    .await
                {
                    Ok(l) => l,
                    Err(Error::Held { .. }) => {
                        log.lock().unwrap().held += 1;
                        continue;
                    }
                    Err(e) => {
                        *log.lock()
                            .unwrap()
                            .acquire_errors
                            .entry(kind(&e))
                            .or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let token = lease.token();
                holds += 1;
                log.lock().unwrap().grants.push(Granted {
                    client: i,
                    token,
                    sent,
                    answered: Instant::now(),
                });
                for n in 0..3 {
                    let payload = format!("wr-{i}-{token}-{holds}-{n}");
                    let r = lease.append("lock", &[payload.as_str()]).await;
                    let stop = matches!(r, Err(Error::Lost | Error::Stale { .. }));
                    log.lock().unwrap().writes.push(Write {
                        payload,
                        token,
                        unknown: matches!(&r, Err(e) if e.outcome_unknown()),
                        result: r.map_err(|e| format!("{e:?}")),
                    });
                    if stop {
                        break;
                    }
                }
                if lease.is_lost() {
                    log.lock().unwrap().lost_leases += 1;
                }
                // A lost reply to the release leaves the lease to expire.
                let _ = lease.release().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();

    // The whole stream, read from the leader directly (not through a
    // proxy: `CLUSTER SLOTS` would name the proxies, so it is not asked).
    let (leader, _) = nodes.leader(Duration::from_secs(10)).await;
    let direct = Client::connect(Config {
        seeds: vec![nodes.addrs()[leader].clone()],
        discover_leader: false,
        ..Config::default()
    })
    .await
    .unwrap();
    let mut records = Vec::new();
    loop {
        let page = direct
            .read("lock", records.len() as u64, 10_000)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        records.extend(page);
    }

    let log = log.lock().unwrap();
    let chaos_lost = chaos.lost.lock().unwrap().clone();

    // Tokens: one holder each, and never down the stream.
    // A client whose release was lost (the request cut before the node
    // saw it) still holds the lease, and acquiring it again answers the
    // same token (§4): the same holder, not a new one.
    let mut holder_of: HashMap<u64, usize> = HashMap::new();
    let mut regranted = 0;
    for g in &log.grants {
        if let Some(prev) = holder_of.insert(g.token, g.client) {
            assert_eq!(prev, g.client, "token {} granted to two clients", g.token);
            regranted += 1;
        }
    }
    let mut by_token = log.grants.clone();
    by_token.sort_by_key(|g| (g.token, g.sent));
    for w in by_token.windows(2) {
        // The earlier token was granted before the later one was answered.
        if w[0].token < w[1].token {
            assert!(w[0].sent < w[1].answered, "{w:?}");
        }
    }
    let tokens: Vec<u64> = records.iter().map(|r| r.token).collect();
    for (i, w) in tokens.windows(2).enumerate() {
        assert!(
            w[0] <= w[1],
            "offset {}: token {} after {}",
            records[i + 1].offset,
            w[1],
            w[0]
        );
    }
    let mut holders_in_stream = tokens.clone();
    holders_in_stream.dedup();

    // Writes: acknowledged ones exactly once at their offset, refused ones
    // not at all, none twice.
    let mut at: HashMap<&[u8], Vec<(u64, u64)>> = HashMap::new();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.offset, i as u64, "offsets are contiguous");
        at.entry(r.payload.as_ref())
            .or_default()
            .push((r.offset, r.token));
    }
    let dup: Vec<_> = at.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(dup.is_empty(), "records landed twice: {dup:?}");
    let written: HashSet<&str> = log.writes.iter().map(|w| w.payload.as_str()).collect();
    for r in &records {
        let p = String::from_utf8_lossy(&r.payload);
        assert!(written.contains(p.as_ref()), "a record nobody wrote: {p}");
        let client: usize = p.split('-').nth(1).unwrap().parse().unwrap();
        let token: u64 = p.split('-').nth(2).unwrap().parse().unwrap();
        assert_eq!(r.token, token, "{p}");
        assert_eq!(holder_of.get(&token), Some(&client), "{p}");
    }
    let (mut ok, mut refused, mut unknown, mut unknown_landed) = (0, 0, 0, 0);
    let (mut lost_reply_ok, mut lost_reply_unknown, mut lost_reply_refused) = (0, 0, 0);
    let mut refusals: BTreeMap<String, u64> = BTreeMap::new();
    for w in &log.writes {
        let here = at.get(w.payload.as_bytes());
        let cut = chaos_lost.contains(&w.payload);
        match &w.result {
            Ok(o) => {
                ok += 1;
                assert_eq!(
                    here,
                    Some(&vec![(*o, w.token)]),
                    "{w:?} (reply lost: {cut})"
                );
                lost_reply_ok += u64::from(cut);
            }
            Err(_) if w.unknown => {
                unknown += 1;
                unknown_landed += u64::from(here.is_some());
                lost_reply_unknown += u64::from(cut);
            }
            Err(e) => {
                refused += 1;
                lost_reply_refused += u64::from(cut);
                *refusals
                    .entry(e.split(['(', ' ', '{']).next().unwrap_or("").to_string())
                    .or_default() += 1;
                assert!(here.is_none(), "a refused write landed: {w:?}");
            }
        }
    }
    eprintln!(
        "{clients} clients for {elapsed:?} (seed {seed}) through {} proxied connections, \
         {} requests: {} requests cut, {} replies swallowed ({} writes affected)\n\
         grants: {} (tokens {}..={}; {regranted} the same token to the same client again), {} holders in the stream, {} acquires answered HELD, \
         acquire errors {:?}, {} leases lost while held\n\
         writes: {} attempted, {ok} acknowledged, {refused} refused {refusals:?}, \
         {unknown} outcome unknown ({unknown_landed} landed); records: {}\n\
         lost replies: {lost_reply_ok} retried and acknowledged (each exactly once in the stream), \
         {lost_reply_unknown} unknown after the retry, {lost_reply_refused} refused",
        chaos.connections.load(Ordering::SeqCst),
        chaos.requests.load(Ordering::SeqCst),
        chaos.cut_requests.load(Ordering::SeqCst),
        chaos.cut_replies.load(Ordering::SeqCst),
        chaos_lost.len(),
        log.grants.len(),
        by_token.first().map_or(0, |g| g.token),
        by_token.last().map_or(0, |g| g.token),
        holders_in_stream.len(),
        log.held,
        log.acquire_errors,
        log.lost_leases,
        log.writes.len(),
        records.len(),
    );
    assert!(
        log.grants.len() >= clients,
        "too few grants: {}",
        log.grants.len()
    );
    assert!(
        lost_reply_ok > 0,
        "no lost reply was retried: the proxy tested nothing"
    );
}
