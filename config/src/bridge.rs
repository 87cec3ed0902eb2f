//! The region bridge's config file: which other regions' bridges it syncs
//! policy and summaries with, how it reaches its own region's arbiter, its
//! mTLS files, and this region's ingress addresses (R9). It only describes
//! and validates settings; it must not connect to peers or read the files
//! it names.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::file::ConfigFile;
use crate::{rules, ConfigError, TlsPaths};

/// Longest freshness limit of another region's view, ms (one hour): a view
/// older than that must not steer failover, and the arbiter refuses a
/// report asking for more (`PUT /v1/remote/{region}`).
pub const MAX_SUMMARY_MAX_AGE_MS: u64 = 3_600_000;

/// Most ingress addresses one region may declare (the wire's bound).
pub const MAX_BRIDGE_INGRESS: usize = 16;

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
    /// `[[peers]]`: the other regions' bridges, one per region. This bridge
    /// dials each to receive that region's policies and summaries, and
    /// serves its own region's to whichever peer dials it. Default empty.
    pub peers: Vec<BridgePeer>,
    /// `host:port` of this region's edge gateways, announced to other regions
    /// as failover entry points. At most 16. Default empty.
    pub ingress: Vec<String>,
    /// Remote summaries older than this, in ms, are never a failover target:
    /// a stale summary is no reason to move traffic (R9). Handed to the
    /// arbiter with the remote view, which marks older views not fresh.
    /// Default 30000; at least twice `sync_interval_ms`, so one late
    /// confirmation never makes a healthy peer look stale, and at most
    /// 3600000 (the arbiter refuses a longer one).
    pub summary_max_age_ms: u64,
    /// How often the bridge reads its arbiter's policies and summaries and
    /// confirms its region's view to the peers, in ms. What changed goes
    /// out as a delta; when nothing did, the peers get a confirmation of a
    /// few bytes. Default 1000; 100 to 1800000.
    pub sync_interval_ms: u64,
    /// Where the bridge serves `GET /metrics` (Prometheus text): summary
    /// age and sync lag per peer region, policy revisions, bytes sent per
    /// region pair. Unset (the default): no metrics listener.
    pub metrics_listen: Option<SocketAddr>,
    /// `[arbiter]`: how to reach this region's arbiter replicas.
    pub arbiter: BridgeArbiter,
    /// `[tls]`: this bridge's mTLS files (a `bridge` certificate of this
    /// region, from `rollcall certs --bridge NAME`). Required by
    /// `rollcall bridge`.
    pub tls: Option<TlsPaths>,
}

/// `[arbiter]`: this region's arbiter, through its admin HTTP API with the
/// bridge's own token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BridgeArbiter {
    /// Admin HTTP addresses (`host:port`) of the region's arbiter replicas.
    /// Policies and summaries are read from, and replicated policies
    /// written through, the first that answers; the remote view is held in
    /// each replica's memory, so it is sent to every one. Default
    /// `["127.0.0.1:7071"]`; at least one.
    pub admin: Vec<String>,
    /// The bridge's token file (`bridge.token` in the arbiter's data
    /// directory: it opens the bridge's calls only, and the bridge's
    /// writes are audited as `bridge:bridge-token`; the operator's
    /// `admin.token` works too). Default
    /// `"./rollcall-data/arbiter/bridge.token"`.
    pub token_file: PathBuf,
    /// Call the admin API over HTTPS (the arbiter's admin port answers
    /// both), presenting this bridge's certificate and checking that the
    /// server's names an arbiter of this region; the bridge's writes are
    /// then audited as `bridge:<its name>`. `false`: plain HTTP with the
    /// token alone (an arbiter older than this release). Default `true`.
    pub https: bool,
}

impl Default for BridgeArbiter {
    fn default() -> Self {
        Self {
            admin: vec!["127.0.0.1:7071".to_owned()],
            token_file: PathBuf::from("./rollcall-data/arbiter/bridge.token"),
            https: true,
        }
    }
}

/// One other region's bridge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgePeer {
    /// The peer's region; a DNS-safe label other than this bridge's own.
    pub region: String,
    /// `host:port` of the peer bridge; the host is also the name its
    /// certificate must carry.
    pub address: String,
    /// That region's CA certificate (its `ca.crt`): the only CA trusted to
    /// vouch for that region's bridge, in both directions.
    pub ca: PathBuf,
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
            sync_interval_ms: 1_000,
            metrics_listen: None,
            arbiter: BridgeArbiter::default(),
            tls: None,
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
            rules::non_empty_file(&format!("bridge.peers[{i}].ca"), &peer.ca)?;
        }
        if self.ingress.len() > MAX_BRIDGE_INGRESS {
            return Err(ConfigError::invalid(
                "bridge.ingress",
                format!("{} entries", self.ingress.len()),
                format!("is too long: at most {MAX_BRIDGE_INGRESS} addresses"),
            ));
        }
        rules::host_ports("bridge.ingress", &self.ingress)?;
        for (i, address) in self.ingress.iter().enumerate() {
            if address.len() > 261 || address.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid(
                    format!("bridge.ingress[{i}]"),
                    format!("{address:?}"),
                    "must be host:port without spaces, at most 261 characters",
                ));
            }
        }
        rules::between(
            "bridge.sync_interval_ms",
            self.sync_interval_ms,
            100,
            MAX_SUMMARY_MAX_AGE_MS / 2,
        )?;
        rules::between(
            "bridge.summary_max_age_ms",
            self.summary_max_age_ms,
            self.sync_interval_ms * 2,
            MAX_SUMMARY_MAX_AGE_MS,
        )?;
        if self.arbiter.admin.is_empty() {
            return Err(ConfigError::invalid(
                "bridge.arbiter.admin",
                "[]",
                "must name at least one arbiter admin address (host:port)",
            ));
        }
        rules::host_ports("bridge.arbiter.admin", &self.arbiter.admin)?;
        rules::non_empty_file("bridge.arbiter.token_file", &self.arbiter.token_file)?;
        if let Some(tls) = &self.tls {
            tls.validate("bridge.tls")?;
        }
        Ok(())
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

    /// The example file with every `# <start>…` line uncommented.
    fn uncommented_example(starts: &[&str]) -> String {
        crate::uncommented(include_str!("../examples/bridge.toml"), starts)
    }

    /// The example shows `[tls]` and `[[peers]]` commented out; uncommented
    /// they must parse, validate and change nothing else.
    #[test]
    fn example_optional_tables_parse_and_validate() {
        let text = uncommented_example(
            &[
                &crate::security::TLS_EXAMPLE_LINES[..],
                &["[[peers]]", "region = ", "address = "],
            ]
            .concat(),
        );
        let mut config = BridgeConfig::from_toml_str(&text).expect("uncommented example loads");
        assert_eq!(
            config.tls.take(),
            Some(TlsPaths::new(
                PathBuf::from("/etc/rollcall/certs/ca.crt"),
                PathBuf::from("/etc/rollcall/certs/bridge-bridge-1.crt"),
                PathBuf::from("/etc/rollcall/certs/bridge-bridge-1.key"),
            ))
        );
        assert_eq!(
            std::mem::take(&mut config.peers),
            vec![BridgePeer {
                region: "r2".to_owned(),
                address: "bridge.r2.example:7444".to_owned(),
                ca: PathBuf::from("/etc/rollcall/certs/r2-ca.crt"),
            }]
        );
        assert_eq!(config, BridgeConfig::default());
    }

    /// Every key of the config appears in the example (set or commented
    /// out), so a key added later cannot be forgotten there.
    #[test]
    fn example_names_every_key() {
        let example = include_str!("../examples/bridge.toml");
        let config = BridgeConfig {
            tls: Some(TlsPaths::new("ca".into(), "cert".into(), "key".into())),
            peers: vec![BridgePeer {
                region: "r2".into(),
                address: "b:1".into(),
                ca: "ca".into(),
            }],
            ..BridgeConfig::default()
        };
        let full = toml::to_string(&config).expect("serializable");
        for line in full.lines().filter(|l| !l.is_empty()) {
            let key = line.split(" = ").next().expect("a key or header");
            let shown = example
                .lines()
                .map(|l| l.strip_prefix("# ").unwrap_or(l))
                .any(|l| l == key || l.starts_with(&format!("{key} = ")));
            assert!(shown, "{key} is not in examples/bridge.toml");
        }
    }

    #[test]
    fn peers_parse_and_validate() {
        let peer = |region: &str, address: &str| {
            format!(
                "[[peers]]\nregion = \"{region}\"\naddress = \"{address}\"\nca = \"r2-ca.crt\"\n"
            )
        };
        let config = BridgeConfig::from_toml_str(&peer("r2", "bridge.r2:7444")).expect("valid");
        assert_eq!(config.peers[0].region, "r2");
        let own = BridgeConfig::from_toml_str(&peer("r1", "bridge.r1:7444")).unwrap_err();
        assert!(
            own.to_string()
                .starts_with("bridge.peers[0].region = \"r1\""),
            "{own}"
        );
        let twice = peer("r2", "a:1") + &peer("r2", "b:1");
        let twice = BridgeConfig::from_toml_str(&twice).unwrap_err();
        assert!(
            twice.to_string().starts_with("bridge.peers[1].region"),
            "{twice}"
        );
        let address = BridgeConfig::from_toml_str(&peer("r2", "bridge.r2")).unwrap_err();
        assert!(
            address.to_string().starts_with("bridge.peers[0].address"),
            "{address}"
        );
        let no_ca = BridgeConfig::from_toml_str("[[peers]]\nregion = \"r2\"\naddress = \"b:1\"\n")
            .unwrap_err();
        assert!(no_ca.to_string().contains("ca"), "{no_ca}");
    }

    #[test]
    fn bad_values_name_their_fields() {
        type Breaks = fn(&mut BridgeConfig);
        let cases: [(&str, Breaks); 8] = [
            ("bridge.name", |c| c.name = "Bridge".to_owned()),
            ("bridge.region", |c| c.region = String::new()),
            ("bridge.ingress[1]", |c| {
                c.ingress = vec!["edge:443".to_owned(), "edge".to_owned()]
            }),
            ("bridge.ingress", |c| {
                c.ingress = vec!["edge:443".to_owned(); 17]
            }),
            ("bridge.sync_interval_ms", |c| c.sync_interval_ms = 50),
            ("bridge.summary_max_age_ms", |c| {
                c.summary_max_age_ms = 1_500
            }),
            ("bridge.arbiter.admin", |c| c.arbiter.admin.clear()),
            ("bridge.arbiter.admin[0]", |c| {
                c.arbiter.admin = vec!["no-port".to_owned()]
            }),
        ];
        for (field, breaks) in cases {
            let mut config = BridgeConfig::default();
            breaks(&mut config);
            let message = config.validate().unwrap_err().to_string();
            assert!(message.starts_with(&format!("{field} = ")), "{message}");
        }
    }
}
