//! Helpers shared by the integration tests in `tests/`, and the history
//! checker the cluster's fault tests use.

pub mod history;

use std::path::Path;

use fencelog_wal::{EntryKind, FsStorage, VerifyReport};

/// Runs the offline verifier over a data directory; answers its report and
/// the number of checkpoint and record entries it visited.
pub fn verify(dir: &Path) -> (VerifyReport, u64, u64) {
    let (mut checkpoints, mut records) = (0, 0);
    let report = fencelog_wal::verify(
        &FsStorage,
        dir,
        |e| match e.kind {
            EntryKind::Checkpoint => checkpoints += 1,
            EntryKind::Record => records += 1,
            EntryKind::Link => {}
        },
        |_, _| {},
    )
    .expect("verify runs");
    (report, checkpoints, records)
}
