//! A hostile snapshot archive (`fencelog-cluster`, `snapshot.rs`): unpacked
//! into a fresh directory it is refused or unpacked, never a panic, never
//! a file outside the directory or other than an engine file, memory
//! bounded by one block. The same bytes are also read as a snapshot's
//! metadata file.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    fencelog_cluster::fuzzing::snapshot_unpack(data, dir.path());
});
