//! What a run reads from its cluster: the final catalog, each agent's
//! view, sampled routes, metrics and the audit log.

use super::*;

/// Every record of the scenario's service as a live agent serves it
/// (`all=true`), once it holds revision `revision` or later and the
/// arbiter confirmed it; `None` if no agent did within `PATIENCE`.
pub(super) async fn final_catalog(
    cluster: &Cluster,
    revision: u64,
) -> Option<std::collections::BTreeMap<String, FinalRecord>> {
    let down = cluster.crashed.down();
    let live: Vec<usize> = (0..cluster.nodes.len())
        .filter(|i| !down.contains(i))
        .collect();
    let path = format!("/v1/endpoints/{}?all=true", cluster.service);
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        for &i in &live {
            let Some(body) = cluster.agent_get(i, &path).await else {
                continue;
            };
            let current =
                body["stale"] == false && body["revision"].as_u64().is_some_and(|r| r >= revision);
            if !current {
                continue;
            }
            let records = body["endpoints"].as_array()?;
            return Some(
                records
                    .iter()
                    .filter_map(|e| {
                        Some((
                            e["instance_id"].as_str()?.to_owned(),
                            FinalRecord {
                                generation: e["generation"].as_u64()?,
                                state: e["state"].as_str()?.to_owned(),
                            },
                        ))
                    })
                    .collect(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Follows agent `i`'s view of `service` through blocking resolves
/// (`?index=`): records each change (and the first answer) into `views`,
/// the moment the answer came back, until aborted or `limit`. While its
/// node is crashed it asks nothing; after a restart it starts over.
pub(super) async fn watch_view(
    views: std::sync::Arc<std::sync::Mutex<Vec<Route>>>,
    (i, agent, ip): (usize, String, Ipv4Addr),
    service: String,
    crashed: Crashes,
    t0: Instant,
    limit: Duration,
) {
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
    {
        Ok(http) => http,
        Err(_) => return,
    };
    let mut index: Option<String> = None;
    while t0.elapsed() < limit {
        if crashed.down().contains(&i) {
            index = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let url = match &index {
            Some(index) => format!(
                "http://{ip}:{HTTP_PORT}/v1/endpoints/{service}?index={index}&wait_ms=10000"
            ),
            None => format!("http://{ip}:{HTTP_PORT}/v1/endpoints/{service}"),
        };
        let body = match http.get(url).send().await {
            Ok(response) if response.status().is_success() => {
                response.json::<serde_json::Value>().await.ok()
            }
            _ => None,
        };
        let t_ms = t0.elapsed().as_millis() as u64;
        let Some(body) = body else {
            index = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let next = body["index"].as_str().map(str::to_owned);
        if next != index {
            views.lock().expect("views lock").push(Route {
                t_ms,
                agent: agent.clone(),
                instances: endpoint_ids(&body),
            });
        }
        index = next;
    }
}

/// The instance ids of a resolve answer, in its order.
pub(super) fn endpoint_ids(body: &serde_json::Value) -> Vec<String> {
    body["endpoints"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|e| e["instance_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Records the sampling tasks append to while the run goes on.
pub(super) type Records<T> = std::sync::Arc<std::sync::Mutex<Vec<T>>>;

/// Samples every live agent's resolve answer into `routes` every 100 ms,
/// and, in a multi-region run, what it says of regions into `answers`,
/// until aborted or `limit`.
pub(super) async fn sample_routes(
    (routes, answers, stale): (
        Records<Route>,
        Option<Records<RegionAnswer>>,
        Option<Records<StaleAnswer>>,
    ),
    http: reqwest::Client,
    agents: Vec<(String, Ipv4Addr)>,
    service: String,
    crashed: Crashes,
    t0: Instant,
    limit: Duration,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while t0.elapsed() < limit {
        tick.tick().await;
        let down = crashed.down();
        for (i, (agent, ip)) in agents.iter().enumerate() {
            if down.contains(&i) {
                continue;
            }
            let t_ms = t0.elapsed().as_millis() as u64;
            let url = format!("http://{ip}:{HTTP_PORT}/v1/endpoints/{service}");
            let Ok(response) = http
                .get(url)
                .timeout(Duration::from_millis(500))
                .send()
                .await
            else {
                continue;
            };
            let Ok(body) = response.json::<serde_json::Value>().await else {
                continue;
            };
            routes.lock().expect("routes lock").push(Route {
                t_ms,
                agent: agent.clone(),
                instances: endpoint_ids(&body),
            });
            if let (Some(stale), Some(age_ms)) = (&stale, body["age_ms"].as_u64()) {
                stale.lock().expect("stale answers lock").push(StaleAnswer {
                    t_ms,
                    agent: agent.clone(),
                    age_ms,
                    degraded: body["degraded"].as_bool().unwrap_or(false),
                    // The agent's own words (README, "Stale copies").
                    fallback: body["degraded_reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("no endpoint has fresh local evidence")),
                });
            }
            if let (Some(answers), Some(region)) = (&answers, body["region"].as_str()) {
                answers.lock().expect("answers lock").push(RegionAnswer {
                    t_ms,
                    agent: agent.clone(),
                    region: region.to_owned(),
                    refused: body["failover"]["refused"].as_str().map(str::to_owned),
                });
            }
        }
    }
}

/// One value from the arbiter's Prometheus text.
pub(super) async fn metric(cluster: &mut Cluster, name: &str) -> Option<f64> {
    let (admin, _) = running_admin(cluster)?;
    let url = format!("http://{admin}/metrics");
    let text = cluster.http.get(url).send().await.ok()?.text().await.ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

pub(super) fn arbiter_ips(cluster: &Cluster) -> Vec<Ipv4Addr> {
    cluster
        .arbiters
        .iter()
        .filter_map(|(quic, _)| match quic.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        })
        .collect()
}

/// An audit entry with the services it changed.
pub(super) struct Audited {
    pub(super) entry: history::AuditEntry,
    pub(super) services: Vec<String>,
}

/// The whole audit log, page by page; `None` if a running replica could
/// not be asked or answered something that is not the audit log.
pub(super) async fn audit(cluster: &mut Cluster) -> Option<Vec<Audited>> {
    let (admin, token) = running_admin(cluster)?;
    let mut all: Vec<Audited> = Vec::new();
    loop {
        let since = all.last().map_or(0, |a| a.entry.revision);
        let url = format!("http://{admin}/v1/audit?limit=10000&since={since}");
        let body: Vec<serde_json::Value> = cluster
            .http
            .get(url)
            .bearer_auth(&token)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let page = body.len();
        for value in body {
            let services = value["services"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            all.push(Audited {
                entry: serde_json::from_value(value).ok()?,
                services,
            });
        }
        if page < 10_000 {
            return Some(all);
        }
    }
}
