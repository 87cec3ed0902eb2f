//! Node leases (R3): one per node agent, not per instance, so 5,000 agents
//! renew instead of 100,000 instances.
//!
//! Two halves, two types. The leases themselves (`LeaseTable`: who holds
//! one, which epoch, whether the guard holds its expiry) are replicated
//! state, changed only through commands. Their deadlines (`Deadlines`) are
//! the leader's memory, held by `leader::LeaderMemory` and never by the
//! catalog: renewals move them without a log entry, and a new leader starts
//! by extending every lease by one TTL (`extend_all`) so an election never
//! mass-expires a fleet.

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

/// All leases of a shard: replicated state, changed only by
/// `Catalog::apply`.
#[derive(Clone, Debug, Default)]
pub struct LeaseTable {
    leases: HashMap<NodeId, Lease>,
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

    pub(crate) fn insert(&mut self, lease: Lease) {
        self.leases.insert(lease.node.clone(), lease);
    }

    pub(crate) fn get_mut(&mut self, node: &NodeId) -> Option<&mut Lease> {
        self.leases.get_mut(node)
    }

    pub(crate) fn remove(&mut self, node: &NodeId) -> Option<Lease> {
        self.leases.remove(node)
    }
}

/// The leader's half: when each lease is due. Renewals move a deadline
/// without a log entry, so this lives in the leader's memory
/// (`leader::LeaderMemory`), never in the replicated catalog. A lease it
/// has no deadline for (or one for an earlier grant of the node) is due one
/// TTL after it was granted.
#[derive(Clone, Debug, Default)]
pub struct Deadlines {
    by_node: HashMap<NodeId, (LeaseId, u64)>,
}

impl Deadlines {
    /// When `lease` is due, ms: its last renewal (or extension) plus its
    /// TTL, and never before one TTL after its (re)grant.
    pub fn of(&self, lease: &Lease) -> u64 {
        let granted = lease.granted_at_ms.saturating_add(lease.ttl_ms);
        match self.by_node.get(&lease.node) {
            Some((id, at)) if *id == lease.id => (*at).max(granted),
            _ => granted,
        }
    }

    /// The deadline of `node`'s lease in `leases`, if it holds one.
    pub fn deadline(&self, leases: &LeaseTable, node: &NodeId) -> Option<u64> {
        leases.get(node).map(|l| self.of(l))
    }

    /// Renews `node`'s lease of `epoch` at `now_ms`.
    pub fn renew(
        &mut self,
        leases: &LeaseTable,
        node: &NodeId,
        epoch: AgentEpoch,
        now_ms: u64,
    ) -> Result<Renewal, RenewError> {
        let lease = leases
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
        self.by_node.insert(node.clone(), (lease.id, deadline_ms));
        Ok(Renewal {
            deadline_ms,
            held: lease.held_since_ms.is_some(),
        })
    }

    /// Leases the leader should propose to expire at `now_ms`: active ones
    /// past their deadline, and held ones whose hold reached `max_hold_ms`.
    /// Sorted by node so proposals are made in a stable order.
    pub fn due(
        &self,
        leases: &LeaseTable,
        now_ms: u64,
        max_hold_ms: u64,
    ) -> Vec<(NodeId, AgentEpoch)> {
        let mut due: Vec<(NodeId, AgentEpoch)> = leases
            .iter()
            .filter(|l| match l.held_since_ms {
                Some(since) => now_ms.saturating_sub(since) >= max_hold_ms,
                None => self.of(l) <= now_ms,
            })
            .map(|l| (l.node.clone(), l.epoch))
            .collect();
        due.sort();
        due
    }

    /// Gives every lease one full TTL from `now_ms`: what a new leader or a
    /// restarted arbiter does before it expires anything (R3). Deadlines of
    /// leases that ended are forgotten.
    pub fn extend_all(&mut self, leases: &LeaseTable, now_ms: u64) {
        self.by_node = leases
            .iter()
            .map(|l| (l.node.clone(), (l.id, now_ms.saturating_add(l.ttl_ms))))
            .collect();
    }

    /// Forgets the deadlines of leases that ended.
    pub fn forget_ended(&mut self, leases: &LeaseTable) {
        self.by_node
            .retain(|node, (id, _)| leases.is_live(node, *id));
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
        let mut d = Deadlines::default();
        let mut l = lease("n1", 7);
        l.granted_at_ms = 1_000;
        t.insert(l);
        let n1 = NodeId::new("n1").unwrap();
        assert_eq!(d.deadline(&t, &n1), Some(11_000), "one TTL after the grant");
        assert!(d
            .due(&t, 11_000, 60_000)
            .contains(&(n1.clone(), AgentEpoch(7))));
        let r = d.renew(&t, &n1, AgentEpoch(7), 5_000).unwrap();
        assert_eq!(r.deadline_ms, 15_000);
        assert!(d.due(&t, 11_000, 60_000).is_empty());
        assert!(matches!(
            d.renew(&t, &n1, AgentEpoch(6), 5_000),
            Err(RenewError::OtherEpoch { .. })
        ));
        let n2 = NodeId::new("n2").unwrap();
        assert!(matches!(
            d.renew(&t, &n2, AgentEpoch(1), 5_000),
            Err(RenewError::NoLease { .. })
        ));
    }

    #[test]
    fn a_new_grant_of_the_node_does_not_inherit_the_old_deadline() {
        let mut t = LeaseTable::default();
        let mut d = Deadlines::default();
        let n1 = NodeId::new("n1").unwrap();
        t.insert(lease("n1", 1));
        d.renew(&t, &n1, AgentEpoch(1), 50_000).unwrap();
        assert_eq!(d.deadline(&t, &n1), Some(60_000));
        // Granted again (another epoch, another id) at 2 s.
        let mut again = lease("n1", 2);
        again.id = LeaseId(9);
        again.granted_at_ms = 2_000;
        t.insert(again);
        assert_eq!(d.deadline(&t, &n1), Some(12_000));
        d.forget_ended(&t);
        assert!(d.by_node.is_empty());
    }

    #[test]
    fn extend_all_gives_one_ttl_of_grace() {
        let mut t = LeaseTable::default();
        let mut d = Deadlines::default();
        t.insert(lease("n1", 1));
        t.insert(lease("n2", 1));
        assert_eq!(d.due(&t, 20_000, 60_000).len(), 2);
        d.extend_all(&t, 20_000);
        assert!(d.due(&t, 29_999, 60_000).is_empty());
        assert_eq!(d.due(&t, 30_000, 60_000).len(), 2);
    }

    #[test]
    fn held_leases_are_due_only_after_the_maximum_hold() {
        let mut t = LeaseTable::default();
        let d = Deadlines::default();
        let mut l = lease("n1", 1);
        l.held_since_ms = Some(10_000);
        t.insert(l);
        assert!(d.due(&t, 69_999, 60_000).is_empty());
        assert_eq!(d.due(&t, 70_000, 60_000).len(), 1);
    }
}
