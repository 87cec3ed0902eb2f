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

/// One `[[steps]]` entry: do `action` to `target` at `at_s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// When, in seconds since the run started. At least 0, at most the
    /// scenario's `duration_s`.
    pub at_s: f64,
    /// What to do.
    pub action: Action,
    /// To what: a node ("node-2"), an instance ("node-1/web-1"), or for
    /// `phase` the phase's name. Default "" (actions on the whole cluster).
    #[serde(default)]
    pub target: String,
    /// How long the fault lasts, in seconds, for actions that undo
    /// themselves (a pause, a partition, a delay). Greater than 0 when set.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// Fraction of the instances a `rolling_deploy` replaces per wave, in
    /// (0, 1].
    #[serde(default)]
    pub share: Option<f64>,
    /// For `delay_follower`: the one-way delay added to every packet to and
    /// from the follower, in ms. At least 1 when set.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// For `crash_rounds` and `pause_rounds`: how many rounds (required);
    /// for `rolling_deploy`: how many waves (default 1). At least 1.
    #[serde(default)]
    pub count: Option<u32>,
    /// For `crash_rounds` and `pause_rounds`: seconds from one round's
    /// start to the next's; greater than `duration_s` (a round's fault
    /// ends before the next begins). Required for those actions, and for a
    /// `rolling_deploy` of several waves (from one wave's start to the
    /// next's).
    #[serde(default)]
    pub every_s: Option<f64>,
    /// For `force_writer` (required): the operator's reason, written to
    /// every region's audit log.
    #[serde(default)]
    pub reason: Option<String>,
}

/// What a step does. The names are the scenario file's, in snake_case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Drain an instance through the local API (READY → DRAINING).
    Drain,
    /// Make an instance's readiness check fail (READY → UNHEALTHY).
    FailReadiness,
    /// SIGSTOP a backend: it stops answering without closing anything.
    FreezeBackend,
    /// kill -9 a backend.
    KillBackend,
    /// Kill a whole node: its agent and every backend on it.
    CrashNode,
    /// SIGSTOP an agent.
    PauseAgent,
    /// SIGCONT a paused agent.
    ResumeAgent,
    /// Cut a node off the arbiter replicas (its zone peers still reach it).
    PartitionNode,
    /// Cut every node of a zone (the target, e.g. "z2") off the arbiter
    /// replicas; the zone's gossip and its traffic keep working.
    PartitionZone,
    /// Cut a node off its zone peers; the arbiter still reaches it.
    PartitionPeers,
    /// Undo every partition and delay.
    Heal,
    /// Delay the traffic to one arbiter follower.
    DelayFollower,
    /// kill -9 the arbiter leader.
    KillLeader,
    /// Stop enough arbiter replicas to lose quorum.
    RemoveQuorum,
    /// Restart the replicas `remove_quorum` stopped.
    RestoreQuorum,
    /// Stop every arbiter replica (a control-plane outage).
    StopArbiters,
    /// Start the replicas `stop_arbiters` stopped.
    StartArbiters,
    /// Corrupt an agent's cache file.
    CorruptCache,
    /// Restart agents (all of them, or the target).
    RestartAgents,
    /// Make a probe flap.
    BadProbe,
    /// Replace the service's instances with new ones, `share` at a time.
    RollingDeploy,
    /// Start new instances.
    StartInstances,
    /// Begin a named phase of the report (the target is its name).
    Phase,
    /// Bring a crashed node back: its frozen agent and backends are killed,
    /// its link restored, and they start again (the agent under a new
    /// epoch, from its data directory).
    RestartNode,
    /// `count` rounds, one every `every_s`: a silent crash of a live node
    /// drawn with the run's seed (the target, when given, names the only
    /// candidates: a node, or a zone "z2"), undone by `restart_node` after
    /// `duration_s` (default 5 s). Each round's crash is a hard failure.
    CrashRounds,
    /// `count` rounds, one every `every_s`: SIGSTOP of a live agent drawn
    /// with the run's seed, resumed after `duration_s` (default 1 s).
    PauseRounds,
    /// Kill every live agent, delete their cache files, and start them all
    /// at once: every agent needs a full snapshot of every service (with
    /// the delta log past their revisions, a snapshot stampede).
    WipeRestartAgents,
    /// Crash several nodes at once (the target: a zone "z2" for all its
    /// nodes, or nodes separated by commas "node-1,node-3").
    CrashNodes,
    /// Cut the bridge link between r1 and the target region ("r2"; empty:
    /// every other region): their bridges' packets to each other vanish,
    /// both ways. Callers, ingress gateways and arbiters are untouched.
    CutBridge,
    /// Restore the bridge link `cut_bridge` cut (same targets); `heal`
    /// restores every one too.
    HealBridge,
    /// kill -9 every running backend of the service in r1 (the target:
    /// empty for every node, or one node), without deregistering: the
    /// readiness probes take them out.
    KillBackends,
    /// Start again every backend `kill_backends` or `kill_backend` killed,
    /// on the same address and with the same registration: its readiness
    /// probe passes and it is READY again.
    RestartBackends,
    /// Move the single-writer service's writes to the target region
    /// (`rollcall policy transfer`), at the arbiter of the region r1's
    /// arbiter names as the owner.
    TransferWriter,
    /// Force the writes to the target region at that region's own arbiter
    /// (`--force --reason`, the step's `reason`): the owner is cut off.
    ForceWriter,
    /// Read every region's writer epoch of the service from its arbiter
    /// (what `[pass] writer_epoch` judges: the last reading).
    ReadWriters,
    /// For `duration_s` (required), a rogue node of zone z1 holding a
    /// valid agent certificate of its own and the zone's gossip key tries
    /// every attack of README's "Security model", round after round,
    /// against each replica in turn (what `[pass] max_rogue_breaches`
    /// judges). Needs two zones.
    Rogue,
}

impl Action {
    /// Every action, in the order the file format lists them.
    pub const ALL: [Action; 36] = [
        Action::Drain,
        Action::FailReadiness,
        Action::FreezeBackend,
        Action::KillBackend,
        Action::CrashNode,
        Action::PauseAgent,
        Action::ResumeAgent,
        Action::PartitionNode,
        Action::PartitionZone,
        Action::PartitionPeers,
        Action::Heal,
        Action::DelayFollower,
        Action::KillLeader,
        Action::RemoveQuorum,
        Action::RestoreQuorum,
        Action::StopArbiters,
        Action::StartArbiters,
        Action::CorruptCache,
        Action::RestartAgents,
        Action::BadProbe,
        Action::RollingDeploy,
        Action::StartInstances,
        Action::Phase,
        Action::RestartNode,
        Action::CrashRounds,
        Action::PauseRounds,
        Action::WipeRestartAgents,
        Action::CrashNodes,
        Action::CutBridge,
        Action::HealBridge,
        Action::KillBackends,
        Action::RestartBackends,
        Action::TransferWriter,
        Action::ForceWriter,
        Action::ReadWriters,
        Action::Rogue,
    ];

    /// The name used in scenario files.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Drain => "drain",
            Action::FailReadiness => "fail_readiness",
            Action::FreezeBackend => "freeze_backend",
            Action::KillBackend => "kill_backend",
            Action::CrashNode => "crash_node",
            Action::PauseAgent => "pause_agent",
            Action::ResumeAgent => "resume_agent",
            Action::PartitionNode => "partition_node",
            Action::PartitionZone => "partition_zone",
            Action::PartitionPeers => "partition_peers",
            Action::Heal => "heal",
            Action::DelayFollower => "delay_follower",
            Action::KillLeader => "kill_leader",
            Action::RemoveQuorum => "remove_quorum",
            Action::RestoreQuorum => "restore_quorum",
            Action::StopArbiters => "stop_arbiters",
            Action::StartArbiters => "start_arbiters",
            Action::CorruptCache => "corrupt_cache",
            Action::RestartAgents => "restart_agents",
            Action::BadProbe => "bad_probe",
            Action::RollingDeploy => "rolling_deploy",
            Action::StartInstances => "start_instances",
            Action::Phase => "phase",
            Action::RestartNode => "restart_node",
            Action::CrashRounds => "crash_rounds",
            Action::PauseRounds => "pause_rounds",
            Action::WipeRestartAgents => "wipe_restart_agents",
            Action::CrashNodes => "crash_nodes",
            Action::CutBridge => "cut_bridge",
            Action::HealBridge => "heal_bridge",
            Action::KillBackends => "kill_backends",
            Action::RestartBackends => "restart_backends",
            Action::TransferWriter => "transfer_writer",
            Action::ForceWriter => "force_writer",
            Action::ReadWriters => "read_writers",
            Action::Rogue => "rogue",
        }
    }

    /// The action named `name` in a scenario file, if there is one.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// The names of every action, comma-separated, for error messages.
    fn names() -> String {
        Action::ALL.map(Action::as_str).join(", ")
    }
}

impl Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `[pass]`: the bounds a run must stay within. Defaults are the R5 SLOs
/// and zero tolerance everywhere else. A judged figure needs samples: a
/// run with fewer leave or crash samples than `min_leave_samples` /
/// `min_crash_samples` (default 1 each), fewer checked writes than
/// `min_writes_checked`, no answered connection, or an audit log it could
/// not read fails, saying it measured nothing; a scenario declares a
/// figure not applicable by setting its minimum to 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pass {
    /// Highest acceptable p99 of the leave time (commit of DRAINING or
    /// UNHEALTHY → last new connection to the instance), in ms. Default
    /// 3000, the leave SLO.
    pub leave_p99_ms: u64,
    /// Highest acceptable p99 of the hard-failure time (fault → last failed
    /// connection it caused), in ms. Default 15000, the hard-failure SLO.
    pub crash_p99_ms: u64,
    /// Most connections acceptable to a backend more than 3 s after its
    /// drain committed. Default 0.
    pub max_new_conns_to_drained: u64,
    /// Most failed connections acceptable during a control-plane outage,
    /// while every backend stays alive. Default 0.
    pub max_failed_conns_to_live_backends_in_outage: u64,
    /// Most instances acceptable that the control plane removed although
    /// they were alive. Default 0.
    pub max_false_removals: u64,
    /// Most view dips acceptable: an instance the scenario left alone that
    /// a live agent's view dropped and later offered again (a local
    /// exclusion the catalog never recorded); unset means not checked.
    pub max_view_dips: Option<u64>,
    /// The agents' `staleness.max_age_ms` when the run checks `degrade`
    /// (README, "Stale copies"): every live agent's resolve answer is
    /// sampled every 100 ms, and each must say it is degraded exactly when
    /// its copy is older than this; at least one must be, and none may be
    /// at the end. Unset means not checked.
    pub degraded_max_age_ms: Option<u64>,
    /// Most full snapshots the arbiter may serve at once (a reconnect
    /// storm's bound); unset means not checked.
    pub max_concurrent_snapshots: Option<u64>,
    /// Fewest full snapshots the arbiter must have served at once, and
    /// then have told at least one more agent to retry: a stampede that
    /// really reached its bound. Unset means not checked.
    pub min_concurrent_snapshots: Option<u64>,
    /// Most connections acceptable to an instance before it was first
    /// READY in the catalog (a deploy's new instances). Default 0.
    pub max_new_conns_to_not_ready: u64,
    /// Longest acceptable time from the last recovery step until every
    /// agent routes to the same set and keeps it, in ms; unset means not
    /// checked. Set, it also fails a run that never converges.
    pub max_converge_ms: Option<u64>,
    /// Most failed connections acceptable over the whole run; unset means
    /// not checked (faults that kill backends fail connections on purpose).
    pub max_failed_conns: Option<u64>,
    /// Fewest leave samples the run must have; 0 declares the leave figure
    /// not applicable. Default 1.
    pub min_leave_samples: u64,
    /// Fewest hard-failure samples the run must have; 0 declares the crash
    /// figure not applicable. Default 1.
    pub min_crash_samples: u64,
    /// Most lost writes acceptable (see `history`). Default 0.
    pub max_lost_writes: u64,
    /// Fewest writes (registrations, drains, deregistrations answered 200
    /// or 202) the history check must have checked. Default 1 (every run
    /// registers its instances).
    pub min_writes_checked: u64,
    /// Most failed connections acceptable to live backends during a leader
    /// election (the leader's death until the new leader's first commit);
    /// set, a run without a measured election window fails too. Unset:
    /// not judged.
    pub max_failed_conns_in_election: Option<u64>,
    /// `[[pass.routing]]`: which regions may answer the connections of a
    /// phase (multi-region scenarios). Default none.
    pub routing: Vec<Routing>,
    /// The writer epoch every region's arbiter must hold at the last
    /// `read_writers` step (a forced transfer won everywhere); unset: not
    /// judged. Set, a run without such a reading fails.
    pub writer_epoch: Option<u64>,
    /// Most attempts of a `rogue` step that may get through (answered
    /// otherwise than by the rule aimed at); unset: not judged. Set, the
    /// run also fails without a rogue step, when an attack was never made,
    /// when the rogue's identity committed a change to a record it does
    /// not own, or when its refusals were not counted
    /// (`rollcall_arbiter_refusals_total`) and audited (`rollcall::audit`).
    pub max_rogue_breaches: Option<u64>,
}

/// One `[[pass.routing]]` rule: where the connections opened in `phase`
/// may go, by the region of the backend that answered them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// The phase judged (a `phase` step's target).
    pub phase: String,
    /// Regions whose backends may answer any connection of the phase;
    /// empty: none may be answered at all.
    pub answered_by: Vec<String>,
    /// Seconds from the phase's start during which the system may still be
    /// moving (a probe noticing a death, a summary arriving): connections
    /// opened later must be answered by `settled_by` only. Default 0.
    #[serde(default)]
    pub settle_s: f64,
    /// Regions that may answer once settled; default `answered_by`.
    #[serde(default)]
    pub settled_by: Option<Vec<String>>,
    /// Least share of the connections opened once settled that must be
    /// answered, in [0, 1]. Default 0.
    #[serde(default)]
    pub min_answered_share: f64,
    /// The failover refusal every resolve answer of r1's agents must carry
    /// once settled (`stale`, `no_policy`, …), when set; the run must have
    /// sampled at least one.
    #[serde(default)]
    pub refusal: Option<String>,
    /// The single-writer property seen from the callers: once a
    /// connection of the phase was answered by one region, none opened
    /// later is answered by another (writes never reach two regions
    /// back and forth). Default false.
    #[serde(default)]
    pub exclusive: bool,
}

impl Routing {
    /// The regions that may answer once settled.
    pub fn settled(&self) -> &[String] {
        self.settled_by.as_deref().unwrap_or(&self.answered_by)
    }
}

impl Default for Pass {
    fn default() -> Self {
        Self {
            leave_p99_ms: rollcall_config::LEAVE_SLO_MS as u64,
            crash_p99_ms: rollcall_config::HARD_FAILURE_SLO_MS as u64,
            max_new_conns_to_drained: 0,
            max_failed_conns_to_live_backends_in_outage: 0,
            max_false_removals: 0,
            max_view_dips: None,
            degraded_max_age_ms: None,
            max_concurrent_snapshots: None,
            min_concurrent_snapshots: None,
            max_new_conns_to_not_ready: 0,
            max_converge_ms: None,
            max_failed_conns: None,
            min_leave_samples: 1,
            min_crash_samples: 1,
            max_lost_writes: 0,
            min_writes_checked: 1,
            max_failed_conns_in_election: None,
            routing: Vec::new(),
            writer_epoch: None,
            max_rogue_breaches: None,
        }
    }
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

impl Step {
    /// How long one round of `crash_rounds` or `pause_rounds` keeps its
    /// fault, in seconds.
    pub fn round_fault_s(&self) -> f64 {
        self.duration_s.unwrap_or(match self.action {
            Action::PauseRounds => 1.0,
            _ => 5.0,
        })
    }

    fn validate(&self, index: usize, run_duration_s: f64) -> Result<(), ScenarioError> {
        let field = |name: &str| format!("steps[{index}].{name}");
        if !self.at_s.is_finite() || self.at_s < 0.0 {
            return Err(ScenarioError::invalid(
                field("at_s"),
                self.at_s,
                "must be at least 0",
            ));
        }
        if self.at_s > run_duration_s {
            return Err(ScenarioError::invalid(
                field("at_s"),
                self.at_s,
                format!("must be at most duration_s ({run_duration_s}): the run ends before it"),
            ));
        }
        if let Some(d) = self.duration_s {
            positive(&field("duration_s"), d)?;
        }
        if let Some(share) = self.share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(ScenarioError::invalid(
                    field("share"),
                    share,
                    "must be greater than 0 and at most 1",
                ));
            }
        }
        if self.delay_ms == Some(0) {
            return Err(ScenarioError::invalid(
                field("delay_ms"),
                0,
                "must be at least 1 when set",
            ));
        }
        if self.action == Action::DelayFollower && self.delay_ms.is_none() {
            return Err(ScenarioError::invalid(
                field("delay_ms"),
                "missing",
                "is required for action \"delay_follower\"",
            ));
        }
        if let Some(count) = self.count {
            at_least_one(&field("count"), count)?;
        }
        if let Some(every) = self.every_s {
            positive(&field("every_s"), every)?;
        }
        if matches!(self.action, Action::CrashRounds | Action::PauseRounds) {
            let (Some(count), Some(every)) = (self.count, self.every_s) else {
                return Err(ScenarioError::invalid(
                    field(if self.count.is_none() {
                        "count"
                    } else {
                        "every_s"
                    }),
                    "missing",
                    format!("is required for action {:?}", self.action.as_str()),
                ));
            };
            let fault = self.round_fault_s();
            if fault >= every {
                return Err(ScenarioError::invalid(
                    field("duration_s"),
                    fault,
                    format!("must be less than every_s ({every}): a round's fault ends before the next round"),
                ));
            }
            let end = self.at_s + f64::from(count) * every;
            if end > run_duration_s {
                return Err(ScenarioError::invalid(
                    field("count"),
                    count,
                    format!("rounds end at {end} s, after duration_s ({run_duration_s})"),
                ));
            }
        }
        if self.action == Action::RollingDeploy && self.count.is_some_and(|c| c > 1) {
            let Some(every) = self.every_s else {
                return Err(ScenarioError::invalid(
                    field("every_s"),
                    "missing",
                    "is required for a rolling_deploy of several waves (count)",
                ));
            };
            let end = self.at_s + f64::from(self.count.unwrap_or(1)) * every;
            if end > run_duration_s {
                return Err(ScenarioError::invalid(
                    field("count"),
                    self.count.unwrap_or(1),
                    format!("waves end at {end} s, after duration_s ({run_duration_s})"),
                ));
            }
        }
        if matches!(self.action, Action::CrashNodes | Action::RestartNode)
            && self.target.trim().is_empty()
        {
            return Err(ScenarioError::invalid(
                field("target"),
                "\"\"",
                format!("must name the nodes for action {:?}", self.action.as_str()),
            ));
        }
        if self.action == Action::Rogue {
            let Some(d) = self.duration_s else {
                return Err(ScenarioError::invalid(
                    field("duration_s"),
                    "missing",
                    "is required for action \"rogue\"",
                ));
            };
            if self.at_s + d > run_duration_s {
                return Err(ScenarioError::invalid(
                    field("duration_s"),
                    d,
                    format!(
                        "the rogue attacks until {} s, after duration_s ({run_duration_s})",
                        self.at_s + d
                    ),
                ));
            }
        }
        if self.action == Action::Phase && self.target.trim().is_empty() {
            return Err(ScenarioError::invalid(
                field("target"),
                format!("{:?}", self.target),
                "must name the phase for action \"phase\"",
            ));
        }
        Ok(())
    }
}

/// Refuses any `steps[i].action` string that is not an [`Action`]'s name.
/// Values of the wrong type are left to the typed parse.
fn check_actions(table: &toml::Table) -> Result<(), ScenarioError> {
    let Some(toml::Value::Array(steps)) = table.get("steps") else {
        return Ok(());
    };
    for (i, step) in steps.iter().enumerate() {
        if let Some(toml::Value::String(name)) = step.get("action") {
            if Action::from_name(name).is_none() {
                return Err(ScenarioError::invalid(
                    format!("steps[{i}].action"),
                    format!("{name:?}"),
                    format!("is not one of: {}", Action::names()),
                ));
            }
        }
    }
    Ok(())
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
mod tests {
    use super::*;

    const FULL: &str = r#"
name = "drain-and-crash"
description = "Drain one backend, then crash a node."
agents = 4
instances_per_agent = 3
service = "api"
duration_s = 60
traffic_rate_per_agent = 100
connect_timeout_ms = 500
needs_fault_injection = true

[short]
agents = 2
time_scale = 0.5

[[steps]]
at_s = 0
action = "phase"
target = "steady"

[[steps]]
at_s = 10
action = "drain"
target = "node-1/api-1"

[[steps]]
at_s = 20
action = "pause_agent"
target = "node-3"
duration_s = 5

[[steps]]
at_s = 40
action = "rolling_deploy"
share = 0.25

[pass]
leave_p99_ms = 2500
crash_p99_ms = 12000
max_new_conns_to_drained = 1
max_failed_conns_to_live_backends_in_outage = 2
max_false_removals = 3
max_concurrent_snapshots = 16
"#;

    const MINIMAL: &str = "name = \"m\"\ndescription = \"d\"\nduration_s = 10\n";

    fn invalid_field(text: &str) -> (String, String) {
        let err = Scenario::from_toml_str(text).expect_err("should be refused");
        let message = err.to_string();
        match err {
            ScenarioError::Invalid { field, .. } => (field, message),
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn full_example_parses() {
        let s = Scenario::from_toml_str(FULL).expect("valid scenario");
        assert_eq!(s.name, "drain-and-crash");
        assert_eq!(s.agents, 4);
        assert_eq!(s.instances_per_agent, 3);
        assert_eq!(s.service, "api");
        assert_eq!(s.duration_s, 60.0);
        assert_eq!(s.traffic_rate_per_agent, 100.0);
        assert_eq!(s.connect_timeout_ms, 500);
        assert!(s.needs_fault_injection);
        assert_eq!(
            s.short,
            Some(Short {
                agents: 2,
                time_scale: 0.5,
                rounds: None,
                duration_s: None,
                min_leave_samples: None,
                min_crash_samples: None,
            })
        );
        assert_eq!(s.steps.len(), 4);
        assert_eq!(s.steps[0].action, Action::Phase);
        assert_eq!(s.steps[0].target, "steady");
        assert_eq!(s.steps[1].action, Action::Drain);
        assert_eq!(s.steps[2].duration_s, Some(5.0));
        assert_eq!(s.steps[3].action, Action::RollingDeploy);
        assert_eq!(s.steps[3].target, "");
        assert_eq!(s.steps[3].share, Some(0.25));
        assert_eq!(
            s.pass,
            Pass {
                leave_p99_ms: 2500,
                crash_p99_ms: 12000,
                max_new_conns_to_drained: 1,
                max_failed_conns_to_live_backends_in_outage: 2,
                max_false_removals: 3,
                max_view_dips: None,
                degraded_max_age_ms: None,
                max_concurrent_snapshots: Some(16),
                min_concurrent_snapshots: None,
                max_new_conns_to_not_ready: 0,
                max_converge_ms: None,
                max_failed_conns: None,
                min_leave_samples: 1,
                min_crash_samples: 1,
                max_lost_writes: 0,
                min_writes_checked: 1,
                max_failed_conns_in_election: None,
                routing: Vec::new(),
                writer_epoch: None,
                max_rogue_breaches: None,
            }
        );
    }

    #[test]
    fn defaults_apply() {
        let s = Scenario::from_toml_str(MINIMAL).expect("valid scenario");
        assert_eq!(s.agents, 3);
        assert_eq!(s.instances_per_agent, 2);
        assert_eq!(s.service, "web");
        assert_eq!(s.traffic_rate_per_agent, 50.0);
        assert_eq!(s.connect_timeout_ms, 1000);
        assert_eq!(s.short, None);
        assert!(!s.needs_fault_injection);
        assert!(s.steps.is_empty());
        assert_eq!(s.pass.leave_p99_ms, 3000);
        assert_eq!(s.pass.crash_p99_ms, 15000);
        assert_eq!(s.pass.max_new_conns_to_drained, 0);
        assert_eq!(s.pass.max_concurrent_snapshots, None);
        let short = Scenario::from_toml_str(&format!("{MINIMAL}[short]\nagents = 1\n"))
            .expect("valid scenario");
        assert_eq!(short.short.map(|s| s.time_scale), Some(1.0));
    }

    #[test]
    fn every_action_name_round_trips() {
        for action in Action::ALL {
            let json = serde_json::to_value(action).expect("serializable");
            assert_eq!(json, serde_json::Value::from(action.as_str()));
            assert_eq!(Action::from_name(action.as_str()), Some(action));
            // The bridge links are named by region, in a run of several.
            let (regions, target) = match action {
                Action::CutBridge
                | Action::HealBridge
                | Action::TransferWriter
                | Action::ForceWriter
                | Action::ReadWriters => ("regions = 3\n", "r2"),
                // A rogue reports a node of another zone down.
                Action::Rogue => ("zones = 2\nagents = 2\n", "x"),
                _ => ("", "x"),
            };
            let reason = if action == Action::ForceWriter {
                "reason = \"drill\"\n"
            } else {
                ""
            };
            let text =
                format!("{regions}{MINIMAL}[[steps]]\nat_s = 1\naction = \"{action}\"\ntarget = \"{target}\"\ndelay_ms = 50\ncount = 2\nevery_s = 2\nduration_s = 0.5\n{reason}");
            let s = Scenario::from_toml_str(&text).expect("valid scenario");
            assert_eq!(s.steps[0].action, action);
        }
    }

    #[test]
    fn every_validation_error_names_its_field() {
        let step = |body: &str| format!("{MINIMAL}[[steps]]\n{body}\n");
        let cases: Vec<(String, &str)> =
            vec![
            (
                step("at_s = 1\naction = \"crash_rounds\"\nevery_s = 2"),
                "steps[0].count",
            ),
            (
                step("at_s = 1\naction = \"pause_rounds\"\ncount = 2"),
                "steps[0].every_s",
            ),
            (
                step("at_s = 1\naction = \"crash_rounds\"\ncount = 2\nevery_s = 2\nduration_s = 2"),
                "steps[0].duration_s",
            ),
            (
                step("at_s = 1\naction = \"crash_rounds\"\ncount = 5\nevery_s = 2\nduration_s = 1"),
                "steps[0].count",
            ),
            (step("at_s = 1\naction = \"crash_nodes\""), "steps[0].target"),
            (
                format!("zones = 2\nagents = 2\n{}", step("at_s = 1\naction = \"rogue\"")),
                "steps[0].duration_s",
            ),
            (
                format!(
                    "zones = 2\nagents = 2\n{}",
                    step("at_s = 5\naction = \"rogue\"\nduration_s = 6")
                ),
                "steps[0].duration_s",
            ),
            (
                format!("{MINIMAL}agents = 2\n[[steps]]\nat_s = 1\naction = \"rogue\"\nduration_s = 2\n"),
                "zones",
            ),
            (
                format!("{MINIMAL}[short]\nagents = 1\nrounds = 0\n"),
                "short.rounds",
            ),
            (
                "name = \"\"\ndescription = \"d\"\nduration_s = 1\n".into(),
                "name",
            ),
            (format!("{MINIMAL}agents = 0\n"), "agents"),
            (format!("{MINIMAL}service = \" \"\n"), "service"),
            (format!("{MINIMAL}zones = 2\nagents = 1\n"), "zones"),
            (format!("{MINIMAL}faults = \"drop_delta=0.1\"\n"), "faults"),
            (
                step("at_s = 1\naction = \"delay_follower\""),
                "steps[0].delay_ms",
            ),
            (
                "name = \"m\"\ndescription = \"d\"\nduration_s = 0\n".into(),
                "duration_s",
            ),
            (
                "name = \"m\"\ndescription = \"d\"\nduration_s = nan\n".into(),
                "duration_s",
            ),
            (
                format!("{MINIMAL}traffic_rate_per_agent = -5\n"),
                "traffic_rate_per_agent",
            ),
            (
                format!("{MINIMAL}connect_timeout_ms = 0\n"),
                "connect_timeout_ms",
            ),
            (format!("{MINIMAL}[short]\nagents = 0\n"), "short.agents"),
            (
                format!("{MINIMAL}[short]\nagents = 1\ntime_scale = 1.5\n"),
                "short.time_scale",
            ),
            (
                format!("{MINIMAL}[short]\nagents = 1\ntime_scale = 0\n"),
                "short.time_scale",
            ),
            (step("at_s = -1\naction = \"heal\""), "steps[0].at_s"),
            (step("at_s = 11\naction = \"heal\""), "steps[0].at_s"),
            (
                step("at_s = 1\naction = \"heal\"\nduration_s = 0"),
                "steps[0].duration_s",
            ),
            (
                step("at_s = 1\naction = \"rolling_deploy\"\nshare = 1.5"),
                "steps[0].share",
            ),
            (
                step("at_s = 1\naction = \"rolling_deploy\"\nshare = 0"),
                "steps[0].share",
            ),
            (step("at_s = 1\naction = \"phase\""), "steps[0].target"),
            (step("at_s = 1\naction = \"explode\""), "steps[0].action"),
        ];
        for (text, field) in cases {
            let (got, message) = invalid_field(&text);
            assert_eq!(got, field, "{message}");
            assert!(message.starts_with(field), "{message}");
        }
    }

    #[test]
    fn error_messages_read_well() {
        let text = format!(
            "{MINIMAL}[[steps]]\nat_s = 1\naction = \"heal\"\n[[steps]]\nat_s = 2\naction = \"heal\"\n\
             [[steps]]\nat_s = -1\naction = \"heal\"\n"
        );
        let (_, message) = invalid_field(&text);
        assert_eq!(message, "steps[2].at_s = -1 must be at least 0");

        let (_, message) = invalid_field(&format!(
            "{MINIMAL}[[steps]]\nat_s = 1\naction = \"explode\"\n"
        ));
        assert!(
            message
                .starts_with("steps[0].action = \"explode\" is not one of: drain, fail_readiness,"),
            "{message}"
        );
        assert!(
            message.ends_with(
                "kill_backends, restart_backends, transfer_writer, force_writer, read_writers, rogue"
            ),
            "{message}"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        for text in [
            format!("{MINIMAL}agent = 3\n"),
            format!("{MINIMAL}[short]\nagents = 1\nscale = 0.5\n"),
            format!("{MINIMAL}[[steps]]\nat_s = 1\naction = \"heal\"\ntargte = \"x\"\n"),
            format!("{MINIMAL}[pass]\nleave_p99 = 1\n"),
        ] {
            match Scenario::from_toml_str(&text) {
                Err(ScenarioError::Parse { origin, message }) => {
                    assert_eq!(origin, "<string>");
                    assert!(message.contains("unknown field"), "{message}");
                }
                other => panic!("expected a parse error for {text:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn missing_required_fields_are_parse_errors() {
        let err = Scenario::from_toml_str("name = \"m\"\ndescription = \"d\"\n").unwrap_err();
        assert!(err.to_string().contains("duration_s"), "{err}");
        let err = Scenario::from_toml_str("name = [").unwrap_err();
        assert!(matches!(err, ScenarioError::Parse { .. }), "{err}");
    }

    #[test]
    fn scaling_multiplies_every_scenario_duration() {
        let s = Scenario::from_toml_str(FULL).expect("valid scenario");
        let half = s.scaled(0.5);
        assert_eq!(half.duration_s, 30.0);
        let at: Vec<f64> = half.steps.iter().map(|st| st.at_s).collect();
        assert_eq!(at, [0.0, 5.0, 10.0, 20.0]);
        assert_eq!(half.steps[2].duration_s, Some(2.5));
        assert_eq!(half.steps[3].duration_s, None);
        // What is not a scenario duration is kept.
        assert_eq!(half.connect_timeout_ms, s.connect_timeout_ms);
        assert_eq!(half.traffic_rate_per_agent, s.traffic_rate_per_agent);
        assert_eq!(half.pass, s.pass);
        assert_eq!(half.steps[3].share, Some(0.25));
        half.validate().expect("a scaled scenario stays valid");
    }

    #[test]
    fn for_run_precedence() {
        let s = Scenario::from_toml_str(FULL).expect("valid scenario");

        let plain = s.for_run(false, None, None).expect("valid");
        assert_eq!(plain, s);

        let short = s.for_run(true, None, None).expect("valid");
        assert_eq!((short.agents, short.duration_s), (2, 30.0));

        let short_agents = s.for_run(true, Some(7), None).expect("valid");
        assert_eq!((short_agents.agents, short_agents.duration_s), (7, 30.0));

        let short_scale = s.for_run(true, None, Some(0.1)).expect("valid");
        assert_eq!((short_scale.agents, short_scale.duration_s), (2, 6.0));
        assert_eq!(short_scale.steps[1].at_s, 1.0);

        let all = s.for_run(true, Some(5), Some(2.0)).expect("valid");
        assert_eq!((all.agents, all.duration_s), (5, 120.0));

        let long = s.for_run(false, Some(1), Some(0.5)).expect("valid");
        assert_eq!((long.agents, long.duration_s), (1, 30.0));

        let no_short = Scenario::from_toml_str(MINIMAL).expect("valid scenario");
        assert_eq!(no_short.for_run(true, None, None).expect("valid"), no_short);
    }

    #[test]
    fn for_run_refuses_bad_flags() {
        let s = Scenario::from_toml_str(MINIMAL).expect("valid scenario");
        for (agents, scale, field) in [
            (Some(0), None, "--agents"),
            (None, Some(0.0), "--time-scale"),
            (None, Some(-1.0), "--time-scale"),
            (None, Some(f64::NAN), "--time-scale"),
            (None, Some(f64::INFINITY), "--time-scale"),
        ] {
            match s.for_run(false, agents, scale) {
                Err(ScenarioError::Invalid { field: got, .. }) => assert_eq!(got, field),
                other => panic!("expected {field} refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn shipped_scenarios_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("readable directory").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let s = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
                s.for_run(true, None, None)
                    .unwrap_or_else(|e| panic!("{}: --short: {e}", path.display()));
            }
        }
    }

    #[test]
    fn load_reads_a_file_and_names_it_in_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let good = dir.path().join("good.toml");
        std::fs::write(&good, FULL).expect("write");
        assert_eq!(
            Scenario::load(&good).expect("valid").name,
            "drain-and-crash"
        );

        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, format!("{MINIMAL}bogus = 1\n")).expect("write");
        match Scenario::load(&bad) {
            Err(ScenarioError::Parse { origin, .. }) => {
                assert_eq!(origin, bad.display().to_string())
            }
            other => panic!("expected a parse error, got {other:?}"),
        }

        let missing = dir.path().join("missing.toml");
        let err = Scenario::load(&missing).unwrap_err();
        assert!(matches!(err, ScenarioError::Io { .. }), "{err}");
        assert!(err.to_string().contains("missing.toml"), "{err}");
    }
}
