//! The README's examples, as tests: what the first screen promises holds.

use std::time::Duration;

use fencelog::{AcquireOptions, Error, Log, Options, Token};

#[test]
fn the_failure_fencelog_prevents() -> Result<(), Error> {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path().join("fencelog-data"), Options::default())?;
    log.append("jobs", Token::new(7)?, &["step 1 by A"])?;
    log.fence("jobs", Token::new(8)?)?;
    assert!(matches!(
        log.append("jobs", Token::new(7)?, &["step 2 by A"]),
        Err(Error::Stale {
            presented: 7,
            highest: 8
        })
    ));
    // Nothing changed, and it stays that way after a restart.
    drop(log);
    let log = Log::open(dir.path().join("fencelog-data"), Options::default())?;
    let records = log.read("jobs", 0, 10)?;
    assert_eq!(records.len(), 1);
    assert_eq!(&records[0].payload[..], b"step 1 by A");
    assert_eq!(log.stat("jobs")?.highest_token, 8);

    let grant = log.acquire(
        "jobs",
        "worker-b",
        Duration::from_secs(10),
        AcquireOptions {
            fence: true,
            ..Default::default()
        },
    )?;
    assert!(grant.token.get() > 8);
    log.append("jobs", grant.token, &["B's first step"])?;
    log.renew("jobs", "worker-b", grant.token, Duration::from_secs(10))?;
    assert!(matches!(
        log.append("jobs", Token::new(8)?, &["late"]),
        Err(Error::Stale { .. })
    ));
    Ok(())
}
