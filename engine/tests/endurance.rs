//! A week of history in a few seconds: small segments, thousands of them,
//! ten thousand streams, and the bounds asserted as numbers.
//!
//! What broke before: the checkpoint that opens every segment listed every
//! stream's run in every sealed segment, so it grew with history until it
//! filled a whole segment and every append started a new one (throughput
//! fell a hundredfold, disk use grew twentyfold); every segment kept its
//! file open, so a long log ran out of descriptors. Here the checkpoint
//! must not grow with the number of segments, files open stay within the
//! budget, disk use stays within a fixed factor of what was written, open
//! reads only the tail, and trims give the space back.

use std::path::Path;

use bytes::Bytes;
use fencelog::{Log, Options, Token};

const STREAMS: usize = 10_000;
const PAYLOAD: usize = 100;
const SEGMENT: u64 = 64 << 10;
const OPEN_FILES: usize = 16;

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = SEGMENT;
    o.wal.max_entry_bytes = 32 << 10;
    o.wal.max_open_segments = OPEN_FILES;
    o.wal.footer_cache_bytes = 1 << 20;
    o.index_cache_bytes = 4 << 20;
    o.max_payload_bytes = 16 << 10;
    o
}

fn name(i: usize) -> String {
    format!("stream-{i:05}")
}

/// Bytes one single-record append of `PAYLOAD` bytes costs besides the
/// payload, at most: the entry header (24), the op's header (22 and the
/// name), the record's length (4), padding to 8 (7), and in the segment's
/// footer its index entry (24) and, when it is the stream's only entry in
/// the segment, the stream's directory entry (48).
fn overhead_per_record() -> u64 {
    24 + 22 + name(0).len() as u64 + 4 + 7 + 24 + 48
}

/// Bytes of the files in `dir`. The log's threads run meanwhile: a file
/// they remove or rename between the listing and the look at it is gone,
/// not an error.
fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| match e.and_then(|e| e.metadata()) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => panic!("cannot stat a file in {}: {e}", dir.display()),
        })
        .sum()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Appends `rounds` records to every stream, round robin, pipelined (many
/// appends in flight share each sync).
fn append_rounds(rt: &tokio::runtime::Runtime, log: &Log, rounds: std::ops::Range<usize>) {
    let t = Token::new(1).unwrap();
    rt.block_on(async {
        for round in rounds {
            let mut pending = Vec::with_capacity(STREAMS);
            for i in 0..STREAMS {
                let payload = Bytes::from(vec![(round * 31 + i) as u8; PAYLOAD]);
                let d = log
                    .append_deferred(name(i).as_bytes(), t, vec![payload])
                    .await
                    .unwrap();
                pending.push(d);
            }
            for d in pending {
                d.await.unwrap();
            }
        }
    });
}

#[test]
fn history_grows_and_the_bounds_hold() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let fds_at_start = open_fds();

    // A first stretch of history.
    append_rounds(&rt, &log, 0..4);
    let early = log.metrics();
    let early_rss = rss_bytes();
    let early_segments = log.segments().len();
    assert!(early_segments > 50, "{early_segments} segments");

    // Then ten times more.
    append_rounds(&rt, &log, 4..40);
    let late = log.metrics();
    let segments = log.segments().len();
    assert!(segments > 500, "{segments} segments");
    let records = 40 * STREAMS as u64;

    // What opens a segment grows with the streams, not with history: the
    // same streams, the same checkpoint, at 50 segments and at 500.
    assert!(late.wal.checkpoints >= 2, "{:?}", late.wal);
    assert_eq!(
        late.wal.last_checkpoint_bytes, early.wal.last_checkpoint_bytes,
        "the checkpoint grew with history"
    );
    // And it is a small share of the log: written at most once per eight
    // times its size.
    assert!(
        late.wal.checkpoints * late.wal.last_checkpoint_bytes * 8
            <= late.wal.bytes_written + 8 * late.wal.last_checkpoint_bytes,
        "{:?}",
        late.wal
    );

    // Disk: within 1.3 times what was written, with the per-record
    // overhead, plus the segments made ahead of need.
    let payload = records * PAYLOAD as u64;
    let bound = (payload + records * overhead_per_record()) * 13 / 10 + 3 * SEGMENT;
    let on_disk = disk_bytes(dir.path());
    assert!(
        on_disk <= bound,
        "{on_disk} bytes on disk for {payload} bytes of payload (bound {bound})"
    );

    // Reads all over history open files within the budget, and answer
    // what was written.
    for i in (0..STREAMS).step_by(97) {
        for from in [0u64, 9, 21, 39] {
            let got = log.read(name(i), from, 1).unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].payload[0], (from as usize * 31 + i) as u8);
        }
    }
    let m = log.metrics();
    assert!(m.wal.open_segment_files as usize <= OPEN_FILES);
    let fds = open_fds();
    assert!(
        fds <= fds_at_start + OPEN_FILES + 4,
        "{fds} descriptors open (from {fds_at_start}, budget {OPEN_FILES})"
    );

    // Memory does not follow history: ten times the segments, about the
    // same resident memory (the caches are bounded at a few MiB here).
    let rss = rss_bytes();
    assert!(
        rss <= early_rss + (24 << 20),
        "resident memory went from {early_rss} to {rss} bytes over {} segments",
        segments - early_segments
    );
    drop(log);

    // Open reads the tail only: back to the newest checkpoint.
    let log = Log::open(dir.path(), opts()).unwrap();
    let report = log.recovery_report().clone();
    let checkpoint = late.wal.last_checkpoint_bytes;
    assert!(
        report.scanned_bytes <= 9 * checkpoint + 2 * SEGMENT,
        "open scanned {} bytes (checkpoint {checkpoint})",
        report.scanned_bytes
    );
    assert_eq!(log.read(name(4321), 39, 1).unwrap()[0].offset, 39);

    // Trims give the space back: every stream drops its first half, and
    // (once the collector has looked at what open did not read) about half
    // the segments go.
    let t = Token::new(1).unwrap();
    for i in 0..STREAMS {
        log.trim(name(i), t, 20).unwrap();
    }
    log.collect_garbage();
    let left = log.segments().len();
    assert!(
        left <= segments / 2 + segments / 10,
        "{left} of {segments} segments left after trimming half"
    );
    assert!(matches!(
        log.read(name(7), 19, 1),
        Err(fencelog::Error::Trimmed { .. })
    ));
    assert_eq!(log.read(name(7), 20, 1).unwrap()[0].offset, 20);
    let on_disk = disk_bytes(dir.path());
    assert!(
        on_disk <= bound / 2 + 10 * SEGMENT,
        "{on_disk} bytes after trimming"
    );
}
