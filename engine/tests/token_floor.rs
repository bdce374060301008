//! What a cut raises. A torn tail follows the last sync: it was never
//! acknowledged, and cutting it raises nothing (every byte and operation of
//! that is swept in `power_cut_tokens.rs`). Salvage drops acknowledged
//! entries on purpose: it raises the token floor to the durable ceiling
//! (`MARKS`, which covers every token before it is acknowledged), so the
//! token counter and every stream's highest token restart above every token
//! that could have been acknowledged, and it says by how much. What broke
//! before salvage raised it: the token counter and a stream's highest token
//! restarted from what was left, so a token was issued twice and a
//! fenced-out writer was accepted again. What broke when torn tails raised
//! it too: one power cut fenced out every writer with a counter of its own.
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

/// Damage at rest to the newest synced epoch, with nothing written after
/// it, looks exactly like a torn write: no later entry proves it was
/// synced. That is what recovery cannot know; it is cut as a torn tail,
/// reported, and raises nothing. Everything a later write proves synced is
/// kept, tokens included. (Before, this cut raised every stream to the
/// ceiling, 65 536 above the last token; the assertions that stream "c"
/// kept token 1000 and that "a", "b" and a never-seen stream refused 999
/// encoded that floor and are gone: "c" is back to what survives.)
#[test]
fn damage_to_the_newest_synced_epoch_is_cut_as_a_torn_tail_and_raises_nothing() {
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
    drop(log);
    let image = sim.cut_power(CrashMode::LoseUnsynced);
    let (file, pos) = last_entry(&image);
    image.flip_bit(&file, pos + 30, 2).unwrap();
    let log = open(&image, opts()).unwrap();
    let report = log.recovery_report().clone();
    let cut = report.cut.clone().expect("the cut is reported");
    assert_eq!(cut.kind, fencelog::wal::CutKind::TornTail);
    assert_eq!(cut.position, pos);
    assert!(report.floor_raised.is_none(), "{report:?}");
    assert_eq!(log.metrics().token_floor, 0);
    // Proven synced by later entries: kept, with their tokens.
    assert_eq!(log.stat("a").unwrap().highest_token, 5);
    assert_eq!(log.stat("b").unwrap().highest_token, 900);
    assert!(matches!(
        log.append("b", t(899), &["late"]),
        Err(Error::Stale {
            presented: 899,
            highest: 900
        })
    ));
    // The cut entry's stream: what survives, and nothing else.
    let c = log.stat("c").unwrap();
    assert_eq!((c.highest_token, c.next_offset), (0, 0));
    assert_eq!(log.stat("never-seen").unwrap().highest_token, 0);
    // The grant survived: the lease counter goes on above it.
    let next = log
        .acquire(
            "other",
            "you",
            Duration::from_secs(5),
            AcquireOptions::default(),
        )
        .unwrap();
    assert!(next.token > grant.token);
    // Writers with tokens of their own go on where they were.
    log.append("a", t(6), &["next"]).unwrap();
    drop(log);
    let log = open(&image, opts()).unwrap();
    assert!(log.recovery_report().cut.is_none());
    assert_eq!(log.metrics().token_floor, 0);
    assert_eq!(log.stat("a").unwrap().highest_token, 6);
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
    let report = log.recovery_report().clone();
    assert_eq!(
        report.cut.as_ref().map(|c| c.kind),
        Some(fencelog::wal::CutKind::Salvaged)
    );
    // It says so, and by how much: from the old floor to the ceiling.
    let raise = report.floor_raised.expect("salvage reports its raise");
    assert_eq!(raise.from, 0);
    assert!(raise.to >= 200, "{raise:?}");
    assert_eq!(log.metrics().token_floor, raise.to);
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
