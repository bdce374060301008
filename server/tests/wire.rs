//! The wire protocol against the real binary (SPEC §6): every command's
//! answer, errors that begin with their code and carry the numbers, RESP3,
//! authentication, and bad input that gets an error, never a crash.

mod common;

use common::*;

fn start() -> (tempfile::TempDir, ServerProcess) {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &["--max-payload", "1024"]);
    (dir, server)
}

#[test]
fn log_commands_and_their_answers() {
    let (_d, server) = start();
    let mut c = server.client();
    assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
    assert_eq!(c.cmd(&["LOG.APPEND", "s", "42", "a", "b"]).int(), 0);
    assert_eq!(c.cmd(&["LOG.APPEND", "s", "42", "c"]).int(), 2);
    assert_eq!(
        c.cmd(&["LOG.APPEND", "s", "41", "late"]).err(),
        "STALE token 41 is below the highest accepted token 42"
    );
    assert_eq!(c.cmd(&["LOG.FENCE", "s", "50"]).int(), 50);
    assert_eq!(
        c.cmd(&["LOG.APPENDAT", "s", "50", "5", "x"]).err(),
        "MISMATCH expected offset 5 but the next offset is 3"
    );
    assert_eq!(c.cmd(&["LOG.APPENDAT", "s", "50", "3", "d"]).int(), 3);
    // The retry of an append_at that succeeded answers the same offset.
    assert_eq!(c.cmd(&["LOG.APPENDAT", "s", "50", "3", "d"]).int(), 3);
    let records = c.cmd(&["LOG.READ", "s", "1", "COUNT", "2"]);
    let records = records.array();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].array()[0].int(), 1);
    assert_eq!(records[0].array()[1].int(), 42);
    assert_eq!(records[0].array()[2].bulk(), b"b");
    assert_eq!(c.cmd(&["LOG.TRIM", "s", "50", "2"]).int(), 2);
    assert_eq!(
        c.cmd(&["LOG.READ", "s", "0"]).err(),
        "TRIMMED offset 0 is below the start offset 2"
    );
    let stat = c.cmd(&["LOG.STAT", "s"]);
    let flat: Vec<String> = stat
        .array()
        .iter()
        .map(|v| match v {
            Value::Bulk(b) => String::from_utf8_lossy(b).to_string(),
            Value::Int(n) => n.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        flat,
        [
            "highest_token",
            "50",
            "next_offset",
            "4",
            "start_offset",
            "2",
            "records",
            "2",
            "bytes",
            "2"
        ]
    );
    assert_eq!(c.cmd(&["LOG.DELETE", "s", "50"]).int(), 2);
    assert_eq!(
        c.cmd(&["LOG.STREAMS"]).array(),
        &[Value::Bulk(b"s".to_vec())]
    );
    // A read at or past the end answers empty.
    assert_eq!(c.cmd(&["LOG.READ", "s", "99"]).array().len(), 0);
}

#[test]
fn lease_commands() {
    let (_d, server) = start();
    let mut c = server.client();
    let grant = c.cmd(&["LEASE.ACQUIRE", "jobs", "worker-1", "60000", "FENCE"]);
    let token = grant.array()[0].int();
    assert_eq!(grant.array()[1].int(), 60000);
    let held = c.cmd(&["LEASE.ACQUIRE", "jobs", "worker-2", "1000"]);
    assert!(
        held.err()
            .starts_with("HELD lease is held by another owner for "),
        "{held:?}"
    );
    // The fence went with the grant.
    let stat = c.cmd(&["LOG.STAT", "jobs"]);
    assert_eq!(stat.array()[1].int(), token);
    let info = c.cmd(&["LEASE.INFO", "jobs"]);
    assert_eq!(info.array()[0].bulk(), b"worker-1");
    assert_eq!(info.array()[1].int(), token);
    assert_eq!(
        c.cmd(&[
            "LEASE.RENEW",
            "jobs",
            "worker-1",
            &token.to_string(),
            "30000"
        ])
        .int(),
        30000
    );
    assert_eq!(
        c.cmd(&[
            "LEASE.RENEW",
            "jobs",
            "worker-2",
            &token.to_string(),
            "30000"
        ])
        .err(),
        "LOST lease is not held by this owner and token"
    );
    assert_eq!(
        c.cmd(&["LEASE.RELEASE", "jobs", "worker-1", &token.to_string()])
            .int(),
        1
    );
    assert_eq!(
        c.cmd(&["LEASE.RELEASE", "jobs", "worker-1", &token.to_string()])
            .int(),
        0
    );
    assert_eq!(c.cmd(&["LEASE.INFO", "jobs"]), Value::Null);
    // WAIT: a second client waits for a release.
    let g = c.cmd(&["LEASE.ACQUIRE", "jobs", "a", "60000"]).array()[0].int();
    let addr = server.addr;
    let waiter = std::thread::spawn(move || {
        let mut c2 = Client::connect(addr);
        c2.cmd(&["LEASE.ACQUIRE", "jobs", "b", "1000", "WAIT", "20000"])
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        c.cmd(&["LEASE.RELEASE", "jobs", "a", &g.to_string()]).int(),
        1
    );
    let got = waiter.join().unwrap();
    assert!(got.array()[0].int() > g);
}

#[test]
fn resp3_after_hello_3() {
    let (_d, server) = start();
    let mut c = server.client();
    let hello = c.cmd(&["HELLO", "3"]);
    let Value::Map(pairs) = hello else {
        panic!("{hello:?}")
    };
    assert!(pairs.contains(&(Value::Bulk(b"proto".to_vec()), Value::Int(3))));
    c.cmd(&["LOG.APPEND", "s", "1", "x"]);
    let Value::Map(stat) = c.cmd(&["LOG.STAT", "s"]) else {
        panic!("LOG.STAT is a map in RESP3")
    };
    assert_eq!(
        stat[0],
        (Value::Bulk(b"highest_token".to_vec()), Value::Int(1))
    );
    assert_eq!(c.cmd(&["LEASE.INFO", "nothing"]), Value::Null);
    assert!(matches!(c.cmd(&["INFO", "log"]), Value::Verbatim(t) if t.contains("appends:1")));
    assert_eq!(
        c.cmd(&["HELLO", "4"]).err(),
        "NOPROTO unsupported protocol version"
    );
}

#[test]
fn errors_name_the_problem_and_keep_the_connection() {
    let (_d, server) = start();
    let mut c = server.client();
    assert!(
        c.cmd(&["LOG.APPEND", "s", "0", "x"])
            .err()
            .starts_with("ERR invalid token")
    );
    assert!(
        c.cmd(&["LOG.APPEND", "s", "abc", "x"])
            .err()
            .starts_with("ERR token is not an integer")
    );
    assert_eq!(
        c.cmd(&["LOG.APPEND", "s", "1"]).err(),
        "ERR wrong number of arguments for 'log.append' command"
    );
    assert!(
        c.cmd(&["NOPE", "a"])
            .err()
            .starts_with("ERR unknown command 'NOPE'")
    );
    assert_eq!(
        c.cmd(&["LOG.READ", "s", "0", "COUNT", "0"]).err(),
        "ERR COUNT must be at least 1"
    );
    // A payload over --max-payload: TOOBIG, and the connection stays usable.
    let big = "x".repeat(2000);
    assert!(
        c.cmd(&["LOG.APPEND", "s", "1", &big])
            .err()
            .starts_with("TOOBIG")
    );
    assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
    // Inline commands work too.
    c.send_raw(b"LOG.APPEND inline 7 \"hello world\"\r\n");
    assert_eq!(c.read().unwrap().int(), 0);
    assert_eq!(
        c.cmd(&["LOG.READ", "inline", "0"]).array()[0].array()[2].bulk(),
        b"hello world"
    );
}

#[test]
fn malformed_frames_get_a_protocol_error_and_the_connection_closes() {
    let (_d, server) = start();
    for bad in [
        &b"*2\r\n$4\r\nPING\r\n:1\r\n"[..],
        b"*1\r\n$-5\r\n",
        b"*1\r\n$99999999999\r\n",
        b"*99999999\r\n",
        b"*1\r\n$4\r\nPINGxx",
    ] {
        let mut c = server.client();
        c.send_raw(bad);
        let reply = c.read().unwrap();
        assert!(
            reply.err().starts_with("ERR Protocol error"),
            "{bad:?}: {reply:?}"
        );
        assert_eq!(c.read(), None, "the connection closes after {bad:?}");
    }
    // The server is fine.
    assert_eq!(server.client().cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn a_password_guards_everything_but_auth_hello_and_quit() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &["--requirepass", "s3cret"]);
    let mut c = server.client();
    assert_eq!(
        c.cmd(&["LOG.STREAMS"]).err(),
        "NOAUTH Authentication required."
    );
    assert!(c.cmd(&["HELLO", "3"]).err().starts_with("NOAUTH"));
    assert_eq!(
        c.cmd(&["AUTH", "wrong"]).err(),
        "WRONGPASS invalid username-password pair or user is disabled."
    );
    assert_eq!(
        c.cmd(&["AUTH", "default", "s3cret"]),
        Value::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["LOG.STREAMS"]).array().len(), 0);
    let mut c2 = server.client();
    assert!(matches!(
        c2.cmd(&["HELLO", "3", "AUTH", "default", "s3cret"]),
        Value::Map(_)
    ));
    assert_eq!(c2.cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn pipelined_appends_share_group_commits() {
    let (_d, server) = start();
    let mut c = server.client();
    let mut burst = Vec::new();
    for i in 0..200 {
        burst.extend(Client::encode(&[
            b"LOG.APPEND",
            b"p",
            b"1",
            format!("r{i}").as_bytes(),
        ]));
    }
    // A read at the end of the pipeline sees every append before it.
    burst.extend(Client::encode(&[b"LOG.STAT", b"p"]));
    c.send_raw(&burst);
    for i in 0..200 {
        assert_eq!(c.read().unwrap().int(), i);
    }
    assert_eq!(c.read().unwrap().array()[3].int(), 200);
    let info = match c.cmd(&["INFO", "persistence"]) {
        Value::Bulk(b) => String::from_utf8(b).unwrap(),
        other => panic!("{other:?}"),
    };
    let fsyncs: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("fsyncs:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(fsyncs < 100, "200 pipelined appends took {fsyncs} syncs");
}

#[test]
fn connections_over_the_limit_are_refused_politely() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &["--max-connections", "2"]);
    let mut a = server.client();
    let mut b = server.client();
    assert_eq!(a.cmd(&["PING"]), Value::Simple("PONG".into()));
    assert_eq!(b.cmd(&["PING"]), Value::Simple("PONG".into()));
    let mut c = server.client();
    assert_eq!(
        c.read(),
        Some(Value::Error("ERR max number of clients reached".into()))
    );
    drop(a);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(server.client().cmd(&["PING"]), Value::Simple("PONG".into()));
}

#[test]
fn the_client_commands_libraries_send() {
    let (_d, server) = start();
    let mut c = server.client();
    assert_eq!(
        c.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
        Value::Simple("OK".into())
    );
    assert_eq!(
        c.cmd(&["CLIENT", "SETNAME", "me"]),
        Value::Simple("OK".into())
    );
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), Value::Bulk(b"me".to_vec()));
    assert!(c.cmd(&["CLIENT", "ID"]).int() > 0);
    assert_eq!(c.cmd(&["SELECT", "0"]), Value::Simple("OK".into()));
    assert!(c.cmd(&["SELECT", "1"]).err().starts_with("ERR DB index"));
    assert_eq!(c.cmd(&["ECHO", "hi"]), Value::Bulk(b"hi".to_vec()));
    let cfg = c.cmd(&["CONFIG", "GET", "appendfsync"]);
    assert_eq!(
        cfg.array(),
        &[
            Value::Bulk(b"appendfsync".to_vec()),
            Value::Bulk(b"always".to_vec())
        ]
    );
    assert!(matches!(c.cmd(&["COMMAND", "DOCS"]), Value::Array(_)));
    assert_eq!(c.cmd(&["QUIT"]), Value::Simple("OK".into()));
    assert_eq!(c.read(), None);
}

#[test]
fn answers_before_a_blocking_read_are_sent_before_it_blocks() {
    let (_d, server) = start();
    let mut c = server.client();
    let mut burst = Client::encode(&[b"LOG.APPEND", b"q", b"1", b"first"]);
    burst.extend(Client::encode(&[b"LOG.READ", b"q", b"1", b"BLOCK", b"0"]));
    c.send_raw(&burst);
    // The append's answer arrives while the read still waits.
    assert_eq!(c.read().unwrap().int(), 0);
    let mut other = server.client();
    assert_eq!(other.cmd(&["LOG.APPEND", "q", "1", "second"]).int(), 1);
    let woke = c.read().unwrap();
    assert_eq!(woke.array()[0].array()[2].bulk(), b"second");
}

/// `LOG.STREAMS` answers a page at a time, in byte order: listing a
/// million streams at once kept a server thread busy for 0.7 s and made a
/// 21 MB reply for a 25-byte request. Without `COUNT` it lists every
/// stream only while there are at most 10 000; past that it says how to
/// page instead of cutting the list short without a word.
#[test]
fn log_streams_pages_in_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path(), &[]);
    let mut c = server.client();
    let mut names: Vec<String> = (0..10_000).map(|i| format!("s{i:05}")).collect();
    names.push("A".into()); // upper case sorts first in byte order
    for chunk in names.chunks(1000) {
        let mut batch = Vec::new();
        for n in chunk {
            batch.extend(Client::encode(&[b"LOG.FENCE", n.as_bytes(), b"1"]));
        }
        c.send_raw(&batch);
        for _ in chunk {
            assert_eq!(c.read().unwrap(), Value::Int(1));
        }
    }
    names.sort();
    assert_eq!(
        c.cmd(&["LOG.STREAMS"]).err(),
        "ERR 10001 streams, more than one LOG.STREAMS lists (10000): page with \
         LOG.STREAMS COUNT n, then AFTER the last name"
    );
    let mut listed: Vec<String> = Vec::new();
    let mut pages = Vec::new();
    loop {
        let mut args = vec!["LOG.STREAMS", "COUNT", "4000"];
        let last = listed.last().cloned();
        if let Some(l) = &last {
            args.extend(["AFTER", l.as_str()]);
        }
        let page = c.cmd(&args);
        let page: Vec<String> = page
            .array()
            .iter()
            .map(|v| match v {
                Value::Bulk(b) => String::from_utf8(b.clone()).unwrap(),
                other => panic!("not a name: {other:?}"),
            })
            .collect();
        pages.push(page.len());
        listed.extend(page.iter().cloned());
        if page.len() < 4000 {
            break;
        }
    }
    assert_eq!(pages, [4000, 4000, 2001]);
    assert_eq!(listed, names, "every name once, in byte order");
    // AFTER need not be a stream's name; past the end is an empty page.
    assert_eq!(
        c.cmd(&["LOG.STREAMS", "AFTER", "s04999x", "COUNT", "2"])
            .array(),
        &[
            Value::Bulk(b"s05000".to_vec()),
            Value::Bulk(b"s05001".to_vec())
        ]
    );
    assert!(
        c.cmd(&["LOG.STREAMS", "AFTER", "t", "COUNT", "5"])
            .array()
            .is_empty()
    );
    for bad in ["0", "10001"] {
        assert_eq!(
            c.cmd(&["LOG.STREAMS", "COUNT", bad]).err(),
            "ERR COUNT must be between 1 and 10000"
        );
    }
    assert_eq!(
        c.cmd(&["LOG.STREAMS", "COUNT", "x"]).err(),
        "ERR value is not an integer or out of range"
    );
    assert_eq!(c.cmd(&["LOG.STREAMS", "AFTER"]).err(), "ERR syntax error");
    assert_eq!(
        c.cmd(&["LOG.STREAMS", "FROM", "a"]).err(),
        "ERR syntax error"
    );
}
