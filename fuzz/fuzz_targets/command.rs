//! The server's command layer (`cmd::execute` and its argument
//! parsing) on a real `fencelog::Log`, as a connection drives it: requests
//! parsed from the input by the server's own `RequestParser` (RESP arrays or
//! inline commands, with Redis' smaller limits until the session is
//! authenticated, as a connection sets them), each run through `execute`
//! with one session per input (so `MULTI`/`EXEC` transactions too), each
//! reply encoded as the session's protocol asks.
//!
//! Input: `flags: u8 | requests...`. Bit 0 of `flags` picks a server with
//! a password (`pw`) or without; bit 1 starts the session in RESP3; bit 2
//! starts it authenticated. At most 32 requests per input. The harness
//! command `FUZZ.ADVANCE ms` moves the lease clock (a manual one, so lease
//! expiry is up to the input, not to wall time).
//!
//! Nothing may panic; every reply encodes in both protocols; every error
//! starts with an upper-case code; no reply is `IOERR` (the storage is
//! healthy, so one would be an engine bug: a write that failed, or a read
//! that found the index inconsistent).
//!
//! Waiting is the one thing changed: the session does not wait
//! (`Session::waits`), so a `LOG.READ … BLOCK ms` runs with a zero timeout
//! and a `LEASE.ACQUIRE … WAIT ms` without waiting, and an input never
//! sleeps; the server's parsing of both is unchanged.
//!
//! The log is opened once per fuzz process, on tmpfs (`/dev/shm`, so
//! fsync is cheap), with small limits, and kept across inputs (an input may
//! meet streams and leases earlier inputs left); it is replaced by a fresh
//! one every `RESET_AFTER_BYTES` written or `RESET_AFTER_STREAMS` streams
//! held. A crash found this way may need
//! the inputs before it: rerun the crash input alone first, and if it
//! passes, run the fuzzer's last inputs (`-runs=0` over the corpus) before
//! it.

#![no_main]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use fencelog::wal::FsStorage;
use fencelog::{Log, ManualClock, Options};
use fencelog_server::budget::ClientMemory;
use fencelog_server::cmd;
use fencelog_server::config::ServeConfig;
use fencelog_server::context::{Context, EventLimits, ServerStats};
use fencelog_server::outcome::Outcome;
use fencelog_server::protocol::{Limits, Reply, Request, RequestParser};
use fencelog_server::session::Session;
use libfuzzer_sys::fuzz_target;

/// Requests run per input: bounds one input's time.
const MAX_REQUESTS: usize = 32;
/// A fresh log once the current one has written this much.
const RESET_AFTER_BYTES: u64 = 64 << 20;
/// A fresh log once the current one holds this many streams: `LOG.STREAMS`
/// lists and sorts every one (as documented, like Redis' `KEYS *`), and
/// with the thousands that inputs leave behind, sorting them under the
/// fuzzer's comparison hooks took most of the time of every input.
const RESET_AFTER_STREAMS: u64 = 1024;
const PASSWORD: &str = "pw";

struct Harness {
    rt: tokio::runtime::Runtime,
    clock: Arc<ManualClock>,
    /// Without a password, and with one; the same log.
    open: Arc<Context>,
    guarded: Arc<Context>,
    _dir: tempfile::TempDir,
    inputs: u64,
}

fn options() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 128 << 10;
    o.wal.max_entry_bytes = 16 << 10;
    o.wal.max_batch_bytes = 64 << 10;
    o.max_payload_bytes = 1024;
    o.max_records_per_append = 16;
    o.max_read_records = 64;
    o.max_live_leases = 16;
    o
}

fn limits() -> Limits {
    Limits {
        max_bulk_bytes: 4096,
        max_args: 64,
        max_inline_bytes: 4096,
    }
}

fn context(log: Log, dir: &Path, requirepass: Option<&str>) -> Arc<Context> {
    let config = ServeConfig {
        dir: dir.to_path_buf(),
        addr: SocketAddr::from(([127, 0, 0, 1], 7379)),
        requirepass: requirepass.map(String::from),
        metrics_addr: None,
        allow_unauthenticated_remote: false,
        engine: options(),
        limits: limits(),
        max_query_buffer_bytes: 1 << 20,
        client_output_buffer_limit_bytes: 1 << 20,
        maxmemory_clients_bytes: 4 << 20,
        max_read_bytes: 64 << 10,
        max_pipeline: 64,
        max_connections: 16,
        threads: 1,
        turns: None,
        shutdown_grace: Duration::from_secs(1),
        flags: Vec::new(),
        cluster: None,
    };
    config.check().expect("a valid configuration");
    let clients = Arc::new(ClientMemory::new(config.maxmemory_clients_bytes));
    Arc::new(Context {
        store: Arc::new(log),
        config,
        stats: ServerStats::new(),
        clients,
        registry: Arc::new(fencelog_server::clients::Registry::default()),
        events: EventLimits::default(),
    })
}

impl Harness {
    fn new() -> Harness {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let base = if Path::new("/dev/shm").is_dir() {
            Path::new("/dev/shm").to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tempfile::Builder::new()
            .prefix("fencelog-fuzz-command-")
            .tempdir_in(base)
            .expect("a temporary directory");
        let clock = Arc::new(ManualClock::default());
        let log = Log::open_on(
            Arc::new(FsStorage),
            clock.clone(),
            &dir.path().join("data"),
            options(),
        )
        .expect("the log opens");
        Harness {
            rt,
            clock,
            open: context(log.clone(), dir.path(), None),
            guarded: context(log, dir.path(), Some(PASSWORD)),
            _dir: dir,
            inputs: 0,
        }
    }

    /// A fresh log in a fresh directory once this one holds too much
    /// (looked at every 64 inputs).
    fn maybe_reset(&mut self) {
        self.inputs += 1;
        if self.inputs % 64 != 0 {
            return;
        }
        let m = self.open.engine().metrics();
        if m.wal.bytes_written < RESET_AFTER_BYTES && m.streams < RESET_AFTER_STREAMS {
            return;
        }
        // Drops the old contexts (the log's last handles) before the
        // directory goes.
        let fresh = Harness::new();
        *self = fresh;
    }
}

fn harness() -> &'static Mutex<Harness> {
    static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();
    HARNESS.get_or_init(|| Mutex::new(Harness::new()))
}

/// Encodes a reply both ways and checks what every reply must be.
fn check(reply: &Reply) {
    for proto in [2, 3] {
        let mut out = BytesMut::new();
        reply.encode(proto, &mut out);
        assert!(!out.is_empty());
    }
    check_errors(reply);
}

fn check_errors(reply: &Reply) {
    match reply {
        Reply::Error(text) => {
            let code = text.split(' ').next().unwrap_or_default();
            assert!(
                !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase()),
                "an error without a code: {text:?}"
            );
            assert_ne!(code, "IOERR", "healthy storage answered {text:?}");
        }
        Reply::Array(items) => items.iter().for_each(check_errors),
        Reply::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            check_errors(k);
            check_errors(v);
        }),
        _ => {}
    }
}

/// The harness's own command: `FUZZ.ADVANCE ms` moves the lease clock.
fn harness_command(h: &Harness, request: &Request) -> bool {
    if !request[0].eq_ignore_ascii_case(b"FUZZ.ADVANCE") {
        return false;
    }
    let ms = request
        .get(1)
        .and_then(|a| std::str::from_utf8(a).ok())
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(1000);
    h.clock
        .advance(Duration::from_millis(ms.min(30 * 86_400_000)));
    true
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut h = harness().lock().unwrap_or_else(|e| e.into_inner());
    h.maybe_reset();
    let ctx = if flags & 1 == 1 {
        Arc::clone(&h.guarded)
    } else {
        Arc::clone(&h.open)
    };
    let authenticated = ctx.config.requirepass.is_none() || flags & 4 == 4;
    let mut session = Session::new(1, SocketAddr::from(([127, 0, 0, 1], 40000)), authenticated);
    session.proto = if flags & 2 == 2 { 3 } else { 2 };
    // Never wait: the parsing is the server's, the waiting is not this
    // target's concern (BLOCK and WAIT answer at once, as inside EXEC).
    session.waits = false;
    let mut parser = RequestParser::new();
    let mut input = BytesMut::from(rest);
    for _ in 0..MAX_REQUESTS {
        // As a connection does: Redis' smaller limits until AUTH.
        parser.set_unauthenticated(!session.authenticated);
        let request = match parser.next(&mut input, &ctx.config.limits) {
            Ok(Some(r)) => r,
            // A protocol error closes the connection; nothing more runs.
            Ok(None) | Err(_) => break,
        };
        if harness_command(&h, &request) {
            continue;
        }
        let outcome = h.rt.block_on(cmd::execute(&ctx, &mut session, &request));
        let reply = match outcome {
            Outcome::Close(r) => {
                check(&r);
                break;
            }
            // The connection would be dropped (a reply over the output
            // limit): nothing more runs.
            Outcome::OverOutputLimit { .. } => break,
            Outcome::Pending(_) => panic!("a single node answered after a round"),
            other => h.rt.block_on(other.into_reply()),
        };
        check(&reply);
    }
});
