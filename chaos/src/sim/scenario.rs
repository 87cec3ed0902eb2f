//! The scenario file of `rollcall chaos sim`
//! (`chaos/scenarios/sim/<name>.toml`): the fleet to simulate, its network,
//! the timed steps and the pass criteria, as TOML. Unknown keys are
//! refused and every value is checked once, naming the dotted field, like
//! the real-process harness's scenarios (`crate::scenario`).
//!
//! ```toml
//! name = "node-crashes"
//! description = "1% of the nodes killed silently"
//! duration_s = 120
//!
//! [short]
//! agents = 200
//!
//! [[steps]]
//! at_s = 30
//! action = "crash_nodes"
//! share = 0.01
//!
//! [pass]
//! crash_p99_ms = 6000
//! ```
//!
//! Fleet sizes scale together: `--agents N` (or `[short] agents`) keeps the
//! scenario's instances per agent and agents per service.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::scenario::ScenarioError;

/// One simulation scenario, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimScenario {
    /// Its name (the report directory's default name).
    pub name: String,
    /// What it shows, for the report.
    #[serde(default)]
    pub description: String,
    /// Node agents (one per node), spread evenly over the zones.
    #[serde(default = "default_agents")]
    pub agents: u32,
    /// Zones of the region (each its own SWIM membership).
    #[serde(default = "default_zones")]
    pub zones: u32,
    /// Instances in the region.
    #[serde(default = "default_instances")]
    pub instances: u32,
    /// Services (`namespace/service/port`) the instances belong to.
    #[serde(default = "default_services")]
    pub services: u32,
    /// Zipf exponent of service sizes (rank k gets a share ∝ k^-s).
    #[serde(default = "default_size_skew")]
    pub size_skew: f64,
    /// Zipf exponent of how often a service is followed by an agent.
    #[serde(default = "default_follow_skew")]
    pub follow_skew: f64,
    /// Fewest and most services one agent follows.
    #[serde(default = "default_follows")]
    pub follows: (u32, u32),
    /// Simulated time, in seconds (the steps' times are within it).
    pub duration_s: f64,
    /// The gossip preset of every agent (`lan`, `tolerant`, `wan`).
    #[serde(default = "default_preset")]
    pub gossip_preset: String,
    /// Instances that report by heartbeat instead of being probed.
    #[serde(default)]
    pub heartbeat: Heartbeat,
    /// The simulated network.
    #[serde(default)]
    pub network: Network,
    /// The arbiter group as an ordered log.
    #[serde(default)]
    pub arbiter: Arbiter,
    /// Connections opened through the agents' endpoint views per simulated
    /// second, over the whole fleet (a sample of the traffic: each one goes
    /// through the real view and selector).
    #[serde(default = "default_conns_per_s")]
    pub conns_per_s: f64,
    /// The CI version (`--short`).
    #[serde(default)]
    pub short: Short,
    /// Timed steps.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Pass criteria.
    #[serde(default)]
    pub pass: SimPass,
}

/// `[heartbeat]`: services whose instances report by heartbeat (a TTL
/// readiness check, `PUT /v1/agent/instances/{id}/heartbeat` at an
/// interval) instead of a TCP readiness probe every second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Heartbeat {
    /// Share of the services (chosen at random) whose instances do.
    pub share: f64,
    /// The TTL check's `ttl_ms`.
    pub ttl_ms: u64,
    /// How often each such instance sends a heartbeat, ms (each instance
    /// starts at a random point of its first interval).
    pub interval_ms: u64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            share: 0.5,
            ttl_ms: 10_000,
            interval_ms: 3_000,
        }
    }
}

/// The simulated network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// One-way latency of a gossip datagram, drawn uniformly, in µs.
    pub gossip_latency_us: (u64, u64),
    /// One-way latency between an agent and the arbiter, in µs.
    pub arbiter_latency_us: (u64, u64),
    /// Probability that a gossip datagram is lost.
    pub loss: f64,
    /// The arbiter's egress towards one agent, bytes per ms (a send's
    /// transfer time is its size divided by this).
    pub bytes_per_ms: u64,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            gossip_latency_us: (200, 1_000),
            arbiter_latency_us: (300, 1_500),
            loss: 0.0,
            bytes_per_ms: 125_000,
        }
    }
}

/// The arbiter group, modelled as one ordered log, and the leader's CPU
/// as one core that work queues for. The CPU costs are measured by
/// `rollcall bench fleet` on a real arbiter (README, "Fleet bench").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Arbiter {
    /// Replicas in the Raft group, each the shipped replica machine (1 or
    /// 3; 5 also works). Agents spread over them as real ones do.
    /// Default 1.
    pub replicas: u32,
    /// From a batch's proposal to its commit (quorum fsync), in ms.
    pub commit_latency_ms: u64,
    /// Arbiter CPU per update message sent to an agent (encoding, QUIC
    /// sealing, the send, and the agent's acknowledgement of it), µs.
    /// Sends queue behind every other charge: a fan-out to 500 agents
    /// leaves over 500 times this.
    pub send_cpu_us: u64,
    /// Arbiter CPU per session message received (renewal, subscription,
    /// probe answer), per request and per peer call, µs; it delays the
    /// sends behind it.
    pub recv_cpu_us: u64,
    /// Arbiter CPU per connected session per second, whatever it sends
    /// (its QUIC timers, the agent's PINGs and their acknowledgements),
    /// µs; charged every sweep interval, it delays the work behind it.
    pub session_cpu_us: u64,
}

impl Default for Arbiter {
    fn default() -> Self {
        Arbiter {
            replicas: 1,
            commit_latency_ms: 5,
            send_cpu_us: DEFAULT_SEND_CPU_US,
            recv_cpu_us: DEFAULT_RECV_CPU_US,
            session_cpu_us: DEFAULT_SESSION_CPU_US,
        }
    }
}

/// `[arbiter] send_cpu_us` by default, from the fleet bench: deploy's
/// arbiter CPU above steady's over the update messages sent per second.
/// At 5,000 sessions and 100,000 endpoints (2026-12-04, with keep-alives)
/// (71.1 % − 48.5 %) / 7,162/s = 32 µs and (89.1 % − 52.1 %) / 8,788/s =
/// 42 µs in two runs; at 2,000 sessions with quiet sessions (2026-12-05,
/// `chaos/results/bench/fleet-2000`) (69.2 % − 8.2 %) / 17,505/s = 35 µs.
pub const DEFAULT_SEND_CPU_US: u64 = 35;
/// `[arbiter] recv_cpu_us` and `session_cpu_us` by default: the steady
/// arbiter CPU of two fleet benches fitted as a cost per session-second
/// and a cost per message received (application messages and QUIC PINGs):
/// at 5,020 sessions with keep-alives (2026-12-04) 48 % of a core for
/// 11,550 messages and 5,020 PINGs a second; at 2,008 sessions with quiet
/// sessions (2026-12-05, `chaos/results/bench/fleet-2000`) 8.2 % for 602
/// renewals and 402 PINGs a second. That gives about 20 µs a message and
/// 31 µs a session-second; the quiet session's PING (one per 5 s) is folded
/// into the session's cost (35 µs a second). Charging the whole steady CPU
/// to the renewals instead (136 µs each) would make a burst of small
/// requests (a zone's down reports after a crash) cost seven times what it
/// does.
pub const DEFAULT_RECV_CPU_US: u64 = 20;
/// See [`DEFAULT_RECV_CPU_US`].
pub const DEFAULT_SESSION_CPU_US: u64 = 35;

/// `[short]`: the CI version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Short {
    /// Agents (instances and services scale with them).
    pub agents: Option<u32>,
    /// Multiplies the duration and every step's time and length.
    pub time_scale: Option<f64>,
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A named phase begins (report only).
    Phase,
    /// Replace `share` of the instances over `over_s`: each one is drained,
    /// stopped and deregistered after `drain_s`, and a new instance starts
    /// on its node behind its readiness check.
    Deploy,
    /// Random pauses of whole agents (gossip and session), `pause_ms` each,
    /// `rate_per_s` of them per second over the fleet, for `over_s`.
    Pauses,
    /// Kill `share` of the nodes silently (process, gossip and session gone).
    CrashNodes,
    /// Cut zone `zone` (1-based) from the arbiter for `over_s`.
    PartitionZone,
    /// Stop the arbiter group for `over_s` (every session drops); the
    /// catalog survives (it is the replicated log).
    StopArbiter,
    /// Like `deploy` without the drain wait: replacements made while the
    /// arbiter may be down are kept pending by their agents.
    Churn,
    /// Kill the leader replica with its host (silent: its agents notice
    /// at their silence check, `agent.arbiter_silence_ms` after their next
    /// message); it starts again after `over_s`. Needs
    /// `[arbiter] replicas` of 3 or more.
    KillLeader,
    /// Kill every replica but the leader (silent) for `over_s`: the
    /// leader keeps office without a quorum, commits nothing and takes no
    /// silence for a node's death. Needs `[arbiter] replicas` of 3 or
    /// more.
    LoseQuorum,
}

/// One timed step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// When, in seconds from the start.
    pub at_s: f64,
    /// What.
    pub action: Action,
    /// The phase's name (`phase`).
    #[serde(default)]
    pub name: Option<String>,
    /// Share of instances (`deploy`, `churn`) or nodes (`crash_nodes`).
    #[serde(default)]
    pub share: Option<f64>,
    /// How long the step lasts, in seconds.
    #[serde(default)]
    pub over_s: Option<f64>,
    /// The drain wait of a deploy, in seconds (default 5).
    #[serde(default)]
    pub drain_s: Option<f64>,
    /// The zone to cut (1-based, `partition_zone`).
    #[serde(default)]
    pub zone: Option<u32>,
    /// Pauses per second (`pauses`).
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Length of one pause, in ms (`pauses`).
    #[serde(default)]
    pub pause_ms: Option<u64>,
}

/// Pass criteria; a missing one is not judged.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimPass {
    /// Leave p99 bound, ms (commit → last subscribed agent applied).
    pub leave_p99_ms: Option<f64>,
    /// Crash p99 bound, ms (kill → last agent ejected).
    pub crash_p99_ms: Option<f64>,
    /// Most instances removed although alive.
    pub max_false_removals: Option<u64>,
    /// Most full snapshots in flight at once (default: the arbiter's bound).
    pub max_concurrent_snapshots: Option<u64>,
    /// Least share of agents that resume every service by delta after an
    /// outage.
    pub min_delta_resume_share: Option<f64>,
    /// Most connections opened to an instance more than 3 s after its leave
    /// committed.
    pub max_new_conns_to_drained: Option<u64>,
}

fn default_agents() -> u32 {
    5_000
}
fn default_zones() -> u32 {
    3
}
fn default_instances() -> u32 {
    100_000
}
fn default_services() -> u32 {
    2_000
}
fn default_size_skew() -> f64 {
    0.8
}
fn default_follow_skew() -> f64 {
    0.5
}
fn default_follows() -> (u32, u32) {
    (20, 50)
}
fn default_preset() -> String {
    "lan".to_owned()
}
fn default_conns_per_s() -> f64 {
    200.0
}

fn invalid(field: impl Into<String>, value: impl ToString, reason: &str) -> ScenarioError {
    ScenarioError::Invalid {
        field: field.into(),
        value: value.to_string(),
        reason: reason.to_owned(),
    }
}

impl SimScenario {
    /// Reads and checks a scenario file.
    pub fn load(path: &Path) -> Result<SimScenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a scenario's text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<SimScenario, ScenarioError> {
        let scenario: SimScenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        scenario.validate()?;
        Ok(scenario)
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        if self.agents < 3 {
            return Err(invalid("agents", self.agents, "must be at least 3"));
        }
        if self.zones == 0 || self.zones > self.agents {
            return Err(invalid("zones", self.zones, "must be 1 to agents"));
        }
        if self.services == 0 || self.instances < self.services {
            return Err(invalid(
                "instances",
                self.instances,
                "must be at least services (one instance per service)",
            ));
        }
        if self.follows.0 == 0 || self.follows.0 > self.follows.1 {
            return Err(invalid(
                "follows",
                format!("{:?}", self.follows),
                "must be (min, max) with 1 ≤ min ≤ max",
            ));
        }
        if self.duration_s.is_nan() || self.duration_s <= 0.0 {
            return Err(invalid("duration_s", self.duration_s, "must be positive"));
        }
        if preset(&self.gossip_preset).is_none() {
            return Err(invalid(
                "gossip_preset",
                format!("{:?}", self.gossip_preset),
                "must be \"lan\", \"tolerant\" or \"wan\"",
            ));
        }
        if !(0.0..1.0).contains(&self.network.loss) {
            return Err(invalid(
                "network.loss",
                self.network.loss,
                "must be in [0, 1)",
            ));
        }
        if self.arbiter.send_cpu_us > 100_000 {
            return Err(invalid(
                "arbiter.send_cpu_us",
                self.arbiter.send_cpu_us,
                "must be at most 100000",
            ));
        }
        if !(1..=7).contains(&self.arbiter.replicas) {
            return Err(invalid(
                "arbiter.replicas",
                self.arbiter.replicas,
                "must be 1 to 7",
            ));
        }
        if self.arbiter.session_cpu_us > 10_000 {
            return Err(invalid(
                "arbiter.session_cpu_us",
                self.arbiter.session_cpu_us,
                "must be at most 10000",
            ));
        }
        if self.arbiter.recv_cpu_us > 100_000 {
            return Err(invalid(
                "arbiter.recv_cpu_us",
                self.arbiter.recv_cpu_us,
                "must be at most 100000",
            ));
        }
        if self.network.bytes_per_ms == 0 {
            return Err(invalid("network.bytes_per_ms", 0, "must be positive"));
        }
        if !(0.0..=1.0).contains(&self.heartbeat.share) {
            return Err(invalid(
                "heartbeat.share",
                self.heartbeat.share,
                "must be in [0, 1]",
            ));
        }
        if self.heartbeat.ttl_ms < 1_000 {
            return Err(invalid(
                "heartbeat.ttl_ms",
                self.heartbeat.ttl_ms,
                "must be at least 1000",
            ));
        }
        if self.heartbeat.interval_ms == 0 || self.heartbeat.interval_ms >= self.heartbeat.ttl_ms {
            return Err(invalid(
                "heartbeat.interval_ms",
                self.heartbeat.interval_ms,
                "must be positive and below heartbeat.ttl_ms",
            ));
        }
        for (i, step) in self.steps.iter().enumerate() {
            let field = |f: &str| format!("steps[{i}].{f}");
            if !(0.0..=self.duration_s).contains(&step.at_s) {
                return Err(invalid(
                    field("at_s"),
                    step.at_s,
                    "must be within duration_s",
                ));
            }
            let share = step.share.unwrap_or(0.0);
            let needs_share = matches!(
                step.action,
                Action::Deploy | Action::CrashNodes | Action::Churn
            );
            if needs_share && !(share > 0.0 && share <= 1.0) {
                return Err(invalid(field("share"), share, "must be in (0, 1]"));
            }
            let needs_over = !matches!(step.action, Action::Phase | Action::CrashNodes);
            if needs_over && !step.over_s.is_some_and(|s| s > 0.0) {
                return Err(invalid(
                    field("over_s"),
                    format!("{:?}", step.over_s),
                    "must be given and positive",
                ));
            }
            if step.action == Action::PartitionZone
                && !step.zone.is_some_and(|z| z >= 1 && z <= self.zones)
            {
                return Err(invalid(
                    field("zone"),
                    format!("{:?}", step.zone),
                    "must be a zone number from 1 to zones",
                ));
            }
            if matches!(step.action, Action::KillLeader | Action::LoseQuorum)
                && self.arbiter.replicas < 3
            {
                return Err(invalid(
                    "arbiter.replicas",
                    self.arbiter.replicas,
                    "kill_leader and lose_quorum need at least 3 replicas",
                ));
            }
            if step.action == Action::Pauses
                && !(step.rate_per_s.is_some_and(|r| r > 0.0)
                    && step.pause_ms.is_some_and(|p| p > 0))
            {
                return Err(invalid(
                    field("rate_per_s"),
                    format!("{:?}", step.rate_per_s),
                    "pauses need rate_per_s > 0 and pause_ms > 0",
                ));
            }
        }
        Ok(())
    }

    /// The version to run: `[short]` applied when `short`, then `agents`
    /// (from `--agents`). Instances and services scale with the agents.
    pub fn for_run(&self, short: bool, agents: Option<u32>) -> Result<SimScenario, ScenarioError> {
        let mut s = self.clone();
        let mut wanted = None;
        if short {
            wanted = s.short.agents;
            if let Some(scale) = s.short.time_scale {
                if scale.is_nan() || scale <= 0.0 {
                    return Err(invalid("short.time_scale", scale, "must be positive"));
                }
                s.duration_s *= scale;
                for step in &mut s.steps {
                    step.at_s *= scale;
                    step.over_s = step.over_s.map(|o| o * scale);
                }
            }
        }
        if agents.is_some() {
            wanted = agents;
        }
        if let Some(n) = wanted {
            if n < 3 {
                return Err(invalid("--agents", n, "must be at least 3"));
            }
            let ratio = f64::from(n) / f64::from(s.agents);
            s.services = ((f64::from(s.services) * ratio).round() as u32).max(1);
            s.instances = ((f64::from(s.instances) * ratio).round() as u32).max(s.services);
            s.agents = n;
            s.zones = s.zones.min(n);
            let max = s.follows.1.min(s.services);
            s.follows = (s.follows.0.min(max), max);
        }
        s.validate()?;
        Ok(s)
    }
}

/// The gossip preset named `name`.
pub fn preset(name: &str) -> Option<rollcall_config::GossipPreset> {
    use rollcall_config::GossipPreset;
    match name {
        "lan" => Some(GossipPreset::Lan),
        "tolerant" => Some(GossipPreset::Tolerant),
        "wan" => Some(GossipPreset::Wan),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sim_scenario_file_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/sim");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let s = SimScenario::load(&path).unwrap();
            s.for_run(true, None).unwrap();
            names.push(s.name);
        }
        names.sort();
        assert_eq!(
            names,
            [
                "big-deploy",
                "leader-change",
                "node-crashes",
                "outage-and-storm",
                "steady",
                "zone-partition"
            ]
        );
    }

    #[test]
    fn a_leader_kill_needs_three_replicas() {
        let steps = "[[steps]]\nat_s = 1\naction = \"kill_leader\"\nover_s = 5\n";
        let one = format!("name = \"x\"\nduration_s = 10\n{steps}");
        let e = SimScenario::parse(&one, "t").unwrap_err().to_string();
        assert!(e.contains("arbiter.replicas"), "{e}");
        let three = format!("name = \"x\"\nduration_s = 10\n[arbiter]\nreplicas = 3\n{steps}");
        assert!(SimScenario::parse(&three, "t").is_ok());
        let eight = "name = \"x\"\nduration_s = 10\n[arbiter]\nreplicas = 8\n";
        let e = SimScenario::parse(eight, "t").unwrap_err().to_string();
        assert!(e.contains("arbiter.replicas"), "{e}");
    }

    #[test]
    fn a_bad_value_names_its_field() {
        let text = "name = \"x\"\nduration_s = 10\n[[steps]]\nat_s = 1\naction = \"deploy\"\n";
        let e = SimScenario::parse(text, "t").unwrap_err().to_string();
        assert!(e.starts_with("steps[0].share"), "{e}");
        let e = SimScenario::parse("name = \"x\"\nduration_s = 1\nbogus = 1\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        let text = "name = \"x\"\nduration_s = 1\n[heartbeat]\nttl_ms = 5000\ninterval_ms = 5000\n";
        let e = SimScenario::parse(text, "t").unwrap_err().to_string();
        assert!(e.starts_with("heartbeat.interval_ms"), "{e}");
        let text = "name = \"x\"\nduration_s = 1\n[heartbeat]\nshare = 1.5\n";
        let e = SimScenario::parse(text, "t").unwrap_err().to_string();
        assert!(e.starts_with("heartbeat.share"), "{e}");
    }

    #[test]
    fn agents_scale_the_fleet() {
        let s = SimScenario::parse("name = \"x\"\nduration_s = 10\n", "t").unwrap();
        let small = s.for_run(false, Some(200)).unwrap();
        assert_eq!(
            (small.agents, small.services, small.instances),
            (200, 80, 4_000)
        );
    }
}
