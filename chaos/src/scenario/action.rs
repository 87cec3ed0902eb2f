//! A step's `action`: what the runner does at `at_s`, by its snake_case
//! name in the scenario file.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

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
    pub(super) fn names() -> String {
        Action::ALL.map(Action::as_str).join(", ")
    }
}

impl Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
