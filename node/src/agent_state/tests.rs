//! The agent's state machine stepped by hand: a manual clock, a seeded
//! rng, and the arbiter's answers written out by the test. Saves of the
//! registrations file complete at once unless a test says otherwise.

use std::net::{IpAddr, Ipv4Addr};

use rand::rngs::StdRng;
use rand::SeedableRng;
use rollcall_config::ChecksConfig;
use rollcall_leases::{
    Catalog, CatalogParams, Command, Envelope, Principal, PrincipalName, SinceAnswer,
};

use super::*;
use crate::api_types::RegisterRequest;

const START_MS: u64 = 1_000_000;

struct Harness {
    state: AgentState,
    now: u64,
    rng: StdRng,
    /// Every output so far, in order.
    log: Vec<Output>,
    /// The arbiter's catalog, for deltas.
    catalog: Catalog,
    next_call: CallId,
}

fn node() -> NodeId {
    NodeId::new("n1").unwrap()
}

fn svc() -> ServiceKey {
    ServiceKey::new("default", "web", "default").unwrap()
}

fn id(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}

fn registration(instance: &str, checks: bool) -> ValidRegistration {
    let mut body = serde_json::json!({
        "service": "web",
        "instance_id": instance,
        "address": "10.0.0.1",
        "port": 8080,
    });
    if checks {
        body["checks"] = serde_json::json!({"readiness": {"kind": "tcp"}});
    }
    serde_json::from_value::<RegisterRequest>(body)
        .unwrap()
        .validate(&ChecksConfig::default())
        .unwrap()
}

impl Harness {
    fn new() -> Harness {
        let config = AgentConfig {
            node_id: "n1".into(),
            arbiters: vec!["arbiter-1:7000".into()],
            ..AgentConfig::default()
        };
        let settings = Settings {
            node: node(),
            zone: Label::new("z1").unwrap(),
            epoch: AgentEpoch(7),
            started_ms: START_MS,
            config: Arc::new(config),
        };
        let mut rng = StdRng::seed_from_u64(7);
        let mut log = Vec::new();
        let state = AgentState::new(settings, Restored::default(), START_MS, &mut rng, &mut log);
        let mut catalog = Catalog::new(CatalogParams::with_region(Label::new("r1").unwrap()));
        catalog
            .apply(&Envelope {
                at_ms: START_MS,
                actor: Principal {
                    role: Role::Operator,
                    name: PrincipalName::new("t").unwrap(),
                },
                command: Command::GrantLease {
                    node: node(),
                    epoch: AgentEpoch(7),
                    zone: Label::new("z1").unwrap(),
                    ttl_ms: 10_000,
                },
            })
            .unwrap();
        Harness {
            state,
            now: START_MS,
            rng,
            log,
            catalog,
            next_call: 0,
        }
    }

    /// Feeds `input`; completes every save it asks for. Returns what it
    /// output (the saves' outputs included).
    fn feed(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        self.state.handle(input, self.now, &mut self.rng, &mut out);
        let mut i = 0;
        while i < out.len() {
            if let Output::SaveRegistrations { save, .. } = out[i] {
                let mut more = Vec::new();
                self.state.handle(
                    Input::Saved {
                        save,
                        result: Ok(()),
                    },
                    self.now,
                    &mut self.rng,
                    &mut more,
                );
                out.extend(more);
            }
            i += 1;
        }
        assert!(
            self.state.health.indexed_exactly(),
            "the checkers' due index drifted from their due times"
        );
        self.log.extend(out.iter().cloned());
        out
    }

    /// Moves the clock to `at` and ticks.
    fn tick_at(&mut self, at: u64) -> Vec<Output> {
        self.now = at;
        self.feed(Input::Tick)
    }

    /// Ticks until the agent asks for a session, and gives it one.
    fn connect(&mut self) -> (SessionId, Vec<Output>) {
        for _ in 0..1_000 {
            let at = self.now + 100;
            let out = self.tick_at(at);
            if let Some(session) = out.iter().find_map(|o| match o {
                Output::Connect { session, .. } => Some(*session),
                _ => None,
            }) {
                let out = self.feed(Input::Connected {
                    session,
                    lease: LeaseId(1),
                    ttl_ms: 10_000,
                    revision: self.catalog.revision(),
                    catalog: self.catalog.identity(),
                });
                return (session, out);
            }
        }
        panic!("the agent never asked to connect");
    }

    /// Connects and answers the reconcile plan's NodeInstances with
    /// `listed`; returns the outputs after that answer.
    fn connect_listing(&mut self, listed: Vec<NodeInstance>) -> Vec<Output> {
        let (_, out) = self.connect();
        let (request, body) = only_request(&out);
        assert_eq!(
            body,
            Request::NodeInstances,
            "the plan starts with the list"
        );
        self.answer(request, Ok(Response::Instances(listed)))
    }

    fn answer(&mut self, request: RequestId, result: Result<Response, String>) -> Vec<Output> {
        self.feed(Input::Answer { request, result })
    }

    fn call(&mut self, op: Call) -> (CallId, Vec<Output>) {
        self.next_call += 1;
        let call = self.next_call;
        (call, self.feed(Input::Call { call, op }))
    }

    /// Commits `command` in the test's catalog and delivers its deltas of
    /// web to the agent on `session`.
    fn commit(&mut self, session: SessionId, command: Command) {
        self.catalog
            .apply(&Envelope {
                at_ms: self.now,
                actor: Principal {
                    role: Role::Agent,
                    name: PrincipalName::new("n1").unwrap(),
                },
                command,
            })
            .unwrap();
        let held = self
            .state
            .view(&svc())
            .map_or(Revision(0), |v| v.revision());
        let SinceAnswer::Deltas(deltas) = self.catalog.changes_since(&svc(), held) else {
            panic!("the test catalog keeps every delta");
        };
        self.feed(Input::Message {
            session,
            message: SessionDown::Update(vec![ServiceUpdate::Deltas(deltas)]),
        });
    }
}

fn requests(out: &[Output]) -> Vec<(RequestId, Request)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Request { request, body, .. } => Some((*request, body.clone())),
            _ => None,
        })
        .collect()
}

fn only_request(out: &[Output]) -> (RequestId, Request) {
    let all = requests(out);
    assert_eq!(all.len(), 1, "one request expected: {all:?}");
    all.into_iter().next().unwrap()
}

fn reply_to(out: &[Output], call: CallId) -> Result<Reply, ApiError> {
    out.iter()
        .find_map(|o| match o {
            Output::Reply { call: c, reply } if *c == call => Some(reply.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("call {call} was not answered: {out:?}"))
}

fn committed(generation: Option<u64>) -> Response {
    Response::Committed {
        revision: Some(Revision(9)),
        generation: generation.map(Generation),
        state: Some(State::Ready),
    }
}

fn listed(instance: &str, generation: u64, state: State) -> NodeInstance {
    NodeInstance {
        service: svc(),
        instance_id: id(instance),
        generation: Generation(generation),
        state,
        reason: Reason::new("t").unwrap(),
        origin: Role::Agent,
    }
}

/// The last down set published.
fn down_published(log: &[Output]) -> BTreeSet<NodeId> {
    log.iter()
        .rev()
        .find_map(|o| match o {
            Output::PublishDown(nodes) => Some(nodes.clone()),
            _ => None,
        })
        .expect("a down set was published")
}

/// Registers `instance` while connected; the arbiter commits generation 1.
fn register_committed(h: &mut Harness, instance: &str, checks: bool) {
    let (call, out) = h.call(Call::Register {
        registration: registration(instance, checks),
        caller: Caller::Operator,
    });
    let (request, body) = only_request(&out);
    assert!(matches!(body, Request::Register(_)), "{body:?}");
    let out = h.answer(request, Ok(committed(Some(1))));
    assert!(matches!(
        reply_to(&out, call),
        Ok(Reply::Registered(WriteOutcome::Committed(_)))
    ));
}

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
        Ok(Reply::Registered(WriteOutcome::Pending(r))) => assert!(r.pending),
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
            reason: drain_reason(),
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
        assert_eq!(err.error, "stale_generation", "{err:?}");
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
    let session = h.state.up_session().unwrap();
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
    h.answer(request, Ok(committed(None)));
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
        Ok(Reply::Drained(WriteOutcome::Pending(d))) => assert!(d.pending),
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
