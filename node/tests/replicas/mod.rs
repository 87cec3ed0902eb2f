//! The replication tests' fixture: three arbiter replicas of region r1
//! behind UDP relays the test owns, so a partition drops packets (as a
//! cut link does) instead of closing sockets, and agents started against
//! them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rollcall_config::{AgentConfig, ArbiterConfig, ReplicaEntry};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{Label, Role};
use rollcall_node::process::{self, AgentHandle};
use serde_json::Value;
use tokio::net::UdpSocket;

use crate::common::{self, eventually, free_udp_port, Cluster};

/// A UDP relay in front of one replica's QUIC port: peers dial the relay.
/// `cut` drops everything; `blocked` drops packets from those source ports
/// (a replica's outgoing peer socket), in both directions.
pub(crate) struct Relay {
    pub(crate) addr: SocketAddr,
    pub(crate) cut: Arc<AtomicBool>,
    pub(crate) blocked: Arc<Mutex<HashSet<u16>>>,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub(crate) async fn start(upstream: SocketAddr) -> Relay {
        let listen = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let addr = listen.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let blocked: Arc<Mutex<HashSet<u16>>> = Arc::default();
        let (c, b) = (cut.clone(), blocked.clone());
        let task = tokio::spawn(async move {
            let mut routes: BTreeMap<SocketAddr, Arc<UdpSocket>> = BTreeMap::new();
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, from)) = listen.recv_from(&mut buf).await else {
                    return;
                };
                let dropped = move |c: &AtomicBool, b: &Mutex<HashSet<u16>>| {
                    c.load(Ordering::Relaxed) || b.lock().unwrap().contains(&from.port())
                };
                if dropped(&c, &b) {
                    continue;
                }
                let out = match routes.get(&from) {
                    Some(out) => out.clone(),
                    None => {
                        let out = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
                        out.connect(upstream).await.unwrap();
                        routes.insert(from, out.clone());
                        let (back, listen, c, b) =
                            (out.clone(), listen.clone(), c.clone(), b.clone());
                        tokio::spawn(async move {
                            let mut buf = vec![0u8; 65_536];
                            loop {
                                // A connected UDP socket reports an ICMP
                                // "port unreachable" (a replica not started
                                // yet) as an error on the next receive.
                                let Ok(n) = back.recv(&mut buf).await else {
                                    continue;
                                };
                                if !dropped(&c, &b) {
                                    let _ = listen.send_to(&buf[..n], from).await;
                                }
                            }
                        });
                        out
                    }
                };
                let _ = out.send(&buf[..n]).await;
            }
        });
        Relay {
            addr,
            cut,
            blocked,
            task,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Three replicas of region r1, ids 1–3.
pub(crate) struct Group {
    pub(crate) ca: Ca,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) configs: Vec<ArbiterConfig>,
    pub(crate) tls: Vec<TlsMaterial>,
    pub(crate) servers: Vec<Option<ArbiterServer>>,
    pub(crate) relays: Vec<Relay>,
}

impl Group {
    pub(crate) async fn start(tune: impl Fn(&mut ArbiterConfig)) -> Group {
        // RUST_LOG=info shows the replicas' elections when a test fails.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
        let mut relays = Vec::new();
        for port in &ports {
            relays.push(Relay::start(SocketAddr::from(([127, 0, 0, 1], *port))).await);
        }
        let replicas: Vec<ReplicaEntry> = relays
            .iter()
            .enumerate()
            .map(|(i, r)| ReplicaEntry {
                id: i as u64 + 1,
                addr: r.addr.to_string(),
            })
            .collect();
        let mut configs = Vec::new();
        let mut tls = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let mut config = ArbiterConfig {
                name: format!("arbiter-{}", i + 1),
                listen: SocketAddr::from(([127, 0, 0, 1], *port)),
                admin: SocketAddr::from(([127, 0, 0, 1], 0)),
                data_dir: dir.path().join(format!("arbiter-{}", i + 1)),
                // Tests register addresses no node declared.
                registration: rollcall_config::RegistrationConfig {
                    addresses: rollcall_config::AddressRule::Any,
                    ..Default::default()
                },
                ..ArbiterConfig::default()
            };
            config.raft.id = i as u64 + 1;
            config.raft.replicas = replicas.clone();
            config.raft.write_timeout_ms = 2_000;
            tune(&mut config);
            configs.push(config);
            tls.push(Cluster::material(
                &ca,
                Role::Arbiter,
                &format!("arbiter-{}", i + 1),
            ));
        }
        let mut group = Group {
            ca,
            dir,
            configs,
            tls,
            servers: vec![None, None, None],
            relays,
        };
        for i in 0..3 {
            group.start_replica(i).await;
        }
        group
    }

    pub(crate) async fn start_replica(&mut self, i: usize) {
        let server = ArbiterServer::start(self.configs[i].clone(), &self.tls[i])
            .await
            .unwrap();
        self.servers[i] = Some(server);
    }

    pub(crate) async fn stop_replica(&mut self, i: usize) {
        if let Some(server) = self.servers[i].take() {
            server.shutdown().await;
        }
    }

    pub(crate) fn quic_addrs(&self) -> Vec<String> {
        self.configs.iter().map(|c| c.listen.to_string()).collect()
    }

    /// The replicas' relays, as agents can dial them too: `isolate` then
    /// silences a replica for its agents as a dead host would (no
    /// CONNECTION_CLOSE, no ICMP).
    pub(crate) fn relay_addrs(&self) -> Vec<String> {
        self.relays.iter().map(|r| r.addr.to_string()).collect()
    }

    /// The leader's index as replica `from` sees it, once it sees one.
    pub(crate) async fn leader_seen_by(&self, from: usize) -> usize {
        let raft = self.servers[from].as_ref().unwrap().raft().clone();
        eventually("a leader is elected", || {
            let raft = raft.clone();
            async move {
                raft.metrics()
                    .borrow()
                    .current_leader
                    .map(|id| id as usize - 1)
            }
        })
        .await
    }

    /// The leader, once every running replica agrees on one.
    pub(crate) async fn leader(&self) -> usize {
        eventually("the running replicas agree on a leader", || async {
            let seen: BTreeSet<Option<u64>> = self
                .servers
                .iter()
                .flatten()
                .map(|s| s.raft().metrics().borrow().current_leader)
                .collect();
            match seen.into_iter().collect::<Vec<_>>()[..] {
                [Some(id)] if self.servers[id as usize - 1].is_some() => Some(id as usize - 1),
                _ => None,
            }
        })
        .await
    }

    pub(crate) fn admin(&self, i: usize) -> common::Admin {
        let server = self.servers[i].as_ref().expect("replica running");
        common::Admin {
            base: format!("http://{}", server.admin_addr),
            token: std::fs::read_to_string(&server.token_file)
                .unwrap()
                .trim()
                .to_owned(),
            client: reqwest::Client::new(),
        }
    }

    /// Every audit entry replica `i` holds, oldest first.
    pub(crate) async fn audit(&self, i: usize) -> Vec<Value> {
        let (status, body) = self.admin(i).get("/v1/audit?limit=10000").await;
        assert_eq!(status, 200, "{body}");
        body.as_array().unwrap().clone()
    }

    /// Cuts replica `i` off from the other replicas, both directions.
    pub(crate) fn isolate(&self, i: usize) {
        self.relays[i].cut.store(true, Ordering::Relaxed);
        let port = self.servers[i].as_ref().unwrap().peer_port();
        for (j, relay) in self.relays.iter().enumerate() {
            if j != i {
                relay.blocked.lock().unwrap().insert(port);
            }
        }
    }

    pub(crate) fn heal(&self) {
        for relay in &self.relays {
            relay.cut.store(false, Ordering::Relaxed);
            relay.blocked.lock().unwrap().clear();
        }
    }

    pub(crate) fn agent_config(&self, node: &str, arbiters: Vec<String>) -> AgentConfig {
        AgentConfig {
            node_id: node.into(),
            region: "r1".into(),
            data_dir: self.dir.path().join("agents").join(node),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            dns_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            arbiters,
            reconnect_min_ms: 50,
            reconnect_max_ms: 500,
            ..AgentConfig::default()
        }
    }

    pub(crate) async fn agent(&self, node: &str) -> AgentHandle {
        self.agent_on(node, self.quic_addrs()).await
    }

    pub(crate) async fn agent_on(&self, node: &str, arbiters: Vec<String>) -> AgentHandle {
        let tls = Cluster::material(&self.ca, Role::Agent, node);
        process::start(self.agent_config(node, arbiters), Some(&tls))
            .await
            .unwrap()
    }
}
