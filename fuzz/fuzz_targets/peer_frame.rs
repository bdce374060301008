//! The peer protocol (`fencelog-cluster`, `network.rs`): arbitrary bytes as
//! what a peer sends, to both ends of the handshake and to the frame
//! decoders (requests and replies), as they are and with valid MACs put
//! after each frame so the bodies reach bincode.
//!
//! Input layout: `flags: u8 (bit 0: this node has a cluster secret) |
//! stream...`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, stream)) = data.split_first() else {
        return;
    };
    fencelog_cluster::fuzzing::peer_frame(stream, flags & 1 == 1);
});
