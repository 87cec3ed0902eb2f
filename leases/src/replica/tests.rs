//! Stepped tests of the replica machine: no sockets, no sleeps, no clock.
//! A `Step` holds one replica's machine and its applied catalog; what
//! openraft would do (commit a batch, replicate it here, elect a leader)
//! is done by hand. The tests are by part: `office`, `writes`,
//! `witnesses`, `agents`, `peers`.

use std::net::{IpAddr, Ipv4Addr};

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;
use crate::endpoint::{State, Weight};
use crate::ids::AgentEpoch;
use crate::name::{InstanceId, Label, Version};
use crate::params::CatalogParams;
use crate::protocol::RejectKind;
use crate::raft::AppliedMark;

mod agents;
mod office;
mod peers;
mod probes;
mod witnesses;
mod writes;

const TTL: u64 = 10_000;
const SWEEP: u64 = 250;
const SILENCE: u64 = 2_000;
const PROBE: u64 = 1_000;
const LEADER: (ReplicaId, &str) = (2, "leader:7000");

fn config(witness_wait_ms: u64) -> ArbiterConfig {
    let mut config = ArbiterConfig::default();
    config.lease.ttl_ms = TTL;
    config.lease.sweep_interval_ms = SWEEP;
    config.lease.silence_ms = SILENCE;
    config.lease.probe_timeout_ms = PROBE;
    config.lease.witness_wait_ms = witness_wait_ms;
    // No purge in these steps.
    config.store.purge_interval_ms = 3_600_000;
    config
}

fn node(n: &str) -> NodeId {
    NodeId::new(n).expect("valid")
}

fn zone(z: &str) -> Label {
    Label::new(z).expect("valid")
}

fn web() -> ServiceKey {
    ServiceKey::new("default", "web", "http").expect("valid")
}

fn operator() -> Principal {
    Principal {
        role: Role::Operator,
        name: PrincipalName::new("op").expect("valid"),
    }
}

fn view(
    leads: bool,
    leader: Option<(ReplicaId, &str)>,
    quorum_ack_ms_ago: Option<u64>,
) -> RaftView {
    RaftView {
        term: 1,
        leads,
        leader: leader.map(|(id, a)| (id, a.to_owned())),
        others: Vec::new(),
        quorum_ack_ms_ago,
    }
}

/// One replica: its machine, its applied catalog, the time.
struct Step {
    m: ReplicaState,
    cat: Catalog,
    now: u64,
    installs: u64,
    rng: StdRng,
}

impl Step {
    fn new(witness_wait_ms: u64) -> Step {
        Step::with(config(witness_wait_ms))
    }

    fn with(config: ArbiterConfig) -> Step {
        let cat = Catalog::new(CatalogParams::with_region(zone("r1")));
        let mark = mark(&cat, 0);
        let m = ReplicaState::new(config, 1, &cat, mark, 0);
        Step {
            m,
            cat,
            now: 0,
            installs: 0,
            rng: StdRng::seed_from_u64(7),
        }
    }

    fn input(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        self.m
            .handle(input, self.now, &mut self.rng, &self.cat, &mut out);
        out
    }

    /// `inputs` as one wake-up at `now`: each, then the `Tick`.
    fn wake(&mut self, now: u64, inputs: Vec<Input>) -> Vec<Output> {
        self.now = now;
        let mut out = Vec::new();
        for input in inputs {
            out.extend(self.input(input));
        }
        out.extend(self.input(Input::Tick));
        out
    }

    /// Applies `envelopes` to the catalog as openraft would on this
    /// replica, and tells the machine.
    fn replicate(
        &mut self,
        envelopes: &[Envelope],
    ) -> (Vec<Result<Applied, Rejection>>, Vec<Output>) {
        let results: Vec<_> = envelopes.iter().map(|e| self.cat.apply(e)).collect();
        let mark = mark(&self.cat, self.installs);
        let out = self.input(Input::Applied(mark));
        (results, out)
    }

    /// Commits a proposed batch: applied here, then its outcome.
    fn commit(&mut self, batch: BatchId, envelopes: &[Envelope]) -> Vec<Output> {
        let (results, mut out) = self.replicate(envelopes);
        out.extend(self.input(Input::Committed {
            batch,
            outcome: BatchOutcome::Applied(results),
        }));
        out
    }

    /// Grants `n` a lease of epoch 1 in `z` at `at_ms`, as committed
    /// earlier by some leader.
    fn lease(&mut self, n: &str, z: &str, at_ms: u64) {
        let envelope = Envelope {
            at_ms,
            actor: crate::leader::agent_principal(&node(n)),
            command: Command::GrantLease {
                node: node(n),
                epoch: AgentEpoch(1),
                zone: zone(z),
                ttl_ms: TTL,
            },
        };
        self.replicate(&[envelope]);
    }

    /// Connection `agent` of node `n` says Hello (epoch 1, zone `z`).
    fn hello(&mut self, agent: AgentId, n: &str, z: &str) -> Vec<Output> {
        let identity = Identity::new(
            zone("r1"),
            Role::Agent,
            PrincipalName::new(n).expect("valid"),
        );
        let connected = Input::Connected {
            agent,
            identity,
            certified: Vec::new(),
        };
        let hello = Input::Session {
            agent,
            msg: SessionUp::Hello {
                node: node(n),
                epoch: AgentEpoch(1),
                zone: zone(z),
                addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            },
        };
        let mut out = self.input(connected);
        out.extend(self.input(hello));
        out
    }

    /// A follower's session for `n` (zone z1) on connection `agent` at
    /// `now`: Hello, the grant handed to the leader, its commit answered
    /// and applied here, the Welcome out.
    fn follower_session(&mut self, now: u64, agent: AgentId, n: &str) {
        let out = self.wake(now, hello_inputs(agent, n));
        let Some(Output::Forward { forward, .. }) = out.first() else {
            panic!("expected the grant handed over, got {out:?}");
        };
        let out = self.input(Input::Forwarded {
            forward: *forward,
            outcome: Forwarded::Answer(Response::Committed {
                revision: Some(self.cat.revision()),
                generation: None,
                state: None,
            }),
        });
        assert!(welcomed(&out, agent), "welcomed: {out:?}");
    }

    /// A leader's session for `n` on connection `agent`: Hello, the grant
    /// committed, the Welcome out.
    fn session(&mut self, agent: AgentId, n: &str, z: &str) {
        let mut out = self.hello(agent, n, z);
        out.extend(self.input(Input::Tick));
        let (batch, envelopes) = proposed(&out)
            .into_iter()
            .next()
            .expect("the grant is proposed");
        let out = self.commit(batch, &envelopes);
        assert!(welcomed(&out, agent), "welcomed: {out:?}");
    }
}

fn mark(cat: &Catalog, installs: u64) -> AppliedMark {
    AppliedMark {
        last_applied: None,
        revision: cat.revision(),
        installs,
    }
}

fn proposed(out: &[Output]) -> Vec<(BatchId, Vec<Envelope>)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Propose { batch, envelopes } => Some((*batch, envelopes.clone())),
            _ => None,
        })
        .collect()
}

fn commands(out: &[Output]) -> Vec<&'static str> {
    out.iter()
        .filter_map(|o| match o {
            Output::Propose { envelopes, .. } => Some(envelopes.iter().map(|e| e.command.kind())),
            _ => None,
        })
        .flatten()
        .collect()
}

fn welcomed(out: &[Output], agent: AgentId) -> bool {
    out.iter().any(|o| {
        matches!(o, Output::Send { agent: a, message: SessionDown::Welcome { .. }, .. } if *a == agent)
    })
}

fn answer(out: &[Output], reply: ReplyId) -> Option<&Response> {
    out.iter().find_map(|o| match o {
        Output::Answer { reply: r, response } if *r == reply => Some(response),
        _ => None,
    })
}

fn unavailable(response: Option<&Response>) -> String {
    match response {
        Some(Response::Rejected {
            kind: RejectKind::Unavailable,
            message,
        }) => message.clone(),
        other => panic!("expected unavailable, got {other:?}"),
    }
}

/// Agent `reporter` reports `n` (run 1) down, answered as `reply`.
fn report_down(reporter: AgentId, n: &str, reply: ReplyId) -> Input {
    Input::Request {
        agent: reporter,
        request: Request::ReportDown {
            node: node(n),
            epoch: AgentEpoch(1),
        },
        reply,
    }
}

fn witness_asked(out: &[Output]) -> Vec<AgentId> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send {
                agent,
                message: SessionDown::Witness { .. },
                ..
            } => Some(*agent),
            _ => None,
        })
        .collect()
}

/// Sweeps from `from` to `to` (every sweep interval), collecting outputs.
fn sweeps(s: &mut Step, from: u64, to: u64) -> Vec<Output> {
    let mut out = Vec::new();
    let mut t = from;
    while t <= to {
        out.extend(s.wake(t, Vec::new()));
        t += SWEEP;
    }
    out
}

fn hello_inputs(agent: AgentId, n: &str) -> Vec<Input> {
    let identity = Identity::new(
        zone("r1"),
        Role::Agent,
        PrincipalName::new(n).expect("valid"),
    );
    vec![
        Input::Connected {
            agent,
            identity,
            certified: Vec::new(),
        },
        Input::Session {
            agent,
            msg: SessionUp::Hello {
                node: node(n),
                epoch: AgentEpoch(1),
                zone: zone("z1"),
                addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            },
        },
    ]
}
