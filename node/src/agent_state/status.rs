//! What the driver reads of the machine: `/v1/status`, the metrics'
//! counters, and what the simulator's judges inspect. Nothing here changes
//! state.

use rollcall_leases::{InstanceId, Liveness, ServiceKey, ServiceView, State};

use super::{AgentState, Counters, LocalEntry, Settings};
use crate::api_types::{
    ArbiterStatus, GossipStatus, LeaseStatus, StatusResponse, SubscriptionStatus,
};
use crate::registrations::Registrations;
use crate::sync::SyncStats;

impl AgentState {
    /// Whether a session holds the lease now.
    pub fn is_connected(&self) -> bool {
        self.link.is_connected()
    }

    /// `GET /v1/status` at `now_ms`.
    pub fn status(&self, now_ms: u64) -> StatusResponse {
        let connected = self.is_connected();
        StatusResponse {
            node: self.settings.node.clone(),
            zone: self.settings.zone.clone(),
            agent_epoch: self.settings.epoch.get(),
            arbiter: ArbiterStatus {
                connected,
                address: self.link.address().map(str::to_owned),
                last_contact_ms: self.link.last_contact_ms().map(|t| {
                    if connected {
                        0
                    } else {
                        now_ms.saturating_sub(t)
                    }
                }),
                catalog: self.following.sync.catalog().map(|c| c.to_string()),
                last_end: self.link.last_end().map(str::to_owned),
            },
            lease: self.link.lease().map(|(lease, ttl_ms)| LeaseStatus {
                id: lease.get(),
                ttl_ms,
            }),
            subscriptions: self
                .subscriptions()
                .map(|(service, revision, lag, stale, last)| SubscriptionStatus {
                    service: service.clone(),
                    revision,
                    lag,
                    stale,
                    age_ms: last.map_or(0, |t| now_ms.saturating_sub(t)),
                })
                .collect(),
            pending_writes: self.writes.regs.pending().len() as u32,
            gossip: self.gossip_status(),
            // The driver's: it holds the TLS material.
            tls: None,
        }
    }

    /// The zone's gossip as `/v1/status` shows it: `None` only when gossip
    /// is off (no `gossip.key_file`). Gossip that is on but has said
    /// nothing yet (a zone's lone member) is empty lists, not `None`; a
    /// driver without a key file that feeds verdicts anyway (the
    /// simulator) shows them.
    fn gossip_status(&self) -> Option<GossipStatus> {
        let on = self.settings.config.gossip.key_file.is_some();
        if !on && self.peers.alive.is_none() {
            return None;
        }
        Some(GossipStatus {
            alive: self.peers.alive.iter().flatten().cloned().collect(),
            down: self.peers.downs.nodes().cloned().collect(),
        })
    }

    /// Every followed service: revision held, revisions behind the shard,
    /// whether stale, and the time it was last known current.
    pub fn subscriptions(
        &self,
    ) -> impl Iterator<Item = (&ServiceKey, u64, u64, bool, Option<u64>)> + '_ {
        let f = &self.following;
        f.sync.iter().map(|(service, t)| {
            let revision = t.view.as_ref().map_or(0, |v| v.revision().get());
            let lag = if t.synced {
                0
            } else {
                f.shard_revision.get().saturating_sub(revision)
            };
            let last = if t.synced {
                None
            } else {
                Some(t.confirmed_at_ms.unwrap_or(self.settings.started_ms))
            };
            (service, revision, lag, !t.synced, last)
        })
    }

    /// The liveness of each local instance with checks.
    pub fn liveness(&self) -> impl Iterator<Item = (&InstanceId, Liveness)> + '_ {
        self.health
            .checkers
            .iter()
            .map(|(id, (_, h))| (id, h.liveness()))
    }

    /// Counters for metrics.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The catalog sync's counters.
    pub fn sync_stats(&self) -> &SyncStats {
        self.following.sync.stats()
    }

    /// The agent's settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The local registrations.
    pub fn registrations(&self) -> &Registrations {
        &self.writes.regs
    }

    /// Every local registration with the state its checks give it, for
    /// `GET /v1/agent/instances`.
    pub fn local_entries(&self) -> Vec<LocalEntry> {
        self.writes
            .regs
            .iter()
            .map(|local| LocalEntry {
                checked: self.health_state(&local.registration.instance_id),
                local: local.clone(),
            })
            .collect()
    }

    /// The view held of `service`.
    pub fn view(&self, service: &ServiceKey) -> Option<&ServiceView> {
        self.following
            .sync
            .get(service)
            .and_then(|t| t.view.as_deref())
    }

    /// The state the health checks of a local instance give it, if it has
    /// checks.
    pub fn health_state(&self, id: &InstanceId) -> Option<State> {
        self.health.checkers.get(id).map(|(_, h)| h.state())
    }

    /// Writes not yet in the catalog: pending registrations and intents,
    /// desired states, and requests in flight.
    pub fn writes_waiting(&self) -> usize {
        self.writes.regs.pending().len() + self.health.desired.len() + self.link.in_flight().count()
    }
}
