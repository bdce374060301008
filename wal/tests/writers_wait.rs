//! The sync thread's wait for the writers it answered
//! (`WalOptions::wait_for_writers`): writers that wait for each answer
//! share one sync instead of taking turns, and nothing is lost or reordered
//! by the wait.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fencelog_wal::{FsStorage, Storage, WalOptions};

const WRITERS: u32 = 8;
const EACH: u32 = 100;

/// `WRITERS` threads, each appending `EACH` records and waiting for each
/// to be durable before the next, on real files: every record comes back
/// after a reopen, each writer's in order. Answers the log's counters.
fn writers_each_waiting_for_their_answers(opts: WalOptions) -> fencelog_wal::WalStatsSnapshot {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let (wal, _) = open(&storage, dir.path(), &opts).unwrap();
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let wal = &wal;
            s.spawn(move || {
                for n in 0..EACH {
                    append_durable(wal, &payload(w, n, 64)).expect("a durable append");
                }
            });
        }
    });
    let stats = wal.stats();
    wal.close().unwrap();
    let records = all_records(storage.as_ref(), dir.path());
    assert_eq!(records.len(), (WRITERS * EACH) as usize);
    let mut next = vec![0u32; WRITERS as usize];
    for (_, p) in &records {
        let w = u32::from_le_bytes(p[..4].try_into().unwrap()) as usize;
        let n = u32::from_le_bytes(p[4..8].try_into().unwrap());
        assert_eq!(n, next[w], "writer {w}'s records out of order");
        next[w] += 1;
    }
    stats
}

#[test]
fn writers_that_wait_for_their_answers_are_waited_for_unless_told_not_to() {
    let waited = writers_each_waiting_for_their_answers(small_opts());
    // At least one wait ended by the writers' return (on a loaded machine
    // many may run out; that their bound holds is the next test's).
    assert!(
        waited.comeback_waits > waited.comeback_ran_out,
        "{} records from {WRITERS} writers: {} waits, {} ran out",
        waited.entries,
        waited.comeback_waits,
        waited.comeback_ran_out
    );
    let told_not_to = writers_each_waiting_for_their_answers(WalOptions {
        wait_for_writers: false,
        ..small_opts()
    });
    assert_eq!(
        (told_not_to.comeback_waits, told_not_to.comeback_ran_out),
        (0, 0)
    );
    // Without a sync per batch (a replica's log) there is no wait either.
    let unsynced = writers_each_waiting_for_their_answers(WalOptions {
        sync_every_batch: false,
        ..small_opts()
    });
    assert_eq!(unsynced.comeback_waits, 0);
}

/// Polls `ticket` until it is durable. Not waited on: a blocked waiter
/// may write the batch itself, which would not show the sync thread's
/// bound.
fn until_durable(ticket: fencelog_wal::Ticket) {
    let started = Instant::now();
    while !ticket.is_durable() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no sync after 60 s, with waits bounded by 1 ms"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    ticket.wait().unwrap();
}

#[test]
fn writers_that_do_not_come_back_delay_the_next_sync_a_bounded_time() {
    let (_dir, wal) = open_fs(&small_opts());
    // A batch of two writers' records arms a wait for both to come back;
    // only one does, and its record is made durable when the wait runs out
    // (without the bound, never). Until the sync thread took the two
    // records in one batch (it may take the first alone) and waited.
    for n in 0..1000 {
        let a = append(&wal, &payload(0, 2 * n, 64)).unwrap().1;
        let b = append(&wal, &payload(1, n, 64)).unwrap().1;
        until_durable(a);
        until_durable(b);
        until_durable(append(&wal, &payload(0, 2 * n + 1, 64)).unwrap().1);
        if wal.stats().comeback_ran_out > 0 {
            break;
        }
    }
    let stats = wal.stats();
    assert!(
        stats.comeback_ran_out > 0,
        "no wait for writers ran out in 1000 rounds ({} waits)",
        stats.comeback_waits
    );
    wal.close().unwrap();
}
