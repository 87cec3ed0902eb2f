//! `rollcall bench`: the fleet benchmark that loads a real arbiter with
//! thousands of agent sessions, and the worker processes it starts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::chaos::build_info;
use super::runtime::{init_process, stop_signal};
use crate::EXIT_VIOLATIONS;

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Load a real arbiter (or Raft group) with thousands of real agent
    /// sessions: each simulated agent is the agent's own state machine on
    /// its own QUIC/mTLS session. Runs the setup (connect, register,
    /// follow), then the scenarios, and writes report.json, report.md and
    /// SVG plots. Exits 0 when every figure has its samples, 1 when the
    /// run measured less than it claims (undelivered changes, a phase cut
    /// short, no convergence), 2 when it cannot run. Targets missed are
    /// reported, not failed.
    Fleet(BenchFleetArgs),
    /// One worker process of `bench fleet` (started by it, not by hand).
    #[command(hide = true)]
    Worker(BenchWorkerArgs),
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BenchScenario {
    Steady,
    Deploy,
    Storm,
    All,
}

#[derive(Debug, Args)]
pub(crate) struct BenchFleetArgs {
    /// An arbiter replica's QUIC address to load (repeatable); without it
    /// the bench starts its own group (--spawn).
    #[arg(long = "arbiter", value_name = "ADDR")]
    arbiters: Vec<String>,
    /// Start an arbiter group of N replicas (1 or 3) on loopback as real
    /// processes, and stop it at the end (the default: 1).
    #[arg(long, value_name = "N", conflicts_with = "arbiters")]
    spawn: Option<usize>,
    /// With --arbiter: the directory holding the region's ca.crt and
    /// ca.key (as `rollcall certs` writes them), from which each agent's
    /// certificate is issued.
    #[arg(long, value_name = "DIR", requires = "arbiters")]
    certs: Option<PathBuf>,
    /// With --arbiter: a replica's admin address, for its /metrics
    /// (repeatable, in the order of --arbiter).
    #[arg(long, value_name = "ADDR", requires = "arbiters")]
    admin: Vec<SocketAddr>,
    /// Simulated agents, one session each.
    #[arg(long, value_name = "N", default_value_t = 5_000)]
    agents: u32,
    /// Instances, spread over the agents.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    instances: u32,
    /// Services, sized by a Zipf-like law as in the fleet simulation.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    services: u32,
    /// Services each agent follows, skewed towards the popular ones.
    #[arg(long, value_name = "N", default_value_t = 20)]
    follow: u32,
    /// What to run after the setup.
    #[arg(long, value_enum, default_value = "all")]
    scenario: BenchScenario,
    /// Length of steady, and the window the deploy's replacements are
    /// spread over, s.
    #[arg(long, value_name = "S", default_value_t = 120.0)]
    duration_s: f64,
    /// Report directory (its work/ holds configs and logs of the run).
    #[arg(long, value_name = "DIR", default_value = "bench-reports/fleet")]
    report: PathBuf,
    /// Seed of the plan (who runs and follows what, what is replaced).
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Worker processes that share the agents (the load generator's cores).
    #[arg(long, value_name = "K", default_value_t = 1)]
    procs: u32,
}

#[derive(Debug, Args)]
pub(crate) struct BenchWorkerArgs {
    /// The settings file the coordinator wrote.
    #[arg(long, value_name = "FILE")]
    settings: PathBuf,
    /// Which worker this is.
    #[arg(long, value_name = "K")]
    index: u32,
}

/// Runs the fleet benchmark and prints its headline figures.
pub(crate) async fn fleet(args: BenchFleetArgs) -> anyhow::Result<ExitCode> {
    use rollcall_chaos::bench;
    let binary = std::env::current_exe().context("finding the rollcall binary")?;
    let fleet = bench::FleetArgs {
        spawn: args.spawn.unwrap_or(1),
        arbiters: args.arbiters,
        admin: args.admin,
        certs: args.certs,
        shape: bench::plan::Shape {
            agents: args.agents,
            instances: args.instances,
            services: args.services,
            follow: args.follow,
            zones: 3.min(args.agents.max(1)),
            deploy_share: 0.1,
            storm_share: 0.02,
            wipe_share: 0.1,
            seed: args.seed,
        },
        scenario: match args.scenario {
            BenchScenario::Steady => bench::Scenario::Steady,
            BenchScenario::Deploy => bench::Scenario::Deploy,
            BenchScenario::Storm => bench::Scenario::Storm,
            BenchScenario::All => bench::Scenario::All,
        },
        duration_s: args.duration_s,
        report: args.report.clone(),
        procs: args.procs,
        binary,
        build: build_info(),
    };
    // Ctrl-C or SIGTERM drops the run, which stops every process it started.
    let report = tokio::select! {
        report = bench::run(&fleet) => report?,
        _ = stop_signal() => anyhow::bail!("stopped; every process the bench started was stopped"),
    };
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
    println!(
        "fleet bench: {} — deploy leave p99 {}, commit → applied p99 {}, storm converged in {}; report in {}",
        if report.failures.is_empty() { "measured" } else { "INCOMPLETE" },
        ms(report.deploy.as_ref().and_then(|d| d.leave.p99_ms)),
        ms(report.deploy.as_ref().and_then(|d| d.applied.p99_ms)),
        report
            .storm
            .as_ref()
            .and_then(|s| s.converge_s)
            .map_or("-".into(), |s| format!("{s:.1} s")),
        args.report.display()
    );
    for failure in &report.failures {
        eprintln!("  {failure}");
    }
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS)
    })
}

/// Runs one worker of `bench fleet` (its own process, started by it).
pub(crate) fn worker(args: &BenchWorkerArgs) -> anyhow::Result<ExitCode> {
    init_process();
    rollcall_chaos::bench::worker::run(&args.settings, args.index)
        .map(|()| ExitCode::SUCCESS)
        .map_err(anyhow::Error::from)
}
