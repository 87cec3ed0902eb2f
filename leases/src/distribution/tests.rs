//! The distribution rules, stepped by hand with a manual clock.

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::command::{Command, Envelope, Registration};
use crate::endpoint::{Principal, Role, State, Weight};
use crate::ids::{AgentEpoch, Generation};
use crate::name::{InstanceId, Label, NodeId, PrincipalName, Reason, Version};
use crate::params::CatalogParams;
use crate::view::ServiceView;

fn params() -> DistParams {
    DistParams {
        coalesce_window_ms: 20,
        max_concurrent_snapshots: 2,
        stall_timeout_ms: 10_000,
        snapshot_retry_ms: 250,
    }
}

fn svc(s: &str) -> ServiceKey {
    ServiceKey::new("default", s, "default").unwrap()
}

struct World {
    cat: Catalog,
    dist: Distributor,
    now: u64,
}

impl World {
    fn new() -> Self {
        let mut w = World {
            cat: Catalog::new(CatalogParams::with_region(Label::new("r1").unwrap())),
            dist: Distributor::new(params()),
            now: 1_000,
        };
        w.commit(Command::GrantLease {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
        });
        w
    }

    fn commit(&mut self, command: Command) -> Vec<Output> {
        let actor = Principal {
            role: Role::Operator,
            name: PrincipalName::new("t").unwrap(),
        };
        let applied = self
            .cat
            .apply(&Envelope {
                at_ms: self.now,
                actor,
                command,
            })
            .unwrap();
        let mut out = Vec::new();
        self.dist
            .committed(&applied.services, self.now, &self.cat, &mut out);
        out
    }

    fn register(&mut self, id: &str, service: &str) -> Vec<Output> {
        self.commit(Command::Register(Registration {
            instance_id: InstanceId::new(id).unwrap(),
            service: svc(service),
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 80,
            zone: None,
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            initial: State::Ready,
        }))
    }

    fn drain(&mut self, id: &str) -> Vec<Output> {
        self.commit(Command::Transition {
            instance_id: InstanceId::new(id).unwrap(),
            generation: Generation(1),
            to: State::Draining,
            reason: Reason::new("drain").unwrap(),
        })
    }

    fn subscribe(&mut self, agent: AgentId, service: &str, have: Option<Revision>) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist
            .subscribe(agent, svc(service), have, self.now, &self.cat, &mut out);
        out
    }

    fn sent(&mut self, agent: AgentId) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist.sent(agent, self.now, &self.cat, &mut out);
        out
    }

    fn wake(&mut self, agent: AgentId) -> Vec<Output> {
        let mut out = Vec::new();
        self.dist.wake(agent, self.now, &self.cat, &mut out);
        out
    }
}

fn sends(out: &[Output]) -> Vec<(AgentId, &Vec<ServiceUpdate>)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send { agent, updates } => Some((*agent, updates)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lone_change_goes_out_at_once_on_an_idle_stream() {
    let mut w = World::new();
    w.register("a", "web");
    w.dist.connect(1);
    let out = w.subscribe(1, "web", Some(w.cat.service(&svc("web")).unwrap().revision));
    assert!(
        matches!(&sends(&out)[0].1[0], ServiceUpdate::Current { .. }),
        "an up-to-date subscriber is told so"
    );
    w.sent(1);
    let out = w.drain("a");
    let s = sends(&out);
    assert_eq!(s.len(), 1);
    assert!(matches!(&s[0].1[0], ServiceUpdate::Deltas(d) if d.len() == 1));
}

#[test]
fn changes_during_a_send_are_merged_after_the_window() {
    let mut w = World::new();
    w.dist.connect(1);
    w.register("a", "web");
    w.subscribe(1, "web", Some(w.cat.service(&svc("web")).unwrap().revision));
    w.sent(1);
    let first = w.register("b", "web");
    assert_eq!(sends(&first).len(), 1);
    // Three more changes while the first send is in flight: nothing goes.
    for id in ["c", "d", "e"] {
        w.now += 1;
        assert!(sends(&w.register(id, "web")).is_empty());
    }
    // The send completes 5 ms after the first pending change: wait for the window.
    w.now += 2;
    let out = w.sent(1);
    assert!(sends(&out).is_empty());
    let wake_at = out
        .iter()
        .find_map(|o| match o {
            Output::WakeAt { at_ms, .. } => Some(*at_ms),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        wake_at,
        w.now - 4 + 20,
        "window counted from the first pending change"
    );
    w.now = wake_at;
    let out = w.wake(1);
    let s = sends(&out);
    assert_eq!(s.len(), 1);
    match &s[0].1[0] {
        ServiceUpdate::Deltas(d) => assert_eq!(d.len(), 3, "three changes, one message"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn snapshots_are_bounded_and_the_rest_retry() {
    let mut w = World::new();
    w.register("a", "web");
    let mut snapshots = 0;
    let mut retries = 0;
    for agent in 1..=3 {
        w.dist.connect(agent);
        for (_, updates) in sends(&w.subscribe(agent, "web", None)) {
            for u in updates {
                match u {
                    ServiceUpdate::Snapshot(_) => snapshots += 1,
                    ServiceUpdate::RetryAfter { ms, .. } => {
                        assert_eq!(*ms, 250);
                        retries += 1
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }
    assert_eq!((snapshots, retries), (2, 1));
    assert_eq!(w.dist.snapshots_in_flight(), 2);
    w.sent(1);
    assert_eq!(w.dist.snapshots_in_flight(), 1);
    // Agent 3 got its retry answer and asks again after its wait: now there is a slot.
    w.sent(3);
    let out = w.subscribe(3, "web", None);
    assert!(matches!(sends(&out)[0].1[0], ServiceUpdate::Snapshot(_)));
    assert_eq!(w.dist.stats().max_concurrent_snapshots_seen, 2);
}

#[test]
fn a_snapshot_decodes_into_the_current_view() {
    let mut w = World::new();
    w.register("a", "web");
    w.register("b", "web");
    w.dist.connect(1);
    let out = w.subscribe(1, "web", None);
    let ServiceUpdate::Snapshot(bytes) = &sends(&out)[0].1[0] else {
        panic!()
    };
    let snap = crate::codec::decode_service_snapshot(bytes).unwrap();
    let view = ServiceView::from_snapshot(&snap).unwrap();
    assert_eq!(view.digest(), w.cat.service(&svc("web")).unwrap().digest);
}

#[test]
fn a_stalled_agent_is_disconnected() {
    let mut w = World::new();
    w.register("a", "web");
    w.dist.connect(1);
    w.subscribe(1, "web", None);
    assert_eq!(w.dist.snapshots_in_flight(), 1);
    w.now += 9_999;
    assert!(w.wake(1).is_empty());
    w.now += 1;
    let out = w.wake(1);
    assert!(matches!(&out[0], Output::Disconnect { agent: 1, .. }));
    assert_eq!(
        w.dist.snapshots_in_flight(),
        0,
        "its snapshot slot is freed"
    );
    assert!(w.dist.agent_ids().is_empty());
}

#[test]
fn unknown_services_are_answered_and_delivered_once_created() {
    let mut w = World::new();
    w.dist.connect(1);
    let out = w.subscribe(1, "later", None);
    assert!(matches!(
        &sends(&out)[0].1[0],
        ServiceUpdate::Unknown { .. }
    ));
    w.sent(1);
    let out = w.register("x", "later");
    let s = sends(&out);
    assert_eq!(s.len(), 1, "the creation reaches the waiting subscriber");
    let mut view = ServiceView::empty(svc("later"), crate::ids::ShardId(0));
    match &s[0].1[0] {
        ServiceUpdate::Deltas(d) => d.iter().for_each(|d| view.apply(d).unwrap()),
        other => panic!("{other:?}"),
    }
    assert_eq!(view.ready().count(), 1);
}

#[test]
fn a_subscriber_ahead_of_the_catalog_is_told_to_wait() {
    let mut w = World::new();
    w.register("a", "web");
    w.dist.connect(1);
    let ahead = w.cat.revision().next();
    let out = w.subscribe(1, "web", Some(ahead));
    assert!(matches!(&sends(&out)[0].1[0], ServiceUpdate::NotYet { .. }));
}

#[test]
fn propagation_counts_acknowledging_subscribers() {
    let mut w = World::new();
    w.register("a", "web");
    for agent in 1..=3 {
        w.dist.connect(agent);
        w.subscribe(agent, "web", None);
        w.sent(agent);
    }
    w.drain("a");
    let rev = w.cat.revision();
    assert_eq!(w.dist.propagation(&svc("web"), rev), (0, 3));
    w.dist.ack(1, &svc("web"), rev);
    w.dist.ack(2, &svc("web"), rev);
    assert_eq!(w.dist.propagation(&svc("web"), rev), (2, 3));
    assert!(w.dist.ack_lag(3, &w.cat) > 0);
    assert_eq!(w.dist.ack_lag(1, &w.cat), 0);
    w.dist.disconnect(3);
    assert_eq!(w.dist.propagation(&svc("web"), rev), (2, 2));
}
