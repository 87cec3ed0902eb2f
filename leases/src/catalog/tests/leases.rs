//! Leases, down verdicts and the mass-expiry guard (split from the
//! catalog's tests along their seam).

use super::*;

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
fn down_verdicts_count_in_the_guards_window_but_are_never_held() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 10);
    // A rack of three dies: its verdicts all commit (two signals agree).
    for n in 0..3 {
        let applied = w
            .run(Command::NodeDown {
                node: node(&format!("z1-n{n}")),
                epoch: AgentEpoch(1),
                reporters: vec![node("z1-n9")],
            })
            .unwrap();
        assert!(matches!(applied.effect, Effect::LeaseEnded { marked: 1 }));
    }
    // A fourth lease expiring within the window is one past the 30 %
    // share the verdicts used up: held.
    let applied = w
        .run(Command::ExpireLease {
            node: node("z1-n3"),
            epoch: AgentEpoch(1),
            silent_in_zone: 1,
        })
        .unwrap();
    assert_eq!(applied.effect, Effect::ExpiryHeld);
    // And a fourth verdict still commits.
    let applied = w
        .run(Command::NodeDown {
            node: node("z1-n4"),
            epoch: AgentEpoch(1),
            reporters: vec![node("z1-n9")],
        })
        .unwrap();
    assert!(matches!(applied.effect, Effect::LeaseEnded { marked: 1 }));
}
