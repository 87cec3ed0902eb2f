//! The scenario file of `rollcall chaos run`: the cluster to build, the
//! traffic to send, the timed fault steps to drive and the pass criteria,
//! as TOML. Parsing refuses unknown keys and validates every value once,
//! naming the dotted field (`steps[2].at_s`), so a typo never silently
//! falls back to a default. This module only describes a run; it must not
//! start processes or read clocks (the runner does).
//!
//! ```toml
//! name = "drain-one"
//! description = "Drain one backend under load; no new connection after 3 s."
//! agents = 3
//! duration_s = 30
//!
//! [short]
//! agents = 2
//! time_scale = 0.5
//!
//! [[steps]]
//! at_s = 10
//! action = "drain"
//! target = "node-1/web-1"
//!
//! [pass]
//! leave_p99_ms = 3000
//! ```

use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod action;
mod pass;
mod step;
pub use action::Action;
pub use pass::{Pass, Routing};
use step::check_actions;
pub use step::Step;

/// Why a scenario file could not be read, parsed or accepted. Every variant
/// names where the problem is (the file, or a dotted field path such as
/// `steps[2].at_s`) so its author can fix it without reading code.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read; the OS error is the `source`.
    #[error("cannot read scenario {}", path.display())]
    Io {
        /// The file that was asked for.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The text is not valid TOML, has a value of the wrong type, or has a
    /// key this format does not know.
    #[error("{origin}: {message}")]
    Parse {
        /// The file path, or `<string>` when parsed from memory.
        origin: String,
        /// The TOML parser's message, with line, column and offending text.
        message: String,
    },
    /// The file parsed but a value breaks a rule (or a command-line
    /// override such as `--time-scale` does).
    #[error("{field} = {value} {reason}")]
    Invalid {
        /// Full dotted path of the field, e.g. `steps[2].at_s`, or the
        /// command-line flag, e.g. `--time-scale`.
        field: String,
        /// The rejected value as written (strings quoted).
        value: String,
        /// The rule it breaks.
        reason: String,
    },
}

impl ScenarioError {
    /// Builds a [`ScenarioError::Invalid`] for `field = value`.
    fn invalid(field: impl Into<String>, value: impl Display, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// Origin named in parse errors of text that did not come from a file.
const INLINE_ORIGIN: &str = "<string>";

/// One chaos scenario: what to build, what traffic to send, which faults to
/// drive when, and what counts as a pass. Obtain one through
/// [`Scenario::from_toml_str`] or [`Scenario::load`], which validate;
/// derive a run's effective scenario with [`Scenario::for_run`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name; names the report. Must not be empty.
    pub name: String,
    /// What the scenario shows and why, for the report's reader.
    pub description: String,
    /// Agents (nodes) in the cluster. At least 1; default 3.
    #[serde(default = "default_agents")]
    pub agents: u32,
    /// Test backends started on each agent at the beginning. Default 2; 0
    /// is allowed for scenarios that start their instances in a step.
    #[serde(default = "default_instances_per_agent")]
    pub instances_per_agent: u32,
    /// Zones the agents are spread over, round robin: node-i is in zone
    /// `z{i % zones + 1}`, and each zone gossips on its own. At least 1 and
    /// at most `agents`; default 1.
    #[serde(default = "default_zones")]
    pub zones: u32,
    /// Arbiter replicas in the run's Raft group: 1, 3 or 5. Default 1.
    #[serde(default = "default_arbiters")]
    pub arbiters: u32,
    /// The service the backends register and the traffic resolves.
    /// Must not be empty; default "web".
    #[serde(default = "default_service")]
    pub service: String,
    /// How long the run lasts, in seconds. Greater than 0.
    pub duration_s: f64,
    /// New connections per second the traffic generator opens through each
    /// agent's proxy (open loop: the rate does not slow when connections
    /// fail). Greater than 0; default 50.
    #[serde(default = "default_traffic_rate_per_agent")]
    pub traffic_rate_per_agent: f64,
    /// How long the traffic generator waits for a backend to answer before
    /// it records the connection as failed, in ms. At least 1; default 1000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// The reduced version CI runs with `--short`; absent means `--short`
    /// changes nothing.
    #[serde(default)]
    pub short: Option<Short>,
    /// The scenario needs the fault points of a binary built with
    /// `--features fault-injection` (dropped and corrupted deltas, cut
    /// watch streams); the runner refuses to start it, saying so, with a
    /// binary that lacks them. Default false.
    #[serde(default)]
    pub needs_fault_injection: bool,
    /// The fault points' settings, given to every arbiter replica as
    /// `ROLLCALL_FAULTS` for the whole run (e.g.
    /// "drop_delta=0.05,corrupt_delta=0.02,cut_session=0.01"). Requires
    /// `needs_fault_injection = true`.
    #[serde(default)]
    pub faults: Option<String>,
    /// Services besides `service` every agent follows from start
    /// (`services` of its config), each with one record node-0 registers
    /// at start that never becomes READY (its readiness port has no
    /// listener): they carry no traffic but make every agent's start fetch
    /// that many snapshots, as an agent of a real fleet does. Default 0.
    #[serde(default)]
    pub extra_services: u32,
    /// The agents' SWIM preset (`gossip.preset`: "lan", "tolerant" or
    /// "wan"); unset: the agent's default.
    #[serde(default)]
    pub gossip_preset: Option<String>,
    /// TOML appended to every arbiter replica's config (the harness writes
    /// `name`, `listen`, `admin`, `data_dir`, `[tls]` and `[raft]`), e.g.
    /// "[distribution]\nmax_concurrent_snapshots = 2". The arbiter
    /// validates it at start like any config.
    #[serde(default)]
    pub arbiter_toml: Option<String>,
    /// TOML appended to every agent's config (the harness writes its
    /// identity, listeners, `[tls]`, `[gossip]`, `[budget]` and the
    /// `[[proxy]]`), e.g. "[staleness]\nmax_age_ms = 5000". The agent
    /// validates it at start like any config.
    #[serde(default)]
    pub agent_toml: Option<String>,
    /// Regions in the run: 1 (the default) is one region, `r1`; with 2 to
    /// 5, regions `r2`, `r3`, … each get a host of their own (a namespace
    /// holding its arbiter, one gateway agent with an ingress, and
    /// `remote_instances` backends of the service), every region (r1
    /// included) runs a `rollcall bridge` in a namespace of its own, and
    /// the bridges dial each other, so `cut_bridge` can cut one region
    /// pair's link and nothing else.
    #[serde(default = "default_regions")]
    pub regions: u32,
    /// Backends of the service in each region other than r1. Default 1.
    #[serde(default = "default_remote_instances")]
    pub remote_instances: u32,
    /// The bridges' `summary_max_age_ms`: a remote region's summary older
    /// than this is no failover target. Default 5000; at least 2000 (twice
    /// the bridges' 1000 ms `sync_interval_ms`).
    #[serde(default = "default_summary_max_age_ms")]
    pub summary_max_age_ms: u64,
    /// The service's policy (`[policy]`, the keys of a policy document
    /// but `service` and `home_region`, which are the scenario's service
    /// and r1), applied at r1's arbiter once every region runs. Needs
    /// `regions` ≥ 2; unset: the service has no policy.
    #[serde(default)]
    pub policy: Option<toml::Table>,
    /// The timed steps, in the order they are written.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// The pass criteria.
    #[serde(default)]
    pub pass: Pass,
}

fn default_agents() -> u32 {
    3
}

fn default_zones() -> u32 {
    1
}

fn default_regions() -> u32 {
    1
}

fn default_remote_instances() -> u32 {
    1
}

fn default_summary_max_age_ms() -> u64 {
    5_000
}

/// Most regions a scenario may have.
pub const MAX_REGIONS: u32 = 5;

fn default_arbiters() -> u32 {
    1
}

fn default_instances_per_agent() -> u32 {
    2
}

fn default_service() -> String {
    "web".to_owned()
}

fn default_traffic_rate_per_agent() -> f64 {
    50.0
}

fn default_connect_timeout_ms() -> u64 {
    1000
}

/// `[short]`: the reduced run CI uses (`--short`), fewer agents and a
/// compressed clock, so the suite fits a CI job while keeping its shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Short {
    /// Agents in the short run. At least 1.
    pub agents: u32,
    /// Factor applied to every scenario duration (see
    /// [`Scenario::scaled`]), in (0, 1]. Default 1. The pass deadlines are
    /// never scaled: they are the product's, not the scenario's.
    #[serde(default = "default_time_scale")]
    pub time_scale: f64,
    /// Replaces the `count` of every `crash_rounds` and `pause_rounds`
    /// step, and of every `rolling_deploy` that sets one (fewer rounds or
    /// waves, each as long as in the full run). At least 1 when set.
    #[serde(default)]
    pub rounds: Option<u32>,
    /// Replaces the run's `duration_s` (before the time scale), for a
    /// short run with fewer rounds; steps after it are left out. Greater
    /// than 0 when set.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Replaces `pass.min_leave_samples` (a short run has fewer rounds).
    #[serde(default)]
    pub min_leave_samples: Option<u64>,
    /// Replaces `pass.min_crash_samples` (a short run has fewer rounds).
    #[serde(default)]
    pub min_crash_samples: Option<u64>,
}

fn default_time_scale() -> f64 {
    1.0
}

impl Scenario {
    /// Parses and validates a scenario held in memory.
    pub fn from_toml_str(text: &str) -> Result<Scenario, ScenarioError> {
        Self::parse(text, INLINE_ORIGIN)
    }

    /// Reads, parses and validates a scenario file.
    pub fn load(path: impl AsRef<Path>) -> Result<Scenario, ScenarioError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    fn parse(text: &str, origin: &str) -> Result<Scenario, ScenarioError> {
        let parse_error = |error: toml::de::Error| ScenarioError::Parse {
            origin: origin.to_owned(),
            message: error.to_string().trim_end().to_owned(),
        };
        // Unknown actions are caught on the untyped table first, so the
        // error names `steps[i].action` and lists the valid names rather
        // than serde's "unknown variant" at a line and column.
        let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
        check_actions(&table)?;
        let scenario: Scenario = toml::from_str(text).map_err(parse_error)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Checks every rule; the first broken one is returned, naming its full
    /// dotted field path. [`Scenario::from_toml_str`] and
    /// [`Scenario::load`] call it; call it again after building or changing
    /// a scenario in code.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.name.trim().is_empty() {
            return Err(ScenarioError::invalid(
                "name",
                format!("{:?}", self.name),
                "must not be empty: it names the report",
            ));
        }
        at_least_one("agents", self.agents)?;
        at_least_one("zones", self.zones)?;
        if self.zones > self.agents {
            return Err(ScenarioError::invalid(
                "zones",
                self.zones,
                format!(
                    "must be at most agents ({}): every zone needs a node",
                    self.agents
                ),
            ));
        }
        if self.zones < 2 && self.steps.iter().any(|s| s.action == Action::Rogue) {
            return Err(ScenarioError::invalid(
                "zones",
                self.zones,
                "must be at least 2 for a rogue step: it reports a node of another zone down",
            ));
        }
        if ![1, 3, 5].contains(&self.arbiters) {
            return Err(ScenarioError::invalid(
                "arbiters",
                self.arbiters,
                "must be 1, 3 or 5 (a Raft group keeps a majority with an odd count)",
            ));
        }
        if self.service.trim().is_empty() {
            return Err(ScenarioError::invalid(
                "service",
                format!("{:?}", self.service),
                "must not be empty",
            ));
        }
        positive("duration_s", self.duration_s)?;
        positive("traffic_rate_per_agent", self.traffic_rate_per_agent)?;
        if self.connect_timeout_ms == 0 {
            return Err(ScenarioError::invalid(
                "connect_timeout_ms",
                0,
                "must be at least 1: a zero timeout fails every connection",
            ));
        }
        if let Some(preset) = &self.gossip_preset {
            if !["lan", "tolerant", "wan"].contains(&preset.as_str()) {
                return Err(ScenarioError::invalid(
                    "gossip_preset",
                    format!("{preset:?}"),
                    "must be \"lan\", \"tolerant\" or \"wan\"",
                ));
            }
        }
        if self.faults.is_some() && !self.needs_fault_injection {
            return Err(ScenarioError::invalid(
                "faults",
                format!("{:?}", self.faults.as_deref().unwrap_or_default()),
                "needs needs_fault_injection = true: only a binary built with the fault-injection feature has fault points",
            ));
        }
        if !(1..=MAX_REGIONS).contains(&self.regions) {
            return Err(ScenarioError::invalid(
                "regions",
                self.regions,
                format!("must be 1 to {MAX_REGIONS}"),
            ));
        }
        if self.regions > 1 {
            at_least_one("remote_instances", self.remote_instances)?;
            if self.arbiters != 1 {
                return Err(ScenarioError::invalid(
                    "arbiters",
                    self.arbiters,
                    "must be 1 with regions = 2 or more (r1's bridge holds one replica's operator token)",
                ));
            }
        }
        if self.summary_max_age_ms < 2_000 {
            return Err(ScenarioError::invalid(
                "summary_max_age_ms",
                self.summary_max_age_ms,
                "must be at least 2000: twice the bridges' 1000 ms sync interval",
            ));
        }
        if self.policy.is_some() && self.regions < 2 {
            return Err(ScenarioError::invalid(
                "policy",
                "set",
                "needs regions = 2 or more: a policy says where traffic may move between regions",
            ));
        }
        if let Some(policy) = &self.policy {
            for key in ["service", "home_region"] {
                if policy.contains_key(key) {
                    return Err(ScenarioError::invalid(
                        format!("policy.{key}"),
                        "set",
                        "is the scenario's (its service, homed in r1): leave it out",
                    ));
                }
            }
        }
        let phases: Vec<&str> = self
            .steps
            .iter()
            .filter(|s| s.action == Action::Phase)
            .map(|s| s.target.as_str())
            .collect();
        let known_region = |r: &str| {
            r.strip_prefix('r')
                .and_then(|k| k.parse::<u32>().ok())
                .is_some_and(|k| (1..=self.regions).contains(&k))
        };
        for (i, rule) in self.pass.routing.iter().enumerate() {
            let field = |name: &str| format!("pass.routing[{i}].{name}");
            if !phases.contains(&rule.phase.as_str()) {
                return Err(ScenarioError::invalid(
                    field("phase"),
                    format!("{:?}", rule.phase),
                    "names no phase step of the scenario",
                ));
            }
            for r in rule.answered_by.iter().chain(rule.settled()) {
                if !known_region(r) {
                    return Err(ScenarioError::invalid(
                        field("answered_by"),
                        format!("{r:?}"),
                        format!("is not a region of the run (r1…r{})", self.regions),
                    ));
                }
            }
            if !rule.settle_s.is_finite() || rule.settle_s < 0.0 {
                return Err(ScenarioError::invalid(
                    field("settle_s"),
                    rule.settle_s,
                    "must be at least 0",
                ));
            }
            if !(0.0..=1.0).contains(&rule.min_answered_share) {
                return Err(ScenarioError::invalid(
                    field("min_answered_share"),
                    rule.min_answered_share,
                    "must be in [0, 1]",
                ));
            }
        }
        for (i, step) in self.steps.iter().enumerate() {
            let writers = matches!(
                step.action,
                Action::TransferWriter | Action::ForceWriter | Action::ReadWriters
            );
            let regional = matches!(step.action, Action::CutBridge | Action::HealBridge);
            if (regional || writers) && self.regions < 2 {
                return Err(ScenarioError::invalid(
                    format!("steps[{i}].action"),
                    format!("{:?}", step.action.as_str()),
                    "needs regions = 2 or more",
                ));
            }
            if regional
                && !step.target.is_empty()
                && (!known_region(&step.target) || step.target == "r1")
            {
                return Err(ScenarioError::invalid(
                    format!("steps[{i}].target"),
                    format!("{:?}", step.target),
                    format!(
                        "must be empty (every link of r1) or a region r2…r{}",
                        self.regions
                    ),
                ));
            }
            let moves = matches!(step.action, Action::TransferWriter | Action::ForceWriter);
            if moves && !known_region(&step.target) {
                return Err(ScenarioError::invalid(
                    format!("steps[{i}].target"),
                    format!("{:?}", step.target),
                    format!(
                        "must name the region to take the writes, r1…r{}",
                        self.regions
                    ),
                ));
            }
            let reason = step.reason.as_deref().is_some_and(|r| !r.trim().is_empty());
            if (step.action == Action::ForceWriter) != reason {
                return Err(ScenarioError::invalid(
                    format!("steps[{i}].reason"),
                    format!("{:?}", step.reason.as_deref().unwrap_or("")),
                    "force_writer needs a reason, and only force_writer takes one",
                ));
            }
        }
        if let Some(short) = &self.short {
            at_least_one("short.agents", short.agents)?;
            if let Some(rounds) = short.rounds {
                at_least_one("short.rounds", rounds)?;
            }
            if let Some(duration) = short.duration_s {
                positive("short.duration_s", duration)?;
            }
            time_scale("short.time_scale", short.time_scale)?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            step.validate(i, self.duration_s)?;
        }
        Ok(())
    }

    /// A copy with every scenario duration multiplied by `time_scale`: the
    /// run's `duration_s` and each step's `at_s` and `duration_s`. Traffic
    /// rate, connect timeout and the pass deadlines are kept: they belong
    /// to the product under test, not to the scenario's clock. The factor
    /// should be finite and greater than 0 (see [`Scenario::for_run`],
    /// which checks it); otherwise the copy fails [`Scenario::validate`].
    pub fn scaled(&self, time_scale: f64) -> Scenario {
        let mut scenario = self.clone();
        scenario.duration_s *= time_scale;
        for step in &mut scenario.steps {
            step.at_s *= time_scale;
            if let Some(d) = &mut step.duration_s {
                *d *= time_scale;
            }
            if let Some(every) = &mut step.every_s {
                *every *= time_scale;
            }
        }
        scenario
    }

    /// The scenario a run executes, from the command line's overrides, in
    /// this order: `short` (`--short`) takes `[short]`'s agents and time
    /// scale; then `agents` (`--agents`) replaces the agent count; then
    /// `time_scale` (`--time-scale`) replaces any time scale, `[short]`'s
    /// included. The effective scale is applied through
    /// [`Scenario::scaled`].
    ///
    /// Errors name the flag when `--agents` is 0 or `--time-scale` is not
    /// finite and greater than 0 (values above 1 slow a run down, which is
    /// allowed).
    pub fn for_run(
        &self,
        short: bool,
        agents: Option<u32>,
        time_scale: Option<f64>,
    ) -> Result<Scenario, ScenarioError> {
        let mut scenario = self.clone();
        let mut scale = 1.0;
        if let (true, Some(s)) = (short, &self.short) {
            scenario.agents = s.agents;
            scale = s.time_scale;
            if let Some(duration) = s.duration_s {
                // Steps the shorter run never reaches are left out.
                scenario.duration_s = duration;
                scenario.steps.retain(|step| step.at_s <= duration);
            }
            if let Some(least) = s.min_leave_samples {
                scenario.pass.min_leave_samples = least;
            }
            if let Some(least) = s.min_crash_samples {
                scenario.pass.min_crash_samples = least;
            }
            if let Some(rounds) = s.rounds {
                for step in &mut scenario.steps {
                    let rounds_step =
                        matches!(step.action, Action::CrashRounds | Action::PauseRounds)
                            || (step.action == Action::RollingDeploy && step.count.is_some());
                    if rounds_step {
                        step.count = Some(rounds);
                    }
                }
            }
        }
        if let Some(agents) = agents {
            at_least_one("--agents", agents)?;
            scenario.agents = agents;
        }
        if let Some(x) = time_scale {
            positive("--time-scale", x)?;
            scale = x;
        }
        let scenario = scenario.scaled(scale);
        scenario.validate()?;
        Ok(scenario)
    }
}

fn at_least_one(field: &str, value: u32) -> Result<(), ScenarioError> {
    if value == 0 {
        return Err(ScenarioError::invalid(field, value, "must be at least 1"));
    }
    Ok(())
}

fn positive(field: &str, value: f64) -> Result<(), ScenarioError> {
    if !value.is_finite() || value <= 0.0 {
        return Err(ScenarioError::invalid(
            field,
            value,
            "must be a finite number greater than 0",
        ));
    }
    Ok(())
}

fn time_scale(field: &str, value: f64) -> Result<(), ScenarioError> {
    if !(value > 0.0 && value <= 1.0) {
        return Err(ScenarioError::invalid(
            field,
            value,
            "must be greater than 0 and at most 1",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
