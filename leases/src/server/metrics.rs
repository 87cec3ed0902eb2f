//! The arbiter's Prometheus metrics (R11), names prefixed
//! `rollcall_arbiter_`. Counters and the commit histogram are updated by the
//! core as things happen; gauges are set from the core's state at each scrape.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label of per-service series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabel {
    /// `namespace/service/port_name`.
    pub service: String,
}

/// Label of per-agent series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    /// The agent's node.
    pub node: String,
}

/// Label of per-replica series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReplicaLabel {
    /// The replica's Raft id.
    pub replica: String,
}

/// Label of per-shard series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    /// The shard's number.
    pub shard: String,
}

/// Label of series split by what kind of update was sent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `delta` or `snapshot` (resends), a `RejectKind` (refusals).
    pub kind: &'static str,
}

/// Label of the limit-hit counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `Limit::as_str`.
    pub limit: &'static str,
}

/// Label of a certificate's expiry gauge (the arbiter's, the agent's and
/// the bridge's `…_certificate_expiry_seconds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabel {
    /// `leaf` (the process's own certificate) or `ca` (one of its bundle).
    pub certificate: &'static str,
    /// The certificate's serial number, hex.
    pub serial: String,
}

/// Sets `gauges` to the seconds from `now_unix_s` until each certificate
/// of `status` expires (negative once it has): one series for the leaf,
/// one per CA of the bundle; series of certificates no longer in use go.
pub fn set_certificate_expiry(
    gauges: &Family<CertificateLabel, Gauge>,
    status: &crate::tls::TlsStatus,
    now_unix_s: i64,
) {
    gauges.clear();
    let certificates =
        std::iter::once(("leaf", &status.leaf)).chain(status.cas.iter().map(|ca| ("ca", ca)));
    for (certificate, cert) in certificates {
        gauges
            .get_or_create(&CertificateLabel {
                certificate,
                serial: cert.serial.clone(),
            })
            .set(cert.expires_in_s(now_unix_s));
    }
}

/// Every arbiter metric.
pub struct Metrics {
    registry: Registry,
    /// Registrations committed.
    pub registrations: Counter,
    /// Lease renewals handled (in memory, not logged).
    pub renewals: Counter,
    /// Changes committed.
    pub commits: Counter,
    /// Requests rejected.
    pub rejections: Counter,
    /// Requests rejected, by kind (`RejectKind::as_str`), and refused
    /// Hellos (`hello`) and watches (`watch`).
    pub refusals: Family<KindLabel, Counter>,
    /// Time from proposing a write on the leader to its being committed by
    /// a quorum and applied, in seconds.
    pub commit_latency: Histogram,
    /// Commands per Raft entry (group commit).
    pub batch_size: Histogram,
    /// READY endpoints per service.
    pub ready: Family<ServiceLabel, Gauge>,
    /// Largest ack lag of each agent, in revisions.
    pub ack_lag: Family<NodeLabel, Gauge>,
    /// Full snapshots sent (fallbacks from deltas).
    pub snapshots_sent: Gauge,
    /// Snapshot requests told to retry.
    pub snapshots_refused: Gauge,
    /// Snapshots in flight now.
    pub snapshots_in_flight: Gauge,
    /// Most snapshots in flight at once since start.
    pub snapshots_in_flight_max: Gauge,
    /// Agents connected now.
    pub connected_agents: Gauge,
    /// Heap of the sessions' state (a lower bound), bytes.
    pub session_state_bytes: Gauge,
    /// Heap of the subscriptions' state (a lower bound), bytes.
    pub subscription_state_bytes: Gauge,
    /// Leases whose expiry the mass-expiry guard holds (alert when above 0).
    pub held_leases: Gauge,
    /// Leases past their deadline whose witnesses see the node alive.
    pub leases_held_by_witnesses: Gauge,
    /// Leases held.
    pub leases: Gauge,
    /// The shard's revision.
    pub revision: Gauge,
    /// Agents disconnected for stalling.
    pub stalled_agents: Gauge,
    /// Unacknowledged services sent again, by kind (`delta`, `snapshot`);
    /// brought up to the distributor's count at each scrape.
    pub resends: Family<KindLabel, Counter>,
    /// Gossip down reports about nodes whose session was still alive (a
    /// partition inside a zone): nothing was removed.
    pub down_reports_ignored: Counter,
    /// Single reporters' down reports an asked witness saw alive (vetoed).
    pub down_reports_uncorroborated: Counter,
    /// Probes sent down this replica's sessions (R4).
    pub probes_sent: Counter,
    /// Probes answered on this replica's sessions.
    pub probes_answered: Counter,
    /// Per shard (every shard's group on this replica, shard 0 too): its
    /// revision, its Raft term, its leader's replica id (0: none known),
    /// 1 when this replica leads it, and the last log index applied here.
    pub shard_revision: Family<ShardLabel, Gauge>,
    /// See `shard_revision`.
    pub shard_term: Family<ShardLabel, Gauge>,
    /// See `shard_revision`.
    pub shard_leader: Family<ShardLabel, Gauge>,
    /// See `shard_revision`.
    pub shard_is_leader: Family<ShardLabel, Gauge>,
    /// See `shard_revision`.
    pub shard_applied_index: Family<ShardLabel, Gauge>,
    /// The Raft term this replica knows.
    pub raft_term: Gauge,
    /// The leader's replica id (0: none known).
    pub raft_leader: Gauge,
    /// 1 on the leader, else 0.
    pub raft_is_leader: Gauge,
    /// The last log index this replica holds.
    pub raft_last_log_index: Gauge,
    /// The last log index this replica applied (its commit index as far as
    /// it has acted on it).
    pub raft_applied_index: Gauge,
    /// On the leader: how many log entries each replica trails.
    pub raft_apply_lag: Family<ReplicaLabel, Gauge>,
    /// Raft snapshots this replica built or installed since start.
    pub raft_snapshots: Counter,
    /// Regions messages (policies and remote summaries) sent to agents.
    pub regions_sent: Counter,
    /// Age of the remote view of each other region, seconds (refreshed at
    /// each scrape).
    pub remote_view_age: Family<RegionLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Whether each other region's view is within its freshness limit.
    pub remote_view_fresh: Family<RegionLabel, Gauge>,
    /// The highest home revision of the policies this catalog holds, per
    /// home region (this region's own and those replicated from others).
    pub policy_revision: Family<RegionLabel, Gauge>,
    /// Times a limit of `[limits]` was hit, by limit (`Limit::as_str`).
    pub limit_hits: Family<LimitLabel, Counter>,
    /// Seconds until this replica's certificate and each CA of its bundle
    /// expire (set at each scrape).
    pub certificate_expiry: Family<CertificateLabel, Gauge>,
}

/// A region.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegionLabel {
    /// Its name.
    pub region: String,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rollcall_arbiter");
        let m = Metrics {
            registrations: Counter::default(),
            renewals: Counter::default(),
            commits: Counter::default(),
            rejections: Counter::default(),
            refusals: Family::default(),
            commit_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            ready: Family::default(),
            ack_lag: Family::default(),
            snapshots_sent: Gauge::default(),
            snapshots_refused: Gauge::default(),
            snapshots_in_flight: Gauge::default(),
            snapshots_in_flight_max: Gauge::default(),
            connected_agents: Gauge::default(),
            session_state_bytes: Gauge::default(),
            subscription_state_bytes: Gauge::default(),
            held_leases: Gauge::default(),
            leases_held_by_witnesses: Gauge::default(),
            leases: Gauge::default(),
            revision: Gauge::default(),
            stalled_agents: Gauge::default(),
            resends: Family::default(),
            down_reports_ignored: Counter::default(),
            down_reports_uncorroborated: Counter::default(),
            probes_sent: Counter::default(),
            probes_answered: Counter::default(),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            shard_revision: Family::default(),
            shard_term: Family::default(),
            shard_leader: Family::default(),
            shard_is_leader: Family::default(),
            shard_applied_index: Family::default(),
            raft_term: Gauge::default(),
            raft_leader: Gauge::default(),
            raft_is_leader: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_apply_lag: Family::default(),
            raft_snapshots: Counter::default(),
            regions_sent: Counter::default(),
            remote_view_age: Family::default(),
            remote_view_fresh: Family::default(),
            policy_revision: Family::default(),
            limit_hits: Family::default(),
            certificate_expiry: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "registrations",
            "Instance registrations committed",
            m.registrations.clone(),
        );
        registry.register(
            "renewals",
            "Node lease renewals handled in memory",
            m.renewals.clone(),
        );
        registry.register("commits", "Catalog changes committed", m.commits.clone());
        registry.register(
            "rejections",
            "Requests the catalog or authorization refused",
            m.rejections.clone(),
        );
        registry.register(
            "refusals",
            "Requests the catalog or authorization refused, by kind: stale_generation, not_found, forbidden, invalid, unavailable; and refused Hellos (hello) and denied watches (watch)",
            m.refusals.clone(),
        );
        registry.register(
            "commit_latency_seconds",
            "From proposing a write on the leader to its commit by a quorum and apply",
            m.commit_latency.clone(),
        );
        registry.register(
            "ready_endpoints",
            "READY endpoints per service",
            m.ready.clone(),
        );
        registry.register(
            "agent_ack_lag_revisions",
            "How far each agent's acknowledgements trail its services",
            m.ack_lag.clone(),
        );
        registry.register(
            "snapshots_sent",
            "Full snapshots sent to agents (fallbacks from deltas)",
            m.snapshots_sent.clone(),
        );
        registry.register(
            "snapshots_refused",
            "Snapshot requests told to retry (concurrency bound)",
            m.snapshots_refused.clone(),
        );
        registry.register(
            "snapshots_in_flight",
            "Full snapshots being sent now",
            m.snapshots_in_flight.clone(),
        );
        registry.register(
            "snapshots_in_flight_max",
            "Most full snapshots in flight at once since start",
            m.snapshots_in_flight_max.clone(),
        );
        registry.register(
            "connected_agents",
            "Agent sessions connected",
            m.connected_agents.clone(),
        );
        registry.register(
            "session_state_bytes",
            "Heap the agents' sessions and their delivery state hold, counted from the arbiter's tables (a lower bound: no allocator overhead; QUIC connections not included)",
            m.session_state_bytes.clone(),
        );
        registry.register(
            "subscription_state_bytes",
            "Heap the agents' subscriptions hold, counted from the arbiter's tables (a lower bound)",
            m.subscription_state_bytes.clone(),
        );
        registry.register(
            "held_leases",
            "Lease expiries held by the mass-expiry guard (alert when above 0)",
            m.held_leases.clone(),
        );
        registry.register(
            "leases_held_by_witnesses",
            "Leases past their deadline kept because a witness agent sees the node alive: the arbiter may be cut off from it (alert when above 0)",
            m.leases_held_by_witnesses.clone(),
        );
        registry.register("leases", "Node leases held", m.leases.clone());
        registry.register(
            "revision",
            "The shard's current revision",
            m.revision.clone(),
        );
        registry.register(
            "stalled_agents",
            "Agents disconnected because a send stalled",
            m.stalled_agents.clone(),
        );
        registry.register(
            "resends",
            "Services sent again to an agent whose acknowledgement stayed behind, by kind (delta, snapshot)",
            m.resends.clone(),
        );
        registry.register(
            "down_reports_ignored",
            "Gossip down reports about nodes whose arbiter session was alive (partition inside a zone)",
            m.down_reports_ignored.clone(),
        );
        registry.register(
            "down_reports_uncorroborated",
            "Gossip down reports made by one node alone that a witness the arbiter asked saw alive: nothing removed",
            m.down_reports_uncorroborated.clone(),
        );
        registry.register(
            "probes_sent",
            "Probes sent down this replica's agent sessions (a gossip down report or a silent lease asked for the arbiter's own signal)",
            m.probes_sent.clone(),
        );
        registry.register(
            "probes_answered",
            "Probes answered on this replica's agent sessions",
            m.probes_answered.clone(),
        );
        registry.register(
            "shard_revision",
            "Each catalog shard's revision as applied here",
            m.shard_revision.clone(),
        );
        registry.register(
            "shard_term",
            "Each catalog shard's Raft term as this replica knows it",
            m.shard_term.clone(),
        );
        registry.register(
            "shard_leader",
            "Each catalog shard's leader's replica id (0: none known)",
            m.shard_leader.clone(),
        );
        registry.register(
            "shard_is_leader",
            "1 for each catalog shard this replica leads, else 0",
            m.shard_is_leader.clone(),
        );
        registry.register(
            "shard_applied_index",
            "Each catalog shard's last log index applied here",
            m.shard_applied_index.clone(),
        );
        registry.register(
            "raft_term",
            "The Raft term this replica knows",
            m.raft_term.clone(),
        );
        registry.register(
            "raft_leader",
            "The Raft leader's replica id (0: none known)",
            m.raft_leader.clone(),
        );
        registry.register(
            "raft_is_leader",
            "1 on the Raft leader, else 0",
            m.raft_is_leader.clone(),
        );
        registry.register(
            "raft_last_log_index",
            "The last Raft log index this replica holds",
            m.raft_last_log_index.clone(),
        );
        registry.register(
            "raft_applied_index",
            "The last Raft log index this replica applied",
            m.raft_applied_index.clone(),
        );
        registry.register(
            "raft_replica_lag_entries",
            "On the leader: log entries each replica trails",
            m.raft_apply_lag.clone(),
        );
        registry.register(
            "raft_snapshots",
            "Raft snapshots built or installed since start",
            m.raft_snapshots.clone(),
        );
        registry.register(
            "regions_sent",
            "Regions messages (policies, other regions' summaries) sent to agents",
            m.regions_sent.clone(),
        );
        registry.register(
            "remote_view_age_seconds",
            "How long ago the region bridge last confirmed each other region's view",
            m.remote_view_age.clone(),
        );
        registry.register(
            "remote_view_fresh",
            "1 while a region's view is within the bridge's summary_max_age_ms (a failover target), else 0",
            m.remote_view_fresh.clone(),
        );
        registry.register(
            "policy_revision",
            "Highest home revision of the service policies held, per home region",
            m.policy_revision.clone(),
        );
        registry.register(
            "limit_hits",
            "Times a [limits] limit was hit, by limit: handshakes_per_address, connections_per_identity, sessions_per_node (a session replaced), requests, session_messages, admin_calls, subscriptions_per_session, snapshots_per_session, propagation_waits_per_identity",
            m.limit_hits.clone(),
        );
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until this replica's certificate (certificate=leaf) and each CA it trusts (certificate=ca) expire; negative once expired",
            m.certificate_expiry.clone(),
        );
        #[cfg(feature = "fault-injection")]
        crate::fault::register_metrics(&mut registry);
        Metrics { registry, ..m }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

impl Metrics {
    /// Counts `hits` hits of `limit`.
    pub fn hit_by(&self, limit: crate::limits::Limit, hits: u64) {
        if hits > 0 {
            self.limit_hits
                .get_or_create(&LimitLabel {
                    limit: limit.as_str(),
                })
                .inc_by(hits);
        }
    }

    /// Counts one hit of `limit`; the total so far.
    pub fn hit(&self, limit: crate::limits::Limit) -> u64 {
        self.limit_hits
            .get_or_create(&LimitLabel {
                limit: limit.as_str(),
            })
            .inc()
            + 1
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
