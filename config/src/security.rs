//! Security settings shared by the agent and arbiter files (R10): where the
//! mTLS material lives, and which services an identity may write or watch,
//! written as service patterns. This module only describes and validates;
//! it must not read certificate files (the processes do, at start).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{rules, ConfigError};

/// `[tls]`: the PEM files of this process's mTLS identity, as written by
/// `rollcall certs`. Relative paths are relative to the working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsPaths {
    /// The region CA's certificate (`ca.crt`): the only root trusted for
    /// peers.
    pub ca: PathBuf,
    /// This process's certificate, whose URI SAN names region, role and name.
    pub cert: PathBuf,
    /// Its private key (keep it mode 0600).
    pub key: PathBuf,
    /// How often the three files are read to see whether they changed, in
    /// ms; changed files are reloaded without a restart (new handshakes use
    /// them, established sessions keep theirs), and SIGHUP reloads at once.
    /// `0`: only SIGHUP. Default 5000; otherwise 100 to 3,600,000.
    #[serde(default = "default_check_interval_ms")]
    pub check_interval_ms: u64,
}

/// The starts of the commented `[tls]` lines of every example file, for
/// the examples' tests that uncomment them.
#[cfg(test)]
pub(crate) const TLS_EXAMPLE_LINES: [&str; 5] = [
    "[tls]",
    "ca = ",
    "cert = ",
    "key = ",
    "check_interval_ms = ",
];

/// `[tls] check_interval_ms` when the file leaves it out.
pub const DEFAULT_TLS_CHECK_INTERVAL_MS: u64 = 5_000;

fn default_check_interval_ms() -> u64 {
    DEFAULT_TLS_CHECK_INTERVAL_MS
}

impl TlsPaths {
    /// The three files, checked every `DEFAULT_TLS_CHECK_INTERVAL_MS`.
    pub fn new(ca: PathBuf, cert: PathBuf, key: PathBuf) -> TlsPaths {
        TlsPaths {
            ca,
            cert,
            key,
            check_interval_ms: DEFAULT_TLS_CHECK_INTERVAL_MS,
        }
    }

    pub(crate) fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        rules::non_empty_file(&format!("{prefix}.ca"), &self.ca)?;
        rules::non_empty_file(&format!("{prefix}.cert"), &self.cert)?;
        rules::non_empty_file(&format!("{prefix}.key"), &self.key)?;
        if self.check_interval_ms != 0 {
            rules::between(
                &format!("{prefix}.check_interval_ms"),
                self.check_interval_ms,
                100,
                3_600_000,
            )?;
        }
        Ok(())
    }
}

/// A set of services: `namespace/service/port_name`, where the last part
/// written may be `*` (`shop/*` is every service of namespace `shop`,
/// `shop/cart/*` every port of `shop/cart`, `*` everything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ServicePattern {
    parts: Vec<String>,
}

impl ServicePattern {
    /// Whether the service `namespace/service/port_name` is in the set.
    pub fn matches(&self, namespace: &str, service: &str, port_name: &str) -> bool {
        let key = [namespace, service, port_name];
        for (i, part) in self.parts.iter().enumerate() {
            if part == "*" {
                return true;
            }
            if key[i] != part {
                return false;
            }
        }
        true
    }
}

impl TryFrom<String> for ServicePattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let parts: Vec<String> = text.split('/').map(str::to_owned).collect();
        let wildcard_last = parts.last().is_some_and(|p| p == "*");
        let complete = parts.len() == 3 && !parts.iter().any(|p| p == "*");
        let label_ok = |p: &String| rules::dns_label("pattern", p).is_ok();
        let prefix = &parts[..parts.len() - usize::from(wildcard_last)];
        if parts.len() <= 3 && prefix.iter().all(label_ok) && (complete || wildcard_last) {
            Ok(ServicePattern { parts })
        } else {
            Err(format!(
                "service pattern {text:?} is invalid: write namespace/service/port_name, where the last part written may be * (e.g. shop/cart/http, shop/cart/*, shop/*, *)"
            ))
        }
    }
}

impl From<ServicePattern> for String {
    fn from(p: ServicePattern) -> String {
        p.to_string()
    }
}

impl fmt::Display for ServicePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.parts.join("/"))
    }
}

/// `[[controllers]]`: an orchestrator identity (certificate role
/// `controller`) and the services it may register instances of, on any node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerGrant {
    /// The controller's name in its certificate.
    pub name: String,
    /// Services it may write.
    pub services: Vec<ServicePattern>,
}

/// `[[watch_rules]]`: restricts which services some nodes' agents may
/// watch. Nodes named by no rule may watch every service (the default).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchRule {
    /// The nodes the rule applies to.
    pub nodes: Vec<String>,
    /// The services they may watch.
    pub services: Vec<ServicePattern>,
}

/// `[[registration_rules]]`: which services the agents of some nodes may
/// register, and whether those registrations may name an address the node
/// did not declare (R10). A rule applies to a node its `nodes` name (a
/// name, or a prefix ending in `*`) or whose lease is in one of its
/// `zones`. A node no rule applies to may register every service; a node
/// some rules apply to may register only the services those rules list.
/// Controllers are not bound by these rules (their `[[controllers]]` grant
/// is what they may write).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrationRule {
    /// Node names, or name prefixes ending in `*` (`edge-*`). Default none.
    #[serde(default)]
    pub nodes: Vec<NodePattern>,
    /// Zones whose nodes the rule applies to. Default none.
    #[serde(default)]
    pub zones: Vec<String>,
    /// The services those nodes may register.
    pub services: Vec<ServicePattern>,
    /// Registrations of these services (from these nodes) may name any
    /// address, not only one the node declared. Default false.
    #[serde(default)]
    pub any_address: bool,
}

impl RegistrationRule {
    /// Whether the rule applies to `node`, whose lease is in `zone`.
    pub fn applies_to(&self, node: &str, zone: Option<&str>) -> bool {
        self.nodes.iter().any(|p| p.matches(node))
            || zone.is_some_and(|z| self.zones.iter().any(|r| r == z))
    }

    /// Whether the rule lists the service `namespace/service/port_name`.
    pub fn lists(&self, namespace: &str, service: &str, port_name: &str) -> bool {
        self.services
            .iter()
            .any(|p| p.matches(namespace, service, port_name))
    }
}

/// A node name, or a prefix of node names ending in `*` (`edge-*`; `*`
/// alone is every node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodePattern {
    text: String,
}

impl NodePattern {
    /// Whether `node` is named by the pattern.
    pub fn matches(&self, node: &str) -> bool {
        match self.text.strip_suffix('*') {
            Some(prefix) => node.starts_with(prefix),
            None => node == self.text,
        }
    }
}

impl TryFrom<String> for NodePattern {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        let allowed =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
        let (name, wildcard) = match text.strip_suffix('*') {
            Some(prefix) => (prefix, true),
            None => (text.as_str(), false),
        };
        let ok = name.len() <= 253
            && name.chars().all(allowed)
            && !name.starts_with(['-', '.'])
            && (wildcard || !(name.is_empty() || name.ends_with(['-', '.'])));
        if ok {
            Ok(NodePattern { text })
        } else {
            Err(format!(
                "node pattern {text:?} is invalid: write a node name (a-z, 0-9, '-', '.') or a prefix ending in * (e.g. edge-1, edge-*, *)"
            ))
        }
    }
}

impl From<NodePattern> for String {
    fn from(p: NodePattern) -> String {
        p.text
    }
}

impl fmt::Display for NodePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `[registration]`: what an agent's registration must satisfy beyond its
/// node (R10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistrationConfig {
    /// `"declared"` (default): an agent may register only an address its
    /// node declared (its certificate's IP SANs, or the addresses its Hello
    /// states when the certificate has none), unless a rule that lists the
    /// service sets `any_address`. `"any"`: any address (`rollcall dev`
    /// writes this).
    pub addresses: AddressRule,
    /// `"declared"` (default): a node no `[[node_zones]]` entry names is in
    /// the zone its agent's Hello declares. `"bound"`: such a node's Hello
    /// is refused; every node's zone comes from `[[node_zones]]` (least
    /// privilege: a node cannot claim another zone's registration rules or
    /// witness role). A node an entry names is always in that entry's zone.
    pub zones: ZoneRule,
}

impl Default for RegistrationConfig {
    fn default() -> Self {
        Self {
            addresses: AddressRule::Declared,
            zones: ZoneRule::Declared,
        }
    }
}

/// `registration.zones`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZoneRule {
    /// Nodes no `[[node_zones]]` entry names are where they say.
    Declared,
    /// Every node must be named by a `[[node_zones]]` entry.
    Bound,
}

/// `[[node_zones]]`: the zone of some nodes, bound by the arbiter rather
/// than declared by their agents, and the most weight their registrations
/// may ask for. The first entry that names a node applies to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeZone {
    /// Node names, or name prefixes ending in `*` (`edge-*`).
    pub nodes: Vec<NodePattern>,
    /// Their zone: a Hello declaring another is refused.
    pub zone: String,
    /// The most weight one of their registrations may ask for (1 to
    /// 10,000). Default: no cap below the catalog's own 10,000.
    #[serde(default)]
    pub max_weight: Option<u32>,
}

/// Checks `[[node_zones]]`; errors name `prefix.node_zones[i]…`.
pub(crate) fn validate_node_zones(
    prefix: &str,
    node_zones: &[NodeZone],
) -> Result<(), ConfigError> {
    for (i, z) in node_zones.iter().enumerate() {
        let field = format!("{prefix}.node_zones[{i}]");
        if z.nodes.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.nodes"),
                "[]",
                "must name the nodes the zone binds: nodes = [\"edge-*\"]",
            ));
        }
        rules::dns_label(&format!("{field}.zone"), &z.zone)?;
        if let Some(max) = z.max_weight {
            rules::between(&format!("{field}.max_weight"), u64::from(max), 1, 10_000)?;
        }
    }
    Ok(())
}

/// `registration.addresses`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressRule {
    /// Only the node's declared addresses.
    Declared,
    /// Any address.
    Any,
}

/// Checks registration rules; errors name `prefix.registration_rules[i]…`.
pub(crate) fn validate_registration_rules(
    prefix: &str,
    registration_rules: &[RegistrationRule],
) -> Result<(), ConfigError> {
    for (i, r) in registration_rules.iter().enumerate() {
        let field = format!("{prefix}.registration_rules[{i}]");
        if r.nodes.is_empty() && r.zones.is_empty() {
            return Err(ConfigError::invalid(
                field,
                "no nodes and no zones",
                "must name the nodes (or zones) it applies to: nodes = [\"edge-*\"] or zones = [\"z1\"]",
            ));
        }
        for (j, zone) in r.zones.iter().enumerate() {
            rules::dns_label(&format!("{field}.zones[{j}]"), zone)?;
        }
        if r.services.is_empty() {
            return Err(ConfigError::invalid(
                format!("{field}.services"),
                "[]",
                "must list at least one service pattern; a node that may register nothing needs no agent",
            ));
        }
    }
    Ok(())
}

/// Checks controller grants and watch rules; errors name `prefix.field[i]`.
pub(crate) fn validate_grants(
    prefix: &str,
    controllers: &[ControllerGrant],
    watch_rules: &[WatchRule],
) -> Result<(), ConfigError> {
    for (i, c) in controllers.iter().enumerate() {
        rules::node_name(&format!("{prefix}.controllers[{i}].name"), &c.name)?;
        if controllers[..i].iter().any(|o| o.name == c.name) {
            return Err(ConfigError::invalid(
                format!("{prefix}.controllers[{i}].name"),
                format!("{:?}", c.name),
                "is listed twice",
            ));
        }
    }
    for (i, w) in watch_rules.iter().enumerate() {
        for (j, node) in w.nodes.iter().enumerate() {
            rules::node_name(&format!("{prefix}.watch_rules[{i}].nodes[{j}]"), node)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<ServicePattern, String> {
        ServicePattern::try_from(s.to_owned())
    }

    #[test]
    fn patterns_match_by_parts_with_a_trailing_wildcard() {
        assert!(p("shop/cart/http").unwrap().matches("shop", "cart", "http"));
        assert!(!p("shop/cart/http").unwrap().matches("shop", "cart", "grpc"));
        assert!(p("shop/cart/*").unwrap().matches("shop", "cart", "grpc"));
        assert!(p("shop/*").unwrap().matches("shop", "any", "thing"));
        assert!(!p("shop/*").unwrap().matches("web", "any", "thing"));
        assert!(p("*").unwrap().matches("a", "b", "c"));
    }

    #[test]
    fn node_zones_name_what_is_wrong() {
        let entry = |nodes: Vec<&str>, zone: &str, max_weight| NodeZone {
            nodes: nodes
                .into_iter()
                .map(|n| NodePattern::try_from(n.to_owned()).unwrap())
                .collect(),
            zone: zone.to_owned(),
            max_weight,
        };
        assert!(validate_node_zones("arbiter", &[entry(vec!["edge-*"], "dmz", Some(500))]).is_ok());
        for (bad, field) in [
            (entry(vec![], "dmz", None), "arbiter.node_zones[0].nodes"),
            (
                entry(vec!["edge-*"], "DMZ", None),
                "arbiter.node_zones[0].zone",
            ),
            (
                entry(vec!["edge-*"], "dmz", Some(0)),
                "arbiter.node_zones[0].max_weight",
            ),
            (
                entry(vec!["edge-*"], "dmz", Some(10_001)),
                "arbiter.node_zones[0].max_weight",
            ),
        ] {
            let e = validate_node_zones("arbiter", &[bad])
                .unwrap_err()
                .to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn bad_patterns_say_how_to_write_them() {
        for bad in [
            "shop",
            "shop/cart",
            "*/cart/http",
            "shop/Cart/http",
            "a/b/c/d",
            "shop/*/http",
        ] {
            let err = p(bad).unwrap_err();
            assert!(err.contains("namespace/service/port_name"), "{bad}: {err}");
        }
    }
}
