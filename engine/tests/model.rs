//! The engine against a plain in-memory model of SPEC §2–3, through random
//! operations on a few streams, power cuts at random points and reopens:
//! the model and its checks are in `fencelog::fuzzing::stream_model`
//! (shared with the `engine_model` fuzz target); this file draws the
//! actions with proptest.

use fencelog::fuzzing::stream_model::{Action, STREAMS, run};
use fencelog::wal::CrashMode;
use proptest::prelude::*;

fn mode() -> impl Strategy<Value = CrashMode> {
    prop_oneof![
        Just(CrashMode::LoseUnsynced),
        Just(CrashMode::LastWriteOnly),
        Just(CrashMode::ProcessCrash),
        any::<u64>().prop_map(|seed| CrashMode::Torn { seed }),
        any::<u64>().prop_map(|seed| CrashMode::TornSequence { seed }),
    ]
}

fn payloads() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::collection::vec(any::<u8>(), 0..40),
            1 => prop::collection::vec(any::<u8>(), 2000..12000),
        ],
        1..4,
    )
}

fn action() -> impl Strategy<Value = Action> {
    let s = 0..STREAMS.len();
    let t = 1u64..10;
    prop_oneof![
        30 => (s.clone(), t.clone(), payloads()).prop_map(|(s, t, payloads)| Action::Append { s, t, payloads }),
        10 => (s.clone(), t.clone(), -2i64..2, payloads())
            .prop_map(|(s, t, delta, payloads)| Action::AppendAt { s, t, delta, payloads }),
        3 => Just(Action::Retry),
        6 => (s.clone(), t.clone()).prop_map(|(s, t)| Action::Fence { s, t }),
        5 => (s.clone(), t.clone(), 0.0f64..1.2).prop_map(|(s, t, frac)| Action::Trim { s, t, frac }),
        2 => (s.clone(), t.clone()).prop_map(|(s, t)| Action::Delete { s, t }),
        10 => (s, 0.0f64..1.1, 1u32..50).prop_map(|(s, frac, max)| Action::Read { s, frac, max }),
        2 => mode().prop_map(|mode| Action::Cut { mode }),
        2 => (0u64..40, mode()).prop_map(|(after, mode)| Action::ArmCut { after, mode }),
        2 => Just(Action::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(64), ..ProptestConfig::default() })]

    #[test]
    fn the_engine_follows_the_model_through_crashes(actions in prop::collection::vec(action(), 1..120)) {
        run(actions);
    }
}

/// What the `engine_model` fuzzer found, replayed by the plain test
/// command too (CI's fuzz stage replays the seeds as well, but only where
/// cargo-fuzz builds), through the fuzz target's own entry point.
#[test]
fn the_engine_model_fuzz_seeds_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/engine_model");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        eprintln!("replaying {}", path.display());
        fencelog::fuzzing::engine_model(&std::fs::read(&path).unwrap());
        replayed += 1;
    }
    assert!(replayed >= 3, "only {replayed} seeds in {}", dir.display());
}

/// The number of cases: `default`, or `PROPTEST_CASES` for a deeper run.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
