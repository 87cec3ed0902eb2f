//! The lease arbiter's config file: identity, listeners, node leases, the
//! mass-expiry guard, catalog retention, delta log and watch distribution
//! (R3, R6). It only describes and validates settings; it must not open
//! sockets, touch the data directory or start Raft.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::file::ConfigFile;
use crate::security::{validate_grants, validate_node_zones, validate_registration_rules};
use crate::{
    rules, ConfigError, ControllerGrant, RegistrationConfig, RegistrationRule, TlsPaths, WatchRule,
};

/// Renewals per lease TTL: the agent renews its node lease every
/// `ttl_ms / RENEWALS_PER_TTL`. Fixed rather than configured so that two
/// renewals in a row can be lost before a healthy node expires, whatever
/// the TTL.
pub const RENEWALS_PER_TTL: u64 = 3;

/// Upper bound on `distribution.coalesce_window_ms`, in ms. Coalescing sits
/// inside the 3 s leave budget (R5, R6), so it must stay well below it.
pub const MAX_COALESCE_WINDOW_MS: u64 = 250;

/// Most catalog shards (`[catalog] shards`).
pub const MAX_SHARDS: u16 = 64;

/// Bounds on `distribution.resend_after_ms`, in ms. Below the lower one a
/// slow but healthy agent's acks would race the re-sends; above the upper
/// one a lost update would leave an agent stale for minutes.
pub const RESEND_AFTER_MS_RANGE: (u64, u64) = (100, 60_000);

/// `udp_recv_buffer_bytes` when set (not 0): (least, most).
pub const UDP_RECV_BUFFER_BYTES_RANGE: (u64, u64) = (64 * 1024, 256 * 1024 * 1024);

/// Configuration of one lease arbiter replica (`rollcall arbiter --config arbiter.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArbiterConfig {
    /// This replica's name, unique in its region; a DNS-safe label used in
    /// its mTLS identity and Raft membership. Default `"arbiter-1"`.
    pub name: String,
    /// The region this arbiter group is the authority for (R9); a DNS-safe
    /// label. Default `"r1"`.
    pub region: String,
    /// QUIC address agents and peer replicas connect to. Default
    /// `127.0.0.1:7443` (loopback for development).
    pub listen: SocketAddr,
    /// Receive buffer asked for the QUIC socket on `listen`, in bytes
    /// (`SO_RCVBUF`); 0, the default, keeps the kernel's
    /// (`net.core.rmem_default`, often 208 KiB). A larger buffer absorbs
    /// bursts the arbiter can keep up with, such as a region's agents
    /// connecting at once (5,000 agents: 17 s → 6 s, 100,000 datagrams
    /// dropped → 531, with 4 MiB); under load it cannot keep up with, it
    /// turns drops, which slow QUIC's senders, into queueing delay for
    /// every message (2,000 agents in a deploy: commit → applied p99
    /// 148 ms → 5 s with 4 MiB). Linux grants at most
    /// `net.core.rmem_max`: the arbiter logs what it got and warns when
    /// that is less than asked. 0, or from 65536 to 268435456.
    pub udp_recv_buffer_bytes: u64,
    /// HTTP address of the admin and metrics endpoint. Default
    /// `127.0.0.1:7071`; must differ from `listen`.
    pub admin: SocketAddr,
    /// Directory of the Raft log and snapshots. Default `"./rollcall-data/arbiter"`.
    pub data_dir: PathBuf,
    /// `[http_limits]`: connections and timeouts of the admin endpoint.
    pub http_limits: crate::HttpLimits,
    /// `[limits]`: what one identity, connection or source address may
    /// take of this replica (handshakes, connections, requests, session
    /// messages, admin calls).
    pub limits: crate::LimitsConfig,
    /// `[lease]`: node leases and the silence needed for gossip verdicts.
    pub lease: LeaseConfig,
    /// `[guard]`: the mass-expiry guard.
    pub guard: GuardConfig,
    /// `[catalog]`: retention and label limits of endpoint records.
    pub catalog: CatalogConfig,
    /// `[delta_log]`: how far back agents can resume with deltas.
    pub delta_log: DeltaLogConfig,
    /// `[distribution]`: watch streams to agents.
    pub distribution: DistributionConfig,
    /// `[store]`: durable storage in `data_dir`.
    pub store: StoreConfig,
    /// `[raft]`: this replica's place in its Raft group.
    pub raft: RaftConfig,
    /// `[tls]`: this replica's mTLS files. Required by `rollcall arbiter`;
    /// `rollcall dev` makes its own.
    pub tls: Option<TlsPaths>,
    /// `[[controllers]]`: orchestrator identities and the services each may
    /// register on any node (R10). Default none.
    pub controllers: Vec<ControllerGrant>,
    /// `[[watch_rules]]`: nodes restricted to watching some services.
    /// Default none: every node may watch every service.
    pub watch_rules: Vec<WatchRule>,
    /// `[registration]`: whether agents may register addresses their node
    /// did not declare. Default: only declared ones.
    pub registration: RegistrationConfig,
    /// `[[registration_rules]]`: nodes restricted to registering some
    /// services. Default none: every node may register every service.
    pub registration_rules: Vec<RegistrationRule>,
    /// `[[node_zones]]`: nodes whose zone (and weight cap) the arbiter
    /// binds. Default none: every node is in the zone it declares (unless
    /// `registration.zones = "bound"`).
    pub node_zones: Vec<crate::NodeZone>,
}

impl Default for ArbiterConfig {
    fn default() -> Self {
        Self {
            name: "arbiter-1".to_owned(),
            region: "r1".to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7443)),
            udp_recv_buffer_bytes: 0,
            admin: SocketAddr::from(([127, 0, 0, 1], 7071)),
            data_dir: PathBuf::from("./rollcall-data/arbiter"),
            http_limits: crate::HttpLimits::default(),
            limits: crate::LimitsConfig::default(),
            lease: LeaseConfig::default(),
            guard: GuardConfig::default(),
            catalog: CatalogConfig::default(),
            delta_log: DeltaLogConfig::default(),
            distribution: DistributionConfig::default(),
            store: StoreConfig::default(),
            raft: RaftConfig::default(),
            tls: None,
            controllers: Vec::new(),
            watch_rules: Vec::new(),
            registration: RegistrationConfig::default(),
            registration_rules: Vec::new(),
            node_zones: Vec::new(),
        }
    }
}

/// `[lease]`: node leases (R3) and the arbiter's half of a gossip down
/// verdict (R4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// Lifetime of a node agent's lease, in ms; one lease per agent, not per
    /// instance. The agent renews every `ttl_ms / 3`. Default 10000: a
    /// silently crashed node whose gossip verdict never arrives expires
    /// within 10 s, plus sweep, commit and propagation, inside the 15 s
    /// hard-failure SLO. Lower costs more renewals (5,000 agents renew).
    pub ttl_ms: u64,
    /// How often the leader checks lease deadlines, in ms. Adds up to one
    /// interval to expiry. Default 250. Must be below `ttl_ms`.
    pub sweep_interval_ms: u64,
    /// How long a leader may go without a quorum's acknowledgement before
    /// it counts its quorum lost (then no lease expires and no down verdict
    /// is taken until the quorum answers again), in ms. Default 2000. Must
    /// be below `ttl_ms`. (Sessions are no longer timed by it: agents send
    /// no periodic keep-alive, and a down report asks the node's session
    /// with a probe, `probe_timeout_ms`.)
    pub silence_ms: u64,
    /// How long the arbiter waits for a node's answer to a probe of its
    /// session before it takes the node's silence as its own signal, in
    /// ms (R4). A gossip down report, or a lease past its deadline, makes
    /// the replica holding the node's session send a probe; the agent's
    /// session actor answers at once. An answer after the report is a
    /// partition inside the zone, nothing removed; none within this bound
    /// (or no session on any replica) agrees with gossip and the node is
    /// marked down. It is what stops one zone-internal partition from
    /// removing a live node, and what a process pause must stay under
    /// (counted from the gossip report, which comes well into a pause).
    /// Default 1000; 50 to `ttl_ms / 2`.
    pub probe_timeout_ms: u64,
    /// How long the leader waits for witnesses once a lease is past its
    /// deadline, in ms (R3, R4). Silence alone is one signal: before it
    /// expires a silent lease, the leader asks up to three connected agents
    /// of the node's zone (does their gossip hold it alive?) and three of
    /// other zones (does one of its endpoints accept a TCP connection?).
    /// Any witness that sees the node alive holds the expiry (a WARN log and
    /// `rollcall_arbiter_leases_held_by_witnesses`) for at most
    /// `guard.max_hold_ms`; two or more that all see it gone confirm it
    /// down at once (records UNHEALTHY, as a gossip verdict, not held by the
    /// mass-expiry guard); no answer within this wait expires it as before.
    /// Default 1500. 0 turns witnesses off: silence alone expires a lease.
    /// At most 60000.
    pub witness_wait_ms: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            ttl_ms: 10_000,
            sweep_interval_ms: 250,
            silence_ms: 2_000,
            probe_timeout_ms: 1_000,
            witness_wait_ms: 1_500,
        }
    }
}

/// `[guard]`: the mass-expiry guard (R3). When lease expiries would hit too
/// large a share of one zone at once, the arbiter is more likely cut off
/// from the zone than the zone dead, so those expiries are held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Largest fraction of one zone's nodes whose expiries may commit within
    /// one window, in (0, 1]; further expiries are held and an alert raised.
    /// At least one node may always expire, so small zones still heal.
    /// Default 0.3. 1.0 disables the guard.
    pub max_share: f64,
    /// Length of the window the share is counted over, in ms. Default 60000.
    pub window_ms: u64,
    /// Longest an expiry is held, in ms; after it the expiry proceeds even
    /// without a gossip verdict. Default 600000 (10 min, the control-plane
    /// outage R7 plans for).
    pub max_hold_ms: u64,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            max_share: 0.3,
            window_ms: 60_000,
            max_hold_ms: 600_000,
        }
    }
}

/// `[catalog]`: retention and label limits of endpoint records (R2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CatalogConfig {
    /// Records no longer covered by a live lease (EXPIRED) are purged this
    /// long after their last change, in ms. Default 900000 (15 min), so an
    /// operator can still see why an instance vanished.
    pub expired_retention_ms: u64,
    /// A service stays known this long after its last record was purged, in
    /// ms; until then DNS answers "empty", after it NXDOMAIN. Default
    /// 86400000 (24 h): NXDOMAIN is cached by resolvers, so a service between
    /// deploys must not be forgotten quickly.
    pub service_retention_ms: u64,
    /// The only label keys a registration may use (bounded dimensions keep
    /// records small and selectors cheap). Each a DNS-safe label, no
    /// duplicates. Default `["track", "canary", "tier", "shard", "cell", "arch"]`.
    pub allowed_label_keys: Vec<String>,
    /// Most labels one endpoint record may carry. Default 8; at least 1.
    pub max_labels: u32,
    /// How many shards (Raft groups) the region's catalog is split into,
    /// by a stable hash of each service's `namespace/service`. Fixed when
    /// the region's first replica creates its store: a replica whose store
    /// was made with another number refuses to start. Default 1; 1 to 64.
    pub shards: u16,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        Self {
            expired_retention_ms: 900_000,
            service_retention_ms: 86_400_000,
            allowed_label_keys: ["track", "canary", "tier", "shard", "cell", "arch"]
                .map(String::from)
                .to_vec(),
            max_labels: 8,
            shards: 1,
        }
    }
}

/// `[delta_log]`: the ordered changes kept for agents that resume a watch.
/// An agent further behind gets a full snapshot of the service instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeltaLogConfig {
    /// Most changes kept. Default 180000: 15 minutes at 200 changes/s, so an
    /// agent back from the 10-minute outage of R7 resumes with deltas.
    pub max_entries: u64,
    /// Oldest revision kept, counted back from the newest. Default 180000
    /// (same reasoning as `max_entries`).
    pub max_revision_span: u64,
}

impl Default for DeltaLogConfig {
    fn default() -> Self {
        Self {
            max_entries: 180_000,
            max_revision_span: 180_000,
        }
    }
}

/// `[distribution]`: watch streams from the arbiter to agents (R6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistributionConfig {
    /// At most one update message goes to an agent per window, in ms,
    /// carrying every change since the last: changes that arrive while a
    /// send is in flight, or within a window of the last message, wait for
    /// the window's end; a change on a stream quiet for a window goes at
    /// once, so a lone drain is never delayed. Default 20; at most 250,
    /// because it is spent inside the 3 s leave budget.
    pub coalesce_window_ms: u64,
    /// Most full snapshots served at once; the rest are told when to retry,
    /// so 5,000 agents returning together cannot stampede the arbiter.
    /// Default 64; at least 1.
    pub max_concurrent_snapshots: u32,
    /// Bytes queued for one agent (its connection's send window): when an
    /// agent reads slower than changes arrive, its sends stop completing and
    /// the stall timeout cuts it, so a slow agent never holds more arbiter
    /// memory than this. Default 8 MiB (8388608), more than two snapshots of
    /// a 100,000-endpoint service.
    pub max_queued_bytes_per_agent: u64,
    /// A send to an agent that has not completed after this long gets the
    /// agent disconnected; it resumes by delta or snapshot when it returns.
    /// Default 10000 ms.
    pub stall_timeout_ms: u64,
    /// What an agent refused a snapshot (the concurrency bound was reached)
    /// is told to wait before asking again, in ms; agents add their own
    /// jitter. Default 250.
    pub snapshot_retry_ms: u64,
    /// A revision sent to an agent and not acknowledged this long after the
    /// send completed is sent again, in ms: as deltas from the agent's
    /// acknowledged revision while the delta log reaches back to it, else
    /// as a snapshot (within `max_concurrent_snapshots`). The first four
    /// re-sends of the same gap each wait this long; each later one waits
    /// twice as long as the one before, up to 8 times this; the count
    /// resets once the agent's ack catches up. This is what heals a lost
    /// update or an agent's failed apply when the service does not change
    /// again. Default 500: well above a healthy ack's round trip, and four
    /// lost sends in a row (re-sends at 0.5, 1, 1.5 and 2 s, plus the sweep
    /// interval) still land inside the 3 s leave budget.
    /// From 100 to 60000.
    pub resend_after_ms: u64,
}

impl Default for DistributionConfig {
    fn default() -> Self {
        Self {
            coalesce_window_ms: 20,
            max_concurrent_snapshots: 64,
            max_queued_bytes_per_agent: 8 * 1024 * 1024,
            stall_timeout_ms: 10_000,
            snapshot_retry_ms: 250,
            resend_after_ms: 500,
        }
    }
}

/// `[store]`: the arbiter's durable storage (redb in `data_dir`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Audit log entries kept; the oldest are deleted beyond this. Default
    /// 1,000,000 (days of a large deploy's changes).
    pub audit_max_entries: u64,
    /// Log entries between catalog snapshots; a snapshot lets the log be
    /// truncated and bounds restart time. Default 50,000.
    pub compact_every: u64,
    /// How often the arbiter purges records no lease covers once their
    /// retention passed, in ms. Default 60000.
    pub purge_interval_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            audit_max_entries: 1_000_000,
            compact_every: 50_000,
            purge_interval_ms: 60_000,
        }
    }
}

/// `[raft]`: replication of the catalog over a Raft group of 1, 3 or 5
/// replicas (openraft). One replica is a group of one: it elects itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    /// This replica's id in the group, at least 1; stable for its life (a
    /// wiped replica that rejoins keeps it). Default 1.
    pub id: u64,
    /// `[[raft.replicas]]`: the group as it starts, the same list on every
    /// replica. Empty (the default) means this replica alone, at `listen`.
    /// Only the lowest id initializes a new group; later changes go through
    /// `rollcall cluster add|remove`, not this list.
    pub replicas: Vec<ReplicaEntry>,
    /// How often the leader sends heartbeats, in ms; also how long one
    /// AppendEntries may take before openraft retries it. Default 100.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in
    /// [election_min_ms, election_max_ms) starts an election. Default 300.
    pub election_min_ms: u64,
    /// Upper end of the election timeout, in ms; also how long a follower
    /// that heard a leader refuses to vote for another (openraft's leader
    /// lease). Default 600: a dead leader is replaced in about 1 s.
    pub election_max_ms: u64,
    /// A write not committed within this long is refused as unavailable
    /// (the group has no quorum); the agent keeps it pending. Default 3000.
    pub write_timeout_ms: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            id: 1,
            replicas: Vec::new(),
            heartbeat_ms: 100,
            election_min_ms: 300,
            election_max_ms: 600,
            write_timeout_ms: 3_000,
        }
    }
}

/// One `[[raft.replicas]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaEntry {
    /// The replica's id (`raft.id` in its own config).
    pub id: u64,
    /// Its QUIC `host:port` (its `listen`), where peers and agents reach it.
    pub addr: String,
}

impl RaftConfig {
    /// The starting group: `replicas`, or this replica alone at `listen`.
    pub fn members(&self, listen: SocketAddr) -> Vec<ReplicaEntry> {
        if self.replicas.is_empty() {
            vec![ReplicaEntry {
                id: self.id,
                addr: listen.to_string(),
            }]
        } else {
            self.replicas.clone()
        }
    }
}

impl ConfigFile for ArbiterConfig {
    /// Checks every rule; the first broken one is returned, naming its full
    /// dotted field path (`arbiter.…`).
    fn validate(&self) -> Result<(), ConfigError> {
        rules::dns_label("arbiter.name", &self.name)?;
        rules::dns_label("arbiter.region", &self.region)?;
        if self.admin == self.listen {
            return Err(ConfigError::invalid(
                "arbiter.admin",
                self.admin,
                "must differ from listen",
            ));
        }
        let (least, most) = UDP_RECV_BUFFER_BYTES_RANGE;
        let buffer = self.udp_recv_buffer_bytes;
        if buffer != 0 && !(least..=most).contains(&buffer) {
            return Err(ConfigError::invalid(
                "arbiter.udp_recv_buffer_bytes",
                buffer,
                format!("must be 0 (the kernel's default) or from {least} to {most}"),
            ));
        }
        rules::non_empty_path("arbiter.data_dir", &self.data_dir)?;
        self.http_limits.validate("arbiter.http_limits")?;
        self.limits.validate("arbiter.limits")?;
        self.validate_lease()?;
        self.validate_guard()?;
        self.validate_catalog()?;
        rules::at_least(
            "arbiter.delta_log.max_entries",
            self.delta_log.max_entries,
            1,
        )?;
        rules::at_least(
            "arbiter.delta_log.max_revision_span",
            self.delta_log.max_revision_span,
            1,
        )?;
        self.validate_distribution()?;
        rules::at_least(
            "arbiter.store.audit_max_entries",
            self.store.audit_max_entries,
            1,
        )?;
        rules::at_least("arbiter.store.compact_every", self.store.compact_every, 1)?;
        rules::at_least(
            "arbiter.store.purge_interval_ms",
            self.store.purge_interval_ms,
            1_000,
        )?;
        self.validate_raft()?;
        if let Some(tls) = &self.tls {
            tls.validate("arbiter.tls")?;
        }
        validate_grants("arbiter", &self.controllers, &self.watch_rules)?;
        validate_registration_rules("arbiter", &self.registration_rules)?;
        validate_node_zones("arbiter", &self.node_zones)
    }
}

impl ArbiterConfig {
    fn validate_raft(&self) -> Result<(), ConfigError> {
        let raft = &self.raft;
        rules::at_least("arbiter.raft.id", raft.id, 1)?;
        for (i, r) in raft.replicas.iter().enumerate() {
            rules::at_least(&format!("arbiter.raft.replicas[{i}].id"), r.id, 1)?;
            if raft.replicas[..i].iter().any(|o| o.id == r.id) {
                return Err(ConfigError::invalid(
                    format!("arbiter.raft.replicas[{i}].id"),
                    r.id,
                    "is listed twice",
                ));
            }
            let port_ok = r
                .addr
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok {
                return Err(ConfigError::invalid(
                    format!("arbiter.raft.replicas[{i}].addr"),
                    format!("{:?}", r.addr),
                    "must be host:port",
                ));
            }
        }
        if !raft.replicas.is_empty() && !raft.replicas.iter().any(|r| r.id == raft.id) {
            return Err(ConfigError::invalid(
                "arbiter.raft.replicas",
                format!("{} entries", raft.replicas.len()),
                format!("must list this replica (raft.id = {})", raft.id),
            ));
        }
        rules::at_least("arbiter.raft.heartbeat_ms", raft.heartbeat_ms, 10)?;
        if raft.election_min_ms <= raft.heartbeat_ms {
            return Err(ConfigError::invalid(
                "arbiter.raft.election_min_ms",
                raft.election_min_ms,
                format!("must be above heartbeat_ms = {}", raft.heartbeat_ms),
            ));
        }
        if raft.election_max_ms <= raft.election_min_ms {
            return Err(ConfigError::invalid(
                "arbiter.raft.election_max_ms",
                raft.election_max_ms,
                format!("must be above election_min_ms = {}", raft.election_min_ms),
            ));
        }
        if raft.write_timeout_ms < raft.election_max_ms {
            return Err(ConfigError::invalid(
                "arbiter.raft.write_timeout_ms",
                raft.write_timeout_ms,
                format!(
                    "must be at least election_max_ms = {}: a write must outlive one election",
                    raft.election_max_ms
                ),
            ));
        }
        Ok(())
    }

    fn validate_lease(&self) -> Result<(), ConfigError> {
        let lease = &self.lease;
        rules::at_least("arbiter.lease.ttl_ms", lease.ttl_ms, RENEWALS_PER_TTL)?;
        rules::at_least(
            "arbiter.lease.sweep_interval_ms",
            lease.sweep_interval_ms,
            1,
        )?;
        if lease.sweep_interval_ms >= lease.ttl_ms {
            return Err(ConfigError::invalid(
                "arbiter.lease.sweep_interval_ms",
                lease.sweep_interval_ms,
                format!("must be below ttl_ms = {}", lease.ttl_ms),
            ));
        }
        rules::at_least("arbiter.lease.silence_ms", lease.silence_ms, 1)?;
        rules::between(
            "arbiter.lease.probe_timeout_ms",
            lease.probe_timeout_ms,
            50,
            (lease.ttl_ms / 2).max(50),
        )?;
        rules::between(
            "arbiter.lease.witness_wait_ms",
            lease.witness_wait_ms,
            0,
            60_000,
        )?;
        if lease.silence_ms >= lease.ttl_ms {
            return Err(ConfigError::invalid(
                "arbiter.lease.silence_ms",
                lease.silence_ms,
                format!(
                    "must be below ttl_ms = {}: otherwise leases expire before a lost quorum \
                     is noticed",
                    lease.ttl_ms
                ),
            ));
        }
        Ok(())
    }

    fn validate_guard(&self) -> Result<(), ConfigError> {
        let guard = &self.guard;
        if !(guard.max_share > 0.0 && guard.max_share <= 1.0) {
            return Err(ConfigError::invalid(
                "arbiter.guard.max_share",
                guard.max_share,
                "must be above 0.0 and at most 1.0",
            ));
        }
        rules::at_least("arbiter.guard.window_ms", guard.window_ms, 1)?;
        rules::at_least("arbiter.guard.max_hold_ms", guard.max_hold_ms, 1)
    }

    fn validate_catalog(&self) -> Result<(), ConfigError> {
        let catalog = &self.catalog;
        for (i, key) in catalog.allowed_label_keys.iter().enumerate() {
            let field = format!("arbiter.catalog.allowed_label_keys[{i}]");
            rules::dns_label(&field, key)?;
            if catalog.allowed_label_keys[..i].contains(key) {
                return Err(ConfigError::invalid(
                    field,
                    format!("{key:?}"),
                    "is listed twice",
                ));
            }
        }
        rules::at_least("arbiter.catalog.max_labels", catalog.max_labels, 1)?;
        if !(1..=MAX_SHARDS).contains(&catalog.shards) {
            return Err(ConfigError::invalid(
                "arbiter.catalog.shards",
                catalog.shards,
                format!("must be 1 to {MAX_SHARDS}"),
            ));
        }
        Ok(())
    }

    fn validate_distribution(&self) -> Result<(), ConfigError> {
        let distribution = &self.distribution;
        if distribution.coalesce_window_ms > MAX_COALESCE_WINDOW_MS {
            return Err(ConfigError::invalid(
                "arbiter.distribution.coalesce_window_ms",
                distribution.coalesce_window_ms,
                format!("must be at most {MAX_COALESCE_WINDOW_MS}"),
            ));
        }
        rules::at_least(
            "arbiter.distribution.max_concurrent_snapshots",
            distribution.max_concurrent_snapshots,
            1,
        )?;
        rules::at_least(
            "arbiter.distribution.max_queued_bytes_per_agent",
            distribution.max_queued_bytes_per_agent,
            64 * 1024,
        )?;
        rules::at_least(
            "arbiter.distribution.stall_timeout_ms",
            distribution.stall_timeout_ms,
            100,
        )?;
        rules::at_least(
            "arbiter.distribution.snapshot_retry_ms",
            distribution.snapshot_retry_ms,
            1,
        )?;
        let (min, max) = RESEND_AFTER_MS_RANGE;
        rules::at_least(
            "arbiter.distribution.resend_after_ms",
            distribution.resend_after_ms,
            min,
        )?;
        if distribution.resend_after_ms > max {
            return Err(ConfigError::invalid(
                "arbiter.distribution.resend_after_ms",
                distribution.resend_after_ms,
                format!("must be at most {max}"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
