//! The wire types of the agent's local HTTP API (JSON): request bodies, their
//! validation into typed values, responses and the error body.
//!
//! These names and shapes are a public contract with every workload and tool
//! on the host: change them only additively. Requests deny unknown fields so
//! a typo is an error, not a silently ignored setting, and every validation
//! error names the field (`checks.readiness.timeout_ms = 6000 must be below
//! interval_ms = 5000`). This module only describes and validates; it must
//! not hold agent state, call the arbiter or read clocks.

use std::collections::BTreeMap;
use std::net::IpAddr;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rollcall_config::{CheckTiming, CheckTimingOverrides, ChecksConfig, MIN_CHECK_INTERVAL_MS};
use rollcall_leases::{
    EndpointRecord, InstanceId, Label, LabelValue, NameError, NodeId, ServiceKey, Version, Weight,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The namespace and port name a registration gets when it omits them.
pub const DEFAULT_NAME: &str = "default";

/// Longest accepted HTTP check path, in bytes.
pub const MAX_CHECK_PATH_LEN: usize = 1024;

/// Longest accepted TTL of a `ttl` check, in ms (one hour). A TTL is how long
/// a hung instance stays unnoticed, so longer values would hide failures.
pub const MAX_CHECK_TTL_MS: u64 = 3_600_000;

// ----- errors -----

/// An API error: an HTTP status and the JSON body `{"error", "detail"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{error} ({status}): {detail}")]
pub struct ApiError {
    /// The HTTP status code (not part of the body).
    #[serde(skip)]
    pub status: u16,
    /// A short stable code clients can switch on: `invalid_request`,
    /// `too_large`, `conflict`, `stale_generation`, `not_found`,
    /// `unavailable`, `forbidden`, `unauthorized`.
    pub error: &'static str,
    /// What was wrong and what to do about it, naming the field if any.
    pub detail: String,
}

impl ApiError {
    fn new(status: StatusCode, error: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status: status.as_u16(),
            error,
            detail: detail.into(),
        }
    }

    /// 400 `invalid_request`: the body is not valid JSON of the expected shape.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", detail)
    }

    /// 422 `invalid_request`: the body parses but a value breaks a rule.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail)
    }

    /// 413 `too_large`: the body is over the size limit.
    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", detail)
    }

    /// 409 `conflict`: the request contradicts the current state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    /// 409 `stale_generation`: the caller named a generation that is no
    /// longer the instance's current one (a replaced process).
    pub fn stale_generation(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "stale_generation", detail)
    }

    /// 404 `not_found`.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// 503 `unavailable`: the agent cannot answer now (for example it is
    /// not subscribed to the service and the arbiter is unreachable).
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// 403 `forbidden`: the caller is known but may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// 401 `unauthorized`: the caller did not prove who it is.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self)).into_response()
    }
}

/// Parses a JSON request body of at most `max` bytes: 413 over the limit,
/// 400 with serde_json's message (which names the unknown field, or the line
/// and column of the syntax error) when it does not parse.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8], max: usize) -> Result<T, ApiError> {
    if bytes.len() > max {
        return Err(ApiError::too_large(format!(
            "request body of {} bytes exceeds the {max}-byte limit",
            bytes.len()
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A 422 naming `field` for a name that failed validation.
fn name_error(field: &str, e: NameError) -> ApiError {
    ApiError::unprocessable(format!("{field} = {:?} is invalid: {}", e.value, e.rule))
}

// ----- registration -----

/// Body of `PUT /v1/agent/instances`: register (or re-register) an instance
/// on this node. Validate it with [`RegisterRequest::validate`].
///
/// Numbers that have a range (`port`, `weight`) are signed here so that an
/// out-of-range value gets an error naming the field rather than a type error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// The logical service (a DNS label).
    pub service: String,
    /// The namespace (a DNS label), "default" when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The named port of the service (a DNS label), "default" when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_name: Option<String>,
    /// Stable id of the instance (process slot).
    pub instance_id: String,
    /// The IPv4 or IPv6 address callers connect to.
    pub address: String,
    /// The port callers connect to, 1 to 65535.
    pub port: i64,
    /// The zone; must match the node's zone when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The software version, empty when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Relative weight, 1 to 10,000; 100 when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    /// Labels: DNS-label keys to label values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Health checks; without any the instance is READY at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<ChecksRequest>,
}

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

/// A registration after validation: every value typed, defaults applied.
/// The agent persists it (with `durable`) to reconcile after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidRegistration {
    /// The service key.
    pub service: ServiceKey,
    /// The instance.
    pub instance_id: InstanceId,
    /// Where callers connect.
    pub address: IpAddr,
    /// The port callers connect to (never 0).
    pub port: u16,
    /// The zone, if the caller stated one.
    pub zone: Option<Label>,
    /// The software version (may be empty).
    pub version: Version,
    /// Relative weight.
    pub weight: Weight,
    /// Labels, sorted by key.
    pub labels: Vec<(Label, LabelValue)>,
    /// The checks; `None` when the registration has none (an empty `checks`
    /// object counts as none).
    pub checks: Option<ValidChecks>,
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
    fn validate(self, which: &str, default: &CheckTiming) -> Result<Check, ApiError> {
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

impl RegisterRequest {
    /// Validates every field into typed values, applying the defaults
    /// (namespace and port name "default", weight 100, version "", check
    /// timings from `defaults`). The first broken rule is returned as a 422
    /// whose detail names the field.
    pub fn validate(self, defaults: &ChecksConfig) -> Result<ValidRegistration, ApiError> {
        let label = |field: &str, value: &str| Label::new(value).map_err(|e| name_error(field, e));
        let namespace = label(
            "namespace",
            self.namespace.as_deref().unwrap_or(DEFAULT_NAME),
        )?;
        let service = label("service", &self.service)?;
        let port_name = label(
            "port_name",
            self.port_name.as_deref().unwrap_or(DEFAULT_NAME),
        )?;
        let instance_id =
            InstanceId::new(&self.instance_id).map_err(|e| name_error("instance_id", e))?;
        if self.instance_id.bytes().all(|b| b == b'.') {
            // "." and ".." would be path segments, not names, in the
            // instance paths of this API.
            return Err(ApiError::unprocessable(format!(
                "instance_id = {:?} is invalid: it must contain a character other than '.'",
                self.instance_id
            )));
        }
        let address: IpAddr = self.address.parse().map_err(|_| {
            ApiError::unprocessable(format!(
                "address = {:?} is not an IPv4 or IPv6 address",
                self.address
            ))
        })?;
        let broadcast = matches!(address, IpAddr::V4(v4) if v4.is_broadcast());
        if address.is_unspecified() || address.is_multicast() || broadcast {
            return Err(ApiError::unprocessable(format!(
                "address = {:?} is not an address callers can connect to",
                self.address
            )));
        }
        let port = u16::try_from(self.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                ApiError::unprocessable(format!("port = {} must be between 1 and 65535", self.port))
            })?;
        let zone = self.zone.as_deref().map(|z| label("zone", z)).transpose()?;
        let version = Version::new(self.version.as_deref().unwrap_or(""))
            .map_err(|e| name_error("version", e))?;
        let weight = match self.weight {
            None => Weight::DEFAULT,
            Some(w) => u32::try_from(w)
                .map_err(|_| w.to_string())
                .and_then(Weight::new)
                .map_err(|_| {
                    ApiError::unprocessable(format!(
                        "weight = {w} must be between 1 and {}",
                        Weight::MAX
                    ))
                })?,
        };
        let labels = self
            .labels
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                let key = label(&format!("labels.{k}"), &k)?;
                let value =
                    LabelValue::new(&v).map_err(|e| name_error(&format!("labels.{k}"), e))?;
                Ok((key, value))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let checks = match self.checks {
            None => None,
            Some(c) => {
                let one = |check: Option<CheckRequest>, which: &str, default: &CheckTiming| {
                    check.map(|c| c.validate(which, default)).transpose()
                };
                let checks = ValidChecks {
                    startup: one(c.startup, "startup", &defaults.startup)?,
                    readiness: one(c.readiness, "readiness", &defaults.readiness)?,
                    liveness: one(c.liveness, "liveness", &defaults.liveness)?,
                };
                let any = checks.startup.is_some()
                    || checks.readiness.is_some()
                    || checks.liveness.is_some();
                any.then_some(checks)
            }
        };
        Ok(ValidRegistration {
            service: ServiceKey {
                namespace,
                service,
                port_name,
            },
            instance_id,
            address,
            port,
            zone,
            version,
            weight,
            labels,
            checks,
        })
    }
}

// ----- responses -----

/// Answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The instance.
    pub instance_id: InstanceId,
    /// The generation the catalog assigned; `null` while pending.
    pub generation: Option<u64>,
    /// The record's state (`STARTING`, `READY`, …).
    pub state: String,
    /// True when the arbiter was unreachable: accepted locally, not yet
    /// committed. Always present.
    pub pending: bool,
}

/// Answer to a drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainResponse {
    /// The revision that committed the drain; `null` while pending.
    pub revision: Option<u64>,
    /// True when accepted locally only (it already applies to this agent's
    /// own proxy).
    pub pending: bool,
    /// How far the drain has reached other agents, when the caller waited.
    pub propagated: Option<Propagated>,
}

/// How many subscribed agents acknowledged a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propagated {
    /// Agents that acknowledged the revision.
    pub acked: u32,
    /// Agents subscribed to the service.
    pub total: u32,
    /// Whether every one of them did.
    pub complete: bool,
}

/// Answer of the resolve API: one service's endpoints as this agent sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsResponse {
    /// The service.
    pub service: Label,
    /// Its namespace.
    pub namespace: Label,
    /// Its port name.
    pub port_name: Label,
    /// The catalog shard it lives in.
    pub shard: u16,
    /// The revision of the service's last change held.
    pub revision: u64,
    /// Age of the held copy, in ms since it was last confirmed by the arbiter.
    pub age_ms: u64,
    /// Whether the copy is older than the service's maximum age, or was
    /// loaded from the cache and not yet confirmed.
    pub stale: bool,
    /// How the agent is serving it (its outage policy or protection in effect).
    pub mode: String,
    /// The region the answer comes from: this agent's own, or the region
    /// the service failed over to (then `endpoints` is empty and
    /// `failover.ingress` lists where to connect).
    pub region: Label,
    /// The endpoints.
    pub endpoints: Vec<EndpointJson>,
    /// Whether the copy is past its maximum age and served degraded
    /// (staleness behaviour `degrade`): only endpoints this agent has
    /// fresh local evidence of, no failover to other regions (README,
    /// "Stale copies").
    #[serde(default)]
    pub degraded: bool,
    /// Why, when `degraded`: the copy's age and limit, and which set is
    /// served (the endpoints with fresh local evidence, or the whole copy
    /// when none has any).
    #[serde(default)]
    pub degraded_reason: Option<String>,
    /// Set when the service has no usable endpoint in this region: where
    /// its traffic goes instead, or why it goes nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverJson>,
    /// A fingerprint of what this answer routes to (its mode, region,
    /// failover, and each endpoint's instance, generation, state and
    /// address; not the weights, which slow start moves continuously):
    /// pass it back as `?index=` to wait until the answer changes.
    pub index: String,
}

impl EndpointsResponse {
    /// The fingerprint `index` holds, of the other fields.
    pub fn fingerprint(&self) -> String {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut put = |s: &str| {
            h.update(s.as_bytes());
            h.update(&[0]);
        };
        put(&self.mode);
        put(if self.degraded { "degraded" } else { "" });
        put(self.region.as_str());
        if let Some(f) = &self.failover {
            put(f.region.as_ref().map_or("", |r| r.as_str()));
            put(f.refused.as_deref().unwrap_or(""));
            for i in &f.ingress {
                put(i);
            }
        }
        for e in &self.endpoints {
            put(e.instance_id.as_str());
            put(&e.generation.to_string());
            put(&e.state);
            put(&e.address.to_string());
            put(&e.port.to_string());
        }
        format!("{:016x}", h.digest())
    }
}

/// Failover of an answer to another region (R9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverJson {
    /// The region the traffic goes to; `null` when it goes nowhere.
    pub region: Option<Label>,
    /// That region's ingress addresses (`host:port`): connect there and
    /// open with the ingress preamble (the agent's proxy does this).
    pub ingress: Vec<String>,
    /// READY instances of the service in that region, by its summary.
    pub ready: u32,
    /// Why the traffic stays here with no backend (a
    /// `rollcall_agent_failover_refusals_total` reason); `null` when it moves.
    pub refused: Option<String>,
    /// The same in words.
    pub detail: String,
}

/// Answer of `GET /v1/regions`: what this agent holds of other regions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionsResponse {
    /// This agent's region.
    pub region: String,
    /// Every other region its arbiter holds a view of, with the summaries
    /// of the services this agent follows.
    pub regions: Vec<crate::failover::RegionStatus>,
    /// The policies of the services this agent follows.
    pub policies: Vec<RegionsPolicy>,
}

/// One policy in a [`RegionsResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionsPolicy {
    /// The document, as its home region committed it.
    pub policy: rollcall_config::ServicePolicy,
    /// Its revision in its home region.
    pub home_revision: u64,
}

impl Eq for RegionsPolicy {}

/// One endpoint in an [`EndpointsResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointJson {
    /// The instance.
    pub instance_id: InstanceId,
    /// Its registration's generation.
    pub generation: u64,
    /// Where to connect.
    pub address: IpAddr,
    /// The port to connect to.
    pub port: u16,
    /// Its zone.
    pub zone: Label,
    /// Its software version.
    pub version: Version,
    /// Its relative weight.
    pub weight: u32,
    /// `STARTING`, `READY`, `DRAINING`, `UNHEALTHY` or `EXPIRED`.
    pub state: String,
    /// `unknown`, `passing` or `failing` (informational, never routes).
    pub liveness: String,
}

impl EndpointJson {
    /// The API form of a catalog record.
    pub fn from_record(record: &EndpointRecord) -> Self {
        EndpointJson {
            instance_id: record.instance_id.clone(),
            generation: record.generation.get(),
            address: record.address,
            port: record.port,
            zone: record.zone.clone(),
            version: record.version.clone(),
            weight: record.weight.get(),
            state: record.state.as_str().to_string(),
            liveness: record.liveness.as_str().to_string(),
        }
    }
}

/// Answer of `GET /v1/agent/instances`: this node's registrations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstancesResponse {
    /// Every local registration, in instance id order.
    pub instances: Vec<LocalInstanceJson>,
}

/// One of this node's registrations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalInstanceJson {
    /// The instance.
    pub instance_id: InstanceId,
    /// Its service, as `namespace/service/port_name`.
    #[serde(with = "key_text")]
    pub service: ServiceKey,
    /// Where callers connect.
    pub address: IpAddr,
    /// The port callers connect to.
    pub port: u16,
    /// The generation the catalog gave it; `null` while its registration
    /// is pending.
    pub generation: Option<u64>,
    /// What the agent wants for it: `serve`, `drain` or `leave`.
    pub intent: String,
    /// Whether the arbiter has committed that intent (`false`: pending,
    /// sent when the arbiter answers or is back).
    pub committed: bool,
    /// The state its health checks give it (`STARTING`, `READY`,
    /// `UNHEALTHY`); `null` when it has no checks.
    pub checked: Option<String>,
}

/// Answer of `GET /v1/services`: the region's services, listed by the
/// arbiter; or, when it cannot be asked, the services this agent holds a
/// copy of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicesResponse {
    /// `catalog` (the arbiter listed the region's services) or `held` (the
    /// arbiter could not be asked: only the copies this agent holds).
    pub source: String,
    /// The revision of the catalog listed (`null` for `held`).
    pub revision: Option<u64>,
    /// More services than the arbiter lists at once (10,000): the list
    /// holds the first ones in key order.
    pub truncated: bool,
    /// Each service, in key order.
    pub services: Vec<ServiceJson>,
}

/// One service with its counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceJson {
    /// The service key, as `namespace/service/port_name`.
    #[serde(with = "key_text")]
    pub service: ServiceKey,
    /// The revision of its last change (held, for `held`).
    pub revision: u64,
    /// Endpoints READY (in the catalog, or in the copy).
    pub ready: usize,
    /// Every endpoint, whatever its state.
    pub total: usize,
    /// Whether the copy is not confirmed by the arbiter in this session
    /// (always `false` for `catalog`).
    pub stale: bool,
    /// Age of the copy, ms (0 while the session keeps it current, and
    /// for `catalog`).
    pub age_ms: u64,
}

/// Answer of the agent's status endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// This node.
    pub node: NodeId,
    /// Its zone.
    pub zone: Label,
    /// This run of the agent.
    pub agent_epoch: u64,
    /// The connection to the arbiter.
    pub arbiter: ArbiterStatus,
    /// The node lease, when one is held.
    pub lease: Option<LeaseStatus>,
    /// Every subscribed service.
    pub subscriptions: Vec<SubscriptionStatus>,
    /// Writes accepted locally and not yet committed.
    pub pending_writes: u32,
    /// This node's view of its zone's gossip; `null` when gossip is off
    /// (no `gossip.key_file`). Gossip that is on and has heard of no peer
    /// yet (a zone's lone member) shows empty lists.
    pub gossip: Option<GossipStatus>,
    /// The certificate this agent presents to the arbiter (its identity,
    /// serial and notAfter) and the CAs it trusts; `null` when it has no
    /// arbiter (no TLS material).
    #[serde(default)]
    pub tls: Option<rollcall_leases::tls::TlsStatus>,
}

/// The zone peers this node's gossip knows (like `consul members`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GossipStatus {
    /// Peers seen alive, by node id (this node excluded).
    pub alive: Vec<NodeId>,
    /// Peers gossip declared down and not seen since.
    pub down: Vec<NodeId>,
}

/// The agent's connection to the arbiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArbiterStatus {
    /// Whether a session is up.
    pub connected: bool,
    /// The arbiter it talks to (or last talked to).
    pub address: Option<String>,
    /// Milliseconds since the last successful contact; `null` if never.
    pub last_contact_ms: Option<u64>,
    /// The identity of the arbiter's catalog (16 hex digits) as of the last
    /// session; `null` before any, or while the arbiter group has not named
    /// it yet.
    #[serde(default)]
    pub catalog: Option<String>,
}

/// The node lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// The lease id.
    pub id: u64,
    /// Its time to live, in ms.
    pub ttl_ms: u64,
}

/// One subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionStatus {
    /// The service key, as `namespace/service/port_name`.
    #[serde(with = "key_text")]
    pub service: ServiceKey,
    /// The revision held.
    pub revision: u64,
    /// Revisions behind the newest the arbiter announced for the service's
    /// shard (0 when caught up).
    pub lag: u64,
    /// Whether the held copy is stale.
    pub stale: bool,
    /// Age of the held copy, ms: 0 while the session keeps it current,
    /// else the time since it was last known current (since the agent
    /// started, for a copy from the disk cache not confirmed yet).
    #[serde(default)]
    pub age_ms: u64,
}

/// A service key as its `namespace/service/port_name` text.
mod key_text {
    use rollcall_leases::ServiceKey;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(key: &ServiceKey, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(key)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ServiceKey, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    use rollcall_leases::{
        AgentEpoch, Generation, LeaseId, Liveness, Principal, PrincipalName, Reason, Revision,
        Role, State,
    };
    use serde_json::{json, Value};

    use super::*;

    fn parse(body: Value) -> Result<RegisterRequest, ApiError> {
        parse_json(body.to_string().as_bytes(), 64 * 1024)
    }

    fn validate(body: Value) -> Result<ValidRegistration, ApiError> {
        parse(body)?.validate(&ChecksConfig::default())
    }

    fn minimal() -> Value {
        json!({
            "service": "checkout",
            "instance_id": "checkout-7d9f8b6c4-x2k9p",
            "address": "10.0.0.7",
            "port": 8080
        })
    }

    fn with(field: &str, value: Value) -> Value {
        let mut body = minimal();
        body[field] = value;
        body
    }

    #[test]
    fn a_minimal_body_gets_the_defaults() {
        let reg = validate(minimal()).unwrap();
        assert_eq!(
            reg.service,
            ServiceKey::new("default", "checkout", "default").unwrap()
        );
        assert_eq!(reg.instance_id.as_str(), "checkout-7d9f8b6c4-x2k9p");
        assert_eq!(reg.address, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)));
        assert_eq!(reg.port, 8080);
        assert_eq!(reg.zone, None);
        assert_eq!(reg.version.as_str(), "");
        assert_eq!(reg.weight, Weight::DEFAULT);
        assert!(reg.labels.is_empty());
        assert_eq!(reg.checks, None);
    }

    #[test]
    fn a_full_body_parses_to_typed_values() {
        let reg = validate(json!({
            "service": "checkout",
            "namespace": "shop",
            "port_name": "grpc",
            "instance_id": "checkout-1",
            "address": "2001:db8::7",
            "port": 9090,
            "zone": "eu-west-1a",
            "version": "v1.42.0",
            "weight": 250,
            "labels": {"track": "canary", "arch": "arm64"},
            "checks": {
                "startup": {"kind": "tcp"},
                "readiness": {"kind": "http", "path": "/healthz", "interval_ms": 2000, "port": 9091},
                "liveness": {"kind": "ttl", "ttl_ms": 30000}
            }
        }))
        .unwrap();
        assert_eq!(reg.service.to_string(), "shop/checkout/grpc");
        assert_eq!(reg.address, "2001:db8::7".parse::<IpAddr>().unwrap());
        assert_eq!(reg.zone.unwrap().as_str(), "eu-west-1a");
        assert_eq!(reg.version.as_str(), "v1.42.0");
        assert_eq!(reg.weight.get(), 250);
        let labels: Vec<(&str, &str)> = reg
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(labels, [("arch", "arm64"), ("track", "canary")]);
        let checks = reg.checks.unwrap();
        assert_eq!(
            checks.startup,
            Some(Check {
                kind: CheckKind::Tcp,
                timing: CheckTiming::STARTUP,
                port: None,
            })
        );
        assert_eq!(
            checks.readiness,
            Some(Check {
                kind: CheckKind::Http {
                    path: "/healthz".into()
                },
                timing: CheckTiming {
                    interval_ms: 2000,
                    ..CheckTiming::READINESS
                },
                port: Some(9091),
            })
        );
        assert_eq!(
            checks.liveness,
            Some(Check {
                kind: CheckKind::Ttl { ttl_ms: 30_000 },
                timing: CheckTiming::LIVENESS,
                port: None,
            })
        );
    }

    #[test]
    fn check_timings_come_from_the_agents_defaults() {
        let mut defaults = ChecksConfig::default();
        defaults.readiness.interval_ms = 3000;
        let reg = parse(with(
            "checks",
            json!({"readiness": {"kind": "http", "timeout_ms": 700}}),
        ))
        .unwrap()
        .validate(&defaults)
        .unwrap();
        let readiness = reg.checks.unwrap().readiness.unwrap();
        assert_eq!(readiness.kind, CheckKind::Http { path: "/".into() });
        assert_eq!(readiness.timing.interval_ms, 3000);
        assert_eq!(readiness.timing.timeout_ms, 700);
    }

    /// Issue 37, item 6: an interval alone, below the default timeout, gets
    /// half of itself as its timeout instead of a 422; an interval above
    /// the default timeout keeps it.
    #[test]
    fn an_interval_alone_derives_its_timeout_when_the_default_does_not_fit() {
        let timing = |interval: u64| {
            let reg = validate(with(
                "checks",
                json!({"readiness": {"kind": "http", "interval_ms": interval}}),
            ))
            .unwrap();
            reg.checks.unwrap().readiness.unwrap().timing
        };
        let default = ChecksConfig::default().readiness.timeout_ms;
        assert_eq!(default, 500);
        assert_eq!(
            (timing(200).interval_ms, timing(200).timeout_ms),
            (200, 100)
        );
        assert_eq!(timing(500).timeout_ms, 250);
        assert_eq!(timing(800).timeout_ms, default);
        // A stated timeout is never changed: one that does not fit is refused.
        let e = validate(with(
            "checks",
            json!({"readiness": {"kind": "http", "interval_ms": 200, "timeout_ms": 300}}),
        ))
        .unwrap_err();
        assert!(
            e.detail
                .contains("timeout_ms = 300 must be below interval_ms = 200"),
            "{}",
            e.detail
        );
    }

    #[test]
    fn an_empty_checks_object_means_no_checks() {
        assert_eq!(validate(with("checks", json!({}))).unwrap().checks, None);
    }

    #[test]
    fn invalid_inputs_are_rejected_naming_the_field() {
        let cases: Vec<(Value, u16, &str)> = vec![
            (with("colour", json!("red")), 400, "colour"),
            (
                with("service", json!("Bad_Name")),
                422,
                "service = \"Bad_Name\"",
            ),
            (with("namespace", json!("-x")), 422, "namespace"),
            (with("port_name", json!("a.b")), 422, "port_name"),
            (with("instance_id", json!("has space")), 422, "instance_id"),
            (with("address", json!("10.0.0.300")), 422, "address"),
            (with("address", json!("checkout.local")), 422, "address"),
            (with("address", json!("0.0.0.0")), 422, "address"),
            (with("port", json!(0)), 422, "port = 0"),
            (with("port", json!(70000)), 422, "port = 70000"),
            (with("port", json!(-1)), 422, "port = -1"),
            (with("weight", json!(0)), 422, "weight = 0"),
            (with("weight", json!(10001)), 422, "weight = 10001"),
            (with("zone", json!("EU")), 422, "zone"),
            (with("version", json!("v 1")), 422, "version"),
            (with("labels", json!({"Track": "x"})), 422, "labels.Track"),
            (with("labels", json!({"track": "a b"})), 422, "labels.track"),
            (
                with(
                    "checks",
                    json!({"readiness": {"kind": "http", "interval_ms": 5000, "timeout_ms": 6000}}),
                ),
                422,
                "checks.readiness.timeout_ms = 6000 must be below interval_ms = 5000",
            ),
            (
                with("checks", json!({"liveness": {"kind": "ttl"}})),
                422,
                "checks.liveness.ttl_ms",
            ),
            (
                with(
                    "checks",
                    json!({"readiness": {"kind": "http", "path": "healthz"}}),
                ),
                422,
                "checks.readiness.path",
            ),
            (
                with(
                    "checks",
                    json!({"readiness": {"kind": "http", "path": "/a b"}}),
                ),
                422,
                "checks.readiness.path",
            ),
            (
                with("checks", json!({"startup": {"kind": "tcp", "path": "/"}})),
                422,
                "checks.startup.path",
            ),
            (
                with(
                    "checks",
                    json!({"startup": {"kind": "http", "ttl_ms": 1000}}),
                ),
                422,
                "checks.startup.ttl_ms",
            ),
            (
                with("checks", json!({"readiness": {"kind": "grpc"}})),
                422,
                "checks.readiness.kind",
            ),
            (
                with(
                    "checks",
                    json!({"readiness": {"kind": "tcp", "jitter": 0.9}}),
                ),
                422,
                "checks.readiness.jitter",
            ),
            (
                with(
                    "checks",
                    json!({"readiness": {"kind": "tcp", "intervl_ms": 10}}),
                ),
                400,
                "intervl_ms",
            ),
            (with("checks", json!({"readyness": {}})), 400, "readyness"),
        ];
        for (body, status, needle) in cases {
            let err = validate(body.clone()).unwrap_err();
            assert_eq!(err.status, status, "{body}: {err}");
            assert!(
                err.detail.contains(needle),
                "{body}: {:?} lacks {needle:?}",
                err.detail
            );
        }
    }

    #[test]
    fn parse_json_limits_size_and_reports_syntax() {
        let err = parse_json::<RegisterRequest>(&[b' '; 100], 99).unwrap_err();
        assert_eq!((err.status, err.error), (413, "too_large"));
        assert!(err.detail.contains("99-byte limit"), "{}", err.detail);
        let err = parse_json::<RegisterRequest>(b"{\"service\": ", 1024).unwrap_err();
        assert_eq!((err.status, err.error), (400, "invalid_request"));
        assert!(err.detail.contains("line 1"), "{}", err.detail);
        let err = parse_json::<RegisterRequest>(b"{\"service\": \"x\"}", 1024).unwrap_err();
        assert!(err.detail.contains("instance_id"), "{}", err.detail);
    }

    #[test]
    fn a_valid_registration_survives_a_round_trip_through_json() {
        let reg = validate(json!({
            "service": "checkout",
            "instance_id": "checkout-1",
            "address": "10.0.0.1",
            "port": 80,
            "checks": {"readiness": {"kind": "http", "path": "/ready"}, "liveness": {"kind": "ttl", "ttl_ms": 5000}}
        }))
        .unwrap();
        let text = serde_json::to_string(&reg).unwrap();
        let back: ValidRegistration = serde_json::from_str(&text).unwrap();
        assert_eq!(back, reg);
        // Reading back re-validates what the types cannot hold by themselves.
        let tampered = text.replace("\"/ready\"", "\"ready\"");
        assert!(serde_json::from_str::<ValidRegistration>(&tampered).is_err());
    }

    #[test]
    fn api_errors_serialize_as_error_and_detail() {
        let err = ApiError::not_found("no instance checkout-1 on this node");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"error": "not_found", "detail": "no instance checkout-1 on this node"})
        );
        let response = ApiError::stale_generation("x").into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let codes = [
            (ApiError::bad_request(""), 400),
            (ApiError::unprocessable(""), 422),
            (ApiError::conflict(""), 409),
            (ApiError::unavailable(""), 503),
            (ApiError::forbidden(""), 403),
            (ApiError::unauthorized(""), 401),
        ];
        for (err, status) in codes {
            assert_eq!(err.status, status);
            assert_eq!(err.into_response().status().as_u16(), status);
        }
    }

    #[test]
    fn endpoint_json_matches_the_contract() {
        let record = EndpointRecord {
            instance_id: InstanceId::new("checkout-1").unwrap(),
            generation: Generation(3),
            node_id: NodeId::new("node-1").unwrap(),
            epoch: AgentEpoch(1),
            lease: LeaseId(1),
            address: "10.0.0.1".parse().unwrap(),
            port: 8080,
            region: Label::new("r1").unwrap(),
            zone: Label::new("z1").unwrap(),
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            state: State::Ready,
            reason: Reason::new("registered").unwrap(),
            origin: Principal {
                role: Role::Agent,
                name: PrincipalName::new("node-1").unwrap(),
            },
            liveness: Liveness::Passing,
            revision: Revision(9),
            changed_at_ms: 1,
        };
        let value = serde_json::to_value(EndpointJson::from_record(&Arc::new(record))).unwrap();
        assert_eq!(
            value,
            json!({
                "instance_id": "checkout-1",
                "generation": 3,
                "address": "10.0.0.1",
                "port": 8080,
                "zone": "z1",
                "version": "v1",
                "weight": 100,
                "state": "READY",
                "liveness": "passing"
            })
        );
    }

    #[test]
    fn responses_have_the_contract_keys() {
        let keys = |v: Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let register = RegisterResponse {
            instance_id: InstanceId::new("checkout-1").unwrap(),
            generation: None,
            state: State::Starting.as_str().to_string(),
            pending: false,
        };
        assert_eq!(
            serde_json::to_value(&register).unwrap(),
            json!({"instance_id": "checkout-1", "generation": null, "state": "STARTING", "pending": false})
        );
        let drain = DrainResponse {
            revision: Some(12),
            pending: false,
            propagated: Some(Propagated {
                acked: 3,
                total: 4,
                complete: false,
            }),
        };
        assert_eq!(
            serde_json::to_value(&drain).unwrap(),
            json!({"revision": 12, "pending": false, "propagated": {"acked": 3, "total": 4, "complete": false}})
        );
        let endpoints = EndpointsResponse {
            service: Label::new("checkout").unwrap(),
            namespace: Label::new("default").unwrap(),
            port_name: Label::new("default").unwrap(),
            shard: 0,
            revision: 7,
            age_ms: 120,
            stale: false,
            mode: "serve".into(),
            degraded: false,
            degraded_reason: None,
            region: Label::new("r1").unwrap(),
            endpoints: Vec::new(),
            failover: None,
            index: "00000000000000ff".into(),
        };
        assert_eq!(
            keys(serde_json::to_value(&endpoints).unwrap()),
            [
                "age_ms",
                "degraded",
                "degraded_reason",
                "endpoints",
                "index",
                "mode",
                "namespace",
                "port_name",
                "region",
                "revision",
                "service",
                "shard",
                "stale"
            ]
        );
        let status = StatusResponse {
            node: NodeId::new("node-1").unwrap(),
            zone: Label::new("z1").unwrap(),
            agent_epoch: 5,
            arbiter: ArbiterStatus {
                connected: true,
                address: Some("10.0.0.9:7443".into()),
                last_contact_ms: Some(40),
                catalog: Some("0123456789abcdef".into()),
            },
            lease: Some(LeaseStatus {
                id: 2,
                ttl_ms: 10_000,
            }),
            subscriptions: vec![SubscriptionStatus {
                service: ServiceKey::new("shop", "cart", "http").unwrap(),
                revision: 7,
                lag: 0,
                stale: false,
                age_ms: 0,
            }],
            pending_writes: 0,
            gossip: Some(GossipStatus {
                alive: vec![NodeId::new("node-2").unwrap()],
                down: vec![NodeId::new("node-3").unwrap()],
            }),
            tls: None,
        };
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(
            value["gossip"],
            json!({"alive": ["node-2"], "down": ["node-3"]})
        );
        assert_eq!(
            keys(value.clone()),
            [
                "agent_epoch",
                "arbiter",
                "gossip",
                "lease",
                "node",
                "pending_writes",
                "subscriptions",
                "tls",
                "zone"
            ]
        );
        assert_eq!(
            value["subscriptions"][0],
            json!({"service": "shop/cart/http", "revision": 7, "lag": 0, "stale": false, "age_ms": 0})
        );
        assert_eq!(value["lease"], json!({"id": 2, "ttl_ms": 10_000}));
        assert_eq!(
            value["arbiter"],
            json!({"connected": true, "address": "10.0.0.9:7443", "last_contact_ms": 40, "catalog": "0123456789abcdef"})
        );
        let back: StatusResponse = serde_json::from_value(value).unwrap();
        assert_eq!(back, status);
    }
}
