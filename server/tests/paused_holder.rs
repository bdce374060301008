//! The failure fencelog exists for, with real processes: client A holds a
//! lease and writes; A is frozen (SIGSTOP, like a long GC pause or a stalled
//! VM) past its lease; B acquires the lease with FENCE and writes; A wakes
//! (SIGCONT) and makes its late write. It must be rejected as STALE, its
//! renewal must be LOST, and the stream must hold A's first step and B's,
//! nothing else — also after the server restarts.
//!
//! Client A is this test binary re-run on the ignored `holder` test.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const ADDR: &str = "FENCELOG_HOLDER_ADDR";

#[test]
#[ignore = "a helper: the_paused_holders_late_write_is_rejected runs it as a child process"]
fn holder() {
    let Ok(addr) = std::env::var(ADDR) else {
        return;
    };
    let mut c = Client::connect(addr.parse().unwrap());
    let grant = c.cmd(&["LEASE.ACQUIRE", "jobs", "worker-a", "400", "FENCE"]);
    let token = grant.array()[0].int().to_string();
    assert_eq!(c.cmd(&["LOG.APPEND", "jobs", &token, "A: step 1"]).int(), 0);
    println!("READY {token}");
    // Frozen here by the parent; told to go on once resumed.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let late = c.cmd(&["LOG.APPEND", "jobs", &token, "A: step 2 (late)"]);
    let renew = c.cmd(&["LEASE.RENEW", "jobs", "worker-a", &token, "400"]);
    println!(
        "LATE {}",
        match late {
            Value::Error(e) => e,
            other => format!("{other:?}"),
        }
    );
    println!(
        "RENEW {}",
        match renew {
            Value::Error(e) => e,
            other => format!("{other:?}"),
        }
    );
}

#[test]
fn the_paused_holders_late_write_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let mut a = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "holder",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ADDR, server.addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The child's lines, with a timeout: a broken child fails the test
    // instead of hanging it. (libtest prints "test holder ... " without a
    // newline, so a marker can sit in the middle of a line.)
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = a.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let wait_for = |marker: &str| -> String {
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("the holder never printed {marker}"));
            if let Some(i) = line.find(marker) {
                return line[i + marker.len()..].to_string();
            }
        }
    };
    let token_a: i64 = wait_for("READY ").trim().parse().unwrap();

    // A stops dead, as a paused process does, past its 400 ms lease.
    let pid = a.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    std::thread::sleep(Duration::from_millis(600));

    // B takes over: acquire with FENCE, then work.
    let mut b = server.client();
    let grant = b.cmd(&["LEASE.ACQUIRE", "jobs", "worker-b", "60000", "FENCE"]);
    let token_b = grant.array()[0].int();
    assert!(token_b > token_a);
    assert_eq!(
        b.cmd(&["LOG.APPEND", "jobs", &token_b.to_string(), "B: step 1"])
            .int(),
        1
    );

    // A wakes up and carries on as if nothing happened.
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    a.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let late = wait_for("LATE ");
    let renew = wait_for("RENEW ");
    assert!(a.wait().unwrap().success());
    assert_eq!(
        late,
        format!("STALE token {token_a} is below the highest accepted token {token_b}")
    );
    assert_eq!(renew, "LOST lease is not held by this owner and token");

    let expect = |server: &ServerProcess| {
        let mut c = server.client();
        let records = c.cmd(&["LOG.READ", "jobs", "0"]);
        let payloads: Vec<&[u8]> = records
            .array()
            .iter()
            .map(|r| r.array()[2].bulk())
            .collect();
        assert_eq!(payloads, vec![&b"A: step 1"[..], b"B: step 1"]);
    };
    expect(&server);
    // And after a restart, the late write stays rejected.
    let mut server = server;
    server.signal("TERM");
    assert!(server.wait(Duration::from_secs(30)).success());
    drop(server);
    let server = ServerProcess::start(dir.path(), &[]);
    expect(&server);
    let mut c = server.client();
    assert!(
        c.cmd(&["LOG.APPEND", "jobs", &token_a.to_string(), "again"])
            .err()
            .starts_with("STALE")
    );
}
