//! A cut never lowers what was promised. Recovery cuts a torn tail, and
//! salvage cuts damage; both can take acknowledged entries with them (the
//! last synced epoch damaged at rest looks exactly like a torn write). What
//! broke before: the token counter and a stream's highest token restarted
//! from what was left, so a token was issued twice and a fenced-out writer
//! was accepted again. Now every token is covered by a durable ceiling
//! (`MARKS`) before it is acknowledged, and a cut raises every stream's
//! highest token and the lease counter to it.
//!
//! Also here: `lease_info` and a HELD answer show only durable grants, and a
//! read from a failing disk answers an error without harming the log.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fencelog::wal::{CrashMode, RecoveryMode, SimStorage, Storage, format};
use fencelog::{AcquireOptions, Error, Log, ManualClock, Options, Token};

fn t(n: u64) -> Token {
    Token::new(n).unwrap()
}

fn opts() -> Options {
    let mut o = Options::default();
    o.wal.segment_bytes = 64 << 10;
    o.wal.max_entry_bytes = 32 << 10;
    o.max_payload_bytes = 16 << 10;
    o
}

fn open(sim: &SimStorage, opts: Options) -> Result<Log, Error> {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    Log::open_on(
        storage,
        Arc::new(ManualClock::default()),
        Path::new("/db"),
        opts,
    )
}

/// The position of the newest record entry of the log's last segment.
fn last_entry(sim: &SimStorage) -> (std::path::PathBuf, u64) {
    let mut last = None;
    fencelog::wal::verify(
        sim,
        Path::new("/db"),
        |e| {
            if e.kind == fencelog::wal::EntryKind::Record {
                last = Some((e.segment, e.position));
            }
        },
        |_, _| {},
    )
    .unwrap();
    let (seg, pos) = last.unwrap();
    (Path::new("/db").join(format::segment_file_name(seg)), pos)
}

#[test]
fn a_torn_tail_cut_keeps_every_token_acknowledged_before() {
    let sim = SimStorage::new();
    let log = open(&sim, opts()).unwrap();
    log.append("a", t(5), &["a"]).unwrap();
    log.fence("b", t(900)).unwrap();
    let grant = log
        .acquire(
            "lock",
            "me",
            Duration::from_secs(5),
            AcquireOptions::default(),
        )
        .unwrap();
    // The last acknowledged write: the highest token of all.
    log.append("c", t(1000), &["last"]).unwrap();
    assert!(
        log.metrics().token_ceiling >= 1000,
        "acknowledged above the ceiling"
    );
    drop(log);
    // Damage at rest in the last synced epoch: indistinguishable from a
    // torn write, so it is cut (and reported) instead of refused.
    let image = sim.cut_power(CrashMode::LoseUnsynced);
    let (file, pos) = last_entry(&image);
    image.flip_bit(&file, pos + 30, 2).unwrap();
    let log = open(&image, opts()).unwrap();
    let cut = log
        .recovery_report()
        .cut
        .clone()
        .expect("the cut is reported");
    assert_eq!(cut.kind, fencelog::wal::CutKind::TornTail);
    // Stream c lost its record, but not its token: nothing below 1000 is
    // accepted anywhere, on any stream, even one never seen.
    for stream in ["a", "b", "c", "never-seen"] {
        let st = log.stat(stream).unwrap();
        assert!(
            st.highest_token >= 1000,
            "{stream}: highest {}",
            st.highest_token
        );
        assert!(matches!(
            log.append(stream, t(999), &["late"]),
            Err(Error::Stale { presented: 999, .. })
        ));
    }
    assert_eq!(log.stat("c").unwrap().next_offset, 0);
    // The lease counter moved past the floor: no token is issued twice.
    let next = log
        .acquire(
            "other",
            "you",
            Duration::from_secs(5),
            AcquireOptions::default(),
        )
        .unwrap();
    assert!(next.token > grant.token);
    assert!(next.token.get() > 1000);
    // And the floor outlives the next restart.
    let floor = log.metrics().token_floor;
    drop(log);
    let log = open(&image, opts()).unwrap();
    assert_eq!(log.metrics().token_floor, floor);
    assert!(log.stat("never-seen").unwrap().highest_token >= 1000);
}

#[test]
fn salvage_of_acknowledged_damage_raises_the_floor_too() {
    let sim = SimStorage::new();
    let log = open(&sim, opts()).unwrap();
    for i in 1..=200u64 {
        log.append(format!("s{}", i % 7), t(i), &[vec![i as u8; 300]])
            .unwrap();
    }
    drop(log);
    let image = sim.cut_power(CrashMode::LoseUnsynced);
    // Damage an early record of the last segment: later syncs prove it
    // was acknowledged.
    let mut first_in_last = None;
    let last_seg = *image_segments(&image).last().unwrap();
    fencelog::wal::verify(
        &image,
        Path::new("/db"),
        |e| {
            if e.kind == fencelog::wal::EntryKind::Record && e.segment == last_seg {
                first_in_last.get_or_insert(e.position);
            }
        },
        |_, _| {},
    )
    .unwrap();
    let file = Path::new("/db").join(format::segment_file_name(last_seg));
    image
        .flip_bit(&file, first_in_last.unwrap() + 40, 0)
        .unwrap();
    assert!(matches!(open(&image, opts()), Err(Error::Corrupt { .. })));
    let mut salvage = opts();
    salvage.wal.recovery = RecoveryMode::Salvage;
    let log = open(&image, salvage).unwrap();
    assert!(log.recovery_report().cut.is_some());
    for i in 0..7 {
        assert!(log.stat(format!("s{i}")).unwrap().highest_token >= 200);
    }
    assert!(matches!(
        log.fence("s3", t(199)),
        Err(Error::Stale { highest, .. }) if highest >= 200
    ));
}

fn image_segments(sim: &SimStorage) -> Vec<u64> {
    let mut segs: Vec<u64> = sim
        .list(Path::new("/db"))
        .unwrap()
        .iter()
        .filter_map(|n| format::parse_segment_file_name(n))
        .collect();
    segs.sort_unstable();
    segs
}

#[test]
fn a_clean_restart_does_not_raise_the_floor() {
    let sim = SimStorage::new();
    let log = open(&sim, opts()).unwrap();
    log.append("a", t(70_000), &["x"]).unwrap();
    drop(log);
    let log = open(&sim.cut_power(CrashMode::LoseUnsynced), opts()).unwrap();
    assert!(log.recovery_report().cut.is_none());
    assert_eq!(log.metrics().token_floor, 0);
    assert_eq!(log.stat("b").unwrap().highest_token, 0);
    log.append("b", t(1), &["fine"]).unwrap();
}

#[test]
fn lease_info_and_held_show_only_durable_grants() {
    let sim = SimStorage::new();
    sim.faults().only_on(".wal");
    let log = open(&sim, opts()).unwrap();
    // The grant's sync is slow, then fails: it never becomes durable.
    sim.faults().delay_syncs(Duration::from_millis(300));
    sim.faults().fail_sync_after(0);
    let acquirer = {
        let log = log.clone();
        std::thread::spawn(move || {
            log.acquire(
                "lock",
                "a",
                Duration::from_secs(10),
                AcquireOptions::default(),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    // The grant is decided but not durable: neither INFO nor a HELD answer
    // may show it.
    let info = log.lease_info("lock");
    let held = log.acquire(
        "lock",
        "b",
        Duration::from_secs(10),
        AcquireOptions::default(),
    );
    assert!(acquirer.join().unwrap().is_err());
    assert!(
        !matches!(info, Ok(Some(_))),
        "INFO showed a grant that never became durable: {info:?}"
    );
    assert!(
        !matches!(held, Err(Error::Held { .. })),
        "HELD cited a grant that never became durable"
    );
}

#[test]
fn a_read_from_a_failing_disk_answers_an_error_and_the_log_goes_on() {
    let sim = SimStorage::new();
    sim.faults().only_on(".wal");
    let log = open(&sim, opts()).unwrap();
    for i in 0..400u64 {
        log.append("s", t(1), &[vec![i as u8; 500]]).unwrap();
    }
    assert!(log.segments().len() > 2);
    sim.faults().fail_reads(true);
    assert!(matches!(log.read("s", 0, 10), Err(Error::Io(_))));
    sim.faults().fail_reads(false);
    // Nothing latched: reads and writes go on.
    assert_eq!(log.read("s", 0, 10).unwrap().len(), 10);
    log.append("s", t(1), &["after"]).unwrap();
    assert!(!log.has_failed());
}
