//! Every chaos scenario's CI version (issue 7): `rollcall chaos run
//! chaos/scenarios/<name>.toml --short`, one scenario at a time in this one
//! test, so they never share the cores with each other. Each builds real
//! processes in network namespaces (root needed; CI runs as root) and must
//! pass its own criteria; the report must follow the published schema.
//! Run times are in the reports; nothing here asserts a timing beyond the
//! scenarios' SLO bounds (3 s / 15 s).

use std::process::Command;

const REPORT_KEYS: [&str; 30] = [
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
];

/// The scenarios issues 7, 18, 36 and 38 ask for; each must have its file.
const REQUIRED: [&str; 24] = [
    "pauses-2s",
    "backend-kill",
    "correlated-crash",
    "zone-crash",
    "arbiter-cut",
    "snapshot-stampede",
    "rolling-deploy",
    "not-ready",
    "app-freeze",
    "node-crash",
    "pauses",
    "zone-partition",
    "follower-lag",
    "leader-kill",
    "quorum-loss",
    "arbiter-outage",
    "arbiter-outage-degrade",
    "wire-faults",
    "cache-corruption",
    "reconnect-storm",
    "bad-probe",
    "region-partition",
    "writer-transfer",
    "rogue-agent",
];

#[test]
fn every_scenario_passes_its_short_version() {
    let scenarios = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("chaos/scenarios");
    let mut names: Vec<_> = std::fs::read_dir(&scenarios)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    names.sort();
    for required in REQUIRED {
        assert!(
            names
                .iter()
                .any(|p| p.file_stem().is_some_and(|s| s == required)),
            "chaos/scenarios/{required}.toml is missing"
        );
    }
    let out = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    // Namespaces that exist before (another run on this host) are not ours.
    let before = namespaces();
    for path in names {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let report = out.path().join(&name);
        let run = Command::new(env!("CARGO_BIN_EXE_rollcall"))
            .args(["chaos", "run"])
            .arg(&path)
            .args(["--short", "--report"])
            .arg(&report)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&run.stdout);
        let stderr = String::from_utf8_lossy(&run.stderr);
        eprintln!("{name}: exit {:?}\n{stdout}{stderr}", run.status.code());
        let json: serde_json::Value = match std::fs::read(report.join("report.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Err(e) => {
                failed.push(format!("{name}: no report.json ({e}): {stderr}"));
                continue;
            }
        };
        let keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        for key in REPORT_KEYS {
            assert!(keys.contains(&key), "{name}: report.json lacks {key}");
        }
        assert_eq!(
            keys.len(),
            REPORT_KEYS.len(),
            "{name}: extra keys in {keys:?}"
        );
        for file in ["report.md", "timeline.json", "traffic.svg", "cdf.svg"] {
            assert!(report.join(file).exists(), "{name}: {file} missing");
        }
        if !run.status.success() || json["pass"] != true {
            failed.push(format!("{name}: {}", json["failures"]));
        }
        // The binary under test is this tree's: the report says which.
        assert!(
            json["git_commit"].as_str().is_some_and(|c| !c.is_empty()),
            "{name}: no git_commit"
        );
    }
    // Nothing of a run is left behind.
    let left: Vec<String> = namespaces()
        .into_iter()
        .filter(|n| n.starts_with("rc") && !before.contains(n))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    assert!(failed.is_empty(), "scenarios failed: {failed:#?}");
}

/// The names in `ip netns list`.
fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}
