//! The scenario format's parsing and validation, with the shipped files.

use super::*;

const FULL: &str = r#"
name = "drain-and-crash"
description = "Drain one backend, then crash a node."
agents = 4
instances_per_agent = 3
service = "api"
duration_s = 60
traffic_rate_per_agent = 100
connect_timeout_ms = 500
needs_fault_injection = true

[short]
agents = 2
time_scale = 0.5

[[steps]]
at_s = 0
action = "phase"
target = "steady"

[[steps]]
at_s = 10
action = "drain"
target = "node-1/api-1"

[[steps]]
at_s = 20
action = "pause_agent"
target = "node-3"
duration_s = 5

[[steps]]
at_s = 40
action = "rolling_deploy"
share = 0.25

[pass]
leave_p99_ms = 2500
crash_p99_ms = 12000
max_new_conns_to_drained = 1
max_failed_conns_to_live_backends_in_outage = 2
max_false_removals = 3
max_concurrent_snapshots = 16
"#;

const MINIMAL: &str = "name = \"m\"\ndescription = \"d\"\nduration_s = 10\n";

fn invalid_field(text: &str) -> (String, String) {
    let err = Scenario::from_toml_str(text).expect_err("should be refused");
    let message = err.to_string();
    match err {
        ScenarioError::Invalid { field, .. } => (field, message),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn full_example_parses() {
    let s = Scenario::from_toml_str(FULL).expect("valid scenario");
    assert_eq!(s.name, "drain-and-crash");
    assert_eq!(s.agents, 4);
    assert_eq!(s.instances_per_agent, 3);
    assert_eq!(s.service, "api");
    assert_eq!(s.duration_s, 60.0);
    assert_eq!(s.traffic_rate_per_agent, 100.0);
    assert_eq!(s.connect_timeout_ms, 500);
    assert!(s.needs_fault_injection);
    assert_eq!(
        s.short,
        Some(Short {
            agents: 2,
            time_scale: 0.5,
            rounds: None,
            duration_s: None,
            min_leave_samples: None,
            min_crash_samples: None,
        })
    );
    assert_eq!(s.steps.len(), 4);
    assert_eq!(s.steps[0].action, Action::Phase);
    assert_eq!(s.steps[0].target, "steady");
    assert_eq!(s.steps[1].action, Action::Drain);
    assert_eq!(s.steps[2].duration_s, Some(5.0));
    assert_eq!(s.steps[3].action, Action::RollingDeploy);
    assert_eq!(s.steps[3].target, "");
    assert_eq!(s.steps[3].share, Some(0.25));
    assert_eq!(
        s.pass,
        Pass {
            leave_p99_ms: 2500,
            crash_p99_ms: 12000,
            max_new_conns_to_drained: 1,
            max_failed_conns_to_live_backends_in_outage: 2,
            max_false_removals: 3,
            max_view_dips: None,
            degraded_max_age_ms: None,
            max_concurrent_snapshots: Some(16),
            min_concurrent_snapshots: None,
            max_new_conns_to_not_ready: 0,
            max_converge_ms: None,
            max_failed_conns: None,
            min_leave_samples: 1,
            min_crash_samples: 1,
            max_lost_writes: 0,
            min_writes_checked: 1,
            max_failed_conns_in_election: None,
            routing: Vec::new(),
            writer_epoch: None,
            max_rogue_breaches: None,
        }
    );
}

#[test]
fn defaults_apply() {
    let s = Scenario::from_toml_str(MINIMAL).expect("valid scenario");
    assert_eq!(s.agents, 3);
    assert_eq!(s.instances_per_agent, 2);
    assert_eq!(s.service, "web");
    assert_eq!(s.traffic_rate_per_agent, 50.0);
    assert_eq!(s.connect_timeout_ms, 1000);
    assert_eq!(s.short, None);
    assert!(!s.needs_fault_injection);
    assert!(s.steps.is_empty());
    assert_eq!(s.pass.leave_p99_ms, 3000);
    assert_eq!(s.pass.crash_p99_ms, 15000);
    assert_eq!(s.pass.max_new_conns_to_drained, 0);
    assert_eq!(s.pass.max_concurrent_snapshots, None);
    let short = Scenario::from_toml_str(&format!("{MINIMAL}[short]\nagents = 1\n"))
        .expect("valid scenario");
    assert_eq!(short.short.map(|s| s.time_scale), Some(1.0));
}

#[test]
fn every_action_name_round_trips() {
    for action in Action::ALL {
        let json = serde_json::to_value(action).expect("serializable");
        assert_eq!(json, serde_json::Value::from(action.as_str()));
        assert_eq!(Action::from_name(action.as_str()), Some(action));
        // The bridge links are named by region, in a run of several.
        let (regions, target) = match action {
            Action::CutBridge
            | Action::HealBridge
            | Action::TransferWriter
            | Action::ForceWriter
            | Action::ReadWriters => ("regions = 3\n", "r2"),
            // A rogue reports a node of another zone down.
            Action::Rogue => ("zones = 2\nagents = 2\n", "x"),
            _ => ("", "x"),
        };
        let reason = if action == Action::ForceWriter {
            "reason = \"drill\"\n"
        } else {
            ""
        };
        let text =
                format!("{regions}{MINIMAL}[[steps]]\nat_s = 1\naction = \"{action}\"\ntarget = \"{target}\"\ndelay_ms = 50\ncount = 2\nevery_s = 2\nduration_s = 0.5\n{reason}");
        let s = Scenario::from_toml_str(&text).expect("valid scenario");
        assert_eq!(s.steps[0].action, action);
    }
}

#[test]
fn every_validation_error_names_its_field() {
    let step = |body: &str| format!("{MINIMAL}[[steps]]\n{body}\n");
    let cases: Vec<(String, &str)> = vec![
        (
            step("at_s = 1\naction = \"crash_rounds\"\nevery_s = 2"),
            "steps[0].count",
        ),
        (
            step("at_s = 1\naction = \"pause_rounds\"\ncount = 2"),
            "steps[0].every_s",
        ),
        (
            step("at_s = 1\naction = \"crash_rounds\"\ncount = 2\nevery_s = 2\nduration_s = 2"),
            "steps[0].duration_s",
        ),
        (
            step("at_s = 1\naction = \"crash_rounds\"\ncount = 5\nevery_s = 2\nduration_s = 1"),
            "steps[0].count",
        ),
        (
            step("at_s = 1\naction = \"crash_nodes\""),
            "steps[0].target",
        ),
        (
            format!(
                "zones = 2\nagents = 2\n{}",
                step("at_s = 1\naction = \"rogue\"")
            ),
            "steps[0].duration_s",
        ),
        (
            format!(
                "zones = 2\nagents = 2\n{}",
                step("at_s = 5\naction = \"rogue\"\nduration_s = 6")
            ),
            "steps[0].duration_s",
        ),
        (
            format!(
                "{MINIMAL}agents = 2\n[[steps]]\nat_s = 1\naction = \"rogue\"\nduration_s = 2\n"
            ),
            "zones",
        ),
        (
            format!("{MINIMAL}[short]\nagents = 1\nrounds = 0\n"),
            "short.rounds",
        ),
        (
            "name = \"\"\ndescription = \"d\"\nduration_s = 1\n".into(),
            "name",
        ),
        (format!("{MINIMAL}agents = 0\n"), "agents"),
        (format!("{MINIMAL}service = \" \"\n"), "service"),
        (format!("{MINIMAL}zones = 2\nagents = 1\n"), "zones"),
        (format!("{MINIMAL}faults = \"drop_delta=0.1\"\n"), "faults"),
        (
            step("at_s = 1\naction = \"delay_follower\""),
            "steps[0].delay_ms",
        ),
        (
            "name = \"m\"\ndescription = \"d\"\nduration_s = 0\n".into(),
            "duration_s",
        ),
        (
            "name = \"m\"\ndescription = \"d\"\nduration_s = nan\n".into(),
            "duration_s",
        ),
        (
            format!("{MINIMAL}traffic_rate_per_agent = -5\n"),
            "traffic_rate_per_agent",
        ),
        (
            format!("{MINIMAL}connect_timeout_ms = 0\n"),
            "connect_timeout_ms",
        ),
        (format!("{MINIMAL}[short]\nagents = 0\n"), "short.agents"),
        (
            format!("{MINIMAL}[short]\nagents = 1\ntime_scale = 1.5\n"),
            "short.time_scale",
        ),
        (
            format!("{MINIMAL}[short]\nagents = 1\ntime_scale = 0\n"),
            "short.time_scale",
        ),
        (step("at_s = -1\naction = \"heal\""), "steps[0].at_s"),
        (step("at_s = 11\naction = \"heal\""), "steps[0].at_s"),
        (
            step("at_s = 1\naction = \"heal\"\nduration_s = 0"),
            "steps[0].duration_s",
        ),
        (
            step("at_s = 1\naction = \"rolling_deploy\"\nshare = 1.5"),
            "steps[0].share",
        ),
        (
            step("at_s = 1\naction = \"rolling_deploy\"\nshare = 0"),
            "steps[0].share",
        ),
        (step("at_s = 1\naction = \"phase\""), "steps[0].target"),
        (step("at_s = 1\naction = \"explode\""), "steps[0].action"),
    ];
    for (text, field) in cases {
        let (got, message) = invalid_field(&text);
        assert_eq!(got, field, "{message}");
        assert!(message.starts_with(field), "{message}");
    }
}

#[test]
fn error_messages_read_well() {
    let text = format!(
        "{MINIMAL}[[steps]]\nat_s = 1\naction = \"heal\"\n[[steps]]\nat_s = 2\naction = \"heal\"\n\
             [[steps]]\nat_s = -1\naction = \"heal\"\n"
    );
    let (_, message) = invalid_field(&text);
    assert_eq!(message, "steps[2].at_s = -1 must be at least 0");

    let (_, message) = invalid_field(&format!(
        "{MINIMAL}[[steps]]\nat_s = 1\naction = \"explode\"\n"
    ));
    assert!(
        message.starts_with("steps[0].action = \"explode\" is not one of: drain, fail_readiness,"),
        "{message}"
    );
    assert!(
        message.ends_with(
            "kill_backends, restart_backends, transfer_writer, force_writer, read_writers, rogue"
        ),
        "{message}"
    );
}

#[test]
fn unknown_keys_are_refused() {
    for text in [
        format!("{MINIMAL}agent = 3\n"),
        format!("{MINIMAL}[short]\nagents = 1\nscale = 0.5\n"),
        format!("{MINIMAL}[[steps]]\nat_s = 1\naction = \"heal\"\ntargte = \"x\"\n"),
        format!("{MINIMAL}[pass]\nleave_p99 = 1\n"),
    ] {
        match Scenario::from_toml_str(&text) {
            Err(ScenarioError::Parse { origin, message }) => {
                assert_eq!(origin, "<string>");
                assert!(message.contains("unknown field"), "{message}");
            }
            other => panic!("expected a parse error for {text:?}, got {other:?}"),
        }
    }
}

#[test]
fn missing_required_fields_are_parse_errors() {
    let err = Scenario::from_toml_str("name = \"m\"\ndescription = \"d\"\n").unwrap_err();
    assert!(err.to_string().contains("duration_s"), "{err}");
    let err = Scenario::from_toml_str("name = [").unwrap_err();
    assert!(matches!(err, ScenarioError::Parse { .. }), "{err}");
}

#[test]
fn scaling_multiplies_every_scenario_duration() {
    let s = Scenario::from_toml_str(FULL).expect("valid scenario");
    let half = s.scaled(0.5);
    assert_eq!(half.duration_s, 30.0);
    let at: Vec<f64> = half.steps.iter().map(|st| st.at_s).collect();
    assert_eq!(at, [0.0, 5.0, 10.0, 20.0]);
    assert_eq!(half.steps[2].duration_s, Some(2.5));
    assert_eq!(half.steps[3].duration_s, None);
    // What is not a scenario duration is kept.
    assert_eq!(half.connect_timeout_ms, s.connect_timeout_ms);
    assert_eq!(half.traffic_rate_per_agent, s.traffic_rate_per_agent);
    assert_eq!(half.pass, s.pass);
    assert_eq!(half.steps[3].share, Some(0.25));
    half.validate().expect("a scaled scenario stays valid");
}

#[test]
fn for_run_precedence() {
    let s = Scenario::from_toml_str(FULL).expect("valid scenario");

    let plain = s.for_run(false, None, None).expect("valid");
    assert_eq!(plain, s);

    let short = s.for_run(true, None, None).expect("valid");
    assert_eq!((short.agents, short.duration_s), (2, 30.0));

    let short_agents = s.for_run(true, Some(7), None).expect("valid");
    assert_eq!((short_agents.agents, short_agents.duration_s), (7, 30.0));

    let short_scale = s.for_run(true, None, Some(0.1)).expect("valid");
    assert_eq!((short_scale.agents, short_scale.duration_s), (2, 6.0));
    assert_eq!(short_scale.steps[1].at_s, 1.0);

    let all = s.for_run(true, Some(5), Some(2.0)).expect("valid");
    assert_eq!((all.agents, all.duration_s), (5, 120.0));

    let long = s.for_run(false, Some(1), Some(0.5)).expect("valid");
    assert_eq!((long.agents, long.duration_s), (1, 30.0));

    let no_short = Scenario::from_toml_str(MINIMAL).expect("valid scenario");
    assert_eq!(no_short.for_run(true, None, None).expect("valid"), no_short);
}

#[test]
fn for_run_refuses_bad_flags() {
    let s = Scenario::from_toml_str(MINIMAL).expect("valid scenario");
    for (agents, scale, field) in [
        (Some(0), None, "--agents"),
        (None, Some(0.0), "--time-scale"),
        (None, Some(-1.0), "--time-scale"),
        (None, Some(f64::NAN), "--time-scale"),
        (None, Some(f64::INFINITY), "--time-scale"),
    ] {
        match s.for_run(false, agents, scale) {
            Err(ScenarioError::Invalid { field: got, .. }) => assert_eq!(got, field),
            other => panic!("expected {field} refused, got {other:?}"),
        }
    }
}

#[test]
fn shipped_scenarios_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("readable directory").path();
        if path.extension().is_some_and(|e| e == "toml") {
            let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            s.for_run(true, None, None)
                .unwrap_or_else(|e| panic!("{}: --short: {e}", path.display()));
        }
    }
}

#[test]
fn load_reads_a_file_and_names_it_in_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = dir.path().join("good.toml");
    std::fs::write(&good, FULL).expect("write");
    assert_eq!(
        Scenario::load(&good).expect("valid").name,
        "drain-and-crash"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("{MINIMAL}bogus = 1\n")).expect("write");
    match Scenario::load(&bad) {
        Err(ScenarioError::Parse { origin, .. }) => {
            assert_eq!(origin, bad.display().to_string())
        }
        other => panic!("expected a parse error, got {other:?}"),
    }

    let missing = dir.path().join("missing.toml");
    let err = Scenario::load(&missing).unwrap_err();
    assert!(matches!(err, ScenarioError::Io { .. }), "{err}");
    assert!(err.to_string().contains("missing.toml"), "{err}");
}
