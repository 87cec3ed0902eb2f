//! The publishing half of the bridge protocol, sans-IO: this region's state
//! as the bridge last read it from its arbiter, and what each subscribing
//! peer needs next.
//!
//! Versions are revisions of this region's catalog, so they survive a
//! bridge restart: a peer that held version v gets every policy and summary
//! whose revision is above v, and every removal seen above v. Removals are
//! only known from this bridge's own observations (the catalog keeps no
//! tombstones), so a peer resuming from before the first observation of
//! this run, or from a version this region never reached, gets the full
//! state instead. Nothing here reads a clock or a socket: observations and
//! their time come in, updates go out.

use std::collections::BTreeMap;

use rollcall_leases::{
    Ingress, Label, PolicyKey, RemotePolicy, Revision, ServiceKey, ServiceSummary,
};

use crate::message::Update;

/// Most removals remembered; past it the oldest are forgotten and peers
/// resuming from before them get the full state.
pub const MAX_REMOVALS: usize = 100_000;

/// One read of this region's arbiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// The catalog revision everything read is complete up to (the lower
    /// of the revisions the policy and summary reads answered at).
    pub version: Revision,
    /// Every policy homed in this region.
    pub policies: Vec<RemotePolicy>,
    /// Every service: revision, READY count, summed READY weight.
    pub summaries: Vec<(ServiceKey, Revision, u32, u64)>,
    /// Every writer epoch the region stores.
    pub writers: Vec<rollcall_leases::WriterEpoch>,
}

/// One subscribing peer's progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// What the peer said it holds; consulted for the first update only.
    have: Option<Revision>,
    /// The version and time of the last update sent, once one was.
    sent: Option<(Revision, u64)>,
}

impl Session {
    /// A session whose peer said `Hello` with `have`.
    pub fn new(have: Option<Revision>) -> Session {
        Session { have, sent: None }
    }
}

/// This region's state as published to peers.
#[derive(Clone, Debug)]
pub struct Publisher {
    region: Label,
    ingress: Vec<Ingress>,
    /// The version of the last observation; `None` before the first.
    version: Option<Revision>,
    /// Removals are known for every version at or above this one.
    known_since: Revision,
    as_of_ms: u64,
    policies: BTreeMap<PolicyKey, RemotePolicy>,
    summaries: BTreeMap<ServiceKey, ServiceSummary>,
    /// Removed policies and services, with the version their removal was
    /// first seen at.
    removed_policies: BTreeMap<PolicyKey, Revision>,
    removed_services: BTreeMap<ServiceKey, Revision>,
    /// Every writer epoch the region stores, sent whole in each update.
    writers: Vec<rollcall_leases::WriterEpoch>,
}

impl Publisher {
    /// A publisher of `region` announcing `ingress`, with nothing observed.
    pub fn new(region: Label, ingress: Vec<Ingress>) -> Publisher {
        Publisher {
            region,
            ingress,
            version: None,
            known_since: Revision(0),
            as_of_ms: 0,
            policies: BTreeMap::new(),
            summaries: BTreeMap::new(),
            removed_policies: BTreeMap::new(),
            removed_services: BTreeMap::new(),
            writers: Vec::new(),
        }
    }

    /// The version of the last observation.
    pub fn version(&self) -> Option<Revision> {
        self.version
    }

    /// The policies published, in key order.
    pub fn policies(&self) -> impl Iterator<Item = &RemotePolicy> {
        self.policies.values()
    }

    /// The summaries published, in service order.
    pub fn summaries(&self) -> impl Iterator<Item = &ServiceSummary> {
        self.summaries.values()
    }

    /// Takes in one read of the arbiter at `now_ms`. A read behind the last
    /// one (the arbiter's catalog was replaced) starts over: every peer
    /// then gets the full state.
    pub fn observe(&mut self, obs: Observation, now_ms: u64) {
        let first = match self.version {
            None => true,
            Some(last) if obs.version < last => true,
            Some(_) => false,
        };
        if first {
            self.removed_policies.clear();
            self.removed_services.clear();
            self.known_since = obs.version;
        }
        let at = obs.version;
        let mut policies = BTreeMap::new();
        for policy in obs.policies {
            if policy.policy.home_region() == &self.region {
                policies.insert(policy.policy.key().clone(), policy);
            }
        }
        for gone in self.policies.keys().filter(|k| !policies.contains_key(*k)) {
            self.removed_policies.insert(gone.clone(), at);
        }
        for key in policies.keys() {
            self.removed_policies.remove(key);
        }
        self.policies = policies;

        let mut summaries = BTreeMap::new();
        for (service, revision, ready, weight) in obs.summaries {
            // A summary keeps the time it was first taken at while its
            // revision stays the same: it did not change.
            let taken_at_ms = match self.summaries.get(&service) {
                Some(old) if old.revision == revision => old.taken_at_ms,
                _ => now_ms,
            };
            summaries.insert(
                service.clone(),
                ServiceSummary {
                    service,
                    revision,
                    ready,
                    weight,
                    taken_at_ms,
                },
            );
        }
        for gone in self
            .summaries
            .keys()
            .filter(|k| !summaries.contains_key(*k))
        {
            self.removed_services.insert(gone.clone(), at);
        }
        for key in summaries.keys() {
            self.removed_services.remove(key);
        }
        self.summaries = summaries;
        self.writers = obs.writers;
        self.forget_old_removals();
        self.version = Some(at);
        self.as_of_ms = now_ms;
    }

    /// Keeps at most `MAX_REMOVALS` removals, raising `known_since` past
    /// the ones forgotten.
    fn forget_old_removals(&mut self) {
        while self.removed_policies.len() + self.removed_services.len() > MAX_REMOVALS {
            let oldest_policy = self.removed_policies.iter().min_by_key(|(_, v)| **v);
            let oldest_service = self.removed_services.iter().min_by_key(|(_, v)| **v);
            let forgotten = match (oldest_policy, oldest_service) {
                (Some((k, v)), Some((_, w))) if v <= w => {
                    let (k, v) = (k.clone(), *v);
                    self.removed_policies.remove(&k);
                    v
                }
                (_, Some((k, w))) => {
                    let (k, w) = (k.clone(), *w);
                    self.removed_services.remove(&k);
                    w
                }
                (Some((k, v)), None) => {
                    let (k, v) = (k.clone(), *v);
                    self.removed_policies.remove(&k);
                    v
                }
                (None, None) => break,
            };
            self.known_since = self.known_since.max(forgotten);
        }
    }

    /// The next update for `session`, if it needs one: its first update (a
    /// delta from what it holds when this run knows every removal since,
    /// else the full state), then a delta whenever a newer observation was
    /// made. `None` before the first observation and when the session is
    /// up to date.
    pub fn update_for(&self, session: &mut Session) -> Option<Update> {
        let version = self.version?;
        let update = match session.sent {
            None => match session.have {
                Some(have) if have >= self.known_since && have <= version => self.delta(have, true),
                _ => self.full(),
            },
            Some((sent, _)) if sent > version => self.full(),
            Some((sent, sent_at)) if sent < version || sent_at < self.as_of_ms => {
                self.delta(sent, false)
            }
            Some(_) => return None,
        };
        session.sent = Some((version, self.as_of_ms));
        Some(update)
    }

    fn full(&self) -> Update {
        Update {
            region: self.region.clone(),
            full: true,
            base: Revision(0),
            version: self.version.unwrap_or_default(),
            as_of_ms: self.as_of_ms,
            ingress: Some(self.ingress.clone()),
            policies: self.policies.values().cloned().collect(),
            removed_policies: Vec::new(),
            summaries: self.summaries.values().cloned().collect(),
            removed_services: Vec::new(),
            writers: self.writers.clone(),
        }
    }

    fn delta(&self, base: Revision, with_ingress: bool) -> Update {
        Update {
            region: self.region.clone(),
            full: false,
            base,
            version: self.version.unwrap_or_default(),
            as_of_ms: self.as_of_ms,
            ingress: with_ingress.then(|| self.ingress.clone()),
            policies: self
                .policies
                .values()
                .filter(|p| p.home_revision > base)
                .cloned()
                .collect(),
            removed_policies: self
                .removed_policies
                .iter()
                .filter(|(_, at)| **at > base)
                .map(|(k, _)| k.clone())
                .collect(),
            summaries: self
                .summaries
                .values()
                .filter(|s| s.revision > base)
                .cloned()
                .collect(),
            removed_services: self
                .removed_services
                .iter()
                .filter(|(_, at)| **at > base)
                .map(|(k, _)| k.clone())
                .collect(),
            writers: self.writers.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(s: &str) -> Label {
        Label::new(s).unwrap()
    }

    fn obs(version: u64, services: &[(&str, u64)]) -> Observation {
        Observation {
            version: Revision(version),
            policies: Vec::new(),
            summaries: services
                .iter()
                .map(|(s, r)| (s.parse().unwrap(), Revision(*r), 1, 100))
                .collect(),
            writers: Vec::new(),
        }
    }

    #[test]
    fn an_unchanged_summary_keeps_the_time_it_was_taken() {
        let mut p = Publisher::new(label("r1"), Vec::new());
        p.observe(obs(3, &[("a/b/c", 3)]), 1_000);
        p.observe(obs(4, &[("a/b/c", 3), ("a/d/c", 4)]), 2_000);
        let taken: Vec<u64> = p.summaries().map(|s| s.taken_at_ms).collect();
        assert_eq!(taken, [1_000, 2_000]);
    }

    #[test]
    fn a_catalog_that_went_back_starts_over_with_full_states() {
        let mut p = Publisher::new(label("r1"), Vec::new());
        p.observe(obs(10, &[("a/b/c", 3)]), 1_000);
        let mut session = Session::new(Some(Revision(10)));
        assert!(!p.update_for(&mut session).unwrap().full);
        // The arbiter's catalog was replaced by a younger one.
        p.observe(obs(2, &[("a/x/c", 2)]), 2_000);
        let next = p.update_for(&mut session).unwrap();
        assert!(next.full);
        assert_eq!(next.version, Revision(2));
        assert!(p.update_for(&mut session).is_none());
    }

    #[test]
    fn removals_are_remembered_up_to_a_bound() {
        let mut p = Publisher::new(label("r1"), Vec::new());
        let many: Vec<String> = (0..=MAX_REMOVALS)
            .map(|i| format!("ns/s{i}/http"))
            .collect();
        let all: Vec<(&str, u64)> = many.iter().map(|s| (s.as_str(), 1)).collect();
        p.observe(obs(1, &all), 0);
        p.observe(obs(2, &[]), 1);
        // One more removal than remembered: a peer at version 1 can no
        // longer get a delta.
        let update = p.update_for(&mut Session::new(Some(Revision(1)))).unwrap();
        assert!(update.full);
        let update = p.update_for(&mut Session::new(Some(Revision(2)))).unwrap();
        assert!(!update.full);
    }
}
