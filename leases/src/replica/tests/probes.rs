//! Probes (R4): a gossip down report makes the replica holding the
//! node's session probe it; an answer is a partition, none within the
//! probe timeout is the arbiter's own signal. Stepped, on the leader and
//! on a follower.

use super::*;

/// When the reports come: half a TTL after taking office (a leader that
/// has led that long takes a node without a session as silent at once),
/// before any lease is due.
const AT: u64 = TTL / 2;

fn probed(out: &[Output]) -> Vec<AgentId> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send {
                agent,
                message: SessionDown::Probe { .. },
                ..
            } => Some(*agent),
            _ => None,
        })
        .collect()
}

fn alive(agent: AgentId) -> Input {
    Input::Session {
        agent,
        msg: SessionUp::Alive { nonce: 1 },
    }
}

/// A leader of one replica, in office since 0, with sessions for n1 (1)
/// and n2 (2).
fn leader() -> Step {
    let mut s = Step::new(0);
    let out = s.wake(0, vec![Input::Raft(view(true, None, Some(0)))]);
    let (batch, envelopes) = proposed(&out).remove(0);
    s.commit(batch, &envelopes);
    s.session(1, "n1", "z1");
    s.session(2, "n2", "z1");
    s
}

#[test]
fn a_down_report_probes_the_nodes_session_and_an_answer_is_a_partition() {
    let mut s = leader();
    let out = s.wake(AT, vec![report_down(2, "n1", 9)]);
    assert_eq!(probed(&out), [1], "n1's own session is probed");
    assert!(answer(&out, 9).is_none(), "held for the answer");
    let mut out = s.wake(AT + 5, vec![alive(1)]);
    out.extend(sweeps(&mut s, AT + SWEEP, AT + PROBE + SWEEP));
    assert!(!commands(&out).contains(&"node-down"), "{out:?}");
    match answer(&out, 9) {
        Some(Response::Rejected { message, .. }) => {
            assert!(message.contains("partition"), "{message}")
        }
        other => panic!("expected the partition answer, got {other:?}"),
    }
}

#[test]
fn an_agent_from_before_probes_is_not_probed_and_its_keep_alive_answers() {
    let mut s = leader();
    let keepalive = || Input::Session {
        agent: 1,
        msg: SessionUp::Keepalive,
    };
    s.wake(AT - 100, vec![keepalive()]);
    let out = s.wake(AT, vec![report_down(2, "n1", 9)]);
    assert!(probed(&out).is_empty(), "it could not read one");
    let mut out = s.wake(AT + 400, vec![keepalive()]);
    out.extend(sweeps(&mut s, AT + 500, AT + PROBE + SWEEP));
    assert!(!commands(&out).contains(&"node-down"), "{out:?}");
    assert!(matches!(answer(&out, 9), Some(Response::Rejected { .. })));
}

#[test]
fn a_probe_unanswered_for_the_timeout_agrees_with_gossip() {
    let mut s = leader();
    let out = s.wake(AT, vec![report_down(2, "n1", 9)]);
    assert_eq!(probed(&out), [1]);
    let out = sweeps(&mut s, AT + SWEEP, AT + PROBE - 1);
    assert!(!commands(&out).contains(&"node-down"), "{out:?}");
    let out = sweeps(&mut s, AT + PROBE, AT + PROBE);
    assert_eq!(commands(&out), ["node-down"]);
}

#[test]
fn the_probe_deadline_is_decided_when_it_falls_not_at_the_next_sweep() {
    let mut s = leader();
    // Reported between two sweeps: its deadline is not a sweep's time.
    let at = AT + 10;
    s.wake(at, vec![report_down(2, "n1", 9)]);
    // Woken only when the machine asks to be.
    let mut t = at;
    let decided = loop {
        t = s.m.poll_timeout().max(t + 1);
        assert!(t <= at + PROBE + SWEEP, "never decided");
        if commands(&s.wake(t, Vec::new())).contains(&"node-down") {
            break t;
        }
    };
    assert_eq!(decided, at + PROBE, "at the deadline itself");
}

#[test]
fn a_closed_session_is_silence_at_once_in_a_group_of_one() {
    let mut s = leader();
    s.wake(AT, vec![report_down(2, "n1", 9)]);
    let out = s.wake(AT + 10, vec![Input::Closed { agent: 1 }]);
    assert_eq!(commands(&out), ["node-down"], "not after the probe timeout");
}

#[test]
fn a_node_without_a_session_is_silent_at_once_in_a_group_of_one() {
    let mut s = leader();
    s.lease("n3", "z1", 0);
    let out = s.wake(AT, vec![report_down(2, "n3", 10)]);
    assert!(probed(&out).is_empty());
    assert_eq!(commands(&out), ["node-down"]);
}

#[test]
fn a_follower_probes_what_the_leader_hands_it_and_reports_the_answer_at_once() {
    let mut s = Step::new(0);
    s.lease("n1", "z1", 0);
    s.wake(0, vec![Input::Raft(view(false, Some(LEADER), None))]);
    s.follower_session(10, 1, "n1");
    // Every sweep reports to the leader while sessions are here, heard or
    // not: the answers carry the probes.
    let out = s.wake(SWEEP, Vec::new());
    assert!(
        out.iter().any(|o| matches!(o, Output::ReportHeard { .. })),
        "{out:?}"
    );
    let handed = || Input::HeardAnswered {
        refused: Vec::new(),
        asks: Vec::new(),
        probes: vec![(node("n1"), AgentEpoch(1))],
    };
    let out = s.wake(SWEEP + 10, vec![handed()]);
    assert_eq!(probed(&out), [1]);
    let out = s.wake(SWEEP + 20, vec![handed()]);
    assert!(probed(&out).is_empty(), "probed once while it is open");
    // The answer goes to the leader in the same wake-up, not at a sweep.
    let out = s.wake(SWEEP + 30, vec![alive(1)]);
    let heard = out.iter().find_map(|o| match o {
        Output::ReportHeard { heard, .. } => Some(heard.clone()),
        _ => None,
    });
    let heard = heard.expect("reported at once");
    assert_eq!(heard.len(), 1);
    assert_eq!(heard[0].node, node("n1"));
}

#[test]
fn the_leader_hands_its_open_probes_to_the_followers_with_their_heard_answers() {
    let mut s = leader();
    s.wake(AT, vec![report_down(2, "n1", 9)]);
    let out = s.wake(
        AT + 100,
        vec![Input::Peer {
            request: PeerRequest::Heard(Vec::new()),
            reply: 4,
        }],
    );
    let probes = out.iter().find_map(|o| match o {
        Output::AnswerPeer {
            reply: 4,
            response: PeerResponse::HeardProbes { probes, .. },
        } => Some(probes.clone()),
        _ => None,
    });
    assert_eq!(probes, Some(vec![(node("n1"), AgentEpoch(1))]));
}
