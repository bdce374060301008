//! What an operator meets first: flags as people type them, a failed
//! start that leaves nothing behind, errors that name flags, and the admin
//! commands Redis tools send (`CLIENT LIST`, `CLIENT KILL`, `DBSIZE`,
//! `CONFIG GET *`, `INFO`, `redis-cli --stat`, cluster probes).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// A reply's bulk strings, one per line (as redis-cli prints them).
fn lines(v: &Value) -> String {
    match v {
        Value::Bulk(b) => String::from_utf8_lossy(b).replace("\r\n", "\n"),
        Value::Array(items) => items.iter().map(lines).collect::<Vec<_>>().join("\n") + "\n",
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

fn serve_fails(args: &[&str]) -> String {
    let out = Command::new(bin())
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "it started with {args:?}");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn a_taken_port_leaves_no_data_directory_behind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("new/data");
    let err = serve_fails(&["--dir", dir.to_str().unwrap(), "--addr", &port]);
    assert!(err.contains("--addr"), "{err}");
    assert!(!parent.path().join("new").exists(), "{err}");
    // A taken metrics port too.
    let err = serve_fails(&[
        "--dir",
        dir.to_str().unwrap(),
        "--addr",
        "127.0.0.1:0",
        "--metrics-addr",
        &port,
    ]);
    assert!(err.contains("--metrics-addr"), "{err}");
    assert!(!parent.path().join("new").exists(), "{err}");
}

#[test]
fn errors_name_the_flags_not_internal_fields() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("d");
    let d = dir.to_str().unwrap();
    let err = serve_fails(&["--dir", d, "--addr", "0", "--segment-bytes", "1KiB"]);
    assert!(err.contains("--segment-bytes"), "{err}");
    assert!(!err.contains("segment_bytes"), "{err}");
    let err = serve_fails(&[
        "--dir",
        d,
        "--addr",
        "0",
        "--segment-bytes",
        "1MiB",
        "--max-payload",
        "1MiB",
    ]);
    assert!(
        err.contains("--max-payload") && err.contains("--segment-bytes"),
        "{err}"
    );
    let err = serve_fails(&["--dir", d, "--addr", "localhost:99999"]);
    assert!(err.contains("--addr"), "{err}");
    assert!(!dir.exists());
}

#[test]
fn addresses_ports_and_small_segments_as_people_type_them() {
    let dir = tempfile::tempdir().unwrap();
    // The default payload limit follows a small segment instead of failing.
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--port",
            "0",
            "--segment-bytes",
            "1MiB",
            "--max-open-segments",
            "8",
        ],
    );
    let mut c = server.client();
    assert_eq!(c.cmd(&["LOG.APPEND", "s", "1", "x"]).int(), 0);
    let config = lines(&c.cmd(&["CONFIG", "GET", "max-*"]));
    assert!(config.contains("max-open-segments\n8\n"), "{config}");
    assert!(config.contains("max-payload\n520192\n"), "{config}");
    drop(server);
    // A name and a port alone.
    for addr in ["localhost:0", "0"] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin())
            .args(["serve", "--addr", addr, "--dir"])
            .arg(dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
        while !line.contains("serving") {
            line.clear();
            let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
            assert!(n > 0, "no serving line for {addr}");
        }
        assert!(line.contains("127.0.0.1:"), "{line}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn admin_commands_answer_as_redis_tools_expect() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let mut c = server.client();
    c.cmd(&["CLIENT", "SETNAME", "admin"]);
    c.cmd(&["LOG.APPEND", "a", "1", "x"]);
    c.cmd(&["LOG.FENCE", "b", "3"]);
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 2);
    let mut other = server.client();
    other.cmd(&["CLIENT", "SETNAME", "victim"]);
    other.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "probe"]);
    let id = other.cmd(&["CLIENT", "ID"]).int();
    let list = match c.cmd(&["CLIENT", "LIST"]) {
        Value::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.contains("name=admin") && list.contains("cmd=client|list"),
        "{list}"
    );
    assert!(
        list.contains(&format!("id={id} ")) && list.contains("lib-name=probe"),
        "{list}"
    );
    assert_eq!(c.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]).int(), 1);
    assert_eq!(other.read(), None, "the killed client is closed");
    assert_eq!(c.cmd(&["CLIENT", "KILL", "ID", "999"]).int(), 0);
    assert!(
        c.cmd(&["CLIENT", "KILL", "127.0.0.1:1"])
            .err()
            .contains("No such client")
    );
    // Cluster clients learn where they are, in Redis' words.
    for sub in ["INFO", "SLOTS", "SHARDS", "NODES"] {
        assert_eq!(
            c.cmd(&["CLUSTER", sub]).err(),
            "ERR This instance has cluster support disabled"
        );
    }
    // Every flag of serve, under its own name.
    let config = lines(&c.cmd(&["CONFIG", "GET", "*"]));
    for flag in [
        "dir",
        "addr",
        "max-payload",
        "max-bulk-bytes",
        "max-args",
        "max-inline-bytes",
        "max-query-buffer",
        "client-output-buffer-limit",
        "maxmemory-clients",
        "max-read-bytes",
        "max-pipeline",
        "max-connections",
        "segment-bytes",
        "max-open-segments",
        "shutdown-grace-secs",
        "metrics-addr",
        "requirepass",
    ] {
        assert!(
            config.lines().any(|l| l == flag),
            "{flag} missing:\n{config}"
        );
    }
    // INFO: one server section; leases held now, refusals apart.
    let mut owner = server.client();
    owner.cmd(&["LEASE.ACQUIRE", "job", "w1", "60000"]);
    assert!(
        owner
            .cmd(&["LEASE.ACQUIRE", "job", "w2", "60000"])
            .err()
            .starts_with("HELD")
    );
    let info = lines(&c.cmd(&["INFO"]));
    assert_eq!(info.matches("# Server").count(), 1, "{info}");
    let has = |line: &str| info.lines().any(|l| l.trim_end() == line);
    assert!(has("leases_held:1"), "{info}");
    assert!(has("lease_acquisitions_refused:1"), "{info}");
    assert!(has("db0:keys=2,expires=0,avg_ttl=0"), "{info}");
    let only = lines(&c.cmd(&["INFO", "leases", "clients"]));
    assert!(
        only.contains("# Leases") && only.contains("# Clients"),
        "{only}"
    );
    assert!(!only.contains("# Server"), "{only}");
}

#[test]
fn redis_cli_stat_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    server.client().cmd(&["LOG.APPEND", "a", "1", "x"]);
    // Line-buffered: redis-cli does not flush a pipe before it is killed.
    let mut stat = match Command::new("stdbuf")
        .args([
            "-oL",
            "redis-cli",
            "-p",
            &server.addr.port().to_string(),
            "--stat",
            "-i",
            "0.2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(_) => return missing("redis-cli", "apt-get install redis-tools"),
    };
    std::thread::sleep(Duration::from_millis(900));
    stat.kill().unwrap();
    let out = stat.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("1 ")).collect();
    assert!(
        !rows.is_empty(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every column filled: no field missing (it prints huge negatives).
    assert!(!text.contains("-92233"), "{text}");
}
