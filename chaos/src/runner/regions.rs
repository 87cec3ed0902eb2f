//! The other regions of a multi-region run (`regions` ≥ 2 in the
//! scenario): what `rollcall dev --regions` builds in one process, here as
//! real processes in namespaces of their own, so a bridge link can be cut
//! by the network alone.
//!
//! Region r1 is the run's usual cluster (its agents, their proxies, the
//! traffic). Each other region rK gets one namespace host holding its own
//! CA's certificates, a single arbiter replica, one gateway agent
//! (`gw-rK`) whose `[ingress]` takes failed-over connections, the
//! scenario's `remote_instances` backends of the service (`web-rK-j`) and
//! its bridge. r1's bridge runs alone in a namespace, so cutting the link
//! r1 ↔ rK (each side's packets to the other's bridge address go nowhere)
//! cuts nothing else: callers still reach rK's ingress, agents their
//! arbiters. The policy of the scenario is applied at r1's arbiter once
//! every r1 agent holds it and sees every other region fresh.
//!
//! Only setup and the link faults live here; the runner drives the steps
//! and the report judges where connections went.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{io, Cluster, RunError, HEALTH_PORT_OFFSET};
use crate::scenario::Scenario;
use crate::timeline::Event;

/// The bridges' QUIC port (on each region's bridge address).
const BRIDGE_PORT: u16 = 7444;
/// The gateway agents' ingress port.
const INGRESS_PORT: u16 = 15100;
/// How often the bridges read their arbiter and confirm to their peers.
const SYNC_INTERVAL_MS: u64 = 1_000;

/// One region other than r1.
#[derive(Clone, Debug)]
pub(super) struct RegionHost {
    /// `r2`, `r3`, …
    pub name: String,
    /// Its host's index in the topology.
    pub host: usize,
    /// Its backends, with their ports.
    pub instances: Vec<(String, u16)>,
}

/// The topology names of a run's region hosts, after its nodes: r1's
/// bridge, then r2, r3, …; none for a one-region run.
pub(super) fn host_names(scenario: &Scenario) -> Vec<String> {
    if scenario.regions < 2 {
        return Vec::new();
    }
    std::iter::once("r1-bridge".to_owned())
        .chain((2..=scenario.regions).map(|k| format!("r{k}")))
        .collect()
}

/// The region hosts of the run (`regions` in the cluster), not started.
pub(super) fn hosts(scenario: &Scenario, nodes: usize) -> (Option<usize>, Vec<RegionHost>) {
    if scenario.regions < 2 {
        return (None, Vec::new());
    }
    let regions = (2..=scenario.regions)
        .map(|k| {
            let name = format!("r{k}");
            RegionHost {
                instances: (0..scenario.remote_instances)
                    .map(|j| {
                        (
                            format!("{}-{name}-{j}", scenario.service),
                            super::ECHO_PORT + j as u16,
                        )
                    })
                    .collect(),
                name,
                host: nodes + k as usize - 1,
            }
        })
        .collect();
    (Some(nodes), regions)
}

/// Starts every other region and every bridge, applies the scenario's
/// policy at r1, and waits until every r1 agent holds it (when there is
/// one) and sees every other region fresh with READY backends.
pub(super) async fn start(cluster: &mut Cluster, scenario: &Scenario) -> Result<(), RunError> {
    let Some(r1_bridge) = cluster.bridge_host else {
        return Ok(());
    };
    let work = cluster.work.clone();
    for region in cluster.regions.clone() {
        let ip = cluster.node_ip(region.host);
        let certs = work.join(format!("certs-{}", region.name));
        let status = Command::new(&cluster.binary)
            .args(["certs", "--out"])
            .arg(&certs)
            .args(["--region", &region.name, "--arbiter", "arbiter-1"])
            .args(["--agent", &format!("{}={ip}", gateway(&region.name))])
            .args(["--bridge", &format!("bridge-{}", region.name)])
            .args(["--ip", &ip.to_string()])
            .stdout(Stdio::null())
            .status()
            .map_err(io("rollcall certs"))?;
        if !status.success() {
            return Err(RunError::Cluster(format!(
                "rollcall certs for {} failed",
                region.name
            )));
        }
        let dir = work.join(&region.name);
        let c = certs.display();
        let arbiter = format!(
            "name = \"arbiter-1\"\nregion = \"{r}\"\nlisten = \"{ip}:7443\"\nadmin = \"{ip}:7071\"\ndata_dir = \"{d}/arbiter\"\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/arbiter-arbiter-1.crt\"\nkey = \"{c}/arbiter-arbiter-1.key\"\n",
            r = region.name,
            d = dir.display(),
        );
        let agent = format!(
            "node_id = \"{g}\"\nregion = \"{r}\"\ndata_dir = \"{d}/agent\"\nhttp_listen = \"{ip}:{http}\"\ndns_listen = \"{ip}:8600\"\narbiters = [\"{ip}:7443\"]\nreconnect_min_ms = 50\nreconnect_max_ms = 1000\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/agent-{g}.crt\"\nkey = \"{c}/agent-{g}.key\"\n[gossip]\nlisten = \"{ip}:{gossip}\"\n[ingress]\nlisten = \"{ip}:{INGRESS_PORT}\"\n",
            g = gateway(&region.name),
            r = region.name,
            d = dir.display(),
            http = super::HTTP_PORT,
            gossip = super::GOSSIP_PORT,
        );
        for (name, text) in [("arbiter", arbiter), ("agent", agent)] {
            let path = work.join(format!("{}-{name}.toml", region.name));
            std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
            cluster.spawn(
                &format!("{}-{name}", region.name),
                Some(region.host),
                &[name.into(), "--config".into(), path.display().to_string()],
            )?;
        }
        for (id, port) in &region.instances {
            cluster.spawn(
                id,
                Some(region.host),
                &[
                    "echo".into(),
                    "--listen".into(),
                    format!("{ip}:{port}"),
                    "--id".into(),
                    id.clone(),
                    "--health".into(),
                    format!("{ip}:{}", port + HEALTH_PORT_OFFSET),
                ],
            )?;
        }
    }
    // The bridges, once every arbiter has made its operator token.
    let all: Vec<(String, usize)> = std::iter::once(("r1".to_owned(), r1_bridge))
        .chain(cluster.regions.iter().map(|r| (r.name.clone(), r.host)))
        .collect();
    for (name, host) in &all {
        // The bridge's own token, beside the operator's.
        let token = token_file(cluster, name).with_file_name("bridge.token");
        cluster
            .wait(
                &format!("{name}'s arbiter wrote the bridge's token"),
                async || token.exists(),
            )
            .await?;
        let ip = cluster.node_ip(*host);
        let admin: Vec<String> = if name == "r1" {
            cluster
                .arbiters
                .iter()
                .map(|(_, a)| format!("\"{a}\""))
                .collect()
        } else {
            vec![format!("\"{ip}:7071\"")]
        };
        let certs = certs_dir(cluster, name);
        let peers: String = all
            .iter()
            .filter(|(other, _)| other != name)
            .map(|(other, h)| {
                format!(
                    "[[peers]]\nregion = \"{other}\"\naddress = \"{}:{BRIDGE_PORT}\"\nca = \"{}\"\n",
                    cluster.node_ip(*h),
                    certs_dir(cluster, other).join("ca.crt").display()
                )
            })
            .collect();
        let ingress = if name == "r1" {
            String::new()
        } else {
            format!("\"{ip}:{INGRESS_PORT}\"")
        };
        let c = certs.display();
        let text = format!(
            "name = \"bridge-{name}\"\nregion = \"{name}\"\nlisten = \"{ip}:{BRIDGE_PORT}\"\ningress = [{ingress}]\nsummary_max_age_ms = {age}\nsync_interval_ms = {SYNC_INTERVAL_MS}\n[arbiter]\nadmin = [{admin}]\ntoken_file = \"{t}\"\n[tls]\nca = \"{c}/ca.crt\"\ncert = \"{c}/bridge-bridge-{name}.crt\"\nkey = \"{c}/bridge-bridge-{name}.key\"\n{peers}",
            age = scenario.summary_max_age_ms,
            admin = admin.join(", "),
            t = token.display(),
        );
        let path = work.join(format!("bridge-{name}.toml"));
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
        cluster.spawn(
            &format!("bridge-{name}"),
            Some(*host),
            &[
                "bridge".into(),
                "--config".into(),
                path.display().to_string(),
            ],
        )?;
    }
    // Each gateway registers its region's backends.
    for region in cluster.regions.clone() {
        let ip = cluster.node_ip(region.host);
        let token_path = work.join(&region.name).join("agent").join("agent.token");
        cluster
            .wait(
                &format!("{}'s gateway connected", region.name),
                async || {
                    status(cluster, ip)
                        .await
                        .is_some_and(|s| s["arbiter"]["connected"] == true)
                },
            )
            .await?;
        let token = std::fs::read_to_string(&token_path)
            .map_err(io(format!("reading {}", token_path.display())))?;
        for (id, port) in &region.instances {
            let body = serde_json::json!({
                "service": cluster.service,
                "instance_id": id,
                "address": ip.to_string(),
                "port": port,
                "checks": {
                    "readiness": {"kind": "http", "path": "/ready", "port": port + HEALTH_PORT_OFFSET},
                },
            });
            let url = format!("http://{ip}:{}/v1/agent/instances", super::HTTP_PORT);
            let response = cluster
                .http
                .put(url)
                .bearer_auth(token.trim())
                .json(&body)
                .send()
                .await
                .map_err(|e| RunError::Cluster(format!("registering {id}: {e}")))?;
            if !response.status().is_success() {
                return Err(RunError::Cluster(format!(
                    "registering {id} in {}: {}",
                    region.name,
                    response.status()
                )));
            }
        }
    }
    if let Some(policy) = &scenario.policy {
        apply_policy(cluster, policy).await?;
    }
    let service = format!("default/{}", cluster.service);
    let others: Vec<String> = cluster.regions.iter().map(|r| r.name.clone()).collect();
    for i in 0..cluster.nodes.len() {
        let ip = cluster.node_ip(i);
        let (http, service, others) = (cluster.http.clone(), service.clone(), others.clone());
        let with_policy = scenario.policy.is_some();
        cluster
            .wait(
                &format!(
                    "{} sees every other region fresh with READY backends{}",
                    cluster.nodes[i],
                    if with_policy {
                        " and holds the policy"
                    } else {
                        ""
                    }
                ),
                async || {
                    let url = format!("http://{ip}:{}/v1/regions", super::HTTP_PORT);
                    let Some(body) = get(&http, &url).await else {
                        return false;
                    };
                    let fresh = others.iter().all(|name| {
                        body["regions"].as_array().is_some_and(|rs| {
                            rs.iter().any(|r| {
                                r["region"] == name.as_str()
                                    && r["fresh"] == true
                                    && r["summaries"].as_array().is_some_and(|ss| {
                                        ss.iter()
                                            .any(|s| s["ready"].as_u64().is_some_and(|n| n > 0))
                                    })
                            })
                        })
                    });
                    let held = !with_policy
                        || body["policies"].as_array().is_some_and(|ps| {
                            ps.iter()
                                .any(|p| p["policy"]["service"] == service.as_str())
                        });
                    fresh && held
                },
            )
            .await?;
    }
    Ok(())
}

/// The scenario's policy for its service, homed in r1, through r1's
/// arbiter admin API.
async fn apply_policy(cluster: &mut Cluster, policy: &toml::Table) -> Result<(), RunError> {
    let mut document = serde_json::to_value(policy)
        .map_err(|e| RunError::Cluster(format!("the scenario's [policy]: {e}")))?;
    document["service"] = format!("default/{}", cluster.service).into();
    document["home_region"] = "r1".into();
    let (admin, token) = super::running_admin(cluster)
        .ok_or_else(|| RunError::Cluster("no r1 arbiter runs to apply the policy".into()))?;
    let response = cluster
        .http
        .put(format!("http://{admin}/v1/policies"))
        .bearer_auth(token)
        .json(&serde_json::json!({ "policy": [document] }))
        .send()
        .await
        .map_err(|e| RunError::Cluster(format!("applying the policy: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(RunError::Cluster(format!(
            "r1's arbiter refused the scenario's policy ({status}): {body}"
        )));
    }
    Ok(())
}

/// The pairs of topology hosts whose bridge packets `target` names: r1's
/// bridge and the region's host, both ways ("": every other region).
fn links(cluster: &Cluster, target: &str) -> Result<Vec<(usize, Ipv4Addr)>, RunError> {
    let r1 = cluster
        .bridge_host
        .ok_or_else(|| RunError::Cluster("cut_bridge needs regions = 2 or more".into()))?;
    let regions: Vec<&RegionHost> = cluster
        .regions
        .iter()
        .filter(|r| target.is_empty() || r.name == target)
        .collect();
    if regions.is_empty() {
        return Err(RunError::Cluster(format!(
            "{target:?} is not a region of the run"
        )));
    }
    Ok(regions
        .iter()
        .flat_map(|r| [(r1, cluster.node_ip(r.host)), (r.host, cluster.node_ip(r1))])
        .collect())
}

/// Cuts the bridge links `target` names (see [`links`]).
pub(super) fn cut(cluster: &mut Cluster, target: &str) -> Result<(), RunError> {
    for (host, ip) in links(cluster, target)? {
        super::cut(cluster, host, vec![ip])?;
    }
    Ok(())
}

/// Restores the bridge links `target` names.
pub(super) fn heal(cluster: &mut Cluster, target: &str) -> Result<(), RunError> {
    for (host, ip) in links(cluster, target)? {
        cluster.topology.heal(host, &[ip])?;
        cluster
            .cuts
            .retain(|(h, ips)| !(*h == host && ips.as_slice() == [ip]));
    }
    Ok(())
}

/// The admin address and operator token of `region`'s arbiter.
fn admin_of(cluster: &mut Cluster, region: &str) -> Result<(String, String), RunError> {
    if region == "r1" {
        let (admin, token) = super::running_admin(cluster)
            .ok_or_else(|| RunError::Cluster("no r1 arbiter runs".into()))?;
        return Ok((admin.to_string(), token));
    }
    let host = cluster
        .regions
        .iter()
        .find(|r| r.name == region)
        .ok_or_else(|| RunError::Cluster(format!("{region:?} is not a region of the run")))?
        .host;
    let token = std::fs::read_to_string(token_file(cluster, region))
        .map_err(io("reading a region's admin token"))?;
    Ok((
        format!("{}:7071", cluster.node_ip(host)),
        token.trim().to_owned(),
    ))
}

/// The service's policy path on the admin API.
fn policy_path(cluster: &Cluster) -> String {
    format!("/v1/policies/default/{}", cluster.service)
}

/// Moves the service's writes to `to` (`rollcall policy transfer`): at the
/// owner's arbiter as r1's arbiter names it, or, forced with `reason`, at
/// `to`'s own arbiter. A refusal fails the run: the scenario asked for a
/// transfer the system should take.
pub(super) async fn transfer_writer(
    cluster: &mut Cluster,
    to: &str,
    reason: Option<&str>,
) -> Result<(), RunError> {
    let path = policy_path(cluster);
    let at = match reason {
        Some(_) => to.to_owned(),
        None => {
            let (admin, token) = admin_of(cluster, "r1")?;
            let body = get_with(&cluster.http, &format!("http://{admin}{path}"), &token)
                .await
                .ok_or_else(|| RunError::Cluster("r1's arbiter did not show the policy".into()))?;
            body["writer"]["owner"]
                .as_str()
                .ok_or_else(|| RunError::Cluster(format!("the policy has no writer: {body}")))?
                .to_owned()
        }
    };
    let (admin, token) = admin_of(cluster, &at)?;
    let mut request = serde_json::json!({ "to": to });
    if let Some(reason) = reason {
        request["force"] = true.into();
        request["reason"] = reason.into();
    }
    let response = cluster
        .http
        .post(format!("http://{admin}{path}/transfer"))
        .bearer_auth(token)
        .json(&request)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| RunError::Cluster(format!("asking {at}'s arbiter for the transfer: {e}")))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(RunError::Cluster(format!(
            "{at}'s arbiter refused the transfer of the writes to {to} ({status}): {body}"
        )));
    }
    Ok(())
}

/// Every region's writer epoch of the service, as its arbiter reports it
/// now; a region that does not answer is left out (and the judge says so).
pub(super) async fn read_writers(cluster: &mut Cluster, t_ms: u64) -> Vec<Event> {
    let path = policy_path(cluster);
    let names: Vec<String> = std::iter::once("r1".to_owned())
        .chain(cluster.regions.iter().map(|r| r.name.clone()))
        .collect();
    let mut events = Vec::new();
    for region in names {
        let Ok((admin, token)) = admin_of(cluster, &region) else {
            continue;
        };
        let Some(body) = get_with(&cluster.http, &format!("http://{admin}{path}"), &token).await
        else {
            continue;
        };
        let w = &body["writer"];
        if let (Some(epoch), Some(owner)) = (w["epoch"].as_u64(), w["owner"].as_str()) {
            events.push(Event::Writer {
                t_ms,
                region,
                epoch,
                owner: owner.to_owned(),
                settled: w["settled"].as_bool().unwrap_or(false),
            });
        }
    }
    events
}

fn gateway(region: &str) -> String {
    format!("gw-{region}")
}

fn certs_dir(cluster: &Cluster, region: &str) -> std::path::PathBuf {
    if region == "r1" {
        cluster.work.join("certs")
    } else {
        cluster.work.join(format!("certs-{region}"))
    }
}

fn token_file(cluster: &Cluster, region: &str) -> std::path::PathBuf {
    if region == "r1" {
        cluster.work.join("arbiter-1").join("admin.token")
    } else {
        cluster
            .work
            .join(region)
            .join("arbiter")
            .join("admin.token")
    }
}

async fn status(cluster: &Cluster, ip: Ipv4Addr) -> Option<serde_json::Value> {
    get(
        &cluster.http,
        &format!("http://{ip}:{}/v1/status", super::HTTP_PORT),
    )
    .await
}

/// `url` with the operator token, as JSON; `None` on any failure.
async fn get_with(http: &reqwest::Client, url: &str, token: &str) -> Option<serde_json::Value> {
    let response = http
        .get(url)
        .bearer_auth(token)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

async fn get(http: &reqwest::Client, url: &str) -> Option<serde_json::Value> {
    http.get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}
