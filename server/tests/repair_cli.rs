//! `fencelog repair` on damaged logs. Salvage was reachable only from
//! Rust; from the command line it must show what it cuts, ask or refuse
//! without `--yes`, keep the cut bytes, raise the token floor above every
//! token written before, and leave a log that verifies clean.
//!
//! A child process forked while a log is open shares its directory lock
//! until it execs, so opening logs and spawning the binary are serialized.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

use fencelog::{Error, Log, Options, Token};
use fencelog_wal::format::{ENTRY_HEADER_LEN, segment_file_name};
use fencelog_wal::{EntryKind, FsStorage};

fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 64 << 10;
    o.wal.max_entry_bytes = 16 << 10;
    o.max_payload_bytes = 4 << 10;
    o
}

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

/// Appends (each its own sync) to `alpha` and `beta`, tokens rising to
/// `top`, through several segments. Answers the highest token written.
fn write_log(dir: &Path, appends: u64) -> u64 {
    let _serial = serial();
    let log = Log::open(dir, opts()).unwrap();
    let mut top = 0;
    for i in 0..appends {
        top = 1 + i / 10;
        let stream = if i % 2 == 0 { "alpha" } else { "beta" };
        log.append(stream, t(top), &[vec![b'r'; 300]]).unwrap();
    }
    top
}

/// Every valid entry: (segment, position, lsn, kind).
fn entries(dir: &Path) -> Vec<(u64, u64, u64, EntryKind)> {
    let _serial = serial();
    let mut all = Vec::new();
    fencelog_wal::verify(
        &FsStorage,
        dir,
        |e| all.push((e.segment, e.position, e.lsn, e.kind)),
        |_, _| {},
    )
    .unwrap();
    all
}

fn segment(dir: &Path, seq: u64) -> PathBuf {
    dir.join(segment_file_name(seq))
}

fn flip(path: &Path, pos: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos).unwrap();
    b[0] ^= 0x55;
    f.write_all_at(&b, pos).unwrap();
}

fn fencelog(args: &[&str], dir: &Path) -> Output {
    let _serial = serial();
    Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(args)
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn damaged_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".damaged"))
        .collect()
}

/// After a repair: verify is clean, the floor holds every token written
/// before, and a write with an older token is STALE.
fn assert_repaired(dir: &Path, top: u64) {
    let v = fencelog(&["verify", "--no-progress"], dir);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v));
    let _serial = serial();
    let log = Log::open(dir, opts()).unwrap();
    assert!(log.metrics().token_floor >= top, "{:?}", log.metrics());
    for stream in ["alpha", "beta"] {
        assert!(log.stat(stream).unwrap().highest_token >= top);
        assert!(matches!(
            log.append(stream, t(top - 1), &["late"]),
            Err(Error::Stale { .. })
        ));
    }
    // The floor is a reserved ceiling, above what was written: new writes
    // go on from it.
    let floor = log.metrics().token_floor;
    log.append("alpha", t(floor), &["after the repair"])
        .unwrap();
}

#[test]
fn damage_at_rest_in_the_middle_of_the_tail_is_cut_and_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let top = write_log(dir.path(), 400);
    let all = entries(dir.path());
    let last_seg = all.last().unwrap().0;
    let in_last: Vec<_> = all.iter().filter(|e| e.0 == last_seg).collect();
    assert!(in_last.len() > 10, "{}", in_last.len());
    // A byte in the payload of an entry with many synced entries after it.
    let victim = in_last[in_last.len() / 2];
    assert_eq!(victim.3, EntryKind::Record);
    flip(
        &segment(dir.path(), last_seg),
        victim.1 + ENTRY_HEADER_LEN as u64 + 5,
    );
    let before = fencelog(&["verify", "--no-progress"], dir.path());
    assert_eq!(before.status.code(), Some(1), "{}", text(&before));

    // No terminal and no --yes: refused, nothing changed.
    let refused = fencelog(&["repair"], dir.path());
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--yes"), "{}", text(&refused));
    assert!(damaged_files(dir.path()).is_empty());

    let o = fencelog(&["repair", "--yes", "--no-progress"], dir.path());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    // The plan: file, byte, entries, streams touched.
    let file = segment(dir.path(), last_seg);
    assert!(
        out.contains(&format!("file:     {}", file.display())),
        "{out}"
    );
    assert!(out.contains(&format!("byte:     {}", victim.1)), "{out}");
    assert!(out.contains("streams:  \"alpha\", \"beta\""), "{out}");
    assert!(out.contains("Token floor now in force:"), "{out}");
    // Salvage cut acknowledged entries: it says it raised the floor, and
    // by how much.
    assert!(out.contains("Token floor raised from 0 to "), "{out}");
    assert!(out.trim_end().contains("OK"), "{out}");
    let aside = damaged_files(dir.path());
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(out.contains(&aside[0].display().to_string()), "{out}");
    assert_repaired(dir.path(), top);
}

#[test]
fn a_segment_with_an_unreadable_header_is_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let top = write_log(dir.path(), 400);
    let all = entries(dir.path());
    let last_seg = all.last().unwrap().0;
    assert!(last_seg > 1, "the log needs several segments");
    // The segment header's magic: the file cannot be read at all.
    flip(&segment(dir.path(), last_seg), 1);
    let o = fencelog(&["repair", "--yes", "--no-progress"], dir.path());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let aside = damaged_files(dir.path());
    assert!(
        aside
            .iter()
            .any(|p| p.to_string_lossy().contains(&segment_file_name(last_seg))),
        "{aside:?}\n{out}"
    );
    // Its entries were still read to name what they touched.
    assert!(out.contains("\"alpha\""), "{out}");
    assert_repaired(dir.path(), top);
}

#[test]
fn a_clean_log_needs_no_repair() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 20);
    let o = fencelog(&["repair", "--no-progress"], dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("nothing to cut"), "{}", text(&o));
    assert!(damaged_files(dir.path()).is_empty());
}

#[test]
fn a_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 20);
    let log = {
        let _serial = serial();
        Log::open(dir.path(), opts()).unwrap()
    };
    let o = Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(["repair", "--yes"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("in use"), "{}", text(&o));
    drop(log);
}

/// A torn tail (junk past the last entry, what a write cut short by a
/// power cut leaves) is cut without raising the token floor: it followed
/// the last sync and was never acknowledged, so every writer keeps its
/// token (SPEC §5, "a power cut keeps every writer's token").
#[test]
fn a_torn_tail_is_cut_without_raising_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let top = write_log(dir.path(), 30);
    let (last_seg, last_pos, _, _) = *entries(dir.path()).last().unwrap();
    let file = segment(dir.path(), last_seg);
    // Well past the last entry (a 300-byte record), inside the zeros of
    // the preallocated segment, or just past its end if it grows.
    let len = std::fs::metadata(&file).unwrap().len();
    let junk_at = (last_pos + 2048).min(len);
    {
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&[0xA5; 8], junk_at).unwrap();
    }
    let o = fencelog(&["repair", "--yes", "--no-progress"], dir.path());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("a torn tail"), "{out}");
    assert!(out.contains("floor:    not raised"), "{out}");
    assert!(out.contains("Token floor not raised"), "{out}");
    assert!(out.contains("Token floor now in force: 0"), "{out}");
    let _serial = serial();
    let log = Log::open(dir.path(), opts()).unwrap();
    assert_eq!(log.metrics().token_floor, 0);
    for stream in ["alpha", "beta"] {
        assert_eq!(log.stat(stream).unwrap().highest_token, top);
        log.append(stream, t(top), &["the same writer goes on"])
            .unwrap();
    }
}
