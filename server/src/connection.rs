//! One client connection: read requests, run them in order, answer in
//! order. Writes are decided as they arrive and answered once durable, so a
//! pipelined burst of appends shares one group commit.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::commands::{self, Context, Later, Outcome};
use crate::protocol::{ProtocolError, Reply, RequestParser};

/// What a connection knows about its client.
pub struct Session {
    pub id: u64,
    pub proto: u8,
    pub authenticated: bool,
    pub name: Option<Bytes>,
}

/// An answer in the connection's queue, in request order.
enum Answer {
    Now(Reply),
    Later(Later),
}

/// Serves one client until it leaves, breaks the protocol, or the server
/// shuts down (the command in progress finishes first).
pub async fn serve(
    ctx: Arc<Context>,
    mut stream: TcpStream,
    id: u64,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut session = Session {
        id,
        proto: 2,
        authenticated: ctx.config.requirepass.is_none(),
        name: None,
    };
    let limits = ctx.config.limits.clone();
    let mut parser = RequestParser::new();
    let mut input = BytesMut::with_capacity(16 << 10);
    let mut output = BytesMut::with_capacity(16 << 10);
    let mut queue: VecDeque<Answer> = VecDeque::new();
    loop {
        let mut closing = false;
        // Run every whole request already received (up to the pipeline
        // limit), deciding writes without waiting for them.
        while queue.len() < ctx.config.max_pipeline {
            let request = match parser.next(&mut input, &limits) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(ProtocolError(why)) => {
                    queue.push_back(Answer::Now(Reply::Error(format!(
                        "ERR Protocol error: {why}"
                    ))));
                    closing = true;
                    break;
                }
            };
            if !is_deferrable(&request) {
                // Anything but a write sees the writes before it answered:
                // a read after an append in one pipeline sees the append.
                drain(&mut queue, session.proto, &mut output).await;
            }
            match commands::execute(&ctx, &mut session, request).await {
                Outcome::Reply(r) => queue.push_back(Answer::Now(r)),
                Outcome::Later(l) => queue.push_back(Answer::Later(l)),
                Outcome::Close(r) => {
                    queue.push_back(Answer::Now(r));
                    closing = true;
                    break;
                }
                Outcome::Blocking(b) => {
                    // The answers before it go out first: the client may be
                    // waiting for them before it expects this one.
                    drain(&mut queue, session.proto, &mut output).await;
                    if !output.is_empty() {
                        stream.write_all(&output).await?;
                        output.clear();
                    }
                    // Watch the socket meanwhile: a client that leaves gives
                    // up the wait (and takes nothing).
                    let run = b.run(&ctx.log);
                    tokio::pin!(run);
                    let reply = loop {
                        tokio::select! {
                            reply = &mut run => break Some(reply),
                            read = stream.read_buf(&mut input) => {
                                match read {
                                    Ok(0) | Err(_) => break None,
                                    Ok(_) if input.len() > ctx.config.max_query_buffer_bytes => break None,
                                    Ok(_) => {}
                                }
                            }
                        }
                    };
                    match reply {
                        Some(r) => queue.push_back(Answer::Now(r)),
                        None => return Ok(()),
                    }
                }
            }
        }
        drain(&mut queue, session.proto, &mut output).await;
        if !output.is_empty() {
            stream.write_all(&output).await?;
            output.clear();
        }
        if closing || *shutdown.borrow() {
            let _ = stream.shutdown().await;
            return Ok(());
        }
        if input.len() > ctx.config.max_query_buffer_bytes {
            let mut out = BytesMut::new();
            Reply::Error("ERR Protocol error: the query buffer is over its limit".into())
                .encode(session.proto, &mut out);
            let _ = stream.write_all(&out).await;
            return Ok(());
        }
        tokio::select! {
            read = stream.read_buf(&mut input) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                ctx.stats.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
            }
            // Every whole request received so far was answered above; a
            // partial one is dropped with the connection.
            _ = shutdown.changed() => return Ok(()),
        }
    }
}

/// Writes whose answer may wait for durability while later requests are
/// decided.
fn is_deferrable(request: &[Bytes]) -> bool {
    let Some(cmd) = request.first() else {
        return false;
    };
    [
        &b"LOG.APPEND"[..],
        b"LOG.APPENDAT",
        b"LOG.FENCE",
        b"LOG.TRIM",
        b"LOG.DELETE",
    ]
    .iter()
    .any(|c| cmd.eq_ignore_ascii_case(c))
}

/// Answers everything queued, in order.
async fn drain(queue: &mut VecDeque<Answer>, proto: u8, output: &mut BytesMut) {
    while let Some(answer) = queue.pop_front() {
        let reply = match answer {
            Answer::Now(r) => r,
            Answer::Later(l) => l.reply().await,
        };
        reply.encode(proto, output);
    }
}
