//! Issue 4, health and identity: checks against real backends on loopback,
//! registration sessions, and workload identity on the unix socket.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{eventually, Cluster, Http};
use rollcall_config::{ServicePattern, WorkloadGrant};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP backend whose /healthz answers 200 or 503 as `healthy` says.
async fn backend(healthy: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/healthz",
        axum::routing::get(move || {
            let healthy = healthy.clone();
            async move {
                if healthy.load(Ordering::SeqCst) {
                    axum::http::StatusCode::OK
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

async fn state_of(http: &Http, service: &str, id: &str) -> Option<String> {
    let (status, body) = http.resolve_all(service).await;
    if status != 200 {
        return None;
    }
    body["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["instance_id"] == id)
        .map(|e| e["state"].as_str().unwrap().to_owned())
}

async fn register(http: &Http, body: Value) -> (u16, Value) {
    http.send(reqwest::Method::PUT, "/v1/agent/instances", Some(body))
        .await
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_failing_readiness_check_takes_the_instance_out_and_passing_brings_it_back() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent("node-a").await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    // A second, healthy instance: with the failing one alone, empty-set
    // protection (R7) would rightly keep it in the answer.
    assert_eq!(http.register("web", "web-2", 9999).await.0, 200);
    let healthy = Arc::new(AtomicBool::new(true));
    let port = backend(healthy.clone()).await;
    let checks = json!({"readiness": {"kind": "http", "path": "/healthz", "interval_ms": 200, "timeout_ms": 100, "failure_threshold": 3, "success_threshold": 2}});
    let (status, body) = register(&http, json!({"service": "web", "instance_id": "web-1", "address": "127.0.0.1", "port": port, "checks": checks})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["state"], "STARTING",
        "an instance with checks waits for them"
    );
    eventually("READY after the checks pass", || async {
        (state_of(&http, "web", "web-1").await.as_deref() == Some("READY")).then_some(())
    })
    .await;
    healthy.store(false, Ordering::SeqCst);
    eventually("UNHEALTHY after 3 failures", || async {
        (state_of(&http, "web", "web-1").await.as_deref() == Some("UNHEALTHY")).then_some(())
    })
    .await;
    assert_eq!(http.ready_ids("web").await.unwrap(), vec!["web-2"]);
    healthy.store(true, Ordering::SeqCst);
    eventually("READY again", || async {
        (http.ready_ids("web").await == Some(vec!["web-1".to_owned(), "web-2".to_owned()]))
            .then_some(())
    })
    .await;
    let metrics = http.metrics().await;
    assert!(
        metrics.contains("rollcall_agent_health_flaps_total"),
        "{metrics}"
    );
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_ttl_instance_that_stops_heartbeating_goes_unhealthy() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent("node-a").await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    let checks = json!({"readiness": {"kind": "ttl", "ttl_ms": 600, "interval_ms": 200, "timeout_ms": 100, "failure_threshold": 1}});
    let (status, body) = register(&http, json!({"service": "worker", "instance_id": "w-1", "address": "127.0.0.1", "port": 9000, "checks": checks})).await;
    assert_eq!(status, 200, "{body}");
    let generation = body["generation"].as_u64().unwrap();
    // Heartbeats keep it READY.
    eventually("READY while heartbeating", || async {
        http.heartbeat("w-1", &format!("?generation={generation}"))
            .await;
        (state_of(&http, "worker", "w-1").await.as_deref() == Some("READY")).then_some(())
    })
    .await;
    // A heartbeat with another generation is refused and changes nothing.
    assert_eq!(
        http.heartbeat("w-1", &format!("?generation={}", generation + 1))
            .await
            .0,
        409
    );
    eventually("UNHEALTHY once heartbeats stop", || async {
        (state_of(&http, "worker", "w-1").await.as_deref() == Some("UNHEALTHY")).then_some(())
    })
    .await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_closed_session_marks_the_instance_unhealthy() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent("node-a").await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    let (status, body) = http.register("web", "web-1", 8080).await;
    assert_eq!(status, 200, "{body}");
    // Hold the session on a raw connection, as a process would.
    let mut conn = tokio::net::TcpStream::connect(agent.http_addr)
        .await
        .unwrap();
    let request = format!(
        "POST /v1/agent/instances/web-1/session?generation=1 HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {}\r\nContent-Length: 0\r\n\r\n",
        http.token
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = conn.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert_eq!(
        state_of(&http, "web", "web-1").await.as_deref(),
        Some("READY")
    );
    drop(conn);
    eventually("UNHEALTHY once the session closes", || async {
        (state_of(&http, "web", "web-1").await.as_deref() == Some("UNHEALTHY")).then_some(())
    })
    .await;

    // A session of a drained instance may close without effect.
    http.register("web", "web-2", 8081).await;
    let mut conn = tokio::net::TcpStream::connect(agent.http_addr)
        .await
        .unwrap();
    let request = format!(
        "POST /v1/agent/instances/web-2/session?generation=1 HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {}\r\nContent-Length: 0\r\n\r\n",
        http.token
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let _ = conn.read(&mut buf).await.unwrap();
    assert_eq!(http.drain("web-2", "?generation=1").await.0, 200);
    drop(conn);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        state_of(&http, "web", "web-2").await.as_deref(),
        Some("DRAINING")
    );
}

/// One HTTP/1.1 request over the agent's unix socket; returns the status.
async fn over_socket(
    path: &std::path::Path,
    method: &str,
    target: &str,
    body: &str,
) -> (u16, String) {
    let mut conn = tokio::net::UnixStream::connect(path).await.unwrap();
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
    (status, answer)
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn workloads_touch_only_their_own_services() {
    let cluster = Cluster::start().await;
    let uid = nix_like_uid();
    let mut config = cluster.agent_config("node-a");
    config.workloads = vec![WorkloadGrant {
        uid: Some(uid),
        gid: None,
        services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
    }];
    let agent = cluster.agent_with(config).await;
    let http = Http::of(&agent);
    http.wait_connected().await;
    let socket = cluster.agent_dir("node-a").join("agent.sock");
    let body = |service: &str, id: &str| {
        json!({"service": service, "instance_id": id, "address": "127.0.0.1", "port": 8080})
            .to_string()
    };
    let (status, answer) =
        over_socket(&socket, "PUT", "/v1/agent/instances", &body("web", "web-1")).await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) =
        over_socket(&socket, "PUT", "/v1/agent/instances", &body("api", "api-1")).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains(&format!("uid {uid}")), "{answer}");
    // A workload must name the generation; the node token need not.
    let (status, answer) = over_socket(&socket, "PUT", "/v1/agent/instances/web-1/drain", "").await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = over_socket(
        &socket,
        "PUT",
        "/v1/agent/instances/web-1/drain?generation=1",
        "",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // The TCP API without a token has no identity at all.
    let (status, _) = http
        .send_raw(
            reqwest::Method::PUT,
            "/v1/agent/instances",
            body("web", "web-2").into_bytes(),
            false,
        )
        .await;
    assert_eq!(status, 401);
    assert_eq!(
        http.resolve("api").await.0,
        404,
        "nothing of api was registered"
    );
}

/// This process's uid, read from /proc (tests run on Linux).
fn nix_like_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
