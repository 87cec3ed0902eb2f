//! `rollcall budget` as an operator runs it: the built binary, real files,
//! exit codes and messages.

use std::path::Path;
use std::process::{Command, Output};

fn rollcall_budget(args: &[&Path], flags: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rollcall"));
    command.arg("budget");
    for (flag, path) in flags.iter().zip(args) {
        command.arg(flag).arg(path);
    }
    command.output().expect("the rollcall binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn defaults_meet_every_slo() {
    let output = rollcall_budget(&[], &[]);
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    for case in [
        "readiness failure / app freeze",
        "process crash (probe only)",
        "process crash (session held)",
        "silent node crash",
        "deliberate leave (drain)",
    ] {
        assert!(stdout.contains(case), "{case} missing from:\n{stdout}");
    }
}

/// Issue 37, item 4: the defaults have no zone key, so gossip is off and
/// the lease is the silent crash's only path; with a key both are shown.
#[test]
fn gossip_counts_only_with_a_zone_key() {
    let off = rollcall_budget(&[], &[]);
    let stdout = text(&off.stdout);
    assert!(off.status.success(), "{}", text(&off.stderr));
    assert!(!stdout.contains("gossip path"), "{stdout}");
    assert!(!stdout.contains("gossip.probe_period_ms"), "{stdout}");
    assert!(stdout.contains("arbiter.lease.ttl_ms"), "{stdout}");
    assert!(stdout.contains("gossip is off"), "{stdout}");
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = dir.path().join("agent.toml");
    std::fs::write(&agent, "[gossip]\nkey_file = \"zone.key\"\n").expect("write agent");
    let on = rollcall_budget(&[&agent], &["--config"]);
    let stdout = text(&on.stdout);
    assert!(on.status.success(), "{}", text(&on.stderr));
    assert!(stdout.contains("gossip path"), "{stdout}");
    assert!(stdout.contains("gossip preset lan"), "{stdout}");
}

#[test]
fn slow_gossip_and_long_lease_fail_with_the_setting_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let agent = dir.path().join("agent.toml");
    let arbiter = dir.path().join("arbiter.toml");
    std::fs::write(
        &agent,
        "[gossip]\nkey_file = \"zone.key\"\nsuspect_to_down_ms = 12000\n",
    )
    .expect("write agent");
    std::fs::write(&arbiter, "[lease]\nttl_ms = 30000\n").expect("write arbiter");
    let output = rollcall_budget(&[&agent, &arbiter], &["--config", "--arbiter-config"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: silent node crash"), "{stderr}");
    assert!(stderr.contains("15 s SLO"), "{stderr}");
    assert!(
        stderr.contains("agent.gossip.suspect_to_down_ms = 12000"),
        "{stderr}"
    );
}

#[test]
fn invalid_configs_are_rejected_with_the_field_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let invalid = dir.path().join("invalid.toml");
    std::fs::write(
        &invalid,
        "[checks.readiness]\ninterval_ms = 5000\ntimeout_ms = 6000\n",
    )
    .expect("write agent");
    let output = rollcall_budget(&[&invalid], &["--config"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "error: agent config: agent.checks.readiness.timeout_ms = 6000 must be below interval_ms = 5000"
        ),
        "{stderr}"
    );

    let unknown = dir.path().join("unknown.toml");
    std::fs::write(&unknown, "[checks.readiness]\njiter = 0.2\n").expect("write agent");
    let output = rollcall_budget(&[&unknown], &["--config"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("error: agent config: {}: ", unknown.display())),
        "{stderr}"
    );
    assert!(stderr.contains("unknown field `jiter`"), "{stderr}");
}

#[test]
fn missing_file_is_reported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope.toml");
    let output = rollcall_budget(&[&missing], &["--arbiter-config"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot read"), "{stderr}");
}
