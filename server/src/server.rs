//! The accept loop, connection limits, the metrics endpoint and graceful
//! shutdown: on SIGINT or SIGTERM the server stops accepting, answers the
//! clients waiting in `BLOCK`/`WAIT`, hands out the answers already
//! decided, waits for every task it spawned, syncs the log and exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fencelog::wal::Turns;
use tokio::runtime::Runtime;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::budget::ClientMemory;
use crate::cluster::Cluster;
use crate::cluster::route::Group;
use crate::config::ServeConfig;
use crate::connection;
use crate::context::Context;
use crate::shutdown::{self, Shutdown};
use crate::store::Store;

/// Counters of the server itself (the engine keeps its own).
pub use crate::context::ServerStats;

/// A server bound to its addresses, not yet serving.
pub struct Server {
    ctx: Arc<Context>,
    /// Cluster mode: this node's replica (`None`: a single node).
    cluster: Option<Arc<Cluster>>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
}

impl Server {
    /// Opens the log and binds the addresses: every error a person must fix
    /// (a locked directory, a taken port, an unsafe bind) surfaces here.
    pub async fn bind(mut config: ServeConfig) -> Result<Server, String> {
        config.check()?;
        fit_open_files(&mut config);
        // Listeners first: a taken port must fail before the data directory
        // is created or a segment preallocated (a failed start leaves
        // nothing behind).
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|e| format!("cannot listen on {} (--addr): {e}", config.addr))?;
        let metrics =
            match config.metrics_addr {
                Some(addr) => Some(TcpListener::bind(addr).await.map_err(|e| {
                    format!("cannot serve metrics on {addr} (--metrics-addr): {e}")
                })?),
                None => None,
            };
        let engine = config.engine.clone();
        let dir = config.dir.clone();
        let created = first_missing_ancestor(&dir);
        if let Some(cluster) = config.cluster.clone() {
            let queue_bytes = config.maxmemory_clients_bytes as u64;
            return match Cluster::start(cluster, &config.dir, engine, queue_bytes).await {
                Ok(cluster) => {
                    let cluster = Arc::new(cluster);
                    let store = Arc::new(Group::new(Arc::clone(&cluster)));
                    Ok(Server::with(
                        config,
                        store,
                        Some(cluster),
                        listener,
                        metrics,
                    ))
                }
                Err(e) => {
                    if let Some(created) = created {
                        let _ = std::fs::remove_dir_all(&created);
                    }
                    Err(e)
                }
            };
        }
        let opened = tokio::task::spawn_blocking(move || fencelog::Log::open(&dir, engine))
            .await
            .map_err(|e| e.to_string())?;
        let log = match opened {
            Ok(log) => log,
            Err(e) => {
                // Whatever this start created goes again; a directory that
                // was there is left as it was.
                if let Some(created) = created {
                    let _ = std::fs::remove_dir_all(&created);
                }
                return Err(format!(
                    "cannot open {} (--dir): {}",
                    config.dir.display(),
                    crate::config::engine_error_in_flags(&e)
                ));
            }
        };
        let report = log.recovery_report();
        tracing::info!(
            dir = %config.dir.display(),
            segments = report.segments,
            entries_replayed = report.entries_replayed,
            "log opened"
        );
        if let Some(cut) = &report.cut {
            tracing::warn!(event = "recovery_cut", file = %cut.file.display(), position = cut.position, kind = ?cut.kind, reason = %cut.reason, bytes_cut = cut.bytes_cut, entries_cut = cut.entries_cut, token_floor = report.marks.floor, floor_raised = ?report.floor_raised, "recovery cut the log");
        }
        Ok(Server::with(config, Arc::new(log), None, listener, metrics))
    }

    fn with(
        config: ServeConfig,
        store: Arc<dyn Store>,
        cluster: Option<Arc<Cluster>>,
        listener: TcpListener,
        metrics: Option<TcpListener>,
    ) -> Server {
        let clients = Arc::new(ClientMemory::new(config.maxmemory_clients_bytes));
        Server {
            ctx: Arc::new(Context {
                store,
                config,
                stats: ServerStats::new(),
                clients,
                registry: Arc::new(crate::clients::Registry::default()),
                events: crate::context::EventLimits::default(),
            }),
            cluster,
            listener,
            metrics,
        }
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` resolves, then shuts down gracefully: stops
    /// accepting, tells every task (connections answer their waiting
    /// commands at once and hand out the answers already decided), waits up
    /// to `--shutdown-grace-secs` for connections, aborts what is left and
    /// waits for it too, then closes the log (which syncs).
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> Result<(), String> {
        let Server {
            ctx,
            cluster,
            listener,
            metrics,
        } = self;
        let (trigger, shutdown) = shutdown::channel();
        let permits = Arc::new(Semaphore::new(ctx.config.max_connections));
        let metrics_task = metrics.map(|metrics| {
            tokio::spawn(serve_metrics(Arc::clone(&ctx), metrics, shutdown.clone()))
        });
        tracing::info!(addr = %listener.local_addr().map_err(|e| e.to_string())?, "serving");
        // A node started empty with --cluster-join asks to be added, while
        // it serves (answering TRYAGAIN until it is).
        let join = cluster
            .clone()
            .map(|c| tokio::spawn(async move { c.join().await }));
        let mut tasks = Tasks {
            connections: JoinSet::new(),
            workers: Worker::start_all(&ctx.config, &shutdown)?,
            // Refusals over the connection limit: short, but tasks all the same.
            refusals: JoinSet::new(),
            metrics: metrics_task,
            join,
        };
        tokio::pin!(stop);
        let mut next_id = 1u64;
        // Leases granted here whose ttl ran out: logged once a second.
        let mut lease_sweep = tokio::time::interval(std::time::Duration::from_secs(1));
        lease_sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
                        note_refused(&ctx, peer);
                        tasks.refusals.spawn(refuse(stream));
                        continue;
                    };
                    let open = OpenConnection { ctx: Arc::clone(&ctx), _permit: permit };
                    tasks.serve(open, stream, peer, next_id, &shutdown);
                    next_id += 1;
                }
                Some(_) = tasks.connections.join_next(), if !tasks.connections.is_empty() => {}
                Some(_) = tasks.refusals.join_next(), if !tasks.refusals.is_empty() => {}
                _ = lease_sweep.tick() => crate::context::sweep_expired_leases(&ctx),
                () = &mut stop => break,
            }
        }
        tracing::info!("shutting down: answering what was decided");
        drop(listener);
        trigger.fire();
        shut_down(ctx, cluster, tasks).await?;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The tasks a server waits for when it shuts down.
struct Tasks {
    connections: JoinSet<()>,
    workers: Vec<Worker>,
    refusals: JoinSet<()>,
    metrics: Option<tokio::task::JoinHandle<()>>,
    join: Option<tokio::task::JoinHandle<()>>,
}

impl Tasks {
    /// Serves an accepted connection on one of the threads, round robin
    /// (this one is thread 0).
    fn serve(
        &mut self,
        open: OpenConnection,
        stream: TcpStream,
        peer: SocketAddr,
        id: u64,
        shutdown: &Shutdown,
    ) {
        let stats = &open.ctx.stats;
        stats.connections_total.fetch_add(1, Ordering::Relaxed);
        stats.connections_now.fetch_add(1, Ordering::Relaxed);
        let thread = (id % (self.workers.len() as u64 + 1)) as usize;
        if thread == 0 {
            let task = serve_connection(open, stream, peer, id, shutdown.clone());
            self.connections.spawn(task);
        } else {
            self.workers[thread - 1].hand_over(open, stream, peer, id);
        }
    }
}

/// The shutdown once the listener is gone and the signal fired: the
/// connections answer what was decided (for up to the grace period), every
/// task is awaited, the cluster stops, and the log is closed (synced).
async fn shut_down(
    ctx: Arc<Context>,
    cluster: Option<Arc<Cluster>>,
    mut tasks: Tasks,
) -> Result<(), String> {
    let grace = ctx.config.shutdown_grace;
    drain(&mut tasks.connections, grace).await;
    // The other threads did the same with theirs (the same grace).
    for worker in tasks.workers {
        worker.join().await;
    }
    tasks.refusals.abort_all();
    while tasks.refusals.join_next().await.is_some() {}
    if let Some(task) = tasks.metrics {
        // It aborts and waits for its own scrapes before it returns.
        let _ = task.await;
    }
    if let Some(join) = tasks.join {
        join.abort();
        let _ = join.await;
    }
    if let Some(cluster) = &cluster {
        cluster.shutdown().await;
    }
    // The store holds the cluster too: the context's is the last.
    drop(cluster);
    // The last handle: dropping it syncs what was submitted and stops
    // the log's threads. Off the runtime: it blocks.
    let ctx = Arc::try_unwrap(ctx).map_err(|ctx| {
        format!(
            "internal error: {} tasks still hold the server's context after every task \
             was awaited",
            Arc::strong_count(&ctx) - 1
        )
    })?;
    tokio::task::spawn_blocking(move || drop(ctx))
        .await
        .map_err(|e| e.to_string())
}

/// A connection refused over `--max-connections`: counted, and logged
/// (rate-limited).
fn note_refused(ctx: &Context, peer: SocketAddr) {
    ctx.stats
        .connections_refused
        .fetch_add(1, Ordering::Relaxed);
    if let Some(suppressed) = ctx.events.refused.admit() {
        tracing::warn!(
            event = "connection_refused",
            client_addr = %peer,
            max_connections = ctx.config.max_connections,
            suppressed,
            "connection refused: --max-connections reached"
        );
    }
}

/// The outermost directory of `dir` that does not exist yet (what opening
/// it would create), if any.
fn first_missing_ancestor(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut missing = None;
    for a in dir.ancestors() {
        if a.as_os_str().is_empty() || a.exists() {
            break;
        }
        missing = Some(a.to_path_buf());
    }
    missing
}

/// Serves one accepted connection to its end, on the thread it was given to.
async fn serve_connection(
    open: OpenConnection,
    stream: TcpStream,
    peer: SocketAddr,
    id: u64,
    shutdown: Shutdown,
) {
    let ctx = Arc::clone(&open.ctx);
    // Counted down even if the task is aborted.
    let _open = open;
    if let Err(e) = connection::serve(ctx, stream, peer, id, shutdown).await {
        tracing::debug!(%peer, error = %e, "connection ended");
    }
}

/// The runtime of connection thread `index`: single-threaded, and member
/// `index` of `turns` if any, so that the log's sync waits for the pass of
/// its event loop under way (a pass begins when the thread wakes with work
/// and ends when it is about to sleep).
pub fn connection_runtime(turns: Option<&Arc<Turns>>, index: usize) -> std::io::Result<Runtime> {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    if let Some(member) = turns.and_then(|t| t.member(index)) {
        let ends = member.clone();
        builder
            .on_thread_unpark(move || member.begin())
            .on_thread_park(move || ends.end());
    }
    builder.build()
}

/// A connection on its way to the thread that serves it.
struct HandOver {
    open: OpenConnection,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    id: u64,
}

/// A thread that serves connections: a single-threaded runtime of its own,
/// so that a connection's task, its reads and writes and the wake-ups of
/// its durable answers all stay on one thread (no task is stolen by
/// another thread, no wake-up crosses threads but the sync thread's). The
/// accept loop hands connections over round robin.
struct Worker {
    handoff: tokio::sync::mpsc::UnboundedSender<HandOver>,
    thread: std::thread::JoinHandle<()>,
}

impl Worker {
    /// The threads that serve connections besides the caller's (the first
    /// of `config.threads`).
    fn start_all(config: &ServeConfig, shutdown: &Shutdown) -> Result<Vec<Worker>, String> {
        (1..config.threads.max(1))
            .map(|i| {
                Worker::start(
                    i,
                    config.turns.as_ref(),
                    shutdown.clone(),
                    config.shutdown_grace,
                )
            })
            .collect()
    }

    fn start(
        index: usize,
        turns: Option<&Arc<Turns>>,
        shutdown: Shutdown,
        grace: std::time::Duration,
    ) -> Result<Worker, String> {
        let runtime = connection_runtime(turns, index)
            .map_err(|e| format!("cannot start the runtime of thread {index}: {e}"))?;
        let (handoff, arrivals) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name(format!("fencelog-conn-{index}"))
            .spawn(move || runtime.block_on(Worker::run(arrivals, shutdown, grace)))
            .map_err(|e| format!("cannot start thread {index}: {e}"))?;
        Ok(Worker { handoff, thread })
    }

    /// Gives a connection to this thread. Should the thread be gone (it
    /// never ends before shutdown), the connection is closed.
    fn hand_over(&self, open: OpenConnection, stream: TcpStream, peer: SocketAddr, id: u64) {
        // Out of this runtime's reactor; the thread registers it with its own.
        let Ok(stream) = stream.into_std() else {
            return;
        };
        let _ = self.handoff.send(HandOver {
            open,
            stream,
            peer,
            id,
        });
    }

    /// Serves what it is handed until shutdown, then gives its connections
    /// the same grace as the accept loop's thread gives its own.
    async fn run(
        mut arrivals: tokio::sync::mpsc::UnboundedReceiver<HandOver>,
        mut shutdown: Shutdown,
        grace: std::time::Duration,
    ) {
        // Durable answers wake this thread once per group commit.
        tokio::spawn(connection::relay::run());
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                arrived = arrivals.recv() => match arrived {
                    Some(h) => take_over(&mut connections, h, &shutdown),
                    None => break,
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                () = shutdown.recv() => break,
            }
        }
        // Connections handed over just before shutdown are served too
        // (they see the signal at once and close).
        arrivals.close();
        while let Some(h) = arrivals.recv().await {
            take_over(&mut connections, h, &shutdown);
        }
        drain(&mut connections, grace).await;
    }

    /// Waits until the thread has ended (its connections with it).
    async fn join(self) {
        let Worker { handoff, thread } = self;
        drop(handoff);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// A connection being served: counted in `connections_now` and holding its
/// permit until its task ends, however it ends.
struct OpenConnection {
    ctx: Arc<Context>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.ctx
            .stats
            .connections_now
            .fetch_sub(1, Ordering::Relaxed);
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
/// Each scrape is a task of its own, aborted and waited for at shutdown (a
/// scraper that connects and sends nothing must not hold the server).
async fn serve_metrics(ctx: Arc<Context>, listener: TcpListener, mut shutdown: Shutdown) {
    let mut scrapes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let ctx = Arc::clone(&ctx);
                    scrapes.spawn(async move {
                        let _ = metrics_request(&ctx, stream).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = scrapes.join_next(), if !scrapes.is_empty() => {}
            () = shutdown.recv() => break,
        }
    }
    drop(listener);
    scrapes.abort_all();
    while scrapes.join_next().await.is_some() {}
}

async fn metrics_request(ctx: &Context, mut stream: TcpStream) -> std::io::Result<()> {
    // A request line and headers, bounded: nothing else is read.
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    // Bytes before this were searched already: each read searches only what
    // it added (and 3 bytes before), not the whole buffer again.
    let mut searched = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !buf[searched..len].windows(4).any(|w| w == b"\r\n\r\n") {
        searched = len.saturating_sub(3);
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
    let mut words = line.split(|&b| b == b' ');
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    // The path without a query string (`/metrics?x=1` is still metrics).
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let (status, content_type, body) = match (method, path) {
        (b"GET" | b"HEAD", b"/metrics") => match crate::metrics::exposition(ctx) {
            Ok(text) => ("200 OK", crate::metrics::CONTENT_TYPE, text),
            Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
        },
        (b"GET" | b"HEAD", _) => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET or HEAD /metrics\n".to_string(),
        ),
    };
    let allow = if status.starts_with("405") {
        "allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{allow}connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    // HEAD: the same headers, no body.
    if method != b"HEAD" {
        stream.write_all(body.as_bytes()).await?;
    }
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

/// Serves a connection handed over to this thread.
fn take_over(connections: &mut JoinSet<()>, h: HandOver, shutdown: &Shutdown) {
    match TcpStream::from_std(h.stream) {
        Ok(stream) => {
            connections.spawn(serve_connection(
                h.open,
                stream,
                h.peer,
                h.id,
                shutdown.clone(),
            ));
        }
        Err(e) => tracing::warn!(error = %e, "cannot serve a connection"),
    }
}

/// Lets `connections` finish within `grace`, aborts those still busy, and
/// waits for every task, aborted or not: each holds the context.
async fn drain<T: 'static>(connections: &mut JoinSet<T>, grace: std::time::Duration) {
    if tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            ?grace,
            left = connections.len(),
            "connections still busy after the grace period; closing them"
        );
        connections.abort_all();
    }
    while connections.join_next().await.is_some() {}
}
