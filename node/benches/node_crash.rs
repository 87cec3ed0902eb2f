//! Issue 5 benchmark (a script until the chaos suite exists; not a test):
//! 32 agents in one process, one real arbiter, gossip with the `lan`
//! preset over sealed UDP on loopback. Each round crashes one agent
//! silently — its tasks stop with no leave and no close of its gossip:
//! peers' probes go unanswered, the arbiter's session with it falls silent
//! (a blackhole, not a reset) — then measures:
//! (a) crash → the arbiter's commit of the down verdict (audit time), and
//! (b) crash → the last other agent no longer offering its endpoint,
//! then restarts it (new agent run, same data directory) and waits until
//! every agent offers it again. False removals: down verdicts about nodes
//! that were not crashed.
//!
//! Run: `cargo bench -p rollcall-node --bench node_crash` (env CRASHES,
//! default 100; AGENTS, default 32). Everything shares 2 cores. `cargo
//! test` runs it as a smoke test (4 agents, 2 crashes): it fails unless
//! every crash was seen both at the arbiter and at the last agent.

#[path = "../../leases/benches/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rollcall_config::{AgentConfig, ArbiterConfig};
use rollcall_gossip::ZoneKey;
use rollcall_leases::identity::Identity;
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role, ServiceKey};
use rollcall_node::process::{self, Agent, AgentHandle};
use rollcall_node::view::Lookup;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

struct Fleet {
    ca: Ca,
    dir: tempfile::TempDir,
    arbiter: SocketAddr,
    key: std::path::PathBuf,
}

impl Fleet {
    fn config(&self, i: usize, seed: Option<SocketAddr>, gossip: SocketAddr) -> AgentConfig {
        let mut c = AgentConfig {
            node_id: format!("node-{i:02}"),
            data_dir: self.dir.path().join(format!("agent-{i:02}")),
            http_listen: "127.0.0.1:0".parse().unwrap(),
            dns_listen: "127.0.0.1:0".parse().unwrap(),
            arbiters: vec![self.arbiter.to_string()],
            reconnect_min_ms: 50,
            reconnect_max_ms: 500,
            services: vec!["default/web/default".into()],
            ..AgentConfig::default()
        };
        c.gossip.key_file = Some(self.key.clone());
        c.gossip.listen = gossip;
        c.gossip.seeds = seed.into_iter().map(|s| s.to_string()).collect();
        c
    }

    /// Starts agent `i`; `gossip` is its gossip address (port 0 the first
    /// time; a restart keeps the address, as a real agent's fixed port does).
    async fn start(&self, i: usize, seed: Option<SocketAddr>, gossip: SocketAddr) -> AgentHandle {
        let config = self.config(i, seed, gossip);
        let identity = Identity::new(
            Label::new("r1").unwrap(),
            Role::Agent,
            PrincipalName::new(&config.node_id).unwrap(),
        );
        let tls = TlsMaterial::from_issued(&self.ca, &self.ca.issue(&identity, &[], &[]).unwrap());
        process::start(config, Some(&tls)).await.unwrap()
    }
}

fn offers(agent: &Agent, key: &ServiceKey, node: &str) -> bool {
    match agent.lookup(key) {
        Lookup::Serve(a) => a
            .selection
            .candidates
            .iter()
            .any(|c| c.record.node_id.as_str() == node),
        _ => false,
    }
}

fn main() {
    rollcall_leases::tls::install_crypto_provider();
    support::announce("node_crash");
    rollcall_node::runtime::block_on(Some(2), run());
}

async fn run() {
    let agents_n = support::sized("AGENTS", 32, 4);
    let crashes = support::sized("CRASHES", 100, 2);
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let arbiter_tls = TlsMaterial::from_issued(
        &ca,
        &ca.issue(
            &Identity::new(
                Label::new("r1").unwrap(),
                Role::Arbiter,
                PrincipalName::new("arbiter-1").unwrap(),
            ),
            &[],
            &[],
        )
        .unwrap(),
    );
    let arbiter_config = ArbiterConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().join("arbiter"),
        ..ArbiterConfig::default()
    };
    let server = ArbiterServer::start(arbiter_config, &arbiter_tls)
        .await
        .unwrap();
    let key = dir.path().join("zone.key");
    std::fs::write(&key, ZoneKey::generate_line(1)).unwrap();
    let fleet = Fleet {
        ca,
        dir,
        arbiter: server.quic_addr,
        key,
    };
    let web = ServiceKey::new("default", "web", "default").unwrap();
    let client = reqwest::Client::new();
    let admin = format!("http://{}", server.admin_addr);
    let token = std::fs::read_to_string(&server.token_file)
        .unwrap()
        .trim()
        .to_owned();

    let mut agents: Vec<Option<AgentHandle>> = Vec::new();
    let mut seed = None;
    for i in 0..agents_n {
        let a = fleet.start(i, seed, "127.0.0.1:0".parse().unwrap()).await;
        seed = seed.or(a.gossip.as_ref().map(|g| g.local_addr));
        let body = serde_json::json!({"service": "web", "instance_id": format!("web-{i:02}"), "address": "127.0.0.1", "port": 9000 + i});
        client
            .put(format!("http://{}/v1/agent/instances", a.http_addr))
            .bearer_auth(a.agent.token())
            .json(&body)
            .send()
            .await
            .unwrap();
        agents.push(Some(a));
    }
    let all_offer = |agents: &Vec<Option<AgentHandle>>, n: usize| {
        agents.iter().flatten().all(|a| match a.agent.lookup(&web) {
            Lookup::Serve(ans) => ans.selection.candidates.len() == n,
            _ => false,
        })
    };
    let start = Instant::now();
    while !all_offer(&agents, agents_n) {
        if start.elapsed() > Duration::from_secs(60) {
            let seen: Vec<String> = agents
                .iter()
                .flatten()
                .map(|a| match a.agent.lookup(&web) {
                    Lookup::Serve(ans) => ans.selection.candidates.len().to_string(),
                    other => format!("{other:?}"),
                })
                .collect();
            panic!("the fleet did not converge in 60 s; endpoints offered per agent: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{agents_n} agents up, each offering {agents_n} endpoints; lan preset; {crashes} crashes"
    );

    let mut to_commit = Vec::new();
    let mut to_last_agent = Vec::new();
    let deadline = Duration::from_secs(30);
    for k in 0..crashes {
        let i = (k * 7) % agents_n;
        let node = format!("node-{i:02}");
        let victim = agents[i].take().unwrap();
        let gossip_addr = victim.gossip.as_ref().unwrap().local_addr;
        let crash_ms = unix_ms();
        let t0 = Instant::now();
        victim.shutdown().await;
        loop {
            if !agents
                .iter()
                .flatten()
                .any(|a| offers(&a.agent, &web, &node))
            {
                to_last_agent.push(t0.elapsed().as_secs_f64() * 1e3);
                break;
            }
            if t0.elapsed() > deadline {
                println!("crash {k}: {node} still offered after {deadline:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The views may drop the node before the arbiter commits: agents
        // hold a gossip-down node out locally until the arbiter, which
        // waits for its own session's silence, settles the report. Poll the
        // audit log for the commit, within the same deadline.
        loop {
            let audit = audit_log(&client, &admin, &token).await;
            let committed = audit
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| {
                    e["command"] == "node-down"
                        && e["detail"].as_str().unwrap_or("").contains(&node)
                })
                .filter_map(|e| e["at_ms"].as_u64())
                .find(|t| *t >= crash_ms);
            if let Some(at) = committed {
                to_commit.push((at - crash_ms) as f64);
                break;
            }
            if t0.elapsed() > deadline {
                println!("crash {k}: no down verdict for {node} after {deadline:?}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Restart it: a new agent run with the same data directory.
        agents[i] = Some(fleet.start(i, seed, gossip_addr).await);
        let back = Instant::now();
        while !all_offer(&agents, agents_n) && back.elapsed() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let audit = audit_log(&client, &admin, &token).await;
    let verdicts = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] == "node-down")
        .count();
    let (seen_at_arbiter, seen_everywhere) = (to_commit.len(), to_last_agent.len());
    support::report(
        "(a) crash -> arbiter commits the down verdict",
        to_commit,
        "ms",
        0,
    );
    support::report(
        "(b) crash -> last agent stops offering the endpoint",
        to_last_agent,
        "ms",
        0,
    );
    println!(
        "down verdicts committed: {verdicts} for {crashes} crashes (false removals: {})",
        verdicts.saturating_sub(crashes)
    );
    support::expect_samples("(a) crashes committed as down", seen_at_arbiter, crashes);
    support::expect_samples("(b) crashes out of every view", seen_everywhere, crashes);
}

/// The arbiter's audit log (its last 10,000 entries) from the admin API.
async fn audit_log(client: &reqwest::Client, admin: &str, token: &str) -> serde_json::Value {
    client
        .get(format!("{admin}/v1/audit?limit=10000"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
