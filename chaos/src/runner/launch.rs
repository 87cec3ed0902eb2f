//! Starting a run's cluster: certificates and configs, the arbiter
//! replicas, the agents, their backends and the records they register.

use super::*;

/// Certificates, the arbiter, agents and backends; returns when every agent
/// routes to every instance.
pub(super) async fn start(cluster: &mut Cluster, scenario: &Scenario) -> Result<(), RunError> {
    let work = cluster.work.clone();
    let certs = work.join("certs");
    let mut args: Vec<String> = vec![
        "certs".into(),
        "--out".into(),
        certs.display().to_string(),
        "--region".into(),
        "r1".into(),
    ];
    // Each replica's certificate names its own address (and its relay's,
    // which its peers dial): the peer link admits a replica only by a
    // member's address, so every run exercises that check.
    for (k, (quic, _)) in cluster.arbiters.iter().enumerate() {
        let mut own = quic.ip().to_string();
        if let Some(relay) = cluster.relays.get(k) {
            own.push_str(&format!(",{}", relay.addr.ip()));
        }
        args.extend(["--arbiter".into(), format!("arbiter-{}={own}", k + 1)]);
    }
    // Each agent's certificate names its node's address as an IP SAN: what
    // the arbiter (`registration.addresses = "declared"`, the default) lets
    // the node register, as on a production fleet.
    for (i, node) in cluster.nodes.iter().enumerate() {
        args.extend(["--agent".into(), format!("{node}={}", cluster.node_ip(i))]);
    }
    if let Some(ip) = cluster.rogue_ip {
        args.extend(rogue::cert_args(ip));
    }
    if let Some(host) = cluster.bridge_host {
        args.extend([
            "--bridge".into(),
            "bridge-r1".into(),
            "--ip".into(),
            cluster.node_ip(host).to_string(),
        ]);
    }
    let status = Command::new(&cluster.binary)
        .args(&args)
        .stdout(Stdio::null())
        .status()
        .map_err(io("rollcall certs"))?;
    if !status.success() {
        return Err(RunError::Cluster("rollcall certs failed".into()));
    }
    if cluster.rogue_ip.is_some() {
        rogue::revoke(cluster, &certs)?;
    }
    let key = Command::new(&cluster.binary)
        .args(["gossip-key", "--id", "1"])
        .output()
        .map_err(io("rollcall gossip-key"))?;
    std::fs::write(work.join("zone.key"), &key.stdout).map_err(io("writing zone.key"))?;

    let replicas: String = if cluster.arbiters.len() == 1 {
        String::new()
    } else {
        cluster
            .arbiters
            .iter()
            .enumerate()
            .map(|(k, (quic, _))| {
                // Peers dial the replica's relay when there is one.
                let addr = cluster.relays.get(k).map_or(*quic, |r| r.addr);
                format!("[[raft.replicas]]\nid = {}\naddr = \"{addr}\"\n", k + 1)
            })
            .collect()
    };
    for k in 0..cluster.arbiters.len() {
        let (quic, admin) = cluster.arbiters[k];
        let mut toml = format!(
            "name = \"arbiter-{id}\"\nlisten = \"{quic}\"\nadmin = \"{admin}\"\ndata_dir = \"{data}\"\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/arbiter-arbiter-{id}.crt\"\nkey = \"{c}/arbiter-arbiter-{id}.key\"\n[raft]\nid = {id}\n{replicas}",
            id = k + 1,
            data = work.join(format!("arbiter-{}", k + 1)).display(),
            c = certs.display()
        );
        if let Some(extra) = &scenario.arbiter_toml {
            toml.push('\n');
            toml.push_str(extra);
            toml.push('\n');
        }
        if cluster.rogue_ip.is_some() {
            toml.push_str(&rogue::node_zones(cluster));
        }
        let path = work.join(format!("arbiter-{}.toml", k + 1));
        std::fs::write(&path, toml).map_err(io(format!("writing {}", path.display())))?;
        start_arbiter(cluster, k)?;
    }
    for i in 0..cluster.nodes.len() {
        for k in 0..cluster.instances[i].len() {
            let (id, port) = (cluster.instances[i][k].clone(), cluster.ports[i][k]);
            start_echo(cluster, i, &id, port)?;
        }
        start_agent(cluster, i)?;
    }
    for i in 0..cluster.nodes.len() {
        let node = cluster.nodes[i].clone();
        cluster
            .wait(&format!("{node} connected to the arbiter"), async || {
                cluster
                    .agent_get(i, "/v1/status")
                    .await
                    .is_some_and(|s| s["arbiter"]["connected"] == true)
            })
            .await?;
        for k in 0..cluster.instances[i].len() {
            let (id, port) = (cluster.instances[i][k].clone(), cluster.ports[i][k]);
            register(cluster, i, &id, port).await?;
        }
    }
    // The extra services: one record each on node-0 whose readiness port
    // has no listener, so it stays STARTING and takes no traffic.
    for k in 0..cluster.extra_services {
        register_record(
            cluster,
            0,
            &format!("extra-{k}"),
            &format!("extra-{k}-0"),
            EXTRA_PORT,
        )
        .await?;
    }
    // Every node knows its zone peers before the first fault: a node that
    // knows nobody would never report a peer down.
    for i in 0..cluster.nodes.len() {
        let peers = cluster
            .zones
            .iter()
            .filter(|z| **z == cluster.zones[i])
            .count()
            - 1;
        cluster
            .wait(
                &format!(
                    "{} sees its {peers} zone peers through gossip",
                    cluster.nodes[i]
                ),
                async || {
                    cluster.agent_get(i, "/v1/status").await.is_some_and(|s| {
                        s["gossip"]["alive"]
                            .as_array()
                            .is_some_and(|a| a.len() == peers)
                    })
                },
            )
            .await?;
    }
    let total: usize = cluster.instances.iter().map(Vec::len).sum();
    for i in 0..cluster.nodes.len() {
        let path = format!("/v1/endpoints/{}", scenario.service);
        cluster
            .wait("every agent routes to every instance", async || {
                cluster
                    .agent_get(i, &path)
                    .await
                    .is_some_and(|b| b["endpoints"].as_array().is_some_and(|e| e.len() == total))
            })
            .await?;
    }
    regions::start(cluster, scenario).await
}

/// An echo backend's HTTP health port: its data port + 1000.
pub(super) const HEALTH_PORT_OFFSET: u16 = 1000;

/// The file whose existence fails instance `id`'s readiness.
pub(super) fn not_ready_file(cluster: &Cluster, id: &str) -> PathBuf {
    cluster.work.join(format!("{id}.not-ready"))
}

/// Starts an echo backend `id` on node `i` at `port`, with its HTTP
/// health on `port` + 1000.
pub(super) fn start_echo(
    cluster: &mut Cluster,
    i: usize,
    id: &str,
    port: u16,
) -> Result<(), RunError> {
    let ip = cluster.node_ip(i);
    let flag = not_ready_file(cluster, id).display().to_string();
    cluster.spawn(
        id,
        Some(i),
        &[
            "echo".into(),
            "--listen".into(),
            format!("{ip}:{port}"),
            "--id".into(),
            id.to_owned(),
            "--health".into(),
            format!("{ip}:{}", port + HEALTH_PORT_OFFSET),
            "--not-ready-file".into(),
            flag,
        ],
    )
}

/// The budget's `fanout_us` for this rig, in µs: every agent follows the
/// scenario's service and shares the machine's two cores with the others
/// and the arbiter, so the last agent's view changes after the other
/// agents' wake-ups and applies. Measured (rolling-deploy, 20 agents, 200
/// leaves, 2026-12-03): first → last agent's view change p50 8 ms, so
/// about 8/19 ms per further agent.
pub(super) const RIG_FANOUT_US: u64 = 420;

/// The budget's `commit_ms` for this rig, in ms: in the same rolling-deploy
/// run the first agent's view changed 3 ms after the drain's proposal
/// (p50), which holds the commit (fsync included), one hop and one apply.
pub(super) const RIG_COMMIT_MS: u64 = 2;

/// Writes node `i`'s agent config (its zone, its zone's first node as the
/// gossip seed) and starts the agent.
pub(super) fn start_agent(cluster: &mut Cluster, i: usize) -> Result<(), RunError> {
    let ip = cluster.node_ip(i);
    let zone = cluster.zones[i].clone();
    // The zone's first three nodes: a restarted node rejoins through
    // another even when it is one of them (a member skips itself).
    let seeds = (0..cluster.nodes.len())
        .filter(|j| cluster.zones[*j] == zone)
        .take(3)
        .map(|j| format!("\"{}:{GOSSIP_PORT}\"", cluster.node_ip(j)))
        .collect::<Vec<_>>()
        .join(", ");
    let node = cluster.nodes[i].clone();
    let certs = cluster.work.join("certs");
    let mut toml = format!(
        "node_id = \"{node}\"\nzone = \"{zone}\"\ndata_dir = \"{data}\"\nhttp_listen = \"{ip}:{HTTP_PORT}\"\ndns_listen = \"{ip}:8600\"\narbiters = [\"{arbiter}\"]\nreconnect_min_ms = 50\nreconnect_max_ms = 1000\nservices = [{extra}]\n\
         [tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/agent-{node}.crt\"\nkey = \"{c}/agent-{node}.key\"\n\
         [gossip]\nlisten = \"{ip}:{GOSSIP_PORT}\"\nseeds = [{seeds}]\nkey_file = \"{k}\"\n{preset}\
         [budget]\ncommit_ms = {RIG_COMMIT_MS}\nfollowers = {followers}\nfanout_us = {RIG_FANOUT_US}\n\
         [[proxy]]\nservice = \"default/{service}/default\"\nlisten = \"{ip}:{PROXY_PORT}\"\n",
        data = cluster.work.join(&node).display(),
        arbiter = cluster
            .arbiters
            .iter()
            .map(|(quic, _)| quic.to_string())
            .collect::<Vec<_>>()
            .join("\", \""),
        c = certs.display(),
        k = cluster.work.join("zone.key").display(),
        extra = (0..cluster.extra_services)
            .map(|k| format!("\"default/extra-{k}/default\""))
            .collect::<Vec<_>>()
            .join(", "),
        preset = cluster
            .gossip_preset
            .as_ref()
            .map_or_else(String::new, |p| format!("preset = \"{p}\"\n")),
        service = cluster.service,
        followers = cluster.nodes.len(),
    );
    if let Some(extra) = &cluster.agent_toml {
        toml.push('\n');
        toml.push_str(extra);
        toml.push('\n');
    }
    let path = cluster.work.join(format!("{node}.toml"));
    std::fs::write(&path, toml).map_err(io(format!("writing {}", path.display())))?;
    cluster.processes.children.retain(|(n, _)| *n != node);
    cluster.spawn(
        &node,
        Some(i),
        &[
            "agent".into(),
            "--config".into(),
            path.display().to_string(),
        ],
    )
}

/// Registers instance `id` (echo on `port`) through node `i`'s agent API,
/// with an HTTP readiness check on its health port at the agent's default
/// timings: STARTING until the first probe passes, UNHEALTHY after three
/// failed or timed-out probes (a frozen backend times out).
pub(super) async fn register(
    cluster: &Cluster,
    i: usize,
    id: &str,
    port: u16,
) -> Result<(), RunError> {
    register_record(cluster, i, &cluster.service, id, port).await
}

/// The port of the extra services' records: nothing listens on it.
pub(super) const EXTRA_PORT: u16 = 8999;

/// Registers instance `id` of `service` (see [`register`]).
pub(super) async fn register_record(
    cluster: &Cluster,
    i: usize,
    service: &str,
    id: &str,
    port: u16,
) -> Result<(), RunError> {
    let token = cluster.token(i)?;
    let body = serde_json::json!({
        "service": service,
        "instance_id": id,
        "address": cluster.node_ip(i).to_string(),
        "port": port,
        "checks": {
            "readiness": {"kind": "http", "path": "/ready", "port": port + HEALTH_PORT_OFFSET},
        },
    });
    let url = format!(
        "http://{}:{HTTP_PORT}/v1/agent/instances",
        cluster.node_ip(i)
    );
    let sent = now_ms();
    let response = cluster
        .http
        .put(url)
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .map_err(|e| RunError::Cluster(format!("registering {id}: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        cluster.wrote(sent, WriteKind::Register, id, Answer::Refused);
        return Err(RunError::Cluster(format!("registering {id}: {status}")));
    }
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    let answer = if status == reqwest::StatusCode::ACCEPTED {
        Answer::Pending
    } else {
        Answer::Committed {
            generation: body["generation"].as_u64(),
        }
    };
    cluster.wrote(sent, WriteKind::Register, id, answer);
    Ok(())
}

/// An agent API call with node `i`'s token; fails unless it answers 2xx.
/// The write is recorded for the history check as `kind` about
/// `instance`.
pub(super) async fn agent_call(
    cluster: &Cluster,
    i: usize,
    method: reqwest::Method,
    path: &str,
    (kind, instance): (WriteKind, &str),
    what: &str,
) -> Result<(), RunError> {
    let token = cluster.token(i)?;
    let url = format!("http://{}:{HTTP_PORT}{path}", cluster.node_ip(i));
    let sent = now_ms();
    let response = cluster
        .http
        .request(method, url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| RunError::Cluster(format!("{what}: {e}")))?;
    let status = response.status();
    let answer = match status {
        reqwest::StatusCode::ACCEPTED => Answer::Pending,
        s if s.is_success() => Answer::Committed { generation: None },
        _ => Answer::Refused,
    };
    cluster.wrote(sent, kind, instance, answer);
    if !status.is_success() {
        return Err(RunError::Cluster(format!("{what}: {status}")));
    }
    Ok(())
}

/// Starts replica `k` (index, id k + 1) unless it runs.
pub(super) fn start_arbiter(cluster: &mut Cluster, k: usize) -> Result<(), RunError> {
    let name = format!("arbiter-{}", k + 1);
    if cluster.processes.running(&name) {
        return Ok(());
    }
    let config = cluster
        .work
        .join(format!("{name}.toml"))
        .display()
        .to_string();
    cluster.processes.children.retain(|(n, _)| *n != name);
    let faults = cluster.faults.clone();
    let env: Vec<(&str, &str)> = faults
        .as_deref()
        .map(|f| ("ROLLCALL_FAULTS", f))
        .into_iter()
        .collect();
    cluster.spawn_env(
        &name,
        None,
        &["arbiter".into(), "--config".into(), config],
        &env,
    )
}

/// The admin address and token of a replica that runs, if any.
pub(super) fn running_admin(cluster: &mut Cluster) -> Option<(SocketAddr, String)> {
    running_admins(cluster).into_iter().next()
}

/// Every running replica, in order: its admin address and operator
/// token (a replica whose token cannot be read is left out).
pub(super) fn running_admins(cluster: &mut Cluster) -> Vec<(SocketAddr, String)> {
    (0..cluster.arbiters.len())
        .filter_map(|k| {
            let name = format!("arbiter-{}", k + 1);
            if !cluster.processes.running(&name) {
                return None;
            }
            let token =
                std::fs::read_to_string(cluster.work.join(&name).join("admin.token")).ok()?;
            Some((cluster.arbiters[k].1, token.trim().to_owned()))
        })
        .collect()
}

/// The leader's replica index as a running replica reports it.
pub(super) async fn leader(cluster: &mut Cluster) -> Option<usize> {
    for (admin, token) in running_admins(cluster) {
        let url = format!("http://{admin}/v1/cluster");
        let Ok(response) = cluster.http.get(url).bearer_auth(&token).send().await else {
            continue;
        };
        let Ok(body) = response.json::<serde_json::Value>().await else {
            continue;
        };
        if let Some(id) = body["leader"].as_u64() {
            return Some(id as usize - 1);
        }
    }
    None
}
