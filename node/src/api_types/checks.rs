//! The checks of a registration: the `checks` object of the body, its
//! validation into typed [`Check`]s (with the agent's default timings), and
//! the re-validation of a stored check read back from disk. Tested through
//! the registration body, in `registration`.

use rollcall_config::{CheckTiming, CheckTimingOverrides, MIN_CHECK_INTERVAL_MS};
use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// Longest accepted HTTP check path, in bytes.
pub const MAX_CHECK_PATH_LEN: usize = 1024;

/// Longest accepted TTL of a `ttl` check, in ms (one hour). A TTL is how long
/// a hung instance stays unnoticed, so longer values would hide failures.
pub const MAX_CHECK_TTL_MS: u64 = 3_600_000;

/// The `checks` object of a registration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChecksRequest {
    /// Gates the other two until it first passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<CheckRequest>,
    /// Failing removes new traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<CheckRequest>,
    /// Failing is reported to the supervisor; never routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<CheckRequest>,
}

/// One check of a registration. Omitted timing fields take the agent's
/// defaults for that kind of check (`[checks.*]` in its config).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// `http`, `tcp` or `ttl`.
    pub kind: String,
    /// For `http` only: the path to GET, starting with '/'; "/" when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// For `ttl` only (and required there): how long a heartbeat from the
    /// instance keeps the check passing, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// For `http` and `tcp`: the port to probe on the instance's address,
    /// when not the instance's own (a separate health port); 1–65535.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// See [`CheckTiming::interval_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// See [`CheckTiming::timeout_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// See [`CheckTiming::failure_threshold`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// See [`CheckTiming::success_threshold`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<u32>,
    /// See [`CheckTiming::jitter`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

/// The validated checks of a registration; at least one is present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidChecks {
    /// Gates the other two until it first passes.
    pub startup: Option<Check>,
    /// Failing removes new traffic.
    pub readiness: Option<Check>,
    /// Failing is reported to the supervisor.
    pub liveness: Option<Check>,
}

/// One validated check: what to probe and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "CheckParts")]
pub struct Check {
    /// What the probe does.
    pub kind: CheckKind,
    /// When it runs and how many results flip it (validated).
    pub timing: CheckTiming,
    /// For http and tcp: the port probed on the instance's address, when
    /// it is not the instance's own (a separate health or admin port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// What a check probes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CheckKind {
    /// An HTTP GET of `path` on the instance's address and port; 2xx and 3xx
    /// pass (redirects are not followed).
    Http {
        /// Starts with '/'; printable ASCII without spaces.
        path: String,
    },
    /// A TCP connect to the instance's address and port.
    Tcp,
    /// Passes while the instance sends heartbeats at most `ttl_ms` apart.
    Ttl {
        /// In ms.
        ttl_ms: u64,
    },
}

/// `Check` as stored, re-validated when read back from disk.
#[derive(Deserialize)]
struct CheckParts {
    kind: CheckKind,
    timing: CheckTiming,
    #[serde(default)]
    port: Option<u16>,
}

impl TryFrom<CheckParts> for Check {
    type Error = String;
    fn try_from(parts: CheckParts) -> Result<Check, String> {
        match &parts.kind {
            CheckKind::Http { path } => check_path("path", path)?,
            CheckKind::Tcp => {}
            CheckKind::Ttl { ttl_ms } => check_ttl("ttl_ms", *ttl_ms)?,
        }
        parts.timing.validate("timing").map_err(|e| e.to_string())?;
        check_port("port", &parts.kind, parts.port)?;
        Ok(Check {
            kind: parts.kind,
            timing: parts.timing,
            port: parts.port,
        })
    }
}

fn check_port(field: &str, kind: &CheckKind, port: Option<u16>) -> Result<(), String> {
    match (kind, port) {
        (_, None) => Ok(()),
        (_, Some(0)) => Err(format!("{field} = 0 must be between 1 and 65535")),
        (CheckKind::Ttl { .. }, Some(_)) => Err(format!(
            "{field} is only for http and tcp checks (a ttl check probes nothing)"
        )),
        _ => Ok(()),
    }
}

fn check_path(field: &str, path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{field} = {path:?} must start with '/'"));
    }
    if path.len() > MAX_CHECK_PATH_LEN {
        return Err(format!(
            "{field} is {} bytes long; the limit is {MAX_CHECK_PATH_LEN}",
            path.len()
        ));
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{field} = {path:?} must be printable ASCII without spaces (percent-encode the rest)"
        ));
    }
    Ok(())
}

fn check_ttl(field: &str, ttl_ms: u64) -> Result<(), String> {
    if (MIN_CHECK_INTERVAL_MS..=MAX_CHECK_TTL_MS).contains(&ttl_ms) {
        Ok(())
    } else {
        Err(format!(
            "{field} = {ttl_ms} must be between {MIN_CHECK_INTERVAL_MS} and {MAX_CHECK_TTL_MS}"
        ))
    }
}

impl CheckRequest {
    /// Validates this check as `checks.{which}`, on top of `default` timing.
    pub(super) fn validate(self, which: &str, default: &CheckTiming) -> Result<Check, ApiError> {
        let field = |name: &str| format!("checks.{which}.{name}");
        let invalid = ApiError::unprocessable;
        let is = |kind: &str| self.kind == kind;
        if self.path.is_some() && !is("http") {
            return Err(invalid(format!(
                "{} is only for http checks",
                field("path")
            )));
        }
        if self.ttl_ms.is_some() && !is("ttl") {
            return Err(invalid(format!(
                "{} is only for ttl checks",
                field("ttl_ms")
            )));
        }
        let kind = match self.kind.as_str() {
            "http" => {
                let path = self.path.unwrap_or_else(|| "/".to_string());
                check_path(&field("path"), &path).map_err(invalid)?;
                CheckKind::Http { path }
            }
            "tcp" => CheckKind::Tcp,
            "ttl" => {
                let ttl_ms = self.ttl_ms.ok_or_else(|| {
                    invalid(format!(
                        "{} is required for a ttl check: how long a heartbeat keeps it passing, in ms",
                        field("ttl_ms")
                    ))
                })?;
                check_ttl(&field("ttl_ms"), ttl_ms).map_err(invalid)?;
                CheckKind::Ttl { ttl_ms }
            }
            other => {
                return Err(invalid(format!(
                    "{} = {other:?} must be one of \"http\", \"tcp\", \"ttl\"",
                    field("kind")
                )))
            }
        };
        let overrides = CheckTimingOverrides {
            interval_ms: self.interval_ms,
            timeout_ms: self.timeout_ms,
            failure_threshold: self.failure_threshold,
            success_threshold: self.success_threshold,
            jitter: self.jitter,
        };
        let timing = overrides.apply_to(default);
        timing
            .validate(&format!("checks.{which}"))
            .map_err(|e| invalid(e.to_string()))?;
        check_port(&field("port"), &kind, self.port).map_err(invalid)?;
        Ok(Check {
            kind,
            timing,
            port: self.port,
        })
    }
}
