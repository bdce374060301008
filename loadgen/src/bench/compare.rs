//! `fencelog bench --compare-redis`: fencelog and redis-server under the
//! same load generator, in alternating runs, on this machine and in this
//! run. Redis is made as durable as fencelog (`appendonly yes`,
//! `appendfsync always`) and does the same fencing decision in a Lua
//! script, or with `--redis-commands plain` runs its cheapest commands of
//! the same shape (`SET` for an append, `GET` for a rejection). Each run reads each server's CPU time from `/proc/PID/stat`
//! (utime + stime) before and after, so the table shows CPU seconds per
//! million requests beside the throughput; medians over `--runs`.
//!
//! Where the machine's CPU went is measured too: the load generator's
//! own (this process), and the whole machine's busy time from
//! `/proc/stat` (every process and the kernel's own threads). From those,
//! what each side would do with every core busy at the CPU per request
//! it measured: on a machine the load generator shares, a target above
//! that needs less CPU per request, not less waiting.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::*;

/// A server this comparison started: killed (and its directory removed)
/// when dropped.
struct Started {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One side of the comparison.
struct Side {
    name: &'static str,
    target: Target,
    pid: Option<u32>,
    _started: Option<Started>,
}

/// What one side measured for one workload, run by run.
#[derive(Default)]
struct Samples {
    ops_per_sec: Vec<f64>,
    p50_ns: Vec<f64>,
    p99_ns: Vec<f64>,
    cpu_secs_per_million: Vec<f64>,
    /// The user part of `cpu_secs_per_million`.
    user_secs_per_million: Vec<f64>,
    /// The load generator's (this process') CPU per million requests.
    generator_secs_per_million: Vec<f64>,
    /// The whole machine's busy CPU per million requests.
    machine_secs_per_million: Vec<f64>,
    /// The fraction of the machine's CPUs busy during the run.
    machine_busy: Vec<f64>,
    /// fencelog's group commit, from `INFO` before and after.
    entries_per_sync: Vec<f64>,
    sync_idle: Vec<f64>,
    commit_p99_us: Vec<f64>,
    unexpected: u64,
}

pub(super) fn run(args: &BenchArgs) -> ExitCode {
    match compare(args) {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fencelog bench --compare-redis: {e}");
            ExitCode::FAILURE
        }
    }
}

fn free_port() -> Result<u16, String> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    probe
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Waits until `addr` accepts connections, up to 10 s.
fn wait_listening(addr: SocketAddr, child: &mut Child, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited at start ({status})"));
        }
        if Instant::now() > deadline {
            return Err(format!("{what} does not listen on {addr} after 10 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_redis(program: &Path, dialect: Dialect) -> Result<Side, String> {
    let dir = tempfile::Builder::new()
        .prefix("fencelog-bench-redis-")
        .tempdir()
        .map_err(|e| format!("cannot create a directory for redis-server: {e}"))?;
    let port = free_port()?;
    let child = Command::new(program)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(dir.path())
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} ({e}); install Redis (apt-get install redis-server) or pass \
                 --redis-server PATH",
                program.display()
            )
        })?;
    started("redis", "redis-server", port, child, dir, dialect)
}

fn start_fencelog() -> Result<Side, String> {
    let dir = tempfile::Builder::new()
        .prefix("fencelog-bench-server-")
        .tempdir()
        .map_err(|e| format!("cannot create a directory for the server: {e}"))?;
    let port = free_port()?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let child = Command::new(exe)
        .args(["serve", "--addr", &port.to_string(), "--log-level", "warn"])
        .arg("--dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start fencelog serve: {e}"))?;
    started(
        "fencelog",
        "fencelog serve",
        port,
        child,
        dir,
        Dialect::Fencelog,
    )
}

/// The side of a server this program started (`what`, in `dir`), once it
/// listens on `port` of this machine.
fn started(
    name: &'static str,
    what: &str,
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
    dialect: Dialect,
) -> Result<Side, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // Owned by `Started` before the wait, so that a server which never
    // listens is killed when the error returns, not left running.
    let mut started = Started { child, _dir: dir };
    wait_listening(addr, &mut started.child, what)?;
    Ok(Side {
        name,
        target: Target::Tcp {
            addr,
            password: None,
            dialect,
        },
        pid: Some(started.child.id()),
        _started: Some(started),
    })
}

/// A server at `--addr`: its process id from `INFO server`, when that
/// process is on this machine (its CPU time is read from `/proc`).
fn existing_fencelog(runtime: &tokio::runtime::Runtime, args: &BenchArgs) -> Result<Side, String> {
    let addr_text = args.addr.as_deref().unwrap_or_default();
    let addr = runtime
        .block_on(tokio::net::lookup_host(addr_text))
        .map_err(|e| format!("cannot resolve {addr_text}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr_text} resolves to no address"))?;
    let pid = runtime.block_on(async {
        let timeout = Duration::from_secs(10);
        let mut conn = connect(addr, args.password.as_deref(), timeout)
            .await
            .ok()?;
        match request(&mut conn, &[b"INFO", b"server"], timeout)
            .await
            .ok()?
        {
            Value::Bulk(text) => String::from_utf8_lossy(&text).lines().find_map(|l| {
                l.trim_end()
                    .strip_prefix("process_id:")?
                    .parse::<u32>()
                    .ok()
            }),
            _ => None,
        }
    });
    let pid = pid.filter(|p| cpu_times(*p).is_some() && addr.ip().is_loopback());
    Ok(Side {
        name: "fencelog",
        target: Target::Tcp {
            addr,
            password: args.password.clone(),
            dialect: Dialect::Fencelog,
        },
        pid,
        _started: None,
    })
}

/// utime and stime of process `pid`, in seconds: where a server's CPU
/// goes, its own code or the kernel's (TCP, wake-ups).
fn cpu_times(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the
    // last ')'. utime and stime are fields 14 and 15 (state is field 3).
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let ticks = ticks_per_second()?;
    Some((utime / ticks, stime / ticks))
}

/// The unit of `/proc`'s CPU times.
fn ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf reads a constant of the system; no memory is shared.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// The whole machine's CPU time: busy seconds summed over its CPUs (all
/// but idle and I/O wait), and how many CPUs.
#[derive(Clone, Copy)]
struct Machine {
    busy: f64,
    cpus: usize,
}

/// Reads `/proc/stat`.
fn machine_busy() -> Option<Machine> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_proc_stat(stat: &str) -> Option<Machine> {
    let mut lines = stat.lines();
    // cpu  user nice system idle iowait irq softirq steal guest guest_nice
    // (guest time is counted in user already)
    let total: Vec<f64> = lines
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let field = |i: usize| total.get(i).copied().unwrap_or(0.0);
    let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
    let cpus = lines
        .take_while(|l| l.starts_with("cpu"))
        .filter(|l| l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    let ticks = ticks_per_second()?;
    (cpus > 0 && total.len() >= 4).then(|| Machine {
        busy: busy / ticks,
        cpus,
    })
}

/// The median with two decimals, or "-" without samples.
fn median_2dp(v: &[f64]) -> String {
    median(v).map_or_else(|| "-".to_string(), |c| format!("{c:.2}"))
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn compare(args: &BenchArgs) -> Result<String, String> {
    let workloads = args.workloads();
    let runtime = super::runtime()?;
    let dialect = match args.redis_commands {
        RedisCommands::Lua => Dialect::Redis,
        RedisCommands::Plain => Dialect::RedisPlain,
    };
    let redis = start_redis(&args.redis_server, dialect)?;
    let fencelog = match &args.addr {
        Some(_) => existing_fencelog(&runtime, args)?,
        None => start_fencelog()?,
    };
    let sides = [fencelog, redis];
    // samples[side][workload]
    let mut samples: Vec<Vec<Samples>> = (0..2)
        .map(|_| workloads.iter().map(|_| Samples::default()).collect())
        .collect();
    for run in 0..args.runs {
        // Alternate who goes first, so that neither always meets a warmer
        // (or more tired) machine.
        let order: [usize; 2] = if run % 2 == 0 { [0, 1] } else { [1, 0] };
        for &i in &order {
            let side = &sides[i];
            for (w, &workload) in workloads.iter().enumerate() {
                let plan = Arc::new(Plan::new(args, workload, &run_id())?);
                eprintln!(
                    "bench: run {}/{}: {} {} ({} clients × pipeline {})",
                    run + 1,
                    args.runs,
                    side.name,
                    workload.name(),
                    plan.clients,
                    plan.pipeline
                );
                let before = side.pid.and_then(cpu_times);
                let generator_before = cpu_times(std::process::id());
                let machine_before = machine_busy();
                let started = Instant::now();
                let result = runtime.block_on(run_workload(&side.target, Arc::clone(&plan)))?;
                let elapsed = started.elapsed().as_secs_f64();
                let machine_after = machine_busy();
                let generator_after = cpu_times(std::process::id());
                let after = side.pid.and_then(cpu_times);
                if args.cleanup
                    && let Err(e) = runtime.block_on(cleanup(&side.target, &plan))
                {
                    eprintln!("bench: cleanup: {e}");
                }
                let s = &mut samples[i][w];
                s.ops_per_sec.push(result.ops_per_sec());
                s.p50_ns.push(result.latency.quantile(0.5) as f64);
                s.p99_ns.push(result.latency.quantile(0.99) as f64);
                if let Some(g) = result.group_commit.filter(|g| g.syncs > 0) {
                    s.entries_per_sync.push(g.entries_per_sync);
                    if let Some(idle) = g.idle_fraction {
                        s.sync_idle.push(idle);
                    }
                    if let Some(p99) = g.commit_p99_us {
                        s.commit_p99_us.push(p99 as f64);
                    }
                }
                s.unexpected += result.unexpected;
                if result.requests > 0 {
                    let per_m = |secs: f64| secs / result.requests as f64 * 1e6;
                    // A process' (user, system) CPU per million requests.
                    let split = |b: (f64, f64), a: (f64, f64)| (per_m(a.0 - b.0), per_m(a.1 - b.1));
                    let name = format!("{} {}", side.name, workload.name());
                    if let (Some(b), Some(a)) = (before, after) {
                        let (user, system) = split(b, a);
                        eprintln!(
                            "bench: {name}: {:.0} ops/s, CPU {:.2} s/M (user {user:.2}, system \
                             {system:.2})",
                            result.ops_per_sec(),
                            user + system
                        );
                        s.cpu_secs_per_million.push(user + system);
                        s.user_secs_per_million.push(user);
                    }
                    if let (Some(b), Some(a)) = (generator_before, generator_after) {
                        let (user, system) = split(b, a);
                        eprintln!(
                            "bench: {name}: load generator CPU {:.2} s/M (user {user:.2}, \
                             system {system:.2})",
                            user + system
                        );
                        s.generator_secs_per_million.push(user + system);
                    }
                    if let (Some(b), Some(a)) = (machine_before, machine_after) {
                        s.machine_secs_per_million.push(per_m(a.busy - b.busy));
                        if elapsed > 0.0 {
                            s.machine_busy
                                .push((a.busy - b.busy) / (elapsed * a.cpus as f64));
                        }
                    }
                }
                if result.unexpected > 0 {
                    eprintln!(
                        "bench: {} {}: {} unexpected answers: {:?}",
                        side.name,
                        workload.name(),
                        result.unexpected,
                        result.unexpected_samples
                    );
                }
            }
        }
    }
    drop(runtime);
    let mut s = String::new();
    let redis_does = match args.redis_commands {
        RedisCommands::Lua => "a Lua script fences each append",
        RedisCommands::Plain => "Redis runs SET for an append, GET for a rejection",
    };
    let _ = writeln!(
        s,
        "\nfencelog vs redis-server (appendonly yes, appendfsync always; {redis_does}), \
         measured in this run"
    );
    let _ = writeln!(
        s,
        "{} clients ({}), pipeline {}, {}-byte records, median of {} alternating run(s); CPU: \
         the server process' utime+stime (user: utime) per million requests",
        args.clients,
        match args.driver {
            Driver::Events => "one event loop",
            Driver::Threads => "a thread each",
        },
        args.pipeline,
        args.payload_bytes,
        args.runs
    );
    let header = [
        "workload",
        "fencelog ops/s",
        "redis ops/s",
        "ratio",
        "fencelog p50",
        "redis p50",
        "fencelog p99",
        "redis p99",
        "fencelog CPU s/M",
        "redis CPU s/M",
        "fencelog user s/M",
        "redis user s/M",
    ];
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    let mut failed = 0;
    for (w, workload) in workloads.iter().enumerate() {
        let (f, r) = (&samples[0][w], &samples[1][w]);
        failed += f.unexpected + r.unexpected;
        let ops = |x: &Samples| median(&x.ops_per_sec).unwrap_or(0.0);
        let cpu = |x: &Samples| median_2dp(&x.cpu_secs_per_million);
        let user = |x: &Samples| median_2dp(&x.user_secs_per_million);
        let p50 = |x: &Samples| fmt_ns(median(&x.p50_ns).unwrap_or(0.0) as u64);
        let p99 = |x: &Samples| fmt_ns(median(&x.p99_ns).unwrap_or(0.0) as u64);
        let ratio = if ops(r) > 0.0 {
            format!("{:.2}x", ops(f) / ops(r))
        } else {
            "-".into()
        };
        rows.push(vec![
            workload.name().to_string(),
            fmt_count(ops(f)),
            fmt_count(ops(r)),
            ratio,
            p50(f),
            p50(r),
            p99(f),
            p99(r),
            cpu(f),
            cpu(r),
            user(f),
            user(r),
        ]);
    }
    s.push('\n');
    super::write_columns(&mut s, &rows);
    let cpus = machine_busy().map_or(0, |m| m.cpus);
    if cpus > 0 {
        let _ = writeln!(
            s,
            "\nwhere the machine's {cpus} CPUs went (the load generator: this process; the \
             machine: every CPU's busy time in /proc/stat, the kernel's own threads and \
             anything else running included), and the throughput at the machine CPU per \
             request measured with every CPU busy\n"
        );
        let mut rows = vec![
            [
                "workload",
                "server",
                "machine busy",
                "load generator CPU s/M",
                "machine CPU s/M",
                "with every CPU busy",
            ]
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>(),
        ];
        for (w, workload) in workloads.iter().enumerate() {
            for (i, side) in sides.iter().enumerate() {
                let x = &samples[i][w];
                rows.push(vec![
                    workload.name().to_string(),
                    side.name.to_string(),
                    median(&x.machine_busy)
                        .map_or_else(|| "-".into(), |b| format!("{:.0}%", b * 100.0)),
                    median_2dp(&x.generator_secs_per_million),
                    median_2dp(&x.machine_secs_per_million),
                    median(&x.machine_secs_per_million)
                        .filter(|&m| m > 0.0)
                        .map_or_else(
                            || "-".into(),
                            |m| format!("{}/s", fmt_count(cpus as f64 * 1e6 / m)),
                        ),
                ]);
            }
        }
        super::write_columns(&mut s, &rows);
    }
    for (w, workload) in workloads.iter().enumerate() {
        let f = &samples[0][w];
        if let Some(per_sync) = median(&f.entries_per_sync) {
            let _ = write!(
                s,
                "\nfencelog {}: {per_sync:.1} records per sync",
                workload.name()
            );
            if let Some(idle) = median(&f.sync_idle) {
                let _ = write!(s, ", sync thread idle {:.0}%", idle * 100.0);
            }
            if let Some(p99) = median(&f.commit_p99_us) {
                let _ = write!(s, ", commit latency p99 ≤ {p99:.0} µs");
            }
            s.push('\n');
        }
    }
    if failed > 0 {
        return Err(format!("{failed} unexpected answers (see above)\n{s}"));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_cpu_time() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert!(cpu_times(std::process::id()).is_some());
    }

    #[test]
    fn the_machine_s_busy_time_leaves_out_idle_and_waiting() {
        let ticks = ticks_per_second().unwrap();
        let stat = "cpu  100 5 50 1000 40 3 2 1 7 0\n\
                    cpu0 50 2 25 500 20 1 1 0 3 0\n\
                    cpu1 50 3 25 500 20 2 1 1 4 0\n\
                    intr 12345\n";
        let m = parse_proc_stat(stat).unwrap();
        assert_eq!(m.cpus, 2);
        assert!((m.busy - 161.0 / ticks).abs() < 1e-9, "{}", m.busy);
        assert!(parse_proc_stat("intr 1\n").is_none());
        assert!(parse_proc_stat("cpu  x y\ncpu0 1 2 3 4\n").is_none());
        assert!(machine_busy().is_some_and(|m| m.cpus >= 1 && m.busy > 0.0));
    }
}
