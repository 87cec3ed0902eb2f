//! Service policy (R9): per service, whether and how its traffic may leave
//! its region, where to, how much, where never, who owns its writes, and
//! how stale its endpoint set may get (R7). `rollcall policy apply FILE`
//! reads a policy file (one `[[policy]]` table per service); the arbiter of
//! the policy's home region commits it.
//!
//! This module only describes and validates policies; it must not decide
//! routing (the agent's data plane does) or know which region it runs in
//! (the arbiter checks the home region).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::file::ConfigFile;
use crate::{rules, ConfigError, StaleBehaviour};

/// Most regions one list or map of a policy may name. Three regions today;
/// the bound keeps every encoded policy small (R10: decoders have limits).
pub const MAX_POLICY_REGIONS: usize = 16;

/// Most `[[policy]]` tables in one file (about 2,000 services, with room).
pub const MAX_POLICIES_PER_FILE: usize = 4_096;

/// The capacity share a region in `failover_order` may take when
/// `capacity_limits` does not name it: half of the target's READY capacity,
/// the headroom a region sized to survive the loss of another normally has.
pub const DEFAULT_CAPACITY_LIMIT: f64 = 0.5;

/// A policy file: `[[policy]]` tables, one per service.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyFile {
    /// `[[policy]]`: the policies, each for a different service.
    pub policy: Vec<ServicePolicy>,
}

/// Which traffic may fail over to another region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrafficClass {
    /// Only read-only (stateless read) traffic moves; writes get "no
    /// backend" when the home set is gone.
    #[default]
    ReadOnly,
    /// Every connection may move (still subject to `single_writer`).
    All,
}

impl TrafficClass {
    /// The name used in files and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficClass::ReadOnly => "read_only",
            TrafficClass::All => "all",
        }
    }
}

/// `[policy.single_writer]`: the service's writes are owned by one region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SingleWriter {
    /// The region that owns the writes; a DNS label outside `data_boundary`.
    pub owner: String,
    /// An ownership transfer the owner declared: writes may move to this
    /// region (and only to it). Unset: writes never leave `owner`.
    #[serde(default)]
    pub transfer_to: Option<String>,
}

/// `[[policy]]`: one service's policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePolicy {
    /// The service, `namespace/service` (the policy covers all its ports).
    /// Required.
    pub service: String,
    /// The region whose arbiter holds this policy; only that arbiter
    /// accepts changes to it, so two regions never hold conflicting
    /// versions. Required.
    pub home_region: String,
    /// Whether the service's traffic may be routed to another region at
    /// all. Default false: callers get "no backend" rather than a silent
    /// jump to another region (R7).
    #[serde(default)]
    pub cross_region: bool,
    /// Which traffic may move when `cross_region` is true. Default
    /// `read_only`.
    #[serde(default)]
    pub failover_traffic: TrafficClass,
    /// Regions to fail over to, first choice first; never the home region,
    /// never a region in `data_boundary`. Default none.
    #[serde(default)]
    pub failover_order: Vec<String>,
    /// Regions the service's traffic may never reach (data residency).
    /// Default none.
    #[serde(default)]
    pub data_boundary: Vec<String>,
    /// Most time a caller's copy of the service's endpoints may go
    /// unconfirmed by the arbiter, in ms. Unset: the agent's
    /// `[staleness]` setting for the service.
    #[serde(default)]
    pub max_snapshot_age_ms: Option<u64>,
    /// What happens past `max_snapshot_age_ms`: `keep`, `degrade` or
    /// `refuse` (as the agent's `[staleness]`). Unset: the agent's.
    #[serde(default)]
    pub stale_behaviour: Option<StaleBehaviour>,
    /// `[policy.capacity_limits]`: per region of `failover_order`, the most
    /// this service may send there, as a share (0.0 to 1.0) of the target's
    /// READY capacity. Regions not named get [`DEFAULT_CAPACITY_LIMIT`].
    #[serde(default)]
    pub capacity_limits: BTreeMap<String, f64>,
    /// `[policy.single_writer]`: the region that owns the service's writes
    /// and any declared ownership transfer. Unset: no single writer.
    #[serde(default)]
    pub single_writer: Option<SingleWriter>,
}

impl ServicePolicy {
    /// A policy for `service` homed in `home_region` with every other key
    /// at its default (no cross-region traffic at all).
    pub fn new(service: impl Into<String>, home_region: impl Into<String>) -> Self {
        ServicePolicy {
            service: service.into(),
            home_region: home_region.into(),
            cross_region: false,
            failover_traffic: TrafficClass::ReadOnly,
            failover_order: Vec::new(),
            data_boundary: Vec::new(),
            max_snapshot_age_ms: None,
            stale_behaviour: None,
            capacity_limits: BTreeMap::new(),
            single_writer: None,
        }
    }

    /// `(namespace, service)` of `service`, once validated.
    pub fn service_parts(&self) -> Option<(&str, &str)> {
        self.service.split_once('/')
    }

    /// The capacity share `region` may take as a failover target:
    /// `capacity_limits[region]`, else [`DEFAULT_CAPACITY_LIMIT`].
    pub fn capacity_limit(&self, region: &str) -> f64 {
        self.capacity_limits
            .get(region)
            .copied()
            .unwrap_or(DEFAULT_CAPACITY_LIMIT)
    }

    /// Checks every rule; the first broken one is returned, its field path
    /// starting with `prefix` (e.g. `policy[0]`).
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        let f = |name: &str| format!("{prefix}.{name}");
        let quoted = |v: &str| format!("{v:?}");
        match self.service.split('/').collect::<Vec<_>>()[..] {
            [ns, svc] if rules::dns_label("", ns).is_ok() && rules::dns_label("", svc).is_ok() => {}
            _ => {
                return Err(ConfigError::invalid(
                    f("service"),
                    quoted(&self.service),
                    "must be namespace/service, each a DNS-safe label (e.g. shop/checkout); a policy covers every port of the service",
                ))
            }
        }
        rules::dns_label(&f("home_region"), &self.home_region)?;
        let home = self.home_region.as_str();
        region_list(&f("data_boundary"), &self.data_boundary, home)?;
        let bounded = |r: &str| self.data_boundary.iter().any(|b| b == r);
        region_list(&f("failover_order"), &self.failover_order, home)?;
        if let Some((i, r)) = self
            .failover_order
            .iter()
            .enumerate()
            .find(|(_, r)| bounded(r))
        {
            return Err(ConfigError::invalid(
                format!("{prefix}.failover_order[{i}]"),
                quoted(r),
                "is in data_boundary: the service's traffic may never reach it",
            ));
        }
        if self.capacity_limits.len() > MAX_POLICY_REGIONS {
            return Err(ConfigError::invalid(
                f("capacity_limits"),
                format!("{} entries", self.capacity_limits.len()),
                format!("is too long: at most {MAX_POLICY_REGIONS} regions"),
            ));
        }
        for (region, share) in &self.capacity_limits {
            let field = format!("{prefix}.capacity_limits.{region}");
            rules::dns_label(&field, region)?;
            if !self.failover_order.contains(region) {
                return Err(ConfigError::invalid(
                    field,
                    share,
                    format!("names region {region:?}, which is not in failover_order (a limit only applies to a failover target)"),
                ));
            }
            if !share.is_finite() || !(0.0..=1.0).contains(share) {
                return Err(ConfigError::invalid(
                    field,
                    share,
                    "must be between 0.0 and 1.0 (a share of the target region's READY capacity)",
                ));
            }
        }
        if let Some(writer) = &self.single_writer {
            let owner = f("single_writer.owner");
            rules::dns_label(&owner, &writer.owner)?;
            if bounded(&writer.owner) {
                return Err(ConfigError::invalid(
                    owner,
                    quoted(&writer.owner),
                    "is in data_boundary: the region that owns the writes must be reachable",
                ));
            }
            if let Some(to) = &writer.transfer_to {
                let field = f("single_writer.transfer_to");
                rules::dns_label(&field, to)?;
                if *to == writer.owner {
                    return Err(ConfigError::invalid(
                        field,
                        quoted(to),
                        "is the owner itself: name the region the ownership moves to, or leave it unset",
                    ));
                }
                if bounded(to) {
                    return Err(ConfigError::invalid(
                        field,
                        quoted(to),
                        "is in data_boundary: the service's traffic may never reach it",
                    ));
                }
            }
        }
        if let Some(age) = self.max_snapshot_age_ms {
            rules::at_least(&f("max_snapshot_age_ms"), age, 1)?;
        }
        Ok(())
    }
}

/// A list of regions: each a DNS label other than `home`, none twice, at
/// most [`MAX_POLICY_REGIONS`].
fn region_list(field: &str, regions: &[String], home: &str) -> Result<(), ConfigError> {
    if regions.len() > MAX_POLICY_REGIONS {
        return Err(ConfigError::invalid(
            field,
            format!("{} entries", regions.len()),
            format!("is too long: at most {MAX_POLICY_REGIONS} regions"),
        ));
    }
    for (i, region) in regions.iter().enumerate() {
        let at = format!("{field}[{i}]");
        rules::dns_label(&at, region)?;
        if region == home {
            return Err(ConfigError::invalid(
                at,
                format!("{region:?}"),
                "is the home region: list other regions only",
            ));
        }
        if regions[..i].contains(region) {
            return Err(ConfigError::invalid(
                at,
                format!("{region:?}"),
                "is listed twice",
            ));
        }
    }
    Ok(())
}

impl PolicyFile {
    /// The file as TOML, in the format `rollcall policy apply` reads.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a policy file always serializes to TOML")
    }
}

impl ConfigFile for PolicyFile {
    /// Checks every policy (field paths `policy[i].…`) and that no service
    /// appears twice.
    fn validate(&self) -> Result<(), ConfigError> {
        if self.policy.is_empty() {
            return Err(ConfigError::invalid(
                "policy",
                "[]",
                "is empty: write one [[policy]] table per service",
            ));
        }
        if self.policy.len() > MAX_POLICIES_PER_FILE {
            return Err(ConfigError::invalid(
                "policy",
                format!("{} tables", self.policy.len()),
                format!("is too long: at most {MAX_POLICIES_PER_FILE}; split the file"),
            ));
        }
        for (i, policy) in self.policy.iter().enumerate() {
            policy.validate(&format!("policy[{i}]"))?;
            if let Some(first) = self.policy[..i]
                .iter()
                .position(|p| p.service == policy.service)
            {
                return Err(ConfigError::invalid(
                    format!("policy[{i}].service"),
                    format!("{:?}", policy.service),
                    format!("is listed twice (also policy[{first}])"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
[[policy]]
service = "shop/checkout"
home_region = "r1"
cross_region = true
failover_traffic = "all"
failover_order = ["r2", "r3"]
data_boundary = ["r4"]
max_snapshot_age_ms = 60000
stale_behaviour = "refuse"

[policy.capacity_limits]
r2 = 0.3

[policy.single_writer]
owner = "r1"
transfer_to = "r2"

[[policy]]
service = "shop/catalog"
home_region = "r2"
"#;

    /// The error of `text`, which must fail validation.
    fn error(text: &str) -> String {
        PolicyFile::from_toml_str(text).unwrap_err().to_string()
    }

    /// `FULL`'s first policy with `key = value` replaced or added.
    fn with(key: &str, value: &str) -> String {
        let mut lines: Vec<String> = FULL.lines().map(str::to_owned).collect();
        if let Some(old) = lines
            .iter()
            .position(|l| l.starts_with(&format!("{key} = ")))
        {
            lines.remove(old);
        }
        let at = lines
            .iter()
            .position(|l| l == "[[policy]]")
            .expect("FULL has a policy");
        lines.insert(at + 1, format!("{key} = {value}"));
        lines.join("\n")
    }

    #[test]
    fn a_full_file_parses_with_every_key() {
        let file = PolicyFile::from_toml_str(FULL).expect("valid");
        let p = &file.policy[0];
        assert_eq!(p.service_parts(), Some(("shop", "checkout")));
        assert!(p.cross_region);
        assert_eq!(p.failover_traffic, TrafficClass::All);
        assert_eq!(p.failover_order, ["r2", "r3"]);
        assert_eq!(p.capacity_limit("r2"), 0.3);
        assert_eq!(p.capacity_limit("r3"), DEFAULT_CAPACITY_LIMIT);
        assert_eq!(p.stale_behaviour, Some(StaleBehaviour::Refuse));
        assert_eq!(
            p.single_writer
                .as_ref()
                .and_then(|w| w.transfer_to.as_deref()),
            Some("r2")
        );
        assert_eq!(
            file.policy[1],
            ServicePolicy::new("shop/catalog", "r2"),
            "omitted keys take their defaults"
        );
    }

    #[test]
    fn the_example_file_is_valid_and_matches_the_tests() {
        let example = PolicyFile::from_toml_str(include_str!("../examples/policy.toml"))
            .expect("the example must load");
        // The tests' file also sets the superseded `transfer_to` (still
        // read and checked); the example does not, so `policy apply`
        // takes it.
        let mut full = PolicyFile::from_toml_str(FULL).unwrap();
        if let Some(w) = full.policy[0].single_writer.as_mut() {
            w.transfer_to = None;
        }
        assert_eq!(example, full);
    }

    #[test]
    fn to_toml_round_trips() {
        let file = PolicyFile::from_toml_str(FULL).expect("valid");
        assert_eq!(PolicyFile::from_toml_str(&file.to_toml()).unwrap(), file);
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (with("failover_order", r#"["r2", "r4"]"#), "policy[0].failover_order[1] = \"r4\" is in data_boundary"),
            (with("failover_order", r#"["r2", "r2"]"#), "policy[0].failover_order[1] = \"r2\" is listed twice"),
            (with("failover_order", r#"["r1"]"#), "policy[0].failover_order[0] = \"r1\" is the home region"),
            (with("failover_order", r#"["R2"]"#), "policy[0].failover_order[0] = \"R2\" must be a DNS-safe label"),
            (with("data_boundary", r#"["r1"]"#), "policy[0].data_boundary[0] = \"r1\" is the home region"),
            (with("service", r#""shop/checkout/http""#), "policy[0].service = \"shop/checkout/http\" must be namespace/service"),
            (with("home_region", r#""""#), "policy[0].home_region = \"\" must be a DNS-safe label"),
            (with("max_snapshot_age_ms", "0"), "policy[0].max_snapshot_age_ms = 0 must be at least 1"),
            (FULL.replace("r2 = 0.3", "r2 = 1.5"), "policy[0].capacity_limits.r2 = 1.5 must be between 0.0 and 1.0"),
            (FULL.replace("r2 = 0.3", "r9 = 0.3"), "policy[0].capacity_limits.r9 = 0.3 names region \"r9\", which is not in failover_order"),
            (FULL.replace("owner = \"r1\"", "owner = \"r4\""), "policy[0].single_writer.owner = \"r4\" is in data_boundary"),
            (FULL.replace("transfer_to = \"r2\"", "transfer_to = \"r1\""), "policy[0].single_writer.transfer_to = \"r1\" is the owner itself"),
            (FULL.replace("transfer_to = \"r2\"", "transfer_to = \"r4\""), "policy[0].single_writer.transfer_to = \"r4\" is in data_boundary"),
            (FULL.replace("shop/catalog", "shop/checkout"), "policy[1].service = \"shop/checkout\" is listed twice (also policy[0])"),
            (String::new(), "policy = [] is empty"),
        ];
        for (text, expected) in cases {
            let message = error(&text);
            assert!(
                message.starts_with(expected),
                "{message}\n  expected: {expected}"
            );
        }
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_parse_errors() {
        let typo = error(&with("failover_ordr", r#"["r2"]"#));
        assert!(
            typo.starts_with("<string>: ") && typo.contains("failover_ordr"),
            "{typo}"
        );
        let traffic = error(&with("failover_traffic", r#""writes""#));
        assert!(traffic.contains("writes"), "{traffic}");
        let missing = error("[[policy]]\nservice = \"shop/cart\"\n");
        assert!(missing.contains("home_region"), "{missing}");
    }

    #[test]
    fn lists_are_bounded() {
        let regions: Vec<String> = (0..=MAX_POLICY_REGIONS)
            .map(|i| format!("\"x{i}\""))
            .collect();
        let message = error(&with("data_boundary", &format!("[{}]", regions.join(", "))));
        assert!(
            message.starts_with("policy[0].data_boundary = 17 entries is too long"),
            "{message}"
        );
    }
}
