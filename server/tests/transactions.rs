//! MULTI / EXEC / DISCARD against the real binary, over a raw socket.
//!
//! What broke: the server rejected MULTI, ran the queued commands at once
//! and then rejected EXEC, so a client library's transaction raised an
//! error while its appends had landed, and a retry wrote them twice. Now a
//! transaction's writes are decided together and reach the log as one
//! entry: after a restart (SIGKILL), an accepted transaction is there whole
//! and a rejected one left nothing.

mod common;

use common::*;

fn start(dir: &std::path::Path) -> ServerProcess {
    ServerProcess::start(dir, &["--max-payload", "1024"])
}

fn queued() -> Value {
    Value::Simple("QUEUED".into())
}

fn ok() -> Value {
    Value::Simple("OK".into())
}

const NOT_APPLIED: &str = "EXECABORT the transaction was not applied";

/// Sends every command in one write, as client libraries send a
/// transaction, and reads one reply per command.
fn pipeline(c: &mut Client, commands: &[&[&str]]) -> Vec<Value> {
    let mut bytes = Vec::new();
    for args in commands {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        bytes.extend(Client::encode(&args));
    }
    c.send_raw(&bytes);
    commands
        .iter()
        .map(|_| c.read().expect("a reply"))
        .collect()
}

fn next_offset(c: &mut Client, stream: &str) -> i64 {
    c.cmd(&["LOG.STAT", stream]).array()[3].int()
}

fn highest(c: &mut Client, stream: &str) -> i64 {
    c.cmd(&["LOG.STAT", stream]).array()[1].int()
}

#[test]
fn a_stale_token_in_the_middle_applies_nothing_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    assert_eq!(c.cmd(&["LOG.FENCE", "b", "9"]).int(), 9);
    let replies = pipeline(
        &mut c,
        &[
            &["MULTI"],
            &["LOG.APPEND", "a", "5", "first"],
            &["LOG.APPEND", "b", "5", "stale"],
            &["LOG.APPEND", "c", "5", "third"],
            &["EXEC"],
        ],
    );
    assert_eq!(replies[..4], [ok(), queued(), queued(), queued()]);
    let exec = replies[4].array();
    assert_eq!(exec.len(), 3);
    assert_eq!(exec[0].err(), NOT_APPLIED);
    assert_eq!(
        exec[1].err(),
        "STALE token 5 is below the highest accepted token 9"
    );
    assert_eq!(exec[2].err(), NOT_APPLIED);
    // The connection goes on, outside any transaction.
    assert_eq!(c.cmd(&["LOG.APPEND", "d", "1", "after"]).int(), 0);
    drop(server); // SIGKILL
    let server = start(dir.path());
    let mut c = server.client();
    for stream in ["a", "c"] {
        assert_eq!(next_offset(&mut c, stream), 0, "{stream}");
        assert_eq!(highest(&mut c, stream), 0, "{stream}");
    }
    assert_eq!(next_offset(&mut c, "b"), 0);
    assert_eq!(highest(&mut c, "b"), 9);
    assert_eq!(next_offset(&mut c, "d"), 1);
}

#[test]
fn an_accepted_transaction_lands_whole_across_streams_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    let replies = pipeline(
        &mut c,
        &[
            &["MULTI"],
            &["LOG.APPEND", "a", "5", "x", "y"],
            &["LOG.FENCE", "c", "7"],
            &["LOG.APPENDAT", "b", "5", "0", "z"],
            &["LOG.TRIM", "a", "5", "1"],
            &["EXEC"],
        ],
    );
    assert_eq!(replies[0], ok());
    assert_eq!(
        replies[5],
        Value::Array(vec![
            Value::Int(0),
            Value::Int(7),
            Value::Int(0),
            Value::Int(1)
        ])
    );
    drop(server); // SIGKILL: the answer came once the entry was durable.
    let server = start(dir.path());
    let mut c = server.client();
    let a = c.cmd(&["LOG.READ", "a", "1"]);
    assert_eq!(a.array().len(), 1);
    assert_eq!(a.array()[0].array()[2].bulk(), b"y");
    assert_eq!(
        c.cmd(&["LOG.READ", "a", "0"]).err(),
        "TRIMMED offset 0 is below the start offset 1"
    );
    assert_eq!(
        c.cmd(&["LOG.READ", "b", "0"]).array()[0].array()[2].bulk(),
        b"z"
    );
    assert_eq!(highest(&mut c, "c"), 7);
}

#[test]
fn every_rejection_kind_aborts_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    c.cmd(&["LOG.APPEND", "s", "3", "r0", "r1"]);
    let big = "x".repeat(2000);
    let cases: &[(&[&str], &str)] = &[
        (
            &["LOG.APPENDAT", "s", "3", "5", "p"],
            // The first op moved the next offset to 3.
            "MISMATCH expected offset 5 but the next offset is 3",
        ),
        (&["LOG.APPEND", "s", "3", &big], "TOOBIG"),
        (&["LOG.TRIM", "s", "3", "9"], "ERR"),
        (
            &["LOG.APPEND", "s", "2", "p"],
            "STALE token 2 is below the highest accepted token 3",
        ),
    ];
    for (bad, expected) in cases {
        let replies = pipeline(
            &mut c,
            &[
                &["MULTI"],
                &["LOG.APPEND", "s", "3", "ok"],
                bad,
                &["LOG.FENCE", "t", "4"],
                &["EXEC"],
            ],
        );
        let exec = replies[4].array();
        assert_eq!(exec[0].err(), NOT_APPLIED, "{bad:?}");
        assert!(exec[1].err().starts_with(expected), "{bad:?}: {exec:?}");
        assert_eq!(exec[2].err(), NOT_APPLIED, "{bad:?}");
    }
    // A token lower than one earlier in the same transaction is refused too.
    let replies = pipeline(
        &mut c,
        &[
            &["MULTI"],
            &["LOG.FENCE", "u", "8"],
            &["LOG.APPEND", "u", "7", "p"],
            &["EXEC"],
        ],
    );
    assert!(replies[3].array()[1].err().starts_with("ERR"));
    assert_eq!(next_offset(&mut c, "s"), 2);
    assert_eq!(highest(&mut c, "t"), 0);
    assert_eq!(highest(&mut c, "u"), 0);
}

#[test]
fn queuing_errors_discard_the_transaction_as_in_redis() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    let refused: &[&[&str]] = &[
        &["LOG.APPEND", "s", "1"],
        &["LOG.APPEND", "s", "0", "token zero"],
        &["LOG.APPEND", "s", "x", "not a number"],
        &["NOSUCH", "command"],
        &["LEASE.ACQUIRE", "lock", "me", "1000"],
        &["LEASE.RENEW", "lock", "me", "1", "1000"],
        &["LEASE.RELEASE", "lock", "me", "1"],
        &["AUTH", "pw"],
        &["HELLO", "3"],
    ];
    for bad in refused {
        let replies = pipeline(
            &mut c,
            &[
                &["MULTI"],
                &["LOG.APPEND", "s", "1", "never"],
                bad,
                &["LOG.APPEND", "s", "1", "never either"],
                &["EXEC"],
            ],
        );
        assert_eq!(replies[1], queued(), "{bad:?}");
        assert!(
            matches!(replies[2], Value::Error(_)),
            "{bad:?}: {replies:?}"
        );
        assert_eq!(
            replies[4].err(),
            "EXECABORT Transaction discarded because of previous errors.",
            "{bad:?}"
        );
    }
    assert_eq!(next_offset(&mut c, "s"), 0);
    assert_eq!(c.cmd(&["LEASE.INFO", "lock"]), Value::Null);
    let lease = pipeline(
        &mut c,
        &[&["MULTI"], &["LEASE.ACQUIRE", "lock", "me", "1000"]],
    );
    assert!(
        lease[1]
            .err()
            .contains("not allowed inside a transaction: leases are not part of its atomic entry"),
        "{lease:?}"
    );
    c.cmd(&["DISCARD"]);
}

#[test]
fn transaction_commands_answer_as_redis_does() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    assert_eq!(c.cmd(&["EXEC"]).err(), "ERR EXEC without MULTI");
    assert_eq!(c.cmd(&["DISCARD"]).err(), "ERR DISCARD without MULTI");
    assert!(
        c.cmd(&["WATCH", "s"])
            .err()
            .starts_with("ERR WATCH is not supported")
    );
    assert_eq!(c.cmd(&["UNWATCH"]), ok());
    assert_eq!(c.cmd(&["MULTI"]), ok());
    assert_eq!(c.cmd(&["MULTI"]).err(), "ERR MULTI calls can not be nested");
    assert_eq!(
        c.cmd(&["WATCH", "s"]).err(),
        "ERR WATCH inside MULTI is not allowed"
    );
    assert_eq!(c.cmd(&["LOG.APPEND", "s", "1", "x"]), queued());
    assert_eq!(c.cmd(&["PING"]), queued());
    assert_eq!(c.cmd(&["DISCARD"]), ok());
    assert_eq!(next_offset(&mut c, "s"), 0);
    // An empty transaction answers an empty array.
    assert_eq!(c.cmd(&["MULTI"]), ok());
    assert_eq!(c.cmd(&["EXEC"]), Value::Array(Vec::new()));
    // Nested MULTI does not discard; the transaction still runs.
    let replies = pipeline(
        &mut c,
        &[
            &["MULTI"],
            &["LOG.APPEND", "s", "1", "x"],
            &["MULTI"],
            &["PING"],
            &["UNWATCH"],
            &["EXEC"],
        ],
    );
    assert_eq!(
        replies[5],
        Value::Array(vec![Value::Int(0), Value::Simple("PONG".into()), ok()])
    );
}

#[test]
fn reads_before_the_first_write_see_the_state_before_and_after_see_it_all() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    c.cmd(&["LOG.APPEND", "s", "1", "old"]);
    let replies = pipeline(
        &mut c,
        &[
            &["MULTI"],
            &["LOG.READ", "s", "0"],
            &["LOG.APPEND", "s", "1", "new1"],
            &["LOG.READ", "s", "0"],
            &["LOG.APPEND", "s", "1", "new2"],
            &["EXEC"],
        ],
    );
    let exec = replies[5].array();
    let payloads = |v: &Value| -> Vec<Vec<u8>> {
        v.array()
            .iter()
            .map(|r| r.array()[2].bulk().to_vec())
            .collect()
    };
    assert_eq!(payloads(&exec[0]), [b"old".to_vec()]);
    assert_eq!(exec[1].int(), 1);
    // After the first write: the whole entry is durable, both writes seen.
    assert_eq!(
        payloads(&exec[2]),
        [b"old".to_vec(), b"new1".to_vec(), b"new2".to_vec()]
    );
    assert_eq!(exec[3].int(), 2);
}

#[test]
fn block_inside_multi_does_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let mut c = server.client();
    let started = std::time::Instant::now();
    let replies = pipeline(
        &mut c,
        &[
            &["MULTI"],
            &["LOG.READ", "nothing-yet", "0", "BLOCK", "0"],
            &["LOG.READ", "nothing-yet", "0", "BLOCK", "5000"],
            &["EXEC"],
        ],
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(
        replies[3],
        Value::Array(vec![Value::Array(Vec::new()), Value::Array(Vec::new())])
    );
}

#[test]
fn queued_commands_count_against_the_query_buffer() {
    //! A client queuing forever inside MULTI would hold unbounded memory.
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--max-query-buffer",
            "1MiB",
            "--max-bulk-bytes",
            "64KiB",
            "--max-payload",
            "64KiB",
        ],
    );
    let mut c = server.client();
    assert_eq!(c.cmd(&["MULTI"]), ok());
    let payload = vec![b'p'; 60 << 10];
    let mut closed = false;
    for _ in 0..40 {
        c.send_raw(&Client::encode(&[b"LOG.APPEND", b"s", b"1", &payload]));
        match c.read() {
            Some(Value::Simple(q)) if q == "QUEUED" => {}
            Some(Value::Error(e)) => {
                assert!(e.contains("query buffer"), "{e}");
                closed = c.read().is_none();
                break;
            }
            None => {
                closed = true;
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(closed, "a transaction queued past --max-query-buffer");
    server.wait_for_log("query_bytes=");
    let mut c = server.client();
    assert_eq!(next_offset(&mut c, "s"), 0);
}

#[test]
fn an_exec_reply_over_the_output_limit_drops_the_client_and_says_so() {
    //! EXEC holds its replies until the array is complete: a transaction of
    //! many large reads must not hold them all.
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(
        dir.path(),
        &[
            "--max-payload",
            "64KiB",
            "--max-bulk-bytes",
            "64KiB",
            "--max-query-buffer",
            "1MiB",
            "--max-read-bytes",
            "128KiB",
            "--client-output-buffer-limit",
            "1MiB",
        ],
    );
    let mut c = server.client();
    let payload = vec![b'r'; 60 << 10];
    for _ in 0..4 {
        c.cmd_bytes(&[b"LOG.APPEND", b"s", b"1", &payload]);
    }
    let mut commands: Vec<&[&str]> = vec![&["MULTI"]];
    // Each read answers ~120 KiB; 20 of them are over 1 MiB.
    commands.extend(std::iter::repeat_n(&["LOG.READ", "s", "0"][..], 20));
    let mut bytes = Vec::new();
    for args in &commands {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        bytes.extend(Client::encode(&args));
    }
    bytes.extend(Client::encode(&[b"EXEC"]));
    c.send_raw(&bytes);
    for _ in 0..commands.len() {
        let reply = c.read();
        assert!(matches!(reply, Some(Value::Simple(_))), "{reply:?}");
    }
    assert_eq!(c.read(), None, "the client was not disconnected");
    let log = server.wait_for_log("client-output-buffer-limit");
    assert!(log.contains("limit_bytes=1048576"), "{log}");
    // The server goes on.
    let mut c = server.client();
    assert_eq!(next_offset(&mut c, "s"), 4);
}
