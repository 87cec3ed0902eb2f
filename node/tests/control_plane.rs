//! Issue 3's integration tests: a real arbiter and real agents on loopback,
//! driven through the public HTTP API.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::{eventually, Cluster, Http};
use rollcall_config::{ControllerGrant, ServicePattern};
use rollcall_leases::client::ArbiterClient;
use rollcall_leases::codec::MAX_SERVICE_SNAPSHOT_BYTES;
use rollcall_leases::protocol::{RejectKind, Request, Response, SessionDown, SessionUp};
use rollcall_leases::{
    AgentEpoch, Generation, InstanceId, Label, NodeId, Registration, Role, ServiceKey, State,
    Version, Weight,
};
use rollcall_node::process::{self, AgentHandle};
use serde_json::Value;

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn register_resolve_drain() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent("node-a").await;
    let http = Http::of(&agent);
    eventually("agent connected", || async {
        http.status().await["arbiter"]["connected"]
            .as_bool()
            .unwrap()
            .then_some(())
    })
    .await;
    let (status, body) = http.register("web", "web-1", 8080).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["generation"], 1);
    assert_eq!(body["state"], "READY");
    assert_eq!(http.ready_ids("web").await.unwrap(), vec!["web-1"]);
    let (status, body) = http.drain("web-1", "?generation=1").await;
    assert_eq!(status, 200, "{body}");
    assert!(body["revision"].as_u64().unwrap() > 0);
    assert_eq!(http.ready_ids("web").await.unwrap(), Vec::<String>::new());
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_blocking_resolve_returns_when_the_answer_changes() {
    let cluster = Cluster::start().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    for (id, port) in [("web-1", 8081), ("web-2", 8082)] {
        let (status, body) = http.register("web", id, port).await;
        assert_eq!(status, 200, "{body}");
    }
    wait_ready(&http, "web", &["web-1", "web-2"]).await;
    let (_, first) = http.resolve("web").await;
    let index = first["index"].as_str().unwrap().to_owned();
    assert_eq!(index.len(), 16, "{first}");
    // Unchanged: it waits the whole wait_ms, then answers the same.
    let started = std::time::Instant::now();
    let (status, same) = http
        .send(
            reqwest::Method::GET,
            &format!("/v1/endpoints/web?index={index}&wait_ms=300"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{same}");
    assert_eq!(same["index"], first["index"]);
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    // A drain while a blocking resolve waits: it returns with web-1 gone.
    let waiting = {
        let http = http.clone();
        let index = index.clone();
        tokio::spawn(async move {
            http.send(
                reqwest::Method::GET,
                &format!("/v1/endpoints/web?index={index}&wait_ms=20000"),
                None,
            )
            .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "it waits while nothing changes");
    let (status, body) = http.drain("web-1", "?generation=1").await;
    assert_eq!(status, 200, "{body}");
    let (status, changed) = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("answered once the view changed")
        .unwrap();
    assert_eq!(status, 200, "{changed}");
    assert_eq!(ids(&changed), ["web-2"]);
    assert_ne!(changed["index"], first["index"]);
    // Bad waits are refused.
    for query in [
        format!("index={index}&wait_ms=0"),
        format!("index={index}&wait_ms=999999999"),
        "wait_ms=100".to_owned(),
    ] {
        let (status, body) = http
            .send(
                reqwest::Method::GET,
                &format!("/v1/endpoints/web?{query}"),
                None,
            )
            .await;
        assert_eq!(
            (status, &body["error"]),
            (400, &Value::from("invalid_request")),
            "{query}: {body}"
        );
    }
}

/// The instance ids in a resolve answer body.
fn ids(body: &Value) -> Vec<String> {
    let mut ids: Vec<String> = body["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["instance_id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

/// The endpoint `id` in a resolve answer body.
fn endpoint<'a>(body: &'a Value, id: &str) -> Option<&'a Value> {
    body["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["instance_id"] == id)
}

/// Waits until `http` resolves `service` to exactly `want` (READY ids), from
/// a view the arbiter confirmed (not stale).
async fn wait_ready(http: &Http, service: &str, want: &[&str]) {
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    eventually(
        &format!("{service} resolves to {want:?}, not stale"),
        || async {
            let (status, body) = http.resolve(service).await;
            (status == 200 && body["stale"] == false && ids(&body) == want).then_some(())
        },
    )
    .await;
}

async fn connected_agent(cluster: &Cluster, node: &str) -> (AgentHandle, Http) {
    let handle = cluster.agent(node).await;
    let http = Http::of(&handle);
    http.wait_connected().await;
    (handle, http)
}

fn registration(id: &str, service: &str, node: &str, epoch: AgentEpoch) -> Registration {
    Registration {
        instance_id: InstanceId::new(id).unwrap(),
        service: ServiceKey::new("default", service, "default").unwrap(),
        node: NodeId::new(node).unwrap(),
        epoch,
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 9000,
        zone: None,
        version: Version::new("").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    }
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_stale_generation_cannot_touch_its_successor() {
    let cluster = Cluster::start().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    let (status, body) = http.register("web", "web-1", 8080).await;
    assert_eq!(
        (status, body["generation"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    let (status, body) = http.register("web", "web-1", 8081).await;
    assert_eq!(
        (status, body["generation"].as_u64()),
        (200, Some(2)),
        "{body}"
    );

    eventually("the view holds generation 2", || async {
        let (_, body) = http.resolve("web").await;
        endpoint(&body, "web-1")
            .is_some_and(|e| e["generation"] == 2)
            .then_some(())
    })
    .await;
    let admin = cluster.admin();
    let before = admin.revision().await;

    let (status, body) = http.heartbeat("web-1", "?generation=1").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "stale_generation");
    let (status, body) = http.deregister("web-1", "?generation=1").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "stale_generation");
    assert_eq!(
        admin.revision().await,
        before,
        "a stale call changed the catalog"
    );

    let (status, body) = http.resolve("web").await;
    assert_eq!(status, 200, "{body}");
    let successor = endpoint(&body, "web-1").expect("the successor is still listed");
    assert_eq!(successor["generation"], 2);
    assert_eq!(successor["state"], "READY");
    assert_eq!(successor["port"], 8081);
    let (status, body) = http.heartbeat("web-1", "?generation=2").await;
    assert_eq!(status, 200, "{body}");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn agents_resume_by_delta_after_an_arbiter_restart() {
    let mut cluster = Cluster::start().await;
    let (_a, http_a) = connected_agent(&cluster, "node-a").await;
    let (_b, http_b) = connected_agent(&cluster, "node-b").await;
    for id in ["web-1", "web-2"] {
        assert_eq!(http_a.register("web", id, 8080).await.0, 200);
    }
    assert_eq!(http_b.register("web", "web-3", 8080).await.0, 200);
    wait_ready(&http_a, "web", &["web-1", "web-2", "web-3"]).await;
    wait_ready(&http_b, "web", &["web-1", "web-2", "web-3"]).await;
    let before = cluster.admin().revision().await;

    cluster.stop_arbiter().await;
    http_a.wait_disconnected().await;
    http_b.wait_disconnected().await;
    cluster.start_arbiter().await;
    http_a.wait_connected().await;
    http_b.wait_connected().await;

    let admin = cluster.admin();
    assert!(
        admin.revision().await >= before,
        "the catalog revision went back"
    );
    wait_ready(&http_a, "web", &["web-1", "web-2", "web-3"]).await;
    wait_ready(&http_b, "web", &["web-1", "web-2", "web-3"]).await;
    let (status, body) = http_a.register("web", "web-4", 8080).await;
    assert_eq!(
        (status, body["generation"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    wait_ready(&http_b, "web", &["web-1", "web-2", "web-3", "web-4"]).await;
    assert_eq!(
        admin.metric("rollcall_arbiter_snapshots_sent").await,
        0.0,
        "an agent was sent a full snapshot instead of deltas"
    );
    // The control: a newcomer's first subscription is a snapshot, and counts.
    let (_c, http_c) = connected_agent(&cluster, "node-c").await;
    wait_ready(&http_c, "web", &["web-1", "web-2", "web-3", "web-4"]).await;
    eventually("the newcomer's snapshot is counted", || async {
        (admin.metric("rollcall_arbiter_snapshots_sent").await >= 1.0).then_some(())
    })
    .await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_restarted_agent_serves_its_cache_while_the_arbiter_is_down() {
    let mut cluster = Cluster::start().await;
    let (agent, http) = connected_agent(&cluster, "node-a").await;
    assert_eq!(http.register("web", "web-1", 8080).await.0, 200);
    wait_ready(&http, "web", &["web-1"]).await;
    let cache_file = cluster
        .agent_dir("node-a")
        .join("cache")
        .join("default.web.default.snap");
    eventually("the cache file is written", || async {
        cache_file.exists().then_some(())
    })
    .await;

    cluster.stop_arbiter().await;
    agent.shutdown().await;
    let agent = cluster.agent("node-a").await;
    let http = Http::of(&agent);
    let (status, body) = http.resolve("web").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stale"], true, "{body}");
    assert_eq!(ids(&body), vec!["web-1"]);
    assert_eq!(http.status().await["arbiter"]["connected"], false);
    let (status, body) = http.resolve("api").await;
    assert_eq!(
        status, 503,
        "a service neither cached nor reachable cannot be known: {body}"
    );

    cluster.start_arbiter().await;
    wait_ready(&http, "web", &["web-1"]).await;
}

/// Issue 22, item 1: `dev`, register and deregister until `web` is at
/// revision 16, stop, remove the arbiter's data, start again, register
/// `new-1`. The agent's cache is of the old catalog: it must not be served
/// against the new one (before, `web` stayed at the cached revision 16,
/// stale and without `new-1`, for good).
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn an_agent_discards_a_cache_of_a_rebuilt_arbiter_group() {
    let mut cluster = Cluster::start().await;
    let (agent, http) = connected_agent(&cluster, "node-a").await;
    let old_catalog = eventually("the arbiter names its catalog", || async {
        cluster.admin().status().await["catalog"]
            .as_str()
            .map(str::to_owned)
    })
    .await;
    assert_eq!(
        http.status().await["arbiter"]["catalog"],
        old_catalog.as_str()
    );
    for i in 1..=6 {
        assert_eq!(http.register("web", &format!("old-{i}"), 8080).await.0, 200);
    }
    for i in 2..=6 {
        let (status, body) = http.deregister(&format!("old-{i}"), "?generation=1").await;
        assert_eq!(status, 200, "{body}");
    }
    wait_ready(&http, "web", &["old-1"]).await;
    let old_revision = cluster.admin().revision().await;
    assert!(old_revision >= 12, "{old_revision}");
    let cache_file = cluster
        .agent_dir("node-a")
        .join("cache")
        .join("default.web.default.snap");
    eventually("the cache file holds the last revision", || async {
        let bytes = std::fs::read(&cache_file).ok()?;
        (bytes.len() > 8).then_some(())
    })
    .await;
    agent.shutdown().await;

    // The arbiter group is rebuilt: an empty store, a new catalog.
    cluster.stop_arbiter().await;
    std::fs::remove_dir_all(&cluster.arbiter_config.data_dir).unwrap();
    cluster.start_arbiter().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    let (status, body) = http.register("web", "new-1", 8080).await;
    assert_eq!(status, 200, "{body}");
    // old-1 is this agent's own registration: it registers it again in
    // the new catalog. Both are served from the new catalog, current.
    wait_ready(&http, "web", &["new-1", "old-1"]).await;
    let (_, body) = http.resolve("web").await;
    assert!(
        body["revision"].as_u64().unwrap() < old_revision,
        "the revision is the new catalog's: {body}"
    );
    let new_catalog = cluster.admin().status().await["catalog"].clone();
    assert!(new_catalog.is_string());
    assert_ne!(new_catalog, old_catalog.as_str());
    assert_eq!(http.status().await["arbiter"]["catalog"], new_catalog);
    let metrics = http.metrics().await;
    assert_eq!(
        common::metric_in(
            &metrics,
            "rollcall_agent_cache_discarded_total{reason=\"other_catalog\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_drain_while_the_arbiter_is_down_applies_locally_then_commits() {
    let mut cluster = Cluster::start().await;
    let (_a, http) = connected_agent(&cluster, "node-a").await;
    for id in ["web-1", "web-2"] {
        assert_eq!(http.register("web", id, 8080).await.0, 200);
    }
    wait_ready(&http, "web", &["web-1", "web-2"]).await;

    cluster.stop_arbiter().await;
    http.wait_disconnected().await;
    let (status, body) = http.drain("web-1", "?generation=1").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["pending"], true, "{body}");
    let (status, body) = http.resolve("web").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        ids(&body),
        vec!["web-2"],
        "a local drain applies to this agent at once"
    );
    assert!(http.status().await["pending_writes"].as_u64().unwrap() >= 1);

    cluster.start_arbiter().await;
    eventually("the pending drain is committed", || async {
        (http.status().await["pending_writes"] == 0).then_some(())
    })
    .await;
    let (_b, http_b) = connected_agent(&cluster, "node-b").await;
    wait_ready(&http_b, "web", &["web-2"]).await;
    let (status, body) = http_b.resolve_all("web").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        endpoint(&body, "web-1").expect("web-1 is listed with all=true")["state"],
        "DRAINING"
    );
    assert_eq!(endpoint(&body, "web-2").unwrap()["state"], "READY");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_registration_while_the_arbiter_is_down_is_pending_until_it_returns() {
    let mut cluster = Cluster::start().await;
    let (_a, http_a) = connected_agent(&cluster, "node-a").await;
    let (_b, http_b) = connected_agent(&cluster, "node-b").await;
    assert_eq!(http_a.register("web", "web-1", 8080).await.0, 200);
    wait_ready(&http_a, "web", &["web-1"]).await;
    wait_ready(&http_b, "web", &["web-1"]).await;

    cluster.stop_arbiter().await;
    http_a.wait_disconnected().await;
    let (status, body) = http_a.register("web", "web-2", 8080).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["generation"], Value::Null, "{body}");
    assert_eq!(body["pending"], true, "{body}");
    for http in [&http_a, &http_b] {
        let (status, body) = http.resolve_all("web").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            ids(&body),
            vec!["web-1"],
            "a pending registration is invisible"
        );
    }

    cluster.start_arbiter().await;
    wait_ready(&http_b, "web", &["web-1", "web-2"]).await;
    wait_ready(&http_a, "web", &["web-1", "web-2"]).await;
    let (_, body) = http_b.resolve("web").await;
    let registered = endpoint(&body, "web-2").unwrap();
    assert_eq!(registered["generation"], 1);
    assert_eq!(registered["state"], "READY");
    eventually("the agent has nothing pending", || async {
        (http_a.status().await["pending_writes"] == 0).then_some(())
    })
    .await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_corrupt_cache_file_is_discarded_and_refetched() {
    let cluster = Cluster::start().await;
    let (agent, http) = connected_agent(&cluster, "node-a").await;
    assert_eq!(http.register("web", "web-1", 8080).await.0, 200);
    wait_ready(&http, "web", &["web-1"]).await;
    let cache_file = cluster
        .agent_dir("node-a")
        .join("cache")
        .join("default.web.default.snap");
    eventually("the cache file is written", || async {
        cache_file.exists().then_some(())
    })
    .await;
    agent.shutdown().await;

    let mut corrupted = std::fs::read(&cache_file).unwrap();
    let middle = corrupted.len() / 2;
    corrupted[middle] ^= 0x5a;
    std::fs::write(&cache_file, &corrupted).unwrap();

    let agent = cluster.agent("node-a").await;
    let http = Http::of(&agent);
    eventually("web resolves from the arbiter", || async {
        let (status, body) = http.resolve("web").await;
        if status == 200 {
            assert_eq!(body["stale"], false, "the corrupt cache was served: {body}");
        }
        (status == 200 && ids(&body) == ["web-1"]).then_some(())
    })
    .await;
    let cache = rollcall_node::cache::ServiceCache::open(&cluster.agent_dir("node-a")).unwrap();
    let (view, catalog) = eventually("the cache file is rewritten", || async {
        rollcall_node::durable::read_verified(&cache_file, MAX_SERVICE_SNAPSHOT_BYTES as u64)
            .ok()??;
        cache.load_all().views.pop()
    })
    .await;
    assert_ne!(std::fs::read(&cache_file).unwrap(), corrupted);
    assert!(catalog.is_some(), "the file names its catalog");
    assert_eq!(
        view.records()
            .map(|r| r.instance_id.as_str().to_owned())
            .collect::<Vec<_>>(),
        vec!["web-1"]
    );
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_certificate_for_another_node_gets_no_lease_and_writes_nothing() {
    let cluster = Cluster::start().await;
    let admin = cluster.admin();
    let config_b = cluster.agent_config("node-b");
    let impostor = process::start(config_b, Some(&cluster.tls(Role::Agent, "node-a")))
        .await
        .unwrap();
    let http = Http::of(&impostor);
    // A bounded observation window: this asserts that something does NOT happen.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < until {
        assert!(
            !http.connected().await,
            "an agent with node-a's certificate connected as node-b"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = admin.status().await;
    assert!(
        status["agents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["node"] != "node-b"),
        "{status}"
    );
    assert_eq!(status["leases"], 0, "{status}");
    impostor.shutdown().await;

    let client = ArbiterClient::new(&cluster.tls(Role::Agent, "node-a")).unwrap();
    let conn = client
        .connect(&cluster.quic_addr().to_string())
        .await
        .unwrap();
    let epoch = AgentEpoch(1);
    let hello = SessionUp::Hello {
        node: NodeId::new("node-a").unwrap(),
        epoch,
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (_writer, mut reader) = conn.open_session(&hello).await.unwrap();
    let welcome = reader.next().await.unwrap();
    assert!(
        matches!(welcome, SessionDown::Welcome { .. }),
        "{welcome:?}"
    );
    let before = admin.revision().await;
    let answer = conn
        .request(&Request::Register(registration(
            "web-9", "web", "node-c", epoch,
        )))
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            Response::Rejected {
                kind: RejectKind::Forbidden,
                ..
            }
        ),
        "{answer:?}"
    );
    assert_eq!(admin.revision().await, before);
    conn.close("test over");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_controller_writes_only_the_services_of_its_grant() {
    let cluster = Cluster::start_with(|c| {
        c.controllers = vec![ControllerGrant {
            name: "deployer".into(),
            services: vec![ServicePattern::try_from("default/web/*".to_string()).unwrap()],
        }];
    })
    .await;
    let (agent, http) = connected_agent(&cluster, "node-a").await;
    let epoch = agent.agent.epoch();

    let client = ArbiterClient::new(&cluster.tls(Role::Controller, "deployer")).unwrap();
    let conn = client
        .connect(&cluster.quic_addr().to_string())
        .await
        .unwrap();
    let answer = conn
        .request(&Request::Register(registration(
            "web-c1", "web", "node-a", epoch,
        )))
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            Response::Committed {
                generation: Some(Generation(1)),
                ..
            }
        ),
        "{answer:?}"
    );
    wait_ready(&http, "web", &["web-c1"]).await;

    let before = cluster.admin().revision().await;
    let answer = conn
        .request(&Request::Register(registration(
            "api-c1", "api", "node-a", epoch,
        )))
        .await
        .unwrap();
    assert!(
        matches!(
            answer,
            Response::Rejected {
                kind: RejectKind::Forbidden,
                ..
            }
        ),
        "{answer:?}"
    );
    assert_eq!(cluster.admin().revision().await, before);
    conn.close("test over");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn every_change_through_the_agent_is_audited() {
    let cluster = Cluster::start().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    assert_eq!(http.register("web", "web-1", 8080).await.0, 200);
    assert_eq!(http.drain("web-1", "?generation=1").await.0, 200);
    let (status, body) = http.deregister("web-1", "?generation=1").await;
    assert_eq!(status, 200, "{body}");

    let admin = cluster.admin();
    let (status, body) = admin.get("/v1/audit?service=default/web/default").await;
    assert_eq!(status, 200, "{body}");
    let entries = body.as_array().unwrap();
    let commands: Vec<&str> = entries
        .iter()
        .map(|e| e["command"].as_str().unwrap())
        .filter(|c| *c != "grant-lease")
        .collect();
    assert_eq!(commands, ["register", "transition", "deregister"], "{body}");
    let revisions: Vec<u64> = entries
        .iter()
        .map(|e| e["revision"].as_u64().unwrap())
        .collect();
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "not in revision order: {revisions:?}"
    );
    for entry in entries {
        assert_eq!(entry["actor"], "agent:node-a", "{entry}");
        assert!(
            entry["services"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "default/web/default"),
            "{entry}"
        );
    }
    for entry in entries.iter().filter(|e| e["command"] != "grant-lease") {
        assert_eq!(entry["instance"], "web-1", "{entry}");
    }
    assert_eq!(admin.get_without_token("/v1/audit").await, 401);
}

/// Issue 38, item 1: an instance id belongs to the node that holds it; a
/// registration of it from another node is refused naming the owner and
/// changes nothing, until an operator frees it (`DELETE
/// /v1/instances/{id}`), which is audited as the operator's.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn an_instance_id_is_its_nodes_until_an_operator_frees_it() {
    let cluster = Cluster::start().await;
    let admin = cluster.admin();
    let (_a, http_a) = connected_agent(&cluster, "node-a").await;
    let (_b, http_b) = connected_agent(&cluster, "node-b").await;
    assert_eq!(http_a.register("web", "web-1", 8080).await.0, 200);
    let before = admin.revision().await;
    let (status, body) = http_b.register("web", "web-1", 8081).await;
    assert_eq!(status, 403, "{body}");
    let message = body.to_string();
    assert!(
        message.contains("held by node node-a") && message.contains("rollcall instance free web-1"),
        "{message}"
    );
    assert_eq!(admin.revision().await, before, "a refusal commits nothing");
    assert_eq!(http_a.ready_ids("web").await.unwrap(), vec!["web-1"]);
    let refused = admin
        .metric("rollcall_arbiter_refusals_total{kind=\"forbidden\"}")
        .await;
    assert!(refused >= 1.0, "refusals counted: {refused}");

    // The operator frees it; a stale generation or an unknown id is refused.
    let (status, body) = admin.delete("/v1/instances/web-1?generation=7").await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = admin.delete("/v1/instances/web-1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["node"], "node-a", "{body}");
    assert_eq!(body["generation"], 1, "{body}");
    let (status, body) = admin.delete("/v1/instances/web-1").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = http_b.register("web", "web-1", 8081).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["generation"], 2, "{body}");

    let (_, audit) = admin.get("/v1/audit?service=default/web/default").await;
    let entries: Vec<(&str, &str)> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] != "grant-lease")
        .map(|e| (e["command"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        entries,
        [
            ("register", "agent:node-a"),
            ("deregister", "operator:admin-token"),
            ("register", "agent:node-b"),
        ],
        "{audit}"
    );
}

/// Issue 38, item 6: a certificate on the arbiter's deny list is cut off
/// at the reload that brings the list: its session is closed with the
/// reason and its handshakes are refused from then on; others go on.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_revoked_agent_is_cut_off_at_the_reload() {
    let cluster = Cluster::start().await;
    let (_a, http_a) = connected_agent(&cluster, "node-a").await;
    let (_b, http_b) = connected_agent(&cluster, "node-b").await;
    let mut material = cluster.arbiter_material();
    material.revoked = rollcall_leases::tls::revoked::Revoked::parse(
        "rollcall://r1/agent/node-a\n",
        std::path::Path::new("revoked.txt"),
    )
    .unwrap();
    let server = cluster.arbiter.as_ref().unwrap();
    server
        .tls()
        .replace(&material, std::path::Path::new("arbiter-arbiter-1.crt"))
        .unwrap();
    http_a.wait_disconnected().await;
    // Its reconnects (every backoff of the next seconds) are refused.
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!http_a.connected().await, "a revoked agent got a session");
    }
    assert!(http_b.connected().await, "another agent keeps its session");
    let (status, body) = http_b.register("web", "web-1", 8080).await;
    assert_eq!(status, 200, "{body}");
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn bad_registrations_change_nothing() {
    let cluster = Cluster::start().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    let admin = cluster.admin();
    let before = admin.revision().await;
    let put = |body: Vec<u8>, with_token: bool| {
        http.send_raw(
            reqwest::Method::PUT,
            "/v1/agent/instances",
            body,
            with_token,
        )
    };
    let valid = serde_json::json!({"service": "web", "instance_id": "web-1", "address": "127.0.0.1", "port": 8080});
    let with = |field: &str, value: Value| {
        let mut body = valid.clone();
        body[field] = value;
        serde_json::to_vec(&body).unwrap()
    };

    let (status, body) = put(br#"{"service": "web", "instance_id": "#.to_vec(), true).await;
    assert_eq!(status, 400, "malformed JSON: {body}");
    let (status, body) = put(with("colour", "blue".into()), true).await;
    assert_eq!(status, 400, "unknown field: {body}");
    let (status, body) = put(with("port", 0.into()), true).await;
    assert_eq!(status, 422, "port 0: {body}");
    let mut oversized = serde_json::to_vec(&valid).unwrap();
    oversized.resize(64 * 1024 + 1, b' ');
    let (status, body) = put(oversized, true).await;
    assert_eq!(status, 413, "a body over 64 KiB: {body}");
    assert_eq!(body["error"], "too_large", "{body}");
    let (status, body) = put(
        with("checks", serde_json::json!({"readiness": {"kind": "tcp", "interval_ms": 5000, "timeout_ms": 6000}})),
        true,
    )
    .await;
    assert_eq!(
        status, 422,
        "a check whose timeout is not below its interval: {body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("checks.readiness.timeout_ms"),
        "{body}"
    );
    let (status, body) = put(serde_json::to_vec(&valid).unwrap(), false).await;
    assert_eq!(status, 401, "no token: {body}");

    assert_eq!(admin.revision().await, before);
    assert_eq!(http.status().await["pending_writes"], 0);
    assert_eq!(http.resolve("web").await.0, 404, "nothing registered web");
}

/// Issue 22, item 3: every answer of the local API is the documented JSON
/// error, including the ones the framework makes (before: a plain-text 413
/// for a body over 64 KiB + 1, a plain-text 400 for `%FF` in a path, and
/// empty 404 and 405 bodies).
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn every_error_of_the_local_api_is_the_json_error() {
    let cluster = Cluster::start().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    let send = |method: reqwest::Method, path: &str, body: Option<Vec<u8>>| {
        let mut req = http
            .client
            .request(method, format!("{}{path}", http.base))
            .bearer_auth(&http.token);
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let allow = resp
                .headers()
                .get("allow")
                .map(|v| v.to_str().unwrap().to_owned());
            let kind = resp
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = resp.json().await.expect("a JSON body");
            (status, kind, allow, body)
        }
    };
    let big = vec![b' '; rollcall_node::api::MAX_BODY_BYTES + 2];
    let cases = [
        (
            reqwest::Method::PUT,
            "/v1/agent/instances",
            Some(big),
            413,
            "too_large",
        ),
        (
            reqwest::Method::GET,
            "/v1/endpoints/%FF",
            None,
            400,
            "invalid_request",
        ),
        (
            reqwest::Method::GET,
            "/v1/no-such-path",
            None,
            404,
            "not_found",
        ),
        (
            reqwest::Method::DELETE,
            "/v1/status",
            None,
            405,
            "method_not_allowed",
        ),
    ];
    for (method, path, body, want_status, want_code) in cases {
        let (status, kind, allow, body) = send(method.clone(), path, body).await;
        assert_eq!(status, want_status, "{method} {path}: {body}");
        assert_eq!(kind.as_deref(), Some("application/json"), "{method} {path}");
        assert_eq!(body["error"], want_code, "{method} {path}: {body}");
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{method} {path}: {body}"
        );
        if status == 405 {
            assert_eq!(allow.as_deref(), Some("GET,HEAD"), "{body}");
        }
    }
}

/// Issue 22, item 4: values the API used to accept and then could not use
/// are refused, each naming the field, and change nothing.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn values_that_could_not_be_used_are_refused() {
    let cluster = Cluster::start().await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    let admin = cluster.admin();
    let valid = serde_json::json!({"service": "web", "instance_id": "web-1", "address": "127.0.0.1", "port": 8080});
    let with = |field: &str, value: Value| {
        let mut body = valid.clone();
        body[field] = value;
        body
    };
    let put = |body: Value| http.send(reqwest::Method::PUT, "/v1/agent/instances", Some(body));
    let before = admin.revision().await;
    let refused = [
        (with("address", "255.255.255.255".into()), "address"),
        (with("address", "224.0.0.1".into()), "address"),
        (with("instance_id", ".".into()), "instance_id"),
        (with("instance_id", "..".into()), "instance_id"),
        (
            with(
                "checks",
                serde_json::json!({"readiness": {"kind": "tcp", "interval_ms": u64::MAX, "timeout_ms": 500}}),
            ),
            "checks.readiness.interval_ms",
        ),
        (
            with(
                "checks",
                serde_json::json!({"readiness": {"kind": "tcp", "failure_threshold": u32::MAX}}),
            ),
            "checks.readiness.failure_threshold",
        ),
    ];
    for (body, field) in refused {
        let (status, answer) = put(body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(field),
            "{body}: {answer}"
        );
    }
    assert_eq!(admin.revision().await, before, "nothing was written");

    // An instance id does not move between services: 409, and the first
    // registration stays.
    assert_eq!(put(valid.clone()).await.0, 200);
    let (status, answer) = put(with("service", "api".into())).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["detail"]
            .as_str()
            .unwrap()
            .contains("default/web/default"),
        "{answer}"
    );
    wait_ready(&http, "web", &["web-1"]).await;
    assert_eq!(http.resolve("api").await.0, 404, "nothing moved to api");
}

/// Issue 22, item 2: half-sent requests no longer hold connections for
/// good (500 of them stayed open 40 s), and a listener holds at most
/// `http_limits.max_connections`: on the agent's local API and on the
/// arbiter's admin API.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn half_sent_requests_are_closed_and_connections_are_capped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limits = rollcall_config::HttpLimits {
        max_connections: 8,
        header_read_timeout_ms: 500,
        idle_timeout_ms: 11_000,
    };
    let cluster = Cluster::start_with(|c| c.http_limits = limits).await;
    let mut config = cluster.agent_config("node-a");
    config.http_limits = limits;
    let handle = cluster.agent_with(config).await;
    let http = Http::of(&handle);
    http.wait_connected().await;
    let admin_addr = cluster.arbiter.as_ref().unwrap().admin_addr;
    for addr in [handle.http_addr, admin_addr] {
        // Eight half-sent requests fill the listener; a ninth connection
        // is closed at once.
        let mut held = Vec::new();
        for _ in 0..8 {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            held.push(stream);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut ninth = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = ninth
            .write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
            .await;
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), ninth.read(&mut buf))
            .await
            .expect("the ninth connection is answered or closed at once");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "{addr}: a connection over max_connections was served: {read:?}"
        );
        // The half-sent ones are closed after the header-read timeout,
        // with a 408 or nothing.
        for mut stream in held {
            let mut answer = Vec::new();
            let read =
                tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
                    .await
                    .expect("a half-sent request is closed within header_read_timeout_ms");
            let text = String::from_utf8_lossy(&answer);
            assert!(
                read.is_err() || answer.is_empty() || text.starts_with("HTTP/1.1 408"),
                "{addr}: {text}"
            );
        }
        // The listener serves again.
        let status = eventually("the listener serves again", || async {
            let resp = reqwest::get(format!("http://{addr}/v1/status"))
                .await
                .ok()?;
            Some(resp.status().as_u16())
        })
        .await;
        assert!(status == 200 || status == 401, "{addr}: {status}");
    }
}

/// Issue 20 item 2, through real agents' HTTP API against a real arbiter:
/// `[[registration_rules]]` bind the nodes they name to the services they
/// list, and `registration.addresses = "declared"` (the default) to the
/// addresses the node declared in its Hello. A refusal is 403 with the
/// reason and changes nothing; a node no rule names registers as before.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn registration_rules_refuse_unlisted_services_and_undeclared_addresses() {
    let cluster = Cluster::start_with(|c| {
        c.registration_rules = vec![rollcall_config::RegistrationRule {
            nodes: vec![rollcall_config::NodePattern::try_from("edge-*".to_owned()).unwrap()],
            zones: Vec::new(),
            services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
            any_address: false,
        }];
    })
    .await;
    let admin = cluster.admin();
    let mut edge = cluster.agent_config("edge-1");
    edge.advertise_addresses = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    let edge = cluster.agent_with(edge).await;
    let http = Http::of(&edge);
    http.wait_connected().await;

    let (status, body) = http.register("web", "web-1", 8080).await;
    assert_eq!(
        status, 200,
        "a listed service at a declared address: {body}"
    );
    let before = admin.revision().await;

    let (status, body) = http.register("api", "api-1", 8081).await;
    assert_eq!(status, 403, "{body}");
    let message = body.to_string();
    assert!(
        message.contains("may not register") && message.contains("default/web/*"),
        "the refusal names the rule's services: {message}"
    );

    let (status, body) = http
        .register_at("web", "web-2", "127.0.0.9", 8082, 100)
        .await;
    assert_eq!(status, 403, "{body}");
    let message = body.to_string();
    assert!(
        message.contains("127.0.0.9") && message.contains("declared addresses"),
        "the refusal names the address: {message}"
    );
    assert_eq!(admin.revision().await, before, "a refusal commits nothing");
    assert_eq!(http.ready_ids("web").await.unwrap(), vec!["web-1"]);
    let refused = admin
        .metric("rollcall_arbiter_refusals_total{kind=\"forbidden\"}")
        .await;
    assert!(refused >= 2.0, "refusals counted: {refused}");

    // A node no rule names may register any service at its own address.
    let core = cluster.agent("core-1").await;
    let core_http = Http::of(&core);
    core_http.wait_connected().await;
    let (status, body) = core_http.register("api", "api-2", 8083).await;
    assert_eq!(status, 200, "{body}");
    edge.shutdown().await;
    core.shutdown().await;
}

/// Issue 37, item 1: `GET /v1/agent/instances` lists this node's
/// registrations (pending and drained ones as such), and `GET
/// /v1/services` the region's services with READY/total counts as the
/// arbiter lists them, leaving out what its watch rules keep from this
/// node; with the arbiter away, the services the agent holds, said so.
#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn an_agent_lists_its_registrations_and_the_regions_services() {
    let mut cluster = Cluster::start_with(|c| {
        c.watch_rules = vec![rollcall_config::WatchRule {
            nodes: vec!["node-a".into()],
            services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
        }];
    })
    .await;
    let (_agent, http) = connected_agent(&cluster, "node-a").await;
    let (_, body) = get_plain(&http, "/v1/agent/instances").await;
    assert_eq!(body, serde_json::json!({"instances": []}));
    for (service, id, port) in [
        ("web", "web-1", 8081),
        ("web", "web-2", 8082),
        ("db", "db-1", 5432),
    ] {
        let (status, body) = http.register(service, id, port).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = http.drain("web-2", "?wait=committed").await;
    assert_eq!(status, 200);
    let (status, body) = get_plain(&http, "/v1/agent/instances").await;
    assert_eq!(status, 200, "{body}");
    let listed: Vec<(String, String, String, bool)> = body["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["instance_id"].as_str().unwrap().to_owned(),
                i["service"].as_str().unwrap().to_owned(),
                i["intent"].as_str().unwrap().to_owned(),
                i["committed"].as_bool().unwrap(),
            )
        })
        .collect();
    let want = |id: &str, service: &str, intent: &str| {
        (
            id.to_owned(),
            format!("default/{service}/default"),
            intent.to_owned(),
            true,
        )
    };
    assert_eq!(
        listed,
        vec![
            want("db-1", "db", "serve"),
            want("web-1", "web", "serve"),
            want("web-2", "web", "drain"),
        ],
        "{body}"
    );
    assert_eq!(body["instances"][1]["generation"], 1, "{body}");
    assert_eq!(body["instances"][1]["port"], 8081, "{body}");
    assert_eq!(body["instances"][1]["checked"], Value::Null, "{body}");
    // Both looked up; db is refused by the watch rules, so not held.
    wait_ready(&http, "web", &["web-1"]).await;
    let (status, _) = http.resolve("db").await;
    assert_eq!(status, 503);
    let denied = cluster
        .admin()
        .metric("rollcall_arbiter_refusals_total{kind=\"watch\"}")
        .await;
    assert!(denied >= 1.0, "the denied watch is counted: {denied}");
    let (status, body) = get_plain(&http, "/v1/services").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["source"], "catalog", "{body}");
    assert_eq!(body["truncated"], false, "{body}");
    let catalog_revision = body["revision"].as_u64().unwrap();
    assert_eq!(
        body["services"],
        serde_json::json!([{
            "service": "default/web/default",
            "revision": body["services"][0]["revision"],
            "ready": 1,
            "total": 2,
            "stale": false,
            "age_ms": 0,
        }]),
        "{body}"
    );
    let web_revision = body["services"][0]["revision"].as_u64().unwrap();
    assert!(
        web_revision > 0 && web_revision <= catalog_revision,
        "{body}"
    );

    // A node no watch rule names sees the whole region, services it has
    // never looked up included.
    let other = cluster.agent("node-b").await;
    let other_http = Http::of(&other);
    other_http.wait_connected().await;
    let (status, body) = get_plain(&other_http, "/v1/services").await;
    assert_eq!(status, 200, "{body}");
    let listed: Vec<(&str, u64, u64)> = body["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["service"].as_str().unwrap(),
                s["ready"].as_u64().unwrap(),
                s["total"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![("default/db/default", 1, 1), ("default/web/default", 1, 2)],
        "{body}"
    );
    other.shutdown().await;

    // The arbiter away: the copies this agent holds, said so.
    cluster.stop_arbiter().await;
    http.wait_disconnected().await;
    let (status, body) = get_plain(&http, "/v1/services").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["source"], "held", "{body}");
    assert_eq!(body["revision"], Value::Null, "{body}");
    let held: Vec<&str> = body["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["service"].as_str().unwrap())
        .collect();
    assert_eq!(held, vec!["default/web/default"], "{body}");
    assert_eq!(body["services"][0]["stale"], true, "{body}");
}

/// A read as anyone on the host sends it: no token.
async fn get_plain(http: &Http, path: &str) -> (u16, Value) {
    let resp = http
        .client
        .get(format!("{}{path}", http.base))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}
