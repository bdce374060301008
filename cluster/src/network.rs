//! Raft's messages between nodes, over TCP: one connection per target,
//! one request at a time, each a length-prefixed bincode frame.
//!
//! ```text
//! // frame: { len: u32 LE | bincode(Rpc or RpcReply) }   len ≤ MAX_FRAME
//! ```
//!
//! A node that cannot be reached is reported as such, and Raft backs off
//! before trying it again.

use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::types::{Member, NodeId, Raft, TypeConfig};

/// The largest frame accepted from a peer: a batch of entries or a
/// snapshot chunk, never more.
const MAX_FRAME: usize = 256 << 20;

#[derive(Serialize, Deserialize)]
enum Rpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

#[derive(Serialize, Deserialize)]
enum RpcReply {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
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

/// bincode with a bound: a frame never decodes to more than its length.
fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
}

async fn write_frame<T: Serialize>(s: &mut TcpStream, msg: &T) -> std::io::Result<()> {
    use bincode::Options;
    let body = codec().serialize(msg).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(std::io::Error::other)?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&body);
    s.write_all(&buf).await
}

async fn read_frame<T: for<'de> Deserialize<'de>>(s: &mut TcpStream) -> std::io::Result<T> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a frame of {len} bytes (at most {MAX_FRAME})"
        )));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await?;
    use bincode::Options;
    codec().deserialize(&body).map_err(std::io::Error::other)
}

/// Makes a client per target node.
#[derive(Clone, Default)]
pub struct Network {
    /// The address this node's connections come from: the one it listens
    /// on for peers, so that a peer (or a firewall) tells nodes apart by
    /// address even when they share a host (127.0.0.x on one machine).
    pub source: Option<std::net::IpAddr>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Client {
        Client {
            target,
            addr: node.raft_addr.clone(),
            source: self.source,
            conn: None,
        }
    }
}

/// The connection to one target.
pub struct Client {
    target: NodeId,
    addr: String,
    source: Option<std::net::IpAddr>,
    conn: Option<TcpStream>,
}

async fn connect(addr: &str, source: Option<std::net::IpAddr>) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(addr).await;
    };
    let mut last = None;
    for target in tokio::net::lookup_host(addr).await? {
        let socket = match target {
            std::net::SocketAddr::V4(_) if source.is_ipv4() => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) if source.is_ipv6() => tokio::net::TcpSocket::new_v6()?,
            _ => {
                last = Some(TcpStream::connect(target).await);
                continue;
            }
        };
        socket.bind(std::net::SocketAddr::new(source, 0))?;
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
    async fn call(&mut self, rpc: &Rpc, timeout: Duration) -> std::io::Result<RpcReply> {
        let result = tokio::time::timeout(timeout, async {
            if self.conn.is_none() {
                let s = connect(&self.addr, self.source).await?;
                s.set_nodelay(true)?;
                self.conn = Some(s);
            }
            let conn = self
                .conn
                .as_mut()
                .ok_or_else(|| std::io::Error::other("no connection"))?;
            write_frame(conn, rpc).await?;
            read_frame(conn).await
        })
        .await
        .unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from node {} in {timeout:?}", self.target),
            ))
        });
        if result.is_err() {
            // The stream may hold half a frame: start over next time.
            self.conn = None;
        }
        result
    }
}

fn unreachable<E: std::error::Error>(e: std::io::Error) -> RPCError<NodeId, Member, E> {
    if e.kind() == std::io::ErrorKind::TimedOut {
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
/// dropped or aborted (which ends every peer connection with it).
pub async fn serve(listener: TcpListener, raft: Raft) {
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
        let _ = stream.set_nodelay(true);
        let raft = raft.clone();
        peers.spawn(async move {
            loop {
                let rpc: Rpc = match read_frame(&mut stream).await {
                    Ok(r) => r,
                    Err(_) => return,
                };
                let reply = match rpc {
                    Rpc::Append(r) => RpcReply::Append(raft.append_entries(r).await),
                    Rpc::Vote(r) => RpcReply::Vote(raft.vote(r).await),
                    Rpc::Snapshot(r) => RpcReply::Snapshot(raft.install_snapshot(r).await),
                };
                if let Err(e) = write_frame(&mut stream, &reply).await {
                    tracing::debug!(%peer, error = %e, "a peer went away");
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Request, WireCommand};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};

    fn entry(index: u64, bytes: usize) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request {
                time_ms: 1,
                cmds: vec![WireCommand::Append {
                    stream: b"s".to_vec(),
                    token: 1,
                    payloads: vec![serde_bytes::ByteBuf::from(vec![7u8; bytes])],
                }],
            }),
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
}
