//! `rollcall dev`: the embedded default. One process with an arbiter (or a
//! Raft group of `--replicas` arbiters) and an agent on loopback, a
//! throwaway CA and certificates made at start, data under one directory. For trying rollcall on a laptop, never production:
//! the CA lives only in memory and is new at every start.

use std::net::SocketAddr;
use std::path::PathBuf;

use rollcall_config::{
    AddressRule, AgentConfig, ArbiterConfig, ProxyEntry, RegistrationConfig, ReplicaEntry,
};
use rollcall_leases::identity::Identity;
use rollcall_leases::server::{ArbiterServer, ServerError};
use rollcall_leases::tls::{Ca, TlsError, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role};

use rollcall_node::process::{self, AgentError, AgentHandle};

/// Where `rollcall dev` listens and keeps its data.
#[derive(Clone, Debug)]
pub struct DevOptions {
    /// Data directory (arbiter and agent each get a subdirectory).
    pub data_dir: PathBuf,
    /// The agent's HTTP API.
    pub http: SocketAddr,
    /// The arbiter's admin endpoint.
    pub admin: SocketAddr,
    /// The arbiter's QUIC port; a free one when `None`.
    pub quic: Option<SocketAddr>,
    /// TCP proxy listeners to start on the agent.
    pub proxies: Vec<ProxyEntry>,
    /// The agent's DNS server.
    pub dns: SocketAddr,
    /// Arbiter replicas (1, 3 or 5), one Raft group in this process.
    pub replicas: u8,
}

/// Why `rollcall dev` could not start.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// Certificates could not be made.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The arbiter did not start.
    #[error(transparent)]
    Arbiter(#[from] ServerError),
    /// The agent did not start.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The options are unusable.
    #[error("{0}")]
    Options(String),
}

/// A running dev cluster.
pub struct Dev {
    /// The arbiter replicas, replica 1 first.
    pub arbiters: Vec<ArbiterServer>,
    /// The agent.
    pub agent: AgentHandle,
    /// The agent's data directory (its token file is `agent.token` there).
    pub agent_dir: PathBuf,
}

const REGION: &str = "r1";

/// How long a launcher waits for its agent's first session.
const CONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until `agent` holds a session with an arbiter, so the first
/// write a user pastes commits instead of answering pending.
pub async fn connected(agent: &AgentHandle) -> Result<(), DevError> {
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    loop {
        let status = agent.agent.status().await;
        if status.is_some_and(|s| s.arbiter.connected) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(DevError::Options(format!(
                "the agent has no arbiter session after {} s; see the log above",
                CONNECT_PATIENCE.as_secs()
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
const NODE: &str = "dev-node";

/// Waits until every replica applied the catalog's identity: the group
/// has a leader whose writes commit and reach every replica, so the first
/// write a user pastes commits instead of answering pending.
pub async fn named(arbiters: &[ArbiterServer]) -> Result<(), DevError> {
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    loop {
        let ids: Vec<_> = arbiters.iter().map(|a| a.catalog_identity()).collect();
        let named = ids.iter().all(|id| id.is_some() && *id == ids[0]);
        // A leader whose quorum answers now (a restarted group may hold a
        // leader from its log before any peer answered).
        let quorum = arbiters.len() == 1
            || arbiters.iter().any(|a| {
                let m = a.raft().metrics().borrow().clone();
                m.current_leader == Some(a.replica_id)
                    && m.millis_since_quorum_ack.is_some_and(|ms| ms < 1_000)
            });
        if named && quorum {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(DevError::Options(format!(
                "the arbiter group elected no leader whose writes commit within {} s; see the log above",
                CONNECT_PATIENCE.as_secs()
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

impl Dev {
    /// Makes certificates, checks the agent, starts the arbiters, then the
    /// agent. What started is stopped again when a later step fails.
    pub async fn start(options: DevOptions) -> Result<Dev, DevError> {
        let region = Label::new(REGION).expect("a valid constant");
        let ca = Ca::generate(&region)?;
        let issue = |role: Role, name: &str| -> Result<TlsMaterial, TlsError> {
            let identity = Identity::new(
                region.clone(),
                role,
                PrincipalName::new(name).expect("a valid constant"),
            );
            Ok(TlsMaterial::from_issued(
                &ca,
                &ca.issue(&identity, &[], &[])?,
            ))
        };
        let agent_tls = issue(Role::Agent, NODE)?;
        let n = options.replicas;
        if ![1, 3, 5].contains(&n) {
            return Err(DevError::Options(format!(
                "--replicas {n}: use 1, 3 or 5 (a Raft group needs an odd number to keep a majority)"
            )));
        }
        // The agent is checked (its ports bound, its data directory
        // written) before any arbiter starts: a port in use stops `dev`
        // before anything ran. Its arbiters are known once they listen.
        let agent_dir = options.data_dir.join("agent");
        let agent_config = AgentConfig {
            node_id: NODE.into(),
            region: REGION.into(),
            http_listen: options.http,
            data_dir: agent_dir.clone(),
            proxy: options.proxies.clone(),
            dns_listen: options.dns,
            ..AgentConfig::default()
        };
        let agent = process::prepare(agent_config, Some(&agent_tls)).await?;
        // Every replica must know the others' QUIC addresses before it
        // starts, so they are fixed here: --quic and the ports after it, or
        // free ports. The group's membership is stored with its log, so
        // free ports found once are kept in the data directory and used
        // again by the next start (other ports would leave every replica
        // calling addresses nobody listens on).
        let ports_file = options.data_dir.join(format!("quic-ports-{n}"));
        let kept: Option<Vec<SocketAddr>> = std::fs::read_to_string(&ports_file)
            .ok()
            .and_then(|text| text.split_whitespace().map(|a| a.parse().ok()).collect())
            .filter(|kept: &Vec<SocketAddr>| kept.len() == usize::from(n));
        let quic: Vec<SocketAddr> = match (options.quic, kept) {
            (Some(q), _) if q.port() != 0 => (0..n)
                .map(|k| SocketAddr::new(q.ip(), q.port() + u16::from(k)))
                .collect(),
            _ if n == 1 => vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            (_, Some(kept)) => kept,
            _ => {
                let free = (0..n)
                    .map(|_| {
                        std::net::UdpSocket::bind("127.0.0.1:0")
                            .and_then(|s| s.local_addr())
                            .map_err(|e| DevError::Options(format!("finding a free UDP port: {e}")))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let text: Vec<String> = free.iter().map(|a| a.to_string()).collect();
                std::fs::create_dir_all(&options.data_dir)
                    .and_then(|()| std::fs::write(&ports_file, text.join("\n") + "\n"))
                    .map_err(|e| {
                        DevError::Options(format!("writing {}: {e}", ports_file.display()))
                    })?;
                free
            }
        };
        let replicas: Vec<ReplicaEntry> = if n == 1 {
            Vec::new()
        } else {
            quic.iter()
                .enumerate()
                .map(|(k, addr)| ReplicaEntry {
                    id: k as u64 + 1,
                    addr: addr.to_string(),
                })
                .collect()
        };
        // All replicas start at once, so none asks a peer that is not
        // listening yet for its vote (openraft logs that as an error).
        let mut starting = tokio::task::JoinSet::new();
        for k in 0..n {
            let name = format!("arbiter-{}", k + 1);
            let mut config = ArbiterConfig {
                name: name.clone(),
                region: REGION.into(),
                listen: quic[usize::from(k)],
                admin: match options.admin.port() {
                    0 => options.admin,
                    port => SocketAddr::new(options.admin.ip(), port + u16::from(k)),
                },
                data_dir: if n == 1 {
                    options.data_dir.join("arbiter")
                } else {
                    options.data_dir.join(&name)
                },
                // Development: every address may be registered, so the
                // first session needs no declared addresses.
                registration: RegistrationConfig {
                    addresses: AddressRule::Any,
                    ..Default::default()
                },
                ..ArbiterConfig::default()
            };
            config.raft.id = u64::from(k) + 1;
            config.raft.replicas = replicas.clone();
            let tls = issue(Role::Arbiter, &name)?;
            starting.spawn(async move { ArbiterServer::start(config, &tls).await });
        }
        let mut arbiters = Vec::new();
        let mut failed = None;
        while let Some(started) = starting.join_next().await {
            match started {
                Ok(Ok(arbiter)) => arbiters.push(arbiter),
                Ok(Err(e)) => failed = Some(e.into()),
                Err(e) => {
                    failed = Some(DevError::Options(format!(
                        "an arbiter replica did not start: {e}"
                    )))
                }
            }
        }
        if let Some(e) = failed {
            stop_arbiters(arbiters).await;
            return Err(e);
        }
        arbiters.sort_by_key(|a| a.replica_id);
        match start_agent(agent, &arbiters).await {
            Ok(agent) => Ok(Dev {
                arbiters,
                agent,
                agent_dir,
            }),
            Err(e) => {
                stop_arbiters(arbiters).await;
                Err(e)
            }
        }
    }

    /// What `rollcall dev` prints at start: the addresses and an example.
    pub fn banner(&self) -> String {
        let http = self.agent.http_addr;
        let token = self.agent_dir.join("agent.token");
        let auth = format!("-H \"Authorization: Bearer $(cat {})\"", token.display());
        format!(
            "rollcall dev is running (region {REGION}, node {NODE})\n\
             \x20 agent HTTP API   http://{http}   (node token: {token})\n\
             {arbiters}\
             \x20 DNS              {dns} (UDP and TCP; try: dig @{dns_ip} -p {dns_port} web.default.svc.rollcall)\n\
             {proxies}\
             \x20 security         permissive (a trial, not a deployment): any node may register any service at any address, zones are as agents declare them; README \"Security model\" says how to close it\n\
             \n\
             Try it:\n\
             \x20 curl -X PUT {auth} -d '{{\"service\":\"web\",\"instance_id\":\"web-1\",\"address\":\"127.0.0.1\",\"port\":8080}}' http://{http}/v1/agent/instances\n\
             \x20 curl http://{http}/v1/endpoints/web\n\
             \x20 curl -X PUT {auth} http://{http}/v1/agent/instances/web-1/drain\n",
            token = token.display(),
            arbiters = self.arbiters.iter().map(|a| format!(
                "  arbiter {id}        admin http://{admin}   QUIC {quic}   (operator token: {token})\n",
                id = a.replica_id,
                admin = a.admin_addr,
                quic = a.quic_addr,
                token = a.token_file.display(),
            )).collect::<String>(),
            dns = self.agent.dns_addr,
            dns_ip = self.agent.dns_addr.ip(),
            dns_port = self.agent.dns_addr.port(),
            proxies = self.agent.proxies.iter().map(|p| format!("  proxy            {} -> {}\n", p.local_addr, p.service)).collect::<String>(),
        )
    }

    /// The addresses and token files the operator commands default to.
    pub fn targets(&self) -> crate::targets::DevTargets {
        crate::targets::DevTargets {
            regions: vec![crate::targets::RegionTargets {
                region: REGION.to_owned(),
                agent: format!("http://{}", self.agent.http_addr),
                agent_token_file: self.agent_dir.join("agent.token"),
                arbiters: self
                    .arbiters
                    .iter()
                    .map(|a| crate::targets::ArbiterTargets {
                        replica: a.replica_id,
                        admin: a.admin_addr.to_string(),
                        token_file: a.token_file.clone(),
                    })
                    .collect(),
            }],
        }
    }

    /// Stops the agent, then the arbiters (all at once).
    pub async fn shutdown(self) {
        self.agent.shutdown().await;
        stop_arbiters(self.arbiters).await;
    }
}

/// Once the arbiter group commits writes, starts the prepared agent on it
/// and waits for its session; an agent that started is stopped again if
/// that wait fails.
async fn start_agent(
    mut agent: process::Prepared,
    arbiters: &[ArbiterServer],
) -> Result<AgentHandle, DevError> {
    named(arbiters).await?;
    agent.set_arbiters(arbiters.iter().map(|a| a.quic_addr.to_string()).collect())?;
    let agent = agent.start().await;
    match connected(&agent).await {
        Ok(()) => Ok(agent),
        Err(e) => {
            agent.shutdown().await;
            Err(e)
        }
    }
}

/// Stops every one of `arbiters`, all at once, in three steps so that no
/// replica replicates to a peer that already closed (openraft logs that as
/// an error) and no follower misses the leader's heartbeats long enough to
/// call an election: every core, then every Raft (leaders first), then
/// every endpoint (each wait cut short at [`STOP_PATIENCE`]).
async fn stop_arbiters(arbiters: Vec<ArbiterServer>) {
    let mut serving = tokio::task::JoinSet::new();
    for arbiter in arbiters {
        serving.spawn(arbiter.stop_serving());
    }
    let mut stopping = Vec::new();
    while let Some(done) = serving.join_next().await {
        if let Ok(s) = done {
            stopping.push(s);
        }
    }
    stopping.sort_by_key(|s| !s.leads());
    for s in &stopping {
        s.stop_raft().await;
    }
    let mut closing = tokio::task::JoinSet::new();
    for s in stopping {
        closing.spawn(async move {
            if tokio::time::timeout(STOP_PATIENCE, s.close())
                .await
                .is_err()
            {
                tracing::info!(
                    "arbiter connections still draining; the process exits without waiting"
                );
            }
        });
    }
    while closing.join_next().await.is_some() {}
}

/// Longest wait for one arbiter of a launcher whose process then exits.
const STOP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Stops `arbiter` for a process about to exit: its writes are answered
/// and its store closed within the first part of the shutdown; the wait
/// for QUIC connections to drain (which lets the same process bind the port
/// again, and can last a peer's idle timeout when that peer stopped first)
/// is cut short at [`STOP_PATIENCE`]: the exit releases the socket anyway.
pub async fn stop_arbiter(arbiter: ArbiterServer) {
    if tokio::time::timeout(STOP_PATIENCE, arbiter.shutdown())
        .await
        .is_err()
    {
        tracing::info!("arbiter connections still draining; the process exits without waiting");
    }
}
