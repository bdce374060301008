//! A power cut must never leave a replica unable to start. A replica's
//! engine (`Options::replicated`, no sync per batch: the Raft log is the
//! durable copy) used to start a new sync epoch at every write although no
//! `fdatasync` happened, so after a torn sequence (a later write kept, an
//! earlier one lost, LazyFS `torn-seq`) recovery took the later write for
//! proof that the earlier one had been synced and refused to open: "corrupt
//! at byte 64: the entries end here, yet a valid entry (LSN 485) of a later
//! sync follows". Epochs now begin only where a sync really completed.
//!
//! Here: a power cut at every mutating operation of a replica applying
//! entries (with a sync now and then), under every crash mode of the
//! simulated storage. The engine always opens, its `applied()` position is
//! at or below what was written and at or above the last sync, and applying
//! the entries after it again reproduces the reference state.

mod replica_common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use fencelog::wal::{CrashMode, SimStorage, Storage};
use fencelog::{Applied, Command, Log, LogPosition, ManualClock, Token, TxOp};
use replica_common::{open, opts};

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A deterministic stream of commands, with its entries' positions and
/// leader clocks: two terms, the second led by a node whose clock is far
/// behind the first's.
fn entries() -> Vec<(LogPosition, u64, Command)> {
    let mut out = Vec::new();
    let mut index = 0;
    let mut push = |term: u64, time: u64, cmd: Command| {
        index += 1;
        out.push((
            LogPosition {
                term,
                node: term,
                index,
            },
            time,
            cmd,
        ));
    };
    push(1, 1_000_000, Command::TakeOver);
    push(
        1,
        1_000_010,
        Command::Acquire {
            name: b("job"),
            owner: b("a"),
            ttl_ms: 5_000,
            fence: true,
        },
    );
    for i in 0..300u64 {
        push(
            1,
            1_000_020 + i,
            Command::Write(TxOp::Append {
                stream: b(&format!("s{}", i % 7)),
                token: t(1 + i % 3),
                payloads: vec![Bytes::from(vec![i as u8; 200])].into(),
            }),
        );
    }
    push(
        1,
        1_000_400,
        Command::Write(TxOp::Fence {
            stream: b("s1"),
            token: t(50),
        }),
    );
    // Stale now: rejected alike everywhere.
    push(
        1,
        1_000_401,
        Command::Write(TxOp::Append {
            stream: b("s1"),
            token: t(49),
            payloads: vec![b("late")].into(),
        }),
    );
    push(
        1,
        1_000_402,
        Command::Transact(vec![
            TxOp::Append {
                stream: b("s2"),
                token: t(9),
                payloads: vec![b("x")].into(),
            },
            TxOp::Trim {
                stream: b("s3"),
                token: t(9),
                before: 10,
            },
        ]),
    );
    // Term 2: a leader whose clock reads 40 where the old one read 1e6.
    push(2, 40, Command::TakeOver);
    push(
        2,
        41,
        Command::Acquire {
            name: b("job"),
            owner: b("b"),
            ttl_ms: 1_000,
            fence: false,
        },
    );
    // 5 s later on the new leader's clock: the old lease (restarted at the
    // take-over, 5 s ttl) has just expired.
    push(
        2,
        40 + 5_001,
        Command::Acquire {
            name: b("job"),
            owner: b("b"),
            ttl_ms: 1_000,
            fence: true,
        },
    );
    push(
        2,
        5_100,
        Command::Renew {
            name: b("job"),
            owner: b("b"),
            token: t(2),
            ttl_ms: 9_000,
        },
    );
    out
}

fn answer(a: &Applied) -> String {
    match a {
        Applied::Rejected(e) => format!("rejected: {e}"),
        other => format!("{other:?}"),
    }
}

async fn apply_all(log: &Log, entries: &[(LogPosition, u64, Command)]) -> Vec<String> {
    let mut answers = Vec::new();
    for (at, time, cmd) in entries {
        answers.push(answer(
            &log.apply_replicated(*at, *time, cmd).await.unwrap(),
        ));
    }
    answers
}

fn state(log: &Log) -> Vec<String> {
    let mut out = Vec::new();
    for s in log.streams() {
        let st = log.stat(&s).unwrap();
        let records: Vec<(u64, u64, Vec<u8>)> = log
            .read(&s, st.start_offset, 10_000)
            .unwrap()
            .into_iter()
            .map(|r| (r.offset, r.token.get(), r.payload.to_vec()))
            .collect();
        out.push(format!("{s:?} {st:?} {records:?}"));
    }
    out.push(format!(
        "{:?}",
        log.lease_info("job").unwrap().map(|l| (l.owner, l.token))
    ));
    out
}

/// Applies `entries` in batches of uneven sizes, syncing after the batch
/// that ends at `sync_at`; stops at the first error. Answers how many
/// entries were handed to the engine and how many were synced.
async fn apply_until_failure(
    log: &Log,
    entries: &[(LogPosition, u64, Command)],
    sync_at: usize,
) -> (usize, usize) {
    let mut given = 0;
    let mut synced = 0;
    let mut rest = entries;
    for size in [1usize, 7, 64, 3, 20].iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (now, later) = rest.split_at((*size).min(rest.len()));
        given += now.len();
        if log.apply_replicated_many(now).await.is_err() {
            return (given, synced);
        }
        rest = later;
        if given >= sync_at && synced == 0 {
            if log.sync().is_err() {
                return (given, synced);
            }
            synced = given;
        }
    }
    (given, synced)
}

fn modes(unsynced: u64) -> Vec<CrashMode> {
    let mut m = vec![
        CrashMode::ProcessCrash,
        CrashMode::LoseUnsynced,
        CrashMode::LastWriteOnly,
    ];
    for seed in 0..6 {
        m.push(CrashMode::Torn { seed });
        m.push(CrashMode::TornSequence { seed });
    }
    let mut bytes = 0;
    while bytes <= unsynced {
        m.push(CrashMode::Prefix { bytes });
        bytes += 1 << 12;
    }
    m
}

#[tokio::test]
async fn a_replica_opens_after_a_power_cut_at_any_operation_in_any_crash_mode() {
    let entries = entries();
    let reference = open(&SimStorage::new());
    apply_all(&reference, &entries).await;
    let want = state(&reference);
    let mut points = 0;
    for n in 0.. {
        let sim = SimStorage::new();
        let log = open(&sim);
        sim.cut_power_after(n, CrashMode::ProcessCrash);
        let (given, synced) = apply_until_failure(&log, &entries, 150).await;
        drop(log);
        let Some(image) = sim.image() else {
            assert_eq!(given, entries.len());
            break;
        };
        points += 1;
        for mode in modes(image.unsynced_bytes()) {
            let what = format!("cut at operation {n} ({given} given, {synced} synced), {mode:?}");
            let storage: Arc<dyn Storage> = Arc::new(image.cut_power(mode));
            let log = Log::open_on(
                storage,
                Arc::new(ManualClock::default()),
                Path::new("/db"),
                opts(),
            )
            .unwrap_or_else(|e| panic!("{what}: the replica cannot start: {e}"));
            let applied = log.applied().map_or(0, |p| p.index) as usize;
            assert!(applied <= given, "{what}: applied {applied}");
            assert!(
                applied >= synced,
                "{what}: applied {applied}, synced entries lost"
            );
            apply_all(&log, &entries[applied..]).await;
            assert_eq!(state(&log), want, "{what}: applied {applied}");
        }
    }
    assert!(points > 10, "only {points} cut points");
}
