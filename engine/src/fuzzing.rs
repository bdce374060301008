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
//! tests and the `engine_model` fuzz target share them.

// A harness: a failed unwrap or assertion is a finding, reported by
// panicking, which is what the fuzzer and the tests look for.
#![allow(clippy::unwrap_used)]

pub mod lease_model;
pub mod stream_model;

use bytes::Bytes;
use fencelog_wal::EntryKind;

use crate::checkpoint::{self, Encoder};
use crate::footer::{self, SegmentIndex, StreamPart};
use crate::inspect::{EntryView, describe};
use crate::op::{self, Op};
use crate::view::{IndexEntry, Run};

/// Decodes a log entry's op. When it decodes, it re-encodes to the same
/// bytes (an acquisition's `fence` byte excepted: any non-zero byte reads as
/// true and is written as 1), and the re-encoding decodes to the same op.
pub fn decode_op(bytes: &[u8]) {
    let Ok(decoded) = op::decode(bytes) else {
        return;
    };
    let again = match decoded {
        Op::Append {
            stream,
            token,
            first_offset,
            count,
            records,
        } => {
            let payloads: Vec<&[u8]> = op::records(records).map(|(s, e)| &records[s..e]).collect();
            assert_eq!(payloads.len(), count as usize, "records walked");
            let mut buf = vec![0u8; op::append_len(stream, &payloads)];
            op::encode_append(&mut buf, stream, token, first_offset, &payloads);
            assert_eq!(buf, op::encode(&decoded), "the two append encoders");
            buf
        }
        _ => op::encode(&decoded),
    };
    assert_eq!(op::decode(&again), Ok(decoded), "decode(encode(op))");
    let canonical = !matches!(decoded, Op::Acquire { .. }) || bytes.last() <= Some(&1);
    if canonical {
        assert_eq!(again, bytes, "encode(decode(bytes))");
    }
}

/// Decodes a checkpoint; when it decodes, the encoder gives back the same
/// bytes (the format is canonical), and they decode to the same checkpoint.
pub fn decode_checkpoint(bytes: &[u8]) {
    let Ok(c) = checkpoint::decode(bytes) else {
        return;
    };
    for s in &c.streams {
        assert!(!s.name.is_empty() && s.start_offset <= s.next_offset);
        assert!(s.id < c.next_stream_id);
        for r in &s.runs {
            assert!(r.first_offset < r.end_offset && r.end_offset <= s.next_offset);
        }
    }
    let again = encode_checkpoint(&c);
    assert_eq!(again, bytes, "encode(decode(bytes))");
    assert_eq!(
        checkpoint::decode(&again).as_ref(),
        Ok(&c),
        "decode(encode(c))"
    );
}

fn encode_checkpoint(c: &checkpoint::Checkpoint) -> Vec<u8> {
    let mut e = Encoder::new(c.next_stream_id, c.last_token);
    for s in &c.streams {
        e.stream(
            s.id,
            &s.name,
            s.highest,
            s.next_offset,
            s.start_offset,
            s.total_bytes,
            s.runs.iter(),
        );
    }
    e.finish(
        c.leases
            .iter()
            .map(|l| (&l.name[..], &l.owner[..], l.token, l.ttl_ms)),
    )
}

/// Parses a segment index and looks up, through it, every stream id that
/// appears anywhere in the bytes (each 8-byte word is tried, so the lookups
/// do not depend on the layout): a stream found has a non-empty offset range,
/// and its entries from any offset are at least one, at most as many as the
/// index holds, the last ending at the stream's end offset.
pub fn parse_footer(bytes: &[u8]) {
    let Ok(index) = SegmentIndex::parse(bytes) else {
        return;
    };
    let max_entries = bytes.len() / 8;
    for word in bytes.chunks_exact(8) {
        let id = u64::from_le_bytes(word.try_into().unwrap());
        let Some(dir) = index.stream(id) else {
            continue;
        };
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

/// A segment index built from the input with the real encoder: it parses,
/// every stream is found with its offsets and bytes, ids not in it are not,
/// and the entries from any offset are those a plain search over the parts
/// gives.
pub fn footer_round_trip(data: &[u8]) {
    let mut r = Input::new(data);
    let streams = 1 + usize::from(r.u8() % 8);
    let mut id = 0u64;
    let mut parts: Vec<(u64, u64, Vec<IndexEntry>)> = Vec::new();
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
        parts.push((id, offset, entries));
    }
    let encoded = footer::encode(
        &parts
            .iter()
            .map(|(id, end, entries)| StreamPart {
                stream_id: *id,
                end_offset: *end,
                entries,
            })
            .collect::<Vec<_>>(),
    );
    let total: usize = parts.iter().map(|p| p.2.len()).sum();
    assert_eq!(encoded.len(), footer::encoded_len(parts.len(), total));
    let index = SegmentIndex::parse(&encoded).expect("an encoded index parses");
    for (id, end, entries) in &parts {
        assert!(index.stream(id - 1).is_none() || parts.iter().any(|p| p.0 == id - 1));
        let dir = index.stream(*id).expect("every stream is found");
        assert_eq!(
            (dir.first_offset, dir.end_offset, dir.cum_bytes),
            (entries[0].first_offset, *end, entries[0].cum_bytes)
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
    assert!(index.stream(id + 1).is_none());
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
        EntryKind::Record => {
            assert_eq!(view.is_ok(), op::decode(bytes).is_ok());
            let Ok(view) = view else {
                return;
            };
            assert!(view.name().is_some_and(|n| !n.is_empty()));
            if let EntryView::Append {
                records, payloads, ..
            } = &view
            {
                assert_eq!(payloads.len(), *records as usize);
                let inside = bytes.as_ptr_range();
                for p in payloads {
                    let r = p.as_ptr_range();
                    assert!(inside.start <= r.start && r.end <= inside.end);
                }
                let sum: usize = payloads.iter().map(|p| 4 + p.len()).sum();
                assert_eq!(
                    sum,
                    bytes.len() - op::append_len(view.name().unwrap(), &[] as &[&[u8]])
                );
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
    let Ok(Op::Append {
        token,
        first_offset,
        count,
        records,
        ..
    }) = op::decode(&payload)
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
    let walked: Vec<&[u8]> = op::records(records).map(|(s, e)| &records[s..e]).collect();
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

/// Valid encodings made with the real encoders, named `decoder/what`
/// (`op/…`, `checkpoint/…`, `footer/…`), for seeds and tests.
pub fn sample_encodings() -> Vec<(&'static str, Vec<u8>)> {
    let payloads: [&[u8]; 3] = [b"first", b"", b"third record"];
    let mut append = vec![0u8; op::append_len(b"orders", &payloads)];
    op::encode_append(&mut append, b"orders", 42, 7, &payloads);
    let mut one = vec![0u8; op::append_len(b"s", &[b"x"])];
    op::encode_append(&mut one, b"s", 1, 0, &[b"x"]);
    let ops = [
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
            op::encode(&Op::Acquire {
                name: b"lock",
                owner: b"worker-1",
                token: 45,
                ttl_ms: 5000,
                fence: true,
            }),
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
    let runs = [
        Run {
            segment: 3,
            first_offset: 0,
            end_offset: 5,
            cum_bytes: 0,
        },
        Run {
            segment: 4,
            first_offset: 5,
            end_offset: 9,
            cum_bytes: 120,
        },
    ];
    let mut c = Encoder::new(7, 45);
    c.stream(2, b"orders", 44, 10, 2, 300, runs.iter());
    c.stream(6, b"x", 1, 0, 0, 0, [].iter());
    let checkpoint = c.finish([(&b"lock"[..], &b"worker-1"[..], 45u64, 5000u64)].into_iter());
    let empty = Encoder::new(1, 0).finish(std::iter::empty());
    let e = |first_offset, cum_bytes, position| IndexEntry {
        first_offset,
        cum_bytes,
        position,
    };
    let a = [e(10, 100, 64), e(12, 130, 200), e(15, 160, 400)];
    let b = [e(0, 0, 128)];
    let footer = footer::encode(&[
        StreamPart {
            stream_id: 3,
            end_offset: 20,
            entries: &a,
        },
        StreamPart {
            stream_id: 9,
            end_offset: 1,
            entries: &b,
        },
    ]);
    let mut all: Vec<(&'static str, Vec<u8>)> = ops.into_iter().collect();
    all.push(("checkpoint/two_streams_a_lease", checkpoint));
    all.push(("checkpoint/empty", empty));
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
                _ => assert!(SegmentIndex::parse(&bytes).is_ok(), "{name}"),
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
