//! Transactions land whole or not at all. What broke before them: a client
//! library's MULTI … EXEC ran its commands one by one, so a stale token in
//! the middle left the writes before it applied. These tests check that a
//! rejected op leaves nothing behind, that an accepted transaction's ops
//! are all there after a restart, and that a power cut at any point of a
//! transaction's write keeps all of its ops or none.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use fencelog::wal::{CrashMode, SimStorage, Storage};
use fencelog::{Error, Log, ManualClock, Options, ReadOptions, Token, TxOp};

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn append(stream: &str, token: u64, payloads: &[&str]) -> TxOp {
    TxOp::Append {
        stream: b(stream),
        token: t(token),
        payloads: payloads.iter().map(|p| b(p)).collect(),
    }
}

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 64 << 10;
    o.wal.max_entry_bytes = 48 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

fn open(sim: &SimStorage) -> Log {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    Log::open_on(
        storage,
        Arc::new(ManualClock::default()),
        Path::new("/db"),
        opts(),
    )
    .unwrap()
}

fn payloads(log: &Log, stream: &str) -> Vec<Vec<u8>> {
    log.read(stream, log.stat(stream).unwrap().start_offset, 1000)
        .unwrap()
        .into_iter()
        .map(|r| r.payload.to_vec())
        .collect()
}

#[test]
fn an_accepted_transaction_lands_whole_and_survives_a_restart() {
    let sim = SimStorage::new();
    let log = open(&sim);
    log.append("a", t(3), &["old"]).unwrap();
    let answers = log
        .transact(vec![
            append("a", 4, &["x", "y"]),
            TxOp::AppendAt {
                stream: b("b"),
                token: t(4),
                expected_offset: 0,
                payloads: vec![b("z")].into(),
            },
            TxOp::Fence {
                stream: b("c"),
                token: t(9),
            },
            TxOp::Trim {
                stream: b("a"),
                token: t(4),
                before: 1,
            },
            append("a", 5, &["w"]),
        ])
        .unwrap();
    assert_eq!(answers, vec![1, 0, 9, 1, 3]);
    drop(log);
    let log = open(&sim.cut_power(CrashMode::LoseUnsynced));
    assert_eq!(
        payloads(&log, "a"),
        vec![b"x".to_vec(), b"y".to_vec(), b"w".to_vec()]
    );
    assert_eq!(log.stat("a").unwrap().highest_token, 5);
    assert_eq!(log.stat("a").unwrap().start_offset, 1);
    assert_eq!(payloads(&log, "b"), vec![b"z".to_vec()]);
    assert_eq!(log.stat("c").unwrap().highest_token, 9);
    assert_eq!(log.metrics().transactions, 0, "counters are per process");
}

#[test]
fn a_stale_op_in_the_middle_applies_nothing() {
    let sim = SimStorage::new();
    let log = open(&sim);
    log.fence("b", t(10)).unwrap();
    let err = log
        .transact(vec![
            append("a", 5, &["x"]),
            append("b", 9, &["late"]),
            append("c", 5, &["y"]),
        ])
        .unwrap_err();
    match err {
        Error::Aborted { index: 1, cause } => assert!(matches!(
            *cause,
            Error::Stale {
                presented: 9,
                highest: 10
            }
        )),
        other => panic!("unexpected {other:?}"),
    }
    for s in ["a", "b", "c"] {
        assert_eq!(log.stat(s).unwrap().next_offset, 0, "stream {s}");
    }
    assert_eq!(log.stat("a").unwrap().highest_token, 0);
    drop(log);
    let log = open(&sim.cut_power(CrashMode::LoseUnsynced));
    assert_eq!(log.stat("a").unwrap().highest_token, 0);
    assert_eq!(log.stat("c").unwrap().next_offset, 0);
}

#[test]
fn rejections_decided_inside_the_lock_apply_nothing_either() {
    // The stale token here is in flight in the same transaction, or the
    // offset moved within it: decided in the serialized section, not on the
    // fast path.
    let log = open(&SimStorage::new());
    let err = log
        .transact(vec![
            TxOp::Fence {
                stream: b("s"),
                token: t(8),
            },
            append("s", 7, &["x"]),
        ])
        .unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { index: 1, cause } if matches!(**cause, Error::Invalid { .. })),
        "{err:?}"
    );
    let err = log
        .transact(vec![
            append("s", 1, &["x"]),
            TxOp::AppendAt {
                stream: b("s"),
                token: t(1),
                expected_offset: 0,
                payloads: vec![b("y")].into(),
            },
        ])
        .unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { index: 1, cause } if matches!(**cause, Error::OffsetMismatch { expected: 0, next: 1 })),
        "{err:?}"
    );
    let err = log
        .transact(vec![TxOp::Trim {
            stream: b("s"),
            token: t(1),
            before: 5,
        }])
        .unwrap_err();
    assert!(
        matches!(&err, Error::Aborted { index: 0, cause } if matches!(**cause, Error::TrimBeyondEnd { .. })),
        "{err:?}"
    );
    assert_eq!(log.stat("s").unwrap(), Default::default());
    assert_eq!(log.metrics().transactions, 0);
}

#[test]
fn a_power_cut_keeps_a_transaction_whole_or_drops_it_whole() {
    // Cut the power at every storage operation of a run of transactions:
    // each one is found complete or not at all, and every acknowledged one
    // is found.
    let mut cut_midway = 0;
    for cut_at in 1..60 {
        for mode in [
            CrashMode::LoseUnsynced,
            CrashMode::Torn { seed: cut_at },
            CrashMode::LastWriteOnly,
            CrashMode::ProcessCrash,
        ] {
            let sim = SimStorage::new();
            let log = open(&sim);
            sim.cut_power_after(cut_at, mode);
            let mut acked = 0u64;
            for i in 0..10u64 {
                let ops = vec![
                    append("a", 1, &[&format!("a{i}")]),
                    append("b", 1, &[&format!("b{i}"), &format!("b{i}'")]),
                ];
                match log.transact(ops) {
                    Ok(_) => acked = i + 1,
                    Err(_) => break,
                }
            }
            drop(log);
            if (1..10).contains(&acked) {
                cut_midway += 1;
            }
            let image = sim.image().unwrap_or_else(|| sim.cut_power(mode));
            let log = open(&image);
            let a = payloads(&log, "a");
            let bs = payloads(&log, "b");
            assert_eq!(
                bs.len(),
                2 * a.len(),
                "cut at {cut_at} ({mode:?}): a={a:?} b={bs:?}"
            );
            assert!(
                a.len() as u64 >= acked,
                "cut at {cut_at} ({mode:?}): {acked} acknowledged, {} found",
                a.len()
            );
            for (i, p) in a.iter().enumerate() {
                assert_eq!(p, format!("a{i}").as_bytes());
                assert_eq!(bs[2 * i], format!("b{i}").as_bytes());
            }
        }
    }
    assert!(
        cut_midway > 20,
        "only {cut_midway} cuts fell among the transactions"
    );
}

#[test]
fn reads_stop_at_the_byte_limit_but_always_answer_one_record() {
    let log = open(&SimStorage::new());
    let big = "x".repeat(1000);
    log.append("s", t(1), &[big.as_str(), "a", "b"]).unwrap();
    log.append("s", t(1), &["c"]).unwrap();
    let opts = ReadOptions {
        max_bytes: 10,
        ..ReadOptions::default()
    };
    let first = log.read_with("s", 0, &opts).unwrap();
    assert_eq!(
        first.len(),
        1,
        "one record over the limit is still answered"
    );
    let rest = log.read_with("s", 1, &opts).unwrap();
    assert_eq!(
        rest.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let two = ReadOptions {
        max_bytes: 1001,
        ..ReadOptions::default()
    };
    assert_eq!(log.read_with("s", 0, &two).unwrap().len(), 2);
}

/// `write_deferred` (the server's one path for a single write) answers
/// what each op's own method answers, and decides it as that method does
/// (an `AppendAt` retry of a landed append answers its offset again, which
/// a transaction of one would refuse as a mismatch).
#[test]
fn write_deferred_answers_as_each_ops_own_method() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), opts()).unwrap();
    let write = |op: TxOp| rt.block_on(async { log.write_deferred(op).await?.await });
    assert_eq!(write(append("s", 5, &["a", "b"])).unwrap(), 0);
    let at = TxOp::AppendAt {
        stream: b("s"),
        token: t(5),
        expected_offset: 2,
        payloads: vec![b("c")].into(),
    };
    assert_eq!(write(at.clone()).unwrap(), 2);
    assert_eq!(
        write(at).unwrap(),
        2,
        "an exact retry answers the original offset"
    );
    let fence = |token| TxOp::Fence {
        stream: b("s"),
        token: t(token),
    };
    assert_eq!(write(fence(9)).unwrap(), 9);
    assert_eq!(
        write(fence(7)).unwrap_err().to_string(),
        log.fence("s", t(7)).unwrap_err().to_string()
    );
    assert_eq!(
        write(TxOp::Trim {
            stream: b("s"),
            token: t(9),
            before: 1,
        })
        .unwrap(),
        1
    );
    assert_eq!(
        write(TxOp::Delete {
            stream: b("s"),
            token: t(9),
        })
        .unwrap(),
        2
    );
    // Decided inside the lock (`write_deferred` leaves the lock-free
    // check to its caller), answered and counted as the fast path does.
    let stale_before = log.metrics().stale_rejections;
    assert!(matches!(
        write(append("s", 8, &["late"])),
        Err(Error::Stale {
            presented: 8,
            highest: 9
        })
    ));
    assert_eq!(log.metrics().stale_rejections, stale_before + 1);
    assert_eq!(log.stat("s").unwrap().next_offset, 3);
}
