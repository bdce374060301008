//! Shared pieces of the benchmarks: the baselines every result is compared
//! with, measured in the same run on the same disk.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One thread, one `pwrite` + one `fdatasync` per entry: the durable rate
/// without group commit. `preallocate` writes into space that already
/// exists (as fencelog's segments do) instead of growing the file.
pub fn raw_write_sync_per_entry(
    dir: &Path,
    entries: u64,
    entry_bytes: usize,
    preallocate: bool,
) -> io::Result<Duration> {
    let path = dir.join(if preallocate {
        "raw-prealloc"
    } else {
        "raw-grow"
    });
    let _ = std::fs::remove_file(&path);
    let file = open(&path, preallocate, entries * entry_bytes as u64)?;
    let buf = vec![0xA5u8; entry_bytes];
    let start = Instant::now();
    for i in 0..entries {
        file.write_all_at(&buf, i * entry_bytes as u64)?;
        file.sync_data()?;
    }
    Ok(start.elapsed())
}

/// One thread writing `batch` entries with one `pwrite` and one `fdatasync`
/// per batch, into preallocated space: the ceiling of group commit at that
/// batch size on this disk.
pub fn raw_batch_write_sync(
    dir: &Path,
    entries: u64,
    entry_bytes: usize,
    batch: u64,
) -> io::Result<Duration> {
    let path = dir.join("raw-batch");
    let _ = std::fs::remove_file(&path);
    let file = open(
        &path,
        true,
        entries * entry_bytes as u64 + batch * entry_bytes as u64,
    )?;
    let buf = vec![0xA5u8; entry_bytes * batch as usize];
    let start = Instant::now();
    let mut pos = 0;
    let mut written = 0;
    while written < entries {
        file.write_all_at(&buf, pos)?;
        file.sync_data()?;
        pos += buf.len() as u64;
        written += batch;
    }
    Ok(start.elapsed())
}

fn open(path: &Path, preallocate: bool, len: u64) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    if preallocate {
        // Written once, so that later overwrites touch no metadata.
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < len {
            file.write_all_at(&zeros, at)?;
            at += zeros.len() as u64;
        }
        file.sync_all()?;
    }
    Ok(file)
}
