//! The agent's state machine stepped by hand: a manual clock, a seeded
//! rng, and the arbiter's answers written out by the test. Saves of the
//! registrations file complete at once unless a test says otherwise.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use rand::rngs::StdRng;
use rand::SeedableRng;
use rollcall_config::ChecksConfig;
use rollcall_leases::protocol::{
    NodeInstance, Request, ServiceUpdate, SessionDown, SessionUp, MAX_WITNESS_ADDRESSES,
};
use rollcall_leases::{
    Catalog, CatalogParams, Command, Envelope, LeaseId, Principal, PrincipalName, Reason,
    Registration, Role, ServiceKey, SinceAnswer,
};

use super::*;
use crate::api_types::{parse_json, RegisterRequest, ValidRegistration};
use crate::view::Status;

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
    let checks = if checks {
        r#", "checks": {"readiness": {"kind": "tcp"}}"#
    } else {
        ""
    };
    let body = format!(
        r#"{{"service": "web", "instance_id": "{instance}", "address": "10.0.0.1", "port": 8080{checks}}}"#
    );
    parse_json::<RegisterRequest>(body.as_bytes(), 64 * 1024)
        .unwrap()
        .validate(&ChecksConfig::default())
        .unwrap()
}

impl Harness {
    fn new() -> Harness {
        Harness::with(|_| {})
    }

    /// An agent whose config `tune` changed first.
    fn with(tune: impl FnOnce(&mut AgentConfig)) -> Harness {
        let mut config = AgentConfig {
            node_id: "n1".into(),
            arbiters: vec!["arbiter-1:7000".into()],
            ..AgentConfig::default()
        };
        tune(&mut config);
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
            self.state.health.checkers.indexed_exactly(),
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

fn reply_to(out: &[Output], call: CallId) -> Result<Reply, Refusal> {
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

mod link;
mod writes;
