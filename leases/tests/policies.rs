//! Service policies through a real arbiter's admin HTTP (issue 8, item 1):
//! committed under a revision and audited, refused outside their home
//! region and when invalid (changing nothing), kept across restarts from
//! the Raft log and from a snapshot, and handed to the leader when sent to
//! a follower.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use rollcall_config::{ArbiterConfig, ReplicaEntry};
use rollcall_leases::identity::Identity;
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role};
use serde_json::{json, Value};

fn material(ca: &Ca, name: &str) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        Role::Arbiter,
        PrincipalName::new(name).unwrap(),
    );
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

async fn arbiter(ca: &Ca, dir: &std::path::Path) -> ArbiterServer {
    let config = ArbiterConfig {
        region: "r1".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.join("arbiter"),
        // Tests register addresses no node declared.
        registration: rollcall_config::RegistrationConfig {
            addresses: rollcall_config::AddressRule::Any,
            ..Default::default()
        },
        ..ArbiterConfig::default()
    };
    common::start_when_released(config, &material(ca, "arbiter-1")).await
}

/// One admin call with the operator token: status and JSON body.
async fn call(
    server: &ArbiterServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let token = std::fs::read_to_string(&server.token_file).unwrap();
    let mut request = reqwest::Client::new()
        .request(method, format!("http://{}{path}", server.admin_addr))
        .bearer_auth(token.trim());
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn get(server: &ArbiterServer, path: &str) -> (u16, Value) {
    call(server, reqwest::Method::GET, path, None).await
}

async fn put(server: &ArbiterServer, body: Value) -> (u16, Value) {
    call(server, reqwest::Method::PUT, "/v1/policies", Some(body)).await
}

async fn revision(server: &ArbiterServer) -> u64 {
    get(server, "/v1/status").await.1["revision"]
        .as_u64()
        .unwrap()
}

fn checkout() -> Value {
    json!({
        "service": "shop/checkout",
        "home_region": "r1",
        "cross_region": true,
        "failover_traffic": "all",
        "failover_order": ["r2", "r3"],
        "data_boundary": ["r4"],
        "max_snapshot_age_ms": 60000,
        "stale_behaviour": "refuse",
        "capacity_limits": {"r2": 0.3},
        "single_writer": {"owner": "r1"},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_commit_with_revisions_refuse_bad_input_and_survive_restarts() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path()).await;

    // Applied: each policy gets a revision, and the audit log says so.
    let document = json!({"policy": [checkout(), {"service": "shop/cart", "home_region": "r1"}]});
    let (status, body) = put(&server, document.clone()).await;
    assert_eq!(status, 200, "{body}");
    let rows = body["policies"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["changed"] == true), "{body}");
    let set_at = rows[0]["revision"].as_u64().unwrap();
    assert!(set_at > 0);

    let (status, shown) = get(&server, "/v1/policies/shop/checkout").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["revision"], set_at);
    assert_eq!(shown["home_region"], "r1");
    assert_eq!(shown["set_by"], "operator:admin-token");
    assert_eq!(shown["policy"]["failover_order"], json!(["r2", "r3"]));
    assert_eq!(shown["policy"]["capacity_limits"], json!({"r2": 0.3}));
    assert_eq!(shown["policy"]["single_writer"]["owner"], "r1");
    assert_eq!(shown["writer"]["epoch"], 1, "{shown}");
    assert_eq!(shown["writer"]["owner"], "r1", "{shown}");
    let (_, cart) = get(&server, "/v1/policies/shop/cart").await;
    assert_eq!(cart["policy"]["cross_region"], false, "defaults filled in");
    assert_eq!(cart["writer"], Value::Null, "no single writer, no epoch");

    let (_, audit) = get(&server, "/v1/audit").await;
    let entry = audit
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["revision"] == set_at)
        .unwrap_or_else(|| panic!("no audit entry at revision {set_at}: {audit}"));
    assert_eq!(entry["command"], "set-policy");
    assert_eq!(entry["actor"], "operator:admin-token");
    let detail = entry["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("policy of shop/checkout set: home r1, cross-region all traffic"),
        "{detail}"
    );

    // The same document again commits nothing.
    let before = revision(&server).await;
    let (status, body) = put(&server, document.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["policies"][0]["changed"], false);
    assert_eq!(body["policies"][0]["revision"], set_at);
    assert_eq!(revision(&server).await, before);

    // Refused, changing nothing: another home region (even next to a
    // valid policy), a rule broken, a value of the wrong type, no token.
    let mut changed = checkout();
    changed["cross_region"] = json!(false);
    let elsewhere = json!({"policy": [changed, {"service": "shop/search", "home_region": "r2"}]});
    let (status, body) = put(&server, elsewhere).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "not_home_region");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("policy[1]: the policy of shop/search has home region r2; only region r2's arbiter accepts changes to it"),
        "{detail}"
    );

    let mut invalid = checkout();
    invalid["failover_order"] = json!(["r2", "r4"]);
    let (status, body) = put(&server, json!({"policy": [invalid]})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"], "invalid_policy");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("policy[0].failover_order[1] = \"r4\" is in data_boundary"),
        "{detail}"
    );

    let mut declared = checkout();
    declared["single_writer"]["transfer_to"] = json!("r2");
    let (status, body) = put(&server, json!({"policy": [declared]})).await;
    assert_eq!(status, 422, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("transfer_to") && detail.contains("rollcall policy transfer shop/checkout"),
        "{detail}"
    );

    let mut mistyped = checkout();
    mistyped["cross_region"] = json!("yes");
    let (status, body) = put(&server, json!({"policy": [mistyped]})).await;
    assert_eq!(status, 400, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("policy[0].cross_region"), "{detail}");

    let anonymous = reqwest::Client::new()
        .put(format!("http://{}/v1/policies", server.admin_addr))
        .json(&document)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);

    assert_eq!(revision(&server).await, before, "refusals commit nothing");
    let (_, shown) = get(&server, "/v1/policies/shop/checkout").await;
    assert_eq!(shown["revision"], set_at);
    assert_eq!(shown["policy"]["cross_region"], true);
    let (status, _) = get(&server, "/v1/policies/shop/search").await;
    assert_eq!(status, 404);

    // Deleted once; then unknown.
    let (status, body) = call(
        &server,
        reqwest::Method::DELETE,
        "/v1/policies/shop/cart",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        &server,
        reqwest::Method::DELETE,
        "/v1/policies/shop/cart",
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (_, list) = get(&server, "/v1/policies").await;
    assert_eq!(list["region"], "r1");
    let services: Vec<&str> = list["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["service"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["shop/checkout"]);

    // The writes move: epoch 2, moving until r2 confirms; a transfer of
    // a service without a single writer, or to a region the policy does
    // not allow, is refused.
    let transfer = |service: &str, to: &str| {
        (
            format!("/v1/policies/shop/{service}/transfer"),
            json!({ "to": to }),
        )
    };
    let (path, body) = transfer("checkout", "r4");
    let (status, answer) = call(&server, reqwest::Method::POST, &path, Some(body)).await;
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("data_boundary"),
        "{answer}"
    );
    let (path, body) = transfer("checkout", "r2");
    let (status, answer) = call(&server, reqwest::Method::POST, &path, Some(body)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["writer"]["epoch"], 2, "{answer}");
    assert_eq!(answer["writer"]["settled"], false, "{answer}");
    let (_, writers) = get(&server, "/v1/writers").await;
    assert_eq!(
        writers["writers"].as_array().map(Vec::len),
        Some(1),
        "{writers}"
    );

    // A restart replays the Raft log.
    let (_, expected) = get(&server, "/v1/policies").await;
    assert_eq!(expected["policies"][0]["writer"]["epoch"], 2, "{expected}");
    server.shutdown().await;
    let server = arbiter(&ca, dir.path()).await;
    assert_eq!(get(&server, "/v1/policies").await.1, expected);

    // A restart from a snapshot that covers every write.
    let raft = server.raft().clone();
    raft.trigger().snapshot().await.unwrap();
    let applied = raft.metrics().borrow().last_applied;
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut metrics = raft.metrics();
        while metrics.borrow_and_update().snapshot < applied {
            metrics.changed().await.unwrap();
        }
    })
    .await
    .expect("a snapshot is built");
    drop(raft);
    server.shutdown().await;
    let server = arbiter(&ca, dir.path()).await;
    assert_eq!(get(&server, "/v1/policies").await.1, expected);
    let (_, shown) = get(&server, "/v1/policies/shop/checkout").await;
    assert_eq!(shown["revision"], set_at);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_sent_to_a_follower_is_committed_by_the_leader() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            socket.local_addr().unwrap().port()
        })
        .collect();
    let replicas: Vec<ReplicaEntry> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| ReplicaEntry {
            id: i as u64 + 1,
            addr: format!("127.0.0.1:{port}"),
        })
        .collect();
    let mut servers = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let name = format!("arbiter-{}", i + 1);
        let mut config = ArbiterConfig {
            name: name.clone(),
            region: "r1".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], *port)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join(&name),
            // Tests register addresses no node declared.
            registration: rollcall_config::RegistrationConfig {
                addresses: rollcall_config::AddressRule::Any,
                ..Default::default()
            },
            ..ArbiterConfig::default()
        };
        config.raft.id = i as u64 + 1;
        config.raft.replicas = replicas.clone();
        servers.push(
            ArbiterServer::start(config, &material(&ca, &name))
                .await
                .unwrap(),
        );
    }
    let leader = tokio::time::timeout(Duration::from_secs(30), async {
        let mut metrics = servers[0].raft().metrics();
        loop {
            if let Some(leader) = metrics.borrow_and_update().current_leader {
                return leader;
            }
            metrics.changed().await.unwrap();
        }
    })
    .await
    .expect("the group elects a leader");
    let follower = servers
        .iter()
        .find(|s| s.replica_id != leader)
        .expect("two of three follow");

    let (status, body) = put(follower, json!({"policy": [checkout()]})).await;
    assert_eq!(status, 200, "{body}");
    let set_at = body["policies"][0]["revision"].as_u64().unwrap();
    // Answered once the follower applied it: it reads its own write.
    let (status, shown) = get(follower, "/v1/policies/shop/checkout").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["revision"], set_at);

    let elsewhere = json!({"policy": [{"service": "shop/search", "home_region": "r3"}]});
    let (status, body) = put(follower, elsewhere).await;
    assert_eq!(status, 403, "{body}");
    for server in servers {
        server.shutdown().await;
    }
}
