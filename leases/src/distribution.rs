//! Distribution (R6): which subscribed agent gets which change, and when.
//!
//! Sans-IO: the arbiter's driver feeds it connections, subscriptions, acks,
//! commits and "that send completed", with the time as a value, and carries
//! out what it returns (`Output`): send these updates, wake me at, drop
//! that agent. It never touches a socket or a clock.
//!
//! The rules:
//! - At most one update message per agent per coalescing window, counted
//!   from the last message: a change goes out at once when nothing is in
//!   flight and the stream has been quiet for a window; changes that arrive
//!   while a send is in flight, or within a window of the last message, are
//!   merged into the next send, which leaves when the send completes and
//!   the window has passed. So a lone change on a quiet stream is never
//!   delayed, and a deploy costs each agent at most one message per window
//!   however many of its services change.
//! - What is queued per agent is a set of service keys; the deltas stay in
//!   the catalog's log. An agent whose send does not complete within the
//!   stall timeout is disconnected and resyncs when it returns.
//! - At most `max_snapshots_per_agent` full snapshots go to one agent at
//!   once (`limits.snapshots_per_session`), so one agent that lost its
//!   cache cannot take every slot; the rest are told to retry.
//! - At most `max_concurrent_snapshots` full snapshots are in flight at
//!   once; the rest are told when to retry.
//! - A revision sent but not acknowledged within `resend_after_ms` of the
//!   send completing is sent again by the next `sweep`: deltas from the
//!   acknowledged revision while the log reaches back to it, else a snapshot.
//!   Streams are reliable, but an agent's apply can fail (a snapshot that
//!   does not check is dropped without an answer), and without this the
//!   agent would stay stale until the service changes again. The first
//!   `QUICK_RESENDS` re-sends of the same gap each wait `resend_after_ms`;
//!   later ones wait twice as long each time, up to `MAX_RESEND_BACKOFF`
//!   times; the count resets once the ack catches up. Quick first: a lost
//!   drain must still reach the agent within the 3 s leave promise when a
//!   few sends in a row are lost (with 500 ms, four re-sends by 2 s), while
//!   an agent that can never apply costs one send per 4 s at most.

use std::collections::BTreeSet;
use std::sync::Arc;

use foldhash::HashMap;

use crate::catalog::{Catalog, SinceAnswer};
use crate::ids::{AgentId, Revision};
use crate::name::ServiceKey;
use crate::protocol::ServiceUpdate;
use crate::snapshot::ServiceSnapshot;

/// Encodes a service snapshot for the wire (`codec::shared_service_snapshot`
/// in the arbiter): the distributor caches the bytes and shares them among
/// every agent that needs the same snapshot.
pub type EncodeSnapshot = fn(&ServiceSnapshot) -> Arc<[u8]>;

/// The longest wait before a re-send, as a multiple of `resend_after_ms`.
pub const MAX_RESEND_BACKOFF: u64 = 8;

/// Re-sends of one gap that wait only `resend_after_ms` before the waits
/// start doubling.
pub const QUICK_RESENDS: u32 = 4;

/// Distribution settings (from `[distribution]` in the arbiter config).
#[derive(Clone, Debug, PartialEq)]
pub struct DistParams {
    /// Coalescing window for changes arriving during a send, in ms.
    pub coalesce_window_ms: u64,
    /// Most full snapshots in flight at once, over all agents.
    pub max_concurrent_snapshots: usize,
    /// Most full snapshots in flight at once to one agent
    /// (`limits.snapshots_per_session`).
    pub max_snapshots_per_agent: usize,
    /// A send not completed after this long gets its agent disconnected, ms.
    pub stall_timeout_ms: u64,
    /// What a refused snapshot is told to wait before asking again, ms.
    pub snapshot_retry_ms: u64,
    /// A send not acknowledged this long after it completed is sent again
    /// (`QUICK_RESENDS` times; then after twice as long each time, up to
    /// `MAX_RESEND_BACKOFF` times), ms.
    pub resend_after_ms: u64,
}

impl From<&rollcall_config::ArbiterConfig> for DistParams {
    fn from(config: &rollcall_config::ArbiterConfig) -> Self {
        let d = &config.distribution;
        DistParams {
            coalesce_window_ms: d.coalesce_window_ms,
            max_concurrent_snapshots: d.max_concurrent_snapshots as usize,
            max_snapshots_per_agent: config.limits.snapshots_per_session as usize,
            stall_timeout_ms: d.stall_timeout_ms,
            snapshot_retry_ms: d.snapshot_retry_ms,
            resend_after_ms: d.resend_after_ms,
        }
    }
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// Send these updates to the agent as one message, then call `sent`.
    Send {
        /// The agent.
        agent: AgentId,
        /// The updates.
        updates: Vec<ServiceUpdate>,
    },
    /// Call `wake(agent)` at this time.
    WakeAt {
        /// The agent.
        agent: AgentId,
        /// When, in ms.
        at_ms: u64,
    },
    /// Close the agent's connection; it has been forgotten here.
    Disconnect {
        /// The agent.
        agent: AgentId,
        /// Why, for its log.
        reason: String,
    },
}

/// Counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DistStats {
    /// Full snapshots sent.
    pub snapshots_sent: u64,
    /// Snapshot requests told to retry.
    pub snapshots_refused: u64,
    /// Of those, the ones refused by the per-agent bound
    /// (`limits.snapshots_per_session`) with slots free overall.
    pub snapshots_limited: u64,
    /// Most snapshots in flight at once so far.
    pub max_concurrent_snapshots_seen: usize,
    /// Deltas sent.
    pub deltas_sent: u64,
    /// Update messages sent.
    pub messages_sent: u64,
    /// Agents disconnected for stalling.
    pub stalled_agents: u64,
    /// Unacknowledged services sent again as deltas.
    pub resent_as_deltas: u64,
    /// Unacknowledged services sent again as a snapshot.
    pub resent_as_snapshots: u64,
    /// Acknowledgements of a revision the catalog never had, answered
    /// with a snapshot.
    pub acks_ahead: u64,
}

#[derive(Clone, Debug)]
struct Sub {
    /// What the agent holds (or will once the in-flight send lands);
    /// `None` when it needs a snapshot.
    sent: Option<Revision>,
    /// What it acknowledged (`Revision(0)`: nothing yet).
    acked: Revision,
    /// When the last send carrying this service was queued, then when it
    /// completed: the re-send clock starts here.
    sent_at_ms: u64,
    /// Re-sends of the current gap so far (0 once the ack catches up).
    resends: u32,
    /// Queued by `sweep`: the next flush sends from `acked`, not `sent`.
    resend: bool,
}

impl Sub {
    fn new(have: Option<Revision>, now_ms: u64) -> Self {
        Sub {
            sent: have,
            acked: have.unwrap_or_default(),
            sent_at_ms: now_ms,
            resends: 0,
            resend: false,
        }
    }

    /// How long the next re-send waits, as a multiple of `resend_after_ms`:
    /// 1 for the first `QUICK_RESENDS`, then 2, 4, 8, 8, …
    fn backoff(&self) -> u64 {
        let doublings = self.resends.saturating_sub(QUICK_RESENDS - 1).min(3);
        (1u64 << doublings).min(MAX_RESEND_BACKOFF)
    }

    /// Something was sent that the agent has not acknowledged.
    fn unacked(&self) -> bool {
        self.sent.is_some_and(|sent| sent > self.acked)
    }

    /// What the next flush answers from: the revision the agent will hold
    /// once what was sent lands, or for a re-send the one it acknowledged
    /// (`None`, a snapshot, when it acknowledged nothing).
    fn base(&self) -> Option<Revision> {
        if self.resend {
            Some(self.acked).filter(|acked| *acked > Revision(0))
        } else {
            self.sent
        }
    }
}

#[derive(Clone, Debug)]
struct InFlight {
    since_ms: u64,
    snapshots: usize,
    /// Services whose revision this send carries: their re-send clocks
    /// restart when it completes.
    carries: Vec<ServiceKey>,
}

#[derive(Clone, Debug, Default)]
struct AgentState {
    subs: HashMap<ServiceKey, Sub>,
    pending: BTreeSet<ServiceKey>,
    /// Subscriptions not answered yet: they get an answer even when there
    /// is nothing new (`Current`).
    fresh: BTreeSet<ServiceKey>,
    pending_since_ms: Option<u64>,
    in_flight: Option<InFlight>,
    /// When the last update message went, ms: the next one goes no
    /// sooner than a coalescing window after it.
    last_sent_ms: Option<u64>,
    /// The wake-up already asked for the next flush, ms.
    wake_asked_ms: Option<u64>,
}

impl AgentState {
    /// When what is pending may go: at once on a stream quiet for a
    /// window, else a window after the last message.
    fn due_ms(&self, window_ms: u64) -> Option<u64> {
        let since = self.pending_since_ms?;
        Some(
            self.last_sent_ms
                .map_or(since, |last| since.max(last + window_ms)),
        )
    }
}

/// The distribution state of one arbiter.
#[derive(Debug)]
pub struct Distributor {
    params: DistParams,
    encode: EncodeSnapshot,
    agents: HashMap<AgentId, AgentState>,
    watchers: HashMap<ServiceKey, BTreeSet<AgentId>>,
    snapshots_in_flight: usize,
    snapshot_cache: HashMap<ServiceKey, (Revision, Arc<[u8]>)>,
    stats: DistStats,
}

impl Distributor {
    /// No agents yet; snapshots are encoded with `encode`.
    pub fn new(params: DistParams, encode: EncodeSnapshot) -> Self {
        Distributor {
            params,
            encode,
            agents: HashMap::default(),
            watchers: HashMap::default(),
            snapshots_in_flight: 0,
            snapshot_cache: HashMap::default(),
            stats: DistStats::default(),
        }
    }

    /// A new agent connection.
    pub fn connect(&mut self, agent: AgentId) {
        self.agents.insert(agent, AgentState::default());
    }

    /// The agent's connection is gone.
    pub fn disconnect(&mut self, agent: AgentId) {
        let Some(state) = self.agents.remove(&agent) else {
            return;
        };
        if let Some(f) = state.in_flight {
            self.snapshots_in_flight -= f.snapshots;
        }
        for service in state.subs.keys() {
            if let Some(w) = self.watchers.get_mut(service) {
                w.remove(&agent);
                if w.is_empty() {
                    self.watchers.remove(service);
                }
            }
        }
    }

    /// The agent follows `service`, holding revision `have` of it (`None`:
    /// send a snapshot).
    pub fn subscribe(
        &mut self,
        agent: AgentId,
        service: ServiceKey,
        have: Option<Revision>,
        now_ms: u64,
        catalog: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let Some(state) = self.agents.get_mut(&agent) else {
            return;
        };
        state.subs.insert(service.clone(), Sub::new(have, now_ms));
        state.pending.insert(service.clone());
        state.fresh.insert(service.clone());
        state.pending_since_ms.get_or_insert(now_ms);
        self.watchers.entry(service).or_default().insert(agent);
        self.flush_when_due(agent, now_ms, catalog, out);
    }

    /// How many services `agent` follows, and whether `service` is one.
    pub fn follows(&self, agent: AgentId, service: &ServiceKey) -> (usize, bool) {
        self.agents
            .get(&agent)
            .map_or((0, false), |a| (a.subs.len(), a.subs.contains_key(service)))
    }

    /// The services `agent` follows.
    pub fn subscriptions(&self, agent: AgentId) -> impl Iterator<Item = &ServiceKey> {
        self.agents
            .get(&agent)
            .into_iter()
            .flat_map(|a| a.subs.keys())
    }

    /// The agent stops following `service`.
    pub fn unsubscribe(&mut self, agent: AgentId, service: &ServiceKey) {
        if let Some(state) = self.agents.get_mut(&agent) {
            state.subs.remove(service);
            state.pending.remove(service);
            state.fresh.remove(service);
        }
        if let Some(w) = self.watchers.get_mut(service) {
            w.remove(&agent);
            if w.is_empty() {
                self.watchers.remove(service);
            }
        }
    }

    /// The agent applied `service` up to `revision`. A revision past the
    /// service's last change in `catalog` is one this catalog never had:
    /// the agent holds an update damaged on the way that still decoded
    /// and checked (a revision number is covered by no digest), and would
    /// otherwise skip every later change as already held. It is sent a
    /// snapshot, which replaces what it holds.
    pub fn ack(
        &mut self,
        agent: AgentId,
        service: &ServiceKey,
        revision: Revision,
        now_ms: u64,
        catalog: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let Some(state) = self.agents.get_mut(&agent) else {
            return;
        };
        let Some(sub) = state.subs.get_mut(service) else {
            return;
        };
        let current = catalog.service(service).map_or(Revision(0), |i| i.revision);
        if revision <= current {
            sub.acked = sub.acked.max(revision);
            if !sub.unacked() {
                sub.resends = 0;
            }
            return;
        }
        tracing::warn!(agent, service = %service, acked = revision.0, current = current.0, "an agent acknowledged a revision this catalog never had; sending it a snapshot");
        self.stats.acks_ahead += 1;
        *sub = Sub::new(None, now_ms);
        state.pending.insert(service.clone());
        state.pending_since_ms.get_or_insert(now_ms);
        self.flush_when_due(agent, now_ms, catalog, out);
    }

    /// These services changed in a commit.
    pub fn committed(
        &mut self,
        services: &[ServiceKey],
        now_ms: u64,
        catalog: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let mut touched = BTreeSet::new();
        for service in services {
            let Some(agents) = self.watchers.get(service) else {
                continue;
            };
            for agent in agents {
                if let Some(state) = self.agents.get_mut(agent) {
                    state.pending.insert(service.clone());
                    state.pending_since_ms.get_or_insert(now_ms);
                    touched.insert(*agent);
                }
            }
        }
        for agent in touched {
            self.flush_when_due(agent, now_ms, catalog, out);
        }
    }

    /// The agent's in-flight send completed.
    pub fn sent(&mut self, agent: AgentId, now_ms: u64, catalog: &Catalog, out: &mut Vec<Output>) {
        let Some(state) = self.agents.get_mut(&agent) else {
            return;
        };
        if let Some(f) = state.in_flight.take() {
            self.snapshots_in_flight -= f.snapshots;
            for service in &f.carries {
                if let Some(sub) = state.subs.get_mut(service) {
                    sub.sent_at_ms = now_ms;
                }
            }
        }
        self.flush_when_due(agent, now_ms, catalog, out);
    }

    /// Sends what is pending for `agent` if nothing is in flight and its
    /// window has passed, or asks to be woken when it has: at most one
    /// update message per agent per `coalesce_window_ms`, carrying every
    /// change since the last; a change on a stream quiet for a window goes
    /// at once.
    fn flush_when_due(
        &mut self,
        agent: AgentId,
        now_ms: u64,
        catalog: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let Some(state) = self.agents.get_mut(&agent) else {
            return;
        };
        if state.in_flight.is_some() {
            return;
        }
        let Some(due) = state.due_ms(self.params.coalesce_window_ms) else {
            return;
        };
        if now_ms >= due {
            self.flush(agent, now_ms, catalog, out);
        } else if state.wake_asked_ms != Some(due) {
            state.wake_asked_ms = Some(due);
            out.push(Output::WakeAt { agent, at_ms: due });
        }
    }

    /// A timer set by `WakeAt` fired.
    pub fn wake(&mut self, agent: AgentId, now_ms: u64, catalog: &Catalog, out: &mut Vec<Output>) {
        let Some(state) = self.agents.get(&agent) else {
            return;
        };
        match (&state.in_flight, state.pending_since_ms) {
            (Some(f), _) if now_ms.saturating_sub(f.since_ms) >= self.params.stall_timeout_ms => {
                self.stats.stalled_agents += 1;
                let reason = format!(
                    "an update stayed unsent for {} ms (stall timeout {} ms); the agent must reconnect and resync",
                    now_ms - f.since_ms,
                    self.params.stall_timeout_ms
                );
                self.disconnect(agent);
                out.push(Output::Disconnect { agent, reason });
            }
            (None, Some(_)) => self.flush_when_due(agent, now_ms, catalog, out),
            _ => {}
        }
    }

    /// Queues a re-send for every service whose last send completed at
    /// least its back-off ago and is still not acknowledged. Called
    /// periodically; a service in a send still in flight waits for it.
    pub fn sweep(&mut self, now_ms: u64, catalog: &Catalog, out: &mut Vec<Output>) {
        let resend_after_ms = self.params.resend_after_ms;
        let mut touched = Vec::new();
        for (agent, state) in &mut self.agents {
            let carried = state.in_flight.as_ref().map_or(&[][..], |f| &f.carries);
            let mut queued = false;
            for (service, sub) in &mut state.subs {
                if !sub.unacked()
                    || sub.resend
                    || carried.contains(service)
                    || now_ms < sub.sent_at_ms + resend_after_ms * sub.backoff()
                {
                    continue;
                }
                sub.resend = true;
                sub.resends = sub.resends.saturating_add(1);
                state.pending.insert(service.clone());
                queued = true;
            }
            if queued {
                state.pending_since_ms.get_or_insert(now_ms);
                if state.in_flight.is_none() {
                    touched.push(*agent);
                }
            }
        }
        touched.sort_unstable();
        for agent in touched {
            self.flush_when_due(agent, now_ms, catalog, out);
        }
    }

    fn flush(&mut self, agent: AgentId, now_ms: u64, catalog: &Catalog, out: &mut Vec<Output>) {
        let Some(state) = self.agents.get_mut(&agent) else {
            return;
        };
        let pending = std::mem::take(&mut state.pending);
        let fresh = std::mem::take(&mut state.fresh);
        state.pending_since_ms = None;
        let mut updates = Vec::new();
        let mut snapshots = 0;
        let mut carries = Vec::new();
        for service in pending {
            let Some(sub) = state.subs.get_mut(&service) else {
                continue;
            };
            let answer = match sub.base() {
                Some(have) => catalog.changes_since(&service, have),
                None => SinceAnswer::SnapshotNeeded,
            };
            let resend = std::mem::take(&mut sub.resend);
            match answer {
                SinceAnswer::UpToDate => {
                    if fresh.contains(&service) {
                        let revision = sub.sent.unwrap_or_default();
                        updates.push(ServiceUpdate::Current { service, revision });
                    }
                }
                SinceAnswer::Deltas(deltas) => {
                    sub.sent = deltas.last().map(|d| d.revision).or(sub.sent);
                    sub.sent_at_ms = now_ms;
                    self.stats.deltas_sent += deltas.len() as u64;
                    self.stats.resent_as_deltas += u64::from(resend);
                    carries.push(service);
                    updates.push(ServiceUpdate::Deltas(deltas));
                }
                SinceAnswer::SnapshotNeeded => match catalog.service(&service) {
                    None => {
                        sub.sent = Some(Revision(0));
                        updates.push(ServiceUpdate::Unknown { service });
                    }
                    Some(info)
                        if snapshots < self.params.max_snapshots_per_agent
                            && self.snapshots_in_flight + snapshots
                                < self.params.max_concurrent_snapshots =>
                    {
                        let bytes = match self.snapshot_cache.get(&service) {
                            Some((rev, bytes)) if *rev == info.revision => bytes.clone(),
                            _ => {
                                let snap = catalog
                                    .service_snapshot(&service)
                                    .expect("the service exists");
                                let bytes = (self.encode)(&snap);
                                self.snapshot_cache
                                    .insert(service.clone(), (info.revision, bytes.clone()));
                                bytes
                            }
                        };
                        sub.sent = Some(info.revision);
                        sub.sent_at_ms = now_ms;
                        snapshots += 1;
                        self.stats.resent_as_snapshots += u64::from(resend);
                        carries.push(service);
                        updates.push(ServiceUpdate::Snapshot(bytes));
                    }
                    Some(_) => {
                        self.stats.snapshots_refused += 1;
                        self.stats.snapshots_limited +=
                            u64::from(snapshots >= self.params.max_snapshots_per_agent);
                        updates.push(ServiceUpdate::RetryAfter {
                            service,
                            ms: self.params.snapshot_retry_ms,
                        });
                    }
                },
                SinceAnswer::Ahead { current } => {
                    updates.push(ServiceUpdate::NotYet { service, current })
                }
                SinceAnswer::Unknown => {
                    sub.sent = Some(Revision(0));
                    updates.push(ServiceUpdate::Unknown { service });
                }
            }
        }
        if updates.is_empty() {
            return;
        }
        state.in_flight = Some(InFlight {
            since_ms: now_ms,
            snapshots,
            carries,
        });
        state.last_sent_ms = Some(now_ms);
        state.wake_asked_ms = None;
        self.snapshots_in_flight += snapshots;
        self.stats.snapshots_sent += snapshots as u64;
        self.stats.messages_sent += 1;
        self.stats.max_concurrent_snapshots_seen = self
            .stats
            .max_concurrent_snapshots_seen
            .max(self.snapshots_in_flight);
        out.push(Output::Send { agent, updates });
        out.push(Output::WakeAt {
            agent,
            at_ms: now_ms + self.params.stall_timeout_ms,
        });
    }

    /// How many subscribers of `service` acknowledged `revision`, of how many.
    pub fn propagation(&self, service: &ServiceKey, revision: Revision) -> (u32, u32) {
        let Some(agents) = self.watchers.get(service) else {
            return (0, 0);
        };
        let acked = agents
            .iter()
            .filter(|a| {
                self.agents
                    .get(a)
                    .and_then(|s| s.subs.get(service))
                    .is_some_and(|sub| sub.acked >= revision)
            })
            .count();
        (acked as u32, agents.len() as u32)
    }

    /// How far the agent's acknowledgements trail its services' last
    /// changes, in revisions (the largest over its subscriptions).
    pub fn ack_lag(&self, agent: AgentId, catalog: &Catalog) -> u64 {
        let Some(state) = self.agents.get(&agent) else {
            return 0;
        };
        state
            .subs
            .iter()
            .filter_map(|(service, sub)| {
                catalog
                    .service(service)
                    .map(|info| info.revision.0.saturating_sub(sub.acked.0))
            })
            .max()
            .unwrap_or(0)
    }

    /// Connected agents.
    pub fn agent_ids(&self) -> Vec<AgentId> {
        let mut ids: Vec<AgentId> = self.agents.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Snapshots in flight now.
    pub fn snapshots_in_flight(&self) -> usize {
        self.snapshots_in_flight
    }

    /// Counters.
    pub fn stats(&self) -> &DistStats {
        &self.stats
    }
}

mod memory;
#[cfg(test)]
mod tests;
