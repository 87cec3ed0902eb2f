//! The agent as its region's ingress gateway (R9): other regions' proxies
//! send connections of a service with no usable endpoint in their region
//! here, and the gateway forwards each to a READY endpoint of that service
//! in this region.
//!
//! Raw TCP carries no service name, so a failed-over connection opens with
//! one line, the preamble: `ROLLCALL-INGRESS/1 <namespace/service/port>
//! <read_only|read_write>[ writer-epoch=<n>]\n` (at most [`MAX_PREAMBLE`]
//! bytes; a proxy adds the writer epoch it holds to a write of a
//! single-writer service). The gateway
//! reads exactly that line, within `ingress.preamble_timeout_ms`, and
//! forwards everything after it unchanged. It admits a connection only
//! when the service's policy lets that traffic into this region (this
//! region is in its `failover_order`, outside its `data_boundary`, and a
//! read-write connection is allowed by `failover_traffic`, and, for a
//! single-writer service, this region is the settled writer of the epoch
//! it holds and of the epoch the preamble names), and it routes only to
//! local endpoints: a
//! gateway never fails over again, so connections cannot loop between
//! regions. Anything else closes the connection, counted in
//! `rollcall_agent_ingress_refused_total{reason}`.
//!
//! The ingress listener is not authenticated beyond what the network
//! allows: expose it only where other regions' agents can reach it (a
//! private inter-region network), as one would an edge gateway.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rollcall_config::{ConnTraffic, IngressConfig};
use rollcall_leases::clock::now_ms;
use rollcall_leases::ServiceKey;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::failover::Refusal;
use crate::forward::{accept_loop, connect_local, pipe};
use crate::metrics::RefusalLabel;
use crate::shutdown::Shutdown;
use crate::view::{Lookup, Views};

/// The first word of the preamble.
pub const MAGIC: &str = "ROLLCALL-INGRESS/1";

/// Longest preamble, newline included.
pub const MAX_PREAMBLE: usize = 320;

/// The preamble a proxy sends before a failed-over connection's bytes,
/// with the writer epoch it holds for a write of a single-writer service.
pub fn preamble(service: &ServiceKey, traffic: ConnTraffic, writer_epoch: Option<u64>) -> String {
    match writer_epoch {
        Some(epoch) => format!(
            "{MAGIC} {service} {} writer-epoch={epoch}\n",
            traffic.as_str()
        ),
        None => format!("{MAGIC} {service} {}\n", traffic.as_str()),
    }
}

/// What a preamble says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preamble {
    /// The service.
    pub service: ServiceKey,
    /// The connection's traffic class.
    pub traffic: ConnTraffic,
    /// The writer epoch the caller's proxy holds, when it sent one.
    pub writer_epoch: Option<u64>,
}

/// Why a preamble was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    /// Not the expected shape.
    #[error("the preamble must be \"{MAGIC} <namespace/service/port> <read_only|read_write> [writer-epoch=<n>]\" and a newline, at most {MAX_PREAMBLE} bytes: {0}")]
    Shape(String),
}

/// Parses one preamble line (without its newline).
pub fn parse_preamble(line: &str) -> Result<Preamble, PreambleError> {
    let bad = |what: &str| PreambleError::Shape(what.to_owned());
    let mut words = line.split(' ');
    if words.next() != Some(MAGIC) {
        return Err(bad("it does not start with the magic word"));
    }
    let service: ServiceKey = words
        .next()
        .ok_or_else(|| bad("the service is missing"))?
        .parse()
        .map_err(|e: rollcall_leases::NameError| bad(&e.to_string()))?;
    let traffic = words
        .next()
        .and_then(ConnTraffic::parse)
        .ok_or_else(|| bad("the traffic class is missing or unknown"))?;
    let writer_epoch = match words.next() {
        None => None,
        Some(word) => Some(
            word.strip_prefix("writer-epoch=")
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("the fourth word must be writer-epoch=<n>, n at least 1"))?,
        ),
    };
    if words.next().is_some() {
        return Err(bad("it has extra words"));
    }
    Ok(Preamble {
        service,
        traffic,
        writer_epoch,
    })
}

/// A running ingress gateway.
pub struct IngressHandle {
    /// The address it is bound to.
    pub local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl IngressHandle {
    /// Waits until the gateway stopped after the shutdown signal (open
    /// connections get the proxy's grace to finish).
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}

/// The gateway's listener, bound and not serving yet: the agent binds
/// every listener before it starts anything, so an address in use stops
/// it before anything ran.
pub struct BoundIngress {
    listener: TcpListener,
    /// The address it is bound to (the real port when asked for port 0).
    pub local_addr: SocketAddr,
}

/// Binds `listen` (`agent.ingress.listen`).
pub async fn bind(listen: SocketAddr) -> std::io::Result<BoundIngress> {
    let listener = TcpListener::bind(listen).await?;
    let local_addr = listener.local_addr()?;
    Ok(BoundIngress {
        listener,
        local_addr,
    })
}

/// Serves `bound` until the shutdown signal.
pub fn start(
    views: Views,
    bound: BoundIngress,
    config: IngressConfig,
    first_resolve_wait_ms: u64,
    shutdown: Shutdown,
) -> IngressHandle {
    let BoundIngress {
        listener,
        local_addr,
    } = bound;
    let gateway = Arc::new(Gateway {
        views,
        config,
        first_resolve_wait_ms,
    });
    let max_connections = gateway.config.max_connections;
    let views = gateway.views.clone();
    let task = tokio::spawn(accept_loop(
        listener,
        "ingress gateway".into(),
        move |client, peer| serve(gateway.clone(), client, peer),
        (max_connections, move |peer| {
            views
                .metrics()
                .ingress_refused_unnamed("too_many_connections");
            tracing::debug!(peer = %peer, max_connections, "ingress connection refused: too many open ([ingress] max_connections)");
        }),
        shutdown,
    ));
    tracing::info!(listen = %local_addr, "ingress gateway listening");
    IngressHandle { local_addr, task }
}

/// What every connection of the gateway shares.
struct Gateway {
    views: Views,
    config: IngressConfig,
    first_resolve_wait_ms: u64,
}

/// Reads the preamble line; what the client sent after it stays buffered.
async fn read_preamble(
    reader: &mut BufReader<TcpStream>,
    timeout: Duration,
) -> Result<String, String> {
    let mut line = Vec::with_capacity(96);
    let mut limited = (&mut *reader).take(MAX_PREAMBLE as u64);
    let read = limited.read_until(b'\n', &mut line);
    match tokio::time::timeout(timeout, read).await {
        Err(_) => return Err("no preamble within ingress.preamble_timeout_ms".into()),
        Ok(Err(e)) => return Err(format!("reading the preamble failed: {e}")),
        Ok(Ok(_)) => {}
    }
    if line.pop() != Some(b'\n') {
        return Err(format!("no newline within {MAX_PREAMBLE} bytes"));
    }
    String::from_utf8(line).map_err(|_| "the preamble is not UTF-8".into())
}

async fn serve(gateway: Arc<Gateway>, client: TcpStream, peer: SocketAddr) {
    let views = &gateway.views;
    let refuse = |service: &str, reason: &str, detail: &str| {
        views
            .metrics()
            .ingress_refused
            .get_or_create(&RefusalLabel {
                service: views.metrics().service_name(service),
                reason: reason.to_owned(),
            })
            .inc();
        tracing::debug!(peer = %peer, service, reason, detail, "ingress connection refused");
    };
    let timeout = Duration::from_millis(gateway.config.preamble_timeout_ms);
    let mut reader = BufReader::with_capacity(4096, client);
    let parsed = read_preamble(&mut reader, timeout)
        .await
        .and_then(|line| parse_preamble(&line).map_err(|e| e.to_string()));
    let Preamble {
        service,
        traffic,
        writer_epoch,
    } = match parsed {
        Ok(p) => p,
        Err(detail) => {
            views.metrics().ingress_refused_unnamed("bad_preamble");
            tracing::debug!(peer = %peer, detail, "ingress connection refused: bad preamble");
            return;
        }
    };
    let name = service.to_string();
    // The first connection of a service makes this agent follow it; its
    // policy arrives right behind its endpoints.
    let answer = views.lookup_wait(&service).await;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(gateway.first_resolve_wait_ms);
    let admitted = loop {
        match views.ingress_admits(&service, traffic, writer_epoch) {
            Err(Refusal::NoPolicy) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other,
        }
    };
    if let Err(refusal) = admitted {
        return refuse(&name, refusal.as_str(), refusal.describe());
    }
    let answer = match answer {
        Lookup::Serve(answer) if !answer.selection.candidates.is_empty() => answer,
        _ => match views.lookup(&service, now_ms()) {
            Lookup::Serve(answer) if !answer.selection.candidates.is_empty() => answer,
            _ => {
                return refuse(
                    &name,
                    "no_local_endpoint",
                    "no usable endpoint in this region",
                )
            }
        },
    };
    let view = views.service(&service);
    let Some(mut upstream) = connect_local(views, &view, &answer).await else {
        return refuse(
            &name,
            "no_local_endpoint",
            "every endpoint tried failed to connect",
        );
    };
    // Bytes the client sent right behind its preamble go first.
    let early = reader.buffer().to_vec();
    let mut client = reader.into_inner();
    if !early.is_empty() && upstream.stream.write_all(&early).await.is_err() {
        return;
    }
    views
        .metrics()
        .ingress_forwarded
        .get_or_create(&views.metrics().service_label(&name))
        .inc();
    let result = pipe(&mut client, &mut upstream.stream).await;
    tracing::debug!(peer = %peer, service = %name, instance = %upstream.record.instance_id, result = ?result, "ingress connection closed");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preambles_round_trip_and_bad_ones_are_named() {
        let key: ServiceKey = "shop/web/http".parse().unwrap();
        let line = preamble(&key, ConnTraffic::ReadOnly, None);
        assert_eq!(line, "ROLLCALL-INGRESS/1 shop/web/http read_only\n");
        assert_eq!(
            parse_preamble(line.trim_end()).unwrap(),
            Preamble {
                service: key.clone(),
                traffic: ConnTraffic::ReadOnly,
                writer_epoch: None
            }
        );
        let line = preamble(&key, ConnTraffic::ReadWrite, Some(3));
        assert_eq!(
            line,
            "ROLLCALL-INGRESS/1 shop/web/http read_write writer-epoch=3\n"
        );
        assert_eq!(
            parse_preamble(line.trim_end()).unwrap().writer_epoch,
            Some(3)
        );
        for bad in [
            "",
            "GET / HTTP/1.1",
            "ROLLCALL-INGRESS/1",
            "ROLLCALL-INGRESS/1 shop/web/http",
            "ROLLCALL-INGRESS/1 shop/web/http write",
            "ROLLCALL-INGRESS/1 Shop/web/http read_only",
            "ROLLCALL-INGRESS/1 shop/web/http read_only extra",
            "ROLLCALL-INGRESS/1 shop/web/http read_write writer-epoch=0",
            "ROLLCALL-INGRESS/1 shop/web/http read_write writer-epoch=x",
            "ROLLCALL-INGRESS/1 shop/web/http read_write writer-epoch=2 extra",
            "ROLLCALL-INGRESS/2 shop/web/http read_only",
        ] {
            assert!(parse_preamble(bad).is_err(), "{bad:?} accepted");
        }
    }
}
