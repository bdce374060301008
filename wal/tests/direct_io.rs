//! Batches written around the page cache (`WalOptions::direct_io`, on by
//! default with a sync per batch): each write begins at the start of the
//! disk block its batch begins in and ends at a block's end. What is
//! written must read back and recover exactly as with plain writes, byte
//! for byte in the files, whether a batch begins where the last one ended,
//! after a reopen (the block's earlier bytes then come from the disk), or
//! at a segment's last block.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use fencelog_wal::{FsStorage, Storage, WalOptions};

const O_DIRECT: u32 = 0o40000;

/// Whether this process holds `path` open with `O_DIRECT`.
fn open_direct(path: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    fds.flatten().any(|fd| {
        let same = std::fs::read_link(fd.path()).is_ok_and(|p| p == path);
        let info = Path::new("/proc/self/fdinfo").join(fd.file_name());
        let flags = std::fs::read_to_string(info).ok().and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("flags:"))?;
            u32::from_str_radix(line.trim_start_matches("flags:").trim(), 8).ok()
        });
        same && flags.is_some_and(|f| f & O_DIRECT != 0)
    })
}

/// Appends writer `writer`'s entries of lengths `lens` in durable batches
/// of `batch` entries each: where each went and what it holds.
fn write(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    opts: &WalOptions,
    writer: u32,
    lens: &[usize],
    batch: usize,
) -> Vec<(fencelog_wal::Appended, Vec<u8>)> {
    let (wal, _) = open(storage, dir, opts).unwrap();
    let mut written = Vec::new();
    for (i, group) in lens.chunks(batch).enumerate() {
        let mut tickets = Vec::new();
        for (j, &len) in group.iter().enumerate() {
            let p = payload(writer, (i * batch + j) as u32, len);
            let (at, ticket) = append(&wal, &p).unwrap();
            tickets.push(ticket);
            written.push((at, p));
        }
        for t in tickets {
            t.wait().unwrap();
        }
    }
    wal.close().unwrap();
    written
}

/// Lengths that put batch ends at every offset within a block, and
/// entries that span blocks.
fn lens(n: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 131 + 17) % 5000 + 1).collect()
}

#[test]
fn batches_written_direct_read_back_and_match_plain_writes_byte_for_byte() {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let direct_dir = tempfile::tempdir().unwrap();
    let plain_dir = tempfile::tempdir().unwrap();
    assert!(small_opts().direct_io, "on by default");
    // Every batch written by its submitter, on its thread (no sync thread
    // to take batches as they come): the two logs' files are the same.
    let direct = WalOptions {
        inline_io: true,
        ..small_opts()
    };
    let plain = WalOptions {
        direct_io: false,
        ..direct.clone()
    };
    let lens = lens(600);
    // Three sessions each, so that two reopens find a block half written.
    let mut written = Vec::new();
    for (session, part) in lens.chunks(200).enumerate() {
        let w = write(
            &storage,
            direct_dir.path(),
            &direct,
            1,
            part,
            1 + session * 3,
        );
        write(&storage, plain_dir.path(), &plain, 1, part, 1 + session * 3);
        written.extend(w);
    }
    // No batch of the plain log went direct; the direct log's did.
    for (dir, opts, direct) in [(&plain_dir, &plain, false), (&direct_dir, &direct, true)] {
        let (wal, _) = open(&storage, dir.path(), opts).unwrap();
        let p = payload(1, written.len() as u32, 10);
        let at = append_durable(&wal, &p).unwrap();
        assert_eq!(wal.stats().direct_writes > 0, direct, "{opts:?}");
        wal.close().unwrap();
        if direct {
            written.push((at, p));
        }
    }
    // The same records, in order, from the directory's files.
    let all = all_records(storage.as_ref(), direct_dir.path());
    assert_eq!(all.len(), written.len());
    for ((lsn, bytes), (at, p)) in all.iter().zip(&written) {
        assert_eq!(*lsn, at.lsn);
        assert_eq!(bytes, p);
    }
    // And the same files: the zeros after each batch's end are the fill's.
    let mut names = storage.list(direct_dir.path()).unwrap();
    names.retain(|n| n.ends_with(".wal"));
    names.sort();
    assert!(names.len() > 20, "small segments rotate: {names:?}");
    for name in &names {
        let a = std::fs::read(direct_dir.path().join(name)).unwrap();
        let b = std::fs::read(plain_dir.path().join(name)).unwrap();
        assert_eq!(a.len(), b.len(), "{name}");
        if let Some(at) = a.iter().zip(&b).position(|(x, y)| x != y) {
            let to = (at + 64).min(a.len());
            panic!(
                "{name} differs at byte {at} of {}: {:?} against {:?}",
                a.len(),
                &a[at..to],
                &b[at..to]
            );
        }
    }
}

#[test]
fn the_segment_being_written_is_open_direct_and_reads_back_while_written() {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    let dir = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        segment_bytes: 1 << 20,
        ..small_opts()
    };
    let (wal, _) = open(&storage, dir.path(), &opts).unwrap();
    let mut written = Vec::new();
    for n in 0..300u32 {
        let p = payload(2, n, (n as usize * 37) % 900 + 1);
        let at = append_durable(&wal, &p).unwrap();
        // Read back through the page cache right after each direct write
        // of the block it ends in.
        let e = wal.read_entry(at.segment, at.position).unwrap();
        assert_eq!(&e.payload[..], &p[..]);
        written.push((at, p));
    }
    let segment = written[written.len() - 1].0.segment;
    let path = dir.path().join(format!("{segment:020}.wal"));
    // On a file system without direct I/O (tmpfs) the writes are plain;
    // the temporary directory here is on the project's disk.
    if std::fs::File::options()
        .read(true)
        .custom_flags_direct()
        .open(&path)
        .is_ok()
    {
        assert!(
            open_direct(&path),
            "{} not open with O_DIRECT",
            path.display()
        );
        // Every batch went direct (none reached a segment's last block),
        // and the log says so.
        let stats = wal.stats();
        assert!(
            stats.direct_writes > 0 && stats.direct_writes <= stats.syncs,
            "{} direct writes in {} syncs",
            stats.direct_writes,
            stats.syncs
        );
    }
    for (at, p) in &written {
        let e = wal.read_entry(at.segment, at.position).unwrap();
        assert_eq!(&e.payload[..], &p[..]);
    }
    wal.close().unwrap();
}

/// `OpenOptions` with `O_DIRECT`, to ask whether the file system has it.
trait DirectFlag {
    fn custom_flags_direct(&mut self) -> &mut Self;
}

impl DirectFlag for std::fs::OpenOptions {
    fn custom_flags_direct(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(O_DIRECT as i32)
    }
}
