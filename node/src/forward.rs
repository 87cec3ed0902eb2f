//! What the proxy and the ingress gateway share once a listener accepted
//! a connection: the accept loop with its shutdown grace, connecting to
//! one of a view's candidates (retrying elsewhere only before any byte of
//! the client's was read; failures and successes feed the view's local
//! ejection), and carrying bytes both ways (`relay`). It decides nothing about which
//! endpoints are usable: that is the view's.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rollcall_leases::clock::now_ms;
use rollcall_leases::{EndpointRecord, InstanceId, State};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::endpoints::Candidate;
use crate::shutdown::Shutdown;
use crate::view::{ActiveGuard, Answer, ServiceView, Views, DEGRADED_RETRIES};

/// How long connections still open at shutdown may go on, ms.
pub const SHUTDOWN_GRACE_MS: u64 = 1_000;

/// Accepts until the shutdown signal, then lets open connections finish
/// for `SHUTDOWN_GRACE_MS` (the proxy's and the ingress gateway's). The
/// connections' tasks live in a `JoinSet`, so dropping it ends those still
/// open. A connection beyond `max_connections` open ones is closed as soon
/// as it is accepted, and reported to `refused`.
pub(crate) async fn accept_loop<S, Fut>(
    listener: TcpListener,
    name: String,
    serve: S,
    (max_connections, refused): (usize, impl Fn(SocketAddr)),
    mut shutdown: Shutdown,
) where
    S: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, peer)) if connections.len() >= max_connections => {
                    drop(client);
                    refused(peer);
                }
                Ok((client, peer)) => {
                    connections.spawn(serve(client, peer));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off a little
                    // rather than spin.
                    tracing::warn!(listener = %name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.fired() => break,
        }
    }
    drop(listener);
    let grace = tokio::time::sleep(Duration::from_millis(SHUTDOWN_GRACE_MS));
    tokio::pin!(grace);
    while !connections.is_empty() {
        tokio::select! {
            _ = connections.join_next() => {}
            _ = &mut grace => break,
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
/// Failures and successes feed the view's local ejection.
pub(crate) async fn connect_local(
    views: &Views,
    view: &ServiceView,
    answer: &Answer,
) -> Option<Upstream> {
    let candidates = &answer.selection.candidates;
    let config = views.data_plane();
    let active = views.active();
    let service = view.key();
    let timeout = Duration::from_millis(config.connect_timeout_ms);
    let mut tried = BTreeSet::new();
    // A degraded copy's endpoints are tried twice at most: the evidence for
    // them is local and may be old.
    let retries = match answer.degraded {
        Some(_) => config.retries.min(DEGRADED_RETRIES),
        None => config.retries,
    };
    for _ in 0..=retries {
        let count = |id: &InstanceId| active.count(id);
        let i = crate::selector::choose(
            candidates,
            views.zone(),
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
                view.connect_succeeded(instance);
                let metrics = views.metrics();
                metrics.proxied_connections.inc();
                if answer.degraded.is_some() {
                    metrics.degraded_picks.inc();
                }
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
        view.connect_failed(views, instance, now_ms());
        rule_out(candidates, i, &mut tried);
    }
    None
}

/// After a failed connect to `candidates[failed]`, what this connection
/// does not try again: that instance and, while an instance of another
/// node is still untried, every instance of its node. A refused or
/// unanswered connect most often means the node is gone (crashed, cut
/// off), its other instances with it; a retry spent on one of them is a
/// connection failed that another node would have served. Only this
/// connection's choice changes: the node's other instances are not
/// marked as failed.
fn rule_out(candidates: &[Candidate], failed: usize, tried: &mut BTreeSet<InstanceId>) {
    let node = &candidates[failed].record.node_id;
    tried.insert(candidates[failed].record.instance_id.clone());
    let elsewhere = candidates
        .iter()
        .any(|c| c.record.node_id != *node && !tried.contains(&c.record.instance_id));
    if elsewhere {
        for c in candidates.iter().filter(|c| c.record.node_id == *node) {
            tried.insert(c.record.instance_id.clone());
        }
    }
}

/// Carries bytes both ways until both sides ended (`relay`: a copy for
/// small exchanges, splice for bulk on Linux). From here on bytes flow:
/// whatever happens, no retry.
pub(crate) async fn pipe(
    client: &mut TcpStream,
    backend: &mut TcpStream,
) -> std::io::Result<(u64, u64)> {
    let _ = client.set_nodelay(true);
    let _ = backend.set_nodelay(true);
    crate::relay::relay(client, backend).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A READY candidate of weight 1 (the view's tests' record).
    fn candidate(instance: &str, node: &str) -> Candidate {
        Candidate {
            record: crate::view::tests::record(instance, node),
            weight: 1.0,
        }
    }

    fn ids(tried: &BTreeSet<InstanceId>) -> Vec<&str> {
        tried.iter().map(|i| i.as_str()).collect()
    }

    #[test]
    fn a_failed_connect_rules_out_its_nodes_other_instances_while_another_node_is_left() {
        let candidates = [
            candidate("a-1", "node-a"),
            candidate("a-2", "node-a"),
            candidate("b-1", "node-b"),
        ];
        let mut tried = BTreeSet::new();
        rule_out(&candidates, 0, &mut tried);
        assert_eq!(ids(&tried), ["a-1", "a-2"]);
        // node-b failed too: nothing else is left, so only b-1 is added.
        rule_out(&candidates, 2, &mut tried);
        assert_eq!(ids(&tried), ["a-1", "a-2", "b-1"]);
    }

    #[test]
    fn with_one_node_left_its_other_instances_stay_tryable() {
        let candidates = [candidate("a-1", "node-a"), candidate("a-2", "node-a")];
        let mut tried = BTreeSet::new();
        rule_out(&candidates, 0, &mut tried);
        assert_eq!(ids(&tried), ["a-1"]);
    }
}
