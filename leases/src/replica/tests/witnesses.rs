//! Witness asks and answers, on the leader and on a follower, stepped.

use super::*;

#[test]
fn witnesses_are_asked_about_a_silent_lease_and_their_answers_confirm_it_down() {
    let mut s = Step::new(1_500);
    s.lease("n1", "z1", 0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    s.session(2, "n2", "z1");
    s.session(3, "n3", "z2");
    // n2 and n3 keep talking; n1 never does.
    let mut asked = Vec::new();
    let mut t = SWEEP;
    while t <= TTL {
        let keepalives = [2, 3]
            .map(|agent| Input::Session {
                agent,
                msg: SessionUp::Renew,
            })
            .into();
        let out = s.wake(t, keepalives);
        assert!(
            commands(&out).is_empty(),
            "no expiry before the witnesses answer: {out:?}"
        );
        asked.extend(witness_asked(&out));
        t += SWEEP;
    }
    asked.sort_unstable();
    assert_eq!(asked, [2, 3], "both sides of the zone line are asked, once");
    let seen_gone = |agent| Input::Session {
        agent,
        msg: SessionUp::Witnessed {
            node: node("n1"),
            epoch: AgentEpoch(1),
            gossip: Some(false),
            reachable: Some(false),
        },
    };
    let out = s.wake(TTL + 500, vec![seen_gone(2), seen_gone(3)]);
    assert_eq!(commands(&out), ["node-down"], "{out:?}");
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
