//! The bytes of a proposed [`Command`]: what the replicated log carries
//! (a Raft entry's request, `fencelog-cluster`), decided when applied.
//!
//! Integers are little-endian; names and owners are u8-length-prefixed,
//! records `[len: u32 | payload]*`, as in the engine's own ops (`op.rs`),
//! whose codes and layouts are reused wherever a proposal means what the
//! decided op means. The codes a decided op does not have are 13 and up.
//!
//! ```text
//! // commands: { count: u32 | [len: u32 | command]* }
//! // Append:   { op: u8 = 13 | name_len: u8 | name | token: u64 | count: u32 | [len: u32 | payload]* }
//! // AppendAt: { op: u8 = 14 | name_len: u8 | name | token: u64 | expected_offset: u64 | count: u32 | [len: u32 | payload]* }
//! // Fence:    { op: u8 = 2 | name_len: u8 | name | token: u64 }                  (as op.rs)
//! // Trim:     { op: u8 = 3 | name_len: u8 | name | token: u64 | before: u64 }    (as op.rs)
//! // Delete:   { op: u8 = 4 | name_len: u8 | name | token: u64 }                  (as op.rs)
//! // Transact: { op: u8 = 8 | count: u32 | [len: u32 | op]* }   (each an Append, AppendAt, Fence, Trim or Delete above)
//! // Acquire:  { op: u8 = 15 | name_len: u8 | name | owner_len: u8 | owner | ttl_ms: u64 | fence: u8 }
//! // Release:  { op: u8 = 6 | name_len: u8 | name | owner_len: u8 | owner | token: u64 }                (as op.rs)
//! // Renew:    { op: u8 = 7 | name_len: u8 | name | owner_len: u8 | owner | token: u64 | ttl_ms: u64 } (as op.rs)
//! // Membership: { op: u8 = 10 | config: [u8] }   TakeOver: { op: u8 = 11 }   Limits: { op: u8 = 12 | … } (as op.rs)
//! // Check:    { op: u8 = 16 | index: u64 | digest: u64 }
//! // Blank:    { op: u8 = 17 }
//! // Refused:  { op: u8 = 18 | tx_op: u32 (u32::MAX: none) | what_len: u8 | what | reason_len: u16 | reason }
//! ```
//!
//! What the layout holds but the engine refuses (a token of 0, an empty
//! stream name) decodes, as a [`Command::Refused`] or as a command its
//! decision refuses: the same answer on every replica, never a failure of
//! the entry. What the layout cannot hold (a name over 255 bytes) is
//! encoded as the refusal the engine would answer. Decoding slices names
//! and payloads out of the input without copying them, and allocates
//! nothing from a claimed count before checking the bytes could hold it.

use bytes::Bytes;

use crate::error::Error;
use crate::lease_api::check_owner;
use crate::op::{self, Op, Put, Reader};
use crate::replicated::{Command, GroupLimits, Refusal};
use crate::token::{Token, check_stream_name};
use crate::tx::{Payloads, TxOp};

pub(crate) const APPEND: u8 = 13;
const APPEND_AT: u8 = 14;
const ACQUIRE: u8 = 15;
const CHECK: u8 = 16;
const BLANK: u8 = 17;
const REFUSED: u8 = 18;

/// The `tx_op` of a refusal that concerns no op of a transaction.
const NO_OP: u32 = u32::MAX;

/// Bytes that are not a proposed command (or list of them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandDecodeError {
    /// The layout is broken: truncated, bytes left over, a field out of
    /// its layout's range.
    #[error("a proposed command of {len} bytes: {reason}")]
    Malformed {
        /// The bytes decoded.
        len: usize,
        /// What is wrong, and where.
        reason: String,
    },
    /// A code no command has (written by a newer build?).
    #[error("a proposed command with code {code}, which this build does not know")]
    UnknownCode {
        /// The first byte.
        code: u8,
    },
}

impl Command {
    /// Appends this command's bytes to `out` (see the module's layouts).
    pub fn encode(&self, out: &mut Vec<u8>) {
        if let Some(refusal) = self.unencodable() {
            return put_refused(out, &refusal);
        }
        match self {
            Command::Write(op) => put_stream_op(out, op),
            Command::Transact(ops) => {
                out.u8(op::BATCH);
                out.u32(ops.len() as u32);
                for tx_op in ops {
                    framed(out, |out| put_stream_op(out, tx_op));
                }
            }
            Command::Acquire {
                name,
                owner,
                ttl_ms,
                fence,
            } => {
                out.u8(ACQUIRE);
                out.name(name);
                out.name(owner);
                out.u64(*ttl_ms);
                out.u8(u8::from(*fence));
            }
            Command::Renew {
                name,
                owner,
                token,
                ttl_ms,
            } => op::put(out, &renew(name, owner, *token, *ttl_ms)),
            Command::Release { name, owner, token } => op::put(
                out,
                &Op::Release {
                    name,
                    owner,
                    token: token.get(),
                },
            ),
            Command::TakeOver => op::put(out, &Op::TakeOver),
            Command::SetLimits(limits) => op::put(out, &Op::Limits { limits: *limits }),
            Command::Membership(config) => op::put(out, &Op::Membership { config }),
            Command::Check { index, digest } => {
                out.u8(CHECK);
                out.u64(*index);
                out.u64(*digest);
            }
            Command::Blank => out.u8(BLANK),
            Command::Refused(r) => put_refused(out, r),
        }
    }

    /// How many bytes [`Command::encode`] appends (what a proposal costs
    /// an entry, measured without encoding it).
    pub fn encoded_len(&self) -> usize {
        if let Some(refusal) = self.unencodable() {
            return refused_len(&refusal);
        }
        let lease = |name: &[u8], owner: &[u8]| 3 + name.len() + owner.len();
        match self {
            Command::Write(op) => stream_op_len(op),
            Command::Transact(ops) => 5 + ops.iter().map(|op| 4 + stream_op_len(op)).sum::<usize>(),
            Command::Acquire { name, owner, .. } => lease(name, owner) + 9,
            Command::Renew { name, owner, .. } => lease(name, owner) + 16,
            Command::Release { name, owner, .. } => lease(name, owner) + 8,
            Command::TakeOver | Command::Blank => 1,
            Command::SetLimits(_) => 1 + GroupLimits::ENCODED,
            Command::Membership(config) => 1 + config.len(),
            Command::Check { .. } => 17,
            Command::Refused(r) => refused_len(r),
        }
    }

    /// Decodes one command from all of `b`; names and payloads are slices
    /// of `b`.
    pub fn decode(b: &Bytes) -> Result<Command, CommandDecodeError> {
        Command::decode_within(b, b)
    }

    /// Decodes one command from all of `b`, which lies within `all`; names
    /// and payloads are slices of `all`. A list's commands are decoded in
    /// place: a `Bytes` of each command's own is one count up and one down
    /// on the list's shared count (bytes' `shared_drop`, a third of whose
    /// calls were those, was a tenth of a replica's apply thread under
    /// `perf`).
    pub(crate) fn decode_within(all: &Bytes, b: &[u8]) -> Result<Command, CommandDecodeError> {
        let malformed = |reason: String| CommandDecodeError::Malformed {
            len: b.len(),
            reason,
        };
        let code = *b.first().ok_or_else(|| malformed("no bytes".into()))?;
        let decoded = match code {
            APPEND | APPEND_AT | op::FENCE | op::TRIM | op::DELETE => {
                stream_op(all, b).map_err(malformed)?.map(Command::Write)
            }
            op::BATCH => transact(all, b).map_err(malformed)?,
            ACQUIRE => acquire(all, b).map_err(malformed)?,
            CHECK => {
                let mut r = Reader::new(b);
                r.u8().map_err(&malformed)?;
                let (index, digest) = (r.u64().map_err(&malformed)?, r.u64().map_err(&malformed)?);
                whole(&r).map_err(&malformed)?;
                Ok(Command::Check { index, digest })
            }
            BLANK if b.len() == 1 => Ok(Command::Blank),
            BLANK => return Err(malformed("bytes after a blank".into())),
            REFUSED => Ok(Command::Refused(refused(b).map_err(malformed)?)),
            op::RELEASE | op::RENEW | op::TAKE_OVER | op::LIMITS | op::MEMBERSHIP => {
                shared(all, op::decode_layout(b).map_err(malformed)?).map_err(malformed)?
            }
            code => return Err(CommandDecodeError::UnknownCode { code }),
        };
        Ok(decoded.unwrap_or_else(Command::Refused))
    }

    /// Bytes [`Command::encode_all`] writes for `cmds`.
    pub fn encoded_len_all(cmds: &[Command]) -> usize {
        4 + cmds.iter().map(|c| 4 + c.encoded_len()).sum::<usize>()
    }

    /// Appends `cmds` as a list: `{ count: u32 | [len: u32 | command]* }`
    /// (reserving its whole length first: one allocation per list).
    pub fn encode_all(cmds: &[Command], out: &mut Vec<u8>) {
        out.reserve(Command::encoded_len_all(cmds));
        out.u32(cmds.len() as u32);
        for cmd in cmds {
            framed(out, |out| cmd.encode(out));
        }
    }

    /// Decodes a list [`Command::encode_all`] wrote, all of `b`.
    pub fn decode_all(b: &Bytes) -> Result<Vec<Command>, CommandDecodeError> {
        let list = List::new(b)?;
        let mut cmds = Vec::with_capacity(list.left);
        for cmd in list {
            cmds.push(Command::decode_within(b, cmd?)?);
        }
        Ok(cmds)
    }

    /// Whether this command's encoding decodes to exactly this command
    /// (`decode(encode(c)) == c`): true unless it is a refusal (whose
    /// reason may be cut) or a command its layout cannot hold (encoded as
    /// the refusal the engine would answer). A leader that proposes such
    /// commands may decide them as given, without decoding its own entry:
    /// the followers decode the same command.
    pub fn decodes_to_itself(&self) -> bool {
        !matches!(self, Command::Refused(_)) && self.unencodable().is_none()
    }

    /// The refusal to encode instead of this command when a name, an
    /// owner or a count does not fit its layout: the one the engine's
    /// decision would answer (the name first, then the owner). Asked up to
    /// four times of every write a leader proposes (its size, its
    /// encoding, whether it decodes to itself): a write that fits answers
    /// here, inlined where it is asked (callgrind had the check at 2.7 %
    /// of a leader's instructions; one path through the closures below
    /// cost about 150 instructions per write more).
    #[inline]
    fn unencodable(&self) -> Option<Refusal> {
        if let Command::Write(op) = self
            && stream_op_fits(op)
        {
            return None;
        }
        self.refusal_to_encode()
    }

    /// [`Command::unencodable`] for any command.
    fn refusal_to_encode(&self) -> Option<Refusal> {
        let fits = |n: &[u8]| n.len() <= usize::from(u8::MAX);
        let op_error = |op: &TxOp| {
            if stream_op_fits(op) {
                return None;
            }
            if !fits(op.stream()) {
                return check_stream_name(op.stream()).err();
            }
            Some(Error::invalid(
                "payload bytes",
                "a record or a count over 2^32 cannot be proposed",
            ))
        };
        match self {
            Command::Write(op) => op_error(op).map(|e| Refusal::of(&e, None)),
            Command::Transact(ops) => {
                if u32::try_from(ops.len()).is_err() {
                    let e = Error::invalid("transaction", "over 2^32 ops cannot be proposed");
                    return Some(Refusal::of(&e, None));
                }
                ops.iter()
                    .enumerate()
                    .find_map(|(i, op)| op_error(op).map(|e| Refusal::of(&e, Some(i as u32))))
            }
            Command::Acquire { name, owner, .. }
            | Command::Renew { name, owner, .. }
            | Command::Release { name, owner, .. }
                if !fits(name) || !fits(owner) =>
            {
                let e = check_stream_name(name)
                    .and_then(|()| check_owner(owner))
                    .err()?;
                Some(Refusal::of(&e, None))
            }
            _ => None,
        }
    }
}

/// Writes `fill`'s bytes behind their length as a u32.
fn framed(out: &mut Vec<u8>, fill: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.u32(0);
    fill(out);
    // A proposal is bounded far below 4 GiB (the cluster's request limit
    // is checked against `encoded_len` before it is proposed).
    debug_assert!(u32::try_from(out.len() - at - 4).is_ok());
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

fn renew<'a>(name: &'a [u8], owner: &'a [u8], token: Token, ttl_ms: u64) -> Op<'a> {
    Op::Renew {
        name,
        owner,
        token: token.get(),
        ttl_ms,
    }
}

fn put_stream_op(out: &mut Vec<u8>, op: &TxOp) {
    match op {
        TxOp::Append {
            stream,
            token,
            payloads,
        } => {
            out.u8(APPEND);
            out.name(stream);
            out.u64(token.get());
            put_records(out, payloads);
        }
        TxOp::AppendAt {
            stream,
            token,
            expected_offset,
            payloads,
        } => {
            out.u8(APPEND_AT);
            out.name(stream);
            out.u64(token.get());
            out.u64(*expected_offset);
            put_records(out, payloads);
        }
        TxOp::Fence { stream, token } => op::put(
            out,
            &Op::Fence {
                stream,
                token: token.get(),
            },
        ),
        TxOp::Trim {
            stream,
            token,
            before,
        } => op::put(
            out,
            &Op::Trim {
                stream,
                token: token.get(),
                before: *before,
            },
        ),
        TxOp::Delete { stream, token } => op::put(
            out,
            &Op::Delete {
                stream,
                token: token.get(),
            },
        ),
    }
}

fn stream_op_len(op: &TxOp) -> usize {
    // Code, name length and name, token.
    let head = 10 + op.stream().len();
    let records = |p: &[Bytes]| 4 + p.iter().map(|p| 4 + p.len()).sum::<usize>();
    match op {
        TxOp::Append { payloads, .. } => head + records(payloads),
        TxOp::AppendAt { payloads, .. } => head + 8 + records(payloads),
        TxOp::Fence { .. } | TxOp::Delete { .. } => head,
        TxOp::Trim { .. } => head + 8,
    }
}

fn refused_len(r: &Refusal) -> usize {
    8 + r.what.len() + reason_end(&r.reason)
}

/// Where a refusal's reason is cut: the engine's are short sentences; one
/// past the u16 of its length is cut at a character boundary.
fn reason_end(reason: &str) -> usize {
    let mut end = reason.len().min(usize::from(u16::MAX));
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    end
}

fn put_records(out: &mut Vec<u8>, payloads: &[Bytes]) {
    out.reserve(4 + payloads.iter().map(|p| 4 + p.len()).sum::<usize>());
    out.u32(payloads.len() as u32);
    for p in payloads {
        out.u32(p.len() as u32);
        out.bytes(p);
    }
}

fn put_refused(out: &mut Vec<u8>, r: &Refusal) {
    out.u8(REFUSED);
    out.u32(r.op.unwrap_or(NO_OP));
    out.name(r.what.as_bytes());
    let end = reason_end(&r.reason);
    out.bytes(&(end as u16).to_le_bytes());
    out.bytes(&r.reason.as_bytes()[..end]);
}

/// The commands of a list, `{ count: u32 | [len: u32 | command]* }`: each
/// one's bytes in turn, then an error if bytes are left after the last.
pub(crate) struct List<'b> {
    b: &'b [u8],
    r: Reader<'b>,
    /// Commands not read yet.
    pub(crate) left: usize,
    /// Whether an error or the end was reached.
    done: bool,
}

impl<'b> List<'b> {
    /// The list `b`, its count read and checked against its length.
    pub(crate) fn new(b: &'b [u8]) -> Result<List<'b>, CommandDecodeError> {
        let mut r = Reader::new(b);
        let count = r.u32().map_err(|reason| malformed_list(b, reason))? as usize;
        // Each command takes at least 5 bytes (its length and code).
        if count > b.len() / 5 {
            return Err(malformed_list(b, format!("{count} commands claimed")));
        }
        Ok(List {
            b,
            r,
            left: count,
            done: false,
        })
    }
}

impl<'b> Iterator for List<'b> {
    type Item = Result<&'b [u8], CommandDecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.left == 0 {
            self.done = true;
            return whole(&self.r).err().map(|e| Err(malformed_list(self.b, e)));
        }
        self.left -= 1;
        let cmd = match self.r.u32().and_then(|len| self.r.bytes(len as usize)) {
            Ok(cmd) => Ok(cmd),
            Err(e) => {
                self.done = true;
                Err(malformed_list(self.b, e))
            }
        };
        Some(cmd)
    }
}

fn malformed_list(b: &[u8], reason: String) -> CommandDecodeError {
    CommandDecodeError::Malformed {
        len: b.len(),
        reason,
    }
}

/// Every byte read: a command is exactly its bytes.
fn whole(r: &Reader<'_>) -> Result<(), String> {
    if r.is_empty() {
        Ok(())
    } else {
        Err("bytes after the command".into())
    }
}

/// A token from the log: out of range, refused alike everywhere.
fn token(n: u64) -> Result<Token, Refusal> {
    Token::new(n).map_err(|e| Refusal::of(&e, None))
}

/// A stream op (Append, AppendAt, Fence, Trim, Delete), all of `b`; its
/// name and records are slices of `all`, which holds `b`.
fn stream_op(all: &Bytes, b: &[u8]) -> Result<Result<TxOp, Refusal>, String> {
    let mut r = Reader::new(b);
    let code = r.u8()?;
    let stream = all.slice_ref(r.name()?);
    let raw = r.u64()?;
    let expected_offset = if code == APPEND_AT { r.u64()? } else { 0 };
    let before = if code == op::TRIM { r.u64()? } else { 0 };
    let payloads = if code == APPEND || code == APPEND_AT {
        records(all, &mut r)?
    } else {
        Payloads::new()
    };
    whole(&r)?;
    let token = match token(raw) {
        Ok(t) => t,
        Err(refusal) => return Ok(Err(refusal)),
    };
    Ok(Ok(match code {
        APPEND => TxOp::Append {
            stream,
            token,
            payloads,
        },
        APPEND_AT => TxOp::AppendAt {
            stream,
            token,
            expected_offset,
            payloads,
        },
        op::FENCE => TxOp::Fence { stream, token },
        op::TRIM => TxOp::Trim {
            stream,
            token,
            before,
        },
        op::DELETE => TxOp::Delete { stream, token },
        other => return Err(format!("code {other} is not a stream op")),
    }))
}

/// `count: u32 | [len: u32 | payload]*`, each a slice of `all` (which
/// holds what `r` reads).
fn records(all: &Bytes, r: &mut Reader<'_>) -> Result<Payloads, String> {
    let count = r.u32()? as usize;
    let left = r.rest_len();
    // Each record takes at least its 4-byte length.
    if count > left / 4 {
        return Err(format!("{count} records claimed in {left} bytes"));
    }
    let mut payloads = Payloads::with_capacity(count);
    for _ in 0..count {
        let len = r.u32()? as usize;
        payloads.push(all.slice_ref(r.bytes(len)?));
    }
    Ok(payloads)
}

/// A transaction's ops: any refused refuses the whole (as a token out of
/// range always has).
fn transact(all: &Bytes, b: &[u8]) -> Result<Result<Command, Refusal>, String> {
    let mut r = Reader::new(b);
    r.u8()?;
    let count = r.u32()? as usize;
    // Each op takes at least its length and the shortest op (a fence of
    // an empty name: 10 bytes).
    if count > r.rest_len() / 14 {
        return Err(format!("{count} ops claimed in {} bytes", r.rest_len()));
    }
    let mut ops = Vec::with_capacity(count);
    let mut refused = None;
    for _ in 0..count {
        let len = r.u32()? as usize;
        let sub = r.bytes(len)?;
        if !matches!(
            sub.first(),
            Some(&(APPEND | APPEND_AT | op::FENCE | op::TRIM | op::DELETE))
        ) {
            return Err("a transaction may hold only stream ops".into());
        }
        match stream_op(all, sub)? {
            Ok(op) => ops.push(op),
            Err(refusal) => refused = refused.or(Some(refusal)),
        }
    }
    whole(&r)?;
    Ok(match refused {
        Some(refusal) => Err(refusal),
        None => Ok(Command::Transact(ops)),
    })
}

fn acquire(all: &Bytes, b: &[u8]) -> Result<Result<Command, Refusal>, String> {
    let mut r = Reader::new(b);
    r.u8()?;
    let name = all.slice_ref(r.name()?);
    let owner = all.slice_ref(r.name()?);
    let ttl_ms = r.u64()?;
    let fence = match r.u8()? {
        0 => false,
        1 => true,
        other => return Err(format!("fence flag {other} is neither 0 nor 1")),
    };
    whole(&r)?;
    Ok(Ok(Command::Acquire {
        name,
        owner,
        ttl_ms,
        fence,
    }))
}

fn refused(b: &[u8]) -> Result<Refusal, String> {
    let mut r = Reader::new(b);
    r.u8()?;
    let op = match r.u32()? {
        NO_OP => None,
        i => Some(i),
    };
    let what = Refusal::what_of(r.name()?);
    let mut len = [0u8; 2];
    len.copy_from_slice(r.bytes(2)?);
    let reason = String::from_utf8_lossy(r.bytes(usize::from(u16::from_le_bytes(len)))?);
    whole(&r)?;
    Ok(Refusal {
        op,
        what,
        reason: reason.into_owned(),
    })
}

/// A command whose layout is a decided op's (its slices within `b`).
fn shared(b: &Bytes, op: Op<'_>) -> Result<Result<Command, Refusal>, String> {
    let cmd = match op {
        Op::Release {
            name,
            owner,
            token: t,
        } => token(t).map(|token| Command::Release {
            name: b.slice_ref(name),
            owner: b.slice_ref(owner),
            token,
        }),
        Op::Renew {
            name,
            owner,
            token: t,
            ttl_ms,
        } => token(t).map(|token| Command::Renew {
            name: b.slice_ref(name),
            owner: b.slice_ref(owner),
            token,
            ttl_ms,
        }),
        Op::TakeOver => Ok(Command::TakeOver),
        Op::Limits { limits } => Ok(Command::SetLimits(limits)),
        Op::Membership { config } => Ok(Command::Membership(b.slice_ref(config))),
        other => return Err(format!("{other:?} is not a proposal")),
    };
    Ok(cmd)
}

/// Whether a stream op's name, records and record count fit the layout
/// (a name of at most 255 bytes, counts and lengths below 2^32).
#[inline]
fn stream_op_fits(op: &TxOp) -> bool {
    let payloads = op.payloads();
    op.stream().len() <= usize::from(u8::MAX)
        && u32::try_from(payloads.len()).is_ok()
        && payloads.iter().all(|p| u32::try_from(p.len()).is_ok())
}
