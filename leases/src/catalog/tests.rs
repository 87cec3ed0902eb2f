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

#[test]
fn lease_expiry_marks_only_that_nodes_records() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.grant("n2", 1, "z1").unwrap();
    w.grant("n3", 1, "z1").unwrap();
    w.grant("n4", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.register("b", "web", "n2", 1).unwrap();
    let applied = w
        .run(Command::ExpireLease {
            node: node("n1"),
            epoch: AgentEpoch(1),
            silent_in_zone: 1,
        })
        .unwrap();
    assert_eq!(applied.effect, Effect::LeaseEnded { marked: 1 });
    assert_eq!(w.state("a"), State::Expired);
    assert_eq!(w.state("b"), State::Ready);
    assert!(w.cat.leases().get(&node("n1")).is_none());
}

#[test]
fn a_revoked_lease_expires_its_records() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.run(Command::RevokeLease {
        node: node("n1"),
        epoch: AgentEpoch(1),
    })
    .unwrap();
    assert_eq!(w.state("a"), State::Expired);
}

#[test]
fn a_down_verdict_marks_the_node_unhealthy_and_names_the_reporters() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.register("d", "web", "n1", 1).unwrap();
    w.transition("d", 1, State::Draining).unwrap();
    let applied = w
        .run(Command::NodeDown {
            node: node("n1"),
            epoch: AgentEpoch(1),
            reporters: vec![node("n2"), node("n3")],
        })
        .unwrap();
    assert_eq!(applied.effect, Effect::LeaseEnded { marked: 1 });
    let a = w.cat.instance(&iid("a")).unwrap();
    assert_eq!(a.state, State::Unhealthy);
    assert_eq!(
        a.reason.as_str(),
        "node down, silent to the arbiter (reported by n2, n3)"
    );
    assert_eq!(w.state("d"), State::Draining);
    // The record may not come back to READY without its node's agent.
    assert!(matches!(
        w.transition("a", 1, State::Ready),
        Err(Rejection::NotCovered { .. })
    ));
}

#[test]
fn only_down_verdicts_and_ended_leases_are_confirmed_deaths() {
    let mut w = World::new();
    for n in ["n1", "n2", "n3"] {
        w.grant(n, 1, "z1").unwrap();
    }
    w.register("a", "web", "n1", 1).unwrap();
    w.register("b", "web", "n2", 1).unwrap();
    w.register("c", "web", "n3", 1).unwrap();
    let dead = |w: &World, id: &str| w.cat.instance(&iid(id)).unwrap().confirmed_dead();
    // A readiness failure its own agent reports is a doubt.
    w.run_as(
        Role::Agent,
        "n1",
        Command::Transition {
            instance_id: iid("a"),
            generation: Generation(1),
            to: State::Unhealthy,
            reason: Reason::new("readiness failed").unwrap(),
        },
    )
    .unwrap();
    assert_eq!(w.state("a"), State::Unhealthy);
    assert!(!dead(&w, "a"));
    // The arbiter commits a down verdict as the reporting agent (another
    // node's): evidence.
    w.run_as(
        Role::Agent,
        "n3",
        Command::NodeDown {
            node: node("n2"),
            epoch: AgentEpoch(1),
            reporters: vec![node("n3")],
        },
    )
    .unwrap();
    assert_eq!(w.state("b"), State::Unhealthy);
    assert!(dead(&w, "b"));
    // An ended lease: evidence.
    w.run_as(
        Role::Agent,
        "n3",
        Command::RevokeLease {
            node: node("n3"),
            epoch: AgentEpoch(1),
        },
    )
    .unwrap();
    assert!(dead(&w, "c"));
    // The node's agent comes back under a new epoch: its records move to
    // the new lease as its own, and are doubts again until it probes them.
    w.run_as(
        Role::Agent,
        "n2",
        Command::GrantLease {
            node: node("n2"),
            epoch: AgentEpoch(2),
            zone: label("z1"),
            ttl_ms: 10_000,
        },
    )
    .unwrap();
    assert!(!dead(&w, "b"));
}

#[test]
fn a_verdict_about_an_older_agent_epoch_changes_nothing() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    w.grant("n1", 2, "z1").unwrap();
    let before = w.snapshot();
    let err = w
        .run(Command::NodeDown {
            node: node("n1"),
            epoch: AgentEpoch(1),
            reporters: vec![node("n2")],
        })
        .unwrap_err();
    assert!(matches!(err, Rejection::OtherEpoch { .. }));
    assert_eq!(w.snapshot(), before);
    assert_eq!(w.state("a"), State::Ready);
}

#[test]
fn a_restarted_agent_keeps_its_records_and_their_generations() {
    let mut w = World::new();
    w.grant("n1", 1, "z1").unwrap();
    w.register("a", "web", "n1", 1).unwrap();
    let applied = w.grant("n1", 2, "z1").unwrap();
    assert!(matches!(
        applied.effect,
        Effect::LeaseGranted { moved: 1, .. }
    ));
    let a = w.cat.instance(&iid("a")).unwrap();
    assert_eq!(
        (a.generation, a.epoch, a.state),
        (Generation(1), AgentEpoch(2), State::Ready)
    );
    // A verdict about the new run now marks it.
    w.run(Command::NodeDown {
        node: node("n1"),
        epoch: AgentEpoch(2),
        reporters: vec![node("n2")],
    })
    .unwrap();
    assert_eq!(w.state("a"), State::Unhealthy);
}

fn zone_of(w: &mut World, zone: &str, count: usize) {
    for i in 0..count {
        w.grant(&format!("{zone}-n{i}"), 1, zone).unwrap();
        w.register(&format!("{zone}-i{i}"), "web", &format!("{zone}-n{i}"), 1)
            .unwrap();
    }
}

#[test]
fn the_guard_holds_expiries_when_a_zone_goes_silent() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 10);
    let applied = w
        .run(Command::ExpireLease {
            node: node("z1-n0"),
            epoch: AgentEpoch(1),
            silent_in_zone: 10,
        })
        .unwrap();
    assert_eq!(applied.effect, Effect::ExpiryHeld);
    assert!(applied.revision.is_some(), "holding is a replicated change");
    assert_eq!(w.state("z1-i0"), State::Ready, "held records keep serving");
    assert_eq!(w.cat.leases().held(), 1);
    // Asking again before the maximum hold changes nothing.
    let again = w
        .run(Command::ExpireLease {
            node: node("z1-n0"),
            epoch: AgentEpoch(1),
            silent_in_zone: 10,
        })
        .unwrap();
    assert_eq!(again.effect, Effect::Unchanged);
}

#[test]
fn the_guard_lets_a_lone_crash_expire() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 10);
    let applied = w
        .run(Command::ExpireLease {
            node: node("z1-n0"),
            epoch: AgentEpoch(1),
            silent_in_zone: 1,
        })
        .unwrap();
    assert!(matches!(applied.effect, Effect::LeaseEnded { marked: 1 }));
}

#[test]
fn a_held_lease_is_released_by_a_down_verdict() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 10);
    w.run(Command::ExpireLease {
        node: node("z1-n0"),
        epoch: AgentEpoch(1),
        silent_in_zone: 10,
    })
    .unwrap();
    w.run(Command::NodeDown {
        node: node("z1-n0"),
        epoch: AgentEpoch(1),
        reporters: vec![node("z1-n1")],
    })
    .unwrap();
    assert_eq!(w.state("z1-i0"), State::Unhealthy);
    assert_eq!(w.cat.leases().held(), 0);
}

#[test]
fn a_held_lease_is_reinstated_when_its_session_returns() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 10);
    w.run(Command::ExpireLease {
        node: node("z1-n0"),
        epoch: AgentEpoch(1),
        silent_in_zone: 10,
    })
    .unwrap();
    let applied = w.grant("z1-n0", 1, "z1").unwrap();
    assert_eq!(applied.effect, Effect::LeaseReinstated);
    assert_eq!(w.cat.leases().held(), 0);
    assert_eq!(w.state("z1-i0"), State::Ready);
}

#[test]
fn a_held_lease_expires_after_the_maximum_hold() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 10);
    w.run(Command::ExpireLease {
        node: node("z1-n0"),
        epoch: AgentEpoch(1),
        silent_in_zone: 10,
    })
    .unwrap();
    w.now += params().guard.max_hold_ms;
    let applied = w
        .run(Command::ExpireLease {
            node: node("z1-n0"),
            epoch: AgentEpoch(1),
            silent_in_zone: 10,
        })
        .unwrap();
    assert!(matches!(applied.effect, Effect::LeaseEnded { marked: 1 }));
    assert_eq!(w.state("z1-i0"), State::Expired);
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

fn policy(service: &str, home: &str) -> Policy {
    let mut doc = rollcall_config::ServicePolicy::new(service, home);
    doc.cross_region = true;
    doc.failover_order = vec!["r3".into()];
    Policy::new(doc).unwrap()
}

fn policy_key(s: &str) -> PolicyKey {
    s.parse().unwrap()
}

#[test]
fn a_policy_takes_a_revision_and_setting_it_again_changes_nothing() {
    let mut w = World::new();
    let applied = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    assert_eq!(applied.effect, Effect::PolicyChanged);
    assert_eq!(applied.revision, Some(Revision(1)));
    assert!(applied.services.is_empty(), "a policy touches no record");
    let stored = w.cat.policy(&policy_key("shop/cart")).unwrap();
    assert_eq!(stored.revision, Revision(1));
    assert_eq!(stored.set_by.to_string(), "operator:ops");

    let again = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    assert_eq!((again.effect, again.revision), (Effect::Unchanged, None));

    let mut changed = policy("shop/cart", "r1").document().clone();
    changed.cross_region = false;
    let applied = w
        .run(Command::SetPolicy(Box::new(Policy::new(changed).unwrap())))
        .unwrap();
    assert_eq!(applied.revision, Some(Revision(2)));
    assert_eq!(
        w.cat.policy(&policy_key("shop/cart")).unwrap().revision,
        Revision(2)
    );
}

#[test]
fn only_the_home_region_changes_a_policy() {
    let mut w = World::new();
    let before = w.snapshot();
    let err = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r2"))))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the policy of shop/cart has home region r2; only region r2's arbiter accepts changes to it, and this arbiter serves region r1"
    );
    assert_eq!(w.snapshot(), before, "a refused policy changes nothing");
    assert_eq!(w.cat.revision(), Revision(0));
}

#[test]
fn a_policy_is_deleted_once() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    let applied = w
        .run(Command::DeletePolicy {
            service: policy_key("shop/cart"),
        })
        .unwrap();
    assert_eq!(applied.revision, Some(Revision(2)));
    assert!(w.cat.policy(&policy_key("shop/cart")).is_none());
    assert!(matches!(
        w.run(Command::DeletePolicy {
            service: policy_key("shop/cart"),
        }),
        Err(Rejection::UnknownPolicy { .. })
    ));
}

#[test]
fn policies_survive_a_snapshot_and_old_snapshots_still_decode() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 2);
    let without = w.snapshot();
    w.run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    w.run(Command::SetPolicy(Box::new(policy("shop/web", "r1"))))
        .unwrap();
    let snap = w.cat.export();
    assert_eq!(snap.policies.len(), 2);
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded, snap);
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.export(), snap);
    assert_eq!(
        back.policy(&policy_key("shop/web")).unwrap().revision,
        w.cat.revision()
    );

    // A snapshot written before policies existed: frame kind 4, the same
    // body without the trailing policy lists, identity and writer epochs
    // (here two empty lists, no identity and no epoch, one byte each);
    // before replicated policies: kind 11, without the last three; before
    // identities: kind 12, without the last two; before writer epochs:
    // kind 13, without the last.
    for (kind, trailing) in [(4u8, 4), (11, 3), (12, 2), (13, 1)] {
        let mut old = without.clone();
        old[1] = kind;
        for _ in 0..trailing {
            assert_eq!(old.pop(), Some(0));
        }
        let decoded = crate::codec::decode_catalog_snapshot(&old).unwrap();
        assert!(decoded.replicated_policies.is_empty());
        assert_eq!(decoded.identity, None);
        assert_eq!(crate::codec::encode_catalog_snapshot(&decoded), without);
    }
}

#[test]
fn the_first_identity_committed_is_the_catalogs_for_good_and_survives_a_snapshot() {
    let mut w = World::new();
    assert_eq!(w.cat.identity(), None);
    let first = crate::CatalogId(0x0123_4567_89ab_cdef);
    let applied = w.run(Command::Identify { catalog: first }).unwrap();
    assert_eq!(applied.effect, Effect::Identified);
    assert!(applied.revision.is_some());
    // A second leader's late proposal changes nothing.
    let again = w
        .run(Command::Identify {
            catalog: crate::CatalogId(7),
        })
        .unwrap();
    assert_eq!((again.effect, again.revision), (Effect::Unchanged, None));
    assert_eq!(w.cat.identity(), Some(first));
    let snap = w.cat.export();
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded.identity, Some(first));
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.identity(), Some(first));
    assert_eq!(first.to_string(), "0123456789abcdef");
    assert_eq!(crate::CatalogId::parse("0123456789abcdef"), Some(first));
    assert_eq!(crate::CatalogId::parse("0123"), None);
}

fn remote(service: &str, home: &str, home_revision: u64) -> Box<RemotePolicy> {
    Box::new(RemotePolicy {
        policy: policy(service, home),
        home_revision: Revision(home_revision),
        home_set_at_ms: 5,
    })
}

#[test]
fn a_replicated_policy_keeps_its_home_revision_and_never_goes_back() {
    let mut w = World::new();
    let applied = w
        .run(Command::ReplicatePolicy(remote("shop/cart", "r2", 40)))
        .unwrap();
    assert_eq!(applied.effect, Effect::PolicyChanged);
    let held = w.cat.replicated_policy(&policy_key("shop/cart")).unwrap();
    assert_eq!(held.remote.home_revision, Revision(40));
    assert_eq!(held.revision, Revision(1));
    assert!(w.cat.policy(&policy_key("shop/cart")).is_none());

    // The same version again, or an older one, changes nothing.
    for older in [40, 39] {
        let again = w
            .run(Command::ReplicatePolicy(remote("shop/cart", "r2", older)))
            .unwrap();
        assert_eq!((again.effect, again.revision), (Effect::Unchanged, None));
    }
    w.run(Command::ReplicatePolicy(remote("shop/cart", "r2", 41)))
        .unwrap();
    assert_eq!(
        w.cat
            .replicated_policy(&policy_key("shop/cart"))
            .unwrap()
            .remote
            .home_revision,
        Revision(41)
    );

    // Dropped only by its home, at or after the version held.
    let drop = |home: &str, rev: u64| Command::DropReplicatedPolicy {
        service: policy_key("shop/cart"),
        home: label(home),
        home_revision: Revision(rev),
    };
    for (home, rev) in [("r3", 50), ("r2", 40)] {
        let kept = w.run(drop(home, rev)).unwrap();
        assert_eq!(kept.effect, Effect::Unchanged, "{home} {rev}");
    }
    assert_eq!(w.run(drop("r2", 45)).unwrap().effect, Effect::PolicyChanged);
    assert!(w.cat.replicated_policy(&policy_key("shop/cart")).is_none());
}

#[test]
fn local_changes_never_override_a_replicated_policy() {
    let mut w = World::new();
    w.run(Command::ReplicatePolicy(remote("shop/cart", "r2", 40)))
        .unwrap();
    let before = w.snapshot();
    let set = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap_err();
    assert!(
        matches!(&set, Rejection::NotHomeRegion { home, .. } if home.as_str() == "r2"),
        "{set}"
    );
    let delete = w
        .run(Command::DeletePolicy {
            service: policy_key("shop/cart"),
        })
        .unwrap_err();
    assert!(
        matches!(delete, Rejection::NotHomeRegion { .. }),
        "{delete}"
    );
    // A third region's version of the same service is a home conflict.
    let other = w
        .run(Command::ReplicatePolicy(remote("shop/cart", "r4", 99)))
        .unwrap_err();
    assert!(matches!(other, Rejection::HomeConflict { .. }), "{other}");
    // A bridge never replicates a policy homed here, nor over one.
    let here = w
        .run(Command::ReplicatePolicy(remote("shop/web", "r1", 1)))
        .unwrap_err();
    assert!(matches!(here, Rejection::HomeHere { .. }), "{here}");
    assert_eq!(w.snapshot(), before, "refusals change nothing");
    w.run(Command::SetPolicy(Box::new(policy("shop/web", "r1"))))
        .unwrap();
    let over = w
        .run(Command::ReplicatePolicy(remote("shop/web", "r2", 7)))
        .unwrap_err();
    assert!(matches!(over, Rejection::HomeConflict { .. }), "{over}");
}

#[test]
fn replicated_policies_survive_a_snapshot() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(policy("shop/web", "r1"))))
        .unwrap();
    w.run(Command::ReplicatePolicy(remote("shop/cart", "r2", 40)))
        .unwrap();
    let snap = w.cat.export();
    assert_eq!(snap.replicated_policies.len(), 1);
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded, snap);
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.export(), snap);

    // Imported into its home region, it would be a second home: refused.
    let mut p = params();
    p.region = label("r2");
    let mut only_remote = snap.clone();
    only_remote.policies.clear();
    let err = Catalog::import(p, only_remote).unwrap_err();
    assert!(err.to_string().contains("own region r2"), "{err}");
}

#[test]
fn ready_summaries_count_ready_records_and_their_weight() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 2);
    let rows = w.cat.ready_summaries();
    assert!(!rows.is_empty());
    for row in rows {
        let records = w.cat.records(&row.service).unwrap();
        let ready: Vec<_> = records.iter().filter(|r| r.state.is_routable()).collect();
        assert_eq!(row.ready, ready.len());
        assert_eq!(
            row.ready_weight,
            ready.iter().map(|r| u64::from(r.weight.get())).sum::<u64>()
        );
        assert_eq!(row.revision, w.cat.service(&row.service).unwrap().revision);
    }
}

#[test]
fn import_refuses_a_policy_of_another_home() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    let snap = w.cat.export();
    let mut p = params();
    p.region = label("r2");
    let err = Catalog::import(p, snap).unwrap_err();
    assert!(err.to_string().contains("home region r1"), "{err}");
}

fn single_writer(service: &str) -> Policy {
    let mut doc = rollcall_config::ServicePolicy::new(service, "r1");
    doc.cross_region = true;
    doc.failover_traffic = rollcall_config::TrafficClass::All;
    doc.failover_order = vec!["r2".into(), "r3".into()];
    doc.single_writer = Some(rollcall_config::SingleWriter {
        owner: "r1".into(),
        transfer_to: None,
    });
    Policy::new(doc).unwrap()
}

fn transfer(service: &str, to: &str, forced: Option<&str>) -> Command {
    Command::TransferWriter(Box::new(crate::writer::Transfer {
        service: policy_key(service),
        to: label(to),
        forced: forced.map(|r| Reason::new(r).unwrap()),
    }))
}

#[test]
fn a_transfer_commits_the_next_writer_epoch_which_survives_a_snapshot() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(single_writer("shop/ledger"))))
        .unwrap();
    let first = w.cat.writer(&policy_key("shop/ledger")).unwrap();
    assert_eq!(
        (first.epoch, first.owner.as_str(), first.settled),
        (1, "r1", true)
    );

    // r1 owns the writes: its transfer moves them, unsettled until r2
    // confirms.
    let applied = w.run(transfer("shop/ledger", "r2", None)).unwrap();
    assert_eq!(
        applied.effect,
        Effect::WriterChanged {
            epoch: 2,
            settled: false
        }
    );
    let moving = w.cat.writer(&policy_key("shop/ledger")).unwrap();
    assert_eq!((moving.epoch, moving.owner.as_str()), (2, "r2"));
    assert_eq!(moving.writer(), None);
    // A second transfer waits for the first; a late copy of epoch 1 or
    // the same epoch changes nothing.
    let err = w.run(transfer("shop/ledger", "r3", None)).unwrap_err();
    assert!(err.to_string().contains("has not confirmed yet"), "{err}");
    let again = w
        .run(Command::ReplicateWriter(Box::new(moving.clone())))
        .unwrap();
    assert_eq!(again.effect, Effect::Unchanged);

    // r2's confirmation (its settled copy) comes back through the bridge.
    let mut settled = moving.clone();
    settled.settled = true;
    settled.committed_in = label("r2");
    let applied = w
        .run(Command::ReplicateWriter(Box::new(settled.clone())))
        .unwrap();
    assert!(matches!(
        applied.effect,
        Effect::WriterChanged {
            epoch: 2,
            settled: true
        }
    ));
    // r1 no longer owns the writes.
    let err = w.run(transfer("shop/ledger", "r1", None)).unwrap_err();
    assert!(err.to_string().contains("owned by region r2"), "{err}");

    let snap = w.cat.export();
    assert_eq!(snap.writers.len(), 1);
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded, snap);
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.writer(&policy_key("shop/ledger")), Some(settled));
}

#[test]
fn a_forced_transfer_is_committed_by_another_region_and_wins_when_the_owner_returns() {
    // r2, the owner r1 cut off: forced.
    let mut p = params();
    p.region = label("r2");
    let mut r2 = World::new();
    r2.cat = Catalog::new(p);
    let replicated = Box::new(RemotePolicy {
        policy: single_writer("shop/ledger"),
        home_revision: Revision(3),
        home_set_at_ms: 5,
    });
    r2.run(Command::ReplicatePolicy(replicated)).unwrap();
    let err = r2.run(transfer("shop/ledger", "r2", None)).unwrap_err();
    assert!(err.to_string().contains("--force --reason"), "{err}");
    r2.run(transfer("shop/ledger", "r2", Some("r1 cut off")))
        .unwrap();
    let forced = r2.cat.writer(&policy_key("shop/ledger")).unwrap();
    assert_eq!((forced.epoch, forced.settled), (2, true));
    let audit = crate::audit::AuditEntry::describe(
        &Envelope {
            at_ms: 9,
            actor: forced.by.clone(),
            command: transfer("shop/ledger", "r2", Some("r1 cut off")),
        },
        &Applied {
            revision: Some(Revision(9)),
            effect: Effect::WriterChanged {
                epoch: 2,
                settled: true,
            },
            services: Vec::new(),
        },
    )
    .unwrap();
    assert!(audit.detail.contains("FORCED"), "{}", audit.detail);

    // r1 meanwhile moved the writes to r3 on its own (epoch 2, moving);
    // when the bridges meet, the forced epoch wins in r1 and never goes
    // back.
    let mut r1 = World::new();
    r1.run(Command::SetPolicy(Box::new(single_writer("shop/ledger"))))
        .unwrap();
    r1.run(transfer("shop/ledger", "r3", None)).unwrap();
    r1.run(Command::ReplicateWriter(Box::new(forced.clone())))
        .unwrap();
    assert_eq!(
        r1.cat.writer(&policy_key("shop/ledger")),
        Some(forced.clone())
    );
    let own = r1.cat.writer(&policy_key("shop/ledger")).unwrap();
    let mut stale = own.clone();
    stale.epoch = 1;
    let unchanged = r1.run(Command::ReplicateWriter(Box::new(stale))).unwrap();
    assert_eq!(unchanged.effect, Effect::Unchanged);
}
