//! The server as a process: killed with SIGKILL under pipelined load it
//! loses no acknowledged write and no accepted token; SIGTERM finishes the work in flight and
//! exits 0; a data directory in use is refused; an unsafe bind is refused;
//! the metrics endpoint answers.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// A write acknowledged: stream, offset, token, payload.
type Acked = (String, i64, u64, Vec<u8>);

/// Clients pipelining appends until told to stop or the server goes away,
/// each burst with a token one above the burst before (from `base`);
/// answers every write acknowledged.
fn load(
    addr: std::net::SocketAddr,
    clients: usize,
    stop: Arc<AtomicBool>,
    base: u64,
) -> Vec<Acked> {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let acked = acked.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut client = Client::connect(addr);
                let name = format!("stream-{c}");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // 16 appends in one pipeline.
                    let mut burst = Vec::new();
                    let payloads: Vec<Vec<u8>> = (0..16)
                        .map(|i| format!("c{c} n{} i{i}", n).into_bytes())
                        .collect();
                    let token = base + n + 1;
                    let token_arg = token.to_string();
                    for p in &payloads {
                        burst.extend(Client::encode(&[
                            b"LOG.APPEND",
                            name.as_bytes(),
                            token_arg.as_bytes(),
                            p,
                        ]));
                    }
                    n += 1;
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        client.send_raw(&burst)
                    }))
                    .is_err()
                    {
                        return;
                    }
                    for p in payloads {
                        match client.read() {
                            Some(Value::Int(offset)) => {
                                acked.lock().unwrap().push((name.clone(), offset, token, p))
                            }
                            _ => return,
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    Arc::try_unwrap(acked).unwrap().into_inner().unwrap()
}

fn check_acked(server: &ServerProcess, acked: &[Acked]) {
    let mut c = server.client();
    for (name, offset, token, payload) in acked {
        let got = c.cmd(&["LOG.READ", name, &offset.to_string(), "COUNT", "1"]);
        let rec = &got.array()[0];
        assert_eq!(rec.array()[0].int(), *offset);
        assert_eq!(
            rec.array()[1].int(),
            *token as i64,
            "{name} offset {offset}"
        );
        assert_eq!(
            rec.array()[2].bulk(),
            &payload[..],
            "{name} offset {offset}"
        );
    }
}

#[test]
fn sigkill_under_pipelined_load_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = Vec::new();
    for round in 0..3 {
        let mut server = ServerProcess::start(dir.path(), &[]);
        check_acked(&server, &all);
        let stop = Arc::new(AtomicBool::new(false));
        let addr = server.addr;
        let loader = {
            let stop = stop.clone();
            // Each round's tokens above the last round's.
            std::thread::spawn(move || load(addr, 8, stop, round * 1_000_000))
        };
        std::thread::sleep(Duration::from_millis(300 + round * 100));
        server.signal("KILL");
        server.wait(Duration::from_secs(10));
        stop.store(true, Ordering::Relaxed);
        let acked = loader.join().unwrap();
        assert!(
            acked.len() > 100,
            "round {round}: only {} appends acknowledged",
            acked.len()
        );
        all.extend(acked);
        drop(server);
    }
    let server = ServerProcess::start(dir.path(), &[]);
    check_acked(&server, &all);
    // Offsets were never handed out twice.
    let mut seen = std::collections::HashSet::new();
    for (name, offset, _, _) in &all {
        assert!(
            seen.insert((name.clone(), *offset)),
            "{name} offset {offset} acknowledged twice"
        );
    }
    // Every stream keeps the highest token it acknowledged, through three
    // kills, and refuses one below it.
    let mut highest = std::collections::HashMap::new();
    for (name, _, token, _) in &all {
        let h = highest.entry(name.clone()).or_insert(0u64);
        *h = (*h).max(*token);
    }
    let mut c = server.client();
    for (name, token) in highest {
        let kept = c.cmd(&["LOG.STAT", &name]).array()[1].int();
        assert!(
            kept >= token as i64,
            "{name}: highest {kept} after acknowledging {token}"
        );
        let late = c.cmd(&["LOG.APPEND", &name, &(kept - 1).to_string(), "late"]);
        assert!(late.err().starts_with("STALE"), "{name}: {late:?}");
    }
}

#[test]
fn sigterm_finishes_in_flight_work_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(dir.path(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let addr = server.addr;
    let loader = {
        let stop = stop.clone();
        std::thread::spawn(move || load(addr, 4, stop, 0))
    };
    std::thread::sleep(Duration::from_millis(300));
    server.signal("TERM");
    let status = server.wait(Duration::from_secs(30));
    assert!(
        status.success(),
        "SIGTERM: {status:?}\n{}",
        server.stderr.lock().unwrap()
    );
    stop.store(true, Ordering::Relaxed);
    let acked = loader.join().unwrap();
    assert!(!acked.is_empty());
    drop(server);
    let server = ServerProcess::start(dir.path(), &[]);
    check_acked(&server, &acked);
}

#[test]
fn a_data_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = ServerProcess::start(dir.path(), &[]);
    let out = std::process::Command::new(bin())
        .args(["serve", "--addr", "127.0.0.1:0", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another process"), "{err}");
}

#[test]
fn a_non_loopback_address_needs_a_password_or_a_deliberate_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .args(["serve", "--addr", "0.0.0.0:0", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without a password"));
    // With a password it starts (and is stopped at once: no traffic is sent
    // to a non-loopback address).
    let server = ServerProcess::start(dir.path(), &["--requirepass", "pw"]);
    drop(server);
}
