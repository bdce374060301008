//! `fencelog`: the server and its tools.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelog_server::config::{ServeConfig, parse_size};
use fencelog_server::dump::{self, DumpOptions};
use fencelog_server::protocol::Limits;
use fencelog_server::server::Server;
use fencelog_server::verify::{self, VerifyOptions};

/// A fenced append-only storage engine, served over the Redis protocol.
#[derive(Parser)]
#[command(name = "fencelog", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a data directory over the Redis protocol (RESP2 and RESP3).
    Serve(ServeArgs),
    /// Check every segment of a data directory offline and report its
    /// streams, records, tokens and damage.
    ///
    /// Exit status: 0 when nothing is damaged (a torn tail is not damage), 1
    /// on damage, 2 when the directory cannot be verified (missing, not a data
    /// directory, in use by a server, an I/O error).
    Verify(VerifyArgs),
    /// Print every entry of a data directory's log, one per line: segment,
    /// byte position, LSN, kind and what it means.
    ///
    /// Offsets are half-open (offsets=0..2 is records 0 and 1); names and
    /// payloads are escaped like Rust byte strings. Damage and torn tails are
    /// reported on stderr at the end; exit status as for `verify`.
    Dump(DumpArgs),
    /// Load a server (--addr) or an in-process engine with durable appends
    /// and stale-write rejections; print a summary table.
    Bench(fencelog_server::bench::BenchArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// The data directory (created if missing; locked while served).
    #[arg(long, default_value = "./fencelog-data")]
    dir: PathBuf,
    /// Where clients connect.
    #[arg(long, default_value = "127.0.0.1:7379")]
    addr: SocketAddr,
    /// A password every client must give (AUTH, or HELLO … AUTH).
    #[arg(long, env = "FENCELOG_REQUIREPASS")]
    requirepass: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics.
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Serve a non-loopback address without a password. Deliberate only.
    #[arg(long)]
    allow_unauthenticated_remote: bool,
    /// Largest record payload; larger ones get TOOBIG (the connection stays
    /// usable). Sizes take units: 4096, 64KiB, 1MiB, 1MB.
    #[arg(long, default_value = "1MiB", value_name = "SIZE", value_parser = size_u32)]
    max_payload: u32,
    /// Largest bulk string in a request; larger ones break the protocol
    /// (the connection is closed).
    #[arg(long, default_value = "16MiB", value_name = "SIZE", value_parser = size_usize)]
    max_bulk_bytes: usize,
    /// Most arguments in one request.
    #[arg(long, default_value_t = 1 << 16)]
    max_args: usize,
    /// Longest inline command.
    #[arg(long, default_value = "64KiB", value_name = "SIZE", value_parser = size_usize)]
    max_inline_bytes: usize,
    /// Bytes of requests one connection may hold before they run: unparsed
    /// input, the arguments of a request not yet complete and the commands
    /// queued in a transaction (Redis' client-query-buffer-limit). Past it
    /// the client is disconnected. Before AUTH, at most 1 MiB.
    #[arg(long, default_value = "64MiB", value_name = "SIZE", value_parser = size_usize)]
    max_query_buffer: usize,
    /// Bytes of replies one connection may hold unwritten (Redis'
    /// client-output-buffer-limit): past it the client is disconnected. A
    /// client that does not read stalls its own pipeline long before; this
    /// catches a single reply too large to go out (an EXEC of many reads).
    #[arg(long, default_value = "32MiB", value_name = "SIZE", value_parser = size_usize)]
    client_output_buffer_limit: usize,
    /// Bytes all client connections together may hold: input, parsed
    /// arguments, queued transactions, unwritten replies (Redis'
    /// maxmemory-clients). Past it the connection holding the most is
    /// dropped.
    #[arg(long, default_value = "512MiB", value_name = "SIZE", value_parser = size_usize)]
    maxmemory_clients: usize,
    /// Payload bytes one LOG.READ answers at most; it always answers at
    /// least one record if there is one, so a client pages through.
    #[arg(long, default_value = "16MiB", value_name = "SIZE", value_parser = size_u64)]
    max_read_bytes: u64,
    /// Pipelined requests one connection may have unanswered.
    #[arg(long, default_value_t = 1024)]
    max_pipeline: usize,
    /// Client connections at once.
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// Segment file size.
    #[arg(long, default_value = "64MiB", value_name = "SIZE", value_parser = size_u64)]
    segment_bytes: u64,
    /// Seconds shutdown gives connections to hand out their last answers
    /// (writes already decided are made durable either way).
    #[arg(long, default_value_t = 1)]
    shutdown_grace_secs: u64,
}

fn size_u64(text: &str) -> Result<u64, String> {
    parse_size(text)
}

fn size_usize(text: &str) -> Result<usize, String> {
    usize::try_from(parse_size(text)?).map_err(|_| format!("{text:?} is too large"))
}

fn size_u32(text: &str) -> Result<u32, String> {
    u32::try_from(parse_size(text)?).map_err(|_| format!("{text:?} is over 4 GiB"))
}

#[derive(Args)]
struct VerifyArgs {
    /// The data directory (refused while another process, such as a server,
    /// has it open).
    dir: PathBuf,
    /// List every segment and every stream (default: at most 20 of each;
    /// with more streams, the 20 with the most records appended).
    #[arg(long)]
    all: bool,
    /// Draw no progress bar (it is drawn on stderr, only when that is a
    /// terminal).
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args)]
struct DumpArgs {
    /// The data directory (refused while another process, such as a server,
    /// has it open).
    dir: PathBuf,
    /// Show only the entries concerning this stream, or the lease of this
    /// name (a checkpoint shows only this stream's row).
    #[arg(long, value_name = "NAME")]
    stream: Option<OsString>,
    /// Also print each record's payload, escaped like a Rust byte string
    /// (b"...").
    #[arg(long)]
    payloads: bool,
    /// Bytes of each payload printed before it is cut (with --payloads).
    #[arg(long, default_value_t = dump::DEFAULT_PAYLOAD_LIMIT, value_name = "BYTES")]
    payload_limit: usize,
    /// Cut nothing: whole payloads, every record size, every stream of a
    /// checkpoint.
    #[arg(long)]
    full: bool,
}

impl ServeArgs {
    fn config(self) -> ServeConfig {
        // An entry holds one request's payloads: as large as a request may
        // be, and at most half a segment.
        let max_entry = (self.max_bulk_bytes.max(self.max_payload as usize) + 4096)
            .min(usize::try_from(self.segment_bytes / 2).unwrap_or(usize::MAX));
        let engine = fencelog::Options {
            max_payload_bytes: self.max_payload,
            wal: fencelog::WalOptions {
                segment_bytes: self.segment_bytes,
                max_entry_bytes: u32::try_from(max_entry).unwrap_or(u32::MAX),
                ..fencelog::WalOptions::default()
            },
            ..fencelog::Options::default()
        };
        ServeConfig {
            dir: self.dir,
            addr: self.addr,
            requirepass: self.requirepass,
            metrics_addr: self.metrics_addr,
            allow_unauthenticated_remote: self.allow_unauthenticated_remote,
            engine,
            limits: Limits {
                max_bulk_bytes: self.max_bulk_bytes,
                max_args: self.max_args,
                max_inline_bytes: self.max_inline_bytes,
            },
            max_query_buffer_bytes: self.max_query_buffer,
            client_output_buffer_limit_bytes: self.client_output_buffer_limit,
            maxmemory_clients_bytes: self.maxmemory_clients,
            max_read_bytes: self.max_read_bytes,
            max_pipeline: self.max_pipeline,
            max_connections: self.max_connections,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
        }
    }
}

impl VerifyArgs {
    fn options(&self) -> VerifyOptions {
        VerifyOptions {
            all: self.all,
            progress: !self.no_progress,
        }
    }
}

impl DumpArgs {
    fn options(&self) -> DumpOptions {
        DumpOptions {
            stream: self.stream.clone().map(OsString::into_encoded_bytes),
            payloads: self.payloads,
            payload_limit: self.payload_limit,
            full: self.full,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FENCELOG_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Serve(args) => serve(args.config()),
        Command::Verify(args) => verify::run(&args.dir, &args.options()),
        Command::Dump(args) => dump::run(&args.dir, &args.options()),
        Command::Bench(args) => fencelog_server::bench::run(args),
    }
}

/// Large buffers (a 16 MiB reply, a 1 MiB argument) come and go with
/// clients. glibc serves them from its heap once the first is freed (its
/// mmap threshold moves up to 32 MiB), and a fragmented heap keeps what was
/// freed: the process would hold twice what its clients do. A fixed
/// threshold maps every buffer of 128 KiB or more on its own and gives it
/// back when freed, so resident memory follows the clients' budgets.
fn return_large_buffers_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

fn serve(config: ServeConfig) -> ExitCode {
    return_large_buffers_to_the_system();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelog: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        // Handlers first: a signal that arrives once the server says it is
        // serving must be a graceful stop, not the default (death).
        let stop = shutdown_signal();
        let server = match Server::bind(config).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fencelog: {e}");
                return ExitCode::FAILURE;
            }
        };
        match server.run(stop).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fencelog: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGINT or SIGTERM: the handlers are installed when this is called, the
/// future resolves on the first signal.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut int), Ok(mut term)) = handlers else {
            // Without signal handlers there is nothing to wait for.
            return std::future::pending().await;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
}
