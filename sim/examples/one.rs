//! Runs one seed and prints its report: `cargo run --profile ci -p fencelog-sim --example one -- SEED [3|5]`.
fn main() {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut cfg = fencelog_sim::Config::random(seed);
    if let Some(n) = args.next().and_then(|s| s.parse().ok()) {
        cfg.nodes = n;
    }
    cfg.keep_trace = std::env::var("TRACE").is_ok();
    let t = std::time::Instant::now();
    let r = fencelog_sim::run(cfg);
    println!(
        "seed {} nodes {} ops {} acked {} grants {} hash {:016x} events {} simulated {:?} wall {:?}",
        r.seed,
        r.nodes,
        r.ops,
        r.appends_acked,
        r.grants,
        r.trace_hash,
        r.trace_events,
        r.simulated,
        t.elapsed()
    );
    for l in &r.trace {
        println!("{l}");
    }
    for f in &r.faults {
        println!("  fault: {f}");
    }
    for v in &r.violations {
        println!("  VIOLATION: {v}");
    }
}
