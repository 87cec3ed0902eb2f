//! Issue 5 with real agents: eight agents gossiping over authenticated UDP
//! on loopback, one real arbiter. A killed agent's instances leave every
//! other agent's answers (gossip verdict + the arbiter's own silence); an
//! agent whose gossip alone is cut keeps its instances (partition inside
//! the zone: nothing removed).

mod common;

use std::time::Duration;

use common::{eventually, Cluster, Http};
use rollcall_gossip::ZoneKey;
use rollcall_node::process::AgentHandle;

const AGENTS: usize = 8;

async fn zone(cluster: &Cluster) -> Vec<AgentHandle> {
    let key = cluster.dir.path().join("zone.key");
    std::fs::write(&key, ZoneKey::generate_line(1)).unwrap();
    let mut agents: Vec<AgentHandle> = Vec::new();
    for i in 0..AGENTS {
        let mut config = cluster.agent_config(&format!("node-{i}"));
        config.gossip.key_file = Some(key.clone());
        config.gossip.listen = "127.0.0.1:0".parse().unwrap();
        config.gossip.seeds = agents
            .first()
            .map(|a| a.gossip.as_ref().unwrap().local_addr.to_string())
            .into_iter()
            .collect();
        let agent = cluster.agent_with(config).await;
        let http = Http::of(&agent);
        http.wait_connected().await;
        assert_eq!(
            http.register("web", &format!("web-{i}"), 8000 + i as u16)
                .await
                .0,
            200
        );
        agents.push(agent);
    }
    for agent in &agents {
        let http = Http::of(agent);
        eventually("every agent sees every instance", || async {
            (http.ready_ids("web").await.map(|v| v.len()) == Some(AGENTS)).then_some(())
        })
        .await;
    }
    agents
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_killed_agent_leaves_every_answer_through_a_gossip_verdict() {
    let cluster = Cluster::start().await;
    let mut agents = zone(&cluster).await;
    let victim = agents.remove(3);
    victim.shutdown().await;
    for agent in &agents {
        let http = Http::of(agent);
        eventually("web-3 gone from every answer", || async {
            let ids = http.ready_ids("web").await?;
            (!ids.contains(&"web-3".to_owned()) && ids.len() == AGENTS - 1).then_some(())
        })
        .await;
    }
    // It left through a down verdict, not a lease expiry. The answers drop
    // it as soon as gossip does (the agents hold a gossip-down node out
    // locally); the arbiter commits once its own session has been silent
    // for `silence_ms` too, which can be later: wait for the first removal
    // the audit log records, then check which one it was.
    let admin = cluster.admin();
    let audit = eventually("a node-down or lease expiry in the audit log", || async {
        let (_, audit) = admin.get("/v1/audit?limit=1000").await;
        audit
            .as_array()?
            .iter()
            .any(|e| e["command"] == "node-down" || e["command"] == "expire-lease")
            .then_some(audit)
    })
    .await;
    let verdicts: Vec<_> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] == "node-down")
        .collect();
    assert_eq!(verdicts.len(), 1, "{audit}");
    assert!(
        verdicts[0]["detail"].as_str().unwrap().contains("node-3"),
        "{}",
        verdicts[0]
    );

    // The node comes back only through its own agent: a new run, same data
    // directory, re-grants the lease and restores its instance.
    let mut config = cluster.agent_config("node-3");
    config.gossip.key_file = Some(cluster.dir.path().join("zone.key"));
    config.gossip.listen = "127.0.0.1:0".parse().unwrap();
    config.gossip.seeds = vec![agents[0].gossip.as_ref().unwrap().local_addr.to_string()];
    let back = cluster.agent_with(config).await;
    for agent in agents.iter().chain(std::iter::once(&back)) {
        let http = Http::of(agent);
        eventually("web-3 back in every answer", || async {
            (http.ready_ids("web").await.map(|v| v.len()) == Some(AGENTS)).then_some(())
        })
        .await;
    }
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn cutting_only_an_agents_gossip_removes_nothing() {
    let cluster = Cluster::start().await;
    let agents = zone(&cluster).await;
    let admin = cluster.admin();
    let before = admin.revision().await;
    agents[5].gossip.as_ref().unwrap().block(true);
    // The others declare node-5 down and report it; the arbiter still hears
    // node-5's session, so it treats this as a partition inside the zone.
    eventually("down reports refused as a partition", || async {
        (admin
            .metric("rollcall_arbiter_down_reports_ignored_total")
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for agent in &agents {
        let ids = Http::of(agent).ready_ids("web").await.unwrap();
        assert!(ids.contains(&"web-5".to_owned()), "{ids:?}");
    }
    assert_eq!(admin.revision().await, before, "nothing was committed");
}

/// Issue 20, item 5: what the gossip member drops is exported, by reason
/// (`rollcall_gossip_dropped_total{reason}` on the agent's /metrics).
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn dropped_gossip_datagrams_are_counted_by_reason() {
    let cluster = Cluster::start().await;
    let key = cluster.dir.path().join("zone.key");
    std::fs::write(&key, ZoneKey::generate_line(1)).unwrap();
    let mut config = cluster.agent_config("node-a");
    config.gossip.key_file = Some(key.clone());
    config.gossip.listen = "127.0.0.1:0".parse().unwrap();
    let agent = cluster.agent_with(config).await;
    let gossip = agent.gossip.as_ref().unwrap().local_addr;
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // Too short for a seal; sealed with key id 1 but forged; key id 9,
    // which nobody holds.
    let mut forged = vec![0u8; 200];
    forged[0] = 1;
    let mut unknown = vec![0u8; 200];
    unknown[0] = 9;
    for packet in [vec![1u8, 2, 3], forged, unknown] {
        socket.send_to(&packet, gossip).await.unwrap();
    }
    let http = Http::of(&agent);
    eventually("the drops are exported", || async {
        let text = http.metrics().await;
        let count = |reason: &str| {
            common::metric_in(
                &text,
                &format!("rollcall_gossip_dropped_total{{reason=\"{reason}\"}} "),
            )
        };
        (count("too_short")? >= 1.0 && count("forged")? >= 1.0 && count("unknown_key")? >= 1.0)
            .then_some(())
    })
    .await;
}
