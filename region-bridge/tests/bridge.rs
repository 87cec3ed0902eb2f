//! Region bridges over real QUIC on loopback with real arbiters (issue 8,
//! item 2): a policy applied in r1 reaches r2's catalog with r1 as home and
//! its home revision; r1's summaries reach r2's remote view with an age; a
//! restarted bridge resumes by delta; non-bridge certificates are refused;
//! malformed, oversized and invalid messages close the connection and
//! change nothing; a peer bridge revoked while connected is cut off at the
//! reload.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use rollcall_config::ServicePolicy;
use rollcall_leases::codec::write_frame;
use rollcall_leases::tls::{Ca, Reload};
use rollcall_leases::{Ingress, Policy, RemotePolicy, Revision, Role, ServiceSummary};
use rollcall_region_bridge::codec::{self, MAX_HELLO_BYTES, MAX_UPDATE_BYTES};
use rollcall_region_bridge::message::{Hello, Update};
use rollcall_region_bridge::{Bridge, BridgeTls};
use serde_json::json;

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_and_summaries_cross_regions_and_a_restarted_bridge_resumes_by_delta() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, ca2) = (
        Ca::generate(&label("r1")).unwrap(),
        Ca::generate(&label("r2")).unwrap(),
    );
    let a1 = arbiter(&ca1, "r1", dir.path()).await;
    let a2 = arbiter(&ca2, "r2", dir.path()).await;
    let _agent = register_web(&ca1, "r1", &a1).await;
    let checkout_revision = apply(&a1, checkout("r1")).await;

    let (p1, p2) = free_ports();
    let c1 = bridge_config(
        dir.path(),
        ("r1", &ca1),
        p1,
        &a1,
        &[("r2", &ca2, format!("127.0.0.1:{p2}"))],
    );
    let c2 = bridge_config(
        dir.path(),
        ("r2", &ca2),
        p2,
        &a2,
        &[("r1", &ca1, format!("127.0.0.1:{p1}"))],
    );
    let b1 = start_bridge(&c1).await;
    let b2 = start_bridge(&c2).await;

    // The policy reaches r2's catalog as r1 committed it.
    let shown = eventually("the policy in r2", || async {
        let (status, body) = get(&a2, "/v1/policies/shop/checkout").await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(shown["home_region"], "r1");
    assert_eq!(shown["replicated"], true);
    assert_eq!(shown["home_revision"], checkout_revision);
    assert_eq!(shown["policy"]["failover_order"], json!(["r3"]));
    let (_, audit) = get(&a2, "/v1/audit").await;
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["command"] == "replicate-policy"),
        "{audit}"
    );

    // r1's summaries reach r2's remote view, with an age; nothing per instance.
    let view = eventually("r1's summary in r2's view", || async {
        let view = remote_view(&a2, "r1").await?;
        let web = view["summaries"]
            .as_array()?
            .iter()
            .any(|s| s["service"] == "default/web/http");
        web.then_some(view)
    })
    .await;
    let web = &view["summaries"].as_array().unwrap()[0];
    assert_eq!(
        (web["ready"].clone(), web["weight"].clone()),
        (json!(1), json!(250)),
        "{view}"
    );
    assert!(web["taken_at_ms"].as_u64().unwrap() > 0);
    assert_eq!(view["ingress"], json!(["edge.r1.example:443"]));
    assert_eq!(view["fresh"], true);
    assert_eq!(view["max_age_ms"], 5_000);
    assert!(view["age_ms"].as_u64().unwrap() < 5_000, "{view}");
    assert!(
        !view.to_string().contains("web-1"),
        "no instance crosses regions: {view}"
    );
    // And the other way: r1 holds r2's (empty) view.
    eventually("r2's view in r1", || async { remote_view(&a1, "r2").await }).await;

    // A local change never overrides the replicated policy.
    let (status, body) = call(
        &a2,
        reqwest::Method::PUT,
        "/v1/policies",
        Some(json!({"policy": [checkout("r2")]})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = call(
        &a2,
        reqwest::Method::DELETE,
        "/v1/policies/shop/checkout",
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");

    // r2's bridge restarts while a policy is added in r1: it resumes from
    // what r2's arbiter holds, and gets only that policy.
    let version_before = remote_view(&a2, "r1").await.unwrap()["version"]
        .as_u64()
        .unwrap();
    b2.shutdown().await;
    eventually("r1's bridge to see r2's leave", || async {
        (b1.stats().sessions_active == 0).then_some(())
    })
    .await;
    let before = b1.stats();
    let cart_revision = apply(&a1, json!({"service": "shop/cart", "home_region": "r1"})).await;
    let b2 = start_bridge(&c2).await;
    let cart = eventually("the new policy in r2", || async {
        let (status, body) = get(&a2, "/v1/policies/shop/cart").await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(cart["home_revision"], cart_revision);
    eventually("r2's view past the new policy", || async {
        let view = remote_view(&a2, "r1").await?;
        (view["version"].as_u64()? >= cart_revision).then_some(())
    })
    .await;
    let after = b1.stats();
    assert_eq!(after.sessions_served, before.sessions_served + 1);
    assert_eq!(
        after.full_sent, before.full_sent,
        "resumed, not a full state: {before:?} → {after:?}"
    );
    assert_eq!(
        after.items_sent,
        before.items_sent + 1,
        "only the new policy: {before:?} → {after:?}"
    );
    let resumed = b2.stats();
    assert_eq!(resumed.full_received, 0, "{resumed:?}");
    assert_eq!(resumed.items_received, 1, "{resumed:?}");
    assert!(version_before < cart_revision);

    // The metrics, over real HTTP: r2's bridge names r1's policy
    // revision, summary age and sync lag; r1's counts the bytes it sent.
    let scrape = |bridge: &Bridge| {
        let url = format!("http://{}/metrics", bridge.metrics_addr.unwrap());
        async move { reqwest::get(url).await.unwrap().text().await.unwrap() }
    };
    let m2 = scrape(&b2).await;
    for needle in [
        format!("rollcall_bridge_policy_revision{{region=\"r1\"}} {cart_revision}"),
        "rollcall_bridge_summary_age_seconds{region=\"r1\"}".to_owned(),
        "rollcall_bridge_sync_lag_seconds{region=\"r1\"}".to_owned(),
        "rollcall_bridge_updates_received_total{region=\"r1\",kind=\"delta\"}".to_owned(),
    ] {
        assert!(m2.contains(&needle), "{needle} missing from\n{m2}");
    }
    let m1 = scrape(&b1).await;
    assert!(
        m1.contains("rollcall_bridge_sent_bytes_total{region=\"r2\"}"),
        "{m1}"
    );

    // Deleted at home, dropped here.
    let (status, body) = call(&a1, reqwest::Method::DELETE, "/v1/policies/shop/cart", None).await;
    assert_eq!(status, 200, "{body}");
    eventually("the deletion in r2", || async {
        let (status, _) = get(&a2, "/v1/policies/shop/cart").await;
        (status == 404).then_some(())
    })
    .await;

    b1.shutdown().await;
    b2.shutdown().await;
    a1.shutdown().await;
    a2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_bridge_certificates_are_accepted() {
    // r1's bridge dials "r2's bridge", which presents an arbiter certificate.
    let FakeR2 {
        dir: _dir,
        ca1,
        ca2,
        a1,
        fake,
        b1,
    } = FakeR2::start(Role::Arbiter, "arbiter-1").await;
    let dialled = fake.accept().await.unwrap().await.unwrap();
    let (code, reason) = closed(&dialled).await;
    assert_eq!(code, UNAUTHENTICATED, "{reason}");
    assert!(reason.contains("not a bridge of region r2"), "{reason}");
    fake.close(0u32.into(), b"done");

    // Agents and arbiters of a peer region, and anyone of r1 itself, are
    // refused with the reason; nothing of theirs is read.
    let cases = [
        (material(&ca2, "r2", Role::Agent, "n1"), "not a bridge"),
        (
            material(&ca2, "r2", Role::Arbiter, "arbiter-1"),
            "not a bridge",
        ),
        (material(&ca1, "r1", Role::Agent, "n1"), "not a bridge"),
        (material(&ca1, "r1", Role::Bridge, "other"), "own region"),
    ];
    let refused = cases.len() as u64 + 1;
    for (tls, expected) in cases {
        let identity = tls.identity().unwrap();
        let (endpoint, config) = client(tls, "r1", &ca1);
        let conn = dial(&endpoint, &config, b1.listen_addr).await;
        let (code, reason) = closed(&conn).await;
        assert_eq!(code, UNAUTHENTICATED, "{identity}: {reason}");
        assert!(reason.contains(expected), "{identity}: {reason}");
    }
    let stats = b1.stats();
    assert_eq!(stats.refused_peers, refused, "{stats:?}");
    assert_eq!(stats.sessions_served, 0);
    assert!(remote_view(&a1, "r2").await.is_none());

    b1.shutdown().await;
    a1.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_oversized_and_invalid_messages_close_the_connection_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, ca2) = (
        Ca::generate(&label("r1")).unwrap(),
        Ca::generate(&label("r2")).unwrap(),
    );
    let a2 = arbiter(&ca2, "r2", dir.path()).await;

    // A hand-driven "r1 bridge" that r2's bridge subscribes to.
    let fake = BridgeTls {
        material: material(&ca1, "r1", Role::Bridge, "bridge-r1"),
        peer_cas: BTreeMap::from([(label("r2"), vec![ca2.cert_der().clone()])]),
    };
    let fake = quinn::Endpoint::server(
        fake.server_config().unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .unwrap();
    let config = bridge_config(
        dir.path(),
        ("r2", &ca2),
        0,
        &a2,
        &[(
            "r1",
            &ca1,
            format!("127.0.0.1:{}", fake.local_addr().unwrap().port()),
        )],
    );
    let b2 = start_bridge(&config).await;

    let session = || async {
        let conn = fake.accept().await.unwrap().await.unwrap();
        let (send, mut recv) = conn.accept_bi().await.unwrap();
        let hello = codec::read_hello(&mut recv).await.unwrap();
        assert_eq!(hello.region, label("r2"));
        (conn, send, recv, hello.have)
    };
    let (conn, mut send, _recv, have) = session().await;
    assert_eq!(have, None, "r2 holds nothing of r1 yet");
    let full = Update {
        region: label("r1"),
        full: true,
        base: Revision(0),
        version: Revision(5),
        as_of_ms: 1_000,
        ingress: Some(vec![Ingress::new("edge.r1.example:443").unwrap()]),
        policies: vec![RemotePolicy {
            policy: Policy::new(ServicePolicy::new("shop/checkout", "r1")).unwrap(),
            home_revision: Revision(4),
            home_set_at_ms: 900,
        }],
        removed_policies: Vec::new(),
        summaries: vec![ServiceSummary {
            service: "default/web/http".parse().unwrap(),
            revision: Revision(5),
            ready: 2,
            weight: 200,
            taken_at_ms: 1_000,
        }],
        removed_services: Vec::new(),
        writers: Vec::new(),
    };
    write_frame(&mut send, &codec::encode_update(&full))
        .await
        .unwrap();
    eventually("the full state in r2", || async {
        let view = remote_view(&a2, "r1").await?;
        let (status, _) = get(&a2, "/v1/policies/shop/checkout").await;
        (view["version"] == 5 && status == 200).then_some(())
    })
    .await;
    let state = r2_state(&a2).await;

    // Malformed: a frame of the right size that does not decode.
    write_frame(&mut send, &[codec::FORMAT_VERSION, 2, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let (code, reason) = closed(&conn).await;
    assert_eq!(code, PROTOCOL, "{reason}");
    assert!(reason.contains("malformed bridge update"), "{reason}");
    assert_eq!(r2_state(&a2).await, state);

    // It comes back, resuming from what r2's arbiter holds. Oversized: a
    // length over the limit, refused before anything is read.
    let (conn, mut send, _recv, have) = session().await;
    assert_eq!(have, Some(Revision(5)));
    let len = u32::try_from(MAX_UPDATE_BYTES + 1).unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut send, &len.to_be_bytes())
        .await
        .unwrap();
    let (code, reason) = closed(&conn).await;
    assert_eq!(code, PROTOCOL, "{reason}");
    assert!(reason.contains("limit"), "{reason}");
    assert_eq!(r2_state(&a2).await, state);

    // Invalid: well-formed, but a delta on a version r2 does not hold, and
    // a policy of another home region.
    let mut wrong_base = full.clone();
    wrong_base.full = false;
    wrong_base.base = Revision(3);
    wrong_base.version = Revision(9);
    let mut foreign = full.clone();
    foreign.version = Revision(9);
    foreign.policies[0].policy = Policy::new(ServicePolicy::new("shop/cart", "r3")).unwrap();
    for (bad, expected) in [
        (wrong_base, "delta on version 3"),
        (foreign, "home region r3"),
    ] {
        let (conn, mut send, _recv, _) = session().await;
        write_frame(&mut send, &codec::encode_update(&bad))
            .await
            .unwrap();
        let (code, reason) = closed(&conn).await;
        assert_eq!(code, PROTOCOL, "{reason}");
        assert!(reason.contains(expected), "{reason}");
        assert_eq!(r2_state(&a2).await, state);
    }

    // The publishing side: a subscriber's malformed or oversized hello.
    let (endpoint, client_config) =
        client(material(&ca1, "r1", Role::Bridge, "bridge-r1"), "r2", &ca2);
    for frame in [
        vec![codec::FORMAT_VERSION, 1, 0xff],
        vec![0u8; MAX_HELLO_BYTES + 1],
    ] {
        let conn = dial(&endpoint, &client_config, b2.listen_addr).await;
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        write_frame(&mut send, &frame).await.unwrap();
        let (code, reason) = closed(&conn).await;
        assert_eq!(code, PROTOCOL, "{reason}");
    }
    let stats = b2.stats();
    assert_eq!(stats.protocol_errors, 6, "{stats:?}");
    assert_eq!(stats.sessions_served, 0, "{stats:?}");
    assert_eq!(stats.full_received, 1, "{stats:?}");
    assert_eq!(r2_state(&a2).await, state);

    b2.shutdown().await;
    a2.shutdown().await;
}

/// Issue 38, item 6: r2's bridge certificate is revoked in r1 while both
/// of its sessions with r1's bridge are up (the one it subscribed with and
/// the one r1's bridge dialled): the reload that brings the deny list
/// closes both with the reason, and its next handshake is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_peer_bridge_is_cut_off_at_the_reload() {
    // "r2's bridge" as r1's bridge dials it: it reads the hello, says nothing.
    let FakeR2 {
        dir,
        ca1,
        ca2,
        a1,
        fake,
        b1,
    } = FakeR2::start(Role::Bridge, "bridge-r2").await;
    let dialled = fake.accept().await.unwrap().await.unwrap();
    let (_to_b1, mut from_b1) = dialled.accept_bi().await.unwrap();
    assert_eq!(
        codec::read_hello(&mut from_b1).await.unwrap().region,
        label("r1")
    );
    // r2's bridge subscribes to r1's: the first update arrives.
    let (endpoint, client_config) =
        client(material(&ca2, "r2", Role::Bridge, "bridge-r2"), "r1", &ca1);
    let subscribed = dial(&endpoint, &client_config, b1.listen_addr).await;
    let (mut send, mut recv) = subscribed.open_bi().await.unwrap();
    let hello = Hello {
        region: label("r2"),
        have: None,
    };
    write_frame(&mut send, &codec::encode_hello(&hello))
        .await
        .unwrap();
    assert_eq!(
        codec::read_update(&mut recv).await.unwrap().region,
        label("r1")
    );

    std::fs::write(
        dir.path().join("revoked.txt"),
        "rollcall://r2/bridge/bridge-r2\n",
    )
    .unwrap();
    b1.tls_reload().reload().unwrap();
    for conn in [&subscribed, &dialled] {
        let (code, reason) = closed(conn).await;
        assert_eq!(code, UNAUTHENTICATED, "{reason}");
        assert!(reason.contains("revoked"), "{reason}");
    }
    let again = endpoint
        .connect_with(client_config, b1.listen_addr, "localhost")
        .unwrap()
        .await;
    let refused = match again {
        Err(e) => e.to_string(),
        Ok(conn) => tokio::time::timeout(std::time::Duration::from_secs(10), conn.closed())
            .await
            .expect("closed")
            .to_string(),
    };
    assert!(refused.contains("revoked"), "{refused}");
    assert_eq!(b1.stats().sessions_served, 1);

    b1.shutdown().await;
    a1.shutdown().await;
}
