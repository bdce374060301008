//! `fencelog bench --history`: what a long run does to the log. Appends to
//! many streams round robin, pipelined, for a long while, and reports per
//! time slice what a week of traffic would show first: appends per second,
//! segment files, bytes on disk against payload, open files, resident
//! memory, checkpoint size; in process, also how long the log takes to open
//! again at the end.
//!
//! In process (the default) the engine runs here, on a fresh temporary
//! directory unless `--dir` names one, with `--segment-bytes` segments.
//! With `--addr` it drives a running server, reading the server's process
//! id and data directory from `INFO` (so run it on the server's machine to
//! see its files and memory).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencelog::{Log, Options, Token};
use fencelog_client::{Reply, Value};

use crate::bench::{BenchArgs, connect, fmt_count, request, runtime};

/// The longest connecting to the server (and one `INFO`) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a size: a number of bytes, or with a unit (`64KiB`, `1MiB`,
/// `1MB`, `2GiB`; `K`/`M`/`G` alone are binary).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 65536, 64KiB or 1MB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    let v = n * mult;
    if !(0.0..=u64::MAX as f64).contains(&v) || v.fract() != 0.0 {
        return Err(format!("{s:?} is not a whole number of bytes"));
    }
    Ok(v as u64)
}

/// Runs the endurance benchmark; 0 when every append was accepted.
pub fn run(args: &BenchArgs) -> ExitCode {
    match execute(args) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fencelog bench --history: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where the numbers of a slice come from.
enum Target {
    InProcess {
        log: Log,
        dir: PathBuf,
    },
    Tcp {
        addr: std::net::SocketAddr,
        pid: u32,
        dir: PathBuf,
    },
}

/// One row of the report.
struct Slice {
    at: Duration,
    appends_per_s: f64,
    segments: u64,
    disk: u64,
    payload: u64,
    fds: Option<u64>,
    rss: Option<u64>,
    checkpoint: u64,
}

fn execute(args: &BenchArgs) -> Result<String, String> {
    let streams = args.streams.unwrap_or(1000) as usize;
    let clients = args.clients as usize;
    let pipeline = args.pipeline.max(1) as usize;
    let payload = args.payload_bytes as usize;
    let runtime = runtime()?;
    let mut _tempdir = None;
    let target = match &args.addr {
        Some(addr) => runtime.block_on(connect_target(addr, args.password.as_deref()))?,
        None => {
            let dir = match &args.dir {
                Some(d) => d.clone(),
                None => {
                    let t = tempfile::Builder::new()
                        .prefix("fencelog-history-")
                        .tempdir()
                        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
                    let p = t.path().to_path_buf();
                    _tempdir = Some(t);
                    p
                }
            };
            let log = Log::open(&dir, engine_options(args.segment_bytes))
                .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
            Target::InProcess { log, dir }
        }
    };
    let acked = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let prefix = format!("{}:history", args.stream_prefix);
    let started = Instant::now();
    let end = started + args.duration;
    let mut rows: Vec<Slice> = Vec::new();
    runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let (acked, failed, stop) =
                (Arc::clone(&acked), Arc::clone(&failed), Arc::clone(&stop));
            let prefix = prefix.clone();
            let body = Bytes::from(vec![b'x'; payload]);
            match &target {
                Target::InProcess { log, .. } => {
                    let log = log.clone();
                    tasks.spawn(async move {
                        let t = Token::new(1).unwrap_or_else(|_| unreachable!("1 is a token"));
                        let mut k = c;
                        while !stop.load(Ordering::Relaxed) {
                            let mut pending = Vec::with_capacity(pipeline);
                            for _ in 0..pipeline {
                                let stream = format!("{prefix}:{}", k % streams);
                                k += clients;
                                match log
                                    .append_deferred(stream.as_bytes(), t, vec![body.clone()])
                                    .await
                                {
                                    Ok(d) => pending.push(d),
                                    Err(_) => {
                                        failed.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            for d in pending {
                                match d.await {
                                    Ok(_) => acked.fetch_add(1, Ordering::Relaxed),
                                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                                };
                            }
                        }
                    });
                }
                Target::Tcp { addr, .. } => {
                    let addr = *addr;
                    let password = args.password.clone();
                    tasks.spawn(async move {
                        if let Err(e) = tcp_client(
                            addr,
                            password.as_deref(),
                            c,
                            clients,
                            streams,
                            pipeline,
                            &prefix,
                            &body,
                            &acked,
                            &failed,
                            &stop,
                        )
                        .await
                        {
                            eprintln!("fencelog bench --history: client {c}: {e}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            }
        }
        let mut last = (Instant::now(), 0u64);
        loop {
            let next = (last.0 + args.slice).min(end);
            tokio::time::sleep_until(next.into()).await;
            let now = Instant::now();
            let done = acked.load(Ordering::Relaxed);
            let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
            last = (now, done);
            let row = sample(&target, now - started, rate, done * payload as u64).await;
            eprintln!("{}", format_row(&row));
            rows.push(row);
            if now >= end {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
    });
    let failures = failed.load(Ordering::Relaxed);
    let mut out = String::new();
    out.push_str(&format!(
        "history: {} streams, {clients} clients x pipeline {pipeline}, {payload}-byte records, {:.0} s, {}\n",
        streams,
        args.duration.as_secs_f64(),
        match &target {
            Target::InProcess { dir, .. } => format!(
                "in process, {} segments in {}",
                fmt_bytes(args.segment_bytes),
                dir.display()
            ),
            Target::Tcp { addr, pid, dir } => format!("server {addr} (pid {pid}, {})", dir.display()),
        }
    ));
    out.push_str(HEADER);
    out.push('\n');
    for r in &rows {
        out.push_str(&format_row(r));
        out.push('\n');
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() >= 5
    {
        let fifth = rows.len() / 5;
        let mean = |rs: &[Slice]| rs.iter().map(|r| r.appends_per_s).sum::<f64>() / rs.len() as f64;
        let early = mean(&rows[..fifth.max(1)]);
        let late = mean(&rows[rows.len() - fifth.max(1)..]);
        out.push_str(&format!(
            "last fifth / first fifth appends/s: {:.2} ({} / {}); disk/payload at the end {:.2}; first slice {} segments, last {}\n",
            late / early.max(1e-9),
            fmt_count(late),
            fmt_count(early),
            last.disk as f64 / last.payload.max(1) as f64,
            first.segments,
            last.segments
        ));
    }
    drop(runtime);
    if let Target::InProcess { log, dir } = target {
        let closed = Instant::now();
        drop(log);
        let close_s = closed.elapsed().as_secs_f64();
        let opened = Instant::now();
        let log = Log::open(&dir, engine_options(args.segment_bytes))
            .map_err(|e| format!("cannot open {} again: {e}", dir.display()))?;
        let open_s = opened.elapsed().as_secs_f64();
        let report = log.recovery_report();
        out.push_str(&format!(
            "close {:.3} s; open again {:.3} s ({} segments, {} scanned, {} of entries replayed)\n",
            close_s,
            open_s,
            report.segments,
            report.scanned_segments,
            fmt_bytes(report.scanned_bytes),
        ));
    }
    if failures > 0 {
        return Err(format!("{failures} appends failed\n{out}"));
    }
    Ok(out)
}

const HEADER: &str = "    time   appends/s  segments   disk MiB  payload MiB  disk/payload   fds   RSS MiB  checkpoint KiB";

fn format_row(r: &Slice) -> String {
    let opt = |v: Option<u64>, div: f64| {
        v.map_or_else(|| "-".to_string(), |v| format!("{:.0}", v as f64 / div))
    };
    format!(
        "{:>7.1}s {:>11} {:>9} {:>10.1} {:>12.1} {:>13.2} {:>5} {:>9} {:>15.1}",
        r.at.as_secs_f64(),
        fmt_count(r.appends_per_s),
        r.segments,
        r.disk as f64 / (1 << 20) as f64,
        r.payload as f64 / (1 << 20) as f64,
        r.disk as f64 / r.payload.max(1) as f64,
        opt(r.fds, 1.0),
        opt(r.rss, (1 << 20) as f64),
        r.checkpoint as f64 / 1024.0,
    )
}

fn fmt_bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64)
    } else if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

fn engine_options(segment_bytes: u64) -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = segment_bytes;
    o.wal.max_entry_bytes = u32::try_from((segment_bytes / 2).min(16 << 20)).unwrap_or(16 << 20);
    o.max_payload_bytes = (o.wal.max_entry_bytes - 4096).min(1 << 20);
    o
}

async fn sample(target: &Target, at: Duration, rate: f64, payload: u64) -> Slice {
    let (pid, dir) = match target {
        Target::InProcess { dir, .. } => (std::process::id(), dir.clone()),
        Target::Tcp { pid, dir, .. } => (*pid, dir.clone()),
    };
    let (segments, disk) = dir_usage(&dir);
    let checkpoint = match target {
        Target::InProcess { log, .. } => log.metrics().wal.last_checkpoint_bytes,
        Target::Tcp { addr, .. } => info_field(*addr, "last_checkpoint_bytes")
            .await
            .unwrap_or(0),
    };
    Slice {
        at,
        appends_per_s: rate,
        segments,
        disk,
        payload,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()
            .map(|d| d.count() as u64),
        rss: std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map(|kb| kb * 1024),
        checkpoint,
    }
}

/// Segment files and bytes of all files in the data directory.
fn dir_usage(dir: &Path) -> (u64, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let (mut segments, mut bytes) = (0, 0);
    for e in entries.flatten() {
        if let Ok(m) = e.metadata() {
            bytes += m.len();
        }
        if e.file_name().to_string_lossy().ends_with(".wal") {
            segments += 1;
        }
    }
    (segments, bytes)
}

async fn connect_target(addr: &str, password: Option<&str>) -> Result<Target, String> {
    let resolved = tokio::net::lookup_host(addr)
        .await
        .map_err(|e| format!("cannot resolve {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))?;
    let text = info(resolved, password).await?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_string())
    };
    let pid = field("process_id")
        .and_then(|p| p.parse().ok())
        .ok_or("the server's INFO names no process_id")?;
    let dir = field("dir").ok_or("the server's INFO names no dir")?;
    Ok(Target::Tcp {
        addr: resolved,
        pid,
        dir: PathBuf::from(dir),
    })
}

async fn info(addr: std::net::SocketAddr, password: Option<&str>) -> Result<String, String> {
    let mut conn = connect(addr, password, CONNECT_TIMEOUT).await?;
    match request(&mut conn, &[b"INFO"], CONNECT_TIMEOUT).await? {
        Value::Bulk(b) | Value::Verbatim(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        other => Err(format!("INFO answered {other:?}")),
    }
}

async fn info_field(addr: std::net::SocketAddr, name: &str) -> Option<u64> {
    let text = info(addr, None).await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
}

#[allow(clippy::too_many_arguments)]
async fn tcp_client(
    addr: std::net::SocketAddr,
    password: Option<&str>,
    c: usize,
    clients: usize,
    streams: usize,
    pipeline: usize,
    prefix: &str,
    body: &[u8],
    acked: &AtomicU64,
    failed: &AtomicU64,
    stop: &AtomicBool,
) -> Result<(), String> {
    let mut conn = connect(addr, password, CONNECT_TIMEOUT).await?;
    let mut k = c;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..pipeline {
            let stream = format!("{prefix}:{}", k % streams);
            k += clients;
            conn.queue(&[b"LOG.APPEND", stream.as_bytes(), b"1", body]);
        }
        conn.exchange(|reply| {
            match reply {
                Reply::Int(_) => acked.fetch_add(1, Ordering::Relaxed),
                _ => failed.fetch_add(1, Ordering::Relaxed),
            };
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert!(parse_size("1.5").is_err());
        assert!(parse_size("ten").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }
}
