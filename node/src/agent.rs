//! The node agent process (`rollcall agent`) as a small set of actix
//! actors, each a thin driver that owns one state machine or one IO
//! resource and carries outputs out:
//!
//! - `AgentActor` owns the agent's state machine (`agent_state`): every
//!   input reaches it as a message in one mailbox, every output is carried
//!   from here (to the session, the prober, the store, the view, a local
//!   caller's answer, a timer).
//! - `SessionActor`, one per arbiter connection, owns its QUIC streams:
//!   the handshake and Welcome, the session stream in both directions,
//!   each request on a stream of its own.
//! - `ProberActor` owns the prober (HTTP and TCP checks under the
//!   per-agent concurrency cap).
//! - `StoreActor` owns the data directory's files: the cache, the
//!   registrations file and the regions file, written one at a time off
//!   the actors' thread.
//!
//! The gossip driver (`rollcall_gossip::driver`) feeds foca's verdicts to
//! the agent actor as messages. The data plane is not actors: each
//! proxied connection, DNS query and HTTP request is a plain tokio task
//! that reads the published endpoint view (`view`) and never waits on a
//! mailbox (a mailbox hop per connection would add latency); only writes
//! and status calls of the local API go through the agent's mailbox.
//!
//! Actors need an actix System; `runtime::block_on` gives one over a
//! multi-thread tokio runtime that quinn, hickory and axum share.
//! Shutdown is one signal (`shutdown`) that every listener observes; the
//! agent actor then flushes its files and closes the session with a
//! reason.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rollcall_config::AgentConfig;
use rollcall_leases::client::{ArbiterClient, ClientError};
use rollcall_leases::clock::now_ms;
use rollcall_leases::protocol::SessionUp;
use rollcall_leases::tls::{LiveTls, TlsMaterial};
use rollcall_leases::{AgentEpoch, Label, NodeId, ServiceKey};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::agent_state::{AgentState, CallId, Input, Output, Reply, Restored, SessionId, Settings};
use crate::api::{ApiContext, CallMessage, MetricsMessage, SessionClosedMessage, StatusMessage};
use crate::api_types::{ApiError, StatusResponse};
use crate::cache::ServiceCache;
use crate::dns::DnsHandle;
use crate::ingress::IngressHandle;
use crate::metrics::{AgentMetrics, Reported, Scrape};
use crate::prober::{Prober, ProberActor, Reach, RunProbe};
use crate::proxy::ProxyHandle;
use crate::registrations::{RegistrationsError, RegistrationsFile};
use crate::session::{Ask, CloseSession, SendUp, SessionActor};
use crate::shutdown::{self, Trigger};
use crate::store::{Barrier, SaveRegions, SaveRegistrations, StoreActor, StoreViews};
use crate::view::{Lookup, ViewSettings, Views};
use rollcall_gossip::GossipHandle;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A config value this crate cannot use.
    #[error("agent config: {0}")]
    Config(String),
    /// A file or listener failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The registrations file is unusable.
    #[error(transparent)]
    Registrations(#[from] RegistrationsError),
    /// The cache directory is unusable.
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    /// The arbiter client could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The zone's gossip could not be joined.
    #[error(transparent)]
    Zone(#[from] crate::zone::ZoneError),
    /// Started outside an actix System.
    #[error(
        "the agent's actors need an actix System: start it inside rollcall_node::runtime::block_on"
    )]
    NoSystem,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// A handle on a running agent (cheap to clone): its view, its mailbox,
/// its token and metrics.
#[derive(Clone)]
pub struct Agent {
    addr: Addr<AgentActor>,
    tls: Option<Arc<LiveTls>>,
    views: Views,
    token: Arc<str>,
    epoch: AgentEpoch,
    config: Arc<AgentConfig>,
    metrics: Arc<AgentMetrics>,
}

/// A running agent: its listeners and its addresses.
pub struct AgentHandle {
    /// The agent.
    pub agent: Agent,
    /// Where the local HTTP API listens.
    pub http_addr: SocketAddr,
    /// The TCP proxies, one per `[[proxy]]` entry.
    pub proxies: Vec<ProxyHandle>,
    /// Where the DNS server listens (UDP and TCP).
    pub dns_addr: SocketAddr,
    /// The zone gossip member, when `gossip.key_file` is set.
    pub gossip: Option<GossipHandle>,
    /// Where the ingress gateway listens, when `ingress.listen` is set.
    pub ingress_addr: Option<SocketAddr>,
    ingress: Option<IngressHandle>,
    dns: DnsHandle,
    servers: Vec<JoinHandle<()>>,
    trigger: Trigger,
}

impl AgentHandle {
    /// Stops the agent through its one shutdown signal: the listeners stop
    /// accepting and their open connections get a short grace, changed
    /// views are written to the cache, and the session is closed with a
    /// reason. The files keep what the next start needs.
    pub async fn shutdown(self) {
        self.trigger.fire();
        for proxy in self.proxies {
            proxy.stopped().await;
        }
        if let Some(ingress) = self.ingress {
            ingress.stopped().await;
        }
        self.dns.shutdown().await;
        if let Some(gossip) = self.gossip {
            gossip.shutdown().await;
        }
        let _ = self.agent.addr.send(Stop).await;
        for server in self.servers {
            let _ = server.await;
        }
    }
}

/// The addresses this node declares in Hello: `advertise_addresses` when
/// set; none when the certificate carries IP SANs (the arbiter takes those);
/// else every address of the host's interfaces, at most
/// `MAX_DECLARED_ADDRESSES` of them.
fn declared_addresses(config: &AgentConfig, tls: Option<&TlsMaterial>) -> Vec<std::net::IpAddr> {
    if !config.advertise_addresses.is_empty() {
        return config.advertise_addresses.clone();
    }
    let certified = tls
        .and_then(|t| t.cert_chain.first())
        .map(|leaf| rollcall_leases::identity::ip_sans_from_cert_der(leaf))
        .unwrap_or_default();
    if !certified.is_empty() {
        return Vec::new();
    }
    let mut found: Vec<std::net::IpAddr> = match if_addrs::get_if_addrs() {
        Ok(interfaces) => interfaces.iter().map(if_addrs::Interface::ip).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the host's interface addresses: this node declares none, so an arbiter with registration.addresses = \"declared\" refuses its registrations; set advertise_addresses");
            Vec::new()
        }
    };
    found.retain(|a| !a.is_unspecified() && !a.is_multicast());
    found.sort();
    found.dedup();
    let max = rollcall_leases::protocol::MAX_DECLARED_ADDRESSES;
    if found.len() > max {
        tracing::warn!(
            found = found.len(),
            max,
            "the host has more interface addresses than a Hello declares; the first {max} are declared, set advertise_addresses to choose"
        );
        found.truncate(max);
    }
    found
}

impl Agent {
    /// Starts the agent: loads its files, serves the cache at once (stale),
    /// connects to the arbiter (when `arbiters` is set) and serves the local
    /// HTTP API, DNS, the proxies and the ingress gateway. `tls` is
    /// required when `arbiters` is set. Must run inside an actix System
    /// (`runtime::block_on`).
    pub async fn start(
        config: AgentConfig,
        tls: Option<&TlsMaterial>,
    ) -> Result<AgentHandle, AgentError> {
        if System::try_current().is_none() {
            return Err(AgentError::NoSystem);
        }
        let node = NodeId::new(&config.node_id).map_err(|e| AgentError::Config(e.to_string()))?;
        let zone = Label::new(&config.zone).map_err(|e| AgentError::Config(e.to_string()))?;
        let region =
            Label::new(&config.region).map_err(|e| AgentError::Config(format!("region: {e}")))?;
        for service in &config.services {
            service
                .parse::<ServiceKey>()
                .map_err(|e: rollcall_leases::NameError| AgentError::Config(e.to_string()))?;
        }
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(io(format!(
            "creating data directory {}",
            data_dir.display()
        )))?;
        let epoch = next_epoch(&data_dir)?;
        let token: Arc<str> = rollcall_leases::secret::ensure_token(&data_dir.join("agent.token"))
            .map_err(io("writing agent.token"))?
            .into();
        let cache = ServiceCache::open(&data_dir)?;
        let registrations_file = RegistrationsFile::new(&data_dir);
        let registrations = registrations_file.load()?;
        let report = cache.load_all();
        for (path, reason) in &report.discarded {
            tracing::warn!(path = %path.display(), reason = %reason, "cache file discarded; the service is fetched again");
        }
        let regions = match cache.load_regions() {
            Ok(found) => found,
            Err(reason) => {
                tracing::warn!(reason = %reason, "regions file discarded; policies arrive with the arbiter's next message");
                None
            }
        };
        if config.arbiters.is_empty() {
            tracing::warn!(
                "agent.arbiters is empty: this agent serves only its disk cache; registrations, drains and deregistrations stay pending, and resolves of services not cached answer 503"
            );
        }
        let client = match (config.arbiters.is_empty(), tls) {
            (true, _) => None,
            (false, Some(tls)) => Some(ArbiterClient::new(tls)?),
            (false, None) => return Err(AgentError::Config("agent.tls is required when agent.arbiters is set; generate certificates with `rollcall certs`".into())),
        };
        let declared = declared_addresses(&config, tls);
        let prober = Prober::new(config.probes.max_concurrent as usize)
            .map_err(|e| AgentError::Config(e.to_string()))?;
        let config = Arc::new(config);
        let metrics = Arc::new(AgentMetrics::new());
        metrics.set_max_services(config.metrics_max_services);
        metrics.cache_corrupt_at_start(report.corrupt as u64);
        let (trigger, shutdown) = shutdown::channel();

        // The agent actor's address exists before the actor, so the view
        // and the helper actors can send to it.
        let context: Context<AgentActor> = Context::new();
        let addr = context.address();
        let follow = addr.clone();
        let views = Views::new(
            ViewSettings {
                data_plane: config.data_plane.clone(),
                region: config.region.clone(),
                zone: zone.clone(),
                first_resolve_wait_ms: config.first_resolve_wait_ms,
            },
            metrics.clone(),
            move |key| follow.do_send(Input::Follow(key)),
        );
        let prober = ProberActor {
            prober: Arc::new(prober),
            agent: addr.clone().recipient(),
            metrics: metrics.clone(),
        }
        .start();
        let store = StoreActor::new(cache, registrations_file, addr.clone().recipient()).start();
        let now = now_ms();
        let settings = Settings {
            node: node.clone(),
            zone: zone.clone(),
            epoch,
            started_ms: now,
            config: config.clone(),
        };
        let restored = Restored {
            views: report.views,
            regions,
            registrations,
            health: Default::default(),
        };
        let mut outputs = Vec::new();
        let state = AgentState::new(settings, restored, now, &mut rand::rng(), &mut outputs);
        // What the cache holds is in the data plane's view before any
        // listener answers: the actor starts a moment later, and a resolve
        // of a cached service must not find an empty view meanwhile (an
        // agent restarted while the arbiter is down serves its cache at
        // once). The other outputs wait for the actor.
        let outputs: Vec<Output> = outputs
            .into_iter()
            .filter_map(|output| match output {
                Output::Publish(published) => {
                    views.publish(published, now);
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
            .collect();
        let tls = client.as_ref().map(|c| c.tls().clone());
        context.run(AgentActor {
            state,
            views: views.clone(),
            metrics: metrics.clone(),
            hello: SessionUp::Hello {
                node: node.clone(),
                epoch,
                zone: zone.clone(),
                addresses: declared.clone(),
            },
            client,
            session: None,
            prober,
            store,
            calls: HashMap::new(),
            next_call: 0,
            wake: None,
            reported: Reported::default(),
            initial: outputs,
        });

        let agent = Agent {
            tls,
            addr: addr.clone(),
            views: views.clone(),
            token: token.clone(),
            epoch,
            config: config.clone(),
            metrics,
        };
        let api = ApiContext {
            views: views.clone(),
            calls: addr.clone().recipient(),
            status: addr.clone().recipient(),
            metrics: addr.clone().recipient(),
            sessions: addr.clone().recipient(),
            token,
            checks: config.checks.clone(),
            region,
            limits: config.http_limits,
        };
        let listener = tokio::net::TcpListener::bind(config.http_listen)
            .await
            .map_err(io(format!(
                "binding the agent HTTP API on {}",
                config.http_listen
            )))?;
        let http_addr = listener
            .local_addr()
            .map_err(io("reading the HTTP API address"))?;
        let socket = data_dir.join("agent.sock");
        let mut servers = vec![crate::api::serve_tcp(
            api.clone(),
            listener,
            shutdown.clone(),
        )];
        servers.push(
            crate::api::serve_unix(api, &socket, shutdown.clone())
                .await
                .map_err(io(format!(
                    "binding the agent unix socket {}",
                    socket.display()
                )))?,
        );
        let mut proxies = Vec::new();
        for entry in &config.proxy {
            let proxy = crate::proxy::start(views.clone(), entry, shutdown.clone())
                .await
                .map_err(|e| AgentError::Config(e.to_string()))?;
            proxies.push(proxy);
        }
        let dns = crate::dns::start(views.clone(), config.dns_listen, config.dns_ttl_s)
            .await
            .map_err(|e| AgentError::Config(e.to_string()))?;
        let dns_addr = dns.local_addr();
        let ingress = match config.ingress.listen {
            Some(listen) => Some(
                crate::ingress::start(
                    views.clone(),
                    listen,
                    config.ingress.clone(),
                    config.first_resolve_wait_ms,
                    shutdown.clone(),
                )
                .await
                .map_err(io(format!(
                    "binding the ingress gateway {listen} (agent.ingress.listen)"
                )))?,
            ),
            None => None,
        };
        let gossip = crate::zone::start(&config, &node, epoch, addr.recipient()).await?;
        if let Some(gossip) = &gossip {
            agent.metrics().watch_gossip(gossip.drops());
        }
        tracing::info!(node = %node, epoch = %epoch, http = %http_addr, dns = %dns_addr, "agent started");
        Ok(AgentHandle {
            agent,
            http_addr,
            proxies,
            dns_addr,
            ingress_addr: ingress.as_ref().map(|i| i.local_addr),
            ingress,
            gossip,
            dns,
            servers,
            trigger,
        })
    }

    /// The node token (for operators' calls).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// This agent run's epoch.
    pub fn epoch(&self) -> AgentEpoch {
        self.epoch
    }

    /// The TLS material the agent presents to the arbiter, `None` without
    /// arbiters: a reload (`tls::Watcher`, SIGHUP) replaces it here, for
    /// every session from then on (the one up keeps its handshake).
    pub fn tls(&self) -> Option<&Arc<LiveTls>> {
        self.tls.as_ref()
    }

    /// The agent's config.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &AgentMetrics {
        &self.metrics
    }

    /// The endpoint view the data plane reads.
    pub fn views(&self) -> &Views {
        &self.views
    }

    /// What the view answers for `key` now (following it if new).
    pub fn lookup(&self, key: &ServiceKey) -> Lookup {
        self.views.lookup(key, now_ms())
    }

    /// `GET /v1/regions`: the other regions and the policies held.
    pub fn regions_status(&self) -> crate::api_types::RegionsResponse {
        self.views.regions_status(now_ms())
    }

    /// `GET /metrics`: the gauges refreshed, rendered.
    pub async fn metrics_text(&self) -> String {
        self.addr.send(MetricsMessage).await.unwrap_or_default()
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Option<StatusResponse> {
        self.addr.send(StatusMessage).await.ok()
    }
}

// ----- the agent actor -----

/// Every input reaches the state machine as a message of the agent
/// actor's one mailbox.
impl Message for Input {
    type Result = ();
}

/// Shutdown: flush the files, close the session, stop.
#[derive(Message)]
#[rtype(result = "()")]
struct Stop;

/// Owns the agent's state machine and carries its outputs out.
struct AgentActor {
    state: AgentState,
    views: Views,
    metrics: Arc<AgentMetrics>,
    hello: SessionUp,
    client: Option<ArbiterClient>,
    session: Option<(SessionId, Addr<SessionActor>)>,
    prober: Addr<ProberActor>,
    store: Addr<StoreActor>,
    calls: HashMap<CallId, oneshot::Sender<Result<Reply, ApiError>>>,
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
    type Result = ResponseFuture<Result<Reply, ApiError>>;

    fn handle(&mut self, CallMessage(op): CallMessage, ctx: &mut Context<Self>) -> Self::Result {
        self.next_call += 1;
        let call = self.next_call;
        let (tx, rx) = oneshot::channel();
        self.calls.insert(call, tx);
        self.feed(Input::Call { call, op }, ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(ApiError::unavailable("the agent is shutting down")))
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
                    let _ = tx.send(Err(ApiError::unavailable("the agent is shutting down")));
                }
                ctx.stop();
            }),
        )
    }
}

/// A fresh agent epoch, above every earlier one of this data directory: the
/// wall clock in ms, or the previous epoch + 1 if the clock went back.
fn next_epoch(data_dir: &Path) -> Result<AgentEpoch, AgentError> {
    let path = data_dir.join("epoch");
    let previous = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let epoch = now_ms().max(previous + 1);
    crate::durable::write_atomic(&path, epoch.to_string().as_bytes())
        .map_err(|e| AgentError::Config(e.to_string()))?;
    Ok(AgentEpoch(epoch))
}
