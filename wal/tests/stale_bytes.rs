//! Bytes left in preallocated or recycled space must never pass as entries:
//! an entry's checksum covers its segment's number and its LSN, so a copy of
//! a real entry in the wrong segment, or an old entry of the same segment
//! past the tail, is junk, and recovery neither replays it nor loses a real
//! entry over it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use fencelog_wal::{SimStorage, Storage, StorageFile, format};

const DIR: &str = "/db";

fn seg_path(seq: u64) -> PathBuf {
    Path::new(DIR).join(format::segment_file_name(seq))
}

/// A log with a few sealed segments and a tail; answers its records.
fn setup() -> (SimStorage, Vec<(u64, Vec<u8>)>, u64) {
    let sim = SimStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let (wal, _) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
    let mut records = Vec::new();
    let mut tail_seg = 0;
    for n in 0..700u32 {
        let p = payload(7, n, 300);
        let (at, t) = append(&wal, &p).unwrap();
        t.wait().unwrap();
        records.push((at.lsn, p.clone()));
        tail_seg = at.segment;
    }
    wal.close().unwrap();
    assert!(tail_seg > 2);
    (sim, records, tail_seg)
}

fn write(sim: &SimStorage, path: &Path, pos: u64, bytes: &[u8]) {
    let f: Box<dyn StorageFile> = sim.open(path).unwrap();
    f.write_all_at(bytes, pos).unwrap();
    f.sync_data().unwrap();
}

fn tail_end(sim: &SimStorage, seq: u64) -> u64 {
    let data = sim.contents(&seg_path(seq)).unwrap();
    // The first aligned all-zero entry header after the header.
    let mut pos = format::HEADER_LEN;
    while let format::Probe::Entry(h) = format::probe_entry(&data[pos as usize..], seq, u32::MAX) {
        pos += h.encoded_len();
    }
    pos
}

fn check(sim: &SimStorage, records: &[(u64, Vec<u8>)]) {
    let storage: Arc<dyn Storage> = Arc::new(sim.clone());
    let (wal, _report) = open(&storage, Path::new(DIR), &small_opts()).unwrap();
    assert_eq!(
        wal.with_state(|c| c.records),
        records.len() as u64,
        "junk was replayed"
    );
    wal.close().unwrap();
    assert_eq!(
        all_records(sim, Path::new(DIR)),
        records,
        "junk became a record"
    );
}

#[test]
fn entries_of_another_segment_in_preallocated_space_are_not_entries() {
    let (sim, records, tail) = setup();
    let old = sim.contents(&seg_path(1)).unwrap();
    let end = tail_end(&sim, tail);
    // Paste segment 1's entries (valid there) at the same offsets past the
    // tail's end, as if the file had been recycled.
    let from = end as usize;
    write(&sim, &seg_path(tail), end, &old[from..from + 8192]);
    check(&sim, &records);
}

#[test]
fn an_entry_made_for_another_segment_with_the_next_lsn_is_not_an_entry() {
    let (sim, records, tail) = setup();
    let end = tail_end(&sim, tail);
    let next_lsn = records.last().unwrap().0 + 1;
    // Everything right except the segment it was made for: exactly the
    // LSN the tail expects, at exactly the tail's end.
    let body = b"from another segment";
    let mut bytes = vec![0u8; format::entry_len(body.len()) as usize];
    bytes[format::ENTRY_HEADER_LEN..format::ENTRY_HEADER_LEN + body.len()].copy_from_slice(body);
    let (header, rest) = bytes.split_at_mut(format::ENTRY_HEADER_LEN);
    format::encode_entry_header(
        header,
        1,
        next_lsn,
        next_lsn,
        format::EntryKind::Record,
        &rest[..body.len()],
    );
    write(&sim, &seg_path(tail), end, &bytes);
    check(&sim, &records);
}

#[test]
fn old_entries_of_the_same_segment_past_the_tail_are_not_entries() {
    let (sim, records, tail) = setup();
    let data = sim.contents(&seg_path(tail)).unwrap();
    let end = tail_end(&sim, tail);
    // The tail's own first entries again, past its end: right segment, but
    // LSNs from the past.
    let first = format::HEADER_LEN as usize;
    write(&sim, &seg_path(tail), end, &data[first..first + 4096]);
    check(&sim, &records);
}

#[test]
fn random_garbage_in_preallocated_space_is_not_an_entry() {
    let (sim, records, tail) = setup();
    let end = tail_end(&sim, tail);
    let garbage: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    write(&sim, &seg_path(tail), end + 64, &garbage);
    check(&sim, &records);
}

#[test]
fn a_whole_segment_copied_under_a_new_number_holds_no_entries() {
    let (sim, records, tail) = setup();
    // Recycle segment 1's file as the next segment: only the header is new.
    let mut bytes = sim.contents(&seg_path(1)).unwrap();
    bytes[..format::HEADER_LEN as usize].copy_from_slice(&format::encode_header(tail + 5));
    let path = seg_path(tail + 5);
    let _ = sim.remove(&path);
    let f = sim.create_new(&path).unwrap();
    f.write_all_at(&bytes, 0).unwrap();
    f.sync_data().unwrap();
    sim.sync_dir(Path::new(DIR)).unwrap();
    check(&sim, &records);
}
