//! The simulated network: every message between nodes goes through
//! [`SimNet`], which drops, delays (and so reorders), or black-holes it
//! per the links' state and the seed, then hands it to the target's
//! [`PeerEndpoint`] (the same admission and answer as the TCP listener).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fencelog_cluster::{
    NodeId, PeerEndpoint, PeerError, PeerReply, PeerRequest, Transport, TransportFuture,
};
use parking_lot::Mutex;

use crate::{Rng, Trace};

/// What the links do now.
#[derive(Default)]
pub(crate) struct Links {
    /// Reachable nodes (a node down has none).
    pub endpoints: BTreeMap<NodeId, PeerEndpoint>,
    /// One-way cuts: a message from `.0` to `.1` (or its reply, from `.1`
    /// to `.0`, on the cut's side) never arrives.
    pub cut: BTreeSet<(NodeId, NodeId)>,
    /// Messages dropped per thousand (the sender sees an error).
    pub drop_per_mille: u64,
    /// Each hop's delay is drawn from this range (ms).
    pub delay_ms: (u64, u64),
}

impl Links {
    pub(crate) fn heal(&mut self) {
        self.cut.clear();
        self.drop_per_mille = 0;
        self.delay_ms = (0, 2);
    }
}

/// How one message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Deliver,
    Drop,
    Cut,
}

/// The network of one simulated group (shared by all its nodes).
#[derive(Clone)]
pub struct SimNet {
    pub(crate) links: Arc<Mutex<Links>>,
    rng: Arc<Mutex<Rng>>,
    trace: Trace,
}

fn refused(what: &'static str) -> PeerError {
    PeerError::Io {
        what,
        source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "simulated"),
    }
}

impl SimNet {
    pub(crate) fn new(seed: u64, trace: Trace) -> SimNet {
        let mut links = Links::default();
        links.heal();
        SimNet {
            links: Arc::new(Mutex::new(links)),
            rng: Arc::new(Mutex::new(Rng::new(seed ^ 0x6e65_7477_6f72_6b21))),
            trace,
        }
    }

    fn decide(&self, from: NodeId, to: NodeId) -> (Fate, Duration, Duration) {
        let links = self.links.lock();
        let mut rng = self.rng.lock();
        let (lo, hi) = links.delay_ms;
        let mut delay = || Duration::from_millis(lo + rng.below(hi.saturating_sub(lo) + 1));
        let (there, back) = (delay(), delay());
        let fate = if links.cut.contains(&(from, to)) {
            Fate::Cut
        } else if rng.below(1000) < links.drop_per_mille {
            Fate::Drop
        } else {
            Fate::Deliver
        };
        (fate, there, back)
    }

    fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.links.lock().cut.contains(&(from, to))
    }

    fn endpoint(&self, to: NodeId) -> Option<PeerEndpoint> {
        self.links.lock().endpoints.get(&to).cloned()
    }
}

impl Transport for SimNet {
    fn call(
        &self,
        from: NodeId,
        to: NodeId,
        expected: u64,
        req: PeerRequest,
    ) -> TransportFuture<PeerReply> {
        let net = self.clone();
        Box::pin(async move {
            let (fate, there, back) = net.decide(from, to);
            net.trace.note(format_args!(
                "msg {from}>{to} {} {} {fate:?}",
                req.kind(),
                req.len()
            ));
            match fate {
                // A black hole: the sender's own timeout ends the call.
                Fate::Cut => std::future::pending::<()>().await,
                Fate::Drop => {
                    tokio::time::sleep(there).await;
                    return Err(refused("sending (dropped by the simulation)"));
                }
                Fate::Deliver => {}
            }
            tokio::time::sleep(there).await;
            // Delivered as things are on arrival: the target may be down,
            // or the link cut meanwhile.
            if net.is_cut(from, to) {
                std::future::pending::<()>().await;
            }
            let Some(endpoint) = net.endpoint(to) else {
                return Err(refused("connecting (the node is down)"));
            };
            let reply = endpoint.answer(expected, req).await?;
            tokio::time::sleep(back).await;
            if net.is_cut(to, from) {
                std::future::pending::<()>().await;
            }
            Ok(reply)
        })
    }

    fn probe(&self, from: NodeId, to: NodeId) -> TransportFuture<u64> {
        let net = self.clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if net.is_cut(from, to) || net.is_cut(to, from) {
                std::future::pending::<()>().await;
            }
            match net.endpoint(to) {
                Some(e) => Ok(e.incarnation()),
                None => Err(refused("probing (the node is down)")),
            }
        })
    }
}
