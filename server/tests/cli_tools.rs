//! `fencelog verify` and `fencelog dump`, run as the real binary against
//! data directories written through the engine.
//!
//! The directory lock is an `flock` on `LOCK`: a child process forked while
//! a log is open shares that lock until it execs, so a binary spawned by one
//! test could keep another test's just-closed directory locked for a
//! moment. Every open log, in-process verification and spawn therefore runs
//! under [`serial`].

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use fencelog::{AcquireOptions, Log, Options, Token};
use fencelog_wal::format::{ENTRY_HEADER_LEN, encode_entry_header, segment_file_name};
use fencelog_wal::{EntryKind, FsStorage};

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 256 << 10;
    o.wal.max_entry_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

/// Held while a log is open, the verifier holds a lock, or a process is
/// spawned (see the module's comment).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn fencelog(args: &[&str], dir: &Path) -> Output {
    let _serial = serial();
    fencelog_unserialized(args, dir)
}

fn fencelog_unserialized(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(args)
        .arg(dir)
        .env("FENCELOG_LOG", "warn")
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Three streams and two lease acquisitions, in one segment:
/// - `alpha`: 4 appends of 2 records with token 3 (offsets 0..8);
/// - `beta`: fenced at 7, then 3 appends of 1 record (offsets 0..3);
/// - `jobs`: acquired with fence (token 1), one append, released; acquired
///   again with fence (token 2), one append.
fn small_log(dir: &Path) {
    let _serial = serial();
    let log = Log::open(dir, opts()).unwrap();
    for i in 0..4 {
        log.append("alpha", t(3), &[format!("a{i}-0"), format!("a{i}-1")])
            .unwrap();
    }
    log.fence("beta", t(7)).unwrap();
    log.append("beta", t(7), &["hello \"world\"\n"]).unwrap();
    log.append("beta", t(7), &["x".repeat(200)]).unwrap();
    log.append("beta", t(7), &[[0u8, 1, 255]]).unwrap();
    let fenced = AcquireOptions {
        fence: true,
        ..Default::default()
    };
    let g = log
        .acquire("jobs", "worker-a", Duration::from_secs(60), fenced)
        .unwrap();
    log.append("jobs", g.token, &["by a"]).unwrap();
    log.release("jobs", "worker-a", g.token).unwrap();
    let g = log
        .acquire("jobs", "worker-b", Duration::from_secs(60), fenced)
        .unwrap();
    log.append("jobs", g.token, &["by b"]).unwrap();
}

/// Every valid entry: (segment, position, lsn, kind, payload).
fn entries(dir: &Path) -> Vec<(u64, u64, u64, EntryKind, Vec<u8>)> {
    let _serial = serial();
    let mut all = Vec::new();
    fencelog_wal::verify(
        &FsStorage,
        dir,
        |e| all.push((e.segment, e.position, e.lsn, e.kind, e.payload.to_vec())),
        |_, _| {},
    )
    .unwrap();
    all
}

fn segment_path(dir: &Path, seg: u64) -> PathBuf {
    dir.join(segment_file_name(seg))
}

/// Replaces the payload of the entry at `pos` of segment `seg` with one of
/// the same length, with a checksum that matches: damage only the engine's
/// decoding can see.
fn rewrite_entry(dir: &Path, seg: u64, pos: u64, lsn: u64, kind: EntryKind, payload: &[u8]) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment_path(dir, seg))
        .unwrap();
    let mut header = [0u8; ENTRY_HEADER_LEN];
    file.read_exact_at(&mut header, pos).unwrap();
    let epoch_back = u64::from(u32::from_le_bytes(header[16..20].try_into().unwrap()));
    encode_entry_header(&mut header, seg, lsn, lsn - epoch_back, kind, payload);
    file.write_all_at(&header, pos).unwrap();
    file.write_all_at(payload, pos + ENTRY_HEADER_LEN as u64)
        .unwrap();
}

/// The row of `name` in verify's stream table: highest token, next offset,
/// start offset, records appended.
fn stream_row(out: &str, name: &str) -> [u64; 4] {
    let quoted = format!("\"{name}\"");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(&quoted))
        .unwrap_or_else(|| panic!("no row for {name} in:\n{out}"));
    let nums: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    nums.try_into().unwrap()
}

#[test]
fn verify_reports_a_clean_log() {
    let dir = tempfile::tempdir().unwrap();
    small_log(dir.path());
    let o = fencelog(&["verify"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    assert!(out.contains("streams   3"), "{out}");
    assert_eq!(stream_row(&out, "alpha"), [3, 8, 0, 8]);
    assert_eq!(stream_row(&out, "beta"), [7, 3, 0, 3]);
    assert_eq!(stream_row(&out, "jobs"), [2, 2, 0, 2]);
    assert!(out.contains("records   13 appended"), "{out}");
    assert!(
        out.contains("2 acquisitions in the scanned log, highest lease token 2"),
        "{out}"
    );
    assert!(out.contains("damage    none"), "{out}");
    assert!(out.trim_end().ends_with("OK"), "{out}");
}

#[test]
fn verify_replays_through_rotation_trims_and_removed_segments() {
    let dir = tempfile::tempdir().unwrap();
    {
        let _serial = serial();
        let log = Log::open(dir.path(), opts()).unwrap();
        for i in 0..1500u64 {
            let payload = vec![b'p'; 400 + (i % 5) as usize * 100];
            log.append(format!("s{}", i % 5), t(1 + i / 500), &[&payload])
                .unwrap();
            if i % 400 == 0 {
                let g = log
                    .acquire(
                        "lock",
                        format!("o{i}"),
                        Duration::from_secs(60),
                        AcquireOptions::default(),
                    )
                    .unwrap();
                log.release("lock", format!("o{i}"), g.token).unwrap();
            }
        }
        let before = log.segments().len();
        for s in 0..5 {
            let next = log.stat(format!("s{s}")).unwrap().next_offset;
            log.trim(format!("s{s}"), t(100), next - 10).unwrap();
        }
        log.append("s0", t(100), &["after the trims"]).unwrap();
        // Collection runs on its own thread: wait for it, or the check
        // below races it (it failed once so, under load).
        log.collect_garbage();
        assert!(log.segments().len() < before);
    }
    let o = fencelog(&["verify", "--no-progress"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    assert!(out.contains("streams   5"), "{out}");
    assert_eq!(stream_row(&out, "s0")[..3], [100, 301, 290]);
    for s in 1..5 {
        assert_eq!(stream_row(&out, &format!("s{s}"))[..3], [100, 300, 290]);
    }
    // The first segments were collected: the log starts after LSN 1.
    assert!(out.contains("the log starts at LSN"), "{out}");
    assert!(
        out.contains("4 acquisitions in the scanned log, highest lease token 4")
            || out.contains("highest lease token 4"),
        "{out}"
    );
}

#[test]
fn verify_names_the_file_and_byte_of_a_flipped_bit_in_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    {
        let _serial = serial();
        let log = Log::open(dir.path(), opts()).unwrap();
        for i in 0..1000u64 {
            log.append("s", t(1), &[vec![b'a' + (i % 26) as u8; 600]])
                .unwrap();
        }
    }
    let all = entries(dir.path());
    let tail = all.last().unwrap().0;
    assert!(tail > 1, "the log should span several segments");
    let in_tail: Vec<_> = all.iter().filter(|e| e.0 == tail).collect();
    let (seg, pos, lsn, _, payload) = in_tail[in_tail.len() / 2];
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment_path(dir.path(), *seg))
        .unwrap();
    let at = pos + ENTRY_HEADER_LEN as u64 + payload.len() as u64 / 2;
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[b[0] ^ 0x10], at).unwrap();

    let o = fencelog(&["verify"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    let expected = format!("{} at byte {pos}", segment_path(dir.path(), *seg).display());
    assert!(out.contains(&expected), "want {expected:?} in:\n{out}");
    assert!(out.contains("DAMAGED"), "{out}");
    assert!(!out.contains("damage    none"), "{out} (LSN {lsn})");
}

#[test]
fn an_entry_that_passes_its_checksum_but_does_not_decode_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    small_log(dir.path());
    let all = entries(dir.path());
    let (seg, pos, lsn, kind, payload) = &all[3];
    assert_eq!(*kind, EntryKind::Record);
    let mut bad = payload.clone();
    bad[0] = 0xee; // no such op
    rewrite_entry(dir.path(), *seg, *pos, *lsn, *kind, &bad);

    let o = fencelog(&["verify"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    let expected = format!(
        "{} at byte {pos} (LSN {lsn}): an entry that passes its checksum but does not decode",
        segment_path(dir.path(), *seg).display()
    );
    assert!(out.contains(&expected), "want {expected:?} in:\n{out}");

    let o = fencelog(&["dump"], dir.path());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("pos={pos} lsn={lsn} record UNDECODABLE")),
        "{}",
        stdout(&o)
    );
    assert!(stderr(&o).contains("damage:"), "{}", stderr(&o));
}

#[test]
fn an_entry_that_breaks_the_fencing_rule_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    small_log(dir.path());
    // beta's last append (token 7) rewritten to carry token 2.
    let all = entries(dir.path());
    let (seg, pos, lsn, kind, payload) = all
        .iter()
        .rfind(|e| e.4.starts_with(b"\x01\x04beta"))
        .unwrap();
    let mut bad = payload.clone();
    bad[6..14].copy_from_slice(&2u64.to_le_bytes());
    rewrite_entry(dir.path(), *seg, *pos, *lsn, *kind, &bad);

    let o = fencelog(&["verify"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    assert!(
        out.contains(&format!(
            "at byte {pos} (LSN {lsn}): an append of 1 records at offset 2 with token 2"
        )),
        "{out}"
    );
}

#[test]
fn verify_refuses_a_directory_in_use() {
    let dir = tempfile::tempdir().unwrap();
    small_log(dir.path());
    let _serial = serial();
    let _log = Log::open(dir.path(), opts()).unwrap();
    for cmd in ["verify", "dump"] {
        let o = fencelog_unserialized(&[cmd], dir.path());
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        let err = stderr(&o);
        assert!(
            err.contains(&format!(
                "{} is in use by another process",
                dir.path().display()
            )),
            "{cmd}: {err}"
        );
        assert!(o.stdout.is_empty(), "{cmd}: {}", stdout(&o));
    }
}

#[test]
fn verify_refuses_a_missing_or_foreign_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let o = fencelog(&["verify"], &missing);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{}: no such directory", missing.display())),
        "{}",
        stderr(&o)
    );

    let o = fencelog(&["verify"], dir.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not a fencelog data directory"),
        "{}",
        stderr(&o)
    );
    // And left no lock file behind.
    assert!(!dir.path().join("LOCK").exists());
}

#[test]
fn dump_shows_the_appends_of_one_stream() {
    let dir = tempfile::tempdir().unwrap();
    small_log(dir.path());
    let o = fencelog(&["dump", "--stream", "alpha"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    let appends: Vec<&str> = out.lines().filter(|l| l.contains(" append ")).collect();
    assert_eq!(appends.len(), 4, "{out}");
    for (i, line) in appends.iter().enumerate() {
        let want = format!(
            "append stream=\"alpha\" token=3 offsets={}..{} records=2 bytes=8 sizes=[4,4]",
            2 * i,
            2 * i + 2
        );
        assert!(line.contains(&want), "want {want:?} in {line:?}");
        assert!(line.starts_with("segment=1 pos="), "{line}");
        assert!(line.contains(&format!(" lsn={} ", i + 2)), "{line}");
    }
    assert!(!out.contains("beta") && !out.contains("jobs"), "{out}");
    assert!(!out.contains("payloads="), "{out}");

    // A lease's entries are shown by its name; the fence went with it.
    let o = fencelog(&["dump", "--stream", "jobs"], dir.path());
    let out = stdout(&o);
    let kinds: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().nth(3).unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["acquire", "append", "release", "acquire", "append"],
        "{out}"
    );
    assert!(
        out.contains("acquire lease=\"jobs\" owner=\"worker-b\" token=2 ttl_ms=60000 fence=true"),
        "{out}"
    );
}

#[test]
fn dump_shows_payloads_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    small_log(dir.path());
    let o = fencelog(&["dump", "--payloads", "--stream", "beta"], dir.path());
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    assert!(out.contains(r#"payloads=[b"hello \"world\"\n"]"#), "{out}");
    assert!(out.contains(r#"payloads=[b"\x00\x01\xff"]"#), "{out}");
    let cut = format!("payloads=[b\"{}\"...(+136 bytes)]", "x".repeat(64));
    assert!(out.contains(&cut), "{out}");

    let o = fencelog(
        &["dump", "--payloads", "--full", "--stream", "beta"],
        dir.path(),
    );
    let whole = format!("payloads=[b\"{}\"]", "x".repeat(200));
    assert!(stdout(&o).contains(&whole), "{}", stdout(&o));

    let o = fencelog(
        &[
            "dump",
            "--payloads",
            "--payload-limit",
            "3",
            "--stream",
            "alpha",
        ],
        dir.path(),
    );
    assert!(
        stdout(&o).contains(r#"payloads=[b"a0-"...(+1 bytes), b"a0-"...(+1 bytes)]"#),
        "{}",
        stdout(&o)
    );
}

#[test]
fn dump_into_a_closed_pipe_stops_quietly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let _serial = serial();
        let log = Log::open(dir.path(), opts()).unwrap();
        let batch: Vec<String> = (0..50).map(|i| format!("record {i}")).collect();
        for _ in 0..400 {
            log.append("s", t(1), &batch).unwrap();
        }
    }
    let serial = serial();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(["dump", "--payloads", "--full"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(serial);
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's reader is gone (as with `| head`).
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(first.starts_with(b"segment=1 pos="));
}

#[test]
fn every_flag_has_help() {
    for (cmd, flags) in [
        ("verify", &["--all", "--no-progress"][..]),
        (
            "dump",
            &["--stream", "--payloads", "--payload-limit", "--full"][..],
        ),
    ] {
        let _serial = serial();
        let o = Command::new(env!("CARGO_BIN_EXE_fencelog"))
            .args([cmd, "-h"])
            .output()
            .unwrap();
        assert!(o.status.success());
        let help = stdout(&o);
        for flag in flags {
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(flag))
                .unwrap_or_else(|| panic!("{cmd} --help lacks {flag}:\n{help}"));
            assert!(
                line.len() > flag.len() + 10,
                "{cmd} {flag} has no text: {help}"
            );
        }
    }
}
