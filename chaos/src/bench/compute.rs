//! The bench's report computed from what `run` gathered: the setup's
//! memory, each scenario's latencies and rates, and the targets.

use std::collections::HashMap;

use super::*;

/// What `run` gathered, for `compute`.
pub(super) struct Computed {
    pub(super) spans: Vec<Span>,
    pub(super) scraped: Vec<(String, String, ArbiterCounters)>,
    pub(super) storm_samples: Vec<(f64, f64)>,
    pub(super) records: Vec<Records>,
    /// Why a worker's records are missing.
    pub(super) lost: Vec<String>,
    pub(super) processes: Vec<arbiters::Watched>,
    pub(super) bound: Option<u64>,
    pub(super) cores: usize,
}

/// The last reading of `name` at or before `at_us`, KiB.
fn rss_at(processes: &[arbiters::Watched], name: &str, at_us: u64) -> Option<f64> {
    processes
        .iter()
        .find(|p| p.name == name)?
        .readings
        .iter()
        .rfind(|r| r.at_us <= at_us)
        .map(|r| r.rss_kib as f64)
}

pub(super) fn compute(args: &FleetArgs, plan: &Plan, c: Computed) -> (Report, plot::Series) {
    let span = |name: &str| c.spans.iter().find(|s| s.name == name);
    let commits: Vec<&records::Commit> = c.records.iter().flat_map(|r| &r.commits).collect();
    let applies = report::Applies::new(&c.records);
    let mut load: HashMap<u64, records::Load> = HashMap::new();
    for r in &c.records {
        for (s, l) in &r.load {
            load.entry(*s).or_default().add(l);
        }
    }
    let mut load: Vec<(u64, records::Load)> = load.into_iter().collect();
    load.sort_unstable_by_key(|(s, _)| *s);
    let mut failures = c.lost.clone();
    let mut series = plot::Series::default();

    for s in &c.spans {
        if !s.short.is_empty() {
            failures.push(format!("{} ended short: {}", s.name, s.short.join("; ")));
        }
    }
    // Setup.
    let mut setup = report::Setup::default();
    if let (Some(connect), Some(register), Some(follow)) =
        (span("connect"), span("register"), span("follow"))
    {
        setup.sessions = connect.done;
        setup.endpoints = register.done;
        setup.subscriptions = follow.done;
        setup.connect_s = connect.seconds();
        setup.register_s = register.seconds();
        setup.follow_s = follow.seconds();
        let registered = commits
            .iter()
            .filter(|c| c.kind == records::Kind::Register)
            .filter(|c| c.answered_us >= register.start_us && c.answered_us <= register.end_us)
            .count();
        setup.register_commits_per_s =
            (register.seconds() > 0.0).then(|| (registered as f64 / register.seconds()).round());
        let first = "arbiter-1";
        let idle = rss_at(&c.processes, first, connect.start_us);
        let after = |s: &Span| rss_at(&c.processes, first, s.end_us);
        setup.rss_idle_mib = idle.map(|k| (k / 102.4).round() / 10.0);
        let per = |from: Option<f64>, to: Option<f64>, n: u64| match (from, to) {
            (Some(a), Some(b)) if n > 0 => Some(((b - a) / n as f64 * 100.0).round() / 100.0),
            _ => None,
        };
        setup.rss_per_session_kib = per(idle, after(connect), connect.done);
        setup.rss_per_endpoint_kib = per(after(connect), after(register), register.done);
        setup.rss_per_subscription_kib = per(after(register), after(follow), follow.done);
        // The first replica's own count of its state at a setup phase's end.
        let counted = |phase: &str, pick: fn(&ArbiterCounters) -> Option<f64>| {
            c.scraped
                .iter()
                .find(|(p, name, _)| p == phase && name == first)
                .and_then(|(_, _, k)| pick(k))
                .map(|bytes| bytes / 1024.0)
        };
        let sessions = counted("connect", |k| k.session_state_bytes);
        setup.session_state_per_session_kib = per(Some(0.0), sessions, connect.done);
        setup.connection_per_session_kib = match (
            setup.rss_per_session_kib,
            setup.session_state_per_session_kib,
        ) {
            (Some(all), Some(state)) => Some(((all - state) * 100.0).round() / 100.0),
            _ => None,
        };
        let subscriptions = |phase| counted(phase, |k| k.subscription_state_bytes);
        setup.subscription_state_per_subscription_kib = per(
            subscriptions("register"),
            subscriptions("follow"),
            follow.done,
        );
    }
    let steady = span("steady").map(|s| report::Steady {
        seconds: s.seconds(),
        usage: report::usage(&c.processes, s.start_us, s.end_us),
        deliveries_per_s: report::rate(&load, s.start_us, s.end_us, |l| l.updates),
    });
    if let Some(st) = &steady {
        for u in st.usage.iter().filter(|u| u.name.starts_with("arbiter")) {
            if u.cpu_percent.is_none() {
                failures.push(format!("steady: no CPU samples of {}", u.name));
            }
        }
    }
    let deploy = span("deploy").map(|s| {
        let (mut d, applied, leave) = report::deploy(plan, &commits, &applies, s, &load);
        series.applied = applied;
        series.leave = leave;
        d.replacements = plan.deploy.len() as u64;
        d.replaced = s.done;
        d.window_s = args.duration_s;
        d.drain_ms = DRAIN_MS.min((args.duration_s * 1e3) as u64);
        d.usage = report::usage(&c.processes, s.start_us, s.end_us);
        if d.replacements > 0 {
            if d.applied.count == 0 {
                failures.push("deploy: no commit → applied sample".into());
            }
            if d.leave.count == 0 {
                failures.push("deploy: no leave sample".into());
            }
        }
        if d.undelivered > 0 {
            failures.push(format!(
                "deploy: {} (change, follower) pairs never applied the change",
                d.undelivered
            ));
        }
        d
    });
    let storm = match (span("cut"), span("churn"), span("heal")) {
        (Some(cut), Some(churn), Some(heal)) => {
            let (samples, all, last) =
                report::convergence(plan, &commits, &applies, cut.start_us, heal.start_us);
            series.converge = samples.clone();
            let (reconnect, resumed, by_delta, snapshots, retries) =
                report::returns(&c.records, heal.start_us);
            let churn_commits = commits
                .iter()
                .filter(|c| plan.is_churn(c.agent))
                .filter(|c| c.answered_us >= churn.start_us && c.answered_us <= churn.end_us)
                .count() as u64;
            let sampled_max = |i: usize| {
                c.storm_samples
                    .iter()
                    .map(|s| if i == 0 { s.0 } else { s.1 })
                    .reduce(f64::max)
            };
            let run_max = c
                .scraped
                .iter()
                .filter(|(p, _, _)| p == "storm")
                .filter_map(|(_, _, k)| k.snapshots_in_flight_max)
                .reduce(f64::max);
            let st = report::Storm {
                agents: u64::from(plan.shape.agents),
                wiped: plan.wiped.iter().filter(|w| **w).count() as u64,
                churn_commits,
                churn_commits_per_s: (churn.seconds() > 0.0)
                    .then(|| (churn_commits as f64 / churn.seconds()).round()),
                cut_s: heal.start_us.saturating_sub(cut.start_us) as f64 / 1e6,
                converge_s: all.then(|| (last - heal.start_us) as f64 / 1e6),
                agent_converge: report::Latency::from_us(samples),
                reconnect: report::Latency::from_us(reconnect),
                snapshots_in_flight_sampled_max: sampled_max(0),
                snapshots_in_flight_max: run_max,
                max_concurrent_snapshots: c.bound,
                snapshots,
                retries,
                resumed_agents: resumed,
                resumed_by_delta: by_delta,
                resumed_by_delta_share: (resumed > 0)
                    .then(|| (by_delta as f64 / resumed as f64 * 1000.0).round() / 1000.0),
                held_leases_max: sampled_max(1),
                usage: report::usage(&c.processes, heal.start_us, heal.end_us),
            };
            if !all {
                failures.push("storm: some agent never held every view it needed".into());
            }
            if st.reconnect.count == 0 {
                failures.push(
                    "storm: no agent's return was recorded (reconnects, snapshots, resumes)".into(),
                );
            }
            if st.agent_converge.count == 0 {
                failures.push("storm: no convergence sample".into());
            }
            if let (Some(max), Some(bound)) = (st.snapshots_in_flight_max, c.bound) {
                if max > bound as f64 {
                    failures.push(format!(
                        "storm: {max} snapshots in flight at once, above the bound {bound}"
                    ));
                }
            }
            Some(st)
        }
        _ => None,
    };
    for p in c.processes.iter().filter(|p| p.name.starts_with("arbiter")) {
        if p.readings.len() < 2 {
            failures.push(format!("no CPU and memory samples of {}", p.name));
        }
    }
    let targets = targets(&deploy, &storm, &c.processes);
    let mut notes = Vec::new();
    if let Some(st) = &steady {
        notes.extend(report::saturated("steady", &st.usage));
    }
    if let Some(d) = &deploy {
        notes.extend(report::saturated("deploy", &d.usage));
    }
    if let Some(st) = &storm {
        notes.extend(report::saturated("storm", &st.usage));
    }
    let mut errors: HashMap<String, u64> = HashMap::new();
    for r in &c.records {
        for (e, n) in &r.errors {
            *errors.entry(e.clone()).or_default() += n;
        }
    }
    let mut errors: Vec<(String, u64)> = errors.into_iter().collect();
    errors.sort();
    let settings = serde_json::json!({
        "arbiters": args.arbiters,
        "spawn": if args.arbiters.is_empty() { Some(args.spawn) } else { None },
        "agents": args.shape.agents,
        "instances": args.shape.instances,
        "services": args.shape.services,
        "follow": args.shape.follow,
        "zones": args.shape.zones,
        "deploy_share": args.shape.deploy_share,
        "storm_share": args.shape.storm_share,
        "wipe_share": args.shape.wipe_share,
        "scenario": args.scenario,
        "duration_s": args.duration_s,
        "procs": args.procs,
        "seed": args.shape.seed,
    });
    let report = Report {
        bench: "fleet".into(),
        build: args.build.clone(),
        settings,
        cores: c.cores,
        phases: c.spans,
        setup,
        steady,
        deploy,
        storm,
        counters: c.scraped,
        targets,
        errors,
        failures,
        notes,
        processes: c.processes,
        load,
    };
    (report, series)
}

/// The targets for this machine, against what was measured.
fn targets(
    deploy: &Option<report::Deploy>,
    storm: &Option<report::Storm>,
    processes: &[arbiters::Watched],
) -> Vec<Target> {
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
    let mut out = Vec::new();
    let leave = deploy.as_ref().and_then(|d| d.leave.p99_ms);
    out.push(Target {
        name: "deploy: leave p99".into(),
        target: "≤ 1000 ms".into(),
        measured: ms(leave),
        met: leave.map(|v| v <= 1_000.0),
    });
    let applied = deploy.as_ref().and_then(|d| d.applied.p99_ms);
    out.push(Target {
        name: "deploy: commit → applied p99".into(),
        target: "≤ 250 ms".into(),
        measured: ms(applied),
        met: applied.map(|v| v <= 250.0),
    });
    let rss = processes
        .iter()
        .filter(|p| p.name.starts_with("arbiter"))
        .flat_map(|p| p.readings.iter().map(|r| r.rss_kib))
        .max()
        .map(|k| k as f64 / 1024.0);
    out.push(Target {
        name: "arbiter RSS, max over the run".into(),
        target: "≤ 512 MiB".into(),
        measured: rss.map_or("-".into(), |v| format!("{v:.0} MiB")),
        met: rss.map(|v| v <= 512.0),
    });
    let converge = storm.as_ref().and_then(|s| s.converge_s);
    out.push(Target {
        name: "storm: converged".into(),
        target: "≤ 60 s".into(),
        measured: converge.map_or("-".into(), |v| format!("{v:.1} s")),
        met: storm.as_ref().map(|_| converge.is_some_and(|v| v <= 60.0)),
    });
    let snapshots = storm
        .as_ref()
        .and_then(|s| Some((s.snapshots_in_flight_max?, s.max_concurrent_snapshots?)));
    out.push(Target {
        name: "snapshots in flight (run max)".into(),
        target: "≤ the bound".into(),
        measured: snapshots.map_or("-".into(), |(m, b)| format!("{m} (bound {b})")),
        met: snapshots.map(|(m, b)| m <= b as f64),
    });
    out
}
