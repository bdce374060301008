//! The operations the engine writes into the log, one per entry. The token
//! and the decision's effect travel in the same entry, so a crash keeps both
//! or neither.
//!
//! Integers are little-endian. Every op starts with its code:
//!
//! ```text
//! // Append:  { op: u8 = 1 | name_len: u8 | name | token: u64 | first_offset: u64 | count: u32 | [len: u32 | payload]* }
//! // Fence:   { op: u8 = 2 | name_len: u8 | name | token: u64 }
//! // Trim:    { op: u8 = 3 | name_len: u8 | name | token: u64 | before: u64 }
//! // Delete:  { op: u8 = 4 | name_len: u8 | name | token: u64 }
//! // Acquire: { op: u8 = 5 | name_len: u8 | name | owner_len: u8 | owner | token: u64 | ttl_ms: u64 | fence: u8 }
//! // Release: { op: u8 = 6 | name_len: u8 | name | owner_len: u8 | owner | token: u64 }
//! // Renew:   { op: u8 = 7 | name_len: u8 | name | owner_len: u8 | owner | token: u64 | ttl_ms: u64 }
//! // Batch:   { op: u8 = 8 | count: u32 | [len: u32 | op]* }   (each op an Append, Fence, Trim or Delete)
//! // Replicated: { op: u8 = 9 | term: u64 | node: u64 | index: u64 | time_ms: u64 | inner: [op] }
//! // Membership: { op: u8 = 10 | config: [u8] }   (only inside Replicated)
//! // TakeOver:   { op: u8 = 11 }                  (only inside Replicated)
//! // Limits:     { op: u8 = 12 | max_payload_bytes: u32 | max_records_per_append: u32 | lease_ttl_min_ms: u64 |
//! //               lease_ttl_max_ms: u64 | max_live_leases: u64 | max_streams: u64 }   (only inside Replicated)
//! ```
//!
//! In cluster mode every entry the state machine writes is Replicated: the
//! position of the replicated log entry it applies (term, leader node,
//! index), the proposing leader's clock, and the op it decided (none for an
//! entry that changed nothing but the position).
//!
//! A batch is a transaction: its ops were decided together, in order, and
//! land (or vanish in a crash) together.
//!
//! A release is written but not waited for; a renewal is written (and
//! waited for) only when it lengthens the ttl the log holds.

use crate::records::{Laid, Records};

pub(crate) const APPEND: u8 = 1;
pub(crate) const FENCE: u8 = 2;
pub(crate) const TRIM: u8 = 3;
pub(crate) const DELETE: u8 = 4;
pub(crate) const ACQUIRE: u8 = 5;
pub(crate) const RELEASE: u8 = 6;
pub(crate) const RENEW: u8 = 7;
pub(crate) const BATCH: u8 = 8;
pub(crate) const REPLICATED: u8 = 9;
pub(crate) const MEMBERSHIP: u8 = 10;
pub(crate) const TAKE_OVER: u8 = 11;
pub(crate) const LIMITS: u8 = 12;

/// Bytes of a Replicated op's header, before its inner op.
pub(crate) const REPLICATED_HEADER: usize = 33;

/// An append op: records added to a stream, borrowing the entry's payload.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Append<'a> {
    /// The stream.
    pub stream: &'a [u8],
    /// The token the append carried.
    pub token: u64,
    /// The offset of its first record.
    pub first_offset: u64,
    /// How many records.
    pub count: u32,
    /// The records as written, `[len: u32 | payload]*`, `count` times
    /// (checked by the decoder; each payload: [`Append::payloads`]).
    pub records: &'a [u8],
}

impl<'a> Append<'a> {
    /// Each record's payload, in order.
    pub fn payloads(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let records = self.records;
        self::records(records).map(move |(s, e)| &records[s..e])
    }

    /// The bytes of the payloads, together.
    pub fn payload_bytes(&self) -> u64 {
        self.payloads().map(|p| p.len() as u64).sum()
    }

    /// The offset after its last record.
    pub fn end_offset(&self) -> u64 {
        self.first_offset.saturating_add(u64::from(self.count))
    }
}

/// The form tools printed before [`Op`] was public (`fencelog dump` prints
/// it inside a replicated entry): the payloads, not the bytes.
impl std::fmt::Debug for Append<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Append")
            .field("stream", &self.stream)
            .field("token", &self.token)
            .field("first_offset", &self.first_offset)
            .field("records", &self.count)
            .field("payloads", &self.payloads().collect::<Vec<_>>())
            .finish()
    }
}

/// An acquire op: a lease granted, borrowing the entry's payload. Its
/// `Debug` is the form tools printed before [`Op`] was public.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub struct Acquire<'a> {
    /// The lease (and, with `fence`, the stream).
    pub name: &'a [u8],
    /// The holder.
    pub owner: &'a [u8],
    /// The token issued.
    pub token: u64,
    /// Its ttl.
    pub ttl_ms: u64,
    /// Whether the stream of the same name was fenced with it.
    pub fence: bool,
}

/// What one log entry (an op) means to the engine, decoded and checked the
/// way recovery decodes it, borrowing the entry's payload. Tools see it
/// through [`crate::inspect`].
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op<'a> {
    /// Records appended.
    Append(Append<'a>),
    /// The stream's highest token raised.
    Fence {
        /// The stream.
        stream: &'a [u8],
        /// The new highest token.
        token: u64,
    },
    /// Records below `before` trimmed.
    Trim {
        /// The stream.
        stream: &'a [u8],
        /// The token.
        token: u64,
        /// The new start offset (at least).
        before: u64,
    },
    /// Every record deleted.
    Delete {
        /// The stream.
        stream: &'a [u8],
        /// The token.
        token: u64,
    },
    /// A lease granted.
    Acquire(Acquire<'a>),
    /// A lease released.
    Release {
        /// The lease.
        name: &'a [u8],
        /// The holder.
        owner: &'a [u8],
        /// Its token.
        token: u64,
    },
    /// A lease's ttl lengthened.
    Renew {
        /// The lease.
        name: &'a [u8],
        /// The holder.
        owner: &'a [u8],
        /// Its token.
        token: u64,
        /// The new ttl.
        ttl_ms: u64,
    },
    /// A transaction: stream ops (appends, fences, trims, deletes) decided
    /// together, in order, written as one entry.
    Batch {
        /// How many ops.
        count: u32,
        /// The ops as written, `[len: u32 | op]*`, `count` times, each
        /// checked by the decoder (each decoded: [`Op::batch_ops`]).
        ops: &'a [u8],
    },
    /// A replica applied an entry of the replicated log (cluster mode): its
    /// position, the leader's clock, and the op decided.
    Replicated {
        /// The leader's term.
        term: u64,
        /// The leader's node id.
        node: u64,
        /// The entry's index in the replicated log.
        index: u64,
        /// The leader's clock when it proposed the entry, in ms.
        time_ms: u64,
        /// The op it decided as written: an op other than Replicated
        /// (checked by the decoder), or empty when nothing changed but the
        /// position (decoded: [`Op::replicated_op`]).
        inner: &'a [u8],
    },
    /// The cluster's membership (only inside Replicated).
    Membership {
        /// As the replication layer encodes it (opaque to the engine).
        config: &'a [u8],
    },
    /// A new leader took over: every live lease restarts its full ttl.
    TakeOver,
    /// The group's limits changed (cluster mode: the limits that decide
    /// are replicated state, never a node's flags).
    Limits {
        /// The new limits.
        limits: crate::replicated::GroupLimits,
    },
}

impl<'a> Op<'a> {
    /// The ops of a transaction, in order (none for other ops).
    pub fn batch_ops(&self) -> impl Iterator<Item = Op<'a>> + use<'a> {
        let ops: &'a [u8] = match *self {
            Op::Batch { ops, .. } => ops,
            _ => &[],
        };
        batch_ops(ops)
    }

    /// The op a replicated entry decided (`None` for other ops, and for a
    /// replicated entry that changed nothing but the position).
    pub fn replicated_op(&self) -> Option<Op<'a>> {
        match *self {
            // Checked by the decoder when it decoded the wrapper.
            Op::Replicated { inner, .. } if !inner.is_empty() => decode(inner).ok(),
            _ => None,
        }
    }

    /// The stream or lease the op concerns, if one (`None` for a
    /// transaction and the cluster's ops; a replicated entry: its op's).
    pub fn name(&self) -> Option<&'a [u8]> {
        match *self {
            Op::Append(Append { stream, .. })
            | Op::Fence { stream, .. }
            | Op::Trim { stream, .. }
            | Op::Delete { stream, .. } => Some(stream),
            Op::Acquire(Acquire { name, .. })
            | Op::Release { name, .. }
            | Op::Renew { name, .. } => Some(name),
            Op::Replicated { .. } => self.replicated_op().and_then(|o| o.name()),
            Op::Batch { .. } | Op::Membership { .. } | Op::TakeOver | Op::Limits { .. } => None,
        }
    }

    /// Whether the op concerns stream or lease `name` (a transaction: any
    /// of its ops).
    pub fn concerns(&self, name: &[u8]) -> bool {
        match self {
            Op::Batch { .. } => self.batch_ops().any(|o| o.concerns(name)),
            _ => self.name() == Some(name),
        }
    }
}

/// Shows what the op means rather than its bytes: an append's payloads, a
/// transaction's ops, a replicated entry's op, each decoded. `fencelog dump`
/// prints this for the ops it has no line of its own for, so its form (the
/// names of the view tools had before `Op` was public) stays as it was.
impl std::fmt::Debug for Op<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Debug;
        // Each field bound by the pattern, under its own name.
        macro_rules! fields {
            ($($field:ident),*) => { &[$((stringify!($field), $field as &dyn Debug)),*] };
        }
        // Filled only for the ops whose form shows them.
        let (ops, op);
        let (kind, fields): (&str, &[(&str, &dyn Debug)]) = match self {
            Op::Append(a) => return a.fmt(f),
            Op::Acquire(a) => return a.fmt(f),
            Op::TakeOver => return f.write_str("TakeOver"),
            Op::Fence { stream, token } => ("Fence", fields!(stream, token)),
            Op::Trim {
                stream,
                token,
                before,
            } => ("Trim", fields!(stream, token, before)),
            Op::Delete { stream, token } => ("Delete", fields!(stream, token)),
            Op::Release { name, owner, token } => ("Release", fields!(name, owner, token)),
            Op::Renew {
                name,
                owner,
                token,
                ttl_ms,
            } => ("Renew", fields!(name, owner, token, ttl_ms)),
            Op::Batch { .. } => {
                ops = self.batch_ops().collect::<Vec<_>>();
                ("Transaction", &[("ops", &ops)])
            }
            Op::Replicated {
                term,
                node,
                index,
                time_ms,
                ..
            } => {
                op = self.replicated_op();
                let op = &op;
                ("Replicated", fields!(term, node, index, time_ms, op))
            }
            Op::Membership { config } => ("Membership", fields!(config)),
            Op::Limits { limits } => ("Limits", fields!(limits)),
        };
        let mut s = f.debug_struct(kind);
        for (name, value) in fields {
            s.field(name, value);
        }
        s.finish()
    }
}

/// Bytes of an append op with these payloads.
pub(crate) fn append_len<R: Records + ?Sized>(stream: &[u8], payloads: &R) -> usize {
    1 + 1 + stream.len() + 8 + 8 + 4 + payloads.laid_len()
}

/// Writes an append op into `out`, which is exactly `append_len` long.
pub(crate) fn encode_append<R: Records + ?Sized>(
    out: &mut [u8],
    stream: &[u8],
    token: u64,
    first_offset: u64,
    payloads: &R,
) {
    let mut w = Cursor { out, at: 0 };
    w.u8(APPEND);
    w.name(stream);
    w.u64(token);
    w.u64(first_offset);
    w.u32(payloads.count() as u32);
    let at = w.at;
    payloads.lay(&mut w.out[at..]);
}

/// Encodes any op but an append into a new buffer (they are small).
pub(crate) fn encode(op: &Op<'_>) -> Vec<u8> {
    let len = match op {
        Op::Append(a) => 22 + a.stream.len() + a.records.len(),
        Op::Fence { stream, .. } => 10 + stream.len(),
        Op::Trim { stream, .. } => 18 + stream.len(),
        Op::Delete { stream, .. } => 10 + stream.len(),
        Op::Acquire(a) => 20 + a.name.len() + a.owner.len(),
        Op::Release { name, owner, .. } => 11 + name.len() + owner.len(),
        Op::Renew { name, owner, .. } => 19 + name.len() + owner.len(),
        Op::Batch { ops, .. } => 5 + ops.len(),
        Op::Replicated { inner, .. } => REPLICATED_HEADER + inner.len(),
        Op::Membership { config } => 1 + config.len(),
        Op::TakeOver => 1,
        Op::Limits { .. } => 1 + crate::replicated::GroupLimits::ENCODED,
    };
    let mut buf = vec![0u8; len];
    let mut w = Cursor {
        out: &mut buf,
        at: 0,
    };
    put(&mut w, op);
    debug_assert_eq!(w.at, len);
    buf
}

/// Writes `op`'s fields, in its layout, into `w`.
pub(crate) fn put(w: &mut impl Put, op: &Op<'_>) {
    match *op {
        Op::Append(Append {
            stream,
            token,
            first_offset,
            count,
            records,
        }) => {
            w.u8(APPEND);
            w.name(stream);
            w.u64(token);
            w.u64(first_offset);
            w.u32(count);
            w.bytes(records);
        }
        Op::Fence { stream, token } => {
            w.u8(FENCE);
            w.name(stream);
            w.u64(token);
        }
        Op::Trim {
            stream,
            token,
            before,
        } => {
            w.u8(TRIM);
            w.name(stream);
            w.u64(token);
            w.u64(before);
        }
        Op::Delete { stream, token } => {
            w.u8(DELETE);
            w.name(stream);
            w.u64(token);
        }
        Op::Acquire(a) => {
            w.u8(ACQUIRE);
            w.name(a.name);
            w.name(a.owner);
            w.u64(a.token);
            w.u64(a.ttl_ms);
            w.u8(u8::from(a.fence));
        }
        Op::Release { name, owner, token } => {
            w.u8(RELEASE);
            w.name(name);
            w.name(owner);
            w.u64(token);
        }
        Op::Renew {
            name,
            owner,
            token,
            ttl_ms,
        } => {
            w.u8(RENEW);
            w.name(name);
            w.name(owner);
            w.u64(token);
            w.u64(ttl_ms);
        }
        Op::Batch { count, ops } => {
            w.u8(BATCH);
            w.u32(count);
            w.bytes(ops);
        }
        Op::Replicated {
            term,
            node,
            index,
            time_ms,
            inner,
        } => {
            w.bytes(&replicated_header(term, node, index, time_ms));
            w.bytes(inner);
        }
        Op::Membership { config } => {
            w.u8(MEMBERSHIP);
            w.bytes(config);
        }
        Op::TakeOver => w.u8(TAKE_OVER),
        Op::Limits { limits } => {
            w.u8(LIMITS);
            w.bytes(&limits.encode());
        }
    }
}

/// The header of a Replicated op; its inner op follows.
pub(crate) fn replicated_header(
    term: u64,
    node: u64,
    index: u64,
    time_ms: u64,
) -> [u8; REPLICATED_HEADER] {
    let mut h = [0u8; REPLICATED_HEADER];
    h[0] = REPLICATED;
    h[1..9].copy_from_slice(&term.to_le_bytes());
    h[9..17].copy_from_slice(&node.to_le_bytes());
    h[17..25].copy_from_slice(&index.to_le_bytes());
    h[25..33].copy_from_slice(&time_ms.to_le_bytes());
    h
}

/// Bytes of a batch op holding these encoded ops.
pub(crate) fn batch_len(ops: &[Vec<u8>]) -> usize {
    5 + ops.iter().map(|o| 4 + o.len()).sum::<usize>()
}

/// Writes a batch op of these encoded ops into `out`, which is exactly
/// [`batch_len`] long.
pub(crate) fn encode_batch(out: &mut [u8], ops: &[Vec<u8>]) {
    let mut w = Cursor { out, at: 0 };
    w.u8(BATCH);
    w.u32(ops.len() as u32);
    for op in ops {
        w.u32(op.len() as u32);
        w.bytes(op);
    }
    debug_assert_eq!(w.at, w.out.len());
}

/// The ops of a batch, already checked by [`decode`]: each decodes, none is
/// a batch or a lease op.
pub(crate) fn batch_ops(ops: &[u8]) -> impl Iterator<Item = Op<'_>> + '_ {
    let mut r = Reader::new(ops);
    std::iter::from_fn(move || {
        let len = r.u32().ok()? as usize;
        decode(r.bytes(len).ok()?).ok()
    })
}

struct Cursor<'a> {
    out: &'a mut [u8],
    at: usize,
}

/// Where encoded fields go, little-endian: an entry's bytes sized in
/// advance ([`Cursor`]), or a growing buffer (a proposed command's bytes,
/// `command_codec.rs`).
pub(crate) trait Put {
    fn bytes(&mut self, b: &[u8]);
    fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// A name or owner: its length in one byte (the caller has checked
    /// that it fits), then its bytes.
    fn name(&mut self, n: &[u8]) {
        debug_assert!(n.len() <= usize::from(u8::MAX));
        self.u8(n.len() as u8);
        self.bytes(n);
    }
}

impl Put for Cursor<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

impl Put for Vec<u8> {
    fn bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Reads little-endian fields from a byte slice, failing (never panicking)
/// when it runs out.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                format!(
                    "truncated: {n} bytes wanted at {} of {}",
                    self.at,
                    self.b.len()
                )
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.bytes(4)?);
        Ok(u32::from_le_bytes(a))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn name(&mut self) -> Result<&'a [u8], String> {
        let n = self.u8()? as usize;
        self.bytes(n)
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.b[self.at..];
        self.at = self.b.len();
        s
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at == self.b.len()
    }

    /// Bytes not read yet.
    pub(crate) fn rest_len(&self) -> usize {
        self.b.len() - self.at
    }
}

/// Decodes an op; an error (never a panic) on anything malformed.
pub(crate) fn decode(b: &[u8]) -> Result<Op<'_>, String> {
    let op = decode_layout(b)?;
    check_fields(&op)?;
    Ok(op)
}

/// A replica's wrapper after its code: the Raft position and clock, and
/// the op it wraps (not decoded).
fn replicated_parts<'a>(r: &mut Reader<'a>) -> Result<(u64, u64, u64, u64, &'a [u8]), String> {
    let (term, node, index, time_ms) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
    let inner = r.rest();
    // Checked before decoding: a wrapper inside a wrapper would make
    // decoding recurse as deep as the bytes nest.
    if inner.first() == Some(&REPLICATED) {
        return Err("a replicated entry inside a replicated entry".into());
    }
    Ok((term, node, index, time_ms, inner))
}

/// [`decode`], a replica's wrapper taken off: the op it wraps, decoded
/// once (decoding the wrapper decodes it to check it, and a reader that
/// wants the op would decode it again). An empty wrapper is answered as
/// itself.
pub(crate) fn decode_unwrapped(b: &[u8]) -> Result<Op<'_>, String> {
    if b.first() == Some(&REPLICATED) {
        let mut r = Reader::new(&b[1..]);
        let (.., inner) = replicated_parts(&mut r)?;
        if !inner.is_empty() {
            return decode(inner);
        }
    }
    decode(b)
}

/// Decodes an op's layout, without [`check_fields`] on its own fields (a
/// proposed command's are refused, not malformed, when out of range).
pub(crate) fn decode_layout(b: &[u8]) -> Result<Op<'_>, String> {
    let mut r = Reader::new(b);
    let op = match r.u8()? {
        APPEND => {
            let stream = r.name()?;
            let token = r.u64()?;
            let first_offset = r.u64()?;
            let count = r.u32()?;
            let records = r.rest();
            // Walk the records once so that readers can trust the layout.
            if Laid::new(count, records).is_none() {
                return Err(format!(
                    "{count} records claimed, not what the {} bytes after hold",
                    records.len()
                ));
            }
            if count == 0 {
                return Err("an append with no records".into());
            }
            Op::Append(Append {
                stream,
                token,
                first_offset,
                count,
                records,
            })
        }
        FENCE => Op::Fence {
            stream: r.name()?,
            token: r.u64()?,
        },
        TRIM => Op::Trim {
            stream: r.name()?,
            token: r.u64()?,
            before: r.u64()?,
        },
        DELETE => Op::Delete {
            stream: r.name()?,
            token: r.u64()?,
        },
        ACQUIRE => Op::Acquire(Acquire {
            name: r.name()?,
            owner: r.name()?,
            token: r.u64()?,
            ttl_ms: r.u64()?,
            fence: r.u8()? != 0,
        }),
        RELEASE => Op::Release {
            name: r.name()?,
            owner: r.name()?,
            token: r.u64()?,
        },
        RENEW => Op::Renew {
            name: r.name()?,
            owner: r.name()?,
            token: r.u64()?,
            ttl_ms: r.u64()?,
        },
        BATCH => {
            let count = r.u32()?;
            let ops = r.rest();
            let mut walk = Reader::new(ops);
            for _ in 0..count {
                let len = walk.u32()? as usize;
                let sub = walk.bytes(len)?;
                // Checked before decoding: a batch inside a batch, or a
                // replicated entry holding a batch inside a batch, would make
                // decoding recurse as deep as the bytes nest.
                if !matches!(sub.first(), Some(&(APPEND | FENCE | TRIM | DELETE))) {
                    return Err("a batch may hold only appends, fences, trims and deletes".into());
                }
                match decode(sub)? {
                    Op::Append(_) | Op::Fence { .. } | Op::Trim { .. } | Op::Delete { .. } => {}
                    _ => {
                        return Err(
                            "a batch may hold only appends, fences, trims and deletes".into()
                        );
                    }
                }
            }
            if !walk.is_empty() {
                return Err("bytes after the last op of a batch".into());
            }
            if count == 0 {
                return Err("a batch with no ops".into());
            }
            return Ok(Op::Batch { count, ops });
        }
        REPLICATED => {
            let (term, node, index, time_ms, inner) = replicated_parts(&mut r)?;
            if !inner.is_empty() {
                decode(inner)?;
            }
            return Ok(Op::Replicated {
                term,
                node,
                index,
                time_ms,
                inner,
            });
        }
        MEMBERSHIP => return Ok(Op::Membership { config: r.rest() }),
        TAKE_OVER => Op::TakeOver,
        LIMITS => Op::Limits {
            limits: crate::replicated::GroupLimits::decode(
                r.bytes(crate::replicated::GroupLimits::ENCODED)?,
            )?,
        },
        other => return Err(format!("unknown op code {other}")),
    };
    if !r.is_empty() {
        return Err("bytes after the op".into());
    }
    Ok(op)
}

/// The checks every single op passes: a name, an owner of printable ASCII,
/// a token in range.
fn check_fields(op: &Op<'_>) -> Result<(), String> {
    let (name, owner, token) = match *op {
        Op::Append(Append { stream, token, .. })
        | Op::Fence { stream, token }
        | Op::Trim { stream, token, .. }
        | Op::Delete { stream, token } => (stream, None, token),
        Op::Acquire(Acquire {
            name, owner, token, ..
        })
        | Op::Release { name, owner, token }
        | Op::Renew {
            name, owner, token, ..
        } => (name, Some(owner), token),
        // Its ops were checked one by one; the others carry no name.
        Op::Batch { .. }
        | Op::Replicated { .. }
        | Op::Membership { .. }
        | Op::TakeOver
        | Op::Limits { .. } => {
            return Ok(());
        }
    };
    if name.is_empty() {
        return Err("an empty stream or lease name".into());
    }
    if owner.is_some_and(|o| o.is_empty() || o.len() > 128 || !o.iter().all(u8::is_ascii_graphic)) {
        return Err("an owner that is not 1..=128 bytes of printable ASCII".into());
    }
    if token == 0 || token > crate::token::MAX_TOKEN {
        return Err(format!("token {token} out of range"));
    }
    Ok(())
}

/// The records of an append op: `[len: u32 | payload]*`, already checked by
/// [`decode`].
pub(crate) fn records(records: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + 4 > records.len() {
            return None;
        }
        let len = u32::from_le_bytes([
            records[at],
            records[at + 1],
            records[at + 2],
            records[at + 3],
        ]) as usize;
        let start = at + 4;
        let end = (start + len).min(records.len());
        at = end;
        Some((start, end))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An append op's bytes, as the log writes them.
    fn append_bytes(stream: &[u8], token: u64, first: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let mut buf = vec![0u8; append_len(stream, payloads)];
        encode_append(&mut buf, stream, token, first, payloads);
        buf
    }

    #[test]
    fn append_round_trip() {
        let payloads: [&[u8]; 3] = [b"a", b"", b"ccc"];
        let buf = append_bytes(b"orders", 42, 7, &payloads);
        let Op::Append(Append {
            stream,
            token,
            first_offset,
            count,
            records: recs,
        }) = decode(&buf).unwrap()
        else {
            panic!("not an append");
        };
        assert_eq!(
            (stream, token, first_offset, count),
            (&b"orders"[..], 42, 7, 3)
        );
        let got: Vec<&[u8]> = records(recs).map(|(s, e)| &recs[s..e]).collect();
        assert_eq!(got, payloads);
    }

    #[test]
    fn other_ops_round_trip() {
        let ops = [
            Op::Fence {
                stream: b"s",
                token: 9,
            },
            Op::Trim {
                stream: b"s",
                token: 9,
                before: 100,
            },
            Op::Delete {
                stream: b"s",
                token: 9,
            },
            Op::Acquire(Acquire {
                name: b"lock",
                owner: b"me",
                token: 77,
                ttl_ms: 5000,
                fence: true,
            }),
            Op::Release {
                name: b"lock",
                owner: b"me",
                token: 77,
            },
            Op::Renew {
                name: b"lock",
                owner: b"me",
                token: 77,
                ttl_ms: 9000,
            },
        ];
        for op in ops {
            assert_eq!(decode(&encode(&op)).unwrap(), op);
        }
    }

    /// `fencelog dump` prints this form for the ops it has no line of its
    /// own for (a replica's entries): the form it printed before `Op` was
    /// public, when tools had a copy of it.
    #[test]
    fn debug_form_shows_what_an_op_means() {
        let payloads: [&[u8]; 2] = [b"x", b""];
        let append = append_bytes(b"s", 5, 0, &payloads);
        let fence = encode(&Op::Fence {
            stream: b"s",
            token: 6,
        });
        let acquire = encode(&Op::Acquire(Acquire {
            name: b"l",
            owner: b"me",
            token: 7,
            ttl_ms: 1000,
            fence: true,
        }));
        let ops = [append, fence];
        let mut batch = vec![0u8; batch_len(&ops)];
        encode_batch(&mut batch, &ops);
        let shown = |inner: &[u8]| {
            let mut entry = replicated_header(1, 2, 3, 4).to_vec();
            entry.extend_from_slice(inner);
            format!("{:?}", decode(&entry).unwrap())
        };
        let head = "Replicated { term: 1, node: 2, index: 3, time_ms: 4, op:";
        assert_eq!(
            shown(&batch),
            format!(
                "{head} Some(Transaction {{ ops: [Append {{ stream: [115], token: 5, \
                 first_offset: 0, records: 2, payloads: [[120], []] }}, \
                 Fence {{ stream: [115], token: 6 }}] }}) }}"
            )
        );
        assert_eq!(
            shown(&acquire),
            format!(
                "{head} Some(Acquire {{ name: [108], owner: [109, 101], token: 7, \
                 ttl_ms: 1000, fence: true }}) }}"
            )
        );
        assert_eq!(shown(&[]), format!("{head} None }}"));
        assert_eq!(shown(&[TAKE_OVER]), format!("{head} Some(TakeOver) }}"));
        assert_eq!(
            shown(&[MEMBERSHIP, 1, 2]),
            format!("{head} Some(Membership {{ config: [1, 2] }}) }}")
        );
    }

    #[test]
    fn malformed_ops_are_errors() {
        assert!(decode(&[]).is_err());
        assert!(decode(&[99]).is_err());
        let mut buf = encode(&Op::Fence {
            stream: b"s",
            token: 9,
        });
        buf.pop();
        assert!(decode(&buf).is_err());
        let zero = encode(&Op::Fence {
            stream: b"s",
            token: 0,
        });
        assert!(decode(&zero).is_err());
        // An append whose record lengths run past the end.
        let mut buf = append_bytes(b"s", 1, 0, &[b"abc"]);
        let n = buf.len();
        buf[n - 7] = 200;
        assert!(decode(&buf).is_err());
        // A byte after the last record, and no records at all.
        let mut buf = append_bytes(b"s", 1, 0, &[b"abc"]);
        buf.push(0);
        let err = decode(&buf).unwrap_err();
        assert!(
            err.contains("1 records claimed") && err.contains("8 bytes"),
            "{err}"
        );
        let mut none = append_bytes(b"s", 1, 0, &[b"abc"]);
        none.truncate(none.len() - 7);
        let count = none.len() - 4;
        none[count..].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode(&none).unwrap_err(), "an append with no records");
    }

    /// A batch inside a replicated entry inside a batch, and so on: each
    /// wrapper refused only what nested directly in itself, so decoding
    /// recursed once per level, as deep as a crafted entry nests (a 16 MiB
    /// entry holds 400 000 levels: a stack overflow on bytes from disk).
    #[test]
    fn alternating_wrappers_do_not_recurse() {
        const LEVELS: usize = 100_000;
        let fence = encode(&Op::Fence {
            stream: b"s",
            token: 1,
        });
        // Level i wraps level i - 1: a batch of one op at even levels, a
        // replicated entry at odd ones. Written outside in, in one pass.
        let mut sizes = vec![fence.len()];
        for level in 0..LEVELS {
            let inner = sizes[level];
            sizes.push(if level % 2 == 0 {
                9 + inner
            } else {
                REPLICATED_HEADER + inner
            });
        }
        let mut op = Vec::with_capacity(sizes[LEVELS]);
        for level in (0..LEVELS).rev() {
            if level % 2 == 0 {
                op.push(BATCH);
                op.extend_from_slice(&1u32.to_le_bytes());
                op.extend_from_slice(&(sizes[level] as u32).to_le_bytes());
            } else {
                op.extend_from_slice(&replicated_header(1, 1, 1, 1));
            }
        }
        op.extend_from_slice(&fence);
        assert_eq!(op.len(), sizes[LEVELS]);
        assert!(decode(&op).is_err());
        // Two levels are what the log writes: a transaction, replicated.
        let two = &op[op.len() - sizes[2]..];
        assert!(matches!(decode(two), Ok(Op::Replicated { .. })));
    }

    /// `decode_unwrapped` answers what decoding the wrapper and then its op
    /// answers, for every cut and every flipped byte of a wrapped append,
    /// a wrapped fence, an empty wrapper, a wrapper in a wrapper and a
    /// plain op: the op once decoded, every error still an error.
    #[test]
    fn an_op_unwrapped_is_the_op_the_wrapper_holds() {
        let payloads: [&[u8]; 2] = [b"one", b"three"];
        let append = append_bytes(b"orders", 42, 7, &payloads);
        let fence = encode(&Op::Fence {
            stream: b"s",
            token: 3,
        });
        let wrap = |inner: &[u8]| [&replicated_header(2, 1, 9, 100)[..], inner].concat();
        let cases = [
            wrap(&append),
            wrap(&fence),
            wrap(&[]),
            wrap(&wrap(&fence)),
            append.clone(),
        ];
        // The two ways, as the reader used to take them.
        let twice = |b: &[u8]| -> Result<String, String> {
            match decode(b)? {
                Op::Replicated { inner, .. } if !inner.is_empty() => {
                    decode(inner).map(|op| format!("{op:?}"))
                }
                op => Ok(format!("{op:?}")),
            }
        };
        let once = |b: &[u8]| decode_unwrapped(b).map(|op| format!("{op:?}"));
        let mut checked = 0;
        for case in &cases {
            assert_eq!(once(case), twice(case), "{case:?}");
            for cut in 0..case.len() {
                assert_eq!(once(&case[..cut]).is_ok(), twice(&case[..cut]).is_ok());
                for change in [|b: u8| b ^ 0x41, |_| 0] {
                    let mut changed = case.clone();
                    changed[cut] = change(changed[cut]);
                    assert_eq!(once(&changed), twice(&changed), "byte {cut} of {case:?}");
                    checked += 1;
                }
                checked += 1;
            }
        }
        assert!(checked > 200, "{checked}");
        assert!(matches!(once(&cases[0]), Ok(ref d) if d.starts_with("Append")));
        assert!(once(&cases[3]).is_err(), "a wrapper in a wrapper");
    }
}
