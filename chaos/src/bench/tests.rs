use super::*;

fn args() -> FleetArgs {
    FleetArgs {
        arbiters: Vec::new(),
        admin: Vec::new(),
        certs: None,
        spawn: 1,
        shape: Shape {
            agents: 20,
            instances: 200,
            services: 10,
            follow: 3,
            zones: 2,
            deploy_share: 0.1,
            storm_share: 0.02,
            wipe_share: 0.1,
            seed: 5,
        },
        scenario: Scenario::Deploy,
        duration_s: 3.0,
        report: PathBuf::from("unused"),
        procs: 1,
        binary: PathBuf::from("unused"),
        build: Build::default(),
    }
}

fn span(name: &str, start_us: u64, end_us: u64) -> Span {
    Span {
        name: name.into(),
        start_us,
        end_us,
        done: 1,
        total: 1,
        done_at_us: end_us,
        short: Vec::new(),
    }
}

fn computed(records: Vec<Records>) -> Computed {
    Computed {
        spans: vec![
            span("connect", 0, 10),
            span("register", 10, 20),
            span("follow", 20, 30),
            span("deploy", 1_000_000, 5_000_000),
        ],
        scraped: Vec::new(),
        storm_samples: Vec::new(),
        records,
        lost: Vec::new(),
        processes: Vec::new(),
        bound: Some(64),
        cores: 2,
    }
}

#[test]
fn a_deploy_that_recorded_nothing_is_a_failure_not_a_figure() {
    let args = args();
    let plan = Plan::new(&args.shape);
    let (report, _) = compute(&args, &plan, computed(vec![Records::default()]));
    let failures = report.failures.join("\n");
    assert!(
        failures.contains("deploy: no commit → applied sample"),
        "{failures}"
    );
    assert!(failures.contains("deploy: no leave sample"), "{failures}");
    assert_eq!(report.deploy.unwrap().applied.p99_ms, None);
}

#[test]
fn a_worker_that_left_no_records_makes_the_report_incomplete() {
    let args = args();
    let plan = Plan::new(&args.shape);
    let mut c = computed(vec![Records::default()]);
    c.lost = vec!["worker 1 left no records (records-1.json: gone)".into()];
    let (report, _) = compute(&args, &plan, c);
    assert!(
        report
            .failures
            .iter()
            .any(|f| f.contains("worker 1 left no records")),
        "{:?}",
        report.failures
    );
}

#[test]
fn a_change_a_follower_never_applied_is_counted_and_fails_the_run() {
    let args = args();
    let plan = Plan::new(&args.shape);
    let service = (0..10u32)
        .find(|s| plan.followers[*s as usize].len() >= 2)
        .expect("a service with two followers");
    let (first, second) = (
        plan.followers[service as usize][0],
        plan.followers[service as usize][1],
    );
    let commit = records::Commit {
        agent: first,
        kind: records::Kind::Drain,
        service,
        revision: 40,
        sent_us: 2_000_000,
        answered_us: 2_001_000,
    };
    // Every follower but `second` applied revision 40.
    let applies = plan.followers[service as usize]
        .iter()
        .filter(|&&a| a != second)
        .map(|&a| records::Apply(a, service, 40, 2_003_000))
        .collect();
    let records = Records {
        commits: vec![commit],
        applies,
        ..Records::default()
    };
    let (report, series) = compute(&args, &plan, computed(vec![records]));
    let deploy = report.deploy.unwrap();
    assert_eq!(deploy.undelivered, 1);
    assert_eq!(
        deploy.leave.count, 0,
        "a leave some follower never saw has no time"
    );
    assert_eq!(
        deploy.applied.count as usize,
        plan.followers[service as usize].len() - 1
    );
    assert_eq!(deploy.applied.p50_ms, Some(2.0));
    assert_eq!(series.applied.len(), deploy.applied.count as usize);
    assert!(report
        .failures
        .iter()
        .any(|f| f.contains("1 (change, follower) pairs never applied")));
}
