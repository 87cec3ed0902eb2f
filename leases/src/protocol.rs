//! The messages between a node agent and an arbiter (R3, R6), carried over
//! QUIC with mutual TLS.
//!
//! An agent holds one connection. Its first bidirectional stream is the
//! session: the agent says `Hello` (which grants or renews its node lease),
//! then subscribes, acknowledges, renews and keeps the session alive on it,
//! and the arbiter pushes `Update`s back. Every write (register, transition,
//! drain, deregister) travels on a bidirectional stream of its own: one
//! `Request`, one `Response`. Each message is one length-prefixed codec
//! frame (`codec::write_frame` / `read_frame`).
//!
//! This module only defines the vocabulary; who may say what is the
//! server's authorization, and what it means is the catalog's.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::Registration;
use crate::delta_log::ServiceDelta;
use crate::endpoint::{Liveness, State};
use crate::ids::{AgentEpoch, CatalogId, Generation, LeaseId, Revision, ShardId};
use crate::name::{InstanceId, Label, NodeId, Reason, ServiceKey};

/// The ALPN protocol id of this protocol.
pub const ALPN: &[u8] = b"rollcall/1";

/// Agent → arbiter, on the session stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SessionUp {
    /// First message: who this agent run is. Grants (or re-grants) the node
    /// lease; must name the node of the agent's certificate.
    Hello {
        /// The node.
        node: NodeId,
        /// This agent run.
        epoch: AgentEpoch,
        /// The node's zone.
        zone: Label,
        /// The addresses the node's instances may register (the agent's
        /// `advertise_addresses`, else its certificate's IP SANs, else
        /// the host's interface addresses); at most [`MAX_DECLARED_ADDRESSES`].
        /// When the certificate carries IP SANs, every address here must
        /// be one of them.
        addresses: Vec<std::net::IpAddr>,
    },
    /// Follow a service of a shard. `have` is the revision of the service's
    /// last change the agent holds; `None` asks for a full snapshot.
    Subscribe {
        /// The service.
        service: ServiceKey,
        /// The shard the agent expects it in (resume tokens name the shard).
        shard: ShardId,
        /// What the agent already holds.
        have: Option<Revision>,
    },
    /// Stop following a service.
    Unsubscribe {
        /// The service.
        service: ServiceKey,
    },
    /// The agent applied the service up to this revision (R6: the arbiter
    /// learns how far each proxy lags).
    Ack {
        /// The service.
        service: ServiceKey,
        /// The revision applied.
        revision: Revision,
    },
    /// Renew the node lease (every TTL/3, jittered).
    Renew,
    /// The session is alive. Agents no longer send it on a timer (the
    /// arbiter asks with `SessionDown::Probe` when it needs to know, R4);
    /// an arbiter still accepts it from older agents, as any message that
    /// counts the session heard.
    Keepalive,
    /// The answer to `SessionDown::Witness`: what this agent can tell of
    /// a node whose session the arbiter no longer hears.
    Witnessed {
        /// The node asked about.
        node: NodeId,
        /// Its agent run the arbiter asked about.
        epoch: AgentEpoch,
        /// `Some(true)` when this agent's gossip holds the node alive,
        /// `Some(false)` when it holds it down, `None` when its gossip
        /// does not know the node (another zone, or gossip off).
        gossip: Option<bool>,
        /// `Some(true)` when a TCP connect to one of the addresses asked
        /// about completed, `Some(false)` when none did within the
        /// agent's connect timeout, `None` when none was given.
        reachable: Option<bool>,
    },
    /// The answer to `SessionDown::Probe`, sent at once by the agent's
    /// session actor (never queued behind the agent's other work): the
    /// node's process runs and reaches this replica.
    Alive {
        /// The probe's number, echoed.
        nonce: u64,
    },
}

/// Most addresses one `Hello` declares.
pub const MAX_DECLARED_ADDRESSES: usize = 16;

/// Most addresses one `SessionDown::Witness` names.
pub const MAX_WITNESS_ADDRESSES: usize = 4;

/// Arbiter → agent, on the session stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SessionDown {
    /// Answer to `Hello`: the lease and how to keep it.
    Welcome {
        /// The arbiter's region.
        region: Label,
        /// The shard this arbiter serves.
        shard: ShardId,
        /// The catalog's identity (`None` only until a new group's first
        /// leader named it). An agent whose cache was filled from another
        /// catalog discards it.
        catalog: Option<CatalogId>,
        /// The shard's current revision.
        revision: Revision,
        /// The node's lease.
        lease: LeaseId,
        /// Its time to live; renew every third of it.
        ttl_ms: u64,
    },
    /// Changes for subscribed services, merged when they arrived together.
    Update(Vec<ServiceUpdate>),
    /// The policies of the followed services and the other regions'
    /// summaries of them (R9), replacing the previous such message; sent
    /// when it changes and, while other regions are known, again before the
    /// agent's copy of their ages gets old.
    Regions(crate::regions::RegionsUpdate),
    /// The session is refused and will be closed.
    Refused {
        /// Why, in words an operator can act on.
        reason: String,
    },
    /// The arbiter no longer hears `node`'s session past its lease: say
    /// what this agent sees of it (`SessionUp::Witnessed`): whether its
    /// gossip holds the node alive, and whether one of `addresses` (the
    /// node's endpoints, at most [`MAX_WITNESS_ADDRESSES`]) accepts a TCP
    /// connection. The arbiter acts on a silent lease only with its
    /// witnesses (R3, R4).
    Witness {
        /// The node.
        node: NodeId,
        /// Its agent run.
        epoch: AgentEpoch,
        /// Where its endpoints listen.
        addresses: Vec<std::net::SocketAddr>,
    },
    /// Is this node alive? Asked when a gossip down report or a silent
    /// lease needs the arbiter's own signal (R4): an answer
    /// (`SessionUp::Alive`) within `lease.probe_timeout_ms` says alive.
    Probe {
        /// A number to echo.
        nonce: u64,
    },
    /// `Regions` with the writer epochs of the followed single-writer
    /// services (`RegionsUpdate::writers`), which `Regions` cannot carry
    /// to agents of earlier releases. Sent only when there is one.
    RegionsWithWriters(
        crate::regions::RegionsUpdate,
        Vec<crate::writer::WriterEpoch>,
    ),
}

/// What one service's subscriber gets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ServiceUpdate {
    /// The changes after the revision the agent holds, oldest first.
    Deltas(Vec<Arc<ServiceDelta>>),
    /// A full snapshot, in the codec's compact form
    /// (`codec::decode_service_snapshot`), replacing what the agent held.
    Snapshot(Arc<[u8]>),
    /// Answer to a subscription whose holder is already up to date: what
    /// it holds is current (so it may stop calling it stale).
    Current {
        /// The service.
        service: ServiceKey,
        /// The revision of its last change.
        revision: Revision,
    },
    /// The service does not exist (DNS answers NXDOMAIN for it).
    Unknown {
        /// The service.
        service: ServiceKey,
    },
    /// A snapshot is needed but too many are being served: subscribe again
    /// after this many milliseconds (plus the agent's own jitter).
    RetryAfter {
        /// The service.
        service: ServiceKey,
        /// How long to wait.
        ms: u64,
    },
    /// This agent's identity may not watch the service (the arbiter's
    /// `watch_rules`).
    Denied {
        /// The service.
        service: ServiceKey,
        /// Why.
        reason: String,
    },
    /// The agent holds a revision this arbiter has not reached yet (a
    /// lagging replica): wait or ask another.
    NotYet {
        /// The service.
        service: ServiceKey,
        /// This arbiter's revision.
        current: Revision,
    },
}

/// A write, on a stream of its own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Register an instance on the agent's node (or, for a controller, on
    /// the node named).
    Register(Registration),
    /// Move an instance to another state.
    Transition {
        /// The instance.
        instance_id: InstanceId,
        /// The generation the caller knows.
        generation: Generation,
        /// The new state.
        to: State,
        /// Why.
        reason: Reason,
    },
    /// Record a liveness verdict.
    SetLiveness {
        /// The instance.
        instance_id: InstanceId,
        /// The generation the caller knows.
        generation: Generation,
        /// The verdict.
        liveness: Liveness,
    },
    /// Remove an instance.
    Deregister {
        /// The instance.
        instance_id: InstanceId,
        /// The generation the caller knows.
        generation: Generation,
    },
    /// The agent leaves on purpose: its lease is revoked.
    Leave {
        /// The agent run leaving.
        epoch: AgentEpoch,
    },
    /// The records registered on the caller's own node (the agent
    /// reconciles its local registrations with them, R7).
    NodeInstances,
    /// The caller's gossip declared a peer down (R4). The arbiter acts only
    /// when its own session with that node has been silent long enough.
    ReportDown {
        /// The node declared down.
        node: NodeId,
        /// The agent run the reporter's gossip saw.
        epoch: AgentEpoch,
    },
    /// Wait until every agent subscribed to `service` has acknowledged
    /// `revision`, or `timeout_ms` passed.
    AwaitPropagation {
        /// The service.
        service: ServiceKey,
        /// The revision to wait for.
        revision: Revision,
        /// The longest wait.
        timeout_ms: u64,
    },
    /// The region's services with their READY and total counts, from the
    /// catalog this replica applied; only those the caller's node may
    /// watch (`[[watch_rules]]`). At most [`MAX_LISTED_SERVICES`].
    Services,
}

/// The most services one `Services` answer lists (in key order; the
/// answer says when there were more).
pub const MAX_LISTED_SERVICES: usize = 10_000;

/// One service as `Request::Services` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCount {
    /// The service.
    pub service: ServiceKey,
    /// The revision of its last change.
    pub revision: Revision,
    /// Its READY records.
    pub ready: u32,
    /// Its records, whatever their state.
    pub total: u32,
}

/// How a request was refused, for the agent to map onto HTTP codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RejectKind {
    /// The call names another generation than the live one (HTTP 409).
    StaleGeneration,
    /// The instance or service does not exist (HTTP 404).
    NotFound,
    /// The caller's identity may not do this (HTTP 403).
    Forbidden,
    /// The catalog refused the change (HTTP 422).
    Invalid,
    /// The arbiter cannot commit now (HTTP 503); retry.
    Unavailable,
}

impl RejectKind {
    /// The metric label and log word (`stale_generation`, `not_found`,
    /// `forbidden`, `invalid`, `unavailable`).
    pub fn as_str(self) -> &'static str {
        match self {
            RejectKind::StaleGeneration => "stale_generation",
            RejectKind::NotFound => "not_found",
            RejectKind::Forbidden => "forbidden",
            RejectKind::Invalid => "invalid",
            RejectKind::Unavailable => "unavailable",
        }
    }
}

/// The answer to a `Request`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// Committed (or nothing to change: `revision` is `None`).
    Committed {
        /// The revision that committed it.
        revision: Option<Revision>,
        /// The generation a registration got.
        generation: Option<Generation>,
        /// The instance's state afterwards, when the request named one.
        state: Option<State>,
    },
    /// The records on the caller's node.
    Instances(Vec<NodeInstance>),
    /// Propagation result of `AwaitPropagation`.
    Propagated {
        /// Subscribed agents that acknowledged the revision.
        acked: u32,
        /// Subscribed agents.
        total: u32,
    },
    /// Refused; nothing changed.
    Rejected {
        /// The class of refusal.
        kind: RejectKind,
        /// What was wrong and what to do about it.
        message: String,
    },
    /// The answer to `Services`.
    Services {
        /// The services the caller may watch, in key order.
        services: Vec<ServiceCount>,
        /// The catalog this replica applied, at this revision.
        revision: Revision,
        /// More services matched than [`MAX_LISTED_SERVICES`]; the list
        /// holds the first ones.
        truncated: bool,
    },
}

/// One record on a node, as `NodeInstances` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeInstance {
    /// The service it is registered in.
    pub service: ServiceKey,
    /// The instance.
    pub instance_id: InstanceId,
    /// Its live generation.
    pub generation: Generation,
    /// Its state.
    pub state: State,
    /// Why it is in that state.
    pub reason: Reason,
    /// The role of whoever made its last change (agents reconcile only what
    /// agents wrote, never a controller's registrations).
    pub origin: crate::endpoint::Role,
}

/// QUIC application close codes of rollcall's connections (agent and
/// replica sessions with an arbiter, bridge links): a public protocol
/// constant.
pub mod close_code {
    /// Normal close.
    pub const DONE: u32 = 0;
    /// The peer's certificate is missing or names no rollcall identity.
    pub const UNAUTHENTICATED: u32 = 1;
    /// The arbiter refused the session (reason in the close frame).
    pub const REFUSED: u32 = 2;
    /// A frame was oversized or malformed.
    pub const PROTOCOL: u32 = 3;
}
