//! The node agent's decisions, as one deterministic state machine
//! (quinn-proto style): everything the agent decides, and nothing it does.
//!
//! One door: [`AgentState::handle`] takes an [`Input`] (a local API call,
//! a message or an answer from the arbiter, a probe's result, a gossip
//! verdict, a file saved, a timer) with the time and a seeded rng, and
//! pushes [`Output`]s: what to send on the session, which request to make,
//! what to answer a local caller (by its call id), what to save or forget,
//! which probe to start, what to publish to the data plane's view, and
//! when to wake it next. The agent's actors carry the outputs out; the
//! fleet simulator carries the same outputs on a virtual clock.
//!
//! What it decides:
//! - the arbiter link: which replica to try, the reconnect backoff (full
//!   jitter), keep-alives and lease renewals (`link`);
//! - the catalog views it follows (`sync`) and what they publish to the
//!   data plane, with the staleness limit of each service;
//! - the local API: who may write which instance (the node token, or a
//!   workload's `[[workloads]]` grant), which generation a call names
//!   (refusing a stale one), and the answers;
//! - local writes while the arbiter is away (pending), the intent of each
//!   local instance (serve, drain, leave) and, after every (re)connect,
//!   the reconcile plan: replay what is pending in order, send again the
//!   health verdicts the catalog does not hold, report held down verdicts,
//!   deregister records of this node that no local registration backs;
//! - health: when each check is due, and what its results mean (`health`);
//! - gossip: down verdicts reported to the arbiter and kept out of routing
//!   while cut off or until the arbiter answers (`link::DownVerdicts`);
//! - the drain window, and the wait before subscribing again when the
//!   arbiter asks (`RetryAfter`, with jitter from the rng passed in).
//!
//! It never reads a clock, a socket, a file or an unseeded rng.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use rand::{Rng, RngExt};
use rollcall_config::AgentConfig;
use rollcall_leases::protocol::{
    NodeInstance, RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp,
    MAX_WITNESS_ADDRESSES,
};
use rollcall_leases::{
    shard_of, AgentEpoch, CatalogId, Generation, InstanceId, Label, LeaseId, Liveness, NodeId,
    Reason, RegionsUpdate, Registration, Revision, Role, ServiceKey, ServiceView, ShardId, State,
};

use crate::api_types::{
    ApiError, ArbiterStatus, DrainResponse, GossipStatus, LeaseStatus, Propagated,
    RegisterResponse, StatusResponse, SubscriptionStatus, ValidRegistration,
};
use crate::failover::Regions;
use crate::health::{HealthEvent, InstanceHealth, ProbeTask, Which};
use crate::link::{renew_after_ms, resend_health, Backoff, DownVerdicts};
use crate::registrations::{Intent, LocalInstance, Registrations};
use crate::sync::{CatalogSync, Discard, SyncOut, SyncStats};
use crate::view::{Published, Status};

use checkers::Checkers;

mod checkers;

/// Catalog shards per region. One today; services map to shards by key
/// (`shard_of`), so more can be added without changing the protocol.
pub const SHARDS: u16 = 1;

/// Changed views wait this long before they are written to the disk cache,
/// so a burst of deltas costs one write per service, ms.
pub const FLUSH_DELAY_MS: u64 = 100;

/// After a write the arbiter refused as unavailable (no quorum, electing),
/// pending writes are tried again this often while the session is up, ms.
pub const WRITE_RETRY_MS: u64 = 500;

/// A local API call, numbered by the driver; its answer names it.
pub type CallId = u64;
/// One session with an arbiter, numbered here.
pub type SessionId = u64;
/// A request on a stream of its own, numbered here.
pub type RequestId = u64;
/// A save of the registrations file, numbered here.
pub type SaveId = u64;

/// Who is calling the local API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Holds the node token: may do anything on this node.
    Operator,
    /// A local process on the unix socket, by its peer credentials.
    Workload {
        /// Its user id.
        uid: u32,
        /// Its group id.
        gid: u32,
    },
}

/// How a write ended.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteOutcome<T> {
    /// The arbiter committed it.
    Committed(T),
    /// Accepted locally; sent when the arbiter is back.
    Pending(T),
}

/// A call of the local API, validated at the edge.
// Moved once per input, never stored in bulk: boxing the large variant
// would cost an allocation per input for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Call {
    /// `PUT /v1/agent/instances`.
    Register {
        /// What to register.
        registration: ValidRegistration,
        /// Who asks.
        caller: Caller,
    },
    /// `PUT /v1/agent/instances/{id}/heartbeat`.
    Heartbeat {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Who asks.
        caller: Caller,
    },
    /// `PUT /v1/agent/instances/{id}/drain`.
    Drain {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Answer once every subscribed agent applied it (`wait=propagated`).
        propagated: bool,
        /// Who asks.
        caller: Caller,
    },
    /// `DELETE /v1/agent/instances/{id}`.
    Deregister {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Who asks.
        caller: Caller,
    },
    /// `POST /v1/agent/instances/{id}/session`: a registration session
    /// opens (its close is `Input::WorkloadSessionClosed`).
    OpenSession {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Who asks.
        caller: Caller,
    },
}

/// The answer to a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// To `Register`.
    Registered(WriteOutcome<RegisterResponse>),
    /// To `Heartbeat`.
    Heartbeat(serde_json::Value),
    /// To `Drain`.
    Drained(WriteOutcome<DrainResponse>),
    /// To `Deregister`.
    Deregistered(WriteOutcome<serde_json::Value>),
    /// To `OpenSession`: the generation the session holds.
    SessionOpened(Option<Generation>),
}

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
    /// (ms; 0: never), every [`AgentState::usage_interval_ms`]: services
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
        reply: Result<Reply, ApiError>,
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
    /// Only when publications are deferred ([`AgentState::defer_publications`]):
    /// this service's view changed; [`AgentState::published`] gives what to
    /// publish, any time before the data plane next reads it.
    Changed(ServiceKey),
    /// The nodes out of this agent's routing because its gossip holds them
    /// down (R7).
    PublishDown(BTreeSet<NodeId>),
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

/// Who this agent is.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This node.
    pub node: NodeId,
    /// Its zone.
    pub zone: Label,
    /// This run of the agent.
    pub epoch: AgentEpoch,
    /// When it started, ms (a cached copy's age counts from here).
    pub started_ms: u64,
    /// Its config.
    pub config: Arc<AgentConfig>,
}

/// What the agent found on disk at start.
#[derive(Clone, Debug, Default)]
pub struct Restored {
    /// The cached views, each with the catalog it came from.
    pub views: Vec<(ServiceView, Option<CatalogId>)>,
    /// The cached regions message and when it arrived.
    pub regions: Option<(RegionsUpdate, u64)>,
    /// The local registrations.
    pub registrations: Registrations,
    /// Checkers that keep running for restored registrations with checks.
    /// A real agent has none at start (its instances are checked again
    /// from now); the fleet simulator passes warm ones, as for an agent
    /// that has been running.
    pub health: BTreeMap<InstanceId, InstanceHealth>,
}

/// Counters the driver exports as metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// READY ↔ UNHEALTHY changes of local instances.
    pub health_flaps: u64,
    /// Sessions started after the first.
    pub reconnects: u64,
}

/// Where the arbiter link is.
#[derive(Clone, Debug)]
enum Link {
    /// No arbiters configured.
    Off,
    /// The next attempt is due then.
    Waiting { until_ms: u64 },
    /// Handshake in progress.
    Connecting {
        session: SessionId,
        address: String,
        since_ms: u64,
    },
    /// A session holds the lease.
    Up {
        session: SessionId,
        since_ms: u64,
        lease: LeaseId,
        ttl_ms: u64,
        next_keepalive_ms: u64,
        next_renew_ms: u64,
    },
}

/// What a request in flight is for.
// Moved once per input, never stored in bulk: boxing the large variant
// would cost an allocation per input for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Purpose {
    /// A local registration: answer `call`.
    Register {
        call: CallId,
        registration: ValidRegistration,
    },
    /// A drain: answer `call`, if any.
    Drain {
        call: CallId,
        instance: InstanceId,
        generation: Generation,
        propagated: bool,
    },
    /// The propagation wait after a committed drain.
    Propagation { call: CallId, revision: Revision },
    /// A deregistration: answer `call`, if any (none after a drain window).
    Deregister {
        call: Option<CallId>,
        instance: InstanceId,
    },
    /// A local instance's desired state.
    Desired {
        instance: InstanceId,
        want: (State, Reason),
        in_plan: bool,
    },
    /// A liveness change.
    Liveness { instance: InstanceId },
    /// A gossip down report.
    ReportDown { node: NodeId, in_plan: bool },
    /// A step of the reconcile plan.
    Plan(PlanRequest),
}

/// The reconcile plan's requests.
#[derive(Clone, Debug)]
enum PlanRequest {
    /// The catalog's records on this node.
    List,
    /// A local registration the catalog lacks (pending, or gone).
    Register { instance: InstanceId },
    /// The drain or deregistration a local instance still wants.
    Intent {
        instance: InstanceId,
        intent: Intent,
        generation: Generation,
    },
    /// A record of this node no local registration backs.
    Stale,
}

/// The steps of the reconcile plan, in order.
#[derive(Clone, Debug)]
enum Step {
    /// Compare a local instance with the catalog.
    Local(InstanceId),
    /// Send the intent of a local instance.
    Intent(InstanceId),
    /// Queue the health verdicts the catalog does not hold.
    Health,
    /// Send a desired state.
    Desired(InstanceId),
    /// Report held down verdicts.
    Downs,
    /// Report one down verdict.
    Down(NodeId, AgentEpoch),
    /// Deregister records no local registration backs.
    StaleRecords,
    /// Deregister one.
    Deregister(InstanceId, Generation),
}

/// One reconcile run: the catalog's list, then the steps.
#[derive(Clone, Debug, Default)]
struct Plan {
    listed: Vec<NodeInstance>,
    steps: VecDeque<Step>,
    /// A request of the plan is in flight.
    waiting: bool,
}

/// What a save is followed by.
#[derive(Clone, Debug)]
enum Then {
    Nothing,
    Reply(CallId, Result<Reply, ApiError>),
    /// The drain's intent is on disk: send the drain.
    Drain {
        call: CallId,
        instance: InstanceId,
        generation: Option<Generation>,
        propagated: bool,
    },
    /// The deregistration's intent is on disk: send it.
    Deregister {
        call: Option<CallId>,
        instance: InstanceId,
        generation: Option<Generation>,
    },
}

/// The node agent's state (see the module doc).
pub struct AgentState {
    settings: Settings,
    sync: CatalogSync,
    shard_revision: Revision,
    regs: Registrations,
    health: Checkers,
    /// The state and reason each local instance's health (or its session)
    /// wants in the catalog, until the arbiter has it.
    desired: BTreeMap<InstanceId, (State, Reason)>,
    downs: DownVerdicts,
    gossip_alive: Option<BTreeSet<NodeId>>,
    regions: Regions,
    link: Link,
    backoff: Backoff,
    attempt: usize,
    next_session: SessionId,
    sessions: u64,
    last_contact_ms: Option<u64>,
    address: Option<String>,
    next_request: RequestId,
    in_flight: BTreeMap<RequestId, (SessionId, Purpose)>,
    /// Local write calls not answered yet, by when they are answered as
    /// pending at the latest (`agent.write_answer_ms`).
    unanswered: BTreeMap<CallId, (u64, Reply)>,
    /// Calls answered as pending at their bound: the answer the machine
    /// gives later is not sent again.
    answered_early: BTreeSet<CallId>,
    plan: Option<Plan>,
    /// A plan is due again once the current one ends.
    plan_again: bool,
    retry_writes_at: Option<u64>,
    next_save: SaveId,
    saves: BTreeMap<SaveId, Then>,
    /// Drain windows: when each drained instance is deregistered.
    drains: BTreeMap<u64, Vec<(InstanceId, Generation)>>,
    /// Subscriptions to send again (`RetryAfter`, `NotYet`).
    retries: BTreeMap<u64, Vec<ServiceKey>>,
    dirty: BTreeSet<ServiceKey>,
    forget: BTreeSet<ServiceKey>,
    flush_at: Option<u64>,
    publish: BTreeSet<ServiceKey>,
    publish_all: bool,
    publish_down: bool,
    /// Whether views that changed are announced (`Changed`) instead of
    /// built and published at once.
    defer: bool,
    wake: Option<u64>,
    counters: Counters,
    /// Services always followed: `agent.services` and the `[[proxy]]`
    /// listeners' services.
    pinned: BTreeSet<ServiceKey>,
    /// Services followed on demand (a lookup, or the disk cache), with
    /// when they were followed (ms): dropped when nobody asks for them.
    on_demand: BTreeMap<ServiceKey, u64>,
}

impl AgentState {
    /// The agent at start, serving what it found on disk (stale) and
    /// connecting when arbiters are configured.
    pub fn new<R: Rng + ?Sized>(
        settings: Settings,
        restored: Restored,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) -> Self {
        let config = settings.config.clone();
        let pinned: BTreeSet<ServiceKey> = config
            .services
            .iter()
            .filter_map(|s| s.parse::<ServiceKey>().ok())
            .chain(config.proxy.iter().filter_map(|p| p.service.parse().ok()))
            .collect();
        let mut on_demand = BTreeMap::new();
        let mut sync = CatalogSync::new(ShardId(0));
        for (view, catalog) in restored.views {
            if !pinned.contains(view.service()) {
                on_demand.insert(view.service().clone(), now_ms);
            }
            sync.load_cached(view, catalog);
        }
        let mut warm = restored.health;
        let mut regions = Regions::new();
        if let Some((update, received_at_ms)) = restored.regions {
            regions.update(update, received_at_ms);
        }
        let link = if config.arbiters.is_empty() {
            Link::Off
        } else {
            Link::Waiting { until_ms: now_ms }
        };
        let mut state = AgentState {
            backoff: Backoff::new(config.reconnect_min_ms, config.reconnect_max_ms),
            // Agents spread over the replicas (any replica serves watches),
            // each starting at a place fixed by its node id.
            attempt: xxhash_rust::xxh3::xxh3_64(settings.node.as_str().as_bytes()) as usize,
            settings,
            sync,
            shard_revision: Revision(0),
            regs: restored.registrations,
            health: Checkers::default(),
            defer: false,
            desired: BTreeMap::new(),
            downs: DownVerdicts::default(),
            gossip_alive: None,
            regions,
            link,
            next_session: 0,
            sessions: 0,
            last_contact_ms: None,
            address: None,
            next_request: 0,
            in_flight: BTreeMap::new(),
            unanswered: BTreeMap::new(),
            answered_early: BTreeSet::new(),
            plan: None,
            plan_again: false,
            retry_writes_at: None,
            next_save: 0,
            saves: BTreeMap::new(),
            drains: BTreeMap::new(),
            retries: BTreeMap::new(),
            dirty: BTreeSet::new(),
            forget: BTreeSet::new(),
            flush_at: None,
            publish: BTreeSet::new(),
            publish_all: true,
            publish_down: true,
            wake: None,
            counters: Counters::default(),
            pinned,
            on_demand,
        };
        for service in &config.services {
            if let Ok(key) = service.parse::<ServiceKey>() {
                let mut ignored = Vec::new();
                state.sync.follow(key, &mut ignored);
            }
        }
        // Restored registrations with checks are checked again from now.
        let serving: Vec<(ValidRegistration, Option<Generation>)> = state
            .regs
            .iter()
            .filter(|l| l.intent == Intent::Serve)
            .map(|l| (l.registration.clone(), l.generation))
            .collect();
        for (registration, generation) in serving {
            match warm.remove(&registration.instance_id) {
                Some(health) => {
                    state
                        .health
                        .insert(registration.instance_id.clone(), (generation, health));
                }
                None => state.watch_health(&registration, generation, now_ms, rng),
            }
        }
        out.push(Output::PublishRegions(state.regions.clone()));
        state.finish(now_ms, out);
        state
    }

    /// Takes one input at `now_ms`.
    pub fn handle<R: Rng + ?Sized>(
        &mut self,
        input: Input,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        match input {
            Input::Call { call, op } => {
                if let Some(pending) = pending_reply(&op) {
                    let mut bound = self.settings.config.write_answer_ms;
                    if matches!(
                        op,
                        Call::Drain {
                            propagated: true,
                            ..
                        }
                    ) {
                        bound += self.settings.config.propagation_timeout_ms;
                    }
                    self.unanswered.insert(call, (now_ms + bound, pending));
                }
                self.call(call, op, now_ms, rng, out)
            }
            Input::WorkloadSessionClosed {
                instance,
                generation,
            } => {
                let still_serving = self
                    .regs
                    .get(&instance)
                    .is_some_and(|l| l.intent == Intent::Serve && l.generation == generation);
                if still_serving {
                    tracing::warn!(instance = %instance, "registration session closed without a drain: process exited");
                    self.want(&instance, State::Unhealthy, "process exited", out);
                }
            }
            Input::Follow(service) => {
                let mut outs = Vec::new();
                if self.sync.follow(service.clone(), &mut outs) {
                    if !self.pinned.contains(&service) {
                        self.on_demand.insert(service.clone(), now_ms);
                    }
                    self.publish.insert(service);
                }
                self.carry_sync(outs, now_ms, rng, out);
            }
            Input::Usage(usage) => self.usage(usage, now_ms, out),
            Input::Connected {
                session,
                lease,
                ttl_ms,
                revision,
                catalog,
            } => self.connected(
                session,
                lease,
                ttl_ms,
                (catalog, revision),
                now_ms,
                rng,
                out,
            ),
            Input::SessionEnded { session, reason } => {
                if self.session_id() == Some(session) {
                    tracing::warn!(arbiter = ?self.address, error = %reason, "arbiter session ended");
                    self.disconnected(now_ms, rng, out);
                }
            }
            Input::Message { session, message } => {
                if self.up_session() == Some(session) {
                    self.message(session, message, now_ms, rng, out);
                }
            }
            Input::Answer { request, result } => {
                if let Some((_, purpose)) = self.in_flight.remove(&request) {
                    let result = match result {
                        Ok(Response::Rejected {
                            kind: RejectKind::Unavailable,
                            message,
                        }) => {
                            // The region's arbiter group has no quorum, or is
                            // electing: the write stays pending, retried soon.
                            self.retry_writes_at.get_or_insert(now_ms + WRITE_RETRY_MS);
                            Err(format!("arbiter unavailable: {message}"))
                        }
                        other => other,
                    };
                    self.answer(purpose, result, now_ms, rng, out);
                }
            }
            Input::Probed {
                instance,
                generation,
                which,
                passed,
                detail,
            } => {
                // A result for a checker replaced since is dropped.
                let events = self
                    .health
                    .update(&instance, |g, health| {
                        if *g == generation {
                            health.result(which, passed, &detail, now_ms, rng)
                        } else {
                            Vec::new()
                        }
                    })
                    .unwrap_or_default();
                for event in events {
                    self.health_event(&instance, event, out);
                }
            }
            Input::PeerDown { node, epoch } => {
                if node == self.settings.node {
                    return self.finish(now_ms, out);
                }
                tracing::warn!(node = %node, epoch = %epoch, "gossip: peer down");
                self.downs.down(node.clone(), epoch);
                self.gossip_alive
                    .get_or_insert_with(BTreeSet::new)
                    .remove(&node);
                self.publish_down = true;
                self.report_down(node, epoch, false, out);
            }
            Input::PeerUp { node } => {
                self.gossip_alive
                    .get_or_insert_with(BTreeSet::new)
                    .insert(node.clone());
                if self.downs.up(&node) {
                    tracing::info!(node = %node, "gossip: peer up again");
                    // The path to the node is back: the connect failures that
                    // ejected its endpoints here were the partition's.
                    out.push(Output::LiftEjections(node));
                    self.publish_down = true;
                }
            }
            Input::Reached {
                node,
                epoch,
                reachable,
            } => self.witnessed(node, epoch, Some(reachable), out),
            Input::Saved { save, result } => {
                let then = self.saves.remove(&save).unwrap_or(Then::Nothing);
                self.saved(then, result, out);
            }
            Input::Tick => self.tick(now_ms, rng, out),
        }
        self.finish(now_ms, out);
    }

    // ----- the arbiter link -----

    fn session_id(&self) -> Option<SessionId> {
        match &self.link {
            Link::Connecting { session, .. } | Link::Up { session, .. } => Some(*session),
            Link::Off | Link::Waiting { .. } => None,
        }
    }

    fn up_session(&self) -> Option<SessionId> {
        match &self.link {
            Link::Up { session, .. } => Some(*session),
            _ => None,
        }
    }

    /// Whether a session holds the lease now.
    pub fn is_connected(&self) -> bool {
        self.up_session().is_some()
    }

    #[allow(clippy::too_many_arguments)]
    fn connected<R: Rng + ?Sized>(
        &mut self,
        session: SessionId,
        lease: LeaseId,
        ttl_ms: u64,
        (catalog, revision): (Option<CatalogId>, Revision),
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let Link::Connecting {
            session: expected,
            address,
            since_ms,
        } = &self.link
        else {
            return;
        };
        if *expected != session {
            return;
        }
        let (address, since_ms) = (address.clone(), *since_ms);
        tracing::info!(arbiter = %address, epoch = %self.settings.epoch, "arbiter session up");
        self.link = Link::Up {
            session,
            since_ms,
            lease,
            ttl_ms,
            next_keepalive_ms: now_ms + self.settings.config.keepalive_ms,
            next_renew_ms: now_ms + renew_after_ms(ttl_ms, rng),
        };
        self.address = Some(address);
        self.shard_revision = self.shard_revision.max(revision);
        self.last_contact_ms = Some(now_ms);
        if self.sessions > 0 {
            self.counters.reconnects += 1;
        }
        self.sessions += 1;
        out.push(Output::PublishConnected(true));
        self.publish_down = true;
        let mut outs = Vec::new();
        let discarded = self.sync.connected(catalog, revision, &mut outs);
        let arbiter = self.address.clone().unwrap_or_default();
        self.discarded(&arbiter, catalog, revision, &discarded);
        self.carry_sync(outs, now_ms, rng, out);
        self.start_plan(out);
    }

    /// How often the driver reports the data plane's usage
    /// (`Input::Usage`), ms: often enough that a forgotten unknown service
    /// goes within about a quarter of `unknown_ttl_ms` past it.
    pub fn usage_interval_ms(&self) -> u64 {
        (self.settings.config.unknown_ttl_ms / 4).clamp(250, 10_000)
    }

    /// Drops the services followed on demand that nobody asked for: one
    /// with nothing held (unknown to the arbiter, refused, or never
    /// answered) after `unknown_ttl_ms`, one held after `follow_idle_ms`
    /// while a session is up (never while the arbiter is out of reach: the
    /// copy may be all a caller has then).
    fn usage(&mut self, usage: Vec<(ServiceKey, u64)>, now_ms: u64, out: &mut Vec<Output>) {
        let config = &self.settings.config;
        let connected = self.is_connected();
        let mut idle = Vec::new();
        for (service, last_used_ms) in usage {
            let (Some(&since), Some(t)) = (self.on_demand.get(&service), self.sync.get(&service))
            else {
                continue;
            };
            let quiet_ms = now_ms.saturating_sub(last_used_ms.max(since));
            let holds = t.view.as_ref().is_some_and(|v| v.exists());
            let gone = if holds {
                connected && config.follow_idle_ms > 0 && quiet_ms >= config.follow_idle_ms
            } else {
                quiet_ms >= config.unknown_ttl_ms
            };
            if gone {
                idle.push((service, holds));
            }
        }
        if idle.is_empty() {
            return;
        }
        let held = idle.iter().filter(|(_, holds)| *holds).count();
        tracing::debug!(
            unknown = idle.len() - held,
            idle = held,
            "services nobody looked up are no longer followed"
        );
        let session = self.up_session();
        for (service, _) in idle {
            self.sync.unfollow(&service);
            self.on_demand.remove(&service);
            self.publish.remove(&service);
            self.dirty.remove(&service);
            self.forget.insert(service.clone());
            self.flush_at.get_or_insert(now_ms + FLUSH_DELAY_MS);
            if let Some(session) = session {
                out.push(Output::Send {
                    session,
                    message: SessionUp::Unsubscribe {
                        service: service.clone(),
                    },
                });
            }
            out.push(Output::Unpublish(service));
        }
    }

    /// Reports cached views a new session's arbiter made the agent drop.
    fn discarded(
        &mut self,
        arbiter: &str,
        catalog: Option<CatalogId>,
        revision: Revision,
        discarded: &[(ServiceKey, Discard)],
    ) {
        let Some((_, why)) = discarded.first() else {
            return;
        };
        let services: Vec<String> = discarded
            .iter()
            .take(8)
            .map(|(s, _)| s.to_string())
            .collect();
        let catalog = catalog.map_or_else(|| "unnamed".to_string(), |c| c.to_string());
        let cause = match why {
            Discard::OtherCatalog => {
                "the arbiter serves another catalog than the one the cache was filled from"
            }
            Discard::AheadOfArbiter => {
                "the cache holds revisions the arbiter's catalog has not reached"
            }
        };
        tracing::warn!(
            arbiter,
            catalog,
            revision = revision.0,
            discarded = discarded.len(),
            services = ?services,
            "{cause} (a rebuilt or restored arbiter group?): those cached views are no longer served and are fetched again by snapshot"
        );
    }

    fn disconnected<R: Rng + ?Sized>(&mut self, now_ms: u64, rng: &mut R, out: &mut Vec<Output>) {
        let (session, lasted) = match &self.link {
            Link::Up {
                session, since_ms, ..
            } => (*session, now_ms.saturating_sub(*since_ms)),
            Link::Connecting { session, .. } => (*session, 0),
            Link::Off | Link::Waiting { .. } => return,
        };
        let was_up = matches!(self.link, Link::Up { .. });
        let wait = self.backoff.next_wait(lasted, rng);
        self.link = Link::Waiting {
            until_ms: now_ms + wait,
        };
        if !was_up {
            return;
        }
        self.sync.disconnected(now_ms);
        self.downs.disconnected();
        self.plan = None;
        self.plan_again = false;
        self.retry_writes_at = None;
        self.publish_all = true;
        self.publish_down = true;
        out.push(Output::PublishConnected(false));
        // Requests of the ended session get no answer now.
        let ended: Vec<RequestId> = self
            .in_flight
            .iter()
            .filter(|(_, (s, _))| *s == session)
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            if let Some((_, purpose)) = self.in_flight.remove(&id) {
                let result = Err("the arbiter session ended".to_owned());
                self.answer(purpose, result, now_ms, rng, out);
            }
        }
    }

    fn message<R: Rng + ?Sized>(
        &mut self,
        session: SessionId,
        message: SessionDown,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        self.last_contact_ms = Some(now_ms);
        match message {
            SessionDown::Update(items) => {
                let mut outs = Vec::new();
                for item in items {
                    if let ServiceUpdate::Deltas(ds) = &item {
                        if let Some(last) = ds.last() {
                            self.shard_revision = self.shard_revision.max(last.revision);
                        }
                    }
                    if let Some(service) = updated_service(&item) {
                        self.publish.insert(service);
                    }
                    self.sync.update(item, now_ms, &mut outs);
                }
                self.carry_sync(outs, now_ms, rng, out);
            }
            SessionDown::Regions(update) => {
                if self.regions.update(update.clone(), now_ms) {
                    out.push(Output::SaveRegions {
                        update,
                        received_at_ms: now_ms,
                    });
                    // Policies may set a service's staleness limit.
                    self.publish_all = true;
                }
                out.push(Output::PublishRegions(self.regions.clone()));
            }
            SessionDown::Refused { reason } => {
                tracing::warn!(reason = %reason, "the arbiter refused the session");
                out.push(Output::Close {
                    session,
                    reason: format!("refused: {reason}"),
                });
                self.disconnected(now_ms, rng, out);
            }
            SessionDown::Welcome { .. } => {}
            SessionDown::Witness {
                node,
                epoch,
                addresses,
            } => {
                if addresses.len() > MAX_WITNESS_ADDRESSES {
                    tracing::warn!(
                        node = %node,
                        addresses = addresses.len(),
                        "the arbiter asked about more addresses than a witness question holds; not answered"
                    );
                } else if addresses.is_empty() {
                    self.witnessed(node, epoch, None, out);
                } else {
                    out.push(Output::Witness {
                        node,
                        epoch,
                        addresses,
                    });
                }
            }
        }
    }

    /// Answers the arbiter's witness question about `node` (R3, R4): what
    /// this agent's gossip holds of it, and whether its endpoints accepted
    /// a connection. Dropped when no session is up (the arbiter falls back
    /// to its own signal).
    fn witnessed(
        &mut self,
        node: NodeId,
        epoch: AgentEpoch,
        reachable: Option<bool>,
        out: &mut Vec<Output>,
    ) {
        let Link::Up { session, .. } = &self.link else {
            return;
        };
        let gossip = match &self.gossip_alive {
            Some(alive) if alive.contains(&node) => Some(true),
            _ if self.downs.nodes().any(|n| *n == node) => Some(false),
            _ => None,
        };
        out.push(Output::Send {
            session: *session,
            message: SessionUp::Witnessed {
                node,
                epoch,
                gossip,
                reachable,
            },
        });
    }

    fn carry_sync<R: Rng + ?Sized>(
        &mut self,
        outs: Vec<SyncOut>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let session = self.up_session();
        for o in outs {
            match o {
                SyncOut::Subscribe { service, have } => {
                    if let Some(session) = session {
                        out.push(Output::Send {
                            session,
                            message: SessionUp::Subscribe {
                                shard: shard_of(&service, SHARDS),
                                service,
                                have,
                            },
                        });
                    }
                }
                SyncOut::Ack { service, revision } => {
                    if let Some(session) = session {
                        out.push(Output::Send {
                            session,
                            message: SessionUp::Ack { service, revision },
                        });
                    }
                }
                SyncOut::Persist(service) => {
                    // What was applied (deltas or a snapshot) changes the
                    // view; a mere re-acknowledgement does not.
                    self.publish.insert(service.clone());
                    self.forget.remove(&service);
                    self.dirty.insert(service);
                    self.flush_at.get_or_insert(now_ms + FLUSH_DELAY_MS);
                }
                SyncOut::Forget(service) => {
                    self.publish.insert(service.clone());
                    self.dirty.remove(&service);
                    self.forget.insert(service);
                    self.flush_at.get_or_insert(now_ms + FLUSH_DELAY_MS);
                }
                SyncOut::RetryLater { service, base_ms } => {
                    let wait = base_ms + rng.random_range(0..=base_ms);
                    self.retries.entry(now_ms + wait).or_default().push(service);
                }
            }
        }
    }

    /// Sends a request on the session; `None` when there is none.
    fn request(&mut self, body: Request, purpose: Purpose, out: &mut Vec<Output>) -> bool {
        let Some(session) = self.up_session() else {
            return false;
        };
        self.next_request += 1;
        let request = self.next_request;
        self.in_flight.insert(request, (session, purpose));
        out.push(Output::Request {
            session,
            request,
            body,
        });
        true
    }

    fn tick<R: Rng + ?Sized>(&mut self, now_ms: u64, rng: &mut R, out: &mut Vec<Output>) {
        // The link: a due attempt, keep-alives, renewals.
        match &mut self.link {
            Link::Waiting { until_ms } if *until_ms <= now_ms => {
                let arbiters = &self.settings.config.arbiters;
                let address = arbiters[self.attempt % arbiters.len()].clone();
                self.attempt += 1;
                self.next_session += 1;
                let session = self.next_session;
                self.link = Link::Connecting {
                    session,
                    address: address.clone(),
                    since_ms: now_ms,
                };
                out.push(Output::Connect { session, address });
            }
            Link::Up {
                session,
                ttl_ms,
                next_keepalive_ms,
                next_renew_ms,
                ..
            } => {
                if *next_keepalive_ms <= now_ms {
                    *next_keepalive_ms = now_ms + self.settings.config.keepalive_ms;
                    out.push(Output::Send {
                        session: *session,
                        message: SessionUp::Keepalive,
                    });
                }
                if *next_renew_ms <= now_ms {
                    *next_renew_ms = now_ms + renew_after_ms(*ttl_ms, rng);
                    out.push(Output::Send {
                        session: *session,
                        message: SessionUp::Renew,
                    });
                }
            }
            _ => {}
        }
        // Subscriptions the arbiter asked to send again.
        let later = self.retries.split_off(&(now_ms + 1));
        for service in std::mem::replace(&mut self.retries, later)
            .into_values()
            .flatten()
        {
            let mut outs = Vec::new();
            self.sync.retry(&service, &mut outs);
            self.carry_sync(outs, now_ms, rng, out);
        }
        // Writes the arbiter refused as unavailable.
        if self.retry_writes_at.is_some_and(|t| t <= now_ms) {
            self.retry_writes_at = None;
            if self.is_connected() {
                tracing::info!("retrying writes the arbiter refused as unavailable");
                self.start_plan(out);
            }
        }
        // The disk cache.
        if self.flush_at.is_some_and(|t| t <= now_ms) {
            self.flush(out);
        }
        // Drain windows that are over.
        let later = self.drains.split_off(&(now_ms + 1));
        for (instance, generation) in std::mem::replace(&mut self.drains, later)
            .into_values()
            .flatten()
        {
            self.drain_window_over(instance, generation, out);
        }
        // Probes due and TTL checks.
        let mut events = Vec::new();
        for id in self.health.due_at(now_ms) {
            let Some((generation, due)) = self.health.update(&id, |generation, health| {
                (*generation, health.due(now_ms, rng))
            }) else {
                continue;
            };
            for task in due.probes {
                out.push(Output::Probe {
                    instance: id.clone(),
                    generation,
                    task,
                });
            }
            events.extend(due.events.into_iter().map(|e| (id.clone(), e)));
        }
        for (id, event) in events {
            self.health_event(&id, event, out);
        }
    }

    /// Writes the changed views to the disk cache now.
    pub fn flush(&mut self, out: &mut Vec<Output>) {
        self.flush_at = None;
        let dirty = std::mem::take(&mut self.dirty);
        let forget: Vec<ServiceKey> = std::mem::take(&mut self.forget).into_iter().collect();
        let views: Vec<(Arc<ServiceView>, Option<CatalogId>)> = dirty
            .iter()
            .filter_map(|s| {
                let t = self.sync.get(s)?;
                Some((t.view.clone()?, t.catalog))
            })
            .collect();
        if !views.is_empty() || !forget.is_empty() {
            out.push(Output::StoreViews { views, forget });
        }
    }

    /// Ends the session for a shutdown.
    pub fn close(&mut self, reason: &str, out: &mut Vec<Output>) {
        if let Some(session) = self.session_id() {
            out.push(Output::Close {
                session,
                reason: reason.to_owned(),
            });
        }
        self.link = Link::Off;
    }

    /// Publishes what changed and asks for the next wake-up.
    fn finish(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        // Write calls past their bound are answered as pending (their write
        // stays in flight or pending); a call answered so gets no second
        // answer.
        let due: Vec<CallId> = self
            .unanswered
            .iter()
            .filter(|(_, (by, _))| *by <= now_ms)
            .map(|(call, _)| *call)
            .collect();
        if !(self.answered_early.is_empty() && self.unanswered.is_empty()) {
            out.retain(|o| match o {
                Output::Reply { call, .. } => {
                    self.unanswered.remove(call);
                    !self.answered_early.remove(call)
                }
                _ => true,
            });
        }
        for call in due {
            if let Some((_, pending)) = self.unanswered.remove(&call) {
                tracing::info!(call, "a local write got no answer from the arbiter in agent.write_answer_ms; answered as pending");
                self.answered_early.insert(call);
                out.push(Output::Reply {
                    call,
                    reply: Ok(pending),
                });
            }
        }
        if self.publish_down {
            self.publish_down = false;
            out.push(Output::PublishDown(
                self.downs.excluded(self.is_connected()),
            ));
        }
        let keys: Vec<ServiceKey> = if std::mem::take(&mut self.publish_all) {
            self.publish.clear();
            self.sync.iter().map(|(k, _)| k.clone()).collect()
        } else {
            std::mem::take(&mut self.publish).into_iter().collect()
        };
        for key in keys {
            if self.defer {
                if self.sync.get(&key).is_some() {
                    out.push(Output::Changed(key));
                }
            } else if let Some(published) = self.published(&key) {
                out.push(Output::Publish(published));
            }
        }
        let wake = self.next_wake();
        if wake != self.wake {
            self.wake = wake;
            if let Some(at) = wake {
                out.push(Output::WakeAt(at.max(now_ms)));
            }
        }
    }

    fn next_wake(&self) -> Option<u64> {
        let link = match &self.link {
            Link::Waiting { until_ms } => Some(*until_ms),
            Link::Up {
                next_keepalive_ms,
                next_renew_ms,
                ..
            } => Some((*next_keepalive_ms).min(*next_renew_ms)),
            Link::Off | Link::Connecting { .. } => None,
        };
        [
            link,
            self.retries.keys().next().copied(),
            self.retry_writes_at,
            self.flush_at,
            self.drains.keys().next().copied(),
            self.health.next_due_ms(),
            self.unanswered.values().map(|(by, _)| *by).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// From now on a view that changed is announced as
    /// [`Output::Changed`] and built only when the driver asks for it with
    /// [`AgentState::published`]. A driver whose data plane reads a view
    /// far less often than it changes (the fleet simulator, which runs
    /// thousands of agents and samples their traffic) saves building every
    /// intermediate set; what it publishes before a read is the same set an
    /// immediate publication of the last change would have been, since
    /// every change to what a view holds marks it changed again.
    pub fn defer_publications(&mut self) {
        self.defer = true;
    }

    /// What the data plane's view of `key` holds now.
    pub fn published(&self, key: &ServiceKey) -> Option<Published> {
        let t = self.sync.get(key)?;
        let mut p = Published::waiting(key.clone(), self.settings.started_ms);
        let config = &self.settings.config;
        let (config_age, config_behaviour) = config.staleness.for_service(
            key.namespace.as_str(),
            key.service.as_str(),
            key.port_name.as_str(),
        );
        // The service's policy, when it sets them, overrides the agent's.
        let (policy_age, policy_behaviour) = self.regions.staleness(key);
        p.max_age_ms = policy_age.unwrap_or(config_age);
        p.stale_behaviour = policy_behaviour.unwrap_or(config_behaviour);
        p.synced = t.synced;
        p.confirmed_at_ms = t.confirmed_at_ms;
        match t.view.as_ref().filter(|v| v.exists()) {
            Some(view) => {
                p.status = Status::Held;
                p.records = view.records().cloned().collect::<Vec<_>>().into();
                p.ready_weight = view.ready().map(|r| u64::from(r.weight.get())).sum();
                p.revision = view.revision();
                p.leaving = Arc::new(
                    self.regs
                        .iter()
                        .filter(|l| l.intent != Intent::Serve && l.registration.service == *key)
                        .map(|l| l.registration.instance_id.clone())
                        .collect(),
                );
            }
            None if t.unknown => p.status = Status::Unknown,
            None => {
                if let Some(reason) = &t.denied {
                    p.status = Status::Denied(reason.clone());
                }
            }
        }
        Some(p)
    }

    // ----- the local API -----

    fn call<R: Rng + ?Sized>(
        &mut self,
        call: CallId,
        op: Call,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        match op {
            Call::Register {
                registration,
                caller,
            } => {
                if let Err(e) = self.authorize(&caller, &registration.service) {
                    return reply(out, call, Err(e));
                }
                if let Some(local) = self
                    .regs
                    .get(&registration.instance_id)
                    .filter(|l| l.registration.service != registration.service)
                {
                    let e = ApiError::conflict(format!(
                        "instance_id {} is registered under service {}; deregister it first, or use another instance id (an instance id never moves between services)",
                        registration.instance_id, local.registration.service
                    ));
                    return reply(out, call, Err(e));
                }
                let body = Request::Register(self.registration(&registration));
                let purpose = Purpose::Register {
                    call,
                    registration: registration.clone(),
                };
                if !self.request(body, purpose, out) {
                    self.register_pending(call, registration, now_ms, rng, out);
                }
            }
            Call::Heartbeat {
                instance,
                generation,
                caller,
            } => {
                let result = self.heartbeat(&instance, generation, &caller, now_ms);
                reply(out, call, result.map(Reply::Heartbeat));
            }
            Call::Drain {
                instance,
                generation,
                propagated,
                caller,
            } => match self.authorize_instance(&caller, &instance, generation) {
                Err(e) => reply(out, call, Err(e)),
                Ok(generation) => {
                    let then = Then::Drain {
                        call,
                        instance: instance.clone(),
                        generation,
                        propagated,
                    };
                    self.set_intent(&instance, Intent::Drain, then, out);
                }
            },
            Call::Deregister {
                instance,
                generation,
                caller,
            } => match self.authorize_instance(&caller, &instance, generation) {
                Err(e) => reply(out, call, Err(e)),
                Ok(generation) => {
                    let then = Then::Deregister {
                        call: Some(call),
                        instance: instance.clone(),
                        generation,
                    };
                    self.set_intent(&instance, Intent::Leave, then, out);
                }
            },
            Call::OpenSession {
                instance,
                generation,
                caller,
            } => {
                let result = self
                    .authorize_instance(&caller, &instance, generation)
                    .and_then(|generation| match self.regs.get(&instance) {
                        Some(_) => Ok(Reply::SessionOpened(generation)),
                        None => Err(ApiError::not_found(format!(
                            "instance {instance} is not registered on this agent"
                        ))),
                    });
                reply(out, call, result);
            }
        }
    }

    /// Whether `caller` may write instances of `service`: operators may
    /// write anything on this node; a workload only the services its
    /// `[[workloads]]` grants name.
    fn authorize(&self, caller: &Caller, service: &ServiceKey) -> Result<(), ApiError> {
        let Caller::Workload { uid, gid } = *caller else {
            return Ok(());
        };
        let allowed = self
            .settings
            .config
            .workloads
            .iter()
            .filter(|w| w.uid.is_none_or(|u| u == uid) && w.gid.is_none_or(|g| g == gid))
            .flat_map(|w| &w.services)
            .any(|p| {
                p.matches(
                    service.namespace.as_str(),
                    service.service.as_str(),
                    service.port_name.as_str(),
                )
            });
        if allowed {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!("uid {uid} gid {gid} may not write instances of {service} (agent [[workloads]] grants)")))
        }
    }

    /// The service an instance belongs to, from the local registrations or
    /// the views.
    fn service_of(&self, id: &InstanceId) -> Option<ServiceKey> {
        if let Some(local) = self.regs.get(id) {
            return Some(local.registration.service.clone());
        }
        self.sync
            .iter()
            .find(|(_, t)| {
                t.view
                    .as_ref()
                    .is_some_and(|v| v.records().any(|r| &r.instance_id == id))
            })
            .map(|(k, _)| k.clone())
    }

    /// Authorizes a call about an existing instance and resolves the
    /// generation it names. Workloads must name the generation; only the
    /// node token may omit it.
    fn authorize_instance(
        &self,
        caller: &Caller,
        id: &InstanceId,
        given: Option<u64>,
    ) -> Result<Option<Generation>, ApiError> {
        let service = self.service_of(id).ok_or_else(|| {
            ApiError::not_found(format!("instance {id} is not known to this agent"))
        })?;
        self.authorize(caller, &service)?;
        if given.is_none() && matches!(caller, Caller::Workload { .. }) {
            return Err(ApiError::bad_request(
                "generation: required for workload callers; only the node token may omit it",
            ));
        }
        self.generation_for(id, given)
    }

    /// Resolves the generation a call names against the local registration
    /// (409 when it is not the current one) or, for instances this agent did
    /// not register, against its views.
    fn generation_for(
        &self,
        id: &InstanceId,
        given: Option<u64>,
    ) -> Result<Option<Generation>, ApiError> {
        let current = match self.regs.get(id) {
            Some(local) => local.generation,
            None => self.record_of(id).map(|(generation, _)| generation),
        };
        let known = self.regs.get(id).is_some() || current.is_some();
        match (given, current) {
            (Some(g), Some(c)) if c.get() != g => Err(ApiError::stale_generation(format!(
                "instance {id} is at generation {c}, not {g}; nothing was changed"
            ))),
            (Some(g), _) => Ok(Some(Generation(g))),
            (None, c) if known => Ok(c),
            (None, _) => Err(ApiError::not_found(format!(
                "instance {id} is not registered through this agent; give its generation"
            ))),
        }
    }

    /// The generation and revision of the record of `id` in the views.
    fn record_of(&self, id: &InstanceId) -> Option<(Generation, Revision)> {
        self.sync.iter().find_map(|(_, t)| {
            t.view
                .as_ref()?
                .records()
                .find(|r| &r.instance_id == id)
                .map(|r| (r.generation, r.revision))
        })
    }

    fn heartbeat(
        &mut self,
        id: &InstanceId,
        generation: Option<u64>,
        caller: &Caller,
        now_ms: u64,
    ) -> Result<serde_json::Value, ApiError> {
        self.authorize_instance(caller, id, generation)?;
        self.health.update(id, |_, health| health.heartbeat(now_ms));
        let Some(local) = self.regs.get(id) else {
            return Err(ApiError::not_found(format!(
                "instance {id} is not registered on this agent"
            )));
        };
        if let (Some(g), Some(c)) = (generation, local.generation) {
            if g != c.get() {
                return Err(ApiError::stale_generation(format!(
                    "instance {id} is at generation {c}, not {g}; the heartbeat changes nothing"
                )));
            }
        }
        Ok(
            serde_json::json!({"instance_id": id.as_str(), "generation": local.generation.map(|g| g.get())}),
        )
    }

    fn registration(&self, r: &ValidRegistration) -> Registration {
        Registration {
            instance_id: r.instance_id.clone(),
            service: r.service.clone(),
            node: self.settings.node.clone(),
            epoch: self.settings.epoch,
            address: r.address,
            port: r.port,
            zone: r.zone.clone(),
            version: r.version.clone(),
            weight: r.weight,
            labels: r.labels.clone(),
            // With checks an instance starts STARTING and becomes READY when
            // they pass; without, it is READY while the node's lease holds.
            initial: if r.checks.is_some() {
                State::Starting
            } else {
                State::Ready
            },
        }
    }

    /// Keeps a registration the arbiter did not take now (unreachable or
    /// unavailable): it is sent by the next reconcile.
    fn register_pending<R: Rng + ?Sized>(
        &mut self,
        call: CallId,
        registration: ValidRegistration,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let id = registration.instance_id.clone();
        self.watch_health(&registration, None, now_ms, rng);
        self.desired.remove(&id);
        self.publish.insert(registration.service.clone());
        self.regs.put(LocalInstance {
            registration,
            generation: None,
            intent: Intent::Serve,
            committed: false,
        });
        let answer = Ok(Reply::Registered(WriteOutcome::Pending(RegisterResponse {
            instance_id: id,
            generation: None,
            state: "PENDING".into(),
            pending: true,
        })));
        self.save(Then::Reply(call, answer), out);
    }

    /// Saves the registrations, then does `then`.
    fn save(&mut self, then: Then, out: &mut Vec<Output>) {
        self.next_save += 1;
        let save = self.next_save;
        self.saves.insert(save, then);
        out.push(Output::SaveRegistrations {
            save,
            bytes: self.regs.encode(),
        });
    }

    fn saved(&mut self, then: Then, result: Result<(), String>, out: &mut Vec<Output>) {
        if let Err(e) = &result {
            tracing::error!(error = %e, "saving registrations failed");
        }
        let failed =
            |e: &String| ApiError::unavailable(format!("saving the registration failed: {e}"));
        match (then, result) {
            (Then::Nothing, _) => {}
            (Then::Reply(call, answer), Ok(())) => reply(out, call, answer),
            (Then::Reply(call, _), Err(e)) => reply(out, call, Err(failed(&e))),
            (Then::Drain { call, .. }, Err(e)) => reply(out, call, Err(failed(&e))),
            (
                Then::Deregister {
                    call: Some(call), ..
                },
                Err(e),
            ) => reply(out, call, Err(failed(&e))),
            (Then::Deregister { call: None, .. }, Err(_)) => {}
            (
                Then::Drain {
                    call,
                    instance,
                    generation,
                    propagated,
                },
                Ok(()),
            ) => {
                let sent = generation.is_some_and(|generation| {
                    let body = Request::Transition {
                        instance_id: instance.clone(),
                        generation,
                        to: State::Draining,
                        reason: drain_reason(),
                    };
                    let purpose = Purpose::Drain {
                        call,
                        instance,
                        generation,
                        propagated,
                    };
                    self.request(body, purpose, out)
                });
                if !sent {
                    reply(out, call, Ok(drain_pending()));
                }
            }
            (
                Then::Deregister {
                    call,
                    instance,
                    generation,
                },
                Ok(()),
            ) => {
                let sent = generation.is_some_and(|generation| {
                    let body = Request::Deregister {
                        instance_id: instance.clone(),
                        generation,
                    };
                    self.request(body, Purpose::Deregister { call, instance }, out)
                });
                if let (false, Some(call)) = (sent, call) {
                    reply(out, call, Ok(deregister_pending()));
                }
            }
        }
    }

    /// Records the intent of a local instance (effective in this agent's
    /// own data plane at once), saves it, then does `then`.
    fn set_intent(&mut self, id: &InstanceId, intent: Intent, then: Then, out: &mut Vec<Output>) {
        if intent != Intent::Serve {
            // A leaving instance's probes no longer move it (DRAINING is one-way).
            self.health.remove(id);
            self.desired.remove(id);
        }
        match self.regs.get_mut(id) {
            Some(local) => {
                local.intent = intent;
                local.committed = false;
                self.publish.insert(local.registration.service.clone());
                self.save(then, out);
            }
            None => self.saved(then, Ok(()), out),
        }
    }

    fn undo_intent(&mut self, id: &InstanceId, out: &mut Vec<Output>) {
        if let Some(local) = self.regs.get_mut(id) {
            local.intent = Intent::Serve;
            local.committed = true;
            self.publish.insert(local.registration.service.clone());
        }
        self.save(Then::Nothing, out);
    }

    fn mark_committed(&mut self, id: &InstanceId, out: &mut Vec<Output>) {
        if let Some(local) = self.regs.get_mut(id) {
            local.committed = true;
        }
        self.save(Then::Nothing, out);
    }

    fn forget_local(&mut self, id: &InstanceId, out: &mut Vec<Output>) {
        if let Some(local) = self.regs.remove(id) {
            self.publish.insert(local.registration.service);
        }
        self.health.remove(id);
        self.save(Then::Nothing, out);
    }

    /// The drain sequence after its commit: the instance's open
    /// connections may finish for `max_drain_ms`, then it is deregistered
    /// (unless it was re-registered or deregistered meanwhile). The whole
    /// window is always given: this agent sees only its own proxies'
    /// connections, not those of callers on other nodes.
    fn drain_window_over(&mut self, id: InstanceId, generation: Generation, out: &mut Vec<Output>) {
        let still_draining = self
            .regs
            .get(&id)
            .is_some_and(|l| l.intent == Intent::Drain && l.generation == Some(generation));
        if !still_draining {
            return;
        }
        tracing::info!(instance = %id, "drain window over; deregistering");
        let then = Then::Deregister {
            call: None,
            instance: id.clone(),
            generation: Some(generation),
        };
        self.set_intent(&id, Intent::Leave, then, out);
    }

    // ----- answers -----

    fn answer<R: Rng + ?Sized>(
        &mut self,
        purpose: Purpose,
        result: Result<Response, String>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        match purpose {
            Purpose::Register { call, registration } => match result {
                Ok(Response::Committed {
                    generation: Some(g),
                    state,
                    ..
                }) => {
                    let id = registration.instance_id.clone();
                    self.watch_health(&registration, Some(g), now_ms, rng);
                    self.desired.remove(&id);
                    self.publish.insert(registration.service.clone());
                    self.regs.put(LocalInstance {
                        registration,
                        generation: Some(g),
                        intent: Intent::Serve,
                        committed: true,
                    });
                    let state = state.map_or("READY", |s| s.as_str()).to_owned();
                    let answer = Ok(Reply::Registered(WriteOutcome::Committed(
                        RegisterResponse {
                            instance_id: id,
                            generation: Some(g.get()),
                            state,
                            pending: false,
                        },
                    )));
                    self.save(Then::Reply(call, answer), out);
                }
                Ok(Response::Rejected { kind, message }) => {
                    reply(out, call, Err(api_error(kind, message)))
                }
                Ok(other) => reply(
                    out,
                    call,
                    Err(ApiError::unavailable(format!(
                        "unexpected answer from the arbiter: {other:?}"
                    ))),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "registration not sent; kept pending");
                    self.register_pending(call, registration, now_ms, rng, out);
                }
            },
            Purpose::Drain {
                call,
                instance,
                generation,
                propagated,
            } => match result {
                Ok(Response::Committed { revision, .. }) => {
                    self.mark_committed(&instance, out);
                    self.drains
                        .entry(now_ms + self.settings.config.drain.max_drain_ms)
                        .or_default()
                        .push((instance.clone(), generation));
                    let revision = revision.or_else(|| self.record_of(&instance).map(|r| r.1));
                    match (propagated, revision) {
                        (true, Some(revision)) => {
                            self.await_propagation(call, &instance, revision, out)
                        }
                        _ => reply(
                            out,
                            call,
                            Ok(Reply::Drained(WriteOutcome::Committed(DrainResponse {
                                revision: revision.map(|r| r.get()),
                                pending: false,
                                propagated: None,
                            }))),
                        ),
                    }
                }
                Ok(Response::Rejected { kind, message }) => {
                    self.undo_intent(&instance, out);
                    reply(out, call, Err(api_error(kind, message)));
                }
                Ok(other) => reply(
                    out,
                    call,
                    Err(ApiError::unavailable(format!(
                        "unexpected answer from the arbiter: {other:?}"
                    ))),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "drain not sent; kept pending");
                    reply(out, call, Ok(drain_pending()));
                }
            },
            Purpose::Propagation { call, revision } => {
                let answer = match result {
                    Ok(Response::Propagated { acked, total }) => {
                        Ok(Reply::Drained(WriteOutcome::Committed(DrainResponse {
                            revision: Some(revision.get()),
                            pending: false,
                            propagated: Some(Propagated {
                                acked,
                                total,
                                complete: acked >= total,
                            }),
                        })))
                    }
                    Ok(other) => Err(ApiError::unavailable(format!(
                        "unexpected answer from the arbiter: {other:?}"
                    ))),
                    Err(e) => Err(ApiError::unavailable(format!(
                        "the drain committed but waiting for propagation failed: {e}"
                    ))),
                };
                reply(out, call, answer);
            }
            Purpose::Deregister { call, instance } => match result {
                Ok(Response::Committed { revision, .. }) => {
                    self.forget_local(&instance, out);
                    if let Some(call) = call {
                        reply(
                            out,
                            call,
                            Ok(Reply::Deregistered(WriteOutcome::Committed(
                                serde_json::json!({"revision": revision.map(|r| r.get()), "pending": false}),
                            ))),
                        );
                    }
                }
                Ok(Response::Rejected { kind, message }) => {
                    self.undo_intent(&instance, out);
                    match call {
                        Some(call) => reply(out, call, Err(api_error(kind, message))),
                        None => {
                            tracing::warn!(instance = %instance, reason = %message, "deregistration after the drain failed")
                        }
                    }
                }
                Ok(other) => {
                    if let Some(call) = call {
                        reply(
                            out,
                            call,
                            Err(ApiError::unavailable(format!(
                                "unexpected answer from the arbiter: {other:?}"
                            ))),
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "deregistration not sent; kept pending");
                    if let Some(call) = call {
                        reply(out, call, Ok(deregister_pending()));
                    }
                }
            },
            Purpose::Desired {
                instance,
                want,
                in_plan,
            } => {
                let ok = match result {
                    Ok(Response::Committed { .. }) => {
                        if self.desired.get(&instance) == Some(&want) {
                            self.desired.remove(&instance);
                        }
                        true
                    }
                    Ok(Response::Rejected { kind, message }) => {
                        tracing::warn!(instance = %instance, ?kind, reason = %message, "the arbiter refused a health transition");
                        self.desired.remove(&instance);
                        true
                    }
                    Ok(other) => {
                        tracing::warn!(answer = ?other, "unexpected answer to a transition");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(instance = %instance, error = %e, "health change kept until the arbiter is back");
                        false
                    }
                };
                if in_plan {
                    self.plan_step_done(ok, out);
                } else if ok && self.desired.get(&instance).is_some_and(|w| *w != want) {
                    // It changed while this one was in flight.
                    self.push_desired(&instance, false, out);
                }
            }
            Purpose::Liveness { instance } => {
                if let Err(e) = result {
                    tracing::warn!(instance = %instance, error = %e, "liveness not sent");
                }
            }
            Purpose::ReportDown { node, in_plan } => {
                let ok = match result {
                    Ok(Response::Committed { .. }) => {
                        tracing::info!(node = %node, "down verdict committed");
                        self.downs.settled(node);
                        self.publish_down = true;
                        true
                    }
                    Ok(Response::Rejected { message, .. }) => {
                        tracing::info!(node = %node, reason = %message, "down report not acted on");
                        self.downs.settled(node);
                        self.publish_down = true;
                        true
                    }
                    Ok(other) => {
                        tracing::warn!(answer = ?other, "unexpected answer to a down report");
                        true
                    }
                    Err(e) => {
                        tracing::warn!(node = %node, error = %e, "down report not sent");
                        false
                    }
                };
                if in_plan {
                    self.plan_step_done(ok, out);
                }
            }
            Purpose::Plan(step) => self.plan_answer(step, result, now_ms, out),
        }
    }

    fn await_propagation(
        &mut self,
        call: CallId,
        instance: &InstanceId,
        revision: Revision,
        out: &mut Vec<Output>,
    ) {
        let Some(service) = self.service_of(instance) else {
            return reply(
                out,
                call,
                Err(ApiError::not_found(format!(
                    "the service of instance {instance} is not known here"
                ))),
            );
        };
        let body = Request::AwaitPropagation {
            service,
            revision,
            timeout_ms: self.settings.config.propagation_timeout_ms,
        };
        if !self.request(body, Purpose::Propagation { call, revision }, out) {
            reply(
                out,
                call,
                Err(ApiError::unavailable(
                    "the drain committed but the arbiter session ended before propagation",
                )),
            );
        }
    }

    // ----- health (R4) -----

    /// Starts checking a local instance's health (a registration with
    /// checks, at registration or at agent start). Replaces any earlier
    /// checker of the same instance, so results of an old generation's
    /// probes are never counted against the new one.
    fn watch_health<R: Rng + ?Sized>(
        &mut self,
        reg: &ValidRegistration,
        generation: Option<Generation>,
        now_ms: u64,
        rng: &mut R,
    ) {
        let Some(checks) = reg.checks.as_ref() else {
            self.health.remove(&reg.instance_id);
            return;
        };
        let target = SocketAddr::new(reg.address, reg.port);
        let health = InstanceHealth::new(Some(checks), target, now_ms, rng);
        self.health
            .insert(reg.instance_id.clone(), (generation, health));
    }

    fn health_event(&mut self, id: &InstanceId, event: HealthEvent, out: &mut Vec<Output>) {
        let (state, reason) = match event {
            HealthEvent::Ready => (State::Ready, format!("{} passed", Which::Readiness)),
            HealthEvent::Unhealthy { reason } => (State::Unhealthy, reason),
            HealthEvent::StartupFailing { reason } => {
                tracing::warn!(instance = %id, reason = %reason, "startup check failing");
                return;
            }
            HealthEvent::Liveness(liveness) => {
                tracing::info!(instance = %id, liveness = liveness.as_str(), "liveness changed");
                return self.push_liveness(id, liveness, out);
            }
        };
        tracing::info!(instance = %id, state = state.as_str(), reason = %reason, "health changed");
        self.counters.health_flaps += 1;
        self.want(id, state, &reason, out);
    }

    /// Records the state a local instance should have in the catalog and
    /// sends it when connected; the reconcile plan sends what is left
    /// after an outage.
    fn want(&mut self, id: &InstanceId, state: State, reason: &str, out: &mut Vec<Output>) {
        let reason = bounded_reason(reason, "health check changed");
        self.desired.insert(id.clone(), (state, reason));
        let in_flight = self
            .in_flight
            .values()
            .any(|(_, p)| matches!(p, Purpose::Desired { instance, .. } if instance == id));
        if !in_flight {
            self.push_desired(id, false, out);
        }
    }

    /// Sends a local instance's desired state, if any; whether it was sent.
    fn push_desired(&mut self, id: &InstanceId, in_plan: bool, out: &mut Vec<Output>) -> bool {
        let Some(want) = self.desired.get(id).cloned() else {
            return false;
        };
        let Some(generation) = self
            .regs
            .get(id)
            .filter(|l| l.intent == Intent::Serve)
            .and_then(|l| l.generation)
        else {
            return false;
        };
        let body = Request::Transition {
            instance_id: id.clone(),
            generation,
            to: want.0,
            reason: want.1.clone(),
        };
        let purpose = Purpose::Desired {
            instance: id.clone(),
            want,
            in_plan,
        };
        self.request(body, purpose, out)
    }

    fn push_liveness(&mut self, id: &InstanceId, liveness: Liveness, out: &mut Vec<Output>) {
        let Some(generation) = self.regs.get(id).and_then(|l| l.generation) else {
            return;
        };
        let body = Request::SetLiveness {
            instance_id: id.clone(),
            generation,
            liveness,
        };
        self.request(
            body,
            Purpose::Liveness {
                instance: id.clone(),
            },
            out,
        );
    }

    fn report_down(
        &mut self,
        node: NodeId,
        epoch: AgentEpoch,
        in_plan: bool,
        out: &mut Vec<Output>,
    ) -> bool {
        let body = Request::ReportDown {
            node: node.clone(),
            epoch,
        };
        self.request(body, Purpose::ReportDown { node, in_plan }, out)
    }

    // ----- reconciliation (R7) -----

    /// After a (re)connect, or a write refused as unavailable: replays what
    /// is pending and reconciles the local registrations with the catalog's
    /// records on this node. One plan at a time; a trigger during one runs
    /// another after it.
    fn start_plan(&mut self, out: &mut Vec<Output>) {
        if self.plan.is_some() {
            self.plan_again = true;
            return;
        }
        if self.request(
            Request::NodeInstances,
            Purpose::Plan(PlanRequest::List),
            out,
        ) {
            self.plan = Some(Plan {
                waiting: true,
                ..Plan::default()
            });
        }
    }

    fn plan_answer(
        &mut self,
        step: PlanRequest,
        result: Result<Response, String>,
        now_ms: u64,
        out: &mut Vec<Output>,
    ) {
        let ok = match (step, result) {
            (PlanRequest::List, Ok(Response::Instances(listed))) => {
                let steps = self
                    .regs
                    .iter()
                    .map(|l| Step::Local(l.registration.instance_id.clone()))
                    .chain([Step::Health, Step::Downs, Step::StaleRecords])
                    .collect();
                if let Some(plan) = self.plan.as_mut() {
                    plan.listed = listed;
                    plan.steps = steps;
                }
                true
            }
            (PlanRequest::List, Ok(other)) => {
                tracing::warn!(answer = ?other, "unexpected answer to NodeInstances; reconciliation skipped");
                false
            }
            (PlanRequest::Register { instance }, Ok(response)) => {
                match response {
                    Response::Committed {
                        generation: Some(g),
                        ..
                    } => {
                        if let Some(l) = self.regs.get_mut(&instance) {
                            l.generation = Some(g);
                            l.committed = l.intent == Intent::Serve;
                        }
                        self.health.update(&instance, |tag, _| *tag = Some(g));
                        self.save(Then::Nothing, out);
                        self.push_front(Step::Intent(instance));
                    }
                    Response::Rejected { message, .. } => {
                        tracing::error!(instance = %instance, reason = %message, "the arbiter refused a pending registration; dropping it");
                        self.forget_local(&instance, out);
                    }
                    other => {
                        tracing::warn!(answer = ?other, "unexpected answer to a registration");
                        self.push_front(Step::Intent(instance));
                    }
                }
                true
            }
            (
                PlanRequest::Intent {
                    instance,
                    intent,
                    generation,
                },
                Ok(response),
            ) => {
                match (&response, intent) {
                    (Response::Committed { .. }, Intent::Leave)
                    | (
                        Response::Rejected {
                            kind: RejectKind::NotFound | RejectKind::StaleGeneration,
                            ..
                        },
                        _,
                    ) => {
                        if let Some(local) = self.regs.remove(&instance) {
                            self.publish.insert(local.registration.service);
                        }
                    }
                    (Response::Committed { .. }, intent) => {
                        if let Some(l) = self.regs.get_mut(&instance) {
                            l.committed = true;
                        }
                        if intent == Intent::Drain {
                            self.drains
                                .entry(now_ms + self.settings.config.drain.max_drain_ms)
                                .or_default()
                                .push((instance.clone(), generation));
                        }
                    }
                    (other, _) => {
                        tracing::warn!(instance = %instance, answer = ?other, "a pending write was refused")
                    }
                }
                self.save(Then::Nothing, out);
                true
            }
            (PlanRequest::Stale, Ok(_)) => true,
            (_, Err(e)) => {
                tracing::warn!(error = %e, "reconciliation interrupted");
                false
            }
        };
        self.plan_step_done(ok, out);
    }

    fn push_front(&mut self, step: Step) {
        if let Some(plan) = self.plan.as_mut() {
            plan.steps.push_front(step);
        }
    }

    /// The plan's request was answered: go on with the next step, or end
    /// the plan when it failed.
    fn plan_step_done(&mut self, ok: bool, out: &mut Vec<Output>) {
        let Some(plan) = self.plan.as_mut() else {
            return;
        };
        plan.waiting = false;
        if !ok {
            self.end_plan(out);
            return;
        }
        self.run_plan(out);
    }

    fn end_plan(&mut self, out: &mut Vec<Output>) {
        self.plan = None;
        if std::mem::take(&mut self.plan_again) {
            self.start_plan(out);
        }
    }

    /// Runs steps until one sends a request, or the plan ends.
    fn run_plan(&mut self, out: &mut Vec<Output>) {
        loop {
            let Some(plan) = self.plan.as_mut() else {
                return;
            };
            let Some(step) = plan.steps.pop_front() else {
                return self.end_plan(out);
            };
            let sent = match step {
                Step::Local(id) => self.plan_local(&id, out),
                Step::Intent(id) => self.plan_intent(&id, out),
                Step::Health => {
                    self.plan_health();
                    let mut ids: Vec<InstanceId> = self.desired.keys().cloned().collect();
                    ids.sort();
                    if let Some(plan) = self.plan.as_mut() {
                        for id in ids.into_iter().rev() {
                            plan.steps.push_front(Step::Desired(id));
                        }
                    }
                    false
                }
                Step::Desired(id) => self.push_desired(&id, true, out),
                Step::Downs => {
                    let downs = self.downs.to_report();
                    if let Some(plan) = self.plan.as_mut() {
                        for (node, epoch) in downs.into_iter().rev() {
                            plan.steps.push_front(Step::Down(node, epoch));
                        }
                    }
                    false
                }
                Step::Down(node, epoch) => self.report_down(node, epoch, true, out),
                Step::StaleRecords => {
                    let stale: Vec<(InstanceId, Generation)> = self
                        .plan
                        .as_ref()
                        .map(|p| {
                            p.listed
                                .iter()
                                .filter(|l| {
                                    l.origin == Role::Agent
                                        && l.state != State::Expired
                                        && self.regs.get(&l.instance_id).is_none()
                                })
                                .map(|l| (l.instance_id.clone(), l.generation))
                                .collect()
                        })
                        .unwrap_or_default();
                    if let Some(plan) = self.plan.as_mut() {
                        for (id, g) in stale.into_iter().rev() {
                            plan.steps.push_front(Step::Deregister(id, g));
                        }
                    }
                    false
                }
                Step::Deregister(id, generation) => {
                    tracing::warn!(instance = %id, "deregistering a record this agent has no local registration of");
                    let body = Request::Deregister {
                        instance_id: id,
                        generation,
                    };
                    self.request(body, Purpose::Plan(PlanRequest::Stale), out)
                }
            };
            if sent {
                if let Some(plan) = self.plan.as_mut() {
                    plan.waiting = true;
                }
                return;
            }
        }
    }

    /// Compares a local instance with the catalog's record of it.
    fn plan_local(&mut self, id: &InstanceId, out: &mut Vec<Output>) -> bool {
        let Some(local) = self.regs.get(id).cloned() else {
            return false;
        };
        let in_catalog = self.plan.as_ref().and_then(|p| {
            p.listed
                .iter()
                .find(|l| &l.instance_id == id && l.state != State::Expired)
                .cloned()
        });
        match (local.generation, in_catalog) {
            (Some(g), Some(c)) if c.generation == g => {
                if !local.committed {
                    return self.plan_intent(id, out);
                }
                if local.intent == Intent::Serve
                    && local.registration.checks.is_none()
                    && c.state == State::Unhealthy
                    && c.reason.as_str().starts_with("node down")
                {
                    // A down verdict marked it while this node was away;
                    // without checks it serves while the node's lease holds.
                    self.want(
                        id,
                        State::Ready,
                        "node back: its agent holds the lease again",
                        out,
                    );
                }
                false
            }
            (Some(g), Some(c)) => {
                tracing::warn!(instance = %id, local = %g, catalog = %c.generation, "the catalog holds a newer registration of this instance; dropping the local one");
                self.forget_local(id, out);
                false
            }
            (Some(_), None) if local.intent != Intent::Serve => {
                self.forget_local(id, out);
                false
            }
            _ => {
                let body = Request::Register(self.registration(&local.registration));
                self.request(
                    body,
                    Purpose::Plan(PlanRequest::Register {
                        instance: id.clone(),
                    }),
                    out,
                )
            }
        }
    }

    /// Sends the drain or deregistration a local instance still wants.
    fn plan_intent(&mut self, id: &InstanceId, out: &mut Vec<Output>) -> bool {
        let Some(local) = self.regs.get(id) else {
            return false;
        };
        let Some(generation) = local.generation else {
            return false;
        };
        let body = match local.intent {
            Intent::Serve => return false,
            Intent::Drain => Request::Transition {
                instance_id: id.clone(),
                generation,
                to: State::Draining,
                reason: drain_reason(),
            },
            Intent::Leave => Request::Deregister {
                instance_id: id.clone(),
                generation,
            },
        };
        let purpose = Purpose::Plan(PlanRequest::Intent {
            instance: id.clone(),
            intent: local.intent,
            generation,
        });
        self.request(body, purpose, out)
    }

    /// Health verdicts reached while the arbiter was away, or that a down
    /// verdict overwrote, become desired states.
    fn plan_health(&mut self) {
        let Some(plan) = self.plan.as_ref() else {
            return;
        };
        let mut wanted = Vec::new();
        for (id, (_, health)) in self.health.iter() {
            let current = plan
                .listed
                .iter()
                .find(|l| &l.instance_id == id)
                .map(|l| l.state);
            let state = health.state();
            if resend_health(state, current, self.desired.contains_key(id)) {
                let reason = bounded_reason(
                    health.reason().unwrap_or("health check verdict"),
                    "health check verdict",
                );
                wanted.push((id.clone(), (state, reason)));
            }
        }
        self.desired.extend(wanted);
    }

    // ----- what the driver reads -----

    /// `GET /v1/status` at `now_ms`.
    pub fn status(&self, now_ms: u64) -> StatusResponse {
        let connected = self.is_connected();
        StatusResponse {
            node: self.settings.node.clone(),
            zone: self.settings.zone.clone(),
            agent_epoch: self.settings.epoch.get(),
            arbiter: ArbiterStatus {
                connected,
                address: self.address.clone(),
                last_contact_ms: self.last_contact_ms.map(|t| {
                    if connected {
                        0
                    } else {
                        now_ms.saturating_sub(t)
                    }
                }),
                catalog: self.sync.catalog().map(|c| c.to_string()),
            },
            lease: match &self.link {
                Link::Up { lease, ttl_ms, .. } => Some(LeaseStatus {
                    id: lease.get(),
                    ttl_ms: *ttl_ms,
                }),
                _ => None,
            },
            subscriptions: self
                .subscriptions()
                .map(|(service, revision, lag, stale, _)| SubscriptionStatus {
                    service: service.clone(),
                    revision,
                    lag,
                    stale,
                })
                .collect(),
            pending_writes: self.regs.pending().len() as u32,
            gossip: self.gossip_alive.as_ref().map(|alive| GossipStatus {
                alive: alive.iter().cloned().collect(),
                down: self.downs.nodes().cloned().collect(),
            }),
            // The driver's: it holds the TLS material.
            tls: None,
        }
    }

    /// Every followed service: revision held, revisions behind the shard,
    /// whether stale, and the time it was last known current.
    pub fn subscriptions(
        &self,
    ) -> impl Iterator<Item = (&ServiceKey, u64, u64, bool, Option<u64>)> + '_ {
        self.sync.iter().map(|(service, t)| {
            let revision = t.view.as_ref().map_or(0, |v| v.revision().get());
            let lag = if t.synced {
                0
            } else {
                self.shard_revision.get().saturating_sub(revision)
            };
            let last = if t.synced {
                None
            } else {
                Some(t.confirmed_at_ms.unwrap_or(self.settings.started_ms))
            };
            (service, revision, lag, !t.synced, last)
        })
    }

    /// The liveness of each local instance with checks.
    pub fn liveness(&self) -> impl Iterator<Item = (&InstanceId, Liveness)> + '_ {
        self.health.iter().map(|(id, (_, h))| (id, h.liveness()))
    }

    /// Counters for metrics.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The catalog sync's counters.
    pub fn sync_stats(&self) -> &SyncStats {
        self.sync.stats()
    }

    /// The agent's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The local registrations.
    pub fn registrations(&self) -> &Registrations {
        &self.regs
    }

    /// The view held of `service`.
    pub fn view(&self, service: &ServiceKey) -> Option<&ServiceView> {
        self.sync.get(service).and_then(|t| t.view.as_deref())
    }

    /// The state the health checks of a local instance give it, if it has
    /// checks.
    pub fn health_state(&self, id: &InstanceId) -> Option<State> {
        self.health.get(id).map(|(_, h)| h.state())
    }

    /// Writes not yet in the catalog: pending registrations and intents,
    /// desired states, and requests in flight.
    pub fn writes_waiting(&self) -> usize {
        self.regs.pending().len() + self.desired.len() + self.in_flight.len()
    }
}

/// The service a catalog update is about.
fn updated_service(update: &ServiceUpdate) -> Option<ServiceKey> {
    match update {
        ServiceUpdate::Deltas(ds) => ds.first().map(|d| d.service.clone()),
        ServiceUpdate::Snapshot(_) => None,
        ServiceUpdate::Current { service, .. }
        | ServiceUpdate::Unknown { service }
        | ServiceUpdate::RetryAfter { service, .. }
        | ServiceUpdate::Denied { service, .. }
        | ServiceUpdate::NotYet { service, .. } => Some(service.clone()),
    }
}

fn reply(out: &mut Vec<Output>, call: CallId, reply: Result<Reply, ApiError>) {
    out.push(Output::Reply { call, reply });
}

/// The pending (202) answer of a local write call, given when the arbiter
/// has not answered it within `agent.write_answer_ms`; `None` for calls
/// that are not writes.
fn pending_reply(op: &Call) -> Option<Reply> {
    match op {
        Call::Register { registration, .. } => {
            Some(Reply::Registered(WriteOutcome::Pending(RegisterResponse {
                instance_id: registration.instance_id.clone(),
                generation: None,
                state: "PENDING".to_owned(),
                pending: true,
            })))
        }
        Call::Drain { .. } => Some(drain_pending()),
        Call::Deregister { .. } => Some(deregister_pending()),
        Call::Heartbeat { .. } | Call::OpenSession { .. } => None,
    }
}

fn drain_pending() -> Reply {
    Reply::Drained(WriteOutcome::Pending(DrainResponse {
        revision: None,
        pending: true,
        propagated: None,
    }))
}

fn deregister_pending() -> Reply {
    Reply::Deregistered(WriteOutcome::Pending(
        serde_json::json!({"revision": null, "pending": true}),
    ))
}

fn drain_reason() -> Reason {
    Reason::new("drain requested through the agent API").expect("a valid constant")
}

/// A reason from free text: cut to the catalog's 256 bytes at a character
/// boundary, control characters dropped; `fallback` if nothing is left.
fn bounded_reason(text: &str, fallback: &'static str) -> Reason {
    let mut cut = String::new();
    for c in text.chars().filter(|c| !c.is_control()) {
        if cut.len() + c.len_utf8() > 256 {
            break;
        }
        cut.push(c);
    }
    Reason::new(&cut).unwrap_or_else(|_| Reason::new(fallback).expect("a valid constant"))
}

/// The API error for an arbiter's refusal.
pub fn api_error(kind: RejectKind, message: String) -> ApiError {
    match kind {
        RejectKind::StaleGeneration => ApiError::stale_generation(message),
        RejectKind::NotFound => ApiError::not_found(message),
        RejectKind::Forbidden => ApiError::forbidden(message),
        RejectKind::Invalid => ApiError::unprocessable(message),
        RejectKind::Unavailable => ApiError::unavailable(message),
    }
}

#[cfg(test)]
mod tests;
