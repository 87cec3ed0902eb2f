//! The mass-expiry guard (R3): when lease expiries within one window would
//! hit more than a configured share of one zone's nodes, they are held and
//! an alert raised, because the arbiter is then more likely cut off from the
//! zone than the zone dead (Eureka's self-preservation, scoped to a zone).
//!
//! This module only counts and decides; releasing a held lease (a down
//! verdict, the session returning, the maximum hold) is the catalog's job.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::name::Label;
use crate::params::GuardParams;

/// What to do with one expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardDecision {
    /// Let it expire.
    Expire,
    /// Hold it: too much of the zone would go at once.
    Hold,
}

/// Recent committed expiries per zone (replicated state: part of snapshots).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiryGuard {
    recent: BTreeMap<Label, VecDeque<u64>>,
}

impl ExpiryGuard {
    /// Decides an expiry in `zone` at `at_ms`.
    ///
    /// `live_in_zone` is the number of leases the zone holds now (this one
    /// included); `silent_in_zone` the leader's count of the zone's nodes
    /// whose sessions are silent (this one included). The expiries that
    /// would hit the zone are those already committed in the window plus
    /// those the silence announces; the zone's size is its live leases plus
    /// those recently expired. At least one node may always expire, so a
    /// lone crash in a small zone is never held.
    pub fn decide(
        &mut self,
        zone: &Label,
        live_in_zone: usize,
        silent_in_zone: u32,
        at_ms: u64,
        p: &GuardParams,
    ) -> GuardDecision {
        let recent = self.prune(zone, at_ms, p.window_ms);
        let zone_nodes = live_in_zone + recent;
        let allowed = ((p.max_share * zone_nodes as f64).floor() as usize).max(1);
        let would_hit = recent + (silent_in_zone as usize).max(1);
        if would_hit > allowed {
            GuardDecision::Hold
        } else {
            GuardDecision::Expire
        }
    }

    /// Records a committed expiry.
    pub fn record(&mut self, zone: &Label, at_ms: u64) {
        self.recent
            .entry(zone.clone())
            .or_default()
            .push_back(at_ms);
    }

    /// Committed expiries per zone within the window ending at `at_ms`.
    fn prune(&mut self, zone: &Label, at_ms: u64, window_ms: u64) -> usize {
        let Some(times) = self.recent.get_mut(zone) else {
            return 0;
        };
        while times
            .front()
            .is_some_and(|t| at_ms.saturating_sub(*t) > window_ms)
        {
            times.pop_front();
        }
        let n = times.len();
        if n == 0 {
            self.recent.remove(zone);
        }
        n
    }

    /// The recorded expiry times, per zone in order (for snapshots).
    pub fn export(&self) -> Vec<(Label, Vec<u64>)> {
        self.recent
            .iter()
            .map(|(z, t)| (z.clone(), t.iter().copied().collect()))
            .collect()
    }

    /// Rebuilds the guard from `export`'s output.
    pub fn import(entries: Vec<(Label, Vec<u64>)>) -> Self {
        ExpiryGuard {
            recent: entries.into_iter().map(|(z, t)| (z, t.into())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> GuardParams {
        GuardParams {
            max_share: 0.3,
            window_ms: 60_000,
            max_hold_ms: 600_000,
        }
    }

    #[test]
    fn a_lone_expiry_in_a_small_zone_is_never_held() {
        let mut g = ExpiryGuard::default();
        let z = Label::new("z1").unwrap();
        assert_eq!(g.decide(&z, 2, 1, 0, &p()), GuardDecision::Expire);
    }

    #[test]
    fn a_silent_zone_is_held_before_its_share_expires() {
        let mut g = ExpiryGuard::default();
        let z = Label::new("z1").unwrap();
        // 10 nodes, all silent: the first expiry is already held.
        assert_eq!(g.decide(&z, 10, 10, 0, &p()), GuardDecision::Hold);
        // 3 silent of 10 fit the 30 % share.
        assert_eq!(g.decide(&z, 10, 3, 0, &p()), GuardDecision::Expire);
    }

    #[test]
    fn committed_expiries_count_until_the_window_passes() {
        let mut g = ExpiryGuard::default();
        let z = Label::new("z1").unwrap();
        for i in 0..3 {
            assert_eq!(g.decide(&z, 10 - i, 1, 1_000, &p()), GuardDecision::Expire);
            g.record(&z, 1_000);
        }
        assert_eq!(g.decide(&z, 7, 1, 2_000, &p()), GuardDecision::Hold);
        assert_eq!(g.decide(&z, 7, 1, 61_001, &p()), GuardDecision::Expire);
    }
}
