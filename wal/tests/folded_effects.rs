//! Effects queued for one batch are offered to the one queued before them
//! ([`Durable::absorb`]); what is folded runs once, what is handed back runs
//! after, in the order queued, and nothing is folded across batches or into
//! an effect that already ran.

use std::sync::{Arc, Mutex};

use fencelog_wal::{
    Durable, FooterPayload, FsStorage, Replay, Sequencer, Storage, Wal, WalError, WalOptions,
};

/// Numbers `from..=to`, run as one effect; the next number folds in.
struct Run {
    from: u32,
    to: u32,
    ran: Arc<Mutex<Vec<(u32, u32)>>>,
}

impl Durable for Run {
    fn durable(self) {
        self.ran
            .lock()
            .expect("the runs' lock")
            .push((self.from, self.to));
    }

    fn absorb(&mut self, next: Run) -> Option<Run> {
        if next.from == self.to + 1 {
            self.to = next.to;
            None
        } else {
            Some(next)
        }
    }
}

struct Runs;

impl Sequencer for Runs {
    type Effect = Run;

    fn checkpoint(&mut self, _segment: u64, _since: u64) -> Option<Vec<u8>> {
        Some(Vec::new())
    }

    fn seal(&mut self, _segment: u64) -> (FooterPayload, Option<Run>) {
        (Vec::new().into(), None)
    }
}

fn open(dir: &std::path::Path) -> Wal<Runs> {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let build = |_replay: Replay<'_>| Ok::<_, WalError>(Runs);
    Wal::open(storage, dir, WalOptions::default(), build)
        .expect("open")
        .0
}

#[test]
fn effects_of_one_batch_fold_into_the_one_before_and_run_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = open(dir.path());
    let ran = Arc::new(Mutex::new(Vec::new()));
    let run = |from, to| Run {
        from,
        to,
        ran: Arc::clone(&ran),
    };
    // One submit: one batch. 1..=5 fold into one; 7 does not follow 5, so
    // it runs after, with 8 folded into it.
    let ticket = wal
        .submit(|w| {
            for n in [1, 2, 3, 4, 5, 7, 8] {
                w.append(1, |b| b[0] = n as u8)?;
                w.on_durable(run(n, n));
            }
            Ok::<_, WalError>(w.ticket())
        })
        .expect("submit")
        .expect("append");
    ticket.wait().expect("durable");
    assert_eq!(*ran.lock().expect("lock"), vec![(1, 5), (7, 8)]);

    // Everything appended is durable: 9 runs at once, and 10 (in the next
    // batch) finds no effect queued to fold into, though 9 would take it.
    let ticket = wal
        .submit(|w| {
            w.on_durable(run(9, 9));
            w.append(1, |b| b[0] = 10)?;
            w.on_durable(run(10, 10));
            Ok::<_, WalError>(w.ticket())
        })
        .expect("submit")
        .expect("append");
    ticket.wait().expect("durable");
    assert_eq!(
        *ran.lock().expect("lock"),
        vec![(1, 5), (7, 8), (9, 9), (10, 10)]
    );
}
