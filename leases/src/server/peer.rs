//! Replica ↔ replica over the arbiter's QUIC port with mutual TLS: Raft's
//! RPCs (openraft's `RaftNetwork`) and what a follower hands its leader.
//!
//! Only a certificate naming an arbiter of this region may speak here, in
//! both directions: the server side is chosen by the caller's certificate
//! (`connection.rs` sends arbiter identities to `serve`), and the client side
//! checks the certificate of the replica it dialled. An agent's connection
//! never reaches this module, so an agent cannot speak Raft.
//!
//! One request per bidirectional stream: one `PeerRequest` frame, one
//! `PeerResponse` frame. A frame that is oversized or does not decode closes
//! the connection and reaches neither Raft nor the core.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use foldhash::HashMap;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};
use tokio::sync::{mpsc, oneshot};

mod members;

use crate::codec::{self, MAX_PEER_MESSAGE_BYTES};
use crate::endpoint::Role;
use crate::identity::Identity;
use crate::ids::ShardId;
use crate::name::Label;
use crate::peer_protocol::{
    decode_peer_request, decode_peer_response, encode_peer_request, encode_peer_response, raft_rpc,
    PeerRequest, PeerResponse, ShardRpc,
};
use crate::protocol::close_code;
use crate::raft::{CatalogRaft, ReplicaId};
use crate::server::messages::CoreMsg;
use crate::tls::{self, LiveTls};

/// Why a call to a peer replica failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PeerError {
    /// No connection could be made: the request was not sent.
    #[error("replica {addr} unreachable: {detail}")]
    Unreachable {
        /// The replica.
        addr: String,
        /// What failed.
        detail: String,
    },
    /// The connection failed after the request may have been sent.
    #[error("connection to replica {addr} lost: {detail}")]
    Lost {
        /// The replica.
        addr: String,
        /// What failed.
        detail: String,
    },
    /// No answer in time.
    #[error("replica {addr} did not answer within {ms} ms")]
    Timeout {
        /// The replica.
        addr: String,
        /// The limit.
        ms: u64,
    },
    /// The answer was not what the protocol allows.
    #[error("replica {addr} answered badly: {detail}")]
    Protocol {
        /// The replica.
        addr: String,
        /// What was wrong.
        detail: String,
    },
}

/// Longest wait for a handshake with a peer replica.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The client side: one cached QUIC connection per peer address.
pub struct Peers {
    endpoint: quinn::Endpoint,
    region: Label,
    conns: Mutex<HashMap<String, quinn::Connection>>,
}

impl Peers {
    /// A client endpoint presenting this replica's (arbiter) certificate,
    /// as `live` holds it at each handshake.
    pub fn new(live: &Arc<LiveTls>, region: Label) -> std::io::Result<Arc<Peers>> {
        let mut config = live
            .client_config(tls::ALPN)
            .map_err(std::io::Error::other)?;
        config.transport_config(crate::transport::config(crate::transport::Link::Peer));
        let bind: std::net::SocketAddr = ([0, 0, 0, 0], 0).into();
        let mut endpoint = quinn::Endpoint::client(bind)?;
        endpoint.set_default_client_config(config);
        Ok(Arc::new(Peers {
            endpoint,
            region,
            conns: Mutex::new(HashMap::default()),
        }))
    }

    fn cached(&self, addr: &str) -> Option<quinn::Connection> {
        let conns = self.conns.lock().expect("peer map lock");
        conns
            .get(addr)
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    async fn connect(&self, addr: &str) -> Result<quinn::Connection, PeerError> {
        if let Some(conn) = self.cached(addr) {
            return Ok(conn);
        }
        let unreachable = |detail: String| PeerError::Unreachable {
            addr: addr.to_owned(),
            detail,
        };
        let (host, _) = addr
            .rsplit_once(':')
            .ok_or_else(|| unreachable("not host:port".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let socket = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .next()
            .ok_or_else(|| unreachable("the name resolves to no address".into()))?;
        let conn = self
            .endpoint
            .connect(socket, host)
            .map_err(|e| unreachable(e.to_string()))?
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let identity = tls::peer_identity(&conn).map_err(|e| unreachable(e.to_string()))?;
        if identity.principal.role != Role::Arbiter || identity.region != self.region {
            conn.close(
                quinn::VarInt::from_u32(close_code::UNAUTHENTICATED),
                b"not an arbiter of this region",
            );
            return Err(unreachable(format!(
                "its certificate names {} of region {}, not an arbiter of region {}",
                identity.principal.role.as_str(),
                identity.region,
                self.region
            )));
        }
        // A handshake checks validity once: a replica whose certificate
        // expires is dialled again (with what it presents then).
        let expiring = conn.clone();
        tokio::spawn(async move {
            tokio::select! {
                reason = tls::peer_certificate_expired(&expiring) => expiring.close(
                    quinn::VarInt::from_u32(close_code::UNAUTHENTICATED),
                    &reason.as_bytes()[..reason.len().min(1000)],
                ),
                _ = expiring.closed() => {}
            }
        });
        self.conns
            .lock()
            .expect("peer map lock")
            .insert(addr.to_owned(), conn.clone());
        Ok(conn)
    }

    /// Whether the replica at `addr` completes a handshake within the
    /// connect timeout (the connection is kept for the next call).
    pub async fn reachable(&self, addr: &str) -> bool {
        matches!(
            tokio::time::timeout(CONNECT_TIMEOUT, self.connect(addr)).await,
            Ok(Ok(_))
        )
    }

    /// Sends `request` to the replica at `addr` and waits at most `timeout`
    /// for its answer.
    pub async fn call(
        &self,
        addr: &str,
        request: &PeerRequest,
        timeout: Duration,
    ) -> Result<PeerResponse, PeerError> {
        let bytes = encode_peer_request(request);
        let started = std::time::Instant::now();
        let exchange = async {
            // A live replica answers a handshake in milliseconds; a dead one
            // never does, and the caller may try another.
            let conn = match tokio::time::timeout(CONNECT_TIMEOUT.min(timeout), self.connect(addr))
                .await
            {
                Ok(conn) => conn?,
                Err(_) => {
                    return Err(PeerError::Unreachable {
                        addr: addr.to_owned(),
                        detail: format!("no handshake within {} ms", CONNECT_TIMEOUT.as_millis()),
                    })
                }
            };
            // A closed connection's reason says more than the stream error.
            let lost = |e: &dyn std::fmt::Display| PeerError::Lost {
                addr: addr.to_owned(),
                detail: match conn.close_reason() {
                    Some(reason) => format!("{e}: {reason}"),
                    None => e.to_string(),
                },
            };
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| lost(&e))?;
            codec::write_frame(&mut send, &bytes)
                .await
                .map_err(|e| lost(&e))?;
            let _ = send.finish();
            let answer = codec::read_frame(&mut recv, MAX_PEER_MESSAGE_BYTES)
                .await
                .map_err(|e| lost(&e))?;
            decode_peer_response(&answer).map_err(|e| PeerError::Protocol {
                addr: addr.to_owned(),
                detail: e.to_string(),
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => {
                tracing::trace!(
                    addr,
                    kind = request_kind(request),
                    ms = started.elapsed().as_millis() as u64,
                    ok = result.is_ok(),
                    "peer call"
                );
                result
            }
            Err(_) => {
                tracing::trace!(addr, kind = request_kind(request), "peer call timed out");
                Err(PeerError::Timeout {
                    addr: addr.to_owned(),
                    ms: timeout.as_millis() as u64,
                })
            }
        }
    }

    /// The local address peer calls leave from.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Closes every connection.
    pub fn close(&self) {
        self.endpoint.close(
            quinn::VarInt::from_u32(close_code::DONE),
            b"replica stopping",
        );
    }
}

/// openraft's network for shard `shard`'s group: a `PeerLink` per target
/// replica, over the replica's one `Peers` (every group shares its QUIC
/// connections).
#[derive(Clone)]
pub struct RaftNet {
    /// The replica's client to its peers.
    pub peers: Arc<Peers>,
    /// The group's shard.
    pub shard: ShardId,
}

impl RaftNetworkFactory<CatalogRaft> for RaftNet {
    type Network = PeerLink;

    async fn new_client(&mut self, target: ReplicaId, node: &BasicNode) -> PeerLink {
        PeerLink {
            target,
            addr: node.addr.clone(),
            peers: self.peers.clone(),
            shard: self.shard,
        }
    }
}

/// The link to one replica, for one shard's group.
pub struct PeerLink {
    target: ReplicaId,
    addr: String,
    peers: Arc<Peers>,
    shard: ShardId,
}

/// Shard 0's Raft messages go as they did before shards; every other
/// shard's are wrapped with the shard's number.
fn addressed(shard: ShardId, rpc: ShardRpc) -> PeerRequest {
    match (shard.0, rpc) {
        (0, ShardRpc::AppendEntries(rpc)) => PeerRequest::AppendEntries(rpc),
        (0, ShardRpc::Vote(rpc)) => PeerRequest::Vote(rpc),
        (0, ShardRpc::InstallSnapshot(rpc)) => PeerRequest::InstallSnapshot(rpc),
        (_, rpc) => PeerRequest::Shard { shard, rpc },
    }
}

type RpcError<E = openraft::error::Infallible> =
    RPCError<ReplicaId, BasicNode, RaftError<ReplicaId, E>>;

impl PeerLink {
    async fn call<E: std::error::Error>(
        &self,
        request: PeerRequest,
        option: &RPCOption,
        action: RPCTypes,
    ) -> Result<PeerResponse, RpcError<E>> {
        let timeout = option.hard_ttl();
        self.peers
            .call(&self.addr, &request, timeout)
            .await
            .map_err(|e| match e {
                PeerError::Unreachable { .. } | PeerError::Lost { .. } => {
                    RPCError::Unreachable(Unreachable::new(&e))
                }
                PeerError::Timeout { .. } => RPCError::Timeout(Timeout {
                    action,
                    id: 0,
                    target: self.target,
                    timeout,
                }),
                PeerError::Protocol { .. } => RPCError::Network(NetworkError::new(&e)),
            })
    }

    fn mismatch<E: std::error::Error>(&self, got: &PeerResponse) -> RpcError<E> {
        let detail = PeerError::Protocol {
            addr: self.addr.clone(),
            detail: format!("answered with {}", response_kind(got)),
        };
        RPCError::Network(NetworkError::new(&detail))
    }
}

fn request_kind(r: &PeerRequest) -> &'static str {
    match r {
        PeerRequest::AppendEntries(_) => "AppendEntries",
        PeerRequest::Vote(_) => "Vote",
        PeerRequest::InstallSnapshot(_) => "InstallSnapshot",
        PeerRequest::Propose(_) => "Propose",
        PeerRequest::Heard(_) => "Heard",
        PeerRequest::ReportDown { .. } => "ReportDown",
        PeerRequest::Membership(_) => "Membership",
        PeerRequest::Propagation { .. } => "Propagation",
        PeerRequest::Witnessed(_) => "Witnessed",
        PeerRequest::ProposeBatch(_) => "ProposeBatch",
        PeerRequest::Removed(_) => "Removed",
        PeerRequest::Shard { rpc, .. } => match rpc {
            ShardRpc::AppendEntries(_) => "Shard/AppendEntries",
            ShardRpc::Vote(_) => "Shard/Vote",
            ShardRpc::InstallSnapshot(_) => "Shard/InstallSnapshot",
            ShardRpc::Campaign { .. } => "Shard/Campaign",
            ShardRpc::Membership(_) => "Shard/Membership",
        },
    }
}

fn response_kind(r: &PeerResponse) -> &'static str {
    match r {
        PeerResponse::AppendEntries(_) => "AppendEntries",
        PeerResponse::Vote(_) => "Vote",
        PeerResponse::InstallSnapshot(_) => "InstallSnapshot",
        PeerResponse::Answer(_) => "Answer",
        PeerResponse::Refused(_) => "Refused",
        PeerResponse::HeardAsks { .. } => "HeardAsks",
        PeerResponse::Answers(_) => "Answers",
        PeerResponse::HeardProbes { .. } => "HeardProbes",
    }
}

impl RaftNetwork<CatalogRaft> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: raft_rpc::AppendEntries,
        option: RPCOption,
    ) -> Result<openraft::raft::AppendEntriesResponse<ReplicaId>, RpcError> {
        let answer = self
            .call(
                addressed(self.shard, ShardRpc::AppendEntries(rpc)),
                &option,
                RPCTypes::AppendEntries,
            )
            .await?;
        match answer {
            PeerResponse::AppendEntries(r) => {
                r.map_err(|e| RemoteError::new(self.target, e).into())
            }
            other => Err(self.mismatch(&other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: raft_rpc::InstallSnapshot,
        option: RPCOption,
    ) -> Result<openraft::raft::InstallSnapshotResponse<ReplicaId>, RpcError<InstallSnapshotError>>
    {
        let answer = self
            .call(
                addressed(self.shard, ShardRpc::InstallSnapshot(rpc)),
                &option,
                RPCTypes::InstallSnapshot,
            )
            .await?;
        match answer {
            PeerResponse::InstallSnapshot(r) => {
                r.map_err(|e| RemoteError::new(self.target, e).into())
            }
            other => Err(self.mismatch(&other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: raft_rpc::Vote,
        option: RPCOption,
    ) -> Result<openraft::raft::VoteResponse<ReplicaId>, RpcError> {
        let answer = self
            .call(
                addressed(self.shard, ShardRpc::Vote(rpc)),
                &option,
                RPCTypes::Vote,
            )
            .await?;
        match answer {
            PeerResponse::Vote(r) => r.map_err(|e| RemoteError::new(self.target, e).into()),
            other => Err(self.mismatch(&other)),
        }
    }
}

/// Serves a connection whose certificate names `identity`, an arbiter.
/// Another region's arbiter is refused.
pub async fn serve(
    conn: quinn::Connection,
    identity: Identity,
    context: super::connection::PeerContext,
    core: mpsc::Sender<CoreMsg>,
) {
    let region = context.region.clone();
    if identity.region != region {
        let reason = format!(
            "certificate is for region {}, this arbiter serves region {region}",
            identity.region
        );
        tracing::warn!(remote = %conn.remote_address(), reason = %reason, "peer refused");
        conn.close(
            quinn::VarInt::from_u32(close_code::UNAUTHENTICATED),
            reason.as_bytes(),
        );
        return;
    }
    let names = members::CertNames::of(&conn);
    if let Err(reason) = admission(&context, &names) {
        refuse(&conn, &identity, &context, &reason);
        return;
    }
    loop {
        let accepted = tokio::select! {
            accepted = conn.accept_bi() => accepted,
            reason = tls::peer_certificate_expired(&conn) => {
                tracing::warn!(peer = %identity, reason = %reason, "closing a peer replica's connection: its certificate expired");
                conn.close(
                    quinn::VarInt::from_u32(close_code::UNAUTHENTICATED),
                    &reason.as_bytes()[..reason.len().min(1000)],
                );
                return;
            }
            reason = context.tls.peer_revoked(&conn) => {
                tracing::warn!(target: "rollcall::audit", peer = %identity, reason = %reason, "closing a peer replica's connection: its certificate was revoked");
                conn.close(
                    quinn::VarInt::from_u32(close_code::UNAUTHENTICATED),
                    &reason.as_bytes()[..reason.len().min(1000)],
                );
                return;
            }
        };
        let Ok((send, recv)) = accepted else {
            return;
        };
        tokio::spawn(stream(
            conn.clone(),
            (identity.clone(), names.clone()),
            send,
            recv,
            context.clone(),
            core.clone(),
        ));
    }
}

async fn stream(
    conn: quinn::Connection,
    (identity, names): (Identity, members::CertNames),
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    context: super::connection::PeerContext,
    core: mpsc::Sender<CoreMsg>,
) {
    let request = match codec::read_frame(&mut recv, MAX_PEER_MESSAGE_BYTES).await {
        Ok(bytes) => decode_peer_request(&bytes).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let request = match request {
        Ok(request) => request,
        Err(reason) => {
            tracing::warn!(remote = %conn.remote_address(), reason = %reason, "bad frame from a peer replica; closing its connection");
            let reason = format!("bad peer frame: {reason}");
            conn.close(
                quinn::VarInt::from_u32(close_code::PROTOCOL),
                &reason.as_bytes()[..reason.len().min(1000)],
            );
            return;
        }
    };
    // Checked again at every request: membership changes under a
    // connection (a replica removed keeps no voice).
    let allowed =
        admission(&context, &names).and_then(|admitted| members::may_send(&admitted, &request));
    if let Err(reason) = allowed {
        refuse(&conn, &identity, &context, &reason);
        return;
    }
    let started = std::time::Instant::now();
    let kind = request_kind(&request);
    let answer = handle(request, &context, &core).await;
    tracing::debug!(
        kind,
        ms = started.elapsed().as_millis() as u64,
        "peer request served"
    );
    let _ = codec::write_frame(&mut send, &encode_peer_response(&answer)).await;
    let _ = send.finish();
}

/// Whom a peer with certificate names `names` may speak for in the group
/// as this replica knows it now.
fn admission(
    context: &super::connection::PeerContext,
    names: &members::CertNames,
) -> Result<members::Admission, String> {
    let metrics = context.raft.metrics();
    let metrics = metrics.borrow();
    members::admit(metrics.membership_config.membership(), names)
}

/// Closes a peer connection the membership check refused: counted in
/// `rollcall_arbiter_refusals_total{kind="peer"}` and audited (one line
/// per connection; the handshake rate per address bounds how many).
fn refuse(
    conn: &quinn::Connection,
    identity: &Identity,
    context: &super::connection::PeerContext,
    reason: &str,
) {
    context
        .metrics
        .refusals
        .get_or_create(&super::metrics::KindLabel { kind: "peer" })
        .inc();
    tracing::warn!(target: "rollcall::audit", peer = %identity, remote = %conn.remote_address(), reason = %reason, "peer replica refused");
    conn.close(
        quinn::VarInt::from_u32(close_code::UNAUTHENTICATED),
        &reason.as_bytes()[..reason.len().min(1000)],
    );
}

async fn handle(
    request: PeerRequest,
    context: &super::connection::PeerContext,
    core: &mpsc::Sender<CoreMsg>,
) -> PeerResponse {
    let (raft, timeout) = (&context.raft, context.timeout);
    match request {
        PeerRequest::AppendEntries(rpc) => {
            PeerResponse::AppendEntries(raft.append_entries(rpc).await)
        }
        PeerRequest::Vote(rpc) => PeerResponse::Vote(raft.vote(rpc).await),
        PeerRequest::InstallSnapshot(rpc) => {
            PeerResponse::InstallSnapshot(raft.install_snapshot(rpc).await)
        }
        PeerRequest::Membership(change) => PeerResponse::Answer(
            super::membership::change_membership(&context.shards, &context.peers, change, timeout)
                .await,
        ),
        PeerRequest::Removed(removal) => {
            PeerResponse::Answer(super::membership::removed(context, removal))
        }
        PeerRequest::Shard { shard, rpc } => {
            super::shards::serve(&context.shards, shard, rpc, timeout).await
        }
        other => {
            let (reply, answer) = oneshot::channel();
            if core
                .send(CoreMsg::Peer {
                    request: other,
                    reply,
                })
                .await
                .is_err()
            {
                return PeerResponse::Answer(crate::answers::unavailable(
                    "this replica is stopping".into(),
                ));
            }
            answer.await.unwrap_or_else(|_| {
                PeerResponse::Answer(crate::answers::unavailable(
                    "this replica is stopping".into(),
                ))
            })
        }
    }
}

/// Whether the error says this replica is not (or no longer) the leader.
pub fn is_forward(
    e: &RaftError<ReplicaId, openraft::error::ClientWriteError<ReplicaId, BasicNode>>,
) -> bool {
    matches!(
        e,
        RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(_))
    )
}
