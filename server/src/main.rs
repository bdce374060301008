//! `fencelog`: the server and its tools.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelog_server::config::ServeConfig;
use fencelog_server::protocol::Limits;
use fencelog_server::server::Server;

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
    /// usable).
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES")]
    max_payload: u32,
    /// Largest bulk string in a request; larger ones break the protocol
    /// (the connection is closed).
    #[arg(long, default_value_t = 16 << 20, value_name = "BYTES")]
    max_bulk_bytes: usize,
    /// Most arguments in one request.
    #[arg(long, default_value_t = 1 << 16)]
    max_args: usize,
    /// Longest inline command.
    #[arg(long, default_value_t = 64 << 10, value_name = "BYTES")]
    max_inline_bytes: usize,
    /// Unparsed request bytes one connection may buffer.
    #[arg(long, default_value_t = 64 << 20, value_name = "BYTES")]
    max_query_buffer: usize,
    /// Pipelined requests one connection may have unanswered.
    #[arg(long, default_value_t = 1024)]
    max_pipeline: usize,
    /// Client connections at once.
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// Segment file size.
    #[arg(long, default_value_t = 64 << 20, value_name = "BYTES")]
    segment_bytes: u64,
    /// Seconds shutdown waits for connections to finish their command.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_secs: u64,
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
            max_pipeline: self.max_pipeline,
            max_connections: self.max_connections,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
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
        .init();
    match cli.command {
        Command::Serve(args) => serve(args.config()),
    }
}

fn serve(config: ServeConfig) -> ExitCode {
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
        let server = match Server::bind(config).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fencelog: {e}");
                return ExitCode::FAILURE;
            }
        };
        match server.run(shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fencelog: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without signal handlers there is nothing to wait for.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}
