//! Open files: a server holds one per connection, plus the log's. The soft
//! limit many systems start with (1024) is far below the hard one, so the
//! server raises it at start, and keeps its connection limit within what
//! is left after the log's own files.

/// Files the server needs besides connections: the log's segment files
/// (its read budget, the segment being written and the one made ahead),
/// the lock and marks files, the listeners, standard streams, and a margin
/// for what the runtime and libraries open.
pub fn reserved_for_log(max_open_segments: usize) -> u64 {
    max_open_segments as u64 + 64
}

/// What [`raise_open_files_limit`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now (the hard limit, if raising worked).
    pub now: u64,
}

/// Raises the soft limit of open files to the hard limit.
pub fn raise_open_files_limit() -> std::io::Result<OpenFiles> {
    let (before, _) = rlimit::Resource::NOFILE.get()?;
    let now = rlimit::increase_nofile_limit(u64::MAX)?;
    Ok(OpenFiles { before, now })
}

/// The connections that fit: `wanted`, or fewer when the open-file limit
/// minus what the log needs is lower (at least 1).
pub fn connections_that_fit(wanted: usize, limit: u64, reserved: u64) -> usize {
    let room = limit.saturating_sub(reserved).max(1);
    wanted.min(usize::try_from(room).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_fit_what_is_left() {
        assert_eq!(connections_that_fit(10_000, 1024, 128), 896);
        assert_eq!(connections_that_fit(100, 1024, 128), 100);
        assert_eq!(connections_that_fit(100, 10, 128), 1);
    }
}
