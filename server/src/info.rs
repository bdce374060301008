//! `INFO` and the Prometheus endpoint: the same counters, two formats.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::context::Context;

/// Whether a metric only grows, or goes up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (until a restart): a Prometheus `counter`, `_total`.
    Counter,
    /// Goes up and down: a Prometheus `gauge`.
    Gauge,
    /// Shown by `INFO` only (Prometheus computes it from others: a mean,
    /// a quantile of the latency histogram).
    InfoOnly,
}

/// One number, with its name in each format.
#[derive(Debug, Clone)]
pub struct Metric {
    /// Its `INFO` section.
    pub section: &'static str,
    /// Its `INFO` name (Redis' where Redis has one).
    pub info: &'static str,
    /// Its Prometheus name, by Prometheus' rules (`_total` for counters,
    /// units in base units); empty for [`Kind::InfoOnly`].
    pub prometheus: &'static str,
    /// What it counts.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Its value now.
    pub value: f64,
}

/// Every number, in one place for both formats.
pub fn metrics(ctx: &Context) -> Vec<Metric> {
    let m = ctx.engine().metrics();
    let parts: [fn(&Context, &fencelog::Metrics) -> Vec<Metric>; 11] = [
        server_clients,
        stats_1,
        stats_2,
        log_1,
        log_2,
        persistence_1,
        persistence_2,
        leases_1,
        leases_2,
        commit,
        replication,
    ];
    parts.iter().flat_map(|part| part(ctx, &m)).collect()
}

/// The numbers of `server` and `clients`.
fn server_clients(ctx: &Context, _m: &fencelog::Metrics) -> Vec<Metric> {
    let queued = ctx.store.queued().unwrap_or_default();
    let s = &ctx.stats;
    let uptime = ctx.stats.started.elapsed().as_secs_f64();
    vec![
        Metric {
            section: "server",
            info: "uptime_in_seconds",
            prometheus: "fencelog_uptime_seconds",
            help: "Seconds since the server started.",
            kind: Kind::Gauge,
            value: uptime.floor(),
        },
        Metric {
            section: "clients",
            info: "connected_clients",
            prometheus: "fencelog_connected_clients",
            help: "Client connections open now.",
            kind: Kind::Gauge,
            value: s.connections_now.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "clients",
            info: "blocked_clients",
            prometheus: "fencelog_blocked_clients",
            help: "Clients waiting in LOG.READ BLOCK or LEASE.ACQUIRE WAIT now.",
            kind: Kind::Gauge,
            value: s.blocked_clients.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "clients",
            info: "total_connections_received",
            prometheus: "fencelog_connections_received_total",
            help: "Client connections accepted.",
            kind: Kind::Counter,
            value: s.connections_total.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "clients",
            info: "rejected_connections",
            prometheus: "fencelog_connections_rejected_total",
            help: "Connections refused over the limit.",
            kind: Kind::Counter,
            value: s.connections_refused.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "clients",
            info: "mem_clients_normal",
            prometheus: "fencelog_client_memory_bytes",
            help: "Bytes all client connections hold: input, parsed arguments, queued transactions, pending and unwritten replies.",
            kind: Kind::Gauge,
            value: ctx.clients.total_bytes() as f64,
        },
        Metric {
            section: "clients",
            info: "maxmemory_clients",
            prometheus: "fencelog_client_memory_budget_bytes",
            help: "The budget over all clients (--maxmemory-clients), bytes.",
            kind: Kind::Gauge,
            value: ctx.clients.budget_bytes() as f64,
        },
        Metric {
            section: "clients",
            info: "cluster_queued_writes",
            prometheus: "fencelog_cluster_queued_writes",
            help: "Writes waiting in this leader's queue for a replicated entry (cluster mode).",
            kind: Kind::Gauge,
            value: queued.writes as f64,
        },
        Metric {
            section: "clients",
            info: "cluster_queued_bytes",
            prometheus: "fencelog_cluster_queued_bytes",
            help: "Bytes of the writes waiting in this leader's queue (cluster mode); each also \
                   counts in its client's memory while the client waits.",
            kind: Kind::Gauge,
            value: queued.bytes as f64,
        },
    ]
}

/// The numbers of `stats` (part 1 of 2).
fn stats_1(ctx: &Context, _m: &fencelog::Metrics) -> Vec<Metric> {
    let s = &ctx.stats;
    vec![
        Metric {
            section: "stats",
            info: "evicted_clients",
            prometheus: "fencelog_clients_evicted_total",
            help: "Clients dropped because all clients together held more than --maxmemory-clients.",
            kind: Kind::Counter,
            value: ctx.clients.evicted_clients() as f64,
        },
        Metric {
            section: "stats",
            info: "client_query_buffer_limit_disconnections",
            prometheus: "fencelog_client_query_buffer_limit_disconnections_total",
            help: "Clients dropped past --max-query-buffer.",
            kind: Kind::Counter,
            value: s.query_buffer_limit_disconnections.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "stats",
            info: "client_output_buffer_limit_disconnections",
            prometheus: "fencelog_client_output_buffer_limit_disconnections_total",
            help: "Clients dropped past --client-output-buffer-limit.",
            kind: Kind::Counter,
            value: s.output_buffer_limit_disconnections.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "stats",
            info: "http_requests_refused",
            prometheus: "fencelog_http_requests_refused_total",
            help: "Connections closed for sending what looks like HTTP.",
            kind: Kind::Counter,
            value: s.http_requests_refused.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "stats",
            info: "transactions",
            prometheus: "fencelog_transactions_total",
            help: "EXECs with writes.",
            kind: Kind::Counter,
            value: s.transactions.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "stats",
            info: "transactions_aborted",
            prometheus: "fencelog_transactions_aborted_total",
            help: "EXECs whose writes were rejected: nothing applied.",
            kind: Kind::Counter,
            value: s.transactions_aborted.load(Ordering::Relaxed) as f64,
        },
        Metric {
            section: "stats",
            info: "total_commands_processed",
            prometheus: "fencelog_commands_processed_total",
            help: "Commands run.",
            kind: Kind::Counter,
            value: s.commands.get() as f64,
        },
    ]
}

/// The numbers of `stats` (part 2 of 2).
fn stats_2(ctx: &Context, _m: &fencelog::Metrics) -> Vec<Metric> {
    let s = &ctx.stats;
    vec![Metric {
        section: "stats",
        info: "total_net_input_bytes",
        prometheus: "fencelog_net_input_bytes_total",
        help: "Bytes received from clients.",
        kind: Kind::Counter,
        value: s.bytes_in.get() as f64,
    }]
}

/// The numbers of `log` (part 1 of 2).
fn log_1(_ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    vec![
        Metric {
            section: "log",
            info: "streams",
            prometheus: "fencelog_streams",
            help: "Streams that hold records or a token.",
            kind: Kind::Gauge,
            value: m.streams as f64,
        },
        Metric {
            section: "log",
            info: "appends",
            prometheus: "fencelog_appends_total",
            help: "Accepted appends.",
            kind: Kind::Counter,
            value: m.appends as f64,
        },
        Metric {
            section: "log",
            info: "records_written",
            prometheus: "fencelog_records_written_total",
            help: "Records appended.",
            kind: Kind::Counter,
            value: m.records as f64,
        },
        Metric {
            section: "log",
            info: "bytes_written",
            prometheus: "fencelog_payload_written_bytes_total",
            help: "Payload bytes appended.",
            kind: Kind::Counter,
            value: m.bytes as f64,
        },
        Metric {
            section: "log",
            info: "stale_rejections",
            prometheus: "fencelog_stale_rejections_total",
            help: "Writes rejected for a stale token.",
            kind: Kind::Counter,
            value: m.stale_rejections as f64,
        },
        Metric {
            section: "log",
            info: "mismatches",
            prometheus: "fencelog_mismatches_total",
            help: "Conditional appends rejected for their offset.",
            kind: Kind::Counter,
            value: m.mismatches as f64,
        },
        Metric {
            section: "log",
            info: "idempotent_retries",
            prometheus: "fencelog_idempotent_retries_total",
            help: "Conditional appends answered as a retry.",
            kind: Kind::Counter,
            value: m.idempotent_retries as f64,
        },
    ]
}

/// The numbers of `log` (part 2 of 2).
fn log_2(_ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    vec![
        Metric {
            section: "log",
            info: "fences",
            prometheus: "fencelog_fences_total",
            help: "Accepted fences.",
            kind: Kind::Counter,
            value: m.fences as f64,
        },
        Metric {
            section: "log",
            info: "trims",
            prometheus: "fencelog_trims_total",
            help: "Accepted trims.",
            kind: Kind::Counter,
            value: m.trims as f64,
        },
        Metric {
            section: "log",
            info: "deletes",
            prometheus: "fencelog_deletes_total",
            help: "Accepted deletes.",
            kind: Kind::Counter,
            value: m.deletes as f64,
        },
        Metric {
            section: "log",
            info: "reads",
            prometheus: "fencelog_reads_total",
            help: "Reads answered.",
            kind: Kind::Counter,
            value: m.reads as f64,
        },
        Metric {
            section: "log",
            info: "records_read",
            prometheus: "fencelog_records_read_total",
            help: "Records read.",
            kind: Kind::Counter,
            value: m.records_read as f64,
        },
    ]
}

/// The numbers of `persistence` (part 1 of 2).
fn persistence_1(_ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    let w = &m.wal;
    vec![
        Metric {
            section: "persistence",
            info: "segments",
            prometheus: "fencelog_segments",
            help: "Segment files in the log.",
            kind: Kind::Gauge,
            value: m.segments as f64,
        },
        Metric {
            section: "persistence",
            info: "open_segment_files",
            prometheus: "fencelog_open_segment_files",
            help: "Segment files open for reading now (within max_open_segments).",
            kind: Kind::Gauge,
            value: w.open_segment_files as f64,
        },
        Metric {
            section: "persistence",
            info: "last_checkpoint_bytes",
            prometheus: "fencelog_last_checkpoint_bytes",
            help: "Bytes of the last checkpoint written.",
            kind: Kind::Gauge,
            value: w.last_checkpoint_bytes as f64,
        },
        Metric {
            section: "persistence",
            info: "segments_uncounted",
            prometheus: "fencelog_segments_uncounted",
            help: "Segments older than the last open not yet looked at by garbage collection.",
            kind: Kind::Gauge,
            value: m.segments_uncounted as f64,
        },
        Metric {
            section: "persistence",
            info: "token_floor",
            prometheus: "fencelog_token_floor",
            help: "Every stream's highest token is at least this (raised only when salvage cut acknowledged entries).",
            kind: Kind::Gauge,
            value: m.token_floor as f64,
        },
        Metric {
            section: "persistence",
            info: "fsyncs",
            prometheus: "fencelog_fsyncs_total",
            help: "Group commits (write + fdatasync).",
            kind: Kind::Counter,
            value: w.syncs as f64,
        },
        Metric {
            section: "persistence",
            info: "fsync_latency_avg_us",
            prometheus: "",
            help: "Mean write + fdatasync latency, microseconds.",
            kind: Kind::InfoOnly,
            value: w.sync_micros.mean(),
        },
    ]
}

/// The numbers of `persistence` (part 2 of 2).
fn persistence_2(ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    let w = &m.wal;
    vec![
        Metric {
            section: "persistence",
            info: "fsync_latency_p99_us",
            prometheus: "",
            help: "99th percentile write + fdatasync latency (bucket upper bound), microseconds.",
            kind: Kind::InfoOnly,
            value: w.sync_micros.quantile_upper_bound(0.99) as f64,
        },
        Metric {
            section: "persistence",
            info: "group_commit_avg_batch",
            prometheus: "",
            help: "Mean entries per group commit.",
            kind: Kind::InfoOnly,
            value: w.batch_entries.mean(),
        },
        Metric {
            section: "persistence",
            info: "wal_entries",
            prometheus: "fencelog_wal_entries_total",
            help: "Entries made durable.",
            kind: Kind::Counter,
            value: w.entries as f64,
        },
        Metric {
            section: "persistence",
            info: "wal_bytes_written",
            prometheus: "fencelog_wal_written_bytes_total",
            help: "Bytes written to segments.",
            kind: Kind::Counter,
            value: w.bytes_written as f64,
        },
        Metric {
            section: "persistence",
            info: "segments_created",
            prometheus: "fencelog_segments_created_total",
            help: "Segment files created.",
            kind: Kind::Counter,
            value: w.segments_created as f64,
        },
        Metric {
            section: "persistence",
            info: "segments_removed",
            prometheus: "fencelog_segments_removed_total",
            help: "Segment files removed by garbage collection.",
            kind: Kind::Counter,
            value: w.segments_removed as f64,
        },
        Metric {
            section: "persistence",
            info: "footers_read",
            prometheus: "fencelog_footers_read_total",
            help: "Sealed segments' footers (their index) read from disk.",
            kind: Kind::Counter,
            value: w.footers_read as f64,
        },
        Metric {
            section: "persistence",
            info: "log_failed",
            prometheus: "fencelog_log_failed",
            help: "1 if an I/O failure stopped writes (until restart).",
            kind: Kind::Gauge,
            value: f64::from(u8::from(ctx.engine().has_failed())),
        },
    ]
}

/// The numbers of `leases` (part 1 of 2).
fn leases_1(_ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    vec![
        Metric {
            section: "leases",
            info: "leases_acquired",
            prometheus: "fencelog_leases_acquired_total",
            help: "Leases granted.",
            kind: Kind::Counter,
            value: m.leases_acquired as f64,
        },
        Metric {
            section: "leases",
            info: "leases_renewed",
            prometheus: "fencelog_leases_renewed_total",
            help: "Leases renewed.",
            kind: Kind::Counter,
            value: m.leases_renewed as f64,
        },
        Metric {
            section: "leases",
            info: "leases_lost",
            prometheus: "fencelog_leases_lost_total",
            help: "Renewals refused: the lease was lost.",
            kind: Kind::Counter,
            value: m.leases_lost as f64,
        },
        Metric {
            section: "leases",
            info: "leases_expired",
            prometheus: "fencelog_leases_expired_total",
            help: "Leases that expired.",
            kind: Kind::Counter,
            value: m.leases_expired as f64,
        },
        Metric {
            section: "leases",
            info: "leases_released",
            prometheus: "fencelog_leases_released_total",
            help: "Leases released.",
            kind: Kind::Counter,
            value: m.leases_released as f64,
        },
        Metric {
            section: "leases",
            info: "lease_acquisitions_refused",
            prometheus: "fencelog_lease_acquisitions_refused_total",
            help: "Acquisitions refused: the lease was held by another owner.",
            kind: Kind::Counter,
            value: m.leases_held as f64,
        },
        Metric {
            section: "leases",
            info: "leases_waiting",
            prometheus: "fencelog_lease_acquisitions_waiting",
            help: "Acquisitions waiting now.",
            kind: Kind::Gauge,
            value: m.lease_waiting as f64,
        },
    ]
}

/// The numbers of `leases` (part 2 of 2).
fn leases_2(_ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    vec![
        Metric {
            section: "leases",
            info: "leases_held",
            prometheus: "fencelog_leases_held",
            help: "Leases held now (acquired, neither released nor expired).",
            kind: Kind::Gauge,
            value: m.leases_live as f64,
        },
        Metric {
            section: "leases",
            info: "last_lease_token",
            prometheus: "fencelog_lease_token_last",
            help: "The last fencing token the lease counter issued.",
            kind: Kind::Gauge,
            value: m.last_lease_token as f64,
        },
    ]
}

/// The numbers of `commit`.
fn commit(_ctx: &Context, m: &fencelog::Metrics) -> Vec<Metric> {
    let w = &m.wal;
    vec![
        // Group commit as a client sees it. Last: the histogram line of
        // `INFO commit` follows these.
        Metric {
            section: "commit",
            info: "commit_records_per_sync",
            prometheus: "",
            help: "Mean entries made durable per group commit (write + fdatasync).",
            kind: Kind::InfoOnly,
            value: w.batch_entries.mean(),
        },
        Metric {
            section: "commit",
            info: "sync_thread_idle_seconds",
            prometheus: "fencelog_sync_thread_idle_seconds_total",
            help: "Time the log's sync thread waited for work; the rest it wrote, synced and \
               woke waiters.",
            kind: Kind::Counter,
            value: w.sync_idle_micros as f64 / 1e6,
        },
        Metric {
            section: "commit",
            info: "sync_pass_waits",
            prometheus: "fencelog_sync_pass_waits_total",
            help: "Times the sync thread, with entries pending, let the connection threads' \
               passes under way end before it synced (so that one sync covers a pass).",
            kind: Kind::Counter,
            value: w.pass_waits as f64,
        },
        Metric {
            section: "commit",
            info: "sync_pass_wait_seconds",
            prometheus: "fencelog_sync_pass_wait_seconds_total",
            help: "Time the sync thread spent in those waits.",
            kind: Kind::Counter,
            value: w.pass_wait_micros as f64 / 1e6,
        },
        Metric {
            section: "commit",
            info: "sync_comeback_waits",
            prometheus: "fencelog_sync_comeback_waits_total",
            help: "Times the sync thread, before a sync, waited for the writers of the sync \
               before it to come back with their next writes (so that one sync covers them).",
            kind: Kind::Counter,
            value: w.comeback_waits as f64,
        },
        Metric {
            section: "commit",
            info: "sync_comeback_ran_out",
            prometheus: "fencelog_sync_comeback_ran_out_total",
            help: "Those waits that ran out before enough writers came back.",
            kind: Kind::Counter,
            value: w.comeback_ran_out as f64,
        },
        Metric {
            section: "commit",
            info: "sync_comeback_wait_seconds",
            prometheus: "fencelog_sync_comeback_wait_seconds_total",
            help: "Time the sync thread spent in those waits.",
            kind: Kind::Counter,
            value: w.comeback_wait_micros as f64 / 1e6,
        },
        Metric {
            section: "commit",
            info: "log_writebacks_started",
            prometheus: "fencelog_log_writebacks_started_total",
            help: "A log without a sync per batch (a cluster replica's engine log): times its \
               written bytes were handed to the disk ahead of a sync, so that a seal's sync \
               finds little left to write.",
            kind: Kind::Counter,
            value: w.writebacks_started as f64,
        },
        Metric {
            section: "commit",
            info: "log_writebacks_failed",
            prometheus: "fencelog_log_writebacks_failed_total",
            help: "Times the kernel refused such a hand-over (nothing is lost: the next sync \
               writes the bytes).",
            kind: Kind::Counter,
            value: w.writebacks_failed as f64,
        },
        Metric {
            section: "commit",
            info: "log_direct_writes",
            prometheus: "fencelog_log_direct_writes_total",
            help: "Batches the log wrote around the page cache (O_DIRECT); none while batches \
               are synced means the file system refused direct I/O (or --no-direct-io).",
            kind: Kind::Counter,
            value: w.direct_writes as f64,
        },
        Metric {
            section: "commit",
            info: "commit_latency_p50_us",
            prometheus: "",
            help: "Median commit latency of a durable entry (bucket upper bound), microseconds.",
            kind: Kind::InfoOnly,
            value: w.commit_micros.quantile_upper_bound(0.5) as f64,
        },
        Metric {
            section: "commit",
            info: "commit_latency_p99_us",
            prometheus: "",
            help: "99th percentile commit latency of a durable entry (bucket upper bound), \
               microseconds.",
            kind: Kind::InfoOnly,
            value: w.commit_micros.quantile_upper_bound(0.99) as f64,
        },
    ]
}

/// `INFO commit`'s histogram line: entries per commit latency bucket,
/// `commit_latency_us_le:<upper bound>=<entries>,…` (non-empty buckets
/// only), so a client can diff two readings (`fencelog bench` does).
fn commit_histogram_line(h: &fencelog_wal::HistogramSnapshot) -> String {
    let mut line = String::from("commit_latency_us_le:");
    let mut first = true;
    let mut previous = 0;
    for (upper, cumulative) in h.cumulative() {
        let n = cumulative - previous;
        previous = cumulative;
        if n == 0 {
            continue;
        }
        if !first {
            line.push(',');
        }
        first = false;
        let _ = write!(line, "{upper}={n}");
    }
    line.push_str("\r\n");
    line
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.2}")
    }
}

/// The numbers of `replication` (cluster mode only): where a replicated
/// write's time went on this node, each step a count and a total (a
/// dashboard divides the differences of two readings) and, for `INFO`,
/// the mean since the node started.
fn replication(ctx: &Context, _m: &fencelog::Metrics) -> Vec<Metric> {
    /// A step's names: `INFO`'s count, seconds and mean, Prometheus' count
    /// and seconds.
    type Names = [&'static str; 5];
    let Some(t) = ctx.store.timings() else {
        return Vec::new();
    };
    let steps: [(Names, &'static str, fencelog_cluster::Timed); 4] = [
        (
            [
                "raft_entry_rounds",
                "raft_entry_round_seconds",
                "raft_entry_round_mean_us",
                "fencelog_raft_entry_rounds_total",
                "fencelog_raft_entry_round_seconds_total",
            ],
            "Entries this node proposed as the leader, timed from proposal to answer \
             (replicated to a quorum, committed, applied): how many, and their seconds.",
            t.entry_rounds,
        ),
        (
            [
                "raft_replications",
                "raft_replication_seconds",
                "raft_replication_mean_us",
                "fencelog_raft_replications_total",
                "fencelog_raft_replication_seconds_total",
            ],
            "AppendEntries with entries this node sent as the leader, timed from send to a \
             follower's answer (network both ways, the follower's append and sync): how \
             many, and their seconds.",
            t.replications,
        ),
        (
            [
                "raft_log_syncs",
                "raft_log_sync_seconds",
                "raft_log_sync_mean_us",
                "fencelog_raft_log_syncs_total",
                "fencelog_raft_log_sync_seconds_total",
            ],
            "Appends to this node's Raft log, timed until durable: how many, and their seconds.",
            t.log_syncs,
        ),
        (
            [
                "raft_applies",
                "raft_apply_seconds",
                "raft_apply_mean_us",
                "fencelog_raft_applies_total",
                "fencelog_raft_apply_seconds_total",
            ],
            "Applies of committed entries to this node's engine (one per batch of entries), \
             timed: how many, and their seconds.",
            t.applies,
        ),
    ];
    let mut out = Vec::with_capacity(steps.len() * 3);
    for ([count, seconds, mean, count_total, seconds_total], help, timed) in steps {
        let metric = |info, prometheus, kind, value| Metric {
            section: "replication",
            info,
            prometheus,
            help,
            kind,
            value,
        };
        out.push(metric(
            count,
            count_total,
            Kind::Counter,
            timed.count as f64,
        ));
        out.push(metric(
            seconds,
            seconds_total,
            Kind::Counter,
            timed.micros as f64 / 1e6,
        ));
        out.push(metric(
            mean,
            "",
            Kind::InfoOnly,
            timed.mean_micros().unwrap_or(0) as f64,
        ));
    }
    out
}

/// The `INFO [section ...]` text: `# Section` headers and `name:value`
/// lines, as Redis writes them (no sections: the default set).
pub fn info_text(ctx: &Context, sections: &[String]) -> String {
    let wanted = |s: &str| {
        sections.is_empty()
            || sections
                .iter()
                .any(|x| matches!(x.as_str(), "all" | "everything" | "default") || x == s)
    };
    let mut out = String::new();
    let all = metrics(ctx);
    if wanted("server") {
        header(&mut out, "Server");
        server_lines(ctx, &mut out);
    }
    metric_lines(&all, &wanted, &mut out);
    if wanted("commit") {
        out.push_str(&commit_histogram_line(
            &ctx.engine().metrics().wal.commit_micros,
        ));
    }
    if wanted("memory") {
        // What redis-cli --stat and dashboards read; the resident set size
        // is what this process holds (the engine maps segments besides).
        header(&mut out, "Memory");
        let rss = resident_bytes().unwrap_or(0);
        let _ = write!(
            out,
            "used_memory:{rss}\r\nused_memory_rss:{rss}\r\nmaxmemory:0\r\n"
        );
        // Cluster mode: the writes waiting in this leader's queue for an
        // entry (counted in their clients' memory, `mem_clients_normal`, while they wait;
        // the queue's own bound is the same budget).
        if let Some(q) = ctx.store.queued() {
            let _ = write!(
                out,
                "mem_cluster_queue:{}\r\nmem_cluster_queue_writes:{}\r\n\
                 mem_cluster_queue_max:{}\r\n",
                q.bytes, q.writes, q.max_bytes
            );
        }
    }
    if wanted("keyspace") {
        // One database whose keys are the streams (redis-cli --stat sums
        // the keys of every db line).
        header(&mut out, "Keyspace");
        let streams = all
            .iter()
            .find(|m| m.info == "streams")
            .map_or(0.0, |m| m.value);
        let _ = write!(out, "db0:keys={},expires=0,avg_ttl=0\r\n", number(streams));
    }
    out
}

/// A `# Title` line, after a blank line unless it is the first.
fn header(out: &mut String, title: &str) {
    if !out.is_empty() {
        out.push_str("\r\n");
    }
    let _ = write!(out, "# {title}\r\n");
}

/// The server section's lines that are not numbers.
fn server_lines(ctx: &Context, out: &mut String) {
    let _ = write!(
        out,
        "fencelog_version:{}\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\nos:{} {}\r\n\
         process_id:{}\r\ntcp_port:{}\r\nexecutable:{}\r\ndir:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
        std::process::id(),
        ctx.config.addr.port(),
        std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        ctx.config.dir.display()
    );
}

/// The numbers of the sections wanted, each section under its header.
fn metric_lines(all: &[Metric], wanted: &dyn Fn(&str) -> bool, out: &mut String) {
    let mut current = "";
    for metric in all {
        if !wanted(metric.section) {
            continue;
        }
        if metric.section != current {
            // The server section's header is written above, with the
            // lines that are not numbers.
            if metric.section != "server" {
                let mut title = metric.section.to_string();
                if let Some(first) = title.get_mut(..1) {
                    first.make_ascii_uppercase();
                }
                header(out, &title);
            }
            current = metric.section;
        }
        let _ = write!(out, "{}:{}\r\n", metric.info, number(metric.value));
    }
}

/// This process' resident memory in bytes (`VmRSS`), where `/proc` has it.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
