//! Service policies as the catalog holds them (R9): a validated
//! `rollcall_config::ServicePolicy` keyed by `namespace/service`, and the
//! revision, time and actor of the command that set it.
//!
//! A `Policy` can only hold a document that passed every rule of
//! `ServicePolicy::validate`, including when it is decoded from the log, a
//! snapshot or the wire. This module decides nothing: `Catalog::apply`
//! checks the home region, the agents (later) route by it.
//!
//! A policy travels to other regions as a `RemotePolicy`: the document
//! with its home arbiter's revision and time, which the region bridges
//! carry as-is. Another region's catalog holds it as a `ReplicatedPolicy`,
//! apart from its own home policies, so no local change can override it.

use std::fmt;

use rollcall_config::{ConfigError, ServicePolicy};
use serde::{Deserialize, Serialize};

use crate::endpoint::Principal;
use crate::ids::Revision;
use crate::name::{Label, NameError};

/// What a policy is keyed by: a service across all its ports,
/// `namespace/service`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PolicyKey {
    /// The namespace.
    pub namespace: Label,
    /// The logical service.
    pub service: Label,
}

impl PolicyKey {
    /// Builds a key from its two parts, validating each.
    pub fn new(namespace: &str, service: &str) -> Result<Self, NameError> {
        let part = |kind: &'static str, v: &str| Label::new(v).map_err(|e| NameError { kind, ..e });
        Ok(PolicyKey {
            namespace: part("namespace", namespace)?,
            service: part("service name", service)?,
        })
    }
}

impl fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.service)
    }
}

impl fmt::Debug for PolicyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl std::str::FromStr for PolicyKey {
    type Err = NameError;
    /// Parses `namespace/service`.
    fn from_str(s: &str) -> Result<Self, NameError> {
        match s.split_once('/') {
            Some((ns, svc)) if !svc.contains('/') => PolicyKey::new(ns, svc),
            _ => Err(NameError {
                kind: "policy key",
                value: s.chars().take(80).collect(),
                rule: "write it as namespace/service",
            }),
        }
    }
}

/// One service's policy, validated.
///
/// Serialized as its `ServicePolicy` document and validated again on the
/// way in, so nothing decoded can hold a policy that breaks a rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ServicePolicy", into = "ServicePolicy")]
pub struct Policy {
    key: PolicyKey,
    home_region: Label,
    document: ServicePolicy,
}

// Capacity shares are validated finite (0.0 to 1.0), so equality is total.
impl Eq for Policy {}

impl Policy {
    /// Validates `document` (errors name `policy.<field>`).
    pub fn new(document: ServicePolicy) -> Result<Policy, ConfigError> {
        document.validate("policy")?;
        let invalid = |field: &str, value: &str, e: NameError| ConfigError::Invalid {
            field: format!("policy.{field}"),
            value: format!("{value:?}"),
            reason: e.rule.to_owned(),
        };
        let key = document
            .service
            .parse::<PolicyKey>()
            .map_err(|e| invalid("service", &document.service, e))?;
        let home_region = Label::new(&document.home_region)
            .map_err(|e| invalid("home_region", &document.home_region, e))?;
        Ok(Policy {
            key,
            home_region,
            document,
        })
    }

    /// The service it covers.
    pub fn key(&self) -> &PolicyKey {
        &self.key
    }

    /// The region whose arbiter alone accepts changes to it.
    pub fn home_region(&self) -> &Label {
        &self.home_region
    }

    /// The document as the operator wrote it (validated).
    pub fn document(&self) -> &ServicePolicy {
        &self.document
    }

    /// One line for the audit log: what the policy allows.
    pub fn summary(&self) -> String {
        let d = &self.document;
        let mut parts = vec![format!("home {}", d.home_region)];
        if d.cross_region {
            parts.push(format!(
                "cross-region {} traffic",
                d.failover_traffic.as_str()
            ));
        } else {
            parts.push("no cross-region traffic".into());
        }
        if !d.failover_order.is_empty() {
            let order: Vec<String> = d
                .failover_order
                .iter()
                .map(|r| format!("{r} (≤{})", d.capacity_limit(r)))
                .collect();
            parts.push(format!("failover {}", order.join(" > ")));
        }
        if !d.data_boundary.is_empty() {
            parts.push(format!("never {}", d.data_boundary.join(", ")));
        }
        if let Some(w) = &d.single_writer {
            parts.push(match &w.transfer_to {
                Some(to) => format!("single writer {} transferring to {to}", w.owner),
                None => format!("single writer {}", w.owner),
            });
        }
        if let Some(age) = d.max_snapshot_age_ms {
            parts.push(format!("max age {age} ms"));
        }
        if let Some(b) = d.stale_behaviour {
            parts.push(format!("stale {b:?}").to_lowercase());
        }
        parts.join(", ")
    }
}

impl TryFrom<ServicePolicy> for Policy {
    type Error = ConfigError;
    fn try_from(document: ServicePolicy) -> Result<Self, ConfigError> {
        Policy::new(document)
    }
}

impl From<Policy> for ServicePolicy {
    fn from(policy: Policy) -> Self {
        policy.document
    }
}

/// A policy in the catalog: the document and the change that set it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPolicy {
    /// The policy.
    pub policy: Policy,
    /// The revision that committed it.
    pub revision: Revision,
    /// When that change was proposed, ms since the Unix epoch.
    pub set_at_ms: u64,
    /// Who proposed it.
    pub set_by: Principal,
}

/// A policy as its home region's arbiter committed it, as the region
/// bridges carry it to the other regions (R9): the document and the home
/// arbiter's revision and time, never renumbered on the way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemotePolicy {
    /// The policy (its home region is where it came from).
    pub policy: Policy,
    /// The revision that committed it in its home region: what orders
    /// versions of it everywhere.
    pub home_revision: Revision,
    /// When the home arbiter committed it, ms since the Unix epoch.
    pub home_set_at_ms: u64,
}

impl RemotePolicy {
    /// The version a home region's stored policy travels as.
    pub fn of(stored: &StoredPolicy) -> RemotePolicy {
        RemotePolicy {
            policy: stored.policy.clone(),
            home_revision: stored.revision,
            home_set_at_ms: stored.set_at_ms,
        }
    }
}

/// Another region's policy in this region's catalog: as its home committed
/// it, and the local change that stored it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicatedPolicy {
    /// The policy with its home revision.
    pub remote: RemotePolicy,
    /// The local revision that stored this version.
    pub revision: Revision,
    /// When that local change was proposed, ms since the Unix epoch.
    pub set_at_ms: u64,
    /// Who proposed it (the bridge, with the operator token).
    pub set_by: Principal,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollcall_config::TrafficClass;

    #[test]
    fn keys_parse_and_print_namespace_slash_service() {
        let key: PolicyKey = "shop/checkout".parse().unwrap();
        assert_eq!(key.to_string(), "shop/checkout");
        for bad in ["checkout", "shop/checkout/http", "Shop/checkout", "/x"] {
            assert!(bad.parse::<PolicyKey>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn decoding_validates_the_document() {
        let mut doc = ServicePolicy::new("shop/checkout", "r1");
        doc.cross_region = true;
        doc.failover_traffic = TrafficClass::All;
        doc.failover_order = vec!["r2".into()];
        let policy = Policy::new(doc.clone()).unwrap();
        assert_eq!(policy.key().to_string(), "shop/checkout");
        let bytes = postcard::to_allocvec(&policy).unwrap();
        assert_eq!(postcard::from_bytes::<Policy>(&bytes).unwrap(), policy);

        doc.data_boundary = vec!["r2".into()];
        let bad = postcard::to_allocvec(&doc).unwrap();
        let err = postcard::from_bytes::<Policy>(&bad).unwrap_err();
        assert!(matches!(err, postcard::Error::SerdeDeCustom), "{err:?}");
        assert!(Policy::new(doc)
            .unwrap_err()
            .to_string()
            .starts_with("policy.failover_order[0] = \"r2\" is in data_boundary"));
    }

    #[test]
    fn the_summary_says_what_may_move_where() {
        let mut doc = ServicePolicy::new("shop/checkout", "r1");
        assert_eq!(
            Policy::new(doc.clone()).unwrap().summary(),
            "home r1, no cross-region traffic"
        );
        doc.cross_region = true;
        doc.failover_order = vec!["r2".into(), "r3".into()];
        doc.capacity_limits.insert("r2".into(), 0.25);
        doc.single_writer = Some(rollcall_config::SingleWriter {
            owner: "r1".into(),
            transfer_to: None,
        });
        assert_eq!(
            Policy::new(doc).unwrap().summary(),
            "home r1, cross-region read_only traffic, failover r2 (≤0.25) > r3 (≤0.5), single writer r1"
        );
    }
}
