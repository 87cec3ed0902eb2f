//! The local TCP proxy (R8): one listener per `[[proxy]]` entry; each
//! accepted connection is forwarded to one endpoint of the service.
//!
//! A thin driver: which endpoints are usable comes from the agent's shared
//! endpoint view (`Agent::lookup`), which one to use from `selector`. This
//! module owns the sockets: connect with a short timeout, retry on another
//! endpoint while nothing of the client's has been read, then copy bytes
//! both ways. It must never retry once a byte of the client's has been
//! forwarded (a backend that accepted and stalled must never see a
//! duplicate elsewhere), and never send a caller anywhere the view did not
//! offer: with no endpoint the connection is closed and counted as
//! "no backend".

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rollcall_config::ProxyEntry;
use rollcall_leases::{InstanceId, ServiceKey, State};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::agent::{Agent, Lookup};
use crate::metrics::ServiceLabel;

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The entry names an invalid service key.
    #[error("proxy for {service:?}: {reason}; write the service as namespace/service/port_name")]
    Service {
        /// The service as configured.
        service: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The listen address could not be bound.
    #[error("proxy for {service}: binding {listen} failed: {source}; pick a free address in proxy.listen")]
    Bind {
        /// The service.
        service: ServiceKey,
        /// The configured address.
        listen: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Buffer per direction of a proxied connection: large enough that bulk
/// streams move in few syscalls (tokio's default is 8 KiB).
const COPY_BUFFER: usize = 64 * 1024;

/// How many proxied connections are open to each instance, across every
/// proxy that shares this value. The selector balances on it, and the
/// agent's drain sequence waits for a drained instance's count to reach
/// zero. A connect in progress already counts, so a burst of new
/// connections spreads instead of piling onto one endpoint. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ActiveConnections {
    counts: Arc<DashMap<InstanceId, usize>>,
}

impl ActiveConnections {
    /// Connections open (or connecting) to `id` through the proxy.
    pub fn count(&self, id: &InstanceId) -> usize {
        self.counts.get(id).map_or(0, |c| *c)
    }

    /// Counts one more connection to `id` until the guard is dropped.
    fn open(&self, id: &InstanceId) -> ActiveGuard {
        *self.counts.entry(id.clone()).or_default() += 1;
        ActiveGuard {
            counts: self.counts.clone(),
            id: id.clone(),
        }
    }
}

/// One counted connection; dropping it (the connection ended, failed, or
/// its task was aborted) takes it off the count.
struct ActiveGuard {
    counts: Arc<DashMap<InstanceId, usize>>,
    id: InstanceId,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.counts.remove_if_mut(&self.id, |_, count| {
            *count = count.saturating_sub(1);
            *count == 0
        });
    }
}

/// A running proxy listener.
pub struct ProxyHandle {
    /// The address the listener is bound to (the real port when the entry
    /// asked for port 0).
    pub local_addr: SocketAddr,
    /// The service it forwards to.
    pub service: ServiceKey,
    task: JoinHandle<()>,
}

impl ProxyHandle {
    /// Stops accepting and ends every connection this proxy carries (their
    /// active counts go back down). Dropping the handle instead leaves the
    /// proxy running.
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
        tracing::info!(service = %self.service, listen = %self.local_addr, "proxy stopped");
    }
}

/// Binds `entry.listen` and serves it until `ProxyHandle::shutdown`. The
/// agent follows the service from now on, so its endpoints are usually
/// there before the first caller. Share one `active` between all proxies
/// and the drain sequence.
pub async fn start(
    agent: Agent,
    entry: &ProxyEntry,
    active: ActiveConnections,
) -> Result<ProxyHandle, ProxyError> {
    let service: ServiceKey = entry
        .service
        .parse()
        .map_err(|e: rollcall_leases::NameError| ProxyError::Service {
            service: entry.service.clone(),
            reason: e.to_string(),
        })?;
    let bind_error = |source| ProxyError::Bind {
        service: service.clone(),
        listen: entry.listen,
        source,
    };
    let listener = TcpListener::bind(entry.listen).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    // Only to start following the service; callers get a fresh lookup.
    let _ = agent.lookup(&service);
    let task = tokio::spawn(accept_loop(
        listener,
        Arc::new(Forward {
            agent,
            service: service.clone(),
            active,
        }),
    ));
    tracing::info!(service = %service, listen = %local_addr, "proxy listening");
    Ok(ProxyHandle {
        local_addr,
        service,
        task,
    })
}

/// What every connection of one proxy shares.
struct Forward {
    agent: Agent,
    service: ServiceKey,
    active: ActiveConnections,
}

/// Accepts until aborted. The connections' tasks live in a `JoinSet`, so
/// aborting this loop ends them too.
async fn accept_loop(listener: TcpListener, forward: Arc<Forward>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) => {
                    connections.spawn(forward.clone().serve(client, peer));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off a little
                    // rather than spin.
                    tracing::warn!(service = %forward.service, error = %e, "proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

impl Forward {
    /// One client connection: choose, connect (retrying elsewhere only
    /// before anything of the client's is read), then copy both ways.
    async fn serve(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let service = &self.service;
        let answer = match self.agent.lookup_wait(service).await {
            Lookup::Serve(answer) if !answer.selection.candidates.is_empty() => answer,
            other => {
                let reason = match other {
                    Lookup::Serve(_) => "no usable endpoint".to_owned(),
                    Lookup::Unknown => "the service does not exist".to_owned(),
                    Lookup::CannotKnow(reason) | Lookup::Refused(reason) => reason,
                };
                self.no_backend(peer, &reason);
                return;
            }
        };
        let candidates = &answer.selection.candidates;
        let config = &self.agent.config().data_plane;
        let timeout = Duration::from_millis(config.connect_timeout_ms);
        let mut tried = BTreeSet::new();
        let mut upstream = None;
        for _ in 0..=config.retries {
            let active = |id: &InstanceId| self.active.count(id);
            let Some(i) = crate::selector::choose(
                candidates,
                self.agent.zone(),
                &active,
                &tried,
                config.local_zone_min_share,
                &mut rand::rng(),
            ) else {
                break;
            };
            let record = &candidates[i].record;
            let instance = &record.instance_id;
            let guard = self.active.open(instance);
            let target = SocketAddr::new(record.address, record.port);
            let failure = match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
                Ok(Ok(stream)) => {
                    upstream = Some((stream, record.clone(), guard));
                    break;
                }
                Ok(Err(e)) => e,
                Err(_) => std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer within data_plane.connect_timeout_ms",
                ),
            };
            drop(guard);
            tracing::debug!(service = %service, instance = %instance, address = %target, error = %failure, "proxy connect failed");
            self.agent.connect_failed(service, instance);
            tried.insert(instance.clone());
        }
        let Some((mut backend, record, _guard)) = upstream else {
            self.no_backend(peer, "every endpoint tried failed to connect");
            return;
        };
        let instance = &record.instance_id;
        self.agent.connect_succeeded(service, instance);
        let metrics = self.agent.metrics();
        metrics.proxied_connections.inc();
        if record.state != State::Ready {
            metrics.connections_to_not_ready.inc();
        }
        let mut client = client;
        let _ = client.set_nodelay(true);
        let _ = backend.set_nodelay(true);
        tracing::debug!(service = %service, instance = %instance, peer = %peer, mode = answer.selection.mode.as_str(), "proxy connection open");
        // From here on bytes flow: whatever happens, no retry.
        match tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut backend,
            COPY_BUFFER,
            COPY_BUFFER,
        )
        .await
        {
            Ok((sent, received)) => {
                tracing::debug!(service = %service, instance = %instance, peer = %peer, sent, received, "proxy connection closed")
            }
            Err(e) => {
                tracing::debug!(service = %service, instance = %instance, peer = %peer, error = %e, "proxy connection ended")
            }
        }
    }

    /// Closes the client's connection (dropped by the caller) and counts it.
    fn no_backend(&self, peer: SocketAddr, reason: &str) {
        self.agent
            .metrics()
            .no_backend
            .get_or_create(&ServiceLabel {
                service: self.service.to_string(),
            })
            .inc();
        tracing::debug!(service = %self.service, peer = %peer, reason = %reason, "proxy has no backend; connection closed");
    }
}
