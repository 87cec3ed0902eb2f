//! What the arbiter benchmarks share (included by `replication.rs` and
//! `throughput.rs`): certificates from one test CA, a group of three
//! replicas on loopback, agent sessions, and 64 writers flipping their
//! instances between READY and UNHEALTHY through the real QUIC client.

// Each benchmark uses a part of this module.
#![allow(dead_code)]

pub mod shards;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

pub const WRITERS: usize = 64;

pub fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
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

/// `n` arbiter replicas of one group on loopback (fsync on every append).
pub struct Group {
    pub ca: Ca,
    pub configs: Vec<ArbiterConfig>,
    pub servers: Vec<Option<ArbiterServer>>,
    _dir: tempfile::TempDir,
}

impl Group {
    pub async fn start(n: usize) -> Group {
        Group::start_with(n, |_| {}).await
    }

    /// As `start`, with each replica's config changed by `tune` first.
    pub async fn start_with(n: usize, tune: impl Fn(&mut ArbiterConfig)) -> Group {
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
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
                        ..Default::default()
                    },
                    ..ArbiterConfig::default()
                };
                // This measures the group's capacity through one writer's
                // connection: the per-connection request limit is lifted.
                c.limits.requests_per_second = 1_000_000;
                c.limits.request_burst = 1_000_000;
                if n > 1 {
                    c.raft.id = i as u64 + 1;
                    c.raft.replicas = replicas.clone();
                }
                tune(&mut c);
                c
            })
            .collect();
        let mut group = Group {
            ca,
            configs,
            servers: (0..n).map(|_| None).collect(),
            _dir: dir,
        };
        for i in 0..n {
            group.start_replica(i).await;
        }
        group
    }

    pub async fn start_replica(&mut self, i: usize) {
        let tls = material(&self.ca, Role::Arbiter, &format!("arbiter-{}", i + 1));
        self.servers[i] = Some(
            ArbiterServer::start(self.configs[i].clone(), &tls)
                .await
                .unwrap(),
        );
    }

    /// The leader every running replica agrees on.
    pub async fn leader(&self) -> usize {
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

    pub fn addr(&self, i: usize) -> String {
        self.configs[i].listen.to_string()
    }

    /// The last log index of replica `i`.
    pub fn log_index(&self, i: usize) -> u64 {
        let server = self.servers[i].as_ref().expect("the replica runs");
        server.raft().metrics().borrow().last_log_index.unwrap_or(0)
    }

    pub async fn shutdown(self) {
        for server in self.servers.into_iter().flatten() {
            server.shutdown().await;
        }
    }
}

pub fn registration(node: &str, i: usize) -> Registration {
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
pub async fn session(ca: &Ca, node: &str, addr: &str) -> (ArbiterConn, ArbiterClient) {
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

/// 64 writers on one agent connection, each with an instance of its own.
pub struct Writers {
    conn: ArbiterConn,
    _client: ArbiterClient,
    instances: Vec<(InstanceId, rollcall_leases::Generation)>,
    up: Arc<Mutex<Vec<bool>>>,
}

/// What one load run measured.
pub struct Load {
    pub committed: u64,
    pub secs: f64,
    /// Each write's time from sending to its Committed answer, ms.
    pub latencies_ms: Vec<f64>,
}

impl Load {
    pub fn rate(&self) -> f64 {
        self.committed as f64 / self.secs
    }
}

impl Writers {
    /// Opens a session for `node` on `addr` and registers its 64 instances.
    pub async fn register(ca: &Ca, node: &str, addr: &str) -> Writers {
        let (conn, client) = session(ca, node, addr).await;
        let mut instances = Vec::new();
        for i in 0..WRITERS {
            match conn
                .request(&Request::Register(registration(node, i)))
                .await
                .unwrap()
            {
                Response::Committed {
                    generation: Some(g),
                    ..
                } => instances.push((registration(node, i).instance_id, g)),
                other => panic!("registration: {other:?}"),
            }
        }
        Writers {
            conn,
            _client: client,
            instances,
            up: Arc::new(Mutex::new(vec![true; WRITERS])),
        }
    }

    /// Every writer flips its instance until `secs` passed, one write
    /// after another (each waits for its answer).
    pub async fn run(&self, secs: f64) -> Load {
        let committed = Arc::new(AtomicU64::new(0));
        let stop = Instant::now() + Duration::from_secs_f64(secs);
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (w, (id, generation)) in self.instances.iter().cloned().enumerate() {
            let (conn, committed, up) = (self.conn.clone(), committed.clone(), self.up.clone());
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < stop {
                    let ready = !up.lock().unwrap()[w];
                    let request = Request::Transition {
                        instance_id: id.clone(),
                        generation,
                        to: if ready {
                            State::Ready
                        } else {
                            State::Unhealthy
                        },
                        reason: Reason::new("bench").unwrap(),
                    };
                    let sent = Instant::now();
                    match conn.request(&request).await.unwrap() {
                        Response::Committed { .. } => {
                            latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                            committed.fetch_add(1, Ordering::Relaxed);
                            up.lock().unwrap()[w] = ready;
                        }
                        other => panic!("transition: {other:?}"),
                    }
                }
                latencies
            }));
        }
        let mut latencies_ms = Vec::new();
        for t in tasks {
            latencies_ms.extend(t.await.unwrap());
        }
        Load {
            committed: committed.load(Ordering::Relaxed),
            secs: started.elapsed().as_secs_f64(),
            latencies_ms,
        }
    }
}
