//! The leader's memory, stepped by hand with a manual clock.

use super::*;
use crate::catalog::{Catalog, Effect};
use crate::params::CatalogParams;

const TTL: u64 = 10_000;
const PROBE: u64 = 1_000;

fn params() -> LeaderParams {
    LeaderParams {
        ttl_ms: TTL,
        probe_timeout_ms: PROBE,
        max_hold_ms: 60_000,
        purge_interval_ms: 30_000,
        // Silence alone expires (the witnesses' tests turn them on).
        witness_wait_ms: 0,
    }
}

const WAIT: u64 = 1_500;

/// A leader of `cat` in office since 0, asking witnesses for `WAIT`.
fn witnessing_leader(cat: &Catalog) -> LeaderMemory<u32> {
    let mut m = LeaderMemory::new(
        LeaderParams {
            witness_wait_ms: WAIT,
            ..params()
        },
        me(),
        0,
    );
    m.take_office(0, cat.leases());
    m
}

/// A leader asking witnesses, with `a` silent since office at 0 and
/// past its deadline at `TTL`: the first sweep there asks.
fn witnessing() -> (Catalog, LeaderMemory<u32>) {
    let cat = catalog(&["a", "b", "c", "d"]);
    let mut m = witnessing_leader(&cat);
    for n in ["b", "c", "d"] {
        let renew = m.renew(
            cat.leases(),
            &node(n),
            AgentEpoch(1),
            TTL - 1,
            &agent_principal(&node(n)),
        );
        assert!(renew.is_ok());
    }
    let sweep = m.sweep(TTL, cat.leases());
    assert_eq!(sweep.asks, [(node("a"), AgentEpoch(1))]);
    assert!(
        sweep.proposals.is_empty(),
        "no expiry before the witnesses answer"
    );
    (cat, m)
}

fn seen(gossip: Option<bool>, reachable: Option<bool>) -> Seen {
    Seen { gossip, reachable }
}

fn kinds(sweep: &Sweep<u32>) -> Vec<&'static str> {
    sweep.proposals.iter().map(|e| e.command.kind()).collect()
}

#[test]
fn witnesses_that_see_the_node_alive_hold_its_expiry_within_the_bound() {
    let (cat, mut m) = witnessing();
    m.witnessed(node("b"), &node("a"), AgentEpoch(1), seen(Some(true), None));
    m.witnessed(
        node("c"),
        &node("a"),
        AgentEpoch(1),
        seen(None, Some(false)),
    );
    let sweep = m.sweep(TTL + WAIT, cat.leases());
    assert!(sweep.proposals.is_empty(), "held: {:?}", kinds(&sweep));
    assert_eq!(sweep.held.len(), 1);
    assert_eq!(sweep.held[0].witnesses, [node("b")]);
    assert_eq!(m.held_alive(), 1);
    // Asked again every TTL, announced again only then.
    let sweep = m.sweep(2 * TTL, cat.leases());
    assert!(sweep.asks.contains(&(node("a"), AgentEpoch(1))));
    assert!(sweep.held.is_empty() && sweep.proposals.is_empty());
    m.witnessed(node("b"), &node("a"), AgentEpoch(1), seen(Some(true), None));
    assert!(m.sweep(2 * TTL + 100, cat.leases()).proposals.is_empty());
    // The bound: max_hold_ms after the deadline it expires anyway (b,
    // c and d, silent since and never witnessed, expire too).
    let before = m.sweep(TTL + 60_000 - 1, cat.leases());
    let a_expires = |sweep: &Sweep<u32>| {
        sweep.proposals.iter().any(
            |e| matches!(&e.command, Command::ExpireLease { node: n, .. } if n.as_str() == "a"),
        )
    };
    assert!(!a_expires(&before));
    assert!(a_expires(&m.sweep(TTL + 60_000, cat.leases())));
}

#[test]
fn witnesses_that_all_see_the_node_gone_confirm_it_down() {
    let (cat, mut m) = witnessing();
    // One is not enough: it waits for the others, then expires.
    m.witnessed(
        node("b"),
        &node("a"),
        AgentEpoch(1),
        seen(None, Some(false)),
    );
    assert!(m.sweep(TTL + 500, cat.leases()).proposals.is_empty());
    m.witnessed(
        node("c"),
        &node("a"),
        AgentEpoch(1),
        seen(Some(false), None),
    );
    // An answer about another epoch, or from the node itself, counts not.
    m.witnessed(node("d"), &node("a"), AgentEpoch(2), seen(None, Some(true)));
    m.witnessed(node("a"), &node("a"), AgentEpoch(1), seen(Some(true), None));
    let sweep = m.sweep(TTL + 600, cat.leases());
    match sweep.proposals.as_slice() {
        [Envelope {
            actor,
            command: Command::NodeDown {
                node: n, reporters, ..
            },
            ..
        }] => {
            assert_eq!(n, &node("a"));
            assert_eq!(reporters, &[node("b"), node("c")]);
            assert_eq!(actor, &agent_principal(&node("b")), "proposed as a witness");
        }
        other => panic!("expected a NodeDown, got {other:?}"),
    }
    // The verdict is a confirmed death for the data plane (a record
    // changed by another node's agent).
    let mut cat = cat;
    let applied = cat.apply(&sweep.proposals[0]).expect("applies");
    assert!(matches!(applied.effect, Effect::LeaseEnded { .. }));
}

#[test]
fn without_answers_the_lease_expires_after_the_wait_and_a_renewal_ends_the_question() {
    let (cat, mut m) = witnessing();
    assert!(m.sweep(TTL + WAIT - 1, cat.leases()).proposals.is_empty());
    assert_eq!(kinds(&m.sweep(TTL + WAIT, cat.leases())), ["expire-lease"]);
    // Its session speaking again settles it before any verdict.
    let (_, mut m2) = witnessing();
    m2.witnessed(
        node("b"),
        &node("a"),
        AgentEpoch(1),
        seen(None, Some(false)),
    );
    m2.heard(&node("a"), TTL + 100);
    let renew = m2.renew(
        cat.leases(),
        &node("a"),
        AgentEpoch(1),
        TTL + 100,
        &agent_principal(&node("a")),
    );
    assert!(renew.is_ok());
    m2.witnessed(
        node("c"),
        &node("a"),
        AgentEpoch(1),
        seen(None, Some(false)),
    );
    let sweep = m2.sweep(TTL + 600, cat.leases());
    assert!(sweep.proposals.is_empty() && sweep.asks.is_empty());
}

fn node(n: &str) -> NodeId {
    NodeId::new(n).expect("valid")
}

fn me() -> Principal {
    Principal {
        role: Role::Arbiter,
        name: PrincipalName::new("arbiter").expect("valid"),
    }
}

/// A catalog holding leases for `nodes` in zone z1, granted at 0.
fn catalog(nodes: &[&str]) -> Catalog {
    let mut cat = Catalog::new(CatalogParams::with_region(Label::new("r1").expect("valid")));
    for n in nodes {
        let env = Envelope {
            at_ms: 0,
            actor: agent_principal(&node(n)),
            command: Command::GrantLease {
                node: node(n),
                epoch: AgentEpoch(1),
                zone: Label::new("z1").expect("valid"),
                ttl_ms: TTL,
            },
        };
        cat.apply(&env).expect("granted");
    }
    cat
}

fn leader(cat: &mut Catalog, at: u64) -> LeaderMemory<u32> {
    let mut m = LeaderMemory::new(params(), me(), 0);
    m.take_office(at, cat.leases());
    m
}

fn report(m: &mut LeaderMemory<u32>, n: &str, now: u64, w: u32) -> Vec<Verdict<u32>> {
    report_as(m, n, now, false, w)
}

fn report_as(
    m: &mut LeaderMemory<u32>,
    n: &str,
    now: u64,
    sessionless: bool,
    w: u32,
) -> Vec<Verdict<u32>> {
    m.report_down(
        node("reporter"),
        agent_principal(&node("reporter")),
        node(n),
        AgentEpoch(1),
        now,
        sessionless,
        Some(w),
    )
}

#[test]
fn a_follower_decides_nothing() {
    let cat = catalog(&["a"]);
    let mut m: LeaderMemory<u32> = LeaderMemory::new(params(), me(), 0);
    assert!(report(&mut m, "a", 100_000, 1).is_empty());
    let sweep = m.sweep(200_000, cat.leases());
    assert!(sweep.verdicts.is_empty() && sweep.proposals.is_empty());
    assert_eq!(m.step_down().len(), 1, "the report is handed back");
}

#[test]
fn a_down_report_waits_for_the_probe_answer_for_the_probe_timeout() {
    let mut cat = catalog(&["a"]);
    let mut m = leader(&mut cat, 0);
    m.heard(&node("a"), 1_000);
    // Held while the probe may still be answered.
    assert!(report(&mut m, "a", 2_000, 7).is_empty());
    assert_eq!(m.held_downs(), 1);
    assert!(m.decide_downs(2_000 + PROBE - 1).is_empty());
    // A message heard before the report is no answer.
    m.heard(&node("a"), 1_999);
    let settled = m.decide_downs(2_000 + PROBE);
    match settled.as_slice() {
        [Verdict::Down { envelope, waiting }] => {
            assert!(
                matches!(&envelope.command, Command::NodeDown { node: n, .. } if n.as_str() == "a")
            );
            assert_eq!(waiting, &[7]);
        }
        other => panic!("expected one verdict, got {other:?}"),
    }
    assert_eq!(m.held_downs(), 0);
}

#[test]
fn hearing_the_node_after_the_report_is_a_partition() {
    let mut cat = catalog(&["a"]);
    let mut m = leader(&mut cat, 0);
    assert!(report(&mut m, "a", 2_000, 1).is_empty());
    assert!(report(&mut m, "a", 2_100, 2).is_empty());
    m.heard(&node("a"), 2_500);
    match m.decide_downs(9_000).as_slice() {
        [Verdict::Partition {
            waiting,
            heard_ago_ms,
            reporters,
            ..
        }] => {
            assert_eq!(waiting, &[1, 2]);
            assert_eq!(*heard_ago_ms, 6_500);
            assert_eq!(reporters.len(), 1, "one reporter counted once");
        }
        other => panic!("expected a partition, got {other:?}"),
    }
}

#[test]
fn a_new_leader_waits_the_probe_timeout_even_for_a_node_without_a_session() {
    let mut cat = catalog(&["a"]);
    // Never heard at all, and no session here, but the leader took
    // office at 50 s: the node may still be reconnecting.
    let mut m = leader(&mut cat, 50_000);
    assert!(report_as(&mut m, "a", 50_001, true, 1).is_empty());
    assert!(m.decide_downs(50_000 + PROBE).is_empty());
    assert_eq!(m.decide_downs(50_001 + PROBE).len(), 1);
    // And no lease is due before one TTL after taking office.
    let expiries = |p: Vec<Envelope>| {
        p.iter()
            .filter(|e| matches!(e.command, Command::ExpireLease { .. }))
            .count()
    };
    assert_eq!(expiries(m.sweep(59_999, cat.leases()).proposals), 0);
    assert_eq!(expiries(m.sweep(60_000, cat.leases()).proposals), 1);
}

#[test]
fn a_settled_leader_takes_a_node_without_a_session_as_silent_at_once() {
    let mut cat = catalog(&["a", "b"]);
    let mut m = leader(&mut cat, 0);
    match report_as(&mut m, "a", TTL / 2, true, 1).as_slice() {
        [Verdict::Down { .. }] => {}
        other => panic!("expected the verdict at once, got {other:?}"),
    }
    // A node with a session here waits for its probe.
    assert!(report_as(&mut m, "b", TTL / 2, false, 2).is_empty());
}

#[test]
fn one_expiry_per_lease_until_it_settles_with_the_zones_silent_count() {
    let mut cat = catalog(&["a", "b", "c"]);
    let mut m = leader(&mut cat, 0);
    // b renews; a and c stay silent.
    m.heard(&node("b"), 9_000);
    let renewed = m.renew(
        cat.leases(),
        &node("b"),
        AgentEpoch(1),
        9_000,
        &agent_principal(&node("b")),
    );
    assert_eq!(renewed, Ok(None));
    let first = m.sweep(10_000, cat.leases()).proposals;
    let expiries: Vec<(String, u32)> = first
        .iter()
        .filter_map(|e| match &e.command {
            Command::ExpireLease {
                node,
                silent_in_zone,
                ..
            } => Some((node.as_str().to_owned(), *silent_in_zone)),
            _ => None,
        })
        .collect();
    assert_eq!(expiries, vec![("a".into(), 2), ("c".into(), 2)]);
    // In flight: not proposed again before a TTL has passed.
    assert!(m.sweep(11_000, cat.leases()).proposals.is_empty());
    // Settled (say, refused): proposed again at the next sweep.
    m.settled(&first[0].command);
    assert_eq!(m.sweep(12_000, cat.leases()).proposals.len(), 1);
    // Losing office forgets what was in flight.
    m.step_down();
    assert!(m.sweep(13_000, cat.leases()).proposals.is_empty());
}

#[test]
fn renewing_a_held_lease_reinstates_it_and_a_wrong_epoch_is_refused() {
    let mut cat = catalog(&["a", "b"]);
    let mut m = leader(&mut cat, 0);
    // The guard holds both expiries (every lease of the zone silent).
    for env in m.sweep(10_000, cat.leases()).proposals {
        let applied = cat.apply(&env).expect("applied");
        if matches!(env.command, Command::ExpireLease { .. }) {
            assert_eq!(applied.effect, Effect::ExpiryHeld);
        }
        m.settled(&env.command);
    }
    let actor = agent_principal(&node("a"));
    let back = m
        .renew(cat.leases(), &node("a"), AgentEpoch(1), 11_000, &actor)
        .expect("renewed")
        .expect("a held lease is reinstated");
    assert!(matches!(back.command, Command::GrantLease { ref zone, .. } if zone.as_str() == "z1"));
    let wrong = m.renew(cat.leases(), &node("a"), AgentEpoch(2), 11_000, &actor);
    assert!(matches!(wrong, Err(RenewError::OtherEpoch { .. })));
}

#[test]
fn purges_come_at_their_interval() {
    let mut cat = catalog(&[]);
    let mut m = leader(&mut cat, 0);
    assert!(m.sweep(29_999, cat.leases()).proposals.is_empty());
    let p = m.sweep(30_000, cat.leases()).proposals;
    assert!(matches!(p.as_slice(), [e] if e.command == Command::Purge));
    assert!(m.sweep(31_000, cat.leases()).proposals.is_empty());
}

/// A leader with witnesses on (`witness_wait_ms` = `WAIT`), `a` reported
/// down at 2 s by `reporter` alone and silent past its probe: its
/// witnesses are asked, once, and nothing is proposed yet.
fn single_report() -> LeaderMemory<u32> {
    let cat = catalog(&["a", "b", "c"]);
    let mut m = witnessing_leader(&cat);
    assert!(report(&mut m, "a", 2_000, 7).is_empty());
    assert!(m.decide_downs(2_000 + PROBE).is_empty(), "one more wanted");
    assert_eq!(m.take_down_asks(), [(node("a"), AgentEpoch(1))]);
    assert!(m.decide_downs(2_000 + PROBE + 1).is_empty());
    assert!(m.take_down_asks().is_empty(), "asked once");
    assert_eq!(m.next_down_deadline(), Some(2_000 + PROBE + WAIT));
    m
}

#[test]
fn a_single_reporters_verdict_is_proposed_once_a_witness_sees_the_node_gone() {
    let mut m = single_report();
    // The reporter itself is no second opinion, nor the node.
    assert!(m.witnessed(
        node("reporter"),
        &node("a"),
        AgentEpoch(1),
        seen(Some(false), None)
    ));
    m.witnessed(
        node("a"),
        &node("a"),
        AgentEpoch(1),
        seen(Some(false), None),
    );
    // An answer about another run of the node is not this one's.
    assert!(!m.witnessed(
        node("b"),
        &node("a"),
        AgentEpoch(2),
        seen(Some(false), None)
    ));
    assert!(m.decide_downs(3_100).is_empty());
    assert!(m.witnessed(
        node("b"),
        &node("a"),
        AgentEpoch(1),
        seen(None, Some(false))
    ));
    match m.decide_downs(3_100).as_slice() {
        [Verdict::Down { envelope, waiting }] => {
            match &envelope.command {
                Command::NodeDown { reporters, .. } => {
                    assert_eq!(reporters, &[node("reporter"), node("b")]);
                }
                other => panic!("expected NodeDown, got {other:?}"),
            }
            assert_eq!(waiting, &[7]);
        }
        other => panic!("expected the verdict, got {other:?}"),
    }
}

#[test]
fn a_single_reporters_verdict_that_a_witness_sees_alive_removes_nothing() {
    let mut m = single_report();
    m.witnessed(
        node("b"),
        &node("a"),
        AgentEpoch(1),
        seen(None, Some(false)),
    );
    m.witnessed(node("c"), &node("a"), AgentEpoch(1), seen(None, Some(true)));
    match m.decide_downs(3_100).as_slice() {
        [Verdict::Uncorroborated {
            reporter, alive, ..
        }] => {
            assert_eq!(reporter, &node("reporter"));
            assert_eq!(alive, &[node("c")]);
        }
        other => panic!("expected no verdict, got {other:?}"),
    }
    assert_eq!(m.held_downs(), 0);
}

/// Nobody left to ask (most of a zone died together: the survivor is
/// the one reporter and the only witness) is no veto.
#[test]
fn a_single_reporters_verdict_nobody_answers_is_acted_on_after_the_wait() {
    let mut m = single_report();
    // The reporter's own answer is no veto either way.
    m.witnessed(
        node("reporter"),
        &node("a"),
        AgentEpoch(1),
        seen(Some(true), None),
    );
    assert!(m.decide_downs(2_000 + PROBE + WAIT - 1).is_empty());
    match m.decide_downs(2_000 + PROBE + WAIT).as_slice() {
        [Verdict::Down { envelope, waiting }] => {
            assert!(
                matches!(&envelope.command, Command::NodeDown { reporters, .. } if reporters == &[node("reporter")])
            );
            assert_eq!(waiting, &[7]);
        }
        other => panic!("expected the verdict, got {other:?}"),
    }
}

#[test]
fn a_second_reporter_settles_a_verdict_waiting_for_witnesses() {
    let mut m = single_report();
    let verdicts = m.report_down(
        node("b"),
        agent_principal(&node("b")),
        node("a"),
        AgentEpoch(1),
        3_050,
        false,
        Some(8),
    );
    match verdicts.as_slice() {
        [Verdict::Down { waiting, .. }] => assert_eq!(waiting, &[7, 8]),
        other => panic!("expected the verdict at once, got {other:?}"),
    }
}

#[test]
fn a_sweep_asks_about_a_node_once_for_its_single_report_and_its_silent_lease() {
    let cat = catalog(&["a", "b"]);
    let mut m = witnessing_leader(&cat);
    let renew = m.renew(
        cat.leases(),
        &node("b"),
        AgentEpoch(1),
        TTL - 1,
        &agent_principal(&node("b")),
    );
    assert!(renew.is_ok());
    // `a`'s report passes its probe as its lease passes its deadline.
    assert!(report(&mut m, "a", TTL - PROBE, 1).is_empty());
    let sweep = m.sweep(TTL, cat.leases());
    assert_eq!(sweep.asks, [(node("a"), AgentEpoch(1))], "asked once");
    assert!(sweep.verdicts.is_empty() && sweep.proposals.is_empty());
}
