//! `rollcall dev`: the embedded default. One process with an arbiter and an
//! agent on loopback, a throwaway CA and certificates made at start, data
//! under one directory. For trying rollcall on a laptop, never production:
//! the CA lives only in memory and is new at every start.

use std::net::SocketAddr;
use std::path::PathBuf;

use rollcall_config::{AgentConfig, ArbiterConfig, ProxyEntry};
use rollcall_leases::identity::Identity;
use rollcall_leases::server::{ArbiterServer, ServerError};
use rollcall_leases::tls::{Ca, TlsError, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role};

use crate::agent::{Agent, AgentError, AgentHandle};

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
}

/// A running dev cluster.
pub struct Dev {
    /// The arbiter.
    pub arbiter: ArbiterServer,
    /// The agent.
    pub agent: AgentHandle,
    /// The agent's data directory (its token file is `agent.token` there).
    pub agent_dir: PathBuf,
}

const REGION: &str = "r1";
const NODE: &str = "dev-node";

impl Dev {
    /// Makes certificates, starts the arbiter, then the agent.
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
        let arbiter_tls = issue(Role::Arbiter, "arbiter-1")?;
        let agent_tls = issue(Role::Agent, NODE)?;

        let arbiter_config = ArbiterConfig {
            region: REGION.into(),
            listen: options
                .quic
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0))),
            admin: options.admin,
            data_dir: options.data_dir.join("arbiter"),
            ..ArbiterConfig::default()
        };
        let arbiter = ArbiterServer::start(arbiter_config, &arbiter_tls).await?;
        let agent_dir = options.data_dir.join("agent");
        let agent_config = AgentConfig {
            node_id: NODE.into(),
            region: REGION.into(),
            http_listen: options.http,
            data_dir: agent_dir.clone(),
            arbiters: vec![arbiter.quic_addr.to_string()],
            proxy: options.proxies.clone(),
            dns_listen: options.dns,
            ..AgentConfig::default()
        };
        let agent = Agent::start(agent_config, Some(&agent_tls)).await?;
        Ok(Dev {
            arbiter,
            agent,
            agent_dir,
        })
    }

    /// What `rollcall dev` prints at start: the addresses and an example.
    pub fn banner(&self) -> String {
        let http = self.agent.http_addr;
        let token = self.agent_dir.join("agent.token");
        let auth = format!("-H \"Authorization: Bearer $(cat {})\"", token.display());
        format!(
            "rollcall dev is running (region {REGION}, node {NODE})\n\
             \x20 agent HTTP API   http://{http}   (node token: {token})\n\
             \x20 arbiter admin    http://{admin}   (operator token: {admin_token})\n\
             \x20 arbiter QUIC     {quic}\n\
             \x20 DNS              {dns} (UDP and TCP; try: dig @{dns_ip} -p {dns_port} web.default.svc.rollcall)\n\
             {proxies}\
             \n\
             Try it:\n\
             \x20 curl -X PUT {auth} -d '{{\"service\":\"web\",\"instance_id\":\"web-1\",\"address\":\"127.0.0.1\",\"port\":8080}}' http://{http}/v1/agent/instances\n\
             \x20 curl http://{http}/v1/endpoints/web\n\
             \x20 curl -X PUT {auth} http://{http}/v1/agent/instances/web-1/drain\n",
            token = token.display(),
            admin = self.arbiter.admin_addr,
            admin_token = self.arbiter.token_file.display(),
            quic = self.arbiter.quic_addr,
            dns = self.agent.dns_addr,
            dns_ip = self.agent.dns_addr.ip(),
            dns_port = self.agent.dns_addr.port(),
            proxies = self.agent.proxies.iter().map(|p| format!("  proxy            {} -> {}\n", p.local_addr, p.service)).collect::<String>(),
        )
    }

    /// Stops the agent, then the arbiter.
    pub async fn shutdown(self) {
        self.agent.shutdown().await;
        self.arbiter.shutdown().await;
    }
}
