//! Every refusal is a decision, and a replica that restarts decides as one
//! that never did. What broke: a replica restarted from a checkpoint held
//! every lease a full ttl from the checkpoint's clock while the others let
//! it expire, so it refused an acquisition the others granted, and every
//! later token, offset and record differed; and an acquisition past the live
//! lease limit was an error at apply, not a refusal, which stopped every
//! replica for good. Here two replicas apply the same random entries (every
//! kind of command, valid or not, every error the engine has, times that
//! sometimes run back, limits that change), one of them crashing and
//! recovering under every crash mode at random points and applying again
//! from where its disk says it stood; they must answer alike, end alike and
//! have the same digest at every position. A replica that did decide
//! differently is stopped by the next digest check. The second replica
//! applies each entry as a follower does, read from its bytes (appends in
//! place, `Proposal::read_each`), the first as its leader does, the
//! commands as given.

mod replica_common;

use bytes::Bytes;
use fencelog::wal::{CrashMode, SimStorage};
use fencelog::{Applied, Command, Error, GroupLimits, Log, LogPosition, Proposal, Token, TxOp};
use proptest::prelude::*;
use replica_common::open;

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

/// One step of a run: a command with its time, and whether the second
/// replica crashes after it (and how).
#[derive(Debug, Clone)]
struct Step {
    cmd: Cmd,
    /// Added to the previous entry's time (a negative one: a leader's
    /// stale reading, which must not move the clock back).
    dt_ms: i64,
    crash: Option<u8>,
}

#[derive(Debug, Clone)]
enum Cmd {
    Append(u8, u64, Vec<usize>),
    AppendAt(u8, u64, u64, usize),
    Fence(u8, u64),
    Trim(u8, u64, u64),
    Delete(u8, u64),
    Tx(u8, u64, u8, u64),
    Acquire(u8, u8, u64, bool),
    Renew(u8, u8, u64, u64),
    Release(u8, u8, u64),
    TakeOver,
    Limits(u64, u64, u32),
    Blank,
    /// A digest check of the position this many entries back.
    Check(u8),
}

fn name(i: u8) -> Bytes {
    match i % 6 {
        // An empty name: refused alike.
        5 => Bytes::new(),
        n => Bytes::from(format!("s{n}")),
    }
}

fn owner(i: u8) -> Bytes {
    match i % 4 {
        // Not printable ASCII without a space: refused alike.
        3 => Bytes::from_static(b"bad owner"),
        n => Bytes::from(format!("o{n}")),
    }
}

const TTLS: [u64; 7] = [0, 5, 50, 400, 3_000, 60_000, 100_000_000_000];

fn cmd() -> impl Strategy<Value = Cmd> {
    prop_oneof![
        (
            any::<u8>(),
            1..9u64,
            prop::collection::vec(0..12_000usize, 0..4)
        )
            .prop_map(|(s, tok, p)| Cmd::Append(s, tok, p)),
        (any::<u8>(), 1..9u64, 0..12u64, 0..40usize)
            .prop_map(|(s, tok, at, n)| Cmd::AppendAt(s, tok, at, n)),
        (any::<u8>(), 1..12u64).prop_map(|(s, tok)| Cmd::Fence(s, tok)),
        (any::<u8>(), 1..12u64, 0..14u64).prop_map(|(s, tok, b)| Cmd::Trim(s, tok, b)),
        (any::<u8>(), 1..12u64).prop_map(|(s, tok)| Cmd::Delete(s, tok)),
        (any::<u8>(), 1..12u64, any::<u8>(), 1..12u64)
            .prop_map(|(a, ta, b, tb)| Cmd::Tx(a, ta, b, tb)),
        (
            any::<u8>(),
            any::<u8>(),
            0..TTLS.len() as u64,
            any::<bool>()
        )
            .prop_map(|(n, o, ttl, f)| Cmd::Acquire(n, o, ttl, f)),
        (any::<u8>(), any::<u8>(), 1..12u64, 0..TTLS.len() as u64)
            .prop_map(|(n, o, tok, ttl)| Cmd::Renew(n, o, tok, ttl)),
        (any::<u8>(), any::<u8>(), 1..12u64).prop_map(|(n, o, tok)| Cmd::Release(n, o, tok)),
        Just(Cmd::TakeOver),
        (0..4u64, 0..4u64, 0..3u32).prop_map(|(l, s, p)| Cmd::Limits(l, s, p)),
        Just(Cmd::Blank),
        (1..6u8).prop_map(Cmd::Check),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        cmd(),
        prop_oneof![4 => 0..700i64, 1 => -300..0i64],
        prop::option::weighted(0.08, any::<u8>()),
    )
        .prop_map(|(cmd, dt_ms, crash)| Step { cmd, dt_ms, crash })
}

/// The engine command of `c`; a digest check names the reference
/// replica's digest at the position it looks back to.
fn command(c: &Cmd, index: u64, reference: &Log) -> Command {
    let payloads = |sizes: &[usize]| -> Vec<Bytes> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, n)| Bytes::from(vec![i as u8; *n]))
            .collect()
    };
    match c {
        Cmd::Append(s, tok, p) => Command::Write(TxOp::Append {
            stream: name(*s),
            token: t(*tok),
            payloads: payloads(p).into(),
        }),
        Cmd::AppendAt(s, tok, at, n) => Command::Write(TxOp::AppendAt {
            stream: name(*s),
            token: t(*tok),
            expected_offset: *at,
            payloads: vec![Bytes::from(vec![7u8; *n])].into(),
        }),
        Cmd::Fence(s, tok) => Command::Write(TxOp::Fence {
            stream: name(*s),
            token: t(*tok),
        }),
        Cmd::Trim(s, tok, before) => Command::Write(TxOp::Trim {
            stream: name(*s),
            token: t(*tok),
            before: *before,
        }),
        Cmd::Delete(s, tok) => Command::Write(TxOp::Delete {
            stream: name(*s),
            token: t(*tok),
        }),
        Cmd::Tx(a, ta, b, tb) => Command::Transact(vec![
            TxOp::Append {
                stream: name(*a),
                token: t(*ta),
                payloads: vec![Bytes::from_static(b"tx")].into(),
            },
            TxOp::Fence {
                stream: name(*b),
                token: t(*tb),
            },
        ]),
        Cmd::Acquire(n, o, ttl, fence) => Command::Acquire {
            name: name(*n),
            owner: owner(*o),
            ttl_ms: TTLS[*ttl as usize],
            fence: *fence,
        },
        Cmd::Renew(n, o, tok, ttl) => Command::Renew {
            name: name(*n),
            owner: owner(*o),
            token: t(*tok),
            ttl_ms: TTLS[*ttl as usize],
        },
        Cmd::Release(n, o, tok) => Command::Release {
            name: name(*n),
            owner: owner(*o),
            token: t(*tok),
        },
        Cmd::TakeOver => Command::TakeOver,
        // Small limits (sometimes unusable ones, refused alike): the live
        // lease and stream limits are reached.
        Cmd::Limits(leases, streams, payload) => Command::SetLimits(GroupLimits {
            max_live_leases: *leases,
            max_streams: 2 + streams,
            max_payload_bytes: [0, 1000, 16 << 10][*payload as usize],
            ..GroupLimits::default()
        }),
        Cmd::Blank => Command::Blank,
        Cmd::Check(back) => {
            let at = index.saturating_sub(u64::from(*back)).max(1);
            Command::Check {
                index: at,
                digest: reference.digest_at(at).unwrap_or(0),
            }
        }
    }
}

fn answer(a: &Applied) -> String {
    match a {
        Applied::Rejected(e) => format!("rejected: {e}"),
        other => format!("{other:?}"),
    }
}

fn crash_mode(b: u8) -> CrashMode {
    let seed = u64::from(b);
    match b % 6 {
        0 => CrashMode::ProcessCrash,
        1 => CrashMode::LoseUnsynced,
        2 => CrashMode::Torn { seed },
        3 => CrashMode::LastWriteOnly,
        4 => CrashMode::TornSequence { seed },
        _ => CrashMode::Prefix { bytes: seed * 97 },
    }
}

/// Everything a replica's state shows: streams, records, leases, digest.
fn state(log: &Log) -> String {
    let mut out = String::new();
    for s in log.streams() {
        let st = log.stat(&s).unwrap();
        let records: Vec<(u64, u64, usize)> = log
            .read(&s, st.start_offset, 10_000)
            .unwrap()
            .into_iter()
            .map(|r| (r.offset, r.token.get(), r.payload.len()))
            .collect();
        out.push_str(&format!("{s:?} {st:?} {records:?}\n"));
    }
    let now = log.group_clock_ms();
    for n in 0..6 {
        let info = log.lease_info_at(name(n), now).ok().flatten();
        out.push_str(&format!(
            "lease {n}: {:?}\n",
            info.map(|l| (l.owner, l.token, l.remaining))
        ));
    }
    out.push_str(&format!(
        "clock {now} limits {:?} digest {:?}\n",
        log.group_limits(),
        log.digest()
    ));
    out
}

/// Applies `cmd` at `at` as a follower does: encoded into an entry's
/// bytes, read back from them (appends in place) and applied.
async fn apply_read(
    replica: &Log,
    at: LogPosition,
    time_ms: u64,
    cmd: &Command,
) -> Result<Applied, String> {
    let mut bytes = Vec::new();
    Command::encode_all(std::slice::from_ref(cmd), &mut bytes);
    let bytes = Bytes::from(bytes);
    let mut read = Vec::new();
    Proposal::read_each(&bytes, |p| read.push((at, time_ms, p))).map_err(|e| e.to_string())?;
    let mut answers = replica
        .apply_replicated_many(&read)
        .await
        .map_err(|e| e.to_string())?;
    match (answers.pop(), answers.is_empty()) {
        (Some(a), true) => Ok(a),
        (a, _) => Err(format!("one answer expected, got {a:?} and {answers:?}")),
    }
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let reference = open(&SimStorage::new());
        let mut sim = SimStorage::new();
        let mut replica = open(&sim);
        let mut time: i64 = 1_000;
        // Per position: the entry and the reference's answer.
        let mut log: Vec<(LogPosition, u64, Command)> = Vec::new();
        let mut answers: Vec<String> = Vec::new();
        for (i, s) in steps.iter().enumerate() {
            time = (time + s.dt_ms).max(1);
            let at = LogPosition {
                term: 1 + i as u64 / 10,
                node: 1,
                index: i as u64 + 1,
            };
            let cmd = command(&s.cmd, at.index, &reference);
            let a = reference
                .apply_replicated(at, time as u64, &cmd)
                .await
                .map_err(|e| TestCaseError::fail(format!("reference at {i}: {e}")))?;
            answers.push(answer(&a));
            log.push((at, time as u64, cmd));
            let b = apply_read(&replica, at, time as u64, &log[i].2).await;
            let b = b.map_err(|e| TestCaseError::fail(format!("replica at {i}: {e}")))?;
            prop_assert_eq!(&answer(&b), &answers[i], "answers differ at {}", i);
            if let Some(mode) = s.crash {
                drop(replica);
                sim = sim.cut_power(crash_mode(mode));
                replica = open(&sim);
                // Raft applies again what this engine's disk lost.
                let from = replica.applied().map_or(0, |p| p.index) as usize;
                prop_assert!(from <= i + 1, "applied {} past {}", from, i + 1);
                for (j, (at, time, cmd)) in log.iter().enumerate().skip(from) {
                    let b = apply_read(&replica, *at, *time, cmd)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("replay at {j}: {e}")))?;
                    prop_assert_eq!(
                        &answer(&b),
                        &answers[j],
                        "after a crash, answers differ at {}",
                        j
                    );
                }
            }
        }
        prop_assert_eq!(state(&replica), state(&reference));
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn replicas_decide_alike_through_crashes(steps in prop::collection::vec(step(), 1..200)) {
        run(steps)?;
    }
}

/// Every kind of error a decision can meet is a refusal, answered the same
/// on two replicas; none stops a replica.
#[tokio::test]
async fn every_refusal_is_a_decision() {
    let (a, b) = (open(&SimStorage::new()), open(&SimStorage::new()));
    let mut cmds = vec![
        // Fencing: STALE, MISMATCH, TRIMMED (none here: a read), a trim
        // past the end.
        Command::Write(TxOp::Fence {
            stream: Bytes::from_static(b"s"),
            token: t(5),
        }),
        Command::Write(TxOp::Append {
            stream: Bytes::from_static(b"s"),
            token: t(4),
            payloads: vec![Bytes::from_static(b"late")].into(),
        }),
        Command::Write(TxOp::AppendAt {
            stream: Bytes::from_static(b"s"),
            token: t(5),
            expected_offset: 9,
            payloads: vec![Bytes::from_static(b"x")].into(),
        }),
        Command::Write(TxOp::Trim {
            stream: Bytes::from_static(b"s"),
            token: t(5),
            before: 99,
        }),
        // Invalid arguments: no payloads, an empty name, a bad owner, a ttl
        // out of bounds, an empty transaction, limits that cannot be.
        Command::Write(TxOp::Append {
            stream: Bytes::from_static(b"s"),
            token: t(5),
            payloads: vec![].into(),
        }),
        Command::Write(TxOp::Fence {
            stream: Bytes::new(),
            token: t(5),
        }),
        Command::Acquire {
            name: Bytes::from_static(b"l"),
            owner: Bytes::from_static(b"a b"),
            ttl_ms: 1000,
            fence: false,
        },
        Command::Acquire {
            name: Bytes::from_static(b"l"),
            owner: Bytes::from_static(b"a"),
            ttl_ms: 0,
            fence: false,
        },
        Command::Transact(vec![]),
        Command::SetLimits(GroupLimits {
            lease_ttl_min_ms: 10,
            lease_ttl_max_ms: 5,
            ..GroupLimits::default()
        }),
        // Too large: a payload over the group's limit.
        Command::Write(TxOp::Append {
            stream: Bytes::from_static(b"s"),
            token: t(5),
            payloads: vec![Bytes::from(vec![0u8; 2 << 20])].into(),
        }),
        // The live lease limit: one, then a second refused.
        Command::SetLimits(GroupLimits {
            max_live_leases: 1,
            max_streams: 3,
            ..GroupLimits::default()
        }),
        Command::Acquire {
            name: Bytes::from_static(b"l1"),
            owner: Bytes::from_static(b"a"),
            ttl_ms: 60_000,
            fence: false,
        },
        Command::Acquire {
            name: Bytes::from_static(b"l2"),
            owner: Bytes::from_static(b"a"),
            ttl_ms: 60_000,
            fence: false,
        },
        // HELD, LOST.
        Command::Acquire {
            name: Bytes::from_static(b"l1"),
            owner: Bytes::from_static(b"b"),
            ttl_ms: 60_000,
            fence: false,
        },
        Command::Renew {
            name: Bytes::from_static(b"l1"),
            owner: Bytes::from_static(b"b"),
            token: t(1),
            ttl_ms: 60_000,
        },
    ];
    // The stream limit (3 with "s" and the lease's): the fourth refused.
    for s in ["x1", "x2", "x3"] {
        cmds.push(Command::Write(TxOp::Fence {
            stream: Bytes::copy_from_slice(s.as_bytes()),
            token: t(1),
        }));
    }
    let mut refused = Vec::new();
    for (i, cmd) in cmds.iter().enumerate() {
        let at = LogPosition {
            term: 1,
            node: 1,
            index: i as u64 + 1,
        };
        let x = a.apply_replicated(at, 1_000 + i as u64, cmd).await.unwrap();
        let y = b.apply_replicated(at, 1_000 + i as u64, cmd).await.unwrap();
        assert_eq!(answer(&x), answer(&y));
        if let Applied::Rejected(e) = x {
            refused.push(e);
        }
    }
    let kinds = |f: fn(&Error) -> bool| refused.iter().filter(|e| f(e)).count();
    assert_eq!(
        kinds(|e| matches!(e, Error::Stale { .. })),
        1,
        "{refused:#?}"
    );
    assert_eq!(kinds(|e| matches!(e, Error::OffsetMismatch { .. })), 1);
    assert_eq!(kinds(|e| matches!(e, Error::TrimBeyondEnd { .. })), 1);
    assert!(kinds(|e| matches!(e, Error::Invalid { .. })) >= 5);
    assert!(
        kinds(|e| matches!(e, Error::TooLarge { .. })) >= 2,
        "{refused:#?}"
    );
    assert_eq!(kinds(|e| matches!(e, Error::TooManyLeases { .. })), 1);
    assert_eq!(kinds(|e| matches!(e, Error::Held { .. })), 1);
    assert_eq!(kinds(|e| matches!(e, Error::Lost)), 1);
    assert_eq!(a.digest(), b.digest());
}

/// A replica that decided differently is stopped by the next check, which
/// names the position.
#[tokio::test]
async fn a_replica_that_decided_differently_is_stopped_by_the_next_check() {
    let (a, b) = (open(&SimStorage::new()), open(&SimStorage::new()));
    let at = |index| LogPosition {
        term: 1,
        node: 1,
        index,
    };
    let fence = |tok| {
        Command::Write(TxOp::Fence {
            stream: Bytes::from_static(b"s"),
            token: t(tok),
        })
    };
    a.apply_replicated(at(1), 10, &fence(3)).await.unwrap();
    // b applies another command at the same position: it diverged.
    b.apply_replicated(at(1), 10, &fence(4)).await.unwrap();
    let (_, digest) = a.digest();
    let check = Command::Check { index: 1, digest };
    assert!(matches!(
        a.apply_replicated(at(2), 11, &check).await.unwrap(),
        Applied::Done
    ));
    match b.apply_replicated(at(2), 11, &check).await {
        Err(Error::Diverged { index: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// The case that made replicas disagree: a lease live at a checkpoint, the
/// replica restored from that checkpoint, then the lease decided on. The
/// restored replica must hold the lease until exactly when the others do.
#[tokio::test]
async fn a_replica_restored_from_a_checkpoint_lets_a_lease_expire_when_the_others_do() {
    let reference = open(&SimStorage::new());
    let sim = SimStorage::new();
    let replica = open(&sim);
    let mut entries = vec![Command::Acquire {
        name: Bytes::from_static(b"job"),
        owner: Bytes::from_static(b"a"),
        ttl_ms: 3_000,
        fence: false,
    }];
    // Enough records to start new segments (each opens with a checkpoint
    // holding the lease), the group's clock moving 100 ms an entry.
    for _ in 0..20 {
        entries.push(Command::Write(TxOp::Append {
            stream: Bytes::from_static(b"s"),
            token: t(1),
            payloads: vec![Bytes::from(vec![1u8; 12_000])].into(),
        }));
    }
    let at = |i: usize| LogPosition {
        term: 1,
        node: 1,
        index: i as u64 + 1,
    };
    for (i, cmd) in entries.iter().enumerate() {
        let time = 1_000 + 100 * i as u64;
        reference.apply_replicated(at(i), time, cmd).await.unwrap();
        replica.apply_replicated(at(i), time, cmd).await.unwrap();
    }
    assert!(replica.segments().len() > 2, "{:?}", replica.segments());
    replica.sync().unwrap();
    drop(replica);
    let replica = open(&sim.cut_power(CrashMode::LoseUnsynced));
    assert_eq!(replica.applied(), reference.applied());
    // The lease ran out at 4 000 ms on the group's clock: at 4 000 another
    // owner is granted on both, not held on the restored one.
    let n = entries.len();
    let acquire = Command::Acquire {
        name: Bytes::from_static(b"job"),
        owner: Bytes::from_static(b"b"),
        ttl_ms: 3_000,
        fence: false,
    };
    let x = reference
        .apply_replicated(at(n), 4_000, &acquire)
        .await
        .unwrap();
    let y = replica
        .apply_replicated(at(n), 4_000, &acquire)
        .await
        .unwrap();
    assert!(matches!(x, Applied::Grant { .. }), "{x:?}");
    assert_eq!(answer(&x), answer(&y));
    assert_eq!(reference.digest(), replica.digest());
}
