//! Commands: parsed from a request, run against the engine, answered as a
//! [`Reply`]. Writes are decided at once (in arrival order) and answered
//! later, so that a connection's pipelined writes share one group commit.
//! Inside `MULTI` commands are queued instead (see `transaction.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use fencelog::{AcquireOptions, Deferred, Error, Log, ReadOptions, Token, TxOp};

use crate::budget::ClientMemory;
use crate::clients::Registry;
use crate::command_table;
use crate::config::ServeConfig;
use crate::connection::Session;
use crate::glob;
use crate::info;
use crate::logging::{RateLimit, name_field};
use crate::protocol::Reply;
// Integers of commands: digits only (Redis refuses "+5" too), leading
// zeros allowed.
use crate::protocol::ascii_u64 as parse_u64;
use crate::server::ServerStats;
use crate::transaction;

/// What the server shares with every connection.
pub struct Context {
    /// The engine.
    pub log: Log,
    /// The command line.
    pub config: ServeConfig,
    /// The server's own counters.
    pub stats: ServerStats,
    /// What every connection holds, against `--maxmemory-clients`.
    pub clients: Arc<ClientMemory>,
    /// The connections open now (`CLIENT LIST`, `CLIENT KILL`).
    pub registry: Arc<Registry>,
    /// Log events that are rate-limited or followed over time.
    pub events: EventLimits,
    /// Cluster mode: this node's replica (`None`: a single node).
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
}

impl Context {
    /// The engine commands read: the log, or in cluster mode the replica's
    /// current engine (a snapshot installed replaces it).
    pub fn engine(&self) -> std::borrow::Cow<'_, Log> {
        match &self.cluster {
            Some(c) => std::borrow::Cow::Owned(c.log()),
            None => std::borrow::Cow::Borrowed(&self.log),
        }
    }
}

/// Log events that need state: rate limits, and the leases granted here
/// (to tell when one expires).
#[derive(Default)]
pub struct EventLimits {
    /// `stale_fencing_token`.
    pub stale: RateLimit,
    /// `connection_refused`.
    pub refused: RateLimit,
    /// Leases granted through this server and not known to be over: name
    /// → (owner, token, when its ttl runs out unless renewed).
    pub leases:
        parking_lot::Mutex<std::collections::HashMap<Bytes, (Bytes, u64, std::time::Instant)>>,
}

/// Who sent a command, for log events.
#[derive(Clone, Debug)]
pub struct ClientTag {
    /// The connection's id.
    pub id: u64,
    /// The client's address.
    pub addr: std::net::SocketAddr,
    /// `CLIENT SETNAME`, if set.
    pub name: Option<Bytes>,
}

impl ClientTag {
    fn name_field(&self) -> String {
        self.name.as_deref().map(name_field).unwrap_or_default()
    }
}

/// Logs a `stale_fencing_token` event (rate-limited): the stream, the token
/// the client presented, the stream's highest, and who sent it. Never the
/// payload.
pub fn stale_event(ctx: &Context, client: &ClientTag, stream: &[u8], presented: u64, highest: u64) {
    if let Some(suppressed) = ctx.events.stale.admit() {
        tracing::warn!(
            event = "stale_fencing_token",
            stream = %name_field(stream),
            presented,
            highest,
            client_id = client.id,
            client_addr = %client.addr,
            client_name = %client.name_field(),
            suppressed,
            "stale fencing token rejected"
        );
    }
}

/// Logs the events an engine error stands for (a stale token, a lost
/// lease), with who caused it.
pub fn note_error(ctx: &Context, client: &ClientTag, stream: &[u8], e: &Error) {
    match e {
        Error::Stale { presented, highest } => {
            stale_event(ctx, client, stream, *presented, *highest)
        }
        Error::Aborted { cause, .. } => note_error(ctx, client, stream, cause),
        _ => {}
    }
}

/// How a command is answered.
pub enum Outcome {
    /// Now.
    Reply(Reply),
    /// When the decided write is durable.
    Later(Later),
    /// Now, then the connection closes.
    Close(Reply),
    /// A command that may wait (LOG.READ BLOCK, LEASE.ACQUIRE WAIT): run it
    /// while watching the connection, so that a client that goes away takes
    /// nothing.
    Blocking(Blocking),
    /// When a replicated write is applied (cluster mode; in order behind
    /// the answers before it).
    Replicated(crate::cluster::route::ReplyFuture),
    /// A reply too large for the client's output limit (an `EXEC` of many
    /// reads): the client is disconnected, as Redis does past
    /// `client-output-buffer-limit`.
    OverOutputLimit {
        /// Bytes of the reply gathered so far.
        reply_bytes: usize,
        /// `--client-output-buffer-limit`.
        limit_bytes: usize,
        /// Whether a transaction's writes were applied before (they are
        /// durable; only their answer is lost).
        transaction_applied: bool,
    },
}

/// A decided write's answer to come.
pub enum Later {
    Integer(Deferred<u64>),
    Token(Deferred<Token>),
}

impl Later {
    /// The answer, if it has come (polled in place: a connection keeps its
    /// answers in a queue without boxing each again).
    pub fn poll_result(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<fencelog::Result<u64>> {
        use std::future::Future;
        use std::pin::Pin;
        match self {
            Later::Integer(d) => Pin::new(d).poll(cx),
            Later::Token(d) => Pin::new(d).poll(cx).map(|r| r.map(Token::get)),
        }
    }

    /// The answer as a reply, if it has come.
    pub fn poll_reply(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Reply> {
        self.poll_result(cx).map(|r| match r {
            Ok(n) => integer(n),
            Err(e) => error_reply(&e),
        })
    }

    /// Waits for the answer.
    pub async fn reply(self) -> Reply {
        match self {
            Later::Integer(d) => match d.await {
                Ok(n) => integer(n),
                Err(e) => error_reply(&e),
            },
            Later::Token(d) => match d.await {
                Ok(t) => integer(t.get()),
                Err(e) => error_reply(&e),
            },
        }
    }
}

/// A command that may block for a while.
pub enum Blocking {
    Read {
        stream: Bytes,
        from: u64,
        opts: ReadOptions,
    },
    Acquire {
        name: Bytes,
        owner: Bytes,
        ttl: Duration,
        opts: AcquireOptions,
        /// Who asks, for the log event (boxed: every outcome carries this
        /// variant's size).
        client: Option<Box<ClientTag>>,
        /// Where the grant is noted, to log its expiry.
        ctx: Option<Arc<Context>>,
    },
}

/// Payload bytes one step of a read takes from the engine before it lets
/// other connections run: a 16 MiB read is 16 steps, not one long stall.
pub const READ_STEP_BYTES: u64 = 1 << 20;

/// Told the payload bytes a read has gathered so far, between its steps
/// (the connection reports them to the budget over all clients).
pub type ReadProgress = Arc<dyn Fn(usize) + Send + Sync>;

/// Reads like [`Log::read_with_async`], in steps of at most
/// [`READ_STEP_BYTES`], yielding between steps; `progress` is told the
/// payload bytes gathered so far. Records are immutable once durable, so the steps answer what
/// one read would, or a prefix of it (a trim between steps ends the read
/// early: a read answers at most, and the client pages on).
async fn stepped_read(
    log: &Log,
    stream: &[u8],
    from: u64,
    opts: ReadOptions,
    progress: Option<&ReadProgress>,
) -> fencelog::Result<Vec<fencelog::Record>> {
    let first = ReadOptions {
        max_bytes: opts.max_bytes.min(READ_STEP_BYTES),
        ..opts
    };
    let mut records = log.read_with_async(stream, from, &first).await?;
    let mut bytes: u64 = records.iter().map(|r| r.payload.len() as u64).sum();
    let mut step_bytes = bytes;
    // A step that came back at least half full stopped at its byte limit,
    // most likely: there may be more. Otherwise the stream ended there.
    while step_bytes >= READ_STEP_BYTES / 2
        && (records.len() as u64) < u64::from(opts.max_records)
        && bytes < opts.max_bytes
    {
        let Some(next_offset) = records.last().map(|r| r.offset + 1) else {
            break;
        };
        if let Some(p) = progress {
            p(usize::try_from(bytes).unwrap_or(usize::MAX));
        }
        tokio::task::yield_now().await;
        let step = ReadOptions {
            max_records: opts.max_records - records.len() as u32,
            max_bytes: (opts.max_bytes - bytes).min(READ_STEP_BYTES),
            wait: Duration::ZERO,
        };
        // An error past the first step (a trim meanwhile) ends the read with
        // what it has; the next read from there answers the error.
        let Ok(more) = log.read_with(stream, next_offset, &step) else {
            break;
        };
        step_bytes = 0;
        for record in more {
            let len = record.payload.len() as u64;
            // Only the first record of a read may be over the byte limit.
            if bytes + len > opts.max_bytes {
                step_bytes = 0;
                break;
            }
            bytes += len;
            step_bytes += len;
            records.push(record);
        }
    }
    if let Some(p) = progress {
        // The records go to the reply, which the connection counts.
        p(0);
    }
    Ok(records)
}

impl Blocking {
    /// Runs it to its answer. Dropping the future gives up the wait and
    /// takes nothing (an acquisition decided meanwhile is released).
    pub async fn run(self, log: Log) -> Reply {
        self.run_counted(log, None).await
    }

    /// As [`Blocking::run`], telling `progress` how many payload bytes a
    /// read has gathered so far.
    pub async fn run_counted(self, log: Log, progress: Option<ReadProgress>) -> Reply {
        match self {
            Blocking::Read { stream, from, opts } => {
                match stepped_read(&log, &stream, from, opts, progress.as_ref()).await {
                    Ok(records) => records_reply(records),
                    Err(e) => error_reply(&e),
                }
            }
            Blocking::Acquire {
                name,
                owner,
                ttl,
                opts,
                client,
                ctx,
            } => match log.acquire_async(&name, &owner, ttl, opts).await {
                Ok(g) => {
                    if let Some(ctx) = &ctx {
                        lease_granted(
                            ctx,
                            client.as_deref(),
                            &name,
                            &owner,
                            g.token.get(),
                            g.ttl,
                            opts.fence,
                        );
                    }
                    Reply::Array(vec![
                        integer(g.token.get()),
                        integer(g.ttl.as_millis() as u64),
                    ])
                }
                Err(e) => {
                    if let (Some(ctx), Some(client)) = (&ctx, &client) {
                        note_error(ctx, client, &name, &e);
                    }
                    error_reply(&e)
                }
            },
        }
    }

    /// The same command, answering at once instead of waiting (`BLOCK` and
    /// `WAIT` inside a transaction).
    pub fn without_wait(self) -> Blocking {
        match self {
            Blocking::Read {
                stream,
                from,
                mut opts,
            } => {
                opts.wait = Duration::ZERO;
                Blocking::Read { stream, from, opts }
            }
            Blocking::Acquire {
                name,
                owner,
                ttl,
                mut opts,
                client,
                ctx,
            } => {
                opts.wait = None;
                Blocking::Acquire {
                    name,
                    owner,
                    ttl,
                    opts,
                    client,
                    ctx,
                }
            }
        }
    }

    /// What a client waiting in this command is told when the server shuts
    /// down: a read with `BLOCK` answers what a timeout answers (nothing
    /// new); a waiting acquisition is given up (and takes nothing). `None`:
    /// it does not wait, and finishes.
    pub fn shutdown_reply(&self) -> Option<Reply> {
        match self {
            Blocking::Read { opts, .. } if opts.wait.is_zero() => None,
            Blocking::Read { .. } => Some(Reply::Array(Vec::new())),
            Blocking::Acquire { .. } => Some(Reply::Error(
                "ERR the server is shutting down: the wait ended and nothing was acquired".into(),
            )),
        }
    }
}

/// Logs a `lease_acquired` event and remembers the grant, so that its
/// expiry can be logged too.
fn lease_granted(
    ctx: &Context,
    client: Option<&ClientTag>,
    name: &Bytes,
    owner: &Bytes,
    token: u64,
    ttl: Duration,
    fence: bool,
) {
    tracing::info!(
        event = "lease_acquired",
        lease = %name_field(name),
        owner = %name_field(owner),
        token,
        ttl_ms = ttl.as_millis() as u64,
        fence,
        client_addr = %client.map(|c| c.addr.to_string()).unwrap_or_default(),
        client_name = %client.map(ClientTag::name_field).unwrap_or_default(),
        "lease acquired"
    );
    ctx.events.leases.lock().insert(
        name.clone(),
        (owner.clone(), token, std::time::Instant::now() + ttl),
    );
}

/// Logs `lease_expired` for every lease granted here whose ttl has run out
/// and that the engine no longer shows live under the same token (it was
/// neither renewed nor released in time). Called once a second.
pub fn sweep_expired_leases(ctx: &Context) {
    let now = std::time::Instant::now();
    let due: Vec<(Bytes, Bytes, u64)> = ctx
        .events
        .leases
        .lock()
        .iter()
        .filter(|(_, (_, _, until))| *until <= now)
        .map(|(name, (owner, token, _))| (name.clone(), owner.clone(), *token))
        .collect();
    for (name, owner, token) in due {
        let live = ctx.engine().lease_info(&name).ok().flatten();
        let mut leases = ctx.events.leases.lock();
        match live {
            Some(info) if info.token.get() == token => {
                // Renewed: look again when the new ttl runs out.
                leases.insert(name, (owner, token, now + info.remaining));
            }
            _ => {
                leases.remove(&name);
                drop(leases);
                tracing::info!(
                    event = "lease_expired",
                    lease = %name_field(&name),
                    owner = %name_field(&owner),
                    token,
                    "lease expired: neither renewed nor released within its ttl"
                );
            }
        }
    }
}

fn integer(n: u64) -> Reply {
    Reply::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

/// `STALE token 41 is below the highest accepted token 42`, in one
/// allocation of the right size: the reply of every rejection, so without
/// the formatting machinery.
fn stale_text(presented: u64, highest: u64) -> String {
    const HEAD: &str = "STALE token ";
    const MIDDLE: &str = " is below the highest accepted token ";
    let (mut p, mut h) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (p, h) = (p.format(presented), h.format(highest));
    let mut text = String::with_capacity(HEAD.len() + p.len() + MIDDLE.len() + h.len());
    text.push_str(HEAD);
    text.push_str(p);
    text.push_str(MIDDLE);
    text.push_str(h);
    text
}

/// The engine's errors on the wire: a code, then a sentence with the numbers.
/// The first number of STALE, MISMATCH and TRIMMED is the client's.
pub fn error_reply(e: &Error) -> Reply {
    let text = match e {
        Error::Stale { presented, highest } => stale_text(*presented, *highest),
        Error::OffsetMismatch { expected, next } => {
            format!("MISMATCH expected offset {expected} but the next offset is {next}")
        }
        Error::Trimmed { requested, start } => {
            format!("TRIMMED offset {requested} is below the start offset {start}")
        }
        Error::Held { remaining_ms } => {
            format!("HELD lease is held by another owner for {remaining_ms} ms")
        }
        Error::Lost => "LOST lease is not held by this owner and token".into(),
        Error::TooLarge { .. } => format!("TOOBIG {e}"),
        Error::Io(_) | Error::Failed { .. } | Error::Corrupt { .. } | Error::Locked { .. } => {
            format!("IOERR {e}")
        }
        _ => format!("ERR {e}"),
    };
    Reply::Error(text)
}

fn records_reply(records: Vec<fencelog::Record>) -> Reply {
    Reply::Array(
        records
            .into_iter()
            .map(|r| {
                Reply::Array(vec![
                    integer(r.offset),
                    integer(r.token.get()),
                    Reply::Bulk(r.payload),
                ])
            })
            .collect(),
    )
}

pub(crate) fn err(text: impl Into<String>) -> Outcome {
    Outcome::Reply(Reply::Error(text.into()))
}

pub(crate) fn wrong_arity(cmd: &str) -> Outcome {
    err(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

fn not_integer() -> Outcome {
    err("ERR value is not an integer or out of range")
}

fn parse_token(b: &[u8]) -> Result<Token, Outcome> {
    let n = parse_u64(b).ok_or_else(|| err("ERR token is not an integer or out of range"))?;
    Token::new(n).map_err(|e| Outcome::Reply(error_reply(&e)))
}

/// A command or option name in upper case, on the stack: every request
/// matches one, so it must not allocate.
pub(crate) struct Upper {
    buf: [u8; Upper::MAX],
    len: usize,
}

impl Upper {
    /// Longer than any name this server knows.
    const MAX: usize = 24;

    pub(crate) fn as_str(&self) -> &str {
        debug_assert!(self.buf[..self.len].is_ascii());
        // SAFETY: `upper` copies in nothing but ASCII (it checks), and
        // ASCII is UTF-8. (Checked again here, this was 2 % of the CPU of
        // a stale rejection: every request looks its name up twice.)
        unsafe { std::str::from_utf8_unchecked(&self.buf[..self.len]) }
    }
}

/// `b` in upper case; a name too long or not ASCII is empty, which matches
/// nothing (error messages quote the name as the client sent it).
pub(crate) fn upper(b: &[u8]) -> Upper {
    let mut u = Upper {
        buf: [0; Upper::MAX],
        len: 0,
    };
    if b.len() <= Upper::MAX && b.is_ascii() {
        u.buf[..b.len()].copy_from_slice(b);
        u.buf[..b.len()].make_ascii_uppercase();
        u.len = b.len();
    }
    u
}

/// A client's word, for an error message: its first 128 bytes, as Redis
/// quotes it. Whole, three 16 MiB arguments of invalid UTF-8 would make a
/// 144 MiB error (each bad byte turns into a 3-byte U+FFFD).
fn quoted(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&b[..b.len().min(QUOTED_BYTES)])
}

/// How much of a client's word an error message quotes.
const QUOTED_BYTES: usize = 128;

/// Commands allowed before authentication.
fn allowed_unauthenticated(cmd: &str) -> bool {
    matches!(cmd, "AUTH" | "HELLO" | "QUIT")
}

/// Runs one request. Decided writes come back as [`Outcome::Later`];
/// inside a transaction, commands are queued (`transaction.rs`).
pub async fn execute(ctx: &Arc<Context>, session: &mut Session, args: Vec<Bytes>) -> Outcome {
    let Some(first) = args.first() else {
        return err("ERR empty command");
    };
    let upper_cmd = upper(first);
    let cmd = upper_cmd.as_str();
    ctx.stats.commands.fetch_add(1, Ordering::Relaxed);
    if let (Some(r), Some(spec)) = (&session.registration, command_table::lookup(cmd)) {
        // `CLIENT LIST` shows subcommands as Redis does: `client|list`.
        let sub = args
            .get(1)
            .filter(|_| !spec.subcommands.is_empty())
            .and_then(|s| {
                let s = upper(s);
                spec.subcommands
                    .iter()
                    .find(|c| c.name.split_once('|').is_some_and(|(_, n)| n == s.as_str()))
            });
        r.command(sub.unwrap_or(spec).name);
    }
    if ctx.config.requirepass.is_some() && !session.authenticated && !allowed_unauthenticated(cmd) {
        return err("NOAUTH Authentication required.");
    }
    if session.multi.is_some() && !transaction::runs_at_once(cmd) {
        return Outcome::Reply(transaction::queue(cmd, args, session));
    }
    match cmd {
        "MULTI" => Outcome::Reply(transaction::multi(&args[1..], session)),
        "EXEC" => transaction::exec(ctx, &args[1..], session).await,
        "DISCARD" => Outcome::Reply(transaction::discard(&args[1..], session)),
        "WATCH" => Outcome::Reply(transaction::watch(&args[1..], session)),
        _ => run_named(ctx, session, &args, cmd).await,
    }
}

/// How a request may be pipelined behind the answers still to come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipelining {
    /// It runs once every answer before it is out (it sees them).
    InOrder,
    /// A write: decided now, answered once durable (or, in cluster mode,
    /// applied), while later writes are decided. It may follow writes,
    /// never a read still waiting (that read must not see it).
    Write,
    /// A cluster read: it joins a ReadIndex round now and is answered,
    /// in order, once the round is done. It may follow reads, never a
    /// write still waiting (it must see that write).
    Read,
}

/// How `request` may be pipelined. Inside a transaction nothing is
/// (writes are queued).
pub fn pipelining(session: &Session, request: &[Bytes], cluster: bool) -> Pipelining {
    let Some(cmd) = request.first().filter(|_| session.multi.is_none()) else {
        return Pipelining::InOrder;
    };
    let is = |names: &[&str]| names.iter().any(|w| cmd.eq_ignore_ascii_case(w.as_bytes()));
    if is(WRITES) || (cluster && is_lease_write(request)) {
        Pipelining::Write
    } else if cluster
        && is(READS)
        && !request[1..]
            .iter()
            .any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
    {
        Pipelining::Read
    } else {
        Pipelining::InOrder
    }
}

/// The commands that read streams' state: in cluster mode each is
/// answered after a ReadIndex round.
pub(crate) const READS: &[&str] = &["LOG.READ", "LOG.STAT", "LOG.STREAMS", "DBSIZE"];

/// Runs one of [`READS`] against `log` now; `None` for any other command.
/// A `LOG.READ` is a [`Blocking`] read the caller runs (in steps).
pub(crate) fn stream_read(ctx: &Context, log: &Log, cmd: &str, a: &[Bytes]) -> Option<Outcome> {
    Some(match cmd {
        "LOG.READ" => read(cmd, a, ctx),
        "LOG.STAT" if a.len() != 1 => wrong_arity(cmd),
        "LOG.STAT" => match log.stat(&a[0]) {
            Ok(st) => Outcome::Reply(Reply::Map(vec![
                (Reply::text("highest_token"), integer(st.highest_token)),
                (Reply::text("next_offset"), integer(st.next_offset)),
                (Reply::text("start_offset"), integer(st.start_offset)),
                (Reply::text("records"), integer(st.records)),
                (Reply::text("bytes"), integer(st.bytes)),
            ])),
            Err(e) => Outcome::Reply(error_reply(&e)),
        },
        "LOG.STREAMS" => streams(a, log),
        "DBSIZE" if a.is_empty() => Outcome::Reply(integer(log.metrics().streams)),
        "DBSIZE" => wrong_arity(cmd),
        _ => return None,
    })
}

/// In cluster mode a lease command that does not wait is a write proposed
/// in the connection's order, like a stream write: pipelined ones share
/// entries (one entry each made a flood of them cost a round of
/// replication apiece: 1,500 acquisitions/s where fences went ten times
/// faster).
fn is_lease_write(request: &[Bytes]) -> bool {
    let Some(cmd) = request.first() else {
        return false;
    };
    if cmd.eq_ignore_ascii_case(b"LEASE.RENEW") || cmd.eq_ignore_ascii_case(b"LEASE.RELEASE") {
        return true;
    }
    cmd.eq_ignore_ascii_case(b"LEASE.ACQUIRE")
        && !request[1..].iter().any(|a| a.eq_ignore_ascii_case(b"WAIT"))
}

/// The commands that change streams: what a transaction puts in its entry.
pub(crate) const WRITES: &[&str] = &[
    "LOG.APPEND",
    "LOG.APPENDAT",
    "LOG.FENCE",
    "LOG.TRIM",
    "LOG.DELETE",
];

/// A write command parsed into the op it is; `None` for any other command.
/// The error is the command's answer (arity, a token of 0, not a number).
pub(crate) fn parse_write(cmd: &str, a: &[Bytes]) -> Option<Result<TxOp, Reply>> {
    let parsed = match cmd {
        "LOG.APPEND" => (|| {
            if a.len() < 3 {
                return Err(wrong_arity(cmd));
            }
            Ok(TxOp::Append {
                stream: a[0].clone(),
                token: parse_token(&a[1])?,
                payloads: a[2..].to_vec(),
            })
        })(),
        "LOG.APPENDAT" => (|| {
            if a.len() < 4 {
                return Err(wrong_arity(cmd));
            }
            let token = parse_token(&a[1])?;
            let expected_offset = parse_u64(&a[2]).ok_or_else(not_integer)?;
            Ok(TxOp::AppendAt {
                stream: a[0].clone(),
                token,
                expected_offset,
                payloads: a[3..].to_vec(),
            })
        })(),
        "LOG.FENCE" => (|| {
            if a.len() != 2 {
                return Err(wrong_arity(cmd));
            }
            Ok(TxOp::Fence {
                stream: a[0].clone(),
                token: parse_token(&a[1])?,
            })
        })(),
        "LOG.TRIM" => (|| {
            if a.len() != 3 {
                return Err(wrong_arity(cmd));
            }
            let token = parse_token(&a[1])?;
            let before = parse_u64(&a[2]).ok_or_else(not_integer)?;
            Ok(TxOp::Trim {
                stream: a[0].clone(),
                token,
                before,
            })
        })(),
        "LOG.DELETE" => (|| {
            if a.len() != 2 {
                return Err(wrong_arity(cmd));
            }
            Ok(TxOp::Delete {
                stream: a[0].clone(),
                token: parse_token(&a[1])?,
            })
        })(),
        _ => return None,
    };
    Some(parsed.map_err(|o| match o {
        Outcome::Reply(r) => r,
        _ => Reply::Error("ERR syntax error".into()),
    }))
}

/// The stream a write op changes.
pub(crate) fn op_stream(op: &TxOp) -> &Bytes {
    match op {
        TxOp::Append { stream, .. }
        | TxOp::AppendAt { stream, .. }
        | TxOp::Fence { stream, .. }
        | TxOp::Trim { stream, .. }
        | TxOp::Delete { stream, .. } => stream,
    }
}

/// Decides a write now; its answer comes once durable.
async fn write(ctx: &Context, client: &ClientTag, op: TxOp) -> Outcome {
    let log = &ctx.log;
    let stream = op_stream(&op).clone();
    let decided = match op {
        TxOp::Append {
            stream,
            token,
            payloads,
        } => log
            .append_deferred(&stream, token, payloads)
            .await
            .map(Later::Integer),
        TxOp::AppendAt {
            stream,
            token,
            expected_offset,
            payloads,
        } => log
            .append_at_deferred(&stream, token, expected_offset, payloads)
            .await
            .map(Later::Integer),
        TxOp::Fence { stream, token } => log.fence_deferred(&stream, token).await.map(Later::Token),
        TxOp::Trim {
            stream,
            token,
            before,
        } => log
            .trim_deferred(&stream, token, before)
            .await
            .map(Later::Integer),
        TxOp::Delete { stream, token } => log
            .delete_deferred(&stream, token)
            .await
            .map(Later::Integer),
        // TxOp is non-exhaustive in spirit: a new kind is refused, not run.
        #[allow(unreachable_patterns)]
        _ => return err("ERR this write cannot be run on its own"),
    };
    match decided {
        Ok(later) => Outcome::Later(later),
        Err(e) => {
            note_error(ctx, client, &stream, &e);
            Outcome::Reply(error_reply(&e))
        }
    }
}

/// Runs one command outside `MULTI`/`EXEC` handling (also each command of
/// an `EXEC`): `args` is the whole request, name first.
pub(crate) async fn run(ctx: &Arc<Context>, session: &mut Session, args: &[Bytes]) -> Outcome {
    let Some(first) = args.first() else {
        return err("ERR empty command");
    };
    let upper_cmd = upper(first);
    run_named(ctx, session, args, upper_cmd.as_str()).await
}

/// [`run`] with the command's name already in upper case.
async fn run_named(
    ctx: &Arc<Context>,
    session: &mut Session,
    args: &[Bytes],
    cmd: &str,
) -> Outcome {
    let a = &args[1..];
    if let Some(cluster) = &ctx.cluster
        && let Some(outcome) = crate::cluster::route::run(ctx, cluster, session, cmd, args).await
    {
        return outcome;
    }
    let engine = ctx.engine();
    let log = &*engine;
    // A stale append is refused before it is built into an op (no copies
    // of its arguments, no future): the most frequent refusal there is.
    if cmd == "LOG.APPEND"
        && a.len() >= 3
        && let Some(token) = parse_u64(&a[1]).and_then(|t| Token::new(t).ok())
        && let Err(e @ Error::Stale { .. }) = log.check_append(&a[0], token, &a[2..])
    {
        note_error(ctx, &session.tag(), &a[0], &e);
        return Outcome::Reply(error_reply(&e));
    }
    if let Some(parsed) = parse_write(cmd, a) {
        return match parsed {
            Ok(op) => write(ctx, &session.tag(), op).await,
            Err(reply) => Outcome::Reply(reply),
        };
    }
    if let Some(outcome) = stream_read(ctx, log, cmd, a) {
        return outcome;
    }
    match cmd {
        "LEASE.ACQUIRE" => acquire(cmd, a, ctx, session),
        "LEASE.RENEW" => {
            let (token, ttl_ms) = match parse_renew(cmd, a) {
                Ok(parsed) => parsed,
                Err(o) => return o,
            };
            match log
                .renew_async(&a[0], &a[1], token, Duration::from_millis(ttl_ms))
                .await
            {
                Ok(ttl) => {
                    if let Some(l) = ctx.events.leases.lock().get_mut(&a[0])
                        && l.1 == token.get()
                    {
                        l.2 = std::time::Instant::now() + ttl;
                    }
                    Outcome::Reply(integer(ttl.as_millis() as u64))
                }
                Err(e) => {
                    if matches!(e, Error::Lost) {
                        let client = session.tag();
                        tracing::info!(
                            event = "lease_lost",
                            lease = %name_field(&a[0]),
                            owner = %name_field(&a[1]),
                            token = token.get(),
                            client_addr = %client.addr,
                            client_name = %client.name_field(),
                            "lease renewal refused: the lease is lost"
                        );
                    }
                    Outcome::Reply(error_reply(&e))
                }
            }
        }
        "LEASE.RELEASE" => {
            let token = match parse_release(cmd, a) {
                Ok(t) => t,
                Err(o) => return o,
            };
            match log.release_async(&a[0], &a[1], token).await {
                Ok(released) => {
                    if released {
                        let mut leases = ctx.events.leases.lock();
                        if leases.get(&a[0]).is_some_and(|l| l.1 == token.get()) {
                            leases.remove(&a[0]);
                        }
                    }
                    Outcome::Reply(Reply::Integer(i64::from(released)))
                }
                Err(e) => Outcome::Reply(error_reply(&e)),
            }
        }
        "LEASE.INFO" => {
            if a.len() != 1 {
                return wrong_arity(cmd);
            }
            match log.lease_info(&a[0]) {
                Ok(Some(info)) => Outcome::Reply(Reply::Array(vec![
                    Reply::Bulk(info.owner),
                    integer(info.token.get()),
                    integer(info.remaining.as_millis() as u64),
                ])),
                Ok(None) => Outcome::Reply(Reply::Null),
                Err(e) => Outcome::Reply(error_reply(&e)),
            }
        }
        "PING" => match a.len() {
            0 => Outcome::Reply(Reply::Simple("PONG".into())),
            1 => Outcome::Reply(Reply::Bulk(a[0].clone())),
            _ => wrong_arity(cmd),
        },
        "ECHO" => match a.len() {
            1 => Outcome::Reply(Reply::Bulk(a[0].clone())),
            _ => wrong_arity(cmd),
        },
        "QUIT" => Outcome::Close(Reply::ok()),
        "AUTH" => auth(cmd, a, ctx, session),
        "HELLO" => hello(cmd, a, ctx, session),
        "SELECT" => match a.len() {
            1 if &a[0][..] == b"0" => Outcome::Reply(Reply::ok()),
            1 => err("ERR DB index is out of range"),
            _ => wrong_arity(cmd),
        },
        "CLIENT" => client(a, ctx, session),
        "INFO" => {
            let sections: Vec<String> = a.iter().map(|s| quoted(s).to_ascii_lowercase()).collect();
            let text = info::info_text(ctx, &sections);
            Outcome::Reply(Reply::Verbatim(text))
        }
        "CONFIG" => config(a, ctx),
        "COMMAND" => command(a),
        // Redis' own words, so cluster clients know where they are.
        "CLUSTER" | "READONLY" | "READWRITE" | "ASKING" => {
            err("ERR This instance has cluster support disabled")
        }
        // Nothing is watched, so nothing is unwatched; clients send it when
        // they reset a pipeline.
        "UNWATCH" if a.is_empty() => Outcome::Reply(Reply::ok()),
        "UNWATCH" => wrong_arity(cmd),
        _ => Outcome::Reply(unknown_command(args)),
    }
}

/// Arity of every command, as Redis counts it (the name included; negative:
/// at least that many), from the command table. A transaction checks it
/// while queuing, as Redis does: an unknown command or a wrong count
/// discards the transaction.
pub(crate) fn arity(cmd: &str) -> Option<i32> {
    command_table::lookup(cmd).map(|c| c.arity)
}

/// Whether `n` arguments (the name included) fit `cmd`'s arity.
pub(crate) fn arity_fits(cmd: &str, n: usize) -> bool {
    match arity(cmd) {
        Some(a) if a >= 0 => n == a as usize,
        Some(a) => n >= a.unsigned_abs() as usize,
        None => false,
    }
}

/// The answer to a command this server does not know, as Redis words it.
pub(crate) fn unknown_command(args: &[Bytes]) -> Reply {
    let mut shown = String::new();
    for arg in args.iter().skip(1).take(3) {
        shown.push_str(&format!("'{}' ", quoted(arg)));
    }
    Reply::Error(format!(
        "ERR unknown command '{}', with args beginning with: {}",
        args.first().map_or_else(Default::default, |c| quoted(c)),
        shown
    ))
}

/// The most names one `LOG.STREAMS` answers: a request's work is a page,
/// whatever the number of streams (a million streams listed at once kept a
/// server thread busy for 0.7 s and made a 21 MB reply).
pub const MAX_STREAMS_PAGE: u64 = 10_000;

/// `LOG.STREAMS [AFTER name] [COUNT n]`: names in byte order, strictly
/// after `name`. Without `COUNT`, every such name, unless there are more
/// than [`MAX_STREAMS_PAGE`]: then an error that says how to page, not a
/// list cut short without a word.
fn streams(a: &[Bytes], log: &Log) -> Outcome {
    let mut after: Option<&[u8]> = None;
    let mut count: Option<u64> = None;
    let mut rest = a;
    while let [opt, value, tail @ ..] = rest {
        match upper(opt).as_str() {
            "AFTER" => after = Some(value),
            "COUNT" => match parse_u64(value) {
                Some(n @ 1..=MAX_STREAMS_PAGE) => count = Some(n),
                Some(_) => {
                    return err(format!(
                        "ERR COUNT must be between 1 and {MAX_STREAMS_PAGE}"
                    ));
                }
                None => return not_integer(),
            },
            _ => return err("ERR syntax error"),
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return err("ERR syntax error");
    }
    // Without COUNT, one name more than a page tells whether the list
    // would be cut: the index answers that, no count of every stream.
    let page = count.unwrap_or(MAX_STREAMS_PAGE + 1);
    let names = log.streams_after(after, usize::try_from(page).unwrap_or(usize::MAX));
    if names.len() as u64 > MAX_STREAMS_PAGE {
        // The error path only: the count comes from the engine's state.
        let streams = log.metrics().streams;
        return err(format!(
            "ERR {streams} streams, more than one LOG.STREAMS lists \
             ({MAX_STREAMS_PAGE}): page with LOG.STREAMS COUNT n, then AFTER the last \
             name"
        ));
    }
    Outcome::Reply(Reply::Array(names.into_iter().map(Reply::Bulk).collect()))
}

/// `LOG.READ stream from [COUNT n] [BLOCK ms]`
fn read(cmd: &str, a: &[Bytes], ctx: &Context) -> Outcome {
    if a.len() < 2 {
        return wrong_arity(cmd);
    }
    let Some(from) = parse_u64(&a[1]) else {
        return not_integer();
    };
    let mut count = 100u32;
    let mut block: Option<u64> = None;
    let mut rest = &a[2..];
    while let [opt, value, tail @ ..] = rest {
        let Some(n) = parse_u64(value) else {
            return not_integer();
        };
        match upper(opt).as_str() {
            "COUNT" if n >= 1 => count = u32::try_from(n).unwrap_or(u32::MAX),
            "COUNT" => return err("ERR COUNT must be at least 1"),
            "BLOCK" => block = Some(n),
            _ => return err("ERR syntax error"),
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return err("ERR syntax error");
    }
    let mut opts = ReadOptions {
        max_records: count,
        max_bytes: ctx.config.max_read_bytes,
        wait: Duration::ZERO,
    };
    match block {
        // Run in steps by the connection: a large read yields to others.
        None => Outcome::Blocking(Blocking::Read {
            stream: a[0].clone(),
            from,
            opts,
        }),
        Some(ms) => {
            // BLOCK 0 waits without a limit, as in Redis.
            opts.wait = if ms == 0 {
                Duration::MAX
            } else {
                Duration::from_millis(ms)
            };
            Outcome::Blocking(Blocking::Read {
                stream: a[0].clone(),
                from,
                opts,
            })
        }
    }
}

/// `LEASE.ACQUIRE name owner ttl_ms [FENCE] [WAIT ms]`
/// `LEASE.RENEW name owner token ttl_ms`: the token and the ttl, or the
/// answer to a malformed command (one parser for both modes).
pub(crate) fn parse_renew(cmd: &str, a: &[Bytes]) -> Result<(Token, u64), Outcome> {
    if a.len() != 4 {
        return Err(wrong_arity(cmd));
    }
    let token = parse_token(&a[2])?;
    let ttl_ms = parse_u64(&a[3]).ok_or_else(not_integer)?;
    Ok((token, ttl_ms))
}

/// `LEASE.RELEASE name owner token`: the token, or the answer to a
/// malformed command (one parser for both modes).
pub(crate) fn parse_release(cmd: &str, a: &[Bytes]) -> Result<Token, Outcome> {
    if a.len() != 3 {
        return Err(wrong_arity(cmd));
    }
    parse_token(&a[2])
}

pub(crate) fn acquire(cmd: &str, a: &[Bytes], ctx: &Arc<Context>, session: &Session) -> Outcome {
    if a.len() < 3 {
        return wrong_arity(cmd);
    }
    let Some(ttl_ms) = parse_u64(&a[2]) else {
        return not_integer();
    };
    let mut opts = AcquireOptions::default();
    let mut rest = &a[3..];
    while let [opt, tail @ ..] = rest {
        match upper(opt).as_str() {
            "FENCE" => {
                opts.fence = true;
                rest = tail;
            }
            "WAIT" => {
                let [value, tail @ ..] = tail else {
                    return err("ERR syntax error");
                };
                let Some(ms) = parse_u64(value) else {
                    return not_integer();
                };
                // WAIT 0 waits without a limit, as BLOCK 0 does.
                opts.wait = Some(if ms == 0 {
                    Duration::MAX
                } else {
                    Duration::from_millis(ms)
                });
                rest = tail;
            }
            _ => return err("ERR syntax error"),
        }
    }
    Outcome::Blocking(Blocking::Acquire {
        name: a[0].clone(),
        owner: a[1].clone(),
        ttl: Duration::from_millis(ttl_ms),
        opts,
        client: Some(Box::new(session.tag())),
        ctx: Some(Arc::clone(ctx)),
    })
}

fn check_password(ctx: &Context, user: Option<&[u8]>, password: &[u8]) -> bool {
    match &ctx.config.requirepass {
        Some(pass) => {
            user.is_none_or(|u| u == b"default") && constant_time_eq(pass.as_bytes(), password)
        }
        None => false,
    }
}

/// Compares without stopping at the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Logs an `auth_failed` event: who, with which user name; never the
/// password.
fn auth_failed(session: &Session, command: &str, user: Option<&[u8]>) {
    let client = session.tag();
    tracing::warn!(
        event = "auth_failed",
        command,
        user = %user.map(name_field).unwrap_or_else(|| "default".into()),
        client_addr = %client.addr,
        client_name = %client.name_field(),
        "authentication failed"
    );
}

const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// `AUTH [user] password`
fn auth(cmd: &str, a: &[Bytes], ctx: &Context, session: &mut Session) -> Outcome {
    let (user, password) = match a {
        [p] => (None, p),
        [u, p] => (Some(&u[..]), p),
        _ => return wrong_arity(cmd),
    };
    if ctx.config.requirepass.is_none() {
        return err(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        );
    }
    if check_password(ctx, user, password) {
        session.authenticated = true;
        Outcome::Reply(Reply::ok())
    } else {
        auth_failed(session, "AUTH", user);
        err(WRONGPASS)
    }
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`
fn hello(_cmd: &str, a: &[Bytes], ctx: &Context, session: &mut Session) -> Outcome {
    let mut proto = session.proto;
    let mut rest = a;
    if let [v, tail @ ..] = rest {
        match parse_u64(v) {
            Some(2) => proto = 2,
            Some(3) => proto = 3,
            Some(_) => return err("NOPROTO unsupported protocol version"),
            None => return err("ERR Protocol version is not an integer or out of range"),
        }
        rest = tail;
    }
    let mut name = None;
    let mut authed = session.authenticated;
    while let [opt, tail @ ..] = rest {
        match (upper(opt).as_str(), tail) {
            ("AUTH", [user, pass, tail @ ..]) => {
                // Without a password the default user needs none, as in Redis.
                let ok = match ctx.config.requirepass {
                    None => &user[..] == b"default",
                    Some(_) => check_password(ctx, Some(user), pass),
                };
                if !ok {
                    auth_failed(session, "HELLO", Some(user));
                    return err(WRONGPASS);
                }
                authed = true;
                rest = tail;
            }
            ("SETNAME", [n, tail @ ..]) => {
                name = Some(n.clone());
                rest = tail;
            }
            _ => return err("ERR Syntax error in HELLO option"),
        }
    }
    if ctx.config.requirepass.is_some() && !authed {
        return err(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
        );
    }
    session.authenticated = authed;
    session.proto = proto;
    if let Some(n) = name {
        session.name = Some(n);
    }
    Outcome::Reply(Reply::Map(vec![
        (Reply::text("server"), Reply::text("fencelog")),
        (
            Reply::text("version"),
            Reply::text(env!("CARGO_PKG_VERSION")),
        ),
        (Reply::text("proto"), Reply::Integer(i64::from(proto))),
        (Reply::text("id"), integer(session.id)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(Vec::new())),
    ]))
}

/// `COMMAND [COUNT | LIST | INFO name… | DOCS name… | GETKEYS command arg…]`,
/// from the table.
fn command(a: &[Bytes]) -> Outcome {
    let Some(sub) = a.first() else {
        return Outcome::Reply(Reply::Array(
            command_table::COMMANDS
                .iter()
                .map(command_table::CommandSpec::info_reply)
                .collect(),
        ));
    };
    // The commands named (upper case), or every one.
    let named = |names: &[Bytes]| -> Vec<Option<&'static command_table::CommandSpec>> {
        if names.is_empty() {
            command_table::COMMANDS.iter().map(Some).collect()
        } else {
            names
                .iter()
                .map(|n| {
                    let name = String::from_utf8_lossy(n).to_ascii_uppercase();
                    command_table::lookup(&name)
                })
                .collect()
        }
    };
    match (upper(sub).as_str(), &a[1..]) {
        ("COUNT", []) => Outcome::Reply(integer(command_table::COMMANDS.len() as u64)),
        ("LIST", []) => Outcome::Reply(Reply::Array(
            command_table::COMMANDS
                .iter()
                .map(|c| Reply::text(c.lower_name()))
                .collect(),
        )),
        ("INFO", names) => Outcome::Reply(Reply::Array(
            named(names)
                .into_iter()
                .map(|c| c.map_or(Reply::Null, command_table::CommandSpec::info_reply))
                .collect(),
        )),
        // Unknown names are left out, as Redis does.
        ("DOCS", names) => Outcome::Reply(Reply::Map(
            named(names)
                .into_iter()
                .flatten()
                .map(|c| (Reply::text(c.lower_name()), c.docs_reply()))
                .collect(),
        )),
        ("GETKEYS", [name, ..]) => {
            let Some(spec) = command_table::lookup(upper(name).as_str()) else {
                return err("ERR Invalid command specified");
            };
            match spec.keys_of(&a[1..]) {
                None => err("ERR Invalid number of arguments specified for command"),
                Some(keys) if keys.is_empty() => err("ERR The command has no key arguments"),
                Some(keys) => Outcome::Reply(Reply::Array(
                    keys.into_iter().map(|k| Reply::Bulk(k.clone())).collect(),
                )),
            }
        }
        ("COUNT" | "LIST" | "GETKEYS", _) => err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'",
            quoted(sub)
        )),
        _ => err(format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            quoted(sub)
        )),
    }
}

/// `CLIENT ID | SETNAME name | GETNAME | SETINFO attr value | LIST [ID id…]
/// | KILL …`
fn client(a: &[Bytes], ctx: &Context, session: &mut Session) -> Outcome {
    let Some(sub) = a.first() else {
        return wrong_arity("client");
    };
    match (upper(sub).as_str(), &a[1..]) {
        ("ID", []) => Outcome::Reply(integer(session.id)),
        ("GETNAME", []) => Outcome::Reply(session.name.clone().map_or(Reply::Null, Reply::Bulk)),
        ("SETNAME", [name]) => {
            if name.iter().any(|b| !b.is_ascii_graphic()) {
                return err(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            session.name = (!name.is_empty()).then(|| name.clone());
            Outcome::Reply(Reply::ok())
        }
        ("SETINFO", [attr, value]) => {
            if value.iter().any(|b| !b.is_ascii_graphic()) {
                return err(
                    "ERR lib-name and lib-ver cannot contain spaces, newlines or special characters.",
                );
            }
            let r = session.registration.as_ref();
            match upper(attr).as_str() {
                "LIB-NAME" => r.map(|r| r.set_lib(Some(value.clone()), None)),
                "LIB-VER" => r.map(|r| r.set_lib(None, Some(value.clone()))),
                _ => return err(format!("ERR Unrecognized option '{}'", quoted(attr))),
            };
            Outcome::Reply(Reply::ok())
        }
        ("LIST", rest) => {
            let ids = match rest {
                [] => None,
                [kw, ids @ ..] if upper(kw).as_str() == "ID" && !ids.is_empty() => {
                    let mut parsed = Vec::new();
                    for id in ids {
                        match parse_u64(id) {
                            Some(n) => parsed.push(n),
                            None => return err("ERR Invalid client ID"),
                        }
                    }
                    Some(parsed)
                }
                [kw, ..] if upper(kw).as_str() == "TYPE" => None,
                _ => return err("ERR syntax error"),
            };
            let text = ctx
                .registry
                .list(ids.as_deref(), |id| ctx.clients.client_bytes(id));
            Outcome::Reply(Reply::Verbatim(text))
        }
        ("KILL", rest) => client_kill(rest, ctx, session),
        _ => err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'",
            quoted(sub)
        )),
    }
}

/// `CLIENT KILL ip:port` (answers OK or an error) or `CLIENT KILL [ID id]
/// [ADDR ip:port] [LADDR ip:port] [USER name] [SKIPME yes|no]` (answers
/// how many were closed), as in Redis.
fn client_kill(rest: &[Bytes], ctx: &Context, session: &Session) -> Outcome {
    if let [addr] = rest {
        let addr = String::from_utf8_lossy(addr).to_string();
        let n = ctx.registry.kill(|c| c.addr.to_string() == addr, None);
        return if n > 0 {
            Outcome::Reply(Reply::ok())
        } else {
            err("ERR No such client")
        };
    }
    if rest.is_empty() || !rest.len().is_multiple_of(2) {
        return err("ERR syntax error");
    }
    let mut id = None;
    let mut addr = None;
    let mut laddr = None;
    let mut user_ok = true;
    let mut skipme = true;
    for pair in rest.chunks(2) {
        let value = String::from_utf8_lossy(&pair[1]).to_string();
        match upper(&pair[0]).as_str() {
            "ID" => match parse_u64(&pair[1]) {
                Some(n) => id = Some(n),
                None => return err("ERR client-id should be greater than 0"),
            },
            "ADDR" => addr = Some(value),
            "LADDR" => laddr = Some(value),
            // Every client is the default user.
            "USER" => user_ok = value == "default",
            "SKIPME" => match value.to_ascii_lowercase().as_str() {
                "yes" => skipme = true,
                "no" => skipme = false,
                _ => return err("ERR syntax error"),
            },
            _ => return err("ERR syntax error"),
        }
    }
    let n = ctx.registry.kill(
        |c| {
            user_ok
                && id.is_none_or(|id| c.id == id)
                && addr.as_ref().is_none_or(|a| c.addr.to_string() == *a)
                && laddr
                    .as_ref()
                    .is_none_or(|a| c.laddr.is_some_and(|l| l.to_string() == *a))
        },
        skipme.then_some(session.id),
    );
    Outcome::Reply(integer(n as u64))
}

/// `CONFIG GET pattern [pattern ...]`: the settings Redis tools ask about.
fn config(a: &[Bytes], ctx: &Context) -> Outcome {
    let Some(sub) = a.first() else {
        return wrong_arity("config");
    };
    if upper(sub).as_str() != "GET" {
        return err(format!(
            "ERR CONFIG {} is not supported: fencelog is configured on its command line",
            quoted(sub)
        ));
    }
    if a.len() < 2 {
        return wrong_arity("config|get");
    }
    // Bounded before matching: a pattern comes from anyone who can connect.
    if a[1..].iter().any(|p| p.len() > glob::MAX_PATTERN_BYTES) {
        return err(format!(
            "ERR CONFIG GET pattern longer than {} bytes",
            glob::MAX_PATTERN_BYTES
        ));
    }
    let c = &ctx.config;
    let mut settings: Vec<(&str, String)> = vec![
        ("appendonly", "yes".into()),
        ("appendfsync", "always".into()),
        ("save", String::new()),
        ("databases", "1".into()),
        ("maxclients", c.max_connections.to_string()),
        ("port", c.addr.port().to_string()),
        ("bind", c.addr.ip().to_string()),
        ("dir", c.dir.display().to_string()),
        ("timeout", "0".into()),
        ("maxmemory", "0".into()),
        ("proto-max-bulk-len", c.limits.max_bulk_bytes.to_string()),
        (
            "client-query-buffer-limit",
            c.max_query_buffer_bytes.to_string(),
        ),
        // Redis' format: class, hard limit, soft limit, soft seconds. Only
        // the hard limit applies here, to every client.
        (
            "client-output-buffer-limit",
            format!("normal {} 0 0", c.client_output_buffer_limit_bytes),
        ),
        ("maxmemory-clients", c.maxmemory_clients_bytes.to_string()),
        (
            "requirepass",
            // Never the password itself: it is not needed to operate.
            if c.requirepass.is_some() { "(set)" } else { "" }.into(),
        ),
    ];
    // Every flag of `fencelog serve`, under its own name, with the value
    // in force (one Redis also has is answered once, above).
    for (name, value) in &c.flags {
        if !settings.iter().any(|(n, _)| n == name) {
            settings.push((name.as_str(), value.clone()));
        }
    }
    let mut pairs = Vec::new();
    for (name, value) in &settings {
        if a[1..]
            .iter()
            .any(|p| glob::matches(p, name.as_bytes(), true))
        {
            pairs.push((Reply::text(*name), Reply::text(value.clone())));
        }
    }
    Outcome::Reply(Reply::Map(pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_in_any_case_and_odd_ones_match_nothing() {
        assert_eq!(upper(b"log.Append").as_str(), "LOG.APPEND");
        assert_eq!(upper(b"LEASE.ACQUIRE").as_str(), "LEASE.ACQUIRE");
        assert_eq!(upper(b"").as_str(), "");
        assert_eq!(upper(&[b'x'; Upper::MAX]).as_str().len(), Upper::MAX);
        assert_eq!(upper(&[b'x'; Upper::MAX + 1]).as_str(), "");
        assert_eq!(upper("pïng".as_bytes()).as_str(), "");
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_u64(b"42"), Some(42));
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }

    #[test]
    fn error_codes_lead_with_the_clients_number() {
        let r = error_reply(&Error::Stale {
            presented: 41,
            highest: 42,
        });
        assert_eq!(
            r,
            Reply::Error("STALE token 41 is below the highest accepted token 42".into())
        );
        let r = error_reply(&Error::OffsetMismatch {
            expected: 5,
            next: 7,
        });
        assert_eq!(
            r,
            Reply::Error("MISMATCH expected offset 5 but the next offset is 7".into())
        );
        let r = error_reply(&Error::Trimmed {
            requested: 3,
            start: 10,
        });
        assert_eq!(
            r,
            Reply::Error("TRIMMED offset 3 is below the start offset 10".into())
        );
        let r = error_reply(&Error::Held { remaining_ms: 1200 });
        assert_eq!(
            r,
            Reply::Error("HELD lease is held by another owner for 1200 ms".into())
        );
    }
}
