//! One `[[steps]]` entry of a scenario: the timed fault to drive, and its
//! checks (each names its dotted field, `steps[2].at_s`).

use serde::{Deserialize, Serialize};

use super::{at_least_one, positive, Action, ScenarioError};

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

impl Step {
    /// How long one round of `crash_rounds` or `pause_rounds` keeps its
    /// fault, in seconds.
    pub fn round_fault_s(&self) -> f64 {
        self.duration_s.unwrap_or(match self.action {
            Action::PauseRounds => 1.0,
            _ => 5.0,
        })
    }

    pub(super) fn validate(&self, index: usize, run_duration_s: f64) -> Result<(), ScenarioError> {
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
pub(super) fn check_actions(table: &toml::Table) -> Result<(), ScenarioError> {
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
