//! Logs the engine writes — with rotation, trims, deletes, garbage
//! collection and leases — pass the write-ahead log's offline verifier, and
//! the verifier refuses to run on a directory the engine has open.

use std::time::Duration;

use fencelog::{AcquireOptions, Error, Log, Options, Token};
use fencelog_tests::verify;

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 256 << 10;
    o.wal.max_entry_bytes = 64 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

#[test]
fn engine_logs_verify_clean_through_rotation_trim_and_gc() {
    let dir = tempfile::tempdir().unwrap();
    let t = |n| Token::new(n).unwrap();
    {
        let log = Log::open(dir.path(), opts()).unwrap();
        for i in 0..3000u64 {
            let payload = vec![(i % 251) as u8; 200 + (i % 7) as usize * 100];
            log.append(format!("s{}", i % 5), t(1 + i / 500), &[&payload])
                .unwrap();
            if i % 700 == 0 {
                log.acquire(
                    "lock",
                    format!("o{i}"),
                    Duration::from_secs(60),
                    AcquireOptions::default(),
                )
                .map(|g| log.release("lock", format!("o{i}"), g.token).unwrap())
                .unwrap();
            }
        }
        let before = log.segments().len();
        // Trim most of everything: old segments go.
        for s in 0..5 {
            let next = log.stat(format!("s{s}")).unwrap().next_offset;
            log.trim(format!("s{s}"), t(100), next - 10).unwrap();
        }
        log.append("s0", t(100), &["after the trims"]).unwrap();
        // The collector removes them in the background: on a loaded
        // machine it may need a moment (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while log.segments().len() >= before && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            log.segments().len() < before,
            "{} -> {}",
            before,
            log.segments().len()
        );

        // The verifier refuses a directory in use.
        let in_use = fencelog_wal::verify(&fencelog_wal::FsStorage, dir.path(), |_| {}, |_, _| {});
        assert!(matches!(in_use, Err(fencelog_wal::WalError::Locked { .. })));
    }
    let (report, checkpoints, records) = verify(dir.path());
    assert!(!report.is_damaged(), "{report:#?}");
    assert_eq!(
        checkpoints as usize,
        report.segments.iter().filter(|s| s.entries > 0).count()
    );
    assert!(records > 0);

    // And the engine reopens on it with everything in place.
    let log = Log::open(dir.path(), opts()).unwrap();
    for s in 0..5 {
        let st = log.stat(format!("s{s}")).unwrap();
        assert_eq!(st.highest_token, 100);
        assert_eq!(
            log.read(format!("s{s}"), st.start_offset, 100)
                .unwrap()
                .len() as u64,
            st.records
        );
        assert!(matches!(
            log.read(format!("s{s}"), 0, 1),
            Err(Error::Trimmed { .. })
        ));
    }
}
