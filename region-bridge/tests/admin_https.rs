//! The bridge reaches its arbiter's admin API over HTTPS with its own
//! certificate (issue 38, item 4): the admin port answers TLS beside plain
//! HTTP; the bridge's writes are audited under its certificate's name; a
//! certificate of another role names nobody (the token decides); and the
//! bridge talks only to an arbiter of its own region.

mod common;

use std::time::Duration;

use reqwest::Method;
use rollcall_leases::tls::{Ca, LiveTls};
use rollcall_leases::Role;
use rollcall_region_bridge::arbiter::Https;
use serde_json::{json, Value};

use common::*;

const WAIT: Duration = Duration::from_secs(10);

fn client(ca: &Ca, role: Role, name: &str, expects: &str) -> Https {
    let live = LiveTls::new(&material(ca, "r1", role, name)).unwrap();
    Https::new(live.https_client_config(), label(expects))
}

fn policies(home_revision: u64) -> Vec<u8> {
    json!({"policies": [{
        "policy": {"service": "shop/checkout", "home_region": "r2", "cross_region": true, "failover_order": ["r1"]},
        "home_revision": home_revision,
        "home_set_at_ms": 10,
    }]})
    .to_string()
    .into_bytes()
}

/// The audit entries of replicated policies, oldest first: their actors.
async fn replicated_by(server: &rollcall_leases::server::ArbiterServer) -> Vec<Value> {
    let (status, audit) = get(server, "/v1/audit").await;
    assert_eq!(status, 200, "{audit}");
    audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["command"] == "replicate-policy")
        .map(|e| e["actor"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_calls_its_arbiter_over_https_and_is_audited_as_itself() {
    let ca = Ca::generate(&label("r1")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, "r1", dir.path()).await;
    let addr = server.admin_addr.to_string();
    let token = std::fs::read_to_string(&server.bridge_token_file).unwrap();
    let token = token.trim();

    let bridge = client(&ca, Role::Bridge, "bridge-r1", "r1");
    let (status, body) = bridge
        .call(&addr, Method::GET, "/v1/summaries", token, None, WAIT)
        .await
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let put = "/v1/remote/r2/policies";
    let (status, body) = bridge
        .call(&addr, Method::PUT, put, token, Some(policies(4)), WAIT)
        .await
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        replicated_by(&server).await,
        vec![json!("bridge:bridge-r1")]
    );

    // The token decides what a call may do: an agent's certificate with
    // the bridge's token names nobody, and the write is the token's.
    let agent = client(&ca, Role::Agent, "node-1", "r1");
    let (status, _) = agent
        .call(&addr, Method::PUT, put, token, Some(policies(5)), WAIT)
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        replicated_by(&server).await,
        vec![json!("bridge:bridge-r1"), json!("bridge:bridge-token")]
    );
    // And a certificate without the token opens nothing.
    let (status, _) = bridge
        .call(&addr, Method::GET, "/v1/summaries", "wrong", None, WAIT)
        .await
        .unwrap();
    assert_eq!(status, 401);

    // Plain HTTP still answers on the same port.
    let (status, body) = get(&server, "/v1/status").await;
    assert_eq!(status, 200, "{body}");

    // The bridge talks only to an arbiter of its own region.
    let elsewhere = client(&ca, Role::Bridge, "bridge-r1", "r3");
    let refused = elsewhere
        .call(&addr, Method::GET, "/v1/summaries", token, None, WAIT)
        .await
        .expect_err("an arbiter of r1 is not r3's");
    assert!(refused.contains("not an arbiter of region r3"), "{refused}");
    server.shutdown().await;
}
