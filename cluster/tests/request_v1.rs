//! Raft logs written before `REQUEST_VERSION` 2 hold entries whose
//! requests are version 1 (bincode of the old `WireCommand` enum). A group
//! upgraded in place must still apply them: this fixture is a version 1
//! request written by the last build that wrote version 1 (every command
//! kind, and a fence with token 0, which every replica refuses alike), and
//! the test checks that it still decodes to the same engine commands.

use bytes::Bytes;
use fencelog::{Command, GroupLimits, Refusal, Token, TxOp};
use fencelog_cluster::Request;

/// `bincode::serialize(&Request { time_ms: 123_456_789, cmds })` by the
/// version 1 code, `cmds` as in [`expected`], hex in 48-byte lines.
const V1_REQUEST_HEX: &[&str] = &[
    "0115cd5b07000000000e0000000000000000000000020000000000000073310700000000000000030000000000000001",
    "000000000000006100000000000000000300000000000000636363010000000200000000000000733208000000000000",
    "000300000000000000010000000000000001000000000000007802000000020000000000000073330900000000000000",
    "03000000020000000000000073340a00000000000000050000000000000004000000020000000000000073350b000000",
    "000000000500000005000000000000000000000002000000000000007431150000000000000002000000000000000100",
    "000000000000700000000000000000010000000200000000000000743216000000000000000400000000000000010000",
    "000000000001000000000000007102000000020000000000000074331700000000000000030000000200000000000000",
    "743418000000000000000600000000000000040000000200000000000000743519000000000000000600000001000000",
    "000000006c02000000000000006d658813000000000000010700000001000000000000006c02000000000000006d650c",
    "0000000000000070170000000000000800000001000000000000006c02000000000000006d650d000000000000000900",
    "00000a0000000b0000000100000002000000030000000000000004000000000000000500000000000000060000000000",
    "00000c0000004d00000000000000efbeadde0000000002000000020000000000000073360000000000000000",
];

fn v1_bytes() -> Vec<u8> {
    let hex: String = V1_REQUEST_HEX.concat();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("the fixture is hex"))
        .collect()
}

fn t(n: u64) -> Token {
    Token::new(n).expect("a valid token")
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// What the fixture's commands are to the engine; the last is refused
/// alike on every replica (token 0), as version 1 answered it.
fn expected() -> Vec<Command> {
    let tx = vec![
        TxOp::Append {
            stream: b("t1"),
            token: t(21),
            payloads: vec![b("p"), b("")].into(),
        },
        TxOp::AppendAt {
            stream: b("t2"),
            token: t(22),
            expected_offset: 4,
            payloads: vec![b("q")].into(),
        },
        TxOp::Fence {
            stream: b("t3"),
            token: t(23),
        },
        TxOp::Trim {
            stream: b("t4"),
            token: t(24),
            before: 6,
        },
        TxOp::Delete {
            stream: b("t5"),
            token: t(25),
        },
    ];
    vec![
        Command::Write(TxOp::Append {
            stream: b("s1"),
            token: t(7),
            payloads: vec![b("a"), b(""), b("ccc")].into(),
        }),
        Command::Write(TxOp::AppendAt {
            stream: b("s2"),
            token: t(8),
            expected_offset: 3,
            payloads: vec![b("x")].into(),
        }),
        Command::Write(TxOp::Fence {
            stream: b("s3"),
            token: t(9),
        }),
        Command::Write(TxOp::Trim {
            stream: b("s4"),
            token: t(10),
            before: 5,
        }),
        Command::Write(TxOp::Delete {
            stream: b("s5"),
            token: t(11),
        }),
        Command::Transact(tx),
        Command::Acquire {
            name: b("l"),
            owner: b("me"),
            ttl_ms: 5000,
            fence: true,
        },
        Command::Renew {
            name: b("l"),
            owner: b("me"),
            token: t(12),
            ttl_ms: 6000,
        },
        Command::Release {
            name: b("l"),
            owner: b("me"),
            token: t(13),
        },
        Command::Blank,
        Command::TakeOver,
        Command::SetLimits(GroupLimits {
            max_payload_bytes: 1,
            max_records_per_append: 2,
            lease_ttl_min_ms: 3,
            lease_ttl_max_ms: 4,
            max_live_leases: 5,
            max_streams: 6,
        }),
        Command::Check {
            index: 77,
            digest: 0xdead_beef,
        },
        Command::Refused(Refusal {
            op: None,
            what: "token",
            reason: format!("0 is not in 1..={}", fencelog::MAX_TOKEN),
        }),
    ]
}

#[test]
fn a_version_1_request_decodes_to_the_same_commands() {
    let req: Request = bincode::deserialize(&v1_bytes()).expect("a version 1 request decodes");
    assert_eq!(req.time_ms, 123_456_789);
    assert_eq!(req.cmds(), expected());
    // Sent on (a leader's log to a follower) it is version 2, and the same.
    let again = bincode::serialize(&req).expect("encodes");
    assert_eq!(again[0], fencelog_cluster::REQUEST_VERSION);
    assert_eq!(
        bincode::deserialize::<Request>(&again).expect("decodes"),
        req
    );
}

/// Version 1 never had a transaction inside a transaction; reading one
/// is an error, not a recursion as deep as crafted bytes nest.
#[test]
fn a_version_1_transaction_inside_a_transaction_is_an_error() {
    let mut b = vec![1u8];
    b.extend_from_slice(&0u64.to_le_bytes()); // time_ms
    b.extend_from_slice(&1u64.to_le_bytes()); // one command
    b.extend_from_slice(&5u32.to_le_bytes()); // Transact
    b.extend_from_slice(&1u64.to_le_bytes()); // one op
    b.extend_from_slice(&5u32.to_le_bytes()); // Transact again
    b.extend_from_slice(&0u64.to_le_bytes());
    assert!(bincode::deserialize::<Request>(&b).is_err());
}
