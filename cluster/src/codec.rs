//! What every cluster format shares: bounded bincode, the typed error a
//! decoder answers, and the tagged blobs (`{ magic | version | bincode }`)
//! that stand alone on disk (docs/FORMAT.md, "Cluster").

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why bytes of a cluster format did not decode. Whoever reads them adds
/// where they were (the WAL's file and position, a snapshot's path, the
/// Raft index, the peer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// A version this build does not read (written by a newer build, or
    /// damage that kept the checksum).
    #[error("{what}: format version {version} (this build reads version {known})")]
    UnknownVersion {
        /// The structure.
        what: &'static str,
        /// The version found.
        version: u8,
        /// The version this build reads.
        known: u8,
    },
    /// Written by a build from before the cluster's formats carried a
    /// version: the node's data must be re-created (docs/FORMAT.md,
    /// "Cluster", "Compatibility").
    #[error(
        "{what}: written before the cluster's formats carried a version; re-create this node's data (docs/FORMAT.md, \"Cluster\")"
    )]
    Unversioned {
        /// The structure.
        what: &'static str,
    },
    /// Anything else: truncated, a bad magic number, an unknown kind,
    /// bytes that do not decode, bytes left over.
    #[error("{what}: {reason}")]
    Invalid {
        /// The structure.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl FormatError {
    pub(crate) fn invalid(what: &'static str, reason: impl std::fmt::Display) -> FormatError {
        FormatError::Invalid {
            what,
            reason: reason.to_string(),
        }
    }
}

/// bincode as the cluster writes it (fixed-width little-endian integers),
/// reading at most `limit` bytes: no length in the input makes it
/// allocate more than the input could hold; bytes left over are an error.
pub(crate) fn bounded(limit: usize) -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(limit as u64)
}

/// bincode as the cluster writes it (the same bytes as
/// `bincode::serialize`).
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .serialize(value)
}

/// Decodes all of `bytes` as a `T`, within their length.
pub(crate) fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, FormatError> {
    use bincode::Options;
    bounded(bytes.len())
        .deserialize(bytes)
        .map_err(|e| FormatError::invalid(what, e))
}

/// A blob that stands alone: `{ magic: [u8; 4] | version: u8 | bincode(T) }`.
pub(crate) struct Tagged {
    pub what: &'static str,
    pub magic: [u8; 4],
    pub version: u8,
}

impl Tagged {
    pub fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, bincode::Error> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.magic);
        out.push(self.version);
        out.extend_from_slice(&encode(value)?);
        Ok(out)
    }

    /// Decodes a blob of this kind. The version is checked before a byte
    /// of the body is read; a blob without the magic whose first byte is
    /// 0 or 1 (a bincode `Option` or `bool`, what the formats before
    /// versions began with) is [`FormatError::Unversioned`].
    pub fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, FormatError> {
        if bytes.len() < 5 || bytes[..4] != self.magic {
            return Err(match bytes.first() {
                Some(0 | 1) => FormatError::Unversioned { what: self.what },
                _ => FormatError::invalid(
                    self.what,
                    format!(
                        "does not start with {:?}",
                        String::from_utf8_lossy(&self.magic)
                    ),
                ),
            });
        }
        if bytes[4] != self.version {
            return Err(FormatError::UnknownVersion {
                what: self.what,
                version: bytes[4],
                known: self.version,
            });
        }
        decode(self.what, &bytes[5..])
    }
}

/// The state machine's membership, inside the engine (its
/// `Command::Membership` bytes).
// membership: { magic: b"FLMB" | version: u8 (1) | bincode(StoredMembership) }
pub(crate) const MEMBERSHIP: Tagged = Tagged {
    what: "the stored membership",
    magic: *b"FLMB",
    version: 1,
};
