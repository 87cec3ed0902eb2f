//! The region bridge's config file: which other regions' bridges it syncs
//! policy and summaries with, and this region's ingress addresses (R9). It
//! only describes and validates settings; it must not connect to peers.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::file::ConfigFile;
use crate::{rules, ConfigError};

/// Configuration of one region bridge (`rollcall bridge --config bridge.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BridgeConfig {
    /// This bridge's name; a DNS-safe label used in its mTLS identity.
    /// Default `"bridge-1"`.
    pub name: String,
    /// The region this bridge speaks for; a DNS-safe label. Default `"r1"`.
    pub region: String,
    /// QUIC address peer bridges connect to. Default `127.0.0.1:7444`.
    pub listen: SocketAddr,
    /// `[[peers]]`: the other regions' bridges, one per region. Default empty.
    pub peers: Vec<BridgePeer>,
    /// `host:port` of this region's edge gateways, announced to other regions
    /// as failover entry points. Default empty.
    pub ingress: Vec<String>,
    /// Remote summaries older than this, in ms, are never a failover target:
    /// a stale summary is no reason to move traffic (R9). Default 30000.
    pub summary_max_age_ms: u64,
}

/// One other region's bridge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgePeer {
    /// The peer's region; a DNS-safe label other than this bridge's own.
    pub region: String,
    /// `host:port` of the peer bridge.
    pub address: String,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            name: "bridge-1".to_owned(),
            region: "r1".to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7444)),
            peers: Vec::new(),
            ingress: Vec::new(),
            summary_max_age_ms: 30_000,
        }
    }
}

impl ConfigFile for BridgeConfig {
    /// Checks every rule; the first broken one is returned, naming its full
    /// dotted field path (`bridge.…`).
    fn validate(&self) -> Result<(), ConfigError> {
        rules::dns_label("bridge.name", &self.name)?;
        rules::dns_label("bridge.region", &self.region)?;
        for (i, peer) in self.peers.iter().enumerate() {
            let field = format!("bridge.peers[{i}].region");
            rules::dns_label(&field, &peer.region)?;
            if peer.region == self.region {
                return Err(ConfigError::invalid(
                    field,
                    format!("{:?}", peer.region),
                    "is this bridge's own region",
                ));
            }
            if self.peers[..i].iter().any(|p| p.region == peer.region) {
                return Err(ConfigError::invalid(
                    field,
                    format!("{:?}", peer.region),
                    "is listed twice: one bridge per region",
                ));
            }
            rules::host_port(&format!("bridge.peers[{i}].address"), &peer.address)?;
        }
        rules::host_ports("bridge.ingress", &self.ingress)?;
        rules::at_least("bridge.summary_max_age_ms", self.summary_max_age_ms, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_file_shows_every_default() {
        let text = include_str!("../examples/bridge.toml");
        assert_eq!(
            BridgeConfig::from_toml_str(text).expect("example must load"),
            BridgeConfig::default()
        );
    }

    #[test]
    fn peers_parse_and_validate() {
        let config = BridgeConfig::from_toml_str(
            "[[peers]]\nregion = \"r2\"\naddress = \"bridge.r2:7444\"\n",
        )
        .expect("valid");
        assert_eq!(config.peers[0].region, "r2");
        let own = BridgeConfig::from_toml_str(
            "[[peers]]\nregion = \"r1\"\naddress = \"bridge.r1:7444\"\n",
        )
        .unwrap_err();
        assert!(
            own.to_string()
                .starts_with("bridge.peers[0].region = \"r1\""),
            "{own}"
        );
        let address =
            BridgeConfig::from_toml_str("[[peers]]\nregion = \"r2\"\naddress = \"bridge.r2\"\n")
                .unwrap_err();
        assert!(
            address.to_string().starts_with("bridge.peers[0].address"),
            "{address}"
        );
    }
}
