//! Node leases (R3): one per node agent, not per instance, so 5,000 agents
//! renew instead of 100,000 instances.
//!
//! The table has two halves. The leases themselves (who holds one, which
//! epoch, whether the guard holds its expiry) are replicated state, changed
//! only through commands. Deadlines are the leader's memory: renewals move
//! them without a log entry, and a new leader starts by extending every
//! lease by one TTL (`extend_all`) so an election never mass-expires a fleet.

use foldhash::HashMap;

use serde::{Deserialize, Serialize};

use crate::ids::{AgentEpoch, LeaseId};
use crate::name::{Label, NodeId};

/// One node agent's lease.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Lease {
    /// The grant's id (the revision that granted it).
    pub id: LeaseId,
    /// The node.
    pub node: NodeId,
    /// The agent run holding it.
    pub epoch: AgentEpoch,
    /// The node's zone.
    pub zone: Label,
    /// Time to live after the last renewal, in milliseconds.
    pub ttl_ms: u64,
    /// When it was granted (or last re-granted), ms since the Unix epoch.
    pub granted_at_ms: u64,
    /// Set while the mass-expiry guard holds its expiry: since when.
    pub held_since_ms: Option<u64>,
}

/// Why a renewal was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// The node holds no lease.
    #[error("node {node} holds no lease; register the node again (grant a lease) before renewing")]
    NoLease {
        /// The node.
        node: NodeId,
    },
    /// The lease belongs to another agent run.
    #[error("node {node}'s lease belongs to agent epoch {current}, not {given}; this agent run was replaced")]
    OtherEpoch {
        /// The node.
        node: NodeId,
        /// The epoch holding the lease.
        current: AgentEpoch,
        /// The epoch that tried to renew.
        given: AgentEpoch,
    },
}

/// The result of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    /// The new deadline, ms since the Unix epoch.
    pub deadline_ms: u64,
    /// The lease is held by the guard: the leader should propose a
    /// `GrantLease` with the same epoch to reinstate it.
    pub held: bool,
}

/// All leases of a shard plus the leader's deadlines.
#[derive(Clone, Debug, Default)]
pub struct LeaseTable {
    leases: HashMap<NodeId, Lease>,
    deadlines: HashMap<NodeId, u64>,
}

impl LeaseTable {
    /// The node's lease, if it holds one.
    pub fn get(&self, node: &NodeId) -> Option<&Lease> {
        self.leases.get(node)
    }

    /// Whether grant `id` is still the node's live lease: the test for
    /// whether a record is covered.
    pub fn is_live(&self, node: &NodeId, id: LeaseId) -> bool {
        self.leases.get(node).is_some_and(|l| l.id == id)
    }

    /// Number of leases.
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether there are no leases.
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// All leases, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    /// All leases, in node order.
    pub fn sorted(&self) -> Vec<&Lease> {
        let mut all: Vec<&Lease> = self.leases.values().collect();
        all.sort_by(|a, b| a.node.cmp(&b.node));
        all
    }

    /// How many leases are in `zone`.
    pub fn in_zone(&self, zone: &Label) -> usize {
        self.leases.values().filter(|l| &l.zone == zone).count()
    }

    /// How many leases are held by the guard.
    pub fn held(&self) -> usize {
        self.leases
            .values()
            .filter(|l| l.held_since_ms.is_some())
            .count()
    }

    /// Renews the lease in the leader's memory (not a replicated command).
    pub fn renew(
        &mut self,
        node: &NodeId,
        epoch: AgentEpoch,
        now_ms: u64,
    ) -> Result<Renewal, RenewError> {
        let lease = self
            .leases
            .get(node)
            .ok_or_else(|| RenewError::NoLease { node: node.clone() })?;
        if lease.epoch != epoch {
            return Err(RenewError::OtherEpoch {
                node: node.clone(),
                current: lease.epoch,
                given: epoch,
            });
        }
        let deadline_ms = now_ms.saturating_add(lease.ttl_ms);
        self.deadlines.insert(node.clone(), deadline_ms);
        Ok(Renewal {
            deadline_ms,
            held: lease.held_since_ms.is_some(),
        })
    }

    /// The leader's current deadline for a node's lease.
    pub fn deadline(&self, node: &NodeId) -> Option<u64> {
        self.deadlines.get(node).copied()
    }

    /// Leases the leader should propose to expire at `now_ms`: active ones
    /// past their deadline, and held ones whose hold reached `max_hold_ms`.
    /// Sorted by node so proposals are made in a stable order.
    pub fn due(&self, now_ms: u64, max_hold_ms: u64) -> Vec<(NodeId, AgentEpoch)> {
        let mut due: Vec<(NodeId, AgentEpoch)> = self
            .leases
            .values()
            .filter(|l| match l.held_since_ms {
                Some(since) => now_ms.saturating_sub(since) >= max_hold_ms,
                None => self.deadlines.get(&l.node).is_some_and(|d| *d <= now_ms),
            })
            .map(|l| (l.node.clone(), l.epoch))
            .collect();
        due.sort();
        due
    }

    /// Gives every lease one full TTL from `now_ms`: what a new leader or a
    /// restarted arbiter does before it expires anything (R3).
    pub fn extend_all(&mut self, now_ms: u64) {
        for lease in self.leases.values() {
            self.deadlines
                .insert(lease.node.clone(), now_ms.saturating_add(lease.ttl_ms));
        }
    }

    pub(crate) fn insert(&mut self, lease: Lease, now_ms: u64) {
        self.deadlines
            .insert(lease.node.clone(), now_ms.saturating_add(lease.ttl_ms));
        self.leases.insert(lease.node.clone(), lease);
    }

    pub(crate) fn get_mut(&mut self, node: &NodeId) -> Option<&mut Lease> {
        self.leases.get_mut(node)
    }

    pub(crate) fn clear_deadlines(&mut self) {
        self.deadlines.clear();
    }

    pub(crate) fn remove(&mut self, node: &NodeId) -> Option<Lease> {
        self.deadlines.remove(node);
        self.leases.remove(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(node: &str, epoch: u64) -> Lease {
        Lease {
            id: LeaseId(1),
            node: NodeId::new(node).unwrap(),
            epoch: AgentEpoch(epoch),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
            granted_at_ms: 0,
            held_since_ms: None,
        }
    }

    #[test]
    fn renewal_moves_the_deadline_and_checks_the_epoch() {
        let mut t = LeaseTable::default();
        t.insert(lease("n1", 7), 1_000);
        let n1 = NodeId::new("n1").unwrap();
        assert_eq!(t.deadline(&n1), Some(11_000));
        assert!(t.due(11_000, 60_000).contains(&(n1.clone(), AgentEpoch(7))));
        let r = t.renew(&n1, AgentEpoch(7), 5_000).unwrap();
        assert_eq!(r.deadline_ms, 15_000);
        assert!(t.due(11_000, 60_000).is_empty());
        assert!(matches!(
            t.renew(&n1, AgentEpoch(6), 5_000),
            Err(RenewError::OtherEpoch { .. })
        ));
        let n2 = NodeId::new("n2").unwrap();
        assert!(matches!(
            t.renew(&n2, AgentEpoch(1), 5_000),
            Err(RenewError::NoLease { .. })
        ));
    }

    #[test]
    fn extend_all_gives_one_ttl_of_grace() {
        let mut t = LeaseTable::default();
        t.insert(lease("n1", 1), 0);
        t.insert(lease("n2", 1), 0);
        assert_eq!(t.due(20_000, 60_000).len(), 2);
        t.extend_all(20_000);
        assert!(t.due(29_999, 60_000).is_empty());
        assert_eq!(t.due(30_000, 60_000).len(), 2);
    }

    #[test]
    fn held_leases_are_due_only_after_the_maximum_hold() {
        let mut t = LeaseTable::default();
        let mut l = lease("n1", 1);
        l.held_since_ms = Some(10_000);
        t.insert(l, 0);
        assert!(t.due(69_999, 60_000).is_empty());
        assert_eq!(t.due(70_000, 60_000).len(), 1);
    }
}
