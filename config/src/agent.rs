//! The node agent's own config file: identity, listeners, arbiter
//! addresses, default check timings, gossip and the budget's estimates. It
//! only describes and validates settings; it must not open sockets, create
//! directories or start anything.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::file::ConfigFile;
use crate::{rules, BudgetEstimates, ChecksConfig, ConfigError, GossipConfig, TlsPaths};
use crate::{
    DataPlaneConfig, DrainConfig, ProbesConfig, ProxyEntry, StalenessConfig, WorkloadGrant,
};

/// Prefix of every field path in agent errors. The file has no `[agent]`
/// table because it is the agent's own, but errors still say `agent.` so
/// they cannot be confused with the arbiter's.
const PREFIX: &str = "agent";

/// Configuration of one node agent (`rollcall agent --config agent.toml`).
///
/// The agent renews its node lease every `arbiter.lease.ttl_ms / 3`; this is
/// fixed (see [`crate::RENEWALS_PER_TTL`]), not configured here, so that
/// two lost renewals in a row never expire a healthy node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// This node's name, unique in its region; a DNS-safe label. It appears
    /// in every endpoint record and in the agent's mTLS identity. Default
    /// `"dev-node"`.
    pub node_id: String,
    /// Region of this node; a DNS-safe label. Instances register only in
    /// their own region (R9). Default `"r1"`.
    pub region: String,
    /// Zone (failure domain) of this node; a DNS-safe label. Gossip runs per
    /// zone, the proxy prefers same-zone endpoints and the mass-expiry guard
    /// counts per zone. Default `"z1"`.
    pub zone: String,
    /// Directory for the agent's registrations and its checksummed catalog
    /// cache (R7). Default `"./rollcall-data/agent"`.
    pub data_dir: PathBuf,
    /// TCP address of the local registration and resolve HTTP API. Default
    /// `127.0.0.1:7070`: loopback, because only workloads on this host may
    /// use it.
    pub http_listen: SocketAddr,
    /// UDP/TCP address of the local DNS server. Default `127.0.0.1:8600`.
    pub dns_listen: SocketAddr,
    /// TTL of DNS answers, in seconds. Default 1. A resolver may keep a
    /// removed endpoint for this long, so it widens the 3 s leave window by
    /// the same amount for DNS callers; the budget counts it.
    pub dns_ttl_s: u32,
    /// `host:port` of this region's arbiter replicas. Default empty (an agent
    /// without arbiters serves only its on-disk cache).
    pub arbiters: Vec<String>,
    /// Interval of QUIC keep-alives (PING frames) on the agent's connection
    /// to the arbiter while nothing else is sent, in ms. Only the agent
    /// sends them; the arbiter sends none and never times a session by
    /// them (it probes a node's session when it needs to know, R4). They
    /// keep NAT bindings open and bound how long a dead arbiter goes
    /// unnoticed to the QUIC idle timeout (10 s); the agent's silence
    /// check (`arbiter_silence_ms`) notices one sooner. Default 5000; 100 to 5000 (at
    /// most half the idle timeout, so one lost PING never closes a live
    /// connection).
    pub keepalive_ms: u64,
    /// Longest wait of one connect to an arbiter replica (name resolution,
    /// QUIC handshake, the replica's certificate checked), in ms; past it
    /// the agent tries the next replica after its reconnect backoff. A
    /// replica whose host is gone answers nothing, and without this bound
    /// a connect would wait the whole QUIC idle timeout (10 s), about a
    /// lease TTL. The Welcome that follows a handshake is not bounded by
    /// it (the grant is a Raft write; the arbiter refuses the session
    /// itself if the write fails). Default 2000; 100 to 10000.
    pub connect_timeout_ms: u64,
    /// How long the arbiter may leave a message of the agent's session
    /// (a lease renewal, a subscription, a request) without a sign of
    /// life, in ms: when not one QUIC datagram arrives from the replica
    /// within this of a send (its acknowledgement is due within a round
    /// trip and 25 ms), the agent ends the session and moves on to the
    /// next replica. A replica whose host died silently is noticed by the
    /// next renewal (every `ttl_ms / 3`) plus this, not at the 10 s QUIC
    /// idle timeout. A check whose timer fired more than 250 ms late (the
    /// agent was paused or starved) decides nothing. Default 1500; 200 to
    /// 5000.
    pub arbiter_silence_ms: u64,
    /// Services to follow from start, as `namespace/service/port_name`;
    /// others are followed from their first local resolve. Default none.
    pub services: Vec<String>,
    /// The addresses this node's instances register, declared to the
    /// arbiter in Hello (its `registration.addresses = "declared"` allows
    /// only these). When the agent's certificate carries IP SANs, every one
    /// listed here must be among them. Default none: the certificate's IP
    /// SANs, or where it has none, every address of the host's interfaces.
    pub advertise_addresses: Vec<std::net::IpAddr>,
    /// Shortest wait before reconnecting to the arbiter, in ms; it doubles
    /// after each failure up to `reconnect_max_ms`, and each wait is drawn
    /// uniformly below it (full jitter), so 5,000 agents returning after an
    /// outage spread out. Default 100.
    pub reconnect_min_ms: u64,
    /// Longest wait before reconnecting, in ms. Default 5000.
    pub reconnect_max_ms: u64,
    /// How long the first resolve of a service not yet followed waits for
    /// its snapshot, in ms. Default 500.
    pub first_resolve_wait_ms: u64,
    /// Longest wait of a drain with `wait=propagated`, in ms. Default 2500,
    /// inside the 3 s leave budget.
    pub propagation_timeout_ms: u64,
    /// Longest wait of a local write (register, drain, deregister) for the
    /// arbiter's answer, in ms: past it the call is answered as pending
    /// (202), as when the arbiter is unreachable, and the write is
    /// committed when the answer comes (or kept pending and sent again).
    /// Bounds what a caller waits when a replica died and QUIC has not
    /// noticed yet (its idle timeout is 10 s) or the region lost its quorum
    /// (the arbiter answers unavailable after `raft.write_timeout_ms`).
    /// Default 2000; 100 to 60,000. A drain with `wait=propagated` may wait
    /// `propagation_timeout_ms` more.
    pub write_answer_ms: u64,
    /// A service followed because of a lookup (DNS, the resolve API), not
    /// listed in `services` or a `[[proxy]]`, is unfollowed (its
    /// subscription, cached copy and view dropped) once nothing looked it
    /// up for this long, in ms, while a session is up; looked up again, it
    /// is followed again. 0 keeps every such service. Default 3600000.
    pub follow_idle_ms: u64,
    /// A looked-up service the arbiter says does not exist is answered as
    /// unknown (NXDOMAIN, 404) from memory, and then forgotten once nothing
    /// looked it up for this long, in ms; a lookup after that asks the
    /// arbiter again. Bounds what lookups of random names can grow.
    /// Default 30000.
    pub unknown_ttl_ms: u64,
    /// Most distinct services named in per-service metric labels; further
    /// services are counted under `service="_other"`. Default 500.
    pub metrics_max_services: usize,
    /// `[http_limits]`: connections and timeouts of the local HTTP API.
    pub http_limits: crate::HttpLimits,
    /// `[tls]`: this agent's mTLS files. Required by `rollcall agent` when
    /// `arbiters` is set; `rollcall dev` makes its own.
    pub tls: Option<TlsPaths>,
    /// `[checks.*]`: timings of checks whose registration omits them.
    pub checks: ChecksConfig,
    /// `[[proxy]]`: local TCP proxy listeners, one per service. Default none.
    pub proxy: Vec<ProxyEntry>,
    /// `[data_plane]`: endpoint choice, retries, ejection, panic, protection.
    pub data_plane: DataPlaneConfig,
    /// `[staleness]`: maximum age of a service's copy and what happens past it.
    pub staleness: StalenessConfig,
    /// `[[workloads]]`: uids/gids allowed to register and drain services
    /// through the agent's unix socket. Default none.
    pub workloads: Vec<WorkloadGrant>,
    /// `[drain]`: the drain sequence.
    pub drain: DrainConfig,
    /// `[probes]`: the probe runner.
    pub probes: ProbesConfig,
    /// `[gossip]`: SWIM membership of this node's zone.
    pub gossip: GossipConfig,
    /// `[ingress]`: this agent as its region's edge gateway for other
    /// regions' failed-over connections. Default off.
    pub ingress: crate::IngressConfig,
    /// `[budget]`: estimates `rollcall budget` uses for what settings cannot
    /// tell (commit and network latency). Not used at run time.
    pub budget: BudgetEstimates,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_id: "dev-node".to_owned(),
            region: "r1".to_owned(),
            zone: "z1".to_owned(),
            data_dir: PathBuf::from("./rollcall-data/agent"),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            dns_listen: SocketAddr::from(([127, 0, 0, 1], 8600)),
            dns_ttl_s: 1,
            arbiters: Vec::new(),
            keepalive_ms: 5_000,
            connect_timeout_ms: 2_000,
            arbiter_silence_ms: 1_500,
            services: Vec::new(),
            advertise_addresses: Vec::new(),
            reconnect_min_ms: 100,
            reconnect_max_ms: 5_000,
            first_resolve_wait_ms: 500,
            propagation_timeout_ms: 2_500,
            write_answer_ms: 2_000,
            follow_idle_ms: 3_600_000,
            unknown_ttl_ms: 30_000,
            metrics_max_services: 500,
            http_limits: crate::HttpLimits::default(),
            tls: None,
            checks: ChecksConfig::default(),
            proxy: Vec::new(),
            data_plane: DataPlaneConfig::default(),
            staleness: StalenessConfig::default(),
            workloads: Vec::new(),
            drain: DrainConfig::default(),
            probes: ProbesConfig::default(),
            gossip: GossipConfig::default(),
            ingress: crate::IngressConfig::default(),
            budget: BudgetEstimates::default(),
        }
    }
}

impl ConfigFile for AgentConfig {
    /// Checks every rule; the first broken one is returned, naming its full
    /// dotted field path (`agent.…`).
    fn validate(&self) -> Result<(), ConfigError> {
        rules::dns_label("agent.node_id", &self.node_id)?;
        rules::dns_label("agent.region", &self.region)?;
        rules::dns_label("agent.zone", &self.zone)?;
        rules::non_empty_path("agent.data_dir", &self.data_dir)?;
        if self.dns_listen == self.http_listen {
            return Err(ConfigError::invalid(
                "agent.dns_listen",
                self.dns_listen,
                "must differ from http_listen (DNS over TCP would need the same port)",
            ));
        }
        rules::host_ports("agent.arbiters", &self.arbiters)?;
        rules::between(
            "agent.keepalive_ms",
            self.keepalive_ms,
            100,
            crate::QUIC_IDLE_TIMEOUT_MS / 2,
        )?;
        rules::between(
            "agent.connect_timeout_ms",
            self.connect_timeout_ms,
            100,
            crate::QUIC_IDLE_TIMEOUT_MS,
        )?;
        rules::between(
            "agent.arbiter_silence_ms",
            self.arbiter_silence_ms,
            200,
            crate::QUIC_IDLE_TIMEOUT_MS / 2,
        )?;
        for (i, service) in self.services.iter().enumerate() {
            rules::service_key(&format!("agent.services[{i}]"), service)?;
        }
        // The arbiter's protocol bound (rollcall_leases MAX_DECLARED_ADDRESSES).
        const MAX_ADVERTISED: usize = 16;
        if self.advertise_addresses.len() > MAX_ADVERTISED {
            return Err(ConfigError::invalid(
                "agent.advertise_addresses",
                format!("{} addresses", self.advertise_addresses.len()),
                format!("lists at most {MAX_ADVERTISED}"),
            ));
        }
        for (i, address) in self.advertise_addresses.iter().enumerate() {
            if address.is_unspecified() || address.is_multicast() {
                return Err(ConfigError::invalid(
                    format!("agent.advertise_addresses[{i}]"),
                    address,
                    "must be an address instances can be reached at, not unspecified or multicast",
                ));
            }
        }
        rules::at_least("agent.reconnect_min_ms", self.reconnect_min_ms, 1)?;
        rules::at_least(
            "agent.reconnect_max_ms",
            self.reconnect_max_ms,
            self.reconnect_min_ms,
        )?;
        rules::at_least(
            "agent.propagation_timeout_ms",
            self.propagation_timeout_ms,
            1,
        )?;
        rules::between("agent.write_answer_ms", self.write_answer_ms, 100, 60_000)?;
        if self.follow_idle_ms != 0 {
            rules::at_least("agent.follow_idle_ms", self.follow_idle_ms, 1_000)?;
        }
        rules::between(
            "agent.unknown_ttl_ms",
            self.unknown_ttl_ms,
            1_000,
            3_600_000,
        )?;
        rules::between(
            "agent.metrics_max_services",
            self.metrics_max_services,
            1,
            100_000,
        )?;
        self.http_limits.validate("agent.http_limits")?;
        if let Some(tls) = &self.tls {
            tls.validate("agent.tls")?;
        }
        crate::data_plane::validate(
            PREFIX,
            &self.proxy,
            &self.data_plane,
            &self.staleness,
            &self.workloads,
            &self.drain,
            &self.probes,
        )?;
        self.checks.validate(&format!("{PREFIX}.checks"))?;
        self.gossip.validate(&format!("{PREFIX}.gossip"))?;
        rules::at_least(
            "agent.ingress.preamble_timeout_ms",
            self.ingress.preamble_timeout_ms,
            100,
        )?;
        rules::between(
            "agent.ingress.max_connections",
            self.ingress.max_connections,
            1,
            1_000_000,
        )?;
        self.budget.validate(&format!("{PREFIX}.budget"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckTiming, GossipPreset};

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(
            AgentConfig::from_toml_str("").expect("empty is valid"),
            AgentConfig::default()
        );
    }

    #[test]
    fn example_file_shows_every_default() {
        let text = include_str!("../examples/agent.toml");
        assert_eq!(
            AgentConfig::from_toml_str(text).expect("example must load"),
            AgentConfig::default()
        );
    }

    /// The example file with every `# <start>…` line uncommented.
    fn uncommented_example(starts: &[&str]) -> String {
        crate::uncommented(include_str!("../examples/agent.toml"), starts)
    }

    /// The example lists the gossip overrides commented out, with the `lan`
    /// preset's values; uncommented they must parse and change nothing.
    #[test]
    fn example_gossip_overrides_match_the_lan_preset() {
        let keys = [
            "probe_period_ms",
            "probe_rtt_ms",
            "num_indirect_probes",
            "suspect_to_down_ms",
            "periodic_gossip_ms",
            "announce_ms",
            "max_transmissions",
        ];
        let starts: Vec<String> = keys.iter().map(|k| format!("{k} = ")).collect();
        let starts: Vec<&str> = starts.iter().map(String::as_str).collect();
        let text = uncommented_example(&starts);
        let config = AgentConfig::from_toml_str(&text).expect("uncommented example must load");
        for key in keys {
            assert!(
                toml::to_string(&config.gossip)
                    .expect("serializable")
                    .contains(key),
                "{key} is not listed in the example"
            );
        }
        assert_eq!(config.gossip.effective(), GossipPreset::Lan.settings());
    }

    /// The example shows the optional `[tls]` table commented out, with the
    /// paths `rollcall certs --out /etc/rollcall/certs --region r1 --agent
    /// node-17` writes; uncommented it must parse, validate and change
    /// nothing else.
    #[test]
    fn example_tls_table_parses_and_validates() {
        let text = uncommented_example(&crate::security::TLS_EXAMPLE_LINES);
        let mut config = AgentConfig::from_toml_str(&text).expect("uncommented example must load");
        assert_eq!(
            config.tls.take(),
            Some(TlsPaths::new(
                PathBuf::from("/etc/rollcall/certs/ca.crt"),
                PathBuf::from("/etc/rollcall/certs/agent-node-17.crt"),
                PathBuf::from("/etc/rollcall/certs/agent-node-17.key"),
            ))
        );
        assert_eq!(config, AgentConfig::default());
    }

    /// Every key of the config appears in the example (set or commented
    /// out), so a key added later cannot be forgotten there.
    #[test]
    fn example_names_every_key() {
        let example = include_str!("../examples/agent.toml");
        let config = AgentConfig {
            tls: Some(TlsPaths::new("ca".into(), "cert".into(), "key".into())),
            ..AgentConfig::default()
        };
        let full = toml::to_string(&config).expect("serializable");
        for line in full.lines().filter(|l| !l.is_empty()) {
            let key = line.split(" = ").next().expect("a key or header");
            let shown = example
                .lines()
                .map(|l| l.strip_prefix("# ").unwrap_or(l))
                .any(|l| l == key || l.starts_with(&format!("{key} = ")));
            assert!(shown, "{key} is not in examples/agent.toml");
        }
    }

    #[test]
    fn default_round_trips_through_toml() {
        let text = toml::to_string(&AgentConfig::default()).expect("serializable");
        assert_eq!(
            AgentConfig::from_toml_str(&text).expect("round trip"),
            AgentConfig::default()
        );
    }

    #[test]
    fn nested_error_names_the_full_path() {
        let err = AgentConfig::from_toml_str(
            "[checks.readiness]\ninterval_ms = 5000\ntimeout_ms = 6000\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent.checks.readiness.timeout_ms = 6000 must be below interval_ms = 5000"
        );
    }

    #[test]
    fn unknown_key_is_rejected_with_origin() {
        let err = AgentConfig::from_toml_str("node_idd = \"x\"\n").unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with("<string>: "), "{message}");
        assert!(message.contains("node_idd"), "{message}");
    }

    #[test]
    fn load_names_the_file_in_parse_and_io_errors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "dns_ttl_s = \"one\"\n").expect("write");
        let err = AgentConfig::load(&path).unwrap_err();
        assert!(
            err.to_string().starts_with(&path.display().to_string()),
            "{err}"
        );
        let missing = dir.path().join("missing.toml");
        assert!(matches!(
            AgentConfig::load(&missing),
            Err(ConfigError::Io { path, .. }) if path == missing
        ));
    }

    #[test]
    fn bad_values_name_their_fields() {
        type Breaks = fn(&mut AgentConfig);
        let cases: [(&str, Breaks); 8] = [
            ("agent.data_plane.retries", |c| c.data_plane.retries = 11),
            ("agent.data_plane.slow_start_ms", |c| {
                c.data_plane.slow_start_ms = 3_600_001
            }),
            ("agent.staleness.services[0].max_age_ms", |c| {
                c.staleness.services = vec![crate::StalenessOverride {
                    service: crate::ServicePattern::try_from("default/web/*".to_owned()).unwrap(),
                    max_age_ms: 0,
                    behaviour: crate::StaleBehaviour::Refuse,
                }]
            }),
            ("agent.node_id", |c| c.node_id = "Node_1".to_owned()),
            ("agent.zone", |c| c.zone = String::new()),
            ("agent.arbiters[1]", |c| {
                c.arbiters = vec!["a:7443".to_owned(), "b".to_owned()]
            }),
            ("agent.dns_listen", |c| c.dns_listen = c.http_listen),
            ("agent.checks.liveness.jitter", |c| {
                c.checks.liveness = CheckTiming {
                    jitter: -0.1,
                    ..CheckTiming::LIVENESS
                }
            }),
        ];
        for (field, breaks) in cases {
            let mut config = AgentConfig::default();
            breaks(&mut config);
            let message = config.validate().unwrap_err().to_string();
            assert!(message.starts_with(&format!("{field} = ")), "{message}");
        }
    }
}
