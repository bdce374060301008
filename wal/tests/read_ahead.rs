//! Reading ahead (`wal/src/read_ahead.rs`): a segment reader going through
//! close entries reads them in windows, and every entry reads back as
//! written whatever the window holds.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use fencelog_wal::{Storage, StorageFile, WalError, format};
use proptest::prelude::*;

/// Segments large enough that every entry of a test is in the first, and
/// entries up to 1 MiB.
fn one_segment() -> fencelog_wal::WalOptions {
    fencelog_wal::WalOptions {
        segment_bytes: 64 << 20,
        max_entry_bytes: 1 << 20,
        max_batch_bytes: 4 << 20,
        ..fencelog_wal::WalOptions::default()
    }
}

/// The real file system, counting the positional reads of its files.
struct CountingReads {
    reads: Arc<std::sync::atomic::AtomicU64>,
}

struct CountedFile {
    inner: Box<dyn StorageFile>,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl StorageFile for CountedFile {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.read_exact_at(buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, pos)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn preallocate(&self, len: u64) -> std::io::Result<()> {
        self.inner.preallocate(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}

impl CountingReads {
    fn counted(&self, inner: Box<dyn StorageFile>) -> Box<dyn StorageFile> {
        Box::new(CountedFile {
            inner,
            reads: Arc::clone(&self.reads),
        })
    }
}

impl Storage for CountingReads {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        fencelog_wal::FsStorage.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        fencelog_wal::FsStorage.list(dir)
    }
    fn open(&self, path: &Path) -> std::io::Result<Box<dyn StorageFile>> {
        Ok(self.counted(fencelog_wal::FsStorage.open(path)?))
    }
    fn create_new(&self, path: &Path) -> std::io::Result<Box<dyn StorageFile>> {
        Ok(self.counted(fencelog_wal::FsStorage.create_new(path)?))
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        fencelog_wal::FsStorage.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        fencelog_wal::FsStorage.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        fencelog_wal::FsStorage.sync_dir(dir)
    }
    fn lock_dir(&self, dir: &Path) -> std::io::Result<Box<dyn fencelog_wal::DirLock>> {
        fencelog_wal::FsStorage.lock_dir(dir)
    }
}

/// A reader going through entries in order reads them in windows: 2 000
/// entries of 100 bytes take a few dozen reads, not 2 000. Whatever the
/// window holds, every entry reads back as written: entries of every size
/// around the window's (past it, too), entries skipped, read backwards,
/// read again, and entries written after a window was read (the window
/// holds the zeros or the end of the file that were there then).
#[test]
fn a_reader_reads_close_entries_ahead_and_each_as_written() {
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let storage: Arc<dyn Storage> = Arc::new(CountingReads {
        reads: Arc::clone(&reads),
    });
    let dir = tempfile::tempdir().unwrap();
    let (wal, _) = open(&storage, dir.path(), &one_segment()).unwrap();
    let small = append_lens(&wal, 1, [100; 2_000]);
    let segment = small[0].0.segment;
    assert!(small.iter().all(|(at, _)| at.segment == segment));

    let before = reads.load(std::sync::atomic::Ordering::Relaxed);
    let mut reader = wal.segment_reader(segment).unwrap();
    for (at, p) in &small {
        assert_eq!(&reader.read_entry(at.position).unwrap().payload[..], &p[..]);
    }
    let took = reads.load(std::sync::atomic::Ordering::Relaxed) - before;
    // 2 000 entries of 192 bytes (aligned) are 384 000 bytes: one direct
    // read, then windows of 8, 16, 32 and then 64 KiB.
    assert!(took <= 12, "2 000 close entries took {took} reads");

    // Every size around the window's, and past its largest.
    let sizes = [
        0usize,
        1,
        100,
        8 << 10,
        (8 << 10) + 1,
        5_000,
        64 << 10,
        (64 << 10) - 40,
        70_000,
        3,
        200_000,
        16 << 10,
        31,
        100_000,
        64,
    ];
    let mixed = append_lens(&wal, 2, sizes.iter().copied().cycle().take(150));
    let mut reader = wal.segment_reader(segment).unwrap();
    let check = |reader: &mut fencelog_wal::SegmentReader<'_, Counter>,
                 (at, p): &(fencelog_wal::Appended, Vec<u8>)| {
        assert_eq!(at.segment, segment);
        let got = reader.read_entry(at.position).unwrap();
        assert_eq!(got.payload.len(), p.len());
        assert_eq!(&got.payload[..], &p[..], "entry at {}", at.position);
    };
    for e in &mixed {
        check(&mut reader, e);
    }
    for e in mixed.iter().step_by(3) {
        check(&mut reader, e);
    }
    for e in mixed.iter().rev() {
        check(&mut reader, e);
        check(&mut reader, e);
    }

    // Entries written after the reader read its window.
    let mut reader = wal.segment_reader(segment).unwrap();
    for e in &small[1_990..] {
        check(&mut reader, e);
    }
    for e in &mixed[..3] {
        check(&mut reader, e);
    }
    let later = append_lens(&wal, 3, [150; 50]);
    for e in mixed[3..].iter().chain(&later) {
        check(&mut reader, e);
    }
    let (last, p) = &later[later.len() - 1];
    let past = last.position + format::entry_len(p.len());
    assert!(matches!(
        reader.read_entry(past),
        Err(WalError::NoEntry { .. })
    ));
}

/// A bit flipped on disk in an entry that a window holds is caught by its
/// checksum: the entry is answered as no entry, never as data (neither
/// what was written nor the damaged bytes), through the window and
/// directly, and the entries around it read back as written.
#[test]
fn a_flipped_bit_in_a_window_is_never_answered_as_data() {
    let (sim, wal) = open_sim(&one_segment());
    let written = append_lens(&wal, 6, [300; 40]);
    let segment = written[0].0.segment;
    let damaged = 20;
    let (at, _) = &written[damaged];
    // A payload byte of entry 20, in the middle of a window read from the
    // entries before it.
    let file = Path::new(SIM_DIR).join(format::segment_file_name(segment));
    sim.flip_bit(
        &file,
        at.position + format::ENTRY_HEADER_LEN as u64 + 150,
        3,
    )
    .unwrap();
    let mut reader = wal.segment_reader(segment).unwrap();
    for (i, (at, p)) in written.iter().enumerate() {
        let got = reader.read_entry(at.position);
        if i == damaged {
            assert!(
                matches!(got, Err(WalError::NoEntry { .. })),
                "the damaged entry through the window: {:?}",
                got.map(|e| e.payload.len())
            );
        } else {
            assert_eq!(&got.unwrap().payload[..], &p[..], "entry {i}");
        }
    }
    assert!(matches!(
        wal.read_entry(segment, at.position),
        Err(WalError::NoEntry { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(48), ..ProptestConfig::default() })]

    /// Entries of any sizes, read through one reader in any order (runs
    /// forward with skips, backward, the same one again), each read back
    /// as written; entries appended between reads too.
    #[test]
    fn any_reads_through_one_reader_give_back_what_was_written(
        sizes in prop::collection::vec(
            prop_oneof![0usize..300, 300usize..9_000, 9_000usize..140_000],
            1..120,
        ),
        steps in prop::collection::vec((0usize..4, 1usize..6), 1..200),
        later in 0usize..40,
    ) {
        let (_sim, wal) = open_sim(&one_segment());
        let mut written = append_lens(&wal, 4, sizes);
        let segment = written[0].0.segment;
        prop_assert!(written.iter().all(|(at, _)| at.segment == segment));
        let mut reader = wal.segment_reader(segment).unwrap();
        let mut i = 0usize;
        for (n, &(how, by)) in steps.iter().enumerate() {
            if n == steps.len() / 2 {
                written.extend(append_lens(&wal, 5, (0..later).map(|k| 10 + k * 37)));
            }
            i = match how {
                0 | 1 => (i + by) % written.len(),
                2 => i.saturating_sub(by),
                _ => i,
            };
            let (at, p) = &written[i];
            let got = reader.read_entry(at.position).unwrap();
            prop_assert_eq!(&got.payload[..], &p[..], "entry {} at {}", i, at.position);
        }
    }
}
