//! `fencelog cluster …`: a local cluster in one command, and the
//! operator's view and changes of a running one (over the Redis protocol,
//! like `redis-cli --cluster`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fencelog_client::{Client, Config, Error, Value};

/// `fencelog cluster`
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ClusterCommand {
    /// Run a cluster of N nodes on this machine (127.0.0.1, client ports
    /// from --port up, Raft ports 10000 above), each in its own process and
    /// directory under --dir, until Ctrl-C.
    Local {
        /// How many nodes (3 or 5 tolerate 1 or 2 lost).
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// The first node's client port.
        #[arg(long, default_value_t = 7379)]
        port: u16,
        /// Where the nodes keep their data (`n1`, `n2`, …).
        #[arg(long, default_value = "./fencelog-cluster")]
        dir: PathBuf,
        /// The cluster secret every node is given (see `fencelog serve
        /// --cluster-secret-file`). [default: `cluster.secret` in --dir,
        /// made with 32 random bytes on the first run, mode 600]
        #[arg(long, value_name = "PATH")]
        cluster_secret_file: Option<PathBuf>,
        /// Options passed on to every node's `fencelog serve`, after `--`
        /// (e.g. `-- --cluster-election-timeout-ms 500 --log-level info`).
        #[arg(last = true, value_name = "SERVE OPTIONS")]
        serve: Vec<String>,
    },
    /// Show every member: its role, term, last log index, commit index,
    /// applied index and lag behind the leader.
    Status {
        /// Any member's client address.
        #[arg(long, default_value = "127.0.0.1:7379")]
        addr: String,
        /// The password, if the cluster has one.
        #[arg(long, env = "FENCELOG_REQUIREPASS", hide_env_values = true)]
        password: Option<String>,
    },
    /// Add a node (started with --cluster-node-id and no --cluster-initial):
    /// it catches up as a learner, by snapshot if far behind, then votes.
    Add {
        /// Any member's client address (the leader is found from there).
        #[arg(long, default_value = "127.0.0.1:7379")]
        addr: String,
        /// The new node's id.
        #[arg(long)]
        node_id: u64,
        /// Its Raft address (its --cluster-raft-addr).
        #[arg(long)]
        raft_addr: String,
        /// Its client address.
        #[arg(long)]
        client_addr: String,
        /// The password, if the cluster has one.
        #[arg(long, env = "FENCELOG_REQUIREPASS", hide_env_values = true)]
        password: Option<String>,
    },
    /// Compare the replicas: once every member has applied the same
    /// position, each one's digest there must be the same (a replica that
    /// decided one entry differently shows another). Exit 1 if they differ.
    Verify {
        /// Any member's client address.
        #[arg(long, default_value = "127.0.0.1:7379")]
        addr: String,
        /// The password, if the cluster has one.
        #[arg(long, env = "FENCELOG_REQUIREPASS", hide_env_values = true)]
        password: Option<String>,
        /// How long to wait for the members to stand at one position.
        #[arg(long, default_value_t = 30)]
        wait_secs: u64,
    },
    /// Remove a node from the cluster.
    Remove {
        /// Any member's client address.
        #[arg(long, default_value = "127.0.0.1:7379")]
        addr: String,
        /// The node to remove.
        #[arg(long)]
        node_id: u64,
        /// The password, if the cluster has one.
        #[arg(long, env = "FENCELOG_REQUIREPASS", hide_env_values = true)]
        password: Option<String>,
    },
}

/// Runs `fencelog cluster …`.
pub fn run(args: ClusterArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencelog cluster: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match args.command {
            ClusterCommand::Local {
                nodes,
                port,
                dir,
                cluster_secret_file,
                serve,
            } => local(nodes, port, dir, cluster_secret_file, &serve).await,
            ClusterCommand::Status { addr, password } => status(&addr, password.as_deref()).await,
            ClusterCommand::Verify {
                addr,
                password,
                wait_secs,
            } => verify(&addr, password.as_deref(), Duration::from_secs(wait_secs)).await,
            ClusterCommand::Add {
                addr,
                node_id,
                raft_addr,
                client_addr,
                password,
            } => {
                let id = node_id.to_string();
                let args: [&[u8]; 5] = [
                    b"CLUSTER",
                    b"ADDNODE",
                    id.as_bytes(),
                    raft_addr.as_bytes(),
                    client_addr.as_bytes(),
                ];
                to_leader(&addr, password.as_deref(), &args).await
            }
            ClusterCommand::Remove {
                addr,
                node_id,
                password,
            } => {
                let id = node_id.to_string();
                let args: [&[u8]; 3] = [b"CLUSTER", b"REMOVENODE", id.as_bytes()];
                to_leader(&addr, password.as_deref(), &args).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencelog cluster: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Connect time allowed at most, however long the request may take.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of the member at `addr`, authenticated with `password` (the
/// cluster's `--requirepass`, the same on every member). It does not ask
/// for the leader at connect: `status` wants the member it names, and a
/// member that knows no leader yet still answers `CLUSTER INFO`;
/// [`Client::execute`] follows `-MOVED` to the leader when asked. Each
/// request waits up to `timeout`; `-TRYAGAIN` and refused connections are
/// retried within `retry_total`.
pub(crate) async fn connect(
    addr: &str,
    password: Option<&str>,
    timeout: Duration,
    retry_total: Duration,
) -> Result<Client, Error> {
    Client::connect(Config {
        password: password.map(str::to_string),
        connect_timeout: timeout.min(MAX_CONNECT_TIMEOUT),
        request_timeout: timeout,
        retry_total,
        discover_leader: false,
        ..Config::new(addr)
    })
    .await
}

/// The text of a bulk reply (RESP2 bulk, RESP3 verbatim: `INFO`-like
/// replies come as either, depending on the protocol the handshake chose).
fn text(reply: &Value) -> Option<String> {
    match reply {
        Value::Bulk(b) | Value::Verbatim(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// Sends a membership command to the leader (found by following `-MOVED`
/// from `addr`), waiting out `-TRYAGAIN` for up to 300 s: adding a node
/// waits while it catches up.
async fn to_leader(addr: &str, password: Option<&str>, args: &[&[u8]]) -> Result<(), String> {
    let wait = Duration::from_secs(300);
    let client = connect(addr, password, wait, wait)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let reply = client.execute(args, wait).await;
    // The node that answered (or redirected last): the leader, as far as
    // the client knows.
    let target = client.leader().unwrap_or_else(|| addr.to_string());
    match reply {
        Ok(Value::Simple(ok)) if ok == "OK" => {
            println!("OK ({target})");
            Ok(())
        }
        Ok(other) => Err(format!("{target}: {other:?}")),
        Err(e) => Err(format!("{target}: {e}")),
    }
}

/// `CLUSTER INFO` of the member at `addr`, as fields.
async fn info(client: &Client, addr: &str) -> Result<BTreeMap<String, String>, String> {
    let reply = client
        .execute_on(addr, &[b"CLUSTER", b"INFO"], Duration::from_secs(2))
        .await
        .map_err(|e| e.to_string())?;
    match text(&reply) {
        Some(text) => Ok(text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()),
        None => Err(format!("{addr}: CLUSTER INFO answered {reply:?}")),
    }
}

/// The members a node knows: (id, client address, voter) from `CLUSTER
/// NODES`.
async fn members(client: &Client, addr: &str) -> Result<Vec<(u64, String, bool)>, String> {
    let reply = client
        .execute_on(addr, &[b"CLUSTER", b"NODES"], Duration::from_secs(2))
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    match text(&reply) {
        Some(text) => Ok(text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let id = u64::from_str_radix(f.next()?, 16).ok()?;
                let client = f.next()?.split('@').next()?.to_string();
                let voter = !f.next()?.contains("nofailover");
                Some((id, client, voter))
            })
            .collect()),
        None => Err(format!("{addr}: CLUSTER NODES answered {reply:?}")),
    }
}

/// `fencelog cluster status`
async fn status(addr: &str, password: Option<&str>) -> Result<(), String> {
    let timeout = Duration::from_secs(2);
    let client = connect(addr, password, timeout, timeout)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    status_of(&client, addr).await
}

/// `fencelog cluster status` through a connected client: `addr`'s
/// members, then each member's `CLUSTER INFO` (a connection of its own).
async fn status_of(client: &Client, addr: &str) -> Result<(), String> {
    let members = members(client, addr).await?;
    let mut rows = Vec::new();
    let mut lag: BTreeMap<u64, String> = BTreeMap::new();
    for (id, member, voter) in &members {
        let i = info(client, member).await;
        if let Ok(i) = &i
            && i.get("raft_state").is_some_and(|s| s == "leader")
        {
            for (k, v) in i {
                if let Some(n) = k.strip_prefix("raft_replica_").and_then(|n| n.parse().ok()) {
                    let l = v.split("lag=").nth(1).unwrap_or("?").to_string();
                    lag.insert(n, l);
                }
            }
        }
        rows.push((*id, member.clone(), *voter, i));
    }
    println!(
        "{:>4}  {:<22} {:<10} {:>6} {:>10} {:>10} {:>10} {:>8}",
        "node", "address", "role", "term", "last log", "committed", "applied", "lag"
    );
    for (id, client, voter, i) in rows {
        match i {
            Ok(i) => {
                let get = |k: &str| i.get(k).cloned().unwrap_or_else(|| "?".into());
                let role = match (get("raft_state").as_str(), voter) {
                    (s, true) => s.to_string(),
                    (s, false) => format!("{s} (learner)"),
                };
                println!(
                    "{:>4}  {:<22} {:<10} {:>6} {:>10} {:>10} {:>10} {:>8}",
                    id,
                    client,
                    role,
                    get("raft_term"),
                    get("raft_last_log_index"),
                    get("raft_committed"),
                    get("raft_last_applied"),
                    lag.get(&id).cloned().unwrap_or_else(|| "-".into())
                );
            }
            Err(e) => println!("{id:>4}  {client:<22} unreachable: {e}"),
        }
    }
    Ok(())
}

/// `fencelog cluster verify`: every member's applied position and digest
/// (`CLUSTER INFO`), asked until all stand at one position (a group that
/// is being written to moves on: it is asked again), then compared.
async fn verify(addr: &str, password: Option<&str>, wait: Duration) -> Result<(), String> {
    let timeout = Duration::from_secs(2);
    let client = connect(addr, password, timeout, timeout)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let members = members(&client, addr).await?;
    let deadline = std::time::Instant::now() + wait;
    loop {
        let mut seen = Vec::new();
        for (id, member, _) in &members {
            let i = info(&client, member)
                .await
                .map_err(|e| format!("node {id} at {member}: {e}"))?;
            let field = |k: &str| {
                i.get(k)
                    .cloned()
                    .ok_or_else(|| format!("node {id} does not report {k} (an older version?)"))
            };
            seen.push((*id, field("replica_position")?, field("replica_digest")?));
        }
        if seen.iter().all(|(_, p, _)| *p == seen[0].1) {
            for (id, position, digest) in &seen {
                println!("node {id:>4}  position {position:>20}  digest {digest}");
            }
            if seen.iter().all(|(_, _, d)| *d == seen[0].2) {
                println!("{} replicas agree at position {}", seen.len(), seen[0].1);
                return Ok(());
            }
            return Err(format!(
                "the replicas disagree at position {}: a replica decided differently",
                seen[0].1
            ));
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the members never stood at one position within {wait:?}: {seen:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The secret file of a local cluster: `dir/cluster.secret`, made on the
/// first run (64 hex digits, readable by this user only) and reused after,
/// so that a local cluster's peers authenticate each other by default.
fn local_secret_file(dir: &std::path::Path) -> Result<PathBuf, String> {
    let path = dir.join("cluster.secret");
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let secret = fencelog_cluster::ClusterSecret::random_hex()
        .map_err(|e| format!("cannot make a cluster secret: {e}"))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let write = |options: &std::fs::OpenOptions| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = options.open(&path)?;
        f.write_all(secret.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()
    };
    write(&options).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("cluster secret: {} (new)", path.display());
    Ok(path)
}

/// `fencelog cluster local`
async fn local(
    nodes: u64,
    port: u16,
    dir: PathBuf,
    secret_file: Option<PathBuf>,
    serve: &[String],
) -> Result<(), String> {
    if nodes == 0 || nodes > 9 {
        return Err(format!("--nodes {nodes}: from 1 to 9"));
    }
    let secret_file = match secret_file {
        Some(path) => {
            // Refused here, once, rather than by every node.
            super::read_secret_file(&path)?;
            path
        }
        None => local_secret_file(&dir)?,
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let client = |i: u64| format!("127.0.0.1:{}", u64::from(port) + i - 1);
    let raft = |i: u64| format!("127.0.0.1:{}", u64::from(port) + 10_000 + i - 1);
    let initial = (1..=nodes)
        .map(|i| format!("{i}={}/{}", raft(i), client(i)))
        .collect::<Vec<_>>()
        .join(",");
    // Ctrl-C, or SIGTERM from a supervisor or a script: the nodes stop
    // with it (they would outlive it otherwise). Installed before the first
    // child starts, so a signal that comes early is not the default action
    // (which would leave the nodes running).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    let mut children: Vec<std::process::Child> = Vec::new();
    for i in 1..=nodes {
        let node_dir = dir.join(format!("n{i}"));
        let child = std::process::Command::new(&exe)
            .arg("serve")
            .arg("--dir")
            .arg(&node_dir)
            .args(["--addr", &client(i)])
            .args(["--cluster-node-id", &i.to_string()])
            .args(["--cluster-raft-addr", &raft(i)])
            .args(["--cluster-initial", &initial])
            .arg("--cluster-secret-file")
            .arg(&secret_file)
            .args(serve)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                // The nodes already started would run on alone.
                stop_nodes(children);
                return Err(format!("cannot start node {i}: {e}"));
            }
        };
        println!(
            "node {i}: clients {} raft {} data {}",
            client(i),
            raft(i),
            node_dir.display()
        );
        children.push(child);
    }
    let ready = async {
        let first = client(1);
        let timeout = Duration::from_secs(2);
        let deadline = Instant::now() + Duration::from_secs(20);
        // Node 1 may not listen yet: connect again until it does.
        let mut node1: Option<Client> = None;
        loop {
            if node1.is_none() {
                node1 = connect(&first, None, timeout, timeout).await.ok();
            }
            if let Some(c) = &node1
                && let Ok(i) = info(c, &first).await
                && i.get("raft_leader").is_some_and(|l| l != "none")
            {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("no leader after 20 s; the nodes keep trying");
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match &node1 {
            Some(c) => status_of(c, &first).await.ok(),
            None => status(&first, None).await.ok(),
        };
        println!(
            "\nredis-cli -c -p {port} LOG.APPEND orders 1 hello   # -c follows MOVED\n\
             fencelog cluster status --addr {}                 # Ctrl-C (or SIGTERM) stops the nodes",
            client(1)
        );
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = ready => {}
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
    stop_nodes(children);
    Ok(())
}

/// SIGTERM to every node (each stops gracefully), then waits for them all.
fn stop_nodes(children: Vec<std::process::Child>) {
    for child in &children {
        // SAFETY: kill(2) on a child this process started.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
    }
    for mut child in children {
        let _ = child.wait();
    }
}
