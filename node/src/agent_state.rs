//! The node agent's decisions, as one deterministic state machine
//! (quinn-proto style): everything the agent decides, and nothing it does.
//!
//! One door: [`AgentState::handle`] takes an [`Input`] (a local API call,
//! a message or an answer from the arbiter, a probe's result, a gossip
//! verdict, a file saved, a timer) with the time and a seeded rng, and
//! pushes [`Output`]s: what to send on the session, which request to make,
//! what to answer a local caller (by its call id), what to save or forget,
//! which probe to start, what to publish to the data plane's view, and
//! when to wake it next. The agent's actor carries the outputs out; the
//! fleet bench and the simulator carry the same outputs, each through
//! [`Carry`](crate::carry::Carry).
//!
//! `AgentState` routes each input to the sub-machine that owns the fields
//! it concerns and merges what they push, as quinn-proto's `Connection`
//! does over its streams. Each sub-machine is a file with its struct and
//! the glue that reaches into the others:
//! - [`arbiter`]: the arbiter link: which replica to try (a stable place
//!   per node), the reconnect backoff (full jitter), keep-alives and lease
//!   renewals, and the requests in flight on the session;
//! - [`following`]: the catalog views it follows (`sync`), what they
//!   publish to the data plane with the staleness limit of each service,
//!   the disk cache, and the services followed on demand;
//! - [`writes`]: the local API's writes, the intent of each local
//!   instance (serve, drain, leave), writes kept pending while the arbiter
//!   is away, the drain window, and the answers ([`write_answers`] says
//!   what the arbiter's answer to each means); [`authority`] checks who
//!   may write which instance and which generation a call names;
//!   [`requests`] builds every request a local instance's life sends, one
//!   function per shape, for the live path and the replay alike;
//! - [`health`]: when each check is due, what its results mean, and the
//!   state each local instance should have in the catalog;
//! - [`gossip`]: down verdicts reported to the arbiter and kept out of
//!   routing while cut off or until the arbiter answers, and the answers
//!   to the arbiter's witness questions;
//! - [`reconcile`]: after every (re)connect, the plan that replays what is
//!   pending in order, sends again the health verdicts the catalog does
//!   not hold, reports held down verdicts and deregisters records of this
//!   node that no local registration backs;
//! - [`status`]: what the driver reads (`/v1/status`, metrics);
//! - [`listing`]: the region's services, asked of the arbiter for a
//!   local call.
//!
//! Calls are answered in domain terms ([`Reply`], [`Refusal`]); `api`
//! maps them onto HTTP.
//!
//! It never reads a clock, a socket, a file or an unseeded rng.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::Rng;
use rollcall_config::AgentConfig;
use rollcall_leases::protocol::{RejectKind, Response};
use rollcall_leases::{
    AgentEpoch, CatalogId, Generation, InstanceId, Label, NodeId, RegionsUpdate, Revision,
    ServiceView, State,
};

use crate::health::InstanceHealth;
use crate::registrations::{Intent, Registrations};

use arbiter::ArbiterLink;
use following::Following;
use gossip::Peers;
use health::Health;
use reconcile::Reconcile;
use writes::LocalWrites;

pub use calls::{
    Call, CallId, Caller, Drained, LocalEntry, Propagation, Refusal, Refused, RegionServices,
    Registered, Reply, WriteOutcome,
};
pub use door::{Input, Output};

mod arbiter;
mod authority;
mod calls;
mod checkers;
mod door;
mod following;
mod gossip;
mod health;
mod listing;
mod reconcile;
mod requests;
mod status;
mod write_answers;
mod writes;

/// Catalog shards per region. One today; services map to shards by key
/// (`shard_of`), so more can be added without changing the protocol.
pub const SHARDS: u16 = 1;

/// Changed views wait this long before they are written to the disk cache,
/// so a burst of deltas costs one write per service, ms.
pub const FLUSH_DELAY_MS: u64 = 100;

/// After a write the arbiter refused as unavailable (no quorum, electing),
/// pending writes are tried again this often while the session is up, ms.
pub const WRITE_RETRY_MS: u64 = 500;

/// One session with an arbiter, numbered here.
pub type SessionId = u64;
/// A request on a stream of its own, numbered here.
pub type RequestId = u64;
/// A save of the registrations file, numbered here.
pub type SaveId = u64;

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

/// What a request in flight is for, by the sub-machine that asked.
// Moved once per input, never stored in bulk: boxing the large variant
// would cost an allocation per input for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Purpose {
    /// A local write (`writes`).
    Write(writes::WriteRequest),
    /// A local instance's health (`health`).
    Health(health::HealthRequest),
    /// A gossip down report (`gossip`).
    ReportDown { node: NodeId, in_plan: bool },
    /// A step of the reconcile plan (`reconcile`).
    Plan(reconcile::PlanRequest),
    /// The region's services, for a local call (`listing`).
    Services(CallId),
}

/// What the arbiter's answer says about a write.
#[derive(Clone, Debug)]
enum Verdict {
    /// Committed (or nothing to change: no revision).
    Committed {
        revision: Option<Revision>,
        generation: Option<Generation>,
        state: Option<State>,
    },
    /// Refused for a reason that sending it again does not change.
    Refused(RejectKind, String),
    /// No answer (the session ended, the group had no quorum), or an answer
    /// the arbiter should not have sent: whether it took effect is not
    /// known here, so the write is kept and sent again.
    Unknown(String),
}

impl Verdict {
    fn of(result: Result<Response, String>) -> Verdict {
        match result {
            Ok(Response::Committed {
                revision,
                generation,
                state,
            }) => Verdict::Committed {
                revision,
                generation,
                state,
            },
            Ok(Response::Rejected {
                kind: RejectKind::Unavailable,
                message,
            }) => Verdict::Unknown(format!("arbiter unavailable: {message}")),
            Ok(Response::Rejected { kind, message }) => Verdict::Refused(kind, message),
            Ok(other) => {
                tracing::warn!(answer = ?other, "an answer the arbiter should not have sent to a write; the write is kept");
                Verdict::Unknown(format!("unexpected answer from the arbiter: {other:?}"))
            }
            Err(e) => Verdict::Unknown(e),
        }
    }
}

/// The node agent's state (see the module doc).
pub struct AgentState {
    settings: Settings,
    link: ArbiterLink,
    following: Following,
    writes: LocalWrites,
    health: Health,
    peers: Peers,
    reconcile: Reconcile,
    wake: Option<u64>,
    counters: Counters,
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
        let mut state = AgentState {
            link: ArbiterLink::new(&config, &settings.node, now_ms),
            following: Following::new(&config, restored.views, restored.regions, now_ms),
            writes: LocalWrites::new(restored.registrations),
            health: Health::default(),
            peers: Peers::default(),
            reconcile: Reconcile::default(),
            wake: None,
            counters: Counters::default(),
            settings,
        };
        // Restored registrations with checks are checked again from now,
        // unless the driver passed their checkers warm.
        let mut warm = restored.health;
        let serving: Vec<_> = state
            .writes
            .regs
            .iter()
            .filter(|l| l.intent == Intent::Serve)
            .map(|l| (l.registration.clone(), l.generation))
            .collect();
        for (registration, generation) in serving {
            match warm.remove(&registration.instance_id) {
                Some(checker) => state.health.keep(&registration, generation, checker),
                None => state.health.watch(&registration, generation, now_ms, rng),
            }
        }
        out.push(Output::PublishRegions(state.following.regions.clone()));
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
            Input::Call { call, op } => self.call(call, op, now_ms, rng, out),
            Input::WorkloadSessionClosed {
                instance,
                generation,
            } => self.workload_session_closed(&instance, generation, out),
            Input::Follow(service) => self.follow(service, now_ms, rng, out),
            Input::Usage(usage) => self.usage(usage, now_ms, out),
            Input::Connected {
                session,
                lease,
                ttl_ms,
                revision,
                catalog,
            } => {
                if let Some(reconnect) = self.link.up(session, lease, ttl_ms, now_ms, rng) {
                    self.counters.reconnects += u64::from(reconnect);
                    self.connected(catalog, revision, now_ms, rng, out);
                }
            }
            Input::SessionEnded { session, reason } => {
                if self.link.session_id() == Some(session) {
                    tracing::warn!(arbiter = ?self.link.address(), error = %reason, "arbiter session ended");
                    self.link.ended_because(reason);
                    self.disconnected(now_ms, rng, out);
                }
            }
            Input::Message { session, message } => {
                if self.link.up_session() == Some(session) {
                    self.message(session, message, now_ms, rng, out);
                }
            }
            Input::Answer { request, result } => {
                if let Some(purpose) = self.link.answered(request) {
                    if matches!(
                        result,
                        Ok(Response::Rejected {
                            kind: RejectKind::Unavailable,
                            ..
                        })
                    ) {
                        // The region's arbiter group has no quorum, or is
                        // electing: the write stays pending, retried soon.
                        self.writes.retry_soon(now_ms);
                    }
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
                let events = self
                    .health
                    .probed(&instance, generation, which, passed, &detail, now_ms, rng);
                for event in events {
                    self.health_event(&instance, event, out);
                }
            }
            Input::PeerDown { node, epoch } => self.peer_down(node, epoch, out),
            Input::PeerUp { node } => self.peer_up(node, out),
            Input::Reached {
                node,
                epoch,
                reachable,
            } => self.witnessed(node, epoch, Some(reachable), out),
            Input::Saved { save, result } => self.saved(save, result, out),
            Input::Tick => {
                // A tick is the driver's timer firing, which consumes it:
                // the next wake-up is asked for again, even when it is the
                // same (a timer that fires a millisecond early, its clock
                // rounding differently from the machine's, would otherwise
                // leave the machine with none, and the renewals stop).
                self.wake = None;
                self.tick(now_ms, rng, out)
            }
        }
        self.finish(now_ms, out);
    }

    /// Routes an answer to the sub-machine whose request it was.
    fn answer<R: Rng + ?Sized>(
        &mut self,
        purpose: Purpose,
        result: Result<Response, String>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        match purpose {
            Purpose::Write(request) => self.write_answered(request, result, now_ms, rng, out),
            Purpose::Health(request) => self.health_answered(request, Verdict::of(result), out),
            Purpose::ReportDown { node, in_plan } => {
                let ok = self.report_answered(node, Verdict::of(result));
                if in_plan {
                    self.plan_step_done(ok, out);
                }
            }
            Purpose::Plan(step) => self.plan_answer(step, result, now_ms, out),
            Purpose::Services(call) => listing::answered(call, result, out),
        }
    }

    fn tick<R: Rng + ?Sized>(&mut self, now_ms: u64, rng: &mut R, out: &mut Vec<Output>) {
        self.link
            .tick(&self.settings.config.arbiters, now_ms, rng, out);
        self.following_tick(now_ms, rng, out);
        if self.writes.retry_due(now_ms) && self.link.is_connected() {
            tracing::info!("retrying writes the arbiter refused as unavailable");
            self.start_plan(out);
        }
        for (instance, generation) in self.writes.drains_due(now_ms) {
            self.drain_window_over(instance, generation, out);
        }
        let (probes, events) = self.health.due(now_ms, rng);
        out.extend(probes);
        for (id, event) in events {
            self.health_event(&id, event, out);
        }
    }

    /// Ends the session for a shutdown.
    pub fn close(&mut self, reason: &str, out: &mut Vec<Output>) {
        self.link.close(reason, out);
    }

    /// Answers what is due, publishes what changed and asks for the next
    /// wake-up: the end of every input.
    fn finish(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        self.writes.bound_answers(now_ms, out);
        if self.peers.take_changed() {
            out.push(Output::PublishDown(
                self.peers.downs.excluded(self.link.is_connected()),
            ));
        }
        if let Some(mut alive) = self.peers.take_alive() {
            // This agent's own node is alive by the best evidence there is.
            alive.insert(self.settings.node.clone());
            out.push(Output::PublishAlive(alive));
        }
        self.publish_changed(out);
        let wake = self.next_wake();
        if wake != self.wake {
            self.wake = wake;
            if let Some(at) = wake {
                out.push(Output::WakeAt(at.max(now_ms)));
            }
        }
    }

    fn next_wake(&self) -> Option<u64> {
        [
            self.link.next_wake(),
            self.following.next_wake(),
            self.writes.next_wake(),
            self.health.next_due_ms(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

#[cfg(test)]
mod tests;
