//! `[budget]` in the agent file: the figures the calculator needs that no
//! setting gives (commit and network latency, fan-out), and their checks.

use serde::{Deserialize, Serialize};

use crate::{rules, ConfigError};

/// `[budget]` in the agent file: what the calculator cannot know from
/// settings. Measure them (the arbiter exports commit latency, agents their
/// watch lag) and write them here; they have no effect at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetEstimates {
    /// Typical arbiter commit of one change, Raft round and fsync included,
    /// in ms. Default 5.
    pub commit_ms: u64,
    /// Slowest commit worth planning for (p99), in ms. Default 50: a slow
    /// fsync. At least `commit_ms`.
    pub commit_worst_ms: u64,
    /// Typical one-way latency between agent and arbiter, in ms. Default 1
    /// (same data centre).
    pub network_ms: u64,
    /// p99 one-way latency between agent and arbiter, in ms. Default 50. At
    /// least `network_ms`.
    pub network_worst_ms: u64,
    /// Time for an agent to apply a delta to its endpoint view, in ms.
    /// Default 1.
    pub apply_ms: u64,
    /// Agents that follow a typical service. The arbiter sends each change
    /// to its followers one after another, so the last one gets it
    /// (followers − 1) sends after the first. Default 1.
    pub followers: u32,
    /// The cost of one of those sends, in µs: on the arbiter, encoding,
    /// sealing and writing one delta. Default 20. Where the agents share the
    /// arbiter's cores (the chaos harness runs 20–32 on two), their own
    /// wake-up and apply queue behind each other too: measure the spread
    /// between the first and the last agent's view change and write it
    /// here.
    pub fanout_us: u64,
}

impl Default for BudgetEstimates {
    fn default() -> Self {
        Self {
            commit_ms: 5,
            commit_worst_ms: 50,
            network_ms: 1,
            network_worst_ms: 50,
            apply_ms: 1,
            followers: 1,
            fanout_us: 20,
        }
    }
}

impl BudgetEstimates {
    /// Worst cases must not be below typical ones.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        rules::at_least(
            &format!("{prefix}.commit_worst_ms"),
            self.commit_worst_ms,
            self.commit_ms,
        )?;
        rules::at_least(
            &format!("{prefix}.network_worst_ms"),
            self.network_worst_ms,
            self.network_ms,
        )?;
        rules::at_least(&format!("{prefix}.followers"), self.followers, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_worst_below_typical_is_rejected() {
        let estimates = BudgetEstimates {
            commit_worst_ms: 3,
            ..BudgetEstimates::default()
        };
        assert_eq!(
            estimates.validate("agent.budget").unwrap_err().to_string(),
            "agent.budget.commit_worst_ms = 3 must be at least 5"
        );
    }
}
