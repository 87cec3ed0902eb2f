//! What the views answer about other regions (R9): where a connection
//! goes when it has no usable local endpoint or when its service's writes
//! belong to another region, what this region's ingress admits, and what
//! `GET /v1/regions` shows. Every answer reads the published `Regions`.

use std::sync::Arc;

use rollcall_config::ConnTraffic;
use rollcall_leases::ServiceKey;

use super::Views;
use crate::api_types::{RegionsPolicy, RegionsResponse};
use crate::failover::{Decision, Refusal, Regions};
use crate::metrics::{FailoverLabel, RefusalLabel};

impl Views {
    /// Where a `traffic` connection (or answer) of `key` goes when it has
    /// no usable local endpoint (R9): another region's ingress, or nowhere.
    /// Counted in the failover metrics.
    pub fn failover(&self, key: &ServiceKey, traffic: ConnTraffic, now_ms: u64) -> Decision {
        let view = self.service(key);
        let decision = if view.degraded_at(now_ms) {
            Decision::Refused(Refusal::StaleCopy)
        } else {
            self.inner
                .regions
                .load()
                .decide(key, traffic, now_ms, &view.spread)
        };
        self.count_failover(key, &decision);
        decision
    }

    /// Counts a failover decision or refusal in the metrics.
    fn count_failover(&self, key: &ServiceKey, decision: &Decision) {
        let m = &self.inner.metrics;
        match decision {
            Decision::Remote { region, .. } => {
                m.failover_decisions
                    .get_or_create(&FailoverLabel {
                        service: key.to_string(),
                        region: region.to_string(),
                    })
                    .inc();
            }
            // A service without a policy is simply not a failover service.
            Decision::Refused(Refusal::NoPolicy) => {}
            Decision::Refused(refusal) => {
                m.failover_refusals
                    .get_or_create(&RefusalLabel {
                        service: m.service_name(&key.to_string()),
                        reason: refusal.as_str().to_owned(),
                    })
                    .inc();
            }
        }
    }

    /// Whether this agent's ingress gateway takes a `traffic` connection of
    /// `key` from another region, stamped with writer epoch `epoch` when
    /// the caller's proxy sent one: its policy must let it into this
    /// region, and a write must find this region the writer.
    pub fn ingress_admits(
        &self,
        key: &ServiceKey,
        traffic: ConnTraffic,
        epoch: Option<u64>,
    ) -> Result<(), Refusal> {
        self.inner
            .regions
            .load()
            .admits(key, traffic, &self.inner.settings.region, epoch)
    }

    /// Where a `traffic` connection of `key` goes when the service's writes
    /// belong to another region than this one (`Regions::writes_elsewhere`):
    /// `None` when local endpoints serve it. Counted as failovers are.
    pub fn writes_elsewhere(
        &self,
        key: &ServiceKey,
        traffic: ConnTraffic,
        now_ms: u64,
    ) -> Option<Decision> {
        let decision = self.inner.regions.load().writes_elsewhere(
            key,
            traffic,
            &self.inner.settings.region,
            now_ms,
        )?;
        self.count_failover(key, &decision);
        Some(decision)
    }

    /// The writer epoch of `key`'s service this agent holds, if it has a
    /// single writer.
    pub fn writer(&self, key: &ServiceKey) -> Option<rollcall_leases::WriterEpoch> {
        self.inner.regions.load().writer(key)
    }

    /// `GET /v1/regions`: the other regions and the policies held.
    pub fn regions_status(&self, now_ms: u64) -> RegionsResponse {
        let regions = self.inner.regions.load();
        RegionsResponse {
            region: self.inner.settings.region.clone(),
            regions: regions.status(now_ms),
            policies: regions
                .policies()
                .map(|p| RegionsPolicy {
                    policy: p.policy.document().clone(),
                    home_revision: p.home_revision.get(),
                })
                .collect(),
        }
    }

    /// The regions held (metrics read their ages and revisions).
    pub fn regions(&self) -> Arc<Regions> {
        self.inner.regions.load_full()
    }
}
