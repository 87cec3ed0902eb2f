//! The `rollcall` command: parses arguments and dispatches to the library
//! crates. It holds no logic of its own beyond printing results and
//! choosing exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use rollcall_config::{AgentConfig, ArbiterConfig, Budget, ConfigError, ConfigFile};

/// Exit code when the command ran but found SLO violations.
const EXIT_VIOLATIONS: u8 = 1;
/// Exit code when the command could not run (bad config, unreadable file);
/// clap also uses 2 for usage errors.
const EXIT_UNUSABLE: u8 = 2;

/// rollcall: service discovery for fleets on VMs and bare metal.
///
/// Node agents register and probe local instances, lease arbiters keep the
/// catalog, and callers resolve through the agent on their own host.
#[derive(Debug, Parser)]
#[command(name = "rollcall", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compute the failure-detection budget of a configuration against the
    /// SLOs (leave ≤ 3 s after commit, silent crash ≤ 15 s, both p99).
    ///
    /// Exits 1 when a worst case exceeds its SLO, 2 when a config cannot
    /// be loaded.
    Budget(BudgetArgs),
}

#[derive(Debug, Args)]
struct BudgetArgs {
    /// Agent config file; built-in defaults when omitted.
    #[arg(long = "config", value_name = "AGENT_TOML")]
    agent_config: Option<PathBuf>,
    /// Arbiter config file; built-in defaults when omitted.
    #[arg(long, value_name = "ARBITER_TOML")]
    arbiter_config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Budget(args) => budget(&args),
    };
    outcome.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::from(EXIT_UNUSABLE)
    })
}

/// Prints the budget table to stdout, warnings and violations to stderr.
fn budget(args: &BudgetArgs) -> anyhow::Result<ExitCode> {
    let agent = load(args.agent_config.as_deref(), "agent", |p| {
        AgentConfig::load(p)
    })?;
    let arbiter = load(args.arbiter_config.as_deref(), "arbiter", |p| {
        ArbiterConfig::load(p)
    })?;
    let report = Budget::compute(&agent, &arbiter);
    print!("{report}");
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    let violations = report.violations();
    for violation in &violations {
        eprintln!("error: {violation}");
    }
    Ok(if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS)
    })
}

/// Loads the file when one was given, else the defaults. Read and parse
/// errors name the file themselves; validation errors name the field.
fn load<T: Default>(
    path: Option<&Path>,
    kind: &str,
    load: impl Fn(&Path) -> Result<T, ConfigError>,
) -> anyhow::Result<T> {
    path.map_or_else(
        || Ok(T::default()),
        |path| load(path).with_context(|| format!("{kind} config")),
    )
}
