//! The judges' tests: routing rules, writer epochs, bounds, harness
//! figures, figures without samples, elections and corruption.

use super::*;

#[test]
fn routing_rules_judge_where_each_phase_went() {
    let rule = |phase: &str, answered_by: &[&str]| Routing {
        phase: phase.to_owned(),
        answered_by: answered_by.iter().map(|r| r.to_string()).collect(),
        settle_s: 1.0,
        settled_by: None,
        min_answered_share: 0.5,
        refusal: Some("stale".to_owned()),
        exclusive: false,
    };
    let answer = |t_ms: u64, refused: Option<&str>| crate::timeline::RegionAnswer {
        t_ms,
        agent: "a".to_owned(),
        region: "r1".to_owned(),
        refused: refused.map(str::to_owned),
    };
    let timeline = Timeline {
        conns: vec![
            ok(100, "a", "web-r1"),
            ok(1_500, "a", "web-r2"),
            ok(1_600, "a", "web-r2"),
            fail(1_700, "a"),
        ],
        events: vec![phase(0, "one")],
        region_answers: vec![answer(500, None), answer(1_500, Some("stale"))],
        backend_regions: [("web-r1", "r1"), ("web-r2", "r2")]
            .iter()
            .map(|(i, r)| (i.to_string(), r.to_string()))
            .collect(),
        duration_ms: 2_000,
        ..Timeline::default()
    };
    let pass = |rules| Pass {
        routing: rules,
        ..neither()
    };
    // r1 answered before it settled, r2 after; 2 of 3 answered.
    let r = compute(&input(), &timeline, &pass(vec![rule("one", &["r1", "r2"])]));
    assert!(r.pass, "{:?}", r.failures);
    let f = &r.regions.as_ref().unwrap().routing[0];
    assert_eq!((f.conns, f.settled_conns), (4, 3));
    assert_eq!(f.refusals, BTreeMap::from([("stale".to_owned(), 1)]));
    // r2 is not allowed: the run fails, naming it.
    let r = compute(&input(), &timeline, &pass(vec![rule("one", &["r1"])]));
    assert!(
        r.failures.iter().any(|f| f.contains("2 by r2")),
        "{:?}",
        r.failures
    );
    // A settled refusal other than the rule's fails too.
    let mut other = timeline.clone();
    other
        .region_answers
        .push(answer(1_800, Some("no_capacity")));
    let r = compute(&input(), &other, &pass(vec![rule("one", &["r1", "r2"])]));
    assert!(
        r.failures.iter().any(|f| f.contains("1 no_capacity")),
        "{:?}",
        r.failures
    );
    // No connection in the phase: measured nothing.
    let mut empty = timeline.clone();
    empty.conns.clear();
    let r = compute(&input(), &empty, &pass(vec![rule("one", &["r1"])]));
    assert!(
        r.failures.iter().any(|f| f.contains("measured nothing")),
        "{:?}",
        r.failures
    );
    // Rules in a one-region run: not measured.
    let one = Timeline {
        backend_regions: BTreeMap::new(),
        ..timeline
    };
    let r = compute(&input(), &one, &pass(vec![rule("one", &["r1"])]));
    assert!(r.regions.is_none());
    assert!(!r.pass);
}

#[test]
fn a_single_writer_handover_is_judged_exclusive_and_every_region_on_the_epoch() {
    let rule = Routing {
        phase: "moved".to_owned(),
        answered_by: vec!["r1".to_owned(), "r2".to_owned()],
        settle_s: 1.0,
        settled_by: Some(vec!["r2".to_owned()]),
        min_answered_share: 0.5,
        refusal: None,
        exclusive: true,
    };
    let writer = |t_ms: u64, region: &str, epoch: u64| Event::Writer {
        t_ms,
        region: region.to_owned(),
        epoch,
        owner: "r1".to_owned(),
        settled: true,
    };
    let read = |t_ms: u64| Event::Step {
        t_ms,
        action: "read-writers".to_owned(),
        target: String::new(),
    };
    let timeline = Timeline {
        conns: vec![
            ok(100, "a", "web-r1"),
            fail(400, "a"),
            ok(1_500, "a", "web-r2"),
            ok(1_600, "a", "web-r2"),
        ],
        events: vec![
            phase(0, "moved"),
            writer(1_000, "r1", 2),
            read(1_000),
            writer(1_900, "r1", 3),
            writer(1_900, "r2", 3),
            read(1_900),
        ],
        backend_regions: [("web-r1", "r1"), ("web-r2", "r2")]
            .iter()
            .map(|(i, r)| (i.to_string(), r.to_string()))
            .collect(),
        duration_ms: 2_000,
        ..Timeline::default()
    };
    let pass = |epoch| Pass {
        routing: vec![rule.clone()],
        writer_epoch: Some(epoch),
        ..neither()
    };
    // r1, then r2, never back: exclusive; both regions read at epoch 3
    // at the last reading (the earlier one does not count).
    let r = compute(&input(), &timeline, &pass(3));
    assert!(r.pass, "{:?}", r.failures);
    assert_eq!(r.regions.as_ref().unwrap().writers.len(), 2);
    let r = compute(&input(), &timeline, &pass(2));
    assert!(
        r.failures.iter().any(|f| f.contains("r1 holds epoch 3")),
        "{:?}",
        r.failures
    );
    // A write back at r1 after r2 took over: interleaved.
    let mut back = timeline.clone();
    back.conns.push(ok(1_700, "a", "web-r1"));
    back.conns.push(ok(1_800, "a", "web-r2"));
    let r = compute(&input(), &back, &pass(3));
    let f = &r.regions.as_ref().unwrap().routing[0];
    assert_eq!(f.interleaved, 1, "r1 once r2 had taken over");
    assert!(
        r.failures.iter().any(|f| f.contains("back and forth")),
        "{:?}",
        r.failures
    );
    // No reading at all: the epoch was not measured.
    let mut unread = timeline.clone();
    unread.events.retain(|e| !matches!(e, Event::Writer { .. }));
    let r = compute(&input(), &unread, &pass(3));
    assert!(
        r.failures.iter().any(|f| f.contains("was not measured")),
        "{:?}",
        r.failures
    );
}

#[test]
fn crash_over_the_bound_fails() {
    let conns = vec![ok(900, "a", "x"), ok(1500, "a", "y"), fail(17_000, "a")];
    let report = run(conns, vec![hard(1000, "x")], 20_000);
    assert_eq!(report.crash_ms.p99, Some(16_000.0));
    assert_eq!(report.failures, ["crash p99 16000 ms exceeds 15000 ms"]);
}

#[test]
fn harness_figures_are_judged() {
    let input = ReportInput {
        converge_ms: Some(1234),
        false_removals: 2,
        max_concurrent_snapshots: 40,
        ..input()
    };
    let timeline = Timeline {
        conns: vec![ok(10, "a", "x")],
        ..Timeline::default()
    };
    let lenient = compute(&input, &timeline, &neither());
    assert_eq!(lenient.converge_ms, Some(1234));
    assert_eq!(lenient.failures, ["2 false removals exceed the limit of 0"]);

    let strict = Pass {
        max_false_removals: 2,
        min_leave_samples: 0,
        min_crash_samples: 0,
        max_concurrent_snapshots: Some(32),
        ..Pass::default()
    };
    let report = compute(&input, &timeline, &strict);
    assert!(!report.pass);
    assert_eq!(
        report.failures,
        ["40 concurrent snapshots exceed the limit of 32"]
    );
}

#[test]
fn a_judged_figure_without_samples_fails_unless_declared_not_applicable() {
    let timeline = Timeline {
        conns: vec![ok(10, "a", "x")],
        duration_ms: 1000,
        ..Timeline::default()
    };
    let report = compute(&input(), &timeline, &Pass::default());
    assert!(!report.pass);
    assert_eq!(
        report.failures,
        [
            "leave: 0 samples, fewer than the 1 the scenario requires (min_leave_samples): the run did not measure what it judges",
            "crash: 0 samples, fewer than the 1 the scenario requires (min_crash_samples): the run did not measure what it judges",
        ]
    );
    let report = compute(&input(), &timeline, &neither());
    assert!(report.pass, "{:?}", report.failures);
    // A minimum above the samples fails too.
    let timeline = Timeline {
        conns: vec![ok(900, "a", "x"), ok(1100, "a", "y")],
        events: vec![leave(1000, "x")],
        duration_ms: 2000,
        ..Timeline::default()
    };
    let report = compute(
        &input(),
        &timeline,
        &Pass {
            min_leave_samples: 100,
            ..neither()
        },
    );
    assert_eq!(report.leave_ms.count, 1);
    assert!(!report.pass);
}

#[test]
fn a_run_that_answered_nothing_or_read_no_audit_log_fails() {
    let silent = Timeline {
        conns: vec![fail(10, "a")],
        duration_ms: 1000,
        ..Timeline::default()
    };
    let report = compute(&input(), &silent, &neither());
    assert_eq!(
        report.failures,
        ["no connection of 1 was answered: the traffic measured nothing"]
    );
    let answered = Timeline {
        conns: vec![ok(10, "a", "x")],
        duration_ms: 1000,
        ..Timeline::default()
    };
    let blind = ReportInput {
        history: None,
        ..input()
    };
    let report = compute(&blind, &answered, &neither());
    assert_eq!(
        report.failures,
        ["the audit log could not be read: false removals and lost writes were not measured"]
    );
    let unchecked = ReportInput {
        history: Some(HistoryFigures::default()),
        ..input()
    };
    let report = compute(&unchecked, &answered, &neither());
    assert_eq!(
        report.failures,
        ["0 writes checked against the audit log, fewer than the 1 required (min_writes_checked)"]
    );
    let lost = ReportInput {
        history: Some(HistoryFigures {
            writes_checked: 3,
            lost_writes: vec!["x: a drain answered committed (200) at 5 ms is not in the audit log after revision 0".to_owned()],
            false_removals: Vec::new(),
        }),
        ..input()
    };
    let report = compute(&lost, &answered, &neither());
    assert_eq!(report.failures.len(), 1);
    assert!(report.failures[0].starts_with("1 lost writes exceed the limit of 0: x: a drain"));
}

#[test]
fn failures_in_an_election_window_are_judged() {
    let timeline = Timeline {
        conns: vec![
            ok(900, "a", "x"),
            fail(1100, "a"),
            ok(1200, "a", "x"),
            fail(3000, "b"),
        ],
        duration_ms: 4000,
        ..Timeline::default()
    };
    let pass = Pass {
        max_failed_conns_in_election: Some(0),
        ..neither()
    };
    let unmeasured = compute(&input(), &timeline, &pass);
    assert_eq!(
        unmeasured.failures,
        ["no election window was measured (no leader killed, or no commit answered after it)"]
    );
    let elected = ReportInput {
        election: Some((1000, 2000)),
        ..input()
    };
    let report = compute(&elected, &timeline, &pass);
    assert_eq!(
        report.election,
        Some(Election {
            window_ms: 1000,
            conns: 2,
            failed_conns_to_live_backends: 1,
        })
    );
    assert_eq!(
        report.failures,
        ["1 failed connections to live backends during the 1000 ms election exceed the limit of 0"]
    );
}

#[test]
fn an_undetected_or_served_corruption_fails() {
    let timeline = Timeline {
        conns: vec![ok(900, "a", "x")],
        duration_ms: 1000,
        ..Timeline::default()
    };
    let with = |detected, stale_answers| ReportInput {
        cache_corruption: Some(Corruption {
            files: 2,
            detected,
            stale_answers,
        }),
        ..input()
    };
    assert!(compute(&with(2, 0), &timeline, &neither()).pass);
    assert_eq!(
        compute(&with(1, 0), &timeline, &neither()).failures,
        ["1 of 2 corrupted cache files were detected (the rest may have been read as valid)"]
    );
    assert_eq!(
        compute(&with(2, 3), &timeline, &neither()).failures,
        ["the restarted agent answered 3 times from its cache after the corruption"]
    );
}
