//! The bridge's Prometheus metrics (R11), names prefixed
//! `rollcall_bridge_`, served at `GET /metrics` on `metrics_listen`. Per
//! peer region: how old its summaries are here (since it last confirmed
//! them), the sync lag of its last update (from its bridge reading its
//! arbiter to this region's arbiter holding the result, by the two hosts'
//! clocks), the highest home revision of its policies received, and what
//! this bridge sent it and received from it.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rollcall_leases::server::metrics::{set_certificate_expiry, CertificateLabel};
use rollcall_leases::tls::TlsStatus;
use rollcall_leases::Label;

/// A peer region.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegionLabel {
    /// Its name.
    pub region: String,
}

/// A peer region and the kind of update (`full` or `delta`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpdateLabel {
    /// The peer region.
    pub region: String,
    /// `full` or `delta`.
    pub kind: &'static str,
}

/// Every bridge metric.
pub struct Metrics {
    registry: Registry,
    /// Updates sent, per peer region and kind.
    pub updates_sent: Family<UpdateLabel, Counter>,
    /// Encoded bytes sent, per peer region (this region → that one).
    pub bytes_sent: Family<RegionLabel, Counter>,
    /// Updates received and accepted, per peer region and kind.
    pub updates_received: Family<UpdateLabel, Counter>,
    /// Encoded bytes received, per peer region (that region → this one).
    pub bytes_received: Family<RegionLabel, Counter>,
    /// Seconds since each peer region last confirmed its summaries (set at
    /// each scrape).
    pub summary_age: Family<RegionLabel, Gauge<f64, AtomicU64>>,
    /// From the peer's bridge reading its arbiter to this region's arbiter
    /// holding the update, seconds, for the last update of each peer.
    pub sync_lag: Family<RegionLabel, Gauge<f64, AtomicU64>>,
    /// Highest home revision of the policies received from each region.
    pub policy_revision: Family<RegionLabel, Gauge>,
    /// Peers connected to this bridge now.
    pub sessions_active: Gauge,
    /// Connections refused for their certificate.
    pub refused_peers: Counter,
    /// Connections closed for a malformed, oversized or invalid message.
    pub protocol_errors: Counter,
    /// Seconds until this bridge's certificate and each CA it trusts
    /// expire (set at each scrape).
    pub certificate_expiry: Family<CertificateLabel, Gauge>,
    heard: Mutex<HashMap<Label, Instant>>,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rollcall_bridge");
        let m = Metrics {
            registry: Registry::default(),
            updates_sent: Family::default(),
            bytes_sent: Family::default(),
            updates_received: Family::default(),
            bytes_received: Family::default(),
            summary_age: Family::default(),
            sync_lag: Family::default(),
            policy_revision: Family::default(),
            sessions_active: Gauge::default(),
            refused_peers: Counter::default(),
            protocol_errors: Counter::default(),
            certificate_expiry: Family::default(),
            heard: Mutex::new(HashMap::new()),
        };
        registry.register(
            "updates_sent",
            "Updates sent to each peer region, by kind (full, delta)",
            m.updates_sent.clone(),
        );
        registry.register(
            "sent_bytes",
            "Encoded bytes sent to each peer region",
            m.bytes_sent.clone(),
        );
        registry.register(
            "updates_received",
            "Updates received from each peer region and accepted, by kind",
            m.updates_received.clone(),
        );
        registry.register(
            "received_bytes",
            "Encoded bytes received from each peer region",
            m.bytes_received.clone(),
        );
        registry.register(
            "summary_age_seconds",
            "Seconds since each peer region last confirmed its summaries",
            m.summary_age.clone(),
        );
        registry.register(
            "sync_lag_seconds",
            "From the peer bridge reading its arbiter to this region's arbiter holding the update (two hosts' clocks), last update",
            m.sync_lag.clone(),
        );
        registry.register(
            "policy_revision",
            "Highest home revision of the policies received from each region",
            m.policy_revision.clone(),
        );
        registry.register(
            "sessions_active",
            "Peer bridges subscribed to this bridge now",
            m.sessions_active.clone(),
        );
        registry.register(
            "refused_peers",
            "Connections refused for their certificate",
            m.refused_peers.clone(),
        );
        registry.register(
            "protocol_errors",
            "Connections closed for a malformed, oversized or invalid message",
            m.protocol_errors.clone(),
        );
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until this bridge's certificate (certificate=leaf) and each CA it trusts, its region's and its peers' (certificate=ca), expire; negative once expired",
            m.certificate_expiry.clone(),
        );
        Metrics { registry, ..m }
    }

    /// `region` confirmed its summaries now.
    pub fn heard(&self, region: &Label) {
        self.heard
            .lock()
            .expect("heard lock")
            .insert(region.clone(), Instant::now());
    }

    /// The Prometheus text exposition, ages and certificate expiries
    /// (from `tls`, what the bridge presents and trusts) brought up to now.
    pub fn render(&self, tls: &TlsStatus) -> String {
        set_certificate_expiry(
            &self.certificate_expiry,
            tls,
            rollcall_leases::clock::now_ms() as i64 / 1_000,
        );
        for (region, at) in self.heard.lock().expect("heard lock").iter() {
            self.summary_age
                .get_or_create(&RegionLabel {
                    region: region.to_string(),
                })
                .set(at.elapsed().as_secs_f64());
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
