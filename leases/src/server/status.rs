//! What the admin API reads of a replica: status, remote region views and
//! the metrics refreshed on a scrape, from the replica machine, the applied
//! catalog and openraft's metrics. Reads only.

use rollcall_config::ArbiterConfig;

use crate::catalog::Catalog;
use crate::raft::{CatalogRaftNode, ReplicaId};
use crate::replica::ReplicaState;
use crate::server::metrics::{
    KindLabel, Metrics, NodeLabel, RegionLabel, ReplicaLabel, ServiceLabel,
};

/// A replica as the admin API reads it.
pub(crate) struct Reader<'a> {
    pub(crate) config: &'a ArbiterConfig,
    pub(crate) machine: &'a ReplicaState,
    pub(crate) raft: &'a CatalogRaftNode,
    pub(crate) metrics: &'a Metrics,
}

impl Reader<'_> {
    pub(crate) fn refresh_metrics(&self, cat: &Catalog, now: u64) {
        let m = self.metrics;
        m.policy_revision.clear();
        let home = cat.policies().map(|p| (p.policy.home_region(), p.revision));
        let replicated = cat
            .replicated_policies()
            .map(|p| (p.remote.policy.home_region(), p.remote.home_revision));
        for (region, revision) in home.chain(replicated) {
            let gauge = m.policy_revision.get_or_create(&RegionLabel {
                region: region.to_string(),
            });
            gauge.set(gauge.get().max(revision.get() as i64));
        }
        m.remote_view_age.clear();
        m.remote_view_fresh.clear();
        for held in self.machine.remote().iter() {
            let label = RegionLabel {
                region: held.view.region.to_string(),
            };
            m.remote_view_age
                .get_or_create(&label)
                .set(held.age_ms(now) as f64 / 1000.0);
            m.remote_view_fresh
                .get_or_create(&label)
                .set(i64::from(held.fresh(now)));
        }
        m.ready.clear();
        for key in cat.services() {
            if let Some(info) = cat.service(&key) {
                m.ready
                    .get_or_create(&ServiceLabel {
                        service: key.to_string(),
                    })
                    .set(info.ready as i64);
            }
        }
        m.ack_lag.clear();
        for agent in self.machine.sessions().agents() {
            if let Some((node, _)) = self.machine.sessions().held(agent) {
                m.ack_lag
                    .get_or_create(&NodeLabel {
                        node: node.to_string(),
                    })
                    .set(self.machine.distributor().ack_lag(agent, cat) as i64);
            }
        }
        let stats = self.machine.distributor().stats();
        m.snapshots_sent.set(stats.snapshots_sent as i64);
        m.snapshots_refused.set(stats.snapshots_refused as i64);
        m.snapshots_in_flight
            .set(self.machine.distributor().snapshots_in_flight() as i64);
        m.snapshots_in_flight_max
            .set(stats.max_concurrent_snapshots_seen as i64);
        m.stalled_agents.set(stats.stalled_agents as i64);
        for (kind, total) in [
            ("delta", stats.resent_as_deltas),
            ("snapshot", stats.resent_as_snapshots),
        ] {
            let counter = m.resends.get_or_create(&KindLabel { kind });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        m.connected_agents.set(
            self.machine
                .sessions()
                .agents()
                .filter(|a| self.machine.sessions().held(*a).is_some())
                .count() as i64,
        );
        let distributor = self.machine.distributor();
        m.session_state_bytes.set(
            (self.machine.sessions().state_bytes() + distributor.session_state_bytes()) as i64,
        );
        m.subscription_state_bytes
            .set(distributor.subscription_state_bytes() as i64);
        m.held_leases.set(cat.leases().held() as i64);
        m.leases_held_by_witnesses
            .set(self.machine.held_alive() as i64);
        m.leases.set(cat.leases().len() as i64);
        m.revision.set(cat.revision().0 as i64);
        let raft = self.raft.metrics().borrow().clone();
        m.raft_term.set(raft.current_term as i64);
        m.raft_leader
            .set(raft.current_leader.map_or(0, |l| l as i64));
        m.raft_is_leader.set(i64::from(self.machine.leads()));
        m.raft_last_log_index
            .set(raft.last_log_index.unwrap_or(0) as i64);
        m.raft_applied_index
            .set(raft.last_applied.map_or(0, |l| l.index) as i64);
        m.raft_apply_lag.clear();
        if let Some(replication) = &raft.replication {
            let last = raft.last_log_index.unwrap_or(0);
            for (id, matched) in replication {
                m.raft_apply_lag
                    .get_or_create(&ReplicaLabel {
                        replica: id.to_string(),
                    })
                    .set(last.saturating_sub(matched.map_or(0, |l| l.index)) as i64);
            }
        }
    }

    /// `GET /v1/remote`.
    pub(crate) fn remote_json(&self, now: u64) -> serde_json::Value {
        let regions: Vec<serde_json::Value> = self
            .machine
            .remote()
            .iter()
            .map(|held| {
                let view = &held.view;
                serde_json::json!({
                    "region": view.region.to_string(),
                    "version": view.version.0,
                    "as_of_ms": view.as_of_ms,
                    "age_ms": held.age_ms(now),
                    "max_age_ms": held.max_age_ms,
                    "fresh": held.fresh(now),
                    "ingress": view.ingress,
                    "summaries": view.summaries,
                })
            })
            .collect();
        serde_json::json!({"region": self.machine.sessions().rules().region.to_string(), "regions": regions})
    }

    pub(crate) fn status(&self, cat: &Catalog, now: u64) -> serde_json::Value {
        let agents: Vec<serde_json::Value> = self
            .machine
            .sessions()
            .agents()
            .filter_map(|agent| {
                let (node, epoch) = self.machine.sessions().held(agent)?;
                Some(serde_json::json!({
                    "node": node.as_str(),
                    "epoch": epoch.0,
                    "last_heard_ms_ago": self.machine.last_heard(node).map(|t| now.saturating_sub(t)),
                    "ack_lag": self.machine.distributor().ack_lag(agent, cat),
                }))
            })
            .collect();
        let raft = self.raft.metrics().borrow().clone();
        serde_json::json!({
            "name": self.config.name,
            "region": self.machine.sessions().rules().region.as_str(),
            "shard": cat.params().shard.0,
            "catalog": cat.identity().map(|c| c.to_string()),
            "revision": cat.revision().0,
            "services": cat.services().len(),
            "leases": cat.leases().len(),
            "held_leases": cat.leases().held(),
            "snapshots_in_flight": self.machine.distributor().snapshots_in_flight(),
            "agents": agents,
            "raft": raft_json(&raft),
        })
    }
}

/// A replica's Raft state as the admin API shows it.
pub fn raft_json(m: &openraft::RaftMetrics<ReplicaId, openraft::BasicNode>) -> serde_json::Value {
    let membership = m.membership_config.membership();
    let voters: std::collections::BTreeSet<ReplicaId> = membership.voter_ids().collect();
    let last = m.last_log_index.unwrap_or(0);
    let members: Vec<serde_json::Value> = membership
        .nodes()
        .map(|(id, node)| {
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id))
                .map(|l| l.map_or(0, |l| l.index));
            serde_json::json!({
                "id": id,
                "addr": node.addr,
                "voter": voters.contains(id),
                "leader": m.current_leader == Some(*id),
                "matched_index": matched,
                "lag": matched.map(|i| last.saturating_sub(i)),
            })
        })
        .collect();
    serde_json::json!({
        "id": m.id,
        "state": format!("{:?}", m.state),
        "term": m.current_term,
        "leader": m.current_leader,
        "last_log_index": m.last_log_index,
        "applied_index": m.last_applied.map(|l| l.index),
        "snapshot_index": m.snapshot.map(|l| l.index),
        "millis_since_quorum_ack": m.millis_since_quorum_ack,
        "members": members,
    })
}
