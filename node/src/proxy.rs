//! The local TCP proxy (R8): one listener per `[[proxy]]` entry; each
//! accepted connection is forwarded to one endpoint of the service.
//!
//! A thin driver: which endpoints are usable comes from the service's
//! endpoint view (`view::ServiceView`, read without any agent-wide lock),
//! which one to use from `selector`. This
//! module owns the sockets: connect with a short timeout, retry on another
//! endpoint while nothing of the client's has been read, then copy bytes
//! both ways. It must never retry once a byte of the client's has been
//! forwarded (a backend that accepted and stalled must never see a
//! duplicate elsewhere), and never send a caller anywhere the view did not
//! offer. With no usable local endpoint, the service's policy alone may
//! send the connection to another region's ingress (`failover::decide`,
//! opened with the `ingress` preamble); otherwise the connection is closed
//! and counted as "no backend". When no local endpoint is READY (only
//! what protection or panic holds on a doubtful verdict), a failover the
//! policy allows is tried before those.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use rollcall_config::{ConnTraffic, ProxyEntry};
use rollcall_leases::clock::now_ms;
use rollcall_leases::{Ingress, Label, ServiceKey};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::failover::Decision;
use crate::forward::{accept_loop, connect_local, pipe};
use crate::shutdown::Shutdown;
use crate::view::{Answer, Lookup, ServiceView, Views};

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
    /// Waits until the proxy stopped: after the shutdown signal it accepts
    /// nothing new and gives its open connections `SHUTDOWN_GRACE_MS` to
    /// finish before closing them.
    pub async fn stopped(self) {
        let _ = self.task.await;
        tracing::info!(service = %self.service, listen = %self.local_addr, "proxy stopped");
    }
}

/// A `[[proxy]]` entry with its service checked and its address bound,
/// not serving yet: the agent binds every listener before it starts
/// anything, so an address in use stops it before anything ran.
pub struct BoundProxy {
    listener: TcpListener,
    /// The address the listener is bound to (the real port when the entry
    /// asked for port 0).
    pub local_addr: SocketAddr,
    service: ServiceKey,
    traffic: ConnTraffic,
}

/// Checks `entry`'s service and binds `entry.listen`.
pub async fn bind(entry: &ProxyEntry) -> Result<BoundProxy, ProxyError> {
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
    Ok(BoundProxy {
        listener,
        local_addr,
        service,
        traffic: entry.traffic,
    })
}

/// Serves `bound` until the shutdown signal. The agent follows the
/// service from now on, so its endpoints are usually there before the
/// first caller.
pub fn start(views: Views, bound: BoundProxy, shutdown: Shutdown) -> ProxyHandle {
    let BoundProxy {
        listener,
        local_addr,
        service,
        traffic,
    } = bound;
    // The view of the service (following it from now on), held for
    // every connection: no lookup by key on the hot path.
    let view = views.service(&service);
    let forward = Arc::new(Forward {
        views,
        view,
        traffic,
    });
    let task = tokio::spawn(accept_loop(
        listener,
        format!("proxy for {service}"),
        move |client, peer| forward.clone().forward(client, peer),
        (usize::MAX, |_| {}),
        shutdown,
    ));
    tracing::info!(service = %service, listen = %local_addr, "proxy listening");
    ProxyHandle {
        local_addr,
        service,
        task,
    }
}

/// What every connection of one proxy shares.
struct Forward {
    views: Views,
    view: Arc<ServiceView>,
    traffic: ConnTraffic,
}

/// Connects to one of another region's ingress addresses (in random order,
/// as many tries as `data_plane.retries` allows) and opens with the
/// ingress preamble; `None` when none answered.
async fn connect_remote(
    views: &Views,
    service: &ServiceKey,
    traffic: ConnTraffic,
    ingress: &[Ingress],
) -> Option<TcpStream> {
    let config = views.data_plane();
    let timeout = Duration::from_millis(config.connect_timeout_ms);
    let mut order: Vec<&Ingress> = ingress.iter().collect();
    order.shuffle(&mut rand::rng());
    let epoch = (traffic == ConnTraffic::ReadWrite)
        .then(|| views.writer(service).map(|w| w.epoch))
        .flatten();
    let preamble = crate::ingress::preamble(service, traffic, epoch);
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

impl Forward {
    /// One client connection: choose, connect (retrying elsewhere only
    /// before anything of the client's is read), then copy both ways. With
    /// no usable local endpoint, the service's policy may send it to
    /// another region's ingress (R9).
    async fn forward(self: Arc<Self>, mut client: TcpStream, peer: SocketAddr) {
        let service = self.view.key();
        let answer = match self.view.lookup(&self.views, now_ms()) {
            Lookup::CannotKnow(_) => self.views.lookup_wait(service).await,
            answer => answer,
        };
        // A write of a single-writer service whose writer is another
        // region never uses this region's endpoints.
        if let Some(decision) = self.views.writes_elsewhere(service, self.traffic, now_ms()) {
            let why = "the service's writes belong to another region";
            return self
                .elsewhere(&mut client, peer, decision, why, "they go nowhere")
                .await;
        }
        let local_failure = match answer {
            // READY endpoints here: they come first.
            Lookup::Serve(answer) if answer.selection.holds_ready() => {
                if self.local(&mut client, peer, &answer).await {
                    return;
                }
                "every endpoint tried failed to connect".to_owned()
            }
            // Only what protection or panic holds on a doubtful verdict: a
            // failover the policy allows comes first, those after.
            Lookup::Serve(answer) if !answer.selection.candidates.is_empty() => {
                if let Decision::Remote {
                    region, ingress, ..
                } = self.views.failover(service, self.traffic, now_ms())
                {
                    if self.remote(&mut client, peer, &region, &ingress).await {
                        return;
                    }
                }
                if self.local(&mut client, peer, &answer).await {
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
        let decision = self.views.failover(service, self.traffic, now_ms());
        self.elsewhere(&mut client, peer, decision, &local_failure, "no failover")
            .await;
    }

    /// Carries the connection where `decision` sends it, or closes it as
    /// no backend; `why` says why it left this region's endpoints, and
    /// `refused` introduces a refusal.
    async fn elsewhere(
        &self,
        client: &mut TcpStream,
        peer: SocketAddr,
        decision: Decision,
        why: &str,
        refused: &str,
    ) {
        match decision {
            Decision::Remote {
                region, ingress, ..
            } => {
                if !self.remote(client, peer, &region, &ingress).await {
                    self.no_backend(
                        peer,
                        &format!("{why}; region {region}'s ingress did not answer"),
                    );
                }
            }
            Decision::Refused(refusal) => {
                self.no_backend(peer, &format!("{why}; {refused}: {}", refusal.describe()))
            }
        }
    }

    /// Carries the connection to one of `answer`'s endpoints; false when
    /// every one tried failed to connect (nothing of the client's read).
    async fn local(&self, client: &mut TcpStream, peer: SocketAddr, answer: &Answer) -> bool {
        let service = self.view.key();
        let Some(mut upstream) = connect_local(&self.views, &self.view, answer).await else {
            return false;
        };
        let instance = &upstream.record.instance_id;
        tracing::debug!(service = %service, instance = %instance, peer = %peer, mode = answer.selection.mode.as_str(), "proxy connection open");
        let result = pipe(client, &mut upstream.stream).await;
        tracing::debug!(service = %service, instance = %instance, peer = %peer, result = ?result, "proxy connection closed");
        true
    }

    /// Carries the connection to `region`'s ingress; false when none of
    /// its addresses answered (nothing of the client's read).
    async fn remote(
        &self,
        client: &mut TcpStream,
        peer: SocketAddr,
        region: &Label,
        ingress: &[Ingress],
    ) -> bool {
        let service = self.view.key();
        let Some(mut remote) = connect_remote(&self.views, service, self.traffic, ingress).await
        else {
            return false;
        };
        tracing::debug!(service = %service, region = %region, peer = %peer, "proxy connection failed over to another region");
        let result = pipe(client, &mut remote).await;
        tracing::debug!(service = %service, region = %region, peer = %peer, result = ?result, "failed-over connection closed");
        true
    }

    /// Closes the client's connection (dropped by the caller) and counts it.
    fn no_backend(&self, peer: SocketAddr, reason: &str) {
        let service = self.view.key();
        self.views
            .metrics()
            .no_backend
            .get_or_create(&self.views.metrics().service_label(&service.to_string()))
            .inc();
        tracing::debug!(service = %service, peer = %peer, reason = %reason, "proxy has no backend; connection closed");
    }
}
