//! The arbiter server (`rollcall arbiter`): QUIC with mutual TLS on one UDP
//! port for agents, an admin HTTP endpoint for operators, durable storage
//! in the data directory, and the core task that owns the catalog.
//!
//! This module only wires the parts together and owns their lifetimes:
//! the core decides, the connections carry bytes, the store persists.

pub mod admin;
pub mod connection;
pub mod core;
pub mod metrics;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rollcall_config::ArbiterConfig;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::ids::ShardId;
use crate::params::CatalogParams;
use crate::server::core::Core;
use crate::server::metrics::Metrics;
use crate::store::{Store, StoreError, StoreOptions};
use crate::tls::{self, TlsError, TlsMaterial};

/// Why the arbiter could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The config holds a value this crate cannot use.
    #[error("arbiter config: {0}")]
    Config(String),
    /// Storage could not be opened or recovered.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
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

/// A running arbiter.
pub struct ArbiterServer {
    /// The QUIC address agents connect to.
    pub quic_addr: SocketAddr,
    /// The admin HTTP address.
    pub admin_addr: SocketAddr,
    /// The operator token file.
    pub token_file: PathBuf,
    endpoint: quinn::Endpoint,
    tasks: Vec<JoinHandle<()>>,
}

impl ArbiterServer {
    /// Recovers the catalog from `config.data_dir` and starts serving.
    /// Every lease gets one TTL of grace from now (R3).
    pub async fn start(
        config: ArbiterConfig,
        material: &TlsMaterial,
    ) -> Result<ArbiterServer, ServerError> {
        let params = CatalogParams::from_config(&config, ShardId(0))
            .map_err(|e| ServerError::Config(e.to_string()))?;
        std::fs::create_dir_all(&config.data_dir).map_err(io(format!(
            "creating data directory {}",
            config.data_dir.display()
        )))?;
        let options = StoreOptions {
            audit_max_entries: config.store.audit_max_entries,
            compact_every: config.store.compact_every,
        };
        let store = Arc::new(Store::open(&config.data_dir, options)?);
        let recovered = store.recover(params)?;
        let log_len = store.log_len()?;
        tracing::info!(
            revision = %recovered.catalog.revision(),
            snapshot = %recovered.snapshot_revision,
            replayed = recovered.replayed,
            "catalog recovered"
        );
        let token_file = config.data_dir.join("admin.token");
        let token = crate::secret::ensure_token(&token_file)
            .map_err(io(format!("writing {}", token_file.display())))?;

        let metrics = Arc::new(Metrics::new());
        let (core_tx, core_rx) = mpsc::channel(65_536);
        let core = Core::new(
            config.clone(),
            recovered.catalog,
            store.clone(),
            metrics.clone(),
            log_len,
        );
        let mut tasks = vec![tokio::spawn(core.run(core_rx))];

        let mut server_config = tls::server_config(material)?;
        let mut transport = quinn::TransportConfig::default();
        transport.keep_alive_interval(Some(Duration::from_secs(1)));
        transport.max_idle_timeout(Some(
            Duration::from_secs(10)
                .try_into()
                .expect("10 s fits a QUIC idle timeout"),
        ));
        // What is queued for one agent is bounded by its send window; a
        // slower agent stalls and is disconnected (distribution.stall_timeout_ms).
        transport.send_window(config.distribution.max_queued_bytes_per_agent);
        server_config.transport_config(Arc::new(transport));
        let endpoint = quinn::Endpoint::server(server_config, config.listen)
            .map_err(io(format!("binding QUIC listener {}", config.listen)))?;
        let quic_addr = endpoint
            .local_addr()
            .map_err(io("reading the QUIC listener address"))?;
        tasks.push(tokio::spawn(connection::accept_loop(
            endpoint.clone(),
            core_tx.clone(),
        )));

        let admin = tokio::net::TcpListener::bind(config.admin)
            .await
            .map_err(io(format!("binding admin listener {}", config.admin)))?;
        let admin_addr = admin
            .local_addr()
            .map_err(io("reading the admin listener address"))?;
        let app = admin::router(core_tx, store, metrics, token);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, app).await {
                tracing::error!(error = %e, "admin endpoint stopped");
            }
        }));
        tracing::info!(quic = %quic_addr, admin = %admin_addr, region = %config.region, "arbiter serving");
        Ok(ArbiterServer {
            quic_addr,
            admin_addr,
            token_file,
            endpoint,
            tasks,
        })
    }

    /// Stops serving and waits until the store is released, so the same
    /// data directory can be opened again (tests restart arbiters).
    pub async fn shutdown(self) {
        self.endpoint.close(
            quinn::VarInt::from_u32(connection::close_code::DONE),
            b"arbiter shutting down",
        );
        for task in &self.tasks {
            task.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        self.endpoint.wait_idle().await;
    }
}
