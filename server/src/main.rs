//! `fencelog`: the server and its tools.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelog_cluster::{Member, NodeId};
use fencelog_server::cluster::{ClusterConfig, parse_members, read_secret_file};
use fencelog_server::config::{ServeConfig, parse_addr, parse_addr_with_port, parse_size};
use fencelog_server::dump::{self, DumpOptions};
use fencelog_server::logging::LogOptions;
use fencelog_server::protocol::Limits;
use fencelog_server::server::Server;
use fencelog_server::verify::{self, VerifyOptions};

/// A fenced append-only storage engine, served over the Redis protocol.
#[derive(Parser)]
#[command(name = "fencelog", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogOptions,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a data directory over the Redis protocol (RESP2 and RESP3).
    ///
    /// A flag given twice takes its last value (a wrapper script's
    /// defaults can be overridden).
    #[command(args_override_self = true)]
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
    Bench(fencelog_bench::BenchArgs),
    /// Cut a damaged log back to its valid prefix (salvage): show what will
    /// be cut, ask (or --yes), keep the cut bytes in `*.damaged` files,
    /// raise the token floor, then verify.
    ///
    /// Exit status: 0 when the log verifies clean afterwards (or nothing
    /// needed cutting), 1 when it does not, 2 when nothing was done (refused,
    /// declined, the directory in use or unreadable).
    Repair(fencelog_server::repair::RepairArgs),
    /// Cluster mode: run a local cluster, see a cluster's members and lag,
    /// add or remove a node.
    Cluster(fencelog_server::cluster::cli::ClusterArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// The data directory (created if missing; locked while served).
    #[arg(long, default_value = "./fencelog-data")]
    dir: PathBuf,
    /// Where clients connect: HOST:PORT, HOST, or a PORT alone (on
    /// 127.0.0.1). Names resolve (localhost:7379).
    #[arg(long, default_value = "127.0.0.1:7379", value_name = "ADDR",
          value_parser = parse_addr)]
    addr: SocketAddr,
    /// The port clients connect to, on the host of --addr.
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,
    /// A password every client must give (AUTH, or HELLO … AUTH).
    #[arg(long, env = "FENCELOG_REQUIREPASS", hide_env_values = true)]
    requirepass: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics: HOST:PORT, or a
    /// PORT alone (on 127.0.0.1).
    #[arg(long, value_name = "ADDR", value_parser = metrics_addr)]
    metrics_addr: Option<SocketAddr>,
    /// Serve a non-loopback address without a password. Deliberate only.
    #[arg(long)]
    allow_unauthenticated_remote: bool,
    /// Largest record payload; larger ones get TOOBIG (the connection stays
    /// usable). Sizes take units: 4096, 64KiB, 1MiB, 1MB. [default: 1MiB,
    /// or less when --segment-bytes is small: a record must fit half a
    /// segment]
    #[arg(long, value_name = "SIZE", value_parser = size_u32)]
    max_payload: Option<u32>,
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
    /// Threads serving connections: each runs its own connections start to
    /// end (no task moves between threads). Default: one per CPU.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Segment file size (64KiB to 1GiB).
    #[arg(long, default_value = "64MiB", value_name = "SIZE", value_parser = size_u64)]
    segment_bytes: u64,
    /// How a new segment file is made ready, ahead of need, by a background
    /// thread: `fill` writes zeros over it (every later sync only overwrites
    /// data), `reserve` reserves its space with `fallocate` (no second write
    /// of every byte; a sync also journals the blocks it first writes),
    /// `none` grows the file as entries are written (a sync also journals
    /// the new size).
    #[arg(long, value_enum, default_value_t = Preallocate::Fill, value_name = "HOW")]
    preallocate: Preallocate,
    /// Write every batch of a log synced per batch (a single node's log, a
    /// cluster node's Raft log) through the page cache, as other writes
    /// are. By default such a log writes its batches with `O_DIRECT` into
    /// its filled segments (plain writes where the file system has no
    /// direct I/O, or with `--preallocate reserve|none`); see
    /// docs/DESIGN.md, "Batches written around the page cache".
    #[arg(long)]
    no_direct_io: bool,
    /// Segment files the log keeps open for reading at once (its file
    /// budget; reads of other segments open and close theirs). The open-file
    /// limit must leave room for these besides the connections.
    #[arg(long, default_value_t = 64, value_name = "FILES")]
    max_open_segments: usize,
    /// Leases alive at once; one more acquisition is refused (TOOBIG-like
    /// `ERR`, the coordinator keeps serving). In cluster mode the group's
    /// limit is set from the forming node's flags (see docs/CLUSTER.md).
    #[arg(long, default_value_t = 1_000_000, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    max_live_leases: u64,
    /// After a sync, the log syncs again once most of the writers it just
    /// answered wrote again (at most eight syncs' time later, 1 ms):
    /// clients that wait for each answer then share one sync instead of
    /// taking turns. This flag syncs at once instead: for writers that
    /// never wait for their answers, a bounded wait only adds latency
    /// (docs/DESIGN.md, "Waiting for the writers"). A cluster node's logs
    /// never wait this way (see --cluster-no-batch-wait).
    #[arg(long)]
    no_sync_wait: bool,
    /// Seconds shutdown gives connections to hand out their last answers
    /// (writes already decided are made durable either way).
    #[arg(long, default_value_t = 1)]
    shutdown_grace_secs: u64,
    #[command(flatten)]
    cluster: ClusterFlags,
}

/// Cluster mode: `fencelog serve --cluster-node-id N …` (see
/// docs/CLUSTER.md).
#[derive(Args)]
struct ClusterFlags {
    /// Run as node N of a replicated cluster (1 and up; the same across
    /// restarts). Without it the server is a single node.
    #[arg(long, value_name = "N", help_heading = "Cluster")]
    cluster_node_id: Option<u64>,
    /// Where this node listens for its peers (Raft): HOST:PORT, HOST, or a
    /// PORT. [default: the client port + 10000, on the host of --addr]
    #[arg(long, value_name = "ADDR", value_parser = parse_addr, help_heading = "Cluster")]
    cluster_raft_addr: Option<SocketAddr>,
    /// The client address this node is known by (in -MOVED and CLUSTER
    /// SLOTS), as HOST:PORT. [default: --addr]
    #[arg(long, value_name = "HOST:PORT", help_heading = "Cluster")]
    cluster_advertise: Option<String>,
    /// The Raft address peers are told, as HOST:PORT. [default:
    /// --cluster-raft-addr]
    #[arg(long, value_name = "HOST:PORT", help_heading = "Cluster")]
    cluster_advertise_raft: Option<String>,
    /// The first members, to form a new cluster:
    /// ID=RAFT_ADDR/CLIENT_ADDR,… (every node gets the same list; the
    /// lowest id forms the cluster on its first start). Ignored once a
    /// node has state.
    #[arg(long, value_name = "MEMBERS", help_heading = "Cluster")]
    cluster_initial: Option<String>,
    /// Join a running cluster through a member's client address (a node
    /// with no state of its own; also a replica whose disk was wiped).
    #[arg(long, value_name = "HOST:PORT", help_heading = "Cluster")]
    cluster_join: Option<String>,
    /// Milliseconds without a leader before an election (each node draws
    /// once between this and 1.5 times it, after the old leader's lease of
    /// 1.5 times it); heartbeats every half of it.
    #[arg(
        long,
        default_value_t = 300,
        value_name = "MS",
        help_heading = "Cluster"
    )]
    cluster_election_timeout_ms: u64,
    /// A file holding the secret every member shares (1 to 4096 bytes; one
    /// trailing newline is ignored): peers prove it to each other before
    /// any Raft message is read. Required unless the Raft address is
    /// loopback. Make one with `head -c 32 /dev/urandom | base64 > FILE`.
    #[arg(long, value_name = "PATH", help_heading = "Cluster")]
    cluster_secret_file: Option<PathBuf>,
    /// Snapshot the state machine after this many entries (the Raft log
    /// behind a snapshot is removed; a lagging node catches up from it).
    #[arg(
        long,
        default_value_t = 50_000,
        value_name = "ENTRIES",
        help_heading = "Cluster"
    )]
    cluster_snapshot_every: u64,
    /// Snapshot also once the node's Raft log has written this much since
    /// the last snapshot asked for by size (0: by entries only): entries
    /// hold one write or thousands, so this is what bounds the log on
    /// disk. A snapshot links the engine's files; it copies no record.
    #[arg(
        long,
        default_value = "256MiB",
        value_name = "SIZE",
        value_parser = size_u64,
        help_heading = "Cluster"
    )]
    cluster_snapshot_every_bytes: u64,
    /// Entries the leader keeps proposed and not yet answered, at most
    /// (1 to 8): writes that arrive meanwhile go out together in the next
    /// entry. One costs the least CPU per write (each entry costs every
    /// node a sync and a round of messages); more hide more of the
    /// network's round trip (docs/CLUSTER.md, "Entries in flight").
    #[arg(
        long,
        default_value_t = fencelog_cluster::DEFAULT_ENTRIES_IN_FLIGHT as u8,
        value_name = "N",
        value_parser = clap::value_parser!(u8).range(1..=fencelog_cluster::MAX_ENTRIES_IN_FLIGHT as i64),
        help_heading = "Cluster"
    )]
    cluster_entries_in_flight: u8,
    /// With one entry in flight, the leader proposes the next entry once
    /// most of the writers it just answered wrote again (at most two
    /// rounds later, 2 ms): clients that wait for each answer then share
    /// one entry instead of taking turns. This flag proposes at once
    /// instead: for writers that never wait for their answers, a bounded
    /// wait only adds latency (docs/CLUSTER.md, "Waiting for the writers").
    #[arg(long, help_heading = "Cluster")]
    cluster_no_batch_wait: bool,
}

impl ClusterFlags {
    /// The cluster configuration, if cluster mode is asked for.
    fn config(
        &self,
        addr: SocketAddr,
        requirepass: Option<&str>,
    ) -> Result<Option<ClusterConfig>, String> {
        let Some(node_id) = self.cluster_node_id else {
            if self.cluster_initial.is_some()
                || self.cluster_join.is_some()
                || self.cluster_secret_file.is_some()
            {
                return Err(
                    "--cluster-initial, --cluster-join and --cluster-secret-file need \
                     --cluster-node-id"
                        .into(),
                );
            }
            return Ok(None);
        };
        if node_id == 0 {
            return Err("--cluster-node-id must be 1 or more".into());
        }
        if self.cluster_election_timeout_ms < 50 {
            return Err(format!(
                "--cluster-election-timeout-ms {} is below 50",
                self.cluster_election_timeout_ms
            ));
        }
        let raft_addr = self.raft_addr(addr)?;
        let member = Member {
            raft_addr: self
                .cluster_advertise_raft
                .clone()
                .unwrap_or_else(|| raft_addr.to_string()),
            client_addr: self
                .cluster_advertise
                .clone()
                .unwrap_or_else(|| addr.to_string()),
            // Its data directory's: the group learns it when it admits
            // this node (forming, CLUSTER ADDNODE).
            incarnation: 0,
        };
        let initial = self.initial_members(node_id)?;
        Ok(Some(ClusterConfig {
            node_id,
            raft_addr,
            member,
            initial,
            join: self.cluster_join.clone(),
            election_timeout: Duration::from_millis(self.cluster_election_timeout_ms),
            snapshot_every: self.cluster_snapshot_every.max(1),
            snapshot_every_bytes: self.cluster_snapshot_every_bytes,
            entries_in_flight: usize::from(self.cluster_entries_in_flight),
            batch_wait: !self.cluster_no_batch_wait,
            raft_segment_bytes: 64 << 20,
            secret: self
                .cluster_secret_file
                .as_deref()
                .map(read_secret_file)
                .transpose()?,
            join_password: requirepass.map(str::to_string),
        }))
    }

    /// The Raft address: --cluster-raft-addr, or the client port + 10000.
    fn raft_addr(&self, addr: SocketAddr) -> Result<SocketAddr, String> {
        match self.cluster_raft_addr {
            Some(a) => Ok(a),
            None => {
                let port = addr.port().checked_add(10_000).ok_or_else(|| {
                    format!(
                        "--addr port {} leaves no room for the default Raft port (+10000): \
                         set --cluster-raft-addr",
                        addr.port()
                    )
                })?;
                Ok(SocketAddr::new(addr.ip(), port))
            }
        }
    }

    /// The members of --cluster-initial (empty without it), checked
    /// against this node and --cluster-join.
    fn initial_members(&self, node_id: NodeId) -> Result<BTreeMap<NodeId, Member>, String> {
        let initial = match &self.cluster_initial {
            Some(text) => parse_members(text).map_err(|e| format!("--cluster-initial: {e}"))?,
            None => Default::default(),
        };
        if !initial.is_empty() && !initial.contains_key(&node_id) {
            return Err(format!(
                "--cluster-initial does not list this node (--cluster-node-id {node_id})"
            ));
        }
        if !initial.is_empty() && self.cluster_join.is_some() {
            return Err("--cluster-initial and --cluster-join exclude each other".into());
        }
        Ok(initial)
    }
}

/// The metrics endpoint's port when --metrics-addr names only a host.
const DEFAULT_METRICS_PORT: u16 = 9379;

fn metrics_addr(text: &str) -> Result<SocketAddr, String> {
    parse_addr_with_port(text, DEFAULT_METRICS_PORT)
}

/// Longest a sync waits for the connection threads' passes to end
/// (`fencelog_wal::Turns`): a pass over many busy connections, not a
/// timer anyone should wait on.
const PASS_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// `--preallocate`: how a new segment file is made ready
/// ([`fencelog::wal::Preallocation`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Preallocate {
    /// Zeros written over the whole file.
    Fill,
    /// Space reserved with `fallocate`.
    Reserve,
    /// The file grows as entries are written.
    None,
}

impl Preallocate {
    /// The flag's value, as `CONFIG GET` shows it.
    fn name(self) -> &'static str {
        match self {
            Preallocate::Fill => "fill",
            Preallocate::Reserve => "reserve",
            Preallocate::None => "none",
        }
    }
}

impl From<Preallocate> for fencelog::wal::Preallocation {
    fn from(p: Preallocate) -> Self {
        match p {
            Preallocate::Fill => fencelog::wal::Preallocation::Fill,
            Preallocate::Reserve => fencelog::wal::Preallocation::Reserve,
            Preallocate::None => fencelog::wal::Preallocation::None,
        }
    }
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
    /// The configuration these flags describe; an error names the flags.
    fn config(self) -> Result<ServeConfig, String> {
        let mut addr = self.addr;
        if let Some(port) = self.port {
            addr.set_port(port);
        }
        let (max_payload, max_entry) = self.entry_sizes()?;
        let mut engine = fencelog::Options {
            max_payload_bytes: max_payload,
            max_live_leases: self.max_live_leases,
            wal: fencelog::WalOptions {
                segment_bytes: self.segment_bytes,
                max_entry_bytes: u32::try_from(max_entry).unwrap_or(u32::MAX),
                max_open_segments: self.max_open_segments,
                preallocation: self.preallocate.into(),
                direct_io: !self.no_direct_io,
                wait_for_writers: !self.no_sync_wait,
                ..fencelog::WalOptions::default()
            },
            ..fencelog::Options::default()
        };
        let cluster = self.cluster.config(addr, self.requirepass.as_deref())?;
        let threads = self.threads.map_or_else(
            || std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            |n| n as usize,
        );
        // A replica's log is made durable by Raft's, not per batch: no sync
        // waits for passes there.
        let turns = cluster
            .is_none()
            .then(|| fencelog::wal::Turns::new(threads, PASS_WAIT));
        engine.wal.turns = turns.clone();
        let flags = self.flags_shown(addr, max_payload, threads, cluster.as_ref());
        Ok(ServeConfig {
            dir: self.dir,
            addr,
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
            threads,
            turns,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            flags,
            cluster,
        })
    }

    /// The largest payload and entry: an entry holds one request's
    /// payloads, as large as a request may be, and at most half a segment
    /// (so a segment holds two).
    fn entry_sizes(&self) -> Result<(u32, usize), String> {
        let half_segment = usize::try_from(self.segment_bytes / 2).unwrap_or(usize::MAX);
        // A record needs its payload plus the entry's name and headers.
        const RECORD_OVERHEAD: usize = 4096;
        let fits = half_segment.saturating_sub(RECORD_OVERHEAD);
        let max_payload = match self.max_payload {
            Some(p) if p as usize > fits => {
                return Err(format!(
                    "--max-payload ({p} bytes) does not fit --segment-bytes ({} bytes): a record \
                     must fit half a segment with 4 KiB to spare. Lower --max-payload to at most \
                     {fits} or raise --segment-bytes to at least {}",
                    self.segment_bytes,
                    (u64::from(p) + RECORD_OVERHEAD as u64) * 2
                ));
            }
            Some(p) => p,
            // The default, 1 MiB, shrinks to what a small segment holds.
            None => u32::try_from(fits.min(1 << 20)).unwrap_or(1 << 20),
        };
        // --max-bulk-bytes left at its default follows a smaller segment.
        let max_entry =
            (self.max_bulk_bytes.max(max_payload as usize) + RECORD_OVERHEAD).min(half_segment);
        Ok((max_payload, max_entry))
    }

    /// The flags as `CONFIG GET` and the startup log show them.
    fn flags_shown(
        &self,
        addr: SocketAddr,
        max_payload: u32,
        threads: usize,
        cluster: Option<&ClusterConfig>,
    ) -> Vec<(String, String)> {
        let mut flags: Vec<(String, String)> = vec![
            ("dir".into(), self.dir.display().to_string()),
            ("addr".into(), addr.to_string()),
            ("port".into(), addr.port().to_string()),
            (
                "metrics-addr".into(),
                self.metrics_addr.map(|a| a.to_string()).unwrap_or_default(),
            ),
            (
                "allow-unauthenticated-remote".into(),
                yes_no(self.allow_unauthenticated_remote),
            ),
            ("max-payload".into(), max_payload.to_string()),
            ("max-bulk-bytes".into(), self.max_bulk_bytes.to_string()),
            ("max-args".into(), self.max_args.to_string()),
            ("max-inline-bytes".into(), self.max_inline_bytes.to_string()),
            ("max-query-buffer".into(), self.max_query_buffer.to_string()),
            ("max-read-bytes".into(), self.max_read_bytes.to_string()),
            ("max-pipeline".into(), self.max_pipeline.to_string()),
            ("max-connections".into(), self.max_connections.to_string()),
            ("threads".into(), threads.to_string()),
            ("segment-bytes".into(), self.segment_bytes.to_string()),
            ("preallocate".into(), self.preallocate.name().into()),
            ("no-direct-io".into(), yes_no(self.no_direct_io)),
            ("max-live-leases".into(), self.max_live_leases.to_string()),
            (
                "max-open-segments".into(),
                self.max_open_segments.to_string(),
            ),
            ("no-sync-wait".into(), yes_no(self.no_sync_wait)),
            (
                "shutdown-grace-secs".into(),
                self.shutdown_grace_secs.to_string(),
            ),
        ];
        if let Some(c) = cluster {
            flags.extend([
                ("cluster-node-id".into(), c.node_id.to_string()),
                ("cluster-raft-addr".into(), c.raft_addr.to_string()),
                ("cluster-advertise".into(), c.member.client_addr.clone()),
                ("cluster-advertise-raft".into(), c.member.raft_addr.clone()),
                (
                    "cluster-election-timeout-ms".into(),
                    c.election_timeout.as_millis().to_string(),
                ),
                (
                    "cluster-snapshot-every".into(),
                    c.snapshot_every.to_string(),
                ),
                (
                    "cluster-snapshot-every-bytes".into(),
                    c.snapshot_every_bytes.to_string(),
                ),
                (
                    "cluster-entries-in-flight".into(),
                    c.entries_in_flight.to_string(),
                ),
                ("cluster-batch-wait".into(), yes_no(c.batch_wait)),
                // The file's path, never the secret.
                (
                    "cluster-secret-file".into(),
                    self.cluster
                        .cluster_secret_file
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                ),
            ]);
        }
        flags
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
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
    if let Err(e) = fencelog_server::logging::init(&cli.log) {
        eprintln!("fencelog: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Serve(args) => match args.config() {
            Ok(config) => serve(config),
            Err(e) => {
                eprintln!("fencelog serve: {e}");
                ExitCode::from(2)
            }
        },
        Command::Repair(args) => fencelog_server::repair::run(&args),
        Command::Verify(args) => verify::run(&args.dir, &args.options()),
        Command::Dump(args) => dump::run(&args.dir, &args.options()),
        Command::Bench(args) => fencelog_bench::run(args),
        Command::Cluster(args) => fencelog_server::cluster::cli::run(args),
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
    // This thread accepts, and serves connections as the first of
    // `--threads` single-threaded runtimes (server.rs, `Worker`).
    let runtime = match fencelog_server::server::connection_runtime(config.turns.as_ref(), 0) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelog: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        // Durable answers wake this thread once per group commit.
        tokio::spawn(fencelog_server::connection::relay::run());
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
