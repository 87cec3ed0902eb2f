//! Validation of rollcall (R12): the deterministic fleet-scale simulation and
//! the real-process fault harness, their scenario files, reports and plots.
//!
//! Role: produce the evidence for the deadlines of R5 from traffic timelines.
//! The simulator must drive the same state machines the binaries run, never a
//! re-implementation of them.
//!
//! The real-process harness (issue 7): the scenario format (`scenario`),
//! the namespace network (`netns`) and the replicas' delaying relays
//! (`relay`), the test backend (`echo`), the open-loop traffic generator
//! (`traffic`), the runner that builds a cluster and drives a scenario's
//! steps (`runner`), the run's records (`timeline`), and the report and
//! plots computed from them (`report`, `plot`).
//!
//! The fleet-scale simulation (issue 9, `rollcall chaos sim`): `sim`, one
//! deterministic process driving the real state machines of a whole region
//! on a virtual clock, with its scenarios in `chaos/scenarios/sim/`.
//!
//! The fleet bench (issue 19, `rollcall bench fleet`): `bench`, a real
//! arbiter (or Raft group) loaded with thousands of real agent sessions,
//! measured from outside; its fleet has the simulation's shape (`shape`).

pub mod bench;
pub mod degraded;
pub mod echo;
pub mod history;
pub mod netns;
pub mod plot;
pub mod relay;
pub mod report;
pub mod rogue;
pub mod runner;
pub mod scenario;
pub mod shape;
pub mod sim;
pub mod summary;
pub mod timeline;
pub mod traffic;

use std::path::PathBuf;

use rollcall_config::{AgentConfig, ArbiterConfig, ConfigFile};
use rollcall_config::{Budget, Case};

/// `rollcall chaos run`'s arguments.
#[derive(Clone, Debug)]
pub struct RunArgs {
    /// The scenario file.
    pub scenario: PathBuf,
    /// Where report.json, report.md and the run's files go; default
    /// `chaos-reports/<scenario name>`.
    pub report: Option<PathBuf>,
    /// Multiplies every scenario duration (not the system's own timers).
    pub time_scale: Option<f64>,
    /// Seeds the nodes `crash_rounds` and `pause_rounds` pick; recorded in
    /// the report.
    pub seed: u64,
    /// Overrides the scenario's agent count.
    pub agents: Option<u32>,
    /// The CI version of the scenario.
    pub short: bool,
    /// Replaces the scenario's `gossip_preset` (to measure one scenario
    /// with several presets).
    pub gossip_preset: Option<String>,
    /// The `rollcall` binary every process runs.
    pub binary: PathBuf,
    /// The commit that binary was built from, for the report.
    pub build: report::Build,
}

/// Why a scenario could not be run (a run that ran and failed its pass
/// criteria is a `Report` with `pass: false`, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// The scenario file is unusable.
    #[error(transparent)]
    Scenario(#[from] scenario::ScenarioError),
    /// The run could not be carried out.
    #[error(transparent)]
    Run(#[from] runner::RunError),
    /// The report could not be written.
    #[error("writing the report to {dir}: {source}")]
    Write {
        /// The report directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Loads the scenario, runs it in namespaces, computes and writes the
/// report; returns it and the directory it was written to.
pub async fn run(args: &RunArgs) -> Result<(report::Report, PathBuf), ChaosError> {
    let loaded = scenario::Scenario::load(&args.scenario)?;
    let mut scenario = loaded.for_run(args.short, args.agents, args.time_scale)?;
    if let Some(preset) = &args.gossip_preset {
        scenario.gossip_preset = Some(preset.clone());
        scenario.validate()?;
    }
    let dir = args
        .report
        .clone()
        .unwrap_or_else(|| runner::default_dir(&scenario));
    let run_id = format!("{:x}", std::process::id() % 0x10_0000);
    let options = runner::RunOptions {
        binary: args.binary.clone(),
        dir: dir.clone(),
        subnet: free_subnet(),
        run_id,
        seed: args.seed,
    };
    let result = runner::run(&scenario, &options).await?;
    let timeline = result.timeline;
    let input = report::ReportInput {
        scenario: scenario.name.clone(),
        seed: args.seed,
        agents: scenario.agents,
        converge_ms: None,
        false_removals: result.false_removals,
        max_concurrent_snapshots: result.max_concurrent_snapshots,
        snapshots_refused: result.snapshots_refused,
        outage: result.outage,
        connect_timeout_ms: scenario.connect_timeout_ms,
        build: args.build.clone(),
        history: result.history,
        rogue: result.rogue,
        crash_commit_ms: result.crash_commit_ms,
        election: result.election,
        cache_corruption: result.cache_corruption,
        degraded: result.degraded,
    };
    let report = report::compute(&input, &timeline, &scenario.pass);
    // The budget of the settings the run's processes had.
    let (agent_file, arbiter_file) = &result.configs;
    let budget = match (
        AgentConfig::load(agent_file),
        ArbiterConfig::load(arbiter_file),
    ) {
        (Ok(agent), Ok(arbiter)) => Ok(Budget::compute(&agent, &arbiter)),
        (Err(e), _) | (_, Err(e)) => Err(format!("not computed: {e}")),
    };
    let row_of = |case: Case| match &budget {
        Ok(budget) => budget.row(case).ok_or_else(String::new),
        Err(e) => Err(e.clone()),
    };
    let predicted = |case: Case| {
        row_of(case).map_or_else(
            |e| e,
            |row| {
                format!(
                    "expected {:.0} ms, worst {:.0} ms",
                    row.expected_ms(),
                    row.worst_ms()
                )
            },
        )
    };
    let case = crash_case(&timeline);
    // Up to the commit: the detection and commit terms of the fastest path.
    let to_commit = row_of(case).map_or_else(
        |e| e,
        |row| {
            let upto = |path: &rollcall_config::BudgetPath, worst: bool| -> f64 {
                path.terms
                    .iter()
                    .filter(|t| t.phase != rollcall_config::Phase::Propagation)
                    .map(|t| if worst { t.worst_ms } else { t.expected_ms })
                    .sum()
            };
            let expected = row
                .paths
                .iter()
                .map(|p| upto(p, false))
                .fold(f64::INFINITY, f64::min);
            let worst = row
                .paths
                .iter()
                .map(|p| upto(p, true))
                .fold(f64::INFINITY, f64::min);
            format!("expected {expected:.0} ms, worst {worst:.0} ms")
        },
    );
    // The harness starts a leave's clock at the command's proposal time
    // (the audit log's), so the commit is part of what it measures.
    let commit_term = match &budget {
        Ok(budget) => budget
            .rows
            .iter()
            .flat_map(|r| &r.paths)
            .flat_map(|p| &p.terms)
            .find(|t| t.phase == rollcall_config::Phase::Commit)
            .map(|t| (t.expected_ms, t.worst_ms)),
        Err(_) => None,
    };
    let leave_with_commit = row_of(Case::Leave).map_or_else(
        |e| e,
        |row| {
            let (ce, cw) = commit_term.unwrap_or((0.0, 0.0));
            format!(
                "expected {:.0} ms, worst {:.0} ms (commit {ce:.0} | {cw:.0} ms + propagation)",
                row.expected_ms() + ce,
                row.worst_ms() + cw
            )
        },
    );
    let budget_rows = vec![
        ("leave_ms".to_owned(), predicted(Case::Leave)),
        ("leave_view_ms".to_owned(), leave_with_commit),
        ("crash_ms".to_owned(), predicted(case)),
        ("crash_view_ms".to_owned(), predicted(case)),
        ("crash_commit_ms".to_owned(), to_commit),
    ];
    let write_error = |source| ChaosError::Write {
        dir: dir.clone(),
        source,
    };
    // report.json first: nothing later (a plot, the Markdown) may lose it.
    report::write_json(&dir, &report).map_err(write_error)?;
    let timeline_json = serde_json::to_vec(&timeline).expect("a timeline always serializes");
    std::fs::write(dir.join("timeline.json"), timeline_json).map_err(write_error)?;
    let plots = plot::write_all(&dir, &report, &timeline);
    let listed = plots.as_deref().unwrap_or_default();
    report::write_markdown(&dir, &report, &budget_rows, listed).map_err(write_error)?;
    plots.map_err(write_error)?;
    Ok((report, dir))
}

/// The budget row that predicts this run's hard failures: the kind of its
/// first hard failure (a frozen backend is caught by its readiness probe,
/// a killed one by refused probes, a crashed node by gossip or its lease).
fn crash_case(timeline: &timeline::Timeline) -> Case {
    let fault = timeline.events.iter().find_map(|e| match e {
        timeline::Event::HardFailure { fault, .. } => Some(fault.as_str()),
        _ => None,
    });
    match fault {
        Some("freeze-backend") => Case::ReadinessFailure,
        Some("kill-backend") => Case::ProcessCrashProbe,
        _ => Case::SilentNodeCrash,
    }
}

/// A /24 for this run's bridge, 10.S.0.0 with S in 200..250, that no
/// interface of this host uses yet, starting from one the process id
/// picks; two runs at once (a CI run beside a manual one) would otherwise
/// reach each other's agents.
fn free_subnet() -> u8 {
    let used = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let start = (std::process::id() % 50) as u8;
    (0..50u8)
        .map(|k| 200 + (start + k) % 50)
        .find(|s| !used.contains(&format!(" 10.{s}.0.")))
        .unwrap_or(200 + start)
}
