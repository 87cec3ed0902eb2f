//! What the distribution state holds in memory, counted from its own
//! tables, for `/metrics` and the fleet bench's per-session breakdown.
//!
//! A lower bound: each table is counted at its capacity (keys, values and
//! the hash table's control byte), ordered sets at one key per entry with
//! no node slack, and names (`Arc<str>`, shared with the catalog) at their
//! pointer only. Allocator overhead is not counted.

use std::collections::BTreeSet;
use std::mem::size_of;

use super::{AgentState, Distributor, Sub};
use crate::ids::AgentId;
use crate::name::ServiceKey;

impl Distributor {
    /// Bytes of per-agent delivery state (not its subscriptions).
    pub fn session_state_bytes(&self) -> usize {
        let table = self.agents.capacity() * (size_of::<AgentId>() + size_of::<AgentState>() + 1);
        let in_flight: usize = self
            .agents
            .values()
            .filter_map(|a| a.in_flight.as_ref())
            .map(|f| f.carries.capacity() * size_of::<ServiceKey>())
            .sum();
        table + in_flight
    }

    /// Bytes of subscriptions: each agent's per-service state and pending
    /// sets, and the per-service sets of watchers.
    pub fn subscription_state_bytes(&self) -> usize {
        let per_agent: usize = self
            .agents
            .values()
            .map(|a| {
                a.subs.capacity() * (size_of::<ServiceKey>() + size_of::<Sub>() + 1)
                    + (a.pending.len() + a.fresh.len()) * size_of::<ServiceKey>()
            })
            .sum();
        let watchers = self.watchers.capacity()
            * (size_of::<ServiceKey>() + size_of::<BTreeSet<AgentId>>() + 1)
            + self
                .watchers
                .values()
                .map(|set| set.len() * size_of::<AgentId>())
                .sum::<usize>();
        per_agent + watchers
    }
}
