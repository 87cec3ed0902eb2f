//! The subscribing half of the bridge protocol, sans-IO: what this region
//! holds of one other region (its view and its policies), the `Hello` that
//! resumes from it, and the checks every `Update` must pass before it
//! changes anything.
//!
//! A delta must apply to exactly the version held, every policy must be
//! homed in the publisher's region, every summary must be of it: anything
//! else is a protocol error, the update is dropped whole and the connection
//! closed, so a misbehaving peer can never change this region's view by
//! halves. What an accepted update means for this region's arbiter (which
//! policies to store or drop, whether the view changed or was only
//! confirmed) comes back as a `Received`; the actor carries it out.

use std::collections::BTreeMap;

use rollcall_leases::remote::{RemoteError, MAX_INGRESS, MAX_REGION_SUMMARIES};
use rollcall_leases::{Label, PolicyKey, RegionView, RemotePolicy, Revision, ServiceKey};

use crate::message::{Hello, Update};

/// Why an update was refused. A refused update changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The update speaks for another region than the peer's.
    #[error("update of region {got} on the session of region {expected}")]
    WrongRegion {
        /// The peer's region.
        expected: Label,
        /// The region the update named.
        got: Label,
    },
    /// A delta on another version than the one held.
    #[error("delta on version {base}, but this bridge holds {held}")]
    WrongBase {
        /// The delta's base.
        base: Revision,
        /// What is held ("nothing" or a version).
        held: String,
    },
    /// A delta that goes back.
    #[error("delta from version {base} back to {version}")]
    Backwards {
        /// The delta's base.
        base: Revision,
        /// Its version.
        version: Revision,
    },
    /// A policy of another home than the publisher's region: a bridge
    /// speaks for its own region only.
    #[error("policy of {service} has home region {home}, but region {region}'s bridge sent it")]
    ForeignPolicy {
        /// The service.
        service: PolicyKey,
        /// The policy's home.
        home: Label,
        /// The publisher's region.
        region: Label,
    },
    /// The summaries are out of order, or a bound is exceeded.
    #[error("{0}")]
    View(#[from] RemoteError),
}

/// What an accepted update asks of this region's arbiter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Received {
    /// The update replaced the whole state.
    pub full: bool,
    /// Policies to store (newer than what was held).
    pub upserted: Vec<RemotePolicy>,
    /// Policies to drop, with the home version their removal was seen at.
    pub removed: Vec<(PolicyKey, Revision)>,
    /// The view (version, summaries or ingress) changed: send it whole.
    /// False: only confirm the version held.
    pub view_changed: bool,
    /// Items the update carried (`Update::items`).
    pub items: usize,
}

/// What this region holds of one other region.
#[derive(Clone, Debug)]
pub struct Subscriber {
    own: Label,
    view: RegionView,
    holds: bool,
    policies: BTreeMap<PolicyKey, RemotePolicy>,
    heard_at_ms: Option<u64>,
}

impl Subscriber {
    /// A subscriber of `region` for a bridge of region `own`, starting from
    /// what this region's arbiter still holds of it: its view (if any)
    /// and the policies of that home it stores.
    pub fn new(
        own: Label,
        region: Label,
        view: Option<RegionView>,
        policies: Vec<RemotePolicy>,
    ) -> Subscriber {
        let view = view.filter(|v| v.region == region);
        let holds = view.is_some();
        let view = view.unwrap_or_else(|| RegionView::empty(region.clone()));
        let policies = policies
            .into_iter()
            .filter(|p| p.policy.home_region() == &region)
            .map(|p| (p.policy.key().clone(), p))
            .collect();
        Subscriber {
            own,
            view,
            holds,
            policies,
            heard_at_ms: None,
        }
    }

    /// The region subscribed to.
    pub fn region(&self) -> &Label {
        &self.view.region
    }

    /// The first message of a session: this region, and the version held.
    pub fn hello(&self) -> Hello {
        Hello {
            region: self.own.clone(),
            have: self.holds.then_some(self.view.version),
        }
    }

    /// The view held, once there is one.
    pub fn view(&self) -> Option<&RegionView> {
        self.holds.then_some(&self.view)
    }

    /// The policies held, in key order.
    pub fn policies(&self) -> impl Iterator<Item = &RemotePolicy> {
        self.policies.values()
    }

    /// How long before `now_ms` the last update arrived (0 before any).
    pub fn heard_ms_ago(&self, now_ms: u64) -> u64 {
        self.heard_at_ms.map_or(0, |t| now_ms.saturating_sub(t))
    }

    /// Checks `update` and applies it, or refuses it changing nothing.
    pub fn receive(&mut self, update: Update, now_ms: u64) -> Result<Received, ProtocolError> {
        self.check(&update)?;
        let items = update.items();
        let old_version = self.view.version;
        let mut received = Received {
            full: update.full,
            items,
            ..Received::default()
        };
        if update.full {
            for key in self.policies.keys() {
                if !update.policies.iter().any(|p| p.policy.key() == key) {
                    received.removed.push((key.clone(), update.version));
                }
            }
            received.upserted = update
                .policies
                .iter()
                .filter(|p| {
                    self.policies
                        .get(p.policy.key())
                        .is_none_or(|held| held != *p)
                })
                .cloned()
                .collect();
            self.policies = update
                .policies
                .into_iter()
                .map(|p| (p.policy.key().clone(), p))
                .collect();
            self.view = RegionView {
                region: update.region,
                version: update.version,
                as_of_ms: update.as_of_ms,
                ingress: update.ingress.unwrap_or_default(),
                summaries: update.summaries,
            };
            received.view_changed = true;
        } else {
            for key in &update.removed_policies {
                if self.policies.remove(key).is_some() {
                    received.removed.push((key.clone(), update.version));
                }
            }
            for policy in update.policies {
                let newer = self
                    .policies
                    .get(policy.policy.key())
                    .is_none_or(|held| held.home_revision < policy.home_revision);
                if newer {
                    self.policies
                        .insert(policy.policy.key().clone(), policy.clone());
                    received.upserted.push(policy);
                }
            }
            let mut changed = update.version != old_version;
            if let Some(ingress) = update.ingress {
                changed |= ingress != self.view.ingress;
                self.view.ingress = ingress;
            }
            if !update.summaries.is_empty() || !update.removed_services.is_empty() {
                let mut map: BTreeMap<ServiceKey, _> = std::mem::take(&mut self.view.summaries)
                    .into_iter()
                    .map(|s| (s.service.clone(), s))
                    .collect();
                for gone in &update.removed_services {
                    changed |= map.remove(gone).is_some();
                }
                for summary in update.summaries {
                    changed |= map.get(&summary.service) != Some(&summary);
                    map.insert(summary.service.clone(), summary);
                }
                self.view.summaries = map.into_values().collect();
            }
            self.view.version = update.version;
            self.view.as_of_ms = update.as_of_ms;
            received.view_changed = changed || !self.holds;
        }
        self.holds = true;
        self.heard_at_ms = Some(now_ms);
        Ok(received)
    }

    /// Every rule an update must pass before it changes anything.
    fn check(&self, update: &Update) -> Result<(), ProtocolError> {
        let region = self.region();
        if update.region != *region {
            return Err(ProtocolError::WrongRegion {
                expected: region.clone(),
                got: update.region.clone(),
            });
        }
        if !update.full {
            if !self.holds || update.base != self.view.version {
                return Err(ProtocolError::WrongBase {
                    base: update.base,
                    held: if self.holds {
                        format!("version {}", self.view.version)
                    } else {
                        "nothing".to_owned()
                    },
                });
            }
            if update.version < update.base {
                return Err(ProtocolError::Backwards {
                    base: update.base,
                    version: update.version,
                });
            }
        }
        if let Some(p) = update
            .policies
            .iter()
            .find(|p| p.policy.home_region() != region)
        {
            return Err(ProtocolError::ForeignPolicy {
                service: p.policy.key().clone(),
                home: p.policy.home_region().clone(),
                region: region.clone(),
            });
        }
        if let Some(ingress) = &update.ingress {
            if ingress.len() > MAX_INGRESS {
                return Err(RemoteError::TooMany {
                    what: "ingress",
                    count: ingress.len(),
                    limit: MAX_INGRESS,
                }
                .into());
            }
        }
        let held = if update.full {
            0
        } else {
            self.view.summaries.len()
        };
        if held + update.summaries.len() > MAX_REGION_SUMMARIES {
            return Err(RemoteError::TooMany {
                what: "summaries",
                count: held + update.summaries.len(),
                limit: MAX_REGION_SUMMARIES,
            }
            .into());
        }
        if let Some(pair) = update
            .summaries
            .windows(2)
            .find(|pair| pair[0].service >= pair[1].service)
        {
            return Err(RemoteError::Unsorted {
                service: pair[1].service.clone(),
            }
            .into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::{Observation, Publisher, Session};
    use proptest::prelude::*;
    use rollcall_config::ServicePolicy;
    use rollcall_leases::{Ingress, Policy};

    fn label(s: &str) -> Label {
        Label::new(s).unwrap()
    }

    fn policy(service: &str, home: &str, revision: u64) -> RemotePolicy {
        let mut doc = ServicePolicy::new(service, home);
        // The revision shows in the document too, so versions differ.
        doc.max_snapshot_age_ms = Some(1_000 + revision);
        RemotePolicy {
            policy: Policy::new(doc).unwrap(),
            home_revision: Revision(revision),
            home_set_at_ms: revision * 10,
        }
    }

    fn obs(version: u64, policies: &[(&str, u64)], summaries: &[(&str, u64, u32)]) -> Observation {
        Observation {
            version: Revision(version),
            policies: policies.iter().map(|(s, r)| policy(s, "r1", *r)).collect(),
            summaries: summaries
                .iter()
                .map(|(s, r, ready)| {
                    (
                        s.parse().unwrap(),
                        Revision(*r),
                        *ready,
                        u64::from(*ready) * 100,
                    )
                })
                .collect(),
            writers: Vec::new(),
        }
    }

    fn publisher() -> Publisher {
        Publisher::new(label("r1"), vec![Ingress::new("edge.r1:443").unwrap()])
    }

    fn subscriber() -> Subscriber {
        Subscriber::new(label("r2"), label("r1"), None, Vec::new())
    }

    /// The subscriber holds exactly what the publisher publishes.
    fn assert_same(p: &Publisher, s: &Subscriber) {
        let view = s.view().expect("a view");
        assert_eq!(Some(view.version), p.version());
        // The time a summary was taken is informative: a restarted
        // publisher stamps its own, and an unchanged summary is not re-sent.
        let counts = |s: &rollcall_leases::ServiceSummary| {
            (s.service.clone(), s.revision, s.ready, s.weight)
        };
        assert_eq!(
            view.summaries.iter().map(counts).collect::<Vec<_>>(),
            p.summaries().map(counts).collect::<Vec<_>>()
        );
        assert_eq!(
            s.policies().collect::<Vec<_>>(),
            p.policies().collect::<Vec<_>>()
        );
        assert_eq!(view.ingress, vec![Ingress::new("edge.r1:443").unwrap()]);
    }

    #[test]
    fn a_full_state_then_deltas_then_confirmations() {
        let mut p = publisher();
        let mut s = subscriber();
        let mut session = Session::new(s.hello().have);
        assert_eq!(s.hello().have, None);
        assert!(p.update_for(&mut session).is_none(), "nothing observed yet");

        p.observe(
            obs(
                5,
                &[("shop/cart", 2), ("shop/web", 3)],
                &[("shop/cart/http", 4, 2), ("shop/web/http", 5, 1)],
            ),
            1_000,
        );
        let first = p.update_for(&mut session).unwrap();
        assert!(first.full);
        assert_eq!(first.items(), 4);
        let got = s.receive(first, 1_001).unwrap();
        assert_eq!(
            (got.full, got.upserted.len(), got.view_changed),
            (true, 2, true)
        );
        assert_same(&p, &s);
        assert!(p.update_for(&mut session).is_none(), "up to date");

        // Nothing changed, but the region confirmed it: a bare delta.
        p.observe(
            obs(
                5,
                &[("shop/cart", 2), ("shop/web", 3)],
                &[("shop/cart/http", 4, 2), ("shop/web/http", 5, 1)],
            ),
            2_000,
        );
        let confirm = p.update_for(&mut session).unwrap();
        assert_eq!((confirm.full, confirm.items()), (false, 0));
        let got = s.receive(confirm, 2_001).unwrap();
        assert!(!got.view_changed);
        assert_eq!(s.view().unwrap().as_of_ms, 2_000);
        assert_eq!(s.heard_ms_ago(2_500), 499);

        // One summary changed and one policy deleted: two items.
        p.observe(
            obs(
                7,
                &[("shop/cart", 2)],
                &[("shop/cart/http", 4, 2), ("shop/web/http", 7, 0)],
            ),
            3_000,
        );
        let delta = p.update_for(&mut session).unwrap();
        assert_eq!(delta.items(), 2);
        assert_eq!(delta.ingress, None, "ingress went with the first update");
        let got = s.receive(delta, 3_001).unwrap();
        assert_eq!(
            got.removed,
            vec![("shop/web".parse().unwrap(), Revision(7))]
        );
        assert!(got.upserted.is_empty());
        assert!(got.view_changed);
        assert_same(&p, &s);
    }

    #[test]
    fn a_returning_subscriber_resumes_by_delta_from_what_its_arbiter_holds() {
        let mut p = publisher();
        let mut s = subscriber();
        let mut session = Session::new(None);
        p.observe(
            obs(5, &[("shop/cart", 2)], &[("shop/cart/http", 4, 2)]),
            1_000,
        );
        s.receive(p.update_for(&mut session).unwrap(), 1_000)
            .unwrap();

        // The subscribing bridge restarts: it starts again from what its
        // arbiter holds. Meanwhile one policy was added.
        let held_view = s.view().cloned();
        let held_policies: Vec<RemotePolicy> = s.policies().cloned().collect();
        p.observe(
            obs(
                6,
                &[("shop/cart", 2), ("shop/web", 6)],
                &[("shop/cart/http", 4, 2)],
            ),
            2_000,
        );
        let mut again = Subscriber::new(label("r2"), label("r1"), held_view, held_policies);
        assert_eq!(again.hello().have, Some(Revision(5)));
        let mut session = Session::new(again.hello().have);
        let resume = p.update_for(&mut session).unwrap();
        assert!(!resume.full);
        assert_eq!(resume.items(), 1, "only the new policy");
        assert!(resume.ingress.is_some());
        let got = again.receive(resume, 2_000).unwrap();
        assert_eq!(got.upserted.len(), 1);
        assert_same(&p, &again);
    }

    #[test]
    fn the_full_state_when_the_publisher_cannot_know_what_was_removed() {
        let mut first = publisher();
        first.observe(
            obs(5, &[("shop/cart", 2)], &[("shop/cart/http", 4, 2)]),
            1_000,
        );
        let mut s = subscriber();
        s.receive(first.update_for(&mut Session::new(None)).unwrap(), 1_000)
            .unwrap();

        // The publishing bridge restarted after shop/cart was deleted: it
        // never saw the deletion, so a resume from 5 gets the full state,
        // and the subscriber drops what is gone.
        let mut restarted = publisher();
        restarted.observe(obs(9, &[], &[("shop/cart/http", 4, 2)]), 2_000);
        let full = restarted
            .update_for(&mut Session::new(s.hello().have))
            .unwrap();
        assert!(full.full);
        let got = s.receive(full, 2_000).unwrap();
        assert_eq!(
            got.removed,
            vec![("shop/cart".parse().unwrap(), Revision(9))]
        );
        assert_same(&restarted, &s);

        // A subscriber claiming a version this region never reached (its
        // arbiter was replaced) gets the full state too.
        let ahead = restarted
            .update_for(&mut Session::new(Some(Revision(99))))
            .unwrap();
        assert!(ahead.full);
    }

    #[test]
    fn a_bad_update_is_refused_whole_and_changes_nothing() {
        let mut p = publisher();
        let mut s = subscriber();
        p.observe(
            obs(5, &[("shop/cart", 2)], &[("shop/cart/http", 4, 2)]),
            1_000,
        );
        let full = p.update_for(&mut Session::new(None)).unwrap();
        s.receive(full.clone(), 1_000).unwrap();
        let before = (s.view().cloned(), s.policies().cloned().collect::<Vec<_>>());

        let mut wrong_base = full.clone();
        wrong_base.full = false;
        wrong_base.base = Revision(4);
        let mut wrong_region = full.clone();
        wrong_region.region = label("r3");
        let mut foreign = full.clone();
        foreign.policies.push(policy("shop/web", "r3", 3));
        let mut unsorted = full.clone();
        unsorted.summaries.insert(
            0,
            rollcall_leases::ServiceSummary {
                service: "zz/last/http".parse().unwrap(),
                revision: Revision(1),
                ready: 1,
                weight: 1,
                taken_at_ms: 0,
            },
        );
        let mut backwards = full.clone();
        backwards.full = false;
        backwards.base = Revision(5);
        backwards.version = Revision(3);
        for (bad, what) in [
            (wrong_base, "wrong base"),
            (wrong_region, "wrong region"),
            (foreign, "foreign policy"),
            (unsorted, "unsorted"),
            (backwards, "backwards"),
        ] {
            assert!(s.receive(bad, 9_000).is_err(), "{what} accepted");
            assert_eq!(
                (s.view().cloned(), s.policies().cloned().collect::<Vec<_>>()),
                before,
                "{what} changed something"
            );
            assert_eq!(s.heard_ms_ago(9_000), 8_000, "{what} counted as heard");
        }

        // A delta to a subscriber holding nothing is refused too.
        let mut empty = subscriber();
        let mut delta = full;
        delta.full = false;
        assert!(empty.receive(delta, 1).is_err());
        assert!(empty.view().is_none());
    }

    /// One step of a random history: the publisher's region changes, the
    /// link carries an update, or a bridge restarts.
    #[derive(Clone, Debug)]
    enum Step {
        /// Set or delete a policy / summary (service index, present?).
        Policy(u8, bool),
        Summary(u8, u32),
        DropService(u8),
        /// The publisher reads its arbiter.
        Observe,
        /// The session sends what the subscriber needs.
        Send,
        /// The subscribing bridge restarts (resumes from its arbiter).
        RestartSubscriber,
        /// The publishing bridge restarts (forgets its removals).
        RestartPublisher,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..6u8, any::<bool>()).prop_map(|(i, on)| Step::Policy(i, on)),
            (0..6u8, 0..4u32).prop_map(|(i, r)| Step::Summary(i, r)),
            (0..6u8).prop_map(Step::DropService),
            Just(Step::Observe),
            Just(Step::Send),
            Just(Step::Send),
            Just(Step::RestartSubscriber),
            Just(Step::RestartPublisher),
        ]
    }

    proptest! {
        /// Whatever the history, once the publisher has observed and the
        /// session has sent, the subscriber holds exactly the publisher's
        /// state, and every update it got was accepted.
        #[test]
        fn the_subscriber_converges_through_restarts(steps in proptest::collection::vec(step(), 1..60)) {
            // The region's catalog: revision, policies and services.
            let mut revision = 1u64;
            let mut policies: BTreeMap<u8, u64> = BTreeMap::new();
            let mut services: BTreeMap<u8, (u64, u32)> = BTreeMap::new();
            let read = |revision: u64, policies: &BTreeMap<u8, u64>, services: &BTreeMap<u8, (u64, u32)>| Observation {
                version: Revision(revision),
                policies: policies.iter().map(|(i, r)| policy(&format!("ns/s{i}"), "r1", *r)).collect(),
                summaries: services.iter().map(|(i, (r, ready))| (format!("ns/s{i}/http").parse().unwrap(), Revision(*r), *ready, u64::from(*ready))).collect(),
                writers: Vec::new(),
            };
            let mut p = publisher();
            let mut s = subscriber();
            let mut session = Session::new(None);
            let mut now = 0;
            for step in steps {
                now += 10;
                match step {
                    Step::Policy(i, on) => {
                        revision += 1;
                        if on { policies.insert(i, revision); } else { policies.remove(&i); }
                    }
                    Step::Summary(i, ready) => {
                        revision += 1;
                        services.insert(i, (revision, ready));
                    }
                    Step::DropService(i) => {
                        revision += 1;
                        services.remove(&i);
                    }
                    Step::Observe => p.observe(read(revision, &policies, &services), now),
                    Step::Send => {
                        if let Some(update) = p.update_for(&mut session) {
                            prop_assert!(s.receive(update, now).is_ok());
                        }
                    }
                    Step::RestartSubscriber => {
                        s = Subscriber::new(label("r2"), label("r1"), s.view().cloned(), s.policies().cloned().collect());
                        session = Session::new(s.hello().have);
                    }
                    Step::RestartPublisher => {
                        p = publisher();
                        session = Session::new(s.hello().have);
                    }
                }
            }
            p.observe(read(revision, &policies, &services), now + 10);
            if let Some(update) = p.update_for(&mut session) {
                prop_assert!(s.receive(update, now + 10).is_ok());
            }
            assert_same(&p, &s);
        }
    }
}
