//! What the report writes: `report.json`'s fields (the public contract)
//! and both files on disk.

use super::*;

#[test]
fn json_fields_are_exactly_the_contract() {
    let input = ReportInput {
        outage: Some((0, 1000)),
        ..input()
    };
    let timeline = Timeline {
        views: Vec::new(),
        region_answers: Vec::new(),
        backend_regions: Default::default(),
        routes: Vec::new(),
        conns: vec![ok(10, "a", "x")],
        events: vec![phase(0, "p")],
        duration_ms: 1000,
    };
    let report = compute(&input, &timeline, &Pass::default());
    let json = serde_json::to_value(&report).expect("serializable");
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
        k.sort();
        k
    };
    let sorted = |names: &[&str]| {
        let mut n: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        n.sort();
        n
    };
    assert_eq!(
        keys(&json),
        sorted(&[
            "scenario",
            "git_commit",
            "git_dirty",
            "seed",
            "agents",
            "duration_s",
            "leave_ms",
            "crash_ms",
            "crash_commit_ms",
            "leave_view_ms",
            "crash_view_ms",
            "converge_ms",
            "new_conns_to_drained",
            "new_conns_to_not_ready",
            "conns",
            "failed_conns",
            "false_removals",
            "view_dips",
            "max_concurrent_snapshots",
            "snapshots_refused",
            "phases",
            "outage",
            "election",
            "history",
            "cache_corruption",
            "degraded",
            "regions",
            "rogue",
            "pass",
            "failures",
        ])
    );
    assert_eq!(
        keys(&json["history"]),
        sorted(&["writes_checked", "lost_writes", "false_removals"])
    );
    let stats = sorted(&["count", "p50", "p99", "max"]);
    assert_eq!(keys(&json["leave_ms"]), stats);
    assert_eq!(keys(&json["crash_ms"]), stats);
    assert_eq!(
        keys(&json["phases"][0]),
        sorted(&["name", "start_s", "end_s", "conns", "failed_conns"])
    );
    assert_eq!(
        keys(&json["outage"]),
        sorted(&["duration_s", "failed_conns_to_live_backends"])
    );
    assert!(json["failures"].is_array());
    assert!(json["pass"].is_boolean());
}

#[test]
fn write_produces_both_files() {
    let report = run(
        vec![ok(4500, "a", "x")],
        vec![phase(0, "all | one"), leave(1000, "x")],
        5000,
    );
    assert!(!report.pass);
    let budget = vec![("leave_ms".to_owned(), "p99 2100 ms".to_owned())];
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("run-1");
    write_json(&out, &report).expect("report.json written");
    let plots = vec!["traffic.svg".to_owned()];
    write_markdown(&out, &report, &budget, &plots).expect("report.md written");

    let json = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    let back: Report = serde_json::from_str(&json).expect("parses back");
    assert_eq!(back, report);

    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(md.contains("**FAIL**"), "{md}");
    assert!(
        md.contains("| figure | measured | budget predicts |"),
        "{md}"
    );
    assert!(
        md.contains("| leave_ms | count 1, p50 3500, p99 3500, max 3500 | p99 2100 ms |"),
        "{md}"
    );
    assert!(md.contains("| crash_ms | count 0 |  |"), "{md}");
    assert!(md.contains("- leave p99 3500 ms exceeds 3000 ms"), "{md}");
    assert!(md.contains("| all \\| one | 0 | 5 | 1 | 0 |"), "{md}");
    assert!(
        md.contains("## Plots\n\n- [traffic.svg](traffic.svg)\n"),
        "{md}"
    );
}
