//! The body of `PUT /v1/agent/instances` and its validation into a
//! [`ValidRegistration`], the form the agent keeps and persists. The checks
//! of a registration are validated in `checks`; their tests are here, since
//! a check is only ever validated as part of a registration body.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rollcall_config::{CheckTiming, ChecksConfig};
use rollcall_leases::{InstanceId, Label, LabelValue, ServiceKey, Version, Weight};
use serde::{Deserialize, Serialize};

use super::checks::{CheckRequest, ChecksRequest, ValidChecks};
use super::error::{name_error, ApiError};

/// The namespace and port name a registration gets when it omits them.
pub const DEFAULT_NAME: &str = "default";

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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use serde_json::{json, Value};

    use super::*;
    use crate::api_types::{parse_json, Check, CheckKind};

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
}
