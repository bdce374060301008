//! The real `fencelog` binary on an ephemeral port, and a small blocking
//! RESP client to talk to it.
#![allow(dead_code)]

pub mod cluster;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `fencelog` binary the tests run: this profile's build, or the one
/// `FENCELOG_TEST_BIN` names (CI runs the process suites once more against
/// the release build, which is optimized whole as this profile is not).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("FENCELOG_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_fencelog").to_string())
    })
}

/// What a child process writes to `pipe`, line by line into `log` (for a
/// failure's message, or to wait on), on a thread of its own until the
/// pipe closes; `on_line` sees each line first.
pub fn capture_lines<R: Read + Send + 'static>(
    pipe: R,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    mut on_line: impl FnMut(&str) + Send + 'static,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            on_line(&line);
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.push_str(&line);
            log.push('\n');
        }
    });
}

/// `log` once it holds `needle` (it is written by another thread, as
/// [`capture_lines`] does), or `Err` with what it holds after `within`.
pub fn wait_for_text(
    log: &std::sync::Mutex<String>,
    needle: &str,
    within: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + within;
    loop {
        // Looked at in place: copied only for the answer (a node's log
        // grows to megabytes, and this looks every 10 ms).
        {
            let text = log.lock().unwrap_or_else(|e| e.into_inner());
            if text.contains(needle) {
                return Ok(text.clone());
            }
            if Instant::now() >= deadline {
                return Err(text.clone());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A base port on `ip` such that `base + o` is free for every `o` in
/// `offsets` (each bound, then released for a server to take), below the
/// kernel's ephemeral range (32768 and up here). A port from that range
/// (what binding port 0 gives) can be handed to an outgoing connection
/// between its release and the server's bind, or stay held by such a
/// connection of a killed node in TIME_WAIT: a restart then fails with
/// "address in use" (one fault schedule in a hundred did).
pub fn free_ports(ip: &str, offsets: &[u16]) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Ports handed out in this process: tests run in parallel, and a
    // released port looks free to the next caller.
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u32>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    const LOW: u32 = 20_000;
    const TOP: u32 = 32_768;
    let reach = u32::from(offsets.iter().copied().max().unwrap_or(0));
    let span = TOP - LOW - reach;
    // Another test binary may run beside this one: start at a place of
    // this process' own.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let base = LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let ports: Vec<u32> = offsets.iter().map(|&o| base + u32::from(o)).collect();
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        let free = ports
            .iter()
            .all(|&p| !given.contains(&p) && std::net::TcpListener::bind((ip, p as u16)).is_ok());
        if free {
            given.extend(ports);
            return base as u16;
        }
    }
    panic!("no free ports on {ip} from {LOW} to {TOP} at offsets {offsets:?}");
}

/// A running `fencelog serve`, killed on drop.
pub struct ServerProcess {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ServerProcess {
    /// Starts the server on `dir` with extra flags; waits until it listens.
    pub fn start(dir: &Path, extra: &[&str]) -> ServerProcess {
        let mut child = Command::new(bin())
            .arg("serve")
            .arg("--dir")
            .arg(dir)
            .args(["--addr", "127.0.0.1:0", "--segment-bytes", "4194304"])
            .args(extra)
            .env("FENCELOG_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fencelog serve");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut tx = Some(tx);
        capture_lines(stderr, log.clone(), move |line| {
            if let Some(addr) = serving_addr(line)
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(addr);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().expect("an address"),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "the server did not start ({status:?}): {}",
                    log.lock().unwrap()
                );
            }
        };
        ServerProcess {
            child,
            addr,
            dir: dir.to_path_buf(),
            stderr: log,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Sends a signal to the server process.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits until the server's log holds `needle` (events are written as
    /// they happen, and read by another thread); answers the log. Panics
    /// with the log after 5 s.
    pub fn wait_for_log(&self, needle: &str) -> String {
        wait_for_text(&self.stderr, needle, Duration::from_secs(5))
            .unwrap_or_else(|log| panic!("the server's log never said {needle:?}:\n{log}"))
    }

    /// Waits for the process to exit, up to `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The address in the server's "serving" line, text or JSON.
fn serving_addr(line: &str) -> Option<String> {
    if let Some(i) = line.find("serving addr=") {
        return Some(line[i + "serving addr=".len()..].trim().to_string());
    }
    if line.contains("\"message\":\"serving\"") {
        let i = line.find("\"addr\":\"")? + "\"addr\":\"".len();
        let end = line[i..].find('"')?;
        return Some(line[i..i + end].to_string());
    }
    None
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A RESP value as the client reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Verbatim(String),
}

impl Value {
    pub fn int(&self) -> i64 {
        match self {
            Value::Int(n) => *n,
            other => panic!("not an integer: {other:?}"),
        }
    }

    pub fn err(&self) -> &str {
        match self {
            Value::Error(e) => e,
            other => panic!("not an error: {other:?}"),
        }
    }

    pub fn bulk(&self) -> &[u8] {
        match self {
            Value::Bulk(b) => b,
            other => panic!("not a bulk string: {other:?}"),
        }
    }

    pub fn array(&self) -> &[Value] {
        match self {
            Value::Array(a) => a,
            other => panic!("not an array: {other:?}"),
        }
    }
}

/// A blocking RESP client.
pub struct Client {
    stream: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Client {
            stream: BufReader::new(stream),
        }
    }

    /// Encodes a command as an array of bulk strings.
    pub fn encode(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.get_mut().write_all(bytes).unwrap();
    }

    /// Sends one command and reads its reply.
    pub fn cmd(&mut self, args: &[&str]) -> Value {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd_bytes(&args)
    }

    pub fn cmd_bytes(&mut self, args: &[&[u8]]) -> Value {
        self.send_raw(&Self::encode(args));
        self.read().expect("a reply")
    }

    /// Reads one reply; `None` at end of stream.
    pub fn read(&mut self) -> Option<Value> {
        let mut line = Vec::new();
        if self.stream.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&line[1..line.len().saturating_sub(2)]).to_string();
        Some(match line[0] {
            b'+' => Value::Simple(text),
            b'-' => Value::Error(text),
            b':' => Value::Int(text.parse().unwrap()),
            b'_' => Value::Null,
            b'$' | b'=' => {
                let n: i64 = text.parse().unwrap();
                if n < 0 {
                    return Some(Value::Null);
                }
                let mut buf = vec![0u8; n as usize + 2];
                self.stream.read_exact(&mut buf).unwrap();
                buf.truncate(n as usize);
                if line[0] == b'=' {
                    Value::Verbatim(String::from_utf8_lossy(&buf[4..]).to_string())
                } else {
                    Value::Bulk(buf)
                }
            }
            b'*' => {
                let n: i64 = text.parse().unwrap();
                if n < 0 {
                    return Some(Value::Null);
                }
                Value::Array((0..n).map(|_| self.read().unwrap()).collect())
            }
            b'%' => {
                let n: usize = text.parse().unwrap();
                Value::Map(
                    (0..n)
                        .map(|_| (self.read().unwrap(), self.read().unwrap()))
                        .collect(),
                )
            }
            other => panic!("unexpected reply type {:?}", char::from(other)),
        })
    }
}

/// Runs `redis-cli` (CI installs redis-tools; a missing one fails loudly).
pub fn redis_cli(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli must be installed (apt-get install redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Where `.ci/run` installs the client libraries the tests drive: under
/// the cargo target directory (`ci-venv` for redis-py, `ci-node` for
/// ioredis).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    }
}

/// Whether `tool` runs (`tool --version`); if not, [`missing`] says so
/// (and fails in CI).
pub fn have(tool: &str, how: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        missing(tool, how);
    }
    ok
}

/// A tool a test needs is missing: in CI (`CI=true`) the test fails
/// loudly; elsewhere it is skipped with the reason printed.
pub fn missing(what: &str, how: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} is needed and missing in CI: {how}");
    }
    eprintln!("SKIPPED: {what} is not installed ({how})");
}

/// A Python with redis-py 5 or newer: `$FENCELOG_PYTHON`, the virtual
/// environment `.ci/run` makes (`<target>/ci-venv`), or `python3`.
pub fn python_with_redis_py() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("FENCELOG_PYTHON") {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(target_dir().join("ci-venv/bin/python"));
    candidates.push(PathBuf::from("python3"));
    let found = candidates.into_iter().find(|python| {
        Command::new(python)
            .args([
                "-c",
                "import redis, sys; sys.exit(0 if int(redis.__version__.split('.')[0]) >= 5 else 1)",
            ])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        missing(
            "redis-py >= 5",
            "bash .ci/run installs it into <target>/ci-venv; or set FENCELOG_PYTHON",
        );
    }
    found
}

/// Runs a Python script with redis-py; answers its stdout, panics with its
/// stderr if it fails.
pub fn run_python(python: &Path, script: &str) -> String {
    let out = Command::new(python)
        .args(["-c", script])
        .output()
        .expect("python runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python client failed:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The `node_modules` directory holding ioredis: `$FENCELOG_NODE_PATH`, or
/// where `.ci/run` installs it (`<target>/ci-node/node_modules`).
pub fn node_with_ioredis() -> Option<PathBuf> {
    let dir = std::env::var_os("FENCELOG_NODE_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("ci-node/node_modules"));
    let works = Command::new("node")
        .args(["-e", "require('ioredis')"])
        .env("NODE_PATH", &dir)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        missing(
            "node with ioredis",
            "bash .ci/run installs it with npm into <target>/ci-node; or set FENCELOG_NODE_PATH",
        );
        return None;
    }
    Some(dir)
}

/// Runs a Node script with `NODE_PATH` set; answers its stdout, panics with
/// its stderr if it fails.
pub fn run_node(node_path: &Path, script: &str) -> String {
    let out = Command::new("node")
        .args(["-e", script])
        .env("NODE_PATH", node_path)
        .output()
        .expect("node runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Node client failed:\n{stderr}");
    String::from_utf8_lossy(&out.stdout).to_string()
}
