//! The wire fault points (`fault-injection` builds only) on a real arbiter:
//! `ROLLCALL_FAULTS` is read at start, a snapshot leaves corrupted while
//! the rest of the session is untouched, and the fault is counted.
//!
//! One test per file: the faults are read once per process.
#![cfg(feature = "fault-injection")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rollcall_config::ArbiterConfig;
use rollcall_leases::client::ArbiterClient;
use rollcall_leases::codec::decode_service_snapshot;
use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{Request, Response, ServiceUpdate, SessionDown, SessionUp};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{
    AgentEpoch, InstanceId, Label, NodeId, PrincipalName, Registration, Role, ServiceKey,
    ServiceView, ShardId, State, Version, Weight,
};

const PATIENCE: Duration = Duration::from_secs(60);

fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        role,
        PrincipalName::new(name).unwrap(),
    );
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_snapshot_does_not_check_and_is_counted() {
    // Set before the arbiter starts, and only here: one test per process.
    std::env::set_var("ROLLCALL_FAULTS", "corrupt_snapshot=1");
    std::env::set_var("ROLLCALL_FAULTS_SEED", "7");
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = ArbiterConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().join("arbiter"),
        // Tests register addresses no node declared.
        registration: rollcall_config::RegistrationConfig {
            addresses: rollcall_config::AddressRule::Any,
            ..Default::default()
        },
        ..ArbiterConfig::default()
    };
    let server = ArbiterServer::start(config, &material(&ca, Role::Arbiter, "arbiter-1"))
        .await
        .unwrap();
    let service = ServiceKey::new("default", "web", "default").unwrap();

    let client = ArbiterClient::new(&material(&ca, Role::Agent, "node-1")).unwrap();
    let conn = client.connect(&server.quic_addr.to_string()).await.unwrap();
    let hello = SessionUp::Hello {
        node: NodeId::new("node-1").unwrap(),
        epoch: AgentEpoch(1),
        zone: Label::new("z1").unwrap(),
        addresses: vec![std::net::IpAddr::from([127, 0, 0, 1])],
    };
    let (mut w, mut r) = conn.open_session(&hello).await.unwrap();
    // Only deltas and snapshots are corrupted.
    assert!(matches!(
        r.next().await.unwrap(),
        SessionDown::Welcome { .. }
    ));
    let reg = Registration {
        instance_id: InstanceId::new("web-1").unwrap(),
        service: service.clone(),
        node: NodeId::new("node-1").unwrap(),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    };
    let Response::Committed {
        revision: Some(committed),
        ..
    } = conn.request(&Request::Register(reg)).await.unwrap()
    else {
        panic!("registration not committed");
    };

    w.send(&SessionUp::Subscribe {
        service,
        shard: ShardId(0),
        have: None,
    })
    .await
    .unwrap();
    // The frame arrives whole (its length prefix is right), but what it
    // carries is not the snapshot the arbiter sent: it does not decode, or
    // does not check, or says something else.
    let intact = |bytes: &[u8]| {
        let Ok(snap) = decode_service_snapshot(bytes) else {
            return false;
        };
        ServiceView::from_snapshot(&snap).is_ok()
            && snap.shard == ShardId(0)
            && snap.revision == committed
            && snap.records.len() == 1
            && snap.records[0].instance_id.as_str() == "web-1"
            && snap.records[0].address == IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
            && snap.records[0].port == 8080
    };
    match tokio::time::timeout(PATIENCE, r.next()).await.unwrap() {
        Err(_) => {}
        Ok(SessionDown::Update(items)) => assert!(
            !items
                .iter()
                .any(|u| matches!(u, ServiceUpdate::Snapshot(b) if intact(b))),
            "the snapshot arrived intact"
        ),
        Ok(_) => {}
    }

    let metrics = reqwest::get(format!("http://{}/metrics", server.admin_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "rollcall_arbiter_faults_injected_total{fault=\"corrupt_snapshot\"} 1"),
        "{metrics}"
    );
    server.shutdown().await;
}
