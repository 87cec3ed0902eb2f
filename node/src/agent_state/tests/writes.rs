//! Local writes stepped by hand: pending while away, replayed in order,
//! refused when stale, answered within their bound; and the property that
//! the live path and the replay send the same request for the same intent.

use super::*;

#[test]
fn a_reconnect_replays_pending_writes_in_order() {
    let mut h = Harness::new();
    // The arbiter is not reachable: the registration and then the drain are
    // accepted locally.
    let (call, out) = h.call(Call::Register {
        registration: registration("web-1", false),
        caller: Caller::Operator,
    });
    assert!(requests(&out).is_empty());
    match reply_to(&out, call) {
        Ok(Reply::Registered(WriteOutcome::Pending(r))) => assert_eq!(r.generation, None),
        other => panic!("{other:?}"),
    }
    let (call, out) = h.call(Call::Drain {
        instance: id("web-1"),
        generation: None,
        propagated: false,
        caller: Caller::Operator,
    });
    assert!(matches!(
        reply_to(&out, call),
        Ok(Reply::Drained(WriteOutcome::Pending(_)))
    ));
    assert_eq!(h.state.registrations().pending().len(), 1);

    // Back: the list, then the registration, then (once it has its
    // generation) the drain, each after the previous answer.
    let out = h.connect_listing(Vec::new());
    let (request, body) = only_request(&out);
    let Request::Register(reg) = body else {
        panic!("{body:?}")
    };
    assert_eq!(reg.instance_id, id("web-1"));
    let out = h.answer(request, Ok(committed(Some(1))));
    let (request, body) = only_request(&out);
    assert_eq!(
        body,
        Request::Transition {
            instance_id: id("web-1"),
            generation: Generation(1),
            to: State::Draining,
            reason: Reason::new("drain requested through the agent API").unwrap(),
        }
    );
    let out = h.answer(request, Ok(committed(None)));
    assert!(requests(&out).is_empty(), "nothing else is pending");
    assert!(h.state.registrations().pending().is_empty());
    // The drain window ends with the deregistration.
    let window = h.state.settings().config.drain.max_drain_ms;
    let out = h.tick_at(h.now + window);
    let (_, body) = only_request(&out);
    assert_eq!(
        body,
        Request::Deregister {
            instance_id: id("web-1"),
            generation: Generation(1),
        }
    );
}

#[test]
fn a_deregistration_of_a_record_already_gone_is_done_not_refused() {
    let mut h = with_instance(Asked::Deregister, "web-1", false, 1);
    let (call, out) = h.call(asked_call(Asked::Deregister, "web-1", false));
    let (request, _) = only_request(&out);
    let out = h.answer(
        request,
        Ok(Response::Rejected {
            kind: RejectKind::NotFound,
            message: "instance web-1 is not registered".into(),
        }),
    );
    assert_eq!(
        reply_to(&out, call),
        Ok(Reply::Deregistered(WriteOutcome::Committed(None)))
    );
    assert!(
        h.state.registrations().get(&id("web-1")).is_none(),
        "forgotten, not kept to be registered again"
    );
}

#[test]
fn a_stale_generation_is_refused_and_changes_nothing() {
    let mut h = Harness::new();
    h.connect_listing(Vec::new());
    register_committed(&mut h, "web-1", false);
    for op in [
        Call::Drain {
            instance: id("web-1"),
            generation: Some(2),
            propagated: false,
            caller: Caller::Operator,
        },
        Call::Deregister {
            instance: id("web-1"),
            generation: Some(2),
            caller: Caller::Operator,
        },
        Call::Heartbeat {
            instance: id("web-1"),
            generation: Some(2),
            caller: Caller::Operator,
        },
    ] {
        let (call, out) = h.call(op);
        let err = reply_to(&out, call).unwrap_err();
        assert_eq!(err.kind, Refused::StaleGeneration, "{err:?}");
        assert!(
            requests(&out).is_empty(),
            "a stale call reached the arbiter"
        );
        assert!(
            !out.iter()
                .any(|o| matches!(o, Output::SaveRegistrations { .. })),
            "a stale call changed the registrations"
        );
    }
    let local = h.state.registrations().get(&id("web-1")).unwrap();
    assert_eq!(local.intent, Intent::Serve);
    // A workload must name the generation at all.
    let (call, out) = h.call(Call::Drain {
        instance: id("web-1"),
        generation: None,
        propagated: false,
        caller: Caller::Workload { uid: 1, gid: 1 },
    });
    assert!(reply_to(&out, call).is_err());
}

#[test]
fn a_drain_while_disconnected_is_local_at_once_and_committed_later() {
    let mut h = Harness::new();
    let (session, _) = h.connect();
    // The plan's list is still out; answer it with nothing.
    let plan = requests(&h.log)
        .into_iter()
        .find(|(_, b)| *b == Request::NodeInstances)
        .unwrap();
    h.answer(plan.0, Ok(Response::Instances(Vec::new())));
    h.feed(Input::Follow(svc()));
    register_committed(&mut h, "web-1", false);
    h.commit(
        session,
        Command::Register(Registration {
            instance_id: id("web-1"),
            service: svc(),
            node: node(),
            epoch: AgentEpoch(7),
            address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            port: 8080,
            zone: None,
            version: rollcall_leases::Version::new("").unwrap(),
            weight: rollcall_leases::Weight::DEFAULT,
            labels: Vec::new(),
            initial: State::Ready,
        }),
    );
    h.now += 1_000;
    h.feed(Input::SessionEnded {
        session,
        reason: "cut".into(),
    });
    let (call, out) = h.call(Call::Drain {
        instance: id("web-1"),
        generation: Some(1),
        propagated: false,
        caller: Caller::Operator,
    });
    assert!(matches!(
        reply_to(&out, call),
        Ok(Reply::Drained(WriteOutcome::Pending(_)))
    ));
    // Out of this agent's data plane at once.
    let published = out
        .iter()
        .find_map(|o| match o {
            Output::Publish(p) if p.service == svc() => Some(p.clone()),
            _ => None,
        })
        .expect("web published again");
    assert_eq!(published.status, Status::Held);
    assert!(published.leaving.contains(&id("web-1")));
    assert!(!published.synced, "cut off: stale");
    // Committed when the arbiter is back.
    let out = h.connect_listing(vec![listed("web-1", 1, State::Ready)]);
    let (request, body) = only_request(&out);
    assert!(matches!(
        body,
        Request::Transition {
            to: State::Draining,
            generation: Generation(1),
            ..
        }
    ));
    h.answer(request, Ok(committed(None)));
    assert!(h.state.registrations().get(&id("web-1")).unwrap().committed);
}

#[test]
fn a_write_the_arbiter_does_not_answer_in_time_is_answered_as_pending_once() {
    let mut h = Harness::new();
    let out = h.connect_listing(Vec::new());
    assert!(requests(&out).is_empty());
    register_committed(&mut h, "a", false);
    // The drain goes out; the arbiter (a replica QUIC has not yet noticed
    // is dead, a group without quorum) does not answer.
    let (call, out) = h.call(Call::Drain {
        instance: id("a"),
        generation: Some(1),
        propagated: false,
        caller: Caller::Operator,
    });
    let (request, _) = only_request(&out);
    assert!(
        !h.log
            .iter()
            .any(|o| matches!(o, Output::Reply { call: c, .. } if *c == call)),
        "not answered yet"
    );
    let bound = h.state.settings.config.write_answer_ms;
    let out = h.tick_at(h.now + bound - 1);
    assert!(!out.iter().any(|o| matches!(o, Output::Reply { .. })));
    let out = h.tick_at(h.now + 1);
    match reply_to(&out, call) {
        Ok(Reply::Drained(WriteOutcome::Pending(d))) => assert_eq!(d.revision, None),
        other => panic!("expected a pending answer, got {other:?}"),
    }
    // The commit comes later: recorded, not answered a second time.
    let out = h.answer(request, Ok(committed(None)));
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::Reply { call: c, .. } if *c == call)),
        "{out:?}"
    );
}

/// What a local instance's life asks of the arbiter, as a call.
#[derive(Clone, Copy, Debug)]
enum Asked {
    Register,
    Drain,
    Deregister,
}

fn asked_call(asked: Asked, instance: &str, checks: bool) -> Call {
    match asked {
        Asked::Register => Call::Register {
            registration: registration(instance, checks),
            caller: Caller::Operator,
        },
        Asked::Drain => Call::Drain {
            instance: id(instance),
            generation: None,
            propagated: false,
            caller: Caller::Operator,
        },
        Asked::Deregister => Call::Deregister {
            instance: id(instance),
            generation: None,
            caller: Caller::Operator,
        },
    }
}

/// A connected agent with `instance` registered at `generation` (unless
/// the call is the registration itself).
fn with_instance(asked: Asked, instance: &str, checks: bool, generation: u64) -> Harness {
    let mut h = Harness::new();
    h.connect_listing(Vec::new());
    if !matches!(asked, Asked::Register) {
        let (_, out) = h.call(asked_call(Asked::Register, instance, checks));
        let (request, _) = only_request(&out);
        h.answer(request, Ok(committed(Some(generation))));
    }
    h
}

/// The request the live path sends for the call.
fn live_request(asked: Asked, instance: &str, checks: bool, generation: u64) -> Request {
    let mut h = with_instance(asked, instance, checks, generation);
    let (_, out) = h.call(asked_call(asked, instance, checks));
    only_request(&out).1
}

/// The request the replay sends for the same call made while the arbiter
/// was away.
fn replayed_request(asked: Asked, instance: &str, checks: bool, generation: u64) -> Request {
    let mut h = with_instance(asked, instance, checks, generation);
    let session = h.state.link.up_session().expect("connected");
    h.feed(Input::SessionEnded {
        session,
        reason: "cut".into(),
    });
    let (_, out) = h.call(asked_call(asked, instance, checks));
    assert!(requests(&out).is_empty(), "nothing is sent while away");
    let listed = match asked {
        Asked::Register => Vec::new(),
        Asked::Drain | Asked::Deregister => vec![listed(instance, generation, State::Ready)],
    };
    let out = h.connect_listing(listed);
    only_request(&out).1
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    #[test]
    fn the_live_path_and_the_replay_send_the_same_request(
        asked in proptest::sample::select(vec![Asked::Register, Asked::Drain, Asked::Deregister]),
        instance in "[a-z][a-z0-9-]{0,20}",
        checks: bool,
        generation in 1u64..1_000_000,
    ) {
        let live = live_request(asked, &instance, checks, generation);
        let replayed = replayed_request(asked, &instance, checks, generation);
        proptest::prop_assert_eq!(live, replayed);
    }
}

/// The drain window's deregistration is the request a replayed departure
/// sends.
#[test]
fn the_drain_windows_deregistration_is_the_replayed_one() {
    let mut h = with_instance(Asked::Drain, "web-1", false, 3);
    let (_, out) = h.call(asked_call(Asked::Drain, "web-1", false));
    let (request, _) = only_request(&out);
    h.answer(request, Ok(committed(None)));
    let window = h.state.settings().config.drain.max_drain_ms;
    let out = h.tick_at(h.now + window);
    let (_, live) = only_request(&out);
    assert_eq!(live, replayed_request(Asked::Deregister, "web-1", false, 3));
}
