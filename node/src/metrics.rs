//! The agent's Prometheus metrics (R11), names prefixed `rollcall_agent_`,
//! served at `GET /metrics` on the agent's HTTP address. Counters move as
//! things happen; per-service gauges (snapshot age, watch lag) are set at
//! each scrape from the agent's state.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use rollcall_leases::{InstanceId, Liveness, ServiceKey};

use crate::failover::Regions;
use crate::sync::SyncStats;

/// What the agent's state machine shows at a scrape.
pub struct Scrape<'a> {
    /// The catalog sync's counters.
    pub sync: SyncStats,
    /// READY ↔ UNHEALTHY changes of local instances so far.
    pub health_flaps: u64,
    /// Sessions started after the first, so far.
    pub reconnects: u64,
    /// Every followed service: revisions behind, and when it was last
    /// known current (`None` while it is).
    pub subscriptions: Vec<(ServiceKey, u64, Option<u64>)>,
    /// Local instances' liveness.
    pub liveness: Vec<(InstanceId, Liveness)>,
    /// The regions held.
    pub regions: &'a Regions,
}

/// The counters of the last scrape, so the next adds only what is new.
#[derive(Debug, Default)]
pub struct Reported {
    sync: SyncStats,
    health_flaps: u64,
    reconnects: u64,
}

/// Label of per-service series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabel {
    /// `namespace/service/port_name`.
    pub service: String,
}

/// Label of cache discards.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `other_catalog` or `ahead_of_arbiter`.
    pub reason: String,
}

/// Label of per-instance series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabel {
    /// The instance id.
    pub instance: String,
}

/// Label of DNS answers.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RcodeLabel {
    /// `noerror`, `nxdomain`, `servfail`, `refused`.
    pub rcode: String,
}

/// Label of failover decisions: the service and the region it went to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabel {
    /// `namespace/service/port_name`.
    pub service: String,
    /// The region the connection or answer went to.
    pub region: String,
}

/// Label of refusals: the service and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// `namespace/service/port_name`.
    pub service: String,
    /// `failover::Refusal::as_str`.
    pub reason: String,
}

/// Label of answers served past their maximum age.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BehaviourLabel {
    /// The service's staleness behaviour: `keep` or `degrade`.
    pub behaviour: String,
}

/// Label of per-region series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegionLabel {
    /// The region.
    pub region: String,
}

/// Every agent metric.
pub struct AgentMetrics {
    registry: Registry,
    /// Probe latency, seconds.
    pub probe_latency: Histogram,
    /// Time probes waited for the per-agent concurrency cap, seconds.
    pub probe_queue_wait: Histogram,
    /// READY ↔ UNHEALTHY changes of local instances.
    pub health_flaps: Counter,
    /// Liveness of local instances with a liveness check: 1 passing,
    /// 0 failing (for supervisors; never used to route).
    pub liveness: Family<InstanceLabel, Gauge>,
    /// Age of each service's copy, seconds (0 while confirmed).
    pub snapshot_age: Family<ServiceLabel, Gauge>,
    /// Revisions each service's copy trails the arbiter by (0 while confirmed).
    pub watch_lag: Family<ServiceLabel, Gauge>,
    /// Gaps found in a service's revision chain.
    pub revision_gaps: Counter,
    /// Digest mismatches after applying a delta.
    pub digest_mismatches: Counter,
    /// Sessions to the arbiter started after the first.
    pub reconnects: Counter,
    /// Full snapshots applied (fallbacks from deltas).
    pub snapshots_applied: Counter,
    /// Cached views dropped, by reason: corrupt files at start, views of
    /// another catalog or ahead of the arbiter at a session start.
    pub cache_discarded: Family<ReasonLabel, Counter>,
    /// Connections or queries answered "no backend".
    pub no_backend: Family<ServiceLabel, Counter>,
    /// Local ejections.
    pub ejections: Family<ServiceLabel, Counter>,
    /// Failed connects to endpoints.
    pub connect_failures: Counter,
    /// Failed connects to endpoints the catalog then took out of READY
    /// within 30 s: the view was stale.
    pub connect_failures_to_stale: Counter,
    /// Connections made to endpoints that were not READY at the revision
    /// held (protected or panic mode).
    pub connections_to_not_ready: Counter,
    /// Proxied connections.
    pub proxied_connections: Counter,
    /// Answers served from a copy past its maximum age.
    pub stale_served: Family<BehaviourLabel, Counter>,
    /// Proxied connections that picked an endpoint of a degraded copy.
    pub degraded_picks: Counter,
    /// Answers refused because the copy was past its maximum age.
    pub stale_refused: Counter,
    /// DNS answers by response code.
    pub dns_answers: Family<RcodeLabel, Counter>,
    /// Connections and answers sent to another region (R9).
    pub failover_decisions: Family<FailoverLabel, Counter>,
    /// Connections and answers with no usable local endpoint that did not
    /// move to another region, by reason.
    pub failover_refusals: Family<RefusalLabel, Counter>,
    /// Connections this agent's ingress gateway forwarded from other regions.
    pub ingress_forwarded: Family<ServiceLabel, Counter>,
    /// Connections this agent's ingress gateway refused, by reason.
    pub ingress_refused: Family<RefusalLabel, Counter>,
    /// Age of each other region's view as this agent holds it, seconds.
    pub remote_view_age: Family<RegionLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Highest home revision of the policies held, per home region.
    pub policy_revision: Family<RegionLabel, Gauge>,
    /// Seconds until this agent's certificate and each CA it trusts expire
    /// (set at each scrape).
    pub certificate_expiry: Family<rollcall_leases::server::metrics::CertificateLabel, Gauge>,
    /// The services named in per-service labels so far, at most
    /// `max_services` (`agent.metrics_max_services`).
    named: std::sync::Mutex<std::collections::HashSet<String>>,
    max_services: std::sync::atomic::AtomicUsize,
    /// Gossip datagrams dropped, by reason (`rollcall_gossip_dropped_total`).
    pub gossip_dropped: Family<ReasonLabel, Counter>,
    /// Where the gossip member publishes its drop counts, once it runs;
    /// with the counts already exported.
    gossip: std::sync::OnceLock<(
        std::sync::Arc<rollcall_gossip::SharedDrops>,
        std::sync::Mutex<rollcall_gossip::Drops>,
    )>,
}

/// The label value that stands for every service past the cap.
pub const OTHER_SERVICES: &str = "_other";

/// The label value of an ingress refusal that names no service: a
/// connection over `[ingress] max_connections` (refused before its
/// preamble is read) or one whose preamble does not parse. Service names
/// cannot hold `_`, so it never stands for a real service.
pub const NO_SERVICE: &str = "_none";

impl AgentMetrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("rollcall_agent");
        let m = AgentMetrics {
            registry: Registry::default(),
            probe_latency: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            probe_queue_wait: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            health_flaps: Counter::default(),
            liveness: Family::default(),
            snapshot_age: Family::default(),
            watch_lag: Family::default(),
            revision_gaps: Counter::default(),
            digest_mismatches: Counter::default(),
            reconnects: Counter::default(),
            snapshots_applied: Counter::default(),
            cache_discarded: Family::default(),
            named: Default::default(),
            gossip_dropped: Family::default(),
            gossip: std::sync::OnceLock::new(),
            max_services: std::sync::atomic::AtomicUsize::new(500),
            no_backend: Family::default(),
            ejections: Family::default(),
            connect_failures: Counter::default(),
            connect_failures_to_stale: Counter::default(),
            connections_to_not_ready: Counter::default(),
            proxied_connections: Counter::default(),
            stale_served: Family::default(),
            degraded_picks: Counter::default(),
            stale_refused: Counter::default(),
            dns_answers: Family::default(),
            failover_decisions: Family::default(),
            failover_refusals: Family::default(),
            ingress_forwarded: Family::default(),
            ingress_refused: Family::default(),
            remote_view_age: Family::default(),
            policy_revision: Family::default(),
            certificate_expiry: Family::default(),
        };
        registry.register(
            "probe_latency_seconds",
            "Latency of health probes",
            m.probe_latency.clone(),
        );
        registry.register(
            "probe_queue_wait_seconds",
            "Time probes waited for the per-agent concurrency cap",
            m.probe_queue_wait.clone(),
        );
        registry.register(
            "health_flaps",
            "READY/UNHEALTHY changes of local instances",
            m.health_flaps.clone(),
        );
        registry.register(
            "liveness",
            "Liveness of local instances: 1 passing, 0 failing (never routes)",
            m.liveness.clone(),
        );
        registry.register(
            "snapshot_age_seconds",
            "Age of each service's copy (0 while confirmed by the arbiter)",
            m.snapshot_age.clone(),
        );
        registry.register(
            "watch_lag_revisions",
            "Revisions each service's copy trails the arbiter by",
            m.watch_lag.clone(),
        );
        registry.register(
            "revision_gaps",
            "Gaps found in a service's revision chain",
            m.revision_gaps.clone(),
        );
        registry.register(
            "digest_mismatches",
            "Digest mismatches after applying a delta",
            m.digest_mismatches.clone(),
        );
        registry.register(
            "reconnects",
            "Arbiter sessions started after the first",
            m.reconnects.clone(),
        );
        registry.register(
            "cache_discarded",
            "Cached views dropped: corrupt files at start (reason corrupt, deleted and never served), and at an arbiter session's start views from another catalog (a rebuilt or restored arbiter group) or ahead of the arbiter's revision",
            m.cache_discarded.clone(),
        );
        registry.register(
            "snapshots_applied",
            "Full snapshots applied (fallbacks from deltas)",
            m.snapshots_applied.clone(),
        );
        registry.register(
            "no_backend",
            "Connections or queries answered with no backend",
            m.no_backend.clone(),
        );
        registry.register(
            "ejections",
            "Endpoints ejected locally after consecutive connect failures",
            m.ejections.clone(),
        );
        registry.register(
            "connect_failures",
            "Failed connects to endpoints",
            m.connect_failures.clone(),
        );
        registry.register(
            "connect_failures_to_stale",
            "Failed connects to endpoints the catalog took out of READY within 30 s after",
            m.connect_failures_to_stale.clone(),
        );
        registry.register(
            "connections_to_not_ready",
            "Connections to endpoints not READY at the revision held (protected or panic mode)",
            m.connections_to_not_ready.clone(),
        );
        registry.register(
            "proxied_connections",
            "Connections forwarded by the proxy",
            m.proxied_connections.clone(),
        );
        registry.register(
            "stale_served",
            "Answers served from a copy past its maximum age, by staleness behaviour (keep, degrade)",
            m.stale_served.clone(),
        );
        registry.register(
            "degraded_picks",
            "Proxied connections to an endpoint chosen from a degraded copy",
            m.degraded_picks.clone(),
        );
        registry.register(
            "stale_refused",
            "Answers refused because the copy was past its maximum age",
            m.stale_refused.clone(),
        );
        registry.register(
            "dns_answers",
            "DNS answers by response code",
            m.dns_answers.clone(),
        );
        registry.register(
            "failover_decisions",
            "Connections and answers sent to another region's ingress, by service and region",
            m.failover_decisions.clone(),
        );
        registry.register(
            "failover_refusals",
            "Connections and answers with no usable local endpoint that did not fail over, by service and reason",
            m.failover_refusals.clone(),
        );
        registry.register(
            "ingress_forwarded",
            "Connections from other regions the ingress gateway forwarded to a local endpoint",
            m.ingress_forwarded.clone(),
        );
        registry.register(
            "ingress_refused",
            "Connections from other regions the ingress gateway refused, by reason",
            m.ingress_refused.clone(),
        );
        registry.register(
            "remote_view_age_seconds",
            "Age of each other region's summaries as this agent holds them",
            m.remote_view_age.clone(),
        );
        registry.register(
            "policy_revision",
            "Highest home revision of the service policies this agent holds, per home region",
            m.policy_revision.clone(),
        );
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until the certificate this agent presents to the arbiter (certificate=leaf) and each CA it trusts (certificate=ca) expire; negative once expired",
            m.certificate_expiry.clone(),
        );
        root.sub_registry_with_prefix("rollcall_gossip").register(
            "dropped",
            "Incoming gossip datagrams dropped, by reason: too_large, too_short, unknown_key (sealed with a key this node does not hold), forged (the seal does not verify), replay (authentic, but opened before: a resent or duplicated datagram), refused (authentic, but foca refused it)",
            m.gossip_dropped.clone(),
        );
        AgentMetrics {
            registry: root,
            ..m
        }
    }
    /// Exports the drop counts of this agent's gossip member from now on.
    pub fn watch_gossip(&self, drops: std::sync::Arc<rollcall_gossip::SharedDrops>) {
        let _ = self.gossip.set((drops, Default::default()));
    }

    /// Brings `rollcall_gossip_dropped_total` up to the member's counts.
    fn refresh_gossip(&self) {
        let Some((source, exported)) = self.gossip.get() else {
            return;
        };
        let now = source.get();
        let mut exported = exported.lock().unwrap_or_else(|p| p.into_inner());
        let before = *exported;
        for (reason, now, then) in [
            ("too_large", now.open.too_large, before.open.too_large),
            ("too_short", now.open.too_short, before.open.too_short),
            ("unknown_key", now.open.unknown_key, before.open.unknown_key),
            ("forged", now.open.forged, before.open.forged),
            ("replay", now.open.replay, before.open.replay),
            ("refused", now.refused, before.refused),
        ] {
            self.gossip_dropped
                .get_or_create(&ReasonLabel {
                    reason: reason.to_owned(),
                })
                .inc_by(now.saturating_sub(then));
        }
        *exported = now;
    }

    /// Counts the corrupt cache files found (and deleted) at start as
    /// `cache_discarded{reason="corrupt"}`.
    pub fn cache_corrupt_at_start(&self, files: u64) {
        self.cache_discarded
            .get_or_create(&ReasonLabel {
                reason: "corrupt".to_owned(),
            })
            .inc_by(files);
    }

    /// Caps the distinct services per-service labels name
    /// (`agent.metrics_max_services`).
    pub fn set_max_services(&self, max: usize) {
        self.max_services
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// The label of `service` in per-service series: its name while fewer
    /// than `metrics_max_services` services were named, or a name already
    /// named; [`OTHER_SERVICES`] past that, so lookups of random names (or
    /// preambles naming them) cannot grow the metrics without bound.
    pub fn service_label(&self, service: &str) -> ServiceLabel {
        ServiceLabel {
            service: self.service_name(service),
        }
    }

    /// Counts an ingress connection refused before any service was named
    /// (`service="_none"`), for `reason`.
    pub fn ingress_refused_unnamed(&self, reason: &str) {
        self.ingress_refused
            .get_or_create(&RefusalLabel {
                service: NO_SERVICE.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// [`service_label`](Self::service_label)'s value.
    pub fn service_name(&self, service: &str) -> String {
        let mut named = self.named.lock().unwrap_or_else(|p| p.into_inner());
        if named.contains(service) {
            return service.to_owned();
        }
        if named.len() < self.max_services.load(std::sync::atomic::Ordering::Relaxed) {
            named.insert(service.to_owned());
            return service.to_owned();
        }
        OTHER_SERVICES.to_owned()
    }

    /// Moves what the agent's state machine shows at a scrape into the
    /// metrics: counters grow by what they grew since `reported`, gauges
    /// are set anew.
    pub fn refresh(&self, scrape: Scrape<'_>, reported: &mut Reported, now: u64) {
        self.refresh_gossip();
        let (stats, before) = (&scrape.sync, &reported.sync);
        self.revision_gaps.inc_by(stats.gaps - before.gaps);
        self.digest_mismatches
            .inc_by(stats.digest_mismatches - before.digest_mismatches);
        self.snapshots_applied
            .inc_by(stats.snapshots_applied - before.snapshots_applied);
        for (reason, now, then) in [
            (
                crate::sync::Discard::OtherCatalog,
                stats.discarded_other_catalog,
                before.discarded_other_catalog,
            ),
            (
                crate::sync::Discard::AheadOfArbiter,
                stats.discarded_ahead,
                before.discarded_ahead,
            ),
        ] {
            self.cache_discarded
                .get_or_create(&ReasonLabel {
                    reason: reason.as_str().to_string(),
                })
                .inc_by(now - then);
        }
        self.health_flaps
            .inc_by(scrape.health_flaps - reported.health_flaps);
        self.reconnects
            .inc_by(scrape.reconnects - reported.reconnects);
        *reported = Reported {
            sync: scrape.sync.clone(),
            health_flaps: scrape.health_flaps,
            reconnects: scrape.reconnects,
        };
        self.snapshot_age.clear();
        self.watch_lag.clear();
        for (service, lag, last) in scrape.subscriptions {
            let label = self.service_label(&service.to_string());
            if label.service == OTHER_SERVICES {
                // A gauge of many services in one series means nothing.
                continue;
            }
            let age_ms = last.map_or(0, |t| now.saturating_sub(t));
            self.snapshot_age
                .get_or_create(&label)
                .set((age_ms / 1000) as i64);
            self.watch_lag.get_or_create(&label).set(lag as i64);
        }
        for (instance, liveness) in scrape.liveness {
            if liveness == Liveness::Unknown {
                continue;
            }
            self.liveness
                .get_or_create(&InstanceLabel {
                    instance: instance.to_string(),
                })
                .set(i64::from(liveness == Liveness::Passing));
        }
        self.remote_view_age.clear();
        for region in scrape.regions.status(now) {
            self.remote_view_age
                .get_or_create(&RegionLabel {
                    region: region.region.to_string(),
                })
                .set(region.age_ms as f64 / 1000.0);
        }
        self.policy_revision.clear();
        for p in scrape.regions.policies() {
            let gauge = self.policy_revision.get_or_create(&RegionLabel {
                region: p.policy.home_region().to_string(),
            });
            gauge.set(gauge.get().max(p.home_revision.get() as i64));
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// One more answer with this DNS response code.
    pub fn dns_answer(&self, rcode: &str) {
        self.dns_answers
            .get_or_create(&RcodeLabel {
                rcode: rcode.to_owned(),
            })
            .inc();
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37, item 6: an ingress refusal that names no service is
    /// labelled `_none`, not `service=""`, and takes no per-service slot.
    #[test]
    fn refusals_without_a_service_are_labelled_none() {
        let metrics = AgentMetrics::new();
        metrics.ingress_refused_unnamed("too_many_connections");
        metrics.ingress_refused_unnamed("bad_preamble");
        let text = metrics.render();
        for reason in ["too_many_connections", "bad_preamble"] {
            assert!(
                text.contains(&format!(
                    "rollcall_agent_ingress_refused_total{{service=\"_none\",reason=\"{reason}\"}} 1"
                )),
                "{text}"
            );
        }
        assert!(!text.contains("service=\"\""), "{text}");
        assert!(metrics.named.lock().unwrap().is_empty());
    }
}
