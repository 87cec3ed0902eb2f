//! The running bridge (`rollcall bridge`): one QUIC endpoint that serves
//! this region's state to the peers that dial it and dials every peer to
//! receive theirs, a task that reads this region's arbiter every sync
//! interval, and the writes of what peers said into this region's arbiter.
//!
//! Thin: the publisher and subscriber state machines decide; this module
//! owns the sockets, timers and HTTP calls, and closes a connection with
//! the reason whenever a peer's certificate or message is refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollcall_config::{BridgeConfig, BridgePeer};
use rollcall_leases::clock::now_ms;
use rollcall_leases::codec::{write_frame, FrameError};
use rollcall_leases::protocol::close_code;
use rollcall_leases::shutdown::{self, Shutdown, Trigger};
use rollcall_leases::{Ingress, Label, PolicyKey, RemotePolicy, WriterEpoch};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::arbiter::{ArbiterApi, ArbiterError, Https};
use crate::codec::{self, CodecError};
use crate::error::BridgeError;
use crate::metrics::{Metrics, RegionLabel, UpdateLabel};
use crate::publisher::{Publisher, Session};
use crate::stats::{Stats, StatsSnapshot};
use crate::subscriber::{Received, Subscriber};
use crate::tls::{self, BridgeReload, BridgeTls, LiveBridgeTls, PeerCheck};

/// Longest wait for a peer's handshake, and for its `Hello` after it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reconnect backoff: full jitter up to `BACKOFF_BASE` doubled per failure
/// in a row, at most `BACKOFF_MAX`.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A session that lasted this long resets the backoff.
const STABLE_SESSION: Duration = Duration::from_secs(10);

/// How long `shutdown` waits for each task to end by itself.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// Closes `conn` with `code` and `reason` (cut to what a close frame holds).
fn close(conn: &quinn::Connection, code: u32, reason: &str) {
    let mut end = reason.len().min(1000);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    conn.close(quinn::VarInt::from_u32(code), &reason.as_bytes()[..end]);
}

/// What every task of one bridge shares.
struct Shared {
    region: Label,
    check: PeerCheck,
    api: ArbiterApi,
    publisher: Mutex<Publisher>,
    published: watch::Sender<u64>,
    stats: Arc<Stats>,
    metrics: Arc<Metrics>,
    max_age_ms: u64,
    /// The origin of the monotonic ms the subscribers count ages in.
    started: Instant,
    /// The bridge's stop signal.
    stopping: Shutdown,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// A running region bridge.
pub struct Bridge {
    /// The QUIC address peers dial.
    pub listen_addr: SocketAddr,
    /// Where `GET /metrics` is served, when `metrics_listen` is set.
    pub metrics_addr: Option<SocketAddr>,
    stats: Arc<Stats>,
    metrics: Arc<Metrics>,
    endpoint: quinn::Endpoint,
    reload: Arc<BridgeReload>,
    stop: Trigger,
    tasks: Vec<JoinHandle<()>>,
}

impl Bridge {
    /// Binds the QUIC listener and starts reading this region's arbiter,
    /// serving peers and dialling them.
    pub async fn start(config: BridgeConfig, tls: BridgeTls) -> Result<Bridge, BridgeError> {
        let region = Label::new(&config.region).map_err(|e| BridgeError::Config(e.to_string()))?;
        let ingress = config
            .ingress
            .iter()
            .map(|a| Ingress::new(a))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| BridgeError::Config(format!("bridge.ingress: {e}")))?;
        let token =
            rollcall_leases::secret::read_token(&config.arbiter.token_file).map_err(|source| {
                BridgeError::Token {
                    path: config.arbiter.token_file.clone(),
                    source,
                }
            })?;
        let live = Arc::new(LiveBridgeTls::new(&tls)?);
        let endpoint =
            quinn::Endpoint::server(live.server_config()?, config.listen).map_err(|source| {
                BridgeError::Io {
                    what: format!("binding the bridge listener {}", config.listen),
                    source,
                }
            })?;
        let listen_addr = endpoint.local_addr().map_err(|source| BridgeError::Io {
            what: "reading the bridge listener address".to_owned(),
            source,
        })?;
        let mut dials = Vec::with_capacity(config.peers.len());
        for peer in &config.peers {
            let peer_region =
                Label::new(&peer.region).map_err(|e| BridgeError::Config(e.to_string()))?;
            let client = live.client_config(&peer_region)?;
            dials.push((peer.clone(), peer_region, client));
        }
        let stats = Arc::new(Stats::default());
        let metrics = Arc::new(Metrics::new());
        let (stop, stopping) = shutdown::channel();
        let shared = Arc::new(Shared {
            metrics: metrics.clone(),
            check: PeerCheck::new(live.clone(), region.clone()),
            api: ArbiterApi::new(
                config.arbiter.admin.clone(),
                token,
                region.clone(),
                config
                    .arbiter
                    .https
                    .then(|| Https::new(live.arbiter_config(), region.clone())),
            ),
            publisher: Mutex::new(Publisher::new(region.clone(), ingress)),
            published: watch::channel(0).0,
            stats: stats.clone(),
            max_age_ms: config.summary_max_age_ms,
            started: Instant::now(),
            region: region.clone(),
            stopping: stopping.clone(),
        });
        let mut tasks = vec![
            tokio::spawn(observe_loop(
                shared.clone(),
                Duration::from_millis(config.sync_interval_ms),
            )),
            tokio::spawn(accept_loop(endpoint.clone(), shared.clone())),
        ];
        let metrics_addr = match config.metrics_listen {
            Some(listen) => {
                let listener = tokio::net::TcpListener::bind(listen)
                    .await
                    .map_err(|source| BridgeError::Io {
                        what: format!(
                            "binding the metrics listener {listen} (bridge.metrics_listen)"
                        ),
                        source,
                    })?;
                let addr = listener.local_addr().map_err(|source| BridgeError::Io {
                    what: "reading the metrics listener address".to_owned(),
                    source,
                })?;
                let (served, certificates) = (metrics.clone(), live.clone());
                let app = axum::Router::new().route(
                    "/metrics",
                    axum::routing::get(move || {
                        let metrics = served.clone();
                        let status = certificates.status();
                        async move {
                            (
                                [(
                                    axum::http::header::CONTENT_TYPE,
                                    "text/plain; version=0.0.4; charset=utf-8",
                                )],
                                metrics.render(&status),
                            )
                        }
                    }),
                );
                let mut stopping = stopping.clone();
                tasks.push(tokio::spawn(async move {
                    let serve = axum::serve(listener, app)
                        .with_graceful_shutdown(async move { stopping.fired().await });
                    if let Err(e) = serve.await {
                        tracing::error!(error = %e, "bridge metrics endpoint stopped");
                    }
                }));
                Some(addr)
            }
            None => None,
        };
        for (peer, peer_region, client) in dials {
            tasks.push(tokio::spawn(dial_loop(
                endpoint.clone(),
                client,
                peer,
                peer_region,
                shared.clone(),
            )));
        }
        tracing::info!(region = %region, listen = %listen_addr, peers = config.peers.len(), "bridge serving");
        Ok(Bridge {
            listen_addr,
            metrics_addr,
            stats,
            metrics,
            endpoint,
            reload: Arc::new(BridgeReload { config, live }),
            stop,
            tasks,
        })
    }

    /// `GET /metrics`: the Prometheus text exposition.
    pub fn metrics_text(&self) -> String {
        self.metrics.render(&self.reload.live.status())
    }

    /// What reloads this bridge's TLS material from its config's files
    /// (`[tls]` and every `[[peers]] ca`), for a `tls::Watcher`: new
    /// handshakes use the reloaded material, sessions keep theirs.
    pub fn tls_reload(&self) -> Arc<BridgeReload> {
        self.reload.clone()
    }

    /// What this bridge has sent and received so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Stops through one signal (Ctrl-C / SIGTERM in the binary): the
    /// arbiter is no longer read, no peer is accepted or dialled again,
    /// every session is closed with a reason, and each task ends by
    /// itself (one that overruns a bound is abandoned with a warning).
    pub async fn shutdown(self) {
        // Every connection first, so each peer reads the reason; then the
        // loops end.
        self.endpoint.close(
            quinn::VarInt::from_u32(close_code::DONE),
            b"bridge shutting down",
        );
        self.stop.fire();
        for task in self.tasks {
            let mut task = task;
            if tokio::time::timeout(SHUTDOWN_BOUND, &mut task)
                .await
                .is_err()
            {
                tracing::warn!(
                    bound_ms = SHUTDOWN_BOUND.as_millis() as u64,
                    "a bridge task did not stop within its bound; abandoned"
                );
                task.abort();
                let _ = task.await;
            }
        }
        self.endpoint.wait_idle().await;
        tracing::info!("bridge stopped");
    }
}

/// Reads this region's arbiter every `interval` and hands the result to
/// the publisher; every session then sends what changed, or a
/// confirmation.
async fn observe_loop(shared: Arc<Shared>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let mut stopping = shared.stopping.clone();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopping.fired() => return,
        }
        match shared.api.observe().await {
            Ok(observation) => {
                let version = observation.version;
                shared
                    .publisher
                    .lock()
                    .expect("publisher lock")
                    .observe(observation, now_ms());
                shared.published.send_modify(|n| *n += 1);
                if failing {
                    tracing::info!(revision = %version, "this region's arbiter answers again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read this region's arbiter; peers keep the last view this bridge sent, ageing");
                    failing = true;
                }
            }
        }
    }
}

async fn accept_loop(endpoint: quinn::Endpoint, shared: Arc<Shared>) {
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(serve_peer(incoming, shared.clone()));
    }
}

/// One peer that dialled this bridge: authenticate it, read its `Hello`,
/// then send it this region's state for as long as it stays.
async fn serve_peer(incoming: quinn::Incoming, shared: Arc<Shared>) {
    let conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, incoming).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "bridge handshake failed");
            return;
        }
        Err(_) => return,
    };
    let remote = conn.remote_address();
    let identity = match shared.check.accepted(&conn) {
        Ok(identity) => identity,
        Err(reason) => {
            tracing::warn!(%remote, %reason, "peer refused");
            shared.stats.refused();
            shared.metrics.refused_peers.inc();
            close(&conn, close_code::UNAUTHENTICATED, &reason);
            return;
        }
    };
    let protocol_error = |reason: &str| {
        tracing::warn!(%remote, peer = %identity, %reason, "peer closed for a bad message");
        shared.stats.protocol_error();
        shared.metrics.protocol_errors.inc();
        close(&conn, close_code::PROTOCOL, reason);
    };
    let (send, mut recv) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.accept_bi()).await {
        Ok(Ok(streams)) => streams,
        Ok(Err(_)) => return,
        Err(_) => return protocol_error("no session stream within 5 s of the handshake"),
    };
    let hello = match tokio::time::timeout(HANDSHAKE_TIMEOUT, codec::read_hello(&mut recv)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(e)) => return protocol_error(&e.to_string()),
        Err(_) => return protocol_error("no hello within 5 s of the session stream"),
    };
    if hello.region != identity.region {
        return protocol_error(&format!(
            "hello names region {} but the certificate region {}",
            hello.region, identity.region
        ));
    }
    shared.stats.session();
    shared.metrics.sessions_active.inc();
    tracing::info!(peer = %identity, have = ?hello.have.map(|r| r.0), "peer subscribed");
    tokio::select! {
        _ = publish(&conn, &shared, &identity, hello.have, send, &mut recv) => {}
        reason = rollcall_leases::tls::peer_certificate_expired(&conn) => {
            tracing::warn!(peer = %identity, %reason, "closing a peer session: its certificate expired");
            close(&conn, close_code::UNAUTHENTICATED, &reason);
        }
        reason = shared.check.revoked(&conn) => {
            tracing::warn!(target: "rollcall::audit", peer = %identity, %reason, "closing a peer bridge's session: its certificate was revoked");
            close(&conn, close_code::UNAUTHENTICATED, &reason);
        }
    }
    shared.stats.session_ended();
    shared.metrics.sessions_active.dec();
    tracing::info!(peer = %identity, reason = ?conn.close_reason(), "peer left");
}

/// Sends one subscribed peer this region's state: its first update, then
/// one per observation, until it leaves or says something.
async fn publish(
    conn: &quinn::Connection,
    shared: &Shared,
    identity: &rollcall_leases::identity::Identity,
    have: Option<rollcall_leases::Revision>,
    mut send: quinn::SendStream,
    recv: &mut quinn::RecvStream,
) {
    let mut session = Session::new(have);
    let mut published = shared.published.subscribe();
    loop {
        let update = shared
            .publisher
            .lock()
            .expect("publisher lock")
            .update_for(&mut session);
        if let Some(update) = update {
            let bytes = codec::encode_update(&update);
            if write_frame(&mut send, &bytes).await.is_err() {
                break;
            }
            shared.stats.sent(&update, bytes.len());
            let region = identity.region.to_string();
            shared
                .metrics
                .updates_sent
                .get_or_create(&UpdateLabel {
                    region: region.clone(),
                    kind: if update.full { "full" } else { "delta" },
                })
                .inc();
            shared
                .metrics
                .bytes_sent
                .get_or_create(&RegionLabel { region })
                .inc_by(bytes.len() as u64);
            tracing::debug!(peer = %identity, full = update.full, version = %update.version, items = update.items(), "update sent");
        }
        tokio::select! {
            changed = published.changed() => if changed.is_err() { break },
            _ = conn.closed() => break,
            // A subscriber says nothing after its hello: anything it sends
            // is a protocol error.
            extra = codec::read_hello(&mut *recv) => {
                let gone = matches!(
                    extra,
                    Err(CodecError::Frame { source: FrameError::Closed | FrameError::Io(_), .. })
                );
                if !gone {
                    let reason = "a subscriber sends nothing after its hello";
                    tracing::warn!(peer = %identity, reason, "peer closed for a bad message");
                    shared.stats.protocol_error();
                    shared.metrics.protocol_errors.inc();
                    close(conn, close_code::PROTOCOL, reason);
                }
                break;
            }
        }
    }
}

/// Keeps a subscription to one peer region: sync, and after it ends wait
/// (exponential backoff with full jitter) and sync again.
async fn dial_loop(
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    peer: BridgePeer,
    region: Label,
    shared: Arc<Shared>,
) {
    let mut failures = 0u32;
    // Policies this region's arbiter refused (a home conflict), offered
    // again with every update until accepted or superseded.
    let mut pending: Vec<RemotePolicy> = Vec::new();
    let mut stopping = shared.stopping.clone();
    loop {
        let started = Instant::now();
        let ended = tokio::select! {
            ended = sync_once(&endpoint, &client, &peer, &region, &shared, &mut pending) => ended,
            _ = stopping.fired() => return,
        };
        tracing::info!(peer = %region, address = %peer.address, reason = %ended, "subscription ended; reconnecting");
        if started.elapsed() >= STABLE_SESSION {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        let cap = BACKOFF_BASE
            .saturating_mul(1 << failures.min(16))
            .min(BACKOFF_MAX)
            .as_millis() as u64;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(rand::random_range(0..=cap))) => {}
            _ = stopping.fired() => return,
        }
    }
}

/// One subscription to a peer region, from loading what this region holds
/// of it to the connection's end; answers why it ended.
async fn sync_once(
    endpoint: &quinn::Endpoint,
    client: &quinn::ClientConfig,
    peer: &BridgePeer,
    region: &Label,
    shared: &Shared,
    pending: &mut Vec<RemotePolicy>,
) -> String {
    let (view, policies) = match shared.api.load(region).await {
        Ok(held) => held,
        Err(e) => return format!("cannot read what this region holds of {region}: {e}"),
    };
    let mut subscriber = Subscriber::new(shared.region.clone(), region.clone(), view, policies);
    let conn = match connect(endpoint, client, &peer.address).await {
        Ok(conn) => conn,
        Err(e) => return e,
    };
    if let Err(reason) = tls::dialed(&conn, region) {
        shared.stats.refused();
        shared.metrics.refused_peers.inc();
        close(&conn, close_code::UNAUTHENTICATED, &reason);
        return reason;
    }
    let (mut send, mut recv) = match conn.open_bi().await {
        Ok(streams) => streams,
        Err(e) => return format!("opening the session stream: {e}"),
    };
    let hello = subscriber.hello();
    if let Err(e) = write_frame(&mut send, &codec::encode_hello(&hello)).await {
        return format!("sending hello: {e}");
    }
    tracing::info!(peer = %region, have = ?hello.have.map(|r| r.0), "subscribed");
    // The writer epochs this session offered, by service: each update
    // carries them whole, and only a change is worth a Raft write.
    let mut forwarded: BTreeMap<PolicyKey, WriterEpoch> = BTreeMap::new();
    loop {
        let read = tokio::select! {
            read = codec::read_update_sized(&mut recv) => read,
            reason = rollcall_leases::tls::peer_certificate_expired(&conn) => {
                close(&conn, close_code::UNAUTHENTICATED, &reason);
                return reason;
            }
            reason = shared.check.revoked(&conn) => {
                tracing::warn!(target: "rollcall::audit", peer = %region, %reason, "closing the session with a peer bridge: its certificate was revoked");
                close(&conn, close_code::UNAUTHENTICATED, &reason);
                return reason;
            }
        };
        let (update, size) = match read {
            Ok(read) => read,
            Err(CodecError::Frame {
                source: FrameError::Closed | FrameError::Io(_),
                ..
            }) => {
                return match conn.close_reason() {
                    Some(reason) => format!("connection closed: {reason}"),
                    None => "the peer ended the session stream".to_owned(),
                }
            }
            Err(e) => return refuse(&conn, shared, e.to_string()),
        };
        let now = shared.now_ms();
        let as_of_ms = update.as_of_ms;
        let mut update = update;
        let writers = std::mem::take(&mut update.writers);
        let received = match subscriber.receive(update, now) {
            Ok(received) => received,
            Err(e) => return refuse(&conn, shared, e.to_string()),
        };
        shared.stats.received(received.full, received.items);
        let m = &shared.metrics;
        let label = RegionLabel {
            region: region.to_string(),
        };
        m.updates_received
            .get_or_create(&UpdateLabel {
                region: label.region.clone(),
                kind: if received.full { "full" } else { "delta" },
            })
            .inc();
        m.bytes_received.get_or_create(&label).inc_by(size as u64);
        if let Some(top) = received
            .upserted
            .iter()
            .map(|p| p.home_revision.get())
            .max()
        {
            let gauge = m.policy_revision.get_or_create(&label);
            gauge.set(gauge.get().max(top as i64));
        }
        if let Err(e) = carry_writers(shared, region, writers, &mut forwarded).await {
            let reason = format!("this region's arbiter: {e}");
            close(&conn, close_code::DONE, &reason);
            return reason;
        }
        if let Err(e) = carry(shared, region, &subscriber, received, pending, now).await {
            let reason = format!("this region's arbiter: {e}");
            close(&conn, close_code::DONE, &reason);
            return reason;
        }
        m.heard(region);
        m.sync_lag
            .get_or_create(&label)
            .set(now_ms().saturating_sub(as_of_ms) as f64 / 1000.0);
    }
}

/// Closes a connection whose peer sent a bad message; answers the reason.
fn refuse(conn: &quinn::Connection, shared: &Shared, reason: String) -> String {
    tracing::warn!(remote = %conn.remote_address(), %reason, "peer closed for a bad message");
    shared.stats.protocol_error();
    shared.metrics.protocol_errors.inc();
    close(conn, close_code::PROTOCOL, &reason);
    reason
}

async fn connect(
    endpoint: &quinn::Endpoint,
    client: &quinn::ClientConfig,
    address: &str,
) -> Result<quinn::Connection, String> {
    let host = address
        .rsplit_once(':')
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .ok_or_else(|| format!("{address} is not host:port"))?;
    let socket = tokio::net::lookup_host(address)
        .await
        .map_err(|e| format!("resolving {address}: {e}"))?
        .next()
        .ok_or_else(|| format!("{address} resolves to no address"))?;
    let connecting = endpoint
        .connect_with(client.clone(), socket, host)
        .map_err(|e| format!("connecting to {address}: {e}"))?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!("connecting to {address}: {e}")),
        Err(_) => Err(format!("no handshake with {address} within 5 s")),
    }
}

/// Offers this region's arbiter the writer epochs of a peer's update that
/// changed since this session last offered them; the arbiter stores only
/// those newer than what it holds (epochs never go back).
async fn carry_writers(
    shared: &Shared,
    region: &Label,
    writers: Vec<WriterEpoch>,
    forwarded: &mut BTreeMap<PolicyKey, WriterEpoch>,
) -> Result<(), ArbiterError> {
    let fresh: Vec<WriterEpoch> = writers
        .into_iter()
        .filter(|w| forwarded.get(&w.service) != Some(w))
        .collect();
    if fresh.is_empty() {
        return Ok(());
    }
    shared.api.store_writers(&fresh).await?;
    for w in fresh {
        tracing::info!(peer = %region, service = %w.service, epoch = w.epoch, owner = %w.owner, settled = w.settled, "writer epoch offered to this region's arbiter");
        forwarded.insert(w.service.clone(), w);
    }
    Ok(())
}

/// Carries an accepted update into this region's arbiter: policies first,
/// then the view (whole when it changed, else a confirmation), so the view
/// never names a version whose policies are not stored.
async fn carry(
    shared: &Shared,
    region: &Label,
    subscriber: &Subscriber,
    received: Received,
    pending: &mut Vec<RemotePolicy>,
    now: u64,
) -> Result<(), ArbiterError> {
    let mut offer = received.upserted;
    pending.retain(|p| {
        !offer.iter().any(|o| o.policy.key() == p.policy.key())
            && !received.removed.iter().any(|(k, _)| k == p.policy.key())
    });
    offer.append(pending);
    if !offer.is_empty() || !received.removed.is_empty() {
        let refused = shared
            .api
            .store_policies(region, &offer, &received.removed)
            .await?;
        for (service, detail) in &refused {
            tracing::warn!(peer = %region, %service, %detail, "this region's arbiter refused a replicated policy; offering it again with the next update");
        }
        *pending = offer
            .into_iter()
            .filter(|p| {
                refused
                    .iter()
                    .any(|(s, _)| *s == p.policy.key().to_string())
            })
            .collect();
    }
    let view = subscriber
        .view()
        .expect("a subscriber that accepted an update holds a view");
    let heard = subscriber.heard_ms_ago(now);
    if received.view_changed {
        shared.api.put_view(view, heard, shared.max_age_ms).await
    } else {
        shared.api.confirm(view, heard, shared.max_age_ms).await
    }
}
