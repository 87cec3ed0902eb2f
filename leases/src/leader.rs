//! The leader's memory (R3, R4), sans-IO: when each node's session was
//! last heard, when each lease is due (`lease::Deadlines`: renewals move
//! deadlines without a log entry, so they live here and never in the
//! replicated catalog), gossip down reports held for the arbiter's own signal,
//! witnesses asked about leases past their deadline, lease expiries with
//! the zone's silent count, purges, and the grace a new leader gives.
//!
//! Two signals for expiry too: a session the arbiter no longer hears is
//! one signal, and the arbiter may be the one cut off. So before a lease
//! past its deadline is expired, agents that still hold sessions are asked
//! as witnesses (`Sweep::asks`; the driver picks them and carries the
//! answers back through [`LeaderMemory::witnessed`]): one that sees the
//! node alive (its gossip holds it alive, or its endpoints accept a
//! connection) holds the expiry for at most `max_hold_ms`; at least
//! [`MIN_GONE_WITNESSES`] that all see it gone confirm it down at once (a
//! `NodeDown` naming them, which the mass-expiry guard counts but does not
//! hold: the zone may be dead, not cut off); no answer within
//! `witness_wait_ms` falls back to the expiry, which the guard may hold.
//! Gossip down reports are held for the arbiter's own signal, and a single
//! reporter's for one more (`downs.rs`).
//!
//! The replica machine (`replica::ReplicaState`) owns it and drives it
//! with the time and openraft's view of who leads; the fleet simulation
//! (`rollcall chaos sim`) drives the same code on a virtual clock. It
//! proposes commands and applies none: `Catalog::apply` decides (the
//! mass-expiry guard, the epoch checks).
//!
//! `W` is what waits for a down report's answer: the replica machine's
//! answer ids, `()` where nobody waits.

use std::collections::BTreeMap;

use foldhash::HashMap;
use rollcall_config::ArbiterConfig;

use crate::command::{Command, Envelope, MAX_REPORTERS};
use crate::endpoint::{Principal, Role};
use crate::ids::AgentEpoch;
use crate::lease::{Deadlines, LeaseTable, RenewError};
use crate::name::{Label, NodeId, PrincipalName};

mod downs;

pub use downs::{Corroboration, HeldDown, Verdict};

/// The settings the leader's memory works with, from `[lease]`,
/// `[guard]` and `[store]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderParams {
    /// A lease's time to live after its last renewal, ms.
    pub ttl_ms: u64,
    /// How long a probe of a node's session may go unanswered before the
    /// arbiter's own signal agrees with gossip, ms.
    pub probe_timeout_ms: u64,
    /// How long the mass-expiry guard may hold an expiry, ms.
    pub max_hold_ms: u64,
    /// How often tombstones are purged, ms.
    pub purge_interval_ms: u64,
    /// How long witnesses are waited for once a lease is past its
    /// deadline, ms; 0: no witnesses, silence alone expires.
    pub witness_wait_ms: u64,
}

/// Witnesses that must all see a silent node gone before it is confirmed
/// down without its lease expiring.
pub const MIN_GONE_WITNESSES: usize = 2;

/// What one witness said of a silent node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Its gossip holds the node alive (`Some(true)`), down
    /// (`Some(false)`), or does not know it.
    pub gossip: Option<bool>,
    /// One of the node's endpoints accepted a connection (`Some(true)`),
    /// none did (`Some(false)`), or none was asked about.
    pub reachable: Option<bool>,
}

impl Seen {
    /// The witness sees the node alive.
    pub fn alive(self) -> bool {
        self.gossip == Some(true) || self.reachable == Some(true)
    }

    /// The witness sees the node gone (and nothing alive).
    pub fn gone(self) -> bool {
        !self.alive() && (self.gossip == Some(false) || self.reachable == Some(false))
    }
}

/// Witnesses asked about one silent lease.
#[derive(Debug)]
struct Witnessing {
    epoch: AgentEpoch,
    /// When the lease was first found past its deadline, ms.
    since_ms: u64,
    /// When witnesses were last asked, ms.
    asked_at_ms: u64,
    answers: BTreeMap<NodeId, Seen>,
    /// Whether the hold was announced (once per hold).
    announced: bool,
}

impl Witnessing {
    fn new(epoch: AgentEpoch, now_ms: u64) -> Self {
        Witnessing {
            epoch,
            since_ms: now_ms,
            asked_at_ms: now_ms,
            answers: BTreeMap::new(),
            announced: false,
        }
    }

    /// The witnesses whose answer says `what`, in node order.
    fn witnesses(&self, what: fn(Seen) -> bool) -> Vec<NodeId> {
        self.answers
            .iter()
            .filter(|(_, seen)| what(**seen))
            .map(|(node, _)| node.clone())
            .collect()
    }
}

/// A silent lease whose expiry witnesses hold: its node is alive to them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldAlive {
    /// The node.
    pub node: NodeId,
    /// The witnesses that see it alive.
    pub witnesses: Vec<NodeId>,
    /// How long its session has been silent, ms.
    pub silent_ms: u64,
}

impl From<&ArbiterConfig> for LeaderParams {
    fn from(config: &ArbiterConfig) -> Self {
        LeaderParams {
            ttl_ms: config.lease.ttl_ms,
            probe_timeout_ms: config.lease.probe_timeout_ms,
            max_hold_ms: config.guard.max_hold_ms,
            purge_interval_ms: config.store.purge_interval_ms,
            witness_wait_ms: config.lease.witness_wait_ms,
        }
    }
}

/// What one sweep proposes.
#[derive(Debug)]
pub struct Sweep<W> {
    /// Down reports settled.
    pub verdicts: Vec<Verdict<W>>,
    /// `ExpireLease` for every lease past its deadline (or held by the
    /// guard for `max_hold_ms`) that no witness confirmed or held,
    /// `NodeDown` for one its witnesses confirmed gone, and `Purge` when
    /// it is due.
    pub proposals: Vec<Envelope>,
    /// Silent leases to ask witnesses about now: (node, epoch).
    pub asks: Vec<(NodeId, AgentEpoch)>,
    /// Expiries witnesses began to hold in this sweep (for the alert).
    pub held: Vec<HeldAlive>,
}

/// The leader's memory of one replica. A follower keeps hearing sessions
/// (so it knows them if it is elected) but decides nothing.
#[derive(Debug)]
pub struct LeaderMemory<W> {
    params: LeaderParams,
    me: Principal,
    /// Since when this replica leads (ms), `None` while it follows.
    since: Option<u64>,
    last_heard: HashMap<NodeId, u64>,
    downs: BTreeMap<NodeId, HeldDown<W>>,
    /// Single reporters' verdicts whose witnesses are to be asked.
    down_asks: Vec<(NodeId, AgentEpoch)>,
    /// Expiries proposed and not yet settled, with when.
    expiring: HashMap<NodeId, u64>,
    /// Silent leases whose witnesses were asked.
    witnessing: BTreeMap<NodeId, Witnessing>,
    /// When each lease is due: renewals move these without a log entry.
    deadlines: Deadlines,
    next_purge_ms: u64,
}

impl<W> LeaderMemory<W> {
    /// A follower's memory at `now_ms`, proposing as `me`.
    pub fn new(params: LeaderParams, me: Principal, now_ms: u64) -> Self {
        LeaderMemory {
            params,
            me,
            since: None,
            last_heard: HashMap::default(),
            downs: BTreeMap::new(),
            down_asks: Vec::new(),
            expiring: HashMap::default(),
            witnessing: BTreeMap::new(),
            deadlines: Deadlines::default(),
            next_purge_ms: now_ms.saturating_add(params.purge_interval_ms),
        }
    }

    /// Who this replica's own proposals come from.
    pub fn principal(&self) -> &Principal {
        &self.me
    }

    /// The settings.
    pub fn params(&self) -> &LeaderParams {
        &self.params
    }

    /// Whether this replica leads.
    pub fn leads(&self) -> bool {
        self.since.is_some()
    }

    /// Starts leading at `now_ms` (an election won, a restart, a quorum
    /// back): every lease gets one TTL from now, every session counts as
    /// heard now, and nothing is being expired. An election or an outage
    /// of the arbiter never expires a fleet that was silent towards it
    /// (R3).
    pub fn take_office(&mut self, now_ms: u64, leases: &LeaseTable) {
        self.since = Some(now_ms);
        self.deadlines.extend_all(leases, now_ms);
        self.expiring.clear();
        self.witnessing.clear();
    }

    /// Gives every lease one TTL from `now_ms` without anything else of
    /// taking office: a leader that installed a snapshot holds leases it
    /// had no deadlines for.
    pub fn extend_all(&mut self, now_ms: u64, leases: &LeaseTable) {
        self.deadlines.extend_all(leases, now_ms);
    }

    /// When `node`'s lease in `leases` is due, as this memory counts it.
    pub fn deadline(&self, leases: &LeaseTable, node: &NodeId) -> Option<u64> {
        self.deadlines.deadline(leases, node)
    }

    /// Stops leading: the held down reports are handed back (their
    /// waiters must report again to the new leader) and nothing is being
    /// expired.
    pub fn step_down(&mut self) -> Vec<HeldDown<W>> {
        self.since = None;
        self.expiring.clear();
        self.witnessing.clear();
        self.down_asks.clear();
        std::mem::take(&mut self.downs).into_values().collect()
    }

    /// `node`'s session was heard at `at_ms` (directly, or as a follower
    /// reports it).
    pub fn heard(&mut self, node: &NodeId, at_ms: u64) {
        match self.last_heard.get_mut(node) {
            Some(t) => *t = (*t).max(at_ms),
            None => {
                self.last_heard.insert(node.clone(), at_ms);
            }
        }
        // Its session speaks again: what witnesses said no longer matters.
        if self
            .witnessing
            .get(node)
            .is_some_and(|w| w.asked_at_ms <= at_ms)
        {
            self.witnessing.remove(node);
        }
    }

    /// A witness's answer about `node`'s silent lease of `epoch`, or about
    /// a single reporter's verdict on it; ignored unless witnesses were
    /// asked about that one. Whether a held down report took it (the
    /// caller decides the held reports again, `decide_downs`).
    pub fn witnessed(
        &mut self,
        witness: NodeId,
        node: &NodeId,
        epoch: AgentEpoch,
        seen: Seen,
    ) -> bool {
        let down = self.corroborate(&witness, node, epoch, seen);
        if let Some(w) = self.witnessing.get_mut(node) {
            if w.epoch == epoch && witness != *node {
                w.answers.insert(witness, seen);
            }
        }
        down
    }

    /// How many silent leases witnesses hold alive now.
    pub fn held_alive(&self) -> usize {
        self.witnessing
            .values()
            .filter(|w| w.answers.values().any(|s| s.alive()))
            .count()
    }

    /// When `node`'s session was last heard, as this replica counts it:
    /// a leader never earlier than the moment it took office.
    pub fn heard_at(&self, node: &NodeId) -> Option<u64> {
        let last = self.last_heard.get(node).copied();
        match self.since {
            Some(since) => Some(last.map_or(since, |t| t.max(since))),
            None => last,
        }
    }

    /// When `node`'s session was last actually heard here, if ever.
    pub fn last_heard(&self, node: &NodeId) -> Option<u64> {
        self.last_heard.get(node).copied()
    }

    /// The leader's periodic pass over `leases`: held down reports, lease
    /// deadlines (one `ExpireLease` per lease until it settles or a TTL
    /// passes, each with its zone's silent count for the guard), and
    /// purges. A follower proposes nothing.
    pub fn sweep(&mut self, now_ms: u64, leases: &LeaseTable) -> Sweep<W> {
        let verdicts = self.decide_downs(now_ms);
        let mut sweep = Sweep {
            verdicts,
            proposals: Vec::new(),
            asks: self.take_down_asks(),
            held: Vec::new(),
        };
        if !self.leads() {
            return sweep;
        }
        self.deadlines.forget_ended(leases);
        let due = self.deadlines.due(leases, now_ms, self.params.max_hold_ms);
        let witnessed: Vec<NodeId> = self.witnessing.keys().cloned().collect();
        for node in witnessed {
            if !due.iter().any(|(n, _)| *n == node) {
                // Renewed, or its lease ended.
                self.witnessing.remove(&node);
            }
        }
        if !due.is_empty() {
            let silent = self.silent_by_zone(now_ms, leases);
            for (node, epoch) in due {
                if self
                    .expiring
                    .get(&node)
                    .is_some_and(|at| now_ms < at.saturating_add(self.params.ttl_ms))
                {
                    continue;
                }
                // A lease the guard holds already had its witnesses.
                let guard_held = leases.get(&node).is_some_and(|l| l.held_since_ms.is_some());
                if !guard_held && self.params.witness_wait_ms > 0 {
                    match self.witness(&node, epoch, now_ms, &mut sweep) {
                        Witnesses::Wait => continue,
                        Witnesses::Gone(reporters) => {
                            self.witnessing.remove(&node);
                            self.expiring.insert(node.clone(), now_ms);
                            sweep.proposals.push(Envelope {
                                at_ms: now_ms,
                                actor: agent_principal(&reporters[0]),
                                command: Command::NodeDown {
                                    node,
                                    epoch,
                                    reporters,
                                },
                            });
                            continue;
                        }
                        Witnesses::Expire => {
                            self.witnessing.remove(&node);
                        }
                    }
                }
                let silent_in_zone = leases
                    .get(&node)
                    .and_then(|l| silent.get(&l.zone).copied())
                    .unwrap_or(1)
                    .max(1);
                self.expiring.insert(node.clone(), now_ms);
                sweep.proposals.push(Envelope {
                    at_ms: now_ms,
                    actor: self.me.clone(),
                    command: Command::ExpireLease {
                        node,
                        epoch,
                        silent_in_zone,
                    },
                });
            }
        }
        // A single reporter's verdict and a silent lease may ask about
        // the same node in one sweep: asked once.
        let mut asked = std::collections::BTreeSet::new();
        sweep.asks.retain(|(node, _)| asked.insert(node.clone()));
        if now_ms >= self.next_purge_ms {
            self.next_purge_ms = now_ms.saturating_add(self.params.purge_interval_ms);
            sweep.proposals.push(Envelope {
                at_ms: now_ms,
                actor: self.me.clone(),
                command: Command::Purge,
            });
        }
        sweep
    }

    /// What the witnesses of `node`'s silent lease decide now: ask them
    /// (first, and again every TTL while they hold it alive), wait, hold,
    /// confirm it gone, or let it expire.
    fn witness(
        &mut self,
        node: &NodeId,
        epoch: AgentEpoch,
        now_ms: u64,
        sweep: &mut Sweep<W>,
    ) -> Witnesses {
        let heard = self.heard_at(node);
        let w = self
            .witnessing
            .entry(node.clone())
            .or_insert_with(|| Witnessing::new(epoch, now_ms));
        if w.epoch != epoch {
            *w = Witnessing::new(epoch, now_ms);
        }
        if w.since_ms == now_ms {
            sweep.asks.push((node.clone(), epoch));
            return Witnesses::Wait;
        }
        if now_ms.saturating_sub(w.since_ms) >= self.params.max_hold_ms {
            return Witnesses::Expire;
        }
        let alive = w.witnesses(Seen::alive);
        if !alive.is_empty() {
            if !w.announced {
                w.announced = true;
                sweep.held.push(HeldAlive {
                    node: node.clone(),
                    witnesses: alive,
                    silent_ms: now_ms.saturating_sub(heard.unwrap_or(now_ms)),
                });
            }
            // Asked again every TTL: the node may have died since.
            if now_ms.saturating_sub(w.asked_at_ms) >= self.params.ttl_ms {
                w.asked_at_ms = now_ms;
                w.answers.clear();
                w.announced = false;
                sweep.asks.push((node.clone(), epoch));
            }
            return Witnesses::Wait;
        }
        let mut gone = w.witnesses(Seen::gone);
        gone.truncate(MAX_REPORTERS);
        if gone.len() >= MIN_GONE_WITNESSES {
            return Witnesses::Gone(gone);
        }
        if now_ms.saturating_sub(w.asked_at_ms) >= self.params.witness_wait_ms {
            return Witnesses::Expire;
        }
        Witnesses::Wait
    }

    /// How many leaseholders of each zone have had silent sessions for
    /// longer than half a TTL: a live agent renews every third of one, so
    /// past half it missed a renewal.
    fn silent_by_zone(&self, now_ms: u64, leases: &LeaseTable) -> HashMap<Label, u32> {
        let mut silent: HashMap<Label, u32> = HashMap::default();
        let quiet_after = self.params.ttl_ms / 2;
        for lease in leases.iter() {
            let quiet = self
                .heard_at(&lease.node)
                .is_none_or(|t| now_ms.saturating_sub(t) > quiet_after);
            if quiet {
                *silent.entry(lease.zone.clone()).or_default() += 1;
            }
        }
        silent
    }

    /// A proposal of this memory's was committed, refused or lost: an
    /// expiry of the same lease may be proposed again.
    pub fn settled(&mut self, command: &Command) {
        if let Command::ExpireLease { node, .. } = command {
            self.expiring.remove(node);
        }
    }

    /// Renews `node`'s lease (as `leases` holds it) at `at_ms`; a lease the guard
    /// holds is reinstated by the returned proposal, as `actor` (R3).
    pub fn renew(
        &mut self,
        leases: &LeaseTable,
        node: &NodeId,
        epoch: AgentEpoch,
        at_ms: u64,
        actor: &Principal,
    ) -> Result<Option<Envelope>, RenewError> {
        let renewal = self.deadlines.renew(leases, node, epoch, at_ms)?;
        if !renewal.held {
            return Ok(None);
        }
        Ok(leases.get(node).map(|lease| Envelope {
            at_ms,
            actor: actor.clone(),
            command: Command::GrantLease {
                node: node.clone(),
                epoch,
                zone: lease.zone.clone(),
                ttl_ms: self.params.ttl_ms,
            },
        }))
    }
}

/// What a silent lease's witnesses decide.
enum Witnesses {
    /// Not yet (asked now, waiting for answers, or held alive).
    Wait,
    /// These witnesses all see the node gone: confirm it down.
    Gone(Vec<NodeId>),
    /// Nobody could tell (or the hold reached its bound): expire it.
    Expire,
}

/// The principal an agent's node acts as.
pub fn agent_principal(node: &NodeId) -> Principal {
    Principal {
        role: Role::Agent,
        name: PrincipalName::new(node.as_str()).expect("a node id is a valid principal name"),
    }
}

#[cfg(test)]
mod tests;
