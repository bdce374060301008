//! The engine's decoders of bytes read from disk: a log entry's op
//! (`op.rs`), a checkpoint (`checkpoint.rs`), a sealed segment's index and
//! lookups through it (`footer.rs`, raw bytes and indexes built by the
//! encoder), an entry as tools describe it (`inspect.rs`), and the records
//! of an append as a read slices them out (`Log::decode_entry`).
//!
//! Input: `decoder: u8 | bytes...`; the first byte (modulo 7) picks the
//! decoder. The checks live in `fencelog::fuzzing` (feature `fuzzing`):
//! nothing may panic, and what decodes re-encodes to the same bytes where
//! the format is canonical. Seeds come from the real encoders:
//! `cargo run -p fencelog --features fuzzing --example engine_fuzz_seeds`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fencelog::fuzzing::engine_decode(data);
});
