//! A history checker for fenced streams and leases under faults.
//!
//! A test records every operation it runs against a cluster (which client,
//! what, when it was invoked and when its answer came, and the answer),
//! then reads every stream in full once the faults are over, and asks
//! [`check`] whether that history could have happened on a correct
//! fencelog. What is checked (each a [`Violation`] naming the operations):
//!
//! - **No acknowledged write lost**: every append answered with an offset
//!   is in the final stream at that offset, with its payload.
//! - **No phantom or doubled write**: every final record is a payload some
//!   append sent (payloads are unique), at most once; one answered with a
//!   definite refusal (STALE, MOVED, …) is not there at all.
//! - **Fencing**: along each final stream the tokens never decrease, and no
//!   append with token `t` is acknowledged when it began after an append
//!   or a fence with a token above `t` was acknowledged.
//! - **Tokens strictly increase**: a token is granted to one lease and
//!   owner only (the holder acquiring again gets its token again), and a
//!   new grant that began after another was answered has the larger token.
//! - **One linear history, no stale read**: every read agrees with the
//!   final stream record by record; a read that began after an append was
//!   acknowledged sees it; a read that began after another read was
//!   answered sees at least as much.
//!
//! Timestamps are nanoseconds from any fixed origin, taken on one machine.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// What a client asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `LOG.APPEND stream token payload` (one payload, unique in the run).
    Append {
        /// The stream.
        stream: String,
        /// The token sent.
        token: u64,
        /// The payload sent.
        payload: Vec<u8>,
    },
    /// `LOG.FENCE stream token`.
    Fence {
        /// The stream.
        stream: String,
        /// The token sent.
        token: u64,
    },
    /// `LOG.READ stream from COUNT n`.
    Read {
        /// The stream.
        stream: String,
        /// The first offset asked for.
        from: u64,
    },
    /// `LEASE.ACQUIRE name owner ttl`.
    Acquire {
        /// The lease.
        name: String,
        /// Who asks (a holder that acquires again gets its token again).
        owner: String,
    },
    /// `LEASE.RENEW name owner token ttl` (the ttl of the acquisitions).
    Renew {
        /// The lease.
        name: String,
        /// Its holder.
        owner: String,
        /// The token of its grant.
        token: u64,
    },
}

/// A record as a read answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its offset.
    pub offset: u64,
    /// The token it was appended with.
    pub token: u64,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// What the client got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An append's offset.
    Appended(u64),
    /// A fence's highest token.
    Fenced(u64),
    /// A read's records.
    Records(Vec<Record>),
    /// A lease's token.
    Granted(u64),
    /// A renewal accepted: the lease lasts its ttl from then on.
    Renewed,
    /// A refusal that changed nothing (STALE, HELD, MOVED, TRYAGAIN, …).
    Refused(String),
    /// No answer, or one that leaves the effect unknown (a timeout, a
    /// dropped connection): it may or may not have happened.
    Unknown(String),
}

/// One operation: who, what, when, and what came back.
#[derive(Debug, Clone)]
pub struct Event {
    /// The client that ran it (clients run one operation at a time).
    pub client: u32,
    /// What it asked.
    pub op: Op,
    /// When it was sent (ns).
    pub invoked: u64,
    /// When its answer came, or the client gave up (ns).
    pub completed: u64,
    /// The answer.
    pub outcome: Outcome,
}

/// A way the history could not have happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An acknowledged append is not in the final stream where it said.
    LostWrite {
        /// The stream.
        stream: String,
        /// The offset it was acknowledged at.
        offset: u64,
        /// What the final stream holds there (`None`: the stream is shorter).
        found: Option<Vec<u8>>,
    },
    /// A final record no append sent, or sent once but there twice.
    PhantomOrDoubled {
        /// The stream.
        stream: String,
        /// The record's offset.
        offset: u64,
    },
    /// A refused append's payload is in the final stream.
    RefusedButWritten {
        /// The stream.
        stream: String,
        /// Where it is.
        offset: u64,
        /// What the refusal said.
        refusal: String,
    },
    /// The final stream's tokens go down at `offset`.
    TokenWentDown {
        /// The stream.
        stream: String,
        /// The offset whose token is below its predecessor's.
        offset: u64,
        /// The token before.
        before: u64,
        /// The token at `offset`.
        token: u64,
    },
    /// An append with `token` was acknowledged though it began after one
    /// with `newer` had been acknowledged on the same stream.
    StaleAccepted {
        /// The stream.
        stream: String,
        /// The stale token accepted.
        token: u64,
        /// The newer token acknowledged before it began.
        newer: u64,
    },
    /// Two grants with the same token, or a later grant with a smaller one.
    TokenNotIncreasing {
        /// The earlier grant's token.
        earlier: u64,
        /// The later grant's token.
        later: u64,
    },
    /// A lease was granted to another owner while an earlier grant's ttl
    /// had certainly not run out: the later grant was answered before the
    /// earlier one's request was even sent plus its ttl. (The group's clock
    /// runs no faster than real time, so no correct group does this.)
    LeaseOverlap {
        /// The lease.
        name: String,
        /// The earlier grant's token.
        earlier: u64,
        /// The later grant's token (another owner's).
        later: u64,
        /// How long before the earlier lease could end the later one was
        /// answered, in ms.
        overlap_ms: u64,
    },
    /// A read disagrees with the final stream at `offset`.
    ReadDiverges {
        /// The stream.
        stream: String,
        /// The offset.
        offset: u64,
    },
    /// A read missed a write acknowledged before it began (or went back
    /// behind an earlier read).
    StaleRead {
        /// The stream.
        stream: String,
        /// The next offset the read saw.
        saw: u64,
        /// The next offset known before the read began.
        known: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// Lease exclusion, judged against real time: every grant and renewal in
/// `history` was asked for with `ttl_ms` (and none released), so the
/// lease of token `t` lasts at least until the last request answered `t`
/// (or renewing `t`, accepted) was sent, plus `ttl_ms`. A grant of a
/// larger token to another owner answered before then overlaps it.
pub fn check_lease_exclusion(history: &[Event], ttl_ms: u64) -> Vec<Violation> {
    let ttl_ns = ttl_ms.saturating_mul(1_000_000);
    // Per lease: per token, its owner and the last request it answered.
    let mut leases: BTreeMap<&str, BTreeMap<u64, (&str, u64)>> = BTreeMap::new();
    let mut answered: Vec<(&str, u64, &str, u64)> = Vec::new();
    for e in history {
        if let (Op::Acquire { name, owner }, Outcome::Granted(t)) = (&e.op, &e.outcome) {
            let entry = leases
                .entry(name.as_str())
                .or_default()
                .entry(*t)
                .or_insert((owner.as_str(), e.invoked));
            entry.1 = entry.1.max(e.invoked);
            answered.push((name.as_str(), *t, owner.as_str(), e.completed));
        }
    }
    // An accepted renewal extends its grant's lease: its ttl runs at the
    // earliest from when it was sent.
    for e in history {
        if let (Op::Renew { name, owner, token }, Outcome::Renewed) = (&e.op, &e.outcome) {
            let entry = leases
                .entry(name.as_str())
                .or_default()
                .entry(*token)
                .or_insert((owner.as_str(), e.invoked));
            entry.1 = entry.1.max(e.invoked);
        }
    }
    let mut v = Vec::new();
    for (name, later, owner, completed) in answered {
        let Some(tokens) = leases.get(name) else {
            continue;
        };
        for (&earlier, &(earlier_owner, sent)) in tokens.range(..later) {
            let ends = sent.saturating_add(ttl_ns);
            if earlier_owner != owner && completed < ends {
                v.push(Violation::LeaseOverlap {
                    name: name.to_string(),
                    earlier,
                    later,
                    overlap_ms: (ends - completed) / 1_000_000,
                });
            }
        }
    }
    v
}

/// Checks `history` against `final_streams` (each stream read in full after
/// the faults were healed); answers every violation found.
pub fn check(history: &[Event], final_streams: &BTreeMap<String, Vec<Record>>) -> Vec<Violation> {
    let mut v = Vec::new();
    let empty = Vec::new();
    let stream_of = |s: &str| final_streams.get(s).unwrap_or(&empty);

    // Payload → every append that sent it (payloads are unique per run;
    // a retried payload is the same operation sent again).
    let mut sent: HashMap<(&str, &[u8]), Vec<&Event>> = HashMap::new();
    for e in history {
        if let Op::Append {
            stream, payload, ..
        } = &e.op
        {
            sent.entry((stream.as_str(), payload.as_slice()))
                .or_default()
                .push(e);
        }
    }

    // Acknowledged appends are where they said.
    for e in history {
        if let (
            Op::Append {
                stream, payload, ..
            },
            Outcome::Appended(offset),
        ) = (&e.op, &e.outcome)
        {
            let found = stream_of(stream)
                .iter()
                .find(|r| r.offset == *offset)
                .map(|r| r.payload.clone());
            if found.as_deref() != Some(payload.as_slice()) {
                v.push(Violation::LostWrite {
                    stream: stream.clone(),
                    offset: *offset,
                    found,
                });
            }
        }
    }

    for (stream, records) in final_streams {
        // No phantom, no double, nothing refused.
        let mut seen: HashMap<&[u8], u64> = HashMap::new();
        for r in records {
            let senders = sent.get(&(stream.as_str(), r.payload.as_slice()));
            let doubled = seen.insert(&r.payload, r.offset).is_some();
            match senders {
                None => v.push(Violation::PhantomOrDoubled {
                    stream: stream.clone(),
                    offset: r.offset,
                }),
                Some(_) if doubled => v.push(Violation::PhantomOrDoubled {
                    stream: stream.clone(),
                    offset: r.offset,
                }),
                Some(events) => {
                    let ok = events
                        .iter()
                        .any(|e| !matches!(e.outcome, Outcome::Refused(_)));
                    if !ok && let Some(Outcome::Refused(why)) = events.first().map(|e| &e.outcome) {
                        v.push(Violation::RefusedButWritten {
                            stream: stream.clone(),
                            offset: r.offset,
                            refusal: why.clone(),
                        });
                    }
                }
            }
        }
        // Tokens never go down along the stream.
        for pair in records.windows(2) {
            if pair[1].token < pair[0].token {
                v.push(Violation::TokenWentDown {
                    stream: stream.clone(),
                    offset: pair[1].offset,
                    before: pair[0].token,
                    token: pair[1].token,
                });
            }
        }
    }

    // No stale token acknowledged after a newer one was: per stream, the
    // acknowledged fencing writes by completion time, and each acknowledged
    // append against the highest completed before it began.
    let mut acked: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for e in history {
        let (stream, token) = match (&e.op, &e.outcome) {
            (Op::Append { stream, token, .. }, Outcome::Appended(_)) => (stream, *token),
            (Op::Fence { stream, token }, Outcome::Fenced(_)) => (stream, *token),
            _ => continue,
        };
        acked.entry(stream).or_default().push((e.completed, token));
    }
    let mut highest_by: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for (stream, mut list) in acked {
        list.sort();
        let mut high = 0;
        let prefix = list
            .into_iter()
            .map(|(at, t)| {
                high = high.max(t);
                (at, high)
            })
            .collect();
        highest_by.insert(stream, prefix);
    }
    let highest_before = |stream: &str, at: u64| -> u64 {
        highest_by.get(stream).map_or(0, |list| {
            let n = list.partition_point(|(done, _)| *done < at);
            if n == 0 { 0 } else { list[n - 1].1 }
        })
    };
    for e in history {
        if let (Op::Append { stream, token, .. }, Outcome::Appended(_)) = (&e.op, &e.outcome) {
            let newer = highest_before(stream, e.invoked);
            if newer > *token {
                v.push(Violation::StaleAccepted {
                    stream: stream.clone(),
                    token: *token,
                    newer,
                });
            }
        }
    }

    // Grants: a token belongs to one lease and owner; a new grant (not a
    // holder's re-grant) is larger than every grant answered before it
    // began.
    let mut grants: Vec<(u64, u64, u64, (&str, &str))> = history
        .iter()
        .filter_map(|e| match (&e.op, &e.outcome) {
            (Op::Acquire { name, owner }, Outcome::Granted(t)) => {
                Some((e.invoked, e.completed, *t, (name.as_str(), owner.as_str())))
            }
            _ => None,
        })
        .collect();
    grants.sort_by_key(|g| g.1);
    let mut holder_of: HashMap<u64, (&str, &str)> = HashMap::new();
    let mut first_grant: HashMap<u64, u64> = HashMap::new();
    for g in &grants {
        match holder_of.get(&g.2) {
            Some(h) if *h != g.3 => v.push(Violation::TokenNotIncreasing {
                earlier: g.2,
                later: g.2,
            }),
            Some(_) => {}
            None => {
                holder_of.insert(g.2, g.3);
            }
        }
        let first = first_grant.entry(g.2).or_insert(g.1);
        *first = (*first).min(g.1);
    }
    // The largest token among grants answered before each new one began.
    let mut high = 0u64;
    let mut done_prefix: Vec<(u64, u64)> = Vec::with_capacity(grants.len());
    for g in &grants {
        high = high.max(g.2);
        done_prefix.push((g.1, high));
    }
    // An acquire whose answer was lost (a timeout, UNCERTAIN) may still
    // have been granted, and the owner's next acquire of the same lease is
    // then answered that grant's token: the token may date from the
    // earliest such acquire before this one, not from this one.
    let mut unknown_since: HashMap<(&str, &str), Vec<u64>> = HashMap::new();
    for e in history {
        if let (Op::Acquire { name, owner }, Outcome::Unknown(_)) = (&e.op, &e.outcome) {
            unknown_since
                .entry((name.as_str(), owner.as_str()))
                .or_default()
                .push(e.invoked);
        }
    }
    for g in &grants {
        // A re-grant: its token was answered before this one began.
        if first_grant.get(&g.2).is_some_and(|&first| first < g.0) {
            continue;
        }
        let began = unknown_since
            .get(&g.3)
            .and_then(|list| list.iter().copied().filter(|&i| i < g.0).min())
            .unwrap_or(g.0);
        let n = done_prefix.partition_point(|(done, _)| *done < began);
        if n > 0 && done_prefix[n - 1].1 >= g.2 {
            v.push(Violation::TokenNotIncreasing {
                earlier: done_prefix[n - 1].1,
                later: g.2,
            });
        }
    }

    // Reads: agree with the final stream; see everything known before
    // they began (acknowledged appends, earlier reads).
    let mut known: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for e in history {
        let (stream, next) = match (&e.op, &e.outcome) {
            (Op::Append { stream, .. }, Outcome::Appended(o)) => (stream, o + 1),
            (Op::Read { stream, from }, Outcome::Records(rs)) => {
                (stream, rs.last().map_or(*from, |r| r.offset + 1))
            }
            _ => continue,
        };
        known.entry(stream).or_default().push((e.completed, next));
    }
    let mut known_by: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for (stream, mut list) in known {
        list.sort();
        let mut high = 0;
        known_by.insert(
            stream,
            list.into_iter()
                .map(|(at, n)| {
                    high = high.max(n);
                    (at, high)
                })
                .collect(),
        );
    }
    for e in history {
        let (Op::Read { stream, from }, Outcome::Records(rs)) = (&e.op, &e.outcome) else {
            continue;
        };
        let fin = stream_of(stream);
        for r in rs {
            if fin.iter().find(|f| f.offset == r.offset) != Some(r) {
                v.push(Violation::ReadDiverges {
                    stream: stream.clone(),
                    offset: r.offset,
                });
                break;
            }
        }
        let saw = rs.last().map_or(*from, |r| r.offset + 1);
        let before = known_by.get(stream.as_str()).map_or(0, |list| {
            let n = list.partition_point(|(done, _)| *done < e.invoked);
            if n == 0 { 0 } else { list[n - 1].1 }
        });
        if saw < before {
            v.push(Violation::StaleRead {
                stream: stream.clone(),
                saw,
                known: before,
            });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(client: u32, at: (u64, u64), token: u64, payload: &str, outcome: Outcome) -> Event {
        Event {
            client,
            op: Op::Append {
                stream: "s".into(),
                token,
                payload: payload.as_bytes().to_vec(),
            },
            invoked: at.0,
            completed: at.1,
            outcome,
        }
    }

    fn rec(offset: u64, token: u64, payload: &str) -> Record {
        Record {
            offset,
            token,
            payload: payload.as_bytes().to_vec(),
        }
    }

    fn read(at: (u64, u64), records: Vec<Record>) -> Event {
        Event {
            client: 9,
            op: Op::Read {
                stream: "s".into(),
                from: 0,
            },
            invoked: at.0,
            completed: at.1,
            outcome: Outcome::Records(records),
        }
    }

    fn fin(records: Vec<Record>) -> BTreeMap<String, Vec<Record>> {
        BTreeMap::from([("s".to_string(), records)])
    }

    fn good() -> (Vec<Event>, BTreeMap<String, Vec<Record>>) {
        let h = vec![
            append(1, (0, 10), 5, "a", Outcome::Appended(0)),
            append(2, (11, 20), 6, "b", Outcome::Appended(1)),
            append(1, (21, 30), 5, "c", Outcome::Refused("STALE".into())),
            append(1, (31, 40), 7, "d", Outcome::Unknown("timeout".into())),
            read((41, 50), vec![rec(0, 5, "a"), rec(1, 6, "b")]),
            Event {
                client: 3,
                op: Op::Acquire {
                    name: "l".into(),
                    owner: "x".into(),
                },
                invoked: 0,
                completed: 5,
                outcome: Outcome::Granted(1),
            },
            Event {
                client: 3,
                op: Op::Acquire {
                    name: "l".into(),
                    owner: "y".into(),
                },
                invoked: 6,
                completed: 9,
                outcome: Outcome::Granted(2),
            },
            // x holds m and acquires it again: the same token, later.
            Event {
                client: 4,
                op: Op::Acquire {
                    name: "m".into(),
                    owner: "x".into(),
                },
                invoked: 1,
                completed: 2,
                outcome: Outcome::Granted(0),
            },
            Event {
                client: 4,
                op: Op::Acquire {
                    name: "m".into(),
                    owner: "x".into(),
                },
                invoked: 10,
                completed: 12,
                outcome: Outcome::Granted(0),
            },
        ];
        (h, fin(vec![rec(0, 5, "a"), rec(1, 6, "b")]))
    }

    #[test]
    fn a_correct_history_passes_with_an_unknown_write_in_or_out() {
        let (h, f) = good();
        assert_eq!(check(&h, &f), vec![]);
        let with_unknown = fin(vec![rec(0, 5, "a"), rec(1, 6, "b"), rec(2, 7, "d")]);
        assert_eq!(check(&h, &with_unknown), vec![]);
    }

    #[test]
    fn a_token_granted_by_an_acquire_whose_answer_was_lost_may_come_back_later() {
        let acquire = |owner: &str, at: (u64, u64), outcome| Event {
            client: 9,
            op: Op::Acquire {
                name: "n".into(),
                owner: owner.into(),
            },
            invoked: at.0,
            completed: at.1,
            outcome,
        };
        let f = fin(vec![]);
        // z's first acquire timed out (it was granted token 5); y got 7
        // later; z asks again and is answered its grant: 5.
        let h = vec![
            acquire("z", (100, 110), Outcome::Unknown("timeout".into())),
            acquire("y", (120, 130), Outcome::Granted(7)),
            acquire("z", (140, 150), Outcome::Granted(5)),
        ];
        assert_eq!(check(&h, &f), vec![]);
        // Without the lost answer, 5 after 7 is a token going down.
        let v = check(&h[1..], &f);
        assert!(
            matches!(
                v.as_slice(),
                [Violation::TokenNotIncreasing {
                    earlier: 7,
                    later: 5
                }]
            ),
            "{v:?}"
        );
        // A lost answer after the grant it would excuse excuses nothing.
        let late = vec![
            acquire("y", (120, 130), Outcome::Granted(7)),
            acquire("z", (140, 150), Outcome::Granted(5)),
            acquire("z", (160, 170), Outcome::Unknown("timeout".into())),
        ];
        assert_eq!(check(&late, &f).len(), 1);
    }

    #[test]
    fn every_kind_of_violation_is_found() {
        let (h, _) = good();
        // Lost: b acknowledged at 1, missing.
        let v = check(&h, &fin(vec![rec(0, 5, "a")]));
        assert!(
            matches!(v[0], Violation::LostWrite { offset: 1, .. }),
            "{v:?}"
        );
        // Refused but written, and the token went down.
        let v = check(
            &h,
            &fin(vec![rec(0, 5, "a"), rec(1, 6, "b"), rec(2, 5, "c")]),
        );
        assert!(
            v.iter()
                .any(|x| matches!(x, Violation::RefusedButWritten { offset: 2, .. })),
            "{v:?}"
        );
        assert!(
            v.iter()
                .any(|x| matches!(x, Violation::TokenWentDown { offset: 2, .. })),
            "{v:?}"
        );
        // Phantom and doubled.
        let v = check(
            &h,
            &fin(vec![
                rec(0, 5, "a"),
                rec(1, 6, "b"),
                rec(2, 6, "zz"),
                rec(3, 6, "b"),
            ]),
        );
        assert_eq!(
            v.iter()
                .filter(|x| matches!(x, Violation::PhantomOrDoubled { .. }))
                .count(),
            2,
            "{v:?}"
        );
        // A stale token acknowledged after a newer one was.
        let mut stale = h.clone();
        stale[2].outcome = Outcome::Appended(2);
        let v = check(
            &stale,
            &fin(vec![rec(0, 5, "a"), rec(1, 6, "b"), rec(2, 5, "c")]),
        );
        assert!(
            v.iter().any(|x| matches!(
                x,
                Violation::StaleAccepted {
                    token: 5,
                    newer: 6,
                    ..
                }
            )),
            "{v:?}"
        );
        // Tokens: repeated, and going down in real time.
        let mut grants = h.clone();
        grants[6].outcome = Outcome::Granted(1);
        let v = check(&grants, &fin(vec![rec(0, 5, "a"), rec(1, 6, "b")]));
        assert!(
            v.iter()
                .any(|x| matches!(x, Violation::TokenNotIncreasing { .. })),
            "{v:?}"
        );
        // A stale read (misses b, acknowledged before it began), a
        // diverging one, and one behind an earlier read.
        let mut reads = h.clone();
        reads[4].outcome = Outcome::Records(vec![rec(0, 5, "a")]);
        let v = check(&reads, &fin(vec![rec(0, 5, "a"), rec(1, 6, "b")]));
        assert!(
            v.iter().any(|x| matches!(
                x,
                Violation::StaleRead {
                    saw: 1,
                    known: 2,
                    ..
                }
            )),
            "{v:?}"
        );
        reads[4].outcome = Outcome::Records(vec![rec(0, 5, "a"), rec(1, 6, "x")]);
        let v = check(&reads, &fin(vec![rec(0, 5, "a"), rec(1, 6, "b")]));
        assert!(
            v.iter()
                .any(|x| matches!(x, Violation::ReadDiverges { offset: 1, .. })),
            "{v:?}"
        );
        let mut back = h.clone();
        back.push(read(
            (60, 70),
            vec![rec(0, 5, "a"), rec(1, 6, "b"), rec(2, 7, "d")],
        ));
        back.push(read((80, 90), vec![rec(0, 5, "a"), rec(1, 6, "b")]));
        let v = check(
            &back,
            &fin(vec![rec(0, 5, "a"), rec(1, 6, "b"), rec(2, 7, "d")]),
        );
        assert!(
            v.iter().any(|x| matches!(
                x,
                Violation::StaleRead {
                    saw: 2,
                    known: 3,
                    ..
                }
            )),
            "{v:?}"
        );
    }

    /// A millisecond of the histories below, in their nanoseconds.
    const MS: u64 = 1_000_000;

    /// `owner` granted lease "job" with token `t`: sent at `sent` ms,
    /// answered at `done` ms.
    fn grant(owner: &str, t: u64, sent: u64, done: u64) -> Event {
        Event {
            client: 0,
            op: Op::Acquire {
                name: "job".into(),
                owner: owner.into(),
            },
            invoked: sent * MS,
            completed: done * MS,
            outcome: Outcome::Granted(t),
        }
    }

    #[test]
    fn a_grant_to_another_owner_inside_the_ttl_is_an_overlap() {
        // a holds token 1 from 0 ms (ttl 400): b's grant answered at 300 ms
        // overlaps; one answered at 450 ms does not.
        let h = [grant("a", 1, 0, 10), grant("b", 2, 250, 300)];
        assert_eq!(
            check_lease_exclusion(&h, 400),
            vec![Violation::LeaseOverlap {
                name: "job".into(),
                earlier: 1,
                later: 2,
                overlap_ms: 100
            }]
        );
        let h = [grant("a", 1, 0, 10), grant("b", 2, 420, 450)];
        assert!(check_lease_exclusion(&h, 400).is_empty());
        // a re-acquired at 200 ms (same token): its lease runs to 600 ms.
        let h = [
            grant("a", 1, 0, 10),
            grant("a", 1, 200, 210),
            grant("b", 2, 420, 450),
        ];
        assert_eq!(check_lease_exclusion(&h, 400).len(), 1);
    }
    #[test]
    fn an_accepted_renewal_extends_the_lease_and_a_refused_one_does_not() {
        let ms = MS;
        let renew = |sent: u64, outcome| Event {
            client: 0,
            op: Op::Renew {
                name: "job".into(),
                owner: "a".into(),
                token: 1,
            },
            invoked: sent * ms,
            completed: (sent + 5) * ms,
            outcome,
        };
        // a holds token 1 from 0 ms (ttl 400) and renews at 300 ms: its
        // lease runs to 700 ms, so b's grant answered at 450 ms overlaps.
        let h = [
            grant("a", 1, 0, 10),
            renew(300, Outcome::Renewed),
            grant("b", 2, 420, 450),
        ];
        assert_eq!(
            check_lease_exclusion(&h, 400),
            vec![Violation::LeaseOverlap {
                name: "job".into(),
                earlier: 1,
                later: 2,
                overlap_ms: 250
            }]
        );
        // A refused renewal (LOST) extends nothing.
        let h = [
            grant("a", 1, 0, 10),
            renew(300, Outcome::Refused("LOST".into())),
            grant("b", 2, 420, 450),
        ];
        assert!(check_lease_exclusion(&h, 400).is_empty());
        // Renewals are no grants: the stream and token checks pass them by.
        let f = BTreeMap::new();
        assert_eq!(
            check(&[grant("a", 1, 0, 10), renew(300, Outcome::Renewed)], &f),
            vec![]
        );
    }
}
