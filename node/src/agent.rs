//! The node agent's driver (`rollcall agent`): owns the arbiter connection,
//! the session, the disk cache and the local registrations, and answers the
//! local API. The decisions live in `sync` (catalog views) and the catalog
//! itself; this module carries messages, timers and files.
//!
//! Outage behaviour (R7): with the arbiter unreachable the agent keeps
//! serving its views (marked stale) and accepts writes locally as pending;
//! it reconnects with exponential backoff and full jitter, resumes every
//! subscription by delta, and replays what is pending.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rollcall_config::{AgentConfig, ConnTraffic, StaleBehaviour};
use rollcall_leases::client::{ArbiterClient, ArbiterConn, ClientError};
use rollcall_leases::protocol::{RejectKind, Request, Response, SessionDown, SessionUp};
use rollcall_leases::tls::TlsMaterial;
use rollcall_leases::{
    shard_of, AgentEpoch, EndpointRecord, Generation, InstanceId, Label, LeaseId, NodeId, Reason,
    Registration, Revision, Role, ServiceKey, ShardId, State,
};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::api_types::{
    ApiError, DrainResponse, EndpointJson, EndpointsResponse, FailoverJson, Propagated,
    RegionsPolicy, RegionsResponse, RegisterResponse, StatusResponse, SubscriptionStatus,
    ValidRegistration,
};
use crate::api_types::{ArbiterStatus, GossipStatus, LeaseStatus};
use crate::cache::ServiceCache;
use crate::dns::DnsHandle;
use crate::endpoints::{Selection, ServiceMemory};
use crate::failover::{Decision, Refusal};
use crate::health::{HealthEvent, InstanceHealth, ProbeTask, Which};
use crate::link::{renew_after_ms, resend_health, Backoff, DownVerdicts};
use crate::metrics::{AgentMetrics, FailoverLabel, RefusalLabel, RegionLabel, ServiceLabel};
use crate::prober::Prober;
use crate::proxy::{ActiveConnections, ProxyHandle};
use crate::registrations::{Intent, LocalInstance, Registrations, RegistrationsError};
use crate::sync::{Sync, SyncOut};
use rollcall_gossip::{GossipHandle, GossipListener, GossipOptions, ZoneKey};

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
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// Catalog shards per region. One today; services map to shards by key
/// (`shard_of`), so more can be added without changing the protocol.
const SHARDS: u16 = 1;

/// Wall clock in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A handle on a running agent (cheap to clone).
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

struct Inner {
    prober: Prober,
    active: ActiveConnections,
    metrics: AgentMetrics,
    sessions: std::sync::atomic::AtomicU64,
    /// A write was refused as unavailable (the arbiter group has no
    /// quorum): reconcile again soon, without waiting for a reconnect.
    retry_writes: std::sync::atomic::AtomicBool,
    config: AgentConfig,
    node: NodeId,
    zone: Label,
    epoch: AgentEpoch,
    started_ms: u64,
    token: String,
    cache: ServiceCache,
    /// When the regions message last written to the cache arrived (ms).
    regions_saved: Arc<Mutex<u64>>,
    state: Mutex<Shared>,
    changed: Notify,
}

struct Shared {
    sync: Sync,
    regs: Registrations,
    link: Option<ArbiterConn>,
    session: Option<mpsc::UnboundedSender<SessionUp>>,
    address: Option<String>,
    last_contact_ms: Option<u64>,
    lease: Option<(LeaseId, u64)>,
    shard_revision: Revision,
    dirty: BTreeSet<ServiceKey>,
    forget: BTreeSet<ServiceKey>,
    /// The shared endpoint view's memory, per service.
    memory: HashMap<ServiceKey, ServiceMemory>,
    /// Recent failed connects (instance, when), to learn whether the view
    /// was stale when the catalog then takes them out of READY.
    recent_failures: VecDeque<(InstanceId, u64)>,
    /// Sync counters already reported to metrics.
    reported: crate::sync::SyncStats,
    /// Health of local instances with checks, by instance and generation.
    health: HashMap<InstanceId, (Option<Generation>, InstanceHealth)>,
    /// The state and reason each local instance's health (or its session)
    /// wants in the catalog, until the arbiter has it.
    desired: HashMap<InstanceId, (State, Reason)>,
    /// Nodes of this zone the agent's gossip holds down, with the agent
    /// run it saw, and which of those the arbiter answered in this session
    /// (until it has, their endpoints stay ejected here even with a
    /// session up).
    downs: DownVerdicts,
    /// Zone peers gossip has seen alive (this node excluded); `None` while
    /// gossip is off.
    gossip_alive: Option<BTreeSet<NodeId>>,
    /// Policies of the followed services and the other regions' summaries
    /// (R9), as the arbiter last sent them.
    regions: crate::failover::Regions,
}

/// What the shared endpoint view answers for a service.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// Endpoints to use (possibly none).
    Serve(Answer),
    /// The arbiter says the service does not exist.
    Unknown,
    /// The agent cannot know: not cached and the arbiter unreachable, or
    /// not arrived yet.
    CannotKnow(String),
    /// The copy is past its maximum age and the service's policy refuses.
    Refused(String),
}

/// A served lookup.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The service.
    pub service: ServiceKey,
    /// Revision of its last change held.
    pub revision: Revision,
    /// Not confirmed by the arbiter in this session.
    pub stale: bool,
    /// Age of the copy, ms.
    pub age_ms: u64,
    /// The endpoints to use, and how they were chosen.
    pub selection: Selection,
    /// Every record held.
    pub records: Vec<Arc<EndpointRecord>>,
    /// Instances this agent drained or deregistered (shown as DRAINING).
    pub leaving: BTreeSet<InstanceId>,
}

/// The API form of a failover decision.
fn failover_json(decision: Decision) -> FailoverJson {
    match decision {
        Decision::Remote {
            region,
            ingress,
            ready,
        } => FailoverJson {
            detail: format!(
                "no usable endpoint in this region; traffic goes to region {region}'s ingress"
            ),
            region: Some(region),
            ingress: ingress.iter().map(|i| i.to_string()).collect(),
            ready,
            refused: None,
        },
        Decision::Refused(refusal) => FailoverJson {
            region: None,
            ingress: Vec::new(),
            ready: 0,
            refused: Some(refusal.as_str().to_owned()),
            detail: format!(
                "no usable endpoint in this region and no failover: {}",
                refusal.describe()
            ),
        },
    }
}

/// How long a failed connect waits for the catalog to prove the view stale.
const STALE_FAILURE_WINDOW_MS: u64 = 30_000;

/// The agent as the gossip driver's listener.
struct AgentGossip(Agent);

impl GossipListener for AgentGossip {
    fn down(&self, node: NodeId, epoch: AgentEpoch) {
        if node != self.0.inner.node {
            self.0.peer_down(node, epoch);
        }
    }

    fn up(&self, node: NodeId) {
        self.0.peer_up(&node);
    }
}

/// Held by an open registration session; dropping it (the connection
/// closed) marks the instance UNHEALTHY unless it was drained or replaced.
pub struct SessionGuard {
    agent: Agent,
    id: InstanceId,
    generation: Option<Generation>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let still_serving = {
            let state = self.agent.lock();
            state
                .regs
                .get(&self.id)
                .is_some_and(|l| l.intent == Intent::Serve && l.generation == self.generation)
        };
        if still_serving {
            tracing::warn!(instance = %self.id, "registration session closed without a drain: process exited");
            self.agent
                .want(&self.id, State::Unhealthy, "process exited");
        }
    }
}

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
pub enum WriteOutcome<T> {
    /// The arbiter committed it.
    Committed(T),
    /// Accepted locally; sent when the arbiter is back.
    Pending(T),
}

/// A running agent: its tasks and its HTTP address.
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
    ingress: Option<crate::ingress::IngressHandle>,
    dns: DnsHandle,
    tasks: Vec<JoinHandle<()>>,
}

impl AgentHandle {
    /// Stops every task of the agent (the files stay as they are).
    pub async fn shutdown(self) {
        for proxy in self.proxies {
            proxy.shutdown().await;
        }
        if let Some(ingress) = self.ingress {
            ingress.shutdown().await;
        }
        self.dns.shutdown().await;
        if let Some(gossip) = self.gossip {
            gossip.shutdown().await;
        }
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        let link = self.agent.lock().link.take();
        if let Some(link) = link {
            link.close("agent shutting down");
        }
    }
}

impl Agent {
    /// Starts the agent: loads its files, serves the cache at once (stale),
    /// connects to the arbiter (when `arbiters` is set) and serves the local
    /// HTTP API. `tls` is required when `arbiters` is set.
    pub async fn start(
        config: AgentConfig,
        tls: Option<&TlsMaterial>,
    ) -> Result<AgentHandle, AgentError> {
        let node = NodeId::new(&config.node_id).map_err(|e| AgentError::Config(e.to_string()))?;
        let zone = Label::new(&config.zone).map_err(|e| AgentError::Config(e.to_string()))?;
        let data_dir = config.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(io(format!(
            "creating data directory {}",
            data_dir.display()
        )))?;
        let epoch = next_epoch(&data_dir)?;
        let token = rollcall_leases::secret::ensure_token(&data_dir.join("agent.token"))
            .map_err(io("writing agent.token"))?;
        let cache = ServiceCache::open(&data_dir)?;
        let regs = Registrations::open(&data_dir)?;
        let mut sync = Sync::new(ShardId(0));
        let report = cache.load_all();
        for (path, reason) in &report.discarded {
            tracing::warn!(path = %path.display(), reason = %reason, "cache file discarded; the service is fetched again");
        }
        for view in report.views {
            sync.load_cached(view);
        }
        let mut regions = crate::failover::Regions::new();
        match cache.load_regions() {
            Ok(Some((update, received_at_ms))) => {
                regions.update(update, received_at_ms);
            }
            Ok(None) => {}
            Err(reason) => {
                tracing::warn!(reason = %reason, "regions file discarded; policies arrive with the arbiter's next message")
            }
        }
        let mut ignored = Vec::new();
        for service in &config.services {
            let key: ServiceKey = service
                .parse()
                .map_err(|e: rollcall_leases::NameError| AgentError::Config(e.to_string()))?;
            sync.follow(key, &mut ignored);
        }
        let client = match (config.arbiters.is_empty(), tls) {
            (true, _) => None,
            (false, Some(tls)) => Some(ArbiterClient::new(tls)?),
            (false, None) => return Err(AgentError::Config("agent.tls is required when agent.arbiters is set; generate certificates with `rollcall certs`".into())),
        };
        let state = Shared {
            sync,
            regs,
            link: None,
            session: None,
            address: None,
            last_contact_ms: None,
            lease: None,
            shard_revision: Revision(0),
            dirty: BTreeSet::new(),
            forget: BTreeSet::new(),
            memory: HashMap::new(),
            recent_failures: VecDeque::new(),
            reported: crate::sync::SyncStats::default(),
            health: HashMap::new(),
            desired: HashMap::new(),
            downs: DownVerdicts::default(),
            gossip_alive: None,
            regions,
        };
        let agent = Agent {
            inner: Arc::new(Inner {
                active: ActiveConnections::default(),
                prober: Prober::new(config.probes.max_concurrent as usize)
                    .map_err(|e| AgentError::Config(e.to_string()))?,
                metrics: AgentMetrics::new(),
                sessions: std::sync::atomic::AtomicU64::new(0),
                retry_writes: std::sync::atomic::AtomicBool::new(false),
                node,
                zone,
                epoch,
                started_ms: now_ms(),
                token,
                cache,
                regions_saved: Arc::new(Mutex::new(0)),
                state: Mutex::new(state),
                changed: Notify::new(),
                config,
            }),
        };
        {
            // Restored registrations with checks are checked again from now.
            let mut state = agent.lock();
            let serving: Vec<_> = state
                .regs
                .iter()
                .filter(|l| l.intent == Intent::Serve)
                .map(|l| (l.registration.clone(), l.generation))
                .collect();
            for (reg, generation) in serving {
                agent.watch_health(&mut state, &reg, generation);
            }
        }
        let mut tasks = Vec::new();
        if let Some(client) = client {
            tasks.push(tokio::spawn(agent.clone().link_loop(client)));
        }
        tasks.push(tokio::spawn(agent.clone().flush_loop()));
        tasks.push(tokio::spawn(agent.clone().retry_loop()));
        tasks.push(tokio::spawn(agent.clone().health_loop()));
        let listener = tokio::net::TcpListener::bind(agent.inner.config.http_listen)
            .await
            .map_err(io(format!(
                "binding the agent HTTP API on {}",
                agent.inner.config.http_listen
            )))?;
        let http_addr = listener
            .local_addr()
            .map_err(io("reading the HTTP API address"))?;
        let socket = data_dir.join("agent.sock");
        tasks.push(
            crate::api::serve_unix(agent.clone(), &socket)
                .await
                .map_err(io(format!(
                    "binding the agent unix socket {}",
                    socket.display()
                )))?,
        );
        let app = crate::api::router(agent.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "agent HTTP API stopped");
            }
        }));
        let mut proxies = Vec::new();
        for entry in &agent.inner.config.proxy {
            let proxy = crate::proxy::start(agent.clone(), entry, agent.inner.active.clone())
                .await
                .map_err(|e| AgentError::Config(e.to_string()))?;
            tracing::info!(service = %proxy.service, listen = %proxy.local_addr, "proxy listening");
            proxies.push(proxy);
        }
        let config = &agent.inner.config;
        let dns = crate::dns::start(agent.clone(), config.dns_listen, config.dns_ttl_s)
            .await
            .map_err(|e| AgentError::Config(e.to_string()))?;
        let dns_addr = dns.local_addr();
        let ingress = match config.ingress.listen {
            Some(listen) => Some(
                crate::ingress::start(agent.clone(), listen, agent.inner.active.clone())
                    .await
                    .map_err(io(format!(
                        "binding the ingress gateway {listen} (agent.ingress.listen)"
                    )))?,
            ),
            None => None,
        };
        let gossip = agent.start_gossip().await?;
        tracing::info!(node = %agent.inner.node, epoch = %agent.inner.epoch, http = %http_addr, dns = %dns_addr, "agent started");
        Ok(AgentHandle {
            agent,
            http_addr,
            proxies,
            dns_addr,
            ingress_addr: ingress.as_ref().map(|i| i.local_addr),
            ingress,
            gossip,
            dns,
            tasks,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The node token (for operators' calls).
    pub fn token(&self) -> &str {
        &self.inner.token
    }

    /// The check timings a registration's checks default to.
    pub fn checks_defaults(&self) -> rollcall_config::ChecksConfig {
        self.inner.config.checks.clone()
    }

    /// This agent run's epoch.
    pub fn epoch(&self) -> AgentEpoch {
        self.inner.epoch
    }

    // ----- the arbiter link -----

    async fn link_loop(self, client: ArbiterClient) {
        let arbiters = self.inner.config.arbiters.clone();
        let mut backoff = Backoff::new(
            self.inner.config.reconnect_min_ms,
            self.inner.config.reconnect_max_ms,
        );
        // Agents spread over the replicas (any replica serves watches),
        // each starting at a place fixed by its node id, then trying the
        // next after a failure.
        let mut attempt = xxhash_rust::xxh3::xxh3_64(self.inner.node.as_str().as_bytes()) as usize;
        loop {
            let address = &arbiters[attempt % arbiters.len()];
            attempt += 1;
            let started = now_ms();
            match self.session(&client, address).await {
                Ok(()) => {}
                Err(e) => tracing::warn!(arbiter = %address, error = %e, "arbiter session ended"),
            }
            self.on_disconnected();
            let lasted = now_ms().saturating_sub(started);
            let wait = backoff.next_wait(lasted, &mut rand::rng());
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }

    fn on_disconnected(&self) {
        let mut state = self.lock();
        state.link = None;
        state.session = None;
        state.lease = None;
        state.downs.disconnected();
        state.sync.disconnected(now_ms());
    }

    async fn session(&self, client: &ArbiterClient, address: &str) -> Result<(), ClientError> {
        let conn = client.connect(address).await?;
        let hello = SessionUp::Hello {
            node: self.inner.node.clone(),
            epoch: self.inner.epoch,
            zone: self.inner.zone.clone(),
        };
        let (mut writer, mut reader) = conn.open_session(&hello).await?;
        // The reader runs on its own: a frame read must never be cancelled
        // half-way by another event.
        let (down_tx, mut down_rx) = mpsc::unbounded_channel();
        let reader_task = tokio::spawn(async move {
            loop {
                let message = reader.next().await;
                let end = message.is_err();
                if down_tx.send(message).is_err() || end {
                    return;
                }
            }
        });
        let result = self
            .run_session(&conn, address, &mut writer, &mut down_rx)
            .await;
        reader_task.abort();
        conn.close("session over");
        result
    }

    async fn run_session(
        &self,
        conn: &ArbiterConn,
        address: &str,
        writer: &mut rollcall_leases::client::SessionWriter,
        down_rx: &mut mpsc::UnboundedReceiver<Result<SessionDown, ClientError>>,
    ) -> Result<(), ClientError> {
        let ttl_ms = match down_rx.recv().await {
            Some(Ok(SessionDown::Welcome {
                lease,
                ttl_ms,
                revision,
                ..
            })) => {
                let mut state = self.lock();
                state.lease = Some((lease, ttl_ms));
                state.shard_revision = state.shard_revision.max(revision);
                ttl_ms
            }
            Some(Ok(SessionDown::Refused { reason })) => {
                return Err(ClientError::Connection(format!(
                    "arbiter refused the session: {reason}"
                )))
            }
            Some(Ok(other)) => {
                return Err(ClientError::Connection(format!(
                    "expected Welcome, got {other:?}"
                )))
            }
            Some(Err(e)) => return Err(e),
            None => {
                return Err(ClientError::Connection(
                    "session closed before Welcome".into(),
                ))
            }
        };
        let (up_tx, mut up_rx) = mpsc::unbounded_channel();
        let mut outs = Vec::new();
        {
            let mut state = self.lock();
            state.link = Some(conn.clone());
            state.session = Some(up_tx);
            state.address = Some(address.to_owned());
            state.last_contact_ms = Some(now_ms());
            state.sync.connected(&mut outs);
        }
        tracing::info!(arbiter = %address, epoch = %self.inner.epoch, "arbiter session up");
        if self
            .inner
            .sessions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            > 0
        {
            self.inner.metrics.reconnects.inc();
        }
        self.carry_out(outs, writer).await?;
        tokio::spawn(self.clone().reconcile(conn.clone()));
        let mut keepalive =
            tokio::time::interval(Duration::from_millis(self.inner.config.keepalive_ms));
        let renew_every = |ttl: u64| Duration::from_millis(renew_after_ms(ttl, &mut rand::rng()));
        let mut next_renew = tokio::time::Instant::now() + renew_every(ttl_ms);
        loop {
            tokio::select! {
                Some(msg) = up_rx.recv() => writer.send(&msg).await?,
                _ = keepalive.tick() => writer.send(&SessionUp::Keepalive).await?,
                _ = tokio::time::sleep_until(next_renew) => {
                    writer.send(&SessionUp::Renew).await?;
                    next_renew = tokio::time::Instant::now() + renew_every(ttl_ms);
                }
                down = down_rx.recv() => match down {
                    Some(Ok(SessionDown::Update(items))) => {
                        let outs = self.apply_updates(items);
                        self.carry_out(outs, writer).await?;
                    }
                    Some(Ok(SessionDown::Refused { reason })) => return Err(ClientError::Connection(format!("arbiter refused the session: {reason}"))),
                    Some(Ok(SessionDown::Welcome { .. })) => {}
                    Some(Ok(SessionDown::Regions(update))) => {
                        let now = now_ms();
                        let mut state = self.lock();
                        state.last_contact_ms = Some(now);
                        if state.regions.update(update.clone(), now) {
                            drop(state);
                            let cache = self.inner.cache.clone();
                            let saved = self.inner.regions_saved.clone();
                            // Off the session task: an fsync may take a while.
                            // Writes are serialized; an older one never lands
                            // after a newer.
                            tokio::task::spawn_blocking(move || {
                                let mut last = saved.lock().unwrap_or_else(|p| p.into_inner());
                                if *last > now {
                                    return;
                                }
                                *last = now;
                                if let Err(e) = cache.store_regions(&update, now) {
                                    tracing::warn!(error = %e, "saving the regions message failed; a restart waits for the arbiter's");
                                }
                            });
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None => return Err(ClientError::Connection("session closed".into())),
                }
            }
        }
    }

    fn apply_updates(&self, items: Vec<rollcall_leases::protocol::ServiceUpdate>) -> Vec<SyncOut> {
        let now = now_ms();
        let mut outs = Vec::new();
        {
            let mut state = self.lock();
            state.last_contact_ms = Some(now);
            for item in items {
                if let rollcall_leases::protocol::ServiceUpdate::Deltas(ds) = &item {
                    if let Some(last) = ds.last() {
                        state.shard_revision = state.shard_revision.max(last.revision);
                    }
                }
                state.sync.update(item, now, &mut outs);
            }
            self.report_sync(&mut state, now);
            for out in &outs {
                match out {
                    SyncOut::Persist(s) => {
                        state.forget.remove(s);
                        state.dirty.insert(s.clone());
                    }
                    SyncOut::Forget(s) => {
                        state.dirty.remove(s);
                        state.forget.insert(s.clone());
                    }
                    _ => {}
                }
            }
        }
        self.inner.changed.notify_waiters();
        outs
    }

    /// Moves new sync counters into metrics, and counts failed connects
    /// to endpoints the catalog has since taken out of READY.
    fn report_sync(&self, state: &mut Shared, now: u64) {
        let m = &self.inner.metrics;
        let stats = state.sync.stats().clone();
        m.revision_gaps.inc_by(stats.gaps - state.reported.gaps);
        m.digest_mismatches
            .inc_by(stats.digest_mismatches - state.reported.digest_mismatches);
        m.snapshots_applied
            .inc_by(stats.snapshots_applied - state.reported.snapshots_applied);
        state.reported = stats;
        while state
            .recent_failures
            .front()
            .is_some_and(|(_, t)| now.saturating_sub(*t) > STALE_FAILURE_WINDOW_MS)
        {
            state.recent_failures.pop_front();
        }
        let sync = &state.sync;
        let gone = |id: &InstanceId| {
            !sync.iter().any(|(_, t)| {
                t.view
                    .as_ref()
                    .is_some_and(|v| v.ready().any(|r| &r.instance_id == id))
            })
        };
        let before = state.recent_failures.len();
        state.recent_failures.retain(|(id, _)| !gone(id));
        m.connect_failures_to_stale
            .inc_by((before - state.recent_failures.len()) as u64);
    }

    async fn carry_out(
        &self,
        outs: Vec<SyncOut>,
        writer: &mut rollcall_leases::client::SessionWriter,
    ) -> Result<(), ClientError> {
        for out in outs {
            match out {
                SyncOut::Subscribe { service, have } => {
                    writer
                        .send(&SessionUp::Subscribe {
                            shard: shard_of(&service, SHARDS),
                            service,
                            have,
                        })
                        .await?
                }
                SyncOut::Ack { service, revision } => {
                    writer.send(&SessionUp::Ack { service, revision }).await?
                }
                SyncOut::RetryLater { service, base_ms } => {
                    let agent = self.clone();
                    tokio::spawn(async move {
                        let wait = base_ms + rand::random_range(0..=base_ms);
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                        let mut outs = Vec::new();
                        let state = &mut *agent.lock();
                        state.sync.retry(&service, &mut outs);
                        agent.send_session(state, outs);
                    });
                }
                SyncOut::Persist(_) | SyncOut::Forget(_) => {}
            }
        }
        Ok(())
    }

    /// Sends subscribe/ack outputs through the session channel (from code
    /// that does not own the session writer).
    fn send_session(&self, state: &Shared, outs: Vec<SyncOut>) {
        let Some(session) = &state.session else {
            return;
        };
        for out in outs {
            let msg = match out {
                SyncOut::Subscribe { service, have } => SessionUp::Subscribe {
                    shard: shard_of(&service, SHARDS),
                    service,
                    have,
                },
                SyncOut::Ack { service, revision } => SessionUp::Ack { service, revision },
                _ => continue,
            };
            let _ = session.send(msg);
        }
    }

    /// Writes changed views to the disk cache (debounced, off the hot path).
    async fn flush_loop(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let (views, forget) = {
                let mut state = self.lock();
                let dirty = std::mem::take(&mut state.dirty);
                let forget = std::mem::take(&mut state.forget);
                let views: Vec<_> = dirty
                    .iter()
                    .filter_map(|s| state.sync.get(s).and_then(|t| t.view.clone()))
                    .collect();
                (views, forget)
            };
            if views.is_empty() && forget.is_empty() {
                continue;
            }
            let agent = self.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for view in &views {
                    if let Err(e) = agent.inner.cache.store(view) {
                        tracing::warn!(service = %view.service(), error = %e, "cache write failed");
                    }
                }
                for service in &forget {
                    if let Err(e) = agent.inner.cache.remove(service) {
                        tracing::warn!(service = %service, error = %e, "cache removal failed");
                    }
                }
            })
            .await;
        }
    }

    /// Sends one request. A refusal as unavailable (the region's arbiter
    /// group has no quorum, or is electing) counts as not sent: the write
    /// stays pending and is retried (`retry_loop`).
    async fn ask(&self, conn: &ArbiterConn, request: &Request) -> Result<Response, ClientError> {
        match conn.request(request).await? {
            Response::Rejected {
                kind: RejectKind::Unavailable,
                message,
            } => {
                self.inner
                    .retry_writes
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Err(ClientError::Connection(format!(
                    "arbiter unavailable: {message}"
                )))
            }
            other => Ok(other),
        }
    }

    /// Re-sends pending writes every 500 ms after one was refused
    /// as unavailable, while the session stays up.
    async fn retry_loop(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(conn) = self.link() else { continue };
            if self
                .inner
                .retry_writes
                .swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::info!("retrying writes the arbiter refused as unavailable");
                self.clone().reconcile(conn).await;
            }
        }
    }

    // ----- reconciliation (R7) -----

    /// After a (re)connect: replays what is pending and reconciles the local
    /// registrations with the catalog's records on this node.
    async fn reconcile(self, conn: ArbiterConn) {
        let listed = match self.ask(&conn, &Request::NodeInstances).await {
            Ok(Response::Instances(list)) => list,
            Ok(other) => {
                tracing::warn!(answer = ?other, "unexpected answer to NodeInstances; reconciliation skipped");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reconciliation interrupted");
                return;
            }
        };
        let locals: Vec<LocalInstance> = self.lock().regs.iter().cloned().collect();
        for local in &locals {
            let id = &local.registration.instance_id;
            let in_catalog = listed
                .iter()
                .find(|l| &l.instance_id == id && l.state != State::Expired);
            let result = match (local.generation, in_catalog) {
                (Some(g), Some(c)) if c.generation == g => {
                    if !local.committed {
                        self.push_intent(&conn, id).await
                    } else if local.intent == Intent::Serve
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
                        );
                        Ok(())
                    } else {
                        Ok(())
                    }
                }
                (Some(g), Some(c)) => {
                    tracing::warn!(instance = %id, local = %g, catalog = %c.generation, "the catalog holds a newer registration of this instance; dropping the local one");
                    self.forget_local(id);
                    Ok(())
                }
                (Some(_), None) if local.intent != Intent::Serve => {
                    self.forget_local(id);
                    Ok(())
                }
                _ => self.register_local(&conn, id).await,
            };
            if let Err(e) = result {
                tracing::warn!(instance = %id, error = %e, "reconciliation interrupted");
                return;
            }
        }
        // Health verdicts reached while the arbiter was away.
        let pending: Vec<InstanceId> = {
            let mut state = self.lock();
            let state = &mut *state;
            for (id, (_, health)) in &state.health {
                let current = listed
                    .iter()
                    .find(|l| &l.instance_id == id)
                    .map(|l| l.state);
                let wanted = health.state();
                if resend_health(wanted, current, state.desired.contains_key(id)) {
                    let reason = Reason::new(
                        &health
                            .reason()
                            .unwrap_or("health check verdict")
                            .chars()
                            .take(256)
                            .collect::<String>(),
                    )
                    .unwrap_or_else(|_| {
                        Reason::new("health check verdict").expect("a valid constant")
                    });
                    state.desired.insert(id.clone(), (wanted, reason));
                }
            }
            state.desired.keys().cloned().collect()
        };
        for id in pending {
            if let Err(e) = self.push_desired(&conn, &id).await {
                tracing::warn!(error = %e, "reconciliation interrupted");
                return;
            }
        }
        // Down verdicts reached while the arbiter was away (the arbiter
        // still checks its own silence).
        let downs = self.lock().downs.to_report();
        for (node, epoch) in downs {
            self.report_down(node, epoch).await;
        }
        // Records an agent wrote on this node that this agent does not know
        // (it lost its disk): they run nowhere any more.
        let known: BTreeSet<InstanceId> = self
            .lock()
            .regs
            .iter()
            .map(|l| l.registration.instance_id.clone())
            .collect();
        for stale in listed.iter().filter(|l| {
            l.origin == Role::Agent && l.state != State::Expired && !known.contains(&l.instance_id)
        }) {
            tracing::warn!(instance = %stale.instance_id, "deregistering a record this agent has no local registration of");
            let request = Request::Deregister {
                instance_id: stale.instance_id.clone(),
                generation: stale.generation,
            };
            if let Err(e) = self.ask(&conn, &request).await {
                tracing::warn!(error = %e, "reconciliation interrupted");
                return;
            }
        }
    }

    fn forget_local(&self, id: &InstanceId) {
        let mut state = self.lock();
        state.regs.remove(id);
        if let Err(e) = state.regs.save() {
            tracing::error!(error = %e, "saving registrations failed");
        }
    }

    /// Registers a local instance (pending, or gone from the catalog), then
    /// carries out its intent.
    async fn register_local(&self, conn: &ArbiterConn, id: &InstanceId) -> Result<(), ClientError> {
        let Some(local) = self.lock().regs.get(id).cloned() else {
            return Ok(());
        };
        match self
            .ask(
                conn,
                &Request::Register(self.registration(&local.registration)),
            )
            .await?
        {
            Response::Committed {
                generation: Some(g),
                ..
            } => {
                let mut state = self.lock();
                if let Some(l) = state.regs.get_mut(id) {
                    l.generation = Some(g);
                    l.committed = l.intent == Intent::Serve;
                }
                if let Some((tag, _)) = state.health.get_mut(id) {
                    *tag = Some(g);
                }
                self.save(&state);
            }
            Response::Rejected { message, .. } => {
                tracing::error!(instance = %id, reason = %message, "the arbiter refused a pending registration; dropping it");
                drop(self.lock());
                self.forget_local(id);
                return Ok(());
            }
            other => tracing::warn!(answer = ?other, "unexpected answer to a registration"),
        }
        self.push_intent(conn, id).await
    }

    /// Sends the drain or deregistration a local instance still wants.
    async fn push_intent(&self, conn: &ArbiterConn, id: &InstanceId) -> Result<(), ClientError> {
        let Some(local) = self.lock().regs.get(id).cloned() else {
            return Ok(());
        };
        let Some(generation) = local.generation else {
            return Ok(());
        };
        let request = match local.intent {
            Intent::Serve => return Ok(()),
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
        let response = self.ask(conn, &request).await?;
        let mut state = self.lock();
        match (&response, local.intent) {
            (Response::Committed { .. }, Intent::Leave)
            | (
                Response::Rejected {
                    kind: RejectKind::NotFound | RejectKind::StaleGeneration,
                    ..
                },
                _,
            ) => {
                state.regs.remove(id);
            }
            (Response::Committed { .. }, intent) => {
                if let Some(l) = state.regs.get_mut(id) {
                    l.committed = true;
                }
                if intent == Intent::Drain {
                    tokio::spawn(self.clone().finish_drain(id.clone(), generation));
                }
            }
            (other, _) => {
                tracing::warn!(instance = %id, answer = ?other, "a pending write was refused")
            }
        }
        self.save(&state);
        Ok(())
    }

    fn save(&self, state: &Shared) {
        if let Err(e) = state.regs.save() {
            tracing::error!(error = %e, "saving registrations failed");
        }
    }

    fn registration(&self, r: &ValidRegistration) -> Registration {
        Registration {
            instance_id: r.instance_id.clone(),
            service: r.service.clone(),
            node: self.inner.node.clone(),
            epoch: self.inner.epoch,
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

    // ----- health (R4) -----

    /// Starts checking a local instance's health (a registration with
    /// checks, at registration or at agent start). Replaces any earlier
    /// checker of the same instance, so results of an old generation's
    /// probes are never counted against the new one.
    fn watch_health(
        &self,
        state: &mut Shared,
        reg: &ValidRegistration,
        generation: Option<Generation>,
    ) {
        let Some(checks) = reg.checks.as_ref() else {
            state.health.remove(&reg.instance_id);
            return;
        };
        let target = SocketAddr::new(reg.address, reg.port);
        let health = InstanceHealth::new(Some(checks), target, now_ms(), &mut rand::rng());
        state
            .health
            .insert(reg.instance_id.clone(), (generation, health));
    }

    /// Runs due probes and turns health changes into catalog transitions.
    async fn health_loop(self) {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            let now = now_ms();
            let mut probes: Vec<(InstanceId, Option<Generation>, ProbeTask)> = Vec::new();
            let mut events: Vec<(InstanceId, HealthEvent)> = Vec::new();
            {
                let mut state = self.lock();
                let mut rng = rand::rng();
                for (id, (generation, health)) in state.health.iter_mut() {
                    if health.next_due_ms().is_none_or(|t| t > now) {
                        continue;
                    }
                    let due = health.due(now, &mut rng);
                    probes.extend(due.probes.into_iter().map(|p| (id.clone(), *generation, p)));
                    events.extend(due.events.into_iter().map(|e| (id.clone(), e)));
                }
            }
            for (id, event) in events {
                self.on_health_event(&id, event);
            }
            for (id, generation, task) in probes {
                let agent = self.clone();
                tokio::spawn(async move {
                    let outcome = agent
                        .inner
                        .prober
                        .run(task.target, &task.kind, task.timeout_ms)
                        .await;
                    agent
                        .inner
                        .metrics
                        .probe_latency
                        .observe(outcome.latency_ms / 1000.0);
                    agent
                        .inner
                        .metrics
                        .probe_queue_wait
                        .observe(outcome.waited_ms / 1000.0);
                    let events = {
                        let mut state = agent.lock();
                        match state.health.get_mut(&id) {
                            // A result for a checker replaced since is dropped.
                            Some((g, health)) if *g == generation => health.result(
                                task.which,
                                outcome.passed,
                                &outcome.detail,
                                now_ms(),
                                &mut rand::rng(),
                            ),
                            _ => Vec::new(),
                        }
                    };
                    for event in events {
                        agent.on_health_event(&id, event);
                    }
                });
            }
        }
    }

    fn on_health_event(&self, id: &InstanceId, event: HealthEvent) {
        let (state, reason) = match event {
            HealthEvent::Ready => (State::Ready, format!("{} passed", Which::Readiness)),
            HealthEvent::Unhealthy { reason } => (State::Unhealthy, reason),
            HealthEvent::StartupFailing { reason } => {
                tracing::warn!(instance = %id, reason = %reason, "startup check failing");
                return;
            }
            HealthEvent::Liveness(liveness) => {
                tracing::info!(instance = %id, liveness = liveness.as_str(), "liveness changed");
                let gauge =
                    self.inner
                        .metrics
                        .liveness
                        .get_or_create(&crate::metrics::InstanceLabel {
                            instance: id.to_string(),
                        });
                gauge.set(i64::from(liveness == rollcall_leases::Liveness::Passing));
                let this = self.clone();
                let id = id.clone();
                tokio::spawn(async move { this.push_liveness(&id, liveness).await });
                return;
            }
        };
        tracing::info!(instance = %id, state = state.as_str(), reason = %reason, "health changed");
        self.inner.metrics.health_flaps.inc();
        self.want(id, state, &reason);
    }

    /// Records the state a local instance should have in the catalog and
    /// sends it when connected; `reconcile` sends what is left after an
    /// outage.
    fn want(&self, id: &InstanceId, state: State, reason: &str) {
        let reason = Reason::new(&reason.chars().take(256).collect::<String>())
            .unwrap_or_else(|_| Reason::new("health check changed").expect("a valid constant"));
        self.lock().desired.insert(id.clone(), (state, reason));
        let this = self.clone();
        let id = id.clone();
        tokio::spawn(async move {
            if let Some(conn) = this.link() {
                if let Err(e) = this.push_desired(&conn, &id).await {
                    tracing::warn!(instance = %id, error = %e, "health change kept until the arbiter is back");
                }
            }
        });
    }

    /// Sends a local instance's desired state, if any, to the arbiter.
    async fn push_desired(&self, conn: &ArbiterConn, id: &InstanceId) -> Result<(), ClientError> {
        let (want, generation) = {
            let state = self.lock();
            let Some(want) = state.desired.get(id).cloned() else {
                return Ok(());
            };
            let Some(local) = state.regs.get(id) else {
                return Ok(());
            };
            if local.intent != Intent::Serve {
                return Ok(());
            }
            let Some(generation) = local.generation else {
                return Ok(());
            };
            (want, generation)
        };
        let request = Request::Transition {
            instance_id: id.clone(),
            generation,
            to: want.0,
            reason: want.1.clone(),
        };
        match self.ask(conn, &request).await? {
            Response::Committed { .. } => {
                let mut state = self.lock();
                if state.desired.get(id) == Some(&want) {
                    state.desired.remove(id);
                }
            }
            Response::Rejected { kind, message } => {
                tracing::warn!(instance = %id, ?kind, reason = %message, "the arbiter refused a health transition");
                self.lock().desired.remove(id);
            }
            other => tracing::warn!(answer = ?other, "unexpected answer to a transition"),
        }
        Ok(())
    }

    async fn push_liveness(&self, id: &InstanceId, liveness: rollcall_leases::Liveness) {
        let generation = self.lock().regs.get(id).and_then(|l| l.generation);
        let (Some(generation), Some(conn)) = (generation, self.link()) else {
            return;
        };
        let request = Request::SetLiveness {
            instance_id: id.clone(),
            generation,
            liveness,
        };
        if let Err(e) = self.ask(&conn, &request).await {
            tracing::warn!(instance = %id, error = %e, "liveness not sent");
        }
    }

    // ----- gossip (R4, R7) -----

    /// Joins the zone's gossip when a zone key is configured.
    async fn start_gossip(&self) -> Result<Option<GossipHandle>, AgentError> {
        let config = &self.inner.config.gossip;
        let Some(key_file) = &config.key_file else {
            return Ok(None);
        };
        let key = ZoneKey::load(key_file).map_err(|e| AgentError::Config(e.to_string()))?;
        let previous_key = config
            .previous_key_file
            .as_deref()
            .map(ZoneKey::load)
            .transpose()
            .map_err(|e| AgentError::Config(e.to_string()))?;
        let mut seeds = Vec::new();
        for seed in &config.seeds {
            match tokio::net::lookup_host(seed).await {
                Ok(mut addrs) => seeds.extend(addrs.next()),
                Err(e) => {
                    tracing::warn!(seed = %seed, error = %e, "gossip seed does not resolve; skipped")
                }
            }
        }
        let options = GossipOptions {
            node: self.inner.node.clone(),
            epoch: self.inner.epoch,
            listen: config.listen,
            seeds,
            settings: config.effective(),
            key,
            previous_key,
        };
        let handle = rollcall_gossip::driver::start(options, AgentGossip(self.clone()))
            .await
            .map_err(io(format!("binding the gossip socket {}", config.listen)))?;
        self.lock().gossip_alive.get_or_insert_with(BTreeSet::new);
        tracing::info!(gossip = %handle.local_addr, preset = config.preset.name(), "gossip member started");
        Ok(Some(handle))
    }

    /// The zone's gossip declared a peer down: report it to the arbiter
    /// (which acts only when its own session with that node is silent
    /// too), and, while the arbiter is unreachable, stop using that node's
    /// endpoints here.
    pub fn peer_down(&self, node: NodeId, epoch: AgentEpoch) {
        tracing::warn!(node = %node, epoch = %epoch, "gossip: peer down");
        {
            let mut state = self.lock();
            state.downs.down(node.clone(), epoch);
            if let Some(alive) = state.gossip_alive.as_mut() {
                alive.remove(&node);
            }
        }
        let this = self.clone();
        tokio::spawn(async move { this.report_down(node, epoch).await });
    }

    /// The zone's gossip sees a peer (again).
    pub fn peer_up(&self, node: &NodeId) {
        let mut state = self.lock();
        state
            .gossip_alive
            .get_or_insert_with(BTreeSet::new)
            .insert(node.clone());
        if state.downs.up(node) {
            tracing::info!(node = %node, "gossip: peer up again");
            // The path to the node is back: the connect failures that
            // ejected its endpoints here were the partition's, so those
            // ejections (and their growing durations) are lifted at once
            // instead of outlasting the partition. Failing endpoints are
            // ejected again after `consecutive_failures`.
            let lifted: Vec<(ServiceKey, Vec<InstanceId>)> = state
                .sync
                .iter()
                .filter_map(|(service, t)| {
                    let view = t.view.as_ref()?;
                    let ids = view
                        .records()
                        .filter(|r| r.node_id == *node)
                        .map(|r| r.instance_id.clone())
                        .collect();
                    Some((service.clone(), ids))
                })
                .collect();
            for (service, ids) in lifted {
                if let Some(memory) = state.memory.get_mut(&service) {
                    memory.lift(&ids);
                }
            }
        }
    }

    async fn report_down(&self, node: NodeId, epoch: AgentEpoch) {
        let Some(conn) = self.link() else { return };
        match self
            .ask(
                &conn,
                &Request::ReportDown {
                    node: node.clone(),
                    epoch,
                },
            )
            .await
        {
            Ok(Response::Committed { .. }) => {
                tracing::info!(node = %node, "down verdict committed");
                self.lock().downs.settled(node);
            }
            Ok(Response::Rejected { message, .. }) => {
                tracing::info!(node = %node, reason = %message, "down report not acted on");
                self.lock().downs.settled(node);
            }
            Ok(other) => tracing::warn!(answer = ?other, "unexpected answer to a down report"),
            Err(e) => tracing::warn!(node = %node, error = %e, "down report not sent"),
        }
    }

    /// `POST /v1/agent/instances/{id}/session`: the returned guard, held by
    /// the streaming answer, marks the instance UNHEALTHY ("process
    /// exited") when the connection closes without a drain.
    pub fn open_session(
        &self,
        id: &InstanceId,
        generation: Option<u64>,
        caller: &Caller,
    ) -> Result<SessionGuard, ApiError> {
        let generation = self.authorize_instance(caller, id, generation)?;
        if self.lock().regs.get(id).is_none() {
            return Err(ApiError::not_found(format!(
                "instance {id} is not registered on this agent"
            )));
        }
        Ok(SessionGuard {
            agent: self.clone(),
            id: id.clone(),
            generation,
        })
    }

    // ----- the local API's operations -----

    /// Who is calling (R10): an operator holding the node token (sent as
    /// `Authorization: Bearer <token>`), or, on the unix socket, a workload
    /// identified by its peer credentials.
    pub fn caller(
        &self,
        header: Option<&str>,
        peer: Option<(u32, u32)>,
    ) -> Result<Caller, ApiError> {
        match (header.and_then(|h| h.strip_prefix("Bearer ")), peer) {
            (Some(t), _) if t.trim() == self.inner.token => Ok(Caller::Operator),
            (Some(_), _) => Err(ApiError::unauthorized("the bearer token does not match agent.token in the agent's data directory")),
            (None, Some((uid, gid))) => Ok(Caller::Workload { uid, gid }),
            (None, None) => Err(ApiError::unauthorized(
                "writes need the node token (agent.token in the agent's data directory) as Authorization: Bearer <token>, or a workload identity on the agent's unix socket",
            )),
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
            .inner
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
        let state = self.lock();
        if let Some(local) = state.regs.get(id) {
            return Some(local.registration.service.clone());
        }
        let found = state
            .sync
            .iter()
            .find(|(_, t)| {
                t.view
                    .as_ref()
                    .is_some_and(|v| v.records().any(|r| &r.instance_id == id))
            })
            .map(|(k, _)| k.clone());
        found
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

    fn link(&self) -> Option<ArbiterConn> {
        self.lock().link.clone()
    }

    /// `PUT /v1/agent/instances`.
    pub async fn register(
        &self,
        reg: ValidRegistration,
        caller: &Caller,
    ) -> Result<WriteOutcome<RegisterResponse>, ApiError> {
        self.authorize(caller, &reg.service)?;
        let id = reg.instance_id.clone();
        if let Some(conn) = self.link() {
            match self
                .ask(&conn, &Request::Register(self.registration(&reg)))
                .await
            {
                Ok(Response::Committed {
                    generation: Some(g),
                    state,
                    ..
                }) => {
                    let mut st = self.lock();
                    self.watch_health(&mut st, &reg, Some(g));
                    st.desired.remove(&reg.instance_id);
                    st.regs.put(LocalInstance {
                        registration: reg,
                        generation: Some(g),
                        intent: Intent::Serve,
                        committed: true,
                    });
                    self.save_or_err(&st)?;
                    let state = state.map_or("READY", |s| s.as_str()).to_owned();
                    return Ok(WriteOutcome::Committed(RegisterResponse {
                        instance_id: id,
                        generation: Some(g.get()),
                        state,
                        pending: false,
                    }));
                }
                Ok(Response::Rejected { kind, message }) => return Err(api_error(kind, message)),
                Ok(other) => {
                    return Err(ApiError::unavailable(format!(
                        "unexpected answer from the arbiter: {other:?}"
                    )))
                }
                Err(e) => tracing::warn!(error = %e, "registration not sent; kept pending"),
            }
        }
        let mut st = self.lock();
        self.watch_health(&mut st, &reg, None);
        st.desired.remove(&reg.instance_id);
        st.regs.put(LocalInstance {
            registration: reg,
            generation: None,
            intent: Intent::Serve,
            committed: false,
        });
        self.save_or_err(&st)?;
        Ok(WriteOutcome::Pending(RegisterResponse {
            instance_id: id,
            generation: None,
            state: "PENDING".into(),
            pending: true,
        }))
    }

    fn save_or_err(&self, state: &Shared) -> Result<(), ApiError> {
        state
            .regs
            .save()
            .map_err(|e| ApiError::unavailable(format!("saving the registration failed: {e}")))
    }

    /// Resolves the generation a call names against the local registration
    /// (409 when it is not the current one) or, for instances this agent did
    /// not register, against its views.
    fn generation_for(
        &self,
        id: &InstanceId,
        given: Option<u64>,
    ) -> Result<Option<Generation>, ApiError> {
        let state = self.lock();
        let current = match state.regs.get(id) {
            Some(local) => local.generation,
            None => state.sync.iter().find_map(|(_, t)| {
                t.view
                    .as_ref()?
                    .records()
                    .find(|r| &r.instance_id == id)
                    .map(|r| r.generation)
            }),
        };
        let known = state.regs.get(id).is_some() || current.is_some();
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

    /// `PUT /v1/agent/instances/{id}/heartbeat`.
    pub fn heartbeat(
        &self,
        id: &InstanceId,
        generation: Option<u64>,
        caller: &Caller,
    ) -> Result<serde_json::Value, ApiError> {
        self.authorize_instance(caller, id, generation)?;
        let mut state = self.lock();
        if let Some((_, health)) = state.health.get_mut(id) {
            health.heartbeat(now_ms());
        }
        let Some(local) = state.regs.get(id) else {
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

    /// `PUT /v1/agent/instances/{id}/drain`: effective in this agent's own
    /// views at once, committed when the arbiter answers.
    pub async fn drain(
        &self,
        id: &InstanceId,
        generation: Option<u64>,
        propagated: bool,
        caller: &Caller,
    ) -> Result<WriteOutcome<DrainResponse>, ApiError> {
        let generation = self.authorize_instance(caller, id, generation)?;
        self.set_intent(id, Intent::Drain)?;
        let (Some(generation), Some(conn)) = (generation, self.link()) else {
            return Ok(WriteOutcome::Pending(DrainResponse {
                revision: None,
                pending: true,
                propagated: None,
            }));
        };
        let request = Request::Transition {
            instance_id: id.clone(),
            generation,
            to: State::Draining,
            reason: drain_reason(),
        };
        match self.ask(&conn, &request).await {
            Ok(Response::Committed { revision, .. }) => {
                self.mark_committed(id);
                tokio::spawn(self.clone().finish_drain(id.clone(), generation));
                let revision = revision.or_else(|| {
                    self.lock().sync.iter().find_map(|(_, t)| {
                        t.view
                            .as_ref()?
                            .records()
                            .find(|r| &r.instance_id == id)
                            .map(|r| r.revision)
                    })
                });
                let propagated = match (propagated, revision) {
                    (true, Some(rev)) => Some(self.await_propagation(&conn, id, rev).await?),
                    _ => None,
                };
                Ok(WriteOutcome::Committed(DrainResponse {
                    revision: revision.map(|r| r.get()),
                    pending: false,
                    propagated,
                }))
            }
            Ok(Response::Rejected { kind, message }) => {
                self.undo_intent(id);
                Err(api_error(kind, message))
            }
            Ok(other) => Err(ApiError::unavailable(format!(
                "unexpected answer from the arbiter: {other:?}"
            ))),
            Err(e) => {
                tracing::warn!(error = %e, "drain not sent; kept pending");
                Ok(WriteOutcome::Pending(DrainResponse {
                    revision: None,
                    pending: true,
                    propagated: None,
                }))
            }
        }
    }

    async fn await_propagation(
        &self,
        conn: &ArbiterConn,
        id: &InstanceId,
        revision: Revision,
    ) -> Result<Propagated, ApiError> {
        let service = self
            .lock()
            .regs
            .get(id)
            .map(|l| l.registration.service.clone());
        let service = match service {
            Some(s) => s,
            None => self
                .lock()
                .sync
                .iter()
                .find(|(_, t)| {
                    t.view
                        .as_ref()
                        .is_some_and(|v| v.records().any(|r| &r.instance_id == id))
                })
                .map(|(k, _)| k.clone())
                .ok_or_else(|| {
                    ApiError::not_found(format!("the service of instance {id} is not known here"))
                })?,
        };
        let request = Request::AwaitPropagation {
            service,
            revision,
            timeout_ms: self.inner.config.propagation_timeout_ms,
        };
        match self.ask(conn, &request).await {
            Ok(Response::Propagated { acked, total }) => Ok(Propagated {
                acked,
                total,
                complete: acked >= total,
            }),
            Ok(other) => Err(ApiError::unavailable(format!(
                "unexpected answer from the arbiter: {other:?}"
            ))),
            Err(e) => Err(ApiError::unavailable(format!(
                "the drain committed but waiting for propagation failed: {e}"
            ))),
        }
    }

    /// The drain sequence after its commit: the instance's open
    /// connections may finish for `max_drain_ms`, then it is deregistered
    /// (unless it was re-registered or deregistered meanwhile). The whole
    /// window is always given: this agent sees only its own proxies'
    /// connections, not those of callers on other nodes.
    async fn finish_drain(self, id: InstanceId, generation: Generation) {
        tokio::time::sleep(Duration::from_millis(self.inner.config.drain.max_drain_ms)).await;
        let still_draining = self
            .lock()
            .regs
            .get(&id)
            .is_some_and(|l| l.intent == Intent::Drain && l.generation == Some(generation));
        if !still_draining {
            return;
        }
        let open = self.inner.active.count(&id);
        tracing::info!(instance = %id, open_local_connections = open, "drain window over; deregistering");
        if let Err(e) = self
            .deregister(&id, Some(generation.get()), &Caller::Operator)
            .await
        {
            tracing::warn!(instance = %id, error = ?e, "deregistration after the drain failed");
        }
    }

    /// The open proxied connections per instance (the drain sequence waits
    /// for them).
    pub fn active_connections(&self) -> &ActiveConnections {
        &self.inner.active
    }

    /// `DELETE /v1/agent/instances/{id}`.
    pub async fn deregister(
        &self,
        id: &InstanceId,
        generation: Option<u64>,
        caller: &Caller,
    ) -> Result<WriteOutcome<serde_json::Value>, ApiError> {
        let generation = self.authorize_instance(caller, id, generation)?;
        self.set_intent(id, Intent::Leave)?;
        let (Some(generation), Some(conn)) = (generation, self.link()) else {
            return Ok(WriteOutcome::Pending(
                serde_json::json!({"revision": null, "pending": true}),
            ));
        };
        match self
            .ask(
                &conn,
                &Request::Deregister {
                    instance_id: id.clone(),
                    generation,
                },
            )
            .await
        {
            Ok(Response::Committed { revision, .. }) => {
                self.forget_local(id);
                Ok(WriteOutcome::Committed(
                    serde_json::json!({"revision": revision.map(|r| r.get()), "pending": false}),
                ))
            }
            Ok(Response::Rejected { kind, message }) => {
                self.undo_intent(id);
                Err(api_error(kind, message))
            }
            Ok(other) => Err(ApiError::unavailable(format!(
                "unexpected answer from the arbiter: {other:?}"
            ))),
            Err(e) => {
                tracing::warn!(error = %e, "deregistration not sent; kept pending");
                Ok(WriteOutcome::Pending(
                    serde_json::json!({"revision": null, "pending": true}),
                ))
            }
        }
    }

    fn set_intent(&self, id: &InstanceId, intent: Intent) -> Result<(), ApiError> {
        let mut state = self.lock();
        if intent != Intent::Serve {
            // A leaving instance's probes no longer move it (DRAINING is one-way).
            state.health.remove(id);
            state.desired.remove(id);
        }
        if let Some(local) = state.regs.get_mut(id) {
            local.intent = intent;
            local.committed = false;
            self.save_or_err(&state)?;
        }
        Ok(())
    }

    fn undo_intent(&self, id: &InstanceId) {
        let mut state = self.lock();
        if let Some(local) = state.regs.get_mut(id) {
            local.intent = Intent::Serve;
            local.committed = true;
        }
        self.save(&state);
    }

    fn mark_committed(&self, id: &InstanceId) {
        let mut state = self.lock();
        if let Some(local) = state.regs.get_mut(id) {
            local.committed = true;
        }
        self.save(&state);
    }

    /// The shared endpoint view of a service (proxy, DNS and the resolve
    /// API all use it). A service not followed yet is followed from now on;
    /// this call does not wait for it.
    pub fn lookup(&self, key: &ServiceKey) -> Lookup {
        let now = now_ms();
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.sync.get(key).is_none() {
            let mut outs = Vec::new();
            state.sync.follow(key.clone(), &mut outs);
            self.send_session(state, outs);
        }
        let t = state.sync.get(key).expect("followed above");
        let Some(view) = t.view.as_ref().filter(|v| v.exists()) else {
            if t.unknown {
                return Lookup::Unknown;
            }
            if let Some(reason) = &t.denied {
                return Lookup::CannotKnow(format!(
                    "the arbiter refused this agent's watch of {key}: {reason}"
                ));
            }
            return Lookup::CannotKnow(match state.session {
                Some(_) => format!("service {key} has not arrived from the arbiter yet"),
                None => format!("service {key} is not cached here and the arbiter is unreachable"),
            });
        };
        let age_ms = t.age_ms(now, self.inner.started_ms);
        let stale = !t.synced;
        let (config_age, config_behaviour) = self.inner.config.staleness.for_service(
            key.namespace.as_str(),
            key.service.as_str(),
            key.port_name.as_str(),
        );
        // The service's policy, when it sets them, overrides the agent's.
        let (policy_age, policy_behaviour) = state.regions.staleness(key);
        let max_age = policy_age.unwrap_or(config_age);
        let behaviour = policy_behaviour.unwrap_or(config_behaviour);
        if age_ms > max_age {
            match behaviour {
                StaleBehaviour::Refuse => {
                    self.inner.metrics.stale_refused.inc();
                    return Lookup::Refused(format!("the copy of {key} is {age_ms} ms old, past its maximum age of {max_age} ms; its staleness policy refuses"));
                }
                StaleBehaviour::Degrade => {
                    self.inner.metrics.stale_served.inc();
                }
                StaleBehaviour::Keep => {}
            }
        }
        let records: Vec<Arc<EndpointRecord>> = view.records().cloned().collect();
        let revision = view.revision();
        let ready_weight: u64 = view.ready().map(|r| u64::from(r.weight.get())).sum();
        state.regions.observe_local(key, ready_weight, now);
        let leaving: BTreeSet<InstanceId> = state
            .regs
            .iter()
            .filter(|l| l.intent != Intent::Serve)
            .map(|l| l.registration.instance_id.clone())
            .collect();
        // While the arbiter is reachable the agent follows the catalog, whose
        // verdicts need two signals; when cut off it trusts its own gossip
        // view (R7), and after a reconnect it keeps doing so for each node
        // until the arbiter has answered that node's down report.
        let down = state.downs.excluded(state.session.is_some());
        let memory = state.memory.entry(key.clone()).or_default();
        let selection = memory.select(
            &records,
            &leaving,
            &down,
            now,
            &self.inner.config.data_plane,
        );
        Lookup::Serve(Answer {
            service: key.clone(),
            revision,
            stale,
            age_ms,
            selection,
            records,
            leaving,
        })
    }

    /// `lookup`, waiting up to `first_resolve_wait_ms` for a service that
    /// has not arrived yet (the first resolve of a service).
    pub async fn lookup_wait(&self, key: &ServiceKey) -> Lookup {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.inner.config.first_resolve_wait_ms);
        loop {
            let notified = self.inner.changed.notified();
            let answer = self.lookup(key);
            let waiting = matches!(answer, Lookup::CannotKnow(_)) && self.lock().session.is_some();
            if !waiting {
                return answer;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.lookup(key);
            }
        }
    }

    /// Where a `traffic` connection (or answer) of `key` goes when it has
    /// no usable local endpoint (R9): another region's ingress, or nowhere.
    /// Counted in the failover metrics.
    pub fn failover(&self, key: &ServiceKey, traffic: ConnTraffic) -> Decision {
        let decision = self.lock().regions.decide(key, traffic, now_ms());
        let m = &self.inner.metrics;
        match &decision {
            Decision::Remote { region, .. } => {
                m.failover_decisions
                    .get_or_create(&FailoverLabel {
                        service: key.to_string(),
                        region: region.to_string(),
                    })
                    .inc();
            }
            // A service without a policy is simply not a failover service.
            Decision::Refused(Refusal::NoPolicy) => {}
            Decision::Refused(refusal) => {
                m.failover_refusals
                    .get_or_create(&RefusalLabel {
                        service: key.to_string(),
                        reason: refusal.as_str().to_owned(),
                    })
                    .inc();
            }
        }
        decision
    }

    /// Whether this agent's ingress gateway takes a `traffic` connection of
    /// `key` from another region: the service's policy must let it into
    /// this agent's region.
    pub fn ingress_admits(&self, key: &ServiceKey, traffic: ConnTraffic) -> Result<(), Refusal> {
        self.lock()
            .regions
            .admits(key, traffic, &self.inner.config.region)
    }

    /// `GET /v1/regions`: the other regions and the policies held.
    pub fn regions_status(&self) -> RegionsResponse {
        let state = self.lock();
        let now = now_ms();
        RegionsResponse {
            region: self.inner.config.region.clone(),
            regions: state.regions.status(now),
            policies: state
                .regions
                .policies()
                .map(|p| RegionsPolicy {
                    policy: p.policy.document().clone(),
                    home_revision: p.home_revision.get(),
                })
                .collect(),
        }
    }

    /// A connect to an endpoint failed: counts toward its local ejection.
    pub fn connect_failed(&self, key: &ServiceKey, id: &InstanceId) {
        let now = now_ms();
        let mut state = self.lock();
        let ready = state
            .sync
            .get(key)
            .and_then(|t| t.view.as_ref())
            .map_or(0, |v| v.ready().count());
        state.recent_failures.push_back((id.clone(), now));
        while state.recent_failures.len() > 10_000 {
            state.recent_failures.pop_front();
        }
        let ejected = state.memory.entry(key.clone()).or_default().connect_failed(
            id,
            ready,
            now,
            &self.inner.config.data_plane,
        );
        self.inner.metrics.connect_failures.inc();
        if ejected {
            tracing::warn!(service = %key, instance = %id, "endpoint ejected locally after consecutive connect failures");
            self.inner
                .metrics
                .ejections
                .get_or_create(&ServiceLabel {
                    service: key.to_string(),
                })
                .inc();
        }
    }

    /// A connect to an endpoint succeeded.
    pub fn connect_succeeded(&self, key: &ServiceKey, id: &InstanceId) {
        if let Some(m) = self.lock().memory.get_mut(key) {
            m.connect_succeeded(id);
        }
    }

    /// This node's zone.
    pub fn zone(&self) -> &Label {
        &self.inner.zone
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &AgentMetrics {
        &self.inner.metrics
    }

    /// The agent's config.
    pub fn config(&self) -> &AgentConfig {
        &self.inner.config
    }

    /// `GET /metrics`: refreshes the per-service gauges and renders.
    pub fn metrics_text(&self) -> String {
        let now = now_ms();
        {
            let state = self.lock();
            let m = &self.inner.metrics;
            m.snapshot_age.clear();
            m.watch_lag.clear();
            for (service, t) in state.sync.iter() {
                let label = ServiceLabel {
                    service: service.to_string(),
                };
                m.snapshot_age
                    .get_or_create(&label)
                    .set((t.age_ms(now, self.inner.started_ms) / 1000) as i64);
                let revision = t.view.as_ref().map_or(0, |v| v.revision().get());
                let lag = if t.synced {
                    0
                } else {
                    state.shard_revision.get().saturating_sub(revision)
                };
                m.watch_lag.get_or_create(&label).set(lag as i64);
            }
            m.remote_view_age.clear();
            for region in state.regions.status(now) {
                m.remote_view_age
                    .get_or_create(&RegionLabel {
                        region: region.region.to_string(),
                    })
                    .set(region.age_ms as f64 / 1000.0);
            }
            m.policy_revision.clear();
            for p in state.regions.policies() {
                let gauge = m.policy_revision.get_or_create(&RegionLabel {
                    region: p.policy.home_region().to_string(),
                });
                gauge.set(gauge.get().max(p.home_revision.get() as i64));
            }
        }
        self.inner.metrics.render()
    }

    /// `GET /v1/endpoints/{service}`: answered from the local view only. The
    /// first resolve of a service not yet followed subscribes and waits up
    /// to `first_resolve_wait_ms` for it.
    pub async fn resolve(
        &self,
        key: ServiceKey,
        zone: Option<Label>,
        all: bool,
        traffic: ConnTraffic,
    ) -> Result<EndpointsResponse, ApiError> {
        let here = Label::new(&self.inner.config.region)
            .map_err(|e| ApiError::unavailable(format!("agent.region: {e}")))?;
        let answer = match self.lookup_wait(&key).await {
            Lookup::Serve(answer) => answer,
            Lookup::Unknown => {
                // The service may live only in another region.
                if let Decision::Remote {
                    region,
                    ingress,
                    ready,
                } = self.failover(&key, traffic)
                {
                    return Ok(EndpointsResponse {
                        service: key.service.clone(),
                        namespace: key.namespace.clone(),
                        port_name: key.port_name.clone(),
                        shard: shard_of(&key, SHARDS).0,
                        revision: 0,
                        age_ms: 0,
                        stale: false,
                        mode: "failover".into(),
                        region: region.clone(),
                        endpoints: Vec::new(),
                        failover: Some(failover_json(Decision::Remote {
                            region,
                            ingress,
                            ready,
                        })),
                    });
                }
                return Err(ApiError::not_found(format!("service {key} does not exist")));
            }
            Lookup::CannotKnow(reason) | Lookup::Refused(reason) => {
                return Err(ApiError::unavailable(reason))
            }
        };
        let in_zone = |r: &EndpointRecord| zone.as_ref().is_none_or(|z| &r.zone == z);
        let endpoints = if all {
            answer
                .records
                .iter()
                .filter(|r| in_zone(r))
                .map(|r| {
                    let mut e = EndpointJson::from_record(r);
                    if answer.leaving.contains(&r.instance_id) && r.state == State::Ready {
                        // A local drain applies to this agent's own data plane at once.
                        e.state = State::Draining.as_str().to_owned();
                    }
                    e
                })
                .collect()
        } else {
            answer
                .selection
                .candidates
                .iter()
                .filter(|c| in_zone(&c.record))
                .map(|c| EndpointJson::from_record(&c.record))
                .collect()
        };
        let failover = answer
            .selection
            .candidates
            .is_empty()
            .then(|| failover_json(self.failover(&key, traffic)));
        let region = match &failover {
            Some(FailoverJson {
                region: Some(r), ..
            }) => r.clone(),
            _ => here,
        };
        Ok(EndpointsResponse {
            service: key.service.clone(),
            namespace: key.namespace.clone(),
            port_name: key.port_name.clone(),
            shard: shard_of(&key, SHARDS).0,
            revision: answer.revision.get(),
            age_ms: answer.age_ms,
            stale: answer.stale,
            mode: if failover.as_ref().is_some_and(|f| f.region.is_some()) {
                "failover".into()
            } else {
                answer.selection.mode.as_str().into()
            },
            region,
            endpoints,
            failover,
        })
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> StatusResponse {
        let state = self.lock();
        let now = now_ms();
        let subscriptions = state
            .sync
            .iter()
            .map(|(service, t)| {
                let revision = t.view.as_ref().map_or(0, |v| v.revision().get());
                SubscriptionStatus {
                    service: service.clone(),
                    revision,
                    lag: if t.synced {
                        0
                    } else {
                        state.shard_revision.get().saturating_sub(revision)
                    },
                    stale: !t.synced,
                }
            })
            .collect();
        StatusResponse {
            node: self.inner.node.clone(),
            zone: self.inner.zone.clone(),
            agent_epoch: self.inner.epoch.get(),
            arbiter: ArbiterStatus {
                connected: state.session.is_some(),
                address: state.address.clone(),
                last_contact_ms: state.last_contact_ms.map(|t| {
                    if state.session.is_some() {
                        0
                    } else {
                        now.saturating_sub(t)
                    }
                }),
            },
            lease: state.lease.map(|(id, ttl_ms)| LeaseStatus {
                id: id.get(),
                ttl_ms,
            }),
            subscriptions,
            pending_writes: state.regs.pending().len() as u32,
            gossip: state.gossip_alive.as_ref().map(|alive| GossipStatus {
                alive: alive.iter().cloned().collect(),
                down: state.downs.nodes().cloned().collect(),
            }),
        }
    }
}

fn drain_reason() -> Reason {
    Reason::new("drain requested through the agent API").expect("a valid constant")
}

fn api_error(kind: RejectKind, message: String) -> ApiError {
    match kind {
        RejectKind::StaleGeneration => ApiError::stale_generation(message),
        RejectKind::NotFound => ApiError::not_found(message),
        RejectKind::Forbidden => ApiError::forbidden(message),
        RejectKind::Invalid => ApiError::unprocessable(message),
        RejectKind::Unavailable => ApiError::unavailable(message),
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
