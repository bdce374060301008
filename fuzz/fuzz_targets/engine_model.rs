//! The engine against plain in-memory models, through random operations,
//! power cuts at chosen points and reopens, on the crash-simulating
//! `SimStorage` through the public API (`Log::open_on`). The models and
//! their checks are `fencelog::fuzzing::stream_model` and `lease_model`,
//! the same ones the proptest model tests run.
//!
//! Input: `which: u8 | actions...`. An even first byte runs the stream
//! model (append, append_at and exact retries, fence, trim, delete, read,
//! stat, power cuts now or armed for the n-th next file operation, reopen);
//! an odd one the lease model (acquire with and without fence, renew,
//! release, the clock, crashes, armed cuts, reopen, filler appends that
//! rotate segments). At most `MODEL_MAX_ACTIONS` (48) actions per input.
//!
//! After a power cut and reopen, every acknowledged write is there, nothing
//! unacknowledged and undurable is invented, highest tokens never go below
//! what was acknowledged, and tokens from fresh leases strictly increase.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fencelog::fuzzing::engine_model(data);
});
