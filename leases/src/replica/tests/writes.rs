//! Writes handed to the leader and their answers, stepped.

use super::*;

#[test]
fn a_follower_hands_a_wake_ups_writes_over_and_answers_each_once_applied_here() {
    let mut s = Step::new(0);
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    // Two agents say Hello in one wake-up: one request to the leader.
    let mut inputs = Vec::new();
    for (agent, n) in [(1, "n1"), (2, "n2")] {
        let identity = Identity::new(
            zone("r1"),
            Role::Agent,
            PrincipalName::new(n).expect("valid"),
        );
        inputs.push(Input::Connected {
            agent,
            identity,
            certified: Vec::new(),
        });
        inputs.push(Input::Session {
            agent,
            msg: SessionUp::Hello {
                node: node(n),
                epoch: AgentEpoch(1),
                zone: zone("z1"),
                addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            },
        });
    }
    let out = s.wake(100, inputs);
    let (forward, envelopes) = match out.as_slice() {
        [Output::Forward {
            forward,
            to,
            request: PeerRequest::ProposeBatch(envelopes),
            ..
        }] => {
            assert_eq!(to, LEADER.1);
            (*forward, envelopes.clone())
        }
        other => panic!("expected one ProposeBatch, got {other:?}"),
    };
    assert_eq!(envelopes.len(), 2);
    // The leader committed both (revisions 1 and 2); this replica has
    // applied neither yet: no Welcome.
    let committed = |r: u64| Response::Committed {
        revision: Some(Revision(r)),
        generation: None,
        state: None,
    };
    let out = s.input(Input::Forwarded {
        forward,
        outcome: Forwarded::Answers(vec![committed(1), committed(2)]),
    });
    assert!(out.is_empty(), "held until applied here: {out:?}");
    // Revision 1 arrives: the first is answered, the second still held.
    let (_, out) = s.replicate(&envelopes[..1]);
    assert!(welcomed(&out, 1) && !welcomed(&out, 2), "{out:?}");
    let (_, out) = s.replicate(&envelopes[1..]);
    assert!(welcomed(&out, 2), "{out:?}");
}

#[test]
fn a_follower_lagging_past_the_write_timeout_answers_what_the_leader_committed() {
    let mut s = Step::new(0);
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    let write = Input::Write {
        actor: operator(),
        command: Command::Purge,
        reply: 5,
    };
    let out = s.wake(100, vec![write]);
    let Some(Output::Forward { forward, .. }) = out.first() else {
        panic!("expected a Propose handed over, got {out:?}");
    };
    let committed = Response::Committed {
        revision: Some(Revision(1)),
        generation: None,
        state: None,
    };
    let out = s.input(Input::Forwarded {
        forward: *forward,
        outcome: Forwarded::Answer(committed.clone()),
    });
    assert!(out.is_empty());
    let out = sweeps(&mut s, 250, 3_000);
    assert!(answer(&out, 5).is_none());
    let out = sweeps(&mut s, 3_250, 3_250);
    assert_eq!(answer(&out, 5), Some(&committed));
}

#[test]
fn without_a_leader_a_follower_keeps_writes_until_one_is_known_or_the_wait_ends() {
    let mut s = Step::new(0);
    s.wake(0, vec![Input::Raft(view(false, None, None))]);
    let write = |reply| Input::Write {
        actor: operator(),
        command: Command::Purge,
        reply,
    };
    assert!(s.wake(100, vec![write(1)]).is_empty());
    // A leader is elected: the write goes to it.
    let out = s.wake(500, vec![Input::Raft(view(false, Some(LEADER), None))]);
    assert!(
        matches!(
            out.as_slice(),
            [Output::Forward {
                request: PeerRequest::Propose(_),
                ..
            }]
        ),
        "{out:?}"
    );
    // Elections again: a second write waits, then is refused.
    s.wake(600, vec![Input::Raft(view(false, None, None))]);
    assert!(s.wake(700, vec![write(2)]).is_empty());
    assert!(s.m.poll_timeout() <= 700 + 4_000);
    let out = s.wake(700 + 4_000, Vec::new());
    assert!(unavailable(answer(&out, 2)).contains("no leader"));
}

#[test]
fn a_forward_in_flight_when_the_leader_moves_is_answered_retry() {
    let mut s = Step::new(0);
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    let write = Input::Write {
        actor: operator(),
        command: Command::Purge,
        reply: 4,
    };
    let out = s.wake(100, vec![write]);
    assert!(matches!(out.as_slice(), [Output::Forward { .. }]));
    let out = s.wake(
        200,
        vec![Input::Raft(view(false, Some((3, "new:7000")), None))],
    );
    assert!(unavailable(answer(&out, 4)).contains("leadership moved away from replica 2"));
}

#[test]
fn stopping_refuses_new_writes_and_ends_once_the_batches_in_flight_are_answered() {
    let mut s = Step::new(0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    let write = Input::Write {
        actor: operator(),
        command: Command::Purge,
        reply: 3,
    };
    let out = s.wake(100, vec![Input::Stop, write]);
    assert!(unavailable(answer(&out, 3)).contains("shutting down"));
    assert!(
        !out.iter().any(|o| matches!(o, Output::Stopped)),
        "a batch is in flight"
    );
    let mut out = s.commit(batch, &envelopes);
    out.extend(s.input(Input::Tick));
    assert!(out.iter().any(|o| matches!(o, Output::Stopped)), "{out:?}");
}
