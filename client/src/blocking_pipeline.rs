//! The blocking [`Pipeline`]: one connection on a std socket, for a
//! thread per connection (`fencelog bench --driver threads`), with no
//! runtime and no other thread behind it.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};

use bytes::BytesMut;

use crate::conn::READ_CHUNK_BYTES;
use crate::pipeline::{Outbox, Request, closed, take_reply};
use crate::resp::{Parser, Reply, Value};
use crate::{Config, Error};

/// Bytes one read may take from the socket.
const READ_WINDOW_BYTES: usize = 4 << 10;

/// One connection that sends many requests before reading their replies,
/// on a blocking std socket: the blocking twin of [`crate::Pipeline`]
/// (the same encoder and reply parser, scalars judged in the read buffer).
///
/// It speaks RESP2. [`Pipeline::exchange`] writes the whole batch, then
/// reads its replies: the server reads on while a connection's unread
/// replies stay under its budget (64 KiB), so keep a batch's replies
/// below that. Every read and write waits at most
/// `config.request_timeout` (a timeout is [`Error::Io`] with
/// `ErrorKind::TimedOut` or `WouldBlock`). A call that failed leaves the
/// connection in an unknown state: every later call answers
/// [`Error::Protocol`]; connect again.
///
/// # Examples
///
/// ```no_run
/// use fencelog_client::{Config, Reply, blocking::Pipeline};
///
/// # fn run() -> Result<(), fencelog_client::Error> {
/// let config = Config { resp3: false, ..Config::new("127.0.0.1:7379") };
/// let mut pipeline = Pipeline::connect("127.0.0.1:7379", &config)?;
/// for i in 0..16u32 {
///     pipeline.queue(&[b"LOG.APPEND", b"jobs", b"7", i.to_string().as_bytes()]);
/// }
/// let mut stale = 0;
/// pipeline.exchange(|reply| {
///     if matches!(reply, Reply::Error(e) if e.starts_with(b"STALE ")) {
///         stale += 1;
///     }
/// })?;
/// println!("{stale} of 16 refused as stale");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Pipeline {
    stream: TcpStream,
    addr: String,
    buf: BytesMut,
    parser: Parser,
    /// Requests queued, not yet sent.
    out: Outbox,
    /// A call failed midway.
    interrupted: bool,
}

impl Pipeline {
    /// Connects to the node at `addr` within `config.connect_timeout` (per
    /// address it resolves to) and sends `AUTH` if `config` has a
    /// password. `config.resp3` must be false: this pipeline speaks RESP2.
    pub fn connect(addr: &str, config: &Config) -> Result<Pipeline, Error> {
        if config.resp3 {
            return Err(Error::Invalid(
                "the blocking pipeline speaks RESP2: set resp3 to false".into(),
            ));
        }
        let mut last = None;
        let mut stream = None;
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, config.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(Error::Io(e)),
            (None, None) => return Err(Error::Invalid(format!("{addr} resolves to no address"))),
        };
        // A batch is one write waiting for its answers: Nagle's delay
        // would only add latency.
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(config.request_timeout))?;
        stream.set_write_timeout(Some(config.request_timeout))?;
        let mut pipeline = Pipeline {
            stream,
            addr: addr.to_string(),
            buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            parser: Parser::new(config.limits),
            out: Outbox::default(),
            interrupted: false,
        };
        if let Some(pw) = &config.password {
            match &config.user {
                Some(u) => pipeline.queue(&[b"AUTH", u.as_bytes(), pw.as_bytes()]),
                None => pipeline.queue(&[b"AUTH", pw.as_bytes()]),
            }
            let mut reply = Value::Null;
            pipeline.exchange(|r| reply = r.to_value())?;
            match reply {
                Value::Simple(ok) if ok == "OK" => {}
                Value::Error(e) => return Err(Error::from_server(&e)),
                other => return Err(Error::Protocol(format!("AUTH answered {other:?}"))),
            }
        }
        Ok(pipeline)
    }

    /// The node this pipeline talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Requests queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.out.count
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

    /// Sends every queued request in one write, then reads their replies;
    /// `on_reply` gets each in order.
    pub fn exchange(&mut self, mut on_reply: impl FnMut(Reply<'_>)) -> Result<(), Error> {
        if self.interrupted {
            return Err(Error::Protocol(format!(
                "the pipeline to {} was interrupted midway: connect again",
                self.addr
            )));
        }
        self.interrupted = true;
        self.stream.write_all(&self.out.bytes)?;
        for _ in 0..self.out.count {
            let mut pushes = 0;
            // Every turn consumes a reply or reads at least one byte or
            // fails; the parser bounds what a reply may buffer.
            while take_reply(&mut self.buf, &mut self.parser, &mut pushes, &mut on_reply)?.is_none()
            {
                self.read_more()?;
            }
        }
        self.out.sent();
        self.interrupted = false;
        Ok(())
    }

    /// Reads what the socket has (at least one byte) into the buffer.
    fn read_more(&mut self) -> Result<(), Error> {
        let len = self.buf.len();
        // std's read wants initialized bytes: zero a small window per read
        // rather than a whole chunk (most reads carry a few small replies).
        self.buf.resize(len + READ_WINDOW_BYTES, 0);
        let read = self.stream.read(&mut self.buf[len..]);
        let n = *read.as_ref().unwrap_or(&0);
        self.buf.truncate(len + n);
        match read {
            Ok(0) => Err(closed()),
            Ok(_) => Ok(()),
            Err(e) => Err(Error::Io(e)),
        }
    }
}
