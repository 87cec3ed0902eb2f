//! The view's answers for a copy past its maximum age, stepped with a
//! manual clock: `degrade` serves only what this agent has fresh local
//! evidence of, falls back to the whole copy when nothing has any, and
//! refuses failover; `keep` and `refuse` keep their meaning.

use std::net::{IpAddr, Ipv4Addr};

use rollcall_config::{ConnTraffic, DataPlaneConfig, StaleBehaviour};
use rollcall_leases::{
    AgentEpoch, EndpointRecord, Generation, InstanceId, Label, LeaseId, Liveness, NodeId,
    Principal, PrincipalName, Reason, Revision, Role, ServiceKey, State, Version, Weight,
};

use super::*;
use crate::failover::{Decision, Refusal};

const MAX_AGE_MS: u64 = 10_000;
/// When the copy was last confirmed.
const CONFIRMED_MS: u64 = 1_000_000;
/// A moment past the copy's maximum age.
const LATE_MS: u64 = CONFIRMED_MS + MAX_AGE_MS + 1;

fn svc() -> ServiceKey {
    ServiceKey::new("default", "web", "default").unwrap()
}

pub(crate) fn record(id: &str, node: &str) -> Arc<EndpointRecord> {
    Arc::new(EndpointRecord {
        instance_id: InstanceId::new(id).unwrap(),
        generation: Generation(1),
        node_id: NodeId::new(node).unwrap(),
        epoch: AgentEpoch(1),
        lease: LeaseId(1),
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 8000,
        region: Label::new("r1").unwrap(),
        zone: Label::new("z1").unwrap(),
        version: Version::new("v1").unwrap(),
        weight: Weight::new(100).unwrap(),
        labels: Vec::new(),
        state: State::Ready,
        reason: Reason::new("t").unwrap(),
        origin: Principal {
            role: Role::Agent,
            name: PrincipalName::new(node).unwrap(),
        },
        liveness: Liveness::Unknown,
        revision: Revision(1),
        changed_at_ms: 0,
    })
}

fn views() -> Views {
    let settings = ViewSettings {
        data_plane: DataPlaneConfig {
            // Every endpoint keeps its full weight: the sets compare as is.
            slow_start_ms: 0,
            ..DataPlaneConfig::default()
        },
        region: "r1".into(),
        zone: Label::new("z1").unwrap(),
        first_resolve_wait_ms: 0,
    };
    Views::new(settings, Arc::new(AgentMetrics::new()), |_| {})
}

/// Publishes web with one endpoint on each of `nodes` (`web-<node>`),
/// confirmed at `CONFIRMED_MS`, with `behaviour` past `MAX_AGE_MS`.
fn publish(views: &Views, nodes: &[&str], behaviour: StaleBehaviour) {
    let records: Vec<Arc<EndpointRecord>> = nodes
        .iter()
        .map(|n| record(&format!("web-{n}"), n))
        .collect();
    let mut p = Published::waiting(svc(), 0);
    p.status = Status::Held;
    p.records = records.into();
    p.revision = Revision(1);
    p.synced = false;
    p.confirmed_at_ms = Some(CONFIRMED_MS);
    p.max_age_ms = MAX_AGE_MS;
    p.stale_behaviour = behaviour;
    views.publish(p, CONFIRMED_MS);
}

fn alive(views: &Views, nodes: &[&str]) {
    views.set_alive(nodes.iter().map(|n| NodeId::new(n).unwrap()).collect());
}

fn served(lookup: Lookup) -> Answer {
    match lookup {
        Lookup::Serve(answer) => answer,
        other => panic!("expected endpoints, got {other:?}"),
    }
}

fn ids(answer: &Answer) -> Vec<String> {
    answer
        .selection
        .candidates
        .iter()
        .map(|c| c.record.instance_id.to_string())
        .collect()
}

#[test]
fn a_copy_within_its_age_is_served_whole_and_not_degraded() {
    let views = views();
    publish(&views, &["n1", "n2", "n3"], StaleBehaviour::Degrade);
    alive(&views, &["n1"]);
    let answer = served(views.lookup(&svc(), LATE_MS - 1));
    assert_eq!(answer.degraded, None);
    assert_eq!(ids(&answer), ["web-n1", "web-n2", "web-n3"]);
}

#[test]
fn degrade_serves_only_endpoints_with_fresh_local_evidence() {
    let views = views();
    publish(&views, &["n1", "n2", "n3"], StaleBehaviour::Degrade);
    alive(&views, &["n1", "n2"]);
    let view = views.service(&svc());
    // n2's endpoint failed a connect from here a moment ago.
    view.connect_failed(&views, &InstanceId::new("web-n2").unwrap(), LATE_MS - 10);
    let answer = served(views.lookup(&svc(), LATE_MS));
    let degraded = answer.degraded.clone().expect("past its age: degraded");
    assert!(!degraded.fallback, "{degraded:?}");
    assert_eq!(ids(&answer), ["web-n1"]);
    // Past the ejection window, the failure no longer counts against it.
    let window = views.data_plane().base_ejection_ms;
    let answer = served(views.lookup(&svc(), LATE_MS + window));
    assert_eq!(ids(&answer), ["web-n1", "web-n2"]);
}

#[test]
fn degrade_falls_back_to_the_whole_copy_and_says_so() {
    let views = views();
    publish(&views, &["n1", "n2"], StaleBehaviour::Degrade);
    // Gossip sees none of their nodes (or is off).
    let answer = served(views.lookup(&svc(), LATE_MS));
    let degraded = answer.degraded.clone().expect("past its age: degraded");
    assert!(degraded.fallback, "{degraded:?}");
    assert!(
        degraded
            .reason
            .contains("no endpoint has fresh local evidence"),
        "{degraded:?}"
    );
    assert_eq!(ids(&answer), ["web-n1", "web-n2"]);
}

#[test]
fn degrade_refuses_failover_and_keep_does_not_degrade() {
    let views = views();
    publish(&views, &["n1"], StaleBehaviour::Degrade);
    assert_eq!(
        views.failover(&svc(), ConnTraffic::ReadWrite, LATE_MS),
        Decision::Refused(Refusal::StaleCopy)
    );
    // Within its age the service's own policy decides (here: none).
    assert_eq!(
        views.failover(&svc(), ConnTraffic::ReadWrite, LATE_MS - 1),
        Decision::Refused(Refusal::NoPolicy)
    );
    publish(&views, &["n1", "n2"], StaleBehaviour::Keep);
    let answer = served(views.lookup(&svc(), LATE_MS));
    assert_eq!(answer.degraded, None);
    assert_eq!(ids(&answer), ["web-n1", "web-n2"]);
    assert_eq!(
        views.failover(&svc(), ConnTraffic::ReadWrite, LATE_MS),
        Decision::Refused(Refusal::NoPolicy)
    );
    publish(&views, &["n1"], StaleBehaviour::Refuse);
    assert!(matches!(views.lookup(&svc(), LATE_MS), Lookup::Refused(_)));
}
