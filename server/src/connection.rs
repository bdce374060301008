//! One client connection: read requests, run them in order, answer in
//! order. Writes are decided as they arrive and answered once durable, so a
//! pipelined burst of appends shares one group commit.
//!
//! Every byte a connection holds is bounded and counted:
//!
//! - requests: unparsed input, the arguments of a request not yet complete
//!   (`RequestParser::held_bytes`), a parsed request waiting for the answers
//!   before it, and a transaction's queued commands, together at most
//!   `--max-query-buffer` (1 MiB before AUTH, as in Redis);
//! - pending answers: at most `--max-pipeline` writes decided and not yet
//!   durable, each holding its request;
//! - replies not yet written: the connection stops starting requests once
//!   [`OUTPUT_HIGH_WATER_BYTES`] are unwritten (a client that does not read
//!   stalls its own pipeline, nobody else's), and is disconnected if they
//!   pass `--client-output-buffer-limit`;
//! - the sum over all connections is reported to the budget of
//!   `--maxmemory-clients` (`budget.rs`), which may tell this one to go.
//!
//! Fairness: a connection runs at most [`REQUESTS_PER_TURN`] requests or
//! [`OUTPUT_PER_TURN_BYTES`] of replies, writes what the socket takes, and
//! yields to the other tasks before going on.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use fencelog::Log;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::budget::{ClientShare, Eviction};
use crate::cmd::{self, Pipelining};
use crate::context::{Context, failure_reply, note_error};
use crate::outcome::{
    Blocking, BoxFuture, Later, Outcome, ReadProgress, ReplyFuture, error_reply, number,
};
use crate::protocol::{
    Output, ProtocolError, Reply, Request, RequestParser, looks_like_http_named,
};
use crate::read_round::{ReadRounds, Turn};
use crate::session::{Multi, Session};
use crate::shutdown::Shutdown;
use crate::store::Failure;
use crate::wake_gate::WakeGated;

/// Requests one connection runs before it yields to the others.
pub const REQUESTS_PER_TURN: usize = 64;
/// Reply bytes one connection produces before it yields to the others.
pub const OUTPUT_PER_TURN_BYTES: usize = 1 << 20;
/// Unwritten reply bytes at which a connection stops starting requests
/// until its client reads.
pub const OUTPUT_HIGH_WATER_BYTES: usize = 64 << 10;
/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 16 << 10;
/// Empty buffers larger than this are given back.
const KEEP_BUFFER_BYTES: usize = 64 << 10;
/// Before AUTH, Redis lets a query buffer hold at most 1 MiB; so do we.
const UNAUTHENTICATED_QUERY_BYTES: usize = 1 << 20;

/// An answer to come, in request order, with the bytes its request holds
/// until then (a write's payloads stay with its answer until durable).
struct Pending {
    answer: Answer,
    bytes: usize,
    /// A read answered after its round (see [`Pipelining::Read`]).
    read: bool,
}

/// An answer in the queue.
enum Answer {
    /// Given at once, behind answers still to come.
    Ready(Option<Reply>),
    /// A decided write's, once durable, with the stream it writes (for
    /// the log event of a rejection).
    Later(Later, Bytes),
    /// One answered later in order (a replicated write once applied, a
    /// read once its round is done).
    Pending(ReplyFuture),
    /// No answer: the round the reads behind it wait for, which answers
    /// the engine they read (see `read_round.rs`).
    Round(BoxFuture<'static, Option<Log>>),
    /// The answers of pipelined writes taken together, one per write, with
    /// the stream each names (for the log event of a rejection); `None`
    /// while the connection still takes writes into it (see
    /// [`Connection::close_together`]).
    Together(Option<TogetherAnswers>, Vec<Bytes>),
}

/// The answers of writes taken together (`Store::write_together`).
type TogetherAnswers = BoxFuture<'static, Vec<Result<u64, Failure>>>;

/// A queued answer once it has come: a reply, or a write's result.
enum Answered {
    Reply(Reply),
    Write(fencelog::Result<u64>, Bytes),
    /// A round of reads ended (nothing to answer).
    Round(Option<Log>),
    /// Writes taken together: each one's answer, and the stream it names.
    Together(Vec<Result<u64, Failure>>, Vec<Bytes>),
}

impl Answer {
    /// Polls the answer; `relayed`: an answer to come from another thread
    /// (a durable or a replicated write's) wakes this thread's [`relay`]
    /// rather than the task itself.
    fn poll(&mut self, cx: &mut std::task::Context<'_>, relayed: bool) -> Poll<Answered> {
        match self {
            Answer::Ready(reply) => match reply.take() {
                Some(reply) => Poll::Ready(Answered::Reply(reply)),
                None => Poll::Pending,
            },
            Answer::Later(later, stream) if relayed => relay::poll(cx, |cx| later.poll_result(cx))
                .map(|r| Answered::Write(r, stream.clone())),
            Answer::Later(later, stream) => later
                .poll_result(cx)
                .map(|r| Answered::Write(r, stream.clone())),
            // A replicated write's answer comes from the Raft thread: relayed
            // too, one wake-up of this thread per applied entry, not one per
            // connection (each an eventfd write).
            Answer::Pending(answer) if relayed => {
                relay::poll(cx, |cx| answer.as_mut().poll(cx)).map(Answered::Reply)
            }
            Answer::Pending(answer) => answer.as_mut().poll(cx).map(Answered::Reply),
            // Ended from whichever thread ran the round: relayed too.
            Answer::Round(round) if relayed => {
                relay::poll(cx, |cx| round.as_mut().poll(cx)).map(Answered::Round)
            }
            Answer::Round(round) => round.as_mut().poll(cx).map(Answered::Round),
            // From the Raft thread, as a replicated write's: relayed.
            Answer::Together(Some(answers), streams) if relayed => {
                relay::poll(cx, |cx| answers.as_mut().poll(cx))
                    .map(|a| Answered::Together(a, std::mem::take(streams)))
            }
            Answer::Together(Some(answers), streams) => answers
                .as_mut()
                .poll(cx)
                .map(|a| Answered::Together(a, std::mem::take(streams))),
            // Still taking writes: nothing to wait for yet.
            Answer::Together(None, _) => Poll::Pending,
        }
    }
}

/// A command that waits (`BLOCK`, `WAIT`) or reads in steps, and what it
/// answers if the server shuts down meanwhile (`None`: it finishes).
struct Blocked {
    run: Pin<Box<dyn Future<Output = Reply> + Send>>,
    on_shutdown: Option<Reply>,
    _counted: BlockedCount,
}

/// Counts a waiting command in `blocked_clients` while it lives.
struct BlockedCount(Arc<Context>);

impl BlockedCount {
    fn new(ctx: &Arc<Context>) -> BlockedCount {
        ctx.stats.blocked_clients.fetch_add(1, Ordering::Relaxed);
        BlockedCount(Arc::clone(ctx))
    }
}

impl Drop for BlockedCount {
    fn drop(&mut self) {
        self.0.stats.blocked_clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What runs next once the answers before it are out.
enum Held {
    /// A request that must see the writes before it answered.
    Request(Request, usize),
    /// The last reply (a protocol error); the connection closes after it.
    Close(Reply),
}

/// What a request that ran leaves for its answer.
struct Taken {
    /// The bytes its request holds until answered.
    bytes: usize,
    /// Whether it is a read answered after its round.
    read: bool,
    /// The stream a write names (for the log event of a rejection).
    stream_arg: Bytes,
}

/// What taking an outcome did.
enum Took {
    /// Encoded this many reply bytes (0: its answer is to come).
    Produced(usize),
    /// The connection stops running requests for now.
    Stop(Stop),
}

/// Why a connection stopped running requests for now.
enum Stop {
    /// It ran its share of this turn; others go first.
    TurnSpent,
    /// Its client has not read enough of the replies.
    Output,
    /// For input, an answer, or a waiting command.
    Wait,
}

/// Why a connection ended.
enum End {
    /// The client closed, or the connection finished closing.
    Closed,
    /// A socket error.
    Io(std::io::Error),
    /// A request that looks like HTTP: a cross-protocol attack.
    Http,
    /// `--max-query-buffer` (or the limit before AUTH) passed.
    QueryLimit { bytes: usize, limit: usize },
    /// `--client-output-buffer-limit` passed.
    OutputLimit {
        bytes: usize,
        limit: usize,
        transaction_applied: bool,
    },
    /// Told to go by the budget over all clients.
    Evicted(Eviction),
    /// Closed by `CLIENT KILL`.
    Killed,
}

/// Serves one client until it leaves, breaks the protocol or a limit, or
/// the server shuts down (its last answers go out first).
pub async fn serve(
    ctx: Arc<Context>,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let share = Arc::new(ctx.clients.register(id));
    let registration = ctx.registry.register(id, peer, stream.local_addr().ok());
    let authenticated = ctx.config.requirepass.is_none();
    let mut parser = RequestParser::new();
    parser.set_unauthenticated(!authenticated);
    let mut conn = Connection {
        session: Session {
            registration: Some(registration),
            ..Session::new(id, peer, authenticated)
        },
        ctx,
        stream,
        share,
        parser,
        input: BytesMut::new(),
        output: Output::new(),
        pending: VecDeque::new(),
        pending_bytes: 0,
        pending_reads: 0,
        together: None,
        together_extra: 0,
        together_last: 0,
        reads: ReadRounds::default(),
        held: None,
        blocked: None,
        closing: false,
        shutdown,
        shutting_down: false,
        interrupt: None,
        listed: None,
    };
    let end = conn.run().await;
    conn.ended(end)
}

struct Connection {
    ctx: Arc<Context>,
    stream: TcpStream,
    session: Session,
    share: Arc<ClientShare>,
    parser: RequestParser,
    input: BytesMut,
    /// Encoded replies not yet written.
    output: Output,
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// How many of `pending` are cluster reads: all of them or none.
    pending_reads: usize,
    /// Pipelined writes taken together and not yet proposed: their answer
    /// is the last of `pending` (see [`Connection::close_together`]).
    together: Option<Vec<fencelog::TxOp>>,
    /// Writes in `pending`'s answers beyond one per answer (those taken
    /// together): `--max-pipeline` counts requests, not answers.
    together_extra: usize,
    /// How many writes were taken together last time: the next group's
    /// list is made that large at once, not grown a write at a time (a
    /// leader's connection threads spent a twentieth of their
    /// instructions reallocating these lists at pipeline 16).
    together_last: usize,
    /// The round pipelined reads wait for (in a group).
    reads: ReadRounds,
    held: Option<Held>,
    blocked: Option<Blocked>,
    /// No more requests are read or run; the connection closes once its
    /// answers are out.
    closing: bool,
    shutdown: Shutdown,
    shutting_down: bool,
    /// Eviction, kill and shutdown, waited for together (built at the
    /// first wait, again after shutdown begins).
    interrupt: Option<Interrupt>,
    /// What `CLIENT LIST` was last told: name, protocol, commands queued.
    listed: Option<(Option<Bytes>, u8, Option<usize>)>,
}

impl Connection {
    async fn run(&mut self) -> End {
        loop {
            if let Some(why) = self.share.evicted() {
                return End::Evicted(why);
            }
            if self.killed() {
                return End::Killed;
            }
            let stop = match self.process().await {
                Ok(stop) => stop,
                Err(end) => return end,
            };
            if let Err(end) = self.write_now() {
                return end;
            }
            if let Err(end) = self.check_limits() {
                return end;
            }
            self.share.set(self.memory_bytes());
            if self.finished() {
                let _ = self.stream.shutdown().await;
                return End::Closed;
            }
            match stop {
                Stop::TurnSpent => {
                    // Let the other connections run before going on.
                    tokio::task::yield_now().await;
                    continue;
                }
                // The socket took the replies: requests already received can
                // run (nothing else would wake this connection for them).
                Stop::Output if self.unwritten() < OUTPUT_HIGH_WATER_BYTES => continue,
                _ => {}
            }
            if let Err(end) = self.wait().await {
                return end;
            }
        }
    }

    /// Runs requests until one must wait (for the answers before it, for the
    /// client to read, for more input) or the turn is spent; the writes
    /// taken together meanwhile are proposed before it returns.
    async fn process(&mut self) -> Result<Stop, End> {
        let stop = self.process_requests().await;
        self.close_together();
        stop
    }

    async fn process_requests(&mut self) -> Result<Stop, End> {
        let mut requests = 0;
        let mut produced = 0;
        loop {
            if self.unwritten() >= OUTPUT_HIGH_WATER_BYTES {
                return Ok(Stop::Output);
            }
            if self.blocked.is_some() || self.answers_to_come() >= self.ctx.config.max_pipeline {
                return Ok(Stop::Wait);
            }
            if requests >= REQUESTS_PER_TURN || produced >= OUTPUT_PER_TURN_BYTES {
                return Ok(Stop::TurnSpent);
            }
            let Some(next) = self.next_request() else {
                return Ok(Stop::Wait);
            };
            // Anything but a pipelined write sees the writes before it
            // answered: a read after an append in one pipeline sees it.
            // Reads that wait for a round pipeline behind reads only,
            // writes behind writes only (a read never sees a write sent
            // after it).
            // The name, upper-cased once for the three that look at it.
            let (pipelining, name) = match &next {
                Held::Close(_) => (Pipelining::InOrder, None),
                Held::Request(request, _) => match request.get(0) {
                    Some(first) => {
                        let name = cmd::parse::upper(first);
                        let rounds = self.ctx.store.orders_rounds();
                        let pipelining =
                            cmd::pipelining_named(&self.session, request, &name, rounds);
                        (pipelining, Some(name))
                    }
                    None => (Pipelining::InOrder, None),
                },
            };
            let deferrable = match pipelining {
                Pipelining::InOrder => false,
                Pipelining::Write => self.pending_reads == 0,
                Pipelining::Read => self.pending_reads == self.pending.len(),
            };
            if !deferrable && !self.pending.is_empty() {
                self.held = Some(next);
                return Ok(Stop::Wait);
            }
            // A pipelined read (in a group) waits for its connection's
            // round, then runs as on a single node.
            if pipelining == Pipelining::Read {
                match self.reads.turn(&*self.ctx.store) {
                    Turn::Join(round) => {
                        self.push_pending(Answer::Round(round), 0, true);
                        self.held = Some(next);
                        return Ok(Stop::Wait);
                    }
                    Turn::Wait => {
                        self.held = Some(next);
                        return Ok(Stop::Wait);
                    }
                    Turn::Run(log) => {
                        // A round's reads run once everything before them
                        // was answered: their answers go out at once.
                        debug_assert!(log.is_none() || self.pending.is_empty());
                        self.session.round = log;
                    }
                }
            }
            let (request, bytes) = match next {
                Held::Close(reply) => {
                    self.encode(&reply);
                    return Ok(Stop::Wait);
                }
                Held::Request(request, bytes) => (request, bytes),
            };
            // A pipelined stream write in a group goes with the writes next
            // to it. Anything else is proposed (or runs) after them: they
            // go to the leader's queue first, keeping the connection's order.
            let together = pipelining == Pipelining::Write
                && self.ctx.store.batches_writes()
                && name.as_ref().is_some_and(cmd::takes_together);
            if !together {
                self.close_together();
            }
            self.session.together = together;
            let outcome = match &name {
                Some(name) => {
                    if looks_like_http_named(name.as_str(), &request) {
                        return Err(End::Http);
                    }
                    requests += 1;
                    cmd::execute_named(&self.ctx, &mut self.session, &request, name).await
                }
                None => {
                    requests += 1;
                    cmd::execute(&self.ctx, &mut self.session, &request).await
                }
            };
            // Taken by the read it was for; never left for another.
            self.session.round = None;
            self.session.together = false;
            // What a durable answer names (only a write's is awaited): cut
            // out of the request for those alone, not for every refusal.
            let stream_arg = match outcome {
                Outcome::Later(_) => request.bytes(1).unwrap_or_default(),
                _ => Bytes::new(),
            };
            drop(request);
            self.listed_changes();
            self.parser.set_unauthenticated(!self.session.authenticated);
            let taken = Taken {
                bytes,
                read: pipelining == Pipelining::Read,
                stream_arg,
            };
            match self.take(outcome, taken)? {
                Took::Produced(n) => produced += n,
                Took::Stop(stop) => return Ok(stop),
            }
            // A transaction's queue counts as input not yet run.
            self.check_query_limit()?;
        }
    }

    /// The request to run next: one held back, or the next parsed (a
    /// protocol error is the last reply); `None`: none yet, or closing.
    fn next_request(&mut self) -> Option<Held> {
        if let Some(held) = self.held.take() {
            return Some(held);
        }
        if self.closing {
            return None;
        }
        match self.parser.next(&mut self.input, &self.ctx.config.limits) {
            Ok(Some(request)) => {
                self.reads.parsed(self.input.len());
                let bytes = request.memory_bytes();
                Some(Held::Request(request, bytes))
            }
            Ok(None) => None,
            Err(ProtocolError(why)) => {
                tracing::info!(
                    event = "protocol_error",
                    client_id = self.session.id,
                    client_addr = %self.session.peer,
                    client_name = %self.client_name(),
                    error = %why,
                    "protocol error; closing the connection"
                );
                self.close_input();
                Some(Held::Close(Reply::Error(format!(
                    "ERR Protocol error: {why}"
                ))))
            }
        }
    }

    /// `CLIENT LIST` learns what changed (most requests change nothing,
    /// and telling it takes its locks).
    fn listed_changes(&mut self) {
        let Some(r) = &self.session.registration else {
            return;
        };
        let queued = self.session.multi.as_ref().map(Multi::len);
        let same = self.listed.as_ref().is_some_and(|(name, proto, q)| {
            *name == self.session.name && *proto == self.session.proto && *q == queued
        });
        if !same {
            let name = self.session.name.clone();
            r.update(name.as_ref(), self.session.proto, queued);
            self.listed = Some((name, self.session.proto, queued));
        }
    }

    /// Takes a request's outcome: answers it, queues its answer, or runs
    /// it as a waiting command.
    fn take(&mut self, outcome: Outcome, taken: Taken) -> Result<Took, End> {
        // Writes taken together answer before anything taken after them.
        if !matches!(outcome, Outcome::Together(_)) {
            self.close_together();
        }
        match outcome {
            Outcome::Together(op) => self.take_together(op, taken.bytes),
            // A write refused at once (a stale token on the fast path)
            // still answers after the writes before it.
            Outcome::Reply(reply) if !self.pending.is_empty() => {
                self.push_pending(Answer::Ready(Some(reply)), 0, taken.read);
            }
            Outcome::Reply(reply) => return Ok(Took::Produced(self.encode(&reply))),
            Outcome::Later(later) => {
                let answer = Answer::Later(later, taken.stream_arg);
                self.push_pending(answer, taken.bytes, false);
            }
            Outcome::Pending(answer) => {
                self.push_pending(Answer::Pending(answer), taken.bytes, taken.read);
            }
            Outcome::Close(reply) => {
                self.encode(&reply);
                self.close_input();
                return Ok(Took::Stop(Stop::Wait));
            }
            Outcome::Blocking(command) => return Ok(self.run_blocking(command)),
            Outcome::OverOutputLimit {
                reply_bytes,
                limit_bytes,
                transaction_applied,
            } => {
                return Err(End::OutputLimit {
                    bytes: reply_bytes,
                    limit: limit_bytes,
                    transaction_applied,
                });
            }
        }
        Ok(Took::Produced(0))
    }

    /// Runs a command that may wait: answered in line if it is done at
    /// once, else it waits while the connection watches its client.
    fn run_blocking(&mut self, command: Blocking) -> Took {
        let on_shutdown = command.shutdown_reply();
        // A large read tells the budget what it gathers as it goes, not
        // only once it is done.
        let share = Arc::clone(&self.share);
        let progress: ReadProgress = Arc::new(move |bytes| share.set_reading(bytes));
        let mut run = command.run(Some(progress));
        // Most reads are done at once: answer them in line, so a pipeline
        // of reads is not a wait (and a write) each.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(reply) = run.as_mut().poll(&mut cx) {
            return Took::Produced(self.encode(&reply));
        }
        debug_assert!(self.blocked.is_none(), "one waiting command at a time");
        self.blocked = Some(Blocked {
            run,
            on_shutdown,
            _counted: BlockedCount::new(&self.ctx),
        });
        Took::Stop(Stop::Wait)
    }

    /// Waits for something to do: an answer, the socket, shutdown, eviction.
    async fn wait(&mut self) -> Result<(), End> {
        self.reads.idle();
        // Input is read while requests can run, and while a command waits
        // (so that a client that leaves gives up the wait).
        let want_read = !self.closing
            && (self.blocked.is_some()
                || (self.held.is_none()
                    && self.unwritten() < OUTPUT_HIGH_WATER_BYTES
                    && self.answers_to_come() < self.ctx.config.max_pipeline));
        let want_write = self.unwritten() > 0;
        if self.interrupt.is_none() {
            self.interrupt = Some(self.interruptions());
        }
        let event = tokio::select! {
            biased;
            event = interrupted(&mut self.interrupt) => event,
            reply = next_answer(&mut self.pending), if !self.pending.is_empty() => Event::Answer(reply),
            reply = wait_blocked(&mut self.blocked), if self.blocked.is_some() => Event::Unblocked(reply),
            // The socket's own waker slots rather than `writable()` and
            // `readable()`, whose futures join and leave a list of waiters
            // under a lock at every wait (this task is the socket's only
            // waiter; a wake-up left behind costs a poll that finds nothing).
            ready = poll_fn(|cx| self.stream.poll_write_ready(cx)), if want_write => {
                Event::Writable(ready)
            }
            ready = poll_fn(|cx| self.stream.poll_read_ready(cx)), if want_read => {
                Event::Readable(ready)
            }
        };
        match event {
            Event::Evicted(why) => Err(End::Evicted(why)),
            Event::Killed => Err(End::Killed),
            Event::Shutdown => {
                // The next interruptions to wait for are eviction and kill.
                self.interrupt = None;
                self.begin_shutdown();
                Ok(())
            }
            Event::Answer(reply) => {
                self.answered(reply);
                // Answers behind it are often ready too (one group commit).
                while let Some(reply) = ready_answer(&mut self.pending) {
                    self.answered(reply);
                }
                Ok(())
            }
            Event::Unblocked(reply) => {
                self.blocked = None;
                self.encode(&reply);
                Ok(())
            }
            Event::Writable(ready) => {
                ready.map_err(End::Io)?;
                self.write_now()
            }
            Event::Readable(ready) => {
                ready.map_err(End::Io)?;
                self.read_now()
            }
        }
    }

    /// Answers queued and to come, counting each write taken together.
    fn answers_to_come(&self) -> usize {
        self.pending.len() + self.together_extra
    }

    /// Takes a pipelined write with the ones taken before it in this turn
    /// (its answer queued as theirs, the first's place), or starts them.
    fn take_together(&mut self, op: fencelog::TxOp, bytes: usize) {
        match &mut self.together {
            Some(ops) => {
                ops.push(op);
                self.together_extra += 1;
            }
            None => {
                self.push_pending(Answer::Together(None, Vec::new()), 0, false);
                // A count of writes this connection really sent, so within
                // `--max-pipeline`: no bound of its own.
                let mut ops = Vec::with_capacity(self.together_last.max(1));
                ops.push(op);
                self.together = Some(ops);
            }
        }
        // The request's bytes count until its answer, as a write's do.
        if let Some(last) = self.pending.back_mut() {
            last.bytes += bytes;
            self.pending_bytes += bytes;
        }
    }

    /// Proposes the writes taken together, if any (`Store::write_together`):
    /// their answer, the last queued, is to come from now.
    fn close_together(&mut self) {
        let Some(ops) = self.together.take() else {
            return;
        };
        self.together_last = ops.len();
        let streams: Vec<Bytes> = ops.iter().map(|op| op.stream().clone()).collect();
        let answers = self.ctx.store.write_together(ops);
        if let Some(last) = self.pending.back_mut() {
            debug_assert!(matches!(last.answer, Answer::Together(None, _)));
            last.answer = Answer::Together(Some(answers), streams);
        }
    }

    /// Queues an answer to come, behind those before it.
    fn push_pending(&mut self, answer: Answer, bytes: usize, read: bool) {
        self.pending.push_back(Pending {
            answer,
            bytes,
            read,
        });
        self.pending_bytes += bytes;
        self.pending_reads += usize::from(read);
        // Reads and writes never wait in the queue together, and the queue
        // never passes its bound (`--max-pipeline`: a request runs only
        // below it).
        debug_assert!(self.pending_reads == 0 || self.pending_reads == self.pending.len());
        debug_assert!(self.answers_to_come() <= self.ctx.config.max_pipeline);
    }

    fn answered(&mut self, answer: Answered) {
        if let Some(done) = self.pending.pop_front() {
            self.pending_bytes -= done.bytes;
            self.pending_reads -= usize::from(done.read);
        }
        let reply = match answer {
            Answered::Round(log) => return self.reads.ended(log),
            Answered::Together(answers, streams) => {
                self.together_extra -= streams.len().saturating_sub(1);
                let mut tag = None;
                let mut answers = answers.into_iter();
                for stream in &streams {
                    // One answer per write (the store's promise); were one
                    // missing, its client still gets a reply in its place.
                    let answer = answers.next().unwrap_or_else(|| {
                        Err(Failure::Elsewhere(Reply::Error(
                            "ERR internal: no answer for a write taken with others".into(),
                        )))
                    });
                    let reply = match answer {
                        Ok(n) => number(n),
                        Err(f) => {
                            let tag = tag.get_or_insert_with(|| self.session.tag());
                            failure_reply(&self.ctx, tag, stream, f)
                        }
                    };
                    self.encode(&reply);
                }
                return;
            }
            Answered::Reply(reply) => reply,
            Answered::Write(Ok(n), _) => number(n),
            Answered::Write(Err(e), stream) => {
                note_error(&self.ctx, &self.session.tag(), &stream, &e);
                error_reply(&e)
            }
        };
        self.encode(&reply);
    }

    /// The interruptions to wait for: eviction, `CLIENT KILL` and, until it
    /// has begun, shutdown; in that order of precedence.
    fn interruptions(&self) -> Interrupt {
        let share = Arc::clone(&self.share);
        let killed = self.session.registration.as_ref().map(|r| r.killed());
        let mut shutdown = (!self.shutting_down).then(|| self.shutdown.clone());
        WakeGated::new(Box::pin(async move {
            let killed = async {
                match killed {
                    Some(k) => k.await,
                    None => std::future::pending().await,
                }
            };
            let shutdown = async {
                match shutdown.as_mut() {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                why = share.wait_evicted() => Event::Evicted(why),
                () = killed => Event::Killed,
                () = shutdown => Event::Shutdown,
            }
        }))
    }

    fn killed(&self) -> bool {
        self.session
            .registration
            .as_ref()
            .is_some_and(crate::clients::Registered::is_killed)
    }

    fn client_name(&self) -> String {
        self.session
            .name
            .as_deref()
            .map(crate::logging::name_field)
            .unwrap_or_default()
    }

    /// Shutdown: nothing more is read or run; a waiting command is answered
    /// at once; the answers already decided go out, then the connection
    /// closes (the server cuts it off after its grace period).
    fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        if let Some(Held::Request(..)) = self.held {
            self.held = None;
        }
        self.close_input();
        if let Some(reply) = self.blocked.as_ref().and_then(|b| b.on_shutdown.clone()) {
            self.blocked = None;
            self.encode(&reply);
        }
    }

    /// Stops reading, and gives back what unread input holds.
    fn close_input(&mut self) {
        self.closing = true;
        self.input = BytesMut::new();
        self.parser = RequestParser::new();
    }

    fn finished(&self) -> bool {
        self.closing
            && self.held.is_none()
            && self.pending.is_empty()
            && self.blocked.is_none()
            && self.unwritten() == 0
    }

    fn unwritten(&self) -> usize {
        self.output.len()
    }

    /// Appends a reply to the output; answers its length.
    fn encode(&mut self, reply: &Reply) -> usize {
        let len = reply.encoded_len(self.session.proto);
        if len < KEEP_BUFFER_BYTES {
            // Room for it at once rather than doublings (large replies are
            // mostly payloads, which are not copied).
            self.output.reserve(len);
        }
        reply.encode_output(self.session.proto, &mut self.output);
        len
    }

    /// Writes what the socket takes now.
    fn write_now(&mut self) -> Result<(), End> {
        while !self.output.is_empty() {
            let written = {
                let mut slices = [std::io::IoSlice::new(&[]); 64];
                let n = self.output.fill_slices(&mut slices);
                self.stream.try_write_vectored(&slices[..n])
            };
            match written {
                Ok(0) => return Err(End::Closed),
                Ok(n) => self.output.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(End::Io(e)),
            }
        }
        self.output.shrink(KEEP_BUFFER_BYTES);
        Ok(())
    }

    /// Reads what the socket has now.
    fn read_now(&mut self) -> Result<(), End> {
        if self.input.capacity() - self.input.len() < READ_CHUNK_BYTES / 4 {
            self.input.reserve(READ_CHUNK_BYTES);
        }
        let room = self.input.capacity() - self.input.len();
        let (stream, input) = (&self.stream, &mut self.input);
        let mut read = None;
        // A read that leaves room in the buffer drained the socket: its
        // readiness is cleared with it (as a `WouldBlock` does), so the
        // connection next waits in epoll instead of asking the socket again
        // only to hear `WouldBlock` (one system call of three per request
        // at pipeline 1). Race-free: tokio clears the readiness only if no
        // event came since the read began; data that arrives later is a new
        // event.
        let outcome = stream.try_io(tokio::io::Interest::READABLE, || {
            let n = stream.try_read_buf(input)?;
            read = Some(n);
            if n > 0 && n < room {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        let outcome = match (outcome, read) {
            (Err(e), Some(n)) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(n),
            (outcome, _) => outcome,
        };
        match outcome {
            // The client left: what it sent unanswered is dropped with it
            // (decided writes still become durable).
            Ok(0) => Err(End::Closed),
            Ok(n) => {
                self.reads.received(n);
                self.ctx.stats.bytes_in.add(n as u64);
                self.check_query_limit()
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(End::Io(e)),
        }
    }

    /// Bytes of requests held before they run.
    fn query_bytes(&self) -> usize {
        self.input.len() + self.held_bytes()
    }

    /// Bytes of requests out of the input buffer but not run yet: the
    /// arguments of one still arriving, one waiting for earlier writes, a
    /// transaction's queue. The query limit and the memory budget both
    /// count them, so they are counted once, here.
    fn held_bytes(&self) -> usize {
        let held = match &self.held {
            Some(Held::Request(_, bytes)) => *bytes,
            _ => 0,
        };
        self.parser.held_bytes() + held + self.session.multi.as_ref().map_or(0, Multi::bytes)
    }

    fn query_limit(&self) -> usize {
        let limit = self.ctx.config.max_query_buffer_bytes;
        if self.session.authenticated {
            limit
        } else {
            limit.min(UNAUTHENTICATED_QUERY_BYTES)
        }
    }

    fn check_query_limit(&self) -> Result<(), End> {
        let (bytes, limit) = (self.query_bytes(), self.query_limit());
        if bytes > limit {
            return Err(End::QueryLimit { bytes, limit });
        }
        Ok(())
    }

    fn check_limits(&self) -> Result<(), End> {
        self.check_query_limit()?;
        let (bytes, limit) = (
            self.unwritten(),
            self.ctx.config.client_output_buffer_limit_bytes,
        );
        if bytes > limit {
            return Err(End::OutputLimit {
                bytes,
                limit,
                transaction_applied: false,
            });
        }
        Ok(())
    }

    /// Everything this connection holds, for the budget over all clients.
    fn memory_bytes(&self) -> usize {
        self.input.capacity() + self.held_bytes() + self.pending_bytes + self.output.memory_bytes()
    }

    /// Logs why the connection ended, when that is news.
    fn ended(mut self, end: End) -> std::io::Result<()> {
        let s = &self.session;
        let name = self.client_name();
        match end {
            End::Closed => {}
            End::Io(e) => return Err(e),
            End::Killed => {
                tracing::info!(
                    event = "client_killed",
                    client_id = s.id,
                    client_addr = %s.peer,
                    client_name = %name,
                    "client closed by CLIENT KILL"
                );
            }
            End::Http => {
                self.ctx
                    .stats
                    .http_requests_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    event = "http_request",
                    client_id = s.id,
                    client_addr = %s.peer,
                    "possible cross-protocol attack: a request that looks like HTTP \
                     (POST, GET /, Host:) on the Redis port; connection closed"
                );
            }
            End::QueryLimit { bytes, limit } => self.over_query_limit(&name, bytes, limit),
            End::OutputLimit {
                bytes,
                limit,
                transaction_applied,
            } => self.over_output_limit(&name, bytes, limit, transaction_applied),
            End::Evicted(why) => {
                tracing::warn!(
                    event = "client_dropped",
                    reason = "maxmemory_clients",
                    client_id = s.id,
                    client_addr = %s.peer,
                    client_name = %name,
                    client_bytes = why.client_bytes,
                    total_bytes = why.total_bytes,
                    budget_bytes = why.budget_bytes,
                    "client closed: all clients together held more than --maxmemory-clients, \
                     and this one held the most"
                );
            }
        }
        Ok(())
    }

    /// Drops a client past `--max-query-buffer`, telling it why.
    fn over_query_limit(&mut self, name: &str, bytes: usize, limit: usize) {
        let s = &self.session;
        self.ctx
            .stats
            .query_buffer_limit_disconnections
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            event = "client_dropped",
            reason = "query_buffer_limit",
            client_id = s.id,
            client_addr = %s.peer,
            client_name = %name,
            query_bytes = bytes,
            limit_bytes = limit,
            authenticated = s.authenticated,
            "client closed: its query buffer passed the limit (--max-query-buffer; \
             1 MiB before AUTH)"
        );
        Reply::Error(format!(
            "ERR Protocol error: the query buffer holds {bytes} bytes, over the limit \
             of {limit}"
        ))
        .encode_output(s.proto, &mut self.output);
        let _ = self.stream.try_write_vectored(&self.output.slices(64));
    }

    /// Drops a client whose unread replies passed
    /// `--client-output-buffer-limit`.
    fn over_output_limit(
        &mut self,
        name: &str,
        bytes: usize,
        limit: usize,
        transaction_applied: bool,
    ) {
        // The replies before the one over the limit, if the socket takes
        // them now; nothing waits for a client that does not read.
        let _ = self.stream.try_write_vectored(&self.output.slices(64));
        self.ctx
            .stats
            .output_buffer_limit_disconnections
            .fetch_add(1, Ordering::Relaxed);
        let s = &self.session;
        tracing::warn!(
            event = "client_dropped",
            reason = "output_buffer_limit",
            client_id = s.id,
            client_addr = %s.peer,
            client_name = %name,
            output_bytes = bytes,
            limit_bytes = limit,
            transaction_applied,
            "client closed: replies not yet read passed the limit \
             (--client-output-buffer-limit)"
        );
    }
}

/// What woke a waiting connection.
enum Event {
    Evicted(Eviction),
    Killed,
    Shutdown,
    Answer(Answered),
    Unblocked(Reply),
    Writable(std::io::Result<()>),
    Readable(std::io::Result<()>),
}

/// What may end or change a connection from outside, as one future kept
/// across its waits: each wait used to register with three `Notify`s
/// (eviction, `CLIENT KILL`, shutdown, the last shared by every
/// connection) and unregister after, a tenth of a stale rejection's user
/// CPU at pipeline 1. Gated: polled again only once one of them wakes it
/// (a `Notified` takes a lock on every poll).
type Interrupt = WakeGated<Event>;

/// The first interruption to come (never, without any).
async fn interrupted(interrupt: &mut Option<Interrupt>) -> Event {
    match interrupt {
        Some(i) => Pin::new(i).await,
        None => std::future::pending().await,
    }
}

/// The oldest pending answer, once it comes (it stays in the queue).
async fn next_answer(pending: &mut VecDeque<Pending>) -> Answered {
    std::future::poll_fn(|cx| match pending.front_mut() {
        Some(p) => p.answer.poll(cx, true),
        None => Poll::Pending,
    })
    .await
}

/// The oldest pending answer if it is already there.
fn ready_answer(pending: &mut VecDeque<Pending>) -> Option<Answered> {
    let front = pending.front_mut()?;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match front.answer.poll(&mut cx, false) {
        Poll::Ready(reply) => Some(reply),
        Poll::Pending => None,
    }
}

async fn wait_blocked(blocked: &mut Option<Blocked>) -> Reply {
    match blocked {
        Some(b) => b.run.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Durable answers, relayed: one wake-up per thread and group commit.
///
/// The sync thread completes a group commit by waking every task that
/// waits on it. A task of a single-threaded runtime woken from another
/// thread costs a write to the runtime's eventfd each (tokio does not
/// coalesce them), so a commit that answers twenty connections cost twenty
/// system calls on the sync thread and as many wake-ups of the runtime.
/// Instead, each thread that serves connections runs one relay task: a
/// connection waits on its oldest answer with the relay's waker and leaves
/// its own with the relay; the sync thread wakes the relay (once: a task
/// already woken is not woken again), and the relay wakes the connections
/// of its thread, which costs no system call. A connection woken for a
/// later commit than its own polls, finds nothing, and waits again.
///
/// Where no relay runs (a runtime the server did not build, before the
/// relay's first turn), answers wake their tasks directly.
pub mod relay {
    use std::cell::RefCell;
    use std::task::{Context, Poll, Waker};

    #[derive(Default)]
    struct Relay {
        /// The relay task's waker, once it has run.
        own: Option<Waker>,
        /// Connections waiting for a durable answer.
        waiting: Vec<Waker>,
    }

    thread_local! {
        static RELAY: RefCell<Relay> = RefCell::new(Relay::default());
    }

    /// The relay of this thread: spawn it once on each single-threaded
    /// runtime that serves connections; it runs until the runtime ends.
    pub async fn run() {
        std::future::poll_fn(|cx| {
            let mut waiting = RELAY.with(|r| {
                let mut r = r.borrow_mut();
                if !r.own.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    r.own = Some(cx.waker().clone());
                }
                std::mem::take(&mut r.waiting)
            });
            for waker in waiting.drain(..) {
                waker.wake();
            }
            // The list goes back with its room: grown from empty for every
            // group commit, it was reallocated about five times each.
            RELAY.with(|r| {
                let mut r = r.borrow_mut();
                if r.waiting.is_empty() {
                    r.waiting = waiting;
                }
            });
            Poll::<()>::Pending
        })
        .await
    }

    /// Polls `answer` so that it wakes this thread's relay, which wakes the
    /// task of `cx`; without a relay, polls it with `cx`.
    pub fn poll<T>(
        cx: &mut Context<'_>,
        answer: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let Some(own) = RELAY.with(|r| r.borrow().own.clone()) else {
            return answer(cx);
        };
        let polled = answer(&mut Context::from_waker(&own));
        if polled.is_pending() {
            // Before this task yields: the relay runs on this thread, so it
            // cannot take the list between the registration and this push.
            RELAY.with(|r| r.borrow_mut().waiting.push(cx.waker().clone()));
        }
        polled
    }
}
