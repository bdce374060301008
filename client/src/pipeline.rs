//! Pipelining: many requests on one connection, their replies in order.
//!
//! A [`Pipeline`] is one connection of its own to one node (not pooled,
//! not routed): requests are queued into one buffer, sent in one write,
//! and their replies read in the order sent, each handed to a callback
//! while it still lies in the read buffer ([`Reply`]), so the common
//! scalar replies cost no allocation. It is what `fencelog bench` drives
//! the server with: the client must stay cheap next to what it measures.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::conn::{Connection, MAX_PUSHES_SKIPPED, READ_CHUNK_BYTES};
use crate::resp::{Parser, Peek, Reply, Value, encode_into};
use crate::{Config, Error};

/// A request encoded once, to be queued many times
/// ([`Pipeline::queue_request`] copies its bytes, nothing else).
///
/// # Examples
///
/// ```
/// use fencelog_client::Request;
///
/// let append = Request::new(&[b"LOG.APPEND", b"jobs", b"7", b"payload"]);
/// assert!(append.as_bytes().starts_with(b"*4\r\n$10\r\nLOG.APPEND\r\n"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    bytes: Bytes,
}

impl Request {
    /// `args` as a RESP array of bulk strings.
    pub fn new(args: &[&[u8]]) -> Request {
        let mut out = Vec::new();
        encode_into(&mut out, args);
        Request {
            bytes: Bytes::from(out),
        }
    }

    /// The encoded bytes, as sent.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Requests queued and not yet sent: their bytes, and how many.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) bytes: Vec<u8>,
    pub(crate) count: usize,
}

impl Outbox {
    /// Encodes a request behind the others.
    pub(crate) fn push(&mut self, args: &[&[u8]]) {
        encode_into(&mut self.bytes, args);
        self.count += 1;
    }

    /// Adds a request encoded before.
    #[inline]
    pub(crate) fn push_request(&mut self, request: &Request) {
        self.bytes.extend_from_slice(request.as_bytes());
        self.count += 1;
    }

    /// Empties the box once its bytes were sent; answers how many
    /// requests they held.
    pub(crate) fn sent(&mut self) -> usize {
        self.bytes.clear();
        std::mem::take(&mut self.count)
    }
}

/// One connection that sends many requests before reading their replies.
///
/// [`Pipeline::queue`] (or [`Pipeline::queue_request`]) adds requests;
/// [`Pipeline::exchange`] sends all queued and reads every reply owed, the
/// two at once, so a batch of any size never waits for the server to drain
/// replies nobody reads. [`Pipeline::send`] and [`Pipeline::read_with`] /
/// [`Pipeline::read`] do the halves separately (keep such a batch's replies
/// within the server's unread-reply budget, 64 KiB, or read concurrently).
///
/// Replies are raw: an error reply is a [`Reply::Error`], and nothing is
/// routed or retried (`-MOVED` is the caller's). The caller bounds a batch
/// (the queue grows with what is queued) and its wait (wrap a call in
/// `tokio::time::timeout`). A call that failed or was dropped midway leaves
/// the connection in an unknown state: every later call answers
/// [`Error::Protocol`]; connect again.
///
/// # Examples
///
/// ```no_run
/// use fencelog_client::{Client, Config, Reply};
///
/// # async fn run() -> Result<(), fencelog_client::Error> {
/// let client = Client::connect(Config::new("127.0.0.1:7379")).await?;
/// let mut pipeline = client.pipeline().await?;
/// for i in 0..100u32 {
///     pipeline.queue(&[b"LOG.APPEND", b"jobs", b"7", i.to_string().as_bytes()]);
/// }
/// let mut stale = 0;
/// pipeline
///     .exchange(|reply| {
///         if matches!(reply, Reply::Error(e) if e.starts_with(b"STALE ")) {
///             stale += 1;
///         }
///     })
///     .await?;
/// println!("{stale} of 100 refused as stale");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Pipeline {
    conn: Connection,
    addr: String,
    /// Requests queued, not yet sent.
    out: Outbox,
    /// Requests sent whose replies have not been read.
    in_flight: usize,
    /// A call is under way, or one failed or was dropped midway.
    interrupted: bool,
}

impl Pipeline {
    /// Connects to the node at `addr` and shakes hands as `config` says
    /// (`HELLO 3` or RESP2, `AUTH`), within `config.connect_timeout`.
    /// [`Client::pipeline`](crate::Client::pipeline) connects to the
    /// client's leader.
    pub async fn connect(addr: &str, config: &Config) -> Result<Pipeline, Error> {
        let conn = Connection::open(addr, config).await?;
        Ok(Pipeline {
            conn,
            addr: addr.to_string(),
            out: Outbox::default(),
            in_flight: 0,
            interrupted: false,
        })
    }

    /// The node this pipeline talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connection speaks RESP3 (`HELLO 3` was accepted).
    pub fn resp3(&self) -> bool {
        self.conn.resp3
    }

    /// Requests queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.out.count
    }

    /// Requests sent whose replies have not been read.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Queues a request (encoded into the send buffer; nothing is sent).
    pub fn queue(&mut self, args: &[&[u8]]) {
        self.out.push(args);
    }

    /// Queues a request encoded before.
    #[inline]
    pub fn queue_request(&mut self, request: &Request) {
        self.out.push_request(request);
    }

    fn begin(&mut self) -> Result<(), Error> {
        if self.interrupted {
            return Err(Error::Protocol(format!(
                "the pipeline to {} was interrupted midway: connect again",
                self.addr
            )));
        }
        self.interrupted = true;
        Ok(())
    }

    /// Sends every queued request; their replies are then owed
    /// ([`Pipeline::in_flight`]).
    pub async fn send(&mut self) -> Result<(), Error> {
        self.begin()?;
        self.conn.stream.write_all(&self.out.bytes).await?;
        self.in_flight += self.out.sent();
        self.interrupted = false;
        Ok(())
    }

    /// Reads the next reply owed and hands it to `f` while it lies in the
    /// read buffer; answers what `f` does.
    pub async fn read_with<T>(&mut self, f: impl FnOnce(Reply<'_>) -> T) -> Result<T, Error> {
        if self.in_flight == 0 {
            return Err(Error::Invalid("no reply is owed: send first".into()));
        }
        self.begin()?;
        let conn = &mut self.conn;
        let mut f = Some(f);
        let t = read_one(
            &mut conn.stream,
            &mut conn.buf,
            &mut conn.parser,
            &mut |r| f.take().map(|f| f(r)),
        )
        .await?;
        self.in_flight -= 1;
        self.interrupted = false;
        t.ok_or_else(|| Error::Protocol("a reply was handed on twice".into()))
    }

    /// Reads the next reply owed as an owned [`Value`].
    pub async fn read(&mut self) -> Result<Value, Error> {
        self.read_with(|r| match r {
            Reply::Other(v) => *v,
            r => r.to_value(),
        })
        .await
    }

    /// Sends every queued request and reads every reply owed (those of
    /// earlier [`Pipeline::send`]s first), writing and reading at once;
    /// `on_reply` gets each in order.
    pub async fn exchange(&mut self, mut on_reply: impl FnMut(Reply<'_>)) -> Result<(), Error> {
        self.begin()?;
        let owed = self.in_flight + self.out.count;
        let Connection {
            stream,
            buf,
            parser,
            ..
        } = &mut self.conn;
        let (mut rd, mut wr) = stream.split();
        let out = &self.out.bytes;
        let write = async {
            if !out.is_empty() {
                wr.write_all(out).await?;
            }
            Ok::<_, Error>(())
        };
        let read = async {
            for _ in 0..owed {
                read_one(&mut rd, buf, parser, &mut on_reply).await?;
            }
            Ok::<_, Error>(())
        };
        tokio::try_join!(write, read)?;
        self.out.sent();
        self.in_flight = 0;
        self.interrupted = false;
        Ok(())
    }

    /// One request on its own: sends it and answers its reply (an error
    /// reply as [`Value::Error`]). Only with nothing queued or in flight.
    pub async fn request(&mut self, args: &[&[u8]]) -> Result<Value, Error> {
        if self.out.count + self.in_flight > 0 {
            return Err(Error::Invalid(
                "requests are queued or in flight: exchange them first".into(),
            ));
        }
        self.queue(args);
        self.send().await?;
        self.read().await
    }
}

/// Reads one reply from `rd` through `buf` and hands it to `f`, skipping
/// RESP3 pushes: a scalar borrowed in place, anything else parsed whole.
async fn read_one<R: AsyncRead + Unpin, T>(
    rd: &mut R,
    buf: &mut BytesMut,
    parser: &mut Parser,
    f: &mut impl FnMut(Reply<'_>) -> T,
) -> Result<T, Error> {
    let mut pushes = 0;
    // Every turn consumes a reply or reads at least one byte or fails; the
    // parser refuses a reply over its limits, so the buffer stays bounded.
    loop {
        if let Some(t) = take_reply(buf, parser, &mut pushes, f)? {
            return Ok(t);
        }
        buf.reserve(READ_CHUNK_BYTES);
        if rd.read_buf(buf).await? == 0 {
            return Err(closed());
        }
    }
}

/// Hands the reply at the front of `buf` to `f` and consumes it, skipping
/// RESP3 pushes (counted in `pushes`); `None` while its end has not
/// arrived. Shared by the async and the blocking pipeline, which differ
/// only in how they read more bytes.
pub(crate) fn take_reply<T>(
    buf: &mut BytesMut,
    parser: &mut Parser,
    pushes: &mut usize,
    f: &mut impl FnMut(Reply<'_>) -> T,
) -> Result<Option<T>, Error> {
    loop {
        match parser.peek(buf)? {
            Peek::Scalar(reply, used) => {
                let t = f(reply);
                buf.advance(used);
                return Ok(Some(t));
            }
            Peek::Other => match parser.parse(buf)? {
                Some(Value::Push(_)) => {
                    *pushes += 1;
                    if *pushes > MAX_PUSHES_SKIPPED {
                        return Err(Error::Protocol(format!(
                            "more than {MAX_PUSHES_SKIPPED} pushes before a reply"
                        )));
                    }
                }
                Some(v) => return Ok(Some(f(Reply::Other(Box::new(v))))),
                None => return Ok(None),
            },
            Peek::Incomplete => return Ok(None),
        }
    }
}

/// The error of a connection the server closed while a reply was owed.
pub(crate) fn closed() -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    ))
}
