//! Elections with Raft's two remedies for partitions, which openraft 0.9
//! lacks: PreVote and CheckQuorum.
//!
//! - **PreVote.** A node that has heard from no leader for an election
//!   timeout first asks its peers whether they would vote for it
//!   ([`PreVoteRequest`]); it starts a real election (a new term) only if a
//!   majority would. A peer says yes only if it has not heard from a leader
//!   for as long itself, and the candidate's log is at least as long as its
//!   own. So a node cut off from the group (a follower behind a partition,
//!   a leader that lost its followers) never raises its term, and when the
//!   cut heals it cannot depose the healthy leader with a higher one.
//!   openraft's own election timer is off (`Config::enable_elect`): this
//!   module starts every election, through `Raft::trigger().elect()`.
//! - **CheckQuorum.** A leader that has not heard from a quorum for an
//!   election timeout steps down: it grants a vote, in the next term, to no
//!   one (node 0, which never exists), which makes it a follower without
//!   starting an election of its own. Its clients are told `TRYAGAIN`, and
//!   a leader that can send but not hear (a one-way cut) no longer keeps its
//!   followers from electing another.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

// tokio's clock: the same as the OS monotonic clock, but for a runtime
// whose time is paused (the deterministic simulation).
use tokio::time::Instant;

use openraft::raft::VoteRequest;
use openraft::{LogId, ServerState, Vote};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::log_store::LogStore;
use crate::network::Network;
use crate::types::{Member, NodeId, Raft};

/// The node a stepping-down leader votes for: ids start at 1.
const NOBODY: NodeId = 0;

/// "Would you vote for me in `term`?"
// PreVoteRequest: bincode { term: u64 | candidate: u64 | last_log_id: Option<LogId> }
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PreVoteRequest {
    /// The term the candidate would start (its own plus one).
    pub term: u64,
    /// Who asks.
    pub candidate: NodeId,
    /// The candidate's last log entry.
    pub last_log_id: Option<LogId<NodeId>>,
}

/// What a node knows of its leader's liveness, and its election timing.
pub(crate) struct Election {
    /// When this node last heard from a leader (or led itself).
    contact: Mutex<Instant>,
    /// No campaign before then.
    next_campaign: Mutex<Instant>,
    /// A leader is considered gone after this long without contact: the
    /// upper end of the election timeout (openraft's leader lease, which
    /// its followers also wait out before they grant a real vote).
    silence: Duration,
    /// Campaigns wait `silence` plus up to this much more, at random, so
    /// that two nodes rarely campaign at once.
    spread: Duration,
    /// This node stepped down for want of a quorum (CheckQuorum) and has
    /// heard from no leader since: it is cut off, and names no primary.
    stepped_down: AtomicBool,
    /// The random spread's source when seeded (a simulation), else the
    /// OS's.
    seeded: Option<Mutex<u64>>,
}

impl Election {
    /// The timing of a node whose election timeout is `min_ms..=max_ms`.
    /// With `seed`, the random spread is drawn from it (the same seed, the
    /// same draws) instead of the OS.
    pub(crate) fn new(min_ms: u64, max_ms: u64, seed: Option<u64>) -> Arc<Election> {
        let now = Instant::now();
        Arc::new(Election {
            contact: Mutex::new(now),
            next_campaign: Mutex::new(now),
            silence: Duration::from_millis(max_ms),
            spread: Duration::from_millis(max_ms.saturating_sub(min_ms).max(1)),
            stepped_down: AtomicBool::new(false),
            seeded: seed.map(Mutex::new),
        })
    }

    fn random(&self) -> u64 {
        match &self.seeded {
            Some(state) => {
                // SplitMix64.
                let mut s = state.lock();
                *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = *s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            }
            None => rand_seed(),
        }
    }

    /// A leader's message arrived (an AppendEntries or a snapshot it
    /// accepted).
    pub(crate) fn heard_from_leader(&self) {
        *self.contact.lock() = Instant::now();
        self.stepped_down.store(false, Ordering::Release);
    }

    /// Whether this node stepped down for want of a quorum and has heard
    /// from no leader since (nor led again).
    pub(crate) fn stepped_down(&self) -> bool {
        self.stepped_down.load(Ordering::Acquire)
    }

    /// How long since this node last heard from a leader (or led).
    pub(crate) fn silent_for(&self) -> Duration {
        self.contact.lock().elapsed()
    }

    /// The silence after which a leader is taken for gone, and a leader
    /// that heard no quorum for as long has lost it.
    pub(crate) fn silence(&self) -> Duration {
        self.silence
    }

    /// The answer to a pre-vote: yes only if this node has no leader
    /// either and the candidate's log is at least as long as this node's.
    pub(crate) fn grant(&self, raft: &Raft, log: &LogStore, req: &PreVoteRequest) -> bool {
        let state = raft.metrics().borrow().state;
        if state == ServerState::Leader || self.silent_for() < self.silence {
            return false;
        }
        // Not only for a candidate whose term would pass this node's: one
        // behind in terms but ahead in log must be able to stand (it loses
        // its first real election, learns the term from the refusals, and
        // wins the next). Otherwise, with one voter unable to vote (a
        // replaced disk not yet re-added), a node with the longer log and
        // an older term and one with a newer term and a shorter log refuse
        // each other for ever: no leader, and no re-add (found by the
        // simulation, `fencelog-sim`). Real votes still decide.
        let grant = req.last_log_id >= log.last_log_id();
        if grant {
            // The candidate gets a timeout to win before this node stands
            // itself: two nodes campaigning at once made the first leader
            // lose to the second's higher term.
            self.schedule_next();
        }
        grant
    }

    /// A random wait before the next campaign.
    fn schedule_next(&self) {
        let jitter = self.spread.as_millis().max(1) as u64;
        let extra = Duration::from_millis(self.random() % jitter);
        *self.next_campaign.lock() = Instant::now() + self.silence + extra;
    }
}

/// A random number that differs between nodes and between calls (the
/// clock's nanoseconds if the OS cannot give one).
fn rand_seed() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.as_nanos() as u64);
    }
    u64::from_le_bytes(b)
}

/// Drives this node's elections and its leader's quorum check until Raft
/// shuts down.
pub(crate) async fn drive(
    election: Arc<Election>,
    raft: Raft,
    log: LogStore,
    network: Network,
    id: NodeId,
) {
    election.schedule_next();
    // When this leader first saw its quorum silent: it steps down only if
    // the silence outlasts half a timeout more (a heartbeat round), so a
    // leader that was itself paused asks its followers before it gives up.
    let mut silent_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let m = raft.metrics().borrow().clone();
        match m.state {
            ServerState::Shutdown => return,
            ServerState::Leader => {
                // Leading counts as contact: once it steps down, it waits a
                // whole timeout before it campaigns.
                election.heard_from_leader();
                if !quorum_silent(&m, election.silence) {
                    silent_since = None;
                    continue;
                }
                let since = *silent_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= election.silence / 2 {
                    // Set first: once the vote is granted this node follows
                    // no leader, and must not look like a node between
                    // leaders for a moment (it would name itself again).
                    election.stepped_down.store(true, Ordering::Release);
                    if !step_down(&raft, &log, m.current_term, id).await {
                        election.stepped_down.store(false, Ordering::Release);
                    }
                }
                continue;
            }
            ServerState::Learner => continue,
            ServerState::Follower | ServerState::Candidate => silent_since = None,
        }
        let membership = m.membership_config.membership().clone();
        if !membership.voter_ids().any(|v| v == id)
            || election.silent_for() < election.silence
            || Instant::now() < *election.next_campaign.lock()
        {
            continue;
        }
        election.schedule_next();
        let req = PreVoteRequest {
            term: m.current_term + 1,
            candidate: id,
            last_log_id: log.last_log_id(),
        };
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let mut asks = tokio::task::JoinSet::new();
        for peer in voters.iter().copied().filter(|p| *p != id) {
            let Some(member) = membership.get_node(&peer).cloned() else {
                continue;
            };
            let (network, req) = (network.clone(), req.clone());
            let wait = election.silence;
            asks.spawn(async move { network.pre_vote(peer, &member, &req, wait).await });
        }
        let mut yes = 1;
        while let Some(answer) = asks.join_next().await {
            if matches!(answer, Ok(Ok(true))) {
                yes += 1;
            }
        }
        // A leader heard from while the pre-votes were out (a round waits
        // for its slowest answer) is not deposed: the majority's yes
        // predates it. (The simulation's seed 222 saw a node campaign 130
        // ms after another won, moving the term for nothing.)
        if yes * 2 > voters.len() && election.silent_for() < election.silence {
            tracing::debug!(
                pre_votes = yes,
                "a leader was heard from during the pre-votes: not campaigning"
            );
        } else if yes * 2 > voters.len() {
            tracing::info!(
                event = "election",
                term = req.term,
                pre_votes = yes,
                voters = voters.len(),
                "no leader heard for an election timeout and a majority would vote: campaigning"
            );
            if let Err(e) = raft.trigger().elect().await {
                tracing::warn!(error = %e, "starting an election failed");
            }
        } else {
            tracing::debug!(
                pre_votes = yes,
                voters = voters.len(),
                "no majority would vote: not campaigning (the term stays)"
            );
        }
    }
}

/// Whether a leader (as `m` shows it) has heard from no quorum for longer
/// than `silence`: CheckQuorum steps it down half a `silence` later, and
/// meanwhile it answers no client as the leader (`Node::refusal`). A
/// leader alone in its group always has its quorum; one elected a moment
/// ago that no quorum acknowledged yet has not lost it (its voters just
/// granted it their votes).
pub(crate) fn quorum_silent(m: &openraft::RaftMetrics<NodeId, Member>, silence: Duration) -> bool {
    m.state == ServerState::Leader
        && several_voters(m.membership_config.membership())
        && m.millis_since_quorum_ack
            .is_some_and(|ms| Duration::from_millis(ms) > silence)
}

/// Whether `membership` names any voter. Asked on every client request:
/// openraft's `voter_ids` builds a set (clones of each configuration's),
/// this reads them in place.
pub(crate) fn any_voter(membership: &openraft::Membership<NodeId, Member>) -> bool {
    membership.get_joint_config().iter().any(|c| !c.is_empty())
}

/// Whether `membership` names more than one voter (as [`any_voter`]).
pub(crate) fn several_voters(membership: &openraft::Membership<NodeId, Member>) -> bool {
    let mut ids = membership.get_joint_config().iter().flatten();
    ids.next()
        .is_some_and(|first| ids.any(|other| other != first))
}

/// CheckQuorum: the leader grants its vote for the next term to nobody,
/// which ends its leadership without an election of its own.
/// Answers whether it stepped down.
async fn step_down(raft: &Raft, log: &LogStore, term: u64, id: NodeId) -> bool {
    let req = VoteRequest::new(Vote::new(term + 1, NOBODY), log.last_log_id());
    match raft.vote(req).await {
        Ok(r) if r.vote_granted => {
            tracing::warn!(
                event = "leader_stepped_down",
                node = id,
                term,
                "no quorum answered for an election timeout: this leader stepped down"
            );
            true
        }
        // Its own lease not run out yet: asked again on the next round.
        Ok(_) => false,
        Err(e) => {
            tracing::warn!(error = %e, "stepping down failed");
            false
        }
    }
}

#[cfg(test)]
mod voter_tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// The in-place checks agree with openraft's `voter_ids` on single and
    /// joint configurations, empty ones included.
    #[test]
    fn voter_checks_agree_with_openraft() {
        let configs: Vec<Vec<Vec<u64>>> = vec![
            vec![vec![]],
            vec![vec![1]],
            vec![vec![1, 2, 3]],
            vec![vec![1], vec![1]],
            vec![vec![1], vec![2]],
            vec![vec![1], vec![1, 2]],
            vec![vec![], vec![4]],
            vec![vec![2, 3], vec![3]],
        ];
        for joint in configs {
            let sets: Vec<BTreeSet<u64>> =
                joint.iter().map(|c| c.iter().copied().collect()).collect();
            let nodes: BTreeMap<u64, Member> = sets
                .iter()
                .flatten()
                .map(|id| (*id, Member::default()))
                .collect();
            let m = openraft::Membership::new(sets, nodes);
            let n = m.voter_ids().count();
            assert_eq!(any_voter(&m), n > 0, "{joint:?}");
            assert_eq!(several_voters(&m), n > 1, "{joint:?}");
        }
    }
}
