//! Typed configuration of rollcall's processes (node agent, lease arbiter,
//! region bridge) and of service policy (R9), validated once at the edge
//! with errors that name the dotted field path, and the failure-detection
//! budget calculator (R5).
//!
//! Defaults derive from the SLOs: a deliberate leave reaches every proxy
//! within 3 s (p99) of its commit, a silent crash within 15 s (p99). Each
//! field's documentation gives its unit, effect and default.
//!
//! This crate only describes, validates and computes; it must not open
//! sockets, spawn tasks or read clocks. The only IO is reading the config
//! file a caller asks for.

mod agent;
mod arbiter;
mod bridge;
mod budget;
mod checks;
mod data_plane;
mod error;
mod file;
mod gossip;
mod http;
mod limits;
mod policy;
mod rules;
mod security;

/// Test helper of the config loaders: an example file with every
/// `# <start>…` line uncommented, for each `start` (a key followed by
/// ` = `, or a table header).
#[cfg(test)]
fn uncommented(example: &str, starts: &[&str]) -> String {
    example
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest) if starts.iter().any(|s| rest.starts_with(s)) => rest,
            _ => line,
        })
        .fold(String::new(), |acc, line| acc + line + "\n")
}

pub use agent::AgentConfig;
pub use arbiter::{
    ArbiterConfig, CatalogConfig, DeltaLogConfig, DistributionConfig, GuardConfig, LeaseConfig,
    RaftConfig, ReplicaEntry, StoreConfig, MAX_COALESCE_WINDOW_MS, MAX_SHARDS, RENEWALS_PER_TTL,
};
pub use bridge::{
    BridgeArbiter, BridgeConfig, BridgePeer, MAX_BRIDGE_INGRESS, MAX_SUMMARY_MAX_AGE_MS,
};
pub use budget::{
    Budget, BudgetEstimates, BudgetPath, BudgetReport, BudgetRow, Case, PauseTolerance, Phase,
    Setting, Term, HARD_FAILURE_SLO_MS, LEAVE_SLO_MS, QUIET_KEEPALIVE_MS,
    SWIM_EXPECTED_FIRST_PROBE_PERIODS, SWIM_P99_FIRST_PROBE_PERIODS, WITNESS_CONNECT_MS,
};
pub use checks::{
    CheckTiming, CheckTimingOverrides, ChecksConfig, MAX_CHECK_INTERVAL_MS, MAX_CHECK_JITTER,
    MAX_CHECK_THRESHOLD, MIN_CHECK_INTERVAL_MS,
};
pub use data_plane::{
    ConnTraffic, DataPlaneConfig, DrainConfig, IngressConfig, ProbesConfig, ProxyEntry,
    StaleBehaviour, StalenessConfig, StalenessOverride, WorkloadGrant,
};
pub use error::ConfigError;
pub use file::ConfigFile;
pub use gossip::{GossipConfig, GossipPreset, SwimSettings};
pub use http::HttpLimits;
pub use limits::LimitsConfig;
pub use policy::{
    PolicyFile, ServicePolicy, SingleWriter, TrafficClass, DEFAULT_CAPACITY_LIMIT,
    MAX_POLICIES_PER_FILE, MAX_POLICY_REGIONS,
};
pub use security::{
    AddressRule, ControllerGrant, NodePattern, NodeZone, RegistrationConfig, RegistrationRule,
    ServicePattern, TlsPaths, WatchRule, ZoneRule, DEFAULT_TLS_CHECK_INTERVAL_MS,
};

/// QUIC idle timeout of every rollcall connection (agent ↔ arbiter, the
/// replicas' peer links take their own shorter one), ms: a connection
/// nothing was heard on for this long is closed at both ends.
pub const QUIC_IDLE_TIMEOUT_MS: u64 = 10_000;

/// An agent's check for a silent arbiter (`agent.arbiter_silence_ms`)
/// whose timer fired later than this, ms, decides nothing: the agent was
/// paused or starved, and the replica's answer may be there unread.
pub const SILENCE_CHECK_LATE_MS: u64 = 250;
