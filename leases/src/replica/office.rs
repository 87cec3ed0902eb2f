//! The replica's standing: leading, following, taking office and stepping
//! down, quorum lost and back, the leader's sweep (held down reports,
//! lease deadlines, purges, the catalog's identity) and down reports.

use super::writes::{Handed, Then};
use super::*;
use crate::endpoint::Principal;
use crate::ids::{AgentEpoch, CatalogId};
use crate::leader::Verdict;
use crate::sessions::{down_outcome, DownOutcome};
use crate::witness;
use rand::RngExt;

/// How long a leader waits for its proposed catalog identity to commit
/// before it proposes one again, ms.
pub(super) const IDENTIFY_RETRY_MS: u64 = 1_000;

/// What this replica is in its Raft group. Since when it leads is the
/// leader memory's; whether its quorum answers is `quorum_lost_at`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It leads.
    Leader,
    /// It follows `leader` (id and QUIC address), if one is known.
    Follower {
        /// The leader.
        leader: Option<(ReplicaId, String)>,
    },
}

impl ReplicaState {
    /// openraft's view of the group: the standing it gives, and quorum
    /// contact.
    pub(super) fn raft<R: Rng + ?Sized>(
        &mut self,
        view: RaftView,
        now: u64,
        rng: &mut R,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let standing = if view.leads {
            Standing::Leader
        } else {
            Standing::Follower {
                leader: view.leader.clone(),
            }
        };
        let term = view.term;
        self.raft = view;
        if standing == self.standing {
            return;
        }
        let previous = std::mem::replace(&mut self.standing, standing.clone());
        match (&previous, &standing) {
            (Standing::Follower { .. }, Standing::Leader) => {
                // R3: no lease expires and no down verdict is accepted for
                // having been silent towards the previous leader.
                self.leader.take_office(now, cat.leases());
                self.quorum_lost_at = None;
                self.witnesses.took_office();
                tracing::info!(
                    replica = self.me,
                    term,
                    "this replica leads; every lease extended by one TTL"
                );
                // Before any grant this leader proposes, so the first
                // Welcome of a new group names its catalog.
                self.identify(now, rng, cat);
            }
            (Standing::Leader, Standing::Follower { leader }) => {
                tracing::warn!(replica = self.me, leader = ?leader, "this replica no longer leads");
                // Queued writes go to the new leader.
                let queued = self.writes.take_queue();
                if !queued.is_empty() {
                    self.propose(queued, now, cat, out);
                }
                for held in self.leader.step_down() {
                    for reply in held.waiting {
                        self.answer(
                            reply,
                            crate::answers::unavailable(
                                "this replica stopped leading while holding the down report; report again".into(),
                            ),
                            out,
                        );
                    }
                }
            }
            (_, Standing::Follower { leader }) => {
                tracing::info!(replica = self.me, leader = ?leader, "leader changed");
            }
            (Standing::Leader, Standing::Leader) => {}
        }
        self.leader_moved(now, cat, out);
    }

    /// Whether this leader's quorum answers. A leader that has had no
    /// quorum acknowledgement for `lease.silence_ms` commits nothing, so no
    /// agent could hold a session: silence then says nothing about the
    /// nodes (R3). It proposes no expiry or down verdict meanwhile, and
    /// when the quorum answers again it starts over as a new leader would:
    /// every lease extended by one TTL, every session counted as heard now.
    fn has_quorum(&mut self, now: u64, cat: &Catalog) -> bool {
        let lost = self
            .raft
            .quorum_ack_ms_ago
            .is_some_and(|ms| ms > self.config.lease.silence_ms);
        match (self.quorum_lost_at, lost) {
            (None, true) => {
                tracing::warn!(
                    replica = self.me,
                    "this leader has no quorum: no lease expires and no down verdict is taken until it returns"
                );
                self.quorum_lost_at = Some(now);
            }
            (Some(since), false) => {
                self.quorum_lost_at = None;
                self.leader.take_office(now, cat.leases());
                tracing::info!(
                    replica = self.me,
                    without_ms = now.saturating_sub(since),
                    "quorum back; every lease extended by one TTL"
                );
            }
            _ => {}
        }
        !lost
    }

    /// Held down reports, lease deadlines and purges: the leader's own
    /// proposals, and the witnesses it asks.
    pub(super) fn sweep<R: Rng + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        if !self.leads() || !self.has_quorum(now, cat) {
            return;
        }
        let sweep = self.leader.sweep(now, cat.leases());
        let asks: Vec<WitnessAsk> = sweep
            .asks
            .iter()
            .filter_map(|(node, epoch)| witness::ask(cat, node, *epoch))
            .collect();
        self.verdicts(sweep.verdicts, now, cat, out);
        self.writes
            .wake_up
            .extend(sweep.proposals.into_iter().map(|e| (e, Then::Nothing)));
        for held in sweep.held {
            tracing::warn!(
                node = %held.node,
                silent_ms = held.silent_ms,
                witnesses = ?held.witnesses.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                "a lease past its deadline is held: witnesses see the node alive, so this arbiter may be cut off from it; held at most guard.max_hold_ms"
            );
        }
        self.open_asks(asks, now, cat, out);
        if now >= self.identify_after_ms {
            self.identify(now, rng, cat);
        }
    }

    /// A new group's first leader names the catalog (and a leader of a
    /// group older than identities names it on upgrade): proposed when this
    /// replica takes office and again at sweeps while none is committed;
    /// the first committed one wins.
    fn identify<R: Rng + ?Sized>(&mut self, now: u64, rng: &mut R, cat: &Catalog) {
        if cat.identity().is_some() {
            // Named for good: no sweep looks again.
            self.identify_after_ms = u64::MAX;
        } else {
            self.identify_after_ms = now + IDENTIFY_RETRY_MS;
            self.writes.wake_up.push((
                Envelope {
                    at_ms: now,
                    actor: self.leader.principal().clone(),
                    command: Command::Identify {
                        catalog: CatalogId(rng.random()),
                    },
                },
                Then::Nothing,
            ));
        }
    }

    /// A gossip down report: the leader holds it for the second signal, a
    /// follower hands it to the leader.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report_down(
        &mut self,
        reporter: NodeId,
        actor: Principal,
        node: NodeId,
        epoch: AgentEpoch,
        reply: Reply,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        if !self.leads() {
            // The leader holds it for up to probe_timeout_ms, and a
            // follower's answer may come a sweep interval later.
            let wait = self.config.lease.probe_timeout_ms
                + self.config.lease.sweep_interval_ms
                + self.config.raft.write_timeout_ms;
            let handed = Handed::Down {
                reporter,
                actor,
                node,
                epoch,
                reply,
            };
            self.hand_over(handed, now + wait, now, cat, out);
            return;
        }
        // The second signal (R4): the node's own session is probed (here,
        // and by the followers the probe is handed to); the leader memory
        // holds the report until the node is heard (a partition) or the
        // probe goes unanswered for probe_timeout_ms. A node without a
        // session here, in a group of one, is silent at once.
        let here = self.open_probe(&node, epoch, now, out);
        let sessionless = !here && self.raft.others.is_empty();
        let verdicts =
            self.leader
                .report_down(reporter, actor, node, epoch, now, sessionless, Some(reply));
        self.verdicts(verdicts, now, cat, out);
    }

    /// Carries settled down reports: a partition or an uncorroborated
    /// report answers its reporters, a verdict is proposed (answering the
    /// first reporter when committed, the others at once); a single
    /// reporter's verdict past its probe has its witnesses asked.
    pub(super) fn verdicts(
        &mut self,
        verdicts: Vec<Verdict<Reply>>,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        for verdict in verdicts {
            match &verdict {
                Verdict::Partition {
                    node, reporters, ..
                } => {
                    self.counters.down_reports_ignored += 1;
                    tracing::warn!(node = %node, reporters = ?reporters, "gossip says down but the arbiter still hears the node: a partition inside the zone; nothing removed");
                }
                Verdict::Uncorroborated {
                    node,
                    reporter,
                    alive,
                    ..
                } => {
                    self.counters.down_reports_uncorroborated += 1;
                    tracing::warn!(target: "rollcall::audit", node = %node, reporter = %reporter, alive = ?alive, "a down report by one node alone, vetoed by witnesses that see the node alive; nothing removed");
                }
                Verdict::Down { .. } => {}
            }
            match down_outcome(verdict) {
                DownOutcome::Answer { waiting, answer } => {
                    for reply in waiting {
                        self.answer(reply, answer.clone(), out);
                    }
                }
                DownOutcome::Propose {
                    envelope,
                    first,
                    others,
                    answer,
                } => {
                    let then = first.map_or(Then::Nothing, Then::Reply);
                    self.writes.wake_up.push((envelope, then));
                    for reply in others {
                        self.answer(reply, answer.clone(), out);
                    }
                }
            }
        }
        let asks: Vec<WitnessAsk> = self
            .leader
            .take_down_asks()
            .iter()
            .filter_map(|(node, epoch)| witness::ask(cat, node, *epoch))
            .collect();
        if !asks.is_empty() {
            self.open_asks(asks, now, cat, out);
        }
    }

    /// Why this replica does not take a leader's request.
    pub(super) fn not_leader(&self) -> Response {
        match &self.standing {
            Standing::Follower {
                leader: Some((id, addr)),
            } => crate::answers::unavailable(format!(
                "this replica is not the leader; the leader is replica {id} at {addr}; retry"
            )),
            _ => no_leader(),
        }
    }
}

/// The answer to a write while the group has no leader.
pub(super) fn no_leader() -> Response {
    crate::answers::unavailable(
        "this region's arbiter group has no leader now (an election is running, or fewer than a \
         majority of replicas are reachable); the write is not committed; retry"
            .into(),
    )
}
