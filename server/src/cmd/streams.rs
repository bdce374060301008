//! The stream commands: `LOG.APPEND`, `LOG.APPENDAT`, `LOG.FENCE`,
//! `LOG.TRIM`, `LOG.DELETE` (writes: each parsed into the engine's
//! [`TxOp`], the same op a transaction queues) and `LOG.READ`, `LOG.STAT`,
//! `LOG.STREAMS` (reads, once the store lets them look).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fencelog::{Log, Payloads, ReadOptions, TxOp};

use super::parse::{err, not_integer, parse_token, parse_u64, upper, wait_ms, wrong_arity};
use crate::command_table::*;
use crate::context::{ClientTag, Context, failure_reply, note_error};
use crate::outcome::{Blocking, Outcome, ReadProgress, error_reply, number, stale_reply};
use crate::protocol::{ArgRef, Args, Reply};
use crate::session::Session;
use crate::store::{Barrier, Store, Written};

/// The stream commands' specs, in the order `docs/COMMANDS.md` lists them.
pub static SPECS: &[CommandSpec] = &[
    cmd(
        "LOG.APPEND",
        -4,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@stream"],
        "log",
        "Appends records to a stream if the token is not below its highest; answers the first record's offset",
        "O(N) in the payload bytes",
        &[key("stream"), integer("token"), multiple(string("payload"))],
    ),
    cmd(
        "LOG.APPENDAT",
        -5,
        &["write", "denyoom"],
        ONE_KEY,
        &["@write", "@stream"],
        "log",
        "Appends records only at the expected offset (an exact retry answers the original offset); answers the first offset",
        "O(N) in the payload bytes",
        &[
            key("stream"),
            integer("token"),
            integer("expected_offset"),
            multiple(string("payload")),
        ],
    ),
    cmd(
        "LOG.FENCE",
        3,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@stream", "@fast"],
        "log",
        "Raises a stream's highest token without writing a record; answers the highest token",
        "O(1)",
        &[key("stream"), integer("token")],
    ),
    cmd(
        "LOG.READ",
        -3,
        &["readonly", "blocking"],
        ONE_KEY,
        &["@read", "@stream", "@blocking"],
        "log",
        "Reads durable records from an offset on: [offset, token, payload] each",
        "O(N) in the records answered",
        &[
            key("stream"),
            integer("from"),
            optional(token("COUNT", integer("count"))),
            optional(token("BLOCK", integer("milliseconds"))),
        ],
    ),
    cmd(
        "LOG.TRIM",
        4,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@stream", "@fast"],
        "log",
        "Makes the records below an offset unreadable and their space reclaimable; answers the new start offset",
        "O(1)",
        &[key("stream"), integer("token"), integer("before")],
    ),
    cmd(
        "LOG.DELETE",
        3,
        &["write", "fast"],
        ONE_KEY,
        &["@write", "@stream", "@fast"],
        "log",
        "Removes every record of a stream; its highest token and next offset stay forever. Answers the records removed",
        "O(1)",
        &[key("stream"), integer("token")],
    ),
    cmd(
        "LOG.STAT",
        2,
        &["readonly", "fast"],
        ONE_KEY,
        &["@read", "@stream", "@fast"],
        "log",
        "A stream's highest token, next offset, start offset, records and bytes",
        "O(1)",
        &[key("stream")],
    ),
    cmd(
        "LOG.STREAMS",
        -1,
        &["readonly"],
        NO_KEYS,
        &["@read", "@stream", "@slow"],
        "log",
        "The names of the streams that hold records or a token, in byte order, a page at a time (at most 10000)",
        "O(log(N) + M) with M the names answered",
        &[
            optional(token("AFTER", string("name"))),
            optional(token("COUNT", integer("count"))),
        ],
    ),
];

/// The commands that change streams: what a transaction puts in its entry.
pub const WRITES: &[&str] = &[
    "LOG.APPEND",
    "LOG.APPENDAT",
    "LOG.FENCE",
    "LOG.TRIM",
    "LOG.DELETE",
];

/// The commands that read streams' state (with `DBSIZE`): in a group each
/// is answered after a round that confirms leadership.
pub const READS: &[&str] = &["LOG.READ", "LOG.STAT", "LOG.STREAMS", "DBSIZE"];

/// A write command parsed into the op it is; `None` for any other command.
/// The error is the command's answer (arity, a token of 0, not a number).
pub fn parse_write(cmd: &str, a: Args<'_>) -> Option<Result<TxOp, Reply>> {
    let stream = || a.get(0).map(|s| s.to_bytes()).unwrap_or_default();
    let parsed = match cmd {
        "LOG.APPEND" if a.len() < 3 => Err(wrong_arity(cmd)),
        "LOG.APPEND" => parse_token(&a[1]).map(|token| TxOp::Append {
            stream: stream(),
            token,
            payloads: payloads(a.from(2)),
        }),
        "LOG.APPENDAT" if a.len() < 4 => Err(wrong_arity(cmd)),
        "LOG.APPENDAT" => parse_token(&a[1]).and_then(|token| {
            Ok(TxOp::AppendAt {
                stream: stream(),
                token,
                expected_offset: parse_u64(&a[2]).ok_or_else(not_integer)?,
                payloads: payloads(a.from(3)),
            })
        }),
        "LOG.FENCE" if a.len() != 2 => Err(wrong_arity(cmd)),
        "LOG.FENCE" => parse_token(&a[1]).map(|token| TxOp::Fence {
            stream: stream(),
            token,
        }),
        "LOG.TRIM" if a.len() != 3 => Err(wrong_arity(cmd)),
        "LOG.TRIM" => parse_token(&a[1]).and_then(|token| {
            Ok(TxOp::Trim {
                stream: stream(),
                token,
                before: parse_u64(&a[2]).ok_or_else(not_integer)?,
            })
        }),
        "LOG.DELETE" if a.len() != 2 => Err(wrong_arity(cmd)),
        "LOG.DELETE" => parse_token(&a[1]).map(|token| TxOp::Delete {
            stream: stream(),
            token,
        }),
        _ => return None,
    };
    Some(parsed.map_err(|o| match o {
        Outcome::Reply(r) => r,
        _ => Reply::Error("ERR syntax error".into()),
    }))
}

/// An append's records from its arguments: one record, the usual case,
/// built inline without going through the iterator's size hints.
fn payloads(a: Args<'_>) -> Payloads {
    match a.get(0) {
        Some(one) if a.len() == 1 => Payloads::from_buf([one.to_bytes()]),
        _ => a.iter().map(|p| p.to_bytes()).collect(),
    }
}

/// A `LOG.APPEND` from its arguments, before it is built into an op:
/// refused if stale, or taken now where the store can ([`Store::
/// append_now`]); `None` for anything else (it runs as parsed).
pub fn append_now(ctx: &Context, session: &Session, a: Args<'_>) -> Option<Outcome> {
    if a.len() < 3 {
        return None;
    }
    let (stream, token) = (&a[0], &a[1]);
    let token = parse_u64(token).and_then(|t| fencelog::Token::new(t).ok())?;
    // Most appends carry one payload: that one needs no vector.
    let taken = match a.get(2) {
        Some(one) if a.len() == 3 => {
            ctx.store
                .append_now(stream, token, std::slice::from_ref(&one))
        }
        _ => ctx.store.append_now(stream, token, &a.from(2).refs()),
    }?;
    match taken {
        Ok(later) => Some(Outcome::Later(later)),
        Err(e) => {
            note_error(ctx, &session.tag(), stream, &e);
            Some(Outcome::Reply(match e {
                fencelog::Error::Stale { presented, highest } => stale_reply(presented, highest),
                e => error_reply(&e),
            }))
        }
    }
}

/// A parsed write the connection takes with the pipelined writes next to
/// it (`Session::together`): refused at once if the store can tell it is
/// stale, else left for the connection to propose with them.
pub fn together(ctx: &Arc<Context>, session: &Session, op: TxOp) -> Outcome {
    if let Some(e) = ctx.store.refuse_now(&op) {
        note_error(ctx, &session.tag(), op.stream(), &e);
        return Outcome::Reply(error_reply(&e));
    }
    Outcome::Together(op)
}

/// Takes a parsed write: refused at once if the store can tell it is
/// stale, else taken now and answered once durable (or applied).
pub async fn write(ctx: &Arc<Context>, client: ClientTag, op: TxOp) -> Outcome {
    let stream = op.stream().clone();
    if let Some(e) = ctx.store.refuse_now(&op) {
        note_error(ctx, &client, &stream, &e);
        return Outcome::Reply(error_reply(&e));
    }
    match ctx.store.write(op).await {
        Ok(Written::Durable(later)) => Outcome::Later(later),
        Ok(Written::Applied(answer)) => {
            let ctx = Arc::clone(ctx);
            Outcome::Pending(Box::pin(async move {
                match answer.await {
                    Ok(n) => number(n),
                    Err(f) => failure_reply(&ctx, &client, &stream, f),
                }
            }))
        }
        Err(f) => Outcome::Reply(failure_reply(ctx, &client, &stream, f)),
    }
}

/// Runs `read` once the store lets a read of `key` look at the engine:
/// now, or (in a group) once its round is done, answered in order.
/// `here`: a read that may block waits for its round in this call.
/// `round`: the engine a round done since the read arrived lets it read
/// now (its connection waited for the round; see `read_round.rs`).
pub async fn after_round(
    store: &dyn Store,
    round: Option<Log>,
    key: &Bytes,
    here: bool,
    read: impl FnOnce(Log) -> Outcome + Send + 'static,
) -> Outcome {
    if let Some(log) = round {
        return read(log);
    }
    match store.read(key) {
        Err(f) => Outcome::Reply(f.into_reply()),
        Ok(Barrier::Now(log)) => read(log),
        Ok(Barrier::After(round)) if here => match round.await {
            Ok(log) => read(log),
            Err(f) => Outcome::Reply(f.into_reply()),
        },
        Ok(Barrier::After(round)) => Outcome::Pending(Box::pin(async move {
            match round.await {
                Ok(log) => read(log).into_reply().await,
                Err(f) => f.into_reply(),
            }
        })),
    }
}

/// A read's arguments, cut out of its request: it may answer after its
/// round, once the request is gone.
fn owned(a: &[ArgRef<'_>]) -> Vec<Bytes> {
    a.iter().map(ArgRef::to_bytes).collect()
}

/// The key a read is routed by: its first argument.
fn read_key(a: &[Bytes]) -> Bytes {
    a.first().cloned().unwrap_or_default()
}

/// `LOG.READ stream from [COUNT n] [BLOCK ms]`: in steps, so a large read
/// yields to other connections; `BLOCK` waits (not inside `EXEC`).
pub async fn read(
    ctx: &Arc<Context>,
    a: &[ArgRef<'_>],
    waits: bool,
    round: Option<Log>,
) -> Outcome {
    // As the connection's pipelining rule sees it: a read that may block
    // is not pipelined, and waits for its round first.
    let here = a.iter().any(|x| x.eq_ignore_ascii_case(b"BLOCK"));
    let (a, max_bytes) = (owned(a), ctx.config.max_read_bytes);
    after_round(&*ctx.store, round, &read_key(&a), here, move |log| {
        read_parsed(log, &a, max_bytes, waits)
    })
    .await
}

fn read_parsed(log: Log, a: &[Bytes], max_bytes: u64, waits: bool) -> Outcome {
    if a.len() < 2 {
        return wrong_arity("LOG.READ");
    }
    let Some(from) = parse_u64(&a[1]) else {
        return not_integer();
    };
    let mut opts = ReadOptions {
        max_records: 100,
        max_bytes,
        wait: Duration::ZERO,
    };
    let mut rest = &a[2..];
    while let [opt, value, tail @ ..] = rest {
        let Some(n) = parse_u64(value) else {
            return not_integer();
        };
        match upper(opt).as_str() {
            "COUNT" if n >= 1 => opts.max_records = u32::try_from(n).unwrap_or(u32::MAX),
            "COUNT" => return err("ERR COUNT must be at least 1"),
            "BLOCK" if waits => opts.wait = wait_ms(n),
            "BLOCK" => {}
            _ => return err("ERR syntax error"),
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return err("ERR syntax error");
    }
    // A read that waits answers what a timeout answers (nothing new) if
    // the server shuts down meanwhile.
    let on_shutdown = (!opts.wait.is_zero()).then(|| Reply::Array(Vec::new()));
    let stream = a[0].clone();
    Outcome::Blocking(Blocking::new(on_shutdown, move |progress| {
        Box::pin(async move {
            match stepped_read(&log, &stream, from, opts, progress.as_ref()).await {
                Ok(records) => Reply::Records(records),
                Err(e) => error_reply(&e),
            }
        })
    }))
}

/// Payload bytes one step of a read takes from the engine before it lets
/// other connections run: a 16 MiB read is 16 steps, not one long stall.
pub const READ_STEP_BYTES: u64 = 1 << 20;

/// What a record read holds besides its payload until its reply is
/// encoded: its entry's header and encoding around the payload, the
/// entry buffer's shared count, the `Record`. Measured: one `LOG.READ` of
/// 100 000 records of 100 bytes raised the server's peak memory by 40 MB,
/// the 13 MB of its encoded reply included (docs/DESIGN.md, "Reading an
/// entry"). The budget over all clients counted payload bytes alone, a
/// third of what a read of such records held.
pub const RECORD_HELD_BYTES: u64 = 160;

/// What `records` read records holding `bytes` of payload hold.
fn held(bytes: u64, records: usize) -> usize {
    let overhead = (records as u64).saturating_mul(RECORD_HELD_BYTES);
    usize::try_from(bytes.saturating_add(overhead)).unwrap_or(usize::MAX)
}

/// Reads like [`Log::read_with_async`], in steps of at most
/// [`READ_STEP_BYTES`], yielding between steps; `progress` is told what
/// the records gathered so far hold ([`RECORD_HELD_BYTES`] each besides
/// their payload). Records are immutable once durable, so the steps answer what
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
            p(held(bytes, records.len()));
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
            // Offsets are contiguous and never reused: a step goes on
            // where the one before it stopped.
            debug_assert!(records.last().is_none_or(|r| r.offset < record.offset));
            bytes += len;
            step_bytes += len;
            records.push(record);
        }
    }
    debug_assert!(records.len() <= opts.max_records as usize);
    if let Some(p) = progress {
        // The records go to the reply, which the connection counts.
        p(0);
    }
    Ok(records)
}

/// `LOG.STAT stream`
pub async fn stat(ctx: &Arc<Context>, a: &[ArgRef<'_>], round: Option<Log>) -> Outcome {
    let a = owned(a);
    after_round(&*ctx.store, round, &read_key(&a), false, move |log| {
        if a.len() != 1 {
            return wrong_arity("LOG.STAT");
        }
        Outcome::Reply(match log.stat(&a[0]) {
            Ok(st) => Reply::Map(vec![
                (Reply::text("highest_token"), number(st.highest_token)),
                (Reply::text("next_offset"), number(st.next_offset)),
                (Reply::text("start_offset"), number(st.start_offset)),
                (Reply::text("records"), number(st.records)),
                (Reply::text("bytes"), number(st.bytes)),
            ]),
            Err(e) => error_reply(&e),
        })
    })
    .await
}

/// The most names one `LOG.STREAMS` answers: a request's work is a page,
/// whatever the number of streams (a million streams listed at once kept a
/// server thread busy for 0.7 s and made a 21 MB reply).
pub const MAX_STREAMS_PAGE: u64 = 10_000;

/// `LOG.STREAMS [AFTER name] [COUNT n]`: names in byte order, strictly
/// after `name`. Without `COUNT`, every such name, unless there are more
/// than [`MAX_STREAMS_PAGE`]: then an error that says how to page, not a
/// list cut short without a word.
pub async fn streams(ctx: &Arc<Context>, a: &[ArgRef<'_>], round: Option<Log>) -> Outcome {
    let a = owned(a);
    after_round(&*ctx.store, round, &read_key(&a), false, move |log| {
        streams_page(&a, &log)
    })
    .await
}

fn streams_page(a: &[Bytes], log: &Log) -> Outcome {
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
    debug_assert!(names.len() as u64 <= page);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn parsed(args: &[&str]) -> TxOp {
        let request = crate::protocol::Request::from(
            args.iter()
                .map(|a| Bytes::copy_from_slice(a.as_bytes()))
                .collect::<Vec<_>>(),
        );
        let a = request.args();
        parse_write(args[0], a.from(1)).unwrap().unwrap()
    }

    /// An append of one record, a leader's usual write, holds it inline (no
    /// list allocated per append); several are all kept, in order.
    #[test]
    fn an_appends_one_record_is_held_inline() {
        for (args, records) in [
            (&["LOG.APPEND", "s", "3", "x"][..], &["x"][..]),
            (&["LOG.APPENDAT", "s", "3", "0", "x"], &["x"]),
            (&["LOG.APPEND", "s", "3", "x", "y", "z"], &["x", "y", "z"]),
        ] {
            let op = parsed(args);
            let (TxOp::Append { payloads, .. } | TxOp::AppendAt { payloads, .. }) = &op else {
                panic!("{args:?} parsed to {op:?}");
            };
            let want: Vec<Bytes> = records.iter().map(|r| Bytes::from(*r)).collect();
            assert_eq!(payloads.as_slice(), want.as_slice(), "{args:?}");
            assert_eq!(payloads.spilled(), records.len() > 1, "{args:?}");
        }
    }

    /// A read of many small records tells the budget what they hold, not
    /// their payload bytes alone (a small part of it).
    #[tokio::test]
    async fn a_read_tells_the_budget_what_its_records_hold() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), fencelog::Options::default()).unwrap();
        let token = fencelog::Token::new(1).unwrap();
        let payloads = vec![vec![b'r'; 60]; 1000];
        for _ in 0..30 {
            log.append("s", token, &payloads).unwrap();
        }
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&told);
        let progress: ReadProgress = Arc::new(move |bytes| seen.lock().unwrap().push(bytes));
        let opts = ReadOptions {
            max_records: 30_000,
            max_bytes: 16 << 20,
            wait: Duration::ZERO,
        };
        let records = stepped_read(&log, b"s", 0, opts, Some(&progress))
            .await
            .unwrap();
        assert_eq!(records.len(), 30_000);
        let told = told.lock().unwrap().clone();
        // Between steps (each at most the engine's 10 000 records), then 0
        // once the records go to the reply.
        assert!(told.len() >= 3, "{told:?}");
        assert_eq!(told.last(), Some(&0));
        let most = told.iter().copied().max().unwrap();
        let at_least = 20_000 * (60 + RECORD_HELD_BYTES as usize);
        assert!(
            most >= at_least,
            "told {most} for 20 000 records; at least {at_least}"
        );
        log.close().unwrap();
    }
}
