//! Which peers answer: the leader's view of its members' health.
//!
//! openraft 0.9's metrics carry each follower's matched entry, which stands
//! still in an idle group, and no time of the last answer. So the peer
//! network Raft is given is wrapped here ([`Watched`]): every answer a peer
//! sends (an AppendEntries or heartbeat reply, a snapshot chunk's, a
//! vote's, a refusal included: a peer that refuses is alive) records when
//! it came. A leader heartbeats every half election timeout, so a member it
//! has not heard from for a whole election timeout is down, cut off, or
//! too slow to follow (`CLUSTER NODES` flags it `fail`, `CLUSTER SHARDS`
//! says `failed`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{InstallSnapshotError, RPCError, RaftError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use parking_lot::Mutex;

use crate::network::Network;
use crate::types::{Member, NodeId, TypeConfig};

/// When each peer last answered this node's Raft messages.
#[derive(Default)]
pub(crate) struct PeerAnswers {
    last: Mutex<HashMap<NodeId, Instant>>,
}

impl PeerAnswers {
    fn answered(&self, peer: NodeId) {
        self.last.lock().insert(peer, Instant::now());
    }

    /// How long ago `peer` last answered, if it ever did since this node
    /// started.
    pub(crate) fn since(&self, peer: NodeId) -> Option<Duration> {
        self.last.lock().get(&peer).map(Instant::elapsed)
    }
}

/// Whether an RPC's outcome shows the peer alive: it answered, perhaps
/// with a refusal (a remote error); not a network error or a timeout.
fn alive<T, E: std::error::Error>(r: &Result<T, RPCError<NodeId, Member, E>>) -> bool {
    matches!(r, Ok(_) | Err(RPCError::RemoteError(_)))
}

/// The peer network, each answer recorded in [`PeerAnswers`].
pub(crate) struct Watched {
    pub(crate) inner: Network,
    pub(crate) answers: Arc<PeerAnswers>,
    /// Where AppendEntries with entries count their round trips.
    pub(crate) timings: Arc<crate::timings::Timings>,
}

impl RaftNetworkFactory<TypeConfig> for Watched {
    type Network = WatchedClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> WatchedClient {
        WatchedClient {
            inner: self.inner.new_client(target, node).await,
            target,
            answers: Arc::clone(&self.answers),
            timings: Arc::clone(&self.timings),
        }
    }
}

/// One target's client, its answers recorded.
pub(crate) struct WatchedClient {
    inner: <Network as RaftNetworkFactory<TypeConfig>>::Network,
    target: NodeId,
    answers: Arc<PeerAnswers>,
    timings: Arc<crate::timings::Timings>,
}

impl WatchedClient {
    fn note<T, E: std::error::Error>(&self, r: &Result<T, RPCError<NodeId, Member, E>>) {
        if alive(r) {
            self.answers.answered(self.target);
        }
    }
}

/// What an RPC to a peer answers: its reply, or why there is none.
type RpcResult<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, Member, E>>;

impl RaftNetwork<TypeConfig> for WatchedClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        // Heartbeats are not timed.
        let started = (!rpc.entries.is_empty()).then(Instant::now);
        let r = self.inner.append_entries(rpc, option).await;
        if let Some(started) = started
            && r.is_ok()
        {
            self.timings.replications.since(started);
        }
        self.note(&r);
        r
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        let r = self.inner.install_snapshot(rpc, option).await;
        self.note(&r);
        r
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        let r = self.inner.vote(rpc, option).await;
        self.note(&r);
        r
    }
}
