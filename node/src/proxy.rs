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
//! offer. With no usable local endpoint, the service's policy alone may
//! send the connection to another region's ingress (`failover::decide`,
//! opened with the `ingress` preamble); otherwise the connection is closed
//! and counted as "no backend".

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use rand::seq::SliceRandom;
use rollcall_config::{ConnTraffic, ProxyEntry};
use rollcall_leases::{EndpointRecord, Ingress, InstanceId, ServiceKey, State};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::agent::{Agent, Answer, Lookup};
use crate::failover::Decision;
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
    pub(crate) fn open(&self, id: &InstanceId) -> ActiveGuard {
        *self.counts.entry(id.clone()).or_default() += 1;
        ActiveGuard {
            counts: self.counts.clone(),
            id: id.clone(),
        }
    }
}

/// One counted connection; dropping it (the connection ended, failed, or
/// its task was aborted) takes it off the count.
pub(crate) struct ActiveGuard {
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
            traffic: entry.traffic,
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
    traffic: ConnTraffic,
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

/// A connection made to a local endpoint, counted while it lives.
pub(crate) struct Upstream {
    pub(crate) stream: TcpStream,
    pub(crate) record: Arc<EndpointRecord>,
    _guard: ActiveGuard,
}

/// Connects to one of `answer`'s candidates, retrying on another while
/// nothing of the client's has been read; `None` when every try failed.
/// Failures and successes feed the agent's local ejection.
pub(crate) async fn connect_local(
    agent: &Agent,
    service: &ServiceKey,
    answer: &Answer,
    active: &ActiveConnections,
) -> Option<Upstream> {
    let candidates = &answer.selection.candidates;
    let config = &agent.config().data_plane;
    let timeout = Duration::from_millis(config.connect_timeout_ms);
    let mut tried = BTreeSet::new();
    for _ in 0..=config.retries {
        let count = |id: &InstanceId| active.count(id);
        let i = crate::selector::choose(
            candidates,
            agent.zone(),
            &count,
            &tried,
            config.local_zone_min_share,
            &mut rand::rng(),
        )?;
        let record = &candidates[i].record;
        let instance = &record.instance_id;
        let guard = active.open(instance);
        let target = SocketAddr::new(record.address, record.port);
        let failure = match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => {
                agent.connect_succeeded(service, instance);
                let metrics = agent.metrics();
                metrics.proxied_connections.inc();
                if record.state != State::Ready {
                    metrics.connections_to_not_ready.inc();
                }
                return Some(Upstream {
                    stream,
                    record: record.clone(),
                    _guard: guard,
                });
            }
            Ok(Err(e)) => e,
            Err(_) => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer within data_plane.connect_timeout_ms",
            ),
        };
        drop(guard);
        tracing::debug!(service = %service, instance = %instance, address = %target, error = %failure, "proxy connect failed");
        agent.connect_failed(service, instance);
        tried.insert(instance.clone());
    }
    None
}

/// Connects to one of another region's ingress addresses (in random order,
/// as many tries as `data_plane.retries` allows) and opens with the
/// ingress preamble; `None` when none answered.
async fn connect_remote(
    agent: &Agent,
    service: &ServiceKey,
    traffic: ConnTraffic,
    ingress: &[Ingress],
) -> Option<TcpStream> {
    let config = &agent.config().data_plane;
    let timeout = Duration::from_millis(config.connect_timeout_ms);
    let mut order: Vec<&Ingress> = ingress.iter().collect();
    order.shuffle(&mut rand::rng());
    let preamble = crate::ingress::preamble(service, traffic);
    for address in order.into_iter().cycle().take(config.retries as usize + 1) {
        let connect = async {
            let mut stream = TcpStream::connect(address.as_str()).await?;
            stream.write_all(preamble.as_bytes()).await?;
            Ok::<_, std::io::Error>(stream)
        };
        match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(service = %service, ingress = %address, error = %e, "ingress connect failed")
            }
            Err(_) => {
                tracing::debug!(service = %service, ingress = %address, "ingress connect timed out")
            }
        }
    }
    None
}

/// Copies both ways until either side ends. From here on bytes flow:
/// whatever happens, no retry.
pub(crate) async fn pipe(
    client: &mut TcpStream,
    backend: &mut TcpStream,
) -> std::io::Result<(u64, u64)> {
    let _ = client.set_nodelay(true);
    let _ = backend.set_nodelay(true);
    tokio::io::copy_bidirectional_with_sizes(client, backend, COPY_BUFFER, COPY_BUFFER).await
}

impl Forward {
    /// One client connection: choose, connect (retrying elsewhere only
    /// before anything of the client's is read), then copy both ways. With
    /// no usable local endpoint, the service's policy may send it to
    /// another region's ingress (R9).
    async fn serve(self: Arc<Self>, mut client: TcpStream, peer: SocketAddr) {
        let service = &self.service;
        let local_failure = match self.agent.lookup_wait(service).await {
            Lookup::Serve(answer) if !answer.selection.candidates.is_empty() => {
                if let Some(mut upstream) =
                    connect_local(&self.agent, service, &answer, &self.active).await
                {
                    let instance = &upstream.record.instance_id;
                    tracing::debug!(service = %service, instance = %instance, peer = %peer, mode = answer.selection.mode.as_str(), "proxy connection open");
                    let result = pipe(&mut client, &mut upstream.stream).await;
                    tracing::debug!(service = %service, instance = %instance, peer = %peer, result = ?result, "proxy connection closed");
                    return;
                }
                "every endpoint tried failed to connect".to_owned()
            }
            Lookup::Serve(_) => "no usable endpoint".to_owned(),
            Lookup::Unknown => "the service does not exist here".to_owned(),
            Lookup::CannotKnow(reason) | Lookup::Refused(reason) => {
                self.no_backend(peer, &reason);
                return;
            }
        };
        match self.agent.failover(service, self.traffic) {
            Decision::Remote {
                region, ingress, ..
            } => {
                let Some(mut remote) =
                    connect_remote(&self.agent, service, self.traffic, &ingress).await
                else {
                    self.no_backend(
                        peer,
                        &format!("{local_failure}; region {region}'s ingress did not answer"),
                    );
                    return;
                };
                tracing::debug!(service = %service, region = %region, peer = %peer, "proxy connection failed over to another region");
                let result = pipe(&mut client, &mut remote).await;
                tracing::debug!(service = %service, region = %region, peer = %peer, result = ?result, "failed-over connection closed");
            }
            Decision::Refused(refusal) => self.no_backend(
                peer,
                &format!("{local_failure}; no failover: {}", refusal.describe()),
            ),
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
