//! `rollcall dev --regions N`: N regions in one process, for trying
//! cross-region behaviour (R9) on a laptop. Region k (`r1`, `r2`, …) has its
//! own throwaway CA, an arbiter, an agent that is also the region's ingress
//! gateway, and a region bridge dialling every other region's bridge, all
//! on loopback. Never production: the CAs live only in memory.
//!
//! Ports, from the base `B` (the agent HTTP address given with `--http`,
//! default 127.0.0.1:7070), for region k: agent HTTP `B + 10(k−1)`, arbiter
//! admin `+1`, agent ingress gateway `+2`, bridge QUIC (UDP) `+3`, agent DNS
//! `+4` (UDP and TCP), bridge metrics `+5`. The arbiter's QUIC port is a
//! free one, or with `--quic Q` region k's is `Q + 10(k−1)`, so every port
//! can be pinned. A base port of 0 takes free ports for everything (tests
//! do).

use std::net::SocketAddr;
use std::path::PathBuf;

use rollcall_config::{
    AddressRule, AgentConfig, ArbiterConfig, BridgeArbiter, BridgeConfig, BridgePeer,
    RegistrationConfig,
};
use rollcall_leases::identity::Identity;
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsError, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role};
use rollcall_region_bridge::{Bridge, BridgeTls};

use crate::dev::DevError;
use rollcall_node::process::{self, AgentHandle};

/// Most regions `--regions` starts.
pub const MAX_REGIONS: u8 = 9;

/// What `DevRegions::start` starts.
#[derive(Clone, Debug)]
pub struct RegionsOptions {
    /// How many regions (2 to [`MAX_REGIONS`]).
    pub regions: u8,
    /// Data directory; region k keeps its data under `r<k>/`.
    pub data_dir: PathBuf,
    /// The base address (region r1's agent HTTP API); port 0: free ports.
    pub base: SocketAddr,
    /// Region r1's arbiter QUIC address (region k's port is 10(k−1)
    /// above it); free ports when `None`.
    pub quic: Option<SocketAddr>,
    /// TCP proxy listeners on region r1's agent.
    pub proxies: Vec<rollcall_config::ProxyEntry>,
    /// How often each bridge reads its arbiter, ms. Default 1000.
    pub sync_interval_ms: u64,
    /// Past this age a region's summaries count as unknown, ms. Default
    /// 10000.
    pub summary_max_age_ms: u64,
}

impl RegionsOptions {
    /// `regions` regions under `data_dir` from `base`, the rest default.
    pub fn new(regions: u8, data_dir: PathBuf, base: SocketAddr) -> Self {
        RegionsOptions {
            regions,
            data_dir,
            base,
            quic: None,
            proxies: Vec::new(),
            sync_interval_ms: 1_000,
            summary_max_age_ms: 10_000,
        }
    }
}

/// One region of the dev cluster.
pub struct DevRegion {
    /// Its name, `r<k>`.
    pub name: String,
    /// Its arbiter.
    pub arbiter: ArbiterServer,
    /// Its agent (and ingress gateway).
    pub agent: AgentHandle,
    /// Its bridge; `None` once stopped (`DevRegions::stop_bridge`).
    pub bridge: Option<Bridge>,
    /// What its bridge was started with (`DevRegions::start_bridge`).
    bridge_config: BridgeConfig,
    /// The agent's data directory (its token file is `agent.token` there).
    pub agent_dir: PathBuf,
}

/// A running multi-region dev cluster.
pub struct DevRegions {
    /// The regions, r1 first.
    pub regions: Vec<DevRegion>,
    cas: Vec<Ca>,
    data_dir: PathBuf,
}

const NODE: &str = "dev-node";

fn port(base: SocketAddr, k: u8, offset: u16) -> Result<SocketAddr, DevError> {
    step("--http", base, k, offset)
}

/// The address `10k + offset` ports above `base` (the flag `flag` gave),
/// or `base` itself for port 0 (a free port).
fn step(flag: &str, base: SocketAddr, k: u8, offset: u16) -> Result<SocketAddr, DevError> {
    if base.port() == 0 {
        return Ok(base);
    }
    base.port()
        .checked_add(10 * u16::from(k) + offset)
        .map(|p| SocketAddr::new(base.ip(), p))
        .ok_or_else(|| DevError::Options(format!("{flag} {base}: the ports of {} regions do not fit below 65536; pick a lower base port", k + 1)))
}

/// Region `k`'s bridge certificate, issued by its CA, and the other
/// regions' CAs it trusts.
fn bridge_tls(cas: &[Ca], k: usize) -> Result<BridgeTls, TlsError> {
    let identity = Identity::new(
        cas[k].region().clone(),
        Role::Bridge,
        PrincipalName::new(&format!("bridge-{}", cas[k].region()))
            .expect("bridge-r<k> is a valid name"),
    );
    Ok(BridgeTls {
        material: TlsMaterial::from_issued(&cas[k], &cas[k].issue(&identity, &[], &[])?),
        peer_cas: cas
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != k)
            .map(|(_, ca)| (ca.region().clone(), vec![ca.cert_der().clone()]))
            .collect(),
    })
}

impl DevRegions {
    /// Starts the regions `options` asks for.
    pub async fn start(options: RegionsOptions) -> Result<DevRegions, DevError> {
        let RegionsOptions {
            regions: n,
            data_dir,
            base,
            quic,
            proxies,
            sync_interval_ms,
            summary_max_age_ms,
        } = options;
        if !(2..=MAX_REGIONS).contains(&n) {
            return Err(DevError::Options(format!(
                "--regions {n}: use 2 to {MAX_REGIONS} (one region is plain `rollcall dev`)"
            )));
        }
        // The bridges dial each other, so each must know the others' ports
        // before any starts: fixed from the base, or free ones found now.
        let bridge_ports: Vec<SocketAddr> = (0..n)
            .map(|k| match base.port() {
                0 => std::net::UdpSocket::bind(SocketAddr::new(base.ip(), 0))
                    .and_then(|s| s.local_addr())
                    .map_err(|e| DevError::Options(format!("finding a free UDP port: {e}"))),
                _ => port(base, k, 3),
            })
            .collect::<Result<_, _>>()?;
        let names: Vec<String> = (1..=n).map(|k| format!("r{k}")).collect();
        let cas: Vec<Ca> = names
            .iter()
            .map(|r| Ca::generate(&Label::new(r).expect("r<k> is a valid label")))
            .collect::<Result<_, _>>()?;
        let issue = |k: usize, role: Role, name: &str| -> Result<TlsMaterial, TlsError> {
            let identity = Identity::new(
                cas[k].region().clone(),
                role,
                PrincipalName::new(name).expect("a valid constant"),
            );
            Ok(TlsMaterial::from_issued(
                &cas[k],
                &cas[k].issue(&identity, &[], &[])?,
            ))
        };
        // Every region's agent is checked (its ports bound, its data
        // directory written) before anything starts: a port in use stops
        // `dev` before anything ran. Its arbiter is known once it listens.
        let mut agents = Vec::new();
        for (k, name) in names.iter().enumerate() {
            let kk = k as u8;
            let mut agent_config = AgentConfig {
                node_id: NODE.into(),
                region: name.clone(),
                http_listen: port(base, kk, 0)?,
                dns_listen: port(base, kk, 4)?,
                data_dir: data_dir.join(name).join("agent"),
                proxy: if k == 0 { proxies.clone() } else { Vec::new() },
                ..AgentConfig::default()
            };
            agent_config.ingress.listen = Some(port(base, kk, 2)?);
            agents.push(process::prepare(agent_config, Some(&issue(k, Role::Agent, NODE)?)).await?);
        }
        let mut regions = Vec::new();
        for ((k, name), agent) in names.iter().enumerate().zip(agents) {
            let kk = k as u8;
            let dir = data_dir.join(name);
            // What started of this region is stopped when a later step
            // fails; then the regions before it are (below).
            let region = async {
                let arbiter_config = ArbiterConfig {
                    name: format!("arbiter-{name}"),
                    region: name.clone(),
                    listen: match quic {
                        Some(quic) => step("--quic", quic, kk, 0)?,
                        None => SocketAddr::from(([127, 0, 0, 1], 0)),
                    },
                    admin: port(base, kk, 1)?,
                    data_dir: dir.join("arbiter"),
                    registration: RegistrationConfig {
                        addresses: AddressRule::Any,
                        ..Default::default()
                    },
                    ..ArbiterConfig::default()
                };
                let arbiter = ArbiterServer::start(
                    arbiter_config,
                    &issue(k, Role::Arbiter, &format!("arbiter-{name}"))?,
                )
                .await?;
                let rest = async {
                    crate::dev::named(std::slice::from_ref(&arbiter)).await?;
                    let mut agent = agent;
                    agent.set_arbiters(vec![arbiter.quic_addr.to_string()])?;
                    let agent = agent.start().await;
                    let bridge = async {
                        crate::dev::connected(&agent).await?;
                        let ingress = agent
                            .ingress_addr
                            .map(|a| a.to_string())
                            .into_iter()
                            .collect();
                        let peers = names
                            .iter()
                            .enumerate()
                            .filter(|(j, _)| *j != k)
                            .map(|(j, peer)| BridgePeer {
                                region: peer.clone(),
                                address: bridge_ports[j].to_string(),
                                ca: dir.join(format!("{peer}-ca.crt")),
                            })
                            .collect();
                        let bridge_config = BridgeConfig {
                            name: format!("bridge-{name}"),
                            region: name.clone(),
                            listen: bridge_ports[k],
                            peers,
                            ingress,
                            summary_max_age_ms,
                            sync_interval_ms,
                            metrics_listen: Some(port(base, kk, 5)?),
                            arbiter: BridgeArbiter {
                                admin: vec![arbiter.admin_addr.to_string()],
                                token_file: arbiter.bridge_token_file.clone(),
                                https: true,
                            },
                            tls: None,
                        };
                        let tls = bridge_tls(&cas, k)?;
                        Bridge::start(bridge_config.clone(), tls)
                            .await
                            .map(|bridge| (bridge, bridge_config))
                            .map_err(|e| DevError::Options(format!("region {name}'s bridge: {e}")))
                    }
                    .await;
                    match bridge {
                        Ok(bridge) => Ok((agent, bridge)),
                        Err(e) => {
                            agent.shutdown().await;
                            Err(e)
                        }
                    }
                }
                .await;
                match rest {
                    Ok((agent, (bridge, bridge_config))) => Ok(DevRegion {
                        name: name.clone(),
                        arbiter,
                        agent,
                        bridge: Some(bridge),
                        bridge_config,
                        agent_dir: dir.join("agent"),
                    }),
                    Err(e) => {
                        crate::dev::stop_arbiter(arbiter).await;
                        Err(e)
                    }
                }
            }
            .await;
            match region {
                Ok(region) => regions.push(region),
                Err(e) => {
                    let started = DevRegions {
                        regions,
                        cas,
                        data_dir,
                    };
                    started.shutdown().await;
                    return Err(e);
                }
            }
        }
        Ok(DevRegions {
            regions,
            cas,
            data_dir,
        })
    }

    /// What `rollcall dev --regions N` prints at start.
    pub fn banner(&self) -> String {
        let mut out = format!(
            "rollcall dev is running {} regions in one process (node {NODE} in each)\n",
            self.regions.len()
        );
        for r in &self.regions {
            out.push_str(&format!(
                "  region {name}\n\
                 \x20   agent HTTP API   http://{http}   (node token: {token})\n\
                 \x20   arbiter admin    http://{admin}   QUIC {quic}   (operator token: {op})\n\
                 \x20   ingress gateway  {ingress}\n\
                 \x20   bridge QUIC      {bridge}   metrics http://{bridge_metrics}/metrics\n\
                 \x20   DNS              {dns}\n{proxies}",
                name = r.name,
                http = r.agent.http_addr,
                token = r.agent_dir.join("agent.token").display(),
                admin = r.arbiter.admin_addr,
                quic = r.arbiter.quic_addr,
                op = r.arbiter.token_file.display(),
                ingress = r
                    .agent
                    .ingress_addr
                    .map_or("-".to_owned(), |a| a.to_string()),
                bridge = r
                    .bridge
                    .as_ref()
                    .map_or("stopped".to_owned(), |b| b.listen_addr.to_string()),
                bridge_metrics = r
                    .bridge
                    .as_ref()
                    .and_then(|b| b.metrics_addr)
                    .map_or("-".to_owned(), |a| a.to_string()),
                dns = r.agent.dns_addr,
                proxies = r
                    .agent
                    .proxies
                    .iter()
                    .map(|p| format!("    proxy            {} -> {}\n", p.local_addr, p.service))
                    .collect::<String>(),
            ));
        }
        if let [r1, r2, ..] = self.regions.as_slice() {
            let a1 = r1.agent.http_addr;
            let a2 = r2.agent.http_addr;
            let auth = |r: &DevRegion| {
                format!(
                    "-H \"Authorization: Bearer $(cat {})\"",
                    r.agent_dir.join("agent.token").display()
                )
            };
            let op = format!(
                "-H \"Authorization: Bearer $(cat {})\"",
                r1.arbiter.token_file.display()
            );
            out.push_str(&format!(
                "\nTry failover (web in r2 only; r1's policy sends r1's callers there):\n\
                 \x20 rollcall echo --listen 127.0.0.1:8080 --id web-r2 &\n\
                 \x20 curl -X PUT {auth2} -d '{{\"service\":\"web\",\"instance_id\":\"web-r2\",\"address\":\"127.0.0.1\",\"port\":8080}}' http://{a2}/v1/agent/instances\n\
                 \x20 curl -X PUT {op} -H 'Content-Type: application/json' -d '{{\"policy\":[{{\"service\":\"default/web\",\"home_region\":\"r1\",\"cross_region\":true,\"failover_traffic\":\"all\",\"failover_order\":[\"r2\"]}}]}}' http://{admin1}/v1/policies\n\
                 \x20 curl http://{a1}/v1/endpoints/web      # region r2, failover.ingress (after a sync interval or two)\n\
                 \x20 curl http://{a1}/v1/regions\n{proxy}",
                auth2 = auth(r2),
                proxy = r1
                    .agent
                    .proxies
                    .first()
                    .map(|p| format!("  exec 3<>/dev/tcp/{}/{}; head -1 <&3      # {} answers through r2's ingress\n", p.local_addr.ip(), p.local_addr.port(), p.service))
                    .unwrap_or_default(),
                admin1 = r1.arbiter.admin_addr,
            ));
        }
        out
    }

    /// Starts one more agent, node `node`, in region `k` (0 is r1), on
    /// free loopback ports, connected to that region's arbiter (tests and
    /// benchmarks: a caller and an instance on different nodes).
    pub async fn start_agent(&self, k: usize, node: &str) -> Result<AgentHandle, DevError> {
        let region = &self.regions[k];
        let identity = Identity::new(
            self.cas[k].region().clone(),
            Role::Agent,
            PrincipalName::new(node).map_err(|e| DevError::Options(e.to_string()))?,
        );
        let tls = TlsMaterial::from_issued(&self.cas[k], &self.cas[k].issue(&identity, &[], &[])?);
        let free = SocketAddr::from(([127, 0, 0, 1], 0));
        let config = AgentConfig {
            node_id: node.into(),
            region: region.name.clone(),
            http_listen: free,
            dns_listen: free,
            data_dir: self.data_dir.join(&region.name).join(node),
            arbiters: vec![region.arbiter.quic_addr.to_string()],
            ..AgentConfig::default()
        };
        let agent = process::start(config, Some(&tls)).await?;
        crate::dev::connected(&agent).await?;
        Ok(agent)
    }

    /// Stops region `k`'s bridge (0 is r1): the other regions stop
    /// hearing from it, as in a partition between bridges.
    pub async fn stop_bridge(&mut self, k: usize) {
        if let Some(bridge) = self.regions.get_mut(k).and_then(|r| r.bridge.take()) {
            bridge.shutdown().await;
        }
    }

    /// Starts region `k`'s bridge again after `stop_bridge`, with the
    /// same configuration and a new certificate from the region's CA: the
    /// partition between bridges heals. Nothing happens while it runs.
    pub async fn start_bridge(&mut self, k: usize) -> Result<(), DevError> {
        let tls = bridge_tls(&self.cas, k)?;
        let region = &mut self.regions[k];
        if region.bridge.is_none() {
            let bridge = Bridge::start(region.bridge_config.clone(), tls)
                .await
                .map_err(|e| DevError::Options(format!("region {}'s bridge: {e}", region.name)))?;
            region.bridge = Some(bridge);
        }
        Ok(())
    }

    /// The addresses and token files the operator commands default to.
    pub fn targets(&self) -> crate::targets::DevTargets {
        crate::targets::DevTargets {
            regions: self
                .regions
                .iter()
                .map(|r| crate::targets::RegionTargets {
                    region: r.name.clone(),
                    agent: format!("http://{}", r.agent.http_addr),
                    agent_token_file: r.agent_dir.join("agent.token"),
                    arbiters: vec![crate::targets::ArbiterTargets {
                        replica: r.arbiter.replica_id,
                        admin: r.arbiter.admin_addr.to_string(),
                        token_file: r.arbiter.token_file.clone(),
                    }],
                })
                .collect(),
        }
    }

    /// Stops every bridge, agent and arbiter.
    pub async fn shutdown(self) {
        // The regions stop side by side; in each, bridge, agent, arbiter.
        let mut stopping = tokio::task::JoinSet::new();
        for r in self.regions {
            stopping.spawn(async move {
                if let Some(bridge) = r.bridge {
                    bridge.shutdown().await;
                }
                r.agent.shutdown().await;
                crate::dev::stop_arbiter(r.arbiter).await;
            });
        }
        while stopping.join_next().await.is_some() {}
    }
}
