//! Byte strings decoded as slices of the buffer they arrived in.
//!
//! A follower reads each peer frame into one buffer. The entries in it
//! carry their commands' encoding, which the follower writes to its Raft
//! log and decides from (the payloads are slices of it). bincode hands
//! serde a byte string borrowed from the bytes it decodes; while
//! [`decode_from`] runs, a [`SharedBytes`] that lies within the buffer it
//! names is taken as a slice of that buffer (a count on it) instead of
//! being copied out: the bytes an entry arrived in are the bytes it is
//! written and decided from. Anywhere else (a decode from a reader, from
//! bytes not named) the string is copied, as before.
//!
//! The buffer lives as long as any slice of it: a frame's entries keep
//! the whole frame (its few bytes of headers and its MAC beside them).
//! They arrive together and are written, applied and let go in order,
//! so this is at most the frames still in the Raft log's memory.

use std::cell::RefCell;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};

thread_local! {
    /// The buffer the decode under way on this thread reads, if named.
    static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Runs `decode` over `source`'s bytes; a [`SharedBytes`] it decodes from
/// within them is a slice of `source`.
pub(crate) fn decode_from<R>(source: &Bytes, decode: impl FnOnce(&[u8]) -> R) -> R {
    /// Puts back what was named before, however the decode ends.
    struct Restore(Option<Bytes>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            SOURCE.with(|s| *s.borrow_mut() = before);
        }
    }
    let before = SOURCE.with(|s| s.borrow_mut().replace(source.clone()));
    let _restore = Restore(before);
    decode(source)
}

/// `b` as a slice of the buffer being decoded if it lies within it, else
/// a copy.
fn shared_or_copied(b: &[u8]) -> Bytes {
    SOURCE.with(|s| match s.borrow().as_ref() {
        Some(source) if within(source, b) => source.slice_ref(b),
        _ => Bytes::copy_from_slice(b),
    })
}

/// Whether `inner` is a part of `outer`'s memory (what
/// [`Bytes::slice_ref`] requires; it panics otherwise).
fn within(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i + inner.len() <= o + outer.len()
}

/// A byte string that decodes as a slice of the buffer [`decode_from`]
/// names, or as a copy. Encoded as a byte string (as `serde_bytes`).
pub(crate) struct SharedBytes(pub Bytes);

impl<'de> Deserialize<'de> for SharedBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SharedBytes, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SharedBytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte string")
            }

            fn visit_borrowed_bytes<E: Error>(self, b: &'de [u8]) -> Result<SharedBytes, E> {
                Ok(SharedBytes(shared_or_copied(b)))
            }

            fn visit_bytes<E: Error>(self, b: &[u8]) -> Result<SharedBytes, E> {
                Ok(SharedBytes(Bytes::copy_from_slice(b)))
            }

            fn visit_byte_buf<E: Error>(self, b: Vec<u8>) -> Result<SharedBytes, E> {
                Ok(SharedBytes(Bytes::from(b)))
            }

            // A format without byte strings sends a sequence: grown as its
            // bytes come, never sized from a length it claims.
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SharedBytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(SharedBytes(Bytes::from(out)))
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bincode::Options;

    fn codec() -> impl Options {
        bincode::DefaultOptions::new().with_fixint_encoding()
    }

    fn encoded(parts: &[&[u8]]) -> Bytes {
        let v: Vec<serde_bytes::ByteBuf> = parts
            .iter()
            .map(|p| serde_bytes::ByteBuf::from(p.to_vec()))
            .collect();
        Bytes::from(codec().serialize(&v).unwrap())
    }

    fn slices_of(source: &Bytes, decoded: &[SharedBytes]) -> usize {
        decoded
            .iter()
            .filter(|b| !b.0.is_empty() && within(source, &b.0))
            .count()
    }

    /// Decoded from the named buffer, each string is a slice of it (and
    /// the buffer lives on in them after the decode); decoded from other
    /// bytes, a copy.
    #[test]
    fn strings_are_slices_of_the_named_buffer_and_copies_elsewhere() {
        let source = encoded(&[b"first", b"", b"second payload"]);
        let decoded: Vec<SharedBytes> = decode_from(&source, |b| codec().deserialize(b)).unwrap();
        let got: Vec<&[u8]> = decoded.iter().map(|b| &b.0[..]).collect();
        assert_eq!(got, [&b"first"[..], b"", b"second payload"]);
        assert_eq!(
            slices_of(&source, &decoded),
            2,
            "both non-empty strings are slices"
        );
        let kept = decoded[2].0.clone();
        drop(decoded);
        drop(source);
        assert_eq!(&kept[..], b"second payload", "a slice keeps its buffer");

        // Not named: copies, and nothing named is left behind.
        let other = encoded(&[b"copied"]);
        let copied: Vec<SharedBytes> = codec().deserialize(&other).unwrap();
        assert_eq!(slices_of(&other, &copied), 0);
        assert_eq!(&copied[0].0[..], b"copied");
        assert!(SOURCE.with(|s| s.borrow().is_none()));
    }

    /// A decode from bytes other than the named buffer's (a copy of them)
    /// inside `decode_from` copies: only what lies within it is sliced.
    #[test]
    fn bytes_outside_the_named_buffer_are_copied() {
        let source = encoded(&[b"inside"]);
        let elsewhere = source.to_vec();
        let decoded: Vec<SharedBytes> =
            decode_from(&source, |_| codec().deserialize(&elsewhere)).unwrap();
        assert_eq!(&decoded[0].0[..], b"inside");
        assert_eq!(slices_of(&source, &decoded), 0);
        assert!(
            !within(&elsewhere, &decoded[0].0),
            "a copy, not a pointer into bytes nobody keeps"
        );
    }

    /// Nested decodes each see their own buffer, and the outer one's is
    /// named again once the inner returns (or fails).
    #[test]
    fn a_nested_decode_names_its_own_buffer_and_gives_the_outer_back() {
        let outer = encoded(&[b"outer"]);
        let inner = encoded(&[b"inner"]);
        let (a, b): (Vec<SharedBytes>, Vec<SharedBytes>) = decode_from(&outer, |o| {
            let b: Vec<SharedBytes> = decode_from(&inner, |i| codec().deserialize(i)).unwrap();
            let failed: Result<Vec<SharedBytes>, _> =
                decode_from(&inner, |i| codec().deserialize(&i[..3]));
            assert!(failed.is_err());
            (codec().deserialize(o).unwrap(), b)
        });
        assert_eq!(slices_of(&outer, &a), 1);
        assert_eq!(slices_of(&inner, &b), 1);
        assert!(SOURCE.with(|s| s.borrow().is_none()));
    }
}
