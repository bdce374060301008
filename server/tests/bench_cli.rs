//! `fencelog bench` through the real binary: in process and against a
//! running server, both workloads, a summary table and a clean exit.

mod common;

use std::process::Command;

use common::*;

fn bench(args: &[&str]) -> String {
    let defaults = ["--duration", "300ms", "--clients", "4", "--pipeline", "4"];
    bench_exactly(&[&defaults, args].concat())
}

/// `fencelog bench` with `args` and nothing else; its output, once it
/// succeeded.
fn bench_exactly(args: &[&str]) -> String {
    let out = Command::new(bin())
        .arg("bench")
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn in_process_appends_and_rejections() {
    let table = bench(&[]);
    assert!(table.contains("workload"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("append")), "{table}");
    assert!(table.lines().any(|l| l.starts_with("reject")), "{table}");
}

#[test]
fn against_a_server_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let json = bench(&["--addr", &server.addr.to_string(), "--json"]);
    let lines: Vec<&str> = json.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "{json}");
    assert!(
        lines.iter().any(|l| l.contains("\"workload\":\"reject\"")),
        "{json}"
    );
    // The server saw it: stale rejections counted.
    assert!(stale_rejections(&server) > 0);
}

/// The server's own count of stale rejections (`INFO log`).
fn stale_rejections(server: &ServerProcess) -> u64 {
    let info = String::from_utf8_lossy(server.client().cmd(&["INFO", "log"]).bulk()).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix("stale_rejections:"))
        .unwrap_or_else(|| panic!("{info}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_run_against_a_server_deletes_what_it_wrote() {
    //! `bench --addr` once left about 100 streams of records on the server
    //! per run.
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    bench(&["--addr", &server.addr.to_string()]);
    let mut c = server.client();
    let streams = c.cmd(&["LOG.STREAMS"]);
    assert!(!streams.array().is_empty());
    for s in streams.array() {
        let name = String::from_utf8_lossy(s.bulk()).to_string();
        let stat = c.cmd(&["LOG.STAT", &name]);
        // records is the 4th pair of the flat field/value array.
        assert_eq!(stat.array()[7], Value::Int(0), "{name}: {stat:?}");
    }
}

#[test]
fn prints_only_what_it_measured_and_compares_with_redis_in_the_same_run() {
    //! The table once printed fixed Redis and PostgreSQL figures from
    //! another day beside every result.
    let table = bench(&["--workload", "append"]);
    assert!(!table.to_lowercase().contains("elsewhere"), "{table}");
    assert!(
        !table.contains("PostgreSQL") && !table.contains("Redis"),
        "{table}"
    );
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        return missing("redis-server", "apt-get install redis-server");
    }
    let table = bench(&["--compare-redis", "--runs", "2"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("append"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains('x'), "a ratio: {table}");
    assert!(table.contains("redis CPU s/M"), "{table}");
    // Where the machine's CPU went, measured in the run: a row per side.
    let machine: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.contains("with every CPU busy"))
        .filter(|l| l.starts_with("append"))
        .collect();
    assert_eq!(machine.len(), 2, "{table}");
    assert!(
        machine.iter().all(|l| l.contains('%') && l.ends_with("/s")),
        "{table}"
    );
}

#[test]
fn the_threads_driver_counts_every_answer() {
    //! `--driver threads` (a thread per connection on a blocking socket)
    //! must send exactly the requests asked for and judge each answer as
    //! the event-loop driver does: every append accepted, every stale
    //! write refused.
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let addr = server.addr.to_string();
    let stdout = bench_exactly(&[
        "--addr",
        &addr,
        "--driver",
        "threads",
        "--requests",
        "1003",
        "--clients",
        "4",
        "--pipeline",
        "8",
        "--json",
    ]);
    let field = |line: &str, name: &str| -> u64 {
        let at = line.find(&format!("\"{name}\":")).unwrap() + name.len() + 3;
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for line in lines {
        assert_eq!(field(line, "requests"), 1003, "{line}");
        assert_eq!(field(line, "unexpected_errors"), 0, "{line}");
        let (accepted, stale) = (field(line, "accepted"), field(line, "stale"));
        if line.contains("\"workload\":\"append\"") {
            assert_eq!((accepted, stale), (1003, 0), "{line}");
        } else {
            assert_eq!((accepted, stale), (0, 1003), "{line}");
        }
    }
    // The server counted the refusals itself.
    assert!(stale_rejections(&server) >= 1003);
}

#[test]
fn the_threads_driver_refuses_a_pipeline_it_could_deadlock_on() {
    let out = Command::new(bin())
        .args(["bench", "--driver", "threads", "--pipeline", "257"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pipeline up to 256"));
}
