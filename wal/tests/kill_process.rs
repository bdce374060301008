//! Real files, real fsync, a real process killed with SIGKILL in the middle
//! of writing: every entry it acknowledged (printed after its sync) must be
//! there after recovery, and nothing it never wrote may appear.
//!
//! The child is this test binary itself, re-run on the ignored
//! `child_writer` test with the data directory in an environment variable.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fencelog_wal::{FsStorage, Storage};

const CHILD_DIR: &str = "FENCELOG_WAL_CHILD_DIR";
const CHILD_WRITER: &str = "FENCELOG_WAL_CHILD_WRITER";
const CHILD_OPTS: &str = "FENCELOG_WAL_CHILD_OPTS";

/// The log's options, by name: `small` (64 KiB segments), `filled` (4
/// MiB segments, whose zero fill is handed to the disk in paced pieces),
/// `unsynced` (no sync per batch, written bytes handed to the disk every
/// 16 KiB, as a replica's engine log). A killed process loses nothing the
/// kernel took, synced or not, so an acknowledged entry survives in all.
fn opts_named(name: &str) -> fencelog_wal::WalOptions {
    match name {
        "small" => small_opts(),
        "filled" => fencelog_wal::WalOptions {
            segment_bytes: 4 << 20,
            ..small_opts()
        },
        "unsynced" => fencelog_wal::WalOptions {
            segment_bytes: 256 << 10,
            sync_every_batch: false,
            writeback_bytes: 16 << 10,
            ..small_opts()
        },
        other => panic!("no options named {other}"),
    }
}

#[test]
#[ignore = "a helper: kill_mid_write runs it as a child process"]
fn child_writer() {
    use std::io::Write;
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let writer_base: u32 = std::env::var(CHILD_WRITER).unwrap().parse().unwrap();
    let opts = opts_named(&std::env::var(CHILD_OPTS).unwrap());
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let (wal, _) = open(&storage, Path::new(&dir), &opts).unwrap();
    let out = parking_lot::Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let wal = &wal;
            let out = &out;
            s.spawn(move || {
                let writer = writer_base + t;
                for n in 0.. {
                    let p = payload(writer, n, (n as usize * 37) % 700);
                    let (at, ticket) = append(wal, &p).unwrap();
                    ticket.wait().unwrap();
                    let mut out = out.lock();
                    writeln!(
                        out,
                        "ACK {} {} {} {} {}",
                        at.lsn, at.segment, at.position, writer, n
                    )
                    .unwrap();
                    out.flush().unwrap();
                }
            });
        }
    });
}

struct Ack {
    lsn: u64,
    segment: u64,
    position: u64,
    writer: u32,
    n: u32,
}

fn run_child_and_kill(dir: &Path, opts: &str, writer_base: u32, min_acks: usize) -> Vec<Ack> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .env(CHILD_WRITER, writer_base.to_string())
        .env(CHILD_OPTS, opts)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let Some(rest) = line.strip_prefix("ACK ") else {
            continue;
        };
        let f: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
        acks.push(Ack {
            lsn: f[0],
            segment: f[1],
            position: f[2],
            writer: f[3] as u32,
            n: f[4] as u32,
        });
        if acks.len() >= min_acks || Instant::now() > deadline {
            // SIGKILL: no destructor, no flush, no goodbye.
            child.kill().unwrap();
            break;
        }
    }
    child.wait().unwrap();
    assert!(
        acks.len() >= min_acks,
        "the child acknowledged only {} entries",
        acks.len()
    );
    acks
}

#[test]
fn kill_mid_write() {
    kill_rounds("small");
}

/// Segments large enough that each new one's zero fill is handed to the
/// disk in paced pieces (`fill_with_zeros`) while writers are killed.
#[test]
fn kill_mid_write_while_segments_fill_in_pieces() {
    kill_rounds("filled");
}

/// A log without a sync per batch handing its bytes to the disk as it
/// goes (`WalOptions::writeback_bytes`): a kill loses nothing written.
#[test]
fn kill_mid_write_without_a_sync_per_batch() {
    kill_rounds("unsynced");
}

/// Three rounds of a child writing with the options `opts` names, killed
/// mid-write: every acknowledged entry reads back, nothing is invented.
fn kill_rounds(opts: &str) {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let mut all_acks = Vec::new();
    for round in 0..3u32 {
        let acks = run_child_and_kill(dir.path(), opts, round * 100, 1500 + round as usize * 500);
        all_acks.extend(acks);
        let (wal, _report) = open(&storage, dir.path(), &opts_named(opts)).unwrap();
        for a in &all_acks {
            let e = wal.read_entry(a.segment, a.position).unwrap_or_else(|e| {
                panic!(
                    "{opts}, round {round}: acknowledged LSN {} lost: {e}",
                    a.lsn
                )
            });
            assert_eq!(e.lsn, a.lsn);
            assert_eq!(&e.payload[..], &payload(a.writer, a.n, e.payload.len())[..]);
        }
        let counted = wal.with_state(|c| c.records);
        wal.close().unwrap();
        // Nothing invented: every record is a payload some writer made, and
        // each writer's records are its own 0, 1, 2, … without a gap.
        let records = all_records(storage.as_ref(), dir.path());
        assert_eq!(counted, records.len() as u64);
        let mut next = std::collections::HashMap::new();
        for (_, p) in &records {
            let writer = u32::from_le_bytes(p[0..4].try_into().unwrap());
            let n = u32::from_le_bytes(p[4..8].try_into().unwrap());
            assert_eq!(p, &payload(writer, n, p.len()), "a record nobody wrote");
            let expected = next.entry(writer).or_insert(0u32);
            assert_eq!(n, *expected, "writer {writer} has a gap");
            *expected += 1;
        }
    }
}
