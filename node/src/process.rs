//! The agent process (`rollcall agent`, and the agent of `rollcall dev`):
//! its start-up in two steps, and the handles on what runs.
//!
//! [`prepare`] checks everything it can before anything runs, in this
//! order: the names in the config, the arbiter client's TLS material, the
//! gossip key files, every address the agent listens on (bound here: the
//! HTTP API, DNS over UDP and TCP, each proxy, the ingress gateway,
//! gossip), the data directory (created, this run's epoch and the token
//! written, the cache and the registrations read), then the local API's
//! unix socket in it. A failure there leaves nothing to stop: only files
//! and sockets were opened (and the client's idle QUIC endpoint), and
//! dropping them closes them. [`Prepared::start`] then makes the state
//! machine, starts the actors (`agent`) and serves what was bound; it
//! cannot fail.
//!
//! Nothing here decides what the agent does (the state machine does), and
//! nothing may be left half-started on an error path: actix polls an
//! actor that was spawned but never ran once more when it is dropped, for
//! a failed start as the System's runtime goes away, and the agent actor's
//! `started` then panics for want of the runtime's timers ("there is no
//! reactor running").
//!
//! The actors need an actix System: start the agent inside
//! `runtime::block_on`. Shutdown is one signal (`shutdown`) that every
//! listener observes; the agent actor then flushes its files and closes
//! the session with a reason.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rollcall_config::AgentConfig;
use rollcall_leases::client::{ArbiterClient, ClientError};
use rollcall_leases::clock::now_ms;
use rollcall_leases::protocol::SessionUp;
use rollcall_leases::tls::{LiveTls, TlsMaterial};
use rollcall_leases::{AgentEpoch, Label, NodeId, RegionsUpdate, ServiceKey};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::agent::{self, AgentActor, Parts, Stop};
use crate::agent_state::{AgentState, Input, Restored, Settings};
use crate::api::{ApiContext, MetricsMessage, StatusMessage};
use crate::api_types::StatusResponse;
use crate::cache::{LoadReport, ServiceCache};
use crate::dns::{DnsHandle, DnsSockets};
use crate::ingress::{BoundIngress, IngressHandle};
use crate::metrics::AgentMetrics;
use crate::prober::Prober;
use crate::proxy::{BoundProxy, ProxyHandle};
use crate::registrations::{Registrations, RegistrationsError, RegistrationsFile};
use crate::shutdown::{self, Trigger};
use crate::view::{Lookup, ViewSettings, Views};
use rollcall_gossip::GossipHandle;

/// Why the agent could not start. Each message names the setting, file or
/// address at fault and what to do.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A config value this crate cannot use.
    #[error("agent config: {0}")]
    Config(String),
    /// An address the agent listens on could not be bound.
    #[error("binding {what} on {addr}: {source}; free the port or change {setting}")]
    Listen {
        /// What listens there.
        what: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The setting that names it.
        setting: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The data directory or a file in it is unusable.
    #[error("data directory {}: {what}: {source}; make it writable for this user or choose another (agent.data_dir, --data-dir)", dir.display())]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// What was being done.
        what: String,
        /// The cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The local API's unix socket could not be bound.
    #[error("binding the agent unix socket {}: {source}; its path must fit a unix socket address (107 bytes on Linux) and its directory be writable: choose a shorter agent.data_dir (--data-dir)", path.display())]
    Socket {
        /// The socket's path (`agent.sock` in the data directory).
        path: PathBuf,
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
    /// The DNS server's port could not be bound.
    #[error(transparent)]
    Dns(#[from] crate::dns::DnsError),
    /// A proxy entry is unusable.
    #[error(transparent)]
    Proxy(#[from] crate::proxy::ProxyError),
    /// The prober could not be built.
    #[error("agent.probes: {0}")]
    Prober(#[from] crate::prober::ProberError),
    /// Started outside an actix System.
    #[error(
        "the agent's actors need an actix System: start it inside rollcall_node::runtime::block_on"
    )]
    NoSystem,
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

impl Agent {
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

/// Checks and prepares (see the module doc), then starts the agent. `tls`
/// is required when `arbiters` is set. Must run inside an actix System
/// (`runtime::block_on`).
pub async fn start(
    config: AgentConfig,
    tls: Option<&TlsMaterial>,
) -> Result<AgentHandle, AgentError> {
    Ok(prepare(config, tls).await?.start().await)
}

/// An agent checked and ready to start: its names validated, its sockets
/// bound, its files read and written, nothing running.
pub struct Prepared {
    config: AgentConfig,
    node: NodeId,
    zone: Label,
    region: Label,
    client: Option<ArbiterClient>,
    declared: Vec<IpAddr>,
    prober: Prober,
    bound: Bound,
    files: Files,
    /// The local API's unix socket, in the data directory.
    unix: tokio::net::UnixListener,
}

/// What the agent listens on, bound.
struct Bound {
    http: TcpListener,
    http_addr: SocketAddr,
    dns: DnsSockets,
    proxies: Vec<BoundProxy>,
    ingress: Option<BoundIngress>,
    gossip: Option<crate::zone::Prepared>,
}

/// What the data directory holds for this run.
struct Files {
    epoch: AgentEpoch,
    token: Arc<str>,
    cache: ServiceCache,
    registrations_file: RegistrationsFile,
    registrations: Registrations,
    report: LoadReport,
    regions: Option<(RegionsUpdate, u64)>,
}

/// Checks everything the agent needs before it starts anything (see the
/// module doc). `tls` is required when `arbiters` is set.
pub async fn prepare(
    config: AgentConfig,
    tls: Option<&TlsMaterial>,
) -> Result<Prepared, AgentError> {
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
    if !config.arbiters.is_empty() && tls.is_none() {
        return Err(no_tls());
    }
    let keep_alive = Duration::from_millis(config.keepalive_ms);
    let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
    let silence = Duration::from_millis(config.arbiter_silence_ms);
    let client = tls
        .map(|tls| {
            ArbiterClient::new(tls)
                .and_then(|c| c.with_keep_alive(keep_alive))
                .map(|c| c.with_connect_timeout(connect_timeout))
                .map(|c| c.with_arbiter_silence(silence))
        })
        .transpose()?;
    let bound = bind(&config).await?;
    let files = data_dir(&config.data_dir)?;
    let socket = config.data_dir.join("agent.sock");
    let unix = crate::api::bind_unix(&socket).map_err(|source| AgentError::Socket {
        path: socket.clone(),
        source,
    })?;
    let prober = Prober::new(config.probes.max_concurrent as usize)?;
    let declared = declared_addresses(&config, tls);
    Ok(Prepared {
        config,
        node,
        zone,
        region,
        client,
        declared,
        prober,
        bound,
        files,
        unix,
    })
}

fn no_tls() -> AgentError {
    AgentError::Config(
        "agent.tls is required when agent.arbiters is set; generate certificates with `rollcall certs`"
            .into(),
    )
}

/// Binds every address the agent listens on, gossip's after reading the
/// zone keys.
async fn bind(config: &AgentConfig) -> Result<Bound, AgentError> {
    let gossip = crate::zone::prepare(config).await?;
    let listen = |what, addr, setting| {
        move |source| AgentError::Listen {
            what,
            addr,
            setting,
            source,
        }
    };
    let http_error = || {
        listen(
            "the agent HTTP API",
            config.http_listen,
            "agent.http_listen (--http)",
        )
    };
    let http = TcpListener::bind(config.http_listen)
        .await
        .map_err(http_error())?;
    let http_addr = http.local_addr().map_err(http_error())?;
    let dns = crate::dns::bind(config.dns_listen).await?;
    let mut proxies = Vec::new();
    for entry in &config.proxy {
        proxies.push(crate::proxy::bind(entry).await?);
    }
    let ingress = match config.ingress.listen {
        Some(addr) => Some(crate::ingress::bind(addr).await.map_err(listen(
            "the ingress gateway",
            addr,
            "agent.ingress.listen",
        ))?),
        None => None,
    };
    Ok(Bound {
        http,
        http_addr,
        dns,
        proxies,
        ingress,
        gossip,
    })
}

/// Creates the data directory, writes this run's epoch and the node token,
/// and reads the cache, the regions file and the registrations.
fn data_dir(dir: &Path) -> Result<Files, AgentError> {
    let failed = |what: &str| {
        let (dir, what) = (dir.to_owned(), what.to_owned());
        move |source: std::io::Error| AgentError::DataDir {
            dir,
            what,
            source: source.into(),
        }
    };
    std::fs::create_dir_all(dir).map_err(failed("creating it"))?;
    let epoch = next_epoch(dir, now_ms())?;
    let token: Arc<str> = rollcall_leases::secret::ensure_token(&dir.join("agent.token"))
        .map_err(failed("writing agent.token"))?
        .into();
    let cache = ServiceCache::open(dir)?;
    let registrations_file = RegistrationsFile::new(dir);
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
    Ok(Files {
        epoch,
        token,
        cache,
        registrations_file,
        registrations,
        report,
        regions,
    })
}

/// A fresh agent epoch, above every earlier one of this data directory:
/// the wall clock `now_ms`, or the previous epoch + 1 if the clock went
/// back.
fn next_epoch(data_dir: &Path, now_ms: u64) -> Result<AgentEpoch, AgentError> {
    let path = data_dir.join("epoch");
    let previous = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let epoch = now_ms.max(previous + 1);
    crate::durable::write_atomic(&path, epoch.to_string().as_bytes()).map_err(|e| {
        AgentError::DataDir {
            dir: data_dir.to_owned(),
            what: "writing epoch".into(),
            source: e.into(),
        }
    })?;
    Ok(AgentEpoch(epoch))
}

/// The addresses this node declares in Hello: `advertise_addresses` when
/// set; none when the certificate carries IP SANs (the arbiter takes those);
/// else every address of the host's interfaces, at most
/// `MAX_DECLARED_ADDRESSES` of them.
fn declared_addresses(config: &AgentConfig, tls: Option<&TlsMaterial>) -> Vec<IpAddr> {
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
    let mut found: Vec<IpAddr> = match if_addrs::get_if_addrs() {
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

impl Prepared {
    /// Sets `agent.arbiters` once they are known (`rollcall dev` checks its
    /// agent before it starts the arbiters it connects to). Needs the TLS
    /// material `prepare` was given.
    pub fn set_arbiters(&mut self, arbiters: Vec<String>) -> Result<(), AgentError> {
        if !arbiters.is_empty() && self.client.is_none() {
            return Err(no_tls());
        }
        self.config.arbiters = arbiters;
        Ok(())
    }

    /// Starts the agent: serves the cache at once (stale), connects to the
    /// arbiter (when `arbiters` is set) and serves the local HTTP API, DNS,
    /// the proxies and the ingress gateway.
    pub async fn start(self) -> AgentHandle {
        let Prepared {
            config,
            node,
            zone,
            region,
            client,
            declared,
            prober,
            bound,
            files,
            unix,
        } = self;
        if config.arbiters.is_empty() {
            tracing::warn!(
                "agent.arbiters is empty: this agent serves only its disk cache; registrations, drains and deregistrations stay pending, and resolves of services not cached answer 503"
            );
        }
        let client = client.filter(|_| !config.arbiters.is_empty());
        let now = now_ms();
        let epoch = files.epoch;
        let config = Arc::new(config);
        let metrics = Arc::new(AgentMetrics::new());
        metrics.set_max_services(config.metrics_max_services);
        metrics.cache_corrupt_at_start(files.report.corrupt as u64);
        let (trigger, shutdown) = shutdown::channel();

        // The agent actor's address exists before the actor, so the view,
        // the listeners and the helper actors can send to it.
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
        let settings = Settings {
            node: node.clone(),
            zone: zone.clone(),
            epoch,
            started_ms: now,
            config: config.clone(),
        };
        let restored = Restored {
            views: files.report.views,
            regions: files.regions,
            registrations: files.registrations,
            health: Default::default(),
        };
        let mut outputs = Vec::new();
        let state = AgentState::new(settings, restored, now, &mut rand::rng(), &mut outputs);
        let initial = agent::publish_at_start(&views, outputs, now);
        let api = ApiContext {
            views: views.clone(),
            calls: addr.clone().recipient(),
            status: addr.clone().recipient(),
            metrics: addr.clone().recipient(),
            sessions: addr.clone().recipient(),
            token: files.token.clone(),
            checks: config.checks.clone(),
            region,
            limits: config.http_limits,
        };
        let unix = crate::api::serve_unix(api.clone(), unix, shutdown.clone());

        let tls = client.as_ref().map(|c| c.tls().clone());
        let addr = agent::run(
            context,
            Parts {
                state,
                initial,
                views: views.clone(),
                metrics: metrics.clone(),
                hello: SessionUp::Hello {
                    node: node.clone(),
                    epoch,
                    zone,
                    addresses: declared,
                },
                client,
                prober,
                files: (files.cache, files.registrations_file),
            },
        );
        let servers = vec![
            unix,
            crate::api::serve_tcp(api, bound.http, shutdown.clone()),
        ];
        let proxies = bound
            .proxies
            .into_iter()
            .map(|proxy| crate::proxy::start(views.clone(), proxy, shutdown.clone()))
            .collect();
        let dns_addr = bound.dns.local_addr;
        let dns = crate::dns::start(views.clone(), bound.dns, config.dns_ttl_s);
        let ingress = bound.ingress.map(|ingress| {
            crate::ingress::start(
                views.clone(),
                ingress,
                config.ingress.clone(),
                config.first_resolve_wait_ms,
                shutdown.clone(),
            )
        });
        let gossip = bound.gossip.map(|gossip| {
            crate::zone::start(gossip, &config, &node, epoch, addr.clone().recipient())
        });
        if let Some(gossip) = &gossip {
            metrics.watch_gossip(gossip.drops());
        }
        let http_addr = bound.http_addr;
        tracing::info!(node = %node, epoch = %epoch, http = %http_addr, dns = %dns_addr, "agent started");
        AgentHandle {
            agent: Agent {
                addr,
                tls,
                views,
                token: files.token,
                epoch,
                config,
                metrics,
            },
            http_addr,
            proxies,
            dns_addr,
            ingress_addr: ingress.as_ref().map(|i| i.local_addr),
            ingress,
            gossip,
            dns,
            servers,
            trigger,
        }
    }
}
