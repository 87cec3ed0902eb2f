//! Witnesses, probes and heard notes: which sessions are asked about a
//! silent lease (the leader's own, and on a follower the leader's open
//! asks carried to its agents once each), which nodes' sessions are probed
//! for the arbiter's own signal of a down report or a silent lease (R4:
//! the leader probes its own, a follower those the leader hands it), what
//! a follower heard and its witnesses answered, handed to the leader every
//! sweep interval, and at once when a probe was answered.

use super::*;
use crate::ids::AgentEpoch;
use crate::leader::Seen;
use crate::witness::{self, WitnessAnswer};

/// What a follower heard since its last report to the leader.
struct HeardNote {
    epoch: AgentEpoch,
    at_ms: u64,
    renewed: bool,
}

/// The witness asks and heard notes of one replica.
#[derive(Default)]
pub(super) struct Witnesses {
    /// Leader: the asks still open, with when, handed to the followers
    /// with their `Heard` answers.
    open: Vec<(WitnessAsk, u64)>,
    /// Follower: asks already carried to this replica's agents, with when.
    carried: HashMap<(NodeId, AgentEpoch), u64>,
    /// Follower: witnesses' answers to hand to the leader.
    answers: Vec<WitnessAnswer>,
    /// Every replica: the witnesses (nodes) asked about a node's run, with
    /// when. An answer counts only from a node asked, once, within a TTL
    /// (issue 38): its authenticated identity is the ask's nonce. Keyed by
    /// the witness's node, not its session, so a witness that reconnects
    /// between the question and its answer (every agent at once after a
    /// partition heals) is still heard.
    asked: HashMap<(NodeId, NodeId, AgentEpoch), u64>,
    /// Follower: sessions heard since the last report.
    heard: HashMap<NodeId, HeardNote>,
    /// Leader: the nodes being probed, with when, handed to the followers
    /// with their `Heard` answers for `lease.probe_timeout_ms`.
    probes: Vec<(NodeId, AgentEpoch, u64)>,
    /// Follower: probes already carried to this replica's sessions, with
    /// when.
    probed: HashMap<(NodeId, AgentEpoch), u64>,
    /// Follower: a probe was answered; the leader is told at the end of
    /// this wake-up, not at the next sweep.
    pub(super) report_now: bool,
}

impl Witnesses {
    /// A new leader reports to nobody.
    pub(super) fn took_office(&mut self) {
        self.heard.clear();
    }

    /// The leader's open asks.
    pub(super) fn open(&self) -> Vec<WitnessAsk> {
        self.open.iter().map(|(a, _)| a.clone()).collect()
    }

    /// The leader's open probes.
    pub(super) fn open_probes(&self) -> Vec<(NodeId, AgentEpoch)> {
        self.probes
            .iter()
            .map(|(node, epoch, _)| (node.clone(), *epoch))
            .collect()
    }
}

impl ReplicaState {
    /// Notes that `node` was heard now; a follower also queues it for its
    /// next report to the leader.
    pub(super) fn heard(&mut self, node: &NodeId, epoch: AgentEpoch, now: u64, renewed: bool) {
        self.leader.heard(node, now);
        if !self.leads() {
            let note = self
                .witnesses
                .heard
                .entry(node.clone())
                .or_insert(HeardNote {
                    epoch,
                    at_ms: now,
                    renewed: false,
                });
            note.epoch = epoch;
            note.at_ms = now;
            note.renewed |= renewed;
        }
    }

    /// A witness's answer on `agent`'s session (of node `witness`): the
    /// leader's memory takes it (and decides the down reports it may
    /// settle), a follower hands it to the leader. An answer the node was
    /// not asked for (or gave already) is refused: counted and audited,
    /// nothing changed.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn witnessed(
        &mut self,
        agent: AgentId,
        witness: NodeId,
        node: NodeId,
        epoch: AgentEpoch,
        seen: Seen,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let asked = self
            .witnesses
            .asked
            .remove(&(witness.clone(), node.clone(), epoch))
            .is_some_and(|at| now.saturating_sub(at) <= self.config.lease.ttl_ms);
        if !asked {
            self.counters.witness_answers_unasked += 1;
            let reason = format!(
                "a witness answer about node {node} (run {epoch}) that node {witness} was not asked for, or gave already; not counted"
            );
            self.audit_refusal(agent, "witness", &reason, now);
            return;
        }
        if self.leads() {
            if self.leader.witnessed(witness, &node, epoch, seen) {
                let verdicts = self.leader.decide_downs(now);
                self.verdicts(verdicts, now, cat, out);
            }
        } else {
            self.witnesses.answers.push(WitnessAnswer {
                witness,
                node,
                epoch,
                gossip: seen.gossip,
                reachable: seen.reachable,
            });
        }
    }

    /// The leader's new asks: its own witnesses are asked, and the asks
    /// stay open for `lease.witness_wait_ms` for the followers to carry
    /// (answers later than that are not waited for; a held lease is asked
    /// about again every TTL).
    pub(super) fn open_asks(
        &mut self,
        asks: Vec<WitnessAsk>,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let keep = self.config.lease.witness_wait_ms;
        self.witnesses
            .open
            .retain(|(_, at)| now.saturating_sub(*at) < keep);
        self.forget_asked(now);
        self.ask_witnesses(&asks, now, cat, out);
        self.witnesses
            .open
            .extend(asks.into_iter().map(|ask| (ask, now)));
    }

    /// A follower carries the leader's open witness asks to its own
    /// agents, each once while it is open (`lease.witness_wait_ms`).
    pub(super) fn carry_asks(
        &mut self,
        asks: Vec<WitnessAsk>,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let keep = self.config.lease.witness_wait_ms;
        self.witnesses
            .carried
            .retain(|_, at| now.saturating_sub(*at) < keep);
        let mut fresh = Vec::new();
        for ask in asks {
            let key = (ask.node.clone(), ask.epoch);
            if self.witnesses.carried.contains_key(&key) {
                continue;
            }
            self.witnesses.carried.insert(key, now);
            fresh.push(ask);
        }
        self.forget_asked(now);
        self.ask_witnesses(&fresh, now, cat, out);
    }

    /// Forgets the witnesses asked more than a TTL ago: a witness that
    /// has not answered by then is not waited for (a held lease is asked
    /// about again every TTL).
    fn forget_asked(&mut self, now: u64) {
        let ttl = self.config.lease.ttl_ms;
        self.witnesses
            .asked
            .retain(|_, at| now.saturating_sub(*at) <= ttl);
    }

    /// The leader probes `node`'s sessions here and keeps the probe open
    /// for the followers to carry (`lease.probe_timeout_ms`); whether a
    /// session of the node is here.
    pub(super) fn open_probe(
        &mut self,
        node: &NodeId,
        epoch: AgentEpoch,
        now: u64,
        out: &mut Vec<Output>,
    ) -> bool {
        let keep = self.config.lease.probe_timeout_ms;
        self.witnesses
            .probes
            .retain(|(_, _, at)| now.saturating_sub(*at) < keep);
        if !self
            .witnesses
            .probes
            .iter()
            .any(|(n, e, _)| n == node && *e == epoch)
        {
            self.witnesses.probes.push((node.clone(), epoch, now));
        }
        self.probe(node, now, out)
    }

    /// A follower probes the sessions it holds of the nodes the leader
    /// names, each once while the probe is open.
    pub(super) fn carry_probes(
        &mut self,
        probes: Vec<(NodeId, AgentEpoch)>,
        now: u64,
        out: &mut Vec<Output>,
    ) {
        let keep = self.config.lease.probe_timeout_ms;
        self.witnesses
            .probed
            .retain(|_, at| now.saturating_sub(*at) < keep);
        for (node, epoch) in probes {
            if self
                .witnesses
                .probed
                .insert((node.clone(), epoch), now)
                .is_none()
            {
                self.probe(&node, now, out);
            }
        }
    }

    /// Sends a probe down every live session of `node` here; whether
    /// there was one. Its answer (`SessionUp::Alive`), as any message of
    /// the session, counts the node heard.
    pub(super) fn probe(&mut self, node: &NodeId, now: u64, out: &mut Vec<Output>) -> bool {
        let agents: Vec<AgentId> = self
            .sessions
            .agents()
            .filter(|a| self.sessions.live(*a).is_some_and(|(n, _)| n == node))
            .collect();
        self.probe_sessions(agents, now, out)
    }

    /// Sends a probe down each of `agents`' sessions (one node's), in
    /// agent order; whether there was one.
    fn probe_sessions(
        &mut self,
        mut agents: Vec<AgentId>,
        now: u64,
        out: &mut Vec<Output>,
    ) -> bool {
        agents.sort_unstable();
        for &agent in &agents {
            // An agent from before probes keeps its session alive itself.
            if self.sessions.probes(agent) {
                self.counters.probes_sent += 1;
                self.send(agent, SessionDown::Probe { nonce: now }, out);
            }
        }
        !agents.is_empty()
    }

    /// Asks this replica's witnesses about silent leases
    /// (`witness::choose` among the sessions it heard within a TTL: live
    /// agents renew every third of one), and probes each node's own
    /// session here, if it has one. The sessions are read once for the
    /// whole batch: a region's agents cut off together open thousands of
    /// asks at once.
    fn ask_witnesses(
        &mut self,
        asks: &[WitnessAsk],
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        if asks.is_empty() {
            return;
        }
        let silence = self.config.lease.ttl_ms;
        let mut by_node: HashMap<NodeId, Vec<AgentId>> = HashMap::default();
        let mut heard: Vec<(AgentId, NodeId, crate::name::Label)> = Vec::new();
        for agent in self.sessions.agents() {
            let Some((node, _)) = self.sessions.live(agent) else {
                continue;
            };
            by_node.entry(node.clone()).or_default().push(agent);
            let Some(at) = self.leader.last_heard(node) else {
                continue;
            };
            if now.saturating_sub(at) > silence {
                continue;
            }
            if let Some(lease) = cat.leases().get(node) {
                heard.push((agent, node.clone(), lease.zone.clone()));
            }
        }
        let candidates = witness::Candidates::new(heard.iter().map(|(a, n, z)| (*a, n, z)));
        for ask in asks {
            let own = by_node.get(&ask.node).cloned().unwrap_or_default();
            self.probe_sessions(own, now, out);
            for agent in candidates.choose(ask) {
                if let Some((witness, _)) = self.sessions.live(agent) {
                    self.witnesses
                        .asked
                        .insert((witness.clone(), ask.node.clone(), ask.epoch), now);
                }
                let message = SessionDown::Witness {
                    node: ask.node.clone(),
                    epoch: ask.epoch,
                    addresses: ask.addresses.clone(),
                };
                self.send(agent, message, out);
            }
        }
    }

    /// A follower tells the leader which sessions it heard, and hands it
    /// its witnesses' answers.
    pub(super) fn report_heard(&mut self, now: u64, out: &mut Vec<Output>) {
        self.witnesses.report_now = false;
        if self.leads() {
            self.witnesses.answers.clear();
            return;
        }
        let Standing::Follower {
            leader: Some((_, addr)),
        } = &self.standing
        else {
            return;
        };
        let wait_ms = self.config.raft.write_timeout_ms;
        if !self.witnesses.answers.is_empty() {
            out.push(Output::Tell {
                to: addr.clone(),
                request: PeerRequest::Witnessed(std::mem::take(&mut self.witnesses.answers)),
                wait_ms,
            });
        }
        // Reported every sweep while sessions are here, heard or not:
        // the answer carries the probes the leader wants of them.
        if self.witnesses.heard.is_empty() && self.sessions.agents().next().is_none() {
            return;
        }
        let mut heard: Vec<Heard> = self
            .witnesses
            .heard
            .drain()
            .map(|(node, note)| Heard {
                node,
                epoch: note.epoch,
                ago_ms: now.saturating_sub(note.at_ms),
                renewed: note.renewed,
            })
            .collect();
        heard.sort_unstable_by(|a, b| a.node.cmp(&b.node));
        out.push(Output::ReportHeard {
            to: addr.clone(),
            heard,
            wait_ms,
        });
    }

    /// The leader refused renewals this follower reported: the sessions
    /// of those nodes here are refused.
    pub(super) fn refused_renewals(
        &mut self,
        refused: Vec<(NodeId, String)>,
        out: &mut Vec<Output>,
    ) {
        for (node, reason) in refused {
            let mut agents: Vec<AgentId> = self
                .sessions
                .agents()
                .filter(|a| self.sessions.held(*a).is_some_and(|(n, _)| *n == node))
                .collect();
            agents.sort_unstable();
            for agent in agents {
                self.refuse(agent, reason.clone(), out);
            }
        }
    }
}
