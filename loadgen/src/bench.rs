//! `fencelog bench`: a load generator for durable appends and stale-write
//! rejections, in process (the engine's API) or against a server (RESP2
//! over TCP), with a summary table (SPEC.md §7).
//!
//! Workloads, each on streams of its own (named with a unique run id, so a
//! run never meets the streams of an earlier one):
//!
//! - `append`: durable appends of one record each, with a valid token.
//! - `reject`: every stream is first fenced at a high token; then every
//!   append carries an older one and must be answered STALE. A STALE answer
//!   is counted, never a failure; an *accepted* stale write is.
//! - `mixed`: streams fenced as for `reject`; a fraction `--stale-ratio` of
//!   the appends carries the stale token, the rest the current one.
//!
//! A client sends P requests (`--pipeline`), then waits for their P answers.
//! A request's latency runs from the moment its batch is sent to its answer.
//! Answers other than the expected ones (an error that is not STALE, a stale
//! write accepted, a lost connection) are reported separately and make the
//! run fail (exit code 1).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fencelog::{Log, Options, Token};
use fencelog_client::{Config, Pipeline, Reply, Request, Value};
use tokio::task::JoinSet;

/// Load a fencelog server over TCP, or the engine in this process, with
/// durable appends and stale writes; print a summary table.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Load a running server at HOST:PORT over TCP (RESP2). Without it, the
    /// engine runs in this process.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// The server's password, sent with AUTH on every connection (only with
    /// --addr).
    #[arg(long, env = "FENCELOG_REQUIREPASS", hide_env_values = true)]
    pub password: Option<String>,
    /// In process: the data directory (created if missing; the bench's
    /// streams stay in it). Default: a fresh temporary directory, removed
    /// afterwards.
    #[arg(long, conflicts_with = "addr")]
    pub dir: Option<PathBuf>,
    /// What to run. Default: append, then reject.
    #[arg(long, value_enum)]
    pub workload: Option<Workload>,
    /// Concurrent clients: connections over TCP, tasks in process.
    #[arg(long, default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
    pub clients: u32,
    /// Requests in flight per client: P requests are sent, then their P
    /// answers awaited.
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_PIPELINE as i64))]
    pub pipeline: u32,
    /// Streams written: client i writes stream i mod N (1 = every client on
    /// one stream). Default: one per client.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CLIENTS as i64))]
    pub streams: Option<u32>,
    /// Bytes of each record's payload.
    #[arg(long, default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub payload_bytes: u32,
    /// How long each workload is measured: seconds ("3", "0.5") or
    /// milliseconds ("300ms").
    #[arg(long, default_value = "5", value_parser = parse_duration, value_name = "SECS")]
    pub duration: Duration,
    /// Measure this many requests per workload (over all clients) instead
    /// of a duration.
    #[arg(long, conflicts_with = "duration",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,
    /// Unmeasured load before each workload is measured: seconds or "…ms".
    #[arg(long, default_value = "0", value_parser = parse_duration, value_name = "SECS")]
    pub warmup: Duration,
    /// mixed: the fraction of appends sent with a stale token (0 to 1).
    #[arg(long, default_value_t = 0.1, value_parser = parse_ratio, value_name = "FRACTION")]
    pub stale_ratio: f64,
    /// The longest a batch of requests may wait for its answers before the
    /// client gives up (a failure): seconds or "…ms".
    #[arg(long, default_value = "30", value_parser = parse_duration, value_name = "SECS")]
    pub timeout: Duration,
    /// The start of every stream name; a unique run id and the workload
    /// follow it.
    #[arg(long, default_value = "bench")]
    pub stream_prefix: String,
    /// Print one JSON object per workload (one per line) instead of the
    /// table.
    #[arg(long)]
    pub json: bool,
    /// Endurance: append to --streams streams round robin for --duration,
    /// and every --slice print appends/s, segments, bytes on disk against
    /// payload, open files, resident memory and checkpoint size; in process,
    /// also the time to open the log again at the end.
    #[arg(long, conflicts_with_all = ["workload", "requests"])]
    pub history: bool,
    /// --history: seconds between reports.
    #[arg(long, default_value = "5", value_parser = parse_duration, value_name = "SECS")]
    pub slice: Duration,
    /// Against a server: delete the streams this run created when it ends
    /// (LOG.DELETE). A deleted stream keeps its highest token and next
    /// offset forever (that is what fencing needs), so the server keeps a
    /// few bytes per stream in its table; its records' space is given back.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub cleanup: bool,
    /// Measure each workload this many times (alternating with redis-server
    /// under --compare-redis) and report medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Side by side with Redis: start redis-server (appendonly yes,
    /// appendfsync always) on a temporary port and directory, and drive it
    /// and fencelog with the same load in alternating runs; Redis does the
    /// fenced append with a Lua script. Prints medians, ratios and each
    /// server's CPU seconds per million requests. Without --addr a
    /// fencelog server is started the same way.
    #[arg(long, conflicts_with_all = ["dir", "history"])]
    pub compare_redis: bool,
    /// --compare-redis: the redis-server program.
    #[arg(long, default_value = "redis-server", value_name = "PATH")]
    pub redis_server: PathBuf,
    /// --compare-redis: what Redis is asked. `lua`: the same fenced append
    /// as a Lua script. `plain`: Redis' cheapest commands of the same
    /// shape, `SET key payload` for an append (durable with appendfsync
    /// always) and `GET key` for a rejection (a hash lookup, as a stale
    /// rejection is).
    #[arg(long, value_enum, default_value = "lua")]
    pub redis_commands: RedisCommands,
    /// Against a server (and Redis): how the clients run. `events`: every
    /// connection a task on one tokio runtime. `threads`: one OS thread per
    /// connection on a blocking socket, as many client processes would.
    #[arg(long, value_enum, default_value = "events")]
    pub driver: Driver,
    /// --history in process: the segment size (sizes like 1MiB or 65536).
    #[arg(long, default_value = "1MiB", value_parser = crate::history::parse_size, value_name = "BYTES")]
    pub segment_bytes: u64,
}

/// How `fencelog bench` drives a server.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// One tokio runtime; each connection a task.
    Events,
    /// One OS thread per connection, blocking std sockets.
    Threads,
}

/// What Redis runs under `--compare-redis`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisCommands {
    /// The fenced append and fence as Lua scripts (`EVAL`).
    Lua,
    /// `SET` for an append, `GET` for a rejection.
    Plain,
}

/// A workload of `fencelog bench`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Durable appends with a valid token.
    Append,
    /// Appends with a stale token to fenced streams: every answer STALE.
    Reject,
    /// Appends to fenced streams, a fraction (--stale-ratio) stale.
    Mixed,
    /// Reads of the first record of a stream holding one (`LOG.READ stream
    /// 0 COUNT 1`): in cluster mode each read first confirms leadership
    /// with a quorum (linearizable).
    Read,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Append => "append",
            Workload::Reject => "reject",
            Workload::Mixed => "mixed",
            Workload::Read => "read",
        }
    }
}

const MAX_CLIENTS: u32 = 4096;
const MAX_PIPELINE: u32 = 4096;
/// `--driver threads` writes a whole batch before it reads a reply, and the
/// server stops reading a connection whose unread replies pass 64 KiB:
/// this many replies (a STALE answer is under 100 bytes) stay below that.
const MAX_THREADS_PIPELINE: u32 = 256;
/// The token streams are fenced at before `reject` and `mixed`.
const FENCE_TOKEN: u64 = 1_000_000;
/// The token of `append`'s writes, and of every stale write.
const LOW_TOKEN: u64 = 1;
/// Streams fenced per round trip during setup.
const FENCE_CHUNK: usize = 256;
/// Requests a client decides in process before it lets other tasks run,
/// when none of them had to wait (rejections never do).
const YIELD_EVERY: u64 = 256;
/// Distinct unexpected answers kept to show.
const MAX_SAMPLES: usize = 5;

/// Runs `fencelog bench`: 0 when every answer was the expected one, 1 when
/// some was not (or the run could not start), 2 for unusable arguments.
pub fn run(args: BenchArgs) -> ExitCode {
    if args.history {
        return crate::history::run(&args);
    }
    if let Err(e) = check(&args) {
        eprintln!("fencelog bench: {e}");
        return ExitCode::from(2);
    }
    if args.compare_redis {
        return compare::run(&args);
    }
    let report = match execute(&args, !args.json) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fencelog bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        for r in &report.results {
            println!("{}", r.json(&report.target));
        }
    } else {
        print!("{}", report.table());
    }
    let failed: u64 = report.results.iter().map(|r| r.unexpected).sum();
    if failed > 0 {
        eprintln!("fencelog bench: FAILED: {failed} unexpected answer(s):");
        for r in &report.results {
            for s in &r.unexpected_samples {
                eprintln!("  {}: {s}", r.workload.name());
            }
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Checks what clap cannot: relations between flags.
fn check(args: &BenchArgs) -> Result<(), String> {
    if let Some(s) = args.streams
        && s > args.clients
    {
        return Err(format!(
            "--streams ({s}) must not exceed --clients ({}): every stream needs a writer",
            args.clients
        ));
    }
    if args.duration.is_zero() {
        return Err("--duration must be above 0".into());
    }
    if args.timeout.is_zero() {
        return Err("--timeout must be above 0".into());
    }
    if args.driver == Driver::Threads && args.pipeline > MAX_THREADS_PIPELINE {
        return Err(format!(
            "--driver threads takes --pipeline up to {MAX_THREADS_PIPELINE}, not {}",
            args.pipeline
        ));
    }
    // "{prefix}:{run id}:{workload}:{index}" must stay a valid stream name.
    if args.stream_prefix.is_empty() || args.stream_prefix.len() > 200 {
        return Err("--stream-prefix must be 1 to 200 bytes".into());
    }
    Ok(())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = if let Some(ms) = s.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(secs) = s.strip_suffix('s') {
        (secs, 1.0)
    } else {
        (s, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds (e.g. 3, 0.5, 300ms)"))?;
    let secs = value * unit;
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("{s:?} must be between 0 and one day"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_ratio(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&r) {
        return Err(format!("{r} is not between 0 and 1"));
    }
    Ok(r)
}

// ---------------------------------------------------------------------------
// The run: targets, plans, clients.

enum Target {
    InProcess(Log),
    Tcp {
        addr: SocketAddr,
        password: Option<String>,
        dialect: Dialect,
    },
}

/// How a fenced append and a fence are said to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dialect {
    /// `LOG.APPEND`, `LOG.FENCE`, `LOG.DELETE`.
    Fencelog,
    /// Redis: the same decisions by a Lua script per request (the highest
    /// token in `{stream}:token`, the records in a list).
    Redis,
    /// Redis' cheapest commands of the same shape, for the per-request cost
    /// of the server itself: an append is `SET stream payload` (durable
    /// with `appendfsync always`), a stale write is `GET stream` (a hash
    /// lookup, as a stale rejection is).
    RedisPlain,
}

/// Redis' fenced append: STALE if the token is below the stream's highest,
/// else raise the highest and push the record; answers its offset.
const REDIS_APPEND: &[u8] = b"local h = tonumber(redis.call('GET', KEYS[2]) or '0') \
local t = tonumber(ARGV[1]) \
if t < h then return redis.error_reply('STALE token ' .. t .. ' is below the highest accepted token ' .. h) end \
if t > h then redis.call('SET', KEYS[2], ARGV[1]) end \
return redis.call('RPUSH', KEYS[1], ARGV[2]) - 1";

/// Redis' fence: raises the highest token; answers it.
const REDIS_FENCE: &[u8] = b"local h = tonumber(redis.call('GET', KEYS[2]) or '0') \
local t = tonumber(ARGV[1]) \
if t < h then return redis.error_reply('STALE token ' .. t .. ' is below the highest accepted token ' .. h) end \
redis.call('SET', KEYS[2], ARGV[1]) return t";

impl Dialect {
    fn append(self, stream: &[u8], token: u64, payload: &[u8]) -> Request {
        let token = token.to_string();
        match self {
            Dialect::Fencelog => Request::new(&[b"LOG.APPEND", stream, token.as_bytes(), payload]),
            Dialect::RedisPlain => Request::new(&[b"SET", stream, payload]),
            Dialect::Redis => {
                let tok_key = [stream, b":token"].concat();
                Request::new(&[
                    b"EVAL",
                    REDIS_APPEND,
                    b"2",
                    stream,
                    &tok_key,
                    token.as_bytes(),
                    payload,
                ])
            }
        }
    }

    /// A read of a stream's first record.
    fn read(self, stream: &[u8]) -> Request {
        match self {
            Dialect::Fencelog => Request::new(&[b"LOG.READ", stream, b"0", b"COUNT", b"1"]),
            Dialect::Redis => Request::new(&[b"LRANGE", stream, b"0", b"0"]),
            Dialect::RedisPlain => Request::new(&[b"GET", stream]),
        }
    }

    /// A write meant to be rejected: an append with `token`, or under
    /// [`Dialect::RedisPlain`] the lookup that stands for one.
    fn stale(self, stream: &[u8], token: u64, payload: &[u8]) -> Request {
        match self {
            Dialect::RedisPlain => Request::new(&[b"GET", stream]),
            _ => self.append(stream, token, payload),
        }
    }

    /// What an answer means in this dialect.
    fn outcome(self, reply: &Reply<'_>) -> Outcome {
        match (self, reply) {
            (Dialect::RedisPlain, Reply::Simple(b"OK")) => Outcome::Accepted,
            (Dialect::RedisPlain, Reply::Bulk(_)) => Outcome::Stale,
            // A read's records (reads are the only requests answered so).
            (_, Reply::Other(v)) if matches!(**v, Value::Array(_)) => Outcome::Accepted,
            (_, reply) => reply_outcome(reply),
        }
    }

    /// Sets a stream up for rejections: fenced at `token` (under
    /// [`Dialect::RedisPlain`], a value for `GET` to find).
    fn fence(self, stream: &[u8], token: u64) -> Request {
        let token = token.to_string();
        match self {
            Dialect::Fencelog => Request::new(&[b"LOG.FENCE", stream, token.as_bytes()]),
            Dialect::RedisPlain => Request::new(&[b"SET", stream, token.as_bytes()]),
            Dialect::Redis => {
                let tok_key = [stream, b":token"].concat();
                Request::new(&[
                    b"EVAL",
                    REDIS_FENCE,
                    b"2",
                    stream,
                    &tok_key,
                    token.as_bytes(),
                ])
            }
        }
    }

    fn delete(self, stream: &[u8], token: u64) -> Request {
        match self {
            Dialect::Fencelog => {
                Request::new(&[b"LOG.DELETE", stream, token.to_string().as_bytes()])
            }
            Dialect::Redis => {
                let tok_key = [stream, b":token"].concat();
                Request::new(&[b"DEL", stream, &tok_key])
            }
            Dialect::RedisPlain => Request::new(&[b"DEL", stream]),
        }
    }
}

/// What every client of one workload shares.
struct Plan {
    workload: Workload,
    driver: Driver,
    clients: u32,
    pipeline: u32,
    streams: Vec<Bytes>,
    payload: Bytes,
    /// The token of writes meant to be accepted.
    valid: Token,
    /// The token of writes meant to be rejected.
    stale: Token,
    /// The fraction of writes sent with `stale`.
    stale_ratio: f64,
    warmup: Duration,
    duration: Option<Duration>,
    requests: Option<u64>,
    timeout: Duration,
}

impl Plan {
    fn new(args: &BenchArgs, workload: Workload, run_id: &str) -> Result<Plan, String> {
        let streams = args.streams.unwrap_or(args.clients);
        let token = |n| Token::new(n).map_err(|e| e.to_string());
        let (valid, stale, stale_ratio) = match workload {
            Workload::Append | Workload::Read => (token(LOW_TOKEN)?, token(LOW_TOKEN)?, 0.0),
            Workload::Reject => (token(FENCE_TOKEN)?, token(LOW_TOKEN)?, 1.0),
            Workload::Mixed => (token(FENCE_TOKEN)?, token(LOW_TOKEN)?, args.stale_ratio),
        };
        let payload: Vec<u8> = b"fencelog"
            .iter()
            .copied()
            .cycle()
            .take(args.payload_bytes as usize)
            .collect();
        Ok(Plan {
            workload,
            driver: args.driver,
            clients: args.clients,
            pipeline: args.pipeline,
            streams: (0..streams)
                .map(|i| {
                    Bytes::from(format!(
                        "{}:{run_id}:{}:{i}",
                        args.stream_prefix,
                        workload.name()
                    ))
                })
                .collect(),
            payload: Bytes::from(payload),
            valid,
            stale,
            stale_ratio,
            warmup: args.warmup,
            duration: args.requests.is_none().then_some(args.duration),
            requests: args.requests,
            timeout: args.timeout,
        })
    }

    /// The stream client `i` writes.
    fn stream_of(&self, client: u32) -> &Bytes {
        &self.streams[client as usize % self.streams.len()]
    }

    /// Client `i`'s share of `--requests`.
    fn quota_of(&self, client: u32) -> Option<u64> {
        self.requests.map(|n| {
            let c = u64::from(self.clients);
            n / c + u64::from(u64::from(client) < n % c)
        })
    }
}

/// The outcome of a whole run.
struct Report {
    /// "in-process (DIR)" or "tcp ADDR".
    target: String,
    results: Vec<WorkloadResult>,
}

/// The runtime the load generator's clients run on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

impl BenchArgs {
    /// The workloads to run: the one asked for, or append and reject.
    fn workloads(&self) -> Vec<Workload> {
        match self.workload {
            Some(w) => vec![w],
            None => vec![Workload::Append, Workload::Reject],
        }
    }
}

/// Runs every workload asked for and collects the results; `Err` when the
/// run could not start or set up (a failure, not a result).
fn execute(args: &BenchArgs, progress: bool) -> Result<Report, String> {
    check(args)?;
    let workloads = args.workloads();
    let runtime = runtime()?;
    // Declared before `target`: the directory goes after the log closes.
    let mut _tempdir = None;
    let (target, description) = match &args.addr {
        Some(addr) => {
            let resolved = runtime
                .block_on(tokio::net::lookup_host(addr.as_str()))
                .map_err(|e| format!("cannot resolve {addr}: {e}"))?
                .next()
                .ok_or_else(|| format!("{addr} resolves to no address"))?;
            let resolved = runtime.block_on(leader::follow(resolved, args.password.as_deref()))?;
            (
                Target::Tcp {
                    addr: resolved,
                    password: args.password.clone(),
                    dialect: Dialect::Fencelog,
                },
                format!("tcp {resolved}"),
            )
        }
        None => {
            let (dir, removed) = match &args.dir {
                Some(d) => (d.clone(), ""),
                None => {
                    let t = tempfile::Builder::new()
                        .prefix("fencelog-bench-")
                        .tempdir()
                        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
                    let path = t.path().to_path_buf();
                    _tempdir = Some(t);
                    (path, ", removed afterwards")
                }
            };
            let log = Log::open(&dir, Options::default())
                .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
            (
                Target::InProcess(log),
                format!("in-process engine in {}{removed}", dir.display()),
            )
        }
    };
    let run_id = run_id();
    let mut results = Vec::new();
    for workload in workloads {
        let plan = Arc::new(Plan::new(args, workload, &run_id)?);
        if progress {
            let how_long = match plan.requests {
                Some(n) => format!("{n} requests"),
                None => format!("{:.1} s", args.duration.as_secs_f64()),
            };
            eprintln!(
                "bench: {}: {} clients × pipeline {}, {} streams, {}-byte records, {how_long} \
                 (+{:.1} s warmup), {description}",
                workload.name(),
                plan.clients,
                plan.pipeline,
                plan.streams.len(),
                args.payload_bytes,
                args.warmup.as_secs_f64()
            );
        }
        let result = runtime.block_on(run_workload(&target, Arc::clone(&plan)))?;
        results.push(result);
        // A failed cleanup leaves streams behind but measured nothing wrong.
        if args.cleanup
            && let Err(e) = runtime.block_on(cleanup(&target, &plan))
        {
            eprintln!("bench: cleanup: {e}");
        }
    }
    // Tasks are done; close the log (it syncs) outside the runtime, then
    // the temporary directory goes.
    drop(runtime);
    drop(target);
    Ok(Report {
        target: description,
        results,
    })
}

fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{:x}{:04x}",
        (nanos as u64) & 0xffff_ffff_ffff,
        std::process::id() & 0xffff
    )
}

/// The measured window, shared by a workload's clients.
#[derive(Clone, Copy)]
struct Window {
    /// Requests sent from here on are measured.
    measure_start: Instant,
    /// No batch is sent from here on (duration mode).
    end: Option<Instant>,
}

async fn run_workload(target: &Target, plan: Arc<Plan>) -> Result<WorkloadResult, String> {
    // Setup: fence the streams, connect every client, before the clock runs.
    if plan.workload != Workload::Append {
        match target {
            Target::InProcess(log) => fence_in_process(log, &plan).await?,
            Target::Tcp {
                addr,
                password,
                dialect,
            } => fence_tcp(*addr, password.as_deref(), *dialect, &plan).await?,
        }
    }
    let (clients, mut monitor_conn) = match target {
        Target::InProcess(log) => (Clients::InProcess(log.clone()), None),
        Target::Tcp { addr, password, .. } => {
            let clients = match plan.driver {
                Driver::Events => Clients::Events(connect_all(*addr, password, &plan).await?),
                Driver::Threads => {
                    Clients::Threads(threads::connect_all(*addr, password, &plan).await?)
                }
            };
            let monitor = connect(*addr, password.as_deref(), plan.timeout).await?;
            (clients, Some(monitor))
        }
    };

    let start = Instant::now();
    let measure_start = start + plan.warmup;
    let window = Window {
        measure_start,
        end: plan.duration.map(|d| measure_start + d),
    };

    // The engine's group-commit counters at the start of the window and
    // after the last answer.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let monitor = match target {
        Target::InProcess(log) => {
            let log = log.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(measure_start.into()).await;
                let before = Persistence::of_log(&log);
                let _ = done_rx.await;
                Some((before, Persistence::of_log(&log)))
            })
        }
        Target::Tcp { .. } => {
            let mut conn = monitor_conn.take();
            tokio::spawn(async move {
                let conn = conn.as_mut()?;
                tokio::time::sleep_until(measure_start.into()).await;
                let before = persistence(conn).await;
                let _ = done_rx.await;
                Some((before?, persistence(conn).await?))
            })
        }
    };

    let dialect = match target {
        Target::Tcp { dialect, .. } => *dialect,
        Target::InProcess(_) => Dialect::Fencelog,
    };
    let stats = run_clients(clients, &plan, dialect, window).await;
    let _ = done_tx.send(());
    let group_commit = match monitor.await {
        Ok(Some((before, after))) => GroupCommit::between(&before, &after),
        _ => None,
    };
    let seconds = stats.last_answer.map_or(0.0, |t| {
        t.saturating_duration_since(measure_start).as_secs_f64()
    });
    Ok(WorkloadResult {
        workload: plan.workload,
        clients: plan.clients,
        pipeline: plan.pipeline,
        streams: plan.streams.len(),
        payload_bytes: plan.payload.len(),
        stale_ratio: plan.stale_ratio,
        requests: stats.requests,
        accepted: stats.accepted,
        stale: stats.stale,
        unexpected: stats.unexpected,
        unexpected_samples: stats.samples,
        seconds,
        latency: stats.latency,
        group_commit,
    })
}

/// A workload's clients, connected before its window opens.
enum Clients {
    InProcess(Log),
    Events(Vec<Pipeline>),
    Threads(Vec<fencelog_client::blocking::Pipeline>),
}

/// Connects `plan.clients` pipelines at once (before the clock runs).
async fn connect_all(
    addr: SocketAddr,
    password: &Option<String>,
    plan: &Plan,
) -> Result<Vec<Pipeline>, String> {
    let mut connecting = JoinSet::new();
    for i in 0..plan.clients {
        let password = password.clone();
        let timeout = plan.timeout;
        connecting.spawn(async move { (i, connect(addr, password.as_deref(), timeout).await) });
    }
    let mut conns: Vec<Option<Pipeline>> = (0..plan.clients).map(|_| None).collect();
    while let Some(joined) = connecting.join_next().await {
        let (i, conn) = joined.map_err(|e| format!("a connecting task failed: {e}"))?;
        conns[i as usize] = Some(conn?);
    }
    Ok(conns.into_iter().flatten().collect())
}

/// Runs every client of a workload to its end and adds up their counts.
async fn run_clients(
    clients: Clients,
    plan: &Arc<Plan>,
    dialect: Dialect,
    window: Window,
) -> ClientStats {
    let mut tasks = JoinSet::new();
    match clients {
        Clients::InProcess(log) => {
            for i in 0..plan.clients {
                let client = Client::new(plan, i, window);
                tasks.spawn(in_process_client(log.clone(), Arc::clone(plan), client, i));
            }
        }
        Clients::Events(conns) => {
            for (i, conn) in (0..plan.clients).zip(conns) {
                let client = Client::new(plan, i, window);
                let (valid, stale) = requests_of(plan, dialect, i);
                let plan = Arc::clone(plan);
                tasks.spawn(tcp_client(conn, plan, client, dialect, valid, stale));
            }
        }
        Clients::Threads(conns) => return threads::run(conns, plan, dialect, window).await,
    }
    let mut stats = ClientStats::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(s) => stats.merge(s),
            Err(e) => stats.unexpected(format!("a client task failed: {e}")),
        }
    }
    stats
}

/// Client `i`'s two requests: the write meant to be accepted (a read for
/// `read`), and the one meant to be refused.
fn requests_of(plan: &Plan, dialect: Dialect, i: u32) -> (Request, Request) {
    let stream = plan.stream_of(i);
    let valid = if plan.workload == Workload::Read {
        dialect.read(stream)
    } else {
        dialect.append(stream, plan.valid.get(), &plan.payload)
    };
    (
        valid,
        dialect.stale(stream, plan.stale.get(), &plan.payload),
    )
}

async fn fence_in_process(log: &Log, plan: &Plan) -> Result<(), String> {
    for chunk in plan.streams.chunks(FENCE_CHUNK) {
        let mut pending = Vec::with_capacity(chunk.len());
        for stream in chunk {
            let failed = |e: fencelog::Error| {
                format!("cannot fence {}: {e}", String::from_utf8_lossy(stream))
            };
            // `read` reads one record: each stream gets it here.
            if plan.workload == Workload::Read {
                log.append_deferred(stream, plan.valid, vec![plan.payload.clone()])
                    .await
                    .map_err(failed)?
                    .await
                    .map_err(failed)?;
                continue;
            }
            let d = log
                .fence_deferred(stream, plan.valid)
                .await
                .map_err(failed)?;
            pending.push((stream, d));
        }
        for (stream, d) in pending {
            d.await
                .map_err(|e| format!("cannot fence {}: {e}", String::from_utf8_lossy(stream)))?;
        }
    }
    Ok(())
}

/// Deletes the streams a workload wrote (against a server; in process the
/// directory is the bench's own, or the one given, and is left as it is).
async fn cleanup(target: &Target, plan: &Plan) -> Result<(), String> {
    let Target::Tcp {
        addr,
        password,
        dialect,
    } = target
    else {
        return Ok(());
    };
    let mut conn = connect(*addr, password.as_deref(), plan.timeout).await?;
    for chunk in plan.streams.chunks(FENCE_CHUNK) {
        for stream in chunk {
            conn.queue_request(&dialect.delete(stream, plan.valid.get()));
        }
        let replies = exchange_all(&mut conn, plan.timeout, "cleanup").await?;
        for (stream, reply) in chunk.iter().zip(replies) {
            if let Value::Error(e) = reply {
                return Err(format!(
                    "cannot delete {}: {e}",
                    String::from_utf8_lossy(stream)
                ));
            }
        }
    }
    Ok(())
}

async fn fence_tcp(
    addr: SocketAddr,
    password: Option<&str>,
    dialect: Dialect,
    plan: &Plan,
) -> Result<(), String> {
    let mut conn = connect(addr, password, plan.timeout).await?;
    let token = plan.valid.get().to_string();
    for chunk in plan.streams.chunks(FENCE_CHUNK) {
        for stream in chunk {
            // `read` reads one record: each stream gets it here.
            if plan.workload == Workload::Read {
                conn.queue_request(&dialect.append(stream, plan.valid.get(), &plan.payload));
            } else {
                conn.queue_request(&dialect.fence(stream, plan.valid.get()));
            }
        }
        let replies = exchange_all(&mut conn, plan.timeout, "fencing").await?;
        for (stream, reply) in chunk.iter().zip(replies) {
            let fenced = match dialect {
                Dialect::RedisPlain => reply == Value::Simple("OK".into()),
                // The record's offset (the streams are the run's own).
                _ if plan.workload == Workload::Read => reply == Value::Int(0),
                _ => reply == Value::Int(plan.valid.get() as i64),
            };
            if !fenced {
                return Err(format!(
                    "cannot fence {} at {token}: {reply:?}",
                    String::from_utf8_lossy(stream)
                ));
            }
        }
    }
    Ok(())
}

/// One batch of requests: how many, when sent, whether measured.
#[derive(Clone, Copy)]
struct Batch {
    len: u32,
    sent: Instant,
    measured: bool,
}

/// What a request was answered.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Stale,
    Unexpected(String),
}

/// One client's pacing and counts.
struct Client {
    pipeline: u32,
    stale_ratio: f64,
    rng: u64,
    window: Window,
    /// Measured requests still to send (`--requests`).
    quota: Option<u64>,
    since_yield: u64,
    stats: ClientStats,
}

impl Client {
    fn new(plan: &Plan, i: u32, window: Window) -> Client {
        Client {
            pipeline: plan.pipeline,
            stale_ratio: plan.stale_ratio,
            // xorshift64*, seeded per client (never 0).
            rng: 0x9E37_79B9_7F4A_7C15 ^ (u64::from(i) + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9),
            window,
            quota: plan.quota_of(i),
            since_yield: 0,
            stats: ClientStats::default(),
        }
    }

    /// The next batch, or `None` when the client is done.
    fn next_batch(&mut self) -> Option<Batch> {
        let now = Instant::now();
        if self.window.end.is_some_and(|end| now >= end) {
            return None;
        }
        let measured = now >= self.window.measure_start;
        let len = match &mut self.quota {
            Some(left) if measured => {
                if *left == 0 {
                    return None;
                }
                let n = (*left).min(u64::from(self.pipeline));
                *left -= n;
                n as u32
            }
            _ => self.pipeline,
        };
        Some(Batch {
            len,
            sent: now,
            measured,
        })
    }

    /// Decides a batch: for each of its requests whether it carries the
    /// stale token (into `kinds`, handed to `queue`); answers the batch
    /// stamped as sent now.
    fn start_batch(
        &mut self,
        batch: Batch,
        kinds: &mut Vec<bool>,
        mut queue: impl FnMut(bool),
    ) -> Batch {
        kinds.clear();
        for _ in 0..batch.len {
            let meant_stale = self.choose_stale();
            kinds.push(meant_stale);
            queue(meant_stale);
        }
        Batch {
            sent: Instant::now(),
            ..batch
        }
    }

    /// Counts the answers of `batch` in order, each judged in `dialect`.
    fn judge<'a>(
        &'a mut self,
        batch: &'a Batch,
        kinds: &'a [bool],
        dialect: Dialect,
    ) -> impl FnMut(Reply<'_>) + 'a {
        let mut kind = kinds.iter();
        move |reply| {
            let meant_stale = kind.next().copied().unwrap_or_default();
            self.record(batch, meant_stale, dialect.outcome(&reply));
        }
    }

    /// Whether the next request carries the stale token.
    fn choose_stale(&mut self) -> bool {
        if self.stale_ratio <= 0.0 {
            return false;
        }
        if self.stale_ratio >= 1.0 {
            return true;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((r >> 11) as f64 / (1u64 << 53) as f64) < self.stale_ratio
    }

    /// Counts an answer to a request of `batch` that was meant to be stale
    /// or not.
    fn record(&mut self, batch: &Batch, meant_stale: bool, outcome: Outcome) {
        let now = Instant::now();
        let s = &mut self.stats;
        // An unexpected answer fails the run, warmup or not.
        match (outcome, meant_stale) {
            (Outcome::Accepted, false) if batch.measured => s.accepted += 1,
            (Outcome::Stale, true) if batch.measured => s.stale += 1,
            (Outcome::Accepted, false) | (Outcome::Stale, true) => {}
            (Outcome::Accepted, true) => s.unexpected("a write with a stale token was accepted"),
            (Outcome::Stale, false) => s.unexpected("a write with the current token was STALE"),
            (Outcome::Unexpected(e), _) => s.unexpected(e),
        }
        if batch.measured {
            s.requests += 1;
            s.latency.record(now.saturating_duration_since(batch.sent));
            s.last_answer = Some(s.last_answer.map_or(now, |t| t.max(now)));
        }
    }

    /// Lets other tasks run now and then, when nothing waited.
    async fn pace(&mut self, n: u32) {
        self.since_yield += u64::from(n);
        if self.since_yield >= YIELD_EVERY {
            self.since_yield = 0;
            tokio::task::yield_now().await;
        }
    }
}

async fn in_process_client(log: Log, plan: Arc<Plan>, mut c: Client, i: u32) -> ClientStats {
    let stream = plan.stream_of(i).clone();
    let mut pending = Vec::with_capacity(plan.pipeline as usize);
    while let Some(batch) = c.next_batch() {
        let answered = tokio::time::timeout(plan.timeout, async {
            // Decide P writes, then await their P answers.
            for _ in 0..batch.len {
                if plan.workload == Workload::Read {
                    let read = log.read(&stream, 0, 1);
                    let outcome = match read {
                        Ok(_) => Outcome::Accepted,
                        Err(e) => Outcome::Unexpected(e.to_string()),
                    };
                    c.record(&batch, false, outcome);
                    continue;
                }
                let meant_stale = c.choose_stale();
                let token = if meant_stale { plan.stale } else { plan.valid };
                match log
                    .append_deferred(&stream, token, vec![plan.payload.clone()])
                    .await
                {
                    Ok(d) => pending.push((meant_stale, d)),
                    // Rejected before the log: answered at once.
                    Err(e) => c.record(&batch, meant_stale, engine_outcome(Err(e))),
                }
            }
            for (meant_stale, d) in pending.drain(..) {
                let outcome = engine_outcome(d.await);
                c.record(&batch, meant_stale, outcome);
            }
        })
        .await;
        if answered.is_err() {
            c.stats
                .unexpected(format!("no answer within {:?}", plan.timeout));
            break;
        }
        c.pace(batch.len).await;
    }
    c.stats
}

fn engine_outcome(r: fencelog::Result<u64>) -> Outcome {
    match r {
        Ok(_) => Outcome::Accepted,
        Err(fencelog::Error::Stale { .. }) => Outcome::Stale,
        Err(e) => Outcome::Unexpected(e.to_string()),
    }
}

async fn tcp_client(
    mut conn: Pipeline,
    plan: Arc<Plan>,
    mut c: Client,
    dialect: Dialect,
    valid: Request,
    stale: Request,
) -> ClientStats {
    let mut kinds = Vec::with_capacity(plan.pipeline as usize);
    while let Some(batch) = c.next_batch() {
        let batch = c.start_batch(batch, &mut kinds, |meant_stale| {
            conn.queue_request(if meant_stale { &stale } else { &valid });
        });
        // The pipeline writes and reads at once: a large batch never waits
        // for the server to drain replies we are not reading. Each reply is
        // judged where it lies in the read buffer.
        let exchange = conn.exchange(c.judge(&batch, &kinds, dialect));
        match tokio::time::timeout(plan.timeout, exchange).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                c.stats.unexpected(format!("connection: {e}"));
                break;
            }
            Err(_) => {
                c.stats
                    .unexpected(format!("no answer within {:?}", plan.timeout));
                break;
            }
        }
        c.pace(batch.len).await;
    }
    c.stats
}

fn reply_outcome(reply: &Reply<'_>) -> Outcome {
    match reply {
        Reply::Int(_) => Outcome::Accepted,
        Reply::Error(e) if e.starts_with(b"STALE ") => Outcome::Stale,
        Reply::Error(e) => Outcome::Unexpected(String::from_utf8_lossy(e).into_owned()),
        other => Outcome::Unexpected(format!("unexpected reply {other}")),
    }
}

// ---------------------------------------------------------------------------
// Counting.

#[derive(Default)]
struct ClientStats {
    /// Measured requests answered (any answer).
    requests: u64,
    accepted: u64,
    stale: u64,
    /// Unexpected answers, warmup included: any fails the run.
    unexpected: u64,
    samples: Vec<String>,
    latency: LatencyHistogram,
    last_answer: Option<Instant>,
}

impl ClientStats {
    fn unexpected(&mut self, what: impl Into<String>) {
        self.unexpected += 1;
        let what = what.into();
        if self.samples.len() < MAX_SAMPLES && !self.samples.contains(&what) {
            self.samples.push(what);
        }
    }

    fn merge(&mut self, o: ClientStats) {
        self.requests += o.requests;
        self.accepted += o.accepted;
        self.stale += o.stale;
        self.unexpected += o.unexpected;
        for s in o.samples {
            if self.samples.len() < MAX_SAMPLES && !self.samples.contains(&s) {
                self.samples.push(s);
            }
        }
        self.latency.merge(&o.latency);
        self.last_answer = match (self.last_answer, o.last_answer) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// Latencies in nanoseconds, log-linear: exact below 32 ns, then 32
/// buckets per power of two (at most 3.1 % wide).
#[derive(Clone, Debug)]
struct LatencyHistogram {
    counts: Vec<u64>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
}

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const HIST_BUCKETS: usize = (64 - SUB_BITS as usize + 1) << SUB_BITS;

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; HIST_BUCKETS],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl LatencyHistogram {
    fn bucket(ns: u64) -> usize {
        if ns < SUB {
            return ns as usize;
        }
        let shift = 63 - ns.leading_zeros() - SUB_BITS;
        ((shift as usize + 1) << SUB_BITS) + ((ns >> shift) - SUB) as usize
    }

    /// The largest value bucket `i` holds.
    fn bucket_high(i: usize) -> u64 {
        if i < SUB as usize {
            return i as u64;
        }
        let shift = (i >> SUB_BITS) - 1;
        let sub = (i as u128 & (u128::from(SUB) - 1)) + u128::from(SUB);
        u64::try_from(((sub + 1) << shift) - 1).unwrap_or(u64::MAX)
    }

    fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.counts[Self::bucket(ns)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    fn merge(&mut self, o: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.count += o.count;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
    }

    /// An upper bound of the `q`-quantile in nanoseconds (the top of its
    /// bucket, never above the maximum); 0 when empty.
    fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::bucket_high(i).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

/// Buckets of the engine's commit latency histogram (powers of two).
const COMMIT_BUCKETS: usize = 40;

/// Group-commit counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Persistence {
    at: Instant,
    syncs: u64,
    entries: f64,
    sync_micros_sum: f64,
    /// The sync thread's idle time so far (`None`: an older server).
    idle_secs: Option<f64>,
    /// Entries per commit latency bucket: bucket `i` holds latencies up to
    /// `2^i - 1` µs (`None`: an older server).
    commit_buckets: Option<[u64; COMMIT_BUCKETS]>,
}

impl Persistence {
    fn of_log(log: &Log) -> Persistence {
        let w = log.metrics().wal;
        let mut buckets = [0; COMMIT_BUCKETS];
        for (b, n) in buckets.iter_mut().zip(w.commit_micros.buckets) {
            *b = n;
        }
        Persistence {
            at: Instant::now(),
            syncs: w.syncs,
            entries: w.entries as f64,
            sync_micros_sum: w.sync_micros.sum as f64,
            idle_secs: Some(w.sync_idle_micros as f64 / 1e6),
            commit_buckets: Some(buckets),
        }
    }

    /// From `INFO persistence commit`: `fsyncs`, and `wal_entries` (or, from
    /// an older server, `group_commit_avg_batch` × `fsyncs`); the sync
    /// thread's idle time and the commit latency histogram when the server
    /// reports them.
    fn of_info(text: &str) -> Option<Persistence> {
        let value = |name: &str| {
            text.lines().find_map(|line| {
                let (k, v) = line.trim_end_matches('\r').split_once(':')?;
                (k == name).then(|| v.trim().to_string())
            })
        };
        let field = |name: &str| value(name)?.parse::<f64>().ok();
        let syncs = field("fsyncs")?;
        let entries = field("wal_entries")
            .or_else(|| field("group_commit_avg_batch").map(|avg| avg * syncs))?;
        let sync_micros_sum = field("fsync_latency_avg_us").map_or(0.0, |avg| avg * syncs);
        let commit_buckets = value("commit_latency_us_le").and_then(|line| {
            let mut buckets = [0; COMMIT_BUCKETS];
            for pair in line.split(',').filter(|p| !p.is_empty()) {
                let (upper, n) = pair.split_once('=')?;
                let upper: u64 = upper.parse().ok()?;
                // Upper bounds are 2^i - 1.
                let i = (u64::BITS - upper.leading_zeros()) as usize;
                *buckets.get_mut(i)? += n.parse::<u64>().ok()?;
            }
            Some(buckets)
        });
        Some(Persistence {
            at: Instant::now(),
            syncs: syncs as u64,
            entries,
            sync_micros_sum,
            idle_secs: field("sync_thread_idle_seconds"),
            commit_buckets,
        })
    }
}

/// Group commit over the measured window.
#[derive(Clone, Copy, Debug)]
struct GroupCommit {
    syncs: u64,
    entries_per_sync: f64,
    sync_mean_us: f64,
    /// The share of the window the sync thread waited for work.
    idle_fraction: Option<f64>,
    /// The 99th percentile of an entry's commit latency in the window (the
    /// upper bound of its power-of-two bucket), µs.
    commit_p99_us: Option<u64>,
}

impl GroupCommit {
    fn between(before: &Persistence, after: &Persistence) -> Option<GroupCommit> {
        let syncs = after.syncs.checked_sub(before.syncs)?;
        let per_sync = |x: f64| if syncs == 0 { 0.0 } else { x / syncs as f64 };
        let window = after.at.saturating_duration_since(before.at).as_secs_f64();
        let idle_fraction = match (before.idle_secs, after.idle_secs) {
            (Some(b), Some(a)) if window > 0.0 => Some(((a - b) / window).clamp(0.0, 1.0)),
            _ => None,
        };
        let commit_p99_us = match (&before.commit_buckets, &after.commit_buckets) {
            (Some(b), Some(a)) => {
                let diff: Vec<u64> = a.iter().zip(b).map(|(a, b)| a.saturating_sub(*b)).collect();
                let total: u64 = diff.iter().sum();
                (total > 0).then(|| {
                    let rank = (total as f64 * 0.99).ceil() as u64;
                    let mut seen = 0;
                    let i = diff
                        .iter()
                        .position(|n| {
                            seen += n;
                            seen >= rank
                        })
                        .unwrap_or(COMMIT_BUCKETS - 1);
                    if i == 0 { 0 } else { (1u64 << i) - 1 }
                })
            }
            _ => None,
        };
        Some(GroupCommit {
            syncs,
            entries_per_sync: per_sync((after.entries - before.entries).max(0.0)),
            sync_mean_us: per_sync((after.sync_micros_sum - before.sync_micros_sum).max(0.0)),
            idle_fraction,
            commit_p99_us,
        })
    }
}

/// One workload's results.
struct WorkloadResult {
    workload: Workload,
    clients: u32,
    pipeline: u32,
    streams: usize,
    payload_bytes: usize,
    stale_ratio: f64,
    /// Measured requests answered.
    requests: u64,
    accepted: u64,
    stale: u64,
    /// Unexpected answers (warmup included): any fails the run.
    unexpected: u64,
    unexpected_samples: Vec<String>,
    /// From the start of the measured window to the last answer.
    seconds: f64,
    latency: LatencyHistogram,
    group_commit: Option<GroupCommit>,
}

impl WorkloadResult {
    fn ops_per_sec(&self) -> f64 {
        if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn json(&self, target: &str) -> String {
        let us = |ns: u64| ns as f64 / 1e3;
        let l = &self.latency;
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\"workload\":\"{}\",\"target\":{},\"clients\":{},\"pipeline\":{},\"streams\":{},\
             \"payload_bytes\":{},\"stale_ratio\":{},\"requests\":{},\"accepted\":{},\"stale\":{},\
             \"unexpected_errors\":{},\"seconds\":{:.6},\"ops_per_sec\":{:.1},\
             \"latency_us\":{{\"p50\":{:.3},\"p99\":{:.3},\"p999\":{:.3},\"max\":{:.3},\"mean\":{:.3}}}",
            self.workload.name(),
            json_string(target),
            self.clients,
            self.pipeline,
            self.streams,
            self.payload_bytes,
            self.stale_ratio,
            self.requests,
            self.accepted,
            self.stale,
            self.unexpected,
            self.seconds,
            self.ops_per_sec(),
            us(l.quantile(0.5)),
            us(l.quantile(0.99)),
            us(l.quantile(0.999)),
            us(l.max_ns),
            if l.count == 0 {
                0.0
            } else {
                l.sum_ns as f64 / l.count as f64 / 1e3
            },
        );
        match &self.group_commit {
            Some(g) => {
                let _ = write!(
                    s,
                    ",\"syncs\":{},\"entries_per_sync\":{:.2},\"sync_mean_us\":{:.1}",
                    g.syncs, g.entries_per_sync, g.sync_mean_us
                );
            }
            None => s.push_str(",\"syncs\":null,\"entries_per_sync\":null,\"sync_mean_us\":null"),
        }
        match self.group_commit.and_then(|g| g.idle_fraction) {
            Some(f) => {
                let _ = write!(s, ",\"sync_thread_idle\":{f:.3}");
            }
            None => s.push_str(",\"sync_thread_idle\":null"),
        }
        match self.group_commit.and_then(|g| g.commit_p99_us) {
            Some(us) => {
                let _ = write!(s, ",\"commit_p99_us\":{us}");
            }
            None => s.push_str(",\"commit_p99_us\":null"),
        }
        s.push_str(",\"unexpected_samples\":[");
        for (i, e) in self.unexpected_samples.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&json_string(e));
        }
        s.push_str("]}");
        s
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------
// Side by side with Redis.

mod compare;
mod leader;
mod threads;

// ---------------------------------------------------------------------------
// The table.

/// Writes `rows` (the header first) as aligned columns: the first to the
/// left, the others to the right.
fn write_columns(s: &mut String, rows: &[Vec<String>]) {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c == 0 {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(line, "  {cell:>w$}", w = widths[c]);
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
}

/// A count for a table: `1.23M`, `4.5k`, `678`.
pub(crate) fn fmt_count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn fmt_ns(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", ns as f64 / 1e6)
    } else {
        format!("{:.2}s", ns as f64 / 1e9)
    }
}

impl Report {
    fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "\nfencelog bench: {}", self.target);
        let first = self.results.first();
        if let Some(r) = first {
            let _ = writeln!(
                s,
                "{} streams, {}-byte records, latency from send to answer",
                r.streams, r.payload_bytes
            );
        }
        let header = [
            "workload", "clients", "pipeline", "requests", "seconds", "ops/s", "accepted", "stale",
            "errors", "p50", "p99", "p99.9", "max", "syncs", "per sync",
        ];
        let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
        for r in &self.results {
            let l = &r.latency;
            let workload = if r.workload == Workload::Mixed {
                format!("mixed {:.0}%", r.stale_ratio * 100.0)
            } else {
                r.workload.name().to_string()
            };
            let (syncs, per_sync) = match &r.group_commit {
                Some(g) if g.syncs > 0 => {
                    (g.syncs.to_string(), format!("{:.1}", g.entries_per_sync))
                }
                Some(_) => ("0".into(), "-".into()),
                None => ("-".into(), "-".into()),
            };
            rows.push(vec![
                workload,
                r.clients.to_string(),
                r.pipeline.to_string(),
                r.requests.to_string(),
                format!("{:.2}", r.seconds),
                fmt_count(r.ops_per_sec()),
                r.accepted.to_string(),
                r.stale.to_string(),
                r.unexpected.to_string(),
                fmt_ns(l.quantile(0.5)),
                fmt_ns(l.quantile(0.99)),
                fmt_ns(l.quantile(0.999)),
                fmt_ns(l.max_ns),
                syncs,
                per_sync,
            ]);
        }
        s.push('\n');
        write_columns(&mut s, &rows);
        if let Some(g) = self.results.iter().find_map(|r| {
            r.group_commit
                .filter(|g| g.syncs > 0)
                .map(|g| (r.workload, g))
        }) {
            let _ = write!(
                s,
                "\n{}: group commit wrote {:.1} entries per sync, mean write + fdatasync {:.0} µs",
                g.0.name(),
                g.1.entries_per_sync,
                g.1.sync_mean_us
            );
            if let Some(idle) = g.1.idle_fraction {
                let _ = write!(s, ", sync thread idle {:.0}%", idle * 100.0);
            }
            if let Some(p99) = g.1.commit_p99_us {
                let _ = write!(s, ", commit p99 ≤ {p99} µs");
            }
            s.push('\n');
        }
        s
    }
}

// ---------------------------------------------------------------------------
// Connections: fencelog-client's pipelines.

/// The client configuration of every connection the bench makes: RESP2
/// (what the bench has always spoken, and what `--compare-redis` asks of
/// redis-server), `AUTH` with `password`, and `timeout` to connect.
fn client_config(addr: SocketAddr, password: Option<&str>, timeout: Duration) -> Config {
    Config {
        seeds: vec![addr.to_string()],
        password: password.map(str::to_string),
        resp3: false,
        connect_timeout: timeout,
        request_timeout: timeout,
        discover_leader: false,
        ..Config::default()
    }
}

/// A pipeline to the server at `addr`, authenticated with `password`.
pub(crate) async fn connect(
    addr: SocketAddr,
    password: Option<&str>,
    timeout: Duration,
) -> Result<Pipeline, String> {
    let config = client_config(addr, password, timeout);
    Pipeline::connect(&addr.to_string(), &config)
        .await
        .map_err(|e| match e {
            fencelog_client::Error::Io(_) => format!("cannot connect to {addr}: {e}"),
            e if password.is_some() => format!("AUTH failed: {e}"),
            e => format!("cannot connect to {addr}: {e}"),
        })
}

/// Sends what `conn` has queued and answers every reply, within `timeout`
/// (`what` names the step in the error).
async fn exchange_all(
    conn: &mut Pipeline,
    timeout: Duration,
    what: &str,
) -> Result<Vec<Value>, String> {
    let mut replies = Vec::with_capacity(conn.queued());
    tokio::time::timeout(timeout, conn.exchange(|r| replies.push(r.to_value())))
        .await
        .map_err(|_| format!("{what} got no answer within {timeout:?}"))?
        .map_err(|e| format!("{what}: {e}"))?;
    Ok(replies)
}

/// One request on its own, within `timeout`.
pub(crate) async fn request(
    conn: &mut Pipeline,
    args: &[&[u8]],
    timeout: Duration,
) -> Result<Value, String> {
    tokio::time::timeout(timeout, conn.request(args))
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| e.to_string())
}

/// `INFO persistence`, or `None` if the server does not tell.
async fn persistence(conn: &mut Pipeline) -> Option<Persistence> {
    let reply = request(
        conn,
        &[b"INFO", b"persistence", b"commit"],
        Duration::from_secs(10),
    )
    .await
    .ok()?;
    match reply {
        Value::Bulk(text) | Value::Verbatim(text) => {
            Persistence::of_info(&String::from_utf8_lossy(&text))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(list: &[&str]) -> BenchArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(list.iter().copied()))
            .unwrap()
            .bench
    }

    #[test]
    fn flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let a = args(&[]);
        assert_eq!((a.clients, a.pipeline, a.payload_bytes), (50, 1, 100));
        assert_eq!(a.duration, Duration::from_secs(5));
        assert!(a.addr.is_none() && a.workload.is_none() && !a.json);
        assert_eq!(
            args(&["--duration", "300ms"]).duration,
            Duration::from_millis(300)
        );
        assert_eq!(
            args(&["--duration", "0.5"]).duration,
            Duration::from_millis(500)
        );
        assert!(Cli::try_parse_from(["bench", "--duration", "-1"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--stale-ratio", "1.5"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--clients", "0"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--requests", "5", "--duration", "1"]).is_err());
        assert!(Cli::try_parse_from(["bench", "--addr", "x:1", "--dir", "/tmp/x"]).is_err());
        assert!(check(&args(&["--clients", "2", "--streams", "3"])).is_err());
        assert!(check(&args(&["--clients", "2", "--streams", "1"])).is_ok());
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = LatencyHistogram::default();
        for ns in 1..=10_000u64 {
            h.record(Duration::from_nanos(ns));
        }
        for (q, want) in [(0.5, 5_000.0), (0.99, 9_900.0), (0.999, 9_990.0)] {
            let got = h.quantile(q) as f64;
            assert!(got >= want && got <= want * 1.04, "{q}: {got}");
        }
        assert_eq!(h.quantile(1.0), 10_000);
        assert_eq!(h.max_ns, 10_000);
        for v in [0, 1, 31, 32, 33, 1 << 20, u64::MAX / 3, u64::MAX] {
            let i = LatencyHistogram::bucket(v);
            assert!(i < HIST_BUCKETS);
            assert!(LatencyHistogram::bucket_high(i) >= v);
            if i > 0 {
                assert!(LatencyHistogram::bucket_high(i - 1) < v);
            }
        }
    }

    #[test]
    fn info_persistence_is_read() {
        let text = "# Persistence\r\nfsyncs:10\r\nfsync_latency_avg_us:200.50\r\n\
                    group_commit_avg_batch:3.00\r\nwal_entries:31\r\n";
        let p = Persistence::of_info(text).unwrap();
        assert_eq!(p.syncs, 10);
        assert_eq!(p.entries, 31.0);
        let old = Persistence::of_info("fsyncs:4\r\ngroup_commit_avg_batch:2.50\r\n").unwrap();
        assert_eq!(old.entries, 10.0);
        assert!(Persistence::of_info("# Persistence\r\n").is_none());
        let g = GroupCommit::between(&old, &p).unwrap();
        assert_eq!(g.syncs, 6);
        assert!((g.entries_per_sync - 3.5).abs() < 1e-9);
        assert_eq!((g.idle_fraction, g.commit_p99_us), (None, None));
        // The commit section: idle time and the latency histogram.
        let before = Persistence::of_info(
            "fsyncs:10\r\nwal_entries:31\r\nsync_thread_idle_seconds:1.00\r\n\
             commit_latency_us_le:255=31\r\n",
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let after = Persistence::of_info(
            "fsyncs:20\r\nwal_entries:231\r\nsync_thread_idle_seconds:1.00\r\n\
             commit_latency_us_le:255=131,511=90,2047=10\r\n",
        )
        .unwrap();
        let g = GroupCommit::between(&before, &after).unwrap();
        assert_eq!(g.idle_fraction, Some(0.0));
        // 200 entries: 100 ≤ 255 µs, 90 ≤ 511 µs, 10 ≤ 2047 µs.
        assert_eq!(g.commit_p99_us, Some(2047));
    }

    fn by_name(report: &Report, w: Workload) -> &WorkloadResult {
        report.results.iter().find(|r| r.workload == w).unwrap()
    }

    fn assert_sane(report: &Report) {
        for r in &report.results {
            assert_eq!(r.unexpected, 0, "{:?}", r.unexpected_samples);
            assert!(r.requests > 0, "{}", r.workload.name());
            assert_eq!(r.requests, r.accepted + r.stale);
            assert_eq!(r.latency.count, r.requests);
            assert!(r.seconds > 0.0);
            // The table and JSON render.
            assert!(r.json(&report.target).starts_with("{\"workload\""));
        }
        let table = report.table();
        assert!(table.contains("ops/s"));
        // Only what this run measured: no figure from elsewhere.
        assert!(!table.contains("elsewhere") && !table.contains("MACHINE"));
    }

    /// The default workloads: every append accepted through group commit,
    /// every stale write rejected; answers the rejection result.
    fn assert_append_then_reject(report: &Report) -> &WorkloadResult {
        assert_sane(report);
        let a = by_name(report, Workload::Append);
        assert_eq!((a.stale, a.accepted), (0, a.requests));
        let g = a.group_commit.unwrap();
        assert!(g.syncs > 0 && g.entries_per_sync >= 1.0, "{g:?}");
        let r = by_name(report, Workload::Reject);
        assert_eq!((r.accepted, r.stale), (0, r.requests));
        r
    }

    #[test]
    fn in_process_append_then_reject() {
        let report = execute(
            &args(&["--duration", "300ms", "--clients", "4", "--pipeline", "4"]),
            false,
        )
        .unwrap();
        let r = assert_append_then_reject(&report);
        assert_eq!(r.group_commit.unwrap().syncs, 0);
    }

    #[test]
    fn in_process_mixed_with_requests_and_one_stream() {
        let dir = tempfile::tempdir().unwrap();
        let report = execute(
            &args(&[
                "--workload",
                "mixed",
                "--stale-ratio",
                "0.5",
                "--requests",
                "1003",
                "--clients",
                "4",
                "--streams",
                "1",
                "--pipeline",
                "8",
                "--warmup",
                "50ms",
                "--dir",
                dir.path().to_str().unwrap(),
            ]),
            false,
        )
        .unwrap();
        assert_sane(&report);
        let m = by_name(&report, Workload::Mixed);
        assert_eq!(m.requests, 1003);
        assert!(
            m.accepted > 300 && m.stale > 300,
            "{} {}",
            m.accepted,
            m.stale
        );
        // The data stays in a directory that was given.
        let log = Log::open(dir.path(), Options::default()).unwrap();
        assert_eq!(log.streams().len(), 1);
    }

    /// A server on its own runtime and thread, stopped when dropped.
    struct TestServer {
        addr: SocketAddr,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<()>>,
        _dir: tempfile::TempDir,
    }

    impl TestServer {
        fn start(password: Option<&str>) -> TestServer {
            let dir = tempfile::tempdir().unwrap();
            let config = fencelog_server::config::ServeConfig {
                dir: dir.path().to_path_buf(),
                addr: "127.0.0.1:0".parse().unwrap(),
                requirepass: password.map(str::to_string),
                metrics_addr: None,
                allow_unauthenticated_remote: false,
                engine: Options::default(),
                limits: fencelog_server::protocol::Limits::default(),
                max_query_buffer_bytes: 64 << 20,
                client_output_buffer_limit_bytes: 32 << 20,
                maxmemory_clients_bytes: 512 << 20,
                max_read_bytes: 16 << 20,
                max_pipeline: 1024,
                max_connections: 1000,
                threads: 1,
                turns: None,
                shutdown_grace: Duration::from_secs(5),
                flags: Vec::new(),
                cluster: None,
            };
            let (addr_tx, addr_rx) = std::sync::mpsc::channel();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let server = fencelog_server::server::Server::bind(config).await.unwrap();
                    addr_tx.send(server.local_addr().unwrap()).unwrap();
                    server
                        .run(async {
                            let _ = stopped.await;
                        })
                        .await
                        .unwrap();
                });
            });
            TestServer {
                addr: addr_rx.recv().unwrap(),
                stop: Some(stop),
                thread: Some(thread),
                _dir: dir,
            }
        }
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    #[test]
    fn tcp_append_then_reject() {
        let server = TestServer::start(None);
        let addr = server.addr.to_string();
        let report = execute(
            &args(&[
                "--addr",
                &addr,
                "--duration",
                "300ms",
                "--clients",
                "4",
                "--pipeline",
                "4",
            ]),
            false,
        )
        .unwrap();
        assert_append_then_reject(&report);
        // A second run meets none of the first one's streams.
        let again = execute(
            &args(&["--addr", &addr, "--requests", "40", "--clients", "2"]),
            false,
        )
        .unwrap();
        assert_sane(&again);
    }

    #[test]
    fn reads_of_one_record_in_process_and_over_tcp() {
        let server = TestServer::start(None);
        let addr = server.addr.to_string();
        for target in [vec![], vec!["--addr", addr.as_str()]] {
            let mut list = vec![
                "--workload",
                "read",
                "--requests",
                "200",
                "--clients",
                "4",
                "--pipeline",
                "4",
            ];
            list.extend(target);
            let report = execute(&args(&list), false).unwrap();
            assert_sane(&report);
            let r = by_name(&report, Workload::Read);
            assert_eq!((r.requests, r.accepted, r.stale), (200, 200, 0));
        }
    }

    #[test]
    fn tcp_with_a_password() {
        let server = TestServer::start(Some("sesame"));
        let addr = server.addr.to_string();
        let report = execute(
            &args(&[
                "--addr",
                &addr,
                "--password",
                "sesame",
                "--workload",
                "mixed",
                "--requests",
                "200",
                "--clients",
                "3",
                "--pipeline",
                "16",
            ]),
            false,
        )
        .unwrap();
        assert_sane(&report);
        assert_eq!(by_name(&report, Workload::Mixed).requests, 200);
        // A wrong password cannot start a run.
        let e = execute(
            &args(&["--addr", &addr, "--password", "nope", "--requests", "10"]),
            false,
        )
        .err()
        .unwrap();
        assert!(e.contains("AUTH failed"), "{e}");
        // No password: every append is an unexpected NOAUTH, and the run fails.
        let report = execute(
            &args(&[
                "--addr",
                &addr,
                "--workload",
                "append",
                "--requests",
                "10",
                "--clients",
                "1",
            ]),
            false,
        )
        .unwrap();
        let a = by_name(&report, Workload::Append);
        assert_eq!(a.unexpected, 10);
        assert!(
            a.unexpected_samples[0].starts_with("NOAUTH"),
            "{:?}",
            a.unexpected_samples
        );
    }
}
