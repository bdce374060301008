//! The server's log as a machine reads it (`--log-format json`). It once
//! said nothing about stale writes, leases, failed AUTH or protocol
//! errors, even at trace, and only as text. A payload must never reach the
//! log.

mod common;

use std::time::Duration;

use common::*;

/// The JSON lines of the server's log whose `event` is `event`.
fn events(server: &ServerProcess, event: &str) -> Vec<serde_json::Value> {
    server
        .stderr
        .lock()
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))
        })
        .filter(|v| v["event"] == event)
        .collect()
}

fn json_server(dir: &std::path::Path, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--log-format", "json"];
    args.extend_from_slice(extra);
    ServerProcess::start(dir, &args)
}

#[test]
fn a_stale_write_is_one_json_line_with_the_numbers_and_no_payload() {
    let dir = tempfile::tempdir().unwrap();
    let server = json_server(dir.path(), &[]);
    let mut c = server.client();
    c.cmd(&["CLIENT", "SETNAME", "worker-a"]);
    c.cmd(&["LOG.APPEND", "orders", "42", "first"]);
    let e = c.cmd(&["LOG.APPEND", "orders", "41", "secret-payload-bytes"]);
    assert!(e.err().starts_with("STALE"), "{e:?}");
    server.wait_for_log("stale_fencing_token");
    let stale = events(&server, "stale_fencing_token");
    assert_eq!(stale.len(), 1, "{stale:?}");
    let e = &stale[0];
    assert_eq!(e["stream"], "orders");
    assert_eq!(e["presented"], 41);
    assert_eq!(e["highest"], 42);
    assert_eq!(e["client_name"], "worker-a");
    assert!(
        e["client_addr"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{e}"
    );
    assert_eq!(e["level"], "WARN");
    // A stale write inside a transaction and a pipelined one count too.
    c.send_raw(&Client::encode(&[b"LOG.APPEND", b"orders", b"40", b"p"]));
    c.send_raw(&Client::encode(&[b"LOG.APPEND", b"orders", b"42", b"q"]));
    assert!(c.read().unwrap().err().starts_with("STALE"));
    c.read().unwrap().int();
    let log = server.stderr.lock().unwrap().clone();
    assert!(!log.contains("secret-payload-bytes"), "{log}");
}

#[test]
fn a_flood_of_stale_writes_is_cut_and_the_cut_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let server = json_server(dir.path(), &[]);
    let mut c = server.client();
    c.cmd(&["LOG.FENCE", "s", "100"]);
    let started = std::time::Instant::now();
    for _ in 0..50 {
        c.cmd(&["LOG.APPEND", "s", "1", "x"]);
    }
    // The limiter's one-second windows start at an arbitrary point of the
    // monotonic clock, so the flood may straddle a boundary: at most 10
    // events per window it touched are written.
    let windows = started.elapsed().as_secs() + 2;
    // The next second's first event carries the count of those left out.
    std::thread::sleep(Duration::from_millis(1100));
    c.cmd(&["LOG.APPEND", "s", "1", "x"]);
    // Every one of the 51 rejections is either written or counted in a
    // later event's `suppressed`: nothing is lost without a word.
    let accounted = |stale: &[serde_json::Value]| -> u64 {
        stale
            .iter()
            .map(|e| 1 + e["suppressed"].as_u64().unwrap_or(0))
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut stale = events(&server, "stale_fencing_token");
    while accounted(&stale) < 51 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        stale = events(&server, "stale_fencing_token");
    }
    assert_eq!(accounted(&stale), 51, "{stale:?}");
    let written = stale.len() as u64;
    assert!(written <= 10 * windows + 1, "{written} written: {stale:?}");
    assert!(written >= 11, "{stale:?}");
}

#[test]
fn leases_auth_failures_and_protocol_errors_are_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = json_server(dir.path(), &["--requirepass", "sesame"]);
    let mut c = server.client();
    assert!(c.cmd(&["AUTH", "wrong"]).err().starts_with("WRONGPASS"));
    c.cmd(&["AUTH", "sesame"]);
    let grant = c.cmd(&["LEASE.ACQUIRE", "job", "w1", "100"]);
    let token = grant.array()[0].int().to_string();
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        c.cmd(&["LEASE.RENEW", "job", "w1", &token, "100"])
            .err()
            .starts_with("LOST")
    );
    // A lease left to run out.
    c.cmd(&["LEASE.ACQUIRE", "job2", "w2", "50"]);
    let mut bad = server.client();
    bad.send_raw(b"*1\r\n$x\r\n");
    server.wait_for_log("protocol_error");
    server.wait_for_log("lease_expired");
    let auth = events(&server, "auth_failed");
    assert_eq!(auth.len(), 1);
    assert!(auth[0].get("password").is_none(), "{:?}", auth[0]);
    assert_eq!(events(&server, "lease_acquired").len(), 2);
    assert_eq!(events(&server, "lease_lost")[0]["lease"], "job");
    let expired = events(&server, "lease_expired");
    assert!(expired.iter().any(|e| e["lease"] == "job2"), "{expired:?}");
    let log = server.stderr.lock().unwrap().clone();
    assert!(!log.contains("sesame"), "the password was logged:\n{log}");
}

#[test]
fn log_level_and_format_flags_are_checked() {
    let out = std::process::Command::new(bin())
        .args(["serve", "--log-level", "info,fencelog=shout", "--dir"])
        .arg(tempfile::tempdir().unwrap().path().join("d"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--log-level"), "{err}");
}
