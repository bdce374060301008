//! Entry points for the fuzz targets in `fuzz/` and the model tests in
//! `engine/tests/` (cargo feature `fuzzing`, off by default; not part of
//! the API).
//!
//! Decoders of bytes read from disk, one function each, which run the
//! decoder and assert what must hold: never a panic, and where an encoder
//! exists, `decode(encode(x)) == x`, and `encode(decode(b)) == b` whenever
//! the format is canonical:
//!
//! - [`decode_op`]: a log entry's op (`op.rs`);
//! - [`decode_checkpoint`]: a segment's checkpoint (`checkpoint.rs`);
//! - [`parse_footer`] and [`footer_round_trip`]: a sealed segment's index
//!   (`footer.rs`), with lookups through it;
//! - [`describe_entry`]: an entry as tools see it (`inspect.rs`);
//! - [`decode_records`]: the records of an append as a read takes them
//!   (`Log::decode_entry` in `log.rs`, after the entry is read).
//!
//! [`engine_decode`] picks one of them from an input's first byte: the
//! `engine_decode` fuzz target. [`sample_encodings`] makes valid encodings
//! with the real encoders, and [`engine_decode_seeds`] frames them as that
//! target's inputs, so seeds follow the formats when they change
//! (`cargo run -p fencelog --features fuzzing --example engine_fuzz_seeds`).
//!
//! [`stream_model`] and [`lease_model`] run the engine against plain
//! in-memory models through power cuts and reopens: the proptest model
//! tests and the `engine_model` fuzz target ([`engine_model`]) share them.

// A harness: a failed unwrap or assertion is a finding, reported by
// panicking, which is what the fuzzer and the tests look for.
#![allow(clippy::unwrap_used)]

pub mod lease_model;
pub mod stream_model;

use bytes::Bytes;
use fencelog_wal::EntryKind;

use crate::checkpoint::{self, ReplRecord, Row};
use crate::footer::{self, SegmentIndex, StreamPart};
use crate::inspect::{EntryView, describe};
use crate::op::{self, Acquire, Op};
use crate::view::IndexEntry;

/// Decodes a log entry's op. When it decodes, it re-encodes to the same
/// bytes (an acquisition's `fence` byte excepted: any non-zero byte reads as
/// true and is written as 1), and the re-encoding decodes to the same op.
pub fn decode_op(bytes: &[u8]) {
    let Ok(decoded) = op::decode(bytes) else {
        return;
    };
    let again = match decoded {
        Op::Append(a) => {
            let payloads: Vec<&[u8]> = a.payloads().collect();
            assert_eq!(payloads.len(), a.count as usize, "records walked");
            let mut buf = vec![0u8; op::append_len(a.stream, payloads.as_slice())];
            op::encode_append(
                &mut buf,
                a.stream,
                a.token,
                a.first_offset,
                payloads.as_slice(),
            );
            assert_eq!(buf, op::encode(&decoded), "the two append encoders");
            buf
        }
        _ => op::encode(&decoded),
    };
    assert_eq!(op::decode(&again), Ok(decoded), "decode(encode(op))");
    let canonical = !matches!(decoded, Op::Acquire(_)) || bytes.last() <= Some(&1);
    if canonical {
        assert_eq!(again, bytes, "encode(decode(bytes))");
    }
}

/// Decodes a checkpoint; when it decodes, what it holds is consistent (rows
/// sorted by id, below the next id, offsets in order, names non-empty),
/// `next_offsets` (the readers' shortcut) agrees with it, and the encoder
/// gives bytes that decode to the same checkpoint. (The format is not
/// canonical: where each name sits among the names and the reserved bytes
/// are free, so the bytes themselves need not come back.)
pub fn decode_checkpoint(bytes: &[u8]) {
    let Ok(c) = checkpoint::decode(bytes) else {
        return;
    };
    let mut prev = None;
    for s in &c.streams {
        assert!(!s.name.is_empty() && s.start_offset <= s.next_offset);
        assert!(s.id < c.next_stream_id && prev < Some(s.id));
        prev = Some(s.id);
    }
    let shortcut = checkpoint::next_offsets(bytes).expect("decode accepted the rows");
    let want: Vec<(u64, u64)> = c.streams.iter().map(|s| (s.id, s.next_offset)).collect();
    assert_eq!(shortcut, want, "next_offsets");
    let again = encode_checkpoint(&c);
    // A replica's section is written in its current version (v2), which
    // keeps every lease's expiry: a v1 input comes back with expiries 0.
    let mut want = c.clone();
    if want.repl.is_some() {
        for l in &mut want.leases {
            l.expires_at_ms = Some(l.expires_at_ms.unwrap_or(0));
        }
    }
    assert_eq!(
        checkpoint::decode(&again).as_ref(),
        Ok(&want),
        "decode(encode(c))"
    );
    assert_eq!(encode_checkpoint(&c), again, "the encoder is deterministic");
}

fn encode_checkpoint(c: &checkpoint::Checkpoint) -> Vec<u8> {
    let rows = c
        .streams
        .iter()
        .map(|s| Row {
            id: s.id,
            name: &s.name,
            highest: s.highest,
            next_offset: s.next_offset,
            start_offset: s.start_offset,
            total_bytes: s.total_bytes,
            last_sealed: s.last_sealed,
        })
        .collect();
    checkpoint::encode(
        c.next_stream_id,
        c.last_token,
        rows,
        c.leases.iter().map(|l| {
            (
                &l.name[..],
                &l.owner[..],
                l.token,
                l.ttl_ms,
                l.expires_at_ms.unwrap_or(0),
            )
        }),
        c.repl.as_ref(),
    )
}

/// Parses a segment index and looks every stream of its directory up
/// through it: found, with the same entry; ids strictly increasing; a
/// non-empty offset range; and its entries from any offset at least one, at
/// most as many as the index holds, the last ending at the stream's end.
pub fn parse_footer(bytes: &[u8]) {
    let Ok(index) = SegmentIndex::parse(Bytes::copy_from_slice(bytes)) else {
        return;
    };
    let max_entries = bytes.len() / 24;
    let mut prev = None;
    for (id, dir) in index.dirs() {
        assert!(prev < Some(id), "directory ids in order");
        prev = Some(id);
        assert_eq!(index.stream(id), Some(dir), "stream {id} found");
        assert!(dir.first_offset < dir.end_offset, "{dir:?}");
        let mid = dir.first_offset + (dir.end_offset - dir.first_offset) / 2;
        for offset in [
            0,
            dir.first_offset,
            mid,
            dir.end_offset - 1,
            dir.end_offset,
            u64::MAX,
        ] {
            let got: Vec<_> = index.entries_from(dir, offset).collect();
            assert!(!got.is_empty() && got.len() <= max_entries, "{}", got.len());
            assert_eq!(got.last().map(|e| e.1), Some(dir.end_offset));
        }
    }
}

/// Reads the input front to back; past its end every byte reads as zero.
pub(crate) struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Input { data, at: 0 }
    }

    pub(crate) fn done(&self) -> bool {
        self.at >= self.data.len()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub(crate) fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// Streams' parts of a footer from the input, by ascending id: (id, end
/// offset, previous segment, index entries).
fn footer_parts(r: &mut Input<'_>) -> Vec<(u64, u64, u64, Vec<IndexEntry>)> {
    let streams = 1 + usize::from(r.u8() % 8);
    let mut id = 0u64;
    let mut parts = Vec::new();
    for _ in 0..streams {
        id += 1 + u64::from(r.u8());
        let mut offset = u64::from(r.u32());
        let mut cum = u64::from(r.u32());
        let mut entries = Vec::new();
        for _ in 0..1 + r.u8() % 8 {
            entries.push(IndexEntry {
                first_offset: offset,
                cum_bytes: cum,
                position: u64::from(r.u32()),
            });
            offset += 1 + u64::from(r.u8() % 4);
            cum += u64::from(r.u16());
        }
        parts.push((id, offset, u64::from(r.u8()), entries));
    }
    parts
}

/// A segment index built from the input with the real encoder: it parses,
/// every stream is found with its offsets and bytes, ids not in it are not,
/// and the entries from any offset are those a plain search over the parts
/// gives.
pub fn footer_round_trip(data: &[u8]) {
    let mut r = Input::new(data);
    let parts = footer_parts(&mut r);
    let encoded = footer::encode(
        &parts
            .iter()
            .map(|(id, end, prev, entries)| StreamPart {
                stream_id: *id,
                end_offset: *end,
                prev_segment: *prev,
                entries,
            })
            .collect::<Vec<_>>(),
    );
    let total: usize = parts.iter().map(|p| p.3.len()).sum();
    assert_eq!(encoded.len(), footer::encoded_len(parts.len(), total));
    let index = SegmentIndex::parse(Bytes::from(encoded.clone())).expect("an encoded index parses");
    let ids: Vec<u64> = index.dirs().map(|(id, _)| id).collect();
    assert_eq!(ids, parts.iter().map(|p| p.0).collect::<Vec<_>>());
    for (id, end, prev_segment, entries) in &parts {
        assert!(index.stream(id - 1).is_none() || parts.iter().any(|p| p.0 == id - 1));
        let dir = index.stream(*id).expect("every stream is found");
        assert_eq!(
            (
                dir.first_offset,
                dir.end_offset,
                dir.cum_bytes,
                dir.prev_segment
            ),
            (
                entries[0].first_offset,
                *end,
                entries[0].cum_bytes,
                *prev_segment
            )
        );
        for offset in [
            0,
            entries[0].first_offset,
            *end - 1,
            *end,
            u64::from(r.u32()),
        ] {
            let got: Vec<_> = index.entries_from(dir, offset).collect();
            let start = entries
                .iter()
                .rposition(|e| e.first_offset <= offset)
                .unwrap_or(0);
            let want: Vec<_> = (start..entries.len())
                .map(|i| {
                    let e_end = entries.get(i + 1).map_or(*end, |n| n.first_offset);
                    (entries[i], e_end)
                })
                .collect();
            assert_eq!(got, want, "stream {id} from {offset}");
        }
    }
    let last_id = parts.last().map_or(0, |p| p.0);
    assert!(index.stream(last_id + 1).is_none());
    parse_footer(&encoded);
}

/// Describes an entry as `fencelog verify` and `dump` do: it decodes
/// exactly when the engine's own decoder does, and says the same.
pub fn describe_entry(kind: EntryKind, bytes: &[u8]) {
    let view = describe(kind, bytes);
    match kind {
        EntryKind::Checkpoint => {
            let c = checkpoint::decode(bytes);
            assert_eq!(view.is_ok(), c.is_ok());
            if let (
                Ok(EntryView::Checkpoint {
                    streams,
                    leases,
                    last_token,
                }),
                Ok(c),
            ) = (&view, &c)
            {
                assert_eq!(*last_token, c.last_token);
                assert_eq!(*leases, c.leases.len());
                assert_eq!(streams.len(), c.streams.len());
                for (v, s) in streams.iter().zip(&c.streams) {
                    assert_eq!(
                        (&v.name, v.highest_token, v.next_offset, v.start_offset),
                        (&s.name, s.highest, s.next_offset, s.start_offset)
                    );
                }
            }
        }
        EntryKind::Link => assert_eq!(view.is_ok(), bytes.is_empty()),
        EntryKind::Record => {
            assert_eq!(view.is_ok(), op::decode(bytes).is_ok());
            let Ok(view) = view else {
                return;
            };
            if let Some(name) = view.name() {
                assert!(!name.is_empty());
                assert!(view.concerns(name));
            }
            if let EntryView::Op(Op::Append(a)) = view {
                let payloads: Vec<&[u8]> = a.payloads().collect();
                assert_eq!(payloads.len(), a.count as usize);
                let inside = bytes.as_ptr_range();
                for p in &payloads {
                    let r = p.as_ptr_range();
                    assert!(inside.start <= r.start && r.end <= inside.end);
                }
                // A bare append (not inside a wrapper) is the whole entry.
                if bytes.first() == Some(&1) {
                    let sum: usize = payloads.iter().map(|p| 4 + p.len()).sum();
                    let header = op::append_len(a.stream, &[] as &[&[u8]]);
                    assert_eq!(sum, bytes.len() - header);
                }
            }
        }
    }
}

/// The records of an append, as a read takes them from an entry the index
/// says holds offsets from `first` on, keeping those in `[from, end)`; the
/// steps of `Log::decode_entry` after the entry is read (its op decoded,
/// its stream and first offset checked, its records sliced out without a
/// copy). Whatever comes out is consecutive, inside `[from, end)`, at most
/// the entry's count, and each payload is the record's bytes.
pub fn decode_records(bytes: &[u8], first: u64, from: u64, end: u64) {
    let payload = Bytes::copy_from_slice(bytes);
    let Ok(Op::Append(
        append @ op::Append {
            token,
            first_offset,
            count,
            records,
            ..
        },
    )) = op::decode(&payload)
    else {
        return;
    };
    if first_offset != first {
        return;
    }
    let token = crate::Token::new(token).expect("decode checks the token");
    let base = records.as_ptr() as usize - payload.as_ptr() as usize;
    let mut out: Vec<crate::Record> = Vec::new();
    for (i, (s, e)) in op::records(records).enumerate() {
        let offset = first_offset + i as u64;
        if offset >= end {
            break;
        }
        if offset >= from {
            out.push(crate::Record {
                offset,
                token,
                payload: payload.slice(base + s..base + e),
            });
        }
    }
    assert!(out.len() <= count as usize);
    let walked: Vec<&[u8]> = append.payloads().collect();
    for (k, r) in out.iter().enumerate() {
        assert!(from <= r.offset && r.offset < end);
        if k > 0 {
            assert_eq!(r.offset, out[k - 1].offset + 1);
        }
        let i = (r.offset - first_offset) as usize;
        assert_eq!(&r.payload[..], walked[i]);
    }
}

/// How [`engine_decode`] reads an input's first byte.
const DECODERS: [&str; 7] = [
    "op",
    "checkpoint",
    "footer",
    "footer_built",
    "describe_checkpoint",
    "describe_record",
    "records",
];

/// The `engine_decode` fuzz target: the first byte (modulo 7) picks the
/// decoder, the rest is its input (`records` reads `first`, `from`, `end`
/// as three little-endian u64 first).
pub fn engine_decode(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match DECODERS[usize::from(which) % DECODERS.len()] {
        "op" => decode_op(rest),
        "checkpoint" => decode_checkpoint(rest),
        "footer" => parse_footer(rest),
        "footer_built" => footer_round_trip(rest),
        "describe_checkpoint" => describe_entry(EntryKind::Checkpoint, rest),
        "describe_record" => describe_entry(EntryKind::Record, rest),
        _ => {
            let mut r = Input::new(rest);
            let (first, from, end) = (r.u64(), r.u64(), r.u64());
            decode_records(rest.get(24..).unwrap_or_default(), first, from, end);
        }
    }
}

/// Actions one `engine_model` input runs at most: bounds the time of an
/// input (each action may sync, crash or reopen).
pub const MODEL_MAX_ACTIONS: usize = 48;

/// The `engine_model` fuzz target: an even first byte runs
/// [`stream_model`], an odd one [`lease_model`], on the actions the rest
/// decodes to. The model tests replay the target's seeds through it.
pub fn engine_model(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which & 1 == 0 {
        stream_model::run(stream_model::actions_from_bytes(rest, MODEL_MAX_ACTIONS));
    } else {
        lease_model::run(lease_model::actions_from_bytes(rest, MODEL_MAX_ACTIONS));
    }
}

/// Valid encodings made with the real encoders, named `decoder/what`
/// (`op/…`, `checkpoint/…`, `footer/…`), for seeds and tests.
pub fn sample_encodings() -> Vec<(&'static str, Vec<u8>)> {
    let payloads: [&[u8]; 3] = [b"first", b"", b"third record"];
    let mut append = vec![0u8; op::append_len(b"orders", &payloads[..])];
    op::encode_append(&mut append, b"orders", 42, 7, &payloads[..]);
    let mut one = vec![0u8; op::append_len(b"s", &[b"x"][..])];
    op::encode_append(&mut one, b"s", 1, 0, &[b"x"][..]);
    let batch_ops = [
        append.clone(),
        op::encode(&Op::Fence {
            stream: b"orders",
            token: 43,
        }),
    ];
    let mut batch = vec![0u8; op::batch_len(&batch_ops)];
    op::encode_batch(&mut batch, &batch_ops);
    let replicated = op::encode(&Op::Replicated {
        term: 2,
        node: 1,
        index: 41,
        time_ms: 1000,
        inner: &batch,
    });
    let ops = [
        ("op/batch", batch),
        ("op/replicated_batch", replicated),
        ("op/take_over", op::encode(&Op::TakeOver)),
        ("op/append", append),
        ("op/append_one", one),
        (
            "op/fence",
            op::encode(&Op::Fence {
                stream: b"orders",
                token: 43,
            }),
        ),
        (
            "op/trim",
            op::encode(&Op::Trim {
                stream: b"orders",
                token: 43,
                before: 2,
            }),
        ),
        (
            "op/delete",
            op::encode(&Op::Delete {
                stream: b"orders",
                token: 44,
            }),
        ),
        (
            "op/acquire",
            op::encode(&Op::Acquire(Acquire {
                name: b"lock",
                owner: b"worker-1",
                token: 45,
                ttl_ms: 5000,
                fence: true,
            })),
        ),
        (
            "op/release",
            op::encode(&Op::Release {
                name: b"lock",
                owner: b"worker-1",
                token: 45,
            }),
        ),
        (
            "op/renew",
            op::encode(&Op::Renew {
                name: b"lock",
                owner: b"worker-1",
                token: 45,
                ttl_ms: 9000,
            }),
        ),
    ];
    let row = |id, name, highest, next_offset, start_offset, last_sealed| Row {
        id,
        name,
        highest,
        next_offset,
        start_offset,
        total_bytes: next_offset * 10,
        last_sealed,
    };
    let checkpoint = checkpoint::encode(
        7,
        45,
        vec![row(6, b"x", 1, 0, 0, 0), row(2, b"orders", 44, 10, 2, 4)],
        [(&b"lock"[..], &b"worker-1"[..], 45u64, 5000u64, 0u64)].into_iter(),
        None,
    );
    let empty = checkpoint::encode(1, 0, Vec::new(), std::iter::empty(), None);
    let replica = checkpoint::encode(
        3,
        9,
        vec![row(1, b"s", 9, 3, 0, 0)],
        [(&b"s"[..], &b"worker-2"[..], 9u64, 3000u64, 4000u64)].into_iter(),
        Some(&ReplRecord {
            term: 2,
            node: 1,
            index: 40,
            clock_ms: 1000,
            digest: 0x1234_5678_9abc_def0,
            limits: crate::replicated::GroupLimits::default(),
            membership: b"{1,2,3}".to_vec(),
        }),
    );
    let footer = footer::two_stream_sample(2);
    let mut all: Vec<(&'static str, Vec<u8>)> = ops.into_iter().collect();
    all.push(("checkpoint/two_streams_a_lease", checkpoint));
    all.push(("checkpoint/empty", empty));
    all.push(("checkpoint/replica", replica));
    all.push(("footer/two_streams", footer));
    all
}

/// [`sample_encodings`] framed as inputs of the `engine_decode` target:
/// each op and checkpoint for its decoder and for `describe`, each footer
/// for the parser, an append for the record reader, plus inputs for the
/// built footers.
pub fn engine_decode_seeds() -> Vec<(String, Vec<u8>)> {
    let index = |name: &str| DECODERS.iter().position(|d| *d == name).unwrap() as u8;
    let mut seeds = Vec::new();
    for (name, bytes) in sample_encodings() {
        let file = name.replace('/', "_");
        let framed = |decoder: &str, prefix: &[u8]| {
            let mut v = vec![index(decoder)];
            v.extend_from_slice(prefix);
            v.extend_from_slice(&bytes);
            v
        };
        match name.split('/').next() {
            Some("op") => {
                seeds.push((file.clone(), framed("op", &[])));
                seeds.push((format!("describe_{file}"), framed("describe_record", &[])));
                if name.starts_with("op/append") {
                    let mut prefix = Vec::new();
                    let first = if name == "op/append" { 7u64 } else { 0 };
                    for v in [first, first + 1, first + 2] {
                        prefix.extend_from_slice(&v.to_le_bytes());
                    }
                    seeds.push((format!("records_{file}"), framed("records", &prefix)));
                }
            }
            Some("checkpoint") => {
                seeds.push((file.clone(), framed("checkpoint", &[])));
                seeds.push((
                    format!("describe_{file}"),
                    framed("describe_checkpoint", &[]),
                ));
            }
            _ => seeds.push((file, framed("footer", &[]))),
        }
    }
    seeds.push(("footer_built_zeros".into(), vec![index("footer_built")]));
    seeds.push((
        "footer_built_three".into(),
        [vec![index("footer_built"), 2], (1..=60u8).collect()].concat(),
    ));
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds decode: a format change that breaks its own encoder's
    /// output fails here, not only under the fuzzer.
    #[test]
    fn every_sample_passes_its_decoder() {
        for (name, bytes) in sample_encodings() {
            match name.split('/').next() {
                Some("op") => assert!(op::decode(&bytes).is_ok(), "{name}"),
                Some("checkpoint") => assert!(checkpoint::decode(&bytes).is_ok(), "{name}"),
                _ => assert!(SegmentIndex::parse(Bytes::from(bytes)).is_ok(), "{name}"),
            }
        }
        for (name, input) in engine_decode_seeds() {
            engine_decode(&input);
            for cut in 0..input.len() {
                engine_decode(&input[..cut]);
            }
            let _ = name;
        }
    }
}
