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
}

impl TlsPaths {
    pub(crate) fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        rules::non_empty_file(&format!("{prefix}.ca"), &self.ca)?;
        rules::non_empty_file(&format!("{prefix}.cert"), &self.cert)?;
        rules::non_empty_file(&format!("{prefix}.key"), &self.key)
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
