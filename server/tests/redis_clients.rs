//! Redis' own tools and a Redis client library are fencelog's clients,
//! unmodified: redis-cli (RESP2 and RESP3), redis-benchmark with and without
//! pipelining, and redis-py, which opens every connection with HELLO 3.
//!
//! CI installs them (`.ci/run`: redis-tools from Debian, redis-py from PyPI
//! into a virtual environment under the target directory); a missing one
//! fails the test in CI and is skipped with the reason printed elsewhere.

mod common;

use std::process::Command;

use common::*;

#[test]
fn redis_cli_speaks_to_fencelog() {
    if !have("redis-cli", "apt-get install redis-tools") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let a = server.addr;
    assert_eq!(redis_cli(a, &["PING"]).trim(), "PONG");
    assert_eq!(
        redis_cli(a, &["LOG.APPEND", "orders", "42", "first", "second"]).trim(),
        "0"
    );
    assert_eq!(
        redis_cli(a, &["LOG.APPEND", "orders", "41", "late"]).trim(),
        "STALE token 41 is below the highest accepted token 42"
    );
    let read = redis_cli(a, &["LOG.READ", "orders", "0"]);
    assert_eq!(
        read.lines().collect::<Vec<_>>(),
        ["0", "42", "first", "1", "42", "second"]
    );
    // RESP3: the stat is a map.
    let stat = redis_cli(a, &["-3", "LOG.STAT", "orders"]);
    assert!(stat.lines().any(|l| l == "highest_token 42"), "{stat}");
    assert!(redis_cli(a, &["INFO", "log"]).contains("stale_rejections:1"));
}

#[test]
fn redis_benchmark_appends_durably_with_and_without_pipelining() {
    if !have("redis-benchmark", "apt-get install redis-tools") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let port = server.addr.port().to_string();
    for (stream, pipeline) in [("plain", "1"), ("piped", "16")] {
        let out = Command::new("redis-benchmark")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-n",
                "2000",
                "-c",
                "10",
                "-P",
                pipeline,
                "-q",
            ])
            .args([
                "LOG.APPEND",
                stream,
                "1",
                "a-hundred-byte-record-would-go-here",
            ])
            .output()
            .expect("redis-benchmark must be installed (apt-get install redis-tools)");
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("requests per second"), "{text}");
        let mut c = server.client();
        assert_eq!(
            c.cmd(&["LOG.STAT", stream]).array()[3].int(),
            2000,
            "every request appended one record"
        );
    }
}

#[test]
fn redis_py_with_resp3_and_pipelines() {
    let Some(python) = python_with_redis_py() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &["--requirepass", "pw"]);
    let script = format!(
        r#"
import redis, sys
r = redis.Redis(host="127.0.0.1", port={port}, password="pw", protocol=3)
assert r.execute_command("LOG.APPEND", "py", 7, b"one") == 0
try:
    r.execute_command("LOG.APPEND", "py", 6, b"late")
    sys.exit("a stale write was accepted")
except redis.exceptions.ResponseError as e:
    assert str(e) == "STALE token 6 is below the highest accepted token 7", str(e)
p = r.pipeline(transaction=False)
for i in range(50):
    p.execute_command("LOG.APPEND", "py", 7, b"r%d" % i)
offsets = p.execute()
assert offsets == list(range(1, 51)), offsets
stat = r.execute_command("LOG.STAT", "py")
assert stat[b"next_offset"] == 51, stat
grant = r.execute_command("LEASE.ACQUIRE", "py", "worker", 10000, "FENCE")
assert grant[0] > 7 and grant[1] == 10000, grant
assert r.execute_command("LEASE.INFO", "nobody") is None
records = r.execute_command("LOG.READ", "py", 49, "COUNT", 5)
assert [x[2] for x in records] == [b"r48", b"r49"], records
print("ok")
"#,
        port = server.addr.port()
    );
    assert_eq!(run_python(&python, &script).trim(), "ok");
}
