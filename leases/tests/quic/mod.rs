//! Helpers of the arbiter's QUIC tests (`arbiter.rs`, `limits.rs`,
//! `hostile.rs`): an arbiter on loopback, certificates, sessions, the
//! admin API and metrics.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rollcall_config::ArbiterConfig;
use rollcall_leases::client::{ArbiterClient, ArbiterConn, SessionReader, SessionWriter};
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{SessionDown, SessionUp};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, InstanceId, Label, NodeId, PrincipalName, Registration, Role, ServiceKey, State,
    Version, Weight,
};

pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        role,
        PrincipalName::new(name).unwrap(),
    );
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

pub async fn arbiter(
    ca: &Ca,
    dir: &std::path::Path,
    tune: impl FnOnce(&mut ArbiterConfig),
) -> ArbiterServer {
    arbiter_as(&material(ca, Role::Arbiter, "arbiter-1"), dir, tune).await
}

/// [`arbiter`] with its certificate and key from `tls`.
pub async fn arbiter_as(
    tls: &TlsMaterial,
    dir: &std::path::Path,
    tune: impl FnOnce(&mut ArbiterConfig),
) -> ArbiterServer {
    let mut config = ArbiterConfig {
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
    tune(&mut config);
    let server = ArbiterServer::start(config, tls).await.unwrap();
    // The first leader names the catalog as its first change: revisions a
    // test compares are counted from there.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while admin_get(&server, "/v1/status").await["catalog"].is_null() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the catalog was never named"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}

/// `GET path` on the admin API with the operator token.
pub async fn admin_get(server: &ArbiterServer, path: &str) -> serde_json::Value {
    let token = std::fs::read_to_string(&server.token_file).unwrap();
    reqwest::Client::new()
        .get(format!("http://{}{path}", server.admin_addr))
        .bearer_auth(token.trim())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

pub async fn revision(server: &ArbiterServer) -> u64 {
    admin_get(server, "/v1/status").await["revision"]
        .as_u64()
        .unwrap()
}

/// Node `seed`'s session, welcomed.
pub async fn seed_session(
    ca: &Ca,
    server: &ArbiterServer,
) -> (ArbiterConn, SessionWriter, SessionReader) {
    session_of(&material(ca, Role::Agent, "seed"), server, "seed", 1).await
}

/// A READY registration of `id` on node `seed` (epoch 1) at `address`.
pub fn seed_registration(id: &str, address: Ipv4Addr) -> Registration {
    Registration {
        instance_id: InstanceId::new(id).unwrap(),
        service: service(),
        node: NodeId::new("seed").unwrap(),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(address),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    }
}

pub async fn metric(server: &ArbiterServer, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{}/metrics", server.admin_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}

pub fn service() -> ServiceKey {
    ServiceKey::new("default", "web", "default").unwrap()
}

/// `rollcall_arbiter_limit_hits_total{limit}`.
pub async fn limit_hits(server: &ArbiterServer, limit: &str) -> f64 {
    metric(
        server,
        &format!("rollcall_arbiter_limit_hits_total{{limit=\"{limit}\"}}"),
    )
    .await
}

/// An arbiter with `tune` applied (its `[limits]`, mostly), its CA and
/// the directory it lives in.
pub async fn limited(
    tune: impl FnOnce(&mut ArbiterConfig),
) -> (Ca, tempfile::TempDir, ArbiterServer) {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), tune).await;
    (ca, dir, server)
}

/// A welcomed session of node `node` in zone z1, with the certificate
/// `material`.
pub async fn session_of(
    material: &TlsMaterial,
    server: &ArbiterServer,
    node: &str,
    epoch: u64,
) -> (ArbiterConn, SessionWriter, SessionReader) {
    session_in_zone(material, server, node, epoch, "z1").await
}

/// A welcomed session of node `node` in `zone`, with the certificate
/// `material`.
pub async fn session_in_zone(
    material: &TlsMaterial,
    server: &ArbiterServer,
    node: &str,
    epoch: u64,
    zone: &str,
) -> (ArbiterConn, SessionWriter, SessionReader) {
    let client = ArbiterClient::new(material).unwrap();
    let conn = client.connect(&server.quic_addr.to_string()).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(epoch),
        zone: Label::new(zone).unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (w, mut r) = conn.open_session(&hello).await.unwrap();
    match r.next().await.unwrap() {
        SessionDown::Welcome { .. } => {}
        other => panic!("expected Welcome, got {other:?}"),
    }
    (conn, w, r)
}

/// The reason `conn` was closed with, waiting for it.
pub async fn close_reason(conn: &ArbiterConn) -> String {
    tokio::time::timeout(PATIENCE, conn.closed())
        .await
        .expect("the arbiter closes the connection")
}
