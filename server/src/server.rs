//! The accept loop, connection limits, the metrics endpoint and graceful
//! shutdown: on SIGINT or SIGTERM the server stops accepting, lets every
//! connection finish the command it is in, syncs the log and exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::commands::Context;
use crate::config::ServeConfig;
use crate::connection;
use crate::info;

/// Counters of the server itself (the engine keeps its own).
pub struct ServerStats {
    pub connections_total: AtomicU64,
    pub connections_now: AtomicU64,
    pub connections_refused: AtomicU64,
    pub commands: AtomicU64,
    pub bytes_in: AtomicU64,
    pub started: std::time::Instant,
}

impl ServerStats {
    fn new() -> Self {
        ServerStats {
            connections_total: AtomicU64::new(0),
            connections_now: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            started: std::time::Instant::now(),
        }
    }
}

/// A server bound to its addresses, not yet serving.
pub struct Server {
    ctx: Arc<Context>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
}

impl Server {
    /// Opens the log and binds the addresses: every error a person must fix
    /// (a locked directory, a taken port, an unsafe bind) surfaces here.
    pub async fn bind(mut config: ServeConfig) -> Result<Server, String> {
        config.check()?;
        fit_open_files(&mut config);
        let engine = config.engine.clone();
        let dir = config.dir.clone();
        let log = tokio::task::spawn_blocking(move || fencelog::Log::open(&dir, engine))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot open {}: {e}", config.dir.display()))?;
        let report = log.recovery_report();
        tracing::info!(
            dir = %config.dir.display(),
            segments = report.segments,
            entries_replayed = report.entries_replayed,
            "log opened"
        );
        if let Some(cut) = &report.cut {
            tracing::warn!(file = %cut.file.display(), position = cut.position, kind = ?cut.kind, reason = %cut.reason, "recovery cut the log");
        }
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.addr))?;
        let metrics = match config.metrics_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?,
            ),
            None => None,
        };
        let stats = ServerStats::new();
        Ok(Server {
            ctx: Arc::new(Context { log, config, stats }),
            listener,
            metrics,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` resolves, then shuts down gracefully.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> Result<(), String> {
        let Server {
            ctx,
            listener,
            metrics,
        } = self;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let permits = Arc::new(Semaphore::new(ctx.config.max_connections));
        let mut connections = JoinSet::new();
        if let Some(metrics) = metrics {
            let ctx = Arc::clone(&ctx);
            let rx = shutdown_rx.clone();
            tokio::spawn(serve_metrics(ctx, metrics, rx));
        }
        tracing::info!(addr = %listener.local_addr().map_err(|e| e.to_string())?, "serving");
        tokio::pin!(stop);
        let mut next_id = 1u64;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // Out of descriptors and the like: wait, go on.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                        ctx.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(refuse(stream));
                        continue;
                    };
                    let id = next_id;
                    next_id += 1;
                    let ctx = Arc::clone(&ctx);
                    let rx = shutdown_rx.clone();
                    ctx.stats.connections_total.fetch_add(1, Ordering::Relaxed);
                    ctx.stats.connections_now.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(async move {
                        if let Err(e) = connection::serve(Arc::clone(&ctx), stream, id, rx).await {
                            tracing::debug!(%peer, error = %e, "connection ended");
                        }
                        ctx.stats.connections_now.fetch_sub(1, Ordering::Relaxed);
                        drop(permit);
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                () = &mut stop => break,
            }
        }
        tracing::info!("shutting down: finishing the commands in progress");
        drop(listener);
        let _ = shutdown_tx.send(true);
        let grace = ctx.config.shutdown_grace;
        if tokio::time::timeout(grace, async {
            while connections.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            tracing::warn!(
                ?grace,
                "connections still busy after the grace period; closing them"
            );
            connections.abort_all();
        }
        // The last handle: dropping it syncs what was submitted and stops
        // the log's threads. Off the runtime: it blocks.
        let Ok(ctx) = Arc::try_unwrap(ctx) else {
            return Err("internal error: the server's context is still shared".into());
        };
        tokio::task::spawn_blocking(move || drop(ctx))
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Answers a connection over the limit, as Redis does, and closes it.
async fn refuse(mut stream: TcpStream) {
    let _ = stream
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
    let _ = stream.shutdown().await;
}

/// A minimal HTTP endpoint: `GET /metrics` in Prometheus' text format.
async fn serve_metrics(
    ctx: Arc<Context>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
            _ = shutdown.changed() => return,
        };
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let _ = metrics_request(&ctx, stream).await;
        });
    }
}

async fn metrics_request(ctx: &Context, mut stream: TcpStream) -> std::io::Result<()> {
    // A request line and headers, bounded: nothing else is read.
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return stream
                .write_all(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf[len..]))
            .await
            .map_err(|_| std::io::Error::other("timeout"))??;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let line = buf[..len].split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") || line == b"GET /metrics" {
        ("200 OK", info::prometheus(ctx))
    } else {
        ("404 Not Found", "try /metrics\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Raises the open-file limit as far as allowed, and keeps the connection
/// limit within what is left after the log's files; says so in the log.
fn fit_open_files(config: &mut ServeConfig) {
    use crate::fds;
    let reserved = fds::reserved_for_log(config.engine.wal.max_open_segments);
    match fds::raise_open_files_limit() {
        Ok(limit) => {
            if limit.now != limit.before {
                tracing::info!(
                    before = limit.before,
                    now = limit.now,
                    "raised the open-file limit to the hard limit"
                );
            }
            let fit = fds::connections_that_fit(config.max_connections, limit.now, reserved);
            if fit < config.max_connections {
                tracing::warn!(
                    max_connections = config.max_connections,
                    now = fit,
                    open_file_limit = limit.now,
                    reserved_for_log = reserved,
                    "--max-connections lowered to what the open-file limit leaves"
                );
                config.max_connections = fit;
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-file limit"),
    }
}
