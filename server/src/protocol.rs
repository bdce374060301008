//! The Redis protocol: requests in (RESP arrays of bulk strings, or inline
//! commands), replies out (RESP2 or RESP3).
//!
//! The request parser is incremental: a partial request keeps its progress
//! across reads (a 10 MiB payload arriving in 1 KiB pieces is looked at
//! once, not re-parsed per piece). Every length a client claims is checked
//! against a limit before anything is allocated for it, and payloads are
//! handed out as slices of the read buffer, without copying: a request
//! received whole is one frame and the places of its arguments in it
//! ([`Request`]), so parsing it takes one reference count, not one per
//! argument. The arguments
//! of a request not yet complete are counted ([`RequestParser::held_bytes`])
//! so that the connection can bound them with its query buffer.
//!
//! Error texts are Redis' own (`networking.c`), so that clients and tools
//! matching them keep working; where a configured limit is the reason, the
//! numbers follow Redis' words.

use std::ops::Deref;

use bytes::{Buf, Bytes, BytesMut};
use smallvec::SmallVec;

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

/// Bulk strings at least this long get a buffer of their exact size (as
/// Redis does from `PROTO_MBULK_BIG_ARG`): no doubling past what was
/// claimed, and the argument is handed out without a copy.
const BIG_ARG_BYTES: usize = 32 << 10;

/// What one argument costs beyond its bytes: its `Bytes` handle in the
/// request's vector and the `$len\r\n…\r\n` framing its slice keeps alive.
pub const ARG_OVERHEAD_BYTES: usize = 48;

/// Before authentication (with a password configured) Redis allows only
/// tiny requests; so do we, with the same numbers.
pub const UNAUTHENTICATED_MAX_ARGS: usize = 10;
/// See [`UNAUTHENTICATED_MAX_ARGS`].
pub const UNAUTHENTICATED_MAX_BULK_BYTES: usize = 16 << 10;

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
    /// Bytes held by the arguments of the unfinished request (with
    /// [`ARG_OVERHEAD_BYTES`] each).
    held: usize,
    /// Whether the client still has to authenticate: requests are limited
    /// to [`UNAUTHENTICATED_MAX_ARGS`] and
    /// [`UNAUTHENTICATED_MAX_BULK_BYTES`].
    unauthenticated: bool,
    /// Bytes of an unfinished inline line already searched for its `\n`:
    /// searching from there keeps a line that trickles in byte by byte
    /// linear, not quadratic, in its length.
    inline_scanned: usize,
}

/// One request: the command and its arguments, never empty once parsed.
///
/// A request received whole (the common case) is its frame, one `Bytes`,
/// and where each argument lies in it: parsing it costs one reference
/// count for the frame, none per argument. Commands borrow the arguments
/// ([`Request::args`]); only what must outlive the request (a record's
/// payload on its way to the WAL, a stream name) is cut out of the frame,
/// still without a copy ([`ArgRef::to_bytes`]).
#[derive(Clone)]
pub struct Request {
    parts: Parts,
}

/// Where a request's arguments are.
#[derive(Clone)]
enum Parts {
    /// Slices `start..end` of one frame. A `u32` each: a request received
    /// whole past 4 GiB takes the other form.
    Framed {
        frame: Bytes,
        spans: SmallVec<[(u32, u32); INLINE_ARGS]>,
    },
    /// One `Bytes` each: a request that arrived in pieces (its arguments
    /// were cut out of the input as they came) or an inline command.
    Separate(Vec<Bytes>),
}

/// Arguments a request holds without allocating: more than any command
/// of the hot path takes (`LOG.APPEND stream token payload` is four).
const INLINE_ARGS: usize = 8;

/// One argument of a request, borrowed while its command runs: its bytes,
/// and the buffer they lie in, from which [`ArgRef::to_bytes`] cuts them out
/// without a copy.
#[derive(Clone, Copy)]
pub struct ArgRef<'a> {
    bytes: &'a [u8],
    /// The `Bytes` that holds `bytes`.
    owner: &'a Bytes,
}

impl<'a> ArgRef<'a> {
    /// The argument as a `Bytes` sharing the request's buffer: for what
    /// outlives the request.
    pub fn to_bytes(&self) -> Bytes {
        self.owner.slice_ref(self.bytes)
    }

    /// The argument's bytes, for as long as the request lives.
    pub fn as_slice(&self) -> &'a [u8] {
        self.bytes
    }
}

impl Deref for ArgRef<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl AsRef<[u8]> for ArgRef<'_> {
    fn as_ref(&self) -> &[u8] {
        self.bytes
    }
}

impl std::fmt::Debug for ArgRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As `Bytes` shows itself: `b"…"` with escapes.
        std::fmt::Debug::fmt(&Bytes::copy_from_slice(self.bytes), f)
    }
}

/// A request's arguments as its commands see them: a view that borrows
/// the request and hands out each [`ArgRef`] when asked, so a command
/// that looks at three arguments does not first gather all of them
/// (gathering them was 4.5 % of a stale rejection's instructions at
/// pipeline 16).
#[derive(Clone, Copy)]
pub struct Args<'a> {
    parts: ArgParts<'a>,
}

/// Where an [`Args`]' arguments are: [`Parts`], borrowed.
#[derive(Clone, Copy)]
enum ArgParts<'a> {
    Framed {
        frame: &'a Bytes,
        spans: &'a [(u32, u32)],
    },
    Separate(&'a [Bytes]),
}

/// The arguments gathered, for commands that take them as a slice.
pub type ArgRefs<'a> = SmallVec<[ArgRef<'a>; INLINE_ARGS]>;

impl<'a> Args<'a> {
    /// How many arguments.
    pub fn len(&self) -> usize {
        match self.parts {
            ArgParts::Framed { spans, .. } => spans.len(),
            ArgParts::Separate(args) => args.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<ArgRef<'a>> {
        match self.parts {
            ArgParts::Framed { frame, spans } => spans.get(i).map(|&(start, end)| ArgRef {
                bytes: &frame[start as usize..end as usize],
                owner: frame,
            }),
            ArgParts::Separate(args) => args.get(i).map(|a| ArgRef { bytes: a, owner: a }),
        }
    }

    /// The first argument, if any.
    pub fn first(&self) -> Option<ArgRef<'a>> {
        self.get(0)
    }

    /// The arguments from `start` on, as `&args[start..]` is.
    ///
    /// # Panics
    ///
    /// If `start` is past the last argument's end.
    pub fn from(&self, start: usize) -> Args<'a> {
        let parts = match self.parts {
            ArgParts::Framed { frame, spans } => ArgParts::Framed {
                frame,
                spans: &spans[start..],
            },
            ArgParts::Separate(args) => ArgParts::Separate(&args[start..]),
        };
        Args { parts }
    }

    /// The arguments, in order.
    pub fn iter(&self) -> ArgsIter<'a> {
        ArgsIter {
            args: *self,
            next: 0,
        }
    }

    /// The arguments gathered into a vector of [`ArgRef`], for the
    /// commands that match on a slice (none of the frequent ones).
    pub fn refs(&self) -> ArgRefs<'a> {
        self.iter().collect()
    }
}

/// Argument `i`'s bytes, as a slice is indexed.
///
/// # Panics
///
/// If there is no argument `i`.
impl std::ops::Index<usize> for Args<'_> {
    type Output = [u8];

    fn index(&self, i: usize) -> &[u8] {
        match self.get(i) {
            Some(arg) => arg.as_slice(),
            None => panic!("argument {i} of {}", self.len()),
        }
    }
}

/// The arguments of an [`Args`], in order.
pub struct ArgsIter<'a> {
    args: Args<'a>,
    next: usize,
}

impl<'a> Iterator for ArgsIter<'a> {
    type Item = ArgRef<'a>;

    fn next(&mut self) -> Option<ArgRef<'a>> {
        let arg = self.args.get(self.next)?;
        self.next += 1;
        Some(arg)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.args.len().saturating_sub(self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for ArgsIter<'_> {}

impl<'a> IntoIterator for Args<'a> {
    type Item = ArgRef<'a>;
    type IntoIter = ArgsIter<'a>;

    fn into_iter(self) -> ArgsIter<'a> {
        self.iter()
    }
}

impl Request {
    /// Arguments in the request, the command's name included.
    pub fn len(&self) -> usize {
        match &self.parts {
            Parts::Framed { spans, .. } => spans.len(),
            Parts::Separate(args) => args.len(),
        }
    }

    /// Whether the request has no arguments (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `i` (0 is the command's name).
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        match &self.parts {
            Parts::Framed { frame, spans } => spans
                .get(i)
                .map(|&(start, end)| &frame[start as usize..end as usize]),
            Parts::Separate(args) => args.get(i).map(|a| &a[..]),
        }
    }

    /// Argument `i` as a `Bytes` sharing the request's buffer: for what
    /// outlives the request.
    pub fn bytes(&self, i: usize) -> Option<Bytes> {
        match &self.parts {
            Parts::Framed { frame, spans } => spans
                .get(i)
                .map(|&(start, end)| frame.slice(start as usize..end as usize)),
            Parts::Separate(args) => args.get(i).cloned(),
        }
    }

    /// The arguments' bytes, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            request: self,
            next: 0,
        }
    }

    /// The arguments, borrowed: what a command runs on.
    pub fn args(&self) -> Args<'_> {
        let parts = match &self.parts {
            Parts::Framed { frame, spans } => ArgParts::Framed { frame, spans },
            Parts::Separate(args) => ArgParts::Separate(args),
        };
        Args { parts }
    }

    /// What the request holds in memory: its arguments, with
    /// [`ARG_OVERHEAD_BYTES`] each.
    pub fn memory_bytes(&self) -> usize {
        let args: usize = match &self.parts {
            Parts::Framed { spans, .. } => spans.iter().map(|&(s, e)| (e - s) as usize).sum(),
            Parts::Separate(args) => args.iter().map(Bytes::len).sum(),
        };
        args + self.len() * ARG_OVERHEAD_BYTES
    }
}

impl FromIterator<Bytes> for Request {
    fn from_iter<I: IntoIterator<Item = Bytes>>(args: I) -> Request {
        Request {
            parts: Parts::Separate(args.into_iter().collect()),
        }
    }
}

impl From<Vec<Bytes>> for Request {
    fn from(args: Vec<Bytes>) -> Request {
        Request {
            parts: Parts::Separate(args),
        }
    }
}

/// Argument `i`, as a slice is indexed.
///
/// # Panics
///
/// If the request has no argument `i`.
impl std::ops::Index<usize> for Request {
    type Output = [u8];

    fn index(&self, i: usize) -> &[u8] {
        match self.get(i) {
            Some(arg) => arg,
            None => panic!("argument {i} of a request of {}", self.len()),
        }
    }
}

/// The arguments of a request, in order ([`Request::iter`]).
pub struct Iter<'a> {
    request: &'a Request,
    next: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let arg = self.request.get(self.next)?;
        self.next += 1;
        Some(arg)
    }
}

impl<'a> IntoIterator for &'a Request {
    type Item = &'a [u8];
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// Requests are equal when their arguments are, however they are held.
impl PartialEq for Request {
    fn eq(&self, other: &Request) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Request {}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.iter().map(Bytes::copy_from_slice))
            .finish()
    }
}

/// Whether a request looks like HTTP rather than Redis: a browser made to
/// post to this port (a cross-protocol attack) sends `POST / HTTP/1.1`
/// then headers such as `Host: …`, and the body could hold commands. Redis
/// closes such connections at once (`securityWarningCommand`); so do we,
/// and `GET /…` too, since this server has no GET.
pub fn looks_like_http(request: &Request) -> bool {
    let Some(cmd) = request.get(0) else {
        return false;
    };
    if cmd.eq_ignore_ascii_case(b"POST") || cmd.eq_ignore_ascii_case(b"HOST:") {
        return true;
    }
    cmd.eq_ignore_ascii_case(b"GET") && request.get(1).is_some_and(|path| path.starts_with(b"/"))
}

/// [`looks_like_http`] for a request whose name the caller has
/// upper-cased already (`cmd::parse::upper` of argument 0: ASCII, or
/// empty, which is none of these words).
pub fn looks_like_http_named(upper_cmd: &str, request: &Request) -> bool {
    match upper_cmd {
        "POST" | "HOST:" => true,
        "GET" => request.get(1).is_some_and(|path| path.starts_with(b"/")),
        _ => false,
    }
}

/// Where the first CRLF of a length line is, if within [`MAX_LEN_LINE`]
/// bytes: the search stops there (a longer line is refused anyway), so a
/// large buffer with no CRLF is not scanned again on every read.
fn line_end(buf: &[u8]) -> Option<usize> {
    buf[..buf.len().min(MAX_LEN_LINE + 2)]
        .windows(2)
        .position(|w| w == b"\r\n")
}

/// Longest length line (`*…` or `$…`) accepted, CRLF excluded. The same
/// limit applies whether the line arrives whole or in pieces.
const MAX_LEN_LINE: usize = 32;

/// Digits [`plain_len`] reads at most: below 10^18, no overflow.
const PLAIN_LEN_DIGITS: usize = 18;

/// A length line at the front of `buf` in its plainest form, a type byte
/// then 1 to 18 digits with no leading zero, then CRLF: its value and the
/// line's length, CRLF included, in one pass. `None` for anything else
/// (more bytes needed, a sign, an error), which [`line_end`] and
/// [`parse_len`] then read as before, wording the error: every line this
/// accepts, they accept with the same value. Clients write lengths this
/// way, and the three passes were a fifth of a stale rejection's
/// instructions at pipeline 16.
#[inline(always)]
fn plain_len(buf: &[u8]) -> Option<(usize, usize)> {
    let digits = buf.get(1..)?;
    let mut n: u64 = 0;
    let mut i = 0;
    while let Some(&d) = digits.get(i) {
        let v = d.wrapping_sub(b'0');
        if v > 9 {
            break;
        }
        if i == PLAIN_LEN_DIGITS {
            return None;
        }
        n = n * 10 + u64::from(v);
        i += 1;
    }
    if i == 0 || (i > 1 && digits[0] == b'0') || digits.get(i..i + 2)? != b"\r\n" {
        return None;
    }
    debug_assert!(i < MAX_LEN_LINE);
    Some((usize::try_from(n).ok()?, 1 + i + 2))
}

/// Parses a length strictly, as Redis does: an optional `-`, then digits,
/// with no `+` and no leading zeros.
fn parse_len(line: &[u8], what: &str) -> Result<i64, ProtocolError> {
    let invalid = || ProtocolError(format!("invalid {what} length"));
    let (negative, digits) = match line.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    if digits.len() > 1 && digits[0] == b'0' {
        return Err(invalid());
    }
    let n = ascii_u64(digits).ok_or_else(invalid)?;
    if negative {
        // Down to i64::MIN, whose magnitude is one past i64::MAX.
        0i64.checked_sub_unsigned(n).ok_or_else(invalid)
    } else {
        i64::try_from(n).map_err(|_| invalid())
    }
}

/// The value of a non-empty run of ASCII digits, `None` for anything else
/// or on overflow: what `str::parse::<u64>` accepts without a sign, in one
/// pass with no UTF-8 check (this runs several times per request).
pub(crate) fn ascii_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        let v = d.wrapping_sub(b'0');
        if v > 9 {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(v))?;
    }
    Some(n)
}

impl RequestParser {
    /// The request of `expected` arguments whose header is the first
    /// `header` bytes of `buf`, when all of it is already in `buf` and
    /// plainly valid (the common case under pipelining): one pass over the
    /// headers, one split of the buffer (the header goes with the frame:
    /// no second cut), each argument a place in it. `None` leaves `buf`
    /// untouched for the step-by-step parser, which also words every error.
    fn whole_request(
        &self,
        buf: &mut BytesMut,
        header: usize,
        expected: usize,
        limits: &Limits,
    ) -> Option<Request> {
        // A bound on the work given up when the request is not all here
        // yet (the step-by-step parser starts over).
        const MAX_FAST_ARGS: usize = 64;
        if expected > MAX_FAST_ARGS {
            return None;
        }
        let mut spans = SmallVec::<[(u32, u32); INLINE_ARGS]>::with_capacity(expected);
        let mut pos = header;
        for _ in 0..expected {
            let rest = buf.get(pos..)?;
            if rest.first() != Some(&b'$') {
                return None;
            }
            let (len, line) = plain_len(rest)?;
            let len = self.allowed_bulk_len(len, limits).ok()?;
            let start = pos + line;
            let stop = start.checked_add(len)?;
            if buf.get(stop..stop + 2)? != b"\r\n" {
                return None;
            }
            spans.push((u32::try_from(start).ok()?, u32::try_from(stop).ok()?));
            pos = stop + 2;
        }
        let frame = buf.split_to(pos).freeze();
        Some(Request {
            parts: Parts::Framed { frame, spans },
        })
    }

    /// The length of a bulk string from its `$` line (without the `$`),
    /// within the limits; the error says which rule it broke.
    fn bulk_len(&self, line: &[u8], limits: &Limits) -> Result<usize, ProtocolError> {
        let len = usize::try_from(parse_len(line, "bulk")?)
            .map_err(|_| ProtocolError("invalid bulk length".into()))?;
        self.allowed_bulk_len(len, limits)
    }

    /// `len` if a bulk string that long is within the limits; the error
    /// says which rule it broke.
    fn allowed_bulk_len(&self, len: usize, limits: &Limits) -> Result<usize, ProtocolError> {
        if len > limits.max_bulk_bytes {
            return Err(ProtocolError(format!(
                "invalid bulk length: {len} bytes is over the limit of {} (--max-bulk-bytes)",
                limits.max_bulk_bytes
            )));
        }
        if self.unauthenticated && len > UNAUTHENTICATED_MAX_BULK_BYTES {
            return Err(ProtocolError("unauthenticated bulk length".into()));
        }
        Ok(len)
    }

    /// A parser between requests.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a request is partly received.
    pub fn in_request(&self) -> bool {
        !matches!(self.state, State::Start)
    }

    /// Memory held by the arguments already parsed out of the request not
    /// yet complete: they no longer sit in the input buffer, yet count as
    /// much as if they did.
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Limits requests as Redis does before a client authenticates (at
    /// most 10 arguments, bulk strings of at most 16 KiB), or lifts those
    /// limits again.
    pub fn set_unauthenticated(&mut self, unauthenticated: bool) {
        self.unauthenticated = unauthenticated;
    }

    /// Takes the next whole request from the front of `buf`, consuming its
    /// bytes; `Ok(None)` when more bytes are needed (the progress is kept).
    pub fn next(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Request>, ProtocolError> {
        // Between requests, the common cases in a few instructions: no
        // input, or an array received whole. Anything else (and every
        // error) is the step-by-step parser's.
        if matches!(self.state, State::Start) && self.inline_scanned == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            if let Some(request) = self.whole_array(buf, limits) {
                self.held = 0;
                return Ok(Some(request));
            }
        }
        self.next_in_steps(buf, limits)
    }

    /// A request at the front of `buf`, when it is an array received whole
    /// whose header is in its plainest form and within the limits; `None`
    /// leaves `buf` untouched.
    #[inline]
    fn whole_array(&self, buf: &mut BytesMut, limits: &Limits) -> Option<Request> {
        if buf.first() != Some(&b'*') {
            return None;
        }
        let (n, line) = plain_len(buf)?;
        let within = n > 0
            && n <= limits.max_args
            && !(self.unauthenticated && n > UNAUTHENTICATED_MAX_ARGS);
        if !within {
            return None;
        }
        self.whole_request(buf, line, n, limits)
    }

    /// [`RequestParser::next`], one step at a time: kept out of line, so
    /// that the common case does not pay for its frame.
    #[inline(never)]
    fn next_in_steps(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Request>, ProtocolError> {
        let next = self.parse(buf, limits);
        if !matches!(next, Ok(None)) {
            // A request handed out, or the connection ends: nothing is held.
            self.held = 0;
        }
        next
    }

    fn parse(
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
                            Inline::Request(args) => return Ok(Some(Request::from(args))),
                            // A blank line: no command; look for the next.
                            Inline::Blank => continue,
                            Inline::NeedMore => return Ok(None),
                        }
                    }
                    let (n, line) = match plain_len(buf) {
                        // Below 10^18: fits.
                        Some((n, line)) => (n as i64, line),
                        None => {
                            let Some(end) = line_end(buf).filter(|&e| e <= MAX_LEN_LINE) else {
                                if buf.len() > MAX_LEN_LINE {
                                    return Err(ProtocolError("invalid multibulk length".into()));
                                }
                                return Ok(None);
                            };
                            (parse_len(&buf[1..end], "multibulk")?, end + 2)
                        }
                    };
                    if n <= 0 {
                        // `*0` and `*-1` are no command at all.
                        buf.advance(line);
                        continue;
                    }
                    if n as usize > limits.max_args {
                        buf.advance(line);
                        return Err(ProtocolError(format!(
                            "invalid multibulk length: {n} arguments is over the limit of {} \
                             (--max-args)",
                            limits.max_args
                        )));
                    }
                    if self.unauthenticated && n as usize > UNAUTHENTICATED_MAX_ARGS {
                        buf.advance(line);
                        return Err(ProtocolError("unauthenticated multibulk length".into()));
                    }
                    let expected = n as usize;
                    if let Some(args) = self.whole_request(buf, line, expected, limits) {
                        return Ok(Some(args));
                    }
                    buf.advance(line);
                    // Grow as arguments arrive; never trust the count with
                    // an allocation.
                    self.state = State::Array {
                        expected,
                        args: Vec::with_capacity(expected.min(16)),
                    };
                }
                State::Array { expected, args } => {
                    if args.len() == expected {
                        return Ok(Some(Request::from(args)));
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
                    let len = self.bulk_len(&buf[1..end], limits)?;
                    buf.advance(end + 2);
                    self.state = State::Bulk {
                        expected,
                        args,
                        len,
                    };
                }
                State::Bulk {
                    expected,
                    mut args,
                    len,
                } => {
                    if buf.len() < len + 2 {
                        if len >= BIG_ARG_BYTES && buf.capacity() < len + 2 {
                            // A buffer of exactly the argument's size, once:
                            // not one growth per read, nor a doubling past
                            // what the client claimed. The bytes already
                            // here are the argument's first (its header was
                            // consumed), so the copy is small.
                            let mut exact = BytesMut::with_capacity(len + 2);
                            exact.extend_from_slice(buf);
                            *buf = exact;
                        } else {
                            buf.reserve(len + 2 - buf.len());
                        }
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
                    self.held += len + ARG_OVERHEAD_BYTES;
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
    Request(Vec<Bytes>),
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
    /// `-STALE token 41 is below the highest accepted token 42`: the error
    /// of a stale write, the most frequent error there is, encoded from its
    /// numbers (an [`Reply::Error`] of the same text costs an allocation,
    /// its free, and a scan for line breaks it cannot hold).
    Stale {
        /// The token the client presented.
        presented: u64,
        /// The stream's highest accepted token.
        highest: u64,
    },
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
    /// Records read: an array of `[offset, token, payload]`, as
    /// [`Reply::Array`]s of two [`Reply::Integer`]s and a [`Reply::Bulk`]
    /// would be, encoded from the records themselves (a reply of many
    /// records held a vector of three replies per record, and took an
    /// allocation and a free for each).
    Records(Vec<fencelog::Record>),
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

    /// The length of [`Reply::encode`]'s output, without encoding: what a
    /// reply will hold in a connection's output buffer.
    pub fn encoded_len(&self, proto: u8) -> usize {
        // Digits of a length or integer, with its sign: by the logarithm,
        // not by dividing an i128 by ten per digit (every reply's length is
        // asked, and that loop was 6 % of a stale rejection's instructions).
        fn digits(n: i128) -> usize {
            let magnitude = n.unsigned_abs();
            let digits = match u64::try_from(magnitude) {
                Ok(m) => m.checked_ilog10(),
                Err(_) => magnitude.checked_ilog10(),
            };
            usize::from(n < 0) + digits.map_or(1, |d| d as usize + 1)
        }
        let line = |s: &str| 1 + s.len() + 2;
        let integer = |n: i64| 1 + digits(i128::from(n)) + 2;
        let bulk = |len: usize| 1 + digits(len as i128) + 2 + len + 2;
        match self {
            Reply::Simple(s) | Reply::Error(s) => line(s),
            Reply::Stale { presented, highest } => {
                1 + STALE_HEAD.len()
                    + digits(i128::from(*presented))
                    + STALE_MIDDLE.len()
                    + digits(i128::from(*highest))
                    + 2
            }
            Reply::Integer(n) => integer(*n),
            Reply::Bulk(b) => bulk(b.len()),
            Reply::Verbatim(s) if proto >= 3 => {
                1 + digits(s.len() as i128 + 4) + 2 + 4 + s.len() + 2
            }
            Reply::Verbatim(s) => 1 + digits(s.len() as i128) + 2 + s.len() + 2,
            Reply::Null if proto >= 3 => 3,
            Reply::Null => 5,
            Reply::Array(items) => {
                1 + digits(items.len() as i128)
                    + 2
                    + items.iter().map(|i| i.encoded_len(proto)).sum::<usize>()
            }
            Reply::Records(records) => {
                1 + digits(records.len() as i128)
                    + 2
                    + records
                        .iter()
                        .map(|r| {
                            // `*3`, as `Reply::Array` of these three.
                            4 + integer(saturated(r.offset))
                                + integer(saturated(r.token.get()))
                                + bulk(r.payload.len())
                        })
                        .sum::<usize>()
            }
            Reply::Map(pairs) => {
                let n = if proto >= 3 {
                    pairs.len()
                } else {
                    pairs.len() * 2
                };
                1 + digits(n as i128)
                    + 2
                    + pairs
                        .iter()
                        .map(|(k, v)| k.encoded_len(proto) + v.encoded_len(proto))
                        .sum::<usize>()
            }
        }
    }

    /// Appends the encoding of this reply for protocol `proto` (2 or 3).
    pub fn encode(&self, proto: u8, out: &mut BytesMut) {
        self.encode_to(proto, out);
    }

    /// Appends the encoding to an [`Output`]: payloads of
    /// [`ZERO_COPY_MIN_BYTES`] or more are kept as the `Bytes` they are,
    /// not copied.
    pub fn encode_output(&self, proto: u8, out: &mut Output) {
        self.encode_to(proto, out);
    }

    fn encode_to(&self, proto: u8, out: &mut impl Sink) {
        match self {
            Reply::Simple(s) => {
                out.put(b"+");
                out.put(clean_line(s).as_bytes());
                out.put(b"\r\n");
            }
            Reply::Error(s) => {
                out.put(b"-");
                out.put(clean_line(s).as_bytes());
                out.put(b"\r\n");
            }
            Reply::Stale { presented, highest } => {
                let mut line = [0u8; STALE_LINE_MAX];
                out.put(stale_line(&mut line, *presented, *highest));
            }
            Reply::Integer(n) => put_number(out, b':', *n),
            Reply::Bulk(b) => put_bulk(out, b),
            Reply::Verbatim(s) if proto >= 3 => {
                out.put(format!("={}\r\ntxt:", s.len() + 4).as_bytes());
                out.put(s.as_bytes());
                out.put(b"\r\n");
            }
            Reply::Verbatim(s) => Reply::text(s.clone()).encode_to(proto, out),
            Reply::Null if proto >= 3 => out.put(b"_\r\n"),
            Reply::Null => out.put(b"$-1\r\n"),
            Reply::Array(items) => {
                put_number(out, b'*', items.len() as i64);
                for item in items {
                    item.encode_to(proto, out);
                }
            }
            Reply::Records(records) => {
                put_number(out, b'*', records.len() as i64);
                for r in records {
                    out.put(b"*3\r\n");
                    put_number(out, b':', saturated(r.offset));
                    put_number(out, b':', saturated(r.token.get()));
                    put_bulk(out, &r.payload);
                }
            }
            Reply::Map(pairs) => {
                if proto >= 3 {
                    out.put(format!("%{}\r\n", pairs.len()).as_bytes());
                } else {
                    out.put(format!("*{}\r\n", pairs.len() * 2).as_bytes());
                }
                for (k, v) in pairs {
                    k.encode_to(proto, out);
                    v.encode_to(proto, out);
                }
            }
        }
    }
}

/// Where an encoding goes.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    /// A payload: copied by default.
    fn put_bytes(&mut self, bytes: &Bytes) {
        self.put(bytes);
    }
}

impl Sink for BytesMut {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Payloads at least this long go out as they are, without a copy into
/// the output buffer.
pub const ZERO_COPY_MIN_BYTES: usize = 4 << 10;

/// Encoded replies not yet written to a client: small parts gathered in one
/// buffer, large payloads kept as the `Bytes` the engine handed out (a
/// 16 MiB read is not copied a second time, nor its memory doubled).
#[derive(Debug, Default)]
pub struct Output {
    /// Parts before `tail`, in order.
    chunks: std::collections::VecDeque<Bytes>,
    /// Small parts being gathered, after every chunk.
    tail: BytesMut,
    /// Unwritten bytes in `chunks`.
    chunked: usize,
}

impl Sink for Output {
    fn put(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
    }

    fn put_bytes(&mut self, bytes: &Bytes) {
        if bytes.len() < ZERO_COPY_MIN_BYTES {
            return self.put(bytes);
        }
        if !self.tail.is_empty() {
            let gathered = self.tail.split().freeze();
            self.chunked += gathered.len();
            self.chunks.push_back(gathered);
        }
        self.chunked += bytes.len();
        self.chunks.push_back(bytes.clone());
    }
}

impl Output {
    /// An empty output.
    pub fn new() -> Output {
        Output::default()
    }

    /// Bytes not yet written.
    pub fn len(&self) -> usize {
        self.chunked + self.tail.len()
    }

    /// Whether everything was written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Memory this output holds: what is unwritten, and the room of its
    /// gathering buffer. (Payloads the engine maps from its files count as
    /// well: conservative.)
    pub fn memory_bytes(&self) -> usize {
        self.chunked + self.tail.capacity()
    }

    /// Reserves room for `additional` bytes of small parts.
    pub fn reserve(&mut self, additional: usize) {
        self.tail.reserve(additional);
    }

    /// The unwritten bytes as slices for a vectored write (at most `max`).
    pub fn slices(&self, max: usize) -> Vec<std::io::IoSlice<'_>> {
        self.chunks
            .iter()
            .map(|c| &c[..])
            .chain(std::iter::once(&self.tail[..]))
            .filter(|s| !s.is_empty())
            .take(max)
            .map(std::io::IoSlice::new)
            .collect()
    }

    /// Fills `slices` with the unwritten bytes, in order, for a vectored
    /// write; answers how many it filled.
    pub fn fill_slices<'a>(&'a self, slices: &mut [std::io::IoSlice<'a>]) -> usize {
        let parts = self
            .chunks
            .iter()
            .map(|c| &c[..])
            .chain(std::iter::once(&self.tail[..]))
            .filter(|s| !s.is_empty());
        let mut n = 0;
        for (slot, part) in slices.iter_mut().zip(parts) {
            *slot = std::io::IoSlice::new(part);
            n += 1;
        }
        n
    }

    /// Marks `n` bytes as written.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                if n >= self.tail.len() {
                    // All written: the buffer starts over at its start.
                    // (Advancing moved its start forward, which the next
                    // reservation then moved back, per write.)
                    self.tail.clear();
                } else {
                    self.tail.advance(n);
                }
                return;
            };
            let take = n.min(front.len());
            front.advance(take);
            self.chunked -= take;
            n -= take;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    /// Gives back memory once everything is written.
    pub fn shrink(&mut self, keep_bytes: usize) {
        if self.is_empty() {
            if self.chunks.capacity() > 0 {
                self.chunks = std::collections::VecDeque::new();
            }
            if self.tail.capacity() > keep_bytes {
                self.tail = BytesMut::new();
            } else {
                self.tail.clear();
            }
        }
    }
}

/// A count or offset as a RESP integer: past `i64::MAX` (which no stream
/// reaches) it reads `i64::MAX`. Every unsigned number a reply carries
/// goes through here (`outcome::number` too).
pub fn saturated(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `$len`, the bytes (kept as they are if large: see [`Sink::put_bytes`])
/// and CRLF.
fn put_bulk(out: &mut impl Sink, b: &Bytes) {
    put_number(out, b'$', b.len() as i64);
    out.put_bytes(b);
    out.put(b"\r\n");
}

/// A type byte, a number and CRLF (`:42\r\n`, `$5\r\n`), without an
/// allocation: the number is formatted on the stack.
fn put_number(out: &mut impl Sink, kind: u8, n: i64) {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    let mut line = [0u8; 1 + 20 + 2];
    line[0] = kind;
    line[1..1 + digits.len()].copy_from_slice(digits);
    line[1 + digits.len()..3 + digits.len()].copy_from_slice(b"\r\n");
    out.put(&line[..3 + digits.len()]);
}

/// The words of a stale write's error around its two numbers.
pub(crate) const STALE_HEAD: &str = "STALE token ";
/// See [`STALE_HEAD`].
pub(crate) const STALE_MIDDLE: &str = " is below the highest accepted token ";
/// The longest `-STALE …\r\n` line: two numbers of 20 digits at most.
const STALE_LINE_MAX: usize = 1 + STALE_HEAD.len() + 20 + STALE_MIDDLE.len() + 20 + 2;

/// [`Reply::Stale`]'s line, CRLF included, written into `line` in one
/// pass: digits and fixed words only, so no line break to clean.
fn stale_line(line: &mut [u8; STALE_LINE_MAX], presented: u64, highest: u64) -> &[u8] {
    let (mut p, mut h) = (itoa::Buffer::new(), itoa::Buffer::new());
    let mut len = 0;
    for part in [
        b"-".as_slice(),
        STALE_HEAD.as_bytes(),
        p.format(presented).as_bytes(),
        STALE_MIDDLE.as_bytes(),
        h.format(highest).as_bytes(),
        b"\r\n",
    ] {
        line[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    &line[..len]
}

/// Simple strings and errors are one line: no CR or LF inside.
fn clean_line(s: &str) -> std::borrow::Cow<'_, str> {
    if memchr::memchr2(b'\r', b'\n', s.as_bytes()).is_some() {
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
        r.iter().collect()
    }

    /// The length parser as it was (through `str::parse`): the fast one
    /// must agree with it on every input.
    fn parse_len_reference(line: &[u8]) -> Option<i64> {
        let digits = line.strip_prefix(b"-").unwrap_or(line);
        if digits.is_empty()
            || !digits.iter().all(u8::is_ascii_digit)
            || (digits.len() > 1 && digits[0] == b'0')
        {
            return None;
        }
        std::str::from_utf8(line).ok()?.parse::<i64>().ok()
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        #[test]
        fn lengths_parse_as_str_parse_does(
            line in proptest::prop_oneof![
                "-?[0-9]{0,21}",
                proptest::collection::vec(proptest::num::u8::ANY, 0..24)
                    .prop_map(|v: Vec<u8>| String::from_utf8_lossy(&v).into_owned()),
            ]
        ) {
            let got = parse_len(line.as_bytes(), "bulk").ok();
            proptest::prop_assert_eq!(got, parse_len_reference(line.as_bytes()));
            let want = if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) {
                line.parse::<u64>().ok()
            } else {
                None
            };
            proptest::prop_assert_eq!(ascii_u64(line.as_bytes()), want);
        }
    }

    proptest::proptest! {
        /// The one-pass reader of plain lengths accepts only lines the
        /// strict reader accepts, with the same value and length.
        #[test]
        fn plain_lengths_read_as_the_strict_reader_does(
            line in proptest::prop_oneof![
                "[$*]-?[0-9]{0,20}\r\n[a-z]{0,2}",
                "[$*][0-9]{0,3}\r?\n?",
                proptest::collection::vec(proptest::num::u8::ANY, 0..24)
                    .prop_map(|v: Vec<u8>| String::from_utf8_lossy(&v).into_owned()),
            ]
        ) {
            let b = line.as_bytes();
            if let Some((n, used)) = plain_len(b) {
                let end = line_end(b).filter(|&e| e <= MAX_LEN_LINE);
                proptest::prop_assert_eq!(end.map(|e| e + 2), Some(used));
                let strict = parse_len(&b[1..used - 2], "bulk").ok();
                proptest::prop_assert_eq!(strict, i64::try_from(n).ok());
            }
        }
    }

    #[test]
    fn plain_lengths_at_the_edges() {
        for (line, want) in [
            (&b"$0\r\n"[..], Some((0, 4))),
            (b"*3\r\n$4", Some((3, 4))),
            (
                b"$999999999999999999\r\n",
                Some((999_999_999_999_999_999, 21)),
            ),
            // Left to the strict reader: 19 digits, a sign, a leading
            // zero, no CRLF yet, no digit.
            (b"$1000000000000000000\r\n", None),
            (b"$-1\r\n", None),
            (b"$01\r\n", None),
            (b"$12\r", None),
            (b"$\r\n", None),
            (b"$", None),
        ] {
            assert_eq!(plain_len(line), want, "{line:?}");
        }
    }

    #[test]
    fn lengths_at_the_edges() {
        for (line, want) in [
            (&b"9223372036854775807"[..], Some(i64::MAX)),
            (b"9223372036854775808", None),
            (b"-9223372036854775808", Some(i64::MIN)),
            (b"-9223372036854775809", None),
            (b"-1", Some(-1)),
            (b"-0", Some(0)),
            (b"-", None),
            (b"", None),
            (b"01", None),
            (b"+1", None),
        ] {
            assert_eq!(parse_len(line, "bulk").ok(), want, "{line:?}");
            assert_eq!(parse_len_reference(line), want, "{line:?}");
        }
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
    fn arguments_of_an_unfinished_request_are_counted() {
        let limits = Limits::default();
        let mut p = RequestParser::new();
        let mut buf = BytesMut::from(&b"*4\r\n$3\r\nabc\r\n$5\r\nhello\r\n$10\r\n0123"[..]);
        assert_eq!(p.next(&mut buf, &limits), Ok(None));
        // Cut out of the buffer, yet held.
        assert_eq!(p.held_bytes(), 3 + 5 + 2 * ARG_OVERHEAD_BYTES);
        assert_eq!(&buf[..], b"0123");
        buf.extend_from_slice(b"456789\r\n$0\r\n\r\n");
        assert!(p.next(&mut buf, &limits).unwrap().is_some());
        assert_eq!(p.held_bytes(), 0);
        // A broken request holds nothing either.
        let mut buf = BytesMut::from(&b"*2\r\n$1\r\nx\r\n:1\r\n"[..]);
        assert!(p.next(&mut buf, &limits).is_err());
        assert_eq!(p.held_bytes(), 0);
    }

    #[test]
    fn a_big_argument_gets_a_buffer_of_its_size() {
        let limits = Limits::default();
        let mut p = RequestParser::new();
        let len = 1 << 20;
        let mut buf = BytesMut::with_capacity(16 << 10);
        buf.extend_from_slice(format!("*1\r\n${len}\r\nxyz").as_bytes());
        assert_eq!(p.next(&mut buf, &limits), Ok(None));
        assert_eq!(buf.capacity(), len + 2);
        assert_eq!(&buf[..], b"xyz");
    }

    #[test]
    fn before_authentication_requests_are_tiny_as_in_redis() {
        let limits = Limits::default();
        let mut p = RequestParser::new();
        p.set_unauthenticated(true);
        let mut buf = BytesMut::from(&b"*11\r\n"[..]);
        assert_eq!(
            p.next(&mut buf, &limits).unwrap_err().to_string(),
            "Protocol error: unauthenticated multibulk length"
        );
        let mut p = RequestParser::new();
        p.set_unauthenticated(true);
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nAUTH\r\n$16385\r\n"[..]);
        assert_eq!(
            p.next(&mut buf, &limits).unwrap_err().to_string(),
            "Protocol error: unauthenticated bulk length"
        );
        // Within those limits, and once authenticated, as usual.
        let mut buf = BytesMut::from(&b"*10\r\n"[..]);
        let mut p = RequestParser::new();
        p.set_unauthenticated(true);
        assert_eq!(p.next(&mut buf, &limits), Ok(None));
        p.set_unauthenticated(false);
        let mut buf = BytesMut::from(&b"*11\r\n$16385\r\n"[..]);
        let mut p = RequestParser::new();
        assert_eq!(p.next(&mut buf, &limits), Ok(None));
    }

    #[test]
    fn error_texts_are_redis_own() {
        // unit/protocol.tcl matches these with globs.
        let cases: &[(&[u8], &str)] = &[
            (b"*3000000000\r\n", "invalid multibulk length"),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
                "expected '$', got 'f'",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$-10\r\n",
                "invalid bulk length",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$2000000000\r\n",
                "invalid bulk length",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$blabla\r\n",
                "invalid bulk length",
            ),
            (b"*1\r\nfoo\r\n", "expected '$', got 'f'"),
            (b"set \"\"\"test-key\"\"\" test-value\r\n", "unbalanced"),
        ];
        for (input, expected) in cases {
            let mut p = RequestParser::new();
            let mut buf = BytesMut::from(&input[..]);
            let e = p.next(&mut buf, &Limits::default()).unwrap_err();
            assert!(
                e.0.contains(expected),
                "{:?}: {e}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn http_looking_requests() {
        let req = |args: &[&str]| -> Request {
            args.iter().map(|a| Bytes::from(a.to_string())).collect()
        };
        assert!(looks_like_http(&req(&["POST", "/", "HTTP/1.1"])));
        assert!(looks_like_http(&req(&["post"])));
        assert!(looks_like_http(&req(&["Host:", "localhost:7379"])));
        assert!(looks_like_http(&req(&["GET", "/metrics", "HTTP/1.1"])));
        assert!(!looks_like_http(&req(&["GET", "key"])));
        assert!(!looks_like_http(&req(&["LOG.APPEND", "POST", "1", "x"])));
    }

    /// The connection's form, on the name upper-cased once, says what
    /// `looks_like_http` says.
    #[test]
    fn http_looking_requests_by_their_upper_cased_name() {
        let req = |args: &[&str]| -> Request {
            args.iter().map(|a| Bytes::from(a.to_string())).collect()
        };
        let long = "P".repeat(40);
        for args in [
            &["POST", "/", "HTTP/1.1"][..],
            &["post"],
            &["Host:", "localhost:7379"],
            &["hOsT:"],
            &["GET", "/metrics", "HTTP/1.1"],
            &["get", "/"],
            &["GET", "key"],
            &["GET"],
            &["LOG.APPEND", "POST", "1", "x"],
            &["pöst"],
            &[long.as_str()],
        ] {
            let r = req(args);
            let name = crate::cmd::parse::upper(&r[0]);
            assert_eq!(
                looks_like_http_named(name.as_str(), &r),
                looks_like_http(&r),
                "{args:?}"
            );
        }
    }

    #[test]
    fn output_keeps_large_payloads_without_copying_them() {
        let big = Bytes::from(vec![b'x'; ZERO_COPY_MIN_BYTES]);
        let reply = Reply::Array(vec![
            Reply::Integer(1),
            Reply::Bulk(big.clone()),
            Reply::Bulk(Bytes::from_static(b"small")),
        ]);
        let mut flat = BytesMut::new();
        reply.encode(3, &mut flat);
        let mut out = Output::new();
        reply.encode_output(3, &mut out);
        assert_eq!(out.len(), flat.len());
        let gathered: Vec<u8> = out.slices(64).iter().flat_map(|s| s.to_vec()).collect();
        assert_eq!(gathered, &flat[..]);
        // The payload is the engine's own bytes.
        assert!(out.slices(64).iter().any(|s| s.as_ptr() == big.as_ptr()));
        // Written in odd pieces, the rest is always what follows.
        let mut written = 0;
        for n in [1, 7, 4096, 3, 100_000] {
            let n = n.min(out.len());
            out.advance(n);
            written += n;
            let rest: Vec<u8> = out.slices(64).iter().flat_map(|s| s.to_vec()).collect();
            assert_eq!(rest, &flat[written..]);
        }
        assert!(out.is_empty());
        out.shrink(0);
        assert_eq!(out.memory_bytes(), 0);
    }

    #[test]
    fn encoded_lengths_match_the_encoding() {
        let replies = vec![
            Reply::ok(),
            Reply::Error("ERR x".into()),
            Reply::Integer(0),
            Reply::Integer(-42),
            Reply::Integer(i64::MIN),
            Reply::Integer(i64::MAX),
            Reply::Bulk(Bytes::from(vec![7u8; 1234])),
            Reply::Verbatim("info text".into()),
            Reply::Null,
            Reply::Array(vec![
                Reply::Integer(10),
                Reply::Array(Vec::new()),
                Reply::Null,
            ]),
            Reply::Map(vec![(Reply::text("k"), Reply::Integer(123_456))]),
        ];
        for r in replies {
            for proto in [2, 3] {
                let mut out = BytesMut::new();
                r.encode(proto, &mut out);
                assert_eq!(r.encoded_len(proto), out.len(), "{r:?} in RESP{proto}");
            }
        }
    }

    /// Records encode byte for byte as the arrays of an offset, a token
    /// and a payload they stand for, in both protocols, small payloads
    /// and one past the zero-copy size, offsets saturating as `number`
    /// does.
    #[test]
    fn records_encode_as_the_arrays_they_stand_for() {
        let record = |offset: u64, token: u64, len: usize| fencelog::Record {
            offset,
            token: fencelog::Token::new(token).unwrap(),
            payload: Bytes::from(vec![b'x'; len]),
        };
        let records = vec![
            record(0, 1, 0),
            record(9, 42, 100),
            record(10, fencelog::MAX_TOKEN, ZERO_COPY_MIN_BYTES + 1),
            record(u64::MAX, 7, 3),
        ];
        for records in [Vec::new(), records] {
            let as_records = Reply::Records(records.clone());
            let as_arrays = Reply::Array(
                records
                    .iter()
                    .map(|r| {
                        Reply::Array(vec![
                            crate::outcome::number(r.offset),
                            crate::outcome::number(r.token.get()),
                            Reply::Bulk(r.payload.clone()),
                        ])
                    })
                    .collect(),
            );
            for proto in [2, 3] {
                let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
                as_records.encode(proto, &mut a);
                as_arrays.encode(proto, &mut b);
                assert_eq!(a, b, "RESP{proto}, {} records", records.len());
                assert_eq!(as_records.encoded_len(proto), a.len());
                let mut out = Output::new();
                as_records.encode_output(proto, &mut out);
                let written: Vec<u8> = out
                    .slices(usize::MAX)
                    .iter()
                    .flat_map(|s| s.to_vec())
                    .collect();
                assert_eq!(&written[..], &a[..], "through the output, RESP{proto}");
            }
        }
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
