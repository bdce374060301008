//! Random acquire / renew / release / clock / crash / reopen sequences,
//! checked for the coordinator's promises (at most one holder at a time,
//! tokens always increasing, the exact answers between crashes): the model
//! and its checks are in `fencelog::fuzzing::lease_model` (shared with the
//! `engine_model` fuzz target); this file draws the actions with proptest.

use fencelog::fuzzing::lease_model::{Action, run};
use fencelog::wal::CrashMode;
use proptest::prelude::*;

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..2usize, 0..3usize, 1..8u64, any::<bool>())
            .prop_map(|(n, o, ttl_s, fence)| Action::Acquire { n, o, ttl_s, fence }),
        4 => (0..2usize, 0..3usize, 1..8u64).prop_map(|(n, o, ttl_s)| Action::Renew { n, o, ttl_s }),
        2 => (0..2usize, 0..3usize).prop_map(|(n, o)| Action::Release { n, o }),
        5 => (0..6000u64).prop_map(|ms| Action::Advance { ms }),
        1 => prop_oneof![
            Just(CrashMode::LoseUnsynced),
            Just(CrashMode::ProcessCrash),
            any::<u64>().prop_map(|seed| CrashMode::Torn { seed }),
        ]
        .prop_map(|mode| Action::Crash { mode }),
        1 => (0..6u64).prop_map(|after| Action::ArmCut { after }),
        1 => Just(Action::Reopen),
        3 => Just(Action::Filler),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), ..ProptestConfig::default() })]

    #[test]
    fn one_holder_at_a_time_and_tokens_always_increase(actions in prop::collection::vec(action(), 1..80)) {
        run(actions);
    }
}

/// The number of cases: `default`, or `PROPTEST_CASES` for a deeper run.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
