//! `rollcall bench fleet` as an operator runs it, at CI size: the built
//! binary starts its own arbiter (a real process with its redb store),
//! two worker processes of real agent sessions, runs every scenario for a
//! few seconds and writes its report. Judged on what it measured — every
//! phase done, every change delivered to every follower, the storm
//! converged within the bound on snapshots — never on time.

use std::path::Path;
use std::process::{Command, Output};

fn bench(report: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rollcall"))
        .args(["bench", "fleet", "--report"])
        .arg(report)
        .args(args)
        .output()
        .expect("the rollcall binary runs")
}

/// What a failed run printed, with the tail of its processes' logs.
fn explain(output: &Output, report: &Path) -> String {
    let mut text = format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if let Ok(entries) = std::fs::read_dir(report.join("work")) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                text += &format!("\n--- {} (last lines)\n", path.display());
                for line in tail.into_iter().rev() {
                    text += line;
                    text.push('\n');
                }
            }
        }
    }
    text
}

#[test]
fn a_small_fleet_bench_measures_every_scenario_and_delivers_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let report_dir = dir.path().join("fleet");
    let output = bench(
        &report_dir,
        &[
            "--spawn",
            "1",
            "--procs",
            "2",
            "--agents",
            "50",
            "--instances",
            "1000",
            "--services",
            "40",
            "--follow",
            "5",
            "--duration-s",
            "3",
        ],
    );
    assert!(output.status.success(), "{}", explain(&output, &report_dir));
    let json = std::fs::read(report_dir.join("report.json")).unwrap();
    let r: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(r["failures"], serde_json::json!([]), "{r:#}");
    assert_eq!(r["build"]["commit"].as_str().map(str::len), Some(40));

    // The setup: 50 agents and the churn node hold sessions, every
    // instance is registered, every subscription holds its whole service.
    assert_eq!(r["setup"]["sessions"], 51);
    assert_eq!(r["setup"]["endpoints"], 1_000);
    assert_eq!(r["setup"]["subscriptions"], 250);

    // steady: the arbiter's CPU and memory were sampled.
    let steady = &r["steady"]["usage"];
    assert!(steady[0]["cpu_percent"].is_number(), "{steady:#}");
    assert!(steady[0]["rss_max_mib"].as_f64().unwrap() > 0.0);

    // deploy: 10 % replaced, each as three commits, every change applied
    // by every follower of its service.
    let deploy = &r["deploy"];
    assert_eq!(deploy["replacements"], 100);
    assert_eq!(deploy["replaced"], 100);
    assert_eq!(deploy["commit"]["count"], 300, "{deploy:#}");
    assert_eq!(deploy["undelivered"], 0);
    assert!(deploy["applied"]["count"].as_u64().unwrap() > 0);
    assert!(deploy["leave"]["count"].as_u64().unwrap() > 0);
    assert!(deploy["applied"]["p99_ms"].is_number());
    assert!(deploy["deliveries_per_s"]["max"].as_f64().unwrap() > 0.0);

    // storm: every agent came back and holds what the churn changed; the
    // ones not wiped resumed; snapshots never above the bound.
    let storm = &r["storm"];
    assert_eq!(storm["agents"], 50);
    assert!(storm["churn_commits"].as_u64().unwrap() > 0, "{storm:#}");
    assert!(storm["converge_s"].is_number(), "{storm:#}");
    assert_eq!(storm["agent_converge"]["count"], 50);
    assert_eq!(
        storm["resumed_agents"].as_u64().unwrap() + storm["wiped"].as_u64().unwrap(),
        50
    );
    let bound = storm["max_concurrent_snapshots"].as_f64().unwrap();
    assert!(storm["snapshots_in_flight_max"].as_f64().unwrap() <= bound);

    // The table and the plots beside it; the CA key and the arbiter's
    // data are gone, its log and config stay.
    let md = std::fs::read_to_string(report_dir.join("report.md")).unwrap();
    for heading in [
        "## Setup",
        "## steady",
        "## deploy",
        "## storm",
        "## Targets",
    ] {
        assert!(md.contains(heading), "{heading} missing from report.md");
    }
    for plot in ["applied-cdf.svg", "processes.svg", "deliveries.svg"] {
        let svg = std::fs::read_to_string(report_dir.join(plot)).unwrap();
        assert!(svg.trim_end().ends_with("</svg>"), "{plot}");
    }
    let work = report_dir.join("work");
    assert!(work.join("arbiter-1.log").exists());
    assert!(!work.join("certs").exists());
    assert!(!work.join("arbiter-1").exists());
}

#[test]
fn a_bad_flag_is_named_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let report_dir = dir.path().join("fleet");
    let output = bench(&report_dir, &["--instances", "10", "--services", "40"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--instances = 10"), "{stderr}");
    assert!(!report_dir.exists());

    let output = bench(&report_dir, &["--arbiter", "127.0.0.1:7000"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--certs"), "{stderr}");
}

#[test]
fn a_work_directory_the_bench_did_not_make_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("notes.txt"), "mine").unwrap();
    let output = bench(
        dir.path(),
        &[
            "--agents",
            "5",
            "--instances",
            "50",
            "--services",
            "5",
            "--follow",
            "2",
        ],
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("was not made by rollcall bench"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("notes.txt")).unwrap(),
        "mine"
    );
}
