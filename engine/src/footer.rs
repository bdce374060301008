//! The index a sealed segment carries in its footer: for every stream with
//! records in the segment, where each of its entries is, and the previous
//! sealed segment with records of the same stream. Reads of sealed segments
//! search it (read from disk on demand and kept, parsed, in a bounded
//! cache), so the index of sealed history costs memory only while it is
//! used, and opening a log never loads it.
//!
//! ```text
//! // SegmentIndex: { magic: [u8; 4] = "FLIX" | version: u32 = 2 | stream_count: u32 | reserved: u32 | [Dir; stream_count] | [Ix]* }
//! // Dir (48 B):   { stream_id: u64 | first_offset: u64 | end_offset: u64 | cum_bytes: u64 | first_ix: u32 | ix_count: u32 | prev_segment: u64 }
//! // Ix (24 B):    { first_offset: u64 | cum_bytes: u64 | position: u64 }
//! ```
//!
//! `Dir` entries are sorted by stream id; a stream's `Ix` entries by offset.
//! `cum_bytes` counts the stream's payload bytes before that offset.
//! `prev_segment` (0: none) links a stream's segments newest to oldest, so
//! garbage collection visits only the segments a trim leaves.

use fencelog_wal::format::{u32_at, u64_at};

use crate::view::IndexEntry;

const MAGIC: [u8; 4] = *b"FLIX";
const VERSION: u32 = 2;
const HEADER: usize = 16;
const DIR: usize = 48;
const IX: usize = 24;

/// One stream's part of a segment, for encoding.
pub(crate) struct StreamPart<'a> {
    pub stream_id: u64,
    pub end_offset: u64,
    pub prev_segment: u64,
    pub entries: &'a [IndexEntry],
}

/// Bytes the index of `streams` streams and `entries` entries takes.
pub(crate) fn encoded_len(streams: usize, entries: usize) -> usize {
    HEADER + DIR * streams + IX * entries
}

/// [`encode_into`] a new buffer (tests and fuzzing).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn encode(parts: &[StreamPart<'_>]) -> Vec<u8> {
    let mut b = Vec::new();
    encode_into(parts, &mut b);
    b
}

/// Encodes a segment index after what `b` holds; `parts` must be sorted by
/// stream id and each part must have at least one entry. Its size is
/// bounded by the segment's (segments are at most 1 GiB): no length here
/// nears `u32::MAX`.
pub(crate) fn encode_into(parts: &[StreamPart<'_>], b: &mut Vec<u8>) {
    let entries: usize = parts.iter().map(|p| p.entries.len()).sum();
    b.reserve_exact(encoded_len(parts.len(), entries));
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    let mut first_ix = 0u32;
    for p in parts {
        let first = p.entries.first().map_or(p.end_offset, |e| e.first_offset);
        let cum = p.entries.first().map_or(0, |e| e.cum_bytes);
        b.extend_from_slice(&p.stream_id.to_le_bytes());
        b.extend_from_slice(&first.to_le_bytes());
        b.extend_from_slice(&p.end_offset.to_le_bytes());
        b.extend_from_slice(&cum.to_le_bytes());
        b.extend_from_slice(&first_ix.to_le_bytes());
        b.extend_from_slice(&(p.entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&p.prev_segment.to_le_bytes());
        first_ix += p.entries.len() as u32;
    }
    for p in parts {
        for e in p.entries {
            b.extend_from_slice(&e.first_offset.to_le_bytes());
            b.extend_from_slice(&e.cum_bytes.to_le_bytes());
            b.extend_from_slice(&e.position.to_le_bytes());
        }
    }
}

/// A segment index, its layout checked once (see [`SegmentIndex::parse`]).
pub(crate) struct SegmentIndex {
    b: bytes::Bytes,
    streams: usize,
    entries: usize,
}

/// One stream's directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dir {
    pub first_offset: u64,
    pub end_offset: u64,
    pub cum_bytes: u64,
    /// The previous sealed segment with records of this stream (0: none).
    pub prev_segment: u64,
    first_ix: usize,
    ix_count: usize,
}

impl SegmentIndex {
    /// Checks the layout (every count against the length); `Err` with what
    /// is wrong, never a panic.
    pub(crate) fn parse(b: bytes::Bytes) -> Result<Self, String> {
        if b.len() < HEADER || b[0..4] != MAGIC {
            return Err("not a segment index (bad magic)".into());
        }
        let version = u32_at(&b, 4);
        if version != VERSION {
            return Err(format!("segment index version {version} is not supported"));
        }
        let streams = u32_at(&b, 8) as usize;
        let dir_end = streams
            .checked_mul(DIR)
            .and_then(|d| d.checked_add(HEADER))
            .filter(|&e| e <= b.len())
            .ok_or("the directory runs past the end")?;
        let rest = b.len() - dir_end;
        if !rest.is_multiple_of(IX) {
            return Err("the entries do not divide evenly".into());
        }
        let entries = rest / IX;
        let idx = SegmentIndex {
            b,
            streams,
            entries,
        };
        let mut prev_id = None;
        for i in 0..streams {
            let at = HEADER + i * DIR;
            let id = u64_at(&idx.b, at);
            if prev_id.is_some_and(|p| p >= id) {
                return Err("the directory is not sorted".into());
            }
            prev_id = Some(id);
            let d = idx.dir_at(i);
            if d.ix_count == 0
                || d.first_ix + d.ix_count > entries
                || d.first_offset >= d.end_offset
            {
                return Err(format!("stream {id}: a directory entry out of range"));
            }
        }
        Ok(idx)
    }

    fn dir_at(&self, i: usize) -> Dir {
        let at = HEADER + i * DIR;
        Dir {
            first_offset: u64_at(&self.b, at + 8),
            end_offset: u64_at(&self.b, at + 16),
            cum_bytes: u64_at(&self.b, at + 24),
            first_ix: u32_at(&self.b, at + 32) as usize,
            ix_count: u32_at(&self.b, at + 36) as usize,
            prev_segment: u64_at(&self.b, at + 40),
        }
    }

    /// Every stream's directory entry, by stream id.
    pub(crate) fn dirs(&self) -> impl Iterator<Item = (u64, Dir)> + '_ {
        (0..self.streams).map(|i| (u64_at(&self.b, HEADER + i * DIR), self.dir_at(i)))
    }

    /// Bytes this index holds in memory.
    pub(crate) fn len(&self) -> usize {
        self.b.len()
    }

    /// The directory entry of stream `id`, if it has records here.
    pub(crate) fn stream(&self, id: u64) -> Option<Dir> {
        let (mut lo, mut hi) = (0, self.streams);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let mid_id = u64_at(&self.b, HEADER + mid * DIR);
            match mid_id.cmp(&id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(self.dir_at(mid)),
            }
        }
        None
    }

    fn ix(&self, i: usize) -> IndexEntry {
        let at = HEADER + self.streams * DIR + i * IX;
        IndexEntry {
            first_offset: u64_at(&self.b, at),
            cum_bytes: u64_at(&self.b, at + 8),
            position: u64_at(&self.b, at + 16),
        }
    }

    /// The entries of `dir` from the one holding `offset` on, each with the
    /// offset where it ends.
    pub(crate) fn entries_from(
        &self,
        dir: Dir,
        offset: u64,
    ) -> impl Iterator<Item = (IndexEntry, u64)> + '_ {
        let offset = offset.max(dir.first_offset);
        let range = dir.first_ix..(dir.first_ix + dir.ix_count).min(self.entries);
        // The last entry whose first offset is <= offset.
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.ix(mid).first_offset <= offset {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let start = lo.saturating_sub(1).max(range.start);
        (start..range.end).map(move |i| {
            let end = if i + 1 < range.end {
                self.ix(i + 1).first_offset
            } else {
                dir.end_offset
            };
            (self.ix(i), end)
        })
    }
}

/// A footer of two streams, for tests and fuzz seeds: stream 3 with
/// entries at offsets 10, 12 and 15 (ending at 20, the stream's part before
/// in `prev_segment`), stream 9 with one at offset 0 (ending at 1).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn two_stream_sample(prev_segment: u64) -> Vec<u8> {
    let e = |first_offset, cum_bytes, position| IndexEntry {
        first_offset,
        cum_bytes,
        position,
    };
    encode(&[
        StreamPart {
            stream_id: 3,
            end_offset: 20,
            prev_segment,
            entries: &[e(10, 100, 64), e(12, 130, 200), e(15, 160, 400)],
        },
        StreamPart {
            stream_id: 9,
            end_offset: 1,
            prev_segment: 0,
            entries: &[e(0, 0, 128)],
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(first_offset: u64, cum_bytes: u64, position: u64) -> IndexEntry {
        IndexEntry {
            first_offset,
            cum_bytes,
            position,
        }
    }

    #[test]
    fn round_trip_and_lookup() {
        let bytes = two_stream_sample(7);
        assert_eq!(bytes.len(), encoded_len(2, 4));
        let idx = SegmentIndex::parse(bytes::Bytes::from(bytes)).unwrap();
        assert!(idx.stream(4).is_none());
        let d = idx.stream(3).unwrap();
        assert_eq!((d.first_offset, d.end_offset, d.cum_bytes), (10, 20, 100));
        assert_eq!(d.prev_segment, 7);
        let from13: Vec<_> = idx.entries_from(d, 13).collect();
        assert_eq!(from13, vec![(e(12, 130, 200), 15), (e(15, 160, 400), 20)]);
        let from10: Vec<_> = idx.entries_from(d, 10).map(|x| x.0.first_offset).collect();
        assert_eq!(from10, vec![10, 12, 15]);
        let d9 = idx.stream(9).unwrap();
        assert_eq!(
            idx.entries_from(d9, 0).collect::<Vec<_>>(),
            vec![(e(0, 0, 128), 1)]
        );
    }

    #[test]
    fn damaged_indexes_are_errors_not_panics() {
        let bytes = encode(&[StreamPart {
            stream_id: 1,
            end_offset: 5,
            prev_segment: 0,
            entries: &[e(0, 0, 64)],
        }]);
        for cut in 0..bytes.len() {
            let _ = SegmentIndex::parse(bytes::Bytes::copy_from_slice(&bytes[..cut]));
        }
        let mut bad = bytes.clone();
        bad[8] = 200; // stream count
        assert!(SegmentIndex::parse(bytes::Bytes::from(bad)).is_err());
    }
}
