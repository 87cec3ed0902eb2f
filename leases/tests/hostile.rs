//! A rogue agent against an arbiter over real QUIC on loopback (issue 38,
//! item 3): it holds a valid certificate of its own node and tries to
//! take other nodes out with down reports and witness answers. Each
//! attempt is refused or left without effect, and counted.

use std::time::Duration;

use rollcall_leases::client::{ArbiterConn, SessionReader, SessionWriter};
use rollcall_leases::identity::Identity;
use rollcall_leases::peer_protocol::PeerRequest;
use rollcall_leases::protocol::{RejectKind, Request, Response, SessionDown, SessionUp};
use rollcall_leases::server::peer::{PeerError, Peers};
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::Ca;
use rollcall_leases::tls::{LiveTls, TlsMaterial};
use rollcall_leases::{AgentEpoch, Label, NodeId, PrincipalName, Role};

mod quic;
use quic::*;

const EPOCH: AgentEpoch = AgentEpoch(1);

/// A welcomed session of `node` in `zone`.
async fn session_in(
    ca: &Ca,
    server: &ArbiterServer,
    node: &str,
    zone: &str,
) -> (ArbiterConn, SessionWriter, SessionReader) {
    let material = material(ca, Role::Agent, node);
    session_in_zone(&material, server, node, EPOCH.0, zone).await
}

fn down(node: &str) -> Request {
    Request::ReportDown {
        node: NodeId::new(node).unwrap(),
        epoch: EPOCH,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_may_not_report_a_node_of_another_zone_down() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |_| {}).await;
    let (_victim, _vw, _vr) = session_in(&ca, &server, "victim", "z2").await;
    let (rogue, _rw, _rr) = session_in(&ca, &server, "rogue", "z1").await;
    let before = revision(&server).await;
    match rogue.request(&down("victim")).await.unwrap() {
        Response::Rejected {
            kind: RejectKind::Forbidden,
            message,
        } => assert!(
            message.contains("zone z1") && message.contains("zone z2"),
            "{message}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(revision(&server).await, before, "nothing changed");
    assert!(
        metric(
            &server,
            "rollcall_arbiter_refusals_total{kind=\"forbidden\"}"
        )
        .await
            >= 1.0
    );
    server.shutdown().await;
}

/// The victim's session does not answer the probe (a paused process, a
/// path that drops its packets): the rogue's report passes the probe, and
/// is still refused because the witness asked sees the victim alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogues_lone_report_is_vetoed_by_a_witness_and_its_unasked_answers_do_not_count() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = arbiter(&ca, dir.path(), |c| c.lease.probe_timeout_ms = 300).await;
    let (_victim, _vw, _vr) = session_in(&ca, &server, "victim", "z1").await;
    let (rogue, mut rw, _rr) = session_in(&ca, &server, "rogue", "z1").await;
    let (_honest, mut hw, mut hr) = session_in(&ca, &server, "honest", "z1").await;
    let before = revision(&server).await;

    // Unasked, the rogue "confirms" the victim gone twice: not counted.
    let gone = SessionUp::Witnessed {
        node: NodeId::new("victim").unwrap(),
        epoch: EPOCH,
        gossip: Some(false),
        reachable: Some(false),
    };
    rw.send(&gone).await.unwrap();
    rw.send(&gone).await.unwrap();

    // The honest node answers what it is asked: its gossip holds the
    // victim alive.
    let honest = tokio::spawn(async move {
        loop {
            match hr.next().await.unwrap() {
                SessionDown::Witness { node, epoch, .. } => {
                    let answer = SessionUp::Witnessed {
                        node,
                        epoch,
                        gossip: Some(true),
                        reachable: None,
                    };
                    hw.send(&answer).await.unwrap();
                    return (hw, hr);
                }
                SessionDown::Probe { nonce } => {
                    hw.send(&SessionUp::Alive { nonce }).await.unwrap();
                }
                _ => {}
            }
        }
    });
    match rogue.request(&down("victim")).await.unwrap() {
        Response::Rejected {
            kind: RejectKind::Invalid,
            message,
        } => assert!(
            message.contains("alone") && message.contains("honest"),
            "{message}"
        ),
        other => panic!("expected no verdict, got {other:?}"),
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), honest)
        .await
        .expect("the honest node was asked");
    assert_eq!(revision(&server).await, before, "the victim is still in");
    assert_eq!(
        metric(&server, "rollcall_arbiter_refusals_total{kind=\"witness\"}").await,
        2.0
    );
    assert_eq!(
        metric(
            &server,
            "rollcall_arbiter_down_reports_uncorroborated_total"
        )
        .await,
        1.0
    );
    server.shutdown().await;
}

/// An arbiter certificate of region r1 named `name`, with `ips` as its own
/// addresses.
fn arbiter_material(ca: &Ca, name: &str, ips: &[&str]) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        Role::Arbiter,
        PrincipalName::new(name).unwrap(),
    );
    let ips: Vec<std::net::IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &ips).unwrap())
}

fn peer_client(tls: &TlsMaterial) -> std::sync::Arc<Peers> {
    Peers::new(&LiveTls::new(tls).unwrap(), Label::new("r1").unwrap()).unwrap()
}

/// Issue 38, item 4: a valid arbiter certificate of the region is not
/// enough to speak on the peer link; it must name a member's address, and
/// a Raft call must come as that member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arbiter_certificate_naming_no_member_may_not_speak_on_the_peer_link() {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A group of one at 127.0.0.2, its certificate naming that address.
    let server = arbiter_as(
        &arbiter_material(&ca, "arbiter-1", &["127.0.0.2"]),
        dir.path(),
        |config| config.listen = "127.0.0.2:0".parse().unwrap(),
    )
    .await;
    let addr = server.quic_addr.to_string();
    assert!(addr.starts_with("127.0.0.2:"), "{addr}");
    let wait = Duration::from_secs(5);
    let vote = |id| {
        PeerRequest::Vote(openraft::raft::VoteRequest::new(
            openraft::Vote::new(99, id),
            None,
        ))
    };

    // A retired replica: its certificate names 127.0.0.9, no member's.
    let outsider = peer_client(&arbiter_material(&ca, "arbiter-9", &["127.0.0.9"]));
    for request in [PeerRequest::Heard(Vec::new()), vote(9)] {
        match outsider.call(&addr, &request, wait).await {
            Err(PeerError::Lost { detail, .. }) => assert!(
                detail.contains("none of the group's replicas") && detail.contains("127.0.0.9"),
                "{detail}"
            ),
            other => panic!("expected the connection closed with the reason, got {other:?}"),
        }
    }
    assert!(
        metric(&server, "rollcall_arbiter_refusals_total{kind=\"peer\"}").await >= 2.0,
        "each refusal is counted"
    );

    // A certificate naming the member's address is admitted, but only as
    // that member: a vote as replica 7 is refused.
    let impostor = peer_client(&arbiter_material(&ca, "arbiter-7", &["127.0.0.2"]));
    let heard = impostor
        .call(&addr, &PeerRequest::Heard(Vec::new()), wait)
        .await;
    assert!(heard.is_ok(), "a member's certificate is served: {heard:?}");
    match impostor.call(&addr, &vote(7), wait).await {
        Err(PeerError::Lost { detail, .. }) => {
            assert!(detail.contains("speak only as itself"), "{detail}")
        }
        other => panic!("expected the connection closed with the reason, got {other:?}"),
    }
    // The group of one still leads in its own term: no vote reached Raft.
    let status = admin_get(&server, "/v1/status").await;
    assert_eq!(status["raft"]["leader"], 1, "{status}");
    assert!(status["raft"]["term"].as_u64().unwrap() < 99, "{status}");
}
