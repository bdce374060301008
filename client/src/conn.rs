//! One connection to one node: handshake, request, reply.

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::resp::{Parser, Value, encode_command};
use crate::{Config, Error};

/// Bytes read from the socket at a time.
pub(crate) const READ_CHUNK_BYTES: usize = 16 << 10;
/// Out-of-band RESP3 pushes skipped while waiting for one reply; the server
/// sends none today, so more than this is a broken peer.
pub(crate) const MAX_PUSHES_SKIPPED: usize = 64;

/// A connection after its handshake (`HELLO 3` or RESP2, `AUTH`).
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) stream: TcpStream,
    pub(crate) buf: BytesMut,
    pub(crate) parser: Parser,
    /// Whether `HELLO 3` was accepted (maps and nulls arrive as RESP3).
    pub(crate) resp3: bool,
}

impl Connection {
    /// Connects and shakes hands, within `config.connect_timeout` in all.
    pub(crate) async fn open(addr: &str, config: &Config) -> Result<Connection, Error> {
        let setup = async {
            let stream = TcpStream::connect(addr).await?;
            // Requests are single writes waiting for their answer: Nagle's
            // delay would only add latency.
            stream.set_nodelay(true)?;
            let mut conn = Connection {
                stream,
                buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
                parser: Parser::new(config.limits),
                resp3: false,
            };
            conn.handshake(config).await?;
            Ok(conn)
        };
        match tokio::time::timeout(config.connect_timeout, setup).await {
            Ok(r) => r,
            Err(_) => Err(Error::timed_out(&format!(
                "connecting to {addr} took over {:?}",
                config.connect_timeout
            ))),
        }
    }

    /// `HELLO 3 [AUTH user pass]`; on a server that refuses it, RESP2 and
    /// `AUTH [user] pass`.
    async fn handshake(&mut self, config: &Config) -> Result<(), Error> {
        let user = config.user.as_deref().unwrap_or("default");
        if config.resp3 {
            let mut args: Vec<&[u8]> = vec![b"HELLO", b"3"];
            if let Some(pw) = &config.password {
                args.extend([b"AUTH".as_slice(), user.as_bytes(), pw.as_bytes()]);
            }
            match self.request(&args).await? {
                Value::Map(_) | Value::Array(_) => {
                    self.resp3 = true;
                    return Ok(());
                }
                // A server without RESP3 (or without HELLO) stays on RESP2.
                Value::Error(e) if e.starts_with("NOPROTO") || e.contains("unknown command") => {}
                Value::Error(e) => return Err(Error::from_server(&e)),
                other => {
                    return Err(Error::Protocol(format!("HELLO answered {other:?}")));
                }
            }
        }
        if let Some(pw) = &config.password {
            let reply = match &config.user {
                Some(u) => {
                    self.request(&[b"AUTH", u.as_bytes(), pw.as_bytes()])
                        .await?
                }
                None => self.request(&[b"AUTH", pw.as_bytes()]).await?,
            };
            match reply {
                Value::Simple(ok) if ok == "OK" => {}
                Value::Error(e) => return Err(Error::from_server(&e)),
                other => return Err(Error::Protocol(format!("AUTH answered {other:?}"))),
            }
        }
        Ok(())
    }

    /// Sends one request and reads its reply. No timeout here: the caller
    /// bounds the whole call, and drops the connection if it runs out (a
    /// late reply would otherwise answer the next request).
    pub(crate) async fn request(&mut self, args: &[&[u8]]) -> Result<Value, Error> {
        self.stream.write_all(&encode_command(args)).await?;
        for _ in 0..MAX_PUSHES_SKIPPED {
            match self.read_value().await? {
                Value::Push(_) => continue,
                v => return Ok(v),
            }
        }
        Err(Error::Protocol(format!(
            "more than {MAX_PUSHES_SKIPPED} pushes before a reply"
        )))
    }

    async fn read_value(&mut self) -> Result<Value, Error> {
        // Every turn reads at least one byte or fails; the parser refuses a
        // reply over its limits, so the buffered bytes stay bounded.
        loop {
            if let Some(v) = self.parser.parse(&mut self.buf)? {
                return Ok(v);
            }
            self.buf.reserve(READ_CHUNK_BYTES);
            let n = self.stream.read_buf(&mut self.buf).await?;
            if n == 0 {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
        }
    }

    /// Whether an idle connection can be reused: no half-read reply, no
    /// unexpected bytes, not closed by the server (checked without
    /// blocking, so a pooled connection the server dropped is not handed a
    /// write whose reply could then never come).
    pub(crate) fn is_reusable(&self) -> bool {
        if !self.buf.is_empty() || !self.parser.is_idle() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}
