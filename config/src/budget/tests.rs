//! The calculator's tests: every row recomputed from the documented
//! formulas, the SLO violations and warnings each risky setting gives, and
//! the table.

use super::*;
use crate::{AgentConfig, ArbiterConfig, CheckTiming};

const EPSILON_MS: f64 = 1e-9;

/// An agent with a zone key: gossip runs.
fn gossiping() -> AgentConfig {
    let mut agent = AgentConfig::default();
    agent.gossip.key_file = Some("zone.key".into());
    agent
}

/// Issue 37, item 4: without `gossip.key_file` gossip does not run, so
/// a silent node crash has the lease path alone, and a pause is
/// tolerated until the lease can expire.
#[test]
fn without_a_zone_key_the_lease_is_the_only_path() {
    let arbiter = ArbiterConfig::default();
    let off = Budget::compute(&AgentConfig::default(), &arbiter);
    let on = Budget::compute(&gossiping(), &arbiter);
    let node = row(&off, Case::SilentNodeCrash);
    assert_eq!(node.paths.len(), 1);
    assert_eq!(node.paths[0], row(&on, Case::SilentNodeCrash).paths[1]);
    assert_ms(
        node.worst_ms(),
        on.row(Case::SilentNodeCrash).unwrap().paths[1].worst_ms(),
        "lease",
    );
    assert_eq!(
        node.dominant().map(|s| s.path.as_str()),
        Some("arbiter.lease.ttl_ms")
    );
    let ttl = arbiter.lease.ttl_ms as f64;
    assert_ms(
        off.pause.tolerated_ms,
        ttl - ttl / 3.0,
        "pause without gossip",
    );
    assert!(
        off.pause.to_string().contains("gossip is off"),
        "{}",
        off.pause
    );
    assert!(!off.to_string().contains("gossip path"), "{off}");
}

fn row(report: &BudgetReport, case: Case) -> &BudgetRow {
    report.row(case).expect("every case has a row")
}

fn assert_ms(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() < EPSILON_MS,
        "{what}: {actual} ms, expected {expected} ms"
    );
}

#[test]
fn the_pause_a_preset_tolerates_is_named() {
    let report = Budget::compute(&gossiping(), &ArbiterConfig::default());
    // lan: 350 + 1200 − 200 ms of gossip, then the probe's 1000 ms.
    assert_ms(report.pause.gossip_ms, 1_350.0, "lan gossip");
    assert_ms(report.pause.tolerated_ms, 2_350.0, "lan");
    assert_eq!(report.pause.preset, "lan");
    let mut agent = gossiping();
    agent.gossip.preset = crate::GossipPreset::Tolerant;
    let report = Budget::compute(&agent, &ArbiterConfig::default());
    assert_ms(report.pause.tolerated_ms, 3_400.0, "tolerant");
    assert!(
        report
            .pause
            .to_string()
            .starts_with("process pauses tolerated: up to 3.40 s (gossip preset tolerant"),
        "{}",
        report.pause
    );
    agent.gossip.suspect_to_down_ms = Some(5_000);
    let report = Budget::compute(&agent, &ArbiterConfig::default());
    assert_eq!(report.pause.preset, "tolerant with overrides");
}

#[test]
fn defaults_meet_every_slo_without_warnings() {
    let report = Budget::compute(&AgentConfig::default(), &ArbiterConfig::default());
    assert_eq!(report.violations(), Vec::<String>::new());
    assert_eq!(report.warnings, Vec::<String>::new());
}

/// Every row recomputed here from the settings with the documented
/// formulas, independently of the calculator's term lists.
#[test]
fn default_rows_follow_the_formulas() {
    let mut agent = gossiping();
    // A fan-out that is not zero, so its term is checked too.
    agent.budget.followers = 32;
    agent.budget.fanout_us = 400;
    let arbiter = ArbiterConfig::default();
    let report = Budget::compute(&agent, &arbiter);

    let r = agent.checks.readiness;
    let (i, t, f, j) = (
        r.interval_ms as f64,
        r.timeout_ms as f64,
        f64::from(r.failure_threshold),
        r.jitter,
    );
    let b = &agent.budget;
    let (c, cw) = (b.commit_ms as f64, b.commit_worst_ms as f64);
    let window = arbiter.distribution.coalesce_window_ms as f64;
    let fanout = f64::from(b.followers - 1) * b.fanout_us as f64 / 1000.0;
    let p = b.network_ms as f64 + b.apply_ms as f64 + fanout;
    let pw = window
        + b.network_worst_ms as f64
        + b.apply_ms as f64
        + fanout
        + f64::from(agent.dns_ttl_s) * 1000.0;

    let probes = (f - 0.5) * i * (1.0 + j / 2.0);
    let probes_w = f * i * (1.0 + j);
    let a = row(&report, Case::ReadinessFailure);
    assert_ms(a.expected_ms(), probes + t + c + p, "(a) expected");
    assert_ms(a.worst_ms(), probes_w + t + cw + pw, "(a) worst");
    assert_ms(a.post_commit_worst_ms(), pw, "(a) after commit");

    let crash = row(&report, Case::ProcessCrashProbe);
    assert_ms(crash.expected_ms(), probes + c + p, "(b) expected");
    assert_ms(crash.worst_ms(), probes_w + cw + pw, "(b) worst");

    let session = row(&report, Case::ProcessCrashSession);
    assert_ms(session.expected_ms(), c + p, "(b′) expected");
    assert_ms(session.worst_ms(), cw + pw, "(b′) worst");

    let swim = agent.gossip.effective();
    let period = swim.probe_period_ms as f64;
    let suspect = swim.suspect_to_down_ms as f64;
    let probe = arbiter.lease.probe_timeout_ms as f64;
    let ttl = arbiter.lease.ttl_ms as f64;
    let sweep = arbiter.lease.sweep_interval_ms as f64;
    let swim_e = period * std::f64::consts::LN_2 + period + suspect;
    let swim_w = period * 100f64.ln() + period + suspect;
    let wait = arbiter.lease.witness_wait_ms as f64;
    let gossip_e = swim_e + b.network_ms as f64 + probe + c + p;
    // At worst, one node left in the zone reports it: its witnesses wait.
    let gossip_w = swim_w + b.network_worst_ms as f64 + probe + wait + cw + pw;
    // Witnesses: one connect timeout and a round trip (capped at the
    // wait) and half a sweep | the wait and a sweep.
    let witnesses_e =
        (WITNESS_CONNECT_MS as f64 + 2.0 * b.network_ms as f64).min(wait) + sweep / 2.0;
    let witnesses_w = wait + sweep;
    let lease_e = ttl - ttl / 6.0 + sweep / 2.0 + witnesses_e + c + p;
    let lease_w = ttl + sweep + witnesses_w + cw + pw;
    let node = row(&report, Case::SilentNodeCrash);
    assert_ms(node.paths[0].expected_ms(), gossip_e, "(c) gossip expected");
    assert_ms(node.paths[0].worst_ms(), gossip_w, "(c) gossip worst");
    assert_ms(node.paths[1].expected_ms(), lease_e, "(c) lease expected");
    assert_ms(node.paths[1].worst_ms(), lease_w, "(c) lease worst");
    assert_ms(node.expected_ms(), gossip_e.min(lease_e), "(c) expected");
    assert_ms(node.worst_ms(), gossip_w.min(lease_w), "(c) worst");

    let leave = row(&report, Case::Leave);
    assert_ms(leave.expected_ms(), p, "(d) expected");
    assert_ms(leave.worst_ms(), pw, "(d) worst");

    // (e) The next renewal, the silence bound, the backoff, the handshake
    // and Welcome, then the resumed delta; no SLO.
    let silence = agent.arbiter_silence_ms as f64;
    let backoff = agent.reconnect_min_ms as f64;
    let lost = row(&report, Case::LeaveReplicaLost);
    let (n, nw) = (b.network_ms as f64, b.network_worst_ms as f64);
    assert_ms(
        lost.expected_ms(),
        ttl / 6.0 + silence + backoff / 2.0 + 4.0 * n + c + p,
        "(e) expected",
    );
    assert_ms(
        lost.worst_ms(),
        ttl / 3.0 + silence + backoff + 4.0 * nw + cw + pw,
        "(e) worst",
    );
    assert_eq!(lost.slo_ms, None, "(e) is shown, not held to the leave SLO");
}

#[test]
fn slow_gossip_and_long_lease_break_the_silent_crash_slo() {
    let mut agent = gossiping();
    agent.gossip.suspect_to_down_ms = Some(12_000);
    let mut arbiter = ArbiterConfig::default();
    arbiter.lease.ttl_ms = 30_000;
    let violations = Budget::compute(&agent, &arbiter).violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with("silent node crash: worst case "),
        "{}",
        violations[0]
    );
    assert!(
        violations[0].contains("15 s SLO; dominated by agent.gossip.suspect_to_down_ms = 12000"),
        "{}",
        violations[0]
    );
}

#[test]
fn a_long_probe_timeout_dominates_the_gossip_path() {
    let mut arbiter = ArbiterConfig::default();
    arbiter.lease.probe_timeout_ms = 5_000;
    let report = Budget::compute(&gossiping(), &arbiter);
    let node = row(&report, Case::SilentNodeCrash);
    let dominant = node.dominant().expect("a setting dominates");
    assert_eq!(dominant.path, "arbiter.lease.probe_timeout_ms");
}

#[test]
fn slow_readiness_probes_break_the_hard_failure_slo() {
    let mut agent = AgentConfig::default();
    agent.checks.readiness = CheckTiming {
        interval_ms: 5_000,
        failure_threshold: 3,
        ..CheckTiming::READINESS
    };
    let violations = Budget::compute(&agent, &ArbiterConfig::default()).violations();
    for case in [Case::ReadinessFailure, Case::ProcessCrashProbe] {
        let message = violations
            .iter()
            .find(|v| v.starts_with(case.name()))
            .unwrap_or_else(|| panic!("no violation for {}: {violations:?}", case.name()));
        assert!(
            message.contains("dominated by agent.checks.readiness.interval_ms = 5000"),
            "{message}"
        );
    }
}

#[test]
fn wide_coalescing_and_dns_ttl_break_the_leave_slo() {
    let agent = AgentConfig {
        dns_ttl_s: 3,
        ..AgentConfig::default()
    };
    let mut arbiter = ArbiterConfig::default();
    arbiter.distribution.coalesce_window_ms = 250;
    let violations = Budget::compute(&agent, &arbiter).violations();
    let leave = violations
        .iter()
        .find(|v| v.starts_with(Case::Leave.name()))
        .expect("leave violates");
    assert!(
        leave.contains("3 s SLO; dominated by agent.dns_ttl_s = 3"),
        "{leave}"
    );
    let after_commit = violations
        .iter()
        .find(|v| v.starts_with(Case::ReadinessFailure.name()))
        .expect("readiness failure's post-commit part violates");
    assert!(after_commit.contains("after the commit"), "{after_commit}");
    assert!(
        after_commit.contains("agent.dns_ttl_s = 3"),
        "{after_commit}"
    );
}

/// Raising any duration, threshold or jitter never lowers a row's
/// expected or worst time.
#[test]
fn raising_a_setting_never_lowers_a_row() {
    type Knob = fn(&mut AgentConfig, &mut ArbiterConfig);
    let knobs: [(&str, Knob); 15] = [
        ("readiness interval", |a, _| {
            a.checks.readiness.interval_ms += 700
        }),
        ("readiness timeout", |a, _| {
            a.checks.readiness.timeout_ms += 300
        }),
        ("readiness failures", |a, _| {
            a.checks.readiness.failure_threshold += 1
        }),
        ("readiness jitter", |a, _| a.checks.readiness.jitter += 0.05),
        ("probe period", |a, _| {
            let s = a.gossip.effective();
            a.gossip.probe_period_ms = Some(s.probe_period_ms + 400);
        }),
        ("suspect to down", |a, _| {
            let s = a.gossip.effective();
            a.gossip.suspect_to_down_ms = Some(s.suspect_to_down_ms + 900);
        }),
        ("dns ttl", |a, _| a.dns_ttl_s += 1),
        ("commit worst", |a, _| a.budget.commit_worst_ms += 40),
        ("network worst", |a, _| a.budget.network_worst_ms += 40),
        ("probe timeout", |_, r| r.lease.probe_timeout_ms += 300),
        ("lease ttl", |_, r| r.lease.ttl_ms += 3_000),
        ("sweep", |_, r| r.lease.sweep_interval_ms += 200),
        ("coalesce window", |_, r| {
            r.distribution.coalesce_window_ms += 25
        }),
        ("arbiter silence", |a, _| a.arbiter_silence_ms += 250),
        ("reconnect min", |a, _| a.reconnect_min_ms += 50),
    ];
    for (name, raise) in knobs {
        let mut agent = gossiping();
        let mut arbiter = ArbiterConfig::default();
        let mut before = Budget::compute(&agent, &arbiter);
        for _ in 0..10 {
            raise(&mut agent, &mut arbiter);
            let after = Budget::compute(&agent, &arbiter);
            for (old, new) in before.rows.iter().zip(&after.rows) {
                assert!(
                    new.worst_ms() >= old.worst_ms() && new.expected_ms() >= old.expected_ms(),
                    "raising {name} lowered {}",
                    old.name()
                );
            }
            before = after;
        }
    }
}

#[test]
fn frequent_keep_alives_are_a_warning_not_a_violation() {
    let agent = AgentConfig {
        keepalive_ms: 500,
        ..AgentConfig::default()
    };
    let report = Budget::compute(&agent, &ArbiterConfig::default());
    assert_eq!(report.violations(), Vec::<String>::new());
    assert_eq!(report.warnings.len(), 1);
    assert!(
        report.warnings[0].contains("agent.keepalive_ms = 500")
            && report.warnings[0].contains("10000 a second"),
        "{}",
        report.warnings[0]
    );
}

#[test]
fn table_lists_every_case_and_both_node_crash_paths() {
    let report = Budget::compute(&gossiping(), &ArbiterConfig::default());
    let table = report.to_string();
    assert!(table.starts_with("case "), "{table}");
    assert!(table.contains("worst (p99 for gossip)"), "{table}");
    for row in &report.rows {
        assert!(table.contains(row.name()), "{table}");
    }
    assert!(table.contains("  gossip path"), "{table}");
    assert!(table.contains("  lease path"), "{table}");
}
