//! Following: the catalog views the agent holds (`sync`), the services it
//! follows (always: `agent.services` and the proxies' services; on
//! demand: what the data plane looked up, dropped when nobody asks), the
//! regions message, what each view publishes to the data plane (with the
//! service's staleness limit), and the disk cache of the views.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rand::{Rng, RngExt};
use rollcall_config::AgentConfig;
use rollcall_leases::protocol::{ServiceUpdate, SessionUp};
use rollcall_leases::{
    shard_of, CatalogId, RegionsUpdate, Revision, ServiceKey, ServiceView, ShardId,
};

use super::{AgentState, Output, SessionId, FLUSH_DELAY_MS, SHARDS};
use crate::failover::Regions;
use crate::registrations::Intent;
use crate::sync::{CatalogSync, Discard, SyncOut};
use crate::view::{Published, Status};

/// The views followed and what they publish.
pub(super) struct Following {
    pub(super) sync: CatalogSync,
    /// The highest revision of the shard seen (for the lag of each view).
    pub(super) shard_revision: Revision,
    pub(super) regions: Regions,
    /// Subscriptions to send again (`RetryAfter`, `NotYet`), by when.
    retries: BTreeMap<u64, Vec<ServiceKey>>,
    /// Views to write to the disk cache, and services whose files go.
    dirty: BTreeSet<ServiceKey>,
    forget: BTreeSet<ServiceKey>,
    flush_at: Option<u64>,
    /// Views to publish at the end of this input (all of them when
    /// `publish_all`).
    publish: BTreeSet<ServiceKey>,
    publish_all: bool,
    /// Whether views that changed are announced (`Changed`) instead of
    /// built and published at once.
    defer: bool,
    /// Services always followed: `agent.services` and the `[[proxy]]`
    /// listeners' services.
    pinned: BTreeSet<ServiceKey>,
    /// Services followed on demand (a lookup, or the disk cache), with
    /// when they were followed (ms): dropped when nobody asks for them.
    on_demand: BTreeMap<ServiceKey, u64>,
}

impl Following {
    pub(super) fn new(
        config: &AgentConfig,
        cached: Vec<(ServiceView, Option<CatalogId>)>,
        regions_cached: Option<(RegionsUpdate, u64)>,
        now_ms: u64,
    ) -> Following {
        let pinned: BTreeSet<ServiceKey> = config
            .services
            .iter()
            .filter_map(|s| s.parse::<ServiceKey>().ok())
            .chain(config.proxy.iter().filter_map(|p| p.service.parse().ok()))
            .collect();
        let mut on_demand = BTreeMap::new();
        let mut sync = CatalogSync::new(ShardId(0));
        for (view, catalog) in cached {
            if !pinned.contains(view.service()) {
                on_demand.insert(view.service().clone(), now_ms);
            }
            sync.load_cached(view, catalog);
        }
        for service in &config.services {
            if let Ok(key) = service.parse::<ServiceKey>() {
                sync.follow(key, &mut Vec::new());
            }
        }
        let mut regions = Regions::new();
        if let Some((update, received_at_ms)) = regions_cached {
            regions.update(update, received_at_ms);
        }
        Following {
            sync,
            shard_revision: Revision(0),
            regions,
            retries: BTreeMap::new(),
            dirty: BTreeSet::new(),
            forget: BTreeSet::new(),
            flush_at: None,
            publish: BTreeSet::new(),
            publish_all: true,
            defer: false,
            pinned,
            on_demand,
        }
    }

    /// `service`'s view must be published again at the end of this input.
    pub(super) fn republish(&mut self, service: ServiceKey) {
        self.publish.insert(service);
    }

    /// The session ended: every view's staleness counts from now.
    pub(super) fn disconnected(&mut self, now_ms: u64) {
        self.sync.disconnected(now_ms);
        self.publish_all = true;
    }

    pub(super) fn next_wake(&self) -> Option<u64> {
        [self.retries.keys().next().copied(), self.flush_at]
            .into_iter()
            .flatten()
            .min()
    }

    fn cache_later(&mut self, now_ms: u64) {
        self.flush_at.get_or_insert(now_ms + FLUSH_DELAY_MS);
    }

    /// What the sync asked for, as outputs on the session (when one is up)
    /// and as cache and publication work.
    fn carry<R: Rng + ?Sized>(
        &mut self,
        outs: Vec<SyncOut>,
        session: Option<SessionId>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        for o in outs {
            match o {
                SyncOut::Subscribe { service, have } => {
                    if let Some(session) = session {
                        out.push(Output::Send {
                            session,
                            message: SessionUp::Subscribe {
                                shard: shard_of(&service, SHARDS),
                                service,
                                have,
                            },
                        });
                    }
                }
                SyncOut::Ack { service, revision } => {
                    if let Some(session) = session {
                        out.push(Output::Send {
                            session,
                            message: SessionUp::Ack { service, revision },
                        });
                    }
                }
                SyncOut::Persist(service) => {
                    // What was applied (deltas or a snapshot) changes the
                    // view; a mere re-acknowledgement does not.
                    self.publish.insert(service.clone());
                    self.forget.remove(&service);
                    self.dirty.insert(service);
                    self.cache_later(now_ms);
                }
                SyncOut::Forget(service) => {
                    self.publish.insert(service.clone());
                    self.dirty.remove(&service);
                    self.forget.insert(service);
                    self.cache_later(now_ms);
                }
                SyncOut::RetryLater { service, base_ms } => {
                    let wait = base_ms + rng.random_range(0..=base_ms);
                    self.retries.entry(now_ms + wait).or_default().push(service);
                }
            }
        }
    }

    /// Catalog updates for the views.
    pub(super) fn update<R: Rng + ?Sized>(
        &mut self,
        items: Vec<ServiceUpdate>,
        session: Option<SessionId>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let mut outs = Vec::new();
        for item in items {
            if let ServiceUpdate::Deltas(ds) = &item {
                if let Some(last) = ds.last() {
                    self.shard_revision = self.shard_revision.max(last.revision);
                }
            }
            if let Some(service) = updated_service(&item) {
                self.publish.insert(service);
            }
            self.sync.update(item, now_ms, &mut outs);
        }
        self.carry(outs, session, now_ms, rng, out);
    }

    /// A new session's Welcome: the views are checked against its catalog
    /// and subscribed again.
    pub(super) fn connected<R: Rng + ?Sized>(
        &mut self,
        arbiter: &str,
        (catalog, revision): (Option<CatalogId>, Revision),
        session: Option<SessionId>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        self.shard_revision = self.shard_revision.max(revision);
        let mut outs = Vec::new();
        let discarded = self.sync.connected(catalog, revision, &mut outs);
        report_discarded(arbiter, catalog, revision, &discarded);
        self.carry(outs, session, now_ms, rng, out);
    }

    /// The regions message; whether it changed what is held.
    pub(super) fn regions_update(&mut self, update: &RegionsUpdate, now_ms: u64) -> bool {
        let changed = self.regions.update(update.clone(), now_ms);
        if changed {
            // Policies may set a service's staleness limit.
            self.publish_all = true;
        }
        changed
    }

    /// Writes the changed views to the disk cache now.
    pub(super) fn flush(&mut self, out: &mut Vec<Output>) {
        self.flush_at = None;
        let dirty = std::mem::take(&mut self.dirty);
        let forget: Vec<ServiceKey> = std::mem::take(&mut self.forget).into_iter().collect();
        let views: Vec<(Arc<ServiceView>, Option<CatalogId>)> = dirty
            .iter()
            .filter_map(|s| {
                let t = self.sync.get(s)?;
                Some((t.view.clone()?, t.catalog))
            })
            .collect();
        if !views.is_empty() || !forget.is_empty() {
            out.push(Output::StoreViews { views, forget });
        }
    }
}

impl AgentState {
    /// The data plane looked up a service not followed yet.
    pub(super) fn follow<R: Rng + ?Sized>(
        &mut self,
        service: ServiceKey,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let f = &mut self.following;
        let mut outs = Vec::new();
        if f.sync.follow(service.clone(), &mut outs) {
            if !f.pinned.contains(&service) {
                f.on_demand.insert(service.clone(), now_ms);
            }
            f.publish.insert(service);
        }
        f.carry(outs, self.link.up_session(), now_ms, rng, out);
    }

    /// How often the driver reports the data plane's usage
    /// (`Input::Usage`), ms: often enough that a forgotten unknown service
    /// goes within about a quarter of `unknown_ttl_ms` past it.
    pub fn usage_interval_ms(&self) -> u64 {
        (self.settings.config.unknown_ttl_ms / 4).clamp(250, 10_000)
    }

    /// Drops the services followed on demand that nobody asked for: one
    /// with nothing held (unknown to the arbiter, refused, or never
    /// answered) after `unknown_ttl_ms`, one held after `follow_idle_ms`
    /// while a session is up (never while the arbiter is out of reach: the
    /// copy may be all a caller has then).
    pub(super) fn usage(
        &mut self,
        usage: Vec<(ServiceKey, u64)>,
        now_ms: u64,
        out: &mut Vec<Output>,
    ) {
        let config = &self.settings.config;
        let connected = self.link.is_connected();
        let f = &mut self.following;
        let mut idle = Vec::new();
        for (service, last_used_ms) in usage {
            let (Some(&since), Some(t)) = (f.on_demand.get(&service), f.sync.get(&service)) else {
                continue;
            };
            let quiet_ms = now_ms.saturating_sub(last_used_ms.max(since));
            let holds = t.view.as_ref().is_some_and(|v| v.exists());
            let gone = if holds {
                connected && config.follow_idle_ms > 0 && quiet_ms >= config.follow_idle_ms
            } else {
                quiet_ms >= config.unknown_ttl_ms
            };
            if gone {
                idle.push((service, holds));
            }
        }
        if idle.is_empty() {
            return;
        }
        let held = idle.iter().filter(|(_, holds)| *holds).count();
        tracing::debug!(
            unknown = idle.len() - held,
            idle = held,
            "services nobody looked up are no longer followed"
        );
        let session = self.link.up_session();
        for (service, _) in idle {
            f.sync.unfollow(&service);
            f.on_demand.remove(&service);
            f.publish.remove(&service);
            f.dirty.remove(&service);
            f.forget.insert(service.clone());
            f.cache_later(now_ms);
            if let Some(session) = session {
                out.push(Output::Send {
                    session,
                    message: SessionUp::Unsubscribe {
                        service: service.clone(),
                    },
                });
            }
            out.push(Output::Unpublish(service));
        }
    }

    /// Subscriptions the arbiter asked to send again, and the disk cache.
    pub(super) fn following_tick<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let session = self.link.up_session();
        let f = &mut self.following;
        let later = f.retries.split_off(&(now_ms + 1));
        for service in std::mem::replace(&mut f.retries, later)
            .into_values()
            .flatten()
        {
            let mut outs = Vec::new();
            f.sync.retry(&service, &mut outs);
            f.carry(outs, session, now_ms, rng, out);
        }
        if f.flush_at.is_some_and(|t| t <= now_ms) {
            f.flush(out);
        }
    }

    /// Writes the changed views to the disk cache now.
    pub fn flush(&mut self, out: &mut Vec<Output>) {
        self.following.flush(out);
    }

    /// Publishes (or announces) the views that changed during this input.
    pub(super) fn publish_changed(&mut self, out: &mut Vec<Output>) {
        let f = &mut self.following;
        let keys: Vec<ServiceKey> = if std::mem::take(&mut f.publish_all) {
            f.publish.clear();
            f.sync.iter().map(|(k, _)| k.clone()).collect()
        } else {
            std::mem::take(&mut f.publish).into_iter().collect()
        };
        for key in keys {
            if self.following.defer {
                if self.following.sync.get(&key).is_some() {
                    out.push(Output::Changed(key));
                }
            } else if let Some(published) = self.published(&key) {
                out.push(Output::Publish(published));
            }
        }
    }

    /// From now on a view that changed is announced as
    /// [`Output::Changed`] and built only when the driver asks for it with
    /// [`AgentState::published`]. A driver whose data plane reads a view
    /// far less often than it changes (the fleet simulator, which runs
    /// thousands of agents and samples their traffic) saves building every
    /// intermediate set; what it publishes before a read is the same set an
    /// immediate publication of the last change would have been, since
    /// every change to what a view holds marks it changed again.
    pub fn defer_publications(&mut self) {
        self.following.defer = true;
    }

    /// What the data plane's view of `key` holds now.
    pub fn published(&self, key: &ServiceKey) -> Option<Published> {
        let f = &self.following;
        let t = f.sync.get(key)?;
        let mut p = Published::waiting(key.clone(), self.settings.started_ms);
        let config = &self.settings.config;
        let (config_age, config_behaviour) = config.staleness.for_service(
            key.namespace.as_str(),
            key.service.as_str(),
            key.port_name.as_str(),
        );
        // The service's policy, when it sets them, overrides the agent's.
        let (policy_age, policy_behaviour) = f.regions.staleness(key);
        p.max_age_ms = policy_age.unwrap_or(config_age);
        p.stale_behaviour = policy_behaviour.unwrap_or(config_behaviour);
        p.synced = t.synced;
        p.confirmed_at_ms = t.confirmed_at_ms;
        match t.view.as_ref().filter(|v| v.exists()) {
            Some(view) => {
                p.status = Status::Held;
                p.records = view.records().cloned().collect::<Vec<_>>().into();
                p.ready_weight = view.ready().map(|r| u64::from(r.weight.get())).sum();
                p.revision = view.revision();
                p.leaving = Arc::new(
                    self.writes
                        .regs
                        .iter()
                        .filter(|l| l.intent != Intent::Serve && l.registration.service == *key)
                        .map(|l| l.registration.instance_id.clone())
                        .collect(),
                );
            }
            None if t.unknown => p.status = Status::Unknown,
            None => {
                if let Some(reason) = &t.denied {
                    p.status = Status::Denied(reason.clone());
                }
            }
        }
        Some(p)
    }
}

/// The service a catalog update is about.
fn updated_service(update: &ServiceUpdate) -> Option<ServiceKey> {
    match update {
        ServiceUpdate::Deltas(ds) => ds.first().map(|d| d.service.clone()),
        ServiceUpdate::Snapshot(_) => None,
        ServiceUpdate::Current { service, .. }
        | ServiceUpdate::Unknown { service }
        | ServiceUpdate::RetryAfter { service, .. }
        | ServiceUpdate::Denied { service, .. }
        | ServiceUpdate::NotYet { service, .. } => Some(service.clone()),
    }
}

/// Reports cached views a new session's arbiter made the agent drop.
fn report_discarded(
    arbiter: &str,
    catalog: Option<CatalogId>,
    revision: Revision,
    discarded: &[(ServiceKey, Discard)],
) {
    let Some((_, why)) = discarded.first() else {
        return;
    };
    let services: Vec<String> = discarded
        .iter()
        .take(8)
        .map(|(s, _)| s.to_string())
        .collect();
    let catalog = catalog.map_or_else(|| "unnamed".to_string(), |c| c.to_string());
    let cause = match why {
        Discard::OtherCatalog => {
            "the arbiter serves another catalog than the one the cache was filled from"
        }
        Discard::AheadOfArbiter => {
            "the cache holds revisions the arbiter's catalog has not reached"
        }
    };
    tracing::warn!(
        arbiter,
        catalog,
        revision = revision.0,
        discarded = discarded.len(),
        services = ?services,
        "{cause} (a rebuilt or restored arbiter group?): those cached views are no longer served and are fetched again by snapshot"
    );
}
