//! RESP2 and RESP3 on the client side: requests out, replies in.
//!
//! The reply parser is incremental: it consumes each complete element from
//! the front of the buffer as soon as it has arrived and keeps the
//! aggregates it is inside of on a stack, so a large reply is parsed once,
//! not again on every read. Every length from the wire is checked against
//! [`ReplyLimits`] before anything is allocated for it, and no allocation is
//! sized by a length alone: a bulk string is taken only once all its bytes
//! are buffered, and an aggregate grows as its elements arrive.

use bytes::{Buf, Bytes, BytesMut};

use crate::Error;

/// A reply from the server, RESP2 or RESP3.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value {
    /// `+OK`
    Simple(String),
    /// `-ERR …` or a RESP3 blob error, as text.
    Error(String),
    /// `:42`
    Int(i64),
    /// `$5\r\nhello`
    Bulk(Bytes),
    /// RESP2 `$-1` / `*-1`, RESP3 `_`.
    Null,
    /// `*n`
    Array(Vec<Value>),
    /// RESP3 `%n`: key, value pairs in the order sent.
    Map(Vec<(Value, Value)>),
    /// RESP3 `~n`
    Set(Vec<Value>),
    /// RESP3 `#t` / `#f`
    Bool(bool),
    /// RESP3 `,1.5`
    Double(f64),
    /// RESP3 `(123…`, as its digits.
    BigNumber(String),
    /// RESP3 `=`: the text without its three-letter format.
    Verbatim(Bytes),
    /// RESP3 `>n`: an out-of-band message (the connection skips these).
    Push(Vec<Value>),
}

/// A reply borrowed from a [`Pipeline`](crate::Pipeline)'s read buffer,
/// handed to the callback that reads it: the common scalar replies (an
/// integer, a simple string, an error, a bulk string, a null) cost no
/// allocation. Anything else (an aggregate, a RESP3 map, double, …) is
/// parsed in full into [`Reply::Other`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Reply<'a> {
    /// `:42`
    Int(i64),
    /// `+OK`, without the `+`.
    Simple(&'a [u8]),
    /// `-STALE …`, without the `-`.
    Error(&'a [u8]),
    /// `$5\r\nhello`: the bytes.
    Bulk(&'a [u8]),
    /// RESP2 `$-1`, RESP3 `_`.
    Null,
    /// Any other reply, owned (boxed: the common replies stay small).
    Other(Box<Value>),
}

impl Reply<'_> {
    /// The reply as an owned [`Value`] (copies a bulk string).
    pub fn to_value(&self) -> Value {
        match self {
            Reply::Int(n) => Value::Int(*n),
            Reply::Simple(s) => Value::Simple(text(s)),
            Reply::Error(e) => Value::Error(text(e)),
            Reply::Bulk(b) => Value::Bulk(Bytes::copy_from_slice(b)),
            Reply::Null => Value::Null,
            Reply::Other(v) => Value::clone(v),
        }
    }

    /// An error reply as a typed [`Error`] (`Stale`, `Mismatch`, …);
    /// `None` for any other reply.
    pub fn error(&self) -> Option<Error> {
        match self {
            Reply::Error(e) => Some(Error::from_server(&text(e))),
            Reply::Other(v) => match &**v {
                Value::Error(e) => Some(Error::from_server(e)),
                _ => None,
            },
            _ => None,
        }
    }
}

impl std::fmt::Display for Reply<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Int(n) => write!(f, ":{n}"),
            Reply::Simple(s) => write!(f, "+{}", String::from_utf8_lossy(s)),
            Reply::Error(e) => write!(f, "-{}", String::from_utf8_lossy(e)),
            Reply::Bulk(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Null => f.write_str("(nil)"),
            Reply::Other(v) => write!(f, "{v:?}"),
        }
    }
}

/// What [`Parser::peek`] found at the front of the buffer.
#[derive(Debug)]
pub(crate) enum Peek<'a> {
    /// A whole scalar reply, and the bytes it takes.
    Scalar(Reply<'a>, usize),
    /// Its end has not arrived.
    Incomplete,
    /// Not a scalar, or inside a reply: for [`Parser::parse`].
    Other,
}

/// Bounds on what one reply may make the client hold. Each field is
/// checked before the corresponding allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyLimits {
    /// Largest bulk string. Default 64 MiB: a record is at most the
    /// server's `--max-payload` (1 MiB by default), operators may raise it.
    pub max_bulk_bytes: usize,
    /// Most elements in one aggregate (a map counts its keys and values).
    /// Default 100 000: `LOG.READ` answers at most 10 000 records and
    /// `LOG.STREAMS` at most 10 000 names.
    pub max_aggregate_len: usize,
    /// Deepest nesting of aggregates. Default 8 (records are at depth 2).
    pub max_depth: usize,
    /// Most bytes one reply may take, all elements together: its wire
    /// bytes plus the in-memory size of a [`Value`] per element (so a reply
    /// of many tiny elements cannot cost ten times its wire size). Default
    /// 128 MiB: a `LOG.READ` answers at most `--max-read-bytes` (16 MiB by
    /// default) of payload, plus one record.
    pub max_reply_bytes: usize,
    /// Longest simple string, error or length line. Default 64 KiB.
    pub max_line_bytes: usize,
}

impl Default for ReplyLimits {
    fn default() -> Self {
        ReplyLimits {
            max_bulk_bytes: 64 << 20,
            max_aggregate_len: 100_000,
            max_depth: 8,
            max_reply_bytes: 128 << 20,
            max_line_bytes: 64 << 10,
        }
    }
}

/// Which aggregate an unfinished element of the stack is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Array,
    Set,
    Map,
    Push,
}

/// An aggregate whose elements have not all arrived.
#[derive(Debug)]
struct Partial {
    kind: Kind,
    /// Elements it needs in all (a map: twice its pairs).
    want: usize,
    items: Vec<Value>,
}

impl Partial {
    fn finish(self) -> Value {
        match self.kind {
            Kind::Array => Value::Array(self.items),
            Kind::Set => Value::Set(self.items),
            Kind::Push => Value::Push(self.items),
            Kind::Map => {
                let mut pairs = Vec::with_capacity(self.items.len() / 2);
                let mut it = self.items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    pairs.push((k, v));
                }
                Value::Map(pairs)
            }
        }
    }
}

/// Initial capacity of an aggregate: enough for a record or a small
/// reply, never the length the wire claims.
const AGGREGATE_INITIAL_CAPACITY: usize = 16;

/// The incremental reply parser of one connection.
#[derive(Debug)]
pub(crate) struct Parser {
    limits: ReplyLimits,
    stack: Vec<Partial>,
    /// What the reply in progress has cost so far (see `max_reply_bytes`).
    reply_bytes: usize,
}

impl Parser {
    pub(crate) fn new(limits: ReplyLimits) -> Parser {
        Parser {
            limits,
            stack: Vec::new(),
            reply_bytes: 0,
        }
    }

    /// Whether no reply is half parsed (the connection may be reused).
    pub(crate) fn is_idle(&self) -> bool {
        self.stack.is_empty() && self.reply_bytes == 0
    }

    /// Consumes complete elements from the front of `buf`; answers the
    /// reply once its last element is in, `Ok(None)` while more bytes are
    /// needed. A protocol error leaves the connection unusable.
    pub(crate) fn parse(&mut self, buf: &mut BytesMut) -> Result<Option<Value>, Error> {
        // Each turn consumes at least one header from `buf` or returns, so
        // the loop is bounded by the bytes buffered.
        loop {
            let Some(&kind) = buf.first() else {
                return Ok(None);
            };
            let Some(line_len) = self.line_len(buf)? else {
                return Ok(None);
            };
            let header = 1 + line_len + 2;
            let line = &buf[1..1 + line_len];
            let mut element = match kind {
                b'+' => {
                    let v = Value::Simple(text(line));
                    self.consume(buf, header)?;
                    v
                }
                b'-' => {
                    let v = Value::Error(text(line));
                    self.consume(buf, header)?;
                    v
                }
                b':' => {
                    let v = Value::Int(integer(line)?);
                    self.consume(buf, header)?;
                    v
                }
                b'_' => {
                    if !line.is_empty() {
                        return Err(Error::Protocol("a RESP3 null with content".into()));
                    }
                    self.consume(buf, header)?;
                    Value::Null
                }
                b'#' => {
                    let v = match line {
                        b"t" => Value::Bool(true),
                        b"f" => Value::Bool(false),
                        _ => return Err(Error::Protocol("a RESP3 boolean not t or f".into())),
                    };
                    self.consume(buf, header)?;
                    v
                }
                b',' => {
                    let t = text(line);
                    let v = Value::Double(
                        t.parse()
                            .map_err(|_| Error::Protocol(format!("not a double: {t:?}")))?,
                    );
                    self.consume(buf, header)?;
                    v
                }
                b'(' => {
                    let t = text(line);
                    let digits = t.strip_prefix('-').unwrap_or(&t);
                    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(Error::Protocol(format!("not a big number: {t:?}")));
                    }
                    self.consume(buf, header)?;
                    Value::BigNumber(t)
                }
                b'$' | b'=' | b'!' => match self.bulk_len(kind, line)? {
                    None => {
                        self.consume(buf, header)?;
                        Value::Null
                    }
                    Some(n) => {
                        // Checked against the limit in `bulk_len`, so this
                        // cannot overflow; nothing is taken until all bytes
                        // are in.
                        if !bulk_complete(buf, header, n)? {
                            return Ok(None);
                        }
                        self.count(header + n + 2)?;
                        buf.advance(header);
                        let data = buf.split_to(n).freeze();
                        buf.advance(2);
                        match kind {
                            b'$' => Value::Bulk(data),
                            b'!' => Value::Error(text(&data)),
                            _ => {
                                // `txt:` or `mkd:` before the text.
                                if data.len() < 4 || data[3] != b':' {
                                    return Err(Error::Protocol(
                                        "verbatim string without its format".into(),
                                    ));
                                }
                                Value::Verbatim(data.slice(4..))
                            }
                        }
                    }
                },
                b'*' | b'~' | b'%' | b'>' => {
                    let n = integer(line)?;
                    if n == -1 && kind == b'*' {
                        self.consume(buf, header)?;
                        Value::Null
                    } else {
                        let n = usize::try_from(n)
                            .map_err(|_| Error::Protocol(format!("bad aggregate length {n}")))?;
                        let want = if kind == b'%' { n.saturating_mul(2) } else { n };
                        if want > self.limits.max_aggregate_len {
                            return Err(Error::Protocol(format!(
                                "aggregate of {want} elements over the limit of {}",
                                self.limits.max_aggregate_len
                            )));
                        }
                        if self.stack.len() >= self.limits.max_depth {
                            return Err(Error::Protocol(format!(
                                "aggregates nested deeper than {}",
                                self.limits.max_depth
                            )));
                        }
                        self.consume(buf, header)?;
                        let partial = Partial {
                            kind: match kind {
                                b'*' => Kind::Array,
                                b'~' => Kind::Set,
                                b'%' => Kind::Map,
                                _ => Kind::Push,
                            },
                            want,
                            items: Vec::with_capacity(want.min(AGGREGATE_INITIAL_CAPACITY)),
                        };
                        if want > 0 {
                            self.stack.push(partial);
                            continue;
                        }
                        partial.finish()
                    }
                }
                b'|' => {
                    return Err(Error::Protocol("RESP3 attributes are not supported".into()));
                }
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected reply type byte 0x{other:02x}"
                    )));
                }
            };
            // Hand the element to the aggregate it belongs to, finishing
            // every aggregate it completes; at the bottom it is the reply.
            loop {
                let Some(top) = self.stack.last_mut() else {
                    self.reply_bytes = 0;
                    return Ok(Some(element));
                };
                top.items.push(element);
                if top.items.len() < top.want {
                    break;
                }
                let Some(done) = self.stack.pop() else {
                    return Err(Error::Protocol("parser stack underflow".into()));
                };
                element = done.finish();
            }
        }
    }

    /// The length of the line after the type byte, without its CRLF;
    /// `Ok(None)` if its end has not arrived.
    #[inline]
    fn line_len(&self, buf: &[u8]) -> Result<Option<usize>, Error> {
        let max = self.limits.max_line_bytes;
        let rest = &buf[1..];
        let window = &rest[..rest.len().min(max + 2)];
        let Some(lf) = window.iter().position(|&b| b == b'\n') else {
            if rest.len() >= max + 2 {
                return Err(Error::Protocol(format!(
                    "a reply line longer than {max} bytes"
                )));
            }
            return Ok(None);
        };
        if lf == 0 || rest[lf - 1] != b'\r' {
            return Err(Error::Protocol("a reply line not ended by CRLF".into()));
        }
        Ok(Some(lf - 1))
    }

    /// The length of a bulk-like string (`$`, `=`, `!`) from its header
    /// line, checked against `max_bulk_bytes`; `None` for RESP2's `$-1`.
    fn bulk_len(&self, kind: u8, line: &[u8]) -> Result<Option<usize>, Error> {
        let n = integer(line)?;
        if n == -1 && kind == b'$' {
            return Ok(None);
        }
        let n = usize::try_from(n).map_err(|_| Error::Protocol(format!("bad bulk length {n}")))?;
        if n > self.limits.max_bulk_bytes {
            return Err(Error::Protocol(format!(
                "bulk length {n} over the limit of {}",
                self.limits.max_bulk_bytes
            )));
        }
        Ok(Some(n))
    }

    /// A whole scalar reply at the front of `buf`, borrowed from it, and
    /// how many bytes it takes; the caller consumes them once done with
    /// the reply. Only between replies (else [`Peek::Other`]), and only
    /// for the common scalars (`+`, `-`, `:`, `$`, `_`): the rest is for
    /// [`Parser::parse`]. The same limits hold as there.
    #[inline]
    pub(crate) fn peek<'a>(&self, buf: &'a [u8]) -> Result<Peek<'a>, Error> {
        if !self.is_idle() {
            return Ok(Peek::Other);
        }
        let Some(&kind) = buf.first() else {
            return Ok(Peek::Incomplete);
        };
        if !matches!(kind, b'+' | b'-' | b':' | b'$' | b'_') {
            return Ok(Peek::Other);
        }
        let Some(line_len) = self.line_len(buf)? else {
            return Ok(Peek::Incomplete);
        };
        let header = 1 + line_len + 2;
        let line = &buf[1..1 + line_len];
        let (reply, used) = match kind {
            b'+' => (Reply::Simple(line), header),
            b'-' => (Reply::Error(line), header),
            b':' => (Reply::Int(integer(line)?), header),
            b'_' => {
                if !line.is_empty() {
                    return Err(Error::Protocol("a RESP3 null with content".into()));
                }
                (Reply::Null, header)
            }
            _ => match self.bulk_len(kind, line)? {
                None => (Reply::Null, header),
                Some(n) => {
                    if !bulk_complete(buf, header, n)? {
                        return Ok(Peek::Incomplete);
                    }
                    (Reply::Bulk(&buf[header..header + n]), header + n + 2)
                }
            },
        };
        // One element: its cost as `count` would reckon it.
        if used.saturating_add(std::mem::size_of::<Value>()) > self.limits.max_reply_bytes {
            return Err(Error::Protocol(format!(
                "a reply over the limit of {} bytes",
                self.limits.max_reply_bytes
            )));
        }
        Ok(Peek::Scalar(reply, used))
    }

    /// Counts one element of `n` wire bytes against the reply limit and
    /// takes them from the front of `buf`.
    fn consume(&mut self, buf: &mut BytesMut, n: usize) -> Result<(), Error> {
        self.count(n)?;
        buf.advance(n);
        Ok(())
    }

    /// Counts one element of `n` wire bytes against the reply limit.
    fn count(&mut self, n: usize) -> Result<(), Error> {
        let cost = n.saturating_add(std::mem::size_of::<Value>());
        self.reply_bytes = self.reply_bytes.saturating_add(cost);
        if self.reply_bytes > self.limits.max_reply_bytes {
            return Err(Error::Protocol(format!(
                "a reply over the limit of {} bytes",
                self.limits.max_reply_bytes
            )));
        }
        Ok(())
    }
}

/// Whether the bulk string of `n` bytes after a header of `header` bytes
/// has arrived whole, with its CRLF.
fn bulk_complete(buf: &[u8], header: usize, n: usize) -> Result<bool, Error> {
    if buf.len() < header + n + 2 {
        return Ok(false);
    }
    if &buf[header + n..header + n + 2] != b"\r\n" {
        return Err(Error::Protocol("bulk string not followed by CRLF".into()));
    }
    Ok(true)
}

fn text(line: &[u8]) -> String {
    String::from_utf8_lossy(line).into_owned()
}

/// A RESP integer line: optional minus, 1 to 19 digits, no overflow.
#[inline]
fn integer(line: &[u8]) -> Result<i64, Error> {
    let bad = || Error::Protocol(format!("not an integer: {:?}", text(line)));
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(bad());
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(bad());
        }
        let d = i64::from(d - b'0');
        n = n
            .checked_mul(10)
            .and_then(|n| {
                if negative {
                    n.checked_sub(d)
                } else {
                    n.checked_add(d)
                }
            })
            .ok_or_else(bad)?;
    }
    Ok(n)
}

/// A request as a RESP array of bulk strings.
pub(crate) fn encode_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, args);
    out
}

/// Appends a request to `out` as a RESP array of bulk strings
/// (`*n\r\n` then `$len\r\nbytes\r\n` per argument), without allocating
/// beyond `out`'s growth.
pub(crate) fn encode_into(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.reserve(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    push_header(out, b'*', args.len());
    for a in args {
        push_header(out, b'$', a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// `kind`, `n` in decimal, CRLF.
fn push_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    // A usize has at most 20 decimal digits: the loop stays in the array.
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.push(kind);
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8], limits: ReplyLimits) -> Result<Vec<Value>, Error> {
        let mut p = Parser::new(limits);
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(v) = p.parse(&mut buf)? {
            out.push(v);
        }
        assert!(buf.is_empty(), "bytes left: {buf:?}");
        Ok(out)
    }

    const SAMPLE: &[u8] = b"+OK\r\n-ERR x\r\n:-42\r\n$5\r\nhe\r\no\r\n$-1\r\n*-1\r\n_\r\n#t\r\n,1.5\r\n(123\r\n=8\r\ntxt:abcd\r\n!3\r\nBAD\r\n*2\r\n*3\r\n:0\r\n:7\r\n$1\r\nx\r\n*0\r\n%1\r\n+k\r\n~1\r\n:1\r\n>1\r\n+p\r\n";

    fn sample() -> Vec<Value> {
        vec![
            Value::Simple("OK".into()),
            Value::Error("ERR x".into()),
            Value::Int(-42),
            Value::Bulk(Bytes::from_static(b"he\r\no")),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Bool(true),
            Value::Double(1.5),
            Value::BigNumber("123".into()),
            Value::Verbatim(Bytes::from_static(b"abcd")),
            Value::Error("BAD".into()),
            Value::Array(vec![
                Value::Array(vec![
                    Value::Int(0),
                    Value::Int(7),
                    Value::Bulk(Bytes::from_static(b"x")),
                ]),
                Value::Array(vec![]),
            ]),
            Value::Map(vec![(
                Value::Simple("k".into()),
                Value::Set(vec![Value::Int(1)]),
            )]),
            Value::Push(vec![Value::Simple("p".into())]),
        ]
    }

    #[test]
    fn parses_every_type_at_once() {
        assert_eq!(parse_all(SAMPLE, ReplyLimits::default()).unwrap(), sample());
    }

    /// The same bytes arriving one at a time give the same replies: the
    /// parser keeps its place across reads.
    #[test]
    fn parses_byte_by_byte() {
        let mut p = Parser::new(ReplyLimits::default());
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &b in SAMPLE {
            buf.extend_from_slice(&[b]);
            while let Some(v) = p.parse(&mut buf).unwrap() {
                out.push(v);
            }
        }
        assert_eq!(out, sample());
        assert!(p.is_idle());
    }

    /// Replies a parser with 10-byte bulks and 8-byte lines refuses, with
    /// no aggregate around them (too long, or malformed): `parse` and
    /// `peek` alike, so both tests use this one list.
    const BAD_SCALARS: &[&[u8]] = &[
        b"$11\r\n",
        b"+123456789\r\n",
        b"+1234567890",
        b"$1\r\nxy\r\n",
        b":x\r\n",
        b"_x\r\n",
        b"+a\rb\n",
    ];

    #[test]
    fn refuses_lengths_over_the_limits_before_their_bytes_arrive() {
        let limits = ReplyLimits {
            max_bulk_bytes: 10,
            max_aggregate_len: 3,
            max_depth: 2,
            // Three bulks of 10 in an array (55 wire bytes, 4 elements) are
            // one byte too many.
            max_reply_bytes: 54 + 4 * std::mem::size_of::<Value>(),
            max_line_bytes: 8,
        };
        // And what only this test asks of the parser: aggregates over the
        // limits, an absurd length, an unknown type, a bad boolean.
        let more: [&[u8]; 8] = [
            b"*4\r\n",
            b"%2\r\n",
            b"*1\r\n*1\r\n*1\r\n",
            b"$9999999999999999999999\r\n",
            b"*-2\r\n",
            b"*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n",
            b"?\r\n",
            b"#x\r\n",
        ];
        for &bad in BAD_SCALARS.iter().chain(&more) {
            let r = parse_all(bad, limits);
            assert!(
                matches!(r, Err(Error::Protocol(_))),
                "{:?}: {r:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // Within the limits the same shapes parse.
        assert_eq!(
            parse_all(b"$10\r\n0123456789\r\n", limits).unwrap().len(),
            1
        );
        assert_eq!(parse_all(b"*1\r\n*1\r\n:1\r\n", limits).unwrap().len(), 1);
        let one_more = ReplyLimits {
            max_reply_bytes: limits.max_reply_bytes + 1,
            ..limits
        };
        let three = b"*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n";
        assert_eq!(parse_all(three, one_more).unwrap().len(), 1);
    }

    #[test]
    fn an_incomplete_reply_waits_for_more() {
        let mut p = Parser::new(ReplyLimits::default());
        let mut buf = BytesMut::from(&b"*2\r\n:1\r\n$3\r\nab"[..]);
        assert_eq!(p.parse(&mut buf).unwrap(), None);
        assert!(!p.is_idle());
        buf.extend_from_slice(b"c\r\n");
        assert_eq!(
            p.parse(&mut buf).unwrap(),
            Some(Value::Array(vec![
                Value::Int(1),
                Value::Bulk(Bytes::from_static(b"abc"))
            ]))
        );
        assert!(p.is_idle());
    }

    proptest::proptest! {
        /// Any split of the input into reads gives the same replies.
        #[test]
        fn any_split_parses_the_same(cuts in proptest::collection::vec(0..SAMPLE.len(), 0..12)) {
            let mut cuts = cuts;
            cuts.sort_unstable();
            cuts.push(SAMPLE.len());
            let mut p = Parser::new(ReplyLimits::default());
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut from = 0;
            for to in cuts {
                buf.extend_from_slice(&SAMPLE[from..to.max(from)]);
                from = to.max(from);
                while let Some(v) = p.parse(&mut buf).unwrap() {
                    out.push(v);
                }
            }
            proptest::prop_assert_eq!(out, sample());
        }

        /// Arbitrary bytes never panic, and never leave more buffered than
        /// the limits allow while the parser waits.
        #[test]
        fn arbitrary_bytes_are_refused_or_parsed(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let limits = ReplyLimits { max_bulk_bytes: 64, max_aggregate_len: 8, max_depth: 3, max_reply_bytes: 4096, max_line_bytes: 32 };
            let mut p = Parser::new(limits);
            let mut buf = BytesMut::from(&bytes[..]);
            for _ in 0..bytes.len() + 1 {
                match p.parse(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) => {
                        proptest::prop_assert!(buf.len() <= 1 + 32 + 2 + 64 + 2);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
    }

    #[test]
    fn encodes_requests_as_bulk_arrays() {
        assert_eq!(
            encode_command(&[b"PING", b""]),
            b"*2\r\n$4\r\nPING\r\n$0\r\n\r\n"
        );
        let long = vec![b'x'; 1234];
        let args: Vec<&[u8]> = std::iter::repeat_n(&long[..], 10).collect();
        let encoded = encode_command(&args);
        assert!(encoded.starts_with(b"*10\r\n$1234\r\nxxx"));
        assert_eq!(encoded.len(), 5 + 10 * (7 + 1234 + 2));
    }

    /// What a pipeline's reader does: a scalar borrowed through `peek`,
    /// anything else through `parse`, consumed once handled.
    fn peek_or_parse(p: &mut Parser, buf: &mut BytesMut) -> Result<Option<Value>, Error> {
        match p.peek(buf)? {
            Peek::Scalar(r, used) => {
                let v = r.to_value();
                buf.advance(used);
                Ok(Some(v))
            }
            Peek::Incomplete => Ok(None),
            Peek::Other => p.parse(buf),
        }
    }

    /// The borrowed fast path answers what the parser answers, byte by
    /// byte as at once, and leaves every prefix waiting.
    #[test]
    fn peek_agrees_with_parse() {
        for step in [1, 3, SAMPLE.len()] {
            let mut p = Parser::new(ReplyLimits::default());
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for chunk in SAMPLE.chunks(step) {
                buf.extend_from_slice(chunk);
                while let Some(v) = peek_or_parse(&mut p, &mut buf).unwrap() {
                    out.push(v);
                }
            }
            assert_eq!(out, sample(), "step {step}");
            assert!(buf.is_empty() && p.is_idle());
        }
        let p = Parser::new(ReplyLimits::default());
        let one = b"$5\r\nhello\r\n";
        for cut in 0..one.len() {
            assert!(
                matches!(p.peek(&one[..cut]).unwrap(), Peek::Incomplete),
                "{cut}"
            );
        }
        match p.peek(b"-STALE token 1\r\n:5\r\n").unwrap() {
            Peek::Scalar(Reply::Error(e), 16) => assert_eq!(e, b"STALE token 1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn peek_keeps_the_limits() {
        let limits = ReplyLimits {
            max_bulk_bytes: 10,
            max_line_bytes: 8,
            ..ReplyLimits::default()
        };
        let p = Parser::new(limits);
        for bad in BAD_SCALARS {
            assert!(p.peek(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
