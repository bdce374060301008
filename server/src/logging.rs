//! Logs: `tracing` to stderr, as text or one JSON object per line
//! (`--log-format`), at `--log-level`; and the structured events SPEC §6
//! names, each with an `event` field a log pipeline can select on:
//!
//! | `event` | when |
//! |---|---|
//! | `stale_fencing_token` | a write was rejected STALE (stream, presented, highest, client address and name; rate-limited, with the count suppressed) |
//! | `lease_acquired`, `lease_lost`, `lease_expired` | a lease granted; a renewal refused LOST; leases found expired |
//! | `auth_failed` | a wrong password (AUTH or HELLO … AUTH) |
//! | `client_dropped` | a client disconnected for a limit (`reason`: query buffer, output buffer, maxmemory-clients) |
//! | `protocol_error` | a malformed request; the connection was closed |
//! | `http_request` | a request that looks like HTTP; the connection was closed |
//! | `connection_refused` | a connection over `--max-connections` (rate-limited) |
//!
//! No payload is ever logged: events carry names, numbers and addresses.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::EnvFilter;

/// The log flags every subcommand takes.
#[derive(clap::Args, Debug, Clone)]
pub struct LogOptions {
    /// How log lines look on stderr: text for people, json for machines
    /// (one object per line: timestamp, level, message, event, fields).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Which log lines are written: error, warn, info, debug or trace, or
    /// per module (`info,fencelog=debug`).
    #[arg(
        long,
        global = true,
        default_value = "info",
        env = "FENCELOG_LOG",
        value_name = "LEVEL"
    )]
    pub log_level: String,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber; an error names the flag.
pub fn init(opts: &LogOptions) -> Result<(), String> {
    let mut filter = EnvFilter::try_new(&opts.log_level)
        .map_err(|e| format!("invalid --log-level {:?}: {e}", opts.log_level))?;
    // Raft's own lines (every vote, every election step) are for debugging
    // it: warnings only, unless the level names openraft itself.
    if !opts.log_level.contains("openraft")
        && let Ok(quiet) = "openraft=warn".parse()
    {
        filter = filter.add_directive(quiet);
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let done = match opts.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    done.map_err(|e| format!("cannot set up logging: {e}"))
}

/// At most [`RateLimit::PER_SECOND`] events of one kind per second; the
/// rest are counted, and the next event written carries that count as
/// `suppressed`. A client hammering stale writes (a benchmark rejects a
/// million a second) cannot flood the log, and nothing is silently lost.
pub struct RateLimit {
    /// The second (on [`crate::clock::coarse_ms`]) the count below is for.
    window: AtomicU64,
    in_window: AtomicU64,
    /// Striped: past the window's share every event adds here, from
    /// every connection thread.
    suppressed: fencelog::wal::StripedCounter,
}

impl RateLimit {
    /// Events written per second at most.
    pub const PER_SECOND: u64 = 10;

    /// Nothing written yet.
    pub fn new() -> RateLimit {
        RateLimit {
            window: AtomicU64::new(0),
            in_window: AtomicU64::new(0),
            suppressed: fencelog::wal::StripedCounter::new(),
        }
    }

    /// `Some(suppressed)` when this event is to be written (with the count
    /// of events suppressed since the last one written), `None` when it is
    /// suppressed.
    pub fn admit(&self) -> Option<u64> {
        let now = crate::clock::coarse_ms() / 1000;
        let window = self.window.load(Ordering::Relaxed);
        if now != window
            && self
                .window
                .compare_exchange(window, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.in_window.store(0, Ordering::Release);
        }
        // Past the window's share, only the count of suppressed events
        // changes, on this thread's own line of it (a line both connection
        // threads wrote cost a pipelined stale rejection 3 % of its user
        // CPU per atomic add).
        if self.in_window.load(Ordering::Acquire) < Self::PER_SECOND
            && self.in_window.fetch_add(1, Ordering::AcqRel) < Self::PER_SECOND
        {
            Some(self.suppressed.take())
        } else {
            self.suppressed.add(1);
            None
        }
    }

    /// Events suppressed and not yet reported.
    pub fn pending(&self) -> u64 {
        self.suppressed.get()
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// A client-supplied name (a stream, a lease, an owner, a client name) for
/// a log field: lossy UTF-8, cut at 256 bytes, control characters escaped
/// (a name is any bytes; a log line must stay one line).
pub fn name_field(b: &[u8]) -> String {
    let cut = &b[..b.len().min(256)];
    let mut out = String::with_capacity(cut.len());
    for c in String::from_utf8_lossy(cut).chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if b.len() > 256 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_and_counted() {
        let limit = RateLimit::new();
        let written: Vec<Option<u64>> = (0..25).map(|_| limit.admit()).collect();
        assert_eq!(written.iter().filter(|w| w.is_some()).count(), 10);
        assert_eq!(limit.pending(), 15);
    }

    #[test]
    fn names_stay_on_one_line() {
        assert_eq!(name_field(b"a\nb"), "a\\nb");
        assert_eq!(name_field(&[0xff, b'x']), "\u{fffd}x");
        assert!(name_field(&[b'x'; 300]).ends_with('…'));
    }
}
