//! A footer made later ([`FooterPayload::Later`]) is made by the sync
//! thread, off the log's lock: writers go on submitting while it is made.
//!
//! What it replaced: the engine built each sealed segment's footer (an
//! index entry per record, 7.7 MB in a 64 MiB segment of 100-byte appends)
//! and framed it (a copy and a checksum) inside `Sequencer::seal`, under the
//! lock every writer takes: 7–10 ms of every writer waiting, three times a
//! second at pipeline 16.

mod common;

use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelog_wal::{
    FooterPayload, FsStorage, Replay, Sequencer, Storage, Ticket, Wal, WalError, WalOptions,
};

/// Seals with a footer made later, which waits for the test's word before
/// it is made (and says when it has started).
struct Gated {
    records: u64,
    started: Sender<u64>,
    gate: Arc<Mutex<Receiver<()>>>,
}

impl Sequencer for Gated {
    type Effect = ();

    fn checkpoint(&mut self, _segment: u64, _since: u64) -> Option<Vec<u8>> {
        Some(self.records.to_le_bytes().to_vec())
    }

    fn seal(&mut self, segment: u64) -> (FooterPayload, Option<()>) {
        let started = self.started.clone();
        let gate = Arc::clone(&self.gate);
        let records = self.records;
        let fill = move |b: &mut Vec<u8>| {
            let _ = started.send(segment);
            // Bounded: a log that never asks would not hang the test.
            let _ = gate
                .lock()
                .expect("the gate's lock")
                .recv_timeout(Duration::from_secs(20));
            b.extend_from_slice(format!("segment {segment}: {records} records").as_bytes());
        };
        (FooterPayload::Later(Box::new(fill)), None)
    }
}

fn open(
    dir: &Path,
    started: Sender<u64>,
    gate: Arc<Mutex<Receiver<()>>>,
) -> Result<Wal<Gated>, WalError> {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let opts = WalOptions {
        segment_bytes: 64 << 10,
        max_entry_bytes: 16 << 10,
        max_batch_bytes: 1 << 20,
        ..WalOptions::default()
    };
    let build = move |replay: Replay<'_>| -> Result<Gated, WalError> {
        Ok(Gated {
            records: common::count_records(replay)?,
            started,
            gate,
        })
    };
    Wal::open(storage, dir, opts, build).map(|(wal, _)| wal)
}

fn append(wal: &Wal<Gated>, n: u32) -> Ticket {
    let bytes = vec![n as u8; 1000];
    wal.submit(|w| {
        w.append(bytes.len(), |buf| buf.copy_from_slice(&bytes))?;
        w.state().records += 1;
        Ok::<_, WalError>(w.ticket())
    })
    .expect("a submit")
    .expect("an append")
}

#[test]
fn writers_go_on_while_the_sync_thread_makes_a_footer() {
    let dir = tempfile::tempdir().unwrap();
    let (started_tx, started) = channel();
    let (open_gate, gate) = channel();
    let wal = Arc::new(open(dir.path(), started_tx, Arc::new(Mutex::new(gate))).unwrap());

    // Enough to fill the first segment (64 KiB): it is sealed, and the sync
    // thread starts its footer and waits there. (On a thread of its own: a
    // footer made under the lock would be made by the submit that seals.)
    let first = {
        let wal = Arc::clone(&wal);
        std::thread::spawn(move || (0..80).map(|n| append(&wal, n)).collect::<Vec<Ticket>>())
    };
    let sealing = started
        .recv_timeout(Duration::from_secs(20))
        .expect("the sync thread starts the first segment's footer");
    assert_eq!(sealing, 1);

    // Meanwhile a writer submits, and is not held by the footer.
    let (done_tx, done) = channel();
    let writer = {
        let wal = Arc::clone(&wal);
        std::thread::spawn(move || {
            let t = append(&wal, 200);
            let _ = done_tx.send(());
            t
        })
    };
    done.recv_timeout(Duration::from_secs(10))
        .expect("a submit waited for the footer being made");
    let late = writer.join().unwrap();
    let mut tickets = first.join().unwrap();
    assert!(!late.is_durable(), "durable while its sync thread waits");

    // The footer is made, the segment sealed, everything durable.
    open_gate.send(()).unwrap();
    tickets.push(late);
    for t in tickets {
        t.wait().unwrap();
    }
    let footer = wal.footer(1).unwrap().expect("segment 1 is sealed");
    assert!(
        footer.starts_with(b"segment 1: "),
        "{:?}",
        String::from_utf8_lossy(&footer)
    );
    // Every later footer opens the gate itself: nothing waits now.
    drop(open_gate);
    let wal = Arc::into_inner(wal).expect("the only handle");
    wal.close().unwrap();

    // Reopened: the footer reads back from the disk, and all 81 records.
    let (started_tx, _started) = channel();
    let (_gate_tx, gate) = channel();
    let wal = open(dir.path(), started_tx, Arc::new(Mutex::new(gate))).unwrap();
    assert_eq!(wal.footer(1).unwrap().as_deref(), Some(&footer[..]));
    assert_eq!(wal.submit(|w| w.state().records).unwrap(), 81);
}
