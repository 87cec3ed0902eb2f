//! Taking office, quorum loss and a leader change, stepped.

use super::*;

#[test]
fn taking_office_extends_every_lease_and_proposes_the_identity_once() {
    let mut s = Step::new(0);
    s.lease("n1", "z1", 0);
    // Elected long after n1 was last heard of: its lease would be due.
    let out = s.wake(50_000, vec![Input::Raft(view(true, None, Some(0)))]);
    assert!(s.m.leads());
    assert_eq!(
        s.m.deadline(&s.cat, &node("n1")),
        Some(60_000),
        "one TTL from taking office"
    );
    assert_eq!(commands(&out), ["identify"]);
    // Proposed once: not again while it is in flight, nor once committed.
    let (batch, envelopes) = proposed(&out).remove(0);
    let out = sweeps(&mut s, 50_250, 50_750);
    assert!(commands(&out).is_empty(), "{out:?}");
    s.commit(batch, &envelopes);
    assert!(s.cat.identity().is_some());
    let out = sweeps(&mut s, 51_000, 59_750);
    assert!(
        commands(&out).is_empty(),
        "nothing due before the grace ends: {out:?}"
    );
    let out = sweeps(&mut s, 60_000, 60_000);
    assert_eq!(commands(&out), ["expire-lease"]);
}

#[test]
fn an_identity_that_does_not_commit_is_proposed_again_after_a_second() {
    let mut s = Step::new(0);
    let out = s.wake(1_000, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, _) = proposed(&out).remove(0);
    let out = s.input(Input::Committed {
        batch,
        outcome: BatchOutcome::TimedOut,
    });
    assert!(out.is_empty());
    assert!(commands(&sweeps(&mut s, 1_250, 1_750)).is_empty());
    assert_eq!(commands(&sweeps(&mut s, 2_000, 2_000)), ["identify"]);
}

#[test]
fn without_a_quorum_writes_are_refused_and_reads_and_sessions_still_served() {
    let mut s = Step::new(0);
    s.lease("n9", "z1", 0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    s.session(1, "n1", "z1");
    // The quorum is gone for longer than the silence window.
    let lost = view(true, None, Some(SILENCE + 1));
    s.wake(1_000, vec![Input::Raft(lost)]);
    assert_eq!(s.m.quorum_lost_at(), Some(1_000));
    // n9's lease passes its deadline: nothing expires meanwhile.
    let out = sweeps(&mut s, 1_250, 30_000);
    assert!(commands(&out).is_empty(), "{out:?}");
    // A write is proposed and openraft cannot commit it.
    let leave = Input::Request {
        agent: 1,
        request: Request::Leave {
            epoch: AgentEpoch(1),
        },
        reply: 10,
    };
    let out = s.wake(30_100, vec![leave]);
    let (batch, _) = proposed(&out).remove(0);
    let out = s.input(Input::Committed {
        batch,
        outcome: BatchOutcome::TimedOut,
    });
    assert!(unavailable(answer(&out, 10)).contains("no quorum"));
    // Reads are answered from the applied catalog, sessions renew and
    // follow services.
    let list = Input::Request {
        agent: 1,
        request: Request::NodeInstances,
        reply: 11,
    };
    let renew = Input::Session {
        agent: 1,
        msg: SessionUp::Renew,
    };
    let follow = Input::Session {
        agent: 1,
        msg: SessionUp::Subscribe {
            service: web(),
            shard: s.cat.params().shard,
            have: None,
        },
    };
    let out = s.wake(30_200, vec![list, renew, follow]);
    assert!(
        matches!(answer(&out, 11), Some(Response::Instances(_))),
        "{out:?}"
    );
    assert!(
        out.iter().any(|o| matches!(
            o,
            Output::Send {
                agent: 1,
                message: SessionDown::Update(_),
                ..
            }
        )),
        "the followed service is sent: {out:?}"
    );
    assert!(!out.iter().any(|o| matches!(o, Output::Close { .. })));
    assert_eq!(s.m.counters().renewals, 1);
    // The quorum is back: every lease gets one TTL from now.
    s.wake(31_000, vec![Input::Raft(view(true, None, Some(0)))]);
    assert_eq!(s.m.quorum_lost_at(), None);
    assert_eq!(s.m.deadline(&s.cat, &node("n9")), Some(31_000 + TTL));
}

#[test]
fn a_session_silent_during_a_leader_change_is_not_expired_before_the_grace_ends() {
    let mut s = Step::new(0);
    s.lease("n1", "z1", 0);
    s.lease("n2", "z1", 0);
    // A follower of replica 2 hears n1 and n2 until 5 s; n1 falls silent
    // and replica 2 fails at 8 s; this replica is elected at 12 s, past
    // n1's deadline as the old leader counted it.
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    let out = s.wake(10, hello_inputs(1, "n1"));
    let Some(Output::Forward { forward, .. }) = out.first() else {
        panic!("expected the grant handed over, got {out:?}");
    };
    let forward = *forward;
    s.wake(8_000, vec![Input::Raft(view(false, None, None))]);
    // The grant in flight to the old leader is answered: retry.
    let refused = s.input(Input::Forwarded {
        forward,
        outcome: Forwarded::Answer(crate::answers::unavailable("late".into())),
    });
    assert!(
        refused.is_empty(),
        "answered when the leader moved, not again"
    );
    let out = s.wake(12_000, vec![Input::Raft(view(true, None, Some(0)))]);
    assert_eq!(commands(&out), ["identify"]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    // A down report for n1 right after the election waits for this
    // leader's probe of n1's session (not here: n1 may still be on its
    // way to this new leader) for the probe timeout.
    let identity = Identity::new(
        zone("r1"),
        Role::Agent,
        PrincipalName::new("n2").expect("valid"),
    );
    let mut inputs = vec![Input::Connected {
        agent: 2,
        identity,
        certified: Vec::new(),
    }];
    inputs.push(Input::Session {
        agent: 2,
        msg: SessionUp::Hello {
            node: node("n2"),
            epoch: AgentEpoch(1),
            zone: zone("z1"),
            addresses: Vec::new(),
        },
    });
    let out = s.wake(12_100, inputs);
    let (batch, envelopes) = proposed(&out).remove(0);
    assert!(welcomed(&s.commit(batch, &envelopes), 2));
    let report = Input::Request {
        agent: 2,
        request: Request::ReportDown {
            node: node("n1"),
            epoch: AgentEpoch(1),
        },
        reply: 9,
    };
    let out = s.wake(12_200, vec![report]);
    assert!(answer(&out, 9).is_none());
    let out = sweeps(&mut s, 12_250, 12_200 + PROBE - 1);
    assert!(!commands(&out).contains(&"node-down"), "{out:?}");
    let out = sweeps(&mut s, 12_200 + PROBE + 50, 12_200 + PROBE + 50);
    assert_eq!(commands(&out), ["node-down"]);
    // Without the report, no lease of the silent session expires before
    // one TTL after taking office.
    assert_eq!(s.m.deadline(&s.cat, &node("n1")), Some(12_000 + TTL));
}
