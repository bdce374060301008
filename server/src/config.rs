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
    /// How long shutdown waits for connections to hand out their last
    /// answers before closing them. Default 1 s.
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
        self.engine.validate().map_err(|e| e.to_string())
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
