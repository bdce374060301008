//! The Redis protocol of `fencelog-server`: the incremental request parser
//! (`protocol::RequestParser`) on arbitrary bytes, and the reply encoder
//! (`protocol::Reply::encode`) on replies built from the input.
//!
//! Input layout: `max_bulk: u16 LE | max_args: u8 | max_inline: u8 |
//! chunking: u32 LE | bytes...` (missing bytes of the prefix read as zero).
//! The limits are `max_bulk_bytes = 1 + max_bulk % 4096`,
//! `max_args = 1 + max_args % 64`, `max_inline_bytes = 1 + max_inline % 256`.
//! The low 3 bits of `chunking` pick the largest chunk (1, 2, 3, 8, 33, 64,
//! 512 or all bytes at once), the whole word seeds the generator of the
//! chunk sizes.
//!
//! The bytes are fed to a parser twice: all at once, and in chunks (each
//! chunk appended to the buffer, then every whole request taken), as a
//! connection does across reads. Nothing may panic or hang, and:
//!
//! - every request has 1 to `max_args` arguments, none longer than
//!   `max_bulk_bytes`; all arguments together are at most the input length;
//! - after an `Err` nothing more is fed (the connection would be closed);
//! - both ways give the same requests, the same outcome (error or not) and,
//!   without an error, the same leftover (bytes and whether a request is
//!   partly received);
//! - each request, encoded as a `Reply::Array` of `Reply::Bulk` with
//!   protocol 2, is itself a request that parses back to the same arguments.
//!
//! Replies: a few `Reply` trees built from the bytes are encoded with
//! protocol 2 and 3 and decoded by the small RESP2/RESP3 decoder below,
//! which must give back the reply (records as arrays of offset, token and
//! payload; protocol 2: verbatim strings as bulk strings, maps as flat
//! arrays; CR and LF in simple strings and errors as
//! spaces) and consume exactly the encoding. An array of bulk strings and a
//! map of bulk strings encoded with protocol 2 are also requests that parse
//! to those bulk strings.

#![no_main]

use bytes::{Bytes, BytesMut};
use fencelog_server::protocol::{Limits, ProtocolError, Reply, Request, RequestParser};
use libfuzzer_sys::fuzz_target;

const HEADER: usize = 8;

/// A small deterministic generator (xorshift32) for the chunk sizes.
struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.0 = x;
        x
    }
}

/// What one way of feeding the parser gave.
#[derive(Debug, PartialEq)]
struct Outcome {
    requests: Vec<Request>,
    error: Option<ProtocolError>,
    /// Bytes left in the buffer, and whether a request was partly received
    /// (only meaningful without an error).
    leftover: Option<(Vec<u8>, bool)>,
}

/// Feeds `chunks` one after the other, taking every whole request after
/// each; stops at the first error.
fn feed<'a>(chunks: impl Iterator<Item = &'a [u8]>, limits: &Limits, total: usize) -> Outcome {
    let mut parser = RequestParser::new();
    let mut buf = BytesMut::new();
    let mut requests = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match parser.next(&mut buf, limits) {
                Ok(Some(r)) => {
                    // A request consumes bytes: no endless stream of them.
                    assert!(buf.len() < before, "a request from no bytes");
                    assert!(requests.len() < total, "more requests than bytes");
                    requests.push(r);
                }
                Ok(None) => break,
                Err(e) => {
                    return Outcome {
                        requests,
                        error: Some(e),
                        leftover: None,
                    };
                }
            }
        }
    }
    let partial = parser.in_request();
    Outcome {
        requests,
        error: None,
        leftover: Some((buf.to_vec(), partial)),
    }
}

fn check_requests(requests: &[Request], limits: &Limits, input_len: usize) {
    let mut total = 0usize;
    for r in requests {
        assert!(!r.is_empty(), "an empty request");
        assert!(
            r.len() <= limits.max_args,
            "a request of {} arguments (max_args {})",
            r.len(),
            limits.max_args
        );
        for a in r {
            if a.len() > limits.max_bulk_bytes {
                panic!(
                    "an argument of {} bytes (max_bulk_bytes {}): {:?}",
                    a.len(),
                    limits.max_bulk_bytes,
                    r
                );
            }
            total += a.len();
        }
    }
    assert!(
        total <= input_len,
        "arguments of {total} bytes from {input_len} bytes"
    );
}

/// Whether the bytes hold a length line (`*` or `$`) over 32 bytes long.
fn parse_requests(bytes: &[u8], limits: &Limits) -> Result<Vec<Request>, ProtocolError> {
    let mut parser = RequestParser::new();
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(r) = parser.next(&mut buf, limits)? {
        out.push(r);
    }
    assert!(buf.is_empty(), "bytes left after whole requests: {buf:?}");
    assert!(!parser.in_request(), "a request left open");
    Ok(out)
}

fn check_parser(data: &[u8]) {
    let b = |i: usize| data.get(i).copied().unwrap_or(0);
    let limits = Limits {
        max_bulk_bytes: 1 + usize::from(u16::from_le_bytes([b(0), b(1)])) % 4096,
        max_args: 1 + usize::from(b(2)) % 64,
        max_inline_bytes: 1 + usize::from(b(3)) % 256,
    };
    let seed = u32::from_le_bytes([b(4), b(5), b(6), b(7)]);
    let bytes = data.get(HEADER..).unwrap_or_default();

    let whole = feed(std::iter::once(bytes), &limits, bytes.len());
    check_requests(&whole.requests, &limits, bytes.len());

    let max_chunk = [1, 2, 3, 8, 33, 64, 512, usize::MAX][(seed & 7) as usize];
    let mut rng = Rng(seed | 1);
    let mut chunks = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = if max_chunk == usize::MAX {
            rest.len()
        } else {
            1 + rng.next() as usize % max_chunk
        };
        let (c, r) = rest.split_at(n.min(rest.len()));
        chunks.push(c);
        rest = r;
    }
    let chunked = feed(chunks.iter().copied(), &limits, bytes.len());
    check_requests(&chunked.requests, &limits, bytes.len());

    let same = whole.requests == chunked.requests
        && whole.error.is_some() == chunked.error.is_some()
        && whole.leftover == chunked.leftover;
    if !same {
        panic!(
            "all at once and in chunks (max {max_chunk}) differ:\nall at once: {whole:?}\nin chunks:   {chunked:?}"
        );
    }

    // Each request is a RESP array of bulk strings: parses back the same
    // (under the same limits).
    for r in &whole.requests {
        let reply = Reply::Array(
            r.iter()
                .map(|a| Reply::Bulk(Bytes::copy_from_slice(a)))
                .collect(),
        );
        let mut out = BytesMut::new();
        reply.encode(2, &mut out);
        let back = parse_requests(&out, &limits);
        assert_eq!(back, Ok(vec![r.clone()]), "{out:?}");
        // Protocol 3 encodes an array of bulk strings the same way.
        let mut three = BytesMut::new();
        reply.encode(3, &mut three);
        assert_eq!(out, three);
    }
}

/// Reads the fuzz input as a source of replies.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn bytes(&mut self) -> Vec<u8> {
        let n = usize::from(self.byte() % 24).min(self.0.len());
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        a.to_vec()
    }

    fn string(&mut self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    /// A record read: any offset (past `i64::MAX` it encodes saturated),
    /// a valid token, any payload.
    fn record(&mut self) -> fencelog::Record {
        let mut v = [0u8; 8];
        for x in &mut v {
            *x = self.byte();
        }
        let token = 1 + u64::from(self.byte()) * 1_000_003;
        fencelog::Record {
            offset: u64::from_le_bytes(v),
            token: fencelog::Token::new(token).expect("a token within 1..=MAX_TOKEN"),
            payload: Bytes::from(self.bytes()),
        }
    }

    fn reply(&mut self, depth: u32) -> Reply {
        match self.byte() % 8 {
            0 => Reply::Simple(self.string()),
            1 => Reply::Error(self.string()),
            2 => {
                let mut v = [0u8; 8];
                for x in &mut v {
                    *x = self.byte();
                }
                Reply::Integer(i64::from_le_bytes(v))
            }
            3 => Reply::Bulk(Bytes::from(self.bytes())),
            4 => Reply::Verbatim(self.string()),
            5 => {
                let n = self.byte() % 4;
                Reply::Records((0..n).map(|_| self.record()).collect())
            }
            6 if depth < 3 => {
                let n = self.byte() % 5;
                Reply::Array((0..n).map(|_| self.reply(depth + 1)).collect())
            }
            7 if depth < 3 => {
                let n = self.byte() % 4;
                Reply::Map(
                    (0..n)
                        .map(|_| (self.reply(depth + 1), self.reply(depth + 1)))
                        .collect(),
                )
            }
            _ => Reply::Null,
        }
    }
}

/// What a reply must decode to after encoding with `proto`.
fn expected(r: &Reply, proto: u8) -> Reply {
    let line = |s: &str| s.replace(['\r', '\n'], " ");
    match r {
        Reply::Simple(s) => Reply::Simple(line(s)),
        Reply::Error(s) => Reply::Error(line(s)),
        Reply::Verbatim(s) if proto < 3 => Reply::Bulk(Bytes::from(s.clone())),
        Reply::Array(items) => Reply::Array(items.iter().map(|i| expected(i, proto)).collect()),
        // Records are the arrays of an offset, a token and a payload.
        Reply::Records(records) => Reply::Array(
            records
                .iter()
                .map(|r| {
                    let int = |n: u64| Reply::Integer(i64::try_from(n).unwrap_or(i64::MAX));
                    Reply::Array(vec![
                        int(r.offset),
                        int(r.token.get()),
                        Reply::Bulk(r.payload.clone()),
                    ])
                })
                .collect(),
        ),
        Reply::Map(pairs) if proto < 3 => Reply::Array(
            pairs
                .iter()
                .flat_map(|(k, v)| [expected(k, proto), expected(v, proto)])
                .collect(),
        ),
        Reply::Map(pairs) => Reply::Map(
            pairs
                .iter()
                .map(|(k, v)| (expected(k, proto), expected(v, proto)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A strict RESP2/RESP3 reply decoder (only what `Reply` encodes):
/// answers the reply and the bytes after it.
fn decode(b: &[u8], proto: u8) -> Result<(Reply, &[u8]), String> {
    let end = b
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or("no CRLF after a type byte")?;
    let (&kind, line) = b[..end].split_first().ok_or("an empty line")?;
    let rest = &b[end + 2..];
    let text = std::str::from_utf8(line).map_err(|e| e.to_string())?;
    let num = || -> Result<i64, String> {
        // As Redis writes them: no sign but '-', no leading zeros.
        if text.starts_with('+')
            || (text.len() > 1 && text.trim_start_matches('-').starts_with('0'))
        {
            return Err(format!("a badly written number {text:?}"));
        }
        text.parse::<i64>().map_err(|e| format!("{text:?}: {e}"))
    };
    let count = |n: i64| usize::try_from(n).map_err(|_| format!("a count of {n}"));
    let take = |len: usize| -> Result<(&[u8], &[u8]), String> {
        if rest.len() < len + 2 || &rest[len..len + 2] != b"\r\n" {
            return Err(format!("a payload of {len} bytes not followed by CRLF"));
        }
        Ok((&rest[..len], &rest[len + 2..]))
    };
    match kind {
        b'+' => Ok((Reply::Simple(text.to_owned()), rest)),
        b'-' => Ok((Reply::Error(text.to_owned()), rest)),
        b':' => Ok((Reply::Integer(num()?), rest)),
        b'$' if proto < 3 && text == "-1" => Ok((Reply::Null, rest)),
        b'_' if proto >= 3 && text.is_empty() => Ok((Reply::Null, rest)),
        b'$' => {
            let (p, rest) = take(count(num()?)?)?;
            Ok((Reply::Bulk(Bytes::copy_from_slice(p)), rest))
        }
        b'=' if proto >= 3 => {
            let (p, rest) = take(count(num()?)?)?;
            let s = p
                .strip_prefix(b"txt:")
                .ok_or("a verbatim string without txt:")?;
            let s = String::from_utf8(s.to_vec()).map_err(|e| e.to_string())?;
            Ok((Reply::Verbatim(s), rest))
        }
        b'*' => {
            let mut rest = rest;
            let mut items = Vec::new();
            for _ in 0..count(num()?)? {
                let (item, r) = decode(rest, proto)?;
                items.push(item);
                rest = r;
            }
            Ok((Reply::Array(items), rest))
        }
        b'%' if proto >= 3 => {
            let mut rest = rest;
            let mut pairs = Vec::new();
            for _ in 0..count(num()?)? {
                let (k, r) = decode(rest, proto)?;
                let (v, r) = decode(r, proto)?;
                pairs.push((k, v));
                rest = r;
            }
            Ok((Reply::Map(pairs), rest))
        }
        other => Err(format!(
            "unexpected type byte '{}' in protocol {proto}",
            char::from(other).escape_default()
        )),
    }
}

fn check_replies(data: &[u8]) {
    let mut cur = Cursor(data.get(HEADER..).unwrap_or_default());
    for _ in 0..4 {
        let r = cur.reply(0);
        for proto in [2, 3] {
            let mut out = BytesMut::new();
            r.encode(proto, &mut out);
            match decode(&out, proto) {
                Ok((got, rest)) => {
                    assert!(
                        rest.is_empty(),
                        "{r:?} (protocol {proto}): bytes after the reply"
                    );
                    assert_eq!(
                        got,
                        expected(&r, proto),
                        "{r:?} (protocol {proto}): {out:?}"
                    );
                }
                Err(e) => panic!("{r:?} (protocol {proto}) does not decode ({e}): {out:?}"),
            }
        }
        if cur.0.is_empty() {
            break;
        }
    }

    // Arrays and maps of bulk strings (and verbatim strings, bulk strings in
    // protocol 2) encoded with protocol 2 are requests.
    let mut cur = Cursor(data.get(HEADER..).unwrap_or_default());
    let n = 1 + cur.byte() % 6;
    let args: Vec<Bytes> = (0..n * 2).map(|_| Bytes::from(cur.bytes())).collect();
    let limits = Limits::default();
    let array = Reply::Array(
        args.iter()
            .enumerate()
            .map(|(i, a)| match std::str::from_utf8(a) {
                Ok(s) if i % 3 == 1 => Reply::Verbatim(s.to_owned()),
                _ => Reply::Bulk(a.clone()),
            })
            .collect(),
    );
    let map = Reply::Map(
        args.chunks(2)
            .map(|p| (Reply::Bulk(p[0].clone()), Reply::Bulk(p[1].clone())))
            .collect(),
    );
    for r in [array, map] {
        let mut out = BytesMut::new();
        r.encode(2, &mut out);
        match parse_requests(&out, &limits) {
            Ok(got) => assert_eq!(got, vec![Request::from(args.clone())], "{r:?}: {out:?}"),
            Err(e) => panic!("{r:?} encoded as {out:?} is not a request: {e}"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check_parser(data);
    check_replies(data);
});
