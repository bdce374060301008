//! Raft's messages between nodes, over TCP: one pooled connection per
//! target, shared by replication, heartbeats, votes and ReadIndex rounds,
//! one request at a time.
//!
//! Every connection starts with a mutual challenge–response handshake
//! keyed by the cluster secret, and every frame after it carries a MAC
//! over a per-direction sequence number, so a stranger on the Raft port
//! can neither act as a peer nor forge, replay or reorder a peer's frames
//! (docs/FORMAT.md, "Peer protocol"; docs/CLUSTER.md, "Security").
//!
//! ```text
//! // hello: { magic: b"FLRP" | version: u8 | secret: u8 | node: u64 LE | incarnation: u64 LE
//! //          | expected: u64 LE | nonce: [u8; 32] }
//! // proof: { hmac_sha256(secret, PROOF_DOMAIN | role | hello_dialer | hello_acceptor): [u8; 32] }
//! // frame: { version: u8 | len: u32 LE | bincode(Rpc or RpcReply): [u8; len]
//! //          | mac: blake3_keyed(frame_key, seq | version | len | body): [u8; 32] }
//! ```
//!
//! The hello carries the sender's incarnation (its data directory's; a
//! replaced disk is a new one) and, from the dialer, the incarnation it
//! expects of the node it dialed (the one its membership lists): a node
//! whose disk was replaced since refuses the connection, and so neither
//! votes nor accepts entries until the group re-added it.
//!
//! Before authentication only the two fixed-size handshake messages are
//! read (94 bytes); after it, a frame's length is checked against
//! [`MAX_FRAME`] before anything is allocated, and its body is read into a
//! buffer that grows with the bytes that actually arrive.
//!
//! A node that cannot be reached is reported as such, and Raft backs off
//! before trying it again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::types::{Member, NodeId, Raft, TypeConfig};

type HmacSha256 = Hmac<Sha256>;

/// The largest frame body accepted from an authenticated peer: a batch of
/// entries or a snapshot chunk, never more. Checked before anything is
/// allocated; the body's buffer grows only with the bytes received.
pub const MAX_FRAME: usize = 256 << 20;

/// Peer connections a node accepts at once (handshakes under way and
/// authenticated peers together); one more is closed at once. A group has
/// at most a handful of peers, each with one pooled connection (and one
/// being replaced now and then).
pub const MAX_PEER_CONNECTIONS: usize = 64;

/// A peer that has not completed the handshake in this long is dropped
/// (a stranger holding a connection open holds one of
/// [`MAX_PEER_CONNECTIONS`] no longer than this).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest cluster secret (`--cluster-secret-file`), in bytes.
pub const MAX_SECRET_BYTES: usize = 4096;

/// The first bytes of every peer connection: tells a fencelog peer from
/// anything else that reaches the port (an HTTP probe, redis-cli, an
/// older fencelog's length prefix).
const MAGIC: [u8; 4] = *b"FLRP";

/// The version of the peer protocol: the handshake and the frames after
/// it. Version 1 is the first authenticated one (the frames before it had
/// no version byte, and start with a length, never with [`MAGIC`]);
/// version 2 adds the incarnations to the hello, and carries versioned
/// requests (a [`crate::Request`] begins with its own version byte), which
/// a node of version 1 would misread; version 3 is both (the two were
/// numbered 2 on two branches and never ran apart); version 4 carries
/// requests of version 2 (the engine's encoding of its commands), which a
/// node of version 3 refuses entry by entry: refused in the handshake
/// instead; version 5 authenticates frames with keyed BLAKE3 instead of
/// HMAC-SHA256 (a third of the CPU per byte on the replication path),
/// which a node of version 4 would take for a forged frame.
pub const PROTOCOL_VERSION: u8 = 5;

/// Domain separation for the handshake proofs and the session keys: an
/// HMAC computed for one purpose is never valid for another.
const PROOF_DOMAIN: &[u8] = b"fencelog peer auth v1 proof";
// v2: the key of a keyed BLAKE3 since protocol version 5, never of an HMAC.
const KEY_DOMAIN: &[u8] = b"fencelog peer auth v2 frame key";

/// `role` in the proofs and keys: who sends.
const DIALER: &[u8] = b"dialer";
const ACCEPTOR: &[u8] = b"acceptor";

// hello: { magic: [u8; 4] | version: u8 | secret: u8 | node: u64 LE | incarnation: u64 LE
//          | expected: u64 LE | nonce: [u8; 32] }
const HELLO_LEN: usize = 4 + 1 + 1 + 8 + 8 + 8 + 32;
// proof: { mac: [u8; 32] }
const PROOF_LEN: usize = 32;
// frame header: { version: u8 | len: u32 LE }, then the body, then { mac: [u8; 32] }
const FRAME_HEADER_LEN: usize = 1 + 4;
const MAC_LEN: usize = 32;

/// The secret every member of a cluster shares (`--cluster-secret-file`):
/// 1 to [`MAX_SECRET_BYTES`] bytes. Its `Debug` shows no byte of it.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

impl ClusterSecret {
    /// The secret `bytes`, refused when empty or over
    /// [`MAX_SECRET_BYTES`].
    pub fn new(bytes: Vec<u8>) -> Result<ClusterSecret, PeerError> {
        if bytes.is_empty() || bytes.len() > MAX_SECRET_BYTES {
            return Err(PeerError::SecretLength {
                len: bytes.len(),
                max: MAX_SECRET_BYTES,
            });
        }
        Ok(ClusterSecret(bytes.into()))
    }

    /// A new random secret as 64 hexadecimal digits (32 bytes from the
    /// operating system's generator), to write into a secret file.
    pub fn random_hex() -> Result<String, PeerError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| PeerError::Random(e.to_string()))?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.0.len())
    }
}

/// Who this node is to its peers, and what it proves itself with.
#[derive(Clone, Debug)]
pub struct PeerAuth {
    /// This node's id, sent in its hello.
    pub id: NodeId,
    /// This node's incarnation (its data directory's), sent in its hello:
    /// a dialer that expects another one is refused.
    pub incarnation: u64,
    /// The cluster secret; `None` only on loopback (then the handshake and
    /// the MACs are keyed by the empty string: they keep the protocol's
    /// shape and bounds, and prove nothing).
    pub secret: Option<ClusterSecret>,
}

impl PeerAuth {
    fn key(&self) -> &[u8] {
        self.secret.as_ref().map_or(&[], |s| &s.0)
    }
}

/// Why a peer connection failed or was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The socket failed, or the peer closed it.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The peer does not speak this protocol (it did not start with the
    /// magic bytes: a stranger, a probe, or a fencelog from before peer
    /// authentication).
    #[error("not a fencelog peer: its first bytes are {got:02x?}, not {MAGIC:02x?}")]
    NotAPeer {
        /// The bytes it sent where the magic belongs.
        got: [u8; 4],
    },
    /// The peer speaks another version of the protocol.
    #[error("peer protocol version {got} (this node speaks {PROTOCOL_VERSION})")]
    Version {
        /// The version it sent.
        got: u8,
    },
    /// One side has a cluster secret and the other none.
    #[error(
        "this node {} a cluster secret and the peer {} (--cluster-secret-file)",
        if *ours { "has" } else { "has no" },
        if *theirs { "has one" } else { "has none" }
    )]
    SecretMismatch {
        /// Whether this node has one.
        ours: bool,
        /// Whether the peer said it has one.
        theirs: bool,
    },
    /// The peer's proof does not match this node's secret: it does not
    /// know it (a stranger, or another cluster's secret file).
    #[error("the peer's proof does not match this node's cluster secret")]
    BadProof,
    /// The acceptor closed the connection after this node's proof instead
    /// of proving itself: it refused the proof (another cluster secret).
    #[error(
        "the peer closed the connection after this node's proof: it refused it \
         (does it have another --cluster-secret-file?)"
    )]
    ProofRefused,
    /// The node that answered is not the node dialed (an address that
    /// moved to another member, or a misconfigured member list).
    #[error("dialed node {dialed}, node {answered} answered")]
    WrongNode {
        /// The node this one meant to reach.
        dialed: NodeId,
        /// The node id in its hello.
        answered: NodeId,
    },
    /// The node reached is another incarnation than the one expected: its
    /// disk was replaced (or wiped) and the group has not re-added it.
    /// Refused on both ends: such a node neither votes nor accepts entries.
    #[error(
        "node {node} is incarnation {found:016x}, the membership admitted {expected:016x}: \
         its data directory was replaced and it must be re-added (CLUSTER ADDNODE / --cluster-join)"
    )]
    Incarnation {
        /// The node.
        node: NodeId,
        /// The incarnation the dialer's membership lists for it.
        expected: u64,
        /// The incarnation it has.
        found: u64,
    },
    /// A frame of another version.
    #[error("a frame of version {got} (this node speaks {PROTOCOL_VERSION})")]
    FrameVersion {
        /// The version byte it carried.
        got: u8,
    },
    /// A frame longer than [`MAX_FRAME`] (nothing of it was read).
    #[error("a frame of {len} bytes (at most {max})")]
    FrameTooLarge {
        /// The length it claimed.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A frame whose MAC does not match: forged, replayed, reordered or
    /// damaged.
    #[error(
        "frame {seq} of this connection fails its MAC (forged, replayed, reordered or damaged)"
    )]
    BadMac {
        /// Its sequence number in its direction (from 0).
        seq: u64,
    },
    /// A frame's body does not decode as a message.
    #[error("a frame of {len} bytes does not decode: {source}")]
    Decode {
        /// Its length.
        len: usize,
        /// Why.
        #[source]
        source: bincode::Error,
    },
    /// A message that does not encode (over the codec's bound).
    #[error("a message does not encode: {source}")]
    Encode {
        /// Why.
        #[source]
        source: bincode::Error,
    },
    /// A message too large to send in one frame.
    #[error("a message of {len} bytes (at most {max} in one frame)")]
    TooLargeToSend {
        /// Its encoded length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// No answer in time.
    #[error("{what} took over {ms} ms")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The time allowed.
        ms: u128,
    },
    /// A secret of the wrong length.
    #[error("a cluster secret of {len} bytes (1 to {max})")]
    SecretLength {
        /// Its length.
        len: usize,
        /// The longest allowed.
        max: usize,
    },
    /// The operating system's random generator failed.
    #[error("no random nonce: {0}")]
    Random(String),
}

impl PeerError {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> PeerError {
        move |source| PeerError::Io { what, source }
    }

    /// A short name for the reason, for logs and tests.
    pub fn reason(&self) -> &'static str {
        match self {
            PeerError::Io { .. } => "io",
            PeerError::NotAPeer { .. } => "not_a_peer",
            PeerError::Version { .. } => "version",
            PeerError::SecretMismatch { .. } => "secret_mismatch",
            PeerError::BadProof => "bad_proof",
            PeerError::ProofRefused => "proof_refused",
            PeerError::WrongNode { .. } => "wrong_node",
            PeerError::Incarnation { .. } => "incarnation",
            PeerError::FrameVersion { .. } => "frame_version",
            PeerError::FrameTooLarge { .. } => "frame_too_large",
            PeerError::BadMac { .. } => "bad_mac",
            PeerError::Decode { .. } => "decode",
            PeerError::Encode { .. } => "encode",
            PeerError::TooLargeToSend { .. } => "too_large_to_send",
            PeerError::Timeout { .. } => "timeout",
            PeerError::SecretLength { .. } => "secret_length",
            PeerError::Random(_) => "random",
        }
    }
}

/// HMAC-SHA256 keyed by `key` over the concatenation of `parts`.
fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it,
    // and would fail only on a key-length rule HMAC does not have.
    let mut mac = <HmacSha256 as hmac::digest::KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    for p in parts {
        mac.update(p);
    }
    mac
}

/// One side's opening message.
// { magic: b"FLRP" | version: u8 | secret: u8 (1 if it has one) | node: u64 LE
//   | incarnation: u64 LE | expected: u64 LE (the dialed node's, 0 if not known) | nonce: [u8; 32] }
#[derive(Clone, Copy)]
struct Hello {
    version: u8,
    secret: bool,
    node: NodeId,
    /// The sender's incarnation.
    incarnation: u64,
    /// The dialer: the incarnation it expects of the node dialed (0: no
    /// expectation, e.g. a probe or a member admitted before
    /// incarnations). The acceptor: 0.
    expected: u64,
    nonce: [u8; 32],
}

impl Hello {
    fn fresh(auth: &PeerAuth, expected: u64) -> Result<Hello, PeerError> {
        let mut nonce = [0u8; 32];
        getrandom::fill(&mut nonce).map_err(|e| PeerError::Random(e.to_string()))?;
        Ok(Hello {
            version: PROTOCOL_VERSION,
            secret: auth.secret.is_some(),
            node: auth.id,
            incarnation: auth.incarnation,
            expected,
            nonce,
        })
    }

    fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = self.version;
        b[5] = u8::from(self.secret);
        b[6..14].copy_from_slice(&self.node.to_le_bytes());
        b[14..22].copy_from_slice(&self.incarnation.to_le_bytes());
        b[22..30].copy_from_slice(&self.expected.to_le_bytes());
        b[30..].copy_from_slice(&self.nonce);
        b
    }

    /// Decodes and checks a peer's hello against this node's.
    fn decode(b: &[u8; HELLO_LEN], auth: &PeerAuth) -> Result<Hello, PeerError> {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&b[..4]);
        if magic != MAGIC {
            return Err(PeerError::NotAPeer { got: magic });
        }
        if b[4] != PROTOCOL_VERSION {
            return Err(PeerError::Version { got: b[4] });
        }
        let secret = match b[5] {
            0 => false,
            1 => true,
            // Neither "has" nor "has not": not this protocol.
            _ => return Err(PeerError::Version { got: b[4] }),
        };
        if secret != auth.secret.is_some() {
            return Err(PeerError::SecretMismatch {
                ours: auth.secret.is_some(),
                theirs: secret,
            });
        }
        let u = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&b[30..]);
        Ok(Hello {
            version: b[4],
            secret,
            node: u(6),
            incarnation: u(14),
            expected: u(22),
            nonce,
        })
    }
}

/// Which end of a connection this node is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Dialer,
    Acceptor,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Dialer => DIALER,
            Role::Acceptor => ACCEPTOR,
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Dialer => Role::Acceptor,
            Role::Acceptor => Role::Dialer,
        }
    }
}

/// Both hellos, the dialer's first: what every proof and key is bound to
/// (both versions, both ids, both nonces).
struct Transcript {
    dialer: [u8; HELLO_LEN],
    acceptor: [u8; HELLO_LEN],
}

impl Transcript {
    /// `role`'s proof that it knows the secret.
    // proof = HMAC-SHA256(secret, PROOF_DOMAIN | role | hello_dialer | hello_acceptor)
    fn proof(&self, key: &[u8], role: Role) -> HmacSha256 {
        hmac(
            key,
            &[PROOF_DOMAIN, role.label(), &self.dialer, &self.acceptor],
        )
    }

    /// The key of the frames `role` sends.
    // key = HMAC-SHA256(secret, KEY_DOMAIN | role | hello_dialer | hello_acceptor)
    fn frame_key(&self, key: &[u8], role: Role) -> FrameKey {
        let k = hmac(
            key,
            &[KEY_DOMAIN, role.label(), &self.dialer, &self.acceptor],
        )
        .finalize()
        .into_bytes();
        let mut key = [0u8; 32];
        key.copy_from_slice(&k);
        FrameKey { key, seq: 0 }
    }
}

/// The MAC key of one direction of a connection and the number of the
/// next frame in it.
struct FrameKey {
    key: [u8; 32],
    seq: u64,
}

impl FrameKey {
    /// The MAC of the next frame: its `header`, then its `body`.
    // mac = BLAKE3-keyed(frame_key, seq: u64 LE | version: u8 | len: u32 LE | body)
    //
    // Keyed BLAKE3 rather than HMAC-SHA256: every byte replicated is MACed
    // by the leader once per follower and checked by each follower, on
    // their Raft threads; with SHA-NI a 60 KiB entry took 34 µs per MAC,
    // with BLAKE3 11 µs (docs/CLUSTER.md, "Security").
    fn mac(&self, header: &[u8], body: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&self.seq.to_le_bytes());
        h.update(header);
        h.update(body);
        h.finalize()
    }
}

/// An authenticated connection's two directions.
struct Session {
    /// The peer's node id, from its hello.
    peer: NodeId,
    /// The peer's incarnation, from its hello.
    peer_incarnation: u64,
    /// The incarnation the peer expected of this node (0: none).
    expected_of_us: u64,
    send: FrameKey,
    recv: FrameKey,
}

async fn read_array<S: AsyncRead + Unpin, const N: usize>(
    s: &mut S,
    what: &'static str,
) -> Result<[u8; N], PeerError> {
    let mut b = [0u8; N];
    s.read_exact(&mut b).await.map_err(PeerError::io(what))?;
    Ok(b)
}

/// Reads a hello, its magic first: anything else that reaches the port
/// (an older fencelog's frame, a probe) is refused from its first four
/// bytes, without waiting for the rest.
async fn read_hello<S: AsyncRead + Unpin>(s: &mut S) -> Result<[u8; HELLO_LEN], PeerError> {
    let magic: [u8; 4] = read_array(s, "reading the peer's hello").await?;
    if magic != MAGIC {
        return Err(PeerError::NotAPeer { got: magic });
    }
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(&magic);
    s.read_exact(&mut b[4..])
        .await
        .map_err(PeerError::io("reading the peer's hello"))?;
    Ok(b)
}

/// The handshake, from either end: hellos, then the dialer's proof, then
/// (only once the dialer proved itself) the acceptor's. `dialed` is the
/// node the dialer means to reach and the incarnation it expects of it (0:
/// any). Reads exactly [`HELLO_LEN`] and [`PROOF_LEN`] bytes, nothing of a
/// length the peer chooses.
///
/// Incarnations: the dialer refuses an acceptor of another incarnation
/// than it expects, and the acceptor refuses a dialer that expects another
/// incarnation than its own (before it says anything back): a replaced
/// disk answers no peer that still lists the old one, so it neither votes
/// nor accepts entries until re-added.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    role: Role,
    auth: &PeerAuth,
    dialed: Option<(NodeId, u64)>,
) -> Result<Session, PeerError> {
    let ours = Hello::fresh(auth, dialed.map_or(0, |(_, inc)| inc))?;
    let (theirs, transcript) = match role {
        Role::Dialer => {
            s.write_all(&ours.encode())
                .await
                .map_err(PeerError::io("sending the hello"))?;
            let b = read_hello(s).await?;
            let theirs = Hello::decode(&b, auth)?;
            if let Some((dialed, expected)) = dialed {
                if theirs.node != dialed {
                    return Err(PeerError::WrongNode {
                        dialed,
                        answered: theirs.node,
                    });
                }
                if expected != 0 && theirs.incarnation != expected {
                    return Err(PeerError::Incarnation {
                        node: dialed,
                        expected,
                        found: theirs.incarnation,
                    });
                }
            }
            let t = Transcript {
                dialer: ours.encode(),
                acceptor: b,
            };
            (theirs, t)
        }
        Role::Acceptor => {
            // A stranger gets nothing before it sends a well-formed hello.
            let b = read_hello(s).await?;
            let theirs = Hello::decode(&b, auth)?;
            if theirs.expected != 0 && theirs.expected != auth.incarnation {
                return Err(PeerError::Incarnation {
                    node: auth.id,
                    expected: theirs.expected,
                    found: auth.incarnation,
                });
            }
            s.write_all(&ours.encode())
                .await
                .map_err(PeerError::io("sending the hello"))?;
            let t = Transcript {
                dialer: b,
                acceptor: ours.encode(),
            };
            (theirs, t)
        }
    };
    let key = auth.key();
    let proof = transcript.proof(key, role).finalize().into_bytes();
    let check_proof = |b: [u8; PROOF_LEN]| {
        // verify_slice compares in constant time.
        transcript
            .proof(key, role.other())
            .verify_slice(&b)
            .map_err(|_| PeerError::BadProof)
    };
    match role {
        Role::Dialer => {
            s.write_all(&proof)
                .await
                .map_err(PeerError::io("sending the proof"))?;
            let theirs = match read_array(s, "reading the peer's proof").await {
                // An acceptor closes without a word when it refuses a
                // proof: most likely this node's secret is not its.
                Err(PeerError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::UnexpectedEof =>
                {
                    return Err(PeerError::ProofRefused);
                }
                r => r?,
            };
            check_proof(theirs)?;
        }
        Role::Acceptor => {
            // The acceptor proves nothing to a peer that has not proved
            // itself: a stranger learns no MAC of this node's.
            check_proof(read_array(s, "reading the peer's proof").await?)?;
            s.write_all(&proof)
                .await
                .map_err(PeerError::io("sending the proof"))?;
        }
    }
    Ok(Session {
        peer: theirs.node,
        peer_incarnation: theirs.incarnation,
        expected_of_us: theirs.expected,
        send: transcript.frame_key(key, role),
        recv: transcript.frame_key(key, role.other()),
    })
}

/// bincode with a bound: a frame never decodes to more than its length.
fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
}

/// Encodes `msg` as the next frame of `key`'s direction, into one buffer
/// of the frame's size (the body is encoded in place, not copied after).
// { version: u8 | len: u32 LE | body: [u8; len] | mac: [u8; 32] }
fn seal<T: Serialize>(key: &mut FrameKey, msg: &T) -> Result<Vec<u8>, PeerError> {
    use bincode::Options;
    let size = codec()
        .serialized_size(msg)
        .map_err(|source| PeerError::Encode { source })?;
    let too_large = || PeerError::TooLargeToSend {
        len: size,
        max: MAX_FRAME,
    };
    let len = usize::try_from(size)
        .ok()
        .filter(|&len| len <= MAX_FRAME)
        .ok_or_else(too_large)?;
    let len32 = u32::try_from(len).map_err(|_| too_large())?;
    let mut buf = Vec::with_capacity(FRAME_HEADER_LEN + len + MAC_LEN);
    buf.push(PROTOCOL_VERSION);
    buf.extend_from_slice(&len32.to_le_bytes());
    codec()
        .serialize_into(&mut buf, msg)
        .map_err(|source| PeerError::Encode { source })?;
    // The measure and the encoding are of one value; a difference would
    // make the header lie about the body, which the peer refuses.
    if buf.len() != FRAME_HEADER_LEN + len {
        return Err(PeerError::Encode {
            source: Box::new(bincode::ErrorKind::Custom(format!(
                "a message measured {len} bytes and encoded to {}",
                buf.len() - FRAME_HEADER_LEN
            ))),
        });
    }
    let (header, body) = buf.split_at(FRAME_HEADER_LEN);
    let mac = key.mac(header, body);
    key.seq += 1;
    buf.extend_from_slice(mac.as_bytes());
    Ok(buf)
}

async fn write_frame<S: AsyncWrite + Unpin, T: Serialize>(
    s: &mut S,
    key: &mut FrameKey,
    msg: &T,
) -> Result<(), PeerError> {
    let buf = seal(key, msg)?;
    s.write_all(&buf)
        .await
        .map_err(PeerError::io("sending a frame"))
}

/// The first bytes of a frame's buffer; it grows from there as bytes
/// arrive (a peer that claims 256 MiB and sends 10 bytes costs 1 MiB).
/// An entry's frame at pipeline 16 (about 100 KiB) fits at once: no
/// buffer grown, and copied, on the way.
const FIRST_READ: usize = 1 << 20;

/// Reads the next frame of `key`'s direction: its length checked before
/// anything is allocated, its body and MAC read as they arrive (as few
/// reads as the socket allows), its MAC checked before it is decoded.
/// What it decodes to may hold slices of the frame (`slices.rs`): an
/// entry's commands are not copied out of it.
async fn read_frame<S: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    s: &mut S,
    key: &mut FrameKey,
) -> Result<T, PeerError> {
    let header: [u8; FRAME_HEADER_LEN] = read_array(s, "reading a frame header").await?;
    if header[0] != PROTOCOL_VERSION {
        return Err(PeerError::FrameVersion { got: header[0] });
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&header[1..]);
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(PeerError::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME,
        });
    }
    // The body and its MAC, into one buffer.
    let want = len + MAC_LEN;
    let mut buf = Vec::with_capacity(want.min(FIRST_READ));
    while buf.len() < want {
        if buf.len() == buf.capacity() {
            // Doubled, never past the frame: what arrived pays for what
            // is asked next, and the entries that keep the buffer keep no
            // room it did not need.
            buf.reserve_exact((want - buf.len()).min(buf.capacity()));
        }
        let room = (want - buf.len()) as u64;
        let got = (&mut *s)
            .take(room)
            .read_buf(&mut buf)
            .await
            .map_err(PeerError::io("reading a frame body"))?;
        if got == 0 {
            let body = buf.len().min(len);
            return Err(PeerError::Io {
                what: "reading a frame body",
                source: std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the peer closed after {body} of {len} bytes of a frame and {} of its {MAC_LEN}-byte MAC",
                        buf.len() - body
                    ),
                ),
            });
        }
    }
    let (body, mac) = buf.split_at(len);
    // `blake3::Hash`'s comparison takes constant time.
    if key.mac(&header, body) != *mac {
        return Err(PeerError::BadMac { seq: key.seq });
    }
    key.seq += 1;
    buf.truncate(len);
    let body = Bytes::from(buf);
    use bincode::Options;
    crate::slices::decode_from(&body, |b| codec().deserialize(b))
        .map_err(|source| PeerError::Decode { len, source })
}

// Rpc: bincode enum { variant: u32 LE | the request }
#[derive(Serialize, Deserialize)]
enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// Would the peer vote for the sender (see `election.rs`)?
    PreVote(crate::election::PreVoteRequest),
}

// RpcReply: bincode enum { variant: u32 LE | Result of the answer }
#[derive(Serialize, Deserialize)]
enum RpcReply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    PreVote(bool),
}

/// A sender keeps its batches under this (a single entry is at most 64
/// MiB, so a frame is always under [`MAX_FRAME`]).
const SEND_FRAME: u64 = 32 << 20;

/// Cuts `rpc` to the entries that fit in [`SEND_FRAME`], with the last
/// entry sent if some were left out.
fn split(
    mut rpc: AppendEntriesRequest<TypeConfig>,
) -> (
    AppendEntriesRequest<TypeConfig>,
    Option<openraft::LogId<NodeId>>,
) {
    use bincode::Options;
    if rpc.entries.len() <= 1 || codec().serialized_size(&rpc).is_ok_and(|n| n <= SEND_FRAME) {
        return (rpc, None);
    }
    let mut total = 0u64;
    let mut keep = 0;
    for e in &rpc.entries {
        total += codec().serialized_size(e).unwrap_or(SEND_FRAME);
        if keep > 0 && total > SEND_FRAME {
            break;
        }
        keep += 1;
    }
    if keep == rpc.entries.len() {
        return (rpc, None);
    }
    rpc.entries.truncate(keep);
    let last = rpc.entries.last().map(|e| e.log_id);
    (rpc, last)
}

/// Warnings about peers, at most [`WARN_BURST`] a second: a stranger that
/// reconnects in a loop must not fill the log. The ones held back are
/// counted in the next one written.
#[derive(Default)]
struct WarnLimit {
    state: parking_lot::Mutex<(Option<Instant>, u32, u64)>,
}

const WARN_BURST: u32 = 10;

impl WarnLimit {
    /// `Some(held back since the last one written)` if this one may be
    /// written.
    fn admit(&self) -> Option<u64> {
        let mut st = self.state.lock();
        let now = Instant::now();
        if st
            .0
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            st.0 = Some(now);
            st.1 = 0;
        }
        if st.1 < WARN_BURST {
            st.1 += 1;
            Some(std::mem::take(&mut st.2))
        } else {
            st.2 += 1;
            None
        }
    }
}

fn warn_auth_failed(limit: &WarnLimit, peer: &str, role: Role, e: &PeerError) {
    if let Some(suppressed) = limit.admit() {
        tracing::warn!(
            event = "peer_auth_failed",
            peer = %peer,
            side = if role == Role::Dialer { "dialer" } else { "acceptor" },
            reason = e.reason(),
            error = %e,
            suppressed,
            "a peer connection failed its handshake and was closed"
        );
    }
}

/// A live, authenticated connection to one target.
struct Conn {
    /// The address it was dialed at (a member whose address changed is
    /// dialed again).
    addr: String,
    /// The incarnation it was dialed expecting (a member re-added with a
    /// new one is dialed again).
    incarnation: u64,
    stream: TcpStream,
    session: Session,
}

impl Conn {
    async fn call(&mut self, rpc: &Rpc) -> Result<RpcReply, PeerError> {
        write_frame(&mut self.stream, &mut self.session.send, rpc).await?;
        read_frame(&mut self.stream, &mut self.session.recv).await
    }
}

/// One target's connection slot, shared by every [`Client`] for it.
type Slot = Arc<tokio::sync::Mutex<Option<Conn>>>;

/// Makes a client per target node; every client for a target shares one
/// pooled connection, so openraft's client per heartbeat or ReadIndex
/// round costs no new TCP connection.
#[derive(Clone)]
pub struct Network {
    /// The address this node's connections come from: the one it listens
    /// on for peers, so that a peer (or a firewall) tells nodes apart by
    /// address even when they share a host (127.0.0.x on one machine).
    source: Option<std::net::IpAddr>,
    auth: PeerAuth,
    pool: Arc<parking_lot::Mutex<HashMap<NodeId, Slot>>>,
    warn: Arc<WarnLimit>,
    /// Instead of TCP, if set (deterministic simulation).
    transport: Option<Arc<dyn Transport>>,
}

impl Network {
    /// The network of node `auth.id`, dialing from `source` if given.
    pub fn new(auth: PeerAuth, source: Option<std::net::IpAddr>) -> Network {
        Network {
            source,
            auth,
            pool: Default::default(),
            warn: Default::default(),
            transport: None,
        }
    }

    /// The network of node `auth.id` over `transport` instead of TCP.
    pub fn over(auth: PeerAuth, transport: Arc<dyn Transport>) -> Network {
        Network {
            transport: Some(transport),
            ..Network::new(auth, None)
        }
    }

    /// Who this node is to its peers (for [`serve`]).
    pub fn auth(&self) -> PeerAuth {
        self.auth.clone()
    }

    fn slot(&self, target: NodeId) -> Slot {
        self.pool.lock().entry(target).or_default().clone()
    }

    /// Asks `target` whether it would vote for this node (a refusal, or no
    /// answer within `timeout`, is a no).
    pub(crate) async fn pre_vote(
        &self,
        target: NodeId,
        member: &Member,
        req: &crate::election::PreVoteRequest,
        timeout: Duration,
    ) -> Result<bool, PeerError> {
        let mut client = Client {
            target,
            addr: member.raft_addr.clone(),
            incarnation: member.incarnation,
            slot: self.slot(target),
            network: self.clone(),
        };
        match client.call(&Rpc::PreVote(req.clone()), timeout).await? {
            RpcReply::PreVote(granted) => Ok(granted),
            _ => Ok(false),
        }
    }

    /// Dials node `target` at `addr` expecting no particular incarnation,
    /// authenticates, and answers the incarnation it has (the connection
    /// is then closed): how a group learns the incarnation it admits
    /// (forming, `CLUSTER ADDNODE`).
    pub async fn probe(
        &self,
        target: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<u64, PeerError> {
        if let Some(t) = &self.transport {
            let probe = t.probe(self.auth.id, target);
            return tokio::time::timeout(timeout, probe)
                .await
                .unwrap_or_else(|_| {
                    Err(PeerError::Timeout {
                        what: format!("a probe of node {target}"),
                        ms: timeout.as_millis(),
                    })
                });
        }
        let work = async {
            let mut stream = connect(addr, self.source)
                .await
                .map_err(PeerError::io("connecting"))?;
            let session =
                handshake(&mut stream, Role::Dialer, &self.auth, Some((target, 0))).await?;
            Ok(session.peer_incarnation)
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(PeerError::Timeout {
                    what: format!("a probe of node {target} at {addr}"),
                    ms: timeout.as_millis(),
                })
            })
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Client {
        Client {
            target,
            addr: node.raft_addr.clone(),
            incarnation: node.incarnation,
            slot: self.slot(target),
            network: self.clone(),
        }
    }
}

/// The way to one target, over its pooled connection.
pub struct Client {
    target: NodeId,
    addr: String,
    /// The incarnation the membership lists for the target.
    incarnation: u64,
    slot: Slot,
    network: Network,
}

async fn connect(addr: &str, source: Option<std::net::IpAddr>) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr).await;
    };
    let mut last = None;
    for target in tokio::net::lookup_host(addr).await? {
        let socket = match target {
            SocketAddr::V4(_) if source.is_ipv4() => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) if source.is_ipv6() => tokio::net::TcpSocket::new_v6()?,
            _ => {
                last = Some(TcpStream::connect(target).await);
                continue;
            }
        };
        socket.bind(SocketAddr::new(source, 0))?;
        match socket.connect(target).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(Err(e)),
        }
    }
    last.unwrap_or_else(|| {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{addr} resolves to no address"),
        ))
    })
}

impl Client {
    /// Dials the target and authenticates.
    async fn dial(&self) -> Result<Conn, PeerError> {
        let mut stream = connect(&self.addr, self.network.source)
            .await
            .map_err(PeerError::io("connecting"))?;
        stream
            .set_nodelay(true)
            .map_err(PeerError::io("setting TCP_NODELAY"))?;
        match handshake(
            &mut stream,
            Role::Dialer,
            &self.network.auth,
            Some((self.target, self.incarnation)),
        )
        .await
        {
            Ok(session) => Ok(Conn {
                addr: self.addr.clone(),
                incarnation: self.incarnation,
                stream,
                session,
            }),
            Err(e) => {
                if !matches!(e, PeerError::Io { .. }) {
                    warn_auth_failed(&self.network.warn, &self.addr, Role::Dialer, &e);
                }
                Err(e)
            }
        }
    }

    /// Sends `rpc` over the pooled connection (dialing it if there is
    /// none) and waits for its answer, all within `timeout`.
    async fn call(&mut self, rpc: &Rpc, timeout: Duration) -> Result<RpcReply, PeerError> {
        if let Some(t) = &self.network.transport {
            let req = PeerRequest::encode(rpc)?;
            let call = t.call(self.network.auth.id, self.target, self.incarnation, req);
            return match tokio::time::timeout(timeout, call).await {
                Ok(reply) => reply?.decode(),
                Err(_) => Err(PeerError::Timeout {
                    what: format!("an answer from node {}", self.target),
                    ms: timeout.as_millis(),
                }),
            };
        }
        let work = async {
            let mut slot = self.slot.lock().await;
            // Taken out while in use: if this is cancelled (its timeout) or
            // fails halfway through a frame, the connection is dropped with
            // it, never left in the pool holding half a frame.
            let (mut conn, reused) = match slot.take() {
                Some(c) if c.addr == self.addr && c.incarnation == self.incarnation => (c, true),
                _ => (self.dial().await?, false),
            };
            let reply = match conn.call(rpc).await {
                Ok(reply) => reply,
                // A pooled connection the peer closed while it sat idle
                // (the peer restarted): dial once more rather than report
                // a live peer unreachable. Raft's requests bear a repeat.
                Err(PeerError::Io { .. }) if reused => {
                    conn = self.dial().await?;
                    conn.call(rpc).await?
                }
                Err(e) => return Err(e),
            };
            *slot = Some(conn);
            Ok(reply)
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(PeerError::Timeout {
                    what: format!("an answer from node {} at {}", self.target, self.addr),
                    ms: timeout.as_millis(),
                })
            })
    }
}

fn unreachable<E: std::error::Error>(e: PeerError) -> RPCError<NodeId, Member, E> {
    if matches!(e, PeerError::Timeout { .. }) {
        RPCError::Network(NetworkError::new(&e))
    } else {
        RPCError::Unreachable(Unreachable::new(&e))
    }
}

fn protocol<E: std::error::Error>() -> RPCError<NodeId, Member, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(
        "a reply that does not match its request",
    )))
}

impl RaftNetwork<TypeConfig> for Client {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        // A batch over SEND_FRAME goes as its longest prefix that fits
        // (at least one entry), answered as a partial success: Raft sends
        // the rest next.
        let (rpc, cut) = split(rpc);
        match self.call(&Rpc::Append(rpc), option.hard_ttl()).await {
            Ok(RpcReply::Append(Ok(AppendEntriesResponse::Success))) if cut.is_some() => {
                Ok(AppendEntriesResponse::PartialSuccess(cut))
            }
            Ok(RpcReply::Append(Ok(r))) => Ok(r),
            Ok(RpcReply::Append(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(protocol()),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self.call(&Rpc::Snapshot(rpc), option.hard_ttl()).await {
            Ok(RpcReply::Snapshot(Ok(r))) => Ok(r),
            Ok(RpcReply::Snapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(protocol()),
            Err(e) => Err(unreachable(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        match self.call(&Rpc::Vote(rpc), option.hard_ttl()).await {
            Ok(RpcReply::Vote(Ok(r))) => Ok(r),
            Ok(RpcReply::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(protocol()),
            Err(e) => Err(unreachable(e)),
        }
    }
}

/// Serves Raft's messages from peers on `listener` until the task is
/// dropped or aborted (which ends every peer connection with it): at most
/// [`MAX_PEER_CONNECTIONS`] at once, each authenticated within
/// [`HANDSHAKE_TIMEOUT`] before any frame of it is read.
pub(crate) async fn serve(
    listener: TcpListener,
    raft: Raft,
    auth: PeerAuth,
    election: Arc<crate::election::Election>,
    log: crate::log_store::LogStore,
) {
    let max_connections = MAX_PEER_CONNECTIONS;
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let warn = Arc::new(WarnLimit::default());
    let mut peers = tokio::task::JoinSet::new();
    loop {
        let (mut stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a peer failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Reap finished connections so the set stays small.
            Some(_) = peers.join_next(), if !peers.is_empty() => continue,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if let Some(suppressed) = warn.admit() {
                tracing::warn!(
                    event = "peer_connection_refused",
                    peer = %peer,
                    max_connections,
                    suppressed,
                    "too many peer connections: this one is closed"
                );
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let raft = raft.clone();
        let auth = auth.clone();
        let warn = warn.clone();
        let (election, log) = (election.clone(), log.clone());
        peers.spawn(async move {
            let _permit = permit;
            let session = match tokio::time::timeout(
                HANDSHAKE_TIMEOUT,
                handshake(&mut stream, Role::Acceptor, &auth, None),
            )
            .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    warn_auth_failed(&warn, &peer.to_string(), Role::Acceptor, &e);
                    return;
                }
                Err(_) => {
                    let e = PeerError::Timeout {
                        what: "the handshake".into(),
                        ms: HANDSHAKE_TIMEOUT.as_millis(),
                    };
                    warn_auth_failed(&warn, &peer.to_string(), Role::Acceptor, &e);
                    return;
                }
            };
            let Session {
                peer: node,
                peer_incarnation,
                expected_of_us,
                mut send,
                mut recv,
            } = session;
            tracing::debug!(%peer, node, incarnation = format!("{peer_incarnation:016x}"), "a peer connected");
            // A dialer that expects no incarnation of this node (a probe,
            // or a membership that admitted it before incarnations) gets
            // Raft messages answered only if this node knows itself
            // admitted (its own membership lists it, with no incarnation or
            // with its own): a fresh (or replaced) disk listed by a
            // membership from before incarnations must take nothing from
            // it either. A probe just closes here.
            if expected_of_us == 0 && !admitted(&raft, &auth).await {
                return;
            }
            loop {
                let rpc: Rpc = match read_frame(&mut stream, &mut recv).await {
                    Ok(r) => r,
                    Err(PeerError::Io { .. }) => return,
                    Err(e) => {
                        // An authenticated peer sent a frame that fails:
                        // damaged, replayed, or a bug. The connection goes;
                        // the peer dials again.
                        tracing::warn!(event = "peer_frame_refused", %peer, node, reason = e.reason(), error = %e, "a peer's frame was refused; the connection is closed");
                        return;
                    }
                };
                let reply = answer(&raft, &election, &log, rpc).await;
                if let Err(e) = write_frame(&mut stream, &mut send, &reply).await {
                    tracing::debug!(%peer, error = %e, "a peer went away");
                    return;
                }
            }
        });
    }
}

/// Whether a dialer that expects no particular incarnation of this node
/// is answered: only if this node knows itself admitted (its own
/// membership lists it, with no incarnation or with its own).
async fn admitted(raft: &Raft, auth: &PeerAuth) -> bool {
    let (me, mine) = (auth.id, auth.incarnation);
    raft.with_raft_state(move |st| {
        st.membership_state
            .effective()
            .membership()
            .get_node(&me)
            .is_some_and(|m| m.incarnation == 0 || m.incarnation == mine)
    })
    .await
    .unwrap_or(false)
}

/// This node's answer to one authenticated peer message.
async fn answer(
    raft: &Raft,
    election: &crate::election::Election,
    log: &crate::log_store::LogStore,
    rpc: Rpc,
) -> RpcReply {
    match rpc {
        Rpc::Append(r) => {
            let answer = raft.append_entries(r).await;
            // A leader this node follows (not one it refused for an older
            // term) is alive.
            if answer
                .as_ref()
                .is_ok_and(|a| !matches!(a, AppendEntriesResponse::HigherVote(_)))
            {
                election.heard_from_leader();
            }
            RpcReply::Append(answer)
        }
        Rpc::Vote(r) => RpcReply::Vote(raft.vote(r).await),
        Rpc::Snapshot(r) => {
            let answer = raft.install_snapshot(r).await;
            if answer.is_ok() {
                election.heard_from_leader();
            }
            RpcReply::Snapshot(answer)
        }
        Rpc::PreVote(r) => RpcReply::PreVote(election.grant(raft, log, &r)),
    }
}

/// A peer message as a [`Transport`] carries it: the bytes of one frame's
/// body (what the TCP protocol would send, without framing and MAC).
pub struct PeerRequest {
    body: Vec<u8>,
    kind: &'static str,
}

impl PeerRequest {
    fn encode(rpc: &Rpc) -> Result<PeerRequest, PeerError> {
        use bincode::Options;
        let kind = match rpc {
            Rpc::Append(r) if r.entries.is_empty() => "heartbeat",
            Rpc::Append(_) => "append",
            Rpc::Vote(_) => "vote",
            Rpc::Snapshot(_) => "snapshot",
            Rpc::PreVote(_) => "prevote",
        };
        let body = codec()
            .serialize(rpc)
            .map_err(|source| PeerError::Encode { source })?;
        Ok(PeerRequest { body, kind })
    }

    /// What it asks: `heartbeat`, `append`, `vote`, `snapshot` or
    /// `prevote`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Its encoded length.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// Whether it is empty (never: a message has a variant).
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// A peer's answer to a [`PeerRequest`], encoded.
pub struct PeerReply {
    body: Vec<u8>,
}

impl PeerReply {
    fn decode(self) -> Result<RpcReply, PeerError> {
        use bincode::Options;
        let len = self.body.len();
        codec()
            .deserialize(&self.body)
            .map_err(|source| PeerError::Decode { len, source })
    }
}

/// A future a [`Transport`] answers.
pub type TransportFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, PeerError>> + Send>>;

/// How a node reaches its peers instead of TCP: the hook of the
/// deterministic simulation (`fencelog-sim`), which delivers each message
/// to the target's [`PeerEndpoint`] (or drops, delays, reorders it). Peer
/// authentication is TCP's; a transport is trusted.
pub trait Transport: Send + Sync + 'static {
    /// Delivers `req` from node `from` to node `to`, which the sender's
    /// membership lists as incarnation `expected` (0: any), and answers
    /// the reply (an error: unreachable).
    fn call(
        &self,
        from: NodeId,
        to: NodeId,
        expected: u64,
        req: PeerRequest,
    ) -> TransportFuture<PeerReply>;

    /// The incarnation node `to` has now (see [`Network::probe`]).
    fn probe(&self, from: NodeId, to: NodeId) -> TransportFuture<u64>;
}

/// The receiving end of a node for a [`Transport`]: what its TCP listener
/// does with each authenticated message, the same checks included.
#[derive(Clone)]
pub struct PeerEndpoint {
    pub(crate) raft: Raft,
    pub(crate) auth: PeerAuth,
    pub(crate) election: Arc<crate::election::Election>,
    pub(crate) log: crate::log_store::LogStore,
}

impl PeerEndpoint {
    /// This node's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.auth.incarnation
    }

    /// Answers `req` from a dialer that expects incarnation
    /// `expected_of_us` of this node (0: any), as the TCP listener would:
    /// refused if this node is another incarnation; with 0, unanswered
    /// (an error) unless this node knows itself admitted.
    pub async fn answer(
        &self,
        expected_of_us: u64,
        req: PeerRequest,
    ) -> Result<PeerReply, PeerError> {
        use bincode::Options;
        if expected_of_us != 0 && expected_of_us != self.auth.incarnation {
            return Err(PeerError::Incarnation {
                node: self.auth.id,
                expected: expected_of_us,
                found: self.auth.incarnation,
            });
        }
        if expected_of_us == 0 && !admitted(&self.raft, &self.auth).await {
            return Err(PeerError::io("reading a frame")(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "not admitted: the connection is closed",
            )));
        }
        let len = req.body.len();
        let rpc: Rpc = codec()
            .deserialize(&req.body)
            .map_err(|source| PeerError::Decode { len, source })?;
        let reply = answer(&self.raft, &self.election, &self.log, rpc).await;
        let body = codec()
            .serialize(&reply)
            .map_err(|source| PeerError::Encode { source })?;
        Ok(PeerReply { body })
    }
}

/// Entry points for the `peer_frame` fuzz target (`crate::fuzzing`): the
/// handshake and the frame decoder over a stream of arbitrary bytes.
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzz {
    use super::*;

    /// A frame key both sides of the fuzz target know, so frames can be
    /// given a valid MAC and reach the body decoder.
    const KEY: [u8; 32] = [7; 32];

    fn auth(secret: bool) -> PeerAuth {
        PeerAuth {
            id: 1,
            incarnation: 0x1111,
            secret: secret.then(|| ClusterSecret(Arc::from(&b"fuzz secret"[..]))),
        }
    }

    /// `data` with a valid MAC after each frame it holds (a frame is a
    /// 5-byte header and the body its length says; whatever does not fit
    /// is left as it is).
    pub fn with_macs(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len() + 64);
        let mut key = FrameKey { key: KEY, seq: 0 };
        let mut rest = data;
        while rest.len() >= FRAME_HEADER_LEN {
            let mut header = [0u8; FRAME_HEADER_LEN];
            header.copy_from_slice(&rest[..FRAME_HEADER_LEN]);
            let mut len = [0u8; 4];
            len.copy_from_slice(&header[1..]);
            let len = u32::from_le_bytes(len) as usize;
            let Some(body) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
                break;
            };
            out.extend_from_slice(&header);
            out.extend_from_slice(body);
            out.extend_from_slice(key.mac(&header, body).as_bytes());
            key.seq += 1;
            rest = &rest[FRAME_HEADER_LEN + len..];
        }
        out.extend_from_slice(rest);
        out
    }

    /// A frame of `msg` with the fuzz key (for seeds).
    pub fn frame_of_request(seq: u64, rpc_append: AppendEntriesRequest<TypeConfig>) -> Vec<u8> {
        let mut key = FrameKey { key: KEY, seq };
        seal(&mut key, &Rpc::Append(rpc_append)).unwrap_or_default()
    }

    /// Reads frames of `T` from `bytes` until one fails; answers how many
    /// decoded. A frame that decodes re-encodes within its length.
    async fn frames<T: Serialize + for<'de> Deserialize<'de>>(bytes: &[u8]) -> usize {
        let mut key = FrameKey { key: KEY, seq: 0 };
        let mut r = bytes;
        let mut n = 0;
        while let Ok(msg) = read_frame::<_, T>(&mut r, &mut key).await {
            use bincode::Options;
            let len = codec().serialized_size(&msg).unwrap_or(u64::MAX);
            assert!(
                len <= MAX_FRAME as u64,
                "a decoded frame re-encodes over MAX_FRAME"
            );
            n += 1;
        }
        n
    }

    /// Feeds `data` to both ends of a handshake (with or without a
    /// secret), then as frames (as they come, and with valid MACs) to the
    /// request and the reply decoders. Nothing may panic; no handshake
    /// may succeed (the nonces are fresh, the bytes are not).
    pub async fn peer_stream(data: &[u8], secret: bool) {
        let auth = auth(secret);
        for (role, dialed) in [(Role::Acceptor, None), (Role::Dialer, Some((2, 0x2222)))] {
            let mut s = tokio::io::join(data, tokio::io::sink());
            let r = handshake(&mut s, role, &auth, dialed).await;
            assert!(r.is_err(), "a handshake of fixed bytes succeeded");
        }
        let macs = with_macs(data);
        for bytes in [data, &macs[..]] {
            frames::<Rpc>(bytes).await;
            frames::<RpcReply>(bytes).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Request;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    fn entry(index: u64, bytes: usize) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request::new(
                1,
                vec![fencelog::Command::Write(fencelog::TxOp::Append {
                    stream: bytes::Bytes::from_static(b"s"),
                    token: fencelog::Token::new(1).unwrap(),
                    payloads: vec![bytes::Bytes::from(vec![7u8; bytes])].into(),
                })],
            )),
        }
    }

    fn request(entries: Vec<Entry<TypeConfig>>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries,
        }
    }

    #[test]
    fn a_batch_over_the_frame_goes_as_a_prefix_and_a_lone_large_entry_whole() {
        let small = request((1..=10).map(|i| entry(i, 1000)).collect());
        let (rpc, cut) = split(small);
        assert_eq!((rpc.entries.len(), cut), (10, None));

        let big = request((1..=10).map(|i| entry(i, 12 << 20)).collect());
        let (rpc, cut) = split(big);
        assert_eq!(rpc.entries.len(), 2, "two 12 MiB entries fit in 32 MiB");
        assert_eq!(cut.map(|l| l.index), Some(2));
        assert!(codec_size(&rpc) <= SEND_FRAME);

        let lone = request(vec![entry(1, 40 << 20), entry(2, 10)]);
        let (rpc, cut) = split(lone);
        assert_eq!(rpc.entries.len(), 1, "one entry always goes");
        assert_eq!(cut.map(|l| l.index), Some(1));
        assert!(codec_size(&rpc) <= MAX_FRAME as u64);
    }

    fn codec_size(rpc: &AppendEntriesRequest<TypeConfig>) -> u64 {
        use bincode::Options;
        codec().serialized_size(rpc).unwrap()
    }

    fn auth(id: NodeId, secret: Option<&[u8]>) -> PeerAuth {
        PeerAuth {
            id,
            incarnation: 0x1000 + id,
            secret: secret.map(|s| ClusterSecret::new(s.to_vec()).unwrap()),
        }
    }

    /// Both ends of a handshake over an in-memory pipe.
    async fn pair(
        dialer: PeerAuth,
        acceptor: PeerAuth,
        dialed: NodeId,
    ) -> (
        Result<(Session, tokio::io::DuplexStream), PeerError>,
        Result<(Session, tokio::io::DuplexStream), PeerError>,
    ) {
        // The dialer expects the acceptor's incarnation (its membership is
        // current).
        let expected = acceptor.incarnation;
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let d = async move {
            let r = handshake(&mut a, Role::Dialer, &dialer, Some((dialed, expected))).await;
            // Closing the pipe on failure lets the other end finish.
            r.map(|s| (s, a))
        };
        let c = async move {
            let r = handshake(&mut b, Role::Acceptor, &acceptor, None).await;
            r.map(|s| (s, b))
        };
        tokio::join!(d, c)
    }

    #[tokio::test]
    async fn peers_with_the_same_secret_authenticate_and_frames_pass_both_ways() {
        let (d, a) = pair(auth(1, Some(b"s3cret")), auth(2, Some(b"s3cret")), 2).await;
        let (mut d, mut da) = d.unwrap();
        let (mut a, mut ab) = a.unwrap();
        assert_eq!((d.peer, a.peer), (2, 1));
        for i in 0..3u64 {
            write_frame(&mut da, &mut d.send, &i).await.unwrap();
            let got: u64 = read_frame(&mut ab, &mut a.recv).await.unwrap();
            assert_eq!(got, i);
            write_frame(&mut ab, &mut a.send, &(i * 10)).await.unwrap();
            let got: u64 = read_frame(&mut da, &mut d.recv).await.unwrap();
            assert_eq!(got, i * 10);
        }
        // Without secrets (loopback only): the same protocol, unkeyed.
        let (d, a) = pair(auth(1, None), auth(2, None), 2).await;
        assert!(d.is_ok() && a.is_ok());
    }

    #[tokio::test]
    async fn another_secret_or_none_fails_the_handshake_on_both_ends() {
        let (d, a) = pair(auth(1, Some(b"one")), auth(2, Some(b"two")), 2).await;
        // The acceptor checks the dialer's proof first, and proves nothing.
        assert!(matches!(a.err(), Some(PeerError::BadProof)));
        assert!(matches!(d.err(), Some(PeerError::ProofRefused)));
        let (d, a) = pair(auth(1, None), auth(2, Some(b"two")), 2).await;
        assert!(matches!(
            a.err(),
            Some(PeerError::SecretMismatch {
                ours: true,
                theirs: false
            })
        ));
        assert!(d.is_err());
        let (d, _) = pair(auth(1, Some(b"k")), auth(3, Some(b"k")), 2).await;
        assert!(matches!(
            d.err(),
            Some(PeerError::WrongNode {
                dialed: 2,
                answered: 3
            })
        ));
    }

    /// A node whose disk was replaced (another incarnation under the same
    /// id) is refused by a dialer that expects the old one, and refuses it
    /// itself before saying anything: it neither votes nor takes entries.
    #[tokio::test]
    async fn another_incarnation_than_the_one_expected_is_refused_on_both_ends() {
        let mut replaced = auth(2, Some(b"k"));
        replaced.incarnation = 0x9999;
        let dialer = auth(1, Some(b"k"));
        // The dialer's membership lists node 2's old incarnation, 0x1002.
        let (mut x, mut y) = tokio::io::duplex(1 << 16);
        let (d, a) = tokio::join!(
            async {
                let r = handshake(&mut x, Role::Dialer, &dialer, Some((2, 0x1002))).await;
                drop(x);
                r
            },
            async {
                let r = handshake(&mut y, Role::Acceptor, &replaced, None).await;
                drop(y);
                r
            }
        );
        assert_eq!(a.err().map(|e| e.reason()), Some("incarnation"));
        // The acceptor said nothing back: the dialer sees the peer go.
        assert!(d.is_err());
        // An old acceptor that does not check: the dialer refuses it.
        let mut lax = replaced.clone();
        lax.incarnation = 0x9999;
        let (mut x, mut y) = tokio::io::duplex(1 << 16);
        let (d, _) = tokio::join!(
            async {
                let r = handshake(&mut x, Role::Dialer, &dialer, Some((2, 0x1002))).await;
                drop(x);
                r
            },
            async {
                // Answers as if it expected nothing of the dialer and the
                // dialer nothing of it: a hello of its own, unchecked.
                let ours = Hello::fresh(&lax, 0).unwrap();
                let _ = read_hello(&mut y).await;
                let _ = y.write_all(&ours.encode()).await;
                drop(y);
            }
        );
        assert_eq!(d.err().map(|e| e.reason()), Some("incarnation"));
        // A dialer that expects nothing (a probe) learns the new one.
        let (mut x, mut y) = tokio::io::duplex(1 << 16);
        let (d, a) = tokio::join!(
            handshake(&mut x, Role::Dialer, &dialer, Some((2, 0))),
            handshake(&mut y, Role::Acceptor, &replaced, None)
        );
        assert_eq!(d.unwrap().peer_incarnation, 0x9999);
        assert_eq!(a.unwrap().peer_incarnation, 0x1001);
    }

    #[tokio::test]
    async fn a_stranger_gets_nothing_and_its_bytes_are_refused_before_decoding() {
        let acceptor = auth(2, Some(b"k"));
        // Garbage, an old-style length prefix, and a hello of another
        // version: each refused from the fixed-size hello alone.
        for (bytes, reason) in [
            (vec![0xffu8; HELLO_LEN], "not_a_peer"),
            (
                [&(200u32 << 20).to_le_bytes()[..], &[0u8; HELLO_LEN - 4]].concat(),
                "not_a_peer",
            ),
            (
                [&MAGIC[..], &[9u8, 1], &[0u8; HELLO_LEN - 6]].concat(),
                "version",
            ),
        ] {
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            a.write_all(&bytes).await.unwrap();
            let e = handshake(&mut b, Role::Acceptor, &acceptor, None)
                .await
                .err()
                .unwrap();
            assert_eq!(e.reason(), reason, "{e}");
            // The acceptor said nothing back: not even its hello.
            drop(b);
            let mut back = Vec::new();
            a.read_to_end(&mut back).await.unwrap();
            assert!(back.is_empty(), "{back:?}");
        }
    }

    #[tokio::test]
    async fn frames_cannot_be_forged_replayed_reordered_or_oversized() {
        let (d, a) = pair(auth(1, Some(b"k")), auth(2, Some(b"k")), 2).await;
        let (mut d, _) = d.unwrap();
        let (mut a, _) = a.unwrap();
        let f0 = seal(&mut d.send, &1u64).unwrap();
        let f1 = seal(&mut d.send, &2u64).unwrap();

        async fn read(bytes: &[u8], key: &mut FrameKey) -> Result<u64, PeerError> {
            let mut s = bytes;
            read_frame(&mut s, key).await
        }
        // Reordered: frame 1 where frame 0 belongs.
        assert_eq!(
            read(&f1, &mut a.recv).await.unwrap_err().reason(),
            "bad_mac"
        );
        // Flipped bit in the body.
        let mut bad = f0.clone();
        bad[FRAME_HEADER_LEN] ^= 1;
        assert_eq!(
            read(&bad, &mut a.recv).await.unwrap_err().reason(),
            "bad_mac"
        );
        // The genuine order passes; a replay of frame 0 then fails.
        assert_eq!(read(&f0, &mut a.recv).await.unwrap(), 1);
        assert_eq!(
            read(&f0, &mut a.recv).await.unwrap_err().reason(),
            "bad_mac"
        );
        assert_eq!(read(&f1, &mut a.recv).await.unwrap(), 2);
        // A frame sent the other way does not pass as this way's.
        let mut back = seal(&mut a.send, &3u64).unwrap();
        let mut again = FrameKey {
            key: a.recv.key,
            seq: 0,
        };
        assert_eq!(
            read(&back, &mut again).await.unwrap_err().reason(),
            "bad_mac"
        );
        // A length over the limit is refused from the header alone.
        back[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read(&back[..FRAME_HEADER_LEN], &mut a.recv).await,
            Err(PeerError::FrameTooLarge { .. })
        ));
        // A large claimed length with a few bytes behind it: an error at
        // the end of the stream, with no buffer of the claimed size.
        let mut short = vec![PROTOCOL_VERSION];
        short.extend_from_slice(&(200u32 << 20).to_le_bytes());
        short.extend_from_slice(&[0u8; 10]);
        let mut s = &short[..];
        let e = read_frame::<_, u64>(&mut s, &mut a.recv).await.unwrap_err();
        assert_eq!(e.reason(), "io", "{e}");
    }

    /// An entry's commands come out of a frame as slices of it, not
    /// copied out, whatever pieces the frame arrives in; a frame cut in its
    /// body or in its MAC is an error, not a shorter frame.
    #[tokio::test]
    async fn entries_are_read_as_slices_of_their_frame_in_any_pieces() {
        use tokio::io::AsyncWriteExt;
        let (d, a) = pair(auth(1, Some(b"k")), auth(2, Some(b"k")), 2).await;
        let (mut d, _) = d.unwrap();
        let (mut a, _) = a.unwrap();
        let sent = request(vec![entry(1, 3000), entry(2, 5000)]);
        let frame = seal(&mut d.send, &Rpc::Append(sent.clone())).unwrap();

        let (mut w, mut r) = tokio::io::duplex(64);
        let pieces = frame.clone();
        let writer = tokio::spawn(async move {
            for piece in pieces.chunks(7) {
                w.write_all(piece).await.unwrap();
            }
            w
        });
        let got: Rpc = read_frame(&mut r, &mut a.recv).await.unwrap();
        drop(writer.await.unwrap());
        let Rpc::Append(got) = got else {
            panic!("an append was sent")
        };
        assert_eq!(got.entries, sent.entries);

        let payload = |e: &Entry<TypeConfig>| match &e.payload {
            EntryPayload::Normal(req) => match &req.cmds()[0] {
                fencelog::Command::Write(fencelog::TxOp::Append { payloads, .. }) => {
                    payloads[0].clone()
                }
                other => panic!("{other:?}"),
            },
            _ => panic!("a normal entry was sent"),
        };
        let (p1, p2) = (payload(&got.entries[0]), payload(&got.entries[1]));
        let at = |p: &[u8]| frame.windows(p.len()).position(|w| w == p).unwrap();
        assert_eq!(
            (p2.as_ptr() as usize).wrapping_sub(p1.as_ptr() as usize),
            at(&p2) - at(&p1),
            "the two entries' payloads lie in one buffer as they lie in the frame"
        );

        for cut in [
            FRAME_HEADER_LEN + 100,
            frame.len() - MAC_LEN,
            frame.len() - 1,
        ] {
            let mut key = FrameKey {
                key: a.recv.key,
                seq: 0,
            };
            let mut s = &frame[..cut];
            match read_frame::<_, Rpc>(&mut s, &mut key).await {
                Err(e) => assert_eq!(e.reason(), "io", "cut at {cut}: {e}"),
                Ok(_) => panic!("a frame cut at {cut} of {} was read", frame.len()),
            }
        }
    }

    /// Arbitrary bytes from a stranger, and arbitrary frames on an
    /// authenticated connection: refused with an error, never a panic, and
    /// never more read than the fixed handshake or a frame's checked
    /// length. (A cheap, seeded stand-in for a cargo-fuzz target.)
    #[tokio::test]
    async fn arbitrary_bytes_are_refused_without_panicking() {
        let acceptor = auth(2, Some(b"k"));
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..2000 {
            let len = (next() % 200) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Half of them start like a hello, to get past the magic.
            if i % 2 == 0 && bytes.len() >= 6 {
                bytes[..4].copy_from_slice(&MAGIC);
                bytes[4] = PROTOCOL_VERSION;
                bytes[5] = (next() % 2) as u8;
            }
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            a.write_all(&bytes).await.unwrap();
            drop(a);
            assert!(
                handshake(&mut b, Role::Acceptor, &acceptor, None)
                    .await
                    .is_err()
            );
            let mut key = FrameKey {
                key: [7u8; 32],
                seq: 0,
            };
            if i % 2 == 0 && !bytes.is_empty() {
                bytes[0] = PROTOCOL_VERSION;
            }
            let mut s = &bytes[..];
            assert!(read_frame::<_, RpcReply>(&mut s, &mut key).await.is_err());
        }
    }

    #[tokio::test]
    async fn every_client_for_a_target_shares_one_slot() {
        let mut net = Network::new(auth(1, None), None);
        let m = Member {
            raft_addr: "127.0.0.1:1".into(),
            client_addr: "127.0.0.1:2".into(),
            incarnation: 0,
        };
        let a = net.new_client(2, &m).await;
        let b = net.new_client(2, &m).await;
        let c = net.new_client(3, &m).await;
        assert!(Arc::ptr_eq(&a.slot, &b.slot));
        assert!(!Arc::ptr_eq(&a.slot, &c.slot));
    }

    #[test]
    fn a_secret_is_never_printed_and_its_length_is_bounded() {
        let s = ClusterSecret::new(b"hunter2".to_vec()).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(ClusterSecret::new(Vec::new()).is_err());
        assert!(ClusterSecret::new(vec![1; MAX_SECRET_BYTES + 1]).is_err());
        let hex = ClusterSecret::random_hex().unwrap();
        assert_eq!(hex.len(), 64);
        assert_ne!(hex, ClusterSecret::random_hex().unwrap());
    }
}
