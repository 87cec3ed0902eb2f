//! The local instances' health checkers, with each one's next due time
//! indexed: a timer pass visits only the checkers that are due, and the
//! next wake-up is the first entry of the index, so neither scans every
//! checker of the node (an agent with many instances handles a probe result
//! or a timer in O(log n)).
//!
//! Every change to a checker goes through [`Checkers::update`], which moves
//! its index entry when its due time moved; the index cannot drift from the
//! checkers it describes.

use std::collections::{BTreeMap, BTreeSet};

use rollcall_leases::{Generation, InstanceId};

use crate::health::InstanceHealth;

/// One instance's checker with the generation its results are for.
pub(super) type Checker = (Option<Generation>, InstanceHealth);

/// The checkers, by instance, and their due times.
#[derive(Default)]
pub(super) struct Checkers {
    by_instance: BTreeMap<InstanceId, Checker>,
    due: BTreeSet<(u64, InstanceId)>,
}

impl Checkers {
    /// Sets `id`'s checker (replacing any).
    pub(super) fn insert(&mut self, id: InstanceId, checker: Checker) {
        self.remove(&id);
        if let Some(at) = checker.1.next_due_ms() {
            self.due.insert((at, id.clone()));
        }
        self.by_instance.insert(id, checker);
    }

    /// Removes `id`'s checker.
    pub(super) fn remove(&mut self, id: &InstanceId) -> Option<Checker> {
        let checker = self.by_instance.remove(id)?;
        if let Some(at) = checker.1.next_due_ms() {
            self.due.remove(&(at, id.clone()));
        }
        Some(checker)
    }

    /// `id`'s checker.
    pub(super) fn get(&self, id: &InstanceId) -> Option<&Checker> {
        self.by_instance.get(id)
    }

    /// Changes `id`'s checker with `f` and reindexes it; `None` when it has
    /// none.
    pub(super) fn update<T>(
        &mut self,
        id: &InstanceId,
        f: impl FnOnce(&mut Option<Generation>, &mut InstanceHealth) -> T,
    ) -> Option<T> {
        let (generation, health) = self.by_instance.get_mut(id)?;
        let before = health.next_due_ms();
        let result = f(generation, health);
        let after = health.next_due_ms();
        if before != after {
            if let Some(at) = before {
                self.due.remove(&(at, id.clone()));
            }
            if let Some(at) = after {
                self.due.insert((at, id.clone()));
            }
        }
        Some(result)
    }

    /// When the first check is due.
    pub(super) fn next_due_ms(&self) -> Option<u64> {
        self.due.first().map(|(at, _)| *at)
    }

    /// The instances with a check due at `now_ms`, earliest first.
    pub(super) fn due_at(&self, now_ms: u64) -> Vec<InstanceId> {
        self.due
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .map(|(_, id)| id.clone())
            .collect()
    }

    /// Every checker, by instance.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&InstanceId, &Checker)> + '_ {
        self.by_instance.iter()
    }

    /// Whether the index describes exactly the checkers' due times.
    #[cfg(test)]
    pub(super) fn indexed_exactly(&self) -> bool {
        let expected: BTreeSet<(u64, InstanceId)> = self
            .by_instance
            .iter()
            .filter_map(|(id, (_, h))| h.next_due_ms().map(|at| (at, id.clone())))
            .collect();
        expected == self.due
    }
}
