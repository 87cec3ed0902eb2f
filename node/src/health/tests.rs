use super::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

const TARGET: &str = "127.0.0.1:8080";

fn target() -> SocketAddr {
    TARGET.parse().expect("valid address")
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

fn check(kind: CheckKind, failure_threshold: u32, success_threshold: u32) -> Check {
    Check {
        kind,
        timing: CheckTiming {
            interval_ms: 1_000,
            timeout_ms: 500,
            failure_threshold,
            success_threshold,
            jitter: 0.1,
        },
        port: None,
    }
}

fn http(path: &str) -> CheckKind {
    CheckKind::Http { path: path.into() }
}

fn checks(
    startup: Option<Check>,
    readiness: Option<Check>,
    liveness: Option<Check>,
) -> ValidChecks {
    ValidChecks {
        startup,
        readiness,
        liveness,
    }
}

/// Advances to the next due time and starts what is due there.
fn step(h: &mut InstanceHealth, rng: &mut StdRng) -> (u64, Due) {
    let at = h.next_due_ms().expect("something is scheduled");
    (at, h.due(at, rng))
}

/// Steps to the next probe of `which` and answers it 10 ms later
/// (answering any other probe started meanwhile with a pass).
fn probe(
    h: &mut InstanceHealth,
    rng: &mut StdRng,
    which: Which,
    passed: bool,
    detail: &str,
) -> Vec<HealthEvent> {
    loop {
        let (at, due) = step(h, rng);
        assert!(due.events.is_empty(), "{due:?}");
        if let Some(task) = due.probes.iter().find(|t| t.which == which) {
            assert_eq!(task.target, target());
            // Answer the others so they do not stay running.
            for other in due.probes.iter().filter(|t| t.which != which) {
                h.result(other.which, true, "ok", at + 10, rng);
            }
            return h.result(which, passed, detail, at + 10, rng);
        }
        for other in &due.probes {
            h.result(other.which, true, "ok", at + 10, rng);
        }
    }
}

#[test]
fn no_checks_is_ready_at_once() {
    let mut rng = rng();
    let h = InstanceHealth::new(None, target(), 0, &mut rng);
    assert_eq!(h.state(), State::Ready);
    assert_eq!(h.liveness(), Liveness::Unknown);
    assert_eq!(h.next_due_ms(), None);
    let only_liveness = checks(None, None, Some(check(CheckKind::Tcp, 3, 1)));
    let h = InstanceHealth::new(Some(&only_liveness), target(), 0, &mut rng);
    assert_eq!(h.state(), State::Ready);
}

#[test]
fn a_check_with_its_own_port_probes_that_port_on_the_instances_address() {
    let mut rng = rng();
    let mut readiness = check(http("/ready"), 3, 1);
    readiness.port = Some(10_000);
    let c = checks(None, Some(readiness), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    let (at, due) = step(&mut h, &mut rng);
    let task = &due.probes[0];
    assert_eq!(task.target, SocketAddr::new(target().ip(), 10_000));
    let events = h.result(Which::Readiness, false, "status 503", at + 10, &mut rng);
    assert!(events.is_empty(), "one failure of three flips nothing");
}

#[test]
fn readiness_fails_threshold_times_then_unhealthy_then_ready_again() {
    let mut rng = rng();
    let c = checks(None, Some(check(http("/healthz"), 3, 1)), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    assert_eq!(h.state(), State::Starting);
    let r = Which::Readiness;
    assert_eq!(
        probe(&mut h, &mut rng, r, true, "status 200"),
        [HealthEvent::Ready]
    );
    assert!(probe(&mut h, &mut rng, r, false, "status 503").is_empty());
    assert!(probe(&mut h, &mut rng, r, false, "status 503").is_empty());
    assert_eq!(h.state(), State::Ready, "two failures are not enough");
    let reason = "readiness http GET /healthz: status 503 (3 consecutive failures)";
    assert_eq!(
        probe(&mut h, &mut rng, r, false, "status 503"),
        [HealthEvent::Unhealthy {
            reason: reason.into()
        }]
    );
    assert_eq!(h.state(), State::Unhealthy);
    assert_eq!(h.reason(), Some(reason));
    assert!(probe(&mut h, &mut rng, r, false, "status 503").is_empty());
    assert_eq!(
        probe(&mut h, &mut rng, r, true, "status 200"),
        [HealthEvent::Ready]
    );
    assert_eq!(h.reason(), None);
}

#[test]
fn a_pass_between_failures_resets_the_count() {
    let mut rng = rng();
    let c = checks(None, Some(check(CheckKind::Tcp, 3, 1)), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    let r = Which::Readiness;
    probe(&mut h, &mut rng, r, true, "connected");
    for passed in [false, false, true, false, false] {
        assert!(probe(&mut h, &mut rng, r, passed, "connection refused").is_empty());
    }
    assert_eq!(
        probe(&mut h, &mut rng, r, false, "connection refused"),
        [HealthEvent::Unhealthy {
            reason:
                "readiness tcp connect 127.0.0.1:8080: connection refused (3 consecutive failures)"
                    .into()
        }]
    );
}

#[test]
fn success_threshold_needs_consecutive_passes() {
    let mut rng = rng();
    let c = checks(None, Some(check(CheckKind::Tcp, 1, 2)), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    let r = Which::Readiness;
    assert!(probe(&mut h, &mut rng, r, true, "connected").is_empty());
    assert_eq!(h.state(), State::Starting);
    assert_eq!(
        probe(&mut h, &mut rng, r, true, "connected"),
        [HealthEvent::Ready]
    );
    assert!(matches!(
        probe(&mut h, &mut rng, r, false, "timed out after 500 ms")[..],
        [HealthEvent::Unhealthy { .. }]
    ));
    assert!(probe(&mut h, &mut rng, r, true, "connected").is_empty());
    assert_eq!(h.state(), State::Unhealthy);
    assert_eq!(
        probe(&mut h, &mut rng, r, true, "connected"),
        [HealthEvent::Ready]
    );
}

#[test]
fn readiness_failing_before_first_pass_is_unhealthy() {
    let mut rng = rng();
    let c = checks(None, Some(check(CheckKind::Tcp, 2, 1)), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    probe(
        &mut h,
        &mut rng,
        Which::Readiness,
        false,
        "connection refused",
    );
    let events = probe(
        &mut h,
        &mut rng,
        Which::Readiness,
        false,
        "connection refused",
    );
    assert!(matches!(events[..], [HealthEvent::Unhealthy { .. }]));
    assert_eq!(h.state(), State::Unhealthy);
}

#[test]
fn startup_gates_readiness_and_liveness() {
    let mut rng = rng();
    let c = checks(
        Some(check(http("/started"), 3, 1)),
        Some(check(http("/ready"), 3, 1)),
        Some(check(CheckKind::Tcp, 3, 1)),
    );
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    for _ in 0..2 {
        let (at, due) = step(&mut h, &mut rng);
        assert_eq!(
            due.probes.iter().map(|t| t.which).collect::<Vec<_>>(),
            [Which::Startup]
        );
        assert!(h
            .result(Which::Startup, false, "status 503", at + 5, &mut rng)
            .is_empty());
    }
    // The third failure reaches the threshold: still STARTING, reason given.
    let events = probe(&mut h, &mut rng, Which::Startup, false, "status 503");
    let reason = "startup http GET /started: status 503 (3 consecutive failures)";
    assert_eq!(
        events,
        [HealthEvent::StartupFailing {
            reason: reason.into()
        }]
    );
    assert_eq!(h.state(), State::Starting);
    assert_eq!(h.reason(), Some(reason));
    for _ in 0..10 {
        let (at, due) = step(&mut h, &mut rng);
        assert_eq!(due.probes.len(), 1);
        assert_eq!(due.probes[0].which, Which::Startup);
        let next = h.next_due_ms();
        assert_eq!(next, None, "only startup was scheduled and it is running");
        let events = h.result(Which::Startup, false, "status 503", at + 5, &mut rng);
        assert!(events.is_empty(), "reported once: {events:?}");
    }
    assert!(probe(&mut h, &mut rng, Which::Startup, true, "status 200").is_empty());
    assert_eq!(h.state(), State::Starting, "readiness has not passed yet");
    assert_eq!(h.reason(), None);
    assert_eq!(
        probe(&mut h, &mut rng, Which::Readiness, true, "status 200"),
        [HealthEvent::Ready]
    );
    // Startup is never probed again.
    for _ in 0..20 {
        let (at, due) = step(&mut h, &mut rng);
        for t in due.probes {
            assert_ne!(t.which, Which::Startup);
            h.result(t.which, true, "ok", at + 1, &mut rng);
        }
    }
}

#[test]
fn startup_without_readiness_is_ready_when_it_passes() {
    let mut rng = rng();
    let c = checks(Some(check(CheckKind::Tcp, 30, 1)), None, None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    assert_eq!(h.state(), State::Starting);
    assert_eq!(
        probe(&mut h, &mut rng, Which::Startup, true, "connected"),
        [HealthEvent::Ready]
    );
    assert_eq!(h.next_due_ms(), None);
}

fn ttl_readiness() -> ValidChecks {
    checks(
        None,
        Some(check(CheckKind::Ttl { ttl_ms: 5_000 }, 3, 1)),
        None,
    )
}

#[test]
fn ttl_without_heartbeats_becomes_unhealthy() {
    let mut rng = rng();
    let mut h = InstanceHealth::new(Some(&ttl_readiness()), target(), 0, &mut rng);
    let mut events = Vec::new();
    while !matches!(events.last(), Some(HealthEvent::Unhealthy { .. })) {
        let (at, due) = step(&mut h, &mut rng);
        assert!(due.probes.is_empty(), "ttl checks need no probe");
        assert!(at < 60_000, "never became unhealthy");
        events.extend(due.events.into_iter().map(|e| (at, e)).map(|(at, e)| {
            if let HealthEvent::Unhealthy { reason } = &e {
                // Three ticks past the ttl, each at least one interval apart.
                assert!(at > 5_000 + 2 * 1_000, "{at}");
                assert!(
                    reason.starts_with("readiness ttl: no heartbeat for ")
                        && reason.ends_with(" ms (ttl 5000 ms) (3 consecutive failures)"),
                    "{reason}"
                );
            }
            e
        }));
    }
    assert_eq!(events[0], HealthEvent::Ready, "registration is a heartbeat");
    assert_eq!(h.state(), State::Unhealthy);
}

#[test]
fn ttl_heartbeats_keep_it_ready() {
    let mut rng = rng();
    let mut h = InstanceHealth::new(Some(&ttl_readiness()), target(), 0, &mut rng);
    let mut events = Vec::new();
    let mut last_heartbeat = 0;
    while let Some(at) = h.next_due_ms().filter(|&at| at < 120_000) {
        while last_heartbeat + 4_000 <= at {
            last_heartbeat += 4_000;
            h.heartbeat(last_heartbeat);
        }
        events.extend(h.due(at, &mut rng).events);
    }
    assert_eq!(events, [HealthEvent::Ready]);
    assert_eq!(h.state(), State::Ready);
    // Then the heartbeats stop, and start again.
    let mut now = last_heartbeat;
    while h.state() == State::Ready {
        now = h.next_due_ms().expect("scheduled");
        h.due(now, &mut rng);
    }
    h.heartbeat(now);
    let now = h.next_due_ms().expect("scheduled");
    assert_eq!(h.due(now, &mut rng).events, [HealthEvent::Ready]);
}

#[test]
fn ttl_startup_opens_the_gate_in_the_same_call() {
    let mut rng = rng();
    let c = checks(
        Some(check(CheckKind::Ttl { ttl_ms: 5_000 }, 3, 1)),
        Some(check(CheckKind::Tcp, 3, 1)),
        None,
    );
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    let (at, due) = step(&mut h, &mut rng);
    assert!(due.probes.is_empty() && due.events.is_empty(), "{due:?}");
    let next = h.next_due_ms().expect("readiness scheduled");
    assert!((at..at + 1_000).contains(&next), "{at} {next}");
    assert_eq!(h.state(), State::Starting);
}

#[test]
fn liveness_never_changes_ready() {
    let mut rng = rng();
    let c = checks(
        None,
        Some(check(CheckKind::Tcp, 3, 1)),
        Some(check(http("/live"), 3, 1)),
    );
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    probe(&mut h, &mut rng, Which::Readiness, true, "connected");
    assert_eq!(h.state(), State::Ready);
    let l = Which::Liveness;
    assert_eq!(
        probe(&mut h, &mut rng, l, true, "status 200"),
        [HealthEvent::Liveness(Liveness::Passing)]
    );
    assert!(probe(&mut h, &mut rng, l, false, "status 500").is_empty());
    assert!(probe(&mut h, &mut rng, l, false, "status 500").is_empty());
    assert_eq!(
        probe(&mut h, &mut rng, l, false, "status 500"),
        [HealthEvent::Liveness(Liveness::Failing)]
    );
    assert_eq!(h.liveness(), Liveness::Failing);
    assert_eq!(h.state(), State::Ready);
    assert_eq!(h.reason(), None);
    for _ in 0..5 {
        assert!(probe(&mut h, &mut rng, l, false, "status 500").is_empty());
    }
    assert_eq!(h.state(), State::Ready);
    assert_eq!(
        probe(&mut h, &mut rng, l, true, "status 200"),
        [HealthEvent::Liveness(Liveness::Passing)]
    );
}

#[test]
fn first_probes_of_many_instances_spread_over_the_interval() {
    let mut rng = rng();
    let c = checks(None, Some(check(CheckKind::Tcp, 3, 1)), None);
    let firsts: Vec<u64> = (0..100)
        .map(|_| {
            let h = InstanceHealth::new(Some(&c), target(), 10_000, &mut rng);
            h.next_due_ms().expect("scheduled") - 10_000
        })
        .collect();
    assert!(firsts.iter().all(|&f| f < 1_000), "{firsts:?}");
    let (min, max) = (firsts.iter().min(), firsts.iter().max());
    assert!(min < Some(&100) && max > Some(&900), "{min:?} {max:?}");
    // In every tenth of the interval some instance starts.
    for tenth in 0..10 {
        assert!(
            firsts.iter().any(|f| f / 100 == tenth),
            "no first probe in [{}, {}) ms: {firsts:?}",
            tenth * 100,
            (tenth + 1) * 100
        );
    }
}

#[test]
fn a_running_probe_is_not_started_twice() {
    let mut rng = rng();
    let c = checks(None, Some(check(CheckKind::Tcp, 3, 1)), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    let (at, due) = step(&mut h, &mut rng);
    assert_eq!(due.probes.len(), 1);
    assert_eq!(h.next_due_ms(), None);
    for later in [at, at + 1_000, at + 60_000] {
        assert_eq!(h.due(later, &mut rng), Due::default());
    }
    assert!(
        h.result(Which::Readiness, true, "connected", at + 60_001, &mut rng)[..]
            .contains(&HealthEvent::Ready)
    );
    // A late result makes the next probe due at once, not in the past.
    assert_eq!(h.next_due_ms(), Some(at + 60_001));
    // A second result for the same probe, and one for an unconfigured
    // check, are ignored.
    assert!(h
        .result(Which::Readiness, false, "x", at + 60_002, &mut rng)
        .is_empty());
    assert!(h
        .result(Which::Liveness, false, "x", at + 60_002, &mut rng)
        .is_empty());
    assert_eq!(h.next_due_ms(), Some(at + 60_001));
}

#[test]
fn jitter_keeps_intervals_within_bounds() {
    let mut rng = rng();
    let mut c = check(CheckKind::Tcp, 3, 1);
    c.timing.jitter = 0.2;
    let c = checks(None, Some(c), None);
    let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
    let mut starts = Vec::new();
    for i in 0..500u64 {
        let (at, due) = step(&mut h, &mut rng);
        assert_eq!(due.probes.len(), 1);
        starts.push(at);
        // Results arrive after varying latencies below the timeout.
        h.result(Which::Readiness, i % 2 == 0, "x", at + i % 500, &mut rng);
    }
    let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| (1_000..=1_200).contains(g)), "{gaps:?}");
    let (min, max) = (gaps.iter().min(), gaps.iter().max());
    assert!(min < Some(&1_020) && max > Some(&1_180), "{min:?} {max:?}");
}

/// Random outcomes, heartbeats and call times over many seeds: the
/// invariants hold whatever happens.
#[test]
fn invariants_hold_under_random_outcomes() {
    use rand::RngExt;
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let c = checks(
            rng.random_bool(0.5)
                .then(|| check(http("/s"), rng.random_range(1..4), 1)),
            rng.random_bool(0.7).then(|| {
                if rng.random_bool(0.5) {
                    check(CheckKind::Ttl { ttl_ms: 2_500 }, 2, rng.random_range(1..3))
                } else {
                    check(
                        CheckKind::Tcp,
                        rng.random_range(1..4),
                        rng.random_range(1..3),
                    )
                }
            }),
            rng.random_bool(0.5).then(|| check(CheckKind::Tcp, 2, 1)),
        );
        let mut h = InstanceHealth::new(Some(&c), target(), 0, &mut rng);
        let mut running: Vec<(Which, u64)> = Vec::new();
        let mut startup_passed = c.startup.is_none();
        let mut state = h.state();
        let mut liveness = h.liveness();
        let mut now = 0;
        for _ in 0..300 {
            now += rng.random_range(0..400);
            if rng.random_bool(0.3) {
                h.heartbeat(now);
            }
            let mut events = Vec::new();
            // Finish some running probes.
            let mut still = Vec::new();
            for (which, started) in running.drain(..) {
                if now >= started + 500 || rng.random_bool(0.5) {
                    let passed = rng.random_bool(0.6);
                    // Startup's success threshold is 1 here.
                    startup_passed |= which == Which::Startup && passed;
                    events.extend(h.result(which, passed, "x", now, &mut rng));
                } else {
                    still.push((which, started));
                }
            }
            running = still;
            let due = h.due(now, &mut rng);
            events.extend(due.events);
            for t in due.probes {
                assert!(
                    !running.iter().any(|(w, _)| *w == t.which),
                    "seed {seed}: {:?} started twice",
                    t.which
                );
                if t.which != Which::Startup {
                    assert!(startup_passed, "seed {seed}: probed before startup");
                } else {
                    assert!(!startup_passed, "seed {seed}: startup probed again");
                }
                running.push((t.which, now));
            }
            for e in events {
                match e {
                    HealthEvent::Ready => {
                        assert_ne!(state, State::Ready, "seed {seed}");
                        state = State::Ready;
                    }
                    HealthEvent::Unhealthy { .. } => {
                        assert_ne!(state, State::Unhealthy, "seed {seed}");
                        state = State::Unhealthy;
                    }
                    HealthEvent::StartupFailing { .. } => {
                        assert_eq!(state, State::Starting, "seed {seed}")
                    }
                    HealthEvent::Liveness(l) => {
                        assert_ne!(l, liveness, "seed {seed}");
                        liveness = l;
                    }
                }
            }
            assert_eq!(h.state(), state, "seed {seed}: a change without an event");
            assert_eq!(h.liveness(), liveness, "seed {seed}");
            if !startup_passed {
                assert_eq!(h.state(), State::Starting, "seed {seed}");
            }
        }
    }
}
