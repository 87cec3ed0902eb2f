//! The arbiter link, following, health and gossip stepped by hand.

use super::*;

#[test]
fn a_refused_renewal_re_registers_and_re_sends_health() {
    let mut h = Harness::new();
    let (session, out) = h.connect();
    let (plan, _) = only_request(&out);
    h.answer(plan, Ok(Response::Instances(Vec::new())));
    register_committed(&mut h, "web-1", true);
    // Its readiness probe passes: READY is sent.
    let mut probed = false;
    for _ in 0..200 {
        let at = h.now + 50;
        let out = h.tick_at(at);
        if let Some((instance, generation, task)) = out.iter().find_map(|o| match o {
            Output::Probe {
                instance,
                generation,
                task,
            } => Some((instance.clone(), *generation, task.clone())),
            _ => None,
        }) {
            let out = h.feed(Input::Probed {
                instance,
                generation,
                which: task.which,
                passed: true,
                detail: "connected".into(),
            });
            let (request, body) = only_request(&out);
            assert!(matches!(
                body,
                Request::Transition {
                    to: State::Ready,
                    ..
                }
            ));
            h.answer(request, Ok(committed(None)));
            probed = true;
            break;
        }
    }
    assert!(probed, "the readiness probe never ran");
    // The arbiter refuses the session (its lease ended, say by a down
    // verdict while the node was away).
    let out = h.feed(Input::Message {
        session,
        message: SessionDown::Refused {
            reason: "lease 1 ended".into(),
        },
    });
    assert!(out.iter().any(|o| matches!(o, Output::Close { .. })));
    assert!(!h.state.is_connected());
    // It reconnects: the catalog has only an expired record, so the agent
    // registers again (new generation), then sends its READY verdict.
    let out = h.connect_listing(vec![listed("web-1", 1, State::Expired)]);
    let (request, body) = only_request(&out);
    assert!(matches!(body, Request::Register(_)), "{body:?}");
    let out = h.answer(request, Ok(committed(Some(2))));
    let (_, body) = only_request(&out);
    assert!(
        matches!(
            &body,
            Request::Transition {
                instance_id,
                generation: Generation(2),
                to: State::Ready,
                ..
            } if *instance_id == id("web-1")
        ),
        "{body:?}"
    );
}

/// Issue 37, item 4: `gossip: null` in `/v1/status` means gossip is off;
/// a zone's lone member (gossip on, no peer heard of) shows empty lists.
#[test]
fn status_tells_gossip_off_from_gossip_alone() {
    let off = Harness::new();
    assert_eq!(off.state.status(off.now).gossip, None);
    let mut alone = Harness::with(|c| c.gossip.key_file = Some("zone.key".into()));
    let status = alone.state.status(alone.now).gossip.expect("gossip is on");
    assert!(status.alive.is_empty() && status.down.is_empty());
    let n2 = NodeId::new("n2").unwrap();
    alone.feed(Input::PeerUp { node: n2.clone() });
    let status = alone.state.status(alone.now).gossip.unwrap();
    assert_eq!(status.alive, vec![n2]);
}

#[test]
fn a_gossip_down_node_stays_out_until_the_arbiter_answers() {
    let mut h = Harness::new();
    let n2 = NodeId::new("n2").unwrap();
    let out = h.connect_listing(Vec::new());
    assert!(requests(&out).is_empty());
    let out = h.feed(Input::PeerDown {
        node: n2.clone(),
        epoch: AgentEpoch(3),
    });
    assert!(
        down_published(&h.log).contains(&n2),
        "out of routing at once"
    );
    let (request, body) = only_request(&out);
    assert_eq!(
        body,
        Request::ReportDown {
            node: n2.clone(),
            epoch: AgentEpoch(3),
        }
    );
    // Time passes; still out while the report is unanswered.
    h.tick_at(h.now + 5_000);
    assert!(down_published(&h.log).contains(&n2));
    // The arbiter still hears n2 (a partition inside the zone): from now on
    // the catalog decides.
    h.answer(
        request,
        Ok(Response::Rejected {
            kind: RejectKind::Invalid,
            message: "n2's session is not silent".into(),
        }),
    );
    assert!(!down_published(&h.log).contains(&n2));
    // Cut off from the arbiter, the agent trusts its own gossip again.
    let session = h.state.link.up_session().unwrap();
    h.feed(Input::SessionEnded {
        session,
        reason: "cut".into(),
    });
    assert!(down_published(&h.log).contains(&n2));
    // And after the next reconnect it is reported again and stays out until
    // that answer.
    let (_, out) = h.connect();
    let (plan, _) = only_request(&out);
    assert!(down_published(&h.log).contains(&n2));
    let out = h.answer(plan, Ok(Response::Instances(Vec::new())));
    let (request, body) = only_request(&out);
    assert!(matches!(body, Request::ReportDown { .. }));
    // Committed: the verdict reaches the view in the catalog's next delta,
    // which may come after this answer; until gossip sees n2 again it
    // stays out (routing it in between was a crash's late return).
    h.answer(request, Ok(committed(None)));
    assert!(down_published(&h.log).contains(&n2));
    h.tick_at(h.now + 5_000);
    assert!(down_published(&h.log).contains(&n2));
    h.feed(Input::PeerUp { node: n2.clone() });
    assert!(!down_published(&h.log).contains(&n2));
}

#[test]
fn retry_later_waits_with_jitter_then_subscribes_again() {
    let mut h = Harness::new();
    let (session, _) = h.connect();
    h.feed(Input::Follow(svc()));
    h.feed(Input::Message {
        session,
        message: SessionDown::Update(vec![ServiceUpdate::RetryAfter {
            service: svc(),
            ms: 1_000,
        }]),
    });
    let subscribes = |out: &[Output]| {
        out.iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Send {
                        message: SessionUp::Subscribe { .. },
                        ..
                    }
                )
            })
            .count()
    };
    let out = h.tick_at(h.now + 999);
    assert_eq!(subscribes(&out), 0, "not before the arbiter's wait");
    let out = h.tick_at(h.now + 1_001);
    assert_eq!(subscribes(&out), 1, "within the wait plus its jitter");
}

#[test]
fn every_checker_is_probed_when_due_and_the_wake_up_is_the_first_due_check() {
    let mut h = Harness::new();
    let (session, _) = h.connect();
    let _ = session;
    for i in 0..5 {
        register_committed(&mut h, &format!("web-{i}"), true);
    }
    let mut probes: BTreeMap<InstanceId, u32> = BTreeMap::new();
    let mut wake = None;
    let start = h.now;
    // Follow the agent's own wake-ups for 20 s, answering every probe.
    for _ in 0..10_000 {
        let at = wake.take().unwrap_or(h.now + 1);
        if at > start + 20_000 {
            break;
        }
        let out = h.tick_at(at.max(h.now));
        let mut answers = Vec::new();
        for o in &out {
            match o {
                Output::Probe {
                    instance,
                    generation,
                    task,
                } => {
                    *probes.entry(instance.clone()).or_default() += 1;
                    answers.push(Input::Probed {
                        instance: instance.clone(),
                        generation: *generation,
                        which: task.which,
                        passed: true,
                        detail: String::new(),
                    });
                }
                Output::WakeAt(at) => wake = Some(*at),
                _ => {}
            }
        }
        for input in answers {
            for o in h.feed(input) {
                if let Output::WakeAt(at) = o {
                    wake = Some(at);
                }
            }
        }
        if wake.is_none() {
            wake = h.state.next_wake();
        }
        assert_eq!(
            h.state.health.next_due_ms(),
            h.state
                .health
                .checkers
                .iter()
                .filter_map(|(_, (_, c))| c.next_due_ms())
                .min(),
        );
    }
    assert_eq!(probes.len(), 5, "every instance was probed: {probes:?}");
    for (instance, n) in &probes {
        // The default readiness interval is 10 s or shorter: at least two
        // rounds in 20 s, each instance on its own schedule.
        assert!(*n >= 2, "{instance} probed {n} times in 20 s");
    }
}

/// The `SessionUp::Witnessed` messages sent in `out`.
fn witnessed(out: &[Output]) -> Vec<SessionUp> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send { message, .. } if matches!(message, SessionUp::Witnessed { .. }) => {
                Some(message.clone())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_witness_answers_with_its_gossip_and_its_connects() {
    let mut h = Harness::new();
    let (n2, n3) = (NodeId::new("n2").unwrap(), NodeId::new("n3").unwrap());
    let (session, _) = h.connect();
    h.feed(Input::PeerUp { node: n2.clone() });
    // Asked about n2 with addresses: the driver connects first.
    let addr: std::net::SocketAddr = "10.0.0.2:9000".parse().unwrap();
    let out = h.feed(Input::Message {
        session,
        message: SessionDown::Witness {
            node: n2.clone(),
            epoch: AgentEpoch(3),
            addresses: vec![addr],
        },
    });
    assert!(witnessed(&out).is_empty());
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Witness { addresses, .. } if addresses == &[addr])));
    let out = h.feed(Input::Reached {
        node: n2.clone(),
        epoch: AgentEpoch(3),
        reachable: false,
    });
    assert_eq!(
        witnessed(&out),
        [SessionUp::Witnessed {
            node: n2.clone(),
            epoch: AgentEpoch(3),
            gossip: Some(true),
            reachable: Some(false),
        }]
    );
    // Without addresses it answers at once; a node its gossip does not know
    // gets no gossip opinion, one it holds down gets `false`.
    let ask = |node: &NodeId| Input::Message {
        session,
        message: SessionDown::Witness {
            node: node.clone(),
            epoch: AgentEpoch(1),
            addresses: Vec::new(),
        },
    };
    let out = h.feed(ask(&n3));
    assert!(matches!(
        witnessed(&out).as_slice(),
        [SessionUp::Witnessed {
            gossip: None,
            reachable: None,
            ..
        }]
    ));
    h.feed(Input::PeerDown {
        node: n3.clone(),
        epoch: AgentEpoch(1),
    });
    let out = h.feed(ask(&n3));
    assert!(matches!(
        witnessed(&out).as_slice(),
        [SessionUp::Witnessed {
            gossip: Some(false),
            ..
        }]
    ));
    // A question naming too many addresses is not answered.
    let out = h.feed(Input::Message {
        session,
        message: SessionDown::Witness {
            node: n2,
            epoch: AgentEpoch(3),
            addresses: vec![addr; MAX_WITNESS_ADDRESSES + 1],
        },
    });
    assert!(witnessed(&out).is_empty());
    assert!(!out.iter().any(|o| matches!(o, Output::Witness { .. })));
}

#[test]
fn no_keep_alive_goes_on_a_timer_and_a_probe_is_answered_at_once() {
    let mut h = Harness::new();
    let (session, _) = h.connect();
    // A minute of ticks: renewals only (every third of the TTL), nothing
    // that would cost the arbiter a message per session per second.
    let mut sent = Vec::new();
    let start = h.now;
    for t in (0..60_000).step_by(250) {
        for o in h.tick_at(start + t) {
            if let Output::Send { message, .. } = o {
                sent.push(message);
            }
        }
    }
    assert!(!sent.is_empty(), "renewals go");
    assert!(
        sent.iter().all(|m| matches!(m, SessionUp::Renew)),
        "{sent:?}"
    );
    let out = h.feed(Input::Message {
        session,
        message: SessionDown::Probe { nonce: 42 },
    });
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Send {
            session: s,
            message: SessionUp::Alive { nonce: 42 },
        } if *s == session
    )));
}

#[test]
fn woken_only_when_it_asks_the_agent_still_renews_every_third_of_the_ttl() {
    let mut h = Harness::new();
    let (_, out) = h.connect();
    let wake = |out: &[Output]| {
        out.iter().rev().find_map(|o| match o {
            Output::WakeAt(at) => Some(*at),
            _ => None,
        })
    };
    let mut next = wake(&out).expect("a wake-up is asked for");
    let start = h.now;
    let mut renewals = 0;
    let mut early = true;
    while next < start + 60_000 {
        // A driver's timer may fire a millisecond early (its clock and the
        // machine's round differently): the machine must ask again.
        let out = h.tick_at(if std::mem::take(&mut early) {
            next - 1
        } else {
            next
        });
        renewals += out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Send {
                        message: SessionUp::Renew,
                        ..
                    }
                )
            })
            .count();
        next = wake(&out).unwrap_or_else(|| panic!("no wake-up asked for after {next}: {out:?}"));
    }
    // 60 s at a TTL of 10 s: one renewal every 3.0–3.3 s.
    assert!((18..=20).contains(&renewals), "{renewals} renewals");
}
