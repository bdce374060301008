//! The basic contract: what is appended and synced reads back, across
//! reopen, rotation and sealing.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use fencelog_wal::{FsStorage, SimStorage, Storage, WalError};

#[test]
fn append_read_reopen_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let opts = small_opts();
    let mut written = Vec::new();
    {
        let (wal, report) = open(&storage, dir.path(), &opts).unwrap();
        assert_eq!(report.entries_replayed, 0);
        for n in 0..2000u32 {
            let p = payload(1, n, (n as usize * 7) % 300);
            let at = append_durable(&wal, &p).unwrap();
            written.push((at, p));
        }
        for (at, p) in &written {
            let e = wal.read_entry(at.segment, at.position).unwrap();
            assert_eq!(&e.payload[..], &p[..]);
            assert_eq!(e.lsn, at.lsn);
        }
        assert!(wal.segments().len() > 5, "small segments rotate");
        wal.close().unwrap();
    }
    let (wal, report) = open(&storage, dir.path(), &opts).unwrap();
    assert!(report.cut.is_none(), "{report:?}");
    // Back to the newest checkpoint: at most three segments in the test log.
    assert!(report.scanned_segments <= 3, "{report:?}");
    wal.with_state(|c| assert_eq!(c.records, 2000));
    for (at, p) in &written {
        let e = wal.read_entry(at.segment, at.position).unwrap();
        assert_eq!(&e.payload[..], &p[..]);
    }
    drop(wal);
    let all = all_records(storage.as_ref(), dir.path());
    assert_eq!(all.len(), 2000);
    for ((lsn, bytes), (at, p)) in all.iter().zip(&written) {
        assert_eq!(*lsn, at.lsn);
        assert_eq!(bytes, p);
    }
}

#[test]
fn second_open_of_a_directory_in_use_is_refused() {
    let sim: Arc<dyn Storage> = Arc::new(SimStorage::new());
    let dir = Path::new("/db");
    let (_wal, _) = open(&sim, dir, &small_opts()).unwrap();
    match open(&sim, dir, &small_opts()) {
        Err(WalError::Locked { dir: d }) => assert_eq!(d, dir),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a second open of a locked directory succeeded"),
    }
}
