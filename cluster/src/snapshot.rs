//! Snapshots on disk: the engine's files (its segments, which hold the
//! checkpoints and the records still live, and `MARKS`) packed into one
//! file, streamed to a lagging replica in chunks and unpacked there into a
//! fresh engine directory. Nothing is held in memory but one block.
//!
//! ```text
//! // snapshot: { magic: b"FLSNAP" | version: u8 (b'2') | 0u8 | [File]* | 0u16 }
//! // File:     { name_len: u16 (≥ 1) | name | len: u64 | [Run]* | at: u64, 0u32 }
//! // Run:      { at: u64 | run_len: u32 (≥ 1) | bytes }   bytes not in a run are zeros
//! ```
//!
//! ```text
//! // meta: { magic: b"FLSM" | version: u8 (1) | bincode(openraft SnapshotMeta) }
//! ```
//!
//! `<node>/snap/` holds at most one finished snapshot, `<id>.snap` with its
//! Raft metadata in `<id>.meta`, plus a staging directory or an incoming
//! file while one is being made or received (removed at start).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use openraft::SnapshotMeta;

use crate::codec::{FormatError, Tagged};
use crate::types::{Member, NodeId};

/// An archive's first 8 bytes: `FLSNAP`, then its version, then a zero.
// { magic: b"FLSNAP" | version: u8 | 0u8 }
const MAGIC: &[u8; 6] = b"FLSNAP";
/// The archive's format version, an ASCII digit (the first archives were
/// written as the 8-byte magic `FLSNAP2\0`: the same bytes).
pub(crate) const ARCHIVE_VERSION: u8 = b'2';
/// A snapshot's Raft metadata (`<id>.meta`).
// meta: { magic: b"FLSM" | version: u8 (1) | bincode(SnapshotMeta) }
const META: Tagged = Tagged {
    what: "a snapshot's metadata",
    magic: *b"FLSM",
    version: 1,
};
/// No meta file is larger (the membership's addresses are short).
const MAX_META: u64 = 1 << 20;

/// Encodes a snapshot's metadata (the `.meta` file).
pub(crate) fn encode_meta(meta: &SnapshotMeta<NodeId, Member>) -> Result<Vec<u8>, bincode::Error> {
    META.encode(meta)
}

/// Decodes a snapshot's metadata (the `.meta` file).
pub(crate) fn decode_meta(bytes: &[u8]) -> Result<SnapshotMeta<NodeId, Member>, FormatError> {
    META.decode(bytes)
}
const BLOCK: usize = 64 << 10;
/// No engine file is larger (segments are at most 1 GiB, plus slack).
const MAX_FILE: u64 = 2 << 30;

pub(crate) fn bad(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

fn is_engine_file(name: &str) -> bool {
    name == "MARKS" || (name.ends_with(".wal") && !name.starts_with('.'))
}

/// Makes the names in `dir` durable (renames, creations, removals).
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A snapshot's file and its metadata.
pub(crate) struct Saved {
    pub meta: SnapshotMeta<NodeId, Member>,
    pub path: PathBuf,
}

/// The snapshots of one node.
pub(crate) struct Store {
    dir: PathBuf,
    /// A build and an install may finish together: one saves at a time,
    /// and the newer snapshot stays.
    saving: parking_lot::Mutex<()>,
}

impl Store {
    /// Opens `<node>/snap`, removing what an interrupted build or receive
    /// left.
    pub fn open(dir: PathBuf) -> std::io::Result<Store> {
        std::fs::create_dir_all(&dir)?;
        for e in std::fs::read_dir(&dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("staging") {
                std::fs::remove_dir_all(e.path())?;
            } else if name.starts_with("incoming") || name.ends_with(".tmp") {
                std::fs::remove_file(e.path())?;
            }
        }
        // A process killed between `save`'s renames and its directory sync
        // leaves a snapshot whose name only the page cache holds; Raft may
        // purge its log up to a snapshot `current` reports, so the name is
        // made durable before anything is decided on it.
        sync_dir(&dir)?;
        Ok(Store {
            dir,
            saving: parking_lot::Mutex::new(()),
        })
    }

    fn name(meta: &SnapshotMeta<NodeId, Member>) -> String {
        let (term, index) = meta
            .last_log_id
            .map_or((0, 0), |l| (l.leader_id.term, l.index));
        format!("{term:020}-{index:020}")
    }

    /// The finished snapshot, if any (the newest, should a crash have left
    /// two).
    pub fn current(&self) -> std::io::Result<Option<Saved>> {
        let mut best: Option<Saved> = None;
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "meta") {
                continue;
            }
            let snap = path.with_extension("snap");
            if !snap.exists() {
                continue;
            }
            let mut bytes = Vec::new();
            File::open(&path)?
                .take(MAX_META + 1)
                .read_to_end(&mut bytes)?;
            if bytes.len() as u64 > MAX_META {
                return Err(bad(format!(
                    "{}: over {MAX_META} bytes, not a snapshot's metadata",
                    path.display()
                )));
            }
            let meta = decode_meta(&bytes).map_err(|e| bad(format!("{}: {e}", path.display())))?;
            if best
                .as_ref()
                .is_none_or(|b| b.meta.last_log_id < meta.last_log_id)
            {
                best = Some(Saved { meta, path: snap });
            }
        }
        Ok(best)
    }

    /// A fresh directory to stage an engine's files in.
    pub fn staging(&self) -> std::io::Result<PathBuf> {
        let dir = self.dir.join("staging");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// A fresh file to receive a snapshot into.
    pub fn incoming(&self) -> std::io::Result<(PathBuf, File)> {
        let path = self.dir.join(format!("incoming-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok((path, f))
    }

    /// A path for a snapshot being packed.
    pub fn packing(&self) -> PathBuf {
        self.dir.join("packing.tmp")
    }

    /// Makes the packed or received file at `from` the snapshot described
    /// by `meta`, durably, and removes every other.
    pub fn save(&self, from: &Path, meta: &SnapshotMeta<NodeId, Member>) -> std::io::Result<Saved> {
        let _one = self.saving.lock();
        if let Some(newer) = self.current()?
            && newer.meta.last_log_id > meta.last_log_id
        {
            std::fs::remove_file(from)?;
            return Ok(newer);
        }
        File::open(from)?.sync_all()?;
        let name = Store::name(meta);
        let snap = self.dir.join(format!("{name}.snap"));
        std::fs::rename(from, &snap)?;
        let tmp = self.dir.join(format!("{name}.meta.tmp"));
        let bytes = encode_meta(meta).map_err(std::io::Error::other)?;
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(format!("{name}.meta")))?;
        sync_dir(&self.dir)?;
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            if (file.ends_with(".snap") || file.ends_with(".meta")) && !file.starts_with(&name) {
                // A reader of the old one keeps its open file.
                std::fs::remove_file(e.path())?;
            }
        }
        Ok(Saved {
            meta: meta.clone(),
            path: snap,
        })
    }
}

/// Stages the engine in `engine` into `staging`, as of now: segments
/// before `active` are sealed and never change again, so they are
/// hard-linked (the collector may remove them from the engine meanwhile,
/// the links keep them); the active segment, any created ahead of it, and
/// `MARKS` are still written, so they are copied. Called with the state
/// machine's turn held, after a sync.
pub(crate) fn stage(engine: &Path, active: u64, staging: &Path) -> std::io::Result<()> {
    let names: Vec<String> = std::fs::read_dir(engine)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_engine_file(n))
        .collect();
    for name in &names {
        let from = engine.join(name);
        let to = staging.join(name);
        let sealed = name
            .strip_suffix(".wal")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|seq| seq < active);
        let done = if sealed {
            std::fs::hard_link(&from, &to).or_else(|_| std::fs::copy(&from, &to).map(|_| ()))
        } else {
            std::fs::copy(&from, &to).map(|_| ())
        };
        match done {
            Ok(()) => {}
            // The collector removed a dead segment since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Packs the files staged in `staging` into `out`.
pub(crate) fn pack(staging: &Path, out: &Path) -> std::io::Result<u64> {
    let mut names: Vec<String> = std::fs::read_dir(staging)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_engine_file(n))
        .collect();
    names.sort();
    let mut w = BufWriter::with_capacity(BLOCK * 4, File::create(out)?);
    w.write_all(MAGIC)?;
    w.write_all(&[ARCHIVE_VERSION, 0])?;
    let mut block = vec![0u8; BLOCK];
    for name in names {
        let f = File::open(staging.join(&name))?;
        let len = f.metadata()?.len();
        let name_len = u16::try_from(name.len()).map_err(|_| bad("a file name over 64 KiB"))?;
        w.write_all(&name_len.to_le_bytes())?;
        w.write_all(name.as_bytes())?;
        w.write_all(&len.to_le_bytes())?;
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(BLOCK as u64) as usize;
            f.read_exact_at(&mut block[..n], at)?;
            // Preallocated segments are mostly zeros: left out.
            if block[..n].iter().any(|&b| b != 0) {
                w.write_all(&at.to_le_bytes())?;
                w.write_all(&(n as u32).to_le_bytes())?;
                w.write_all(&block[..n])?;
            }
            at += n as u64;
        }
        w.write_all(&len.to_le_bytes())?;
        w.write_all(&0u32.to_le_bytes())?;
    }
    w.write_all(&0u16.to_le_bytes())?;
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    f.metadata().map(|m| m.len())
}

fn read_u16(r: &mut impl Read) -> std::io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_le_bytes(b))
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Unpacks the snapshot in `file` (from a peer: every length checked)
/// into the empty directory `dir`, durably.
pub(crate) fn unpack(file: File, dir: &Path) -> std::io::Result<()> {
    let mut r = BufReader::with_capacity(BLOCK * 4, file);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic[..6] != MAGIC || magic[7] != 0 {
        return Err(bad("not a fencelog snapshot (bad magic)"));
    }
    if magic[6] != ARCHIVE_VERSION {
        return Err(bad(FormatError::UnknownVersion {
            what: "a snapshot archive",
            version: magic[6],
            known: ARCHIVE_VERSION,
        }
        .to_string()));
    }
    std::fs::create_dir_all(dir)?;
    let mut block = vec![0u8; BLOCK];
    loop {
        let name_len = read_u16(&mut r)? as usize;
        if name_len == 0 {
            break;
        }
        let mut name = vec![0u8; name_len];
        r.read_exact(&mut name)?;
        let name = String::from_utf8(name).map_err(|_| bad("a file name that is not UTF-8"))?;
        if !is_engine_file(&name) || name.contains('/') {
            return Err(bad(format!("a snapshot file named {name:?}")));
        }
        let len = read_u64(&mut r)?;
        if len > MAX_FILE {
            return Err(bad(format!("{name}: {len} bytes (at most {MAX_FILE})")));
        }
        let f = File::create(dir.join(&name))?;
        f.set_len(len)?;
        loop {
            let at = read_u64(&mut r)?;
            let n = read_u32(&mut r)? as usize;
            if n == 0 {
                break;
            }
            if n > BLOCK || at.saturating_add(n as u64) > len {
                return Err(bad(format!(
                    "{name}: a run of {n} bytes at {at} (file of {len} bytes, runs of at most {BLOCK})"
                )));
            }
            r.read_exact(&mut block[..n])?;
            f.write_all_at(&block[..n], at)?;
        }
        f.sync_all()?;
    }
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first 8 bytes of an archive of this version.
    const HEAD: &[u8; 8] = b"FLSNAP2\0";

    #[test]
    fn an_archive_of_another_version_is_refused_by_name() {
        let dst = tempfile::tempdir().unwrap();
        let p = dst.path().join("v3");
        std::fs::write(&p, [&b"FLSNAP3\0"[..], &0u16.to_le_bytes()].concat()).unwrap();
        let err = unpack(File::open(&p).unwrap(), &dst.path().join("out")).unwrap_err();
        assert!(err.to_string().contains("format version 51"), "{err}");
    }

    #[test]
    fn meta_round_trips_and_an_unversioned_one_is_refused() {
        let meta = SnapshotMeta::<NodeId, Member> {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(3, 1),
                42,
            )),
            last_membership: Default::default(),
            snapshot_id: "3-42-7".into(),
        };
        let bytes = encode_meta(&meta).unwrap();
        assert_eq!(&bytes[..5], b"FLSM\x01");
        assert_eq!(decode_meta(&bytes).unwrap(), meta);
        // What the build before versions wrote: bincode alone.
        let old = bincode::serialize(&meta).unwrap();
        assert!(matches!(
            decode_meta(&old),
            Err(FormatError::Unversioned { .. })
        ));
        let mut v2 = bytes.clone();
        v2[4] = 2;
        assert!(matches!(
            decode_meta(&v2),
            Err(FormatError::UnknownVersion { version: 2, .. })
        ));
        // Bytes left over, and every truncation, are refused.
        assert!(decode_meta(&[&bytes[..], &[0]].concat()).is_err());
        for n in 0..bytes.len() {
            assert!(decode_meta(&bytes[..n]).is_err(), "{n} bytes accepted");
        }
    }

    #[test]
    fn packs_and_unpacks_files_with_zero_runs_left_out() {
        let src = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let mut seg = vec![0u8; 5 * BLOCK + 17];
        seg[3] = 1;
        seg[2 * BLOCK + 5] = 7;
        seg[5 * BLOCK + 16] = 9;
        std::fs::write(src.path().join("00000000000000000001.wal"), &seg).unwrap();
        std::fs::write(src.path().join("MARKS"), b"marks").unwrap();
        std::fs::write(src.path().join("LOCK"), b"").unwrap();
        let out = src.path().join("x.snap");
        let size = pack(src.path(), &out).unwrap();
        assert!(
            size < 4 * BLOCK as u64,
            "zero blocks left out: {size} bytes"
        );
        let target = dst.path().join("engine");
        unpack(File::open(&out).unwrap(), &target).unwrap();
        assert_eq!(
            std::fs::read(target.join("00000000000000000001.wal")).unwrap(),
            seg
        );
        assert_eq!(std::fs::read(target.join("MARKS")).unwrap(), b"marks");
        assert!(!target.join("LOCK").exists());
    }

    #[test]
    fn a_hostile_snapshot_is_refused() {
        let dst = tempfile::tempdir().unwrap();
        let cases: Vec<Vec<u8>> = vec![
            b"NOTASNAP".to_vec(),
            [&HEAD[..], &3u16.to_le_bytes(), b"../"].concat(),
            [
                &HEAD[..],
                &5u16.to_le_bytes(),
                b"MARKS",
                &(u64::MAX).to_le_bytes(),
            ]
            .concat(),
            [
                &HEAD[..],
                &5u16.to_le_bytes(),
                b"MARKS",
                &10u64.to_le_bytes(),
                &8u64.to_le_bytes(),
                &4u32.to_le_bytes(),
                b"abcd",
            ]
            .concat(),
            // Truncated.
            [&HEAD[..], &5u16.to_le_bytes(), b"MAR"].concat(),
        ];
        for (i, bytes) in cases.into_iter().enumerate() {
            let p = dst.path().join(format!("case{i}"));
            std::fs::write(&p, &bytes).unwrap();
            let err = unpack(File::open(&p).unwrap(), &dst.path().join(format!("out{i}")));
            assert!(err.is_err(), "case {i} accepted");
        }
    }
}
