//! The words every command parses alike: names, integers, tokens, and the
//! errors for arguments that do not fit.

use fencelog::Token;

use crate::outcome::{Outcome, error_reply};
// Integers of commands: digits only (Redis refuses "+5" too), leading
// zeros allowed.
pub(crate) use crate::protocol::ascii_u64 as parse_u64;
use crate::protocol::{ArgRef, Reply};

/// An error reply, now.
pub fn err(text: impl Into<String>) -> Outcome {
    Outcome::Reply(Reply::Error(text.into()))
}

/// `ERR wrong number of arguments for 'cmd' command`.
pub fn arity_error(cmd: &str) -> Reply {
    Reply::Error(format!(
        "ERR wrong number of arguments for '{}' command",
        cmd.to_ascii_lowercase()
    ))
}

/// [`arity_error`], now.
pub fn wrong_arity(cmd: &str) -> Outcome {
    Outcome::Reply(arity_error(cmd))
}

/// `ERR value is not an integer or out of range`.
pub fn not_integer() -> Outcome {
    err("ERR value is not an integer or out of range")
}

/// A fencing token: an integer of 1 or more.
pub fn parse_token(b: &[u8]) -> Result<Token, Outcome> {
    let n = parse_u64(b).ok_or_else(|| err("ERR token is not an integer or out of range"))?;
    Token::new(n).map_err(|e| Outcome::Reply(error_reply(&e)))
}

/// A wait in milliseconds (`BLOCK`, `WAIT`): 0 waits without a limit, as
/// in Redis.
pub fn wait_ms(ms: u64) -> std::time::Duration {
    if ms == 0 {
        std::time::Duration::MAX
    } else {
        std::time::Duration::from_millis(ms)
    }
}

/// A command or option name in upper case, on the stack: every request
/// matches one, so it must not allocate.
pub struct Upper {
    buf: [u8; Upper::MAX],
    len: usize,
}

impl Upper {
    /// Longer than any name this server knows.
    pub const MAX: usize = 24;

    pub fn as_str(&self) -> &str {
        debug_assert!(self.len <= Upper::MAX);
        debug_assert!(self.buf[..self.len].is_ascii());
        // SAFETY: `upper` copies in nothing but ASCII (it checks), and
        // ASCII is UTF-8. (Checked again here, this was 2 % of the CPU of
        // a stale rejection: every request looks its name up twice.)
        unsafe { std::str::from_utf8_unchecked(&self.buf[..self.len]) }
    }
}

/// `b` in upper case; a name too long or not ASCII is empty, which matches
/// nothing (error messages quote the name as the client sent it).
pub fn upper(b: &[u8]) -> Upper {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES * 0x80;
    let mut u = Upper {
        buf: [0; Upper::MAX],
        len: 0,
    };
    if b.len() > Upper::MAX {
        return u;
    }
    u.buf[..b.len()].copy_from_slice(b);
    // Eight bytes at a time (every request's name comes here; byte by
    // byte it was a hundred instructions): the padding is zeros, which
    // are ASCII and not letters.
    let mut words = [0u64; Upper::MAX / 8];
    let mut any_high = 0;
    for (word, chunk) in words.iter_mut().zip(u.buf.chunks_exact(8)) {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        any_high |= x;
        // With every byte below 0x80 no addition carries into the next
        // byte: a byte's high bit says it is at least `a`, resp. past `z`.
        let from_a = x.wrapping_add(ONES * u64::from(0x80 - b'a'));
        let past_z = x.wrapping_add(ONES * u64::from(0x80 - b'z' - 1));
        let lower = from_a & !past_z & HIGH;
        *word = x ^ (lower >> 2);
    }
    if any_high & HIGH != 0 {
        // Not ASCII: matches nothing.
        u.buf = [0; Upper::MAX];
        return u;
    }
    for (chunk, word) in u.buf.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    u.len = b.len();
    u
}

/// How much of a client's word an error message quotes.
const QUOTED_BYTES: usize = 128;

/// A client's word, for an error message: its first 128 bytes, as Redis
/// quotes it. Whole, three 16 MiB arguments of invalid UTF-8 would make a
/// 144 MiB error (each bad byte turns into a 3-byte U+FFFD).
pub fn quoted(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&b[..b.len().min(QUOTED_BYTES)])
}

/// The answer to a command this server does not know, as Redis words it.
pub fn unknown_command(args: &[ArgRef<'_>]) -> Reply {
    let mut shown = String::new();
    for arg in args.iter().skip(1).take(3) {
        shown.push_str(&format!("'{}' ", quoted(arg)));
    }
    Reply::Error(format!(
        "ERR unknown command '{}', with args beginning with: {}",
        args.first().map_or_else(Default::default, |c| quoted(c)),
        shown
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_in_any_case_and_odd_ones_match_nothing() {
        assert_eq!(upper(b"log.Append").as_str(), "LOG.APPEND");
        assert_eq!(upper(b"LEASE.ACQUIRE").as_str(), "LEASE.ACQUIRE");
        assert_eq!(upper(b"").as_str(), "");
        assert_eq!(upper(&[b'x'; Upper::MAX]).as_str().len(), Upper::MAX);
        assert_eq!(upper(&[b'x'; Upper::MAX + 1]).as_str(), "");
        assert_eq!(upper("pïng".as_bytes()).as_str(), "");
    }

    /// The word-at-a-time upper-casing agrees with the standard library's
    /// on every byte, wherever it stands in the name.
    #[test]
    fn upper_agrees_with_the_standard_library() {
        for b in 0..=u8::MAX {
            for at in [0, 7, 8, 15, 23] {
                let mut name = vec![b'x'; at + 1];
                name[at] = b;
                let expected = if name.is_ascii() {
                    String::from_utf8(name.to_ascii_uppercase()).unwrap()
                } else {
                    String::new()
                };
                assert_eq!(upper(&name).as_str(), expected, "byte {b} at {at}");
            }
        }
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_u64(b"42"), Some(42));
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"+1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }
}
