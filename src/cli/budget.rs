//! `rollcall budget`: the failure-detection budget of an agent and an
//! arbiter configuration against the SLOs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use rollcall_config::{AgentConfig, ArbiterConfig, Budget, ConfigError, ConfigFile};

use crate::EXIT_VIOLATIONS;

#[derive(Debug, Args)]
pub(crate) struct BudgetArgs {
    /// Agent config file; built-in defaults when omitted.
    #[arg(long = "config", value_name = "AGENT_TOML")]
    agent_config: Option<PathBuf>,
    /// Arbiter config file; built-in defaults when omitted.
    #[arg(long, value_name = "ARBITER_TOML")]
    arbiter_config: Option<PathBuf>,
}

/// Prints the budget table to stdout, warnings and violations to stderr.
pub(crate) fn budget(args: &BudgetArgs) -> anyhow::Result<ExitCode> {
    let agent = load(args.agent_config.as_deref(), "agent", |p| {
        AgentConfig::load(p)
    })?;
    let arbiter = load(args.arbiter_config.as_deref(), "arbiter", |p| {
        ArbiterConfig::load(p)
    })?;
    let report = Budget::compute(&agent, &arbiter);
    print!("{report}");
    println!("\n{}", report.pause);
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
