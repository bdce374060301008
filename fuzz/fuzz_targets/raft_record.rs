//! The Raft log's decoders (`fencelog-cluster`, `log_store.rs`): a record
//! (Entry, Vote, Truncate, Purge, Committed, each with its version byte),
//! an entry in full (its openraft `Entry` and the versioned `Request` in
//! it), a checkpoint, a request alone and the stored membership, all from
//! the same bytes. Nothing may panic, nothing may allocate more than the
//! input could hold, and a record that decodes re-encodes to the very same
//! bytes (an entry: to bytes that decode to the same entry, since a
//! membership's sets come back sorted; a request, of version 2 or of the
//! read-only version 1: to a version 2 request of the same commands).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fencelog_cluster::fuzzing::raft_record(data);
});
