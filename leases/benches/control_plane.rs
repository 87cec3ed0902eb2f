//! Issue 3 benchmark (not a test): an arbiter on loopback with 200 agent
//! clients in this process, each on its own QUIC connection and subscribed
//! to 20 of 2,000 services.
//!
//! Each client behaves on its session as a node agent does
//! (`node/src/sync.rs`): it keeps one verified view per service, applies
//! deltas on top of it and snapshots in place of it, acknowledges every
//! revision it applied (snapshots included: the arbiter re-sends what is
//! not acknowledged), asks for a snapshot on a gap, subscribes again after
//! a `RetryAfter` without blocking its reader, and sends keep-alives and
//! renewals at the agent's default cadence (500 ms, ttl / 3).
//!
//! Measured:
//! - change latency for a lone change and under a 500 changes/s stream:
//!   from the writer's Committed answer (the arbiter answers right after
//!   the fsync, just before fanning out) to each subscribed agent's view
//!   holding the revision (by delta or by snapshot); also from the write's
//!   submission (adds the fsync). Every subscriber of a changed service
//!   must hold each change: one that does not is reported as undelivered;
//! - committed transitions per second, durable (fsync on every group
//!   commit), with 64 concurrent writers;
//! - deliveries per second and bytes per second to the agents meanwhile;
//! - issue 20's flood (on a second arbiter, with the `[limits]`
//!   defaults; the first lifts the per-connection request limit, since its
//!   one writer carries every change): one identity writes its own
//!   instances as fast as it can on 4 connections with 32 requests in
//!   flight each, and opens new sessions of its node back to back (8 at a time), while
//!   the writer makes lone changes: their Committed answer -> applied at
//!   every subscribed agent, against the 3 s leave budget, and what the
//!   flood got through (writes committed and refused, sessions, limit hits).
//!
//! Run: `cargo bench -p rollcall-leases --bench control_plane`.
//! `cargo test` runs it as a smoke test instead (no `--bench` argument):
//! 8 agents, 40 services, about 5 s of load (2 s of it the flood), and it
//! fails unless every change reached every subscriber and every figure
//! has its samples. It asserts no timing.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollcall_config::{AgentConfig, ArbiterConfig};
use rollcall_leases::client::{ArbiterClient, ArbiterConn, SessionReader, SessionWriter};
use rollcall_leases::codec::{decode_service_snapshot, encode_session_down};
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{
    RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp,
};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, Generation, InstanceId, Label, NodeId, PrincipalName, Reason, Registration,
    Revision, Role, ServiceKey, ServiceView, ShardId, State, Version, Weight,
};

/// How big a run is.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    agents: usize,
    services: usize,
    subs_per_agent: usize,
    lone_changes: usize,
    stream_changes: usize,
    stream_interval_us: u64,
    throughput_s: u64,
    writers: &'static [usize],
}

const FULL: Sizes = Sizes {
    agents: 200,
    services: 2_000,
    subs_per_agent: 20,
    lone_changes: 300,
    stream_changes: 5_000,
    stream_interval_us: 2_000,
    throughput_s: 5,
    writers: &[64, 256],
};

/// The `cargo test` run: small, and judged on delivery, not on time.
const SMOKE: Sizes = Sizes {
    agents: 8,
    services: 40,
    subs_per_agent: 5,
    lone_changes: 20,
    stream_changes: 200,
    stream_interval_us: 5_000,
    throughput_s: 1,
    writers: &[16],
};

fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        role,
        PrincipalName::new(name).unwrap(),
    );
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

fn service(i: usize) -> ServiceKey {
    ServiceKey::new("default", &format!("svc-{i:04}"), "http").unwrap()
}

fn instance(i: usize) -> InstanceId {
    InstanceId::new(&format!("svc-{i:04}-7d9f8b6c4-x2k9p")).unwrap()
}

/// Every revision each agent's view of each service reached, and when.
type Progress = Arc<Mutex<HashMap<(usize, ServiceKey), Vec<(Revision, Instant)>>>>;

#[derive(Default)]
struct Counters {
    deltas: AtomicU64,
    bytes: AtomicU64,
    snapshots: AtomicU64,
    retries: AtomicU64,
}

async fn transition(conn: &ArbiterConn, i: usize, to: State) -> Option<Revision> {
    let request = Request::Transition {
        instance_id: instance(i),
        generation: Generation(1),
        to,
        reason: Reason::new("bench").unwrap(),
    };
    match conn.request(&request).await.unwrap() {
        Response::Committed { revision, .. } => revision,
        other => panic!("{other:?}"),
    }
}

/// Flips instance `i` between READY and UNHEALTHY.
fn next_state(flips: &Mutex<HashMap<usize, bool>>, i: usize) -> State {
    let mut f = flips.lock().unwrap();
    let up = f.entry(i).or_insert(true);
    *up = !*up;
    if *up {
        State::Ready
    } else {
        State::Unhealthy
    }
}

/// One committed change: which service, which revision, when it was
/// submitted and when its Committed answer came.
struct Change {
    service: usize,
    revision: Revision,
    submitted: Instant,
    committed: Instant,
}

/// Who follows what.
struct Followers {
    by_service: Vec<Vec<usize>>,
}

/// Judges one phase: every subscriber of a changed service must hold the
/// change (by delta or snapshot); returns how many did not.
async fn measure_latency(
    name: &str,
    changes: &[Change],
    followers: &Followers,
    progress: &Progress,
) -> usize {
    // Give the last deliveries time to land (and one re-send of a lost one).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let progress = progress.lock().unwrap();
    let mut from_commit = Vec::new();
    let mut from_submit = Vec::new();
    let mut undelivered = 0;
    let mut unseen = 0;
    for change in changes {
        let key = service(change.service);
        let mut seen = false;
        for &agent in &followers.by_service[change.service] {
            let reached = progress.get(&(agent, key.clone())).and_then(|steps| {
                let at = steps.partition_point(|(rev, _)| *rev < change.revision);
                steps.get(at).map(|(_, t)| *t)
            });
            let Some(t) = reached else {
                undelivered += 1;
                continue;
            };
            seen = true;
            from_commit.push(t.saturating_duration_since(change.committed).as_secs_f64() * 1e3);
            from_submit.push(t.saturating_duration_since(change.submitted).as_secs_f64() * 1e3);
        }
        unseen += usize::from(!seen);
    }
    let expected: usize = changes
        .iter()
        .map(|c| followers.by_service[c.service].len())
        .sum();
    println!(
        "{name}: {} changes, {expected} (change, subscriber) deliveries due, {undelivered} missing, {unseen} changes reached no subscriber",
        changes.len()
    );
    support::expect_samples(name, from_commit.len() + undelivered, expected);
    support::report(
        &format!("{name}: Committed answer -> applied at a subscribed agent"),
        from_commit,
        "ms",
        2,
    );
    support::report(
        &format!("{name}: write submitted -> applied at a subscribed agent"),
        from_submit,
        "ms",
        2,
    );
    undelivered
}

fn main() {
    rollcall_leases::tls::install_crypto_provider();
    support::announce("control_plane");
    let sizes = if support::full_run() { FULL } else { SMOKE };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let undelivered = runtime.block_on(run(sizes));
    assert_eq!(
        undelivered, 0,
        "{undelivered} (change, subscriber) deliveries never reached the subscriber's view"
    );
}

/// One agent's session loop, as `node/src/sync.rs` and the agent's session
/// task behave (see the module doc).
struct BenchAgent {
    index: usize,
    writer: SessionWriter,
    views: HashMap<ServiceKey, Option<ServiceView>>,
    /// Subscriptions to send again, by when.
    retries: BTreeMap<Instant, Vec<ServiceKey>>,
    progress: Progress,
    counters: Arc<Counters>,
}

impl BenchAgent {
    async fn run(mut self, mut inbox: tokio::sync::mpsc::UnboundedReceiver<SessionDown>) {
        let agent = AgentConfig::default();
        let renew_every = ArbiterConfig::default().lease.ttl_ms / 3;
        let mut keepalive = tokio::time::interval(Duration::from_millis(agent.keepalive_ms));
        let mut renew = tokio::time::interval(Duration::from_millis(renew_every));
        loop {
            let retry_at = self.retries.keys().next().copied();
            let sent = tokio::select! {
                msg = inbox.recv() => match msg {
                    Some(msg) => self.receive(msg).await,
                    None => return,
                },
                _ = keepalive.tick() => self.writer.send(&SessionUp::Keepalive).await,
                _ = renew.tick() => self.writer.send(&SessionUp::Renew).await,
                _ = sleep_until_some(retry_at) => self.retry_due().await,
            };
            if sent.is_err() {
                return;
            }
        }
    }

    async fn receive(
        &mut self,
        msg: SessionDown,
    ) -> Result<(), rollcall_leases::client::ClientError> {
        let now = Instant::now();
        self.counters.bytes.fetch_add(
            encode_session_down(&msg).len() as u64 + 4,
            Ordering::Relaxed,
        );
        let SessionDown::Update(items) = msg else {
            return Ok(());
        };
        for item in items {
            let up = match item {
                ServiceUpdate::Deltas(deltas) => {
                    self.counters
                        .deltas
                        .fetch_add(deltas.len() as u64, Ordering::Relaxed);
                    let Some(key) = deltas.first().map(|d| d.service.clone()) else {
                        continue;
                    };
                    let Some(slot) = self.views.get_mut(&key) else {
                        continue;
                    };
                    let view =
                        slot.get_or_insert_with(|| ServiceView::empty(key.clone(), ShardId(0)));
                    let held = view.revision();
                    let gap = deltas
                        .iter()
                        .filter(|d| d.revision > held)
                        .any(|d| view.apply(d).is_err());
                    if gap {
                        *slot = None;
                        SessionUp::Subscribe {
                            shard: ShardId(0),
                            service: key,
                            have: None,
                        }
                    } else {
                        let revision = view.revision();
                        self.applied(&key, revision, now);
                        SessionUp::Ack {
                            service: key,
                            revision,
                        }
                    }
                }
                ServiceUpdate::Snapshot(bytes) => {
                    self.counters.snapshots.fetch_add(1, Ordering::Relaxed);
                    let snap = decode_service_snapshot(&bytes).expect("a snapshot decodes");
                    let view = ServiceView::from_snapshot(&snap).expect("a snapshot checks");
                    let (key, revision) = (snap.service, view.revision());
                    self.views.insert(key.clone(), Some(view));
                    self.applied(&key, revision, now);
                    SessionUp::Ack {
                        service: key,
                        revision,
                    }
                }
                ServiceUpdate::RetryAfter { service, ms } => {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    self.retries
                        .entry(now + Duration::from_millis(ms))
                        .or_default()
                        .push(service);
                    continue;
                }
                _ => continue,
            };
            self.writer.send(&up).await?;
        }
        Ok(())
    }

    /// Notes that the view of `service` now holds `revision`.
    fn applied(&self, service: &ServiceKey, revision: Revision, at: Instant) {
        let mut progress = self.progress.lock().unwrap();
        let steps = progress.entry((self.index, service.clone())).or_default();
        if steps.last().is_none_or(|(rev, _)| *rev < revision) {
            steps.push((revision, at));
        }
    }

    async fn retry_due(&mut self) -> Result<(), rollcall_leases::client::ClientError> {
        let later = self
            .retries
            .split_off(&(Instant::now() + Duration::from_nanos(1)));
        let due = std::mem::replace(&mut self.retries, later);
        for service in due.into_values().flatten() {
            let have = self
                .views
                .get(&service)
                .and_then(|v| v.as_ref())
                .map(|v| v.revision());
            self.writer
                .send(&SessionUp::Subscribe {
                    shard: ShardId(0),
                    service,
                    have,
                })
                .await?;
        }
        Ok(())
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Reads the session stream into a channel, so the agent's loop never
/// waits on a half-read frame.
fn read_into(mut reader: SessionReader) -> tokio::sync::mpsc::UnboundedReceiver<SessionDown> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(msg) = reader.next().await {
            if tx.send(msg).is_err() {
                return;
            }
        }
    });
    rx
}

/// An arbiter, a writer holding a lease with one instance per service,
/// and the agents, each subscribed to its pick of the services and holding
/// a view of each.
struct Cluster {
    server: ArbiterServer,
    addr: String,
    ca: Ca,
    /// The writer's connection (its session is kept alive by a task).
    conn: ArbiterConn,
    followers: Followers,
    watched: Vec<usize>,
    progress: Progress,
    counters: Arc<Counters>,
    /// The agents' clients and connections, held open.
    keep: Vec<(ArbiterClient, ArbiterConn)>,
    _dir: tempfile::TempDir,
}

/// A welcomed session of node `node` on `client`; the reader goes to a
/// `BenchAgent`.
async fn open_session(
    client: &ArbiterClient,
    addr: &str,
    node: &str,
) -> Result<(ArbiterConn, SessionWriter, SessionReader), String> {
    let conn = client.connect(addr).await.map_err(|e| e.to_string())?;
    let hello = SessionUp::Hello {
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(1),
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (w, mut r) = conn.open_session(&hello).await.map_err(|e| e.to_string())?;
    match r.next().await.map_err(|e| e.to_string())? {
        SessionDown::Welcome { .. } => Ok((conn, w, r)),
        other => Err(format!("expected Welcome, got {other:?}")),
    }
}

/// A READY registration of `instance` of `service` on node `node` (its
/// agent run 1) at `address`.
fn registration(
    instance: InstanceId,
    service: ServiceKey,
    node: &str,
    address: Ipv4Addr,
) -> Registration {
    Registration {
        instance_id: instance,
        service,
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(address),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    }
}

/// Sends `request` until it is not refused as unavailable (over a rate
/// limit: an agent keeps such a write pending and retries), bounded.
async fn request_until_taken(conn: &ArbiterConn, request: &Request) -> Response {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match conn.request(request).await.unwrap() {
            Response::Rejected {
                kind: RejectKind::Unavailable,
                message,
            } => {
                assert!(
                    Instant::now() < deadline,
                    "still refused after 60 s: {message}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

impl Cluster {
    async fn start(sizes: Sizes, tune: impl FnOnce(&mut ArbiterConfig)) -> Cluster {
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut config = ArbiterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join("arbiter"),
            // Tests register addresses no node declared.
            registration: rollcall_config::RegistrationConfig {
                addresses: rollcall_config::AddressRule::Any,
                ..Default::default()
            },
            ..ArbiterConfig::default()
        };
        tune(&mut config);
        let server = ArbiterServer::start(config, &material(&ca, Role::Arbiter, "arbiter-1"))
            .await
            .unwrap();
        let addr = server.quic_addr.to_string();
        println!("durability: every group commit is one redb write transaction with immediate durability (fsync) before any answer; data dir {}", dir.path().display());

        // The writer holds a lease and registers one instance per service.
        let writer = ArbiterClient::new(&material(&ca, Role::Agent, "writer")).unwrap();
        let (conn, writer_session, writer_reader) =
            open_session(&writer, &addr, "writer").await.unwrap();
        let counters: Arc<Counters> = Arc::default();
        let progress: Progress = Arc::new(Mutex::new(HashMap::new()));
        // The writer's own session follows nothing; it only keeps its lease.
        tokio::spawn(
            BenchAgent {
                index: usize::MAX,
                writer: writer_session,
                views: HashMap::new(),
                retries: BTreeMap::new(),
                progress: progress.clone(),
                counters: Arc::default(),
            }
            .run(read_into(writer_reader)),
        );
        let mut registrations = Vec::new();
        for chunk in (0..sizes.services).collect::<Vec<_>>().chunks(100) {
            for &i in chunk {
                let conn = conn.clone();
                registrations.push(tokio::spawn(async move {
                    let address = Ipv4Addr::new(10, (i / 250) as u8, (i % 250) as u8, 1);
                    let reg = registration(instance(i), service(i), "writer", address);
                    request_until_taken(&conn, &Request::Register(reg)).await
                }));
            }
            for r in registrations.drain(..) {
                assert!(matches!(r.await.unwrap(), Response::Committed { .. }));
            }
        }

        // The agents, each subscribed to a fixed pseudo-random pick of services.
        let mut followers = Followers {
            by_service: vec![Vec::new(); sizes.services],
        };
        let mut keep = Vec::new();
        for a in 0..sizes.agents {
            let node = format!("agent-{a:03}");
            let client = ArbiterClient::new(&material(&ca, Role::Agent, &node)).unwrap();
            let (conn, mut w, r) = open_session(&client, &addr, &node).await.unwrap();
            // A fixed, well spread pick (Knuth's multiplicative hash).
            let mut picks: Vec<usize> = (0..sizes.subs_per_agent)
                .map(|k| {
                    (((a * sizes.subs_per_agent + k) as u64 * 2_654_435_761)
                        % sizes.services as u64) as usize
                })
                .collect();
            picks.sort_unstable();
            picks.dedup();
            let mut views = HashMap::new();
            for &s in &picks {
                followers.by_service[s].push(a);
                views.insert(service(s), None);
                w.send(&SessionUp::Subscribe {
                    shard: ShardId(0),
                    service: service(s),
                    have: None,
                })
                .await
                .unwrap();
            }
            keep.push((client, conn));
            tokio::spawn(
                BenchAgent {
                    index: a,
                    writer: w,
                    views,
                    retries: BTreeMap::new(),
                    progress: progress.clone(),
                    counters: counters.clone(),
                }
                .run(read_into(r)),
            );
        }
        // Every agent holds a view of each service it follows.
        let subscriptions: usize = followers.by_service.iter().map(Vec::len).sum();
        let synced_by = Instant::now() + Duration::from_secs(60);
        while progress.lock().unwrap().len() < subscriptions {
            assert!(
                Instant::now() < synced_by,
                "the agents did not sync their subscriptions within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let watched: Vec<usize> = (0..sizes.services)
            .filter(|s| !followers.by_service[*s].is_empty())
            .collect();
        println!(
            "{} agents subscribed to {} services each; {} of {} services have subscribers",
            sizes.agents,
            sizes.subs_per_agent,
            watched.len(),
            sizes.services
        );
        Cluster {
            server,
            addr,
            ca,
            conn,
            followers,
            watched,
            progress,
            counters,
            keep,
            _dir: dir,
        }
    }

    async fn stop(self) {
        drop(self.keep);
        self.server.shutdown().await;
    }
}

async fn run(sizes: Sizes) -> usize {
    // This arbiter measures capacity: one writer's connection carries every
    // change, so the per-connection request limit is lifted here (the
    // flood phase below runs with the defaults).
    let cluster = Cluster::start(sizes, |c| {
        c.limits.requests_per_second = 1_000_000;
        c.limits.request_burst = 1_000_000;
    })
    .await;
    let Cluster {
        conn,
        followers,
        watched,
        progress,
        counters,
        ..
    } = &cluster;
    let flips = Arc::new(Mutex::new(HashMap::new()));
    let mut undelivered = 0;

    // Lone changes: one at a time, 20 ms apart.
    let changes = lone_changes(conn, watched, &flips, sizes.lone_changes).await;
    undelivered += measure_latency("lone change", &changes, followers, progress).await;

    // A stream of changes at a fixed rate (500/s in the full run), open loop.
    let changes = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for k in 0..sizes.stream_changes {
        let due = start + Duration::from_micros(sizes.stream_interval_us * k as u64);
        tokio::time::sleep_until(due.into()).await;
        let i = watched[(k * 7) % watched.len()];
        let state = next_state(&flips, i);
        let (conn, changes) = (conn.clone(), changes.clone());
        tasks.push(tokio::spawn(async move {
            let submitted = Instant::now();
            if let Some(revision) = transition(&conn, i, state).await {
                changes.lock().unwrap().push(Change {
                    service: i,
                    revision,
                    submitted,
                    committed: Instant::now(),
                });
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let changes = std::mem::take(&mut *changes.lock().unwrap());
    let rate = 1e6 / sizes.stream_interval_us as f64;
    undelivered += measure_latency(
        &format!("{rate:.0} changes/s stream"),
        &changes,
        followers,
        progress,
    )
    .await;

    // Durable throughput with concurrent writers.
    for &writers in sizes.writers {
        throughput(conn, writers, sizes, &flips, counters).await;
    }
    println!(
        "agents applied {} snapshots and were told to retry {} times over the run",
        counters.snapshots.load(Ordering::Relaxed),
        counters.retries.load(Ordering::Relaxed)
    );
    cluster.stop().await;
    undelivered += flood(sizes).await;
    undelivered
}

/// `count` lone changes of watched services, 20 ms apart.
async fn lone_changes(
    conn: &ArbiterConn,
    watched: &[usize],
    flips: &Mutex<HashMap<usize, bool>>,
    count: usize,
) -> Vec<Change> {
    let mut changes = Vec::new();
    for k in 0..count {
        let i = watched[(k * 31) % watched.len()];
        let submitted = Instant::now();
        let revision = transition(conn, i, next_state(flips, i)).await.unwrap();
        changes.push(Change {
            service: i,
            revision,
            submitted,
            committed: Instant::now(),
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    changes
}

/// What one flooding identity got done.
#[derive(Default)]
struct Flooded {
    writes_committed: AtomicU64,
    writes_refused: AtomicU64,
    sessions_welcomed: AtomicU64,
    sessions_failed: AtomicU64,
}

/// Issue 20, item 4: one identity (`flooder`, an agent certificate) floods
/// the arbiter, with the `[limits]` defaults, while the writer makes lone
/// changes the agents follow: the flooder writes its own instances as fast
/// as it can on several connections with many requests in flight each, and
/// opens new sessions of its node as fast as it can (each replaces the
/// last). Measured: the other changes' commit -> applied at every
/// subscribed agent (to hold within the 3 s leave budget at p99), and what
/// the flood got through. The smoke run judges delivery and samples only.
async fn flood(sizes: Sizes) -> usize {
    const FLOOD_CONNECTIONS: usize = 4;
    const IN_FLIGHT_PER_CONNECTION: usize = 32;
    const FLOOD_INSTANCES: usize = 200;
    const SESSION_OPENERS: usize = 8;
    let cluster = Cluster::start(sizes, |_| {}).await;
    let flood_for = Duration::from_secs(if support::full_run() { 10 } else { 2 });
    let flooder = ArbiterClient::new(&material(&cluster.ca, Role::Agent, "flooder")).unwrap();
    // Its instances, registered at the pace the limits allow.
    let (_session, _w, _r) = open_session(&flooder, &cluster.addr, "flooder")
        .await
        .unwrap();
    let setup = flooder.connect(&cluster.addr).await.unwrap();
    for i in 0..FLOOD_INSTANCES {
        let reg = registration(
            InstanceId::new(&format!("flood-{i}")).unwrap(),
            ServiceKey::new("default", "flood", "http").unwrap(),
            "flooder",
            Ipv4Addr::new(10, 99, (i / 250) as u8, (i % 250) as u8),
        );
        assert!(matches!(
            request_until_taken(&setup, &Request::Register(reg)).await,
            Response::Committed { .. }
        ));
    }
    let flooded = Arc::new(Flooded::default());
    let deadline = Instant::now() + flood_for;
    let mut tasks = Vec::new();
    for c in 0..FLOOD_CONNECTIONS {
        let conn = flooder.connect(&cluster.addr).await.unwrap();
        for t in 0..IN_FLIGHT_PER_CONNECTION {
            let (conn, flooded) = (conn.clone(), flooded.clone());
            tasks.push(tokio::spawn(async move {
                let mut k = c * IN_FLIGHT_PER_CONNECTION + t;
                let mut up = false;
                while Instant::now() < deadline {
                    k = (k + 7) % FLOOD_INSTANCES;
                    up = !up;
                    let request = Request::Transition {
                        instance_id: InstanceId::new(&format!("flood-{k}")).unwrap(),
                        generation: Generation(1),
                        to: if up { State::Ready } else { State::Unhealthy },
                        reason: Reason::new("flood").unwrap(),
                    };
                    match conn.request(&request).await {
                        Ok(Response::Committed { .. }) => &flooded.writes_committed,
                        _ => &flooded.writes_refused,
                    }
                    .fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    // New sessions of the flooder's node, as fast as they are answered,
    // SESSION_OPENERS at a time (each replaces the one before).
    for _ in 0..SESSION_OPENERS {
        let (flooder, flooded, addr) = (flooder.clone(), flooded.clone(), cluster.addr.clone());
        tasks.push(tokio::spawn(async move {
            let mut last = None;
            while Instant::now() < deadline {
                match open_session(&flooder, &addr, "flooder").await {
                    Ok(session) => {
                        flooded.sessions_welcomed.fetch_add(1, Ordering::Relaxed);
                        last = Some(session);
                    }
                    Err(_) => {
                        flooded.sessions_failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            drop(last);
        }));
    }
    // Meanwhile, the other agents' service changes, 20 ms apart.
    let flips = Mutex::new(HashMap::new());
    let mut changes = Vec::new();
    while Instant::now() < deadline {
        changes.extend(lone_changes(&cluster.conn, &cluster.watched, &flips, 1).await);
    }
    for task in tasks {
        task.await.unwrap();
    }
    let secs = flood_for.as_secs_f64();
    println!(
        "flood from one identity for {secs:.0} s ({FLOOD_CONNECTIONS} connections x {IN_FLIGHT_PER_CONNECTION} writes in flight, {SESSION_OPENERS} openers of new sessions back to back): {:.0} writes/s committed, {:.0}/s refused; {} sessions welcomed, {} failed",
        flooded.writes_committed.load(Ordering::Relaxed) as f64 / secs,
        flooded.writes_refused.load(Ordering::Relaxed) as f64 / secs,
        flooded.sessions_welcomed.load(Ordering::Relaxed),
        flooded.sessions_failed.load(Ordering::Relaxed),
    );
    let metrics = reqwest::get(format!("http://{}/metrics", cluster.server.admin_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("rollcall_arbiter_limit_hits_total"))
    {
        println!("  {line}");
    }
    let undelivered = measure_latency(
        "other agents' changes during the flood",
        &changes,
        &cluster.followers,
        &cluster.progress,
    )
    .await;
    cluster.stop().await;
    undelivered
}

async fn throughput(
    conn: &ArbiterConn,
    writers: usize,
    sizes: Sizes,
    flips: &Arc<Mutex<HashMap<usize, bool>>>,
    counters: &Counters,
) {
    let committed = Arc::new(AtomicU64::new(0));
    let d0 = counters.deltas.load(Ordering::Relaxed);
    let b0 = counters.bytes.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(sizes.throughput_s);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (conn, committed, flips) = (conn.clone(), committed.clone(), flips.clone());
        tasks.push(tokio::spawn(async move {
            let mut k = w;
            while Instant::now() < deadline {
                let i = k % sizes.services;
                k += writers;
                if transition(&conn, i, next_state(&flips, i)).await.is_some() {
                    committed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = committed.load(Ordering::Relaxed);
    assert!(n > 0, "no transition committed: this measured nothing");
    let deltas = counters.deltas.load(Ordering::Relaxed) - d0;
    let bytes = counters.bytes.load(Ordering::Relaxed) - b0;
    println!("durable throughput, {writers} concurrent writers: {n} transitions committed in {secs:.2} s = {:.0} committed transitions/s", n as f64 / secs);
    println!(
        "  fan-out meanwhile: {:.0} deltas/s delivered, {:.0} KiB/s to {} agents",
        deltas as f64 / secs,
        bytes as f64 / secs / 1024.0,
        sizes.agents
    );
}
