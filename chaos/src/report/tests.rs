//! The report's tests: leaves, crashes, phases, samples, view dips and
//! convergence; the judges' in `judges`, the written files' in `output`.

use super::*;

mod judges;
mod output;

fn conn(t_ms: u64, agent: &str, backend: Option<&str>) -> Conn {
    Conn {
        t_ms,
        agent: agent.to_owned(),
        outcome: if backend.is_some() {
            Outcome::Answered
        } else {
            Outcome::Failed
        },
        backend: backend.map(str::to_owned),
    }
}

fn ok(t_ms: u64, agent: &str, backend: &str) -> Conn {
    conn(t_ms, agent, Some(backend))
}

fn fail(t_ms: u64, agent: &str) -> Conn {
    conn(t_ms, agent, None)
}

fn leave(t_ms: u64, instance: &str) -> Event {
    Event::LeaveCommitted {
        t_ms,
        instance: instance.to_owned(),
    }
}

fn ready(t_ms: u64, instance: &str) -> Event {
    Event::Ready {
        t_ms,
        instance: instance.to_owned(),
    }
}

fn hard(t_ms: u64, instance: &str) -> Event {
    Event::HardFailure {
        t_ms,
        instance: instance.to_owned(),
        fault: "kill-backend".to_owned(),
    }
}

fn phase(t_ms: u64, name: &str) -> Event {
    Event::Phase {
        t_ms,
        name: name.to_owned(),
    }
}

/// A run's harness figures with the history check done (one write
/// checked, nothing lost).
fn input() -> ReportInput {
    ReportInput {
        scenario: "test".to_owned(),
        seed: 7,
        agents: 3,
        history: Some(HistoryFigures {
            writes_checked: 1,
            ..HistoryFigures::default()
        }),
        ..ReportInput::default()
    }
}

/// Pass bounds with the leave and crash figures not applicable.
fn neither() -> Pass {
    Pass {
        min_leave_samples: 0,
        min_crash_samples: 0,
        ..Pass::default()
    }
}

fn run(conns: Vec<Conn>, events: Vec<Event>, duration_ms: u64) -> Report {
    let timeline = Timeline {
        views: Vec::new(),
        region_answers: Vec::new(),
        backend_regions: Default::default(),
        routes: Vec::new(),
        conns,
        events,
        duration_ms,
    };
    compute(&input(), &timeline, &neither())
}

#[test]
fn percentiles_are_nearest_rank() {
    let s = Stats::from_samples((1..=100).rev().collect());
    assert_eq!(
        (s.count, s.p50, s.p99, s.max),
        (100, Some(50.0), Some(99.0), Some(100.0))
    );
    let s = Stats::from_samples(vec![4, 1, 3, 2]);
    assert_eq!((s.p50, s.p99, s.max), (Some(2.0), Some(4.0), Some(4.0)));
    let s = Stats::from_samples(vec![5]);
    assert_eq!((s.p50, s.p99, s.max), (Some(5.0), Some(5.0), Some(5.0)));
    // 200 samples: p99 is the 198th smallest, not the largest.
    let s = Stats::from_samples((1..=200).collect());
    assert_eq!((s.p50, s.p99), (Some(100.0), Some(198.0)));
}

#[test]
fn empty_stats_are_null() {
    let s = Stats::from_samples(Vec::new());
    assert_eq!(s, Stats::default());
    assert_eq!(
        serde_json::to_value(&s).expect("serializable"),
        serde_json::json!({"count": 0, "p50": null, "p99": null, "max": null})
    );
}

#[test]
fn leave_is_the_last_answered_connection_after_the_commit() {
    let report = run(
        vec![
            ok(500, "n1", "a"),
            ok(1500, "n1", "a"),
            ok(2200, "n2", "a"),
            fail(2500, "n1"),
            ok(3000, "n1", "b"),
        ],
        vec![leave(1000, "a"), leave(1000, "b"), leave(9000, "c")],
        10_000,
    );
    // a: 2200 − 1000; b: answered at 3000; c: nothing after → 0.
    assert_eq!(report.leave_ms.count, 3);
    assert_eq!(report.leave_ms.max, Some(2000.0));
    assert_eq!(report.leave_ms.p50, Some(1200.0));
    let samples = run(
        vec![ok(2200, "n2", "a")],
        vec![leave(1000, "a"), leave(9000, "c")],
        10_000,
    )
    .leave_ms;
    assert_eq!((samples.p50, samples.max), (Some(0.0), Some(1200.0)));
}

#[test]
fn a_leave_ends_when_the_instance_is_ready_again() {
    let report = run(
        vec![ok(1500, "n1", "c"), ok(9000, "n1", "c")],
        vec![leave(1000, "c"), ready(2000, "c")],
        10_000,
    );
    assert_eq!(report.leave_ms.max, Some(500.0));
    assert_eq!(report.new_conns_to_drained, 0);
}

#[test]
fn a_leave_ends_when_a_new_process_of_the_instance_starts() {
    // Killed, UNHEALTHY at 1000, restarted at 5000: answers of the new
    // process before its READY commit (panic routing to it) are not
    // answers of the instance that left.
    let restarted = Event::Restarted {
        t_ms: 5_000,
        instance: "c".to_owned(),
    };
    let report = run(
        vec![ok(5_100, "n1", "c"), ok(5_200, "n2", "c")],
        vec![leave(1_000, "c"), restarted, ready(5_800, "c")],
        10_000,
    );
    assert_eq!(report.leave_ms.max, Some(0.0));
    assert_eq!(report.new_conns_to_drained, 0);
}

#[test]
fn a_second_commit_during_a_leave_starts_nothing() {
    // DRAINING at 1000, then UNHEALTHY at 1800: one leave, from 1000.
    let report = run(
        vec![ok(2500, "n1", "a"), ok(4500, "n1", "a")],
        vec![leave(1000, "a"), leave(1800, "a")],
        10_000,
    );
    assert_eq!(report.leave_ms.count, 1);
    assert_eq!(report.leave_ms.max, Some(3500.0));
    assert_eq!(report.new_conns_to_drained, 1);
    assert_eq!(report.failures[0], "leave p99 3500 ms exceeds 3000 ms");
}

#[test]
fn drained_counts_answers_more_than_three_seconds_after_the_commit() {
    let report = run(
        vec![
            ok(3999, "n1", "a"),
            ok(4000, "n1", "a"),
            ok(4001, "n1", "a"),
            ok(4002, "n2", "a"),
            ok(5000, "n2", "b"),
            fail(6000, "n2"),
        ],
        vec![leave(1000, "a")],
        10_000,
    );
    assert_eq!(report.new_conns_to_drained, 2);
    assert!(!report.pass);
    assert!(report
        .failures
        .iter()
        .any(|f| f.starts_with("2 new connections to drained backends")));
}

#[test]
fn not_ready_counts_answers_before_the_first_ready() {
    let report = run(
        vec![
            ok(1000, "n1", "new"),
            ok(1999, "n1", "new"),
            ok(2000, "n1", "new"),
            ok(500, "n1", "old"),
            ok(6000, "n1", "new"),
        ],
        vec![ready(2000, "new"), leave(3000, "new"), ready(5000, "new")],
        10_000,
    );
    assert_eq!(report.new_conns_to_not_ready, 2);
}

#[test]
fn crash_is_the_last_failure_on_agents_that_routed_to_it() {
    let conns = vec![
        ok(9000, "a", "x"),
        ok(9100, "b", "y"),
        ok(9200, "c", "x"),
        fail(10_050, "a"), // before a answered again: not counted alone
        ok(10_100, "a", "y"),
        ok(10_100, "b", "y"),
        fail(10_500, "a"),
        ok(10_600, "a", "y"),
        fail(12_000, "a"),
        ok(12_100, "a", "y"),
        fail(20_000, "b"), // b never routed to x
        fail(11_000, "c"), // c's own node is down: never answers again
        fail(30_000, "c"),
    ];
    let report = run(conns, vec![hard(10_000, "x"), hard(10_000, "z")], 40_000);
    assert_eq!(report.crash_ms.count, 2);
    assert_eq!(report.crash_ms.max, Some(2000.0));
    assert_eq!(report.crash_ms.p50, Some(0.0));
    assert_eq!(report.failed_conns, 6);
    assert!(report.pass, "{:?}", report.failures);
}

#[test]
fn crash_counts_until_no_live_agent_offers_the_backend() {
    let mut timeline = Timeline {
        duration_ms: 30_000,
        ..Timeline::default()
    };
    timeline.events.push(Event::HardFailure {
        t_ms: 1_000,
        instance: "web-1".into(),
        fault: "crash-node".into(),
    });
    for (t, listed) in [(900, true), (1_100, true), (4_600, true), (4_700, false)] {
        timeline.routes.push(Route {
            t_ms: t,
            agent: "node-0".into(),
            instances: if listed {
                vec!["web-1".into(), "web-2".into()]
            } else {
                vec!["web-2".into()]
            },
        });
    }
    let report = compute(&ReportInput::default(), &timeline, &Pass::default());
    assert_eq!(report.crash_ms.max, Some(3_600.0));
}

#[test]
fn outage_failures_while_an_agent_still_offered_a_failed_backend_are_not_counted_as_live() {
    let mut timeline = Timeline {
        duration_ms: 30_000,
        ..Timeline::default()
    };
    timeline.events.push(Event::HardFailure {
        t_ms: 5_000,
        instance: "web-1".into(),
        fault: "crash-node".into(),
    });
    timeline.routes.push(Route {
        t_ms: 5_100,
        agent: "node-0".into(),
        instances: vec!["web-1".into(), "web-2".into()],
    });
    timeline.routes.push(Route {
        t_ms: 5_200,
        agent: "node-0".into(),
        instances: vec!["web-2".into()],
    });
    for t in [5_050, 9_000] {
        timeline.conns.push(Conn {
            t_ms: t,
            agent: "node-0".into(),
            backend: None,
            outcome: Outcome::Failed,
        });
    }
    let input = ReportInput {
        outage: Some((1_000, 20_000)),
        ..ReportInput::default()
    };
    let report = compute(&input, &timeline, &Pass::default());
    let outage = report.outage.unwrap();
    assert_eq!(
        outage.failed_conns_to_live_backends, 1,
        "the failure at 5.05 s went to the crashed web-1; the one at 9 s did not"
    );
}

#[test]
fn phases_split_the_run() {
    let report = run(
        vec![
            ok(500, "a", "x"), // before the first phase
            ok(1000, "a", "x"),
            fail(4999, "a"),
            ok(5000, "a", "x"),
            fail(9999, "a"),
            fail(10_500, "a"), // after the recorded end: still the last phase
        ],
        vec![phase(1000, "steady"), phase(5000, "fault")],
        10_000,
    );
    assert_eq!(
        report.phases,
        [
            Phase {
                name: "steady".to_owned(),
                start_s: 1.0,
                end_s: 5.0,
                conns: 2,
                failed_conns: 1,
            },
            Phase {
                name: "fault".to_owned(),
                start_s: 5.0,
                end_s: 10.0,
                conns: 3,
                failed_conns: 2,
            },
        ]
    );
    assert_eq!(report.duration_s, 10.0);
}

#[test]
fn outage_counts_failures_in_its_window() {
    let timeline = Timeline {
        views: Vec::new(),
        region_answers: Vec::new(),
        backend_regions: Default::default(),
        routes: Vec::new(),
        conns: vec![
            fail(1999, "a"),
            fail(2000, "a"),
            ok(3000, "a", "x"),
            fail(3999, "b"),
            fail(4000, "b"),
        ],
        events: Vec::new(),
        duration_ms: 5000,
    };
    let input = ReportInput {
        outage: Some((2000, 4000)),
        ..input()
    };
    let report = compute(&input, &timeline, &neither());
    assert_eq!(
        report.outage,
        Some(Outage {
            duration_s: 2.0,
            failed_conns_to_live_backends: 2,
        })
    );
    assert_eq!(report.failed_conns, 4);
    assert_eq!(
        report.failures,
        ["2 failed connections to live backends during the outage exceed the limit of 0"]
    );
    let report = compute(&self::input(), &timeline, &neither());
    assert_eq!(report.outage, None);
    assert!(report.pass);
}

#[test]
fn samples_are_the_reports_numbers() {
    let timeline = Timeline {
        views: Vec::new(),
        region_answers: Vec::new(),
        backend_regions: Default::default(),
        routes: Vec::new(),
        conns: vec![ok(900, "n1", "x"), ok(2200, "n1", "a"), fail(2500, "n1")],
        events: vec![leave(1000, "a"), hard(1000, "x")],
        duration_ms: 5000,
    };
    let samples = samples(&timeline);
    assert_eq!(
        samples.leave,
        [Sample {
            instance: "a".to_owned(),
            start_ms: 1000,
            ms: 1200,
        }]
    );
    assert_eq!(samples.crash.len(), 1);
    let report = compute(&input(), &timeline, &Pass::default());
    assert_eq!(report.leave_ms.max, Some(1200.0));
    assert_eq!(
        report.crash_ms.max,
        Some(samples.crash[0].ms as f64),
        "{samples:?}"
    );
}

fn step(t_ms: u64, action: &str) -> Event {
    Event::Step {
        t_ms,
        action: action.to_owned(),
        target: String::new(),
    }
}

fn route(t_ms: u64, agent: &str, instances: &[&str]) -> Route {
    Route {
        t_ms,
        agent: agent.to_owned(),
        instances: instances.iter().map(|i| i.to_string()).collect(),
    }
}

#[test]
fn converges_when_the_last_agent_settles_on_the_common_set() {
    let mut timeline = Timeline {
        duration_ms: 10_000,
        events: vec![
            step(1_000, "partition-node"),
            step(5_000, "heal"),
            step(6_000, "drain"),
        ],
        ..Timeline::default()
    };
    for t in (4_000..10_000).step_by(100) {
        // n1 lags: it offers only x until 5.6 s; n2 has both throughout,
        // in another order. n3's node crashed at 7 s: it no longer counts.
        let n1: &[&str] = if t < 5_600 { &["x"] } else { &["x", "y"] };
        timeline.routes.push(route(t, "n1", n1));
        timeline.routes.push(route(t + 3, "n2", &["y", "x", "y"]));
        if t < 7_000 {
            timeline.routes.push(route(t + 5, "n3", &["z"]));
        }
    }
    assert_eq!(converge_ms(&timeline), Some(600));
    timeline.conns.push(ok(100, "n1", "x"));
    let report = compute(&input(), &timeline, &neither());
    assert_eq!(report.converge_ms, Some(600));
    assert!(report.pass, "{:?}", report.failures);

    // Already agreeing at the recovery: 0.
    timeline.routes.retain(|r| r.agent == "n2");
    assert_eq!(converge_ms(&timeline), Some(0));
    // No recovery step: nothing to converge from.
    timeline
        .events
        .retain(|e| !matches!(e, Event::Step { action, .. } if action == "heal"));
    assert_eq!(converge_ms(&timeline), None);
}

#[test]
fn never_converges_when_the_agents_end_apart() {
    let mut timeline = Timeline {
        duration_ms: 10_000,
        events: vec![step(2_000, "pause-agent"), step(4_000, "resume-agent")],
        ..Timeline::default()
    };
    for t in (0..10_000).step_by(100) {
        timeline.routes.push(route(t, "n1", &["x", "y"]));
        timeline.routes.push(route(t + 1, "n2", &["x"]));
    }
    assert_eq!(converge_ms(&timeline), None);
    timeline.conns.push(ok(100, "n1", "x"));
    let report = compute(&input(), &timeline, &neither());
    assert_eq!(report.converge_ms, None);
    assert!(
        report.pass,
        "no pass bound on convergence: {:?}",
        report.failures
    );
    // No sample after the recovery: unknown, not 0.
    timeline.routes.retain(|r| r.t_ms < 4_000);
    assert_eq!(converge_ms(&timeline), None);
}

#[test]
fn a_crash_sample_ends_when_the_instance_is_ready_again() {
    let timeline = Timeline {
        views: Vec::new(),
        region_answers: Vec::new(),
        backend_regions: Default::default(),
        conns: vec![
            ok(900, "a", "x"),
            ok(1500, "a", "y"),
            fail(2000, "a"),
            ok(9000, "a", "x"),
        ],
        routes: vec![route(1500, "a", &["x"]), route(8000, "a", &["x", "y"])],
        events: vec![hard(1000, "x"), ready(7000, "x")],
        duration_ms: 10_000,
    };
    let report = compute(&input(), &timeline, &neither());
    assert_eq!(
        report.crash_ms.max,
        Some(1000.0),
        "the route at 8 s is after x came back"
    );
}

#[test]
fn view_samples_are_the_last_live_agents_drop() {
    let view = |t_ms: u64, agent: &str, ids: &[&str]| Route {
        t_ms,
        agent: agent.to_owned(),
        instances: ids.iter().map(|s| s.to_string()).collect(),
    };
    let timeline = Timeline {
        conns: vec![ok(10, "a", "x")],
        routes: Vec::new(),
        views: vec![
            view(0, "a", &["x", "y"]),
            view(1_040, "a", &["y"]),
            view(0, "b", &["x", "y"]),
            view(1_090, "b", &["y"]),
            // c's node crashed after the leave: it says nothing.
            view(0, "c", &["x", "y"]),
            // d never held x.
            view(0, "d", &["y"]),
            // e: its node crashed (hard failure of y at 5 s); after
            // that its view is not read.
            view(0, "e", &["x", "y"]),
            view(1_020, "e", &["y"]),
        ],
        events: vec![
            leave(1_000, "x"),
            step(1_500, "crash-node"),
            hard(5_000, "y"),
        ],
        duration_ms: 9_000,
        ..Timeline::default()
    };
    let mut timeline = timeline;
    if let Event::Step { target, .. } = &mut timeline.events[1] {
        *target = "c".to_owned();
    }
    let samples = samples(&timeline);
    assert_eq!(
        samples.leave_view,
        [Sample {
            instance: "x".to_owned(),
            start_ms: 1_000,
            ms: 90,
        }]
    );
    // Nobody dropped y: every live agent still held it at the end.
    assert_eq!(samples.crash_view[0].ms, 4_000);
    let report = compute(&input(), &timeline, &neither());
    assert_eq!(report.leave_view_ms.max, Some(90.0));
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    let strict = Pass {
        crash_p99_ms: 3_000,
        ..neither()
    };
    assert_eq!(
        compute(&input(), &timeline, &strict).failures,
        ["crash (read from every agent's view) p99 4000 ms exceeds 3000 ms"]
    );
}

#[test]
fn a_view_that_drops_an_instance_nobody_touched_and_offers_it_again_is_a_dip() {
    let view = |t_ms: u64, agent: &str, ids: &[&str]| Route {
        t_ms,
        agent: agent.to_owned(),
        instances: ids.iter().map(|s| s.to_string()).collect(),
    };
    let timeline = Timeline {
        views: vec![
            // a: y dropped at 2 s and back at 2.3 s, nothing caused it.
            view(0, "a", &["x", "y"]),
            view(2_000, "a", &["x"]),
            view(2_300, "a", &["x", "y"]),
            // b: x left on its leave commit and came back READY.
            view(0, "b", &["x", "y"]),
            view(1_010, "b", &["y"]),
            view(4_000, "b", &["x", "y"]),
            // c: y dropped for good; not a dip (false removals cover it).
            view(0, "c", &["x", "y"]),
            view(3_000, "c", &["x"]),
        ],
        conns: vec![ok(10, "a", "y")],
        events: vec![leave(1_000, "x"), ready(3_900, "x")],
        duration_ms: 9_000,
        ..Timeline::default()
    };
    let report = compute(&input(), &timeline, &neither());
    assert_eq!(report.view_dips, Some(1));
    assert!(
        report.failures.is_empty(),
        "unjudged: {:?}",
        report.failures
    );
    let judged = Pass {
        max_view_dips: Some(0),
        ..neither()
    };
    assert_eq!(
        compute(&input(), &timeline, &judged).failures,
        ["1 view dips (an instance the scenario left alone dropped from a live agent's view and back) exceed the limit of 0"]
    );
}
