//! The engine's encoding of proposed commands (`fencelog::Command::decode`
//! and `decode_all`, what a Raft entry's request carries): from any bytes,
//! a list of commands or an error, never a panic, never an allocation
//! beyond what the input could hold; a list that decodes, encoded again,
//! decodes to the same commands, with the length `encoded_len` said.
//! Reading the list as a replica applies it (`Proposal::read_each`,
//! appends in place) fails where decoding fails, with the same error, and
//! otherwise hands over the same commands.

#![no_main]

use bytes::Bytes;
use fencelog::{Command, Proposal};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input = Bytes::copy_from_slice(data);
    let _ = Command::decode(&input);
    let decoded = Command::decode_all(&input);
    let mut read = Vec::new();
    let read = Proposal::read_each(&input, |p| read.push(p.to_command())).map(|()| read);
    assert_eq!(read, decoded, "read in place, the list is not what it decodes to");
    if let Ok(cmds) = decoded {
        let mut again = Vec::new();
        Command::encode_all(&cmds, &mut again);
        let expected = Command::encoded_len_all(&cmds);
        assert_eq!(again.len(), expected, "encoded_len differs from the encoding");
        let back = Command::decode_all(&Bytes::from(again)).expect("re-encoded commands decode");
        assert_eq!(back, cmds, "commands re-encode to other commands");
    }
});
