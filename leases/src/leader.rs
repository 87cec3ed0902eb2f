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
//! `NodeDown` naming them, which the mass-expiry guard does not hold: the
//! zone may be dead, not cut off); no answer within `witness_wait_ms`
//! falls back to the expiry, which the guard may hold.
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

/// A gossip down report waiting for the arbiter's own signal: the node's
/// answer to a probe of its session.
#[derive(Debug)]
pub struct HeldDown<W> {
    /// The epoch gossip saw go down.
    pub epoch: AgentEpoch,
    /// The nodes that reported it (at most `MAX_REPORTERS`).
    pub reporters: Vec<NodeId>,
    /// When the first report arrived, ms.
    pub reported_at_ms: u64,
    /// When the node's silence is taken as the second signal unless its
    /// session was heard since the report, ms: the report plus
    /// `probe_timeout_ms`, or the report itself when no replica can hold
    /// its session.
    pub answer_by_ms: u64,
    /// Who the verdict is proposed as: the first reporter.
    pub actor: Principal,
    /// Whoever waits for the answer.
    pub waiting: Vec<W>,
}

/// How a held down report was settled.
#[derive(Debug)]
pub enum Verdict<W> {
    /// The node's own session was heard after the report: a partition
    /// inside the zone; nothing is removed.
    Partition {
        /// The node reported down.
        node: NodeId,
        /// Who reported it.
        reporters: Vec<NodeId>,
        /// How long ago its session was last heard, ms.
        heard_ago_ms: u64,
        /// Whoever waits for the answer.
        waiting: Vec<W>,
    },
    /// Both signals agree: propose this `NodeDown`.
    Down {
        /// The proposal.
        envelope: Envelope,
        /// Whoever waits for the answer.
        waiting: Vec<W>,
    },
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

    /// A witness's answer about `node`'s silent lease of `epoch`; ignored
    /// unless witnesses were asked about that lease.
    pub fn witnessed(&mut self, witness: NodeId, node: &NodeId, epoch: AgentEpoch, seen: Seen) {
        if let Some(w) = self.witnessing.get_mut(node) {
            if w.epoch == epoch && witness != *node {
                w.answers.insert(witness, seen);
            }
        }
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

    /// How many down reports wait for the second signal.
    pub fn held_downs(&self) -> usize {
        self.downs.len()
    }

    /// When the earliest held down report's probe deadline falls, ms: the
    /// driver decides it then, not at the next sweep.
    pub fn next_down_deadline(&self) -> Option<u64> {
        self.downs.values().map(|h| h.answer_by_ms).min()
    }

    /// A gossip down report (the leader's to hold): kept until the node's
    /// session answers the probe the caller sends it (heard after the
    /// report: a partition), or until `probe_timeout_ms` passed without
    /// (both signals agree); with `sessionless`, no replica can hold the
    /// node's session, so its silence is known at once (once this leader
    /// has led for half a TTL: before that, agents may still be
    /// reconnecting to it). Returns what that settles now.
    #[allow(clippy::too_many_arguments)]
    pub fn report_down(
        &mut self,
        reporter: NodeId,
        actor: Principal,
        node: NodeId,
        epoch: AgentEpoch,
        now_ms: u64,
        sessionless: bool,
        waiting: Option<W>,
    ) -> Vec<Verdict<W>> {
        let answer_by_ms = if sessionless && self.settled_in(now_ms) {
            now_ms
        } else {
            now_ms.saturating_add(self.params.probe_timeout_ms)
        };
        let held = self.downs.entry(node).or_insert_with(|| HeldDown {
            epoch,
            reporters: Vec::new(),
            reported_at_ms: now_ms,
            answer_by_ms,
            actor,
            waiting: Vec::new(),
        });
        held.answer_by_ms = held.answer_by_ms.min(answer_by_ms);
        if !held.reporters.contains(&reporter) && held.reporters.len() < MAX_REPORTERS {
            held.reporters.push(reporter);
        }
        held.waiting.extend(waiting);
        self.decide_downs(now_ms)
    }

    /// Whether this leader has led for half a TTL at `now_ms`: before
    /// that, agents may still be reconnecting to it, so a node without a
    /// session here is not yet known silent.
    fn settled_in(&self, now_ms: u64) -> bool {
        self.since
            .is_some_and(|since| now_ms.saturating_sub(since) >= self.params.ttl_ms / 2)
    }

    /// `node`'s session closed and no replica holds another: a down report
    /// held for it need not wait for its probe (as `report_down` with
    /// `sessionless`). Returns what that settles now.
    pub fn session_closed(&mut self, node: &NodeId, now_ms: u64) -> Vec<Verdict<W>> {
        let settled_in = self.settled_in(now_ms);
        match self.downs.get_mut(node) {
            Some(held) if settled_in => held.answer_by_ms = held.answer_by_ms.min(now_ms),
            _ => return Vec::new(),
        }
        self.decide_downs(now_ms)
    }

    /// Settles held down reports (R4): heard directly since the report
    /// (the probe answered, or any other message of its session) → a
    /// partition, nothing removed; no answer by the report's
    /// `answer_by_ms` → both signals agree and the verdict is proposed. A
    /// follower settles nothing.
    pub fn decide_downs(&mut self, now_ms: u64) -> Vec<Verdict<W>> {
        if !self.leads() {
            return Vec::new();
        }
        let mut settled = Vec::new();
        let nodes: Vec<NodeId> = self.downs.keys().cloned().collect();
        for node in nodes {
            let heard = self.heard_at(&node);
            let reported_at = self.downs[&node].reported_at_ms;
            // Heard in the report's own millisecond counts: a probe's answer
            // on loopback can come back within it.
            let heard_directly = self.last_heard(&node).is_some_and(|t| t >= reported_at);
            if heard_directly {
                let held = self.downs.remove(&node).expect("listed above");
                settled.push(Verdict::Partition {
                    heard_ago_ms: now_ms.saturating_sub(heard.unwrap_or(now_ms)),
                    node,
                    reporters: held.reporters,
                    waiting: held.waiting,
                });
            } else if now_ms >= self.downs[&node].answer_by_ms {
                let held = self.downs.remove(&node).expect("listed above");
                let envelope = Envelope {
                    at_ms: now_ms,
                    actor: held.actor,
                    command: Command::NodeDown {
                        node,
                        epoch: held.epoch,
                        reporters: held.reporters,
                    },
                };
                settled.push(Verdict::Down {
                    envelope,
                    waiting: held.waiting,
                });
            }
        }
        settled
    }

    /// The leader's periodic pass over `leases`: held down reports, lease
    /// deadlines (one `ExpireLease` per lease until it settles or a TTL
    /// passes, each with its zone's silent count for the guard), and
    /// purges. A follower proposes nothing.
    pub fn sweep(&mut self, now_ms: u64, leases: &LeaseTable) -> Sweep<W> {
        let mut sweep = Sweep {
            verdicts: self.decide_downs(now_ms),
            proposals: Vec::new(),
            asks: Vec::new(),
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
