//! The endpoint view (R7, R8): one per followed service, the only thing the
//! data plane reads. The proxy, DNS, the resolve API and the ingress
//! gateway all answer from it, so ejection, empty-set protection, panic,
//! slow start, staleness and failover behave the same on every path.
//!
//! The agent's state machine (`agent_state`) publishes what it holds of
//! each service — records, revision, whether the session confirmed them,
//! the instances this agent drains or deregisters, the staleness limit —
//! and the nodes its gossip holds down; its driver stores them here. The
//! data plane reads the latest published set without any agent-wide lock
//! and without cloning records: a lookup loads two `Arc`s and, most of the
//! time, the selection cached from the previous lookup. A selection is
//! computed again only when what it rests on changed (a new publication,
//! a new down set, an ejection) or when time moves it (an ejection ends,
//! a slow-start ramp advances: at most every `SLOW_START_STEP_MS`).
//! Connect failures and successes (passive ejection) stay here, in this
//! agent: they never reach the state machine or the catalog.
//!
//! Time comes in as a value (`now_ms`); the data plane reads the clock at
//! its edge. This module must never wait on the agent: the first lookup of
//! a service it does not follow asks the agent to follow it (a message,
//! not a call) and answers "not arrived yet".

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use dashmap::DashMap;
use rollcall_config::{DataPlaneConfig, StaleBehaviour};
use rollcall_leases::clock::now_ms;
use rollcall_leases::{InstanceId, Label, NodeId, Revision, ServiceKey, State};
use tokio::sync::Notify;

use crate::endpoints::{Selection, ServiceMemory};
use crate::failover::{Regions, Spread};
use crate::metrics::{AgentMetrics, BehaviourLabel};

/// How often a cached selection is computed again while an endpoint's
/// slow start ramps its weight up, ms.
pub const SLOW_START_STEP_MS: u64 = 100;

/// How long a failed connect waits for the catalog to prove the view
/// stale (`rollcall_agent_connect_failures_to_stale_total`), ms.
const STALE_FAILURE_WINDOW_MS: u64 = 30_000;

/// Most recent failed connects remembered per service for that metric.
const RECENT_FAILURES: usize = 1_000;

pub use active::ActiveConnections;
pub(crate) use active::ActiveGuard;
pub use answer::{Answer, Degraded, Lookup, Published, Status, DEGRADED_RETRIES, DEGRADED_TTL_S};

mod active;
mod answer;
mod degrade;
mod regions;
#[cfg(test)]
pub(crate) mod tests;

/// One service as `Views::held` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldService {
    /// The service.
    pub service: ServiceKey,
    /// Revision of its last change held.
    pub revision: Revision,
    /// Records READY in the copy (those this agent drains not counted).
    pub ready: usize,
    /// Every record in the copy, whatever its state.
    pub total: usize,
    /// Not confirmed by the arbiter in this session.
    pub stale: bool,
    /// Age of the copy, ms (0 while the session keeps it current).
    pub age_ms: u64,
}

/// The view's settings, from the agent's config.
#[derive(Clone, Debug)]
pub struct ViewSettings {
    /// `[data_plane]`.
    pub data_plane: DataPlaneConfig,
    /// This agent's region (failover refuses to "move" into it).
    pub region: String,
    /// This agent's zone (the selector and DNS prefer it).
    pub zone: Label,
    /// How long a first resolve waits for a service to arrive, ms.
    pub first_resolve_wait_ms: u64,
}

/// The nodes this agent's gossip holds down, as published.
#[derive(Debug, Default)]
struct Down {
    stamp: u64,
    nodes: BTreeSet<NodeId>,
}

/// A selection and what it was computed from.
#[derive(Debug)]
struct Computed {
    published: u64,
    down: u64,
    memory: u64,
    valid_until_ms: u64,
    selection: Arc<Selection>,
}

/// What the data plane remembers of one service: ejections, slow start,
/// the last non-empty READY set (`ServiceMemory`), and recent failed
/// connects.
#[derive(Debug, Default)]
struct Memory {
    rules: ServiceMemory,
    recent_failures: VecDeque<(InstanceId, u64)>,
}

/// One service's view. Proxies hold theirs; DNS and the API find it by key.
#[derive(Debug)]
pub struct ServiceView {
    service: ServiceKey,
    published: ArcSwap<(u64, Published)>,
    cache: ArcSwapOption<Computed>,
    memory: Mutex<Memory>,
    /// Bumped when an ejection starts or is lifted.
    memory_stamp: AtomicU64,
    /// Instances with a failed connect counted: a success only takes the
    /// lock when there is a count to reset.
    failing: AtomicUsize,
    spread: Spread,
    /// When the data plane last looked the service up (ms; 0: never).
    last_used_ms: AtomicU64,
}

/// Every service's view, the down set, the regions held, and the
/// connection counts the selector balances on. Cheap to clone.
#[derive(Clone)]
pub struct Views {
    inner: Arc<Inner>,
}

struct Inner {
    services: DashMap<ServiceKey, Arc<ServiceView>>,
    down: ArcSwap<Down>,
    /// The nodes this agent's zone gossip sees alive: the fresh local
    /// evidence a degraded copy routes on.
    alive: ArcSwap<BTreeSet<NodeId>>,
    regions: ArcSwap<Regions>,
    connected: AtomicBool,
    stamps: AtomicU64,
    changed: Notify,
    settings: ViewSettings,
    metrics: Arc<AgentMetrics>,
    active: ActiveConnections,
    follow: Box<dyn Fn(ServiceKey) + Send + Sync>,
}

impl Views {
    /// No service yet. `follow` is called (once per service) when the data
    /// plane looks up a service the agent does not follow: it must only
    /// pass the request on, never wait.
    pub fn new(
        settings: ViewSettings,
        metrics: Arc<AgentMetrics>,
        follow: impl Fn(ServiceKey) + Send + Sync + 'static,
    ) -> Views {
        Views {
            inner: Arc::new(Inner {
                services: DashMap::new(),
                down: ArcSwap::from_pointee(Down::default()),
                alive: ArcSwap::from_pointee(BTreeSet::new()),
                regions: ArcSwap::from_pointee(Regions::new()),
                connected: AtomicBool::new(false),
                stamps: AtomicU64::new(1),
                changed: Notify::new(),
                settings,
                metrics,
                active: ActiveConnections::default(),
                follow: Box::new(follow),
            }),
        }
    }

    // ----- what the agent's driver publishes -----

    /// Stores what the agent holds of a service at `now_ms`.
    pub fn publish(&self, published: Published, now_ms: u64) {
        let stamp = self.inner.stamps.fetch_add(1, Ordering::Relaxed);
        let view = self.slot(&published.service);
        view.forget_failures_gone(&published, now_ms, &self.inner.metrics);
        view.published.store(Arc::new((stamp, published)));
        self.inner.changed.notify_waiters();
    }

    /// Completes at the next publication, down-set, connection or regions
    /// change (of any service): a blocking resolve looks again then.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.inner.changed.notified()
    }

    /// Drops the view of a service the agent no longer follows: the next
    /// lookup of it asks the agent to follow it again.
    pub fn unpublish(&self, key: &ServiceKey) {
        self.inner.services.remove(key);
        self.inner.changed.notify_waiters();
    }

    /// When each service was last looked up (ms; 0: never), for the agent
    /// to drop what nobody asks for.
    pub fn usage(&self) -> Vec<(ServiceKey, u64)> {
        self.inner
            .services
            .iter()
            .map(|view| {
                (
                    view.key().clone(),
                    view.last_used_ms.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Whether the view of `key` remembers recent connect failures (the
    /// only part of it a publication changes besides the published set:
    /// failures of endpoints no longer ready are forgotten then).
    pub fn remembers_failures(&self, key: &ServiceKey) -> bool {
        self.inner
            .services
            .get(key)
            .is_some_and(|view| !view.lock().recent_failures.is_empty())
    }

    /// The nodes whose endpoints are out of this agent's data plane because
    /// its gossip holds them down (R7).
    pub fn set_down(&self, nodes: BTreeSet<NodeId>) {
        if self.inner.down.load().nodes == nodes {
            return;
        }
        let stamp = self.inner.stamps.fetch_add(1, Ordering::Relaxed);
        self.inner.down.store(Arc::new(Down { stamp, nodes }));
        self.inner.changed.notify_waiters();
    }

    /// The nodes this agent's zone gossip sees alive (degraded copies
    /// route only to them).
    pub fn set_alive(&self, nodes: BTreeSet<NodeId>) {
        self.inner.alive.store(Arc::new(nodes));
        self.inner.changed.notify_waiters();
    }

    /// Whether a session with the arbiter is up (a first resolve waits for
    /// a service only then).
    pub fn set_connected(&self, connected: bool) {
        self.inner.connected.store(connected, Ordering::Relaxed);
        self.inner.changed.notify_waiters();
    }

    /// The policies and other regions' views, as the arbiter last sent them.
    pub fn set_regions(&self, regions: Regions) {
        self.inner.regions.store(Arc::new(regions));
        self.inner.changed.notify_waiters();
    }

    /// Lifts the local ejections of `node`'s endpoints: its gossip is back,
    /// so the connect failures that ejected them were the partition's.
    pub fn lift_node(&self, node: &NodeId) {
        for view in self.inner.services.iter() {
            let published = view.published.load();
            let ids: Vec<&InstanceId> = published
                .1
                .records
                .iter()
                .filter(|r| r.node_id == *node)
                .map(|r| &r.instance_id)
                .collect();
            if !ids.is_empty() {
                view.lock().rules.lift(ids);
                view.memory_stamp.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    // ----- what the data plane reads -----

    /// The view of `key`; the agent is asked to follow a service it does
    /// not follow yet.
    pub fn service(&self, key: &ServiceKey) -> Arc<ServiceView> {
        if let Some(view) = self.inner.services.get(key) {
            return view.clone();
        }
        let mut created = false;
        let view = self
            .inner
            .services
            .entry(key.clone())
            .or_insert_with(|| {
                created = true;
                Arc::new(ServiceView::new(Published::waiting(key.clone(), 0)))
            })
            .clone();
        if created {
            (self.inner.follow)(key.clone());
        }
        view
    }

    /// The view of `key` for publishing: created without asking to follow.
    fn slot(&self, key: &ServiceKey) -> Arc<ServiceView> {
        if let Some(view) = self.inner.services.get(key) {
            return view.clone();
        }
        self.inner
            .services
            .entry(key.clone())
            .or_insert_with(|| Arc::new(ServiceView::new(Published::waiting(key.clone(), 0))))
            .clone()
    }

    /// What the view answers for `key` at `now_ms`.
    pub fn lookup(&self, key: &ServiceKey, now_ms: u64) -> Lookup {
        self.service(key).lookup(self, now_ms)
    }

    /// `lookup`, waiting up to `first_resolve_wait_ms` while the agent
    /// cannot know yet and its session is up (the first resolve of a
    /// service). Other lookups never wait on this one.
    pub async fn lookup_wait(&self, key: &ServiceKey) -> Lookup {
        let view = self.service(key);
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.inner.settings.first_resolve_wait_ms);
        loop {
            let changed = self.inner.changed.notified();
            let answer = view.lookup(self, now_ms());
            let waiting = matches!(answer, Lookup::CannotKnow(_))
                && self.inner.connected.load(Ordering::Relaxed);
            if !waiting {
                return answer;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return view.lookup(self, now_ms());
            }
        }
    }

    /// Every service this agent holds a copy of, in key order, with its
    /// READY and total record counts (`GET /v1/services`). Services the
    /// arbiter refused to let this node watch, said do not exist, or has
    /// not sent yet are left out. Not a lookup: it neither follows a
    /// service nor keeps one followed.
    pub fn held(&self, now_ms: u64) -> Vec<HeldService> {
        let mut held: Vec<HeldService> = self
            .inner
            .services
            .iter()
            .filter_map(|view| {
                let published = view.published.load_full();
                let p = &published.1;
                (p.status == Status::Held).then(|| HeldService {
                    service: p.service.clone(),
                    revision: p.revision,
                    ready: p
                        .records
                        .iter()
                        .filter(|r| r.state == State::Ready && !p.leaving.contains(&r.instance_id))
                        .count(),
                    total: p.records.len(),
                    stale: !p.synced,
                    age_ms: p.age_ms(now_ms),
                })
            })
            .collect();
        held.sort_by(|a, b| a.service.cmp(&b.service));
        held
    }

    /// The open proxied connections per instance.
    pub fn active(&self) -> &ActiveConnections {
        &self.inner.active
    }

    /// This agent's zone.
    pub fn zone(&self) -> &Label {
        &self.inner.settings.zone
    }

    /// `[data_plane]`.
    pub fn data_plane(&self) -> &DataPlaneConfig {
        &self.inner.settings.data_plane
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &AgentMetrics {
        &self.inner.metrics
    }
}

impl ServiceView {
    fn new(published: Published) -> Self {
        ServiceView {
            service: published.service.clone(),
            published: ArcSwap::from_pointee((0, published)),
            cache: ArcSwapOption::empty(),
            memory: Mutex::new(Memory::default()),
            memory_stamp: AtomicU64::new(0),
            failing: AtomicUsize::new(0),
            spread: Spread::default(),
            last_used_ms: AtomicU64::new(0),
        }
    }

    /// The service.
    pub fn key(&self) -> &ServiceKey {
        &self.service
    }

    fn lock(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the copy is served degraded at `now_ms`: held, past its
    /// maximum age, and its staleness behaviour is `degrade`.
    pub fn degraded_at(&self, now_ms: u64) -> bool {
        let published = self.published.load();
        let p = &published.1;
        p.status == Status::Held
            && p.stale_behaviour == StaleBehaviour::Degrade
            && p.age_ms(now_ms) > p.max_age_ms
    }

    /// What the view answers at `now_ms`.
    pub fn lookup(&self, views: &Views, now_ms: u64) -> Lookup {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
        let published = self.published.load_full();
        let (stamp, p) = &*published;
        let key = &self.service;
        match &p.status {
            Status::Unknown => return Lookup::Unknown,
            Status::Denied(reason) => {
                return Lookup::CannotKnow(format!(
                    "the arbiter refused this agent's watch of {key}: {reason}"
                ))
            }
            Status::Waiting => {
                return Lookup::CannotKnow(if views.inner.connected.load(Ordering::Relaxed) {
                    format!("service {key} has not arrived from the arbiter yet")
                } else {
                    format!("service {key} is not cached here and the arbiter is unreachable")
                })
            }
            Status::Held => {}
        }
        let age_ms = p.age_ms(now_ms);
        let metrics = &views.inner.metrics;
        let past_max_age = age_ms > p.max_age_ms;
        if past_max_age {
            if p.stale_behaviour == StaleBehaviour::Refuse {
                metrics.stale_refused.inc();
                return Lookup::Refused(format!("the copy of {key} is {age_ms} ms old, past its maximum age of {} ms; its staleness policy refuses", p.max_age_ms));
            }
            metrics
                .stale_served
                .get_or_create(&BehaviourLabel {
                    behaviour: behaviour_name(p.stale_behaviour).to_owned(),
                })
                .inc();
        }
        self.spread.observe_local(p.ready_weight, now_ms);
        let mut selection = self.selection(views, *stamp, p, now_ms);
        let degraded = (past_max_age && p.stale_behaviour == StaleBehaviour::Degrade).then(|| {
            let (fresh, degraded) = self.degrade(views, &selection, age_ms, p.max_age_ms, now_ms);
            selection = fresh;
            degraded
        });
        Lookup::Serve(Answer {
            service: key.clone(),
            revision: p.revision,
            stale: !p.synced,
            age_ms,
            selection,
            records: p.records.clone(),
            leaving: p.leaving.clone(),
            degraded,
        })
    }

    /// The cached selection, or a new one when what it rests on moved.
    fn selection(&self, views: &Views, stamp: u64, p: &Published, now_ms: u64) -> Arc<Selection> {
        let down = views.inner.down.load();
        let memory_stamp = self.memory_stamp.load(Ordering::Relaxed);
        if let Some(c) = &*self.cache.load() {
            if c.published == stamp
                && c.down == down.stamp
                && c.memory == memory_stamp
                && now_ms < c.valid_until_ms
            {
                return c.selection.clone();
            }
        }
        let settings = &views.inner.settings;
        let mut memory = self.lock();
        let selection = memory.rules.select(
            &p.records,
            &p.leaving,
            &down.nodes,
            now_ms,
            &settings.data_plane,
        );
        let mut valid_until_ms = memory.rules.next_expiry(now_ms).unwrap_or(u64::MAX);
        if selection
            .candidates
            .iter()
            .any(|c| c.weight < f64::from(c.record.weight.get()))
        {
            valid_until_ms = valid_until_ms.min(now_ms + SLOW_START_STEP_MS);
        }
        drop(memory);
        let selection = Arc::new(selection);
        self.cache.store(Some(Arc::new(Computed {
            published: stamp,
            down: down.stamp,
            memory: memory_stamp,
            valid_until_ms,
            selection: selection.clone(),
        })));
        selection
    }

    /// A connect to `id` failed at `now_ms`: counts toward its local
    /// ejection (never reported anywhere).
    pub fn connect_failed(&self, views: &Views, id: &InstanceId, now_ms: u64) {
        let published = self.published.load();
        let ready = published
            .1
            .records
            .iter()
            .filter(|r| r.state == State::Ready)
            .count();
        let metrics = &views.inner.metrics;
        metrics.connect_failures.inc();
        let mut memory = self.lock();
        memory.recent_failures.push_back((id.clone(), now_ms));
        if memory.recent_failures.len() > RECENT_FAILURES {
            memory.recent_failures.pop_front();
        }
        let ejected =
            memory
                .rules
                .connect_failed(id, ready, now_ms, &views.inner.settings.data_plane);
        self.failing
            .store(memory.rules.failing(), Ordering::Relaxed);
        drop(memory);
        if ejected {
            self.memory_stamp.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(service = %self.service, instance = %id, "endpoint ejected locally after consecutive connect failures");
            metrics
                .ejections
                .get_or_create(&metrics.service_label(&self.service.to_string()))
                .inc();
        }
    }

    /// A connect to `id` succeeded: its failure count starts over.
    pub fn connect_succeeded(&self, id: &InstanceId) {
        if self.failing.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut memory = self.lock();
        memory.rules.connect_succeeded(id);
        self.failing
            .store(memory.rules.failing(), Ordering::Relaxed);
    }

    /// A new publication: failed connects to endpoints it no longer holds
    /// READY were to a stale view (counted), and are forgotten.
    fn forget_failures_gone(&self, next: &Published, now: u64, metrics: &AgentMetrics) {
        let mut memory = self.lock();
        if memory.recent_failures.is_empty() {
            return;
        }
        memory
            .recent_failures
            .retain(|(_, t)| now.saturating_sub(*t) <= STALE_FAILURE_WINDOW_MS);
        let before = memory.recent_failures.len();
        memory.recent_failures.retain(|(id, _)| {
            next.records
                .iter()
                .any(|r| &r.instance_id == id && r.state == State::Ready)
        });
        metrics
            .connect_failures_to_stale
            .inc_by((before - memory.recent_failures.len()) as u64);
    }
}

/// The metric label of a staleness behaviour.
fn behaviour_name(behaviour: StaleBehaviour) -> &'static str {
    match behaviour {
        StaleBehaviour::Keep => "keep",
        StaleBehaviour::Degrade => "degrade",
        StaleBehaviour::Refuse => "refuse",
    }
}
