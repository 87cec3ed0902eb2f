//! Region bridges over real QUIC on loopback with real arbiters (issue 8,
//! item 2): a policy applied in r1 reaches r2's catalog with r1 as home and
//! its home revision; r1's summaries reach r2's remote view with an age; a
//! restarted bridge resumes by delta; non-bridge certificates are refused;
//! malformed, oversized and invalid messages close the connection and
//! change nothing.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use rollcall_config::{
    ArbiterConfig, BridgeArbiter, BridgeConfig, BridgePeer, ServicePolicy, TlsPaths,
};
use rollcall_leases::client::{ArbiterClient, ArbiterConn, SessionReader, SessionWriter};
use rollcall_leases::codec::write_frame;
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{Request, Response, SessionDown, SessionUp};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, Ingress, InstanceId, Label, NodeId, Policy, PrincipalName, Registration,
    RemotePolicy, Revision, Role, ServiceSummary, State, Version, Weight,
};
use rollcall_region_bridge::codec::{self, MAX_HELLO_BYTES, MAX_UPDATE_BYTES};
use rollcall_region_bridge::message::Update;
use rollcall_region_bridge::{Bridge, BridgeTls};
use serde_json::{json, Value};

/// QUIC close codes (as the arbiter's).
const UNAUTHENTICATED: u32 = 1;
const PROTOCOL: u32 = 3;

fn label(s: &str) -> Label {
    Label::new(s).unwrap()
}

fn material(ca: &Ca, region: &str, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(label(region), role, PrincipalName::new(name).unwrap());
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

async fn arbiter(ca: &Ca, region: &str, dir: &Path) -> ArbiterServer {
    let mut config = ArbiterConfig {
        name: format!("arbiter-{region}"),
        region: region.into(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.join(format!("arbiter-{region}")),
        // Tests register addresses no node declared.
        registration: rollcall_config::RegistrationConfig {
            addresses: rollcall_config::AddressRule::Any,
            ..Default::default()
        },
        ..ArbiterConfig::default()
    };
    // The test's agent never renews: its lease outlives the test.
    config.lease.ttl_ms = 600_000;
    let tls = material(ca, region, Role::Arbiter, "arbiter-1");
    ArbiterServer::start(config, &tls).await.unwrap()
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

async fn apply(server: &ArbiterServer, policy: Value) -> u64 {
    let (status, body) = call(
        server,
        reqwest::Method::PUT,
        "/v1/policies",
        Some(json!({"policy": [policy]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["policies"][0]["revision"].as_u64().unwrap()
}

/// Polls `probe` every 50 ms until it answers `Some`, for at most 20 s.
async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The view of `region` in `server`'s remote view, if it holds one.
async fn remote_view(server: &ArbiterServer, region: &str) -> Option<Value> {
    let (status, body) = get(server, "/v1/remote").await;
    assert_eq!(status, 200, "{body}");
    body["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["region"] == region)
        .cloned()
}

/// Registers a READY instance of `default/web/http` (weight 250) on node
/// `n1` of the region (its session must stay open: keep what this returns).
async fn register_web(
    ca: &Ca,
    region: &str,
    server: &ArbiterServer,
) -> (ArbiterConn, SessionWriter, SessionReader) {
    let client = ArbiterClient::new(&material(ca, region, Role::Agent, "n1")).unwrap();
    let conn = client.connect(&server.quic_addr.to_string()).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new("n1").unwrap(),
        epoch: AgentEpoch(1),
        zone: label("z1"),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (writer, mut reader) = conn.open_session(&hello).await.unwrap();
    assert!(matches!(
        reader.next().await.unwrap(),
        SessionDown::Welcome { .. }
    ));
    let registration = Registration {
        instance_id: InstanceId::new("web-1").unwrap(),
        service: "default/web/http".parse().unwrap(),
        node: NodeId::new("n1").unwrap(),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::new(250).unwrap(),
        labels: Vec::new(),
        initial: State::Ready,
    };
    let answer = conn
        .request(&Request::Register(registration))
        .await
        .unwrap();
    assert!(matches!(answer, Response::Committed { .. }), "{answer:?}");
    (conn, writer, reader)
}

/// Two distinct UDP ports that were free a moment ago (bridges dial each
/// other, so each must know the other's port before either starts).
fn free_ports() -> (u16, u16) {
    let bind = || std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (a, b) = (bind(), bind());
    let port = |s: &std::net::UdpSocket| s.local_addr().unwrap().port();
    (port(&a), port(&b))
}

/// Writes a bridge's certificate, key and CA, and the peers' CAs, into
/// `dir`, and a config naming them, its arbiter and its peers.
fn bridge_config(
    dir: &Path,
    own: (&str, &Ca),
    port: u16,
    arbiter: &ArbiterServer,
    peers: &[(&str, &Ca, String)],
) -> BridgeConfig {
    let (region, ca) = own;
    let identity = Identity::new(
        label(region),
        Role::Bridge,
        PrincipalName::new(&format!("bridge-{region}")).unwrap(),
    );
    let issued = ca.issue(&identity, &[], &[]).unwrap();
    let write = |name: String, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let tls = TlsPaths::new(
        write(format!("{region}-ca.crt"), &ca.to_pem().0),
        write(format!("bridge-{region}.crt"), &issued.cert_pem),
        write(format!("bridge-{region}.key"), &issued.key_pem),
    );
    let peers = peers
        .iter()
        .map(|(peer, peer_ca, address)| BridgePeer {
            region: (*peer).to_owned(),
            address: address.clone(),
            ca: write(format!("{region}-peer-{peer}-ca.crt"), &peer_ca.to_pem().0),
        })
        .collect();
    BridgeConfig {
        name: format!("bridge-{region}"),
        region: region.to_owned(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        peers,
        ingress: vec![format!("edge.{region}.example:443")],
        summary_max_age_ms: 5_000,
        sync_interval_ms: 100,
        metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        arbiter: BridgeArbiter {
            admin: vec![arbiter.admin_addr.to_string()],
            token_file: arbiter.token_file.clone(),
        },
        tls: Some(tls),
    }
}

async fn start_bridge(config: &BridgeConfig) -> Bridge {
    let tls = BridgeTls::load(config).unwrap();
    Bridge::start(config.clone(), tls).await.unwrap()
}

fn checkout(home: &str) -> Value {
    json!({
        "service": "shop/checkout",
        "home_region": home,
        "cross_region": true,
        "failover_order": ["r3"],
    })
}

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

/// How the peer closed `conn`: the application code and reason.
async fn closed(conn: &quinn::Connection) -> (u32, String) {
    match tokio::time::timeout(Duration::from_secs(10), conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(close)) => (
            close.error_code.into_inner() as u32,
            String::from_utf8_lossy(&close.reason).into_owned(),
        ),
        Ok(other) => panic!("closed otherwise: {other}"),
        Err(_) => panic!("not closed within 10 s"),
    }
}

/// A QUIC client endpoint presenting `material` to region `peer`'s bridges.
fn client(
    material: TlsMaterial,
    peer: &str,
    peer_ca: &Ca,
) -> (quinn::Endpoint, quinn::ClientConfig) {
    let tls = BridgeTls {
        material,
        peer_cas: BTreeMap::from([(label(peer), vec![peer_ca.cert_der().clone()])]),
    };
    let config = tls.client_config(&label(peer)).unwrap();
    let endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    (endpoint, config)
}

async fn dial(
    endpoint: &quinn::Endpoint,
    config: &quinn::ClientConfig,
    addr: SocketAddr,
) -> quinn::Connection {
    endpoint
        .connect_with(config.clone(), addr, "localhost")
        .unwrap()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_bridge_certificates_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (ca1, ca2) = (
        Ca::generate(&label("r1")).unwrap(),
        Ca::generate(&label("r2")).unwrap(),
    );
    let a1 = arbiter(&ca1, "r1", dir.path()).await;

    // r1's bridge dials "r2's bridge", which presents an arbiter certificate.
    let fake = BridgeTls {
        material: material(&ca2, "r2", Role::Arbiter, "arbiter-1"),
        peer_cas: BTreeMap::from([(label("r1"), vec![ca1.cert_der().clone()])]),
    };
    let fake = quinn::Endpoint::server(
        fake.server_config().unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .unwrap();
    let config = bridge_config(
        dir.path(),
        ("r1", &ca1),
        0,
        &a1,
        &[(
            "r2",
            &ca2,
            format!("127.0.0.1:{}", fake.local_addr().unwrap().port()),
        )],
    );
    let b1 = start_bridge(&config).await;
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

/// r2's arbiter as the test compares it: its remote view without ages, and
/// its catalog revision.
async fn r2_state(a2: &ArbiterServer) -> (Option<Value>, Value) {
    let view = remote_view(a2, "r1").await.map(|mut v| {
        for key in ["age_ms", "fresh", "as_of_ms"] {
            v.as_object_mut().unwrap().remove(key);
        }
        v
    });
    let (_, status) = get(a2, "/v1/status").await;
    (view, status["revision"].clone())
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
