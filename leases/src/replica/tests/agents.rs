//! `AwaitPropagation` on this replica and the others, stepped.

use super::*;

/// A leader with sessions `agents` (nodes a1, a2, …) following `web`,
/// where an instance is registered at the returned revision.
fn following(agents: &[AgentId]) -> (Step, Revision) {
    let mut s = Step::new(0);
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
