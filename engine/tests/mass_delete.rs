//! Deleting many streams at once reads each segment's footer about once.
//!
//! What broke before: the garbage collector followed every trim (a delete
//! is a trim to the end) through the stream's segments on its own, reading
//! each segment's footer from disk, and a footer is about a tenth of its
//! segment. A benchmark that deleted its fifty streams at the end had every
//! footer of a 64 MiB-segment log read fifty times (some 6 GB of reads and
//! checksums) on the collector's thread, which took most of a core for
//! seconds on each of three replicas and slowed the next run by a quarter.
//! Trims queued together are now followed in one walk.

use bytes::Bytes;
use fencelog::{Log, Options, Token};

const STREAMS: usize = 400;
const ROUNDS: usize = 60;
const SEGMENT: u64 = 64 << 10;

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = SEGMENT;
    o.wal.max_entry_bytes = 32 << 10;
    o.max_payload_bytes = 16 << 10;
    // Caches that hold a handful of footers: what a walk needs comes from
    // the disk, as it does for a long log with large segments.
    o.wal.footer_cache_bytes = 64 << 10;
    o.index_cache_bytes = 128 << 10;
    o
}

fn name(i: usize) -> String {
    format!("stream-{i:04}")
}

#[test]
fn deleting_every_stream_at_once_reads_each_footer_about_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    // One thread queues the writes; the log's own threads make them durable.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Token::new(1).unwrap();

    // Every stream has records in almost every segment.
    rt.block_on(async {
        for round in 0..ROUNDS {
            let mut pending = Vec::with_capacity(STREAMS);
            for i in 0..STREAMS {
                let payload = Bytes::from(vec![(round + i) as u8; 100]);
                pending.push(
                    log.append_deferred(name(i).as_bytes(), t, vec![payload])
                        .await
                        .unwrap(),
                );
            }
            for d in pending {
                d.await.unwrap();
            }
        }
    });
    let segments = log.segments().len() as u64;
    assert!(segments > 60, "{segments} segments");
    let before = log.metrics().wal.footers_read;

    // Every stream deleted, pipelined (as a client's cleanup sends them).
    rt.block_on(async {
        let mut pending = Vec::with_capacity(STREAMS);
        for i in 0..STREAMS {
            pending.push(log.delete_deferred(name(i).as_bytes(), t).await.unwrap());
        }
        for d in pending {
            d.await.unwrap();
        }
    });
    log.collect_garbage();
    let read = log.metrics().wal.footers_read - before;

    // Followed one by one, each delete reads every footer: 400 × the
    // segments. Together, once per segment for each run of trims the
    // collector finds queued; a few runs at most.
    assert!(
        read <= 8 * segments,
        "{read} footers read to follow {STREAMS} deletes through {segments} segments"
    );
    // And the space comes back: only the segments recovery still needs
    // (from the newest checkpoint's on, a checkpoint being written once at
    // least eight times its size has been written after the last) are left.
    let left = log.segments().len() as u64;
    assert!(
        left <= 8,
        "{left} of {segments} segments left after deleting every stream"
    );
    // A deleted stream keeps its highest token (the fence outlives the
    // records).
    assert!(matches!(
        log.read(name(7), 0, 1),
        Err(fencelog::Error::Trimmed { .. })
    ));
    assert_eq!(log.highest_token(name(7)).unwrap(), 1);
}

/// Trims by the thousand, pipelined so that the collector finds them
/// merged (one waiting trim per stream, followed before or after the
/// seals around them), remove no segment with a live record: every record
/// at or past its stream's start reads back byte for byte, before and
/// after a reopen, and none below it does; and the segments with none are
/// removed.
#[test]
fn merged_trims_remove_only_segments_without_live_records() {
    const N: usize = 40;
    const ROUNDS: u64 = 600;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Token::new(1).unwrap();
    let payload = |i: usize, round: u64| Bytes::from(vec![(round as usize * 7 + i) as u8; 300]);
    // Each stream ends trimmed to its own point: a third of the way, two
    // thirds, or all of it.
    let end = |i: usize| (ROUNDS * (i as u64 % 7 + 1) / 3).min(ROUNDS);
    let log = Log::open(dir.path(), opts()).unwrap();
    rt.block_on(async {
        for round in 0..ROUNDS {
            let mut pending = Vec::with_capacity(N);
            for i in 0..N {
                pending.push(
                    log.append_deferred(name(i).as_bytes(), t, vec![payload(i, round)])
                        .await
                        .unwrap(),
                );
            }
            for d in pending {
                d.await.unwrap();
            }
        }
        // A hundred steps of trims, every stream's start rising at its own
        // pace, each step's trims pipelined together.
        for step in 1..=100u64 {
            let mut pending = Vec::with_capacity(N);
            for i in 0..N {
                let to = (step * end(i) / 100).min(ROUNDS);
                pending.push(log.trim_deferred(name(i).as_bytes(), t, to).await.unwrap());
            }
            for d in pending {
                d.await.unwrap();
            }
        }
    });
    log.collect_garbage();
    // The first third of the segments written hold no live record (every
    // stream's start is at least a third of the way): they are gone.
    let left = log.segments();
    let (first, last) = (left[0], left[left.len() - 1]);
    assert!(
        first * 4 > last,
        "segments {first}..={last} left: the dead first third was not removed"
    );
    let check = |log: &Log| {
        for i in 0..N {
            let mut from = end(i);
            while from < ROUNDS {
                let records = log.read(name(i), from, 64).unwrap();
                assert!(!records.is_empty(), "stream {i}: nothing at {from}");
                for r in records {
                    assert_eq!(r.offset, from, "stream {i}");
                    assert_eq!(r.payload, payload(i, from), "stream {i} at {from}");
                    from += 1;
                }
            }
            if end(i) > 0 {
                assert!(
                    matches!(
                        log.read(name(i), end(i) - 1, 1),
                        Err(fencelog::Error::Trimmed { .. })
                    ),
                    "stream {i}: a record below its start reads"
                );
            }
        }
    };
    check(&log);
    drop(log);
    let log = Log::open(dir.path(), opts()).unwrap();
    check(&log);
}
