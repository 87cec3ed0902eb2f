//! What the leader answers other replicas, stepped.

use super::*;

#[test]
fn a_followers_batch_joins_the_group_commit_and_is_answered_in_order() {
    let mut s = Step::new(0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (identify, envelopes) = proposed(&out).remove(0);
    s.commit(identify, &envelopes);
    // The second write is refused by the catalog: a lease for a node with
    // a TTL out of range.
    let grant = |n: &str, ttl_ms| Envelope {
        at_ms: 10,
        actor: crate::leader::agent_principal(&node(n)),
        command: Command::GrantLease {
            node: node(n),
            epoch: AgentEpoch(1),
            zone: zone("z1"),
            ttl_ms,
        },
    };
    let batch = Input::Peer {
        request: PeerRequest::ProposeBatch(vec![grant("n1", TTL), grant("n2", 1)]),
        reply: 21,
    };
    let out = s.wake(100, vec![batch]);
    let (batch, envelopes) = proposed(&out).remove(0);
    assert_eq!(envelopes.len(), 2, "one batch for both");
    let out = s.commit(batch, &envelopes);
    match out.as_slice() {
        [Output::AnswerPeer {
            reply: 21,
            response: PeerResponse::Answers(answers),
        }] => {
            assert!(
                matches!(answers[0], Response::Committed { .. }),
                "{answers:?}"
            );
            assert!(
                matches!(answers[1], Response::Rejected { .. }),
                "{answers:?}"
            );
        }
        other => panic!("expected the two answers in order, got {other:?}"),
    }
}

/// Issue 38, item 4: a follower's forwarded writes are checked again by
/// the leader against the actor they name: an agent proposes only its own
/// node's lease and records, and no catalog-wide command at all.
#[test]
fn the_leader_refuses_forwarded_writes_their_actor_may_not_make() {
    let mut s = Step::new(0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (identify, envelopes) = proposed(&out).remove(0);
    s.commit(identify, &envelopes);
    let by_n1 = |command| Envelope {
        at_ms: 10,
        actor: crate::leader::agent_principal(&node("n1")),
        command,
    };
    let grant = |n: &str| Command::GrantLease {
        node: node(n),
        epoch: AgentEpoch(1),
        zone: zone("z1"),
        ttl_ms: TTL,
    };
    let batch = Input::Peer {
        request: PeerRequest::ProposeBatch(vec![
            by_n1(grant("n1")),
            by_n1(grant("n2")),
            by_n1(Command::Purge),
        ]),
        reply: 31,
    };
    let out = s.wake(100, vec![batch]);
    let (batch, envelopes) = proposed(&out).remove(0);
    assert_eq!(envelopes.len(), 1, "only n1's own grant is proposed");
    let out = s.commit(batch, &envelopes);
    match out.as_slice() {
        [Output::AnswerPeer {
            reply: 31,
            response: PeerResponse::Answers(answers),
        }] => {
            assert!(
                matches!(answers[0], Response::Committed { .. }),
                "{answers:?}"
            );
            for (answer, rule) in answers[1..].iter().zip([
                "holds only its own node's lease, not node n2's",
                "the agent role may not propose it",
            ]) {
                match answer {
                    Response::Rejected {
                        kind: RejectKind::Forbidden,
                        message,
                    } => assert!(
                        message.contains("agent:n1") && message.contains(rule),
                        "{message}"
                    ),
                    other => panic!("expected a refusal, got {other:?}"),
                }
            }
        }
        other => panic!("expected the three answers in order, got {other:?}"),
    }
    // A lone forwarded write is answered at once, nothing proposed.
    let out = s.input(Input::Peer {
        request: PeerRequest::Propose(by_n1(Command::RevokeLease {
            node: node("n2"),
            epoch: AgentEpoch(1),
        })),
        reply: 32,
    });
    assert!(proposed(&out).is_empty(), "{out:?}");
    assert!(
        matches!(
            out.as_slice(),
            [Output::AnswerPeer {
                reply: 32,
                response: PeerResponse::Answer(Response::Rejected {
                    kind: RejectKind::Forbidden,
                    ..
                })
            }]
        ),
        "{out:?}"
    );
}

#[test]
fn a_followers_heard_report_renews_on_the_leader_and_is_answered_with_the_open_asks() {
    let mut s = Step::new(1_500);
    s.lease("n1", "z1", 0);
    s.lease("n2", "z1", 0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    // n2 is heard and renews on a follower; n1 is silent and past its
    // deadline, so the leader has an ask open.
    let heard = |at: u64, epoch| Input::Peer {
        request: PeerRequest::Heard(vec![Heard {
            node: node("n2"),
            epoch: AgentEpoch(epoch),
            ago_ms: 100,
            renewed: true,
        }]),
        reply: at,
    };
    let out = s.wake(9_000, vec![heard(1, 1)]);
    assert!(
        matches!(
            out.as_slice(),
            [Output::AnswerPeer { reply: 1, response: PeerResponse::Refused(r) }] if r.is_empty()
        ),
        "{out:?}"
    );
    assert_eq!(s.m.deadline(&s.cat, &node("n2")), Some(8_900 + TTL));
    sweeps(&mut s, 9_250, TTL);
    let out = s.wake(TTL + 100, vec![heard(2, 2)]);
    match out.as_slice() {
        [Output::AnswerPeer {
            reply: 2,
            response: PeerResponse::HeardAsks { refused, asks },
        }] => {
            assert_eq!(refused.len(), 1, "another agent run's renewal is refused");
            assert_eq!(refused[0].0, node("n2"));
            assert_eq!(asks.len(), 1);
            assert_eq!(asks[0].node, node("n1"));
        }
        other => panic!("expected the refusal and the open ask, got {other:?}"),
    }
}

#[test]
fn a_follower_refuses_what_only_the_leader_takes_and_names_the_leader() {
    let mut s = Step::new(0);
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    let out = s.input(Input::Peer {
        request: PeerRequest::Propose(Envelope {
            at_ms: 0,
            actor: operator(),
            command: Command::Purge,
        }),
        reply: 8,
    });
    match out.as_slice() {
        [Output::AnswerPeer {
            reply: 8,
            response: PeerResponse::Answer(answer),
        }] => assert!(unavailable(Some(answer)).contains(LEADER.1)),
        other => panic!("expected a refusal naming the leader, got {other:?}"),
    }
}
