//! Issue 3 benchmark (not a test): an arbiter on loopback with 200 agent
//! clients in this process, each on its own QUIC connection and subscribed
//! to 20 of 2,000 services.
//!
//! Measured:
//! - change latency for a lone change and under a 500 changes/s stream:
//!   from the writer's Committed answer (the arbiter answers right after
//!   the fsync, just before fanning out) to each subscribed agent holding
//!   the delta; also from the write's submission (adds the fsync);
//! - committed transitions per second, durable (fsync on every group
//!   commit), with 64 concurrent writers;
//! - deliveries per second and bytes per second to the agents meanwhile.
//!
//! Run: `cargo bench -p rollcall-leases --bench control_plane`

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rollcall_config::ArbiterConfig;
use rollcall_leases::client::{ArbiterClient, ArbiterConn};
use rollcall_leases::codec::encode_session_down;
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{Request, Response, ServiceUpdate, SessionDown, SessionUp};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, Generation, InstanceId, Label, NodeId, PrincipalName, Reason, Registration,
    Revision, Role, ServiceKey, State, Version, Weight,
};

const AGENTS: usize = 200;
const SERVICES: usize = 2_000;
const SUBS_PER_AGENT: usize = 20;

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

/// Arrival time of each revision at each agent.
type Arrivals = Arc<Mutex<HashMap<Revision, Vec<Instant>>>>;

struct Counters {
    deltas: AtomicU64,
    bytes: AtomicU64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{name}: n={} p50={:.2} ms p99={:.2} ms max={:.2} ms",
        ms.len(),
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN)
    );
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

#[derive(Default)]
struct Sample {
    submitted: Vec<(Revision, Instant, Instant)>,
}

async fn measure_latency(name: &str, sample: Sample, arrivals: &Arrivals) {
    // Give the last deliveries time to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let arrivals = arrivals.lock().unwrap();
    let mut from_commit = Vec::new();
    let mut from_submit = Vec::new();
    let mut missing = 0;
    for (rev, submitted, committed) in &sample.submitted {
        let times = arrivals.get(rev).cloned().unwrap_or_default();
        // Every changed service has subscribers: a change seen by none is lost.
        if times.is_empty() {
            missing += 1;
        }
        for t in times {
            from_commit.push(t.saturating_duration_since(*committed).as_secs_f64() * 1e3);
            from_submit.push(t.saturating_duration_since(*submitted).as_secs_f64() * 1e3);
        }
    }
    summary(
        &format!("{name}: Committed answer -> applied at a subscribed agent"),
        from_commit,
    );
    summary(
        &format!("{name}: write submitted -> applied at a subscribed agent"),
        from_submit,
    );
    if missing > 0 {
        println!("{name}: {missing} changes reached no agent");
    }
}

fn main() {
    rollcall_leases::tls::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(run());
}

async fn run() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = ArbiterConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().join("arbiter"),
        ..ArbiterConfig::default()
    };
    let server = ArbiterServer::start(config, &material(&ca, Role::Arbiter, "arbiter-1"))
        .await
        .unwrap();
    let addr = server.quic_addr.to_string();
    println!("durability: every group commit is one redb write transaction with immediate durability (fsync) before any answer; data dir {}", dir.path().display());

    // The writer holds a lease and registers one instance per service.
    let writer = ArbiterClient::new(&material(&ca, Role::Agent, "writer")).unwrap();
    let conn = writer.connect(&addr).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new("writer").unwrap(),
        epoch: AgentEpoch(1),
        zone: Label::new("z1").unwrap(),
    };
    let (mut writer_session, mut writer_reader) = conn.open_session(&hello).await.unwrap();
    assert!(matches!(
        writer_reader.next().await.unwrap(),
        SessionDown::Welcome { .. }
    ));
    tokio::spawn(async move {
        // Keep the session alive and renew the lease every ttl/3 (10 s TTL).
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        for n in 0u64.. {
            tick.tick().await;
            let msg = if n % 6 == 5 {
                SessionUp::Renew
            } else {
                SessionUp::Keepalive
            };
            if writer_session.send(&msg).await.is_err() {
                return;
            }
        }
    });
    let mut registrations = Vec::new();
    for chunk in (0..SERVICES).collect::<Vec<_>>().chunks(100) {
        for &i in chunk {
            let conn = conn.clone();
            registrations.push(tokio::spawn(async move {
                let reg = Registration {
                    instance_id: instance(i),
                    service: service(i),
                    node: NodeId::new("writer").unwrap(),
                    epoch: AgentEpoch(1),
                    address: IpAddr::V4(Ipv4Addr::new(10, (i / 250) as u8, (i % 250) as u8, 1)),
                    port: 8080,
                    zone: None,
                    version: Version::new("v1").unwrap(),
                    weight: Weight::DEFAULT,
                    labels: Vec::new(),
                    initial: State::Ready,
                };
                conn.request(&Request::Register(reg)).await.unwrap()
            }));
        }
        for r in registrations.drain(..) {
            assert!(matches!(r.await.unwrap(), Response::Committed { .. }));
        }
    }

    // 200 agents, each subscribed to 20 services (a fixed pseudo-random pick).
    let arrivals: Arrivals = Arc::new(Mutex::new(HashMap::new()));
    let counters = Arc::new(Counters {
        deltas: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    });
    let mut subscribers = vec![0usize; SERVICES];
    let mut ready = Vec::new();
    let mut keep = Vec::new();
    for a in 0..AGENTS {
        let node = format!("agent-{a:03}");
        let client = ArbiterClient::new(&material(&ca, Role::Agent, &node)).unwrap();
        let conn = client.connect(&addr).await.unwrap();
        let hello = SessionUp::Hello {
            node: NodeId::new(&node).unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
        };
        let (mut w, mut r) = conn.open_session(&hello).await.unwrap();
        assert!(matches!(
            r.next().await.unwrap(),
            SessionDown::Welcome { .. }
        ));
        // A fixed, well spread pick (Knuth's multiplicative hash).
        let picks: Vec<usize> = (0..SUBS_PER_AGENT)
            .map(|k| (((a * SUBS_PER_AGENT + k) as u64 * 2_654_435_761) % SERVICES as u64) as usize)
            .collect();
        for &s in &picks {
            subscribers[s] += 1;
            w.send(&SessionUp::Subscribe {
                shard: rollcall_leases::ShardId(0),
                service: service(s),
                have: None,
            })
            .await
            .unwrap();
        }
        let arrivals = arrivals.clone();
        let counters = counters.clone();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        ready.push(synced_rx);
        keep.push((client, conn));
        tokio::spawn(async move {
            let mut synced_tx = Some(synced_tx);
            let mut snapshots = 0;
            loop {
                let Ok(msg) = r.next().await else { return };
                let now = Instant::now();
                counters.bytes.fetch_add(
                    encode_session_down(&msg).len() as u64 + 4,
                    Ordering::Relaxed,
                );
                let SessionDown::Update(items) = msg else {
                    continue;
                };
                let mut acks = Vec::new();
                for item in items {
                    match item {
                        ServiceUpdate::Snapshot(_) => snapshots += 1,
                        ServiceUpdate::Deltas(ds) => {
                            counters
                                .deltas
                                .fetch_add(ds.len() as u64, Ordering::Relaxed);
                            let mut a = arrivals.lock().unwrap();
                            for d in &ds {
                                a.entry(d.revision).or_default().push(now);
                            }
                            if let Some(last) = ds.last() {
                                acks.push((last.service.clone(), last.revision));
                            }
                        }
                        ServiceUpdate::RetryAfter { service, .. } => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            acks.clear();
                            let _ = w
                                .send(&SessionUp::Subscribe {
                                    shard: rollcall_leases::ShardId(0),
                                    service,
                                    have: None,
                                })
                                .await;
                        }
                        _ => {}
                    }
                }
                for (service, revision) in acks {
                    let _ = w.send(&SessionUp::Ack { service, revision }).await;
                }
                if snapshots >= SUBS_PER_AGENT {
                    if let Some(tx) = synced_tx.take() {
                        let _ = tx.send(());
                    }
                }
            }
        });
    }
    for r in ready {
        r.await.unwrap();
    }
    let watched: Vec<usize> = (0..SERVICES).filter(|s| subscribers[*s] > 0).collect();
    println!("{AGENTS} agents subscribed to {SUBS_PER_AGENT} services each; {} of {SERVICES} services have subscribers", watched.len());
    let flips = Arc::new(Mutex::new(HashMap::new()));

    // Lone changes: one at a time, 20 ms apart.
    let mut sample = Sample::default();
    for k in 0..300 {
        let i = watched[(k * 31) % watched.len()];
        let submitted = Instant::now();
        let rev = transition(&conn, i, next_state(&flips, i)).await.unwrap();
        sample.submitted.push((rev, submitted, Instant::now()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    measure_latency("lone change", sample, &arrivals).await;

    // A stream of 500 changes per second for 10 s, open loop.
    let sample = Arc::new(Mutex::new(Sample::default()));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for k in 0..5_000usize {
        let due = start + Duration::from_micros(2_000 * k as u64);
        tokio::time::sleep_until(due.into()).await;
        let i = watched[(k * 7) % watched.len()];
        let state = next_state(&flips, i);
        let (conn, sample) = (conn.clone(), sample.clone());
        tasks.push(tokio::spawn(async move {
            let submitted = Instant::now();
            if let Some(rev) = transition(&conn, i, state).await {
                sample
                    .lock()
                    .unwrap()
                    .submitted
                    .push((rev, submitted, Instant::now()));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let sample = std::mem::take(&mut *sample.lock().unwrap());
    measure_latency("500 changes/s stream", sample, &arrivals).await;

    // Durable throughput with 64 and with 256 concurrent writers, 5 s each.
    for writers in [64usize, 256] {
        throughput(&conn, writers, &flips, &counters).await;
    }
    drop(keep);
    server.shutdown().await;
}

async fn throughput(
    conn: &ArbiterConn,
    writers: usize,
    flips: &Arc<Mutex<HashMap<usize, bool>>>,
    counters: &Counters,
) {
    let committed = Arc::new(AtomicU64::new(0));
    let d0 = counters.deltas.load(Ordering::Relaxed);
    let b0 = counters.bytes.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(5);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (conn, committed, flips) = (conn.clone(), committed.clone(), flips.clone());
        tasks.push(tokio::spawn(async move {
            let mut k = w;
            while Instant::now() < deadline {
                let i = k % SERVICES;
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
    let deltas = counters.deltas.load(Ordering::Relaxed) - d0;
    let bytes = counters.bytes.load(Ordering::Relaxed) - b0;
    println!("durable throughput, {writers} concurrent writers: {n} transitions committed in {secs:.2} s = {:.0} committed transitions/s", n as f64 / secs);
    println!(
        "  fan-out meanwhile: {:.0} deltas/s delivered, {:.0} KiB/s to {AGENTS} agents",
        deltas as f64 / secs,
        bytes as f64 / secs / 1024.0
    );
}
