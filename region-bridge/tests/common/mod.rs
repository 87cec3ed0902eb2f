//! Helpers of the bridge tests: arbiters of their own regions, bridge
//! configs and certificates, admin calls, QUIC clients and dials.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use rollcall_config::{ArbiterConfig, BridgeArbiter, BridgeConfig, BridgePeer, TlsPaths};
use rollcall_leases::client::{ArbiterClient, ArbiterConn, SessionReader, SessionWriter};
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{Request, Response, SessionDown, SessionUp};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, InstanceId, Label, NodeId, PrincipalName, Registration, Role, State, Version,
    Weight,
};
use rollcall_region_bridge::{Bridge, BridgeTls};
use serde_json::{json, Value};

/// QUIC close codes (as the arbiter's).
pub const UNAUTHENTICATED: u32 = 1;
pub const PROTOCOL: u32 = 3;

pub fn label(s: &str) -> Label {
    Label::new(s).unwrap()
}

pub fn material(ca: &Ca, region: &str, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(label(region), role, PrincipalName::new(name).unwrap());
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

pub async fn arbiter(ca: &Ca, region: &str, dir: &Path) -> ArbiterServer {
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
pub async fn call(
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

pub async fn get(server: &ArbiterServer, path: &str) -> (u16, Value) {
    call(server, reqwest::Method::GET, path, None).await
}

pub async fn apply(server: &ArbiterServer, policy: Value) -> u64 {
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
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
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
pub async fn remote_view(server: &ArbiterServer, region: &str) -> Option<Value> {
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
pub async fn register_web(
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
pub fn free_ports() -> (u16, u16) {
    let bind = || std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (a, b) = (bind(), bind());
    let port = |s: &std::net::UdpSocket| s.local_addr().unwrap().port();
    (port(&a), port(&b))
}

/// Writes a bridge's certificate, key and CA, and the peers' CAs, into
/// `dir`, and a config naming them, its arbiter and its peers.
pub fn bridge_config(
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
            token_file: arbiter.bridge_token_file.clone(),
            https: true,
        },
        tls: Some(tls),
    }
}

pub async fn start_bridge(config: &BridgeConfig) -> Bridge {
    let tls = BridgeTls::load(config).unwrap();
    Bridge::start(config.clone(), tls).await.unwrap()
}

pub fn checkout(home: &str) -> Value {
    json!({
        "service": "shop/checkout",
        "home_region": home,
        "cross_region": true,
        "failover_order": ["r3"],
    })
}

/// How the peer closed `conn`: the application code and reason.
pub async fn closed(conn: &quinn::Connection) -> (u32, String) {
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
pub fn client(
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

pub async fn dial(
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

/// r2's arbiter as the test compares it: its remote view without ages, and
/// its catalog revision.
pub async fn r2_state(a2: &ArbiterServer) -> (Option<Value>, Value) {
    let view = remote_view(a2, "r1").await.map(|mut v| {
        for key in ["age_ms", "fresh", "as_of_ms"] {
            v.as_object_mut().unwrap().remove(key);
        }
        v
    });
    let (_, status) = get(a2, "/v1/status").await;
    (view, status["revision"].clone())
}

/// r1's arbiter and bridge, with one peer region r2 whose "bridge" is a
/// bare QUIC server (`fake`) presenting r2's certificate of `role` and
/// `name`: the test plays r2 on it.
pub struct FakeR2 {
    pub dir: tempfile::TempDir,
    pub ca1: Ca,
    pub ca2: Ca,
    pub a1: ArbiterServer,
    pub fake: quinn::Endpoint,
    pub b1: Bridge,
}

impl FakeR2 {
    pub async fn start(role: Role, name: &str) -> FakeR2 {
        let dir = tempfile::tempdir().unwrap();
        let (ca1, ca2) = (
            Ca::generate(&label("r1")).unwrap(),
            Ca::generate(&label("r2")).unwrap(),
        );
        let a1 = arbiter(&ca1, "r1", dir.path()).await;
        let fake = BridgeTls {
            material: material(&ca2, "r2", role, name),
            peer_cas: BTreeMap::from([(label("r1"), vec![ca1.cert_der().clone()])]),
        };
        let fake = quinn::Endpoint::server(
            fake.server_config().unwrap(),
            SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .unwrap();
        let peer = format!("127.0.0.1:{}", fake.local_addr().unwrap().port());
        let config = bridge_config(dir.path(), ("r1", &ca1), 0, &a1, &[("r2", &ca2, peer)]);
        let b1 = start_bridge(&config).await;
        FakeR2 {
            dir,
            ca1,
            ca2,
            a1,
            fake,
            b1,
        }
    }
}
