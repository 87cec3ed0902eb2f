//! The chaos harness's commands: `rollcall chaos run`, `sim` and
//! `summary`, and `rollcall echo`, the test backend its scenarios start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::runtime::stop_signal;

#[derive(Debug, Subcommand)]
pub(crate) enum ChaosCommand {
    /// Run a scenario (chaos/scenarios/<name>.toml): builds a cluster of
    /// `rollcall` processes in network namespaces, drives the scenario's
    /// faults while traffic flows through every agent's proxy, and writes
    /// report.json, report.md and timeline.json. Exits 0 when the scenario
    /// passes its criteria, 1 when it fails them, 2 when it cannot run.
    Run(ChaosRunArgs),
    /// Simulate a whole region in one deterministic process
    /// (chaos/scenarios/sim/<name>.toml): 5,000 agents and 100,000
    /// instances by default, the real state machines on a virtual clock.
    /// Writes report.json (with the history's digest), report.md, cdf.svg
    /// and load.svg. Exits 0 when the scenario passes, 1 when it fails, 2
    /// when it cannot run.
    Sim(ChaosSimArgs),
    /// The results table of a set of runs, from DIR/<run>/report.json
    /// (never typed): printed as Markdown, or written into a README
    /// between the lines `<!-- rollcall chaos summary: begin -->` and
    /// `<!-- rollcall chaos summary: end -->`. Exits 2 when a report cannot
    /// be read.
    Summary(ChaosSummaryArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ChaosSummaryArgs {
    /// The directory of run directories (e.g. chaos/results).
    dir: PathBuf,
    /// Write the table into this README between its markers instead of
    /// printing it.
    #[arg(long, value_name = "FILE")]
    readme: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ChaosSimArgs {
    /// The scenario file.
    scenario: PathBuf,
    /// Seed of everything random; the same seed and flags give the same
    /// history and report (but the `wall` figures).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Report directory; default chaos-reports/sim-<scenario name>.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Override the scenario's agent count (instances and services scale).
    #[arg(long, value_name = "N")]
    agents: Option<u32>,
    /// The CI version of the scenario (about 200 agents, shorter).
    #[arg(long)]
    short: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ChaosRunArgs {
    /// The scenario file.
    scenario: PathBuf,
    /// Report directory; default chaos-reports/<scenario name>.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Multiply every scenario duration by X (0.1 = ten times shorter); the
    /// system's own timers are never scaled.
    #[arg(long, value_name = "X")]
    time_scale: Option<f64>,
    /// Recorded in the report.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Override the scenario's agent count.
    #[arg(long, value_name = "N")]
    agents: Option<u32>,
    /// The CI version of the scenario (fewer agents, its own time scale).
    #[arg(long)]
    short: bool,
    /// Run the agents with this gossip preset (lan, tolerant, wan) instead
    /// of the scenario's.
    #[arg(long, value_name = "PRESET")]
    gossip_preset: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct EchoArgs {
    /// Where to listen (`host:port`).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The instance id to answer with.
    #[arg(long, value_name = "ID")]
    id: String,
    /// Close each connection right after the id line instead of holding it.
    #[arg(long)]
    no_hold: bool,
    /// Also serve HTTP health on ADDR: `GET /ready` answers 200, or 503
    /// while the `--not-ready-file` exists; `GET /live` answers 200.
    #[arg(long, value_name = "ADDR")]
    health: Option<SocketAddr>,
    /// While this file exists, `GET /ready` answers 503 (how the chaos
    /// harness fails an instance's readiness).
    #[arg(long, value_name = "PATH", requires = "health")]
    not_ready_file: Option<PathBuf>,
}

/// The commit this binary was built from, and whether its tree had
/// uncommitted changes (build.rs), for the chaos and simulation reports.
pub(crate) fn build_info() -> rollcall_chaos::report::Build {
    rollcall_chaos::report::Build {
        commit: env!("ROLLCALL_GIT_COMMIT").to_owned(),
        dirty: env!("ROLLCALL_GIT_DIRTY") == "true",
    }
}

/// Runs a scenario and prints its verdict.
pub(crate) async fn run(args: ChaosRunArgs) -> anyhow::Result<ExitCode> {
    let binary = std::env::current_exe().context("finding the rollcall binary")?;
    let run = rollcall_chaos::RunArgs {
        scenario: args.scenario,
        report: args.report,
        time_scale: args.time_scale,
        seed: args.seed,
        agents: args.agents,
        short: args.short,
        gossip_preset: args.gossip_preset,
        binary,
        build: build_info(),
    };
    // Ctrl-C or SIGTERM drops the run, which stops its processes and
    // removes its namespaces.
    let outcome = tokio::select! {
        outcome = rollcall_chaos::run(&run) => outcome?,
        _ = stop_signal() => anyhow::bail!("stopped; everything the run started was removed"),
    };
    let (report, dir) = outcome;
    println!(
        "{}: {} — leave p99 {} ms, crash p99 {} ms, failed connections {}; report in {}",
        report.scenario,
        if report.pass { "PASS" } else { "FAIL" },
        report
            .leave_ms
            .p99
            .map_or("-".into(), |v| format!("{v:.0}")),
        report
            .crash_ms
            .p99
            .map_or("-".into(), |v| format!("{v:.0}")),
        report.failed_conns,
        dir.display()
    );
    for failure in &report.failures {
        eprintln!("  {failure}");
    }
    Ok(if report.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Simulates a scenario and prints its verdict.
pub(crate) fn sim(args: ChaosSimArgs) -> anyhow::Result<ExitCode> {
    let sim = rollcall_chaos::sim::SimArgs {
        scenario: args.scenario,
        report: args.report,
        seed: args.seed,
        agents: args.agents,
        short: args.short,
        progress: true,
        build: build_info(),
    };
    let run = rollcall_chaos::sim::simulate(&sim)?;
    let dir = sim
        .report
        .clone()
        .unwrap_or_else(|| rollcall_chaos::sim::default_dir(&run.report.report.scenario));
    rollcall_chaos::sim::write(&dir, &run)?;
    let r = &run.report;
    let p99 = |s: &rollcall_chaos::report::Stats| s.p99.map_or("-".into(), |v| format!("{v:.0}"));
    println!(
        "{}: {} — leave p99 {} ms, crash p99 {} ms, false removals {}, digest {}, {:.1} s wall; report in {}",
        r.report.scenario,
        if r.report.pass { "PASS" } else { "FAIL" },
        p99(&r.report.leave_ms),
        p99(&r.report.crash_ms),
        r.report.false_removals,
        r.digest,
        r.wall.setup_s + r.wall.run_s,
        dir.display()
    );
    for failure in &r.report.failures {
        eprintln!("  {failure}");
    }
    Ok(if r.report.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Prints the results table, or writes it into a README.
pub(crate) fn summary(args: &ChaosSummaryArgs) -> anyhow::Result<ExitCode> {
    use rollcall_chaos::summary;
    let reports = summary::reports(&args.dir)?;
    let table = summary::table(&reports);
    match &args.readme {
        Some(readme) => {
            summary::update_readme(readme, &table)?;
            println!(
                "{}: table of {} runs written",
                readme.display(),
                reports.len()
            );
        }
        None => print!("{table}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Serves `rollcall echo` until it fails.
pub(crate) async fn echo(args: EchoArgs) -> anyhow::Result<ExitCode> {
    let data = rollcall_chaos::echo::serve(args.listen, args.id, !args.no_hold);
    match args.health {
        None => data
            .await
            .with_context(|| format!("echo on {}", args.listen))?,
        Some(health) => {
            let health = rollcall_chaos::echo::serve_health(health, args.not_ready_file);
            tokio::select! {
                r = data => r.with_context(|| format!("echo on {}", args.listen))?,
                r = health => r.context("echo health")?,
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
