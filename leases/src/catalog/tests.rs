//! One test per rule of the state machine.

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::endpoint::{Principal, Role, Weight};
use crate::name::{LabelValue, PrincipalName, Version};

fn label(s: &str) -> Label {
    Label::new(s).unwrap()
}
fn node(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}
fn iid(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}
fn svc(s: &str) -> ServiceKey {
    ServiceKey::new("default", s, "default").unwrap()
}

fn params() -> CatalogParams {
    let mut p = CatalogParams::with_region(label("r1"));
    p.expired_retention_ms = 10_000;
    p.service_retention_ms = 100_000;
    p
}

/// A catalog with a clock and an actor, so each test reads as a story.
struct World {
    cat: Catalog,
    now: u64,
}

impl World {
    fn new() -> Self {
        World {
            cat: Catalog::new(params()),
            now: 1_000_000,
        }
    }

    fn run(&mut self, command: Command) -> Result<Applied, Rejection> {
        self.run_as(Role::Operator, "ops", command)
    }

    fn run_as(&mut self, role: Role, name: &str, command: Command) -> Result<Applied, Rejection> {
        self.now += 10;
        let actor = Principal {
            role,
            name: PrincipalName::new(name).unwrap(),
        };
        self.cat.apply(&Envelope {
            at_ms: self.now,
            actor,
            command,
        })
    }

    fn grant(&mut self, n: &str, epoch: u64, zone: &str) -> Result<Applied, Rejection> {
        self.run(Command::GrantLease {
            node: node(n),
            epoch: AgentEpoch(epoch),
            zone: label(zone),
            ttl_ms: 10_000,
        })
    }

    fn register(
        &mut self,
        id: &str,
        service: &str,
        n: &str,
        epoch: u64,
    ) -> Result<Generation, Rejection> {
        let applied = self.run(Command::Register(registration(id, service, n, epoch)))?;
        match applied.effect {
            Effect::Registered { generation, .. } => Ok(generation),
            other => panic!("unexpected effect {other:?}"),
        }
    }

    fn transition(&mut self, id: &str, generation: u64, to: State) -> Result<Applied, Rejection> {
        self.run(Command::Transition {
            instance_id: iid(id),
            generation: Generation(generation),
            to,
            reason: Reason::new("test").unwrap(),
        })
    }

    fn state(&self, id: &str) -> State {
        self.cat.instance(&iid(id)).unwrap().state
    }

    fn snapshot(&self) -> Vec<u8> {
        crate::codec::encode_catalog_snapshot(&self.cat.export())
    }
}

fn registration(id: &str, service: &str, n: &str, epoch: u64) -> Registration {
    Registration {
        instance_id: iid(id),
        service: svc(service),
        node: node(n),
        epoch: AgentEpoch(epoch),
        address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 8080,
        zone: None,
        version: Version::new("v1").unwrap(),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    }
}

#[test]
fn registration_assigns_generations_and_replaces_the_predecessor() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    assert_eq!(w.register("a", "web", "n1", 1).unwrap(), Generation(1));
    let rev = w.cat.revision();
    assert_eq!(w.register("a", "web", "n1", 1).unwrap(), Generation(2));
    assert_eq!(w.cat.revision(), rev.next());
    let info = w.cat.service(&svc("web")).unwrap();
    assert_eq!((info.records, info.ready), (1, 1));
    assert_eq!(w.cat.instance(&iid("a")).unwrap().generation, Generation(2));
}

#[test]
fn a_replacing_registration_names_what_it_replaced_in_its_effect_and_audit() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    let first = w
        .run(Command::Register(registration("a", "web", "n1", 1)))
        .unwrap();
    assert!(matches!(
        first.effect,
        Effect::Registered { replaced: None, .. }
    ));
    w.transition("a", 1, State::Draining).unwrap();
    let env = Envelope {
        at_ms: w.now + 10,
        actor: Principal {
            role: Role::Agent,
            name: PrincipalName::new("n1").unwrap(),
        },
        command: Command::Register(registration("a", "web", "n1", 1)),
    };
    let applied = w.cat.apply(&env).unwrap();
    assert_eq!(
        applied.effect,
        Effect::Registered {
            generation: Generation(2),
            state: State::Ready,
            replaced: Some(Replaced {
                node: node("n1"),
                generation: Generation(1),
                state: State::Draining,
            }),
        }
    );
    let entry = crate::audit::AuditEntry::describe(&env, &applied).unwrap();
    assert!(
        entry
            .detail
            .ends_with("; replaced generation 1 DRAINING on n1"),
        "{}",
        entry.detail
    );
}

#[test]
fn re_registration_into_another_service_moves_the_record() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    let applied = w
        .run(Command::Register(registration("a", "api", "n1", 1)))
        .unwrap();
    assert_eq!(applied.services, vec![svc("api"), svc("web")]);
    assert_eq!(w.cat.service(&svc("web")).unwrap().records, 0);
    assert_eq!(w.cat.service_of(&iid("a")), Some(&svc("api")));
}

#[test]
fn a_stale_generation_is_rejected_and_changes_nothing() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    let before = w.snapshot();
    let err = w.transition("a", 1, State::Draining).unwrap_err();
    assert!(matches!(
        err,
        Rejection::StaleGeneration {
            given: Generation(1),
            current: Generation(2),
            ..
        }
    ));
    let err = w
        .run(Command::Deregister {
            instance_id: iid("a"),
            generation: Generation(1),
        })
        .unwrap_err();
    assert!(matches!(err, Rejection::StaleGeneration { .. }));
    let err = w
        .run(Command::SetLiveness {
            instance_id: iid("a"),
            generation: Generation(3),
            liveness: Liveness::Failing,
        })
        .unwrap_err();
    assert!(matches!(err, Rejection::StaleGeneration { .. }));
    assert_eq!(w.snapshot(), before);
    assert_eq!(w.state("a"), State::Ready);
}

#[test]
fn unknown_instances_are_rejected() {
    let mut w = World::new();
    let err = w.transition("ghost", 1, State::Ready).unwrap_err();
    assert!(matches!(err, Rejection::UnknownInstance { .. }));
}

#[test]
fn illegal_transitions_are_rejected_with_a_reason() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    for to in [State::Starting, State::Expired] {
        let err = w.transition("a", 1, to).unwrap_err();
        assert!(
            matches!(
                err,
                Rejection::IllegalTransition {
                    from: State::Ready,
                    ..
                }
            ),
            "{to}"
        );
    }
    w.transition("a", 1, State::Draining).unwrap();
    let err = w.transition("a", 1, State::Ready).unwrap_err();
    assert!(err.to_string().contains("deregistration"), "{err}");
}

#[test]
fn a_transition_to_the_current_state_commits_nothing() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    let rev = w.cat.revision();
    let applied = w.transition("a", 1, State::Ready).unwrap();
    assert_eq!(applied.revision, None);
    assert_eq!(w.cat.revision(), rev);
}

#[test]
fn only_ready_is_routable() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    let mut reg = registration("a", "web", "n1", 1);
    reg.initial = State::Starting;
    w.run(Command::Register(reg)).unwrap();
    w.register("b", "web", "n1", 1).unwrap();
    assert_eq!(w.cat.service(&svc("web")).unwrap().ready, 1);
    w.transition("a", 1, State::Ready).unwrap();
    w.transition("b", 1, State::Unhealthy).unwrap();
    let info = w.cat.service(&svc("web")).unwrap();
    assert_eq!(info.ready, 1);
    assert!(w
        .cat
        .records(&svc("web"))
        .unwrap()
        .iter()
        .filter(|r| r.state.is_routable())
        .all(|r| r.instance_id == iid("a")));
}

#[test]
fn writes_need_the_nodes_current_lease() {
    let mut w = World::new();
    assert!(matches!(
        w.register("a", "web", "n1", 1),
        Err(Rejection::NoLease { .. })
    ));
    w.grant("n1", 2, "z1").unwrap();
    assert!(matches!(
        w.register("a", "web", "n1", 1),
        Err(Rejection::OtherEpoch { .. })
    ));
    let mut reg = registration("a", "web", "n1", 2);
    reg.zone = Some(label("z9"));
    assert!(matches!(
        w.run(Command::Register(reg)),
        Err(Rejection::ZoneMismatch { .. })
    ));
    let mut reg = registration("a", "web", "n1", 2);
    reg.initial = State::Draining;
    assert!(matches!(
        w.run(Command::Register(reg)),
        Err(Rejection::BadInitialState { .. })
    ));
    assert!(matches!(
        w.grant("n1", 1, "z1"),
        Err(Rejection::StaleEpoch { .. })
    ));
    assert!(matches!(
        w.run(Command::GrantLease {
            node: node("n1"),
            epoch: AgentEpoch(2),
            zone: label("z1"),
            ttl_ms: 5
        }),
        Err(Rejection::BadTtl { ttl_ms: 5 })
    ));
}

#[test]
fn labels_are_limited_to_predefined_dimensions() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    let value = LabelValue::new("x").unwrap();
    let mut reg = registration("a", "web", "n1", 1);
    reg.labels = vec![(label("colour"), value.clone())];
    let err = w.run(Command::Register(reg)).unwrap_err();
    assert!(err.to_string().contains("predefined"), "{err}");
    let mut reg = registration("a", "web", "n1", 1);
    reg.labels = vec![
        (label("track"), value.clone()),
        (label("track"), value.clone()),
    ];
    assert!(matches!(
        w.run(Command::Register(reg)),
        Err(Rejection::DuplicateLabel { .. })
    ));
    let mut reg = registration("a", "web", "n1", 1);
    reg.labels = (0..9).map(|_| (label("tier"), value.clone())).collect();
    assert!(matches!(
        w.run(Command::Register(reg)),
        Err(Rejection::TooManyLabels { count: 9, .. })
    ));
    let mut reg = registration("a", "web", "n1", 1);
    reg.labels = vec![(label("tier"), value.clone()), (label("canary"), value)];
    w.run(Command::Register(reg)).unwrap();
    let labels = &w.cat.instance(&iid("a")).unwrap().labels;
    assert_eq!(labels[0].0, label("canary"), "labels are stored sorted");
}

/// `count` nodes of `zone`, each with one instance of `web`.
fn zone_of(w: &mut World, zone: &str, count: usize) {
    for i in 0..count {
        w.grant(&format!("{zone}-n{i}"), 1, zone).unwrap();
        w.register(&format!("{zone}-i{i}"), "web", &format!("{zone}-n{i}"), 1)
            .unwrap();
    }
}

#[test]
fn purge_removes_uncovered_records_then_forgets_the_service() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.run(Command::RevokeLease {
        node: node("n1"),
        epoch: AgentEpoch(1),
    })
    .unwrap();
    assert_eq!(
        w.run(Command::Purge).unwrap().effect,
        Effect::Unchanged,
        "retention not yet passed"
    );
    w.now += params().expired_retention_ms;
    let applied = w.run(Command::Purge).unwrap();
    assert_eq!(
        applied.effect,
        Effect::Purged {
            records: 1,
            generations: 0,
            services: 0
        }
    );
    assert!(w.cat.instance(&iid("a")).is_none());
    // The service stays known (empty), and the generation is remembered.
    assert_eq!(w.cat.service(&svc("web")).unwrap().records, 0);
    assert_eq!(
        w.cat.changes_since(&svc("web"), w.cat.revision()),
        SinceAnswer::UpToDate
    );
    w.grant("n1", 2, "z1").unwrap();
    assert_eq!(w.register("a", "web", "n1", 2).unwrap(), Generation(2));
    w.run(Command::Deregister {
        instance_id: iid("a"),
        generation: Generation(2),
    })
    .unwrap();
    w.now += params().service_retention_ms;
    let applied = w.run(Command::Purge).unwrap();
    assert_eq!(
        applied.effect,
        Effect::Purged {
            records: 0,
            generations: 1,
            services: 1
        }
    );
    assert_eq!(
        w.cat.changes_since(&svc("web"), Revision(0)),
        SinceAnswer::Unknown
    );
}

#[test]
fn covered_records_are_never_purged() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.transition("a", 1, State::Unhealthy).unwrap();
    w.now += params().service_retention_ms * 2;
    assert_eq!(w.run(Command::Purge).unwrap().effect, Effect::Unchanged);
}

#[test]
fn only_an_empty_service_can_be_deleted() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    let err = w
        .run(Command::DeleteService {
            service: svc("web"),
        })
        .unwrap_err();
    assert!(matches!(err, Rejection::ServiceNotEmpty { records: 1, .. }));
    w.run(Command::Deregister {
        instance_id: iid("a"),
        generation: Generation(1),
    })
    .unwrap();
    w.run(Command::DeleteService {
        service: svc("web"),
    })
    .unwrap();
    assert!(w.cat.service(&svc("web")).is_none());
    assert!(matches!(
        w.run(Command::DeleteService {
            service: svc("web")
        }),
        Err(Rejection::UnknownService { .. })
    ));
}

#[test]
fn subscribers_get_deltas_a_snapshot_or_a_wait() {
    let mut p = params();
    p.delta_log.max_entries = 3;
    let mut w = World {
        cat: Catalog::new(p),
        now: 0,
    };
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    let held = w.cat.service(&svc("web")).unwrap().revision;
    w.transition("a", 1, State::Unhealthy).unwrap();
    match w.cat.changes_since(&svc("web"), held) {
        SinceAnswer::Deltas(d) => {
            assert_eq!(d.len(), 1);
            assert_eq!(d[0].prev_revision, held);
        }
        other => panic!("{other:?}"),
    }
    for _ in 0..3 {
        w.transition("a", 1, State::Ready).unwrap();
        w.transition("a", 1, State::Unhealthy).unwrap();
    }
    assert_eq!(
        w.cat.changes_since(&svc("web"), held),
        SinceAnswer::SnapshotNeeded
    );
    let now = w.cat.revision();
    assert_eq!(w.cat.changes_since(&svc("web"), now), SinceAnswer::UpToDate);
    assert_eq!(
        w.cat.changes_since(&svc("web"), now.next()),
        SinceAnswer::Ahead { current: now }
    );
    assert_eq!(
        w.cat.changes_since(&svc("nope"), Revision(0)),
        SinceAnswer::Unknown
    );
}

#[test]
fn every_delta_carries_the_new_digest() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    let mut view = crate::view::ServiceView::empty(svc("web"), crate::ids::ShardId(0));
    w.register("a", "web", "n1", 1).unwrap();
    w.register("b", "web", "n1", 1).unwrap();
    w.transition("a", 1, State::Draining).unwrap();
    let SinceAnswer::Deltas(deltas) = w.cat.changes_since(&svc("web"), Revision(0)) else {
        panic!()
    };
    for d in &deltas {
        view.apply(d).unwrap();
        assert_eq!(view.digest(), d.digest);
    }
    assert_eq!(view.digest(), w.cat.service(&svc("web")).unwrap().digest);
}

#[test]
fn import_of_export_gives_the_same_catalog() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 4);
    w.run(Command::ExpireLease {
        node: node("z1-n0"),
        epoch: AgentEpoch(1),
        silent_in_zone: 1,
    })
    .unwrap();
    let snap = w.cat.export();
    let back = Catalog::import(params(), snap.clone()).unwrap();
    assert_eq!(back.export(), snap);
    assert_eq!(back.revision(), w.cat.revision());
}

#[test]
fn import_refuses_a_snapshot_whose_digest_lies() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 2);
    let mut snap = w.cat.export();
    snap.services[0].digest = crate::digest::Digest::EMPTY;
    assert!(Catalog::import(params(), snap).is_err());
}

mod leases;
mod policies;
