//! After a failed write or sync the log must stop: the failed batch's
//! waiters fail, every later write fails at once with an error that says so
//! (a failed fsync is never retried: its data may be gone while the page
//! cache claims it is clean), durable reads go on, and only reopening
//! clears the latch.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use fencelog_wal::{SimStorage, Storage, WalError};

/// Entries written and synced before the fault: (where, payload).
type Durable = Vec<(fencelog_wal::Appended, Vec<u8>)>;

fn setup() -> (
    SimStorage,
    Arc<dyn Storage>,
    fencelog_wal::Wal<Counter>,
    Durable,
) {
    let sim = SimStorage::new();
    // Spare the segment the allocator prepares in the background.
    sim.faults().only_on(".wal");
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let (wal, _) = open(&storage, Path::new("/db"), &small_opts()).unwrap();
    let mut durable = Vec::new();
    for n in 0..50 {
        let p = payload(1, n, 100);
        let (at, t) = append(&wal, &p).unwrap();
        t.wait().unwrap();
        durable.push((at, p));
    }
    (sim, storage, wal, durable)
}

fn assert_latched(wal: &fencelog_wal::Wal<Counter>, durable: &Durable) {
    assert!(wal.has_failed());
    match append(wal, b"after the failure") {
        Err(WalError::Failed { cause }) => assert!(cause.to_string().contains("simulated")),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a write was accepted after a failed sync"),
    }
    for (at, p) in durable {
        let e = wal.read_entry(at.segment, at.position).unwrap();
        assert_eq!(&e.payload[..], &p[..], "durable reads go on");
    }
}

#[test]
fn a_failed_sync_latches() {
    let (sim, storage, wal, durable) = setup();
    let syncs_before = sim.faults().syncs();
    sim.faults().fail_sync_after(0);
    let (_, t) = append(&wal, b"doomed").unwrap();
    assert!(matches!(t.wait(), Err(WalError::Failed { .. })));
    assert_latched(&wal, &durable);
    // Never retried: no sync was attempted after the failed one.
    assert_eq!(sim.faults().syncs(), syncs_before + 1);
    drop(wal);
    // Reopening clears the latch; everything acknowledged is there.
    let (wal, _) = open(&storage, Path::new("/db"), &small_opts()).unwrap();
    for (at, p) in &durable {
        assert_eq!(
            &wal.read_entry(at.segment, at.position).unwrap().payload[..],
            &p[..]
        );
    }
    let (_, t) = append(&wal, b"fine again").unwrap();
    t.wait().unwrap();
}

#[test]
fn a_failed_write_latches() {
    let (sim, _storage, wal, durable) = setup();
    sim.faults().fail_write_after(0);
    let (_, t) = append(&wal, b"doomed").unwrap();
    assert!(matches!(t.wait(), Err(WalError::Failed { .. })));
    assert_latched(&wal, &durable);
}

#[test]
fn every_waiter_of_a_failing_batch_fails_and_none_hangs() {
    let (sim, _storage, wal, durable) = setup();
    sim.faults().fail_sync_after(2);
    let results: Vec<Result<(), WalError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let wal = &wal;
                s.spawn(move || {
                    let mut last = Ok(());
                    for n in 0..200 {
                        match append(wal, &payload(t, n, 64)) {
                            Ok((_, ticket)) => {
                                if let Err(e) = ticket.wait() {
                                    last = Err(e);
                                    break;
                                }
                            }
                            Err(e) => {
                                last = Err(e);
                                break;
                            }
                        }
                    }
                    last
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(WalError::Failed { .. })))
    );
    assert_latched(&wal, &durable);
}

#[test]
fn a_failure_while_sealing_latches() {
    let (sim, _storage, wal, durable) = setup();
    let sealed_before = wal.stats().segments_sealed;
    // Fill the segment in big entries, and arm a failure for the very next
    // sync once the next entry will trigger a seal: the batch carrying the
    // seal then fails at its footer's sync.
    let mut failed = false;
    for n in 0..2000 {
        let p = payload(2, n, 4000);
        let (_, t) = match wal.submit(|w| {
            let at = w.append(p.len(), |buf| buf.copy_from_slice(&p))?;
            w.state().records += 1;
            // The log seals after this submission when the segment is full.
            if at.position + 2 * 4100 > small_opts().segment_bytes {
                sim.faults().fail_sync_after(0);
            }
            Ok::<_, WalError>((at, w.ticket()))
        }) {
            Ok(Ok(x)) => x,
            _ => {
                failed = true;
                break;
            }
        };
        if t.wait().is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed);
    assert_eq!(
        wal.stats().segments_sealed,
        sealed_before,
        "the seal did not complete"
    );
    assert_latched(&wal, &durable);
}
