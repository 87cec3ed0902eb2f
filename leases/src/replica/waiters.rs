//! Propagation waits (`AwaitPropagation` and a peer's `Propagation`
//! question): held by service, so an acknowledgement looks only at the
//! waits of its own service, and by deadline, so a wake-up finds the ones
//! past theirs without a scan; an agent's waits counted per identity
//! (`limits.propagation_waits_per_identity`, issue 38 item 5).

use std::collections::BTreeSet;

use super::*;

/// A propagation wait on this replica's agents.
pub(super) struct Waiter {
    pub(super) service: ServiceKey,
    pub(super) revision: Revision,
    pub(super) deadline_ms: u64,
    pub(super) to: WaitFor,
}

pub(super) enum WaitFor {
    /// A peer's `Propagation` question.
    Peer(ReplyId),
    /// This replica's part of an agent's `AwaitPropagation`.
    Await(AwaitId),
}

/// An agent's `AwaitPropagation`: this replica's sums and the others'.
pub(super) struct Await {
    pub(super) reply: ReplyId,
    pub(super) identity: Principal,
    pub(super) here: Option<(u32, u32)>,
    pub(super) others: Option<(u32, u32)>,
}

/// The waits of one replica.
#[derive(Default)]
pub(super) struct Waiters {
    next: u64,
    waits: HashMap<u64, Waiter>,
    by_service: HashMap<ServiceKey, BTreeSet<u64>>,
    by_deadline: BTreeSet<(u64, u64)>,
    /// Agents' `AwaitPropagation` requests, until both sums are in.
    pub(super) awaits: HashMap<AwaitId, Await>,
    /// Open `AwaitPropagation` requests per identity.
    per_identity: HashMap<Principal, u32>,
}

impl Waiters {
    /// Holds `waiter`.
    pub(super) fn push(&mut self, waiter: Waiter) {
        self.next += 1;
        let id = self.next;
        self.by_service
            .entry(waiter.service.clone())
            .or_default()
            .insert(id);
        self.by_deadline.insert((waiter.deadline_ms, id));
        self.waits.insert(id, waiter);
    }

    fn take(&mut self, id: u64) -> Option<Waiter> {
        let waiter = self.waits.remove(&id)?;
        self.by_deadline.remove(&(waiter.deadline_ms, id));
        if let Some(ids) = self.by_service.get_mut(&waiter.service) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_service.remove(&waiter.service);
            }
        }
        Some(waiter)
    }

    /// The waits of `service` that `complete` says are answered.
    pub(super) fn complete(
        &mut self,
        service: &ServiceKey,
        complete: impl Fn(&Waiter) -> bool,
    ) -> Vec<Waiter> {
        let Some(ids) = self.by_service.get(service) else {
            return Vec::new();
        };
        let done: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| self.waits.get(id).is_some_and(&complete))
            .collect();
        done.into_iter().filter_map(|id| self.take(id)).collect()
    }

    /// The waits past their deadline at `now`.
    pub(super) fn expired(&mut self, now: u64) -> Vec<Waiter> {
        let mut due = Vec::new();
        while let Some(&(deadline, id)) = self.by_deadline.first() {
            if deadline > now {
                break;
            }
            due.extend(self.take(id));
        }
        due
    }

    /// The services some wait is on (for a periodic look at every wait:
    /// a follower that went away completes a wait as an ack does).
    pub(super) fn services(&self) -> Vec<ServiceKey> {
        self.by_service.keys().cloned().collect()
    }

    /// Whether `identity` may open one more `AwaitPropagation` under
    /// `limit`; counted when it may.
    pub(super) fn admit(&mut self, identity: &Principal, limit: u32) -> bool {
        let open = self.per_identity.entry(identity.clone()).or_default();
        if *open >= limit {
            return false;
        }
        *open += 1;
        true
    }

    /// An `AwaitPropagation` is answered: its identity's count drops.
    pub(super) fn finished(&mut self, wait: AwaitId) -> Option<Await> {
        let a = self.awaits.remove(&wait)?;
        if let Some(open) = self.per_identity.get_mut(&a.identity) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                self.per_identity.remove(&a.identity);
            }
        }
        Some(a)
    }
}
