//! One simulated agent of the fleet bench: the binary's own agent state
//! machine ([`AgentState`]) and its own session actor
//! ([`rollcall_node::session::SessionActor`], a real QUIC connection with
//! mutual TLS), carried by a driver as thin as the agent's own
//! (`rollcall_node::agent`). Everything the agent decides — reconnect
//! backoff with full jitter, keep-alives, lease renewals, subscriptions
//! and their resume, acknowledgements, retries after `RetryAfter`,
//! pending writes and their replay — is the real machine's.
//!
//! What this driver does differently from the agent process, and why:
//! - no data plane: publications are deferred and never built (nothing
//!   reads them), so an agent costs the generator little beyond its
//!   session;
//! - no files: saves are answered at once, the cache is not written (the
//!   bench measures the arbiter, not the agents' disks);
//! - a witness question is answered "reachable" without a connect: every
//!   bench node is alive, and its instances' addresses are not real;
//! - it records, at the edge, what the coordinator measures: each commit
//!   with its revision and times, each acknowledgement (the moment the
//!   machine applied a revision), the deliveries and their bytes;
//! - it can be cut off the arbiter (`Cut`: the session ends and every
//!   connect fails until `Heal`), and restarted with its cache wiped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use rollcall_config::AgentConfig;
use rollcall_leases::client::ArbiterClient;
use rollcall_leases::clock::now_ms;
use rollcall_leases::codec::encode_session_down;
use rollcall_leases::protocol::{Request, Response, ServiceUpdate, SessionDown, SessionUp};
use rollcall_leases::{AgentEpoch, InstanceId, ServiceKey, State, Version, Weight};
use rollcall_node::agent_state::{
    AgentState, Call, CallId, Caller, Input, Output, Refusal, Reply, RequestId, Restored, Settings,
};
use rollcall_node::api_types::ValidRegistration;
use rollcall_node::carry::carry;
use rollcall_node::session::SessionSlot;

mod carrier;

use super::plan::Plan;
use super::records::{now_us, Commit, Kind, Load, Records, Return};

/// What every agent of a worker shares: the plan, the records, and the
/// counters the worker polls for progress.
pub struct Shared {
    /// The plan.
    pub plan: Arc<Plan>,
    /// Service key → index in the plan.
    pub index: HashMap<ServiceKey, u32>,
    /// Each service's size (records a complete view holds).
    pub sizes: Vec<usize>,
    /// Every agent's config but its node, zone and followed services.
    pub config: AgentConfig,
    /// What was recorded.
    pub records: Mutex<Records>,
}

impl Shared {
    fn record(&self, f: impl FnOnce(&mut Records)) {
        f(&mut self.records.lock().expect("records lock"));
    }
}

/// Register every instance this agent runs.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RegisterAll;

/// Follow every service this agent follows.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FollowAll;

/// Replace instance `k` of the plan: register its replacement, drain it,
/// and deregister it `drain_ms` after the drain is answered.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Replace {
    /// The instance.
    pub k: u32,
    /// From the drain's answer to the deregistration, ms.
    pub drain_ms: u64,
}

/// Cut the agent off the arbiter, restarting it with an empty cache when
/// `wipe`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cut {
    /// Restart with the cache wiped.
    pub wipe: bool,
}

/// Lift the cut.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Heal;

/// Close the session for good.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Close;

/// How far the agent is with what the current phase wants.
#[derive(Message)]
#[rtype(result = "Progress")]
pub struct Query(pub Want);

/// What a phase waits for.
#[derive(Clone, Debug)]
pub enum Want {
    /// A session holds the lease.
    Connected,
    /// Cut off (every agent; churn nodes never are).
    Cut,
    /// Every instance of the agent is registered (committed).
    Registered,
    /// Every followed view holds every record of its service.
    Complete,
    /// Replacements committed to the end (deregistered).
    Replaced,
    /// A session holds, and every followed view holds at least the
    /// revision named for its service.
    AtLeast(Arc<HashMap<u32, u64>>),
}

impl Want {
    /// What is waited for, in a phase's short note.
    pub fn name(&self) -> &'static str {
        match self {
            Want::Connected => "connected",
            Want::Cut => "cut",
            Want::Registered => "registered",
            Want::Complete => "complete views",
            Want::Replaced => "replaced",
            Want::AtLeast(_) => "views at the churn's revisions",
        }
    }
}

/// One agent's answer to `Query`.
#[derive(Clone, Copy, Debug, Default, MessageResponse)]
pub struct Progress {
    /// Done.
    pub done: u64,
    /// Due.
    pub total: u64,
}

/// What a local call was for, to take the next step when it is answered.
#[derive(Clone, Copy, Debug)]
enum Step {
    Registered,
    ReplacementRegistered { k: u32, drain_ms: u64 },
    Drained { k: u32, drain_ms: u64 },
    Deregistered,
}

/// The storm's accounting for this agent, from the heal on.
#[derive(Clone, Copy, Debug, Default)]
struct Back {
    connected_us: u64,
    snapshots: u64,
    retries: u64,
    failed: u64,
}

/// The driver.
pub struct FleetAgent {
    index: u32,
    shared: Arc<Shared>,
    state: AgentState,
    settings: Settings,
    client: ArbiterClient,
    hello: SessionUp,
    session: SessionSlot,
    wake: Option<SpawnHandle>,
    next_call: CallId,
    calls: HashMap<CallId, Step>,
    requests: HashMap<RequestId, (Kind, u32, u64)>,
    registered: u64,
    replaced: u64,
    replacing: u64,
    cut: bool,
    wiped: bool,
    back: Option<Back>,
    initial: Vec<Output>,
}

impl FleetAgent {
    /// Agent `index` of the plan, connecting through `client`.
    pub fn new(index: u32, shared: Arc<Shared>, client: ArbiterClient) -> FleetAgent {
        let plan = &shared.plan;
        let mut config = shared.config.clone();
        config.node_id = plan.node(index).to_string();
        config.zone = plan.zone(index).to_string();
        let settings = Settings {
            node: plan.node(index),
            zone: plan.zone(index),
            epoch: AgentEpoch(now_ms()),
            started_ms: now_ms(),
            config: Arc::new(config),
        };
        let hello = hello(index, &settings, plan);
        let mut initial = Vec::new();
        let mut state = AgentState::new(
            settings.clone(),
            Restored::default(),
            now_ms(),
            &mut rand::rng(),
            &mut initial,
        );
        // Nothing reads the data plane's view here: never build it.
        state.defer_publications();
        FleetAgent {
            index,
            shared,
            state,
            settings,
            client,
            hello,
            session: SessionSlot::default(),
            wake: None,
            next_call: 0,
            calls: HashMap::new(),
            requests: HashMap::new(),
            registered: 0,
            replaced: 0,
            replacing: 0,
            cut: false,
            wiped: false,
            back: None,
            initial,
        }
    }

    fn feed(&mut self, input: Input, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.state
            .handle(input, now_ms(), &mut rand::rng(), &mut out);
        self.carry(out, ctx);
    }

    fn call(&mut self, op: Call, step: Step, ctx: &mut Context<Self>) {
        self.next_call += 1;
        self.calls.insert(self.next_call, step);
        self.feed(
            Input::Call {
                call: self.next_call,
                op,
            },
            ctx,
        );
    }

    fn register(&mut self, k: u32, replacement: bool, step: Step, ctx: &mut Context<Self>) {
        let plan = &self.shared.plan;
        let inst = &plan.instances[k as usize];
        let registration = ValidRegistration {
            service: plan.services[inst.service as usize].clone(),
            instance_id: if replacement {
                inst.replacement.clone()
            } else {
                inst.id.clone()
            },
            address: plan.address(self.index),
            port: inst.port,
            zone: Some(plan.zone(self.index)),
            version: Version::new(if replacement { "v2" } else { "v1" }).expect("valid version"),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            checks: None,
        };
        self.call(
            Call::Register {
                registration,
                caller: Caller::Operator,
            },
            step,
            ctx,
        );
    }

    fn carry(&mut self, outputs: Vec<Output>, ctx: &mut Context<Self>) {
        carry(outputs, &mut carrier::BenchCarry { act: self, ctx });
    }

    /// What a request writes, and to which service (none for reads).
    fn what(&self, body: &Request) -> Option<(Kind, u32)> {
        let (kind, instance) = match body {
            Request::Register(reg) => {
                return self
                    .shared
                    .index
                    .get(&reg.service)
                    .map(|&s| (Kind::Register, s))
            }
            Request::Transition {
                instance_id, to, ..
            } => (
                if *to == State::Draining {
                    Kind::Drain
                } else {
                    Kind::Other
                },
                instance_id,
            ),
            Request::Deregister { instance_id, .. } => (Kind::Deregister, instance_id),
            Request::SetLiveness { instance_id, .. } => (Kind::Other, instance_id),
            _ => return None,
        };
        self.service_of(instance).map(|s| (kind, s))
    }

    /// The service of one of this agent's instances (old or replacement).
    fn service_of(&self, instance: &InstanceId) -> Option<u32> {
        let plan = &self.shared.plan;
        plan.by_agent[self.index as usize]
            .iter()
            .map(|&k| &plan.instances[k as usize])
            .find(|i| i.id == *instance || i.replacement == *instance)
            .map(|i| i.service)
    }

    fn answered(&mut self, step: Step, reply: Result<Reply, Refusal>, ctx: &mut Context<Self>) {
        if let Err(error) = &reply {
            let message = format!("{step:?}: {error:?}");
            self.shared.record(|r| r.error(message));
            if let Step::ReplacementRegistered { .. } | Step::Drained { .. } = step {
                self.replacing = self.replacing.saturating_sub(1);
            }
            return;
        }
        let instance = |k: u32| self.shared.plan.instances[k as usize].id.clone();
        match step {
            Step::Registered => {}
            Step::Deregistered => {
                self.replaced += 1;
                self.replacing = self.replacing.saturating_sub(1);
            }
            Step::ReplacementRegistered { k, drain_ms } => {
                let op = Call::Drain {
                    instance: instance(k),
                    generation: None,
                    propagated: false,
                    caller: Caller::Operator,
                };
                self.call(op, Step::Drained { k, drain_ms }, ctx);
            }
            Step::Drained { k, drain_ms } => {
                ctx.run_later(Duration::from_millis(drain_ms), move |act, ctx| {
                    let op = Call::Deregister {
                        instance: act.shared.plan.instances[k as usize].id.clone(),
                        generation: None,
                        caller: Caller::Operator,
                    };
                    act.call(op, Step::Deregistered, ctx);
                });
            }
        }
    }

    /// Notes a committed answer, and counts what the phases wait for.
    fn commit(&mut self, request: RequestId, response: &Response) {
        let Some((kind, service, sent_us)) = self.requests.remove(&request) else {
            return;
        };
        let Response::Committed {
            revision: Some(revision),
            ..
        } = response
        else {
            return;
        };
        if kind == Kind::Register {
            self.registered += 1;
        }
        let commit = Commit {
            agent: self.index,
            kind,
            service,
            revision: revision.0,
            sent_us,
            answered_us: now_us(),
        };
        self.shared.record(|r| r.commits.push(commit));
    }

    /// Counts what reached this agent.
    fn delivered(&mut self, message: &SessionDown) {
        let SessionDown::Update(items) = message else {
            return;
        };
        let mut load = Load {
            messages: 1,
            updates: items.len() as u64,
            bytes: encode_session_down(message).len() as u64 + FRAME_PREFIX_BYTES,
            ..Load::default()
        };
        for item in items {
            match item {
                ServiceUpdate::Deltas(deltas) => load.deltas += deltas.len() as u64,
                ServiceUpdate::Snapshot(_) => load.snapshots += 1,
                ServiceUpdate::RetryAfter { .. } => load.retries += 1,
                _ => {}
            }
        }
        if let Some(back) = &mut self.back {
            back.snapshots += load.snapshots;
            back.retries += load.retries;
        }
        let second = now_us() / 1_000_000;
        self.shared
            .record(|r| r.load.entry(second).or_default().add(&load));
    }

    fn progress(&self, want: &Want) -> Progress {
        let plan = &self.shared.plan;
        let follows = &plan.follows[self.index as usize];
        let connected = self.state.is_connected();
        let (done, total) = match want {
            Want::Connected => (u64::from(connected), 1),
            Want::Cut => {
                let due = !plan.is_churn(self.index);
                (u64::from(due && self.cut), u64::from(due))
            }
            Want::Registered => (
                self.registered,
                plan.by_agent[self.index as usize].len() as u64,
            ),
            Want::Complete => (
                follows
                    .iter()
                    .filter(|&&s| {
                        self.state
                            .view(&plan.services[s as usize])
                            .is_some_and(|v| v.records().count() == self.shared.sizes[s as usize])
                    })
                    .count() as u64,
                follows.len() as u64,
            ),
            Want::Replaced => (self.replaced, self.replaced + self.replacing),
            Want::AtLeast(required) => (
                if connected {
                    follows
                        .iter()
                        .filter(|&&s| {
                            let need = required.get(&s).copied().unwrap_or(0);
                            self.state
                                .view(&plan.services[s as usize])
                                .is_some_and(|v| v.revision().0 >= need)
                        })
                        .count() as u64
                } else {
                    0
                },
                follows.len() as u64,
            ),
        };
        Progress { done, total }
    }

    /// The agent restarts with its registrations kept and its cache gone
    /// (a new epoch; its followed services pinned, as a restarted agent's
    /// configured services are).
    fn restart_wiped(&mut self, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.state.close("bench: agent restarting", &mut out);
        self.carry(out, ctx);
        if let Some(handle) = self.wake.take() {
            ctx.cancel_future(handle);
        }
        let plan = &self.shared.plan;
        let mut config = (*self.settings.config).clone();
        config.services = plan.follows[self.index as usize]
            .iter()
            .map(|&s| plan.services[s as usize].to_string())
            .collect();
        self.settings = Settings {
            epoch: AgentEpoch(now_ms().max(self.settings.epoch.0 + 1)),
            started_ms: now_ms(),
            config: Arc::new(config),
            ..self.settings.clone()
        };
        self.hello = hello(self.index, &self.settings, &self.shared.plan);
        let restored = Restored {
            registrations: self.state.registrations().clone(),
            ..Restored::default()
        };
        let mut out = Vec::new();
        self.state = AgentState::new(
            self.settings.clone(),
            restored,
            now_ms(),
            &mut rand::rng(),
            &mut out,
        );
        self.state.defer_publications();
        self.wiped = true;
        self.carry(out, ctx);
    }
}

/// A cut connect fails after this long (a handshake that gets no answer).
const CUT_CONNECT_FAILS_AFTER: Duration = Duration::from_millis(200);

/// The length prefix of every frame on a stream.
const FRAME_PREFIX_BYTES: u64 = 4;

fn hello(index: u32, settings: &Settings, plan: &Plan) -> SessionUp {
    SessionUp::Hello {
        node: settings.node.clone(),
        epoch: settings.epoch,
        zone: settings.zone.clone(),
        addresses: vec![plan.address(index)],
    }
}

impl Actor for FleetAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let initial = std::mem::take(&mut self.initial);
        self.carry(initial, ctx);
    }
}

impl Handler<Input> for FleetAgent {
    type Result = ();

    fn handle(&mut self, input: Input, ctx: &mut Context<Self>) {
        match &input {
            Input::Answer {
                request,
                result: Ok(response),
            } => self.commit(*request, response),
            Input::Answer {
                request,
                result: Err(_),
            } => {
                self.requests.remove(request);
            }
            Input::Message { message, .. } => self.delivered(message),
            Input::Connected { .. } => {
                if let Some(back) = &mut self.back {
                    if back.connected_us == 0 {
                        back.connected_us = now_us();
                    }
                }
            }
            Input::SessionEnded { session, reason } => {
                self.session.ended(*session);
                // Why sessions end (a replica's silence, a lost
                // connection, the storm's cut) is in the report's errors.
                self.shared
                    .record(|r| r.error(format!("session ended: {reason}")));
                if let Some(back) = &mut self.back {
                    if back.connected_us == 0 {
                        back.failed += 1;
                    }
                }
            }
            _ => {}
        }
        self.feed(input, ctx);
    }
}

impl Handler<RegisterAll> for FleetAgent {
    type Result = ();

    fn handle(&mut self, _: RegisterAll, ctx: &mut Context<Self>) {
        let mine = self.shared.plan.by_agent[self.index as usize].clone();
        for k in mine {
            self.register(k, false, Step::Registered, ctx);
        }
    }
}

impl Handler<FollowAll> for FleetAgent {
    type Result = ();

    fn handle(&mut self, _: FollowAll, ctx: &mut Context<Self>) {
        let keys: Vec<ServiceKey> = self.shared.plan.follows[self.index as usize]
            .iter()
            .map(|&s| self.shared.plan.services[s as usize].clone())
            .collect();
        for key in keys {
            self.feed(Input::Follow(key), ctx);
        }
    }
}

impl Handler<Replace> for FleetAgent {
    type Result = ();

    fn handle(&mut self, Replace { k, drain_ms }: Replace, ctx: &mut Context<Self>) {
        self.replacing += 1;
        self.register(k, true, Step::ReplacementRegistered { k, drain_ms }, ctx);
    }
}

impl Handler<Cut> for FleetAgent {
    type Result = ();

    fn handle(&mut self, Cut { wipe }: Cut, ctx: &mut Context<Self>) {
        self.cut = true;
        if wipe {
            return self.restart_wiped(ctx);
        }
        if let Some(session) = self.session.close_any("bench: network cut".into()) {
            self.feed(
                Input::SessionEnded {
                    session,
                    reason: "bench: the network to the arbiters is cut".into(),
                },
                ctx,
            );
        }
    }
}

impl Handler<Heal> for FleetAgent {
    type Result = ();

    fn handle(&mut self, _: Heal, _: &mut Context<Self>) {
        self.cut = false;
        self.back = Some(Back::default());
    }
}

impl Handler<Query> for FleetAgent {
    type Result = Progress;

    fn handle(&mut self, Query(want): Query, _: &mut Context<Self>) -> Progress {
        self.progress(&want)
    }
}

impl Handler<Close> for FleetAgent {
    type Result = ();

    fn handle(&mut self, _: Close, ctx: &mut Context<Self>) {
        if let Some(back) = self.back {
            let ret = Return {
                agent: self.index,
                wiped: self.wiped,
                connected_us: back.connected_us,
                snapshots: back.snapshots,
                retries: back.retries,
                failed: back.failed,
            };
            self.shared.record(|r| r.returns.push(ret));
        }
        let mut out = Vec::new();
        self.state.close("bench over", &mut out);
        self.carry(out, ctx);
        ctx.stop();
    }
}
