//! Issue 4, outage behaviour (R7): with the arbiter gone the proxy keeps
//! routing on the cached set, and each service's staleness policy applies
//! once its copy is older than its maximum age. Also the drain sequence's
//! end: deregistration after the drain window.

mod common;
mod named;

use common::{eventually, Cluster, Http};
use named::{backend, through};
use rollcall_config::{ProxyEntry, ServicePattern, StaleBehaviour, StalenessOverride};

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn the_proxy_keeps_routing_through_an_outage_until_the_staleness_policy_refuses() {
    let mut cluster = Cluster::start().await;
    let mut config = cluster.agent_config("node-a");
    config.proxy = vec![
        ProxyEntry {
            service: "default/web/default".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            traffic: Default::default(),
        },
        ProxyEntry {
            service: "default/pay/default".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            traffic: Default::default(),
        },
    ];
    // web keeps serving its last-known set; pay refuses after 1.5 s.
    config.staleness.services = vec![StalenessOverride {
        service: ServicePattern::try_from("default/pay/*".to_owned()).unwrap(),
        max_age_ms: 1_500,
        behaviour: StaleBehaviour::Refuse,
    }];
    let agent = cluster.agent_with(config).await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    let (web, pay) = (agent.proxies[0].local_addr, agent.proxies[1].local_addr);
    assert_eq!(
        http.register("web", "web-1", backend("web-1").await.0)
            .await
            .0,
        200
    );
    assert_eq!(
        http.register("pay", "pay-1", backend("pay-1").await.0)
            .await
            .0,
        200
    );
    eventually("both proxies route", || async {
        (through(web).await.is_some() && through(pay).await.is_some()).then_some(())
    })
    .await;

    cluster.stop_arbiter().await;
    http.wait_disconnected().await;
    // Right after the outage starts both keep routing on the cached set.
    assert_eq!(through(web).await.as_deref(), Some("web-1"));
    let (status, body) = http.resolve("web").await;
    assert_eq!(status, 200);
    assert_eq!(body["stale"], true, "{body}");

    // Once pay's copy is older than its maximum age its policy refuses, on
    // every path; web keeps serving.
    eventually("pay refused past its maximum age", || async {
        through(pay).await.is_none().then_some(())
    })
    .await;
    assert_eq!(http.resolve("pay").await.0, 503);
    assert_eq!(through(web).await.as_deref(), Some("web-1"));
    assert_eq!(http.resolve("web").await.0, 200);
    let metrics = http.metrics().await;
    let refused = common::metric_in(&metrics, "rollcall_agent_stale_refused_total ").unwrap();
    assert!(refused > 0.0, "{metrics}");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_drained_instance_is_deregistered_after_the_drain_window() {
    let cluster = Cluster::start().await;
    let mut config = cluster.agent_config("node-a");
    config.drain.max_drain_ms = 300;
    let agent = cluster.agent_with(config).await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    assert_eq!(http.register("web", "web-1", 8080).await.0, 200);
    assert_eq!(http.register("web", "web-2", 8081).await.0, 200);
    let (status, body) = http.drain("web-1", "?generation=1").await;
    assert_eq!(status, 200, "{body}");
    let ids = |body: serde_json::Value| -> Vec<String> {
        body["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["instance_id"].as_str().unwrap().to_owned())
            .collect()
    };
    eventually("web-1 deregistered after its drain window", || async {
        (ids(http.resolve_all("web").await.1) == vec!["web-2"]).then_some(())
    })
    .await;
    assert_eq!(http.status().await["pending_writes"], 0);
}
