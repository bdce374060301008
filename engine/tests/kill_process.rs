//! Real files, real fsync, a real process killed with SIGKILL while it
//! appends and fences on several streams. After each kill the log must hold
//! every record the child was told was written, with its token; every
//! stream's highest token must be at least every token the child had
//! accepted, so an older token is still rejected; and offsets must never be
//! handed out twice across the kills.
//!
//! The child is this test binary, re-run on the ignored `child` test.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelog::{Error, Log, Options, Token};

const DIR: &str = "FENCELOG_CHILD_DIR";
const ROUND: &str = "FENCELOG_CHILD_ROUND";

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 256 << 10;
    o.wal.max_entry_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

fn payload(stream: usize, round: u64, n: u64) -> Vec<u8> {
    format!("s{stream} r{round} n{n} {}", "x".repeat((n % 200) as usize)).into_bytes()
}

#[test]
#[ignore = "a helper: kill_mid_write runs it as a child process"]
fn child() {
    let Ok(dir) = std::env::var(DIR) else { return };
    let round: u64 = std::env::var(ROUND).unwrap().parse().unwrap();
    let log = Log::open(&dir, opts()).unwrap();
    let out = parking_lot::Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for stream in 0..3usize {
            let (log, out) = (&log, &out);
            s.spawn(move || {
                let name = format!("stream-{stream}");
                for n in 0.. {
                    // Tokens grow with the round and every 50 records.
                    let token = Token::new(round * 1_000_000 + 1 + n / 50).unwrap();
                    let p = payload(stream, round, n);
                    let off = log.append(&name, token, &[&p]).unwrap();
                    writeln!(out.lock(), "ACK {stream} {off} {} {round} {n}", token.get()).unwrap();
                }
            });
        }
        let (log, out) = (&log, &out);
        s.spawn(move || {
            for n in 1.. {
                let token = Token::new(round * 1_000_000 + n).unwrap();
                log.fence("fenced", token).unwrap();
                writeln!(out.lock(), "FENCE {}", token.get()).unwrap();
            }
        });
    });
}

#[derive(Default)]
struct Acked {
    /// (stream, offset) -> (token, round, n)
    records: HashMap<(usize, u64), (u64, u64, u64)>,
    highest: HashMap<usize, u64>,
    fenced: u64,
}

fn run_child(dir: &std::path::Path, round: u64, acked: &mut Acked, want: usize) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR, dir)
        .env(ROUND, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let f: Vec<&str> = line.split(' ').collect();
        match f[0] {
            "ACK" => {
                let v: Vec<u64> = f[1..].iter().map(|x| x.parse().unwrap()).collect();
                let stream = v[0] as usize;
                let prev = acked.records.insert((stream, v[1]), (v[2], v[3], v[4]));
                assert!(
                    prev.is_none(),
                    "offset {} of stream {stream} handed out twice",
                    v[1]
                );
                let h = acked.highest.entry(stream).or_default();
                *h = (*h).max(v[2]);
                seen += 1;
            }
            "FENCE" => acked.fenced = acked.fenced.max(f[1].parse().unwrap()),
            _ => continue,
        }
        if seen >= want || Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
    }
    child.wait().unwrap();
    assert!(seen >= want, "the child acknowledged only {seen} appends");
}

#[test]
fn kill_mid_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Acked::default();
    for round in 1..=3 {
        run_child(dir.path(), round, &mut acked, 1000);
        let log = Log::open(dir.path(), opts()).unwrap();
        for (&(stream, offset), &(token, r, n)) in &acked.records {
            let got = log.read(format!("stream-{stream}"), offset, 1).unwrap();
            assert_eq!(
                got.len(),
                1,
                "round {round}: stream {stream} lost offset {offset}"
            );
            assert_eq!(got[0].token.get(), token);
            assert_eq!(&got[0].payload[..], &payload(stream, r, n)[..]);
        }
        for (&stream, &highest) in &acked.highest {
            let name = format!("stream-{stream}");
            assert!(log.stat(&name).unwrap().highest_token >= highest);
            let old = Token::new(highest - 1).unwrap();
            assert!(matches!(
                log.append(&name, old, &[b"late"]),
                Err(Error::Stale { .. })
            ));
        }
        assert!(log.stat("fenced").unwrap().highest_token >= acked.fenced);
    }
}
