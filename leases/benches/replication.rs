//! Issue 6 benchmark (not a test): three arbiter replicas (openraft, QUIC +
//! mTLS, fsync on every log append) on loopback in this process.
//!
//! Measured:
//! - committed transitions per second with 3 replicas: 64 concurrent
//!   writers on one agent connection to the leader, each alternating an
//!   instance between READY and UNHEALTHY (openraft batches concurrent
//!   writes into one append and one replication round); and the same load
//!   sent to a follower, which hands each write to the leader;
//! - leader kill → first committed write on the new leader, 20 rounds: the
//!   leader is shut down (no hand-over; its QUIC endpoint closes at once),
//!   a writer retries a registration every 10 ms through a surviving
//!   replica until one commits; also when the survivor first knows the new
//!   leader. The killed replica is restarted before the next round.
//!
//! Run: `cargo bench -p rollcall-leases --bench replication`
//! (`-- --quick` for 3 s of load and 5 rounds). `cargo test` runs it as a
//! smoke test: 1 s of load each way and 2 kill rounds; it fails unless
//! both ways committed writes and every round measured its two times.

mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollcall_config::{ArbiterConfig, ReplicaEntry};
use rollcall_leases::client::{ArbiterClient, ArbiterConn};
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{Request, Response, SessionDown, SessionUp};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, InstanceId, Label, NodeId, PrincipalName, Reason, Registration, Role, ServiceKey,
    State, Version, Weight,
};

const WRITERS: usize = 64;

fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        role,
        PrincipalName::new(name).unwrap(),
    );
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Group {
    ca: Ca,
    configs: Vec<ArbiterConfig>,
    servers: Vec<Option<ArbiterServer>>,
    _dir: tempfile::TempDir,
}

impl Group {
    async fn start() -> Group {
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let replicas: Vec<ReplicaEntry> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| ReplicaEntry {
                id: i as u64 + 1,
                addr: format!("127.0.0.1:{p}"),
            })
            .collect();
        let configs: Vec<ArbiterConfig> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut c = ArbiterConfig {
                    name: format!("arbiter-{}", i + 1),
                    listen: SocketAddr::from(([127, 0, 0, 1], *p)),
                    admin: SocketAddr::from(([127, 0, 0, 1], 0)),
                    data_dir: dir.path().join(format!("arbiter-{}", i + 1)),
                    // Tests register addresses no node declared.
                    registration: rollcall_config::RegistrationConfig {
                        addresses: rollcall_config::AddressRule::Any,
                    },
                    ..ArbiterConfig::default()
                };
                c.raft.id = i as u64 + 1;
                c.raft.replicas = replicas.clone();
                // This measures the group's capacity through one writer's
                // connection: the per-connection request limit is lifted.
                c.limits.requests_per_second = 1_000_000;
                c.limits.request_burst = 1_000_000;
                c
            })
            .collect();
        let mut group = Group {
            ca,
            configs,
            servers: vec![None, None, None],
            _dir: dir,
        };
        for i in 0..3 {
            group.start_replica(i).await;
        }
        group
    }

    async fn start_replica(&mut self, i: usize) {
        let tls = material(&self.ca, Role::Arbiter, &format!("arbiter-{}", i + 1));
        self.servers[i] = Some(
            ArbiterServer::start(self.configs[i].clone(), &tls)
                .await
                .unwrap(),
        );
    }

    /// The leader every running replica agrees on.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen: BTreeSet<Option<u64>> = self
                .servers
                .iter()
                .flatten()
                .map(|s| s.raft().metrics().borrow().current_leader)
                .collect();
            if let [Some(id)] = seen.into_iter().collect::<Vec<_>>()[..] {
                if self.servers[id as usize - 1].is_some() {
                    return id as usize - 1;
                }
            }
            assert!(Instant::now() < deadline, "no leader within 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn addr(&self, i: usize) -> String {
        self.configs[i].listen.to_string()
    }
}

fn registration(node: &str, i: usize) -> Registration {
    Registration {
        instance_id: InstanceId::new(&format!("{node}-i{i}")).unwrap(),
        service: ServiceKey::new("default", &format!("svc-{}", i % 50), "http").unwrap(),
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(Ipv4Addr::new(10, 1, (i / 250) as u8, (i % 250) as u8)),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    }
}

/// An agent session for `node` on replica address `addr`.
async fn session(ca: &Ca, node: &str, addr: &str) -> (ArbiterConn, ArbiterClient) {
    let client = ArbiterClient::new(&material(ca, Role::Agent, node)).unwrap();
    let conn = client.connect(addr).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(1),
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (writer, mut reader) = conn.open_session(&hello).await.unwrap();
    match reader.next().await.unwrap() {
        SessionDown::Welcome { .. } => {}
        other => panic!("expected Welcome, got {other:?}"),
    }
    // Keep the session open and the lease renewed; updates are drained.
    let mut writer = writer;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(3)).await;
            if writer.send(&SessionUp::Renew).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move { while reader.next().await.is_ok() {} });
    (conn, client)
}

/// Runs 64 writers for `secs` and answers committed transitions per second.
async fn throughput(ca: &Ca, addr: &str, node: &str, secs: u64) -> f64 {
    let (conn, _client) = session(ca, node, addr).await;
    let mut generations = Vec::new();
    for i in 0..WRITERS {
        match conn
            .request(&Request::Register(registration(node, i)))
            .await
            .unwrap()
        {
            Response::Committed {
                generation: Some(g),
                ..
            } => generations.push(g),
            other => panic!("registration: {other:?}"),
        }
    }
    let committed = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, generation) in generations.into_iter().enumerate() {
        let conn = conn.clone();
        let committed = committed.clone();
        let id = registration(node, i).instance_id;
        tasks.push(tokio::spawn(async move {
            let mut up = false;
            while Instant::now() < stop {
                let request = Request::Transition {
                    instance_id: id.clone(),
                    generation,
                    to: if up { State::Ready } else { State::Unhealthy },
                    reason: Reason::new("bench").unwrap(),
                };
                match conn.request(&request).await.unwrap() {
                    Response::Committed { .. } => {
                        committed.fetch_add(1, Ordering::Relaxed);
                        up = !up;
                    }
                    other => panic!("transition: {other:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    committed.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    support::announce("replication");
    let quick = std::env::args().any(|a| a == "--quick");
    // RUST_LOG=info shows elections.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let (secs, rounds) = match (support::full_run(), quick) {
        (false, _) => (1, 2),
        (true, true) => (3, 5),
        (true, false) => (10, 20),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut group = Group::start().await;
        let leader = group.leader().await;
        let follower = (leader + 1) % 3;
        println!("3 replicas on loopback, fsync on every append; {WRITERS} concurrent writers, {secs} s each");
        let to_leader = throughput(&group.ca, &group.addr(leader), "bench-l", secs).await;
        println!("committed transitions/s, writes sent to the leader:   {to_leader:>8.0}");
        let to_follower = throughput(&group.ca, &group.addr(follower), "bench-f", secs).await;
        println!("committed transitions/s, writes sent to a follower:   {to_follower:>8.0}");
        assert!(
            to_leader > 0.0 && to_follower > 0.0,
            "no write committed one of the two ways: this measured nothing"
        );

        let mut times = Vec::new();
        let mut elections = Vec::new();
        for round in 0..rounds {
            let leader = group.leader().await;
            let survivor = (leader + 1) % 3;
            let node = format!("kill-{round}");
            let (conn, _client) = session(&group.ca, &node, &group.addr(survivor)).await;
            let watch = group.servers[survivor].as_ref().unwrap().raft().clone();
            // The kill: the replica stops at once (QUIC endpoint closed, Raft
            // stopped); its orderly teardown runs on meanwhile and is waited
            // for only before the restart.
            let victim = group.servers[leader].take().unwrap();
            let killed = Instant::now();
            let teardown = tokio::spawn(victim.shutdown());
            let elected = tokio::spawn(async move {
                loop {
                    let m = watch.metrics().borrow().clone();
                    if m.current_leader.is_some_and(|l| l as usize != leader + 1) {
                        return killed.elapsed().as_secs_f64() * 1000.0;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            let mut attempt = 0;
            loop {
                attempt += 1;
                let request = Request::Register(registration(&node, attempt));
                let answer = tokio::time::timeout(Duration::from_secs(5), conn.request(&request)).await;
                if let Ok(Ok(Response::Committed { .. })) = answer {
                    break;
                }
                assert!(
                    killed.elapsed() < Duration::from_secs(30),
                    "no write committed within 30 s; the last answer: {answer:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let ms = killed.elapsed().as_secs_f64() * 1000.0;
            let election = elected.await.unwrap();
            times.push(ms);
            elections.push(election);
            println!("round {round:>2}: leader {} killed -> new leader known at replica {} after {election:.0} ms, first committed write after {ms:.0} ms", leader + 1, survivor + 1);
            conn.close("round over");
            teardown.await.unwrap();
            group.start_replica(leader).await;
            let _ = group.leader().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        support::expect_samples("leader kill rounds", times.len(), rounds);
        let elections = support::summarize("leader kill -> new leader known", elections);
        let times = support::summarize("leader kill -> first committed write", times);
        println!(
            "leader kill -> new leader known, {rounds} rounds: p50 {:.0} ms, max {:.0} ms",
            elections.p50, elections.max
        );
        println!(
            "leader kill -> first committed write, {rounds} rounds: p50 {:.0} ms, max {:.0} ms (target max <= 2000 ms)",
            times.p50, times.max
        );
        for server in group.servers.into_iter().flatten() {
            server.shutdown().await;
        }
    });
}
