//! Clients that misbehave cannot move the real server's memory past its
//! configured budgets, and cannot starve the other clients: measured on
//! the process (VmRSS and VmHWM from /proc/<pid>/status) while a prober
//! client must keep being answered within a second.
//!
//! What broke: a client pipelining `LOG.READ`s without reading took RSS
//! from 11 MB to 1.3–9.2 GB and others waited 36 s; one unfinished request
//! of many bulk arguments held 646 MB under a 16 MiB query buffer; 300
//! connections each sending half of a 16 MiB argument took 2.4 GB; HTTP
//! requests were run as commands; before AUTH anyone could send 16 MiB
//! arguments.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;

const MIB: u64 = 1 << 20;

/// (VmRSS, VmHWM) of a process, in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"));
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap();
        kb * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A client that pings the server every 20 ms while an attack runs, and
/// records the slowest answer.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Duration, usize)>,
}

impl Prober {
    fn start(server: &ServerProcess) -> Prober {
        let mut c = server.client();
        // Answered once before the attack starts.
        assert_eq!(c.cmd(&["LOG.APPEND", "probe", "1", "ready"]), Value::Int(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut slowest = Duration::ZERO;
                let mut n = 1;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    assert_eq!(
                        c.cmd(&["LOG.APPEND", "probe", "1", "still here"]),
                        Value::Int(n as i64)
                    );
                    slowest = slowest.max(started.elapsed());
                    n += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                (slowest, n)
            })
        };
        Prober { stop, thread }
    }

    /// Stops; asserts every answer came within a second.
    fn finish(self) -> Duration {
        // A few more rounds while the attack's connections are still open.
        std::thread::sleep(Duration::from_millis(200));
        self.stop.store(true, Ordering::Relaxed);
        let (slowest, n) = self.thread.join().unwrap();
        assert!(n > 2, "the prober was answered {n} times");
        assert!(
            slowest < Duration::from_secs(1),
            "another client waited {slowest:?}"
        );
        slowest
    }
}

/// Asserts the peak stayed within `budget` plus `allowance` over `base`.
fn assert_within(what: &str, pid: u32, base_hwm: u64, budget: u64, allowance: u64) {
    let (rss, hwm) = memory(pid);
    eprintln!(
        "{what}: VmRSS {} MiB, VmHWM {} MiB (before: VmHWM {} MiB; budget {} MiB + allowance {} MiB)",
        rss / MIB,
        hwm / MIB,
        base_hwm / MIB,
        budget / MIB,
        allowance / MIB
    );
    assert!(
        hwm <= base_hwm + budget + allowance,
        "{what}: VmHWM {hwm} over {base_hwm} + {budget} + {allowance}"
    );
}

#[test]
fn a_client_pipelining_reads_without_reading_stalls_alone() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &["--maxmemory-clients", "64MiB"]);
    let pid = server.child.id();
    // 8 MiB of records, read once so that every page is in.
    let mut c = server.client();
    let payload = vec![b'r'; 512 << 10];
    for _ in 0..16 {
        c.cmd_bytes(&[b"LOG.APPEND", b"big", b"1", &payload]);
    }
    assert_eq!(
        c.cmd(&["LOG.READ", "big", "0", "COUNT", "100"])
            .array()
            .len(),
        16
    );
    let (_, base) = memory(pid);
    let prober = Prober::start(&server);
    // 5 000 reads of 8 MiB each: 40 GB of replies if they piled up.
    let mut hogs = Vec::new();
    let request = Client::encode(&[b"LOG.READ", b"big", b"0", b"COUNT", b"100"]);
    for _ in 0..4 {
        let mut hog = TcpStream::connect(server.addr).unwrap();
        hog.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        let burst: Vec<u8> = request.repeat(1250);
        // The server stops reading once it stalls: part of this may stay
        // unsent, which is the point.
        let _ = hog.write_all(&burst);
        hogs.push(hog);
    }
    std::thread::sleep(Duration::from_secs(1));
    let slowest = prober.finish();
    eprintln!("prober's slowest answer: {slowest:?}");
    assert_within(
        "4 clients pipelining reads, not reading",
        pid,
        base,
        64 * MIB,
        32 * MIB,
    );
    // The hogs are still served when they read.
    let mut hog = hogs.pop().unwrap();
    hog.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    while got < 32 << 20 {
        got += hog.read(&mut buf).unwrap();
    }
}

#[test]
fn an_unfinished_request_of_many_arguments_is_cut_at_the_query_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--max-query-buffer",
            "16MiB",
            "--max-bulk-bytes",
            "1MiB",
            "--maxmemory-clients",
            "64MiB",
        ],
    );
    let pid = server.child.id();
    let (_, base) = memory(pid);
    let prober = Prober::start(&server);
    let mut hog = TcpStream::connect(server.addr).unwrap();
    hog.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let arg = vec![b'a'; 1 << 20];
    let mut sent = 0u64;
    let mut cut = false;
    // Up to 200 arguments of 1 MiB in one request that never ends.
    let _ = hog.write_all(b"*60000\r\n");
    for _ in 0..200 {
        let mut piece = b"$1048576\r\n".to_vec();
        piece.extend_from_slice(&arg);
        piece.extend_from_slice(b"\r\n");
        if hog.write_all(&piece).is_err() {
            cut = true;
            break;
        }
        sent += piece.len() as u64;
    }
    assert!(cut, "{sent} bytes of one request were taken");
    prober.finish();
    eprintln!("the request was cut after {} MiB sent", sent / MIB);
    server.wait_for_log("its query buffer passed the limit");
    assert_within(
        "one request of many 1 MiB arguments",
        pid,
        base,
        16 * MIB,
        24 * MIB,
    );
}

#[test]
fn three_hundred_clients_each_sending_half_a_big_argument_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--max-bulk-bytes",
            "4MiB",
            "--max-query-buffer",
            "8MiB",
            "--maxmemory-clients",
            "64MiB",
        ],
    );
    let pid = server.child.id();
    let (_, base) = memory(pid);
    let prober = Prober::start(&server);
    let mut head = Client::encode(&[b"LOG.APPEND", b"s", b"1"]);
    head[1] = b'4'; // *4: one more argument, announced below.
    head.extend_from_slice(b"$4194304\r\n");
    let half = vec![b'h'; 2 << 20];
    let mut clients = Vec::new();
    let started = Instant::now();
    for _ in 0..300 {
        let Ok(mut c) = TcpStream::connect(server.addr) else {
            continue;
        };
        c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        // Dropped clients fail here: that is the budget at work.
        let _ = c.write_all(&head).and_then(|()| c.write_all(&half));
        clients.push(c);
    }
    eprintln!(
        "300 clients sent half of a 4 MiB argument each in {:?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(300));
    prober.finish();
    let info = server.client().cmd(&["INFO", "stats"]);
    let text = String::from_utf8_lossy(info.bulk()).to_string();
    let evicted: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("evicted_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    eprintln!("evicted clients: {evicted}");
    assert!(evicted > 200, "{text}");
    server.wait_for_log("more than --maxmemory-clients");
    assert_within(
        "300 clients with half an argument each",
        pid,
        base,
        64 * MIB,
        32 * MIB,
    );
}

#[test]
fn a_request_that_looks_like_http_closes_the_connection_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    for request in [
        &b"POST / HTTP/1.1\r\nHost: localhost\r\n\r\nLOG.APPEND s 1 x\r\n"[..],
        b"GET / HTTP/1.1\r\n\r\n",
        b"Host: 127.0.0.1:7379\r\n",
    ] {
        let mut c = TcpStream::connect(server.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(request).unwrap();
        let mut out = Vec::new();
        // Closed without an answer (a reset is closed too).
        let _ = c.read_to_end(&mut out);
        assert!(out.is_empty(), "{:?}", String::from_utf8_lossy(&out));
    }
    // The body after the headers never ran.
    let mut c = server.client();
    assert_eq!(c.cmd(&["LOG.STAT", "s"]).array()[3].int(), 0);
    server.wait_for_log("possible cross-protocol attack");
}

#[test]
fn before_auth_only_tiny_requests_are_taken_as_in_redis() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &["--requirepass", "pw"]);
    let args: Vec<Vec<u8>> = (0..11).map(|i| format!("a{i}").into_bytes()).collect();
    let args: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
    let mut c = server.client();
    c.send_raw(&Client::encode(&args));
    assert_eq!(
        c.read(),
        Some(Value::Error(
            "ERR Protocol error: unauthenticated multibulk length".into()
        ))
    );
    assert_eq!(c.read(), None);
    let mut c = server.client();
    let big = vec![b'x'; 16385];
    c.send_raw(&Client::encode(&[b"AUTH", &big]));
    assert_eq!(
        c.read(),
        Some(Value::Error(
            "ERR Protocol error: unauthenticated bulk length".into()
        ))
    );
    assert_eq!(c.read(), None);
    // At the limits, and after AUTH, as usual.
    let mut c = server.client();
    let at_limit = vec![b'x'; 16384];
    assert_eq!(
        c.cmd_bytes(&[b"ECHO", &at_limit]).err(),
        "NOAUTH Authentication required."
    );
    assert_eq!(c.cmd(&["AUTH", "pw"]), Value::Simple("OK".into()));
    let big = vec![b'x'; 100_000];
    assert_eq!(c.cmd_bytes(&[b"ECHO", &big]).bulk(), &big[..]);
    let args: Vec<&[u8]> = std::iter::once(&b"LOG.APPEND"[..])
        .chain([&b"s"[..], b"1"])
        .chain(std::iter::repeat_n(&b"r"[..], 20))
        .collect();
    assert_eq!(c.cmd_bytes(&args).int(), 0);
}
