//! Distribution (R6): which subscribed agent gets which change, and when.
//!
//! Sans-IO: the arbiter's driver feeds it connections, subscriptions, acks,
//! commits and "that send completed", with the time as a value, and carries
//! out what it returns (`Output`): send these updates, wake me at, drop
//! that agent. It never touches a socket or a clock.
//!
//! The rules:
//! - A change goes out at once when the agent's stream is idle.
//! - Changes that arrive while a send is in flight are merged into the next
//!   send, which leaves when the send completes but not before the
//!   coalescing window has passed since the first of them arrived; so a lone
//!   change on an idle stream is never delayed, and a burst costs one send.
//! - What is queued per agent is a set of service keys; the deltas stay in
//!   the catalog's log. An agent whose send does not complete within the
//!   stall timeout is disconnected and resyncs when it returns.
//! - At most `max_concurrent_snapshots` full snapshots are in flight at
//!   once; the rest are told when to retry.

use std::collections::BTreeSet;
use std::sync::Arc;

use foldhash::HashMap;

use crate::catalog::{Catalog, SinceAnswer};
use crate::codec::encode_service_snapshot;
use crate::ids::Revision;
use crate::name::ServiceKey;
use crate::protocol::ServiceUpdate;

/// A connection, numbered by the driver.
pub type AgentId = u64;

/// Distribution settings (from `[distribution]` in the arbiter config).
#[derive(Clone, Debug, PartialEq)]
pub struct DistParams {
    /// Coalescing window for changes arriving during a send, in ms.
    pub coalesce_window_ms: u64,
    /// Most full snapshots in flight at once, over all agents.
    pub max_concurrent_snapshots: usize,
    /// A send not completed after this long gets its agent disconnected, ms.
    pub stall_timeout_ms: u64,
    /// What a refused snapshot is told to wait before asking again, ms.
    pub snapshot_retry_ms: u64,
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
    /// Most snapshots in flight at once so far.
    pub max_concurrent_snapshots_seen: usize,
    /// Deltas sent.
    pub deltas_sent: u64,
    /// Update messages sent.
    pub messages_sent: u64,
    /// Agents disconnected for stalling.
    pub stalled_agents: u64,
}

#[derive(Clone, Debug)]
struct Sub {
    /// What the agent holds (or will once the in-flight send lands);
    /// `None` when it needs a snapshot.
    sent: Option<Revision>,
    /// What it acknowledged.
    acked: Revision,
}

#[derive(Clone, Debug)]
struct InFlight {
    since_ms: u64,
    snapshots: usize,
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
}

/// The distribution state of one arbiter.
#[derive(Debug)]
pub struct Distributor {
    params: DistParams,
    agents: HashMap<AgentId, AgentState>,
    watchers: HashMap<ServiceKey, BTreeSet<AgentId>>,
    snapshots_in_flight: usize,
    snapshot_cache: HashMap<ServiceKey, (Revision, Arc<[u8]>)>,
    stats: DistStats,
}

impl Distributor {
    /// No agents yet.
    pub fn new(params: DistParams) -> Self {
        Distributor {
            params,
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
        let acked = have.unwrap_or_default();
        state
            .subs
            .insert(service.clone(), Sub { sent: have, acked });
        state.pending.insert(service.clone());
        state.fresh.insert(service.clone());
        state.pending_since_ms.get_or_insert(now_ms);
        self.watchers.entry(service).or_default().insert(agent);
        if self.agents[&agent].in_flight.is_none() {
            self.flush(agent, now_ms, catalog, out);
        }
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

    /// The agent applied `service` up to `revision`.
    pub fn ack(&mut self, agent: AgentId, service: &ServiceKey, revision: Revision) {
        if let Some(sub) = self
            .agents
            .get_mut(&agent)
            .and_then(|s| s.subs.get_mut(service))
        {
            sub.acked = sub.acked.max(revision);
        }
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
            if self.agents[&agent].in_flight.is_none() {
                self.flush(agent, now_ms, catalog, out);
            }
        }
    }

    /// The agent's in-flight send completed.
    pub fn sent(&mut self, agent: AgentId, now_ms: u64, catalog: &Catalog, out: &mut Vec<Output>) {
        let Some(state) = self.agents.get_mut(&agent) else {
            return;
        };
        if let Some(f) = state.in_flight.take() {
            self.snapshots_in_flight -= f.snapshots;
        }
        let Some(since) = state.pending_since_ms else {
            return;
        };
        let due = since + self.params.coalesce_window_ms;
        if now_ms >= due {
            self.flush(agent, now_ms, catalog, out);
        } else {
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
            (None, Some(since)) if now_ms >= since + self.params.coalesce_window_ms => {
                self.flush(agent, now_ms, catalog, out)
            }
            _ => {}
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
        for service in pending {
            let Some(sub) = state.subs.get_mut(&service) else {
                continue;
            };
            let answer = match sub.sent {
                Some(have) => catalog.changes_since(&service, have),
                None => SinceAnswer::SnapshotNeeded,
            };
            match answer {
                SinceAnswer::UpToDate => {
                    if fresh.contains(&service) {
                        let revision = sub.sent.unwrap_or_default();
                        updates.push(ServiceUpdate::Current { service, revision });
                    }
                }
                SinceAnswer::Deltas(deltas) => {
                    sub.sent = deltas.last().map(|d| d.revision).or(sub.sent);
                    self.stats.deltas_sent += deltas.len() as u64;
                    updates.push(ServiceUpdate::Deltas(deltas));
                }
                SinceAnswer::SnapshotNeeded => match catalog.service(&service) {
                    None => {
                        sub.sent = Some(Revision(0));
                        updates.push(ServiceUpdate::Unknown { service });
                    }
                    Some(info)
                        if self.snapshots_in_flight + snapshots
                            < self.params.max_concurrent_snapshots =>
                    {
                        let bytes = match self.snapshot_cache.get(&service) {
                            Some((rev, bytes)) if *rev == info.revision => bytes.clone(),
                            _ => {
                                let snap = catalog
                                    .service_snapshot(&service)
                                    .expect("the service exists");
                                let bytes: Arc<[u8]> = encode_service_snapshot(&snap).into();
                                self.snapshot_cache
                                    .insert(service.clone(), (info.revision, bytes.clone()));
                                bytes
                            }
                        };
                        sub.sent = Some(info.revision);
                        snapshots += 1;
                        updates.push(ServiceUpdate::Snapshot(bytes));
                    }
                    Some(_) => {
                        self.stats.snapshots_refused += 1;
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
        });
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

#[cfg(test)]
mod tests;
