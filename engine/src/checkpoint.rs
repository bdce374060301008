//! The engine's checkpoint: its whole state at the start of a segment.
//! Recovery replays from the newest intact one, so open time depends on the
//! log's tail, not on its history.
//!
//! ```text
//! // Checkpoint: { magic: [u8; 4] = "FLCK" | version: u32 = 1 | next_stream_id: u64 | last_token: u64 |
//! //               stream_count: u64 | [Stream]* | lease_count: u64 | [Lease]* }
//! // Stream: { id: u64 | name_len: u8 | name | highest: u64 | next_offset: u64 | start_offset: u64 |
//! //           total_bytes: u64 | run_count: u32 | [Run]* }
//! // Run:    { segment: u64 | first_offset: u64 | end_offset: u64 | cum_bytes: u64 }
//! // Lease:  { name_len: u8 | name | owner_len: u8 | owner | token: u64 | ttl_ms: u64 }
//! ```

use crate::op::Reader;
use crate::view::Run;

const MAGIC: [u8; 4] = *b"FLCK";
const VERSION: u32 = 1;

/// A stream as a checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamRecord {
    pub id: u64,
    pub name: Vec<u8>,
    pub highest: u64,
    pub next_offset: u64,
    pub start_offset: u64,
    pub total_bytes: u64,
    pub runs: Vec<Run>,
}

/// A live lease as a checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    pub name: Vec<u8>,
    pub owner: Vec<u8>,
    pub token: u64,
    pub ttl_ms: u64,
}

/// A whole checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub next_stream_id: u64,
    pub last_token: u64,
    pub streams: Vec<StreamRecord>,
    pub leases: Vec<LeaseRecord>,
}

/// Encoding straight from borrowed parts, to avoid copying the state.
pub(crate) struct Encoder {
    buf: Vec<u8>,
    streams_at: usize,
    streams: u64,
}

impl Encoder {
    pub(crate) fn new(next_stream_id: u64, last_token: u64) -> Encoder {
        let mut buf = Vec::with_capacity(4096);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&next_stream_id.to_le_bytes());
        buf.extend_from_slice(&last_token.to_le_bytes());
        let streams_at = buf.len();
        buf.extend_from_slice(&0u64.to_le_bytes());
        Encoder {
            buf,
            streams_at,
            streams: 0,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn stream<'a>(
        &mut self,
        id: u64,
        name: &[u8],
        highest: u64,
        next_offset: u64,
        start_offset: u64,
        total_bytes: u64,
        runs: impl ExactSizeIterator<Item = &'a Run>,
    ) {
        let b = &mut self.buf;
        b.extend_from_slice(&id.to_le_bytes());
        b.push(name.len() as u8);
        b.extend_from_slice(name);
        for v in [highest, next_offset, start_offset, total_bytes] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        for r in runs {
            for v in [r.segment, r.first_offset, r.end_offset, r.cum_bytes] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        self.streams += 1;
    }

    pub(crate) fn finish<'a>(
        mut self,
        leases: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8], u64, u64)>,
    ) -> Vec<u8> {
        let at = self.streams_at;
        self.buf[at..at + 8].copy_from_slice(&self.streams.to_le_bytes());
        self.buf
            .extend_from_slice(&(leases.len() as u64).to_le_bytes());
        for (name, owner, token, ttl_ms) in leases {
            self.buf.push(name.len() as u8);
            self.buf.extend_from_slice(name);
            self.buf.push(owner.len() as u8);
            self.buf.extend_from_slice(owner);
            self.buf.extend_from_slice(&token.to_le_bytes());
            self.buf.extend_from_slice(&ttl_ms.to_le_bytes());
        }
        self.buf
    }
}

/// Decodes a checkpoint; an error (never a panic, never an allocation sized
/// by a count it has not checked against the bytes) on anything malformed.
pub(crate) fn decode(b: &[u8]) -> Result<Checkpoint, String> {
    let mut r = Reader::new(b);
    if r.bytes(4)? != MAGIC {
        return Err("not a checkpoint (bad magic)".into());
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(format!("checkpoint version {version} is not supported"));
    }
    let next_stream_id = r.u64()?;
    let last_token = r.u64()?;
    let stream_count = r.u64()?;
    // Each stream takes at least 46 bytes (with its non-empty name): bound
    // the count by the payload's length before allocating for it.
    if stream_count > (b.len() as u64) / 46 {
        return Err(format!(
            "{stream_count} streams cannot fit in {} bytes",
            b.len()
        ));
    }
    let mut streams = Vec::with_capacity(stream_count as usize);
    for _ in 0..stream_count {
        let id = r.u64()?;
        let name = r.name()?.to_vec();
        if name.is_empty() {
            return Err("a stream with an empty name".into());
        }
        let highest = r.u64()?;
        let next_offset = r.u64()?;
        let start_offset = r.u64()?;
        let total_bytes = r.u64()?;
        if start_offset > next_offset || id >= next_stream_id {
            return Err(format!("stream {id}: inconsistent offsets or id"));
        }
        let run_count = r.u32()? as usize;
        if run_count > b.len() / 32 {
            return Err(format!("stream {id}: {run_count} runs cannot fit"));
        }
        let mut runs = Vec::with_capacity(run_count);
        for _ in 0..run_count {
            let run = Run {
                segment: r.u64()?,
                first_offset: r.u64()?,
                end_offset: r.u64()?,
                cum_bytes: r.u64()?,
            };
            if run.first_offset >= run.end_offset || run.end_offset > next_offset {
                return Err(format!("stream {id}: a run out of range"));
            }
            runs.push(run);
        }
        streams.push(StreamRecord {
            id,
            name,
            highest,
            next_offset,
            start_offset,
            total_bytes,
            runs,
        });
    }
    let lease_count = r.u64()?;
    if lease_count > (b.len() as u64) / 18 {
        return Err(format!("{lease_count} leases cannot fit"));
    }
    let mut leases = Vec::with_capacity(lease_count as usize);
    for _ in 0..lease_count {
        leases.push(LeaseRecord {
            name: r.name()?.to_vec(),
            owner: r.name()?.to_vec(),
            token: r.u64()?,
            ttl_ms: r.u64()?,
        });
    }
    if !r.is_empty() {
        return Err("bytes after the checkpoint".into());
    }
    Ok(Checkpoint {
        next_stream_id,
        last_token,
        streams,
        leases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let run = Run {
            segment: 3,
            first_offset: 5,
            end_offset: 9,
            cum_bytes: 50,
        };
        let mut e = Encoder::new(7, 99);
        e.stream(2, b"orders", 42, 10, 5, 100, [run].iter());
        e.stream(6, b"x", 1, 0, 0, 0, [].iter());
        let bytes = e.finish([(&b"lock"[..], &b"me"[..], 99u64, 5000u64)].into_iter());
        let c = decode(&bytes).unwrap();
        assert_eq!(c.next_stream_id, 7);
        assert_eq!(c.last_token, 99);
        assert_eq!(c.streams.len(), 2);
        assert_eq!(c.streams[0].runs, vec![run]);
        assert_eq!(c.leases[0].owner, b"me");
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err());
        }
    }
}
