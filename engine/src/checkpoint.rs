//! The engine's checkpoint: its whole state at the start of a segment, in
//! space that grows with the number of streams and leases, never with the
//! log's history. Recovery replays from the newest intact one, so open time
//! depends on the log's tail, not on its history.
//!
//! ```text
//! // Checkpoint: { magic: [u8; 4] = "FLCK" | version: u32 = 2 | next_stream_id: u64 | last_token: u64 |
//! //               stream_count: u64 | [Row; stream_count] | names_len: u64 | names: [u8; names_len] |
//! //               lease_count: u64 | [Lease]* | repl: u8 | [Repl] }
//! // Row (56 B): { id: u64 | highest: u64 | next_offset: u64 | start_offset: u64 | total_bytes: u64 |
//! //               last_sealed: u64 | name_at: u32 | name_len: u8 | reserved: [u8; 3] }
//! // Lease:      { name_len: u8 | name | owner_len: u8 | owner | token: u64 | ttl_ms: u64 }
//! // Repl v1 (cluster mode; repl = 1, read only): { term: u64 | node: u64 | index: u64 | clock_ms: u64 |
//! //               clock_term: u64 | clock_first_ms: u64 | clock_base_ms: u64 | membership_len: u32 | membership }
//! // Repl v2 (cluster mode; repl = 2): { term: u64 | node: u64 | index: u64 | clock_ms: u64 | digest: u64 |
//! //               limits: GroupLimits | membership_len: u32 | membership | [expires_at_ms: u64; lease_count] }
//! ```
//!
//! A replica's leases expire on the group's clock: v2 keeps each lease's
//! expiry (in the order of the leases above), so a replica restored from a
//! checkpoint decides exactly as one that never restarted. (v1 kept none,
//! and a restored replica held every lease for a full ttl from the
//! checkpoint's clock while the others let it expire: replicas disagreed.)
//!
//! Rows are sorted by stream id and have a fixed size, so a reader looking
//! for one stream's offset at this point of the log (see `locate.rs`) reads
//! the rows only. `name_at` is the name's position in `names`.
//! `last_sealed` is the newest sealed segment with records of the stream
//! (0: none), the head of the chain its footers link.

use crate::op::Reader;

const MAGIC: [u8; 4] = *b"FLCK";
const VERSION: u32 = 2;
const ROW: usize = 56;
const HEADER: usize = 32;

/// A stream as a checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamRecord {
    pub id: u64,
    pub name: Vec<u8>,
    pub highest: u64,
    pub next_offset: u64,
    pub start_offset: u64,
    pub total_bytes: u64,
    pub last_sealed: u64,
}

/// A live lease as a checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    pub name: Vec<u8>,
    pub owner: Vec<u8>,
    pub token: u64,
    pub ttl_ms: u64,
    /// On the group's clock (a replica's checkpoint, v2); `None` on a
    /// single node, where the restart rule applies.
    pub expires_at_ms: Option<u64>,
}

/// A live lease, borrowed for encoding: name, owner, token, ttl in ms,
/// expiry on the engine's clock (kept only in a replica's section).
pub(crate) type LeaseRow<'a> = (&'a [u8], &'a [u8], u64, u64, u64);

/// What a replica's state machine adds (cluster mode): the position of
/// the last replicated entry applied, its clock, and the membership.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplRecord {
    pub term: u64,
    pub node: u64,
    pub index: u64,
    pub clock_ms: u64,
    pub digest: u64,
    pub limits: crate::replicated::GroupLimits,
    pub membership: Vec<u8>,
}

/// A whole checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub next_stream_id: u64,
    pub last_token: u64,
    pub streams: Vec<StreamRecord>,
    pub leases: Vec<LeaseRecord>,
    pub repl: Option<ReplRecord>,
}

/// One stream's row, borrowed from the state, for encoding.
pub(crate) struct Row<'a> {
    pub id: u64,
    pub name: &'a [u8],
    pub highest: u64,
    pub next_offset: u64,
    pub start_offset: u64,
    pub total_bytes: u64,
    pub last_sealed: u64,
}

/// Encodes a checkpoint from borrowed parts (the state is not copied).
/// Rows are sorted here. The caller bounds the counts (streams, leases) so
/// that the whole stays far below 4 GiB.
pub(crate) fn encode<'a>(
    next_stream_id: u64,
    last_token: u64,
    mut rows: Vec<Row<'_>>,
    leases: impl ExactSizeIterator<Item = LeaseRow<'a>>,
    repl: Option<&ReplRecord>,
) -> Vec<u8> {
    rows.sort_unstable_by_key(|r| r.id);
    let names_len: usize = rows.iter().map(|r| r.name.len()).sum();
    let mut b = Vec::with_capacity(HEADER + rows.len() * ROW + 8 + names_len + 8);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&next_stream_id.to_le_bytes());
    b.extend_from_slice(&last_token.to_le_bytes());
    b.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    let mut name_at = 0u32;
    for r in &rows {
        for v in [
            r.id,
            r.highest,
            r.next_offset,
            r.start_offset,
            r.total_bytes,
            r.last_sealed,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&name_at.to_le_bytes());
        b.push(r.name.len() as u8);
        b.extend_from_slice(&[0; 3]);
        name_at += r.name.len() as u32;
    }
    b.extend_from_slice(&(names_len as u64).to_le_bytes());
    for r in &rows {
        b.extend_from_slice(r.name);
    }
    b.extend_from_slice(&(leases.len() as u64).to_le_bytes());
    let mut expiries = Vec::with_capacity(if repl.is_some() { leases.len() } else { 0 });
    for (name, owner, token, ttl_ms, expires_at_ms) in leases {
        if repl.is_some() {
            expiries.push(expires_at_ms);
        }
        b.push(name.len() as u8);
        b.extend_from_slice(name);
        b.push(owner.len() as u8);
        b.extend_from_slice(owner);
        b.extend_from_slice(&token.to_le_bytes());
        b.extend_from_slice(&ttl_ms.to_le_bytes());
    }
    match repl {
        None => b.push(0),
        Some(r) => {
            b.push(2);
            for v in [r.term, r.node, r.index, r.clock_ms, r.digest] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&r.limits.encode());
            b.extend_from_slice(&(r.membership.len() as u32).to_le_bytes());
            b.extend_from_slice(&r.membership);
            for e in expiries {
                b.extend_from_slice(&e.to_le_bytes());
            }
        }
    }
    b
}

/// The header and the rows, checked: magic, version, count against the
/// length, ids strictly increasing, offsets consistent.
fn rows(b: &[u8]) -> Result<(u64, u64, &[u8]), String> {
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
    let count = r.u64()?;
    let bytes = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(ROW))
        .filter(|&n| n <= b.len())
        .ok_or_else(|| format!("{count} streams cannot fit in {} bytes", b.len()))?;
    let rows = r.bytes(bytes)?;
    let mut prev = None;
    for row in rows.chunks_exact(ROW) {
        let id = u64_le(row, 0);
        let (next, start) = (u64_le(row, 16), u64_le(row, 24));
        if prev.is_some_and(|p| p >= id) {
            return Err("stream rows not sorted by id".into());
        }
        if start > next || id >= next_stream_id || row[48 + 4] == 0 {
            return Err(format!("stream {id}: inconsistent offsets, id or name"));
        }
        prev = Some(id);
    }
    Ok((next_stream_id, last_token, rows))
}

fn u64_le(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_le(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Each stream's next offset at this checkpoint, by id (sorted): all a
/// reader needs to know in which part of the log a record is.
pub(crate) fn next_offsets(b: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    let (_, _, rows) = rows(b)?;
    Ok(rows
        .chunks_exact(ROW)
        .map(|row| (u64_le(row, 0), u64_le(row, 16)))
        .collect())
}

/// Decodes a checkpoint; an error (never a panic, never an allocation sized
/// by a count it has not checked against the bytes) on anything malformed.
pub(crate) fn decode(b: &[u8]) -> Result<Checkpoint, String> {
    let (next_stream_id, last_token, rows) = rows(b)?;
    let mut r = Reader::new(b);
    r.bytes(HEADER + rows.len())?;
    let names_len = r.u64()?;
    let names =
        r.bytes(usize::try_from(names_len).map_err(|_| format!("{names_len} bytes of names"))?)?;
    let streams = decode_streams(rows, names)?;
    let lease_count = r.u64()?;
    // Each lease takes at least 20 bytes (with a name and an owner).
    if lease_count > (b.len() as u64) / 20 {
        return Err(format!("{lease_count} leases cannot fit"));
    }
    let mut leases: Vec<LeaseRecord> = Vec::with_capacity(lease_count as usize);
    for _ in 0..lease_count {
        leases.push(LeaseRecord {
            name: r.name()?.to_vec(),
            owner: r.name()?.to_vec(),
            token: r.u64()?,
            ttl_ms: r.u64()?,
            expires_at_ms: None,
        });
    }
    let repl = decode_repl(&mut r, &mut leases)?;
    if !r.is_empty() {
        return Err("bytes after the checkpoint".into());
    }
    Ok(Checkpoint {
        next_stream_id,
        last_token,
        streams,
        leases,
        repl,
    })
}

/// The stream rows, each with its name from `names`.
fn decode_streams(rows: &[u8], names: &[u8]) -> Result<Vec<StreamRecord>, String> {
    let mut streams = Vec::with_capacity(rows.len() / ROW);
    for row in rows.chunks_exact(ROW) {
        let at = u32_le(row, 48) as usize;
        let len = row[52] as usize;
        let name = names
            .get(at..at.saturating_add(len))
            .ok_or_else(|| format!("stream {}: its name runs past the names", u64_le(row, 0)))?;
        streams.push(StreamRecord {
            id: u64_le(row, 0),
            name: name.to_vec(),
            highest: u64_le(row, 8),
            next_offset: u64_le(row, 16),
            start_offset: u64_le(row, 24),
            total_bytes: u64_le(row, 32),
            last_sealed: u64_le(row, 40),
        });
    }
    Ok(streams)
}

/// The replication section (cluster mode): none, the old form (version 1),
/// or the current one, which also carries each lease's expiry.
fn decode_repl(
    r: &mut Reader<'_>,
    leases: &mut [LeaseRecord],
) -> Result<Option<ReplRecord>, String> {
    Ok(match r.u8()? {
        0 => None,
        1 => {
            // The old clock fields (a per-term rebase) are read past: the
            // group's clock is the highest time applied, `clock_ms`.
            let mut v = [0u64; 7];
            for x in &mut v {
                *x = r.u64()?;
            }
            let len = r.u32()? as usize;
            Some(ReplRecord {
                term: v[0],
                node: v[1],
                index: v[2],
                clock_ms: v[3],
                digest: 0,
                limits: crate::replicated::GroupLimits::default(),
                membership: r.bytes(len)?.to_vec(),
            })
        }
        2 => {
            let mut v = [0u64; 5];
            for x in &mut v {
                *x = r.u64()?;
            }
            let limits = crate::replicated::GroupLimits::decode(
                r.bytes(crate::replicated::GroupLimits::ENCODED)?,
            )?;
            let len = r.u32()? as usize;
            let membership = r.bytes(len)?.to_vec();
            for l in leases.iter_mut() {
                l.expires_at_ms = Some(r.u64()?);
            }
            Some(ReplRecord {
                term: v[0],
                node: v[1],
                index: v[2],
                clock_ms: v[3],
                digest: v[4],
                limits,
                membership,
            })
        }
        other => return Err(format!("unknown replication section {other}")),
    })
}

/// Bytes a checkpoint of these streams (with `names` bytes of names in
/// all) takes, without its leases: to decide whether one is worth writing.
pub(crate) fn row_bytes(streams: usize, names: usize) -> usize {
    HEADER + streams * ROW + 8 + names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, name: &[u8], next: u64) -> Row<'_> {
        Row {
            id,
            name,
            highest: id * 10,
            next_offset: next,
            start_offset: next / 2,
            total_bytes: next * 3,
            last_sealed: id + 100,
        }
    }

    #[test]
    fn round_trip() {
        let rows = vec![row(6, b"x", 4), row(2, b"orders", 10)];
        let bytes = encode(
            7,
            99,
            rows,
            [(&b"lock"[..], &b"me"[..], 99u64, 5000u64, 7000u64)].into_iter(),
            None,
        );
        let c = decode(&bytes).unwrap();
        assert_eq!(c.next_stream_id, 7);
        assert_eq!(c.last_token, 99);
        assert_eq!(c.streams.len(), 2);
        assert_eq!(c.streams[0].name, b"orders", "rows sorted by id");
        assert_eq!(c.streams[0].last_sealed, 102);
        assert_eq!(c.streams[1].next_offset, 4);
        assert_eq!(c.leases[0].owner, b"me");
        assert_eq!(
            c.leases[0].expires_at_ms, None,
            "a single node keeps no expiry"
        );
        assert_eq!(next_offsets(&bytes).unwrap(), vec![(2, 10), (6, 4)]);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn a_checkpoint_grows_with_streams_not_history() {
        // The same streams at any point of the log take the same room.
        let small = encode(
            3,
            0,
            vec![row(1, b"a", 1), row(2, b"b", 1)],
            [].into_iter(),
            None,
        );
        let later = encode(
            3,
            0,
            vec![row(1, b"a", u64::MAX / 4), row(2, b"b", u64::MAX / 4)],
            [].into_iter(),
            None,
        );
        assert_eq!(small.len(), later.len());
        assert_eq!(small.len(), row_bytes(2, 2) + 8 + 1);
    }

    #[test]
    fn a_replica_s_section_round_trips() {
        let repl = ReplRecord {
            term: 3,
            node: 2,
            index: 99,
            clock_ms: 1234,
            digest: 0xfeed_f00d_dead_beef,
            limits: crate::replicated::GroupLimits {
                max_live_leases: 7,
                ..Default::default()
            },
            membership: b"{members}".to_vec(),
        };
        let leases = [
            (&b"a"[..], &b"o1"[..], 5u64, 300u64, 1534u64),
            (&b"b"[..], &b"o2"[..], 6u64, 900u64, 2100u64),
        ];
        let bytes = encode(2, 6, vec![row(1, b"a", 1)], leases.into_iter(), Some(&repl));
        let c = decode(&bytes).unwrap();
        assert_eq!(c.repl, Some(repl));
        // Each lease's expiry on the group's clock, in the leases' order.
        assert_eq!(
            c.leases.iter().map(|l| l.expires_at_ms).collect::<Vec<_>>(),
            [Some(1534), Some(2100)]
        );
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err());
        }
    }
}
