//! One QUIC connection on the arbiter: authenticates the caller by its
//! certificate; an arbiter of this region is a peer replica (`peer.rs`),
//! anyone else an agent or controller, whose session stream and request
//! streams this module reads and whose answers it writes. Thin: every
//! decision is the core's.
//!
//! A frame that is oversized or does not decode closes the whole connection
//! with an error saying why; it never reaches the core, so it changes
//! nothing.
//!
//! It also applies `[limits]` (issue 20) at the edge, before anything
//! reaches the core: handshakes per source address (refused before any
//! TLS work), connections per identity (closed with the reason), requests
//! per connection (answered "unavailable, retry" with the reason) and
//! messages per session stream (the stream is not read until the rate
//! allows, so QUIC's flow control holds the sender back). And it closes a
//! connection whose peer's certificate expires, with the reason.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollcall_config::LimitsConfig;
use tokio::sync::{mpsc, oneshot};

use crate::codec::{self, FrameKind, MAX_SMALL_MESSAGE_BYTES};
use crate::endpoint::Role;
use crate::identity::Identity;
use crate::ids::AgentId;
use crate::limits::{Bucket, Buckets, Counts, Limit, Rate};
use crate::name::Label;
use crate::protocol::{close_code, RejectKind, Response};
use crate::raft::CatalogRaftNode;
use crate::server::messages::{CoreMsg, Outbound};
use crate::server::metrics::Metrics;
use crate::server::peer;
use crate::tls;

/// Most source addresses whose handshake rate is tracked at once.
const MAX_TRACKED_ADDRESSES: usize = 65_536;

/// What every connection of one replica shares: the `[limits]`, what they
/// count, and the metrics a hit is counted in.
pub struct Guards {
    limits: LimitsConfig,
    metrics: Arc<Metrics>,
    origin: Instant,
    handshakes: Mutex<Buckets<IpAddr>>,
    connections: Mutex<Counts<Identity>>,
}

impl Guards {
    /// Nothing counted yet.
    pub fn new(limits: LimitsConfig, metrics: Arc<Metrics>) -> Arc<Guards> {
        Arc::new(Guards {
            handshakes: Mutex::new(Buckets::new(
                Rate::new(limits.handshakes_per_second, limits.handshake_burst),
                MAX_TRACKED_ADDRESSES,
            )),
            connections: Mutex::new(Counts::new(limits.connections_per_identity as usize)),
            limits,
            metrics,
            origin: Instant::now(),
        })
    }

    /// Monotonic ms for the buckets.
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Counts a hit of `limit`, and logs it at the 1st, 2nd, 4th, 8th… hit
    /// (a flood must not flood the log too).
    fn hit(&self, limit: Limit, detail: &str) {
        let hits = self.metrics.hit(limit);
        if hits.is_power_of_two() {
            tracing::warn!(limit = limit.as_str(), hits, detail, "arbiter limit hit");
        }
    }

    /// Whether a handshake from `source` may start now.
    fn handshake(&self, source: IpAddr) -> bool {
        let now = self.now_ms();
        let taken = self
            .handshakes
            .lock()
            .expect("handshake limiter lock")
            .take(&source, now);
        if taken.is_err() {
            self.hit(
                Limit::HandshakesPerAddress,
                &format!("{source} started more than limits.handshakes_per_second handshakes"),
            );
        }
        taken.is_ok()
    }

    /// A connection slot for `identity`, or the reason to close with.
    fn admit(self: &Arc<Self>, identity: &Identity) -> Result<Slot, String> {
        let added = self
            .connections
            .lock()
            .expect("connection counts lock")
            .add(identity);
        match added {
            Ok(()) => Ok(Slot {
                guards: self.clone(),
                identity: identity.clone(),
            }),
            Err(held) => {
                let reason = format!(
                    "{identity} already holds {held} connections to this arbiter (limits.connections_per_identity); close one first"
                );
                self.hit(Limit::ConnectionsPerIdentity, &reason);
                Err(reason)
            }
        }
    }

    fn requests(&self) -> Bucket {
        let l = &self.limits;
        Bucket::new(
            Rate::new(l.requests_per_second, l.request_burst),
            self.now_ms(),
        )
    }

    fn session_messages(&self) -> Bucket {
        let l = &self.limits;
        Bucket::new(
            Rate::new(l.session_messages_per_second, l.session_message_burst),
            self.now_ms(),
        )
    }
}

/// One connection counted against its identity until dropped.
struct Slot {
    guards: Arc<Guards>,
    identity: Identity,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.guards
            .connections
            .lock()
            .expect("connection counts lock")
            .remove(&self.identity);
    }
}

/// What a peer replica's connection is served with.
#[derive(Clone)]
pub struct PeerContext {
    /// This replica's Raft node (shard 0's group, whose membership every
    /// shard's group shares).
    pub raft: CatalogRaftNode,
    /// Every shard's group on this replica.
    pub shards: super::shards::Shards,
    /// This replica's region.
    pub region: Label,
    /// How long a forwarded write may take.
    pub timeout: std::time::Duration,
    /// The client to the other replicas (the leader tells a removed one).
    pub peers: std::sync::Arc<super::peer::Peers>,
    /// Whether this replica was removed from its group.
    pub removed: super::removal::Removed,
    /// The TLS material in use (its deny list closes revoked sessions).
    pub tls: std::sync::Arc<crate::tls::LiveTls>,
    /// Where refused peers are counted.
    pub metrics: std::sync::Arc<super::metrics::Metrics>,
}

/// How long a refused peer gets to read the refusal before the arbiter
/// closes the connection itself.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

fn close(conn: &quinn::Connection, code: u32, reason: &str) {
    let reason = &reason.as_bytes()[..reason.len().min(1000)];
    conn.close(quinn::VarInt::from_u32(code), reason);
}

/// Accepts connections until the endpoint closes. A source address over
/// its handshake rate is refused before any TLS work.
pub async fn accept_loop(
    endpoint: quinn::Endpoint,
    core: mpsc::Sender<CoreMsg>,
    peers: PeerContext,
    guards: Arc<Guards>,
) {
    let next = Arc::new(AtomicU64::new(1));
    while let Some(incoming) = endpoint.accept().await {
        if !guards.handshake(incoming.remote_address().ip()) {
            incoming.refuse();
            continue;
        }
        let agent = next.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(serve(
            incoming,
            agent,
            core.clone(),
            peers.clone(),
            guards.clone(),
        ));
    }
}

async fn serve(
    incoming: quinn::Incoming,
    agent: AgentId,
    core: mpsc::Sender<CoreMsg>,
    peers: PeerContext,
    guards: Arc<Guards>,
) {
    let conn = match incoming.await {
        Ok(conn) => conn,
        Err(e) => {
            tracing::debug!(error = %e, "handshake failed");
            return;
        }
    };
    let identity = match tls::peer_identity(&conn) {
        Ok(identity) => identity,
        Err(e) => {
            tracing::warn!(remote = %conn.remote_address(), error = %e, "connection without a rollcall identity refused");
            close(&conn, close_code::UNAUTHENTICATED, &e.to_string());
            return;
        }
    };
    if identity.principal.role == Role::Arbiter {
        peer::serve(conn, identity, peers, core).await;
        return;
    }
    if let Some(removal) = peers.removed.get() {
        close(&conn, close_code::REFUSED, &removal.describe());
        return;
    }
    let _slot = match guards.admit(&identity) {
        Ok(slot) => slot,
        Err(reason) => {
            close(&conn, close_code::REFUSED, &reason);
            return;
        }
    };
    let certified = tls::peer_ip_sans(&conn);
    let (tx, rx) = mpsc::unbounded_channel();
    if core
        .send(CoreMsg::Connected {
            agent,
            identity,
            certified,
            tx,
        })
        .await
        .is_err()
    {
        // The core is gone: the arbiter is shutting down. Say so, rather
        // than let the dropped connection close with no reason.
        close(&conn, close_code::DONE, "arbiter shutting down");
        return;
    }
    let (session_tx, session_rx) = oneshot::channel();
    let writer = tokio::spawn(write_loop(
        conn.clone(),
        agent,
        rx,
        session_rx,
        core.clone(),
    ));
    tokio::select! {
        _ = read_streams(&conn, agent, &core, session_tx, &guards) => {}
        reason = tls::peer_certificate_expired(&conn) => {
            tracing::warn!(agent, reason = %reason, "closing a session whose peer certificate expired");
            close(&conn, close_code::UNAUTHENTICATED, &reason);
        }
        reason = peers.tls.peer_revoked(&conn) => {
            tracing::warn!(target: "rollcall::audit", agent, reason = %reason, "closing a session whose peer certificate was revoked");
            close(&conn, close_code::UNAUTHENTICATED, &reason);
        }
        removal = peers.removed.wait() => {
            close(&conn, close_code::REFUSED, &removal.describe());
        }
    }
    writer.abort();
    let _ = core.send(CoreMsg::Closed { agent }).await;
}

/// Accepts the peer's streams: the first whose first frame is a session
/// message becomes the session; every other carries one request.
async fn read_streams(
    conn: &quinn::Connection,
    agent: AgentId,
    core: &mpsc::Sender<CoreMsg>,
    session_tx: oneshot::Sender<quinn::SendStream>,
    guards: &Arc<Guards>,
) {
    let mut session_tx = Some(session_tx);
    let mut requests = guards.requests();
    loop {
        let (send, mut recv) = match conn.accept_bi().await {
            Ok(pair) => pair,
            Err(_) => return,
        };
        let first = match codec::read_frame(&mut recv, MAX_SMALL_MESSAGE_BYTES).await {
            Ok(frame) => frame,
            Err(e) => {
                close(
                    conn,
                    close_code::PROTOCOL,
                    &format!("bad first frame on a stream: {e}"),
                );
                return;
            }
        };
        if first.get(1) == Some(&(FrameKind::SessionUp as u8)) {
            let Some(tx) = session_tx.take() else {
                close(
                    conn,
                    close_code::PROTOCOL,
                    "a second session stream on one connection",
                );
                return;
            };
            let _ = tx.send(send);
            tokio::spawn(read_session(
                conn.clone(),
                agent,
                recv,
                first,
                core.clone(),
                guards.clone(),
            ));
        } else if let Err(wait_ms) = requests.take(guards.now_ms()) {
            let l = &guards.limits;
            let reason = format!(
                "rate limit: this connection sent more than {} requests per second (burst {}; arbiter limits.requests_per_second); retry in {wait_ms} ms",
                l.requests_per_second, l.request_burst
            );
            guards.hit(Limit::Requests, &reason);
            tokio::spawn(refuse_request(send, reason));
        } else {
            tokio::spawn(serve_request(
                conn.clone(),
                agent,
                send,
                first,
                core.clone(),
            ));
        }
    }
}

/// Answers a request over the connection's rate as unavailable: the agent
/// keeps the write pending and retries.
async fn refuse_request(mut send: quinn::SendStream, message: String) {
    let response = Response::Rejected {
        kind: RejectKind::Unavailable,
        message,
    };
    if codec::write_frame(&mut send, &codec::encode_response(&response))
        .await
        .is_ok()
    {
        let _ = send.finish();
    }
}

async fn read_session(
    conn: quinn::Connection,
    agent: AgentId,
    mut recv: quinn::RecvStream,
    first: Vec<u8>,
    core: mpsc::Sender<CoreMsg>,
    guards: Arc<Guards>,
) {
    let mut frame = first;
    let mut messages = guards.session_messages();
    loop {
        // Over the rate, the stream is not read on until a message is due
        // (QUIC's flow control then holds the sender back).
        let mut counted = false;
        while let Err(wait_ms) = messages.take(guards.now_ms()) {
            if !counted {
                counted = true;
                guards.hit(
                    Limit::SessionMessages,
                    &format!("session {agent} sent more than limits.session_messages_per_second"),
                );
            }
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        }
        match codec::decode_session_up(&frame) {
            Ok(msg) => {
                if core.send(CoreMsg::Session { agent, msg }).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(agent, error = %e, "malformed session message; closing the connection");
                close(&conn, close_code::PROTOCOL, &e.to_string());
                return;
            }
        }
        frame = match codec::read_frame(&mut recv, MAX_SMALL_MESSAGE_BYTES).await {
            Ok(frame) => frame,
            Err(codec::FrameError::Closed) => return,
            Err(e) => {
                close(&conn, close_code::PROTOCOL, &format!("session stream: {e}"));
                return;
            }
        };
    }
}

async fn serve_request(
    conn: quinn::Connection,
    agent: AgentId,
    mut send: quinn::SendStream,
    frame: Vec<u8>,
    core: mpsc::Sender<CoreMsg>,
) {
    let request = match codec::decode_request(&frame) {
        Ok(request) => request,
        Err(e) => {
            tracing::warn!(agent, error = %e, "malformed request; closing the connection");
            close(&conn, close_code::PROTOCOL, &e.to_string());
            return;
        }
    };
    let (reply, answer) = oneshot::channel();
    if core
        .send(CoreMsg::Request {
            agent,
            request,
            reply,
        })
        .await
        .is_err()
    {
        return;
    }
    let Ok(response) = answer.await else { return };
    let bytes = codec::encode_response(&response);
    if codec::write_frame(&mut send, &bytes).await.is_ok() {
        let _ = send.finish();
    }
}

async fn write_loop(
    conn: quinn::Connection,
    agent: AgentId,
    mut rx: mpsc::UnboundedReceiver<Outbound>,
    session: oneshot::Receiver<quinn::SendStream>,
    core: mpsc::Sender<CoreMsg>,
) {
    let mut session = Some(session);
    let mut send: Option<quinn::SendStream> = None;
    loop {
        tokio::select! {
            biased;
            stream = async { session.as_mut().expect("guarded").await }, if session.is_some() => {
                session = None;
                send = stream.ok();
            }
            out = rx.recv() => {
                // Every message answers something read from the session
                // stream, so that stream is on its way: a message never
                // overtakes it (bounded, in case the connection is dying).
                if send.is_none() && matches!(out, Some(Outbound::Message { .. })) {
                    if let Some(pending) = session.take() {
                        send = tokio::time::timeout(CLOSE_GRACE, pending)
                            .await
                            .ok()
                            .and_then(Result::ok);
                    }
                }
                match out {
                    None => return,
                    Some(Outbound::Close(reason)) => {
                        // Let a refusal written just before reach the peer: finish
                        // the stream and give the peer a moment to read it and
                        // close first.
                        if let Some(stream) = send.as_mut() {
                            let _ = stream.finish();
                            let _ = tokio::time::timeout(CLOSE_GRACE, conn.closed()).await;
                        }
                        close(&conn, close_code::REFUSED, &reason);
                        return;
                    }
                    Some(Outbound::Message { message, notify }) => {
                        let Some(stream) = send.as_mut() else { continue };
                        let bytes = codec::encode_session_down(&message);
                        // The chaos suite's wire faults (`fault.rs`): the
                        // core carries on as if the message had been sent.
                        #[cfg(feature = "fault-injection")]
                        let bytes = {
                            let mut bytes = bytes;
                            match crate::fault::outgoing(agent, &message, &mut bytes) {
                                crate::fault::FaultAction::Send => bytes,
                                crate::fault::FaultAction::Drop => {
                                    if notify && core.send(CoreMsg::Sent { agent }).await.is_err() {
                                        return;
                                    }
                                    continue;
                                }
                                crate::fault::FaultAction::Cut => {
                                    close(&conn, close_code::DONE, "fault injected: session cut");
                                    return;
                                }
                            }
                        };
                        if let Err(e) = codec::write_frame(stream, &bytes).await {
                            tracing::debug!(agent, error = %e, "session write failed");
                            return;
                        }
                        if notify && core.send(CoreMsg::Sent { agent }).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    }
}
