//! One request, of any size the limits allow, must never take the server
//! down or keep a worker busy: `CONFIG GET` with a 100 000-byte pattern of
//! `*` overflowed the stack of the recursive glob matcher and aborted the
//! whole server, before any AUTH; 14 `*` then `z` backtracked for over a
//! minute. Also the other super-linear loops found on network input: an
//! inline line arriving byte by byte was searched again from its start on
//! every read, and an unknown command's error quoted its arguments whole.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::*;
use fencelog_server::protocol::{Limits, RequestParser};

/// Generous: the fixed paths answer in microseconds; the broken ones took
/// seconds to minutes, or killed the process.
const FAST: Duration = Duration::from_secs(3);

fn config_get(c: &mut Client, pattern: &[u8]) -> (Value, Duration) {
    let started = Instant::now();
    let reply = c.cmd_bytes(&[b"CONFIG", b"GET", pattern]);
    (reply, started.elapsed())
}

#[test]
fn config_get_with_huge_or_backtracking_patterns_is_answered_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(&dir.path().join("data"), &[]);
    let mut c = server.client();

    // Over the pattern limit: a clear error, and the connection stays.
    let (reply, took) = config_get(&mut c, &vec![b'*'; 100_000]);
    assert_eq!(reply.err(), "ERR CONFIG GET pattern longer than 1024 bytes");
    assert!(took < FAST, "{took:?}");
    assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));

    // At the limit, all stars: every setting.
    let every = c.cmd(&["CONFIG", "GET", "*"]).array().len();
    assert!(every >= 2 * 12, "{every}");
    let (reply, took) = config_get(&mut c, &vec![b'*'; 1024]);
    assert_eq!(reply.array().len(), every, "{reply:?}");
    assert!(took < FAST, "{took:?}");

    // The backtracking patterns: nothing matches, at once.
    let mut stars_z = vec![b'*'; 14];
    stars_z.push(b'z');
    for pattern in [
        stars_z,
        [b"*a".repeat(511), b"*z".to_vec()].concat(),
        // More single-byte tokens than the longest name has bytes.
        [vec![b'*'; 900], b"?".repeat(120)].concat(),
    ] {
        let (reply, took) = config_get(&mut c, &pattern);
        assert_eq!(reply.array().len(), 0, "{reply:?}");
        assert!(took < FAST, "{took:?}");
    }

    // Many patterns at the limit in one request: linear in its size.
    let pattern = [b"*a".repeat(500), b"*x*".to_vec()].concat();
    let mut args: Vec<&[u8]> = vec![b"CONFIG", b"GET"];
    args.extend(std::iter::repeat_n(&pattern[..], 2000));
    let started = Instant::now();
    let reply = c.cmd_bytes(&args);
    assert_eq!(reply.array().len(), 0, "{reply:?}");
    assert!(started.elapsed() < FAST, "{:?}", started.elapsed());

    // Redis' syntax: classes and escapes, in any case.
    let (reply, _) = config_get(&mut c, b"MAX[a-c]LIENTS");
    assert_eq!(reply.array()[0].bulk(), b"maxclients");
    let (reply, _) = config_get(&mut c, b"app*[^x]");
    assert_eq!(reply.array().len(), 4, "{reply:?}");

    // Another connection is served, and SIGTERM finds no worker busy.
    let mut other = server.client();
    assert_eq!(other.cmd(&["PING"]), Value::Simple("PONG".into()));
    server.signal("TERM");
    assert!(server.wait(Duration::from_secs(20)).success());
}

#[test]
fn an_unknown_command_quotes_at_most_128_bytes_of_each_argument() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&dir.path().join("data"), &[]);
    let mut c = server.client();
    // Invalid UTF-8 becomes U+FFFD, three bytes for one: quoted whole, 1 MiB
    // arguments made a 9 MiB error.
    let big = vec![0xffu8; 1 << 20];
    let reply = c.cmd_bytes(&[&big, &big, &big, &big]);
    let text = reply.err();
    assert!(text.starts_with("ERR unknown command '"), "{text}");
    assert!(text.len() < 4 * 3 * 128 + 100, "{} bytes", text.len());
    assert_eq!(c.cmd(&["PING"]), Value::Simple("PONG".into()));
}

/// Searched from its start on every read, an inline line of L bytes
/// arriving byte by byte cost L²/2 byte compares: 32 GiB of them for a
/// 256 KiB line (about half a minute), 2 GiB for the default 64 KiB.
#[test]
fn an_inline_line_trickling_in_byte_by_byte_is_searched_once() {
    let limits = Limits {
        max_inline_bytes: 256 << 10,
        max_bulk_bytes: 256 << 10,
        ..Limits::default()
    };
    let mut line = b"ECHO ".to_vec();
    line.resize(limits.max_inline_bytes - 2, b'x');
    line.extend_from_slice(b"\r\n");
    let mut parser = RequestParser::new();
    let mut buf = BytesMut::new();
    let started = Instant::now();
    let mut got = None;
    for &b in &line {
        buf.extend_from_slice(&[b]);
        if let Some(r) = parser.next(&mut buf, &limits).unwrap() {
            got = Some(r);
        }
    }
    assert!(started.elapsed() < FAST, "{:?}", started.elapsed());
    let got = got.expect("the request");
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].len(), line.len() - 7);
    assert!(buf.is_empty());
}

/// A lone `\r` pending (the start of a blank line) must not confuse the
/// remembered search position.
#[test]
fn a_split_blank_line_then_a_command_parse_as_at_once() {
    let limits = Limits::default();
    let input = b"\r\n\r\nPING\r\n\r\nECHO a\n";
    for split in 0..input.len() {
        let mut parser = RequestParser::new();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for piece in [&input[..split], &input[split..]] {
            buf.extend_from_slice(piece);
            while let Some(r) = parser.next(&mut buf, &limits).unwrap() {
                got.push(r);
            }
        }
        let got: Vec<Vec<&[u8]>> = got.iter().map(|r| r.iter().collect()).collect();
        assert_eq!(
            got,
            vec![vec![&b"PING"[..]], vec![&b"ECHO"[..], b"a"]],
            "split at {split}"
        );
    }
}
