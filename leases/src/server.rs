//! The arbiter server (`rollcall arbiter`): QUIC with mutual TLS on one UDP
//! port for agents, an admin HTTP endpoint for operators, durable storage
//! in the data directory, and the core task that drives the replica
//! machine (`replica::ReplicaState`).
//!
//! This module only wires the parts together and owns their lifetimes:
//! the replica machine decides, the core task carries its inputs and
//! outputs, the connections carry bytes, the store persists.

pub mod admin;
pub mod connection;
pub mod core;
pub mod membership;
pub mod messages;
pub mod metrics;
pub mod peer;
pub mod removal;
pub mod shards;
pub mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rollcall_config::ArbiterConfig;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::ids::ShardId;
use crate::raft::{CatalogRaftNode, RaftStoreError, ReplicaId};
use crate::server::connection::PeerContext;
use crate::server::core::{Core, Replica};
use crate::server::metrics::Metrics;
use crate::server::peer::Peers;
use crate::server::shards::Shards;
use crate::tls::{self, LiveTls, TlsError, TlsMaterial};

/// Why the arbiter could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The config holds a value this crate cannot use.
    #[error("arbiter config: {0}")]
    Config(String),
    /// Raft storage could not be opened or recovered.
    #[error(transparent)]
    Store(#[from] RaftStoreError),
    /// openraft refused to start.
    #[error("raft: {0}")]
    Raft(String),
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// `ROLLCALL_FAULTS` or `ROLLCALL_FAULTS_SEED` does not parse.
    #[cfg(feature = "fault-injection")]
    #[error(transparent)]
    Faults(#[from] crate::fault::FaultConfigError),
    /// A listener could not be bound, or a file written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

/// A running arbiter replica.
pub struct ArbiterServer {
    /// The QUIC address agents and peer replicas connect to.
    pub quic_addr: SocketAddr,
    /// The admin HTTP address.
    pub admin_addr: SocketAddr,
    /// The operator token file.
    pub token_file: PathBuf,
    /// The region bridge's token file (`bridge.token`, its calls only).
    pub bridge_token_file: PathBuf,
    /// This replica's Raft id.
    pub replica_id: ReplicaId,
    shards: Shards,
    peers: Arc<Peers>,
    endpoint: quinn::Endpoint,
    tls: Arc<LiveTls>,
    /// The one stop signal: the core, the admin server and the accept loop
    /// observe it.
    stop: crate::shutdown::Trigger,
    core_task: JoinHandle<()>,
    balance_task: JoinHandle<()>,
    write_timeout: Duration,
    accept_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
}

impl ArbiterServer {
    /// Opens this replica's Raft storage in `config.data_dir` and starts
    /// serving. A new group is initialized by its lowest-id replica from
    /// `raft.replicas`; the catalog is what the log and snapshot hold.
    pub async fn start(
        config: ArbiterConfig,
        material: &TlsMaterial,
    ) -> Result<ArbiterServer, ServerError> {
        #[cfg(feature = "fault-injection")]
        crate::fault::install()?;
        let region = crate::name::Label::new(&config.region)
            .map_err(|e| ServerError::Config(format!("arbiter.region: {e}")))?;
        crate::secret::private_dir(&config.data_dir).map_err(io(format!(
            "creating data directory {}",
            config.data_dir.display()
        )))?;
        let removed = removal::Removed::load(&config.data_dir).map_err(io(format!(
            "reading {} in {}",
            removal::MARKER,
            config.data_dir.display()
        )))?;
        if let Some(removal) = removed.get() {
            tracing::warn!(reason = %removal.describe(), "this replica was removed from its group");
        }
        let token_file = config.data_dir.join("admin.token");
        let token = crate::secret::ensure_token(&token_file)
            .map_err(io(format!("writing {}", token_file.display())))?;
        let bridge_token_file = config.data_dir.join("bridge.token");
        let bridge_token = crate::secret::ensure_token(&bridge_token_file)
            .map_err(io(format!("writing {}", bridge_token_file.display())))?;

        let live = LiveTls::new(material)?;
        let mut server_config = live.server_config(tls::ALPN)?;
        // No keep-alives from this end (R4); what is queued for one agent
        // is bounded by its send window, and a slower agent stalls and is
        // disconnected (distribution.stall_timeout_ms).
        server_config.transport_config(crate::transport::config(crate::transport::Link::Arbiter {
            send_window: config.distribution.max_queued_bytes_per_agent,
        }));
        let asked = (config.udp_recv_buffer_bytes > 0)
            .then(|| usize::try_from(config.udp_recv_buffer_bytes).unwrap_or(usize::MAX));
        let (socket, granted) = crate::transport::bind_udp(config.listen, asked)
            .map_err(io(format!("binding QUIC listener {}", config.listen)))?;
        // Linux reports twice what it keeps; less than asked means it was
        // capped at net.core.rmem_max.
        if let Some(asked) = asked.filter(|asked| granted < *asked) {
            tracing::warn!(
                asked,
                granted,
                "the kernel capped the QUIC socket's receive buffer below arbiter.udp_recv_buffer_bytes: \
                 bursts from many agents will be dropped; raise it with `sysctl -w net.core.rmem_max={asked}`"
            );
        } else {
            tracing::debug!(?asked, granted, "QUIC socket receive buffer");
        }
        let runtime = quinn::default_runtime().ok_or_else(|| {
            io("starting the QUIC listener")(std::io::Error::other("no tokio runtime"))
        })?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(server_config),
            socket,
            runtime,
        )
        .map_err(io(format!("binding QUIC listener {}", config.listen)))?;
        let quic_addr = endpoint
            .local_addr()
            .map_err(io("reading the QUIC listener address"))?;
        let admin = tokio::net::TcpListener::bind(config.admin)
            .await
            .map_err(io(format!("binding admin listener {}", config.admin)))?;
        let admin_addr = admin
            .local_addr()
            .map_err(io("reading the admin listener address"))?;

        let peers =
            Peers::new(&live, region.clone()).map_err(io("binding the peer client socket"))?;
        let raft_config = raft_config(&config)?;
        let id = config.raft.id;
        let mut groups = Vec::with_capacity(usize::from(config.catalog.shards));
        for shard in 0..config.catalog.shards {
            groups.push(
                shards::open_group(&config, ShardId(shard), &peers, raft_config.clone()).await?,
            );
        }
        let shards = Shards::new(groups);
        let mut members = config.raft.members(quic_addr);
        if config.raft.replicas.is_empty() {
            // A group of one lives wherever it is bound (port 0 in tests).
            members[0].addr = quic_addr.to_string();
        }
        let members: Vec<(ReplicaId, String)> =
            members.into_iter().map(|m| (m.id, m.addr)).collect();
        for group in shards.iter() {
            shards::bootstrap(group, id, &members, &peers, config.raft.election_max_ms).await?;
        }
        let zero = shards
            .get(ShardId(0))
            .expect("a catalog has shard 0")
            .clone();
        let (node, applied) = (zero.raft.clone(), zero.catalog.clone());
        tracing::info!(
            replica = id,
            revision = %applied.mark().revision,
            "catalog opened"
        );

        let metrics = Arc::new(Metrics::new());
        let (core_tx, core_rx) = mpsc::channel(65_536);
        let replica = Replica {
            id,
            peers: peers.clone(),
            group: zero,
        };
        let core = Core::new(config.clone(), replica, metrics.clone());
        let write_timeout = Duration::from_millis(config.raft.write_timeout_ms);
        let (stop, stopping) = crate::shutdown::channel();
        let core_task = tokio::spawn(core.run(core_rx, stopping.clone()));
        let balance_task = tokio::spawn(shards::balance(
            shards.clone(),
            peers.clone(),
            id,
            config.raft.clone(),
            stopping.clone(),
        ));
        let accept_task = tokio::spawn(connection::accept_loop(
            endpoint.clone(),
            core_tx.clone(),
            PeerContext {
                raft: node.clone(),
                shards: shards.clone(),
                region: region.clone(),
                timeout: write_timeout,
                peers: peers.clone(),
                removed: removed.clone(),
                tls: live.clone(),
                metrics: metrics.clone(),
            },
            connection::Guards::new(config.limits, metrics.clone()),
        ));
        let app = admin::router(admin::AdminState {
            core: core_tx,
            applied,
            raft: node.clone(),
            shards: shards.clone(),
            peers: peers.clone(),
            metrics,
            token: token.into(),
            bridge_token: bridge_token.into(),
            write_timeout,
            tls: live.clone(),
            calls: admin::AdminCalls::new(&config.limits),
            bridge_calls: admin::AdminCalls::new(&config.limits),
            removed: removed.clone(),
        });
        let limits = crate::http::Limits::from(&config.http_limits);
        let admin_task = tokio::spawn(crate::http::serve(
            admin,
            app,
            limits,
            |_, addr| *addr,
            "arbiter admin",
            stopping,
            // HTTPS beside HTTP on the admin port, with this replica's
            // certificate: the region bridge calls over it with its own.
            Some(live.https_server_config()),
        ));
        tracing::info!(quic = %quic_addr, admin = %admin_addr, region = %config.region, replica = id, "arbiter serving");
        Ok(ArbiterServer {
            quic_addr,
            admin_addr,
            token_file,
            bridge_token_file,
            replica_id: id,
            shards,
            peers,
            endpoint,
            tls: live,
            stop,
            core_task,
            balance_task,
            write_timeout,
            accept_task,
            admin_task,
        })
    }

    /// The TLS material this replica presents and trusts: a reload
    /// (`tls::Watcher`, SIGHUP) replaces it here, for every handshake from
    /// then on (agents', peers', and its own calls to its peers).
    pub fn tls(&self) -> &Arc<LiveTls> {
        &self.tls
    }

    /// This replica's Raft node (for tests and benchmarks: leadership,
    /// metrics).
    pub fn raft(&self) -> &CatalogRaftNode {
        &self.zero().raft
    }

    /// Shard 0's group, which every catalog has.
    fn zero(&self) -> &shards::ShardGroup {
        self.shards.get(ShardId(0)).expect("a catalog has shard 0")
    }

    /// Every shard's Raft group on this replica, shard 0 first (for tests
    /// and benchmarks: leaders, direct writes to a shard).
    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    /// The identity of the catalog this replica applied (`None` until the
    /// group's first leader named it: a launcher waits for it to know a
    /// write commits).
    pub fn catalog_identity(&self) -> Option<crate::CatalogId> {
        self.zero().catalog.lock().identity()
    }

    /// The UDP port this replica's calls to its peers leave from (tests cut
    /// it to partition the replica).
    pub fn peer_port(&self) -> u16 {
        self.peers.local_addr().map_or(0, |a| a.port())
    }

    /// Stops serving (one signal; Ctrl-C / SIGTERM in the binary) and
    /// waits until the storage is released, so the same data directory can
    /// be opened again: the admin server stops accepting and finishes its
    /// requests; the core answers the batches it sent to Raft (new writes
    /// are refused as unavailable meanwhile, at most `raft.write_timeout_ms`);
    /// then every session and peer connection is closed with a reason,
    /// Raft stops (the log is fsynced at every append, so nothing is left
    /// to flush) and the store is closed when the last task holding it
    /// ends. A task that overruns its bound is abandoned with a warning.
    pub async fn shutdown(self) {
        let stopping = self.stop_serving().await;
        stopping.stop_raft().await;
        stopping.close().await;
    }

    /// Stops at once, as a crash would, for tests and benchmarks that kill a
    /// replica in-process: the QUIC endpoint and the peer client close
    /// first (no heartbeat leaves after), every task is aborted (nothing in
    /// flight is answered, no part gets a teardown bound) and every
    /// shard's Raft stops. The data directory can be opened again once the
    /// aborted tasks dropped their store handles, which this waits for.
    pub async fn kill(self) {
        self.stop.fire();
        self.endpoint.close(
            quinn::VarInt::from_u32(crate::protocol::close_code::DONE),
            b"arbiter killed",
        );
        self.peers.close();
        let tasks = [
            self.admin_task,
            self.core_task,
            self.balance_task,
            self.accept_task,
        ];
        for task in &tasks {
            task.abort();
        }
        for group in self.shards.iter() {
            let _ = group.raft.shutdown().await;
        }
        for task in tasks {
            let _ = task.await;
        }
        self.endpoint.wait_idle().await;
        released(self.endpoint).await;
    }

    /// The first part of [`ArbiterServer::shutdown`]: the stop signal,
    /// then the admin server and the core end (the core answers what it
    /// sent to Raft). Raft still runs and peers still reach it: a launcher
    /// with several replicas in one process stops every core first, then
    /// every Raft (leaders first), then closes every endpoint, so no
    /// replica replicates to a peer that already closed.
    pub async fn stop_serving(self) -> Stopping {
        self.stop.fire();
        let grace = Duration::from_millis(2_000);
        finish("admin server", self.admin_task, grace).await;
        // The core bounds its own wait by the write timeout.
        finish("core", self.core_task, self.write_timeout + grace).await;
        finish("shard placement", self.balance_task, grace).await;
        Stopping {
            shards: self.shards,
            peers: self.peers,
            endpoint: self.endpoint,
            accept_task: self.accept_task,
        }
    }
}

/// An arbiter replica whose core has stopped (`ArbiterServer::stop_serving`).
pub struct Stopping {
    shards: Shards,
    peers: Arc<Peers>,
    endpoint: quinn::Endpoint,
    accept_task: JoinHandle<()>,
}

impl Stopping {
    /// Whether this replica leads its group (a launcher stops leaders'
    /// Raft first, so no follower misses a heartbeat and calls an
    /// election while the rest stop).
    pub fn leads(&self) -> bool {
        self.shards.iter().any(|g| {
            let metrics = g.raft.metrics().borrow().clone();
            metrics.current_leader == Some(metrics.id)
        })
    }

    /// Stops every shard's Raft node (the log is fsynced at every append:
    /// nothing is left to flush).
    pub async fn stop_raft(&self) {
        for group in self.shards.iter() {
            if let Err(e) = group.raft.shutdown().await {
                tracing::warn!(shard = %group.shard, error = %e, "raft did not stop cleanly");
            }
        }
    }

    /// Closes every session and peer connection with a reason and waits
    /// until the socket is released, so the same port can be bound again at
    /// once (a restart in one process).
    pub async fn close(self) {
        self.endpoint.close(
            quinn::VarInt::from_u32(crate::protocol::close_code::DONE),
            b"arbiter shutting down",
        );
        self.peers.close();
        finish(
            "accept loop",
            self.accept_task,
            Duration::from_millis(2_000),
        )
        .await;
        self.endpoint.wait_idle().await;
        released(self.endpoint).await;
        tracing::info!("arbiter stopped");
    }
}

/// Drops `endpoint` and waits (at most 2 s) until its port can be bound
/// again: quinn's endpoint driver closes the socket only when it next
/// runs, and a restart in the same process (tests, benchmarks) binds the
/// same port at once; on a loaded machine it was still held (found in a
/// full test run, `bench replication`).
async fn released(endpoint: quinn::Endpoint) {
    let addr = endpoint.local_addr().ok();
    drop(endpoint);
    let Some(addr) = addr else { return };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while std::net::UdpSocket::bind(addr).is_err() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for `task` to end by itself for at most `bound`; past it the task
/// is abandoned (aborted) with a warning, so a stuck part never keeps the
/// process from stopping.
async fn finish(what: &str, mut task: JoinHandle<()>, bound: Duration) {
    if tokio::time::timeout(bound, &mut task).await.is_err() {
        tracing::warn!(
            part = what,
            bound_ms = bound.as_millis() as u64,
            "did not stop within its bound; abandoned"
        );
        task.abort();
        let _ = task.await;
    }
}

/// openraft's settings from `[raft]` and `[store]`.
fn raft_config(config: &ArbiterConfig) -> Result<Arc<openraft::Config>, ServerError> {
    let r = &config.raft;
    let c = openraft::Config {
        cluster_name: format!("rollcall-{}", config.region),
        heartbeat_interval: r.heartbeat_ms,
        election_timeout_min: r.election_min_ms,
        election_timeout_max: r.election_max_ms,
        install_snapshot_timeout: r.write_timeout_ms.max(1_000),
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.store.compact_every),
        // Followers a little behind catch up from the log, not a snapshot.
        max_in_snapshot_log_to_keep: 1_000.min(config.store.compact_every),
        // openraft gives one AppendEntries `heartbeat_ms` to complete, so
        // a lagging follower is caught up in small steps (an entry is a
        // batch of up to 1,024 commands).
        max_payload_entries: 16,
        snapshot_max_chunk_size: 4 * 1024 * 1024,
        ..Default::default()
    };
    c.validate()
        .map(Arc::new)
        .map_err(|e| ServerError::Config(format!("arbiter.raft: {e}")))
}
