//! Bytes handed to the disk ahead of a sync.
//!
//! A log without a sync per batch (a cluster replica's engine log) hands
//! its written bytes to the disk as it goes (`WalOptions::writeback_bytes`),
//! on real files: so many hand-overs for so many bytes, counted again from
//! each new segment; none when told not to, or with a sync per batch; and
//! every record reads back after a reopen. (What the disk keeps of unsynced
//! writes after a power cut, in any order, is `crash_consistency.rs`' to
//! test: a hand-over is the kernel writing back early, which it may do
//! anyway.)
//!
//! A new segment's zero fill is handed over a MiB at a time, paced by the
//! MiB before, and synced once whatever its size.

mod common;

use std::io;
use std::sync::Arc;

use common::*;
use fencelog_wal::{FsStorage, Preallocation, SimStorage, Storage, WalOptions};

/// Writes `batches` batches of eight 8 KiB records each (64 KiB a batch),
/// waiting for each, closes the log, and answers its hand-overs (started,
/// failed) and the records that read back.
fn write_and_count(opts: WalOptions, batches: u32) -> (u64, u64, usize) {
    let (dir, wal) = open_fs(&opts);
    for b in 0..batches {
        let mut last = None;
        for n in 0..8 {
            last = Some(append(&wal, &payload(b, n, 8 << 10)).unwrap().1);
        }
        last.unwrap().wait().unwrap();
    }
    let stats = wal.stats();
    wal.close().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let records = all_records(storage.as_ref(), dir.path()).len();
    (stats.writebacks_started, stats.writebacks_failed, records)
}

fn unsynced(segment_bytes: u64, writeback_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        max_entry_bytes: 64 << 10,
        sync_every_batch: false,
        flush_on_wait: true,
        preallocation: Preallocation::Reserve,
        writeback_bytes,
        ..WalOptions::default()
    }
}

#[test]
fn an_unsynced_log_hands_a_mebibyte_at_a_time_to_the_disk() {
    // 128 batches of 64 KiB: 8 MiB in one segment, handed over whole
    // pages at a time once a MiB waits: 7 or 8 times.
    let (started, failed, records) = write_and_count(unsynced(64 << 20, 1 << 20), 128);
    assert!((7..=8).contains(&started), "{started} hand-overs for 8 MiB");
    assert_eq!(failed, 0);
    assert_eq!(records, 128 * 8);
}

#[test]
fn each_new_segment_counts_from_its_start() {
    // 2 MiB segments, 12 MiB written: every segment hands over at least
    // one MiB before its seal. Counting on from the last segment's
    // position instead would skip most of them.
    let (started, failed, records) = write_and_count(unsynced(2 << 20, 1 << 20), 192);
    assert!(started >= 6, "{started} hand-overs in six segments or more");
    assert_eq!(failed, 0);
    assert_eq!(records, 192 * 8);
}

#[test]
fn none_when_told_not_to_or_with_a_sync_per_batch() {
    let (started, _, records) = write_and_count(unsynced(64 << 20, 0), 64);
    assert_eq!((started, records), (0, 64 * 8));
    let synced = WalOptions {
        sync_every_batch: true,
        ..unsynced(64 << 20, 1 << 20)
    };
    let (started, _, records) = write_and_count(synced, 64);
    assert_eq!((started, records), (0, 64 * 8));
}

#[test]
fn a_real_file_takes_a_range_and_refuses_one_past_what_the_kernel_counts() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FsStorage;
    let file = storage.create_new(&dir.path().join("f")).unwrap();
    file.write_all_at(&[7u8; 3 << 12], 0).unwrap();
    file.start_writeback(0, 2 << 12).unwrap();
    let err = file.start_writeback(u64::MAX - 1, 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    // The bytes are still there to read (and nothing was made durable:
    // that is only the sync's).
    let mut back = [0u8; 3 << 12];
    file.read_exact_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 7));
}

/// The syncs, hand-overs and waits for them that opening an empty log
/// made on a simulated disk: its first segment, zero-filled.
fn first_segment_costs(segment_bytes: u64) -> (u64, u64, u64) {
    let sim = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let opts = WalOptions {
        segment_bytes,
        max_entry_bytes: 16 << 10,
        preallocation: Preallocation::Fill,
        ..WalOptions::default()
    };
    let (wal, _) = open(&storage, std::path::Path::new(SIM_DIR), &opts).unwrap();
    let faults = sim.faults();
    let costs = (
        faults.syncs(),
        faults.writebacks_started(),
        faults.writebacks_finished(),
    );
    drop(wal);
    costs
}

#[test]
fn a_zero_fill_is_handed_over_a_mebibyte_at_a_time_and_synced_once() {
    let (small_syncs, small_started, small_finished) = first_segment_costs(64 << 10);
    assert_eq!((small_started, small_finished), (0, 0), "64 KiB: one piece");
    let (syncs, started, finished) = first_segment_costs(16 << 20);
    // 16 MiB in pieces of a MiB: 15 handed over while the fill goes on
    // (the last is the create's sync's), each but the first after the
    // one before was written.
    assert_eq!((started, finished), (15, 14));
    // A sync per 4 MiB, as before, would make three more.
    assert_eq!(syncs, small_syncs, "the fill adds no sync");
}
