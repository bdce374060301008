//! What `fencelog serve` is told on its command line.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
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
    /// Bytes of requests one connection may hold before they run: unparsed
    /// input, arguments of the request not yet complete, commands queued in
    /// a transaction (Redis' `client-query-buffer-limit`). Past it the
    /// client is disconnected. Default 64 MiB; at least `--max-bulk-bytes`
    /// plus 64 KiB.
    pub max_query_buffer_bytes: usize,
    /// Bytes of replies one connection may hold unwritten (Redis'
    /// `client-output-buffer-limit`, hard limit): past it the client is
    /// disconnected. A connection whose client does not read stops running
    /// its requests long before (it stalls), so this is reached by one
    /// reply too large to go out, such as an EXEC of many reads. Default
    /// 32 MiB; at least the largest `LOG.READ` reply (see
    /// [`ServeConfig::largest_read_reply_bytes`]).
    pub client_output_buffer_limit_bytes: usize,
    /// Bytes all connections together may hold (input, parsed arguments,
    /// queued transactions, pending and unwritten replies; Redis'
    /// `maxmemory-clients`). Past it the connection holding the most is
    /// dropped. Default 512 MiB.
    pub maxmemory_clients_bytes: usize,
    /// Payload bytes one `LOG.READ` answers at most (always at least one
    /// record if there is one). Default 16 MiB.
    pub max_read_bytes: u64,
    /// Requests one connection may have in flight (pipelined, unanswered).
    pub max_pipeline: usize,
    /// Connections at once.
    pub max_connections: usize,
    /// Threads that serve connections, each a single-threaded runtime that
    /// owns its connections for their whole life (see `docs/DESIGN.md`,
    /// "Threads"). Default: one per CPU; at least 1.
    pub threads: usize,
    /// The passes of those threads' event loops, one member each (thread
    /// `i` is member `i`): the single node's log syncs once they end.
    /// `None` in cluster mode, where the engine's log is not synced per
    /// batch and nothing waits for passes (the threads report none).
    pub turns: Option<std::sync::Arc<fencelog::wal::Turns>>,
    /// How the server was started, flag by flag, for `CONFIG GET`: every
    /// flag of `fencelog serve` with the value in force (sizes in bytes).
    pub flags: Vec<(String, String)>,
    /// How long shutdown waits for connections to hand out their last
    /// answers before closing them. Default 1 s.
    pub shutdown_grace: std::time::Duration,
    /// Cluster mode (`--cluster-node-id` and the other `--cluster-*`
    /// flags); `None`: a single node.
    pub cluster: Option<crate::cluster::ClusterConfig>,
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
        // The Raft port is the group itself: whoever speaks on it votes
        // and replicates. Off loopback, only peers that prove the secret.
        if let Some(c) = &self.cluster
            && c.secret.is_none()
            && !c.raft_addr.ip().is_loopback()
        {
            return Err(format!(
                "refusing to listen for cluster peers on {} without a cluster secret: set \
                 --cluster-secret-file (the same file on every member; see docs/CLUSTER.md, \
                 \"Security\")",
                c.raft_addr
            ));
        }
        if self.limits.max_bulk_bytes < self.engine.max_payload_bytes as usize {
            return Err(format!(
                "--max-bulk-bytes ({}) must be at least --max-payload ({})",
                self.limits.max_bulk_bytes, self.engine.max_payload_bytes
            ));
        }
        // Room for one largest argument with its command and framing: else
        // a payload the protocol allows would always disconnect its client.
        let room = self.limits.max_bulk_bytes.saturating_add(64 << 10);
        if self.max_query_buffer_bytes < room {
            return Err(format!(
                "--max-query-buffer ({}) must be at least --max-bulk-bytes + 64 KiB ({room})",
                self.max_query_buffer_bytes
            ));
        }
        if self.max_pipeline == 0 || self.max_connections == 0 {
            return Err("--max-pipeline and --max-connections must be at least 1".into());
        }
        if self.max_read_bytes == 0 {
            return Err("--max-read-bytes must be at least 1".into());
        }
        let largest = self.largest_read_reply_bytes();
        if self.client_output_buffer_limit_bytes < largest {
            return Err(format!(
                "--client-output-buffer-limit ({}) must hold the largest LOG.READ reply: \
                 --max-read-bytes + --max-payload + 64 bytes per record ({largest})",
                self.client_output_buffer_limit_bytes
            ));
        }
        if self.maxmemory_clients_bytes < self.max_query_buffer_bytes {
            return Err(format!(
                "--maxmemory-clients ({}) must be at least --max-query-buffer ({})",
                self.maxmemory_clients_bytes, self.max_query_buffer_bytes
            ));
        }
        self.engine
            .validate()
            .map_err(|e| engine_error_in_flags(&e))
    }

    /// The largest reply one `LOG.READ` can give: `--max-read-bytes` of
    /// payload, plus one record over it (a read answers at least one
    /// record, up to `--max-payload`), plus the framing of every record.
    pub fn largest_read_reply_bytes(&self) -> usize {
        let framing = 64 * self.engine.max_read_records as usize;
        usize::try_from(self.max_read_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(self.engine.max_payload_bytes as usize)
            .saturating_add(framing)
    }
}

/// The engine's `Error::Invalid` names its own fields (`segment_bytes`,
/// `max_payload_bytes`); a person typed flags. Answers the error in the
/// words of the flags that set those fields.
pub fn engine_error_in_flags(e: &fencelog::Error) -> String {
    match e {
        fencelog::Error::Invalid { what, reason } => {
            let flag = match *what {
                "segment_bytes" => "--segment-bytes",
                "max_payload_bytes" => "--max-payload",
                "max_open_segments" => "--max-open-segments",
                // Derived from --max-bulk-bytes and --segment-bytes (an
                // entry holds one request, at most half a segment).
                "max_entry_bytes" => "--max-bulk-bytes / --segment-bytes",
                other => other,
            };
            // The reason may quote the field too.
            let reason = reason
                .replace("wal.max_entry_bytes", "the largest entry")
                .replace("max_entry_bytes", "the largest entry");
            format!("invalid {flag}: {reason}")
        }
        other => other.to_string(),
    }
}

/// The port clients connect to by default.
pub const DEFAULT_PORT: u16 = 7379;

/// Parses an address as people type it: `127.0.0.1:7379`, `[::1]:7379`,
/// `localhost:7379`, a port alone (`7379`, meaning 127.0.0.1), or a host
/// alone (`localhost`, `0.0.0.0`: the default port). A name resolves to
/// its first IPv4 address if it has one.
///
/// # Examples
///
/// ```
/// use fencelog_server::config::parse_addr;
/// assert_eq!(parse_addr("7000").unwrap().to_string(), "127.0.0.1:7000");
/// assert_eq!(parse_addr("localhost:7000").unwrap().port(), 7000);
/// assert_eq!(parse_addr("0.0.0.0").unwrap().to_string(), "0.0.0.0:7379");
/// assert!(parse_addr("localhost:99999").is_err());
/// ```
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    parse_addr_with_port(text, DEFAULT_PORT)
}

/// As [`parse_addr`], with `default_port` where only a host is given.
pub fn parse_addr_with_port(text: &str, default_port: u16) -> Result<SocketAddr, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("an empty address: use HOST:PORT, HOST or PORT".into());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        let port = text
            .parse::<u16>()
            .map_err(|_| format!("port {text} is not between 0 and 65535"))?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = text.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    // HOST:PORT with a name, or a name alone.
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            let port = port
                .parse::<u16>()
                .map_err(|_| format!("{port:?} in {text:?} is not a port (0 to 65535)"))?;
            (host, port)
        }
        Some(_) => {
            return Err(format!(
                "{text:?} is not an address: write IPv6 as [::1]:7379"
            ));
        }
        None => (text, default_port),
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{host:?} resolves to no address"))
}

/// Parses a size as people type it: `4096`, `64KiB`, `16MiB`, `1GiB`
/// (powers of 1024) or `64KB`, `1MB`, `1GB` (powers of 1000), `B` optional,
/// case-insensitive, an optional space before the unit.
///
/// # Examples
///
/// ```
/// use fencelog_server::config::parse_size;
/// assert_eq!(parse_size("64MiB"), Ok(64 << 20));
/// assert_eq!(parse_size("1MB"), Ok(1_000_000));
/// assert_eq!(parse_size("4096"), Ok(4096));
/// assert!(parse_size("1M").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, 64KiB, 16MiB, 1MB)"))?;
    let unit = unit.trim_start().to_ascii_lowercase();
    let factor: u64 = match unit.as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}: use B, KiB, MiB, GiB (1024) or KB, MB, GB (1000)"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_as_people_type_them() {
        let v4 = |s: &str| parse_addr(s).map(|a| a.to_string());
        assert_eq!(v4("7379").unwrap(), "127.0.0.1:7379");
        assert_eq!(v4("0").unwrap(), "127.0.0.1:0");
        assert_eq!(v4("localhost:7000").unwrap(), "127.0.0.1:7000");
        assert_eq!(v4("localhost").unwrap(), "127.0.0.1:7379");
        assert_eq!(v4("0.0.0.0").unwrap(), "0.0.0.0:7379");
        assert_eq!(v4("[::1]:80").unwrap(), "[::1]:80");
        assert_eq!(v4("::1").unwrap(), "[::1]:7379");
        assert!(parse_addr("70000").is_err());
        assert!(parse_addr("localhost:x").is_err());
        assert!(parse_addr("").is_err());
    }

    #[test]
    fn engine_errors_name_flags_not_fields() {
        let e = fencelog::Error::Invalid {
            what: "segment_bytes",
            reason: "1 is below the minimum of 65536".into(),
        };
        let text = engine_error_in_flags(&e);
        assert!(text.contains("--segment-bytes"), "{text}");
        assert!(!text.contains("segment_bytes"), "{text}");
    }

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("16KiB"), Ok(16 << 10));
        assert_eq!(parse_size("16 kib"), Ok(16 << 10));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("512b"), Ok(512));
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("1.5MiB").is_err());
        assert!(parse_size("1TiB").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
    }
}
