//! The async client: configuration, pooled connections, cluster routing
//! and the typed commands.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::Error;
use crate::conn::Connection;
use crate::lease::{Lease, LeaseOptions};
use crate::pipeline::Pipeline;
use crate::resp::{ReplyLimits, Value};

/// How a [`Client`] connects, waits and retries. Every field has a default
/// ([`Config::default`]: one node at 127.0.0.1:7379).
#[derive(Debug, Clone)]
pub struct Config {
    /// Nodes to ask first, `host:port`. With several, any one that answers
    /// is enough: `CLUSTER SLOTS` names the leader. Default
    /// `["127.0.0.1:7379"]`.
    pub seeds: Vec<String>,
    /// The user of `AUTH user password`; `None` sends `AUTH password` (and
    /// `default` in `HELLO 3 AUTH`). Default `None`.
    pub user: Option<String>,
    /// The server's `--requirepass`. Default `None`.
    pub password: Option<String>,
    /// Ask for RESP3 (`HELLO 3`), falling back to RESP2 if refused.
    /// Default `true`.
    pub resp3: bool,
    /// Longest a connection and its handshake may take. Default 2 s.
    pub connect_timeout: Duration,
    /// Longest one request may wait for its reply, beyond any `BLOCK` or
    /// `WAIT` it asks for. Default 5 s.
    pub request_timeout: Duration,
    /// Idle connections kept per node; more are closed when returned.
    /// Default 4.
    pub max_idle_per_node: usize,
    /// `-MOVED` redirections followed in a row before giving up. Default 8.
    pub max_redirects: u32,
    /// First wait after `-TRYAGAIN`, `-CLUSTERDOWN` or a refused
    /// connection; doubled each time. Default 20 ms.
    pub backoff_initial: Duration,
    /// Longest single wait between retries. Default 500 ms.
    pub backoff_max: Duration,
    /// Longest a call keeps retrying `-TRYAGAIN`, `-CLUSTERDOWN` and
    /// refused connections in all (an election takes about a second).
    /// Default 10 s.
    pub retry_total: Duration,
    /// Ask `CLUSTER SLOTS` for the leader at connect. Default `true`;
    /// without it the first seed is used until a `-MOVED` names another.
    pub discover_leader: bool,
    /// Bounds on one reply. Default [`ReplyLimits::default`].
    pub limits: ReplyLimits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seeds: vec!["127.0.0.1:7379".to_string()],
            user: None,
            password: None,
            resp3: true,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            max_idle_per_node: 4,
            max_redirects: 8,
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            retry_total: Duration::from_secs(10),
            discover_leader: true,
            limits: ReplyLimits::default(),
        }
    }
}

impl Config {
    /// The defaults with one seed node.
    pub fn new(addr: impl Into<String>) -> Config {
        Config {
            seeds: vec![addr.into()],
            ..Config::default()
        }
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |what: &str| Err(Error::Invalid(what.to_string()));
        if self.seeds.is_empty() {
            return bad("no seed node");
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return bad("a zero timeout");
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return bad("backoff_initial must be above zero and at most backoff_max");
        }
        Ok(())
    }
}

/// A record read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its position in the stream.
    pub offset: u64,
    /// The token of the write that appended it.
    pub token: u64,
    /// Its bytes.
    pub payload: Bytes,
}

/// A stream's durable numbers (`LOG.STAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamStat {
    /// The greatest token any accepted write carried (0: none yet).
    pub highest_token: u64,
    /// The offset the next record will get.
    pub next_offset: u64,
    /// The first readable offset.
    pub start_offset: u64,
    /// Readable records.
    pub records: u64,
    /// Payload bytes of the readable records.
    pub bytes: u64,
}

/// A lease granted by `LEASE.ACQUIRE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: carry it into every write.
    pub token: u64,
    /// The ttl the server granted.
    pub ttl: Duration,
}

/// The live lease on a name (`LEASE.INFO`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Who holds it.
    pub owner: String,
    /// Its token.
    pub token: u64,
    /// Time left on the server's clock.
    pub remaining: Duration,
}

/// Most attempts of one call, whatever the retry time says: a bound on the
/// routing loop even with a zero backoff.
const MAX_ATTEMPTS: u32 = 1_000;
/// Names asked for per `LOG.STREAMS` page.
const STREAMS_PAGE: u32 = 1_000;

/// A fencelog client: cloneable (clones share the pool and the leader), for
/// one node or a cluster.
///
/// Calls never resend a write that may have reached the server: an I/O
/// error or timeout after the request was written is returned as
/// [`Error::Io`], because the write may have been applied. What is retried
/// is only what cannot have been applied (a refused connection, `-MOVED`,
/// `-TRYAGAIN`, `-CLUSTERDOWN`) and reads (`LOG.READ`, `LOG.STAT`,
/// `LOG.STREAMS`, `LEASE.INFO`, `PING`), which change nothing.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    /// The node that answers data commands, as far as this client knows.
    leader: Mutex<Option<String>>,
    /// Idle connections by node address.
    idle: Mutex<HashMap<String, Vec<Connection>>>,
}

/// A poisoned lock only means another thread panicked while holding it;
/// the data (an address, a list of connections) is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn arg(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

fn millis(d: Duration) -> Vec<u8> {
    arg(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Client {
    /// Connects: checks the configuration and finds the leader (or the
    /// single node) through the seeds.
    pub async fn connect(config: Config) -> Result<Client, Error> {
        config.check()?;
        let client = Client {
            inner: Arc::new(Inner {
                config,
                leader: Mutex::new(None),
                idle: Mutex::new(HashMap::new()),
            }),
        };
        if client.inner.config.discover_leader {
            client.discover().await?;
        } else {
            let seed = client.inner.config.seeds[0].clone();
            let conn = Connection::open(&seed, &client.inner.config).await?;
            client.checkin(&seed, conn);
        }
        Ok(client)
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The node this client sends data commands to, once known.
    pub fn leader(&self) -> Option<String> {
        lock(&self.inner.leader).clone()
    }

    /// Asks the seeds, in order, for the leader (`CLUSTER SLOTS`); a single
    /// node (cluster support disabled) is its own leader. Retries within
    /// `retry_total` while no seed can say.
    async fn discover(&self) -> Result<(), Error> {
        let cfg = &self.inner.config;
        let started = Instant::now();
        let mut backoff = cfg.backoff_initial;
        let mut last = Error::Invalid("no seed node".into());
        for _ in 0..MAX_ATTEMPTS {
            for seed in &cfg.seeds {
                let reply = match self
                    .exec_on(seed, &[b"CLUSTER", b"SLOTS"], cfg.request_timeout)
                    .await
                {
                    Ok(r) => r,
                    // Only an unreachable node is worth another seed or
                    // another try; a refused handshake (a wrong password)
                    // will not get better.
                    Err(e @ Error::Io(_)) => {
                        last = e;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                match reply {
                    Value::Array(ranges) => match leader_of(&ranges) {
                        Some(leader) => {
                            *lock(&self.inner.leader) = Some(leader);
                            return Ok(());
                        }
                        None => {
                            last = Error::Protocol(format!("CLUSTER SLOTS from {seed}: {ranges:?}"))
                        }
                    },
                    Value::Error(e) if e.contains("cluster support disabled") => {
                        *lock(&self.inner.leader) = Some(seed.clone());
                        return Ok(());
                    }
                    Value::Error(e) => {
                        let err = Error::from_server(&e);
                        // A wrong password will not get better by waiting.
                        if e.starts_with("WRONGPASS") || e.starts_with("NOAUTH") {
                            return Err(err);
                        }
                        last = err;
                    }
                    other => {
                        last = Error::Protocol(format!("CLUSTER SLOTS from {seed}: {other:?}"))
                    }
                }
            }
            if !self.backoff(started, &mut backoff, cfg.backoff_max).await {
                return Err(last);
            }
        }
        Err(last)
    }

    /// Waits the next backoff step if it ends within `retry_total` from
    /// `started`; false if the time is up. Steps double up to `max`.
    async fn backoff(&self, started: Instant, backoff: &mut Duration, max: Duration) -> bool {
        let cfg = &self.inner.config;
        let wake = Instant::now() + *backoff;
        if wake > started + cfg.retry_total {
            return false;
        }
        tokio::time::sleep_until(wake).await;
        *backoff = (*backoff * 2).min(max);
        true
    }

    /// Sends a command to the leader, following `-MOVED` and waiting out
    /// `-TRYAGAIN` / `-CLUSTERDOWN` and refused connections (capped
    /// exponential backoff, `retry_total` in all); a read is also asked
    /// again after an I/O error. `timeout` bounds each attempt's wait for
    /// its reply. An error reply is returned as a value.
    pub(crate) async fn call(&self, args: &[&[u8]], timeout: Duration) -> Result<Value, Error> {
        self.call_with(args, timeout, self.inner.config.backoff_max)
            .await
    }

    /// As [`Client::call`], with the backoff steps capped at `backoff_max`
    /// (at most the configured one).
    pub(crate) async fn call_with(
        &self,
        args: &[&[u8]],
        timeout: Duration,
        backoff_max: Duration,
    ) -> Result<Value, Error> {
        let cfg = &self.inner.config;
        let started = Instant::now();
        let backoff_max = backoff_max.clamp(cfg.backoff_initial, cfg.backoff_max);
        let mut backoff = cfg.backoff_initial;
        let mut redirects = 0;
        let mut seed = 0;
        let mut target = self.leader().unwrap_or_else(|| cfg.seeds[0].clone());
        for _ in 0..MAX_ATTEMPTS {
            let conn = match self.checkout(&target).await {
                Ok(c) => c,
                Err(e @ Error::Io(_)) => {
                    // Nothing was sent: try the seeds in turn, the leader
                    // may be gone.
                    self.forget_leader(&target);
                    if !self.backoff(started, &mut backoff, backoff_max).await {
                        return Err(e);
                    }
                    redirects = 0;
                    // Not the node that just refused, if there is another:
                    // after a leader dies, a turn spent on its address
                    // is a whole backoff step lost (issue 22: a lease
                    // keeper renewing through a failover).
                    let failed = std::mem::take(&mut target);
                    for _ in 0..cfg.seeds.len() {
                        target = cfg.seeds[seed % cfg.seeds.len()].clone();
                        seed += 1;
                        if target != failed {
                            break;
                        }
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            let reply = match self.exec(conn, &target, args, timeout).await {
                Ok(v) => v,
                // A read changes nothing, so a lost reply is simply asked
                // again (a pooled connection to a node that just died fails
                // so); so is a command whose retry answers what the first
                // try would have. Any other write's outcome is the
                // caller's to decide.
                Err(e @ Error::Io(_)) if answer_survives_retry(args) => {
                    if !self.backoff(started, &mut backoff, backoff_max).await {
                        return Err(e);
                    }
                    redirects = 0;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match reply {
                Value::Error(e) if e.starts_with("MOVED ") => {
                    redirects += 1;
                    let addr = e.split_whitespace().nth(2).map(str::to_string);
                    match addr {
                        Some(addr) if redirects <= cfg.max_redirects => {
                            *lock(&self.inner.leader) = Some(addr.clone());
                            target = addr;
                        }
                        _ => return Err(Error::Server(e)),
                    }
                }
                Value::Error(e)
                    if e.starts_with("TRYAGAIN")
                        || e.starts_with("CLUSTERDOWN")
                        || (e.starts_with("UNCERTAIN") && answer_survives_retry(args)) =>
                {
                    if !self.backoff(started, &mut backoff, backoff_max).await {
                        return Err(Error::Server(e));
                    }
                    redirects = 0;
                }
                v => {
                    // It answered instead of redirecting: it leads (or is
                    // the single node), wherever the address came from.
                    *lock(&self.inner.leader) = Some(target);
                    return Ok(v);
                }
            }
        }
        Err(Error::Server(format!(
            "no answer after {MAX_ATTEMPTS} attempts"
        )))
    }

    fn forget_leader(&self, addr: &str) {
        let mut leader = lock(&self.inner.leader);
        if leader.as_deref() == Some(addr) {
            *leader = None;
        }
    }

    /// One request on one node, without routing.
    async fn exec_on(&self, addr: &str, args: &[&[u8]], timeout: Duration) -> Result<Value, Error> {
        let conn = self.checkout(addr).await?;
        self.exec(conn, addr, args, timeout).await
    }

    /// One request on a connection; the connection goes back to the pool
    /// only after a complete reply (after an error or a timeout its state
    /// is unknown, so it is closed).
    async fn exec(
        &self,
        mut conn: Connection,
        addr: &str,
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Value, Error> {
        match tokio::time::timeout(timeout, conn.request(args)).await {
            Ok(Ok(v)) => {
                self.checkin(addr, conn);
                Ok(v)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::timed_out(&format!(
                "{addr} did not answer in {timeout:?}"
            ))),
        }
    }

    async fn checkout(&self, addr: &str) -> Result<Connection, Error> {
        // Bounded: each turn removes one idle connection.
        loop {
            let conn = lock(&self.inner.idle).get_mut(addr).and_then(Vec::pop);
            match conn {
                Some(c) if c.is_reusable() => return Ok(c),
                Some(_) => continue,
                None => return Connection::open(addr, &self.inner.config).await,
            }
        }
    }

    fn checkin(&self, addr: &str, conn: Connection) {
        let mut idle = lock(&self.inner.idle);
        let list = idle.entry(addr.to_string()).or_default();
        if list.len() < self.inner.config.max_idle_per_node {
            list.push(conn);
        }
    }

    /// A command whose error reply becomes a typed [`Error`].
    async fn command(&self, args: &[&[u8]], timeout: Duration) -> Result<Value, Error> {
        match self.call(args, timeout).await? {
            Value::Error(e) => Err(Error::from_server(&e)),
            v => Ok(v),
        }
    }

    async fn integer(&self, args: &[&[u8]], timeout: Duration) -> Result<u64, Error> {
        let v = self.command(args, timeout).await?;
        as_u64(&v)
    }

    fn timeout(&self) -> Duration {
        self.inner.config.request_timeout
    }

    /// Any command, routed like the typed ones (to the leader, following
    /// `-MOVED`, waiting out `-TRYAGAIN`); an error reply is returned as a
    /// typed [`Error`]. For what has no typed method (`INFO`, `CLUSTER
    /// INFO`, …). A command that waits (`BLOCK`, `WAIT`) needs a `timeout`
    /// beyond its wait.
    pub async fn execute(&self, args: &[&[u8]], timeout: Duration) -> Result<Value, Error> {
        self.command(args, timeout).await
    }

    /// Any command on one node, without routing (`CLUSTER INFO` of a
    /// given member); an error reply is returned as a typed [`Error`],
    /// `-MOVED` included (as [`Error::Server`]).
    pub async fn execute_on(
        &self,
        addr: &str,
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Value, Error> {
        match self.exec_on(addr, args, timeout).await? {
            Value::Error(e) => Err(Error::from_server(&e)),
            v => Ok(v),
        }
    }

    /// `PING`: a round trip to the leader.
    pub async fn ping(&self) -> Result<(), Error> {
        self.command(&[b"PING"], self.timeout()).await.map(|_| ())
    }

    /// Appends `records` as one atomic entry with `token`; answers the
    /// offset of the first. Not idempotent: after [`Error::outcome_unknown`]
    /// the records may be in the stream. [`Lease::append`] retries exactly.
    pub async fn append<R: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: u64,
        records: &[R],
    ) -> Result<u64, Error> {
        let mut args: Vec<&[u8]> = vec![b"LOG.APPEND", stream.as_ref()];
        let t = arg(token);
        args.push(&t);
        with_records(&mut args, records)?;
        self.integer(&args, self.timeout()).await
    }

    /// Appends `records` only if `expected_offset` is the stream's next
    /// offset ([`Error::Mismatch`] otherwise). An exact retry of one that
    /// succeeded answers the original offset and writes nothing.
    pub async fn append_at<R: AsRef<[u8]>>(
        &self,
        stream: impl AsRef<[u8]>,
        token: u64,
        expected_offset: u64,
        records: &[R],
    ) -> Result<u64, Error> {
        let (t, o) = (arg(token), arg(expected_offset));
        let mut args: Vec<&[u8]> = vec![b"LOG.APPENDAT", stream.as_ref(), &t, &o];
        with_records(&mut args, records)?;
        self.integer(&args, self.timeout()).await
    }

    /// Raises the stream's highest token to `token` without writing a
    /// record; answers the highest token.
    pub async fn fence(&self, stream: impl AsRef<[u8]>, token: u64) -> Result<u64, Error> {
        let t = arg(token);
        self.integer(&[b"LOG.FENCE", stream.as_ref(), &t], self.timeout())
            .await
    }

    /// Up to `max_records` durable records from offset `from` (fewer if the
    /// server's `--max-read-bytes` is reached; at least one if there is one).
    pub async fn read(
        &self,
        stream: impl AsRef<[u8]>,
        from: u64,
        max_records: u32,
    ) -> Result<Vec<Record>, Error> {
        self.read_inner(stream.as_ref(), from, max_records, None)
            .await
    }

    /// As [`Client::read`], but from the end of the stream waits up to
    /// `block` (at least 1 ms; there is no unbounded wait) for a record.
    pub async fn read_block(
        &self,
        stream: impl AsRef<[u8]>,
        from: u64,
        max_records: u32,
        block: Duration,
    ) -> Result<Vec<Record>, Error> {
        if block < Duration::from_millis(1) {
            return Err(Error::Invalid(
                "BLOCK under 1 ms would wait without a limit".into(),
            ));
        }
        self.read_inner(stream.as_ref(), from, max_records, Some(block))
            .await
    }

    async fn read_inner(
        &self,
        stream: &[u8],
        from: u64,
        max_records: u32,
        block: Option<Duration>,
    ) -> Result<Vec<Record>, Error> {
        if max_records == 0 {
            return Err(Error::Invalid("max_records must be at least 1".into()));
        }
        let (f, n) = (arg(from), arg(u64::from(max_records)));
        let mut args: Vec<&[u8]> = vec![b"LOG.READ", stream, &f, b"COUNT", &n];
        let b;
        let mut timeout = self.timeout();
        if let Some(block) = block {
            b = millis(block);
            args.extend([b"BLOCK".as_slice(), &b]);
            timeout += block;
        }
        match self.command(&args, timeout).await? {
            Value::Array(items) => items.iter().map(record).collect(),
            other => Err(unexpected("LOG.READ", &other)),
        }
    }

    /// A follower of the stream from `from` on: each
    /// [`Tail::next_record`] waits up to `block` for the next record.
    pub fn tail(&self, stream: impl AsRef<[u8]>, from: u64, block: Duration) -> Tail {
        Tail {
            client: self.clone(),
            stream: Bytes::copy_from_slice(stream.as_ref()),
            next: from,
            block,
            buffered: VecDeque::new(),
        }
    }

    /// Makes the records below `before` unreadable; answers the new start
    /// offset.
    pub async fn trim(
        &self,
        stream: impl AsRef<[u8]>,
        token: u64,
        before: u64,
    ) -> Result<u64, Error> {
        let (t, b) = (arg(token), arg(before));
        self.integer(&[b"LOG.TRIM", stream.as_ref(), &t, &b], self.timeout())
            .await
    }

    /// Removes every record (the highest token and next offset survive);
    /// answers how many were removed.
    pub async fn delete(&self, stream: impl AsRef<[u8]>, token: u64) -> Result<u64, Error> {
        let t = arg(token);
        self.integer(&[b"LOG.DELETE", stream.as_ref(), &t], self.timeout())
            .await
    }

    /// The stream's durable numbers (zeros for a stream never written).
    pub async fn stat(&self, stream: impl AsRef<[u8]>) -> Result<StreamStat, Error> {
        let reply = self
            .command(&[b"LOG.STAT", stream.as_ref()], self.timeout())
            .await?;
        let pairs: Vec<(&Value, &Value)> = match &reply {
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            Value::Array(flat) if flat.len() % 2 == 0 => {
                flat.chunks_exact(2).map(|p| (&p[0], &p[1])).collect()
            }
            other => return Err(unexpected("LOG.STAT", other)),
        };
        let mut stat = StreamStat::default();
        for (k, v) in pairs {
            let field = match k {
                Value::Bulk(b) => b.as_ref(),
                Value::Simple(s) => s.as_bytes(),
                other => return Err(unexpected("LOG.STAT", other)),
            };
            let slot = match field {
                b"highest_token" => &mut stat.highest_token,
                b"next_offset" => &mut stat.next_offset,
                b"start_offset" => &mut stat.start_offset,
                b"records" => &mut stat.records,
                b"bytes" => &mut stat.bytes,
                // A newer server may add fields.
                _ => continue,
            };
            *slot = as_u64(v)?;
        }
        Ok(stat)
    }

    /// The names of every stream that holds records or a token, in byte
    /// order, read a page at a time.
    pub async fn streams(&self) -> Result<Vec<Bytes>, Error> {
        let mut names: Vec<Bytes> = Vec::new();
        let count = arg(u64::from(STREAMS_PAGE));
        // Each page starts after the last name of the one before, so every
        // turn makes progress; a short page is the last.
        loop {
            let after = names.last().cloned();
            let mut args: Vec<&[u8]> = vec![b"LOG.STREAMS"];
            if let Some(a) = &after {
                args.extend([b"AFTER".as_slice(), a.as_ref()]);
            }
            args.extend([b"COUNT".as_slice(), &count]);
            let page = match self.command(&args, self.timeout()).await? {
                Value::Array(items) | Value::Set(items) => items,
                other => return Err(unexpected("LOG.STREAMS", &other)),
            };
            let n = page.len();
            for v in page {
                match v {
                    Value::Bulk(b) => names.push(b),
                    other => return Err(unexpected("LOG.STREAMS", &other)),
                }
            }
            if n < STREAMS_PAGE as usize {
                return Ok(names);
            }
        }
    }

    /// `LEASE.ACQUIRE`: a token for `name` if no live lease holds it
    /// ([`Error::Held`] otherwise, or after `options.wait`). With
    /// `options.fence` the stream `name` is fenced at the new token. No
    /// keeper: see [`Client::lease`] for a lease that renews itself.
    /// Asked again after a lost reply or `UNCERTAIN`: an acquire by the
    /// owner that holds the lease answers its token again.
    pub async fn acquire(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        ttl: Duration,
        options: &LeaseOptions,
    ) -> Result<Grant, Error> {
        let ttl_ms = millis(ttl);
        let mut args: Vec<&[u8]> = vec![b"LEASE.ACQUIRE", name.as_ref(), owner.as_bytes(), &ttl_ms];
        if options.fence {
            args.push(b"FENCE");
        }
        let w;
        let mut timeout = self.timeout();
        if let Some(wait) = options.wait {
            if wait < Duration::from_millis(1) {
                return Err(Error::Invalid(
                    "WAIT under 1 ms would wait without a limit".into(),
                ));
            }
            w = millis(wait);
            args.extend([b"WAIT".as_slice(), &w]);
            timeout += wait;
        }
        match self.command(&args, timeout).await? {
            Value::Array(v) if v.len() == 2 => Ok(Grant {
                token: as_u64(&v[0])?,
                ttl: Duration::from_millis(as_u64(&v[1])?),
            }),
            other => Err(unexpected("LEASE.ACQUIRE", &other)),
        }
    }

    /// `LEASE.RENEW`: extends the live lease of exactly this owner and
    /// token to `ttl` from now; [`Error::Lost`] if it expired or was
    /// replaced. Answers the ttl granted.
    pub async fn renew(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        token: u64,
        ttl: Duration,
    ) -> Result<Duration, Error> {
        self.renew_with(
            name.as_ref(),
            owner,
            token,
            ttl,
            self.inner.config.backoff_max,
        )
        .await
    }

    /// [`Client::renew`] with the routing's backoff steps capped at
    /// `backoff_max`: the keeper's, whose renewal must find a new leader
    /// within what is left of the ttl.
    pub(crate) async fn renew_with(
        &self,
        name: &[u8],
        owner: &str,
        token: u64,
        ttl: Duration,
        backoff_max: Duration,
    ) -> Result<Duration, Error> {
        let (t, ms) = (arg(token), millis(ttl));
        let args: [&[u8]; 5] = [b"LEASE.RENEW", name, owner.as_bytes(), &t, &ms];
        let granted = match self.call_with(&args, self.timeout(), backoff_max).await? {
            Value::Error(e) => return Err(Error::from_server(&e)),
            v => as_u64(&v)?,
        };
        Ok(Duration::from_millis(granted))
    }

    /// `LEASE.RELEASE`: whether this owner and token held it (idempotent).
    pub async fn release(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        token: u64,
    ) -> Result<bool, Error> {
        let t = arg(token);
        let n = self
            .integer(
                &[b"LEASE.RELEASE", name.as_ref(), owner.as_bytes(), &t],
                self.timeout(),
            )
            .await?;
        Ok(n == 1)
    }

    /// `LEASE.INFO`: the live lease on `name`, or `None`.
    pub async fn lease_info(&self, name: impl AsRef<[u8]>) -> Result<Option<LeaseInfo>, Error> {
        match self
            .command(&[b"LEASE.INFO", name.as_ref()], self.timeout())
            .await?
        {
            Value::Null => Ok(None),
            Value::Array(v) if v.len() == 3 => Ok(Some(LeaseInfo {
                owner: match &v[0] {
                    Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::Simple(s) => s.clone(),
                    other => return Err(unexpected("LEASE.INFO", other)),
                },
                token: as_u64(&v[1])?,
                remaining: Duration::from_millis(as_u64(&v[2])?),
            })),
            other => Err(unexpected("LEASE.INFO", &other)),
        }
    }

    /// A [`Pipeline`]: a connection of its own to the leader (as far as
    /// this client knows; else the first seed), for many requests before
    /// their replies. Not routed: a `-MOVED` reply is the caller's.
    pub async fn pipeline(&self) -> Result<Pipeline, Error> {
        let addr = self
            .leader()
            .unwrap_or_else(|| self.inner.config.seeds[0].clone());
        Pipeline::connect(&addr, &self.inner.config).await
    }

    /// Acquires `name` for `owner` and starts a keeper that renews it at a
    /// third of `ttl`; see [`Lease`].
    pub async fn lease(
        &self,
        name: impl AsRef<[u8]>,
        owner: &str,
        ttl: Duration,
        options: LeaseOptions,
    ) -> Result<Lease, Error> {
        Lease::acquire(
            self.clone(),
            Bytes::copy_from_slice(name.as_ref()),
            owner,
            ttl,
            options,
        )
        .await
    }
}

/// A follower of one stream: [`Tail::next_record`] answers the records
/// in order, waiting with `LOG.READ … BLOCK` when it has none.
#[derive(Debug)]
pub struct Tail {
    client: Client,
    stream: Bytes,
    next: u64,
    block: Duration,
    buffered: VecDeque<Record>,
}

/// Records asked for per read of a [`Tail`].
const TAIL_BATCH: u32 = 100;

impl Tail {
    /// The next record, or `None` if none arrived within one `block`
    /// interval (call again to go on waiting).
    pub async fn next_record(&mut self) -> Result<Option<Record>, Error> {
        if self.buffered.is_empty() {
            let records = self
                .client
                .read_block(&self.stream, self.next, TAIL_BATCH, self.block)
                .await?;
            if let Some(last) = records.last() {
                self.next = last.offset.saturating_add(1);
            }
            self.buffered.extend(records);
        }
        Ok(self.buffered.pop_front())
    }

    /// The offset the next read starts from (after the buffered records).
    pub fn position(&self) -> u64 {
        self.next
    }
}

/// Whether a command only reads, so that resending it after a lost reply
/// cannot change anything.
fn is_read(args: &[&[u8]]) -> bool {
    const READS: [&[u8]; 5] = [
        b"PING",
        b"LOG.READ",
        b"LOG.STAT",
        b"LOG.STREAMS",
        b"LEASE.INFO",
    ];
    args.first()
        .is_some_and(|c| READS.iter().any(|r| r.eq_ignore_ascii_case(c)))
}

/// Whether sending a command again after its reply was lost (an I/O
/// error, a timeout, `UNCERTAIN` from a leader that stepped down with it in
/// flight) answers what the first try would have: a read, or
/// `LEASE.ACQUIRE`, since an acquire by the owner that holds the lease
/// answers its token again (a retry never takes a second token). Not
/// `LEASE.RELEASE`: a retry of one that landed answers 0.
fn answer_survives_retry(args: &[&[u8]]) -> bool {
    is_read(args)
        || args
            .first()
            .is_some_and(|c| c.eq_ignore_ascii_case(b"LEASE.ACQUIRE"))
}

fn with_records<'a, R: AsRef<[u8]>>(
    args: &mut Vec<&'a [u8]>,
    records: &'a [R],
) -> Result<(), Error> {
    if records.is_empty() {
        return Err(Error::Invalid("an append needs at least one record".into()));
    }
    args.extend(records.iter().map(AsRef::as_ref));
    Ok(())
}

fn unexpected(command: &str, v: &Value) -> Error {
    Error::Protocol(format!("{command} answered {v:?}"))
}

fn as_u64(v: &Value) -> Result<u64, Error> {
    match v {
        Value::Int(n) => {
            u64::try_from(*n).map_err(|_| Error::Protocol(format!("a negative number: {n}")))
        }
        other => Err(Error::Protocol(format!("not an integer: {other:?}"))),
    }
}

fn record(v: &Value) -> Result<Record, Error> {
    match v {
        Value::Array(f) if f.len() == 3 => Ok(Record {
            offset: as_u64(&f[0])?,
            token: as_u64(&f[1])?,
            payload: match &f[2] {
                Value::Bulk(b) => b.clone(),
                other => return Err(unexpected("LOG.READ", other)),
            },
        }),
        other => Err(unexpected("LOG.READ", other)),
    }
}

/// The leader's `host:port` in a `CLUSTER SLOTS` reply: the first node of
/// the first range.
fn leader_of(ranges: &[Value]) -> Option<String> {
    let Value::Array(range) = ranges.first()? else {
        return None;
    };
    let Value::Array(node) = range.get(2)? else {
        return None;
    };
    let host = match node.first()? {
        Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Simple(s) => s.clone(),
        _ => return None,
    };
    let Value::Int(port) = node.get(1)? else {
        return None;
    };
    // An IPv6 host needs its brackets to be an address with a port.
    if host.contains(':') {
        return Some(format!("[{host}]:{port}"));
    }
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_is_the_first_node_of_cluster_slots() {
        let node = |port| {
            Value::Array(vec![
                Value::Bulk(Bytes::from_static(b"127.0.0.1")),
                Value::Int(port),
                Value::Bulk(Bytes::from_static(b"0001")),
            ])
        };
        let ranges = vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            node(7380),
            node(7379),
        ])];
        assert_eq!(leader_of(&ranges).as_deref(), Some("127.0.0.1:7380"));
        let v6 = vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![
                Value::Bulk(Bytes::from_static(b"::1")),
                Value::Int(7380),
            ]),
        ])];
        assert_eq!(leader_of(&v6).as_deref(), Some("[::1]:7380"));
        assert_eq!(leader_of(&[]), None);
        assert_eq!(
            leader_of(&[Value::Array(vec![Value::Int(0), Value::Int(16383)])]),
            None
        );
    }

    #[test]
    fn only_reads_are_asked_again() {
        assert!(is_read(&[b"log.stat", b"s"]));
        assert!(is_read(&[b"LOG.READ", b"s", b"0"]));
        assert!(!is_read(&[b"LOG.APPENDAT", b"s"]));
        assert!(!is_read(&[b"LEASE.RENEW"]));
        assert!(!is_read(&[b"CLUSTER", b"ADDNODE"]));
        assert!(!is_read(&[]));
        assert!(answer_survives_retry(&[
            b"lease.acquire",
            b"l",
            b"me",
            b"100"
        ]));
        assert!(answer_survives_retry(&[b"LOG.READ", b"s", b"0"]));
        assert!(!answer_survives_retry(&[
            b"LEASE.RELEASE",
            b"l",
            b"me",
            b"7"
        ]));
        assert!(!answer_survives_retry(&[b"LOG.APPEND", b"s", b"1", b"x"]));
    }
}
