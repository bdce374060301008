//! Deterministic simulation of a Raft group (issue 20): real nodes on a
//! simulated network, disks and clocks, one seed per run, the history
//! checker and the replicas' digests over every run.
//!
//! `FENCELOG_SIM_SEEDS=n` runs `n` seeds (default 200, split over two
//! tests), from `FENCELOG_SIM_FIRST` (default 1); `FENCELOG_SIM_SEED=n`
//! replays one (docs/TESTING.md, "Deterministic simulation").

use fencelog_sim::{Config, Report, Scenario, run, seeds_from_env};

fn failed(r: &Report) -> String {
    format!(
        "seed {} ({} nodes) failed (a random run replays with FENCELOG_SIM_SEED={}: docs/TESTING.md)\n  faults: {:?}\n  violations:\n    {}",
        r.seed,
        r.nodes,
        r.seed,
        r.faults,
        r.violations.join("\n    ")
    )
}

/// Runs the seeds of this share (`part` of `parts`) and fails listing
/// every seed with a violation.
fn run_share(part: u64, parts: u64) {
    let seeds = seeds_from_env(200);
    let single = seeds.len() == 1;
    let mut failures = Vec::new();
    let (mut ops, mut acked, mut n) = (0, 0, 0);
    for s in seeds {
        // A single replayed seed runs in the first share only.
        if (single && part != 0) || (!single && s % parts != part) {
            continue;
        }
        let r = run(Config::random(s));
        n += 1;
        ops += r.ops;
        acked += r.appends_acked;
        if !r.violations.is_empty() {
            failures.push(failed(&r));
        }
    }
    eprintln!("share {part}: {n} seeds, {ops} operations, {acked} appends acknowledged");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn seeds() {
    run_share(0, 2);
}

#[test]
fn seeds_second_half() {
    run_share(1, 2);
}

/// Seeds that once failed, replayed on every run. (A seed's run depends
/// on the simulator's code as well: these replay the fault mixes that
/// found a bug, not necessarily the same schedule after the simulator
/// changed.)
///
/// - 28: a pre-vote refused for a candidate with the longer log and an
///   older term; with a replaced disk not yet re-added, no leader ever
///   again (`cluster/src/election.rs`).
/// - 9, 34: the simulator replaced a disk while a membership change was
///   under way (9) or a voter was out (34): a majority lost, which no
///   group survives; disks are replaced only while the group is settled.
/// - 222, 1055 (the first long run, 2000 seeds): a node campaigned on
///   pre-votes granted before a leader was elected, and deposed it (and
///   the simulator read the final streams only once, so the move made
///   the run fail): `election.rs` checks the silence again after the
///   pre-votes, the simulator reads again.
#[test]
fn regressions() {
    for seed in [9, 28, 34, 222, 1055] {
        let r = run(Config::random(seed));
        assert!(r.violations.is_empty(), "{}", failed(&r));
    }
}

/// The same seed twice: the same trace (every message with its fate,
/// every fault, every client's answer, with simulated times).
#[test]
fn a_seed_replays_exactly() {
    for (seed, nodes) in [(7, 5), (11, 3)] {
        let cfg = Config {
            nodes,
            ..Config::random(seed)
        };
        let a = run(cfg.clone());
        let b = run(cfg);
        assert!(a.trace_events > 100, "a run that did little: {a:?}");
        assert_eq!(
            (a.trace_hash, a.trace_events, a.ops),
            (b.trace_hash, b.trace_events, b.ops),
            "seed {seed} ran differently twice"
        );
    }
}

/// A follower's disk replaced (a new incarnation), the other follower
/// lagging, the leader killed before the group re-added the new disk:
/// no leader can be elected without the old one (the new incarnation
/// does not vote), and nothing acknowledged is lost.
#[test]
fn wipe_a_follower_then_kill_the_leader_before_the_re_add() {
    for seed in 1..=4 {
        let r = run(Config {
            nodes: 3,
            scenario: Scenario::WipeThenKillLeader,
            ..Config::random(seed)
        });
        assert!(
            r.faults
                .iter()
                .any(|f| f.contains("killed before the re-add")),
            "{r:?}"
        );
        assert!(r.appends_acked > 0, "{r:?}");
        assert!(r.violations.is_empty(), "{}", failed(&r));
    }
}

/// 50 whole-group power cuts (every disk cut at once, each with a crash
/// mode of the seed's): every node starts every time, a leader comes
/// back, nothing acknowledged is lost, the replicas agree.
#[test]
fn fifty_whole_group_power_cuts() {
    let r = run(Config {
        nodes: 3,
        scenario: Scenario::GroupPowerCuts(50),
        ..Config::random(2026)
    });
    let cuts = r
        .faults
        .iter()
        .filter(|f| f.starts_with("group power cut"))
        .count();
    assert_eq!(cuts, 50);
    assert!(r.appends_acked > 0, "{r:?}");
    assert!(r.violations.is_empty(), "{}", failed(&r));
}
