//! The Prometheus endpoint as Prometheus' own tools read it. It once typed
//! every ever-growing counter `gauge`, named them without `_total`, used
//! microseconds, answered `HEAD` with 404, and failed `promtool check
//! metrics`.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use common::*;

fn http(addr: SocketAddr, request: &str) -> String {
    let mut http = std::net::TcpStream::connect(addr).unwrap();
    http.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    http.read_to_string(&mut response).unwrap();
    response
}

fn free_port() -> SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap()
}

/// A server with some traffic: appends, a stale write, a lease.
fn busy_server(dir: &std::path::Path, metrics: SocketAddr) -> ServerProcess {
    let server = ServerProcess::start(dir, &["--metrics-addr", &metrics.to_string()]);
    let mut c = server.client();
    c.cmd(&["LOG.APPEND", "s", "5", "x"]);
    c.cmd(&["LOG.APPEND", "s", "4", "late"]);
    c.cmd(&["LEASE.ACQUIRE", "job", "w1", "10000"]);
    server
}

#[test]
fn counters_are_counters_named_by_prometheus_rules() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let _server = busy_server(dir.path(), metrics);
    let response = http(metrics, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");

    // A real parser of the text format, whatever is installed.
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    let value = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| s.value.clone())
            .unwrap_or_else(|| panic!("no sample {name}:\n{body}"))
    };
    assert_eq!(
        value("fencelog_appends_total"),
        prometheus_parse::Value::Counter(1.0)
    );
    assert_eq!(
        value("fencelog_stale_rejections_total"),
        prometheus_parse::Value::Counter(1.0)
    );
    assert_eq!(
        value("fencelog_leases_held"),
        prometheus_parse::Value::Gauge(1.0)
    );
    assert!(matches!(
        value("fencelog_fsync_duration_seconds"),
        prometheus_parse::Value::Histogram(_)
    ));
    // Every family by the rules: counters end in _total, nothing in
    // microseconds.
    for line in body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut words = line.split_whitespace().skip(2);
        let (name, kind) = (words.next().unwrap(), words.next().unwrap());
        assert!(name.starts_with("fencelog_"), "{line}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        assert!(!name.contains("_us") && !name.contains("micro"), "{line}");
    }

    // Prometheus' own linter, where it is installed (CI installs it).
    let promtool = if Command::new("promtool").arg("--version").output().is_ok() {
        std::path::PathBuf::from("promtool")
    } else {
        target_dir().join("ci-bin/promtool")
    };
    match Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(body.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(_) => missing(
            "promtool",
            "bash .ci/run installs it (Debian's prometheus package)",
        ),
    }
}

#[test]
fn head_answers_the_headers_alone_and_other_paths_are_404() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let _server = busy_server(dir.path(), metrics);
    let head = http(metrics, "HEAD /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    let (headers, body) = head.split_once("\r\n\r\n").unwrap();
    assert!(body.is_empty(), "{body}");
    let length: usize = headers
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(length > 1000, "{headers}");
    let other = http(metrics, "GET / HTTP/1.1\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    let post = http(metrics, "POST /metrics HTTP/1.1\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
}

/// `INFO commit` text as lines.
fn info_commit(c: &mut Client) -> String {
    match c.cmd(&["INFO", "commit"]) {
        Value::Bulk(b) => String::from_utf8_lossy(&b).replace("\r\n", "\n"),
        other => panic!("INFO commit answered {other:?}"),
    }
}

/// Entries counted in `commit_latency_us_le:upper=n,...`.
fn commit_entries(info: &str) -> u64 {
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("commit_latency_us_le:"))
        .unwrap_or_else(|| panic!("no histogram line:\n{info}"));
    line.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

fn info_number(info: &str, name: &str) -> f64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name}:\n{info}"))
        .parse()
        .unwrap()
}

/// The group-commit telemetry the performance work reads (records per
/// sync, the sync thread's idle time, an entry's commit latency) exists in
/// `INFO commit` and `/metrics`, and moves with durable appends.
#[test]
fn commit_telemetry_exists_and_moves() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let server = ServerProcess::start(dir.path(), &["--metrics-addr", &metrics.to_string()]);
    let mut c = server.client();
    // A first append, then the idle sync thread: its idle time grows.
    c.cmd(&["LOG.APPEND", "s", "1", "x"]);
    let before = info_commit(&mut c);
    assert!(before.starts_with("# Commit\n"), "{before}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A pipeline of appends shares group commits.
    let mut pipeline = Vec::new();
    for i in 0..50 {
        pipeline.extend_from_slice(&Client::encode(&[
            b"LOG.APPEND",
            b"s",
            b"1",
            format!("p{i}").as_bytes(),
        ]));
    }
    c.send_raw(&pipeline);
    for _ in 0..50 {
        assert!(matches!(c.read(), Some(Value::Int(_))));
    }
    let after = info_commit(&mut c);
    assert!(
        commit_entries(&after) >= commit_entries(&before) + 50,
        "{before}\n{after}"
    );
    assert!(
        info_number(&after, "commit_records_per_sync") >= 1.0,
        "{after}"
    );
    assert!(
        info_number(&after, "commit_latency_p99_us") > 0.0,
        "{after}"
    );
    assert!(
        info_number(&after, "sync_thread_idle_seconds")
            >= info_number(&before, "sync_thread_idle_seconds") + 0.2,
        "{before}\n{after}"
    );
    let response = http(metrics, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
    let body = response.split_once("\r\n\r\n").unwrap().1;
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    let sample = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| s.value.clone())
            .unwrap_or_else(|| panic!("no sample {name}:\n{body}"))
    };
    match sample("fencelog_commit_duration_seconds") {
        prometheus_parse::Value::Histogram(buckets) => {
            let count = buckets.iter().map(|b| b.count).fold(0.0, f64::max);
            assert!(count >= 51.0, "{body}");
        }
        other => panic!("not a histogram: {other:?}"),
    }
    assert!(matches!(
        sample("fencelog_sync_thread_idle_seconds_total"),
        prometheus_parse::Value::Counter(v) if v > 0.2
    ));
}

/// Eight clients, each waiting for every answer before its next append,
/// are waited for before a sync (`INFO commit`'s `sync_comeback_*`), get
/// offsets 0–99 in order, and with `--no-sync-wait` are never waited for.
#[test]
fn the_log_waits_for_the_writers_it_answered_unless_told_not_to() {
    for (extra, waits) in [(&[][..], true), (&["--no-sync-wait"][..], false)] {
        let dir = tempfile::tempdir().unwrap();
        let server = ServerProcess::start(dir.path(), extra);
        let counts = || {
            let info = info_commit(&mut server.client());
            (
                info_number(&info, "sync_comeback_waits"),
                info_number(&info, "sync_comeback_ran_out"),
            )
        };
        let (waited, ran_out) = counts();
        std::thread::scope(|s| {
            for w in 0..8 {
                let server = &server;
                s.spawn(move || {
                    let mut c = server.client();
                    let stream = format!("w{w}");
                    for i in 0..100 {
                        assert_eq!(
                            c.cmd(&["LOG.APPEND", &stream, "1", "x"]),
                            Value::Int(i),
                            "writer {w}, append {i}"
                        );
                    }
                });
            }
        });
        let (waited_after, ran_out_after) = counts();
        let ended_by_return = (waited_after - waited) - (ran_out_after - ran_out);
        if waits {
            assert!(
                ended_by_return >= 1.0,
                "800 appends: {} waits, {} ran out",
                waited_after - waited,
                ran_out_after - ran_out
            );
        } else {
            assert_eq!(
                (waited_after, ran_out_after),
                (0.0, 0.0),
                "told not to wait"
            );
        }
    }
}

/// A single node replicates nothing: no `# Replication` section, no
/// `fencelog_raft_*` metric (cluster mode has them, `cluster_writes.rs`).
#[test]
fn a_single_node_has_no_replication_timings() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let server = busy_server(dir.path(), metrics);
    let mut c = server.client();
    match c.cmd(&["INFO", "everything"]) {
        Value::Bulk(b) => {
            let text = String::from_utf8_lossy(&b);
            assert!(text.contains("# Commit"), "{text}");
            assert!(!text.contains("# Replication"), "{text}");
            assert!(!text.contains("raft_"), "{text}");
        }
        other => panic!("INFO answered {other:?}"),
    }
    let response = http(metrics, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
    assert!(response.contains("fencelog_appends_total"), "{response}");
    assert!(!response.contains("fencelog_raft_"), "{response}");
}
