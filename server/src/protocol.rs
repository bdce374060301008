//! The Redis protocol: requests in (RESP arrays of bulk strings, or inline
//! commands), replies out (RESP2 or RESP3).
//!
//! The request parser is incremental: a partial request keeps its progress
//! across reads (a 10 MiB payload arriving in 1 KiB pieces is looked at
//! once, not re-parsed per piece). Every length a client claims is checked
//! against a limit before anything is allocated for it, and payloads are
//! handed out as slices of the read buffer, without copying.

use bytes::{Buf, Bytes, BytesMut};

/// Limits on what one client may send; each bounds memory the server holds.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest bulk string (one argument, e.g. one payload), in bytes.
    pub max_bulk_bytes: usize,
    /// Most arguments in one request.
    pub max_args: usize,
    /// Longest inline command line, in bytes.
    pub max_inline_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_bytes: 16 << 20,
            max_args: 1 << 16,
            max_inline_bytes: 64 << 10,
        }
    }
}

/// A request that breaks the protocol: the connection answers
/// `-ERR Protocol error: …` and is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// Where a partially received request stands.
#[derive(Debug, Default)]
enum State {
    /// Between requests.
    #[default]
    Start,
    /// In an array of `expected` bulk strings, some received.
    Array { expected: usize, args: Vec<Bytes> },
    /// In an array, waiting for `len` bytes of a bulk string (plus CRLF).
    Bulk {
        expected: usize,
        args: Vec<Bytes>,
        len: usize,
    },
}

/// Parses requests from a growing buffer, keeping its place between reads.
#[derive(Debug, Default)]
pub struct RequestParser {
    state: State,
    /// Bytes of an unfinished inline line already searched for its `\n`:
    /// searching from there keeps a line that trickles in byte by byte
    /// linear, not quadratic, in its length.
    inline_scanned: usize,
}

/// One request: the command and its arguments.
pub type Request = Vec<Bytes>;

/// Finds `\r\n` in `buf` (from the start); answers the line's length.
fn line_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// Longest length line (`*…` or `$…`) accepted, CRLF excluded. The same
/// limit applies whether the line arrives whole or in pieces.
const MAX_LEN_LINE: usize = 32;

/// Parses a length strictly, as Redis does: an optional `-`, then digits,
/// with no `+` and no leading zeros.
fn parse_len(line: &[u8], what: &str) -> Result<i64, ProtocolError> {
    let invalid = || ProtocolError(format!("invalid {what} length"));
    let digits = line.strip_prefix(b"-").unwrap_or(line);
    if digits.is_empty()
        || !digits.iter().all(u8::is_ascii_digit)
        || (digits.len() > 1 && digits[0] == b'0')
    {
        return Err(invalid());
    }
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(invalid)
}

impl RequestParser {
    /// A parser between requests.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a request is partly received.
    pub fn in_request(&self) -> bool {
        !matches!(self.state, State::Start)
    }

    /// Takes the next whole request from the front of `buf`, consuming its
    /// bytes; `Ok(None)` when more bytes are needed (the progress is kept).
    pub fn next(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Request>, ProtocolError> {
        loop {
            match std::mem::take(&mut self.state) {
                State::Start => {
                    // Empty lines between requests are ignored, as Redis does
                    // (not under an unfinished inline line, which starts here).
                    while self.inline_scanned == 0 && buf.starts_with(b"\r\n") {
                        buf.advance(2);
                    }
                    let Some(&first) = buf.first() else {
                        return Ok(None);
                    };
                    if first != b'*' {
                        match self.inline(buf, limits)? {
                            Inline::Request(args) => return Ok(Some(args)),
                            // A blank line: no command; look for the next.
                            Inline::Blank => continue,
                            Inline::NeedMore => return Ok(None),
                        }
                    }
                    let Some(end) = line_end(buf).filter(|&e| e <= MAX_LEN_LINE) else {
                        if buf.len() > MAX_LEN_LINE {
                            return Err(ProtocolError("invalid multibulk length".into()));
                        }
                        return Ok(None);
                    };
                    let n = parse_len(&buf[1..end], "multibulk")?;
                    buf.advance(end + 2);
                    if n <= 0 {
                        // `*0` and `*-1` are no command at all.
                        continue;
                    }
                    if n as usize > limits.max_args {
                        return Err(ProtocolError(format!(
                            "a request of {n} arguments is over the limit of {}",
                            limits.max_args
                        )));
                    }
                    let expected = n as usize;
                    // Grow as arguments arrive; never trust the count with
                    // an allocation.
                    self.state = State::Array {
                        expected,
                        args: Vec::with_capacity(expected.min(16)),
                    };
                }
                State::Array { expected, args } => {
                    if args.len() == expected {
                        return Ok(Some(args));
                    }
                    let Some(&first) = buf.first() else {
                        self.state = State::Array { expected, args };
                        return Ok(None);
                    };
                    if first != b'$' {
                        return Err(ProtocolError(format!(
                            "expected '$', got '{}'",
                            char::from(first).escape_default()
                        )));
                    }
                    let Some(end) = line_end(buf).filter(|&e| e <= MAX_LEN_LINE) else {
                        if buf.len() > MAX_LEN_LINE {
                            return Err(ProtocolError("invalid bulk length".into()));
                        }
                        self.state = State::Array { expected, args };
                        return Ok(None);
                    };
                    let len = parse_len(&buf[1..end], "bulk")?;
                    if len < 0 {
                        return Err(ProtocolError("invalid bulk length".into()));
                    }
                    if len as usize > limits.max_bulk_bytes {
                        return Err(ProtocolError(format!(
                            "a bulk string of {len} bytes is over the limit of {}",
                            limits.max_bulk_bytes
                        )));
                    }
                    buf.advance(end + 2);
                    self.state = State::Bulk {
                        expected,
                        args,
                        len: len as usize,
                    };
                }
                State::Bulk {
                    expected,
                    mut args,
                    len,
                } => {
                    if buf.len() < len + 2 {
                        // Room for the rest, once: not one growth per read.
                        buf.reserve(len + 2 - buf.len());
                        self.state = State::Bulk {
                            expected,
                            args,
                            len,
                        };
                        return Ok(None);
                    }
                    if &buf[len..len + 2] != b"\r\n" {
                        return Err(ProtocolError("bulk string not terminated by CRLF".into()));
                    }
                    let arg = buf.split_to(len).freeze();
                    buf.advance(2);
                    args.push(arg);
                    self.state = State::Array { expected, args };
                }
            }
        }
    }

    /// An inline command: one line, arguments split on spaces (with Redis'
    /// quoting for "double" and 'single' quoted arguments).
    fn inline(&mut self, buf: &mut BytesMut, limits: &Limits) -> Result<Inline, ProtocolError> {
        let from = self.inline_scanned.min(buf.len());
        let end = match buf[from..].iter().position(|&b| b == b'\n') {
            Some(end) => from + end,
            None if buf.len() > limits.max_inline_bytes => {
                return Err(ProtocolError("too big inline request".into()));
            }
            None => {
                self.inline_scanned = buf.len();
                return Ok(Inline::NeedMore);
            }
        };
        self.inline_scanned = 0;
        if end > limits.max_inline_bytes {
            return Err(ProtocolError("too big inline request".into()));
        }
        let line = buf.split_to(end + 1);
        let mut line = &line[..end];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        let args = split_inline(line)?;
        if args.len() > limits.max_args {
            return Err(ProtocolError("too many inline arguments".into()));
        }
        if args.iter().any(|a| a.len() > limits.max_bulk_bytes) {
            return Err(ProtocolError(format!(
                "an inline argument is over the limit of {} bytes",
                limits.max_bulk_bytes
            )));
        }
        if args.is_empty() {
            return Ok(Inline::Blank);
        }
        Ok(Inline::Request(args))
    }
}

/// What one inline line holds.
enum Inline {
    Request(Request),
    /// Nothing but spaces: no command.
    Blank,
    /// The line has not ended yet.
    NeedMore,
}

/// Splits an inline command line like Redis' `sdssplitargs`.
fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, ProtocolError> {
    let unbalanced = || ProtocolError("unbalanced quotes in request".into());
    let mut args = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        let mut arg = Vec::new();
        match line[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                loop {
                    let Some(&c) = line.get(i) else {
                        return Err(unbalanced());
                    };
                    i += 1;
                    if c == q {
                        // A closing quote must end the argument.
                        if line.get(i).is_some_and(|c| !c.is_ascii_whitespace()) {
                            return Err(unbalanced());
                        }
                        break;
                    }
                    if c == b'\\' && q == b'"' {
                        let Some(&e) = line.get(i) else {
                            return Err(unbalanced());
                        };
                        i += 1;
                        match e {
                            b'n' => arg.push(b'\n'),
                            b'r' => arg.push(b'\r'),
                            b't' => arg.push(b'\t'),
                            b'x' if line.len() >= i + 2 => {
                                let hex = std::str::from_utf8(&line[i..i + 2])
                                    .ok()
                                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                                match hex {
                                    Some(b) => {
                                        arg.push(b);
                                        i += 2;
                                    }
                                    None => arg.push(b'x'),
                                }
                            }
                            other => arg.push(other),
                        }
                    } else if c == b'\\' && q == b'\'' && line.get(i) == Some(&b'\'') {
                        arg.push(b'\'');
                        i += 1;
                    } else {
                        arg.push(c);
                    }
                }
            }
            _ => {
                while i < line.len() && !line[i].is_ascii_whitespace() {
                    arg.push(line[i]);
                    i += 1;
                }
            }
        }
        args.push(Bytes::from(arg));
    }
    Ok(args)
}

/// A reply, encoded per the connection's protocol version.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-CODE message`
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$3 foo`
    Bulk(Bytes),
    /// RESP3 verbatim text (`=`); a bulk string in RESP2.
    Verbatim(String),
    /// `$-1` in RESP2, `_` in RESP3.
    Null,
    /// `*n …`
    Array(Vec<Reply>),
    /// `%n …` in RESP3; a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// A bulk string from text.
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(Bytes::from(s.into()))
    }

    /// Appends the encoding of this reply for protocol `proto` (2 or 3).
    pub fn encode(&self, proto: u8, out: &mut BytesMut) {
        match self {
            Reply::Simple(s) => {
                out.extend_from_slice(b"+");
                out.extend_from_slice(clean_line(s).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(s) => {
                out.extend_from_slice(b"-");
                out.extend_from_slice(clean_line(s).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Integer(n) => {
                out.extend_from_slice(format!(":{n}\r\n").as_bytes());
            }
            Reply::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim(s) if proto >= 3 => {
                out.extend_from_slice(format!("={}\r\ntxt:", s.len() + 4).as_bytes());
                out.extend_from_slice(s.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim(s) => Reply::text(s.clone()).encode(proto, out),
            Reply::Null if proto >= 3 => out.extend_from_slice(b"_\r\n"),
            Reply::Null => out.extend_from_slice(b"$-1\r\n"),
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.encode(proto, out);
                }
            }
            Reply::Map(pairs) => {
                if proto >= 3 {
                    out.extend_from_slice(format!("%{}\r\n", pairs.len()).as_bytes());
                } else {
                    out.extend_from_slice(format!("*{}\r\n", pairs.len() * 2).as_bytes());
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
        }
    }
}

/// Simple strings and errors are one line: no CR or LF inside.
fn clean_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\r', '\n']) {
        s.replace(['\r', '\n'], " ").into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8], chunk: usize) -> Result<Vec<Request>, ProtocolError> {
        let limits = Limits::default();
        let mut p = RequestParser::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(r) = p.next(&mut buf, &limits)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    fn args(r: &Request) -> Vec<&[u8]> {
        r.iter().map(|a| &a[..]).collect()
    }

    #[test]
    fn arrays_of_bulk_strings_in_any_pieces() {
        let input = b"*3\r\n$10\r\nLOG.APPEND\r\n$1\r\ns\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n";
        for chunk in 1..input.len() {
            let got = parse_all(input, chunk).unwrap();
            assert_eq!(got.len(), 2, "chunk {chunk}");
            assert_eq!(args(&got[0]), vec![&b"LOG.APPEND"[..], b"s", b""]);
            assert_eq!(args(&got[1]), vec![&b"PING"[..]]);
        }
    }

    #[test]
    fn inline_commands_with_quotes() {
        let got = parse_all(b"PING\r\nECHO \"a b\\n\" 'c d'\nLOG.STAT x\r\n", 3).unwrap();
        assert_eq!(args(&got[0]), vec![&b"PING"[..]]);
        assert_eq!(args(&got[1]), vec![&b"ECHO"[..], b"a b\n", b"c d"]);
        assert_eq!(args(&got[2]), vec![&b"LOG.STAT"[..], b"x"]);
        assert!(parse_all(b"ECHO \"unbalanced\r\n", 100).is_err());
    }

    #[test]
    fn limits_are_checked_before_allocating() {
        let small = Limits {
            max_bulk_bytes: 10,
            max_args: 3,
            max_inline_bytes: 16,
        };
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*2\r\n$999999999999\r\n"[..]);
        assert!(p.next(&mut buf, &small).is_err());
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*4\r\n"[..]);
        assert!(p.next(&mut buf, &small).is_err());
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&[b'A'; 17][..]);
        assert!(p.next(&mut buf, &small).is_err());
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*1\r\n:12\r\n"[..]);
        assert!(p.next(&mut buf, &small).is_err());
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*1\r\n$2\r\nabXY"[..]);
        assert!(p.next(&mut buf, &small).is_err());
    }

    #[test]
    fn replies_in_both_protocols() {
        let r = Reply::Map(vec![(Reply::text("a"), Reply::Integer(1))]);
        let mut two = BytesMut::new();
        r.encode(2, &mut two);
        assert_eq!(&two[..], b"*2\r\n$1\r\na\r\n:1\r\n");
        let mut three = BytesMut::new();
        r.encode(3, &mut three);
        assert_eq!(&three[..], b"%1\r\n$1\r\na\r\n:1\r\n");
        let mut null = BytesMut::new();
        Reply::Null.encode(2, &mut null);
        Reply::Null.encode(3, &mut null);
        assert_eq!(&null[..], b"$-1\r\n_\r\n");
        let mut err = BytesMut::new();
        Reply::Error("ERR two\nlines".into()).encode(2, &mut err);
        assert_eq!(&err[..], b"-ERR two lines\r\n");
    }
}
