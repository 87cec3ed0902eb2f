//! The machine's door: everything it hears ([`Input`]) and everything it
//! asks its driver to do ([`Output`]). The actor, the fleet bench and the
//! simulator all speak exactly this.

use std::collections::BTreeSet;
use std::sync::Arc;

use rollcall_leases::protocol::{Request, Response, SessionDown, SessionUp};
use rollcall_leases::{
    AgentEpoch, CatalogId, Generation, InstanceId, LeaseId, NodeId, RegionsUpdate, Revision,
    ServiceKey, ServiceView,
};

use super::calls::{Call, CallId, Refusal, Reply};
use super::{RequestId, SaveId, SessionId};
use crate::failover::Regions;
use crate::health::{ProbeTask, Which};
use crate::view::Published;

/// Everything the state machine hears.
// Moved once per input, never stored in bulk: boxing the large variant
// would cost an allocation per input for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Input {
    /// A local API call.
    Call {
        /// Its number, for the answer.
        call: CallId,
        /// What it asks.
        op: Call,
    },
    /// A workload's registration session closed.
    WorkloadSessionClosed {
        /// The instance.
        instance: InstanceId,
        /// The generation it held.
        generation: Option<Generation>,
    },
    /// The data plane looked up a service not followed yet.
    Follow(ServiceKey),
    /// When the data plane last looked up each service it holds a view of
    /// (ms; 0: never), every [`AgentState::usage_interval_ms`](super::AgentState::usage_interval_ms): services
    /// followed on demand that nobody asks for are dropped
    /// (`agent.follow_idle_ms`, `agent.unknown_ttl_ms`).
    Usage(Vec<(ServiceKey, u64)>),
    /// The session asked for by `Output::Connect` got its Welcome.
    Connected {
        /// The session.
        session: SessionId,
        /// The node's lease.
        lease: LeaseId,
        /// Its time to live, ms.
        ttl_ms: u64,
        /// The shard's revision at the Welcome.
        revision: Revision,
        /// The arbiter's catalog (`None` until its group named it).
        catalog: Option<CatalogId>,
    },
    /// The session ended, or never started.
    SessionEnded {
        /// The session.
        session: SessionId,
        /// Why.
        reason: String,
    },
    /// A message on the session stream.
    Message {
        /// The session.
        session: SessionId,
        /// The message.
        message: SessionDown,
    },
    /// The answer to `Output::Request`, or why there is none.
    Answer {
        /// The request.
        request: RequestId,
        /// The arbiter's response, or the connection's error.
        result: Result<Response, String>,
    },
    /// A probe's outcome.
    Probed {
        /// The instance.
        instance: InstanceId,
        /// The generation of the checker that asked for it.
        generation: Option<Generation>,
        /// Which check.
        which: Which,
        /// Whether it passed.
        passed: bool,
        /// What happened.
        detail: String,
    },
    /// The zone's gossip declared a peer down.
    PeerDown {
        /// The node.
        node: NodeId,
        /// The agent run it saw.
        epoch: AgentEpoch,
    },
    /// The zone's gossip sees a peer (again).
    PeerUp {
        /// The node.
        node: NodeId,
    },
    /// The connects asked for by `Output::Witness` ended.
    Reached {
        /// The node asked about.
        node: NodeId,
        /// Its agent run.
        epoch: AgentEpoch,
        /// Whether one of its addresses accepted a connection.
        reachable: bool,
    },
    /// A save asked for by `Output::SaveRegistrations` ended.
    Saved {
        /// The save.
        save: SaveId,
        /// Whether it worked.
        result: Result<(), String>,
    },
    /// The time asked for by `Output::WakeAt` came (or any later time).
    Tick,
}

/// What the driver must do.
#[derive(Clone, Debug)]
pub enum Output {
    /// Open a session with the arbiter at `address` (Hello with this
    /// node's identity); report `Connected` or `SessionEnded`.
    Connect {
        /// The session.
        session: SessionId,
        /// The replica's address.
        address: String,
    },
    /// Close the session.
    Close {
        /// The session.
        session: SessionId,
        /// Why, for the arbiter's log.
        reason: String,
    },
    /// Send one message on the session stream, in order.
    Send {
        /// The session.
        session: SessionId,
        /// The message.
        message: SessionUp,
    },
    /// Send a request on a stream of its own; report `Answer`.
    Request {
        /// The session.
        session: SessionId,
        /// Its number.
        request: RequestId,
        /// What to ask.
        body: Request,
    },
    /// Answer a local API call.
    Reply {
        /// The call.
        call: CallId,
        /// The answer.
        reply: Result<Reply, Refusal>,
    },
    /// Write these views to the disk cache and delete these services'
    /// cache files.
    StoreViews {
        /// Views to write (shared with the state machine), each with the
        /// catalog it came from.
        views: Vec<(Arc<ServiceView>, Option<CatalogId>)>,
        /// Services whose files go.
        forget: Vec<ServiceKey>,
    },
    /// Write the registrations file; report `Saved`.
    SaveRegistrations {
        /// The save.
        save: SaveId,
        /// The file's contents (`Registrations::encode`).
        bytes: Vec<u8>,
    },
    /// Keep the regions message in the cache.
    SaveRegions {
        /// The message.
        update: RegionsUpdate,
        /// When it arrived, ms.
        received_at_ms: u64,
    },
    /// Try a TCP connect to each address (the arbiter's witness question
    /// about a silent node); report `Reached`.
    Witness {
        /// The node asked about.
        node: NodeId,
        /// Its agent run.
        epoch: AgentEpoch,
        /// Its endpoints' addresses.
        addresses: Vec<std::net::SocketAddr>,
    },
    /// Start a probe; report `Probed`.
    Probe {
        /// The instance.
        instance: InstanceId,
        /// The generation of its checker.
        generation: Option<Generation>,
        /// What to probe.
        task: ProbeTask,
    },
    /// What the agent holds of a service now, for the data plane's view.
    Publish(Published),
    /// Only when publications are deferred ([`AgentState::defer_publications`](super::AgentState::defer_publications)):
    /// this service's view changed; [`AgentState::published`](super::AgentState::published) gives what to
    /// publish, any time before the data plane next reads it.
    Changed(ServiceKey),
    /// The nodes out of this agent's routing because its gossip holds them
    /// down (R7).
    PublishDown(BTreeSet<NodeId>),
    /// The nodes the zone's gossip sees alive, and this agent's own node:
    /// the fresh local evidence a copy past its maximum age routes on under
    /// `degrade`.
    PublishAlive(BTreeSet<NodeId>),
    /// Whether a session is up.
    PublishConnected(bool),
    /// The policies and other regions' views held.
    PublishRegions(Regions),
    /// Lift the data plane's local ejections of this node's endpoints.
    LiftEjections(NodeId),
    /// The service is no longer followed: drop its view, so the next
    /// lookup asks to follow it again (`Input::Follow`).
    Unpublish(ServiceKey),
    /// Call `handle(Tick)` at this time, ms (replaces the previous wake).
    WakeAt(u64),
}
