//! A proposed command's bytes are what every replica decides from: one
//! that decoded to anything but what the leader proposed would make the
//! replicas decide something else than the leader answered. Guards the
//! round trip of every variant, that decoding borrows its payloads from
//! the input, that what the engine refuses (a token of 0, a name too long
//! to encode) is a refusal rather than an undecodable entry, and that
//! malformed bytes are errors, never panics or huge allocations.

use bytes::Bytes;
use fencelog::{Command, CommandDecodeError, Error, GroupLimits, Refusal, Token, TxOp};
use proptest::prelude::*;

fn token() -> impl Strategy<Value = Token> {
    (1..=fencelog::MAX_TOKEN).prop_map(|n| Token::new(n).expect("in range"))
}

fn name() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..=255).prop_map(Bytes::from)
}

fn payloads() -> impl Strategy<Value = Vec<Bytes>> {
    proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from),
        0..5,
    )
}

fn tx_op() -> impl Strategy<Value = TxOp> {
    prop_oneof![
        (name(), token(), payloads()).prop_map(|(stream, token, payloads)| TxOp::Append {
            stream,
            token,
            payloads: payloads.into()
        }),
        (name(), token(), any::<u64>(), payloads()).prop_map(
            |(stream, token, expected_offset, payloads)| TxOp::AppendAt {
                stream,
                token,
                expected_offset,
                payloads: payloads.into()
            }
        ),
        (name(), token()).prop_map(|(stream, token)| TxOp::Fence { stream, token }),
        (name(), token(), any::<u64>()).prop_map(|(stream, token, before)| TxOp::Trim {
            stream,
            token,
            before
        }),
        (name(), token()).prop_map(|(stream, token)| TxOp::Delete { stream, token }),
    ]
}

fn limits() -> impl Strategy<Value = GroupLimits> {
    (any::<(u32, u32, u64, u64, u64, u64)>()).prop_map(|(a, b, c, d, e, f)| GroupLimits {
        max_payload_bytes: a,
        max_records_per_append: b,
        lease_ttl_min_ms: c,
        lease_ttl_max_ms: d,
        max_live_leases: e,
        max_streams: f,
    })
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        tx_op().prop_map(Command::Write),
        proptest::collection::vec(tx_op(), 0..4).prop_map(Command::Transact),
        (name(), name(), any::<u64>(), any::<bool>()).prop_map(|(name, owner, ttl_ms, fence)| {
            Command::Acquire {
                name,
                owner,
                ttl_ms,
                fence,
            }
        }),
        (name(), name(), token(), any::<u64>()).prop_map(|(name, owner, token, ttl_ms)| {
            Command::Renew {
                name,
                owner,
                token,
                ttl_ms,
            }
        }),
        (name(), name(), token()).prop_map(|(name, owner, token)| Command::Release {
            name,
            owner,
            token
        }),
        Just(Command::TakeOver),
        limits().prop_map(Command::SetLimits),
        any::<(u64, u64)>().prop_map(|(index, digest)| Command::Check { index, digest }),
        proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|c| Command::Membership(Bytes::from(c))),
        Just(Command::Blank),
        (proptest::option::of(any::<u32>()), ".{0,40}").prop_map(|(op, reason)| {
            Command::Refused(Refusal {
                op: op.filter(|&i| i != u32::MAX),
                what: "stream name",
                reason,
            })
        }),
    ]
}

/// `cmd` with its name (a stream's, a lease's) `len` bytes long.
fn with_name_of(cmd: Command, len: usize) -> Command {
    let long = Bytes::from(vec![b'n'; len]);
    let op = |op: TxOp| match op {
        TxOp::Append {
            token, payloads, ..
        } => TxOp::Append {
            stream: long.clone(),
            token,
            payloads,
        },
        TxOp::AppendAt {
            token,
            expected_offset,
            payloads,
            ..
        } => TxOp::AppendAt {
            stream: long.clone(),
            token,
            expected_offset,
            payloads,
        },
        TxOp::Fence { token, .. } => TxOp::Fence {
            stream: long.clone(),
            token,
        },
        TxOp::Trim { token, before, .. } => TxOp::Trim {
            stream: long.clone(),
            token,
            before,
        },
        TxOp::Delete { token, .. } => TxOp::Delete {
            stream: long.clone(),
            token,
        },
    };
    match cmd {
        Command::Write(o) => Command::Write(op(o)),
        Command::Transact(ops) => Command::Transact(ops.into_iter().map(op).collect()),
        Command::Acquire {
            owner,
            ttl_ms,
            fence,
            ..
        } => Command::Acquire {
            name: long.clone(),
            owner,
            ttl_ms,
            fence,
        },
        Command::Renew {
            owner,
            token,
            ttl_ms,
            ..
        } => Command::Renew {
            name: long.clone(),
            owner,
            token,
            ttl_ms,
        },
        Command::Release { name, token, .. } => Command::Release {
            name,
            owner: long.clone(),
            token,
        },
        other => other,
    }
}

fn encoded(cmd: &Command) -> Bytes {
    let mut out = Vec::new();
    cmd.encode(&mut out);
    Bytes::from(out)
}

proptest! {
    #[test]
    fn every_command_decodes_to_itself(cmds in proptest::collection::vec(command(), 0..6)) {
        for cmd in &cmds {
            let b = encoded(cmd);
            prop_assert_eq!(cmd.encoded_len(), b.len());
            prop_assert_eq!(&Command::decode(&b).unwrap(), cmd);
        }
        let mut all = Vec::new();
        Command::encode_all(&cmds, &mut all);
        prop_assert_eq!(Command::decode_all(&Bytes::from(all)).unwrap(), cmds);
    }

    /// What `decodes_to_itself` promises (a leader decides such commands
    /// as given, its followers as decoded): names and owners on both
    /// sides of what the layout holds.
    #[test]
    fn what_decodes_to_itself_does(cmd in command(), long in 250usize..300) {
        let cmds = [
            cmd.clone(),
            with_name_of(cmd, long),
        ];
        for cmd in cmds {
            if cmd.decodes_to_itself() {
                prop_assert_eq!(&Command::decode(&encoded(&cmd)).unwrap(), &cmd);
            } else {
                prop_assert!(matches!(Command::decode(&encoded(&cmd)).unwrap(), Command::Refused(_)));
            }
        }
    }

    /// Any bytes: a command, a refusal or an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let b = Bytes::from(b);
        let _ = Command::decode(&b);
        let _ = Command::decode_all(&b);
    }

    /// Every strict prefix of a command is an error (no command's bytes
    /// are a prefix of another's), but a membership's: its config runs to
    /// the end of its bytes, which the list's lengths delimit.
    #[test]
    fn truncated_commands_are_errors(cmd in command()) {
        prop_assume!(!matches!(cmd, Command::Membership(_)));
        let b = encoded(&cmd);
        for len in 0..b.len() {
            prop_assert!(Command::decode(&b.slice(..len)).is_err(), "{len} of {}", b.len());
        }
    }
}

#[test]
fn payloads_are_slices_of_the_input() {
    let cmd = Command::Write(TxOp::Append {
        stream: Bytes::from_static(b"s"),
        token: Token::new(3).unwrap(),
        payloads: vec![Bytes::from(vec![9u8; 1000])].into(),
    });
    let b = encoded(&cmd);
    let Command::Write(TxOp::Append { payloads, .. }) = Command::decode(&b).unwrap() else {
        panic!("not an append");
    };
    let range = b.as_ptr() as usize..b.as_ptr() as usize + b.len();
    assert!(range.contains(&(payloads[0].as_ptr() as usize)));
}

/// A token of 0 in the bytes (no leader writes one; a version 1 entry
/// could hold one) decodes as the refusal every replica answers.
#[test]
fn a_token_of_zero_is_a_refusal_not_an_error() {
    let mut b = encoded(&Command::Write(TxOp::Fence {
        stream: Bytes::from_static(b"s"),
        token: Token::new(1).unwrap(),
    }))
    .to_vec();
    let at = b.len() - 8;
    b[at..].copy_from_slice(&0u64.to_le_bytes());
    let Command::Refused(r) = Command::decode(&Bytes::from(b)).unwrap() else {
        panic!("not refused");
    };
    assert!(matches!(r.error(), Error::Invalid { what: "token", .. }));
}

/// A name the layout cannot hold is proposed as the engine's refusal of
/// it; inside a transaction, naming the op.
#[test]
fn a_name_too_long_to_encode_is_the_engines_refusal() {
    let long = Bytes::from(vec![b'x'; 300]);
    let fence = TxOp::Fence {
        stream: long,
        token: Token::new(1).unwrap(),
    };
    let Command::Refused(r) = Command::decode(&encoded(&Command::Write(fence.clone()))).unwrap()
    else {
        panic!("not refused");
    };
    assert_eq!((r.op, r.what), (None, "stream name"));
    let ok = TxOp::Delete {
        stream: Bytes::from_static(b"s"),
        token: Token::new(1).unwrap(),
    };
    let Command::Refused(r) =
        Command::decode(&encoded(&Command::Transact(vec![ok, fence]))).unwrap()
    else {
        panic!("not refused");
    };
    assert!(matches!(r.error(), Error::Aborted { index: 1, .. }));
}

/// A count claimed beyond what the bytes could hold is refused before
/// anything is allocated for it.
#[test]
fn claimed_counts_are_bounded_by_the_input() {
    let mut b = u32::MAX.to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 16]);
    assert!(matches!(
        Command::decode_all(&Bytes::from(b)),
        Err(CommandDecodeError::Malformed { .. })
    ));
    let mut append = vec![13u8, 1, b's'];
    append.extend_from_slice(&1u64.to_le_bytes());
    append.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(Command::decode(&Bytes::from(append)).is_err());
    assert!(matches!(
        Command::decode(&Bytes::from_static(&[200])),
        Err(CommandDecodeError::UnknownCode { code: 200 })
    ));
}
