//! The memory budget over all clients (`--maxmemory-clients`, as Redis'
//! `maxmemory-clients`): every connection reports the bytes it holds
//! (input buffer, parsed arguments, queued transaction, replies not yet
//! written, requests whose answers are pending); when their sum passes the
//! budget, the connection holding the most is told to go.
//!
//! Per-client limits (`--max-query-buffer`, `--client-output-buffer-limit`)
//! bound one client; this bounds the crowd: 300 clients each sending half
//! of a large request cannot together hold more than the budget.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The budget and what every connection holds now.
pub struct ClientMemory {
    budget_bytes: usize,
    /// Sum of every connection's bytes.
    total: AtomicUsize,
    /// What connections already told to go held when told: they free it as
    /// soon as they run, and counting it again would evict more clients
    /// than needed. Given back exactly when each goes.
    doomed: AtomicUsize,
    clients: Mutex<HashMap<u64, Arc<Gauge>>>,
    evicted: AtomicU64,
}

/// One connection's share.
struct Gauge {
    bytes: AtomicUsize,
    /// Set once, when the connection is told to go.
    evicted: AtomicBool,
    /// Why, with what it held then (added to `doomed`).
    why: Mutex<Option<Eviction>>,
    wake: Notify,
}

/// Why a connection was told to go: the numbers for its log event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Eviction {
    /// What the evicted client held when it was chosen.
    pub client_bytes: usize,
    /// What all clients held then.
    pub total_bytes: usize,
    /// `--maxmemory-clients`.
    pub budget_bytes: usize,
}

impl ClientMemory {
    /// A budget of `budget_bytes` over all clients.
    pub fn new(budget_bytes: usize) -> ClientMemory {
        ClientMemory {
            budget_bytes,
            total: AtomicUsize::new(0),
            doomed: AtomicUsize::new(0),
            clients: Mutex::new(HashMap::new()),
            evicted: AtomicU64::new(0),
        }
    }

    /// Registers connection `id`, holding nothing yet.
    pub fn register(self: &Arc<Self>, id: u64) -> ClientShare {
        let gauge = Arc::new(Gauge {
            bytes: AtomicUsize::new(0),
            evicted: AtomicBool::new(false),
            why: Mutex::new(None),
            wake: Notify::new(),
        });
        self.clients.lock().insert(id, Arc::clone(&gauge));
        ClientShare {
            memory: Arc::clone(self),
            gauge,
            id,
            parts: [AtomicUsize::new(0), AtomicUsize::new(0)],
        }
    }

    /// Bytes every client holds now.
    pub fn total_bytes(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// The budget.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Bytes connection `id` holds now (0 if it is gone).
    pub fn client_bytes(&self, id: u64) -> usize {
        self.clients
            .lock()
            .get(&id)
            .map_or(0, |g| g.bytes.load(Ordering::Relaxed))
    }

    /// Clients dropped so far for the budget.
    pub fn evicted_clients(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Whether the clients not yet told to go hold more than the budget:
    /// the check before [`ClientMemory::enforce`] takes the lock over every
    /// client (a connection's bytes change with each request; the lock is
    /// taken only when there is something to enforce).
    fn over(&self) -> bool {
        let total = self.total.load(Ordering::Acquire);
        let doomed = self.doomed.load(Ordering::Acquire);
        total.saturating_sub(doomed) > self.budget_bytes
    }

    /// While the clients not yet told to go hold more than the budget, tells
    /// the one holding the most to go.
    fn enforce(&self) {
        let clients = self.clients.lock();
        loop {
            let total = self.total.load(Ordering::Acquire);
            let doomed = self.doomed.load(Ordering::Acquire);
            if total.saturating_sub(doomed) <= self.budget_bytes {
                return;
            }
            let Some(victim) = clients
                .values()
                .filter(|g| !g.evicted.load(Ordering::Acquire))
                .max_by_key(|g| g.bytes.load(Ordering::Relaxed))
            else {
                return;
            };
            let bytes = victim.bytes.load(Ordering::Relaxed);
            if bytes == 0 {
                // Nothing left to take: the rest is being given back.
                return;
            }
            *victim.why.lock() = Some(Eviction {
                client_bytes: bytes,
                total_bytes: total,
                budget_bytes: self.budget_bytes,
            });
            victim.evicted.store(true, Ordering::Release);
            self.doomed.fetch_add(bytes, Ordering::AcqRel);
            self.evicted.fetch_add(1, Ordering::Relaxed);
            victim.wake.notify_one();
        }
    }
}

/// A connection's registration: reports its bytes, learns when it must go,
/// and gives its share back when dropped.
pub struct ClientShare {
    memory: Arc<ClientMemory>,
    gauge: Arc<Gauge>,
    id: u64,
    /// What the connection holds, and what a read it runs has gathered
    /// (reported by the read itself, between its steps).
    parts: [AtomicUsize; 2],
}

impl ClientShare {
    /// Reports that this connection holds `bytes` now (besides what a read
    /// it runs gathers); past the budget, the largest client (perhaps this
    /// one) is told to go.
    pub fn set(&self, bytes: usize) {
        self.set_part(0, bytes);
    }

    /// Reports what a read this connection runs has gathered so far.
    pub fn set_reading(&self, bytes: usize) {
        self.set_part(1, bytes);
    }

    fn set_part(&self, part: usize, bytes: usize) {
        let before = self.parts[part].swap(bytes, Ordering::AcqRel);
        if before == bytes {
            return;
        }
        if bytes > before {
            self.gauge.bytes.fetch_add(bytes - before, Ordering::AcqRel);
            self.memory
                .total
                .fetch_add(bytes - before, Ordering::AcqRel);
        } else {
            self.gauge.bytes.fetch_sub(before - bytes, Ordering::AcqRel);
            self.memory
                .total
                .fetch_sub(before - bytes, Ordering::AcqRel);
        }
        if bytes > before && !self.gauge.evicted.load(Ordering::Acquire) && self.memory.over() {
            self.memory.enforce();
        }
    }

    /// Whether this connection was told to go (and why).
    pub fn evicted(&self) -> Option<Eviction> {
        if !self.gauge.evicted.load(Ordering::Acquire) {
            return None;
        }
        *self.gauge.why.lock()
    }

    /// Resolves once this connection is told to go.
    pub async fn wait_evicted(&self) -> Eviction {
        loop {
            if let Some(why) = self.evicted() {
                return why;
            }
            self.gauge.wake.notified().await;
        }
    }
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        self.set(0);
        self.set_reading(0);
        let mut clients = self.memory.clients.lock();
        clients.remove(&self.id);
        // Under the lock `enforce` holds, so no eviction is half recorded.
        if let Some(why) = *self.gauge.why.lock() {
            self.memory
                .doomed
                .fetch_sub(why.client_bytes, Ordering::AcqRel);
        }
    }
}
