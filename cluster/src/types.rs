//! What travels through the replicated log: requests (commands stamped with
//! the proposing leader's clock), their answers, and the Raft type
//! configuration.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use bytes::Bytes;
use fencelog::{Applied, Command, Error, Proposal};
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    /// fencelog's Raft types: node ids are `u64`, nodes are addresses.
    pub TypeConfig:
        D = Request,
        R = Responses,
        NodeId = u64,
        Node = Member,
        SnapshotData = crate::snapshot::SnapshotFile,
);

/// A member of the cluster: where its peers send Raft messages, where
/// clients connect (what `-MOVED` and `CLUSTER SHARDS` tell them), and
/// which incarnation of its data directory the group admitted.
///
/// A replaced (or wiped) disk is a new incarnation: a random `u64` made
/// when the directory is first initialized (`node.rs`). Peers dial a
/// member expecting the incarnation listed here, and a node whose own
/// differs refuses the connection: it neither votes nor accepts entries
/// until the group has re-added it with its new incarnation
/// (docs/CLUSTER.md, "A replica whose disk died"). `0` means "not known"
/// (a member admitted before incarnations existed): not checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Member {
    /// Raft messages, `host:port`.
    pub raft_addr: String,
    /// Clients (the Redis protocol), `host:port`.
    pub client_addr: String,
    /// The incarnation admitted (0: not known, not checked).
    pub incarnation: u64,
}

/// How a [`Member`] is encoded (bincode, in Raft log entries, snapshot
/// metadata, the engine's stored membership and peer frames): the layout
/// of the members written before incarnations existed, two strings, with
/// the incarnation as a suffix of the second one when known:
/// `client_addr` `#incarnation=` 16 hex digits. bincode is positional, so
/// a third field would make every membership already on disk undecodable;
/// this way an old record decodes as incarnation 0 (docs/FORMAT.md).
#[derive(Serialize, Deserialize)]
#[serde(rename = "Member")]
struct MemberRepr {
    raft_addr: String,
    client_addr: String,
}

/// The suffix that carries a member's incarnation (see [`MemberRepr`]).
const INCARNATION_MARK: &str = "#incarnation=";

impl Serialize for Member {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let client_addr = if self.incarnation == 0 {
            self.client_addr.clone()
        } else {
            format!(
                "{}{INCARNATION_MARK}{:016x}",
                self.client_addr, self.incarnation
            )
        };
        MemberRepr {
            raft_addr: self.raft_addr.clone(),
            client_addr,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Member, D::Error> {
        let r = MemberRepr::deserialize(d)?;
        let (client_addr, incarnation) = match r.client_addr.rsplit_once(INCARNATION_MARK) {
            Some((addr, hex)) => {
                let inc = u64::from_str_radix(hex, 16).map_err(|_| {
                    serde::de::Error::custom(format!("a member's incarnation {hex:?} is not hex"))
                })?;
                (addr.to_string(), inc)
            }
            None => (r.client_addr, 0),
        };
        Ok(Member {
            raft_addr: r.raft_addr,
            client_addr,
            incarnation,
        })
    }
}

/// The Raft handle of a fencelog node.
pub type Raft = openraft::Raft<TypeConfig>;
/// A node id.
pub type NodeId = u64;

/// Writes proposed to the replicated log together, as one entry: the
/// leader batches what clients sent while its last entry was on its way
/// (openraft 0.9 syncs the leader's log once per entry, so one entry per
/// write would cost a sync each, one after the other).
// Request (bincode tuple): { version: u8 (REQUEST_VERSION = 2) | time_ms: u64 | len: u64 | commands: [u8; len] }
//   commands: the engine's encoding (`Command::encode_all`); version 1 is read only (`request_v1.rs`)
#[derive(Clone)]
pub struct Request {
    /// The proposing leader's monotonic clock in ms (lease time follows it).
    pub time_ms: u64,
    /// Shared: the leader hands an entry to each replication stream and to
    /// apply, a follower to apply, each a clone of the entry.
    body: Arc<Body>,
}

/// What a [`Request`]'s clones share.
struct Body {
    /// What to decide when the entry is applied, in order. A packed
    /// request's are decoded from its encoding on first use (its leader
    /// decides the commands it was given, `given`, and never needs these).
    cmds: OnceLock<Vec<Command>>,
    /// The commands' encoding (`Command::encode_all`), made at most once:
    /// an entry is written to the Raft log and into a frame for each
    /// follower, and bincode measures before it writes, so each of those
    /// would encode every command again. A request read from bytes keeps
    /// the bytes it was read from (its payloads are slices of them).
    encoded: OnceLock<Bytes>,
    /// A packed request's commands as its leader was given them, until
    /// it applied them ([`Request::applied`]); each decodes from the
    /// encoding to itself (`Command::decodes_to_itself`), so the leader
    /// decides what its followers decode.
    given: Mutex<Option<Arc<Vec<Command>>>>,
}

impl Body {
    fn new(cmds: OnceLock<Vec<Command>>, encoded: OnceLock<Bytes>) -> Body {
        Body {
            cmds,
            encoded,
            given: Mutex::new(None),
        }
    }
}

impl Request {
    /// A request of `cmds`, proposed at `time_ms` on the leader's clock.
    pub fn new(time_ms: u64, cmds: Vec<Command>) -> Request {
        Request {
            time_ms,
            body: Arc::new(Body::new(OnceLock::from(cmds), OnceLock::new())),
        }
    }

    /// A request of `cmds` encoded now, whose clones hold that encoding
    /// only once the leader applied it: the buffers `cmds` arrived in
    /// (each a client connection's input) are let go then, not when the
    /// entry leaves the Raft log's memory, many entries later, on another
    /// thread. The leader decides `cmds` as given (decoding its own entry
    /// again cost it a tenth of its instructions per write); commands that
    /// would not decode to themselves make a request read back from the
    /// encoding instead, as a follower reads it.
    pub fn packed(time_ms: u64, cmds: Vec<Command>) -> Request {
        let encoded = encode_cmds(&cmds);
        if !cmds.iter().all(Command::decodes_to_itself) {
            // What was just encoded decodes; were it not to, the commands
            // as given are as good.
            return Request::read_from(time_ms, encoded)
                .unwrap_or_else(|_| Request::new(time_ms, cmds));
        }
        // The leader decides `cmds` from here on, its followers what the
        // encoding decodes to: the two are checked equal wherever debug
        // assertions run (the test command's profile: every cluster test
        // and simulated seed), not only through the replicas' digests.
        debug_assert!(
            Command::decode_all(&encoded).is_ok_and(|decoded| decoded == cmds),
            "a packed request decodes to other commands than it was given"
        );
        let body = Body::new(OnceLock::new(), OnceLock::from(encoded));
        *body.given.lock() = Some(Arc::new(cmds));
        Request {
            time_ms,
            body: Arc::new(body),
        }
    }

    /// A request read from `encoded` (its commands' encoding), which it
    /// keeps: it is what the request writes again, and what its commands
    /// are read from when applied. Checked here (bytes that do not decode
    /// are refused, as they always were), decoded only if asked for
    /// ([`Request::cmds`]): a replica applies its appends in place
    /// ([`Request::proposals`]).
    fn read_from(time_ms: u64, encoded: Bytes) -> Result<Request, fencelog::CommandDecodeError> {
        Proposal::read_each(&encoded, drop)?;
        Ok(Request {
            time_ms,
            body: Arc::new(Body::new(OnceLock::new(), OnceLock::from(encoded))),
        })
    }

    /// `f` of the commands: as given while the leader holds them (not
    /// decoding its entry), else as decoded. What equality compares.
    fn with_commands<T>(&self, f: impl FnOnce(&[Command]) -> T) -> T {
        // The lock is let go before a decode, whose fallback takes it.
        match self.given() {
            Some(given) => f(&given),
            None => f(self.cmds()),
        }
    }

    /// The commands its leader was given, while it holds them: what the
    /// leader decides, as given (else [`Request::proposals`]).
    pub(crate) fn given(&self) -> Option<Arc<Vec<Command>>> {
        self.body.given.lock().clone()
    }

    /// Pushes what to decide when the entry is applied onto `out`, in
    /// order, for a request whose leader's commands are not held here
    /// ([`Request::given`]): the commands already decoded, else each read
    /// from the encoding, appends in place. An encoding that does not
    /// decode (never one read from bytes: those are checked) pushes
    /// nothing, as [`Request::cmds`] answers none.
    pub(crate) fn proposals<'a>(&'a self, out: &mut Vec<Proposal<'a>>) {
        if let Some(cmds) = self.body.cmds.get() {
            out.extend(cmds.iter().map(Proposal::Command));
            return;
        }
        let before = out.len();
        if let Err(e) = Proposal::read_each(self.encoded(), |p| out.push(p)) {
            tracing::error!(error = %e, "a request does not decode");
            out.truncate(before);
        }
    }

    /// The leader applied this request: the commands it was given go (and
    /// with them the client buffers their payloads are slices of); a
    /// later reader decodes them from the encoding.
    pub(crate) fn applied(&self) {
        self.body.given.lock().take();
    }

    /// What to decide when the entry is applied, in order, as decoded
    /// from the encoding where the request was packed.
    pub fn cmds(&self) -> &[Command] {
        self.body.cmds.get_or_init(|| {
            // A packed request's encoding is of commands that each decode
            // to themselves; the fallback is theirs, should that fail.
            Command::decode_all(self.encoded()).unwrap_or_else(|e| {
                tracing::error!(error = %e, "a packed request does not decode");
                self.body
                    .given
                    .lock()
                    .as_ref()
                    .map(|g| g.to_vec())
                    .unwrap_or_default()
            })
        })
    }

    /// The commands' encoding, made on first use.
    fn encoded(&self) -> &Bytes {
        self.body.encoded.get_or_init(|| encode_cmds(self.cmds()))
    }
}

/// Commands' encoding as one list (`Command::encode_all`, which sizes the
/// buffer once: its length is not counted twice).
fn encode_cmds(cmds: &[Command]) -> Bytes {
    let mut out = Vec::new();
    Command::encode_all(cmds, &mut out);
    Bytes::from(out)
}

impl PartialEq for Request {
    fn eq(&self, other: &Request) -> bool {
        self.time_ms == other.time_ms && self.with_commands(|a| other.with_commands(|b| a == b))
    }
}

impl Eq for Request {}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("time_ms", &self.time_ms)
            .field("cmds", &self.with_commands(<[Command]>::to_vec))
            .finish()
    }
}

/// The format version of a [`Request`] (its first byte, in the Raft log
/// and in peer frames). Version 1 (bincode of an enum of the cluster's own)
/// is still read, never written.
pub const REQUEST_VERSION: u8 = 2;

impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&REQUEST_VERSION)?;
        t.serialize_element(&self.time_ms)?;
        t.serialize_element(serde_bytes::Bytes::new(self.encoded()))?;
        t.end()
    }
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Request, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Request;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a versioned Request")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Request, A::Error> {
                use serde::de::Error as _;
                let missing = || A::Error::custom("a truncated Request");
                // The version before anything else: a request of another
                // version is never read as this one.
                let version: u8 = a.next_element()?.ok_or_else(missing)?;
                let time_ms = match version {
                    1 | REQUEST_VERSION => a.next_element()?.ok_or_else(missing)?,
                    _ => {
                        return Err(A::Error::custom(format!(
                            "a Request of format version {version} (this build reads versions 1 and {REQUEST_VERSION})"
                        )));
                    }
                };
                if version == 1 {
                    let cmds = a
                        .next_element_seed(crate::request_v1::Commands)?
                        .ok_or_else(missing)?;
                    return Ok(Request::new(time_ms, cmds));
                }
                // A slice of the frame it arrived in, where it came from one
                // (`slices.rs`): not copied out of it.
                let b: crate::slices::SharedBytes = a.next_element()?.ok_or_else(missing)?;
                Request::read_from(time_ms, b.0).map_err(A::Error::custom)
            }
        }
        d.deserialize_tuple(3, V)
    }
}

/// The answers of an entry's commands, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Responses(pub Vec<Response>);

/// Why a command was rejected, as the log's answer carries it (the
/// engine's [`Error`], the kinds a rejection can be).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum WireError {
    Stale { presented: u64, highest: u64 },
    Mismatch { expected: u64, next: u64 },
    Trimmed { requested: u64, start: u64 },
    TrimBeyondEnd { before: u64, next: u64 },
    TooLarge { what: String, len: u64, max: u64 },
    Invalid { what: String, reason: String },
    Held { remaining_ms: u64 },
    Lost,
    TooManyLeases { live: u64, max: u64 },
    Aborted { index: usize, cause: Box<WireError> },
    Other(String),
}

impl WireError {
    /// The rejection as the log's answer carries it.
    pub fn from_engine(e: &Error) -> WireError {
        match e {
            Error::Stale { presented, highest } => WireError::Stale {
                presented: *presented,
                highest: *highest,
            },
            Error::OffsetMismatch { expected, next } => WireError::Mismatch {
                expected: *expected,
                next: *next,
            },
            Error::Trimmed { requested, start } => WireError::Trimmed {
                requested: *requested,
                start: *start,
            },
            Error::TrimBeyondEnd { before, next } => WireError::TrimBeyondEnd {
                before: *before,
                next: *next,
            },
            Error::TooLarge { what, len, max } => WireError::TooLarge {
                what: (*what).to_string(),
                len: *len,
                max: *max,
            },
            Error::Invalid { what, reason } => WireError::Invalid {
                what: (*what).to_string(),
                reason: reason.clone(),
            },
            Error::Held { remaining_ms } => WireError::Held {
                remaining_ms: *remaining_ms,
            },
            Error::Lost => WireError::Lost,
            Error::TooManyLeases { live, max } => WireError::TooManyLeases {
                live: *live,
                max: *max,
            },
            Error::Aborted { index, cause } => WireError::Aborted {
                index: *index,
                cause: Box::new(WireError::from_engine(cause)),
            },
            other => WireError::Other(other.to_string()),
        }
    }

    /// Back to the engine's error, so the server answers as on one node.
    pub fn to_engine(&self) -> Error {
        match self {
            WireError::Stale { presented, highest } => Error::Stale {
                presented: *presented,
                highest: *highest,
            },
            WireError::Mismatch { expected, next } => Error::OffsetMismatch {
                expected: *expected,
                next: *next,
            },
            WireError::Trimmed { requested, start } => Error::Trimmed {
                requested: *requested,
                start: *start,
            },
            WireError::TrimBeyondEnd { before, next } => Error::TrimBeyondEnd {
                before: *before,
                next: *next,
            },
            WireError::TooLarge { what, len, max } => Error::TooLarge {
                what: static_what(what),
                len: *len,
                max: *max,
            },
            WireError::Invalid { what, reason } => Error::Invalid {
                what: static_what(what),
                reason: reason.clone(),
            },
            WireError::Held { remaining_ms } => Error::Held {
                remaining_ms: *remaining_ms,
            },
            WireError::Lost => Error::Lost,
            WireError::TooManyLeases { live, max } => Error::TooManyLeases {
                live: *live,
                max: *max,
            },
            WireError::Aborted { index, cause } => Error::Aborted {
                index: *index,
                cause: Box::new(cause.to_engine()),
            },
            WireError::Other(s) => Error::Invalid {
                what: "replicated command",
                reason: s.clone(),
            },
        }
    }
}

/// The engine's error kinds name what they concern with static strings;
/// the few that travel are mapped back to them.
fn static_what(s: &str) -> &'static str {
    fencelog::Refusal::what_of(s.as_bytes())
}

/// What applying an entry answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum Response {
    Value(u64),
    Values(Vec<u64>),
    Grant { token: u64, ttl_ms: u64 },
    Released(bool),
    Done,
    Rejected(WireError),
}

impl Response {
    /// The answer as the log carries it.
    pub fn from_applied(a: &Applied) -> Response {
        match a {
            Applied::Value(v) => Response::Value(*v),
            Applied::Values(v) => Response::Values(v.clone()),
            Applied::Grant { token, ttl_ms } => Response::Grant {
                token: token.get(),
                ttl_ms: *ttl_ms,
            },
            Applied::Released(r) => Response::Released(*r),
            Applied::Done => Response::Done,
            Applied::Rejected(e) => Response::Rejected(WireError::from_engine(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member written before incarnations existed decodes as
    /// incarnation 0; a known incarnation survives the round trip.
    #[test]
    fn members_of_before_incarnations_decode_and_new_ones_round_trip() {
        #[derive(Serialize)]
        struct Old {
            raft_addr: String,
            client_addr: String,
        }
        let old = bincode::serialize(&Old {
            raft_addr: "h:1".into(),
            client_addr: "h:2".into(),
        })
        .unwrap();
        let m: Member = bincode::deserialize(&old).unwrap();
        assert_eq!(
            m,
            Member {
                raft_addr: "h:1".into(),
                client_addr: "h:2".into(),
                incarnation: 0
            }
        );
        assert_eq!(bincode::serialize(&m).unwrap(), old);
        let new = Member {
            incarnation: 0xdead_beef_0000_0001,
            ..m
        };
        let back: Member = bincode::deserialize(&bincode::serialize(&new).unwrap()).unwrap();
        assert_eq!(back, new);
    }

    /// An append of `payload` to stream `s` at token `n`.
    fn append(n: u64, payload: &'static [u8]) -> Command {
        Command::Write(fencelog::TxOp::Append {
            stream: Bytes::from_static(b"s"),
            token: fencelog::Token::new(n).unwrap(),
            payloads: vec![Bytes::from_static(payload)].into(),
        })
    }

    #[test]
    fn a_request_is_encoded_once_and_read_back_as_written() {
        let req = Request::new(7, vec![append(1, b"a"), append(2, b"bc")]);
        let mut fresh = Vec::new();
        Command::encode_all(req.cmds(), &mut fresh);
        let first = bincode::serialize(&req).unwrap();
        // Measured, written, and written again from a clone: one encoding.
        let clone = req.clone();
        assert_eq!(bincode::serialize(&clone).unwrap(), first);
        assert!(std::ptr::eq(req.encoded(), clone.encoded()));
        assert_eq!(&req.encoded()[..], &fresh[..]);
        // Read back: the same request, which keeps the bytes it was read
        // from and writes them again as they were.
        let back: Request = bincode::deserialize(&first).unwrap();
        assert_eq!(back, req);
        assert_eq!(back.cmds(), req.cmds());
        assert_eq!(bincode::serialize(&back).unwrap(), first);
        // Equal whatever each has encoded so far.
        let unencoded = Request::new(7, vec![append(1, b"a"), append(2, b"bc")]);
        assert_eq!(unencoded, back);
        assert_ne!(Request::new(8, req.cmds().to_vec()), req);
    }

    #[test]
    fn a_request_read_from_bytes_is_checked_and_its_appends_applied_in_place() {
        let fence = Command::Write(fencelog::TxOp::Fence {
            stream: Bytes::from_static(b"s"),
            token: fencelog::Token::new(3).unwrap(),
        });
        let cmds = vec![append(1, b"a"), fence.clone(), append(2, b"bc")];
        let written = bincode::serialize(&Request::new(7, cmds.clone())).unwrap();
        let back: Request = bincode::deserialize(&written).unwrap();
        // Checked when read, decoded only when asked.
        assert!(back.body.cmds.get().is_none());
        let mut read = Vec::new();
        back.proposals(&mut read);
        assert!(back.body.cmds.get().is_none());
        let own = back.encoded().as_ptr_range();
        let [
            Proposal::Append(a),
            Proposal::Decoded(f),
            Proposal::Append(b),
        ] = &read[..]
        else {
            panic!("{read:?}")
        };
        assert_eq!(**f, fence);
        for append in [a, b] {
            assert!(own.contains(&append.stream().as_ptr()));
            assert!(append.payloads().all(|p| own.contains(&p.as_ptr())));
        }
        let as_read: Vec<Command> = read.iter().map(Proposal::to_command).collect();
        assert_eq!(as_read, cmds);
        assert_eq!(back.cmds(), cmds);
        // Once decoded, those are what apply borrows.
        read.clear();
        back.proposals(&mut read);
        assert!(matches!(&read[..], [Proposal::Command(_), ..]));

        // Bytes that do not decode are refused when read, as before: here
        // a count of commands the bytes cannot hold.
        let mut broken = written.clone();
        broken[17..21].copy_from_slice(&u32::MAX.to_le_bytes());
        let refused = bincode::deserialize::<Request>(&broken).unwrap_err();
        assert!(
            refused.to_string().contains("commands claimed"),
            "{refused}"
        );

        // A leader's own entry holds the commands it was given.
        let packed = Request::packed(7, cmds.clone());
        assert!(packed.given().is_some_and(|given| *given == cmds));
        packed.applied();
        assert!(packed.given().is_none());
    }

    #[test]
    fn a_packed_request_lets_go_of_the_buffers_its_commands_arrived_in_once_applied() {
        // Two writes cut out of one client's input buffer, as a connection
        // parses them.
        let mut input = bytes::BytesMut::from(&b"s1first payloads2second"[..]);
        let mut cut = |n: usize| input.split_to(n).freeze();
        let (s1, p1, s2, p2) = (cut(2), cut(13), cut(2), cut(6));
        drop(input);
        let append = |stream: Bytes, n: u64, payload: Bytes| {
            Command::Write(fencelog::TxOp::Append {
                stream,
                token: fencelog::Token::new(n).unwrap(),
                payloads: vec![payload].into(),
            })
        };
        let cmds = vec![append(s1, 1, p1.clone()), append(s2, 2, p2)];
        let plain = Request::new(7, cmds.clone());
        let packed = Request::packed(7, cmds);
        assert_eq!(packed, plain);
        assert_eq!(
            bincode::serialize(&packed).unwrap(),
            bincode::serialize(&plain).unwrap()
        );
        // Until applied, apply gets the commands as given (a clone shares
        // them): the leader does not decode its own entry.
        let clone = packed.clone();
        assert_eq!(
            clone.given().as_deref().map(Vec::as_slice),
            Some(plain.cmds())
        );
        packed.applied();
        assert!(clone.given().is_none());
        // Then every payload and name is a slice of the request's own
        // encoding.
        let own = packed.encoded().as_ptr_range();
        for cmd in clone.cmds() {
            let Command::Write(fencelog::TxOp::Append {
                stream, payloads, ..
            }) = cmd
            else {
                panic!("{cmd:?}")
            };
            for b in payloads.iter().chain([stream]) {
                assert!(own.contains(&b.as_ptr()), "{b:?} outside the encoding");
            }
        }
        assert_eq!(clone, plain);
        // The input buffer is held by `plain` and the one payload kept here
        // only, not by the applied request.
        drop(plain);
        let p1 = p1
            .try_into_mut()
            .expect("the packed request holds the input buffer");
        assert_eq!(&p1[..], b"first payload");
    }

    #[test]
    fn a_packed_request_of_commands_that_do_not_decode_to_themselves_is_read_back() {
        let long = Bytes::from(vec![b'x'; 300]);
        let cmds = vec![Command::Write(fencelog::TxOp::Fence {
            stream: long,
            token: fencelog::Token::new(1).unwrap(),
        })];
        let packed = Request::packed(7, cmds);
        // As a follower reads it: the refusal the layout carries.
        assert!(packed.given().is_none());
        let [Command::Refused(_)] = packed.cmds() else {
            panic!("{:?}", packed.cmds())
        };
    }
}
