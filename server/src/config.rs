//! What `fencelog serve` is told on its command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::protocol::Limits;

/// The server's configuration, checked before it binds anything.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The data directory.
    pub dir: PathBuf,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The password every client must give (AUTH or HELLO … AUTH).
    pub requirepass: Option<String>,
    /// Where Prometheus scrapes `/metrics`.
    pub metrics_addr: Option<SocketAddr>,
    /// Serve a non-loopback address without a password: deliberate only.
    pub allow_unauthenticated_remote: bool,
    /// The engine's options (payload limit, segment size, …).
    pub engine: fencelog::Options,
    /// Protocol limits per request.
    pub limits: Limits,
    /// Bytes of unparsed requests one connection may buffer.
    pub max_query_buffer_bytes: usize,
    /// Requests one connection may have in flight (pipelined, unanswered).
    pub max_pipeline: usize,
    /// Connections at once.
    pub max_connections: usize,
    /// How long shutdown waits for connections to finish their command.
    pub shutdown_grace: std::time::Duration,
}

impl ServeConfig {
    /// Refuses configurations that are unsafe or inconsistent.
    pub fn check(&self) -> Result<(), String> {
        if self.requirepass.is_none()
            && !self.addr.ip().is_loopback()
            && !self.allow_unauthenticated_remote
        {
            return Err(format!(
                "refusing to serve {} without a password: set --requirepass, or pass \
                 --allow-unauthenticated-remote if this is deliberate",
                self.addr
            ));
        }
        if self.requirepass.as_deref() == Some("") {
            return Err("--requirepass must not be empty".into());
        }
        if self.limits.max_bulk_bytes < self.engine.max_payload_bytes as usize {
            return Err(format!(
                "--max-bulk-bytes ({}) must be at least --max-payload ({})",
                self.limits.max_bulk_bytes, self.engine.max_payload_bytes
            ));
        }
        if self.max_query_buffer_bytes < self.limits.max_bulk_bytes {
            return Err("--max-query-buffer must be at least --max-bulk-bytes".into());
        }
        if self.max_pipeline == 0 || self.max_connections == 0 {
            return Err("--max-pipeline and --max-connections must be at least 1".into());
        }
        self.engine.validate().map_err(|e| e.to_string())
    }
}
