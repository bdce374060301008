//! Entry points for the fuzz targets (`fuzz/fuzz_targets/raft_record.rs`,
//! `snapshot_unpack.rs`, `peer_frame.rs`): the decoders of every cluster
//! format, fed arbitrary bytes. Not part of the API.

use std::path::Path;

use bytes::Bytes;
use fencelog::Command;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

use crate::codec::{self, MEMBERSHIP};
use crate::log_store::{self, Record};
use crate::types::{NodeId, Request, TypeConfig};

/// The Raft log's decoders: a record, an entry in full, a checkpoint, a
/// request and a stored membership, each from the same bytes. Nothing may
/// panic; a record that decodes re-encodes to the very same bytes (an
/// entry: to bytes that decode to the same entry).
pub fn raft_record(data: &[u8]) {
    if let Ok(rec) = Record::decode(data) {
        match rec {
            Record::Entry { index, .. } => {
                if let Ok(e) = log_store::decode_entry(data) {
                    assert_eq!(e.log_id.index, index);
                    // Not byte for byte: a membership's sets and maps
                    // come back sorted and without duplicates.
                    let again = log_store::encode_entry_for_fuzzing(&e).expect("re-encodes");
                    assert_eq!(
                        log_store::decode_entry(&again).as_ref(),
                        Ok(&e),
                        "an entry record re-encodes to another entry"
                    );
                }
            }
            other => {
                let again = other.encode_for_fuzzing().expect("re-encodes");
                assert_eq!(again, data, "a record re-encodes otherwise");
            }
        }
    }
    // Replay: the record over an empty state, and a checkpoint with the
    // record its first 26 bytes hold after it.
    if let Ok(rec) = Record::decode(data) {
        log_store::replay_for_fuzzing(None, &rec);
    }
    if let Ok(state) = log_store::decode_checkpoint(data) {
        let rec = Record::decode(data.get(..26).unwrap_or(data))
            .unwrap_or(Record::Truncate(data.len() as u64));
        log_store::replay_for_fuzzing(Some(state), &rec);
    }
    if let Ok(req) = codec::decode::<Request>("a request", data) {
        // Written again (as version 2, whatever it was read as), it reads
        // as the same commands; a version 1 request may hold a name too
        // long for version 2, which is written as the engine's refusal of
        // it, and then reads the same from there on.
        // From a request made of the commands alone: a request read from
        // bytes keeps them, and would be written as they were.
        let again = |r: &Request| {
            let fresh = Request::new(r.time_ms, r.cmds().to_vec());
            let b = bincode::serialize(&fresh).expect("re-encodes");
            bincode::deserialize::<Request>(&b).expect("decodes again")
        };
        let once = again(&req);
        if data.first() == Some(&crate::types::REQUEST_VERSION) {
            assert_eq!(once, req, "a request re-encodes to another request");
        } else {
            assert_eq!(
                again(&once),
                once,
                "a request re-encodes to another request"
            );
        }
    }
    let _ = MEMBERSHIP.decode::<openraft::StoredMembership<NodeId, crate::Member>>(data);
}

/// Unpacks `data` as a snapshot archive into `dir/engine` (`dir` empty):
/// it succeeds or refuses, never panics, and writes nothing but engine
/// files inside `dir/engine`. Also reads `data` as a snapshot's metadata.
pub fn snapshot_unpack(data: &[u8], dir: &Path) {
    let _ = crate::snapshot::decode_meta(data);
    let archive = dir.join("archive");
    std::fs::write(&archive, data).expect("writing the input");
    let out = dir.join("engine");
    let file = std::fs::File::open(&archive).expect("opening the input");
    let _ = crate::snapshot::unpack(file, &out);
    for e in std::fs::read_dir(dir).expect("listing").flatten() {
        let name = e.file_name();
        assert!(
            name == "archive" || name == "engine",
            "unpack wrote {name:?} beside its directory"
        );
    }
    if let Ok(files) = std::fs::read_dir(&out) {
        for e in files.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                name == "MARKS" || (name.ends_with(".wal") && !name.starts_with('.')),
                "unpack wrote {name:?}"
            );
            let meta = e.metadata().expect("metadata");
            assert!(meta.is_file(), "unpack made {name:?}, not a file");
        }
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
}

/// The peer protocol's decoders, `data` as what a peer sends: both ends
/// of the handshake, then frames (as they are, and with valid MACs) of
/// requests and replies.
pub fn peer_frame(data: &[u8], secret: bool) {
    RUNTIME.with(|rt| rt.block_on(crate::network::fuzz::peer_stream(data, secret)));
}

fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(3, 1), index),
        payload,
    }
}

fn sample_request() -> Request {
    let token = |n| fencelog::Token::new(n).expect("in range");
    Request::new(
        123_456,
        vec![
            Command::TakeOver,
            Command::Blank,
            Command::Write(fencelog::TxOp::Append {
                stream: Bytes::from_static(b"orders"),
                token: token(7),
                payloads: vec![Bytes::from_static(b"hello")].into(),
            }),
            Command::Transact(vec![fencelog::TxOp::Trim {
                stream: Bytes::from_static(b"orders"),
                token: token(8),
                before: 1,
            }]),
            Command::Acquire {
                name: Bytes::from_static(b"lock"),
                owner: Bytes::from_static(b"me"),
                ttl_ms: 10_000,
                fence: true,
            },
            Command::Check {
                index: 9,
                digest: 0xfeed,
            },
        ],
    )
}

/// Writes a few valid encodings of every cluster format as seeds:
/// `root/raft_record/`, `root/command_decode/`, `root/snapshot_unpack/`,
/// `root/peer_frame/`.
pub fn write_seeds(root: &Path) -> std::io::Result<()> {
    let put = |target: &str, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)
    };
    // Raft log records and a checkpoint.
    let id = LogId::new(CommittedLeaderId::new(3, 1), 42);
    let e = |x: bincode::Result<Vec<u8>>| x.map_err(std::io::Error::other);
    put(
        "raft_record",
        "entry_normal",
        &e(log_store::encode_entry_for_fuzzing(&entry(
            5,
            EntryPayload::Normal(sample_request()),
        )))?,
    )?;
    put(
        "raft_record",
        "entry_blank",
        &e(log_store::encode_entry_for_fuzzing(&entry(
            1,
            EntryPayload::Blank,
        )))?,
    )?;
    let membership = openraft::Membership::new(
        vec![[1u64, 2, 3].into_iter().collect()],
        [(
            1u64,
            crate::Member {
                raft_addr: "127.0.0.1:7001".into(),
                client_addr: "127.0.0.1:6380".into(),
                incarnation: 0x1111,
            },
        )]
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>(),
    );
    put(
        "raft_record",
        "entry_membership",
        &e(log_store::encode_entry_for_fuzzing(&entry(
            2,
            EntryPayload::Membership(membership.clone()),
        )))?,
    )?;
    let stored = openraft::StoredMembership::new(Some(id), membership.clone());
    put("raft_record", "membership", &e(MEMBERSHIP.encode(&stored))?)?;
    let mut vote = Vote::new(3, 1);
    vote.commit();
    for (name, rec) in [
        ("vote", Record::Vote(vote)),
        ("truncate", Record::Truncate(17)),
        ("purge", Record::Purge(id)),
        ("committed", Record::Committed(Some(id))),
        ("committed_none", Record::Committed(None)),
        // A purge up to the last index once overflowed at replay.
        (
            "purge_last",
            Record::Purge(LogId::new(CommittedLeaderId::new(3, 1), u64::MAX)),
        ),
    ] {
        put("raft_record", name, &e(rec.encode_for_fuzzing())?)?;
    }
    put(
        "raft_record",
        "checkpoint",
        &log_store::sample_checkpoint_for_fuzzing(),
    )?;
    put(
        "raft_record",
        "request",
        &e(codec::encode(&sample_request()))?,
    )?;
    // The engine's encoding of the request's commands alone.
    let mut cmds = Vec::new();
    Command::encode_all(sample_request().cmds(), &mut cmds);
    put("command_decode", "sample_request", &cmds)?;

    // A snapshot archive of two small files, and a meta file.
    let staging = tempfile_dir(root, "staging")?;
    let mut seg = vec![0u8; 3 * 4096];
    seg[..8].copy_from_slice(b"FENCELOG");
    seg[5000] = 1;
    std::fs::write(staging.join("00000000000000000001.wal"), &seg)?;
    std::fs::write(staging.join("MARKS"), b"marks")?;
    let packed = root.join("snapshot.tmp");
    crate::snapshot::pack(&staging, &packed)?;
    put("snapshot_unpack", "two_files", &std::fs::read(&packed)?)?;
    std::fs::remove_file(&packed)?;
    std::fs::remove_dir_all(&staging)?;
    let meta = openraft::SnapshotMeta {
        last_log_id: Some(id),
        last_membership: stored,
        snapshot_id: "3-42-1".into(),
    };
    put(
        "snapshot_unpack",
        "meta",
        &e(crate::snapshot::encode_meta(&meta))?,
    )?;

    // Peer streams: a hello, and frames (the MACs are put right by the
    // target).
    for secret in [false, true] {
        let mut hello = Vec::new();
        hello.extend_from_slice(b"FLRP");
        hello.push(crate::network::PROTOCOL_VERSION);
        hello.push(u8::from(secret));
        hello.extend_from_slice(&2u64.to_le_bytes());
        hello.extend_from_slice(&[9; 32]);
        hello.extend_from_slice(&[0; 32]);
        // The target's first byte says whether it has a secret.
        let name = if secret { "hello_secret" } else { "hello" };
        put(
            "peer_frame",
            name,
            &[&[u8::from(secret)][..], &hello].concat(),
        )?;
    }
    let append = openraft::raft::AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(id),
        entries: vec![
            entry(43, EntryPayload::Normal(sample_request())),
            entry(44, EntryPayload::Blank),
        ],
        leader_commit: Some(id),
    };
    put(
        "peer_frame",
        "append",
        &[
            &[0u8][..],
            &crate::network::fuzz::frame_of_request(0, append),
        ]
        .concat(),
    )?;
    Ok(())
}

fn tempfile_dir(root: &Path, name: &str) -> std::io::Result<std::path::PathBuf> {
    let d = root.join(name);
    if d.exists() {
        std::fs::remove_dir_all(&d)?;
    }
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
