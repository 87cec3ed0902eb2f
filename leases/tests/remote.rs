//! What the region bridge asks of its arbiter's admin HTTP (issue 8,
//! item 2): the remote view lives in memory with its age (gone after a
//! restart), replicated policies go through the log with their home
//! revision (kept after a restart, never going back), and the summaries
//! say nothing per instance. The bridge's own token opens these calls
//! only, and what it writes is audited as the bridge's.

mod common;

use std::net::SocketAddr;

use rollcall_config::ArbiterConfig;
use rollcall_leases::identity::Identity;
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role};
use serde_json::{json, Value};

async fn arbiter(ca: &Ca, dir: &std::path::Path) -> ArbiterServer {
    let config = ArbiterConfig {
        region: "r2".into(),
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
    let identity = Identity::new(
        Label::new("r2").unwrap(),
        Role::Arbiter,
        PrincipalName::new("arbiter-1").unwrap(),
    );
    let tls = TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap());
    common::start_when_released(config, &tls).await
}

async fn call(
    server: &ArbiterServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_with(&server.token_file, server, method, path, body).await
}

/// `call` with the token in `token_file`.
async fn call_with(
    token_file: &std::path::Path,
    server: &ArbiterServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let token = std::fs::read_to_string(token_file).unwrap();
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

async fn put(server: &ArbiterServer, path: &str, body: Value) -> (u16, Value) {
    call(server, reqwest::Method::PUT, path, Some(body)).await
}

fn view(version: u64, summaries: Value) -> Value {
    json!({
        "view": {
            "region": "r1",
            "version": version,
            "as_of_ms": 1_000,
            "ingress": ["edge.r1.example:443"],
            "summaries": summaries,
        },
        "heard_ms_ago": 100,
        "max_age_ms": 30_000,
    })
}

fn replica(home: &str, home_revision: u64) -> Value {
    json!({
        "policy": {"service": "shop/checkout", "home_region": home, "cross_region": true, "failover_order": ["r2"]},
        "home_revision": home_revision,
        "home_set_at_ms": 10,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_remote_view_lives_in_memory_and_replicated_policies_in_the_log() {
    let ca = Ca::generate(&Label::new("r2").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path()).await;

    // A region's view, with its age counted from the bridge's last word.
    let web = json!({"service": "shop/web/http", "revision": 5, "ready": 2, "weight": 200, "taken_at_ms": 900});
    let (status, body) = put(&server, "/v1/remote/r1", view(7, json!([web]))).await;
    assert_eq!(status, 200, "{body}");
    let (status, remote) = get(&server, "/v1/remote").await;
    assert_eq!(status, 200, "{remote}");
    assert_eq!(remote["region"], "r2");
    let r1 = &remote["regions"][0];
    assert_eq!(r1["region"], "r1");
    assert_eq!(r1["version"], 7);
    assert_eq!(r1["summaries"], json!([web]));
    assert_eq!(r1["ingress"], json!(["edge.r1.example:443"]));
    assert!(r1["age_ms"].as_u64().unwrap() >= 100, "{r1}");
    assert_eq!(
        (r1["max_age_ms"].clone(), r1["fresh"].clone()),
        (json!(30_000), json!(true))
    );

    // A confirmation of the version held refreshes it; of another, 409.
    let heard = |version: u64| json!({"version": version, "as_of_ms": 2_000, "heard_ms_ago": 0});
    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/v1/remote/r1/heard",
        Some(heard(7)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        get(&server, "/v1/remote").await.1["regions"][0]["as_of_ms"],
        2_000
    );
    let (status, body) = call(
        &server,
        reqwest::Method::POST,
        "/v1/remote/r1/heard",
        Some(heard(8)),
    )
    .await;
    assert_eq!(
        (status, body["error"].clone()),
        (409, json!("unknown_version")),
        "{body}"
    );

    // Refused, changing nothing: this region's own view, unsorted
    // summaries, a body naming another region than the path.
    let before = get(&server, "/v1/remote").await.1;
    let (status, body) = put(&server, "/v1/remote/r2", view(1, json!([]))).await;
    assert_eq!(status, 403, "{body}");
    let cart = json!({"service": "shop/cart/http", "revision": 1, "ready": 1, "weight": 1, "taken_at_ms": 0});
    let (status, body) = put(&server, "/v1/remote/r1", view(9, json!([web, cart]))).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = put(&server, "/v1/remote/r3", view(9, json!([]))).await;
    assert_eq!(status, 400, "{body}");
    let mut after = get(&server, "/v1/remote").await.1;
    after["regions"][0]["age_ms"] = before["regions"][0]["age_ms"].clone();
    assert_eq!(after, before);

    // Replicated policies: committed with their home revision, once; an
    // older version changes nothing; another home region is refused.
    let path = "/v1/remote/r1/policies";
    let (status, body) = put(&server, path, json!({"policies": [replica("r1", 4)]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["policies"][0]["changed"], true, "{body}");
    for older in [4, 3] {
        let (status, body) = put(&server, path, json!({"policies": [replica("r1", older)]})).await;
        assert_eq!(
            (status, body["policies"][0]["changed"].clone()),
            (200, json!(false)),
            "{body}"
        );
    }
    let (status, body) = put(&server, path, json!({"policies": [replica("r3", 9)]})).await;
    assert_eq!(status, 422, "{body}");
    let (_, shown) = get(&server, "/v1/policies/shop/checkout").await;
    assert_eq!(shown["replicated"], true);
    assert_eq!(shown["home_region"], "r1");
    assert_eq!(shown["home_revision"], 4);
    let (_, summaries) = get(&server, "/v1/summaries").await;
    assert_eq!(summaries["region"], "r2");
    assert_eq!(summaries["summaries"], json!([]));

    // After a restart: the policy is still there (the log), the view is
    // not (memory only; the bridge sends it again).
    server.shutdown().await;
    let server = arbiter(&ca, dir.path()).await;
    assert_eq!(get(&server, "/v1/remote").await.1["regions"], json!([]));
    let (status, shown) = get(&server, "/v1/policies/shop/checkout").await;
    assert_eq!((status, shown["home_revision"].clone()), (200, json!(4)));

    // Deleted at home: dropped here.
    let removed = json!({"removed": [{"service": "shop/checkout", "home_revision": 5}]});
    let (status, body) = put(&server, path, removed).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["removed"][0]["changed"], true, "{body}");
    assert_eq!(get(&server, "/v1/policies/shop/checkout").await.0, 404);
    server.shutdown().await;
}

/// Issue 38, item 8: the bridge has a token of its own, `bridge.token`:
/// it opens the bridge's calls, is refused `403` elsewhere, and what it
/// writes is audited as `bridge:bridge-token`, not as the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridges_token_opens_the_bridges_calls_only_and_is_audited_as_the_bridge() {
    let ca = Ca::generate(&Label::new("r2").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path()).await;
    let bridge = |method, path: &'static str, body| {
        call_with(&server.bridge_token_file, &server, method, path, body)
    };
    for path in ["/v1/summaries", "/v1/remote", "/v1/policies", "/v1/writers"] {
        let (status, body) = bridge(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (status, body) = bridge(
        reqwest::Method::PUT,
        "/v1/remote/r1/policies",
        Some(json!({"policies": [replica("r1", 4)]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for (method, path) in [
        (reqwest::Method::GET, "/v1/status"),
        (reqwest::Method::GET, "/v1/audit"),
        (reqwest::Method::GET, "/v1/cluster"),
        (reqwest::Method::DELETE, "/v1/policies/shop/checkout"),
    ] {
        let (status, body) = bridge(method, path, None).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body["detail"].as_str().unwrap().contains("bridge.token"),
            "{body}"
        );
    }
    let (_, audit) = get(&server, "/v1/audit").await;
    let replicated: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] == "replicate-policy")
        .collect();
    assert_eq!(replicated.len(), 1, "{audit}");
    assert_eq!(replicated[0]["actor"], "bridge:bridge-token");
    server.shutdown().await;
}
