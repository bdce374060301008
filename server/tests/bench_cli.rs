//! `fencelog bench` through the real binary: in process and against a
//! running server, both workloads, a summary table and a clean exit.

mod common;

use std::process::Command;

use common::*;

fn bench(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("bench")
        .args(["--duration", "300ms", "--clients", "4", "--pipeline", "4"])
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
    let info = redis_cli(server.addr, &["INFO", "log"]);
    let stale: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("stale_rejections:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(stale > 0, "{info}");
}
