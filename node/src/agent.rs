//! The agent actor, `AgentActor`: owns the agent's state machine
//! (`agent_state`). Every input reaches it as a message of its one
//! mailbox; it reads the clock once per input and hands that time down,
//! and carries every output out (to the session, the prober, the store,
//! the view, a local caller's answer, a timer). It decides nothing, and
//! starts only the arbiter sessions the machine asks for: the process
//! around it (checks, listeners, the other actors) is `process`.
//!
//! `process::Agent` is the handle on it that the process and tests hold.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rollcall_leases::client::ArbiterClient;
use rollcall_leases::clock::now_ms;
use rollcall_leases::protocol::SessionUp;
use tokio::sync::oneshot;

use crate::agent_state::{AgentState, CallId, Input, Output, Refusal, Refused, Reply, SessionId};
use crate::api::{CallMessage, MetricsMessage, SessionClosedMessage, StatusMessage};
use crate::cache::ServiceCache;
use crate::metrics::{AgentMetrics, Reported, Scrape};
use crate::prober::{Prober, ProberActor, Reach, RunProbe};
use crate::registrations::RegistrationsFile;
use crate::session::{Ask, CloseSession, SendUp, SessionActor};
use crate::store::{Barrier, SaveRegions, SaveRegistrations, StoreActor, StoreViews};
use crate::view::Views;

/// What the agent actor and its helper actors start with, made by
/// `process` (which owns the order of the agent's start).
pub(crate) struct Parts {
    /// The state machine, made.
    pub state: AgentState,
    /// What it asked for when made and `publish_at_start` left.
    pub initial: Vec<Output>,
    /// The view it publishes to.
    pub views: Views,
    /// The agent's metrics.
    pub metrics: Arc<AgentMetrics>,
    /// The Hello every session starts with.
    pub hello: SessionUp,
    /// The arbiter client; `None` without arbiters.
    pub client: Option<ArbiterClient>,
    /// The prober the prober actor owns.
    pub prober: Prober,
    /// The files the store actor owns.
    pub files: (ServiceCache, RegistrationsFile),
}

/// Carries, at `now_ms`, what the state machine published when it was
/// made into the data plane's view, so that a resolve of a cached service
/// never finds an empty view while the actor starts (an agent restarted
/// while the arbiter is down serves its cache at once). Answers the other
/// outputs, which wait for the actor.
pub(crate) fn publish_at_start(views: &Views, outputs: Vec<Output>, now_ms: u64) -> Vec<Output> {
    outputs
        .into_iter()
        .filter_map(|output| match output {
            Output::Publish(published) => {
                views.publish(published, now_ms);
                None
            }
            Output::PublishDown(nodes) => {
                views.set_down(nodes);
                None
            }
            Output::PublishConnected(up) => {
                views.set_connected(up);
                None
            }
            Output::PublishRegions(regions) => {
                views.set_regions(regions);
                None
            }
            other => Some(other),
        })
        .collect()
}

/// Starts the prober and store actors and the agent actor on `context`
/// (whose address the view and the listeners already hold).
pub(crate) fn run(context: Context<AgentActor>, parts: Parts) -> Addr<AgentActor> {
    let addr = context.address();
    let prober = ProberActor {
        prober: Arc::new(parts.prober),
        agent: addr.clone().recipient(),
        metrics: parts.metrics.clone(),
    }
    .start();
    let (cache, registrations) = parts.files;
    let store = StoreActor::new(cache, registrations, addr.clone().recipient()).start();
    context.run(AgentActor {
        state: parts.state,
        views: parts.views,
        metrics: parts.metrics,
        hello: parts.hello,
        client: parts.client,
        session: None,
        prober,
        store,
        calls: HashMap::new(),
        next_call: 0,
        wake: None,
        reported: Reported::default(),
        initial: parts.initial,
    })
}

/// Every input reaches the state machine as a message of the agent
/// actor's one mailbox.
impl Message for Input {
    type Result = ();
}

/// Shutdown: flush the files, close the session, stop; answered once the
/// files are on disk.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Stop;

/// Owns the agent's state machine and carries its outputs out.
pub(crate) struct AgentActor {
    state: AgentState,
    views: Views,
    metrics: Arc<AgentMetrics>,
    hello: SessionUp,
    client: Option<ArbiterClient>,
    session: Option<(SessionId, Addr<SessionActor>)>,
    prober: Addr<ProberActor>,
    store: Addr<StoreActor>,
    calls: HashMap<CallId, oneshot::Sender<Result<Reply, Refusal>>>,
    next_call: CallId,
    wake: Option<SpawnHandle>,
    /// Counters already moved into the metrics.
    reported: Reported,
    /// What the state machine asked for at start.
    initial: Vec<Output>,
}

impl Actor for AgentActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let initial = std::mem::take(&mut self.initial);
        self.carry(initial, now_ms(), ctx);
        // Which services the data plane still asks for: the state machine
        // drops those followed on demand that nobody asks for.
        let every = Duration::from_millis(self.state.usage_interval_ms());
        ctx.run_interval(every, |act, ctx| {
            let usage = act.views.usage();
            act.feed(Input::Usage(usage), ctx);
        });
    }
}

impl AgentActor {
    /// One clock read per input, at the edge, handed down to the state
    /// machine and to what carries its outputs.
    fn feed(&mut self, input: Input, ctx: &mut Context<Self>) {
        let now = now_ms();
        let mut out = Vec::new();
        self.state.handle(input, now, &mut rand::rng(), &mut out);
        self.carry(out, now, ctx);
    }

    /// Carries `outputs`, made at `now_ms`, out.
    fn carry(&mut self, outputs: Vec<Output>, now_ms: u64, ctx: &mut Context<Self>) {
        for output in outputs {
            match output {
                Output::Connect { session, address } => {
                    let Some(client) = self.client.clone() else {
                        continue;
                    };
                    let actor = SessionActor::new(
                        session,
                        address,
                        client,
                        self.hello.clone(),
                        ctx.address().recipient(),
                    );
                    self.session = Some((session, actor.start()));
                }
                Output::Close { session, reason } => {
                    if let Some((_, addr)) = self.session.take_if(|(s, _)| *s == session) {
                        addr.do_send(CloseSession(reason));
                    }
                }
                Output::Send { session, message } => match &self.session {
                    Some((s, addr)) if *s == session => addr.do_send(SendUp(message)),
                    _ => {}
                },
                Output::Request {
                    session,
                    request,
                    body,
                } => match &self.session {
                    Some((s, addr)) if *s == session => addr.do_send(Ask { request, body }),
                    _ => ctx.notify(Input::Answer {
                        request,
                        result: Err("the arbiter session ended".into()),
                    }),
                },
                Output::Reply { call, reply } => {
                    if let Some(tx) = self.calls.remove(&call) {
                        let _ = tx.send(reply);
                    }
                }
                Output::StoreViews { views, forget } => {
                    self.store.do_send(StoreViews { views, forget })
                }
                Output::SaveRegistrations { save, bytes } => {
                    self.store.do_send(SaveRegistrations { save, bytes })
                }
                Output::SaveRegions {
                    update,
                    received_at_ms,
                } => self.store.do_send(SaveRegions {
                    update,
                    received_at_ms,
                }),
                Output::Witness {
                    node,
                    epoch,
                    addresses,
                } => self.prober.do_send(Reach {
                    node,
                    epoch,
                    addresses,
                }),
                Output::Probe {
                    instance,
                    generation,
                    task,
                } => self.prober.do_send(RunProbe {
                    instance,
                    generation,
                    task,
                }),
                Output::Publish(published) => self.views.publish(published, now_ms),
                Output::Changed(key) => {
                    if let Some(published) = self.state.published(&key) {
                        self.views.publish(published, now_ms);
                    }
                }
                Output::PublishDown(nodes) => self.views.set_down(nodes),
                Output::PublishAlive(nodes) => self.views.set_alive(nodes),
                Output::PublishConnected(up) => self.views.set_connected(up),
                Output::PublishRegions(regions) => self.views.set_regions(regions),
                Output::LiftEjections(node) => self.views.lift_node(&node),
                Output::Unpublish(key) => self.views.unpublish(&key),
                Output::WakeAt(at) => {
                    if let Some(handle) = self.wake.take() {
                        ctx.cancel_future(handle);
                    }
                    let after = Duration::from_millis(at.saturating_sub(now_ms));
                    self.wake = Some(ctx.run_later(after, |act, ctx| {
                        act.wake = None;
                        act.feed(Input::Tick, ctx);
                    }));
                }
            }
        }
    }
}

impl Handler<Input> for AgentActor {
    type Result = ();

    fn handle(&mut self, input: Input, ctx: &mut Context<Self>) {
        self.feed(input, ctx);
    }
}

impl Handler<CallMessage> for AgentActor {
    type Result = ResponseFuture<Result<Reply, Refusal>>;

    fn handle(&mut self, CallMessage(op): CallMessage, ctx: &mut Context<Self>) -> Self::Result {
        self.next_call += 1;
        let call = self.next_call;
        let (tx, rx) = oneshot::channel();
        self.calls.insert(call, tx);
        self.feed(Input::Call { call, op }, ctx);
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(Refusal::new(
                    Refused::Unavailable,
                    "the agent is shutting down",
                ))
            })
        })
    }
}

impl Handler<StatusMessage> for AgentActor {
    type Result = MessageResult<StatusMessage>;

    fn handle(&mut self, _: StatusMessage, _: &mut Context<Self>) -> Self::Result {
        let mut status = self.state.status(now_ms());
        status.tls = self.client.as_ref().map(|c| c.tls().status());
        MessageResult(status)
    }
}

impl Handler<MetricsMessage> for AgentActor {
    type Result = String;

    fn handle(&mut self, _: MetricsMessage, _: &mut Context<Self>) -> String {
        let now = now_ms();
        let regions = self.views.regions();
        let state = &self.state;
        let scrape = Scrape {
            sync: state.sync_stats().clone(),
            health_flaps: state.counters().health_flaps,
            reconnects: state.counters().reconnects,
            subscriptions: state
                .subscriptions()
                .map(|(service, _, lag, _, last)| (service.clone(), lag, last))
                .collect(),
            liveness: state.liveness().map(|(id, l)| (id.clone(), l)).collect(),
            regions: &regions,
        };
        self.metrics.refresh(scrape, &mut self.reported, now);
        if let Some(client) = &self.client {
            rollcall_leases::server::metrics::set_certificate_expiry(
                &self.metrics.certificate_expiry,
                &client.tls().status(),
                now as i64 / 1_000,
            );
        }
        self.metrics.render()
    }
}

impl Handler<SessionClosedMessage> for AgentActor {
    type Result = ();

    fn handle(&mut self, message: SessionClosedMessage, ctx: &mut Context<Self>) {
        self.feed(
            Input::WorkloadSessionClosed {
                instance: message.instance,
                generation: message.generation,
            },
            ctx,
        );
    }
}

impl Handler<Stop> for AgentActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) -> Self::Result {
        let mut out = Vec::new();
        self.state.flush(&mut out);
        self.state.close("agent shutting down", &mut out);
        self.carry(out, now_ms(), ctx);
        let store = self.store.clone();
        Box::pin(
            async move {
                // The store writes in order: once this is answered, every
                // write asked for before it is on disk.
                let _ = store.send(Barrier).await;
            }
            .into_actor(self)
            .map(|_, act, ctx| {
                for (_, tx) in act.calls.drain() {
                    let _ = tx.send(Err(Refusal::new(
                        Refused::Unavailable,
                        "the agent is shutting down",
                    )));
                }
                ctx.stop();
            }),
        )
    }
}
