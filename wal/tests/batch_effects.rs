//! A batch's effects reach the layer above together, in the order queued
//! ([`Durable::durable_all`], which may run a row of them as one); an
//! effect queued when everything is durable already runs at once, alone.

use std::sync::{Arc, Mutex};

use fencelog_wal::{
    Durable, FooterPayload, FsStorage, Replay, Sequencer, Storage, Wal, WalError, WalOptions,
};

/// What ran: each call, with the numbers of the effects it ran.
type Calls = Arc<Mutex<Vec<(&'static str, Vec<u32>)>>>;

struct Numbered {
    n: u32,
    calls: Calls,
}

impl Durable for Numbered {
    fn durable(self) {
        self.calls
            .lock()
            .expect("the calls' lock")
            .push(("alone", vec![self.n]));
    }

    fn durable_all(effects: Vec<Numbered>) {
        let Some(first) = effects.first() else {
            return;
        };
        let calls = Arc::clone(&first.calls);
        let numbers = effects.iter().map(|e| e.n).collect();
        calls
            .lock()
            .expect("the calls' lock")
            .push(("together", numbers));
    }
}

struct Numbers;

impl Sequencer for Numbers {
    type Effect = Numbered;

    fn checkpoint(&mut self, _segment: u64, _since: u64) -> Option<Vec<u8>> {
        Some(Vec::new())
    }

    fn seal(&mut self, _segment: u64) -> (FooterPayload, Option<Numbered>) {
        (Vec::new().into(), None)
    }
}

#[test]
fn a_batch_s_effects_run_together_in_order_and_a_late_one_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let build = |_replay: Replay<'_>| Ok::<_, WalError>(Numbers);
    let wal = Wal::open(storage, dir.path(), WalOptions::default(), build)
        .expect("open")
        .0;
    let calls: Calls = Arc::default();
    let effect = |n| Numbered {
        n,
        calls: Arc::clone(&calls),
    };
    // One submit: one batch, its effects handed over in one call.
    let ticket = wal
        .submit(|w| {
            for n in [3, 1, 2] {
                w.append(1, |b| b[0] = n as u8)?;
                w.on_durable(effect(n));
            }
            Ok::<_, WalError>(w.ticket())
        })
        .expect("submit")
        .expect("append");
    ticket.wait().expect("durable");
    assert_eq!(
        *calls.lock().expect("lock"),
        vec![("together", vec![3, 1, 2])]
    );

    // Everything appended is durable: 4 runs at once, alone; 5 waits for
    // its batch.
    let ticket = wal
        .submit(|w| {
            w.on_durable(effect(4));
            w.append(1, |b| b[0] = 5)?;
            w.on_durable(effect(5));
            Ok::<_, WalError>(w.ticket())
        })
        .expect("submit")
        .expect("append");
    ticket.wait().expect("durable");
    assert_eq!(
        *calls.lock().expect("lock"),
        vec![
            ("together", vec![3, 1, 2]),
            ("alone", vec![4]),
            ("together", vec![5]),
        ]
    );
}
