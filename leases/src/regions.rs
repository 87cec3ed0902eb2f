//! What an agent learns of regions with its subscriptions (R9): the
//! policies of the services it follows (homed here or replicated from their
//! home region) and, for those services only, every other region's summary
//! with the region's ingress addresses and the view's age. The agent's data
//! plane decides failover from it; this module decides nothing about
//! routing.
//!
//! Sans-IO. [`regions_update`] builds one agent's message from the catalog
//! and the remote view; [`RegionsFeed`] remembers what each session was
//! sent and says when to send again: when anything but the ages changed,
//! or when the agent's copy of the ages is a quarter of the freshness limit
//! old (so an agent's own clock can age a view it stops hearing about, and
//! a fresh view never looks stale to it).

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::ids::AgentId;
use crate::ids::Revision;
use crate::name::{Label, ServiceKey};
use crate::policy::{Policy, PolicyKey};
use crate::protocol::SessionDown;
use crate::remote::{Ingress, RemoteViews, ServiceSummary};
use crate::writer::WriterEpoch;

/// Most policies one update carries (an agent follows tens of services).
pub const MAX_UPDATE_POLICIES: usize = 4_096;

/// One policy as an agent holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldPolicy {
    /// The policy (validated again when decoded).
    pub policy: Policy,
    /// Its revision in its home region's catalog: what orders its versions
    /// in every region.
    pub home_revision: Revision,
}

/// One other region, restricted to the agent's services.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionEntry {
    /// The region.
    pub region: Label,
    /// How old the arbiter's view of it was when this was sent, ms.
    pub age_ms: u64,
    /// Past this age the region counts as unknown, ms (the bridge's
    /// `summary_max_age_ms`).
    pub max_age_ms: u64,
    /// The region's catalog revision the view is complete up to.
    pub version: Revision,
    /// Its edge gateways.
    pub ingress: Vec<Ingress>,
    /// Summaries of the agent's services there, sorted by service (a
    /// service the region does not have is absent).
    pub summaries: Vec<ServiceSummary>,
}

/// Arbiter → agent: everything regional about the agent's services. Each
/// message replaces the previous one whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RegionsUpdate {
    /// Policies of the followed services, sorted by key.
    pub policies: Vec<HeldPolicy>,
    /// Every other region this arbiter holds a view of, in region order.
    pub regions: Vec<RegionEntry>,
    /// The writer epochs of the followed single-writer services, sorted by
    /// key (`writer`). Not in this struct's own encoding, which stays the
    /// one agents of earlier releases read: an update with writer epochs
    /// travels as `SessionDown::RegionsWithWriters` (see
    /// [`RegionsUpdate::into_message`]), and the agent's regions file
    /// stores them beside it.
    #[serde(skip)]
    pub writers: Vec<WriterEpoch>,
}

impl RegionsUpdate {
    /// Whether it says nothing at all.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.regions.is_empty() && self.writers.is_empty()
    }

    /// The session message carrying it: `Regions` when it has no writer
    /// epoch (every agent release reads it), `RegionsWithWriters`
    /// otherwise.
    pub fn into_message(mut self) -> SessionDown {
        if self.writers.is_empty() {
            SessionDown::Regions(self)
        } else {
            let writers = std::mem::take(&mut self.writers);
            SessionDown::RegionsWithWriters(self, writers)
        }
    }

    /// The writer epoch held for `key`, if any.
    pub fn writer(&self, key: &PolicyKey) -> Option<&WriterEpoch> {
        self.writers.iter().find(|w| &w.service == key)
    }

    /// A digest of everything but the ages: equal digests mean the agent
    /// would learn nothing new but time.
    fn fingerprint(&self) -> u64 {
        let mut aged = self.clone();
        for r in &mut aged.regions {
            r.age_ms = 0;
        }
        let bytes = postcard::to_allocvec(&(&aged, &self.writers)).unwrap_or_default();
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }
}

/// The update for an agent following `services`, at `now_ms`.
pub fn regions_update<'a>(
    services: impl IntoIterator<Item = &'a ServiceKey>,
    catalog: &Catalog,
    remote: &RemoteViews,
    now_ms: u64,
) -> RegionsUpdate {
    let services: BTreeSet<&ServiceKey> = services.into_iter().collect();
    let keys: BTreeSet<PolicyKey> = services
        .iter()
        .map(|s| PolicyKey {
            namespace: s.namespace.clone(),
            service: s.service.clone(),
        })
        .collect();
    let policies = keys
        .iter()
        .filter_map(|key| {
            if let Some(stored) = catalog.policy(key) {
                Some(HeldPolicy {
                    policy: stored.policy.clone(),
                    home_revision: stored.revision,
                })
            } else {
                catalog.replicated_policy(key).map(|r| HeldPolicy {
                    policy: r.remote.policy.clone(),
                    home_revision: r.remote.home_revision,
                })
            }
        })
        .take(MAX_UPDATE_POLICIES)
        .collect();
    let regions = remote
        .iter()
        .map(|held| RegionEntry {
            region: held.view.region.clone(),
            age_ms: held.age_ms(now_ms),
            max_age_ms: held.max_age_ms,
            version: held.view.version,
            ingress: held.view.ingress.clone(),
            summaries: services
                .iter()
                .filter_map(|s| held.view.summary(s).cloned())
                .collect(),
        })
        .collect();
    let writers = keys
        .iter()
        .filter_map(|key| catalog.writer(key))
        .take(MAX_UPDATE_POLICIES)
        .collect();
    RegionsUpdate {
        policies,
        regions,
        writers,
    }
}

/// What decides whether an agent's message may have changed, besides the
/// agent's own subscriptions: the remote views' generation and the policy
/// set (count and highest revision, home and replicated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionsEpoch {
    /// `RemoteViews::generation`.
    pub views: u64,
    /// How many policies the catalog holds.
    pub policies: usize,
    /// The highest revision that stored one (or a writer epoch).
    pub policy_revision: Revision,
}

impl RegionsEpoch {
    /// The epoch of `catalog` and `remote` now.
    pub fn of(catalog: &Catalog, remote: &RemoteViews) -> RegionsEpoch {
        let home = catalog.policies().map(|p| p.revision);
        let replicated = catalog.replicated_policies().map(|p| p.revision);
        let writers = catalog.writers().map(|w| w.revision);
        let (count, top) = home
            .chain(replicated)
            .chain(writers)
            .fold((0, Revision(0)), |(n, top), r| (n + 1, top.max(r)));
        RegionsEpoch {
            views: remote.generation(),
            policies: count,
            policy_revision: top,
        }
    }
}

#[derive(Debug)]
struct Sent {
    fingerprint: u64,
    at_ms: u64,
    refresh_ms: Option<u64>,
    epoch: RegionsEpoch,
}

/// Each session's last regions message.
#[derive(Debug, Default)]
pub struct RegionsFeed {
    sent: HashMap<AgentId, Sent>,
}

/// Shortest and longest re-send interval of an unchanged update, ms.
const REFRESH_BOUNDS_MS: (u64, u64) = (1_000, 60_000);

impl RegionsFeed {
    /// Nothing sent yet.
    pub fn new() -> Self {
        RegionsFeed::default()
    }

    /// Whether `agent`'s message cannot have changed since it was last
    /// looked at under `epoch` (its subscriptions unchanged), and no
    /// refresh of its ages is due: then it need not even be built.
    pub fn unchanged(&self, agent: AgentId, epoch: RegionsEpoch, now_ms: u64) -> bool {
        self.sent
            .get(&agent)
            .is_some_and(|s| s.epoch == epoch && s.refresh_ms.is_none_or(|r| now_ms < s.at_ms + r))
    }

    /// Whether `update`, built under `epoch`, must go to `agent` now; if so
    /// it is recorded as sent. An empty update goes out only to replace a
    /// non-empty one.
    pub fn due(
        &mut self,
        agent: AgentId,
        update: &RegionsUpdate,
        epoch: RegionsEpoch,
        now_ms: u64,
    ) -> bool {
        let fingerprint = update.fingerprint();
        let refresh_ms = update
            .regions
            .iter()
            .map(|r| r.max_age_ms / 4)
            .min()
            .map(|r| r.clamp(REFRESH_BOUNDS_MS.0, REFRESH_BOUNDS_MS.1));
        let due = match self.sent.get(&agent) {
            None => !update.is_empty(),
            Some(s) => {
                s.fingerprint != fingerprint || s.refresh_ms.is_some_and(|r| now_ms >= s.at_ms + r)
            }
        };
        match self.sent.get_mut(&agent) {
            Some(s) if !due => s.epoch = epoch,
            _ => {
                self.sent.insert(
                    agent,
                    Sent {
                        fingerprint,
                        at_ms: now_ms,
                        refresh_ms,
                        epoch,
                    },
                );
            }
        }
        due
    }

    /// The agent's subscriptions changed: build its message at the next
    /// look.
    pub fn touch(&mut self, agent: AgentId) {
        if let Some(s) = self.sent.get_mut(&agent) {
            s.epoch = RegionsEpoch {
                views: u64::MAX,
                ..s.epoch
            };
        }
    }

    /// The session is gone (a new one starts from nothing).
    pub fn forget(&mut self, agent: AgentId) {
        self.sent.remove(&agent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::RegionView;

    const E: RegionsEpoch = RegionsEpoch {
        views: 0,
        policies: 0,
        policy_revision: Revision(0),
    };

    #[test]
    fn an_agent_is_not_looked_at_again_until_the_epoch_moves_or_a_refresh_is_due() {
        let catalog = Catalog::new(crate::CatalogParams::with_region(label("r1")));
        let mut remote = RemoteViews::new(label("r1"));
        let web: ServiceKey = "shop/web/http".parse().unwrap();
        let mut feed = RegionsFeed::new();
        assert!(!feed.unchanged(1, E, 0), "never looked at");
        let epoch0 = RegionsEpoch::of(&catalog, &remote);
        assert!(!feed.due(1, &regions_update([&web], &catalog, &remote, 0), epoch0, 0));
        assert!(
            feed.unchanged(1, epoch0, 5_000),
            "nothing to say, nothing moved"
        );
        remote.put(view(5, 2), 0, 8_000, 10).unwrap();
        let epoch1 = RegionsEpoch::of(&catalog, &remote);
        assert_ne!(epoch0, epoch1);
        assert!(!feed.unchanged(1, epoch1, 20));
        assert!(feed.due(
            1,
            &regions_update([&web], &catalog, &remote, 20),
            epoch1,
            20
        ));
        assert!(feed.unchanged(1, epoch1, 1_000));
        assert!(
            !feed.unchanged(1, epoch1, 2_020),
            "a refresh is due after 8 s / 4"
        );
        feed.touch(1);
        assert!(!feed.unchanged(1, epoch1, 30), "its subscriptions changed");
    }

    fn label(s: &str) -> Label {
        Label::new(s).unwrap()
    }

    fn view(version: u64, ready: u32) -> RegionView {
        RegionView {
            region: label("r2"),
            version: Revision(version),
            as_of_ms: 0,
            ingress: vec![Ingress::new("127.0.0.1:9443").unwrap()],
            summaries: vec![
                ServiceSummary {
                    service: "shop/cart/http".parse().unwrap(),
                    revision: Revision(3),
                    ready: 9,
                    weight: 900,
                    taken_at_ms: 0,
                },
                ServiceSummary {
                    service: "shop/web/http".parse().unwrap(),
                    revision: Revision(version),
                    ready,
                    weight: u64::from(ready) * 100,
                    taken_at_ms: 0,
                },
            ],
        }
    }

    #[test]
    fn an_agent_gets_only_its_services_and_a_refresh_before_its_copy_ages() {
        let catalog = Catalog::new(crate::CatalogParams::with_region(label("r1")));
        let mut remote = RemoteViews::new(label("r1"));
        remote.put(view(5, 2), 0, 8_000, 10_000).unwrap();
        let web: ServiceKey = "shop/web/http".parse().unwrap();
        let update = regions_update([&web], &catalog, &remote, 10_500);
        assert_eq!(update.regions.len(), 1);
        assert_eq!(update.regions[0].age_ms, 500);
        assert_eq!(update.regions[0].summaries.len(), 1);
        assert_eq!(update.regions[0].summaries[0].ready, 2);

        let mut feed = RegionsFeed::new();
        assert!(feed.due(1, &update, E, 10_500));
        // Only older: not again until a quarter of the 8 s limit passed.
        let later = regions_update([&web], &catalog, &remote, 11_000);
        assert!(!feed.due(1, &later, E, 11_000));
        let later = regions_update([&web], &catalog, &remote, 12_500);
        assert!(feed.due(1, &later, E, 12_500));
        // A change goes out at once.
        remote.put(view(6, 0), 0, 8_000, 12_600).unwrap();
        let changed = regions_update([&web], &catalog, &remote, 12_600);
        assert!(feed.due(1, &changed, E, 12_600));
        // A change to a service the agent does not follow is not news.
        let mut other = view(6, 0);
        other.summaries[0].ready = 1;
        remote.put(other, 0, 8_000, 12_700).unwrap();
        let same = regions_update([&web], &catalog, &remote, 12_700);
        assert!(!feed.due(1, &same, E, 12_700));
    }

    #[test]
    fn nothing_to_say_is_not_sent_until_it_replaces_something() {
        let catalog = Catalog::new(crate::CatalogParams::with_region(label("r1")));
        let mut feed = RegionsFeed::new();
        let empty = RegionsUpdate::default();
        assert!(!feed.due(7, &empty, E, 0));
        let mut remote = RemoteViews::new(label("r1"));
        remote.put(view(5, 2), 0, 8_000, 0).unwrap();
        let web: ServiceKey = "shop/web/http".parse().unwrap();
        assert!(feed.due(7, &regions_update([&web], &catalog, &remote, 0), E, 0));
        assert!(feed.due(7, &empty, E, 1));
        assert!(!feed.due(7, &empty, E, 2));
        feed.forget(7);
        assert!(!feed.due(7, &empty, E, 3));
    }
}
