//! What the server shares with every connection, and the log events that
//! need its state (rate limits, the leases granted here).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fencelog::Error;

use crate::budget::ClientMemory;
use crate::clients::Registry;
use crate::config::ServeConfig;
use crate::logging::{RateLimit, name_field};
use crate::outcome::error_reply;
use crate::protocol::Reply;
use crate::store::{Failure, LeaseState, Store};

/// What the server shares with every connection.
pub struct Context {
    /// What commands run against: the local log, or the replicated group.
    pub store: Arc<dyn Store>,
    /// The command line.
    pub config: ServeConfig,
    /// The server's own counters.
    pub stats: ServerStats,
    /// What every connection holds, against `--maxmemory-clients`.
    pub clients: Arc<ClientMemory>,
    /// The connections open now (`CLIENT LIST`, `CLIENT KILL`).
    pub registry: Arc<Registry>,
    /// Log events that are rate-limited or followed over time.
    pub events: EventLimits,
}

impl Context {
    /// The engine reads look at (in a group, this replica's current one).
    pub fn engine(&self) -> fencelog::Log {
        self.store.log()
    }
}

/// The server's own counters.
pub struct ServerStats {
    pub connections_total: AtomicU64,
    pub connections_now: AtomicU64,
    pub connections_refused: AtomicU64,
    /// Striped: every request adds to both, on every connection thread.
    pub commands: fencelog::wal::StripedCounter,
    pub bytes_in: fencelog::wal::StripedCounter,
    /// Transactions whose writes were submitted, and those rejected.
    pub transactions: AtomicU64,
    pub transactions_aborted: AtomicU64,
    /// Clients disconnected past `--max-query-buffer`.
    pub query_buffer_limit_disconnections: AtomicU64,
    /// Clients disconnected past `--client-output-buffer-limit`.
    pub output_buffer_limit_disconnections: AtomicU64,
    /// Connections closed for looking like HTTP.
    pub http_requests_refused: AtomicU64,
    /// Connections waiting in `BLOCK` or `WAIT` now.
    pub blocked_clients: AtomicU64,
    pub started: Instant,
}

impl ServerStats {
    /// All zero, started now.
    pub fn new() -> Self {
        ServerStats {
            connections_total: AtomicU64::new(0),
            connections_now: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            commands: fencelog::wal::StripedCounter::new(),
            bytes_in: fencelog::wal::StripedCounter::new(),
            transactions: AtomicU64::new(0),
            transactions_aborted: AtomicU64::new(0),
            query_buffer_limit_disconnections: AtomicU64::new(0),
            output_buffer_limit_disconnections: AtomicU64::new(0),
            http_requests_refused: AtomicU64::new(0),
            blocked_clients: AtomicU64::new(0),
            started: Instant::now(),
        }
    }
}

impl Default for ServerStats {
    fn default() -> Self {
        Self::new()
    }
}

/// Log events that need state: rate limits, and the leases granted here
/// (to tell when one expires).
#[derive(Default)]
pub struct EventLimits {
    /// `stale_fencing_token`.
    pub stale: RateLimit,
    /// `connection_refused`.
    pub refused: RateLimit,
    /// Leases granted through this server and not known to be over: name
    /// → (owner, token, when its ttl runs out unless renewed).
    pub leases: parking_lot::Mutex<std::collections::HashMap<Bytes, (Bytes, u64, Instant)>>,
}

/// Who sent a command, for log events.
#[derive(Clone, Debug)]
pub struct ClientTag {
    /// The connection's id.
    pub id: u64,
    /// The client's address.
    pub addr: std::net::SocketAddr,
    /// `CLIENT SETNAME`, if set.
    pub name: Option<Bytes>,
}

impl ClientTag {
    /// The name as log events show it.
    pub fn name_field(&self) -> String {
        self.name.as_deref().map(name_field).unwrap_or_default()
    }
}

/// Logs a `stale_fencing_token` event (rate-limited): the stream, the token
/// the client presented, the stream's highest, and who sent it. Never the
/// payload.
pub fn stale_event(ctx: &Context, client: &ClientTag, stream: &[u8], presented: u64, highest: u64) {
    if let Some(suppressed) = ctx.events.stale.admit() {
        tracing::warn!(
            event = "stale_fencing_token",
            stream = %name_field(stream),
            presented,
            highest,
            client_id = client.id,
            client_addr = %client.addr,
            client_name = %client.name_field(),
            suppressed,
            "stale fencing token rejected"
        );
    }
}

/// Logs the events an engine error stands for (a stale token, a lost
/// lease), with who caused it.
pub fn note_error(ctx: &Context, client: &ClientTag, stream: &[u8], e: &Error) {
    match e {
        Error::Stale { presented, highest } => {
            stale_event(ctx, client, stream, *presented, *highest)
        }
        Error::Aborted { cause, .. } => note_error(ctx, client, stream, cause),
        _ => {}
    }
}

/// The reply for a command that got no answer: the engine's refusal
/// (logged as its event), or where to go instead.
pub fn failure_reply(ctx: &Context, client: &ClientTag, key: &[u8], failure: Failure) -> Reply {
    match failure {
        Failure::Refused(e) => {
            note_error(ctx, client, key, &e);
            error_reply(&e)
        }
        Failure::Elsewhere(reply) => reply,
    }
}

/// Logs a `lease_acquired` event and remembers the grant, so that its
/// expiry can be logged too.
pub fn lease_granted(
    ctx: &Context,
    client: &ClientTag,
    name: &Bytes,
    owner: &Bytes,
    token: u64,
    ttl: Duration,
    fence: bool,
) {
    tracing::info!(
        event = "lease_acquired",
        lease = %name_field(name),
        owner = %name_field(owner),
        token,
        ttl_ms = ttl.as_millis() as u64,
        fence,
        client_addr = %client.addr,
        client_name = %client.name_field(),
        "lease acquired"
    );
    ctx.events
        .leases
        .lock()
        .insert(name.clone(), (owner.clone(), token, Instant::now() + ttl));
}

/// Logs `lease_expired` for every lease granted here whose ttl has run out
/// and that the store no longer shows live under the same token (it was
/// neither renewed nor released in time). Called once a second.
pub fn sweep_expired_leases(ctx: &Context) {
    let now = Instant::now();
    let due: Vec<(Bytes, Bytes, u64)> = ctx
        .events
        .leases
        .lock()
        .iter()
        .filter(|(_, (_, _, until))| *until <= now)
        .map(|(name, (owner, token, _))| (name.clone(), owner.clone(), *token))
        .collect();
    for (name, owner, token) in due {
        let state = ctx.store.lease_state(&name);
        let mut leases = ctx.events.leases.lock();
        match state {
            LeaseState::Live {
                token: live,
                remaining,
            } if live == token => {
                // Renewed: look again when the new ttl runs out.
                leases.insert(name, (owner, token, now + remaining));
            }
            // This node cannot tell any more (it stopped leading): the
            // grant is forgotten without a word.
            LeaseState::Unknown => {
                leases.remove(&name);
            }
            _ => {
                leases.remove(&name);
                drop(leases);
                tracing::info!(
                    event = "lease_expired",
                    lease = %name_field(&name),
                    owner = %name_field(&owner),
                    token,
                    "lease expired: neither renewed nor released within its ttl"
                );
            }
        }
    }
}
