//! Reads the commands of a version 1 [`Request`](crate::Request), never
//! writes them: a Raft log written before version 2 still holds such
//! entries after an upgrade, and every replica must decide them as the
//! build that wrote them did.
//!
//! Version 1 is bincode of an enum the cluster no longer has: a command is
//! a `u32` variant then its fields in order, byte strings a `u64` length
//! and the bytes (docs/FORMAT.md, "Request: what an entry carries"). The
//! visitors below read that layout straight into the engine's
//! [`Command`]; a token out of range becomes the refusal version 1
//! answered (the whole command, even inside a transaction).

use std::fmt;
use std::marker::PhantomData;

use bytes::Bytes;
use fencelog::{Command, GroupLimits, Refusal, Token, TxOp};
use serde::Deserialize;
use serde::de::value::SeqAccessDeserializer;
use serde::de::{DeserializeSeed, Deserializer, EnumAccess, SeqAccess, VariantAccess, Visitor};
use serde_bytes::ByteBuf;

/// The variants of version 1's command enum, in order (bincode knows them
/// by index; the names only document them).
const COMMANDS: &[&str] = &[
    "Append",
    "AppendAt",
    "Fence",
    "Trim",
    "Delete",
    "Transact",
    "Acquire",
    "Renew",
    "Release",
    "Tick",
    "TakeOver",
    "SetLimits",
    "Check",
];

/// Names for a struct variant's fields: bincode reads only how many there
/// are.
const FIELDS: &[&str] = &["0", "1", "2", "3", "4", "5"];

/// A stream op's fields: the five first variants of both enums.
const STREAM_OPS: &[&str] = &["Append", "AppendAt", "Fence", "Trim", "Delete"];

/// Version 1's `cmds`: a `u64` count, then the commands.
pub(crate) struct Commands;

impl<'de> DeserializeSeed<'de> for Commands {
    type Value = Vec<Command>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Command>, D::Error> {
        let cmds: Vec<V1Command> = Vec::deserialize(d)?;
        Ok(cmds.into_iter().map(|c| c.0).collect())
    }
}

/// One version 1 command, as the engine's.
struct V1Command(Command);

/// One version 1 transaction op, or the refusal of its token. Its own
/// visitor, knowing only the stream ops, rather than [`V1Command`]'s: a
/// transaction inside a transaction would make decoding recurse as deep
/// as crafted bytes nest.
struct V1TxOp(Result<TxOp, Refusal>);

/// Reads a struct variant's fields as the tuple `T` (bincode writes a
/// struct's fields in order, with nothing between them).
struct Fields<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a version 1 command's fields")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::deserialize(SeqAccessDeserializer::new(seq))
    }
}

/// The fields of variant `V`, `n` of them, as `T`.
fn fields<'de, V: VariantAccess<'de>, T: Deserialize<'de>>(v: V, n: usize) -> Result<T, V::Error> {
    v.struct_variant(&FIELDS[..n], Fields(PhantomData))
}

fn token(n: u64) -> Result<Token, Refusal> {
    Token::new(n).map_err(|e| Refusal::of(&e, None))
}

fn bytes(b: ByteBuf) -> Bytes {
    Bytes::from(b.into_vec())
}

fn payloads(p: Vec<ByteBuf>) -> fencelog::Payloads {
    p.into_iter().map(bytes).collect()
}

/// A stream op, variant `index` (0 to 4) of either enum.
fn stream_op<'de, V: VariantAccess<'de>>(
    index: u32,
    v: V,
) -> Result<Result<TxOp, Refusal>, V::Error> {
    Ok(match index {
        0 => {
            let (s, t, p): (ByteBuf, u64, Vec<ByteBuf>) = fields(v, 3)?;
            token(t).map(|token| TxOp::Append {
                stream: bytes(s),
                token,
                payloads: payloads(p),
            })
        }
        1 => {
            let (s, t, expected_offset, p): (ByteBuf, u64, u64, Vec<ByteBuf>) = fields(v, 4)?;
            token(t).map(|token| TxOp::AppendAt {
                stream: bytes(s),
                token,
                expected_offset,
                payloads: payloads(p),
            })
        }
        2 | 4 => {
            let (s, t): (ByteBuf, u64) = fields(v, 2)?;
            let stream = bytes(s);
            token(t).map(|token| match index {
                2 => TxOp::Fence { stream, token },
                _ => TxOp::Delete { stream, token },
            })
        }
        3 => {
            let (s, t, before): (ByteBuf, u64, u64) = fields(v, 3)?;
            token(t).map(|token| TxOp::Trim {
                stream: bytes(s),
                token,
                before,
            })
        }
        other => {
            return Err(serde::de::Error::custom(format!(
                "a version 1 stream op of variant {other}"
            )));
        }
    })
}

impl<'de> Deserialize<'de> for V1TxOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<V1TxOp, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = V1TxOp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a version 1 transaction op")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, a: A) -> Result<V1TxOp, A::Error> {
                let (index, v): (u32, _) = a.variant()?;
                stream_op(index, v).map(V1TxOp)
            }
        }
        d.deserialize_enum("WireTxOp", STREAM_OPS, V)
    }
}

impl<'de> Deserialize<'de> for V1Command {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<V1Command, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = V1Command;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a version 1 command")
            }
            fn visit_enum<A: EnumAccess<'de>>(self, a: A) -> Result<V1Command, A::Error> {
                let (index, v): (u32, _) = a.variant()?;
                let cmd = command(index, v)?;
                Ok(V1Command(cmd.unwrap_or_else(Command::Refused)))
            }
        }
        d.deserialize_enum("WireCommand", COMMANDS, V)
    }
}

/// Command variant `index` of version 1.
fn command<'de, V: VariantAccess<'de>>(
    index: u32,
    v: V,
) -> Result<Result<Command, Refusal>, V::Error> {
    Ok(match index {
        0..=4 => stream_op(index, v)?.map(Command::Write),
        5 => {
            let ops: Vec<V1TxOp> = v.newtype_variant()?;
            ops.into_iter()
                .map(|op| op.0)
                .collect::<Result<Vec<_>, _>>()
                .map(Command::Transact)
        }
        6 => {
            let (name, owner, ttl_ms, fence): (ByteBuf, ByteBuf, u64, bool) = fields(v, 4)?;
            Ok(Command::Acquire {
                name: bytes(name),
                owner: bytes(owner),
                ttl_ms,
                fence,
            })
        }
        7 => {
            let (name, owner, t, ttl_ms): (ByteBuf, ByteBuf, u64, u64) = fields(v, 4)?;
            token(t).map(|token| Command::Renew {
                name: bytes(name),
                owner: bytes(owner),
                token,
                ttl_ms,
            })
        }
        8 => {
            let (name, owner, t): (ByteBuf, ByteBuf, u64) = fields(v, 3)?;
            token(t).map(|token| Command::Release {
                name: bytes(name),
                owner: bytes(owner),
                token,
            })
        }
        // A leader's tick: only the clock moves.
        9 => v.unit_variant().map(|()| Ok(Command::Blank))?,
        10 => v.unit_variant().map(|()| Ok(Command::TakeOver))?,
        11 => {
            let (a, b, c, d, e, f): (u32, u32, u64, u64, u64, u64) = fields(v, 6)?;
            Ok(Command::SetLimits(GroupLimits {
                max_payload_bytes: a,
                max_records_per_append: b,
                lease_ttl_min_ms: c,
                lease_ttl_max_ms: d,
                max_live_leases: e,
                max_streams: f,
            }))
        }
        12 => {
            let (index, digest): (u64, u64) = fields(v, 2)?;
            Ok(Command::Check { index, digest })
        }
        other => {
            return Err(serde::de::Error::custom(format!(
                "a version 1 command of variant {other} (version 1 has 0 to 12)"
            )));
        }
    })
}
