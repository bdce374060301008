//! Turns (`fencelog_wal::Turns`): the sync thread lets an event loop's pass
//! under way end before it syncs, so that one sync covers the pass.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use fencelog_wal::{FsStorage, Storage, Turns, Wal, WalOptions};

/// A log on real files in a fresh directory, opened with `turns`.
fn open_with(turns: &Arc<Turns>) -> (tempfile::TempDir, Arc<dyn Storage>, Wal<Counter>) {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let opts = WalOptions {
        turns: Some(Arc::clone(turns)),
        ..small_opts()
    };
    let (wal, _) = open(&storage, dir.path(), &opts).unwrap();
    (dir, storage, wal)
}

#[test]
fn a_sync_waits_for_the_pass_under_way_and_covers_all_of_it() {
    // A wait far longer than the test: only the pass's end lets it sync.
    let turns = Turns::new(2, Duration::from_secs(600));
    let (dir, storage, wal) = open_with(&turns);
    let member = turns.member(1).unwrap();
    let before = wal.stats();

    member.begin();
    let mut tickets = Vec::new();
    for n in 0..3 {
        let (_, ticket) = append(&wal, &payload(1, n, 50)).unwrap();
        tickets.push(ticket);
        // The sync thread is awake (the first submit woke it) and sees
        // entries pending: it must still not sync in the middle of a pass.
        std::thread::sleep(Duration::from_millis(50));
    }
    let during = wal.stats();
    assert_eq!(during.batch_entries.count, before.batch_entries.count);
    assert_eq!(during.entries, before.entries);
    assert!(!tickets.iter().any(|t| t.is_durable()));

    member.end();
    for t in tickets {
        t.wait().unwrap();
    }
    let after = wal.stats();
    // One group commit made the whole pass durable.
    assert_eq!(after.batch_entries.count - before.batch_entries.count, 1);
    assert_eq!(after.entries - before.entries, 3);
    wal.close().unwrap();
    let records = all_records(storage.as_ref(), dir.path());
    assert_eq!(records.len(), 3);
}

#[test]
fn a_pass_that_does_not_end_delays_a_sync_by_max_wait_at_most() {
    let turns = Turns::new(1, Duration::from_millis(5));
    let (_dir, _storage, wal) = open_with(&turns);
    let member = turns.member(0).unwrap();
    member.begin();
    // Never ended: the sync thread syncs once its wait runs out. The
    // ticket is polled, not waited on (a blocked waiter may flush by
    // itself, which would not show the sync thread's bound).
    let (_, ticket) = append(&wal, &payload(0, 0, 50)).unwrap();
    let mut polls = 0;
    while !ticket.is_durable() {
        polls += 1;
        assert!(polls < 60_000, "no sync after 60 s with a 5 ms bound");
        std::thread::sleep(Duration::from_millis(1));
    }
    ticket.wait().unwrap();
    assert!(wal.stats().pass_waits >= 1);
}
