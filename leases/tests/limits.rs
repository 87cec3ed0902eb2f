//! `[limits]` and refusals over real QUIC on loopback (issue 20, and the
//! bounds per identity of issue 38, item 5): what one identity, connection
//! or source address may take of an arbiter, each hit refused or held back
//! with the reason and counted.

use std::net::Ipv4Addr;
use std::time::Duration;

use rollcall_leases::client::ArbiterClient;
use rollcall_leases::protocol::{
    RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp,
};
use rollcall_leases::tls::Ca;
use rollcall_leases::{InstanceId, Label, NodeId, Role, ServiceKey};

mod quic;
use quic::*;

/// Issue 20, item 5: what the arbiter refuses is counted by kind
/// (`rollcall_arbiter_refusals_total{kind}`): at authorization and in the
/// catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_by_kind() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let (conn, _w, _r) = seed_session(&ca, &server).await;
    // Another node's instance: refused by authorization.
    let mut other = seed_registration("web-9", Ipv4Addr::LOCALHOST);
    other.node = NodeId::new("other").unwrap();
    assert!(matches!(
        conn.request(&Request::Register(other)).await.unwrap(),
        Response::Rejected {
            kind: RejectKind::Forbidden,
            ..
        }
    ));
    // A live instance, then a stale generation: refused by the catalog.
    let reg = seed_registration("web-1", Ipv4Addr::LOCALHOST);
    assert!(matches!(
        conn.request(&Request::Register(reg)).await.unwrap(),
        Response::Committed { .. }
    ));
    let stale = Request::Deregister {
        instance_id: InstanceId::new("web-1").unwrap(),
        generation: rollcall_leases::Generation(7),
    };
    assert!(matches!(
        conn.request(&stale).await.unwrap(),
        Response::Rejected {
            kind: RejectKind::StaleGeneration,
            ..
        }
    ));
    assert_eq!(
        metric(
            &server,
            "rollcall_arbiter_refusals_total{kind=\"forbidden\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &server,
            "rollcall_arbiter_refusals_total{kind=\"stale_generation\"}"
        )
        .await,
        1.0
    );
    server.shutdown().await;
}

/// Issue 20, item 4: one session per node. A second session of the same
/// node (the same agent run reconnecting while its old connection is half
/// dead) replaces the first, which is closed with the reason; the node's
/// lease and writes go on through the new one, and other nodes notice
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_session_of_a_node_replaces_the_first() {
    let (ca, _dir, server) = limited(|_| {}).await;
    let seed = material(&ca, Role::Agent, "seed");
    let (old, _old_w, _old_r) = session_of(&seed, &server, "seed", 1).await;
    let (other, _ow, _or) =
        session_of(&material(&ca, Role::Agent, "other"), &server, "other", 1).await;
    let (new, _new_w, _new_r) = session_of(&seed, &server, "seed", 1).await;
    let reason = close_reason(&old).await;
    assert!(
        reason.contains("replaced by a newer session of node seed"),
        "{reason}"
    );
    let reg = seed_registration("web-1", Ipv4Addr::LOCALHOST);
    assert!(matches!(
        new.request(&Request::Register(reg)).await.unwrap(),
        Response::Committed { .. }
    ));
    assert!(matches!(
        other.request(&Request::NodeInstances).await.unwrap(),
        Response::Instances(_)
    ));
    assert_eq!(limit_hits(&server, "sessions_per_node").await, 1.0);
    let status = admin_get(&server, "/v1/status").await;
    let nodes: Vec<&str> = status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["node"].as_str())
        .collect();
    assert_eq!(
        nodes.iter().filter(|n| **n == "seed").count(),
        1,
        "{nodes:?}"
    );
    server.shutdown().await;
}

/// Issue 20, item 4: connections per identity. One over the limit is
/// closed at once with the reason; closing one frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_identity_limit_are_closed_with_the_reason() {
    let (ca, _dir, server) = limited(|c| c.limits.connections_per_identity = 2).await;
    let addr = server.quic_addr.to_string();
    let client = ArbiterClient::new(&material(&ca, Role::Controller, "deployer")).unwrap();
    let first = client.connect(&addr).await.unwrap();
    let second = client.connect(&addr).await.unwrap();
    for conn in [&first, &second] {
        assert!(matches!(
            conn.request(&Request::NodeInstances).await.unwrap(),
            Response::Rejected { .. }
        ));
    }
    let third = client.connect(&addr).await.unwrap();
    let reason = close_reason(&third).await;
    assert!(
        reason.contains("rollcall://r1/controller/deployer already holds 2 connections"),
        "{reason}"
    );
    assert!(
        reason.contains("limits.connections_per_identity"),
        "{reason}"
    );
    // Another identity is not counted with this one.
    let (agent, _w, _r) = session_of(&material(&ca, Role::Agent, "seed"), &server, "seed", 1).await;
    first.close("done");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let fourth = loop {
        let conn = client.connect(&addr).await.unwrap();
        let answered = tokio::time::timeout(
            Duration::from_secs(5),
            conn.request(&Request::NodeInstances),
        )
        .await;
        if let Ok(Ok(_)) = answered {
            break conn;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the freed place was never given"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(matches!(
        agent.request(&Request::NodeInstances).await.unwrap(),
        Response::Instances(_)
    ));
    assert!(limit_hits(&server, "connections_per_identity").await >= 1.0);
    drop(fourth);
    server.shutdown().await;
}

/// Issue 20, item 4: requests per connection. Over the rate, a request is
/// answered unavailable with the reason (agents keep the write pending and
/// retry) and reaches nothing; another connection is not slowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_rate_are_refused_with_the_reason() {
    let (ca, _dir, server) = limited(|c| {
        c.limits.requests_per_second = 1;
        c.limits.request_burst = 2;
    })
    .await;
    let (flooder, _w, _r) =
        session_of(&material(&ca, Role::Agent, "seed"), &server, "seed", 1).await;
    let (calm, _cw, _cr) =
        session_of(&material(&ca, Role::Agent, "calm"), &server, "calm", 1).await;
    let before = revision(&server).await;
    let answers = futures_all((0..20u8).map(|i| {
        let conn = flooder.clone();
        async move {
            let reg = seed_registration(&format!("web-{i}"), Ipv4Addr::new(10, 0, 0, i));
            conn.request(&Request::Register(reg)).await.unwrap()
        }
    }))
    .await;
    let refused: Vec<&String> = answers
        .iter()
        .filter_map(|a| match a {
            Response::Rejected {
                kind: RejectKind::Unavailable,
                message,
            } => Some(message),
            _ => None,
        })
        .collect();
    let committed = answers
        .iter()
        .filter(|a| matches!(a, Response::Committed { .. }))
        .count();
    assert_eq!(refused.len() + committed, 20, "{answers:?}");
    assert!(!refused.is_empty(), "20 at once at 1/s with a burst of 2");
    for message in &refused {
        assert!(message.contains("limits.requests_per_second"), "{message}");
    }
    assert_eq!(
        revision(&server).await,
        before + committed as u64,
        "a refused request changes nothing"
    );
    assert_eq!(limit_hits(&server, "requests").await, refused.len() as f64);
    assert!(matches!(
        calm.request(&Request::NodeInstances).await.unwrap(),
        Response::Instances(_)
    ));
    server.shutdown().await;
}

/// Runs `futures` side by side and collects their outputs in order.
async fn futures_all<T: Send + 'static>(
    futures: impl Iterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Issue 20, item 4: messages per session stream. Over the rate the
/// stream is read later, not refused: every message still takes effect,
/// and the hit is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_messages_over_the_rate_are_held_back_not_lost() {
    let (ca, _dir, server) = limited(|c| {
        c.limits.session_messages_per_second = 20;
        c.limits.session_message_burst = 2;
    })
    .await;
    let (_conn, mut w, mut r) =
        session_of(&material(&ca, Role::Agent, "seed"), &server, "seed", 1).await;
    for _ in 0..5 {
        w.send(&SessionUp::Keepalive).await.unwrap();
    }
    w.send(&SessionUp::Subscribe {
        shard: rollcall_leases::ShardId(0),
        service: service(),
        have: None,
    })
    .await
    .unwrap();
    // The subscription, behind the keep-alives, is still answered.
    let answered = tokio::time::timeout(PATIENCE, async {
        loop {
            if let SessionDown::Update(items) = r.next().await.unwrap() {
                if !items.is_empty() {
                    return;
                }
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "the subscription was answered");
    assert!(limit_hits(&server, "session_messages").await >= 1.0);
    server.shutdown().await;
}

/// Issue 20, item 4: handshakes per source address. Over the rate a new
/// connection from the address is refused before any TLS work, and
/// counted; connections already made are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_over_the_address_rate_are_refused() {
    let (ca, _dir, server) = limited(|c| {
        c.limits.handshakes_per_second = 1;
        c.limits.handshake_burst = 3;
    })
    .await;
    let (held, _w, _r) = session_of(&material(&ca, Role::Agent, "seed"), &server, "seed", 1).await;
    let client = ArbiterClient::new(&material(&ca, Role::Controller, "deployer")).unwrap();
    let addr = server.quic_addr.to_string();
    let attempts = futures_all((0..10).map(|_| {
        let (client, addr) = (client.clone(), addr.clone());
        async move { client.connect(&addr).await.map_err(|e| e.to_string()) }
    }))
    .await;
    let refused: Vec<&String> = attempts.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(!refused.is_empty(), "10 at once, 1/s with a burst of 3");
    for reason in &refused {
        assert!(reason.contains("refused"), "{reason}");
    }
    assert!(limit_hits(&server, "handshakes_per_address").await >= refused.len() as f64);
    assert!(matches!(
        held.request(&Request::NodeInstances).await.unwrap(),
        Response::Instances(_)
    ));
    server.shutdown().await;
}

/// Issue 20, item 4: admin calls per token. Over the rate a call gets 429
/// `rate_limited` with `Retry-After`; `/metrics` is not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_over_the_token_rate_get_429() {
    let (_ca, _dir, server) = limited(|c| {
        c.limits.admin_calls_per_second = 1;
        c.limits.admin_call_burst = 500;
    })
    .await;
    let token = std::fs::read_to_string(&server.token_file).unwrap();
    let http = reqwest::Client::new();
    let mut limited = None;
    for _ in 0..600 {
        let answer = http
            .get(format!("http://{}/v1/status", server.admin_addr))
            .bearer_auth(token.trim())
            .send()
            .await
            .unwrap();
        if answer.status() == reqwest::StatusCode::TOO_MANY_REQUESTS {
            limited = Some(answer);
            break;
        }
    }
    let answer = limited.expect("600 calls at 1/s with a burst of 500 hit the limit");
    let retry_after: u64 = answer.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("limits.admin_calls_per_second"),
        "{body}"
    );
    assert!(limit_hits(&server, "admin_calls").await >= 1.0);
    server.shutdown().await;
}

/// Issue 38, item 5: services followed per session. Past
/// `limits.subscriptions_per_session` a subscription is denied with the
/// limit's name on the session stream, counted, and nothing is stored:
/// the session goes on following what it followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_over_the_session_limit_are_denied_with_the_reason() {
    let (ca, _dir, server) = limited(|c| c.limits.subscriptions_per_session = 2).await;
    let (_conn, mut w, mut r) =
        session_of(&material(&ca, Role::Agent, "seed"), &server, "seed", 1).await;
    for name in ["a", "b", "c"] {
        w.send(&SessionUp::Subscribe {
            shard: rollcall_leases::ShardId(0),
            service: ServiceKey::new("default", name, "default").unwrap(),
            have: None,
        })
        .await
        .unwrap();
    }
    let mut answered = Vec::new();
    let mut denied = None;
    while denied.is_none() || answered.len() < 2 {
        let next = tokio::time::timeout(PATIENCE, r.next())
            .await
            .expect("the arbiter answers every subscription")
            .unwrap();
        let SessionDown::Update(updates) = next else {
            continue;
        };
        for update in updates {
            match update {
                ServiceUpdate::Denied { service, reason } => denied = Some((service, reason)),
                ServiceUpdate::Unknown { service } => answered.push(service),
                _ => {}
            }
        }
    }
    let (service, reason) = denied.unwrap();
    assert_eq!(service.to_string(), "default/c/default");
    assert!(
        reason.contains("limits.subscriptions_per_session = 2"),
        "{reason}"
    );
    assert_eq!(answered.len(), 2, "{answered:?}");
    assert_eq!(limit_hits(&server, "subscriptions_per_session").await, 1.0);
}
