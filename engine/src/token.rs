//! Fencing tokens, offsets and stream names.

use std::fmt;
use std::num::NonZeroU64;

use crate::error::{Error, Result};

/// The largest valid token: 2^63 - 1 (tokens fit a signed 64-bit integer, as
/// they do in Redis and PostgreSQL clients).
pub const MAX_TOKEN: u64 = i64::MAX as u64;

/// A fencing token: an integer in `1..=2^63-1`. Zero is never valid.
///
/// # Examples
///
/// ```
/// use fencelog::Token;
/// let t = Token::new(42).unwrap();
/// assert_eq!(t.get(), 42);
/// assert!(Token::new(0).is_err());
/// assert!(Token::new(1 << 63).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(NonZeroU64);

impl Token {
    /// The token `n`, if it is in `1..=2^63-1`.
    pub fn new(n: u64) -> Result<Token> {
        match NonZeroU64::new(n) {
            Some(nz) if n <= MAX_TOKEN => Ok(Token(nz)),
            _ => Err(Error::invalid(
                "token",
                format!("{n} is not in 1..={MAX_TOKEN}"),
            )),
        }
    }

    /// The token as an integer.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl TryFrom<u64> for Token {
    type Error = Error;
    fn try_from(n: u64) -> Result<Token> {
        Token::new(n)
    }
}

impl From<Token> for u64 {
    fn from(t: Token) -> u64 {
        t.get()
    }
}

/// A record's position in its stream: 0, 1, 2, … never reused.
pub type Offset = u64;

/// The longest stream name in bytes.
pub const MAX_STREAM_NAME: usize = 255;

/// Checks a stream name: 1..=255 bytes, any bytes.
pub(crate) fn check_stream_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > MAX_STREAM_NAME {
        return Err(Error::invalid(
            "stream name",
            format!("{} bytes is not in 1..={MAX_STREAM_NAME}", name.len()),
        ));
    }
    Ok(())
}
