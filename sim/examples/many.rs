//! Runs seeds `FENCELOG_SIM_FIRST..+FENCELOG_SIM_SEEDS` and prints a line per seed with a violation.
fn main() {
    let seeds = fencelog_sim::seeds_from_env(20);
    let t = std::time::Instant::now();
    let (mut bad, mut ops, mut acked) = (0, 0, 0);
    for &s in &seeds {
        let r = fencelog_sim::run(fencelog_sim::Config::random(s));
        ops += r.ops;
        acked += r.appends_acked;
        if std::env::var("HASHES").is_ok() {
            println!("{s} {:016x} {}", r.trace_hash, r.trace_events);
        }
        if !r.violations.is_empty() {
            bad += 1;
            println!(
                "seed {s} ({} nodes): {:?}\n   faults: {:?}",
                r.nodes, r.violations, r.faults
            );
        }
    }
    println!(
        "{} seeds, {bad} with violations, {ops} ops, {acked} appends acked, {:?}",
        seeds.len(),
        t.elapsed()
    );
}
