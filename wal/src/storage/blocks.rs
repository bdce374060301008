//! How an append is laid out for a write around the page cache
//! ([`super::StorageFile::append_at`]): in whole disk blocks, from the
//! start of the block the append begins in (its earlier bytes written again
//! as they are) to the end of the block it ends in (zeros after it).
//!
//! One layout for both backends: the real files write it with `O_DIRECT`,
//! and the simulated disk writes the same bytes as one unsynced write, so
//! that its power cuts (torn sectors, lost or reordered writes, a prefix)
//! also cut what a direct write rewrites.

use std::io;

/// What direct I/O is aligned to, in memory, in the file and in length: a
/// page, which every disk's logical block size divides.
pub(crate) const BLOCK: usize = 4096;

/// The largest staging buffer kept between appends.
const MAX_KEPT_STAGING: usize = 8 << 20;

/// One file's appends, laid out in blocks.
#[derive(Default)]
pub(crate) struct BlockLayout {
    /// Where writes are laid out, aligned in memory; grows as needed.
    staging: Vec<u8>,
    /// The last block laid out: its position in the file and the appended
    /// bytes of it, for the next append, which begins in it.
    tail: Option<(u64, Vec<u8>)>,
}

impl BlockLayout {
    /// Lays out `buf` at `pos` in a file of `file_len` bytes: answers where
    /// the blocks begin and their bytes, or `None` when they would pass the
    /// file's end (nothing laid out). The block's bytes before `pos` come
    /// from the last append if it ended there, else from `read_block`
    /// (which fills one aligned block from the file at the position given).
    pub(crate) fn lay(
        &mut self,
        buf: &[u8],
        pos: u64,
        file_len: u64,
        read_block: impl FnOnce(&mut [u8], u64) -> io::Result<()>,
    ) -> io::Result<Option<(u64, &[u8])>> {
        let start = pos / BLOCK as u64 * BLOCK as u64;
        let lead = (pos - start) as usize;
        let len = lead + buf.len();
        let padded = len.div_ceil(BLOCK) * BLOCK;
        if start + padded as u64 > file_len {
            return Ok(None);
        }
        if self.staging.len() < padded + BLOCK || self.staging.len() > MAX_KEPT_STAGING {
            // A one-off large batch does not pin its buffer past the next.
            self.staging = vec![0; (padded + BLOCK).next_power_of_two()];
        }
        let at = self.staging.as_ptr().align_offset(BLOCK);
        let area = &mut self.staging[at..at + padded];
        if lead > 0 {
            match &self.tail {
                Some((tail_at, tail)) if *tail_at == start && tail.len() == lead => {
                    area[..lead].copy_from_slice(tail);
                }
                // Not where the last append ended (the first append to this
                // file, say): the block as the file has it.
                _ => read_block(&mut area[..BLOCK], start)?,
            }
        }
        area[lead..len].copy_from_slice(buf);
        area[len..].fill(0);
        let last = padded - BLOCK;
        let tail = self
            .tail
            .get_or_insert_with(|| (0, Vec::with_capacity(BLOCK)));
        tail.0 = start + last as u64;
        tail.1.clear();
        tail.1.extend_from_slice(&area[last..len]);
        Ok(Some((start, area)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in memory, written through the layout.
    fn append(file: &mut [u8], layout: &mut BlockLayout, buf: &[u8], pos: u64) -> bool {
        let snapshot = file.to_owned();
        let read = |block: &mut [u8], at: u64| {
            block.copy_from_slice(&snapshot[at as usize..at as usize + BLOCK]);
            Ok(())
        };
        match layout.lay(buf, pos, file.len() as u64, read).unwrap() {
            Some((start, area)) => {
                assert_eq!(start % BLOCK as u64, 0);
                assert_eq!(area.len() % BLOCK, 0);
                assert_eq!(area.as_ptr().align_offset(BLOCK), 0);
                file[start as usize..start as usize + area.len()].copy_from_slice(area);
                true
            }
            None => false,
        }
    }

    #[test]
    fn appends_land_as_plain_writes_would_over_zeros() {
        let size = 16 * BLOCK + 100;
        let (mut laid, mut plain) = (vec![0u8; size], vec![0u8; size]);
        let mut layout = BlockLayout::default();
        let mut pos = 64u64;
        let mut n = 0u8;
        for len in [1, 7, 4000, 4096, 100, 9000, 3, 5000, 4095] {
            let buf = vec![n.wrapping_add(1); len];
            n = n.wrapping_add(1);
            assert!(append(&mut laid, &mut layout, &buf, pos));
            plain[pos as usize..pos as usize + len].copy_from_slice(&buf);
            assert_eq!(laid, plain, "after {len} bytes at {pos}");
            pos += len as u64;
            if n == 4 {
                // A new writer (a reopen): the block's earlier bytes come
                // from the file.
                layout = BlockLayout::default();
            }
        }
        // The last block would pass the file's end: nothing laid out.
        let end = (size - 50) as u64;
        assert!(!append(&mut laid, &mut layout, &[9; 10], end));
    }
}
