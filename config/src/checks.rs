//! Timing of one health check (interval, timeout, thresholds, jitter) and
//! the agent's defaults for registrations that omit them (R4). This file
//! only holds and validates numbers; it must not run probes or read clocks.

use serde::{Deserialize, Deserializer, Serialize};

use crate::{rules, ConfigError};

/// Shortest allowed probe interval, in ms. Faster probing burdens every
/// instance and buys little: the 15 s hard-failure SLO is met with 1 s.
pub const MIN_CHECK_INTERVAL_MS: u64 = 100;

/// Longest allowed probe interval, in ms (one hour): a check probed less
/// often says nothing useful about the instance, and a far larger value
/// (say u64::MAX) would mean a check that is never probed, leaving the
/// instance STARTING for good.
pub const MAX_CHECK_INTERVAL_MS: u64 = 3_600_000;

/// Most consecutive results a threshold may ask for.
pub const MAX_CHECK_THRESHOLD: u32 = 1_000;

/// Largest allowed jitter (fraction of the interval). Half an interval
/// already spreads a node's probes; more would stretch detection for no
/// further benefit.
pub const MAX_CHECK_JITTER: f64 = 0.5;

/// When and how often one check runs, and how many results flip its state.
///
/// A complete timing: deserializing it directly requires every field. Use
/// [`CheckTimingOverrides`] for input that may omit some (a config table or
/// a registration), applied on top of a default timing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckTiming {
    /// Time between the starts of two probes, in ms (before jitter). Detection
    /// time grows linearly with it (see the budget). 100 to 3,600,000.
    pub interval_ms: u64,
    /// How long one probe may take before it counts as failed, in ms. Must be
    /// below `interval_ms` so probes never overlap. A frozen app is only
    /// detected through timeouts, so this adds once to its detection time.
    pub timeout_ms: u64,
    /// Consecutive failed probes that flip the check to failing. 1 to 1,000;
    /// higher rides out single slow probes but adds a whole interval each.
    pub failure_threshold: u32,
    /// Consecutive passing probes that flip the check back to passing. 1 to 1,000.
    pub success_threshold: u32,
    /// Random stretch of each interval, as a fraction in 0.0..=0.5: each probe
    /// fires after `interval_ms × (1 + U[0, jitter])`, so the probes of one node
    /// (and of all nodes restarted together) never fire in lockstep.
    pub jitter: f64,
}

impl CheckTiming {
    /// Readiness default: 1000 ms / 500 ms / 3 failures / 1 success / 0.1.
    /// Readiness removes traffic, so it is the fast one: detection is at
    /// most 3 × 1.1 s + 0.5 s = 3.8 s, leaving more than 11 s of the 15 s
    /// hard-failure SLO (R5) for commit and propagation.
    pub const READINESS: Self = Self {
        interval_ms: 1_000,
        timeout_ms: 500,
        failure_threshold: 3,
        success_threshold: 1,
        jitter: 0.1,
    };

    /// Liveness default: 5000 ms / 1000 ms / 3 failures / 1 success / 0.1.
    /// Liveness never routes (its result goes to the supervisor, R4), so it
    /// is not in the 15 s budget and probes gently: a restart is expensive
    /// and should follow only a sustained failure (about 16.5 s at worst).
    pub const LIVENESS: Self = Self {
        interval_ms: 5_000,
        timeout_ms: 1_000,
        failure_threshold: 3,
        success_threshold: 1,
        jitter: 0.1,
    };

    /// Startup default: 1000 ms / 900 ms / 30 failures / 1 success / 0.1.
    /// Startup gates the other checks and keeps the instance STARTING (no
    /// traffic), so a slow start costs no SLO; 30 failures give an app about
    /// 30 s to come up before it counts as failed. The timeout is 900 ms, not
    /// a full interval, because a timeout must stay below the interval.
    pub const STARTUP: Self = Self {
        interval_ms: 1_000,
        timeout_ms: 900,
        failure_threshold: 30,
        success_threshold: 1,
        jitter: 0.1,
    };

    /// Checks the rules, naming fields as `{prefix}.interval_ms` and so on
    /// (e.g. `agent.checks.readiness`, or a registration's own path).
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        rules::between(
            &format!("{prefix}.interval_ms"),
            self.interval_ms,
            MIN_CHECK_INTERVAL_MS,
            MAX_CHECK_INTERVAL_MS,
        )?;
        rules::at_least(&format!("{prefix}.timeout_ms"), self.timeout_ms, 1)?;
        if self.timeout_ms >= self.interval_ms {
            return Err(ConfigError::invalid(
                format!("{prefix}.timeout_ms"),
                self.timeout_ms,
                format!("must be below interval_ms = {}", self.interval_ms),
            ));
        }
        rules::between(
            &format!("{prefix}.failure_threshold"),
            self.failure_threshold,
            1,
            MAX_CHECK_THRESHOLD,
        )?;
        rules::between(
            &format!("{prefix}.success_threshold"),
            self.success_threshold,
            1,
            MAX_CHECK_THRESHOLD,
        )?;
        if !(0.0..=MAX_CHECK_JITTER).contains(&self.jitter) {
            return Err(ConfigError::invalid(
                format!("{prefix}.jitter"),
                self.jitter,
                format!("must be between 0.0 and {MAX_CHECK_JITTER}"),
            ));
        }
        Ok(())
    }
}

/// A check timing as written by someone who may omit fields: a
/// `[checks.*]` table, or a registration that only changes the interval.
/// Missing fields take the values of the timing it is applied to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckTimingOverrides {
    /// See [`CheckTiming::interval_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// See [`CheckTiming::timeout_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// See [`CheckTiming::failure_threshold`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// See [`CheckTiming::success_threshold`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<u32>,
    /// See [`CheckTiming::jitter`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

impl CheckTimingOverrides {
    /// The timing with every stated field replacing the one in `base`. An
    /// omitted `timeout_ms` is `base`'s, unless a stated `interval_ms` is
    /// not above it (a timeout must be below the interval): then it is half
    /// that interval, so an interval inside the documented range is never
    /// refused for a timeout nobody stated.
    pub fn apply_to(&self, base: &CheckTiming) -> CheckTiming {
        let interval_ms = self.interval_ms.unwrap_or(base.interval_ms);
        let timeout_ms = match self.timeout_ms {
            Some(timeout_ms) => timeout_ms,
            None if base.timeout_ms >= interval_ms => interval_ms / 2,
            None => base.timeout_ms,
        };
        CheckTiming {
            interval_ms,
            timeout_ms,
            failure_threshold: self.failure_threshold.unwrap_or(base.failure_threshold),
            success_threshold: self.success_threshold.unwrap_or(base.success_threshold),
            jitter: self.jitter.unwrap_or(base.jitter),
        }
    }
}

/// `[checks.*]`: the timing a check gets when its registration omits it.
/// A partial table keeps the defaults of its own kind for the fields it
/// omits (a `[checks.liveness]` with only `interval_ms` keeps liveness's
/// timeout, not readiness's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChecksConfig {
    /// `[checks.readiness]`: failing removes new traffic (READY → UNHEALTHY).
    /// Default [`CheckTiming::READINESS`]; it is the check in the budget.
    #[serde(deserialize_with = "readiness")]
    pub readiness: CheckTiming,
    /// `[checks.liveness]`: failing is reported to the supervisor for a
    /// restart and never routes. Default [`CheckTiming::LIVENESS`].
    #[serde(deserialize_with = "liveness")]
    pub liveness: CheckTiming,
    /// `[checks.startup]`: gates the other two until it first passes.
    /// Default [`CheckTiming::STARTUP`].
    #[serde(deserialize_with = "startup")]
    pub startup: CheckTiming,
}

impl Default for ChecksConfig {
    fn default() -> Self {
        Self {
            readiness: CheckTiming::READINESS,
            liveness: CheckTiming::LIVENESS,
            startup: CheckTiming::STARTUP,
        }
    }
}

impl ChecksConfig {
    /// Validates the three timings, naming fields under `prefix`.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        self.readiness.validate(&format!("{prefix}.readiness"))?;
        self.liveness.validate(&format!("{prefix}.liveness"))?;
        self.startup.validate(&format!("{prefix}.startup"))
    }
}

fn readiness<'de, D: Deserializer<'de>>(de: D) -> Result<CheckTiming, D::Error> {
    CheckTimingOverrides::deserialize(de).map(|o| o.apply_to(&CheckTiming::READINESS))
}

fn liveness<'de, D: Deserializer<'de>>(de: D) -> Result<CheckTiming, D::Error> {
    CheckTimingOverrides::deserialize(de).map(|o| o.apply_to(&CheckTiming::LIVENESS))
}

fn startup<'de, D: Deserializer<'de>>(de: D) -> Result<CheckTiming, D::Error> {
    CheckTimingOverrides::deserialize(de).map(|o| o.apply_to(&CheckTiming::STARTUP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        ChecksConfig::default()
            .validate("agent.checks")
            .expect("defaults must validate");
    }

    #[test]
    fn partial_table_keeps_its_own_kinds_defaults() {
        let checks: ChecksConfig =
            toml::from_str("[liveness]\ninterval_ms = 6000\n").expect("valid TOML");
        assert_eq!(
            checks.liveness,
            CheckTiming {
                interval_ms: 6000,
                ..CheckTiming::LIVENESS
            }
        );
        assert_eq!(checks.readiness, CheckTiming::READINESS);
    }

    #[test]
    fn timeout_not_below_interval_names_both_fields() {
        let timing = CheckTiming {
            interval_ms: 5000,
            timeout_ms: 6000,
            ..CheckTiming::READINESS
        };
        let err = timing.validate("agent.checks.readiness").unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent.checks.readiness.timeout_ms = 6000 must be below interval_ms = 5000"
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        let base = CheckTiming::READINESS;
        let cases = [
            (
                CheckTiming {
                    interval_ms: 50,
                    timeout_ms: 10,
                    ..base
                },
                "x.interval_ms",
            ),
            (
                CheckTiming {
                    timeout_ms: 0,
                    ..base
                },
                "x.timeout_ms",
            ),
            (
                CheckTiming {
                    failure_threshold: 0,
                    ..base
                },
                "x.failure_threshold",
            ),
            (
                CheckTiming {
                    success_threshold: 0,
                    ..base
                },
                "x.success_threshold",
            ),
            (
                CheckTiming {
                    jitter: 0.6,
                    ..base
                },
                "x.jitter",
            ),
            (
                CheckTiming {
                    jitter: f64::NAN,
                    ..base
                },
                "x.jitter",
            ),
        ];
        for (timing, field) in cases {
            let err = timing.validate("x").unwrap_err().to_string();
            assert!(err.starts_with(&format!("{field} = ")), "{err}");
        }
    }

    #[test]
    fn unknown_key_in_a_check_table_is_rejected() {
        let err = toml::from_str::<ChecksConfig>("[readiness]\njiter = 0.2\n").unwrap_err();
        assert!(err.to_string().contains("jiter"), "{err}");
    }
}
