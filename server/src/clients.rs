//! The connected clients, for `CLIENT LIST`, `CLIENT KILL` and `INFO`:
//! each connection registers what an operator needs to find it (id,
//! address, name, age, last command) and a switch that closes it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Every connection open now, by id.
#[derive(Default)]
pub struct Registry {
    clients: Mutex<BTreeMap<u64, Arc<ClientInfo>>>,
}

/// What `CLIENT LIST` shows of one connection.
pub struct ClientInfo {
    /// `CLIENT ID`.
    pub id: u64,
    /// The client's address.
    pub addr: SocketAddr,
    /// The server's end of the connection.
    pub laddr: Option<SocketAddr>,
    created: Instant,
    /// The last command's time on [`crate::clock::coarse_ms`].
    last_command_ms: AtomicU64,
    /// The last command's name (upper case), as `cmd=`.
    last_command: Mutex<&'static str>,
    name: Mutex<Option<Bytes>>,
    lib: Mutex<(Option<Bytes>, Option<Bytes>)>,
    proto: AtomicU8,
    /// Commands queued in a transaction (`multi=`), or -1 outside one.
    multi: Mutex<i64>,
    killed: AtomicBool,
    kill: Notify,
}

impl Registry {
    /// Registers a new connection; it leaves the list when the handle is
    /// dropped.
    pub fn register(
        self: &Arc<Self>,
        id: u64,
        addr: SocketAddr,
        laddr: Option<SocketAddr>,
    ) -> Registered {
        let info = Arc::new(ClientInfo {
            id,
            addr,
            laddr,
            created: Instant::now(),
            last_command_ms: AtomicU64::new(crate::clock::coarse_ms()),
            last_command: Mutex::new("NULL"),
            name: Mutex::new(None),
            lib: Mutex::new((None, None)),
            proto: AtomicU8::new(2),
            multi: Mutex::new(-1),
            killed: AtomicBool::new(false),
            kill: Notify::new(),
        });
        self.clients.lock().insert(id, Arc::clone(&info));
        Registered {
            registry: Arc::clone(self),
            info,
        }
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.clients.lock().len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `CLIENT LIST` text: one line per client, `key=value` fields as
    /// Redis writes them; `ids` keeps only those (`CLIENT LIST ID …`).
    pub fn list(&self, ids: Option<&[u64]>, memory: impl Fn(u64) -> usize) -> String {
        let clients: Vec<Arc<ClientInfo>> = self.clients.lock().values().cloned().collect();
        let mut out = String::new();
        for c in clients {
            if ids.is_some_and(|ids| !ids.contains(&c.id)) {
                continue;
            }
            c.write_line(&mut out, memory(c.id));
        }
        out
    }

    /// Closes the clients `filter` picks (not `skip`, the caller, unless
    /// told); answers how many.
    pub fn kill(&self, filter: impl Fn(&ClientInfo) -> bool, skip: Option<u64>) -> usize {
        let clients: Vec<Arc<ClientInfo>> = self.clients.lock().values().cloned().collect();
        let mut n = 0;
        for c in clients {
            if Some(c.id) == skip || !filter(&c) {
                continue;
            }
            if !c.killed.swap(true, Ordering::AcqRel) {
                n += 1;
            }
            c.kill.notify_one();
        }
        n
    }
}

impl ClientInfo {
    fn write_line(&self, out: &mut String, tot_mem: usize) {
        let now = self.created.elapsed();
        let idle_ms =
            crate::clock::coarse_ms().saturating_sub(self.last_command_ms.load(Ordering::Relaxed));
        let name = self.name.lock().clone();
        let (lib_name, lib_ver) = self.lib.lock().clone();
        let text = |b: &Option<Bytes>| {
            b.as_deref()
                .map(|b| String::from_utf8_lossy(b).replace(|c: char| c.is_whitespace(), "_"))
                .unwrap_or_default()
        };
        let _ = writeln!(
            out,
            "id={} addr={} laddr={} fd=-1 name={} age={} idle={} flags=N db=0 sub=0 psub=0 \
             ssub=0 multi={} tot-mem={} cmd={} user=default redir=-1 resp={} lib-name={} \
             lib-ver={}",
            self.id,
            self.addr,
            self.laddr.map(|a| a.to_string()).unwrap_or_default(),
            text(&name),
            now.as_secs(),
            idle_ms / 1000,
            *self.multi.lock(),
            tot_mem,
            self.last_command.lock().to_ascii_lowercase(),
            self.proto.load(Ordering::Relaxed),
            text(&lib_name),
            text(&lib_ver),
        );
    }
}

/// A connection's entry in the registry.
pub struct Registered {
    registry: Arc<Registry>,
    info: Arc<ClientInfo>,
}

impl Registered {
    /// What the list shows.
    pub fn info(&self) -> &ClientInfo {
        &self.info
    }

    /// Notes a command run now.
    pub fn command(&self, name: &'static str) {
        *self.info.last_command.lock() = name;
        self.info
            .last_command_ms
            .store(crate::clock::coarse_ms(), Ordering::Relaxed);
    }

    /// Notes the client's name, protocol and library, and the commands
    /// queued in its transaction.
    pub fn update(&self, name: Option<&Bytes>, proto: u8, queued: Option<usize>) {
        *self.info.name.lock() = name.cloned();
        self.info.proto.store(proto, Ordering::Relaxed);
        *self.info.multi.lock() = queued.map_or(-1, |n| n as i64);
    }

    /// `CLIENT SETINFO LIB-NAME|LIB-VER`.
    pub fn set_lib(&self, name: Option<Bytes>, ver: Option<Bytes>) {
        let mut lib = self.info.lib.lock();
        if name.is_some() {
            lib.0 = name;
        }
        if ver.is_some() {
            lib.1 = ver;
        }
    }

    /// Whether `CLIENT KILL` closed this connection.
    pub fn is_killed(&self) -> bool {
        self.info.killed.load(Ordering::Acquire)
    }

    /// Resolves once `CLIENT KILL` closes this connection. It holds the
    /// client's record, not this registration, so a connection can keep
    /// one across its waits instead of registering anew each time.
    pub fn killed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let info = Arc::clone(&self.info);
        async move {
            loop {
                let notified = info.kill.notified();
                if info.killed.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.clients.lock().remove(&self.info.id);
    }
}

impl ClientInfo {
    /// The client's name, if it set one.
    pub fn name(&self) -> Option<Bytes> {
        self.name.lock().clone()
    }
}
