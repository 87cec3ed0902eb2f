//! Issue 8 benchmark (not a test): three regions in one process
//! (`rollcall dev --regions 3`'s code: per region an arbiter, an agent that
//! is also the ingress gateway, a bridge; QUIC with mutual TLS on
//! loopback), the bridges at their defaults (sync every 1000 ms, summaries
//! fresh for 10 s). Measures:
//! (a) a policy change committed in r1 → visible in r2's agent, p50/p99;
//! (b) summary traffic between r1 and r2 in bytes/s with 2,000 services in
//!     r1: the full sync, the steady state, and under churn;
//! (c) the last local endpoint of a service deregistered in r1 → the first
//!     connection through r1's proxy answered in r2, p50/p99: with the
//!     instance on the caller's own node, and on another node of r1 (the
//!     deregistration then reaches the caller's agent through the arbiter).
//!
//! Run: `cargo bench -p rollcall --bench regions` (env ROUNDS,
//! default 40; SERVICES, default 2000; WINDOW_S, default 20). Everything
//! shares 2 cores. `cargo test` runs it as a smoke test (2 rounds, 20
//! services, 2 s windows): every round must measure its time and the
//! summaries must cross.

#[path = "../leases/benches/support/mod.rs"]
mod support;

#[path = "../node/tests/named/mod.rs"]
mod named;

use std::time::{Duration, Instant};

use named::{backend, through};
use rollcall::dev_regions::{DevRegions, RegionsOptions};
use rollcall_config::{ConnTraffic, ProxyEntry};
use serde_json::{json, Value};

struct Api {
    http: reqwest::Client,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        url: String,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, url).bearer_auth(token.trim());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

fn agent_token(dev: &DevRegions, k: usize) -> String {
    dev.regions[k].agent.agent.token().to_owned()
}

fn admin_token(dev: &DevRegions, k: usize) -> String {
    std::fs::read_to_string(&dev.regions[k].arbiter.token_file).unwrap()
}

async fn register(api: &Api, dev: &DevRegions, k: usize, service: &str, id: &str, port: u16) {
    let url = format!(
        "http://{}/v1/agent/instances",
        dev.regions[k].agent.http_addr
    );
    let (namespace, service) = service.split_once('/').unwrap();
    let body = json!({"namespace": namespace, "service": service, "instance_id": id,
        "address": "127.0.0.1", "port": port});
    let (status, answer) = api
        .call(reqwest::Method::PUT, url, &agent_token(dev, k), Some(body))
        .await;
    assert_eq!(status, 200, "{answer}");
}

async fn apply(api: &Api, dev: &DevRegions, policy: Value) -> u64 {
    let url = format!("http://{}/v1/policies", dev.regions[0].arbiter.admin_addr);
    let (status, body) = api
        .call(
            reqwest::Method::PUT,
            url,
            &admin_token(dev, 0),
            Some(json!({ "policy": [policy] })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body["policies"][0]["revision"].as_u64().unwrap()
}

/// The counter `rollcall_bridge_sent_bytes_total{region=...}` of a bridge.
fn sent_bytes(dev: &DevRegions, k: usize, to: &str) -> u64 {
    let text = dev.regions[k].bridge.as_ref().unwrap().metrics_text();
    let prefix = format!("rollcall_bridge_sent_bytes_total{{region=\"{to}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Polls `check` every 2 ms for at most 30 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn report(name: &str, samples: Vec<f64>, rounds: usize) {
    support::expect_samples(name, samples.len(), rounds);
    support::report(name, samples, "ms", 0);
}

fn main() {
    support::announce("regions");
    let rounds = support::sized("ROUNDS", 40, 2);
    let services = support::sized("SERVICES", 2_000, 20);
    let window = Duration::from_secs(support::sized("WINDOW_S", 20, 2) as u64);
    rollcall_node::runtime::block_on(Some(2), async move {
        let dir = tempfile::tempdir().unwrap();
        let mut options =
            RegionsOptions::new(3, dir.path().to_path_buf(), "127.0.0.1:0".parse().unwrap());
        options.proxies = vec![ProxyEntry {
            service: "shop/web/default".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            traffic: ConnTraffic::ReadWrite,
        }];
        let dev = DevRegions::start(options).await.unwrap();
        let api = Api {
            http: reqwest::Client::new(),
        };
        let proxy = dev.regions[0].agent.proxies[0].local_addr;
        let (web1, _web1) = backend("web-r1").await;
        let (web2, _web2) = backend("web-r2").await;
        register(&api, &dev, 1, "shop/web", "web-r2", web2).await;
        // r2's agent follows web, so it receives web's policy.
        let r2 = dev.regions[1].agent.agent.clone();
        let _ = r2.lookup(&"shop/web/default".parse().unwrap());

        // (a) Policy change in r1 → visible in r2's agent.
        let mut visible = Vec::new();
        for round in 0..rounds {
            let policy = json!({"service": "shop/web", "home_region": "r1", "cross_region": true,
                "failover_traffic": "all", "failover_order": ["r2"],
                "capacity_limits": {"r2": 1.0},
                "max_snapshot_age_ms": 900_000 + round});
            let started = Instant::now();
            let revision = apply(&api, &dev, policy).await;
            until("the policy in r2's agent", || {
                r2.regions_status()
                    .policies
                    .iter()
                    .any(|p| p.home_revision == revision)
            })
            .await;
            visible.push(started.elapsed().as_secs_f64() * 1000.0);
            // Rounds start at different phases of the sync interval.
            tokio::time::sleep(Duration::from_millis(137)).await;
        }
        report(
            "(a) policy committed in r1 -> visible in r2's agent",
            visible,
            rounds,
        );

        // (c) Last local endpoint gone → first connection answered in r2.
        let other = dev.start_agent(0, "node-b").await.unwrap();
        for (label, api_addr, token) in [
            (
                "(c) instance on the caller's node: deregistered",
                dev.regions[0].agent.http_addr,
                agent_token(&dev, 0),
            ),
            (
                "(c) instance on another node of r1: deregistered",
                other.http_addr,
                other.agent.token().to_owned(),
            ),
        ] {
            let r1_api = format!("http://{api_addr}");
            let mut failover = Vec::new();
            for round in 0..rounds {
                let id = format!("web-r1-{round}");
                let url = format!("{r1_api}/v1/agent/instances");
                let body = json!({"namespace": "shop", "service": "web", "instance_id": id,
                "address": "127.0.0.1", "port": web1});
                let (status, answer) = api
                    .call(reqwest::Method::PUT, url, &token, Some(body))
                    .await;
                assert_eq!(status, 200, "{answer}");
                let deadline = Instant::now() + Duration::from_secs(30);
                while through(proxy).await.as_deref() != Some("web-r1") {
                    assert!(Instant::now() < deadline, "web-r1 never served locally");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let url = format!("{r1_api}/v1/agent/instances/{id}");
                let started = Instant::now();
                let (status, body) = api.call(reqwest::Method::DELETE, url, &token, None).await;
                assert_eq!(status, 200, "{body}");
                loop {
                    if through(proxy).await.as_deref() == Some("web-r2") {
                        break;
                    }
                    assert!(started.elapsed() < Duration::from_secs(30), "no failover");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                failover.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            report(
                &format!("{label} -> first connection answered in r2"),
                failover,
                rounds,
            );
        }
        other.shutdown().await;

        if services == 0 {
            dev.shutdown().await;
            return;
        }
        // (b) Summary traffic r1 -> r2 with SERVICES services in r1.
        let before = sent_bytes(&dev, 0, "r2");
        let started = Instant::now();
        for i in 0..services {
            register(
                &api,
                &dev,
                0,
                &format!("load/svc-{i}"),
                &format!("i-{i}"),
                9,
            )
            .await;
        }
        let registered = started.elapsed();
        // The full view has crossed once r2 holds every summary.
        let r2_arbiter = format!("http://{}/v1/remote", dev.regions[1].arbiter.admin_addr);
        let token2 = admin_token(&dev, 1);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, body) = api
                .call(reqwest::Method::GET, r2_arbiter.clone(), &token2, None)
                .await;
            let held = body["regions"]
                .as_array()
                .and_then(|rs| rs.iter().find(|r| r["region"] == "r1"))
                .and_then(|r| r["summaries"].as_array().map(|s| s.len()))
                .unwrap_or(0);
            if held >= services {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "r2 never held r1's {services} summaries ({held})"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let sync_bytes = sent_bytes(&dev, 0, "r2") - before;
        assert!(
            sync_bytes > 0,
            "r1 sent r2 no summary bytes: this measured nothing"
        );
        println!(
            "(b) {services} services registered in r1 in {:.1} s; r1 -> r2 sent {sync_bytes} bytes until r2 held them all ({:.0} bytes per service)",
            registered.as_secs_f64(),
            sync_bytes as f64 / services as f64
        );
        let steady_from = sent_bytes(&dev, 0, "r2");
        tokio::time::sleep(window).await;
        let steady = sent_bytes(&dev, 0, "r2") - steady_from;
        println!(
            "(b) steady state, nothing changing: {:.0} bytes/s r1 -> r2 over {} s",
            steady as f64 / window.as_secs_f64(),
            window.as_secs()
        );
        // Churn: 20 new instances per second spread over the services.
        let churn_from = sent_bytes(&dev, 0, "r2");
        let churn_start = Instant::now();
        let mut n = 0usize;
        while churn_start.elapsed() < window {
            let i = n % services;
            register(
                &api,
                &dev,
                0,
                &format!("load/svc-{i}"),
                &format!("j-{n}"),
                9,
            )
            .await;
            n += 1;
            let next = Duration::from_millis(50 * n as u64);
            if let Some(wait) = next.checked_sub(churn_start.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        let churn = sent_bytes(&dev, 0, "r2") - churn_from;
        println!(
            "(b) churn, {:.0} registrations/s across the services: {:.0} bytes/s r1 -> r2 over {} s",
            n as f64 / window.as_secs_f64(),
            churn as f64 / window.as_secs_f64(),
            window.as_secs()
        );
        dev.shutdown().await;
    });
}
