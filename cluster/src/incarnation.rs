//! A data directory's incarnation: a random `u64` (never 0) made once,
//! durably, when the directory is first initialized, in the file
//! `incarnation` beside `raft/`. A replaced or wiped disk starts a new
//! one. The group admits a member's incarnation with it (in its
//! [`Member`](crate::Member)); a node whose incarnation is not the one
//! admitted is refused by its peers' handshakes, so it neither votes nor
//! accepts entries until re-added (docs/CLUSTER.md).
//!
//! ```text
//! // incarnation: 16 lowercase hex digits, then "\n"
//! ```

use std::io::Write;
use std::path::Path;

/// The file's name, in the node's data directory.
pub const FILE: &str = "incarnation";

fn err(what: String) -> impl FnOnce(std::io::Error) -> crate::ClusterError {
    move |source| crate::ClusterError::Io { what, source }
}

/// The incarnation in `dir`, if the file is there.
pub(crate) fn read(dir: &Path) -> Result<Option<u64>, crate::ClusterError> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(format!("read {}", path.display()))(e)),
    };
    let t = text.trim_end_matches('\n');
    match u64::from_str_radix(t, 16) {
        Ok(n) if n != 0 && t.len() == 16 => Ok(Some(n)),
        _ => Err(crate::ClusterError::Io {
            what: format!("read {}", path.display()),
            source: std::io::Error::other(format!(
                "{t:?} is not an incarnation (16 hex digits, not all zero): the file is damaged"
            )),
        }),
    }
}

/// A new random incarnation (never 0).
pub(crate) fn fresh() -> Result<u64, crate::ClusterError> {
    loop {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).map_err(|e| crate::ClusterError::Io {
            what: "make an incarnation".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let n = u64::from_le_bytes(b);
        if n != 0 {
            return Ok(n);
        }
    }
}

/// Writes `incarnation` into `dir` durably: a temporary file written and
/// synced, renamed into place, the directory synced.
pub(crate) fn write(dir: &Path, incarnation: u64) -> Result<(), crate::ClusterError> {
    let path = dir.join(FILE);
    let what = || format!("write {}", path.display());
    std::fs::create_dir_all(dir).map_err(err(what()))?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp).map_err(err(what()))?;
        f.write_all(format!("{incarnation:016x}\n").as_bytes())
            .map_err(err(what()))?;
        f.sync_all().map_err(err(what()))?;
    }
    std::fs::rename(&tmp, &path).map_err(err(what()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(what()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incarnation_is_written_durably_read_back_and_a_damaged_one_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("n1");
        assert_eq!(read(&dir).unwrap(), None);
        let n = fresh().unwrap();
        write(&dir, n).unwrap();
        assert_eq!(read(&dir).unwrap(), Some(n));
        assert_ne!(fresh().unwrap(), n);
        std::fs::write(dir.join(FILE), "zz\n").unwrap();
        assert!(read(&dir).is_err());
    }
}
