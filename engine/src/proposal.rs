//! A replicated entry's commands as a replica applies them. The commonest,
//! an append, is read in place from the entry's bytes: its stream and
//! records stay where they lie, and are written into the engine's log
//! with one copy. Anything else is decoded into a [`Command`].
//!
//! Decoding an entry's appends gave each a `Vec` of payloads and two
//! reference counts on the entry's bytes, let go again when the entry
//! left memory: about 80 ns per append, on each follower, on its Raft
//! thread (a tenth of a follower's samples under `perf` at pipeline 16).
//!
//! An append read in place is exactly the command decoding it gives
//! (`Command::Write(TxOp::Append { .. })`), and both are decided by the
//! same code; bytes that are not a well-formed append with a token in
//! range are decoded as before, so a refusal or a malformed entry reads
//! as it always did.

use std::borrow::Borrow;

use bytes::Bytes;

use crate::CommandDecodeError;
use crate::command_codec::{self, List};
use crate::records::Laid;
use crate::replicated::Command;
use crate::token::Token;
use crate::tx::TxOp;

/// One command of a replicated entry, as
/// [`Log::apply_replicated_many`](crate::Log::apply_replicated_many)
/// applies it.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Proposal<'a> {
    /// A command as its leader was given it, or decoded already.
    Command(&'a Command),
    /// A command decoded from its entry's bytes: anything but an append
    /// (boxed: these are rare, and a batch holds thousands of proposals).
    Decoded(Box<Command>),
    /// An append read in place from its entry's bytes.
    Append(AppendInPlace<'a>),
}

/// An append read in place (what decodes to `Command::Write(TxOp::Append
/// { .. })`): its stream and records are slices of the entry's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInPlace<'a> {
    pub(crate) stream: &'a [u8],
    pub(crate) token: Token,
    pub(crate) records: Laid<'a>,
}

impl<'a> AppendInPlace<'a> {
    /// `b`, one command's bytes, if it is a well-formed append whose token
    /// is in range; anything else (another command, a refusal, a broken
    /// layout) is left to the decode, which says what it is.
    fn read(b: &'a [u8]) -> Option<AppendInPlace<'a>> {
        // Split off field by field: a failure is only a `None` here (the
        // decode that follows it says what is wrong).
        let (&code, rest) = b.split_first()?;
        if code != command_codec::APPEND {
            return None;
        }
        let (&name_len, rest) = rest.split_first()?;
        let (stream, rest) = rest.split_at_checked(usize::from(name_len))?;
        let (token, rest) = rest.split_first_chunk::<8>()?;
        let token = Token::new(u64::from_le_bytes(*token)).ok()?;
        let (count, records) = rest.split_first_chunk::<4>()?;
        let records = Laid::new(u32::from_le_bytes(*count), records)?;
        Some(AppendInPlace {
            stream,
            token,
            records,
        })
    }

    /// The stream.
    pub fn stream(&self) -> &'a [u8] {
        self.stream
    }

    /// The fencing token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Each record's payload, in order.
    pub fn payloads(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        self.records.payloads()
    }
}

impl<'a> Proposal<'a> {
    /// Reads each command of `b`, a list [`Command::encode_all`] wrote, in
    /// order, and hands it to `each`: an append in place, anything else
    /// decoded (its slices are of `b`). Fails exactly where
    /// [`Command::decode_all`] fails, with the same error; what `each` was
    /// handed before a failure is then to be dropped.
    pub fn read_each(
        b: &'a Bytes,
        mut each: impl FnMut(Proposal<'a>),
    ) -> Result<(), CommandDecodeError> {
        for cmd in List::new(b)? {
            let cmd = cmd?;
            each(match AppendInPlace::read(cmd) {
                Some(append) => Proposal::Append(append),
                None => Proposal::Decoded(Box::new(Command::decode_within(b, cmd)?)),
            });
        }
        Ok(())
    }

    /// The command this stands for (an append read in place, copied).
    pub fn to_command(&self) -> Command {
        match self {
            Proposal::Command(cmd) => (*cmd).clone(),
            Proposal::Decoded(cmd) => cmd.as_ref().clone(),
            Proposal::Append(a) => Command::Write(TxOp::Append {
                stream: Bytes::copy_from_slice(a.stream),
                token: a.token,
                payloads: a.payloads().map(Bytes::copy_from_slice).collect(),
            }),
        }
    }

    /// The command, unless this is an append read in place.
    pub(crate) fn decoded(&self) -> Option<&Command> {
        match self {
            Proposal::Command(cmd) => Some(cmd),
            Proposal::Decoded(cmd) => Some(cmd),
            Proposal::Append(_) => None,
        }
    }
}

/// What [`Log::apply_replicated_many`](crate::Log::apply_replicated_many)
/// applies: a [`Command`], owned or borrowed (`&Command`, a `Cow`), or a
/// [`Proposal`].
pub trait Proposed {
    /// This command, as the engine applies it.
    fn proposal(&self) -> Proposal<'_>;
}

impl<C: Borrow<Command>> Proposed for C {
    fn proposal(&self) -> Proposal<'_> {
        Proposal::Command(self.borrow())
    }
}

impl Proposed for Proposal<'_> {
    fn proposal(&self) -> Proposal<'_> {
        match self {
            Proposal::Command(cmd) => Proposal::Command(cmd),
            Proposal::Decoded(cmd) => Proposal::Command(cmd),
            Proposal::Append(a) => Proposal::Append(*a),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::replicated::Refusal;

    fn t(n: u64) -> Token {
        Token::new(n).expect("a token in range")
    }

    fn append(stream: &'static [u8], token: u64, payloads: &[&'static [u8]]) -> Command {
        Command::Write(TxOp::Append {
            stream: Bytes::from_static(stream),
            token: t(token),
            payloads: payloads.iter().map(|p| Bytes::from_static(p)).collect(),
        })
    }

    fn list(cmds: &[Command]) -> Bytes {
        let mut out = Vec::new();
        Command::encode_all(cmds, &mut out);
        Bytes::from(out)
    }

    /// What `read_each` hands over: the commands, and which were appends
    /// read in place.
    fn read(b: &Bytes) -> Result<(Vec<Command>, Vec<bool>), CommandDecodeError> {
        let mut read = Vec::new();
        Proposal::read_each(b, |p| read.push(p))?;
        Ok((
            read.iter().map(Proposal::to_command).collect(),
            read.iter()
                .map(|p| matches!(p, Proposal::Append(_)))
                .collect(),
        ))
    }

    #[test]
    fn appends_are_read_in_place_and_everything_else_decoded() {
        let cmds = vec![
            append(b"orders", 7, &[b"a", b"", b"third"]),
            Command::Write(TxOp::AppendAt {
                stream: Bytes::from_static(b"orders"),
                token: t(7),
                expected_offset: 3,
                payloads: vec![Bytes::from_static(b"x")].into(),
            }),
            Command::Write(TxOp::Fence {
                stream: Bytes::from_static(b"orders"),
                token: t(8),
            }),
            Command::Transact(vec![TxOp::Append {
                stream: Bytes::from_static(b"tx"),
                token: t(1),
                payloads: vec![Bytes::from_static(b"in a transaction")].into(),
            }]),
            // Decided as refusals, read in place all the same.
            append(b"", 1, &[b"an empty name"]),
            append(b"no records", 1, &[]),
            Command::Blank,
        ];
        let b = list(&cmds);
        let (got, in_place) = read(&b).expect("the list reads");
        assert_eq!(got, cmds);
        assert_eq!(got, Command::decode_all(&b).expect("the list decodes"));
        assert_eq!(in_place, [true, false, false, false, true, true, false]);

        // In place: slices of the entry's bytes, nothing copied.
        let mut first = None;
        Proposal::read_each(&b, |p| {
            if let (None, Proposal::Append(a)) = (&first, p) {
                first = Some(a);
            }
        })
        .expect("the list reads");
        let a = first.expect("an append read in place");
        assert_eq!(a.stream(), b"orders");
        assert_eq!(a.token(), t(7));
        assert!(b.as_ptr_range().contains(&a.stream().as_ptr()));
        let payloads: Vec<&[u8]> = a.payloads().collect();
        assert_eq!(payloads, [&b"a"[..], b"", b"third"]);
        assert!(b.as_ptr_range().contains(&payloads[2].as_ptr()));
    }

    #[test]
    fn an_append_whose_token_is_out_of_range_is_the_refusal_it_decodes_to() {
        for raw in [0, crate::MAX_TOKEN + 1, u64::MAX] {
            let mut bytes = list(&[append(b"s", 5, &[b"x"])]).to_vec();
            // count, len, code, name_len, name, then the token.
            let at = 4 + 4 + 1 + 1 + 1;
            assert_eq!(bytes[at..at + 8], 5u64.to_le_bytes());
            bytes[at..at + 8].copy_from_slice(&raw.to_le_bytes());
            let b = Bytes::from(bytes);
            let (got, in_place) = read(&b).expect("a refusal reads");
            assert_eq!(in_place, [false]);
            assert!(
                matches!(got[..], [Command::Refused(Refusal { .. })]),
                "{got:?}"
            );
            assert_eq!(got, Command::decode_all(&b).expect("a refusal decodes"));
        }
    }

    #[test]
    fn an_append_with_bytes_after_its_records_fails_as_its_decode_does() {
        let mut bytes = list(&[append(b"s", 5, &[b"xy"])]).to_vec();
        // The record's length, one short: a byte is left after it.
        let at = 4 + 4 + 1 + 1 + 1 + 8 + 4;
        assert_eq!(bytes[at..at + 4], 2u32.to_le_bytes());
        bytes[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
        let b = Bytes::from(bytes);
        let decoded = Command::decode_all(&b);
        assert!(decoded.is_err(), "{decoded:?}");
        assert_eq!(read(&b).map(|(got, _)| got), decoded);
    }

    fn some_commands() -> impl Strategy<Value = Vec<Command>> {
        let payloads = prop::collection::vec(prop::collection::vec(any::<u8>(), 0..6), 0..4);
        let one = (0..4u8, 1..5u64, payloads).prop_map(|(kind, token, payloads)| {
            let stream = Bytes::from(vec![b's'; usize::from(kind)]);
            let payloads: crate::Payloads = payloads.into_iter().map(Bytes::from).collect();
            match kind {
                3 => Command::Write(TxOp::Trim {
                    stream,
                    token: t(token),
                    before: 1,
                }),
                2 => Command::Transact(vec![TxOp::Append {
                    stream,
                    token: t(token),
                    payloads,
                }]),
                _ => Command::Write(TxOp::Append {
                    stream,
                    token: t(token),
                    payloads,
                }),
            }
        });
        prop::collection::vec(one, 0..5)
    }

    proptest! {
        /// From any bytes near a list (changed at one place, cut short,
        /// grown), reading fails where decoding fails, with the same
        /// error, and otherwise hands over the commands decoding gives.
        #[test]
        fn reading_fails_and_answers_as_decoding_does(
            cmds in some_commands(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            how in 0..4u8,
        ) {
            let mut bytes = list(&cmds).to_vec();
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = byte,
                1 => bytes.truncate(i),
                2 => bytes.insert(i, byte),
                _ => {}
            }
            let b = Bytes::from(bytes);
            let decoded = Command::decode_all(&b);
            prop_assert_eq!(read(&b).map(|(got, _)| got), decoded.clone());
            if how == 3 {
                prop_assert_eq!(decoded, Ok(cmds));
            }
        }
    }
}
