//! Witness asks and answers, on the leader and on a follower, stepped.

use super::*;

/// A leader whose node n1 (zone z1) holds a lease and never speaks, while
/// n2 (z1, session 2) and n3 (z2, session 3) renew theirs until n1's TTL
/// has passed: both are asked about n1, once, and nothing expires yet.
fn n1_silent_and_its_witnesses_asked() -> Step {
    let mut s = Step::new(1_500);
    s.lease("n1", "z1", 0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    s.session(2, "n2", "z1");
    s.session(3, "n3", "z2");
    let mut asked = Vec::new();
    let mut t = SWEEP;
    while t <= TTL {
        let renewals = [2, 3]
            .map(|agent| Input::Session {
                agent,
                msg: SessionUp::Renew,
            })
            .into();
        let out = s.wake(t, renewals);
        assert!(
            commands(&out).is_empty(),
            "no expiry before the witnesses answer: {out:?}"
        );
        asked.extend(witness_asked(&out));
        t += SWEEP;
    }
    asked.sort_unstable();
    assert_eq!(asked, [2, 3], "both sides of the zone line are asked, once");
    s
}

/// Session `agent`'s witness answer: n1 is gone.
fn sees_n1_gone(agent: AgentId) -> Input {
    Input::Session {
        agent,
        msg: SessionUp::Witnessed {
            node: node("n1"),
            epoch: AgentEpoch(1),
            gossip: Some(false),
            reachable: Some(false),
        },
    }
}

#[test]
fn witnesses_are_asked_about_a_silent_lease_and_their_answers_confirm_it_down() {
    let mut s = n1_silent_and_its_witnesses_asked();
    let out = s.wake(TTL + 500, vec![sees_n1_gone(2), sees_n1_gone(3)]);
    assert_eq!(commands(&out), ["node-down"], "{out:?}");
}

#[test]
fn a_witness_that_reconnects_before_it_answers_is_still_heard() {
    let mut s = n1_silent_and_its_witnesses_asked();
    // Every session drops and comes back (a partition heals): n2 answers
    // on its new session, 12, as the agent does with a question it
    // carried over; n4, never asked, answers too.
    s.wake(TTL + 100, vec![Input::Closed { agent: 2 }]);
    s.session(12, "n2", "z1");
    s.session(14, "n4", "z1");
    let out = s.wake(TTL + 400, vec![sees_n1_gone(14)]);
    assert!(commands(&out).is_empty(), "n4 was not asked: {out:?}");
    assert_eq!(s.m.counters().witness_answers_unasked, 1);
    // The answers are weighed at the next sweep.
    let out = s.wake(TTL + 400 + SWEEP, vec![sees_n1_gone(12), sees_n1_gone(3)]);
    assert_eq!(commands(&out), ["node-down"], "{out:?}");
    // An answer counts once: n2 again is refused.
    s.wake(TTL + 500 + SWEEP, vec![sees_n1_gone(12)]);
    assert_eq!(s.m.counters().witness_answers_unasked, 2);
}

#[test]
fn a_follower_carries_the_leaders_asks_once_and_hands_its_witnesses_answers_over() {
    let mut s = Step::new(1_500);
    s.lease("n1", "z1", 0);
    s.lease("n2", "z1", 0);
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    // n2's session here: the leader commits its grant, this replica
    // applies it and welcomes the agent.
    s.follower_session(10, 2, "n2");
    let ask = crate::witness::ask(&s.cat, &node("n1"), AgentEpoch(1)).expect("n1 holds a lease");
    let heard = |asks: Vec<WitnessAsk>| Input::HeardAnswered {
        refused: Vec::new(),
        asks,
        probes: Vec::new(),
    };
    let out = s.wake(100, vec![heard(vec![ask.clone()])]);
    assert_eq!(witness_asked(&out), [2]);
    let out = s.wake(200, vec![heard(vec![ask])]);
    assert!(
        witness_asked(&out).is_empty(),
        "carried once while it is open"
    );
    let answer = Input::Session {
        agent: 2,
        msg: SessionUp::Witnessed {
            node: node("n1"),
            epoch: AgentEpoch(1),
            gossip: Some(true),
            reachable: None,
        },
    };
    let out = s.wake(300, vec![answer]);
    let told = out.iter().find_map(|o| match o {
        Output::Tell {
            to,
            request: PeerRequest::Witnessed(answers),
            ..
        } => Some((to.clone(), answers.clone())),
        _ => None,
    });
    let (to, answers) = told.expect("handed to the leader at the sweep");
    assert_eq!(to, LEADER.1);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].witness, node("n2"));
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::ReportHeard { heard, .. } if heard.len() == 1)));
}

fn witnessed(agent: AgentId, n: &str, reachable: bool) -> Input {
    Input::Session {
        agent,
        msg: SessionUp::Witnessed {
            node: node(n),
            epoch: AgentEpoch(1),
            gossip: None,
            reachable: Some(reachable),
        },
    }
}

/// A leader of one replica with witnesses on, in office since 0, with
/// sessions for n1 (1) and n2 (2) of z1 and n3 (3) of z2.
fn leader() -> Step {
    let mut s = Step::new(1_500);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    s.session(1, "n1", "z1");
    s.session(2, "n2", "z1");
    s.session(3, "n3", "z2");
    s
}

#[test]
fn a_witness_answer_nobody_asked_for_is_refused_counted_and_changes_nothing() {
    let mut s = leader();
    // n1 goes silent; n2 alone reports it, its witnesses are asked.
    let at = TTL / 2;
    s.wake(at, vec![report_down(2, "n1", 9)]);
    let out = sweeps(&mut s, at + SWEEP, at + PROBE);
    let mut asked = witness_asked(&out);
    asked.sort_unstable();
    assert_eq!(asked, [2, 3], "both sides, n1 itself never");
    // n3 answers twice: the second answer was not asked for. n1 answers
    // about itself unasked.
    // n3's first answer (alive) stands, at once: nothing is removed.
    let answered = s.wake(at + PROBE + 10, vec![witnessed(3, "n1", true)]);
    let mut out = s.wake(
        at + PROBE + 20,
        vec![witnessed(3, "n1", false), witnessed(1, "n1", false)],
    );
    assert_eq!(s.m.counters().witness_answers_unasked, 2);
    assert_eq!(s.m.counters().refusals.get("witness"), Some(&2));
    out.extend(sweeps(
        &mut s,
        at + PROBE + SWEEP,
        at + PROBE + 1_500 + SWEEP,
    ));
    assert!(!commands(&out).contains(&"node-down"), "{out:?}");
    match answer(&answered, 9) {
        Some(Response::Rejected { message, .. }) => {
            assert!(
                message.contains("alone") && message.contains("n3"),
                "{message}"
            )
        }
        other => panic!("expected the uncorroborated answer, got {other:?}"),
    }
    assert_eq!(s.m.counters().down_reports_uncorroborated, 1);
}

#[test]
fn a_single_report_is_acted_on_once_an_asked_witness_sees_the_node_gone() {
    let mut s = leader();
    let at = TTL / 2;
    s.wake(at, vec![report_down(2, "n1", 9)]);
    let out = sweeps(&mut s, at + SWEEP, at + PROBE);
    assert!(!commands(&out).contains(&"node-down"), "one more wanted");
    assert!(!witness_asked(&out).is_empty());
    // The reporter's own answer is no second opinion.
    let out = s.wake(at + PROBE + 10, vec![witnessed(2, "n1", false)]);
    assert!(!commands(&out).contains(&"node-down"), "{out:?}");
    let out = s.wake(at + PROBE + 20, vec![witnessed(3, "n1", false)]);
    assert_eq!(commands(&out), ["node-down"], "decided at the answer");
}

#[test]
fn a_down_report_about_a_node_of_another_zone_is_forbidden() {
    let mut s = leader();
    let out = s.wake(TTL / 2, vec![report_down(3, "n1", 9)]);
    match answer(&out, 9) {
        Some(Response::Rejected {
            kind: RejectKind::Forbidden,
            message,
        }) => assert!(
            message.contains("zone z2") && message.contains("zone z1"),
            "{message}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::Send {
                message: SessionDown::Probe { .. },
                ..
            }
        )),
        "nothing probed: {out:?}"
    );
    assert_eq!(s.m.counters().refusals.get("forbidden"), Some(&1));
}
