//! `AwaitPropagation` on this replica and the others, and the bounds per
//! identity on subscriptions and waits (issue 38, item 5), stepped.

use super::*;
use crate::protocol::ServiceUpdate;

/// A leader with sessions `agents` (nodes a1, a2, …) following `web`,
/// where an instance is registered at the returned revision.
fn following(agents: &[AgentId]) -> (Step, Revision) {
    following_with(agents, config(0))
}

/// As `following`, the machine with `config`.
fn following_with(agents: &[AgentId], config: ArbiterConfig) -> (Step, Revision) {
    let mut s = Step::with(config);
    s.lease("n0", "z1", 0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    let registration = crate::command::Registration {
        instance_id: InstanceId::new("web-1").expect("valid"),
        service: web(),
        node: node("n0"),
        epoch: AgentEpoch(1),
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 80,
        zone: None,
        version: Version::new("v1").expect("valid"),
        weight: Weight::DEFAULT,
        labels: Vec::new(),
        initial: State::Ready,
    };
    let register = Envelope {
        at_ms: 0,
        actor: crate::leader::agent_principal(&node("n0")),
        command: Command::Register(registration),
    };
    s.replicate(&[register]);
    let revision = s.cat.revision();
    for &agent in agents {
        s.session(agent, &format!("a{agent}"), "z1");
        s.input(Input::Session {
            agent,
            msg: SessionUp::Subscribe {
                service: web(),
                shard: s.cat.params().shard,
                have: None,
            },
        });
    }
    (s, revision)
}

fn ack(agent: AgentId, revision: Revision) -> Input {
    Input::Session {
        agent,
        msg: SessionUp::Ack {
            service: web(),
            revision,
        },
    }
}

fn await_propagation(agent: AgentId, revision: Revision, reply: ReplyId) -> Input {
    Input::Request {
        agent,
        request: Request::AwaitPropagation {
            service: web(),
            revision,
            timeout_ms: 5_000,
        },
        reply,
    }
}

#[test]
fn await_propagation_is_answered_on_the_last_ack() {
    let (mut s, revision) = following(&[1, 2]);
    let out = s.wake(1_000, vec![await_propagation(1, revision, 7)]);
    assert!(answer(&out, 7).is_none());
    let out = s.wake(1_100, vec![ack(1, revision)]);
    assert!(answer(&out, 7).is_none(), "one of two acknowledged");
    let out = s.wake(1_200, vec![ack(2, revision)]);
    assert_eq!(
        answer(&out, 7),
        Some(&Response::Propagated { acked: 2, total: 2 })
    );
}

#[test]
fn await_propagation_is_answered_at_the_deadline_with_the_other_replicas_sums() {
    let (mut s, revision) = following(&[1, 2]);
    let mut group = view(true, None, Some(0));
    group.others = vec![(3, "other:7000".into())];
    s.wake(900, vec![Input::Raft(group)]);
    let out = s.wake(
        1_000,
        vec![await_propagation(1, revision, 7), ack(1, revision)],
    );
    let wait = match out
        .iter()
        .find(|o| matches!(o, Output::AskPropagation { .. }))
    {
        Some(Output::AskPropagation { wait, to, .. }) => {
            assert_eq!(to, &["other:7000".to_owned()]);
            *wait
        }
        _ => panic!("expected the other replica asked: {out:?}"),
    };
    let out = s.input(Input::Propagated {
        wait,
        acked: 3,
        total: 3,
    });
    assert!(
        answer(&out, 7).is_none(),
        "this replica's agents are not all there"
    );
    let out = s.wake(5_999, Vec::new());
    assert!(answer(&out, 7).is_none());
    let out = s.wake(6_000, Vec::new());
    assert_eq!(
        answer(&out, 7),
        Some(&Response::Propagated { acked: 4, total: 5 })
    );
}

fn subscribe(agent: AgentId, service: &str) -> Input {
    Input::Session {
        agent,
        msg: SessionUp::Subscribe {
            service: ServiceKey::new("default", service, "default").expect("valid"),
            shard: crate::ShardId(0),
            have: None,
        },
    }
}

fn denied(out: &[Output], agent: AgentId) -> Vec<(String, String)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send {
                agent: a,
                message: SessionDown::Update(updates),
                ..
            } if *a == agent => Some(updates),
            _ => None,
        })
        .flatten()
        .filter_map(|u| match u {
            ServiceUpdate::Denied { service, reason } => {
                Some((service.to_string(), reason.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_session_follows_at_most_subscriptions_per_session_services() {
    let mut config = config(0);
    config.limits.subscriptions_per_session = 2;
    // Session 1 follows `web` (one of its two).
    let (mut s, _) = following_with(&[1, 2], config);
    let out = s.wake(1_000, vec![subscribe(1, "api")]);
    assert!(denied(&out, 1).is_empty(), "the second is within the bound");
    let out = s.wake(1_100, vec![subscribe(1, "db")]);
    let refused = denied(&out, 1);
    assert_eq!(refused.len(), 1, "{out:?}");
    assert!(
        refused[0]
            .1
            .contains("limits.subscriptions_per_session = 2"),
        "{refused:?}"
    );
    assert_eq!(s.m.counters().subscriptions_refused, 1);
    assert_eq!(s.m.counters().refusals.get("watch"), Some(&1));
    // Nothing was stored for it, and following one already followed
    // again is no new subscription.
    assert!(!s
        .m
        .distributor()
        .subscriptions(1)
        .any(|k| k.to_string().contains("db")));
    let out = s.wake(1_200, vec![subscribe(1, "api")]);
    assert!(denied(&out, 1).is_empty());
    // Another session has its own bound.
    let out = s.wake(1_300, vec![subscribe(2, "db")]);
    assert!(denied(&out, 2).is_empty());
}

#[test]
fn an_identity_holds_at_most_propagation_waits_per_identity_open() {
    let mut config = config(0);
    config.limits.propagation_waits_per_identity = 1;
    let (mut s, revision) = following_with(&[1, 2], config);
    // Agent 2 has not acknowledged: agent 1's first wait stays open.
    let out = s.wake(1_000, vec![await_propagation(1, revision, 7)]);
    assert!(answer(&out, 7).is_none());
    let out = s.wake(1_100, vec![await_propagation(1, revision, 8)]);
    let refused = unavailable(answer(&out, 8));
    assert!(
        refused.contains("limits.propagation_waits_per_identity"),
        "{refused}"
    );
    assert_eq!(s.m.counters().propagation_waits_refused, 1);
    // Another identity is not held back by it.
    let out = s.wake(1_200, vec![await_propagation(2, revision, 9)]);
    assert!(answer(&out, 9).is_none());
    // Once the first is answered, the identity may wait again.
    let out = s.wake(1_300, vec![ack(2, revision), ack(1, revision)]);
    assert_eq!(
        answer(&out, 7),
        Some(&Response::Propagated { acked: 2, total: 2 })
    );
    let out = s.wake(1_400, vec![await_propagation(1, revision, 10)]);
    assert_eq!(
        answer(&out, 10),
        Some(&Response::Propagated { acked: 2, total: 2 })
    );
}

/// The writer epochs in the regions messages `out` sends `agent`.
fn writer_epochs(out: &[Output], agent: AgentId) -> Vec<(u64, bool)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send {
                agent: a,
                message: SessionDown::RegionsWithWriters(_, writers),
                ..
            } if *a == agent => Some(writers.iter().map(|w| (w.epoch, w.settled))),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_policy_or_writer_change_reaches_the_followers_at_once() {
    let (mut s, _) = following(&[1]);
    let mut doc = rollcall_config::ServicePolicy::new("default/web", "r1");
    doc.cross_region = true;
    doc.failover_traffic = rollcall_config::TrafficClass::All;
    doc.failover_order = vec!["r2".into()];
    doc.single_writer = Some(rollcall_config::SingleWriter {
        owner: "r1".into(),
        transfer_to: None,
    });
    let policy = crate::policy::Policy::new(doc).expect("valid");
    let at = |at_ms, command| Envelope {
        at_ms,
        actor: operator(),
        command,
    };
    s.wake(10, Vec::new());
    s.replicate(&[at(20, Command::SetPolicy(Box::new(policy)))]);
    // 20 ms in, far from the regions interval: sent with this wake-up.
    let out = s.wake(20, Vec::new());
    assert_eq!(writer_epochs(&out, 1), [(1, true)], "{out:?}");
    let transfer = crate::writer::Transfer {
        service: "default/web".parse().expect("valid"),
        to: zone("r2"),
        forced: None,
    };
    s.replicate(&[at(30, Command::TransferWriter(Box::new(transfer)))]);
    let out = s.wake(30, Vec::new());
    assert_eq!(writer_epochs(&out, 1), [(2, false)], "{out:?}");
    // Nothing changed since: nothing more before the interval.
    let out = s.wake(40, Vec::new());
    assert!(writer_epochs(&out, 1).is_empty(), "{out:?}");
}
