//! `INFO` and the Prometheus endpoint: the same counters, two formats.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use crate::commands::Context;

/// Every counter as (section, name, help, value), in one place for both
/// formats.
fn counters(ctx: &Context) -> Vec<(&'static str, &'static str, &'static str, f64)> {
    let m = ctx.log.metrics();
    let s = &ctx.stats;
    let w = &m.wal;
    let uptime = s.started.elapsed().as_secs_f64();
    vec![
        (
            "server",
            "uptime_in_seconds",
            "Seconds since the server started.",
            uptime.floor(),
        ),
        (
            "clients",
            "connected_clients",
            "Client connections open now.",
            s.connections_now.load(Ordering::Relaxed) as f64,
        ),
        (
            "clients",
            "total_connections_received",
            "Client connections accepted.",
            s.connections_total.load(Ordering::Relaxed) as f64,
        ),
        (
            "clients",
            "rejected_connections",
            "Connections refused over the limit.",
            s.connections_refused.load(Ordering::Relaxed) as f64,
        ),
        (
            "clients",
            "mem_clients_normal",
            "Bytes all client connections hold: input, parsed arguments, queued transactions, pending and unwritten replies.",
            ctx.clients.total_bytes() as f64,
        ),
        (
            "clients",
            "maxmemory_clients",
            "The budget over all clients (--maxmemory-clients), bytes.",
            ctx.clients.budget_bytes() as f64,
        ),
        (
            "stats",
            "evicted_clients",
            "Clients dropped because all clients together held more than --maxmemory-clients.",
            ctx.clients.evicted_clients() as f64,
        ),
        (
            "stats",
            "client_query_buffer_limit_disconnections",
            "Clients dropped past --max-query-buffer.",
            s.query_buffer_limit_disconnections.load(Ordering::Relaxed) as f64,
        ),
        (
            "stats",
            "client_output_buffer_limit_disconnections",
            "Clients dropped past --client-output-buffer-limit.",
            s.output_buffer_limit_disconnections.load(Ordering::Relaxed) as f64,
        ),
        (
            "stats",
            "http_requests_refused",
            "Connections closed for sending what looks like HTTP.",
            s.http_requests_refused.load(Ordering::Relaxed) as f64,
        ),
        (
            "stats",
            "transactions",
            "EXECs with writes.",
            s.transactions.load(Ordering::Relaxed) as f64,
        ),
        (
            "stats",
            "transactions_aborted",
            "EXECs whose writes were rejected: nothing applied.",
            s.transactions_aborted.load(Ordering::Relaxed) as f64,
        ),
        (
            "stats",
            "total_commands_processed",
            "Commands run.",
            s.commands.load(Ordering::Relaxed) as f64,
        ),
        (
            "stats",
            "total_net_input_bytes",
            "Bytes received from clients.",
            s.bytes_in.load(Ordering::Relaxed) as f64,
        ),
        (
            "log",
            "streams",
            "Streams that hold records or a token.",
            m.streams as f64,
        ),
        ("log", "appends", "Accepted appends.", m.appends as f64),
        (
            "log",
            "records_written",
            "Records appended.",
            m.records as f64,
        ),
        (
            "log",
            "bytes_written",
            "Payload bytes appended.",
            m.bytes as f64,
        ),
        (
            "log",
            "stale_rejections",
            "Writes rejected for a stale token.",
            m.stale_rejections as f64,
        ),
        (
            "log",
            "mismatches",
            "Conditional appends rejected for their offset.",
            m.mismatches as f64,
        ),
        (
            "log",
            "idempotent_retries",
            "Conditional appends answered as a retry.",
            m.idempotent_retries as f64,
        ),
        ("log", "fences", "Accepted fences.", m.fences as f64),
        ("log", "trims", "Accepted trims.", m.trims as f64),
        ("log", "deletes", "Accepted deletes.", m.deletes as f64),
        ("log", "reads", "Reads answered.", m.reads as f64),
        (
            "log",
            "records_read",
            "Records read.",
            m.records_read as f64,
        ),
        (
            "persistence",
            "segments",
            "Segment files in the log.",
            m.segments as f64,
        ),
        (
            "persistence",
            "open_segment_files",
            "Segment files open for reading now (within max_open_segments).",
            w.open_segment_files as f64,
        ),
        (
            "persistence",
            "last_checkpoint_bytes",
            "Bytes of the last checkpoint written.",
            w.last_checkpoint_bytes as f64,
        ),
        (
            "persistence",
            "segments_uncounted",
            "Segments older than the last open not yet looked at by garbage collection.",
            m.segments_uncounted as f64,
        ),
        (
            "persistence",
            "token_floor",
            "Every stream's highest token is at least this (raised when recovery cut entries).",
            m.token_floor as f64,
        ),
        (
            "persistence",
            "fsyncs",
            "Group commits (write + fdatasync).",
            w.syncs as f64,
        ),
        (
            "persistence",
            "fsync_latency_avg_us",
            "Mean write + fdatasync latency, microseconds.",
            w.sync_micros.mean(),
        ),
        (
            "persistence",
            "fsync_latency_p99_us",
            "99th percentile write + fdatasync latency (bucket upper bound), microseconds.",
            w.sync_micros.quantile_upper_bound(0.99) as f64,
        ),
        (
            "persistence",
            "group_commit_avg_batch",
            "Mean entries per group commit.",
            w.batch_entries.mean(),
        ),
        (
            "persistence",
            "wal_entries",
            "Entries made durable.",
            w.entries as f64,
        ),
        (
            "persistence",
            "wal_bytes_written",
            "Bytes written to segments.",
            w.bytes_written as f64,
        ),
        (
            "persistence",
            "segments_created",
            "Segment files created.",
            w.segments_created as f64,
        ),
        (
            "persistence",
            "segments_removed",
            "Segment files removed by garbage collection.",
            w.segments_removed as f64,
        ),
        (
            "persistence",
            "log_failed",
            "1 if an I/O failure stopped writes (until restart).",
            f64::from(u8::from(ctx.log.has_failed())),
        ),
        (
            "leases",
            "leases_acquired",
            "Leases granted.",
            m.leases_acquired as f64,
        ),
        (
            "leases",
            "leases_renewed",
            "Leases renewed.",
            m.leases_renewed as f64,
        ),
        (
            "leases",
            "leases_lost",
            "Renewals refused: the lease was lost.",
            m.leases_lost as f64,
        ),
        (
            "leases",
            "leases_expired",
            "Leases that expired.",
            m.leases_expired as f64,
        ),
        (
            "leases",
            "leases_released",
            "Leases released.",
            m.leases_released as f64,
        ),
        (
            "leases",
            "leases_held",
            "Acquisitions refused: held by another owner.",
            m.leases_held as f64,
        ),
        (
            "leases",
            "leases_waiting",
            "Acquisitions waiting now.",
            m.lease_waiting as f64,
        ),
        (
            "leases",
            "leases_live",
            "Leases alive now.",
            m.leases_live as f64,
        ),
    ]
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.2}")
    }
}

/// The `INFO [section]` text: `# Section` headers and `name:value` lines.
pub fn info_text(ctx: &Context, section: Option<&str>) -> String {
    let wanted = |s: &str| match section {
        None | Some("all" | "everything" | "default") => true,
        Some(x) => x == s,
    };
    let mut out = String::new();
    if wanted("server") {
        let _ = write!(
            out,
            "# Server\r\nfencelog_version:{}\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\nprocess_id:{}\r\ntcp_port:{}\r\ndir:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            ctx.config.addr.port(),
            ctx.config.dir.display()
        );
    }
    let mut current = "";
    for (sec, name, _, value) in counters(ctx) {
        if !wanted(sec) {
            continue;
        }
        if sec != current {
            if !out.is_empty() {
                out.push_str("\r\n");
            }
            let mut title = sec.to_string();
            if let Some(first) = title.get_mut(..1) {
                first.make_ascii_uppercase();
            }
            let _ = write!(out, "# {title}\r\n");
            current = sec;
        }
        let _ = write!(out, "{name}:{}\r\n", number(value));
    }
    out
}

/// The Prometheus text exposition of every counter.
pub fn prometheus(ctx: &Context) -> String {
    let mut out = String::new();
    for (_, name, help, value) in counters(ctx) {
        let _ = write!(
            out,
            "# HELP fencelog_{name} {help}\n# TYPE fencelog_{name} gauge\nfencelog_{name} {}\n",
            number(value)
        );
    }
    // The sync latency as a histogram, in seconds.
    let h = ctx.log.metrics().wal.sync_micros;
    out.push_str("# HELP fencelog_fsync_seconds Write + fdatasync latency of group commits.\n# TYPE fencelog_fsync_seconds histogram\n");
    for (upper_us, count) in h.cumulative() {
        if upper_us == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "fencelog_fsync_seconds_bucket{{le=\"{}\"}} {count}",
            upper_us as f64 / 1e6
        );
        if count == h.count {
            break;
        }
    }
    let _ = writeln!(
        out,
        "fencelog_fsync_seconds_bucket{{le=\"+Inf\"}} {}",
        h.count
    );
    let _ = writeln!(out, "fencelog_fsync_seconds_sum {}", h.sum as f64 / 1e6);
    let _ = writeln!(out, "fencelog_fsync_seconds_count {}", h.count);
    out
}
