//! A tiny layer above the log for tests: it counts records, checkpoints the
//! count, and can read back every record of a directory.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use fencelog_wal::{
    Appended, EntryKind, Replay, Sequencer, Storage, Ticket, Wal, WalError, WalOptions,
};

/// Counts the records in the log; the count is its checkpoint.
pub struct Counter {
    pub records: u64,
    pub sealed: Vec<u64>,
}

impl Sequencer for Counter {
    type Effect = ();

    /// Every third segment opens with a checkpoint, the others with a link:
    /// replay often starts a few segments back.
    fn checkpoint(&mut self, segment: u64, _since: u64) -> Option<Vec<u8>> {
        (segment % 3 == 1).then(|| self.records.to_le_bytes().to_vec())
    }

    fn seal(&mut self, segment: u64) -> (fencelog_wal::FooterPayload, Option<()>) {
        self.sealed.push(segment);
        let footer = format!("segment {segment} sealed after {} records", self.records);
        // Made later, by the sync thread, as the engine's footer is.
        let payload = fencelog_wal::FooterPayload::Later(Box::new(move |b: &mut Vec<u8>| {
            b.extend_from_slice(footer.as_bytes())
        }));
        (payload, None)
    }
}

pub fn build(replay: Replay<'_>) -> Result<Counter, WalError> {
    Ok(Counter {
        records: count_records(replay)?,
        sealed: Vec::new(),
    })
}

/// The records a log holds, from its newest checkpoint (a count) and the
/// records replayed after it.
pub fn count_records(replay: Replay<'_>) -> Result<u64, WalError> {
    let mut records = 0;
    for e in replay.entries() {
        match e.kind {
            EntryKind::Checkpoint => {
                let b: [u8; 8] = e.payload[..]
                    .try_into()
                    .map_err(|_| e.corrupt("a checkpoint of the wrong length"))?;
                records = u64::from_le_bytes(b);
            }
            EntryKind::Record => records += 1,
            EntryKind::Link => {}
        }
    }
    Ok(records)
}

pub fn open(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    opts: &WalOptions,
) -> Result<(Wal<Counter>, fencelog_wal::RecoveryReport), WalError> {
    Wal::open(Arc::clone(storage), dir, opts.clone(), build)
}

/// The directory of logs on a simulated disk.
pub const SIM_DIR: &str = "/db";

/// A log with `opts` in [`SIM_DIR`] of a fresh simulated disk, which comes
/// back too (to damage or cut it).
pub fn open_sim(opts: &WalOptions) -> (fencelog_wal::SimStorage, Wal<Counter>) {
    let sim = fencelog_wal::SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let (wal, _) = open(&storage, Path::new(SIM_DIR), opts).expect("a log opens on an empty disk");
    (sim, wal)
}

/// A log with `opts` in a fresh temporary directory on the real file
/// system, removed when the returned directory is dropped.
pub fn open_fs(opts: &WalOptions) -> (tempfile::TempDir, Wal<Counter>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let storage: Arc<dyn Storage> = Arc::new(fencelog_wal::FsStorage);
    let (wal, _) = open(&storage, dir.path(), opts).expect("a log opens in an empty directory");
    (dir, wal)
}

/// Small segments so that rotation and sealing happen all the time.
pub fn small_opts() -> WalOptions {
    WalOptions {
        segment_bytes: 64 << 10,
        max_entry_bytes: 16 << 10,
        max_batch_bytes: 32 << 10,
        ..WalOptions::default()
    }
}

/// A payload that says who wrote it: writer, number, then filler.
pub fn payload(writer: u32, n: u32, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(len.max(8));
    p.extend_from_slice(&writer.to_le_bytes());
    p.extend_from_slice(&n.to_le_bytes());
    let mut x = (u64::from(writer) << 32 | u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while p.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.push(x as u8);
    }
    p
}

/// Appends one record and counts it; answers where it went and its ticket.
pub fn append(wal: &Wal<Counter>, bytes: &[u8]) -> Result<(Appended, Ticket), WalError> {
    wal.submit(|w| {
        let at = w.append(bytes.len(), |buf| buf.copy_from_slice(bytes))?;
        w.state().records += 1;
        Ok((at, w.ticket()))
    })?
}

/// As [`append`], then waits until the record is durable; answers where
/// it went.
pub fn append_durable(wal: &Wal<Counter>, bytes: &[u8]) -> Result<Appended, WalError> {
    let (at, ticket) = append(wal, bytes)?;
    ticket.wait()?;
    Ok(at)
}

/// One durable entry of each length in `lens`, writer `writer`'s
/// [`payload`] number 0, 1, …: where each went and what it holds.
pub fn append_lens(
    wal: &Wal<Counter>,
    writer: u32,
    lens: impl IntoIterator<Item = usize>,
) -> Vec<(Appended, Vec<u8>)> {
    lens.into_iter()
        .enumerate()
        .map(|(n, len)| {
            let p = payload(writer, n as u32, len);
            let at = append_durable(wal, &p).expect("a durable append");
            (at, p)
        })
        .collect()
}

/// As [`append`], from an async task: waits for room without blocking
/// its runtime's thread.
pub async fn append_async(
    wal: &Wal<Counter>,
    bytes: &[u8],
) -> Result<(Appended, Ticket), WalError> {
    wal.submit_async(|w| {
        let at = w.append(bytes.len(), |buf| buf.copy_from_slice(bytes))?;
        w.state().records += 1;
        Ok((at, w.ticket()))
    })
    .await?
}

/// Every record in the directory, in log order: (lsn, payload).
pub fn all_records(storage: &dyn Storage, dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let report = fencelog_wal::verify(
        storage,
        dir,
        |e| {
            if e.kind == EntryKind::Record {
                out.push((e.lsn, e.payload.to_vec()));
            }
        },
        |_, _| {},
    )
    .expect("verify");
    assert!(!report.is_damaged(), "verify found damage: {report:#?}");
    out
}

/// The number of cases: `default`, or `PROPTEST_CASES` for a deeper run.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
