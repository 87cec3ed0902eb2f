//! Gossip down reports in the leader's memory (R4, R10): each is held for
//! the arbiter's own signal (a probe of the node's session, unanswered for
//! `probe_timeout_ms`), and a report only one node made waits for one more
//! before it is acted on.
//!
//! One more, because a node's certificate and its zone's gossip key are
//! all a compromised node needs to report any node of its zone down. Two
//! reporters are two nodes' word; a single one's verdict asks the node's
//! witnesses (`witness::choose`, the same question as for a silent lease)
//! and any of them (never a reporter) that sees the node alive vetoes it:
//! the node stays in, and if it is dead its lease runs out on its own. One
//! that sees it gone settles it at once; no answer within
//! `witness_wait_ms` settles it too, as for a silent lease: nobody is left
//! to ask when most of a zone died together (`correlated-crash --short`
//! kills 4 of 5 nodes: the survivor is every dead node's one reporter and
//! their only witness). So a rogue's report removes only a node that its
//! own session leaves silent and that no honest witness sees alive (its
//! gossip peers, a connect to its endpoints from another zone). A real
//! crash is seen by every gossip peer of the zone at once, so its second
//! report comes within milliseconds of the first and this costs it
//! nothing; a lone reporter's verdict waits at most `witness_wait_ms`
//! more.

use std::collections::BTreeMap;

use super::{LeaderMemory, Seen};
use crate::command::{Command, Envelope, MAX_REPORTERS};
use crate::endpoint::Principal;
use crate::ids::AgentEpoch;
use crate::name::NodeId;

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
    /// A single reporter's verdict past its probe: the witnesses asked for
    /// one more.
    pub corroboration: Option<Corroboration>,
}

/// The witnesses asked about a single reporter's verdict.
#[derive(Debug)]
pub struct Corroboration {
    /// When they were asked, ms.
    pub asked_at_ms: u64,
    /// What each said.
    pub answers: BTreeMap<NodeId, Seen>,
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
    /// One node alone reported it and a witness sees it alive: nothing
    /// is removed.
    Uncorroborated {
        /// The node reported down.
        node: NodeId,
        /// Its one reporter.
        reporter: NodeId,
        /// The witnesses that see it alive.
        alive: Vec<NodeId>,
        /// Whoever waits for the answer.
        waiting: Vec<W>,
    },
}

impl<W> LeaderMemory<W> {
    /// How many down reports wait for the second signal.
    pub fn held_downs(&self) -> usize {
        self.downs.len()
    }

    /// When the earliest held down report is next decided, ms (its
    /// probe's deadline, or its witnesses' once they are asked): the
    /// driver decides it then, not at the next sweep.
    pub fn next_down_deadline(&self) -> Option<u64> {
        let wait = self.params.witness_wait_ms;
        self.downs
            .values()
            .map(|h| match &h.corroboration {
                Some(c) => c.asked_at_ms.saturating_add(wait),
                None => h.answer_by_ms,
            })
            .min()
    }

    /// The nodes whose single reporter's verdict needs witnesses, asked
    /// since the last call: the driver asks them (`witness::ask`); a sweep
    /// hands them over in `Sweep::asks`.
    pub fn take_down_asks(&mut self) -> Vec<(NodeId, AgentEpoch)> {
        std::mem::take(&mut self.down_asks)
    }

    /// A gossip down report (the leader's to hold): kept until the node's
    /// session answers the probe the caller sends it (heard after the
    /// report: a partition), or until `probe_timeout_ms` passed without
    /// (both signals agree); with `sessionless`, no replica can hold the
    /// node's session, so its silence is known at once (once this leader
    /// has led for half a TTL: before that, agents may still be
    /// reconnecting to it). A second reporter settles a verdict waiting
    /// for one more. Returns what that settles now.
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
            corroboration: None,
        });
        held.answer_by_ms = held.answer_by_ms.min(answer_by_ms);
        if !held.reporters.contains(&reporter) && held.reporters.len() < MAX_REPORTERS {
            held.reporters.push(reporter);
        }
        held.waiting.extend(waiting);
        self.decide_downs(now_ms)
    }

    /// A witness's answer about `node`, for a single reporter's verdict
    /// waiting for one more (answers about another run of the node, and
    /// the node's own, are not taken). Whether one was waiting for it.
    pub(super) fn corroborate(
        &mut self,
        witness: &NodeId,
        node: &NodeId,
        epoch: AgentEpoch,
        seen: Seen,
    ) -> bool {
        let Some(held) = self.downs.get_mut(node) else {
            return false;
        };
        match &mut held.corroboration {
            Some(c) if held.epoch == epoch && witness != node => {
                c.answers.insert(witness.clone(), seen);
                true
            }
            _ => false,
        }
    }

    /// Whether this leader has led for half a TTL at `now_ms`: before
    /// that, agents may still be reconnecting to it, so a node without a
    /// session here is not yet known silent.
    pub(super) fn settled_in(&self, now_ms: u64) -> bool {
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
    /// `answer_by_ms` → both signals agree and the verdict is proposed,
    /// unless one node alone reported it and a witness sees it alive (see
    /// the module's notes). A follower settles nothing.
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
                continue;
            }
            if now_ms < self.downs[&node].answer_by_ms {
                continue;
            }
            match self.one_more(&node, now_ms) {
                OneMore::Wait => {}
                OneMore::Agreed(witness) => {
                    let mut held = self.downs.remove(&node).expect("listed above");
                    held.reporters.extend(witness);
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
                OneMore::Refused(alive) => {
                    let held = self.downs.remove(&node).expect("listed above");
                    settled.push(Verdict::Uncorroborated {
                        node,
                        reporter: held.reporters.into_iter().next().expect("one reporter"),
                        alive,
                        waiting: held.waiting,
                    });
                }
            }
        }
        settled
    }

    /// Whether `node`'s held report, past its probe, may be acted on: a
    /// second reporter, or its witnesses (asked the first time) answered
    /// gone or not at all within `witness_wait_ms`, none of them alive.
    fn one_more(&mut self, node: &NodeId, now_ms: u64) -> OneMore {
        let wait = self.params.witness_wait_ms;
        let held = self.downs.get_mut(node).expect("a held report");
        if held.reporters.len() >= 2 || wait == 0 {
            return OneMore::Agreed(None);
        }
        let Some(c) = &held.corroboration else {
            held.corroboration = Some(Corroboration {
                asked_at_ms: now_ms,
                answers: BTreeMap::new(),
            });
            self.down_asks.push((node.clone(), held.epoch));
            return OneMore::Wait;
        };
        let said = |what: fn(Seen) -> bool| -> Vec<NodeId> {
            c.answers
                .iter()
                .filter(|(w, seen)| what(**seen) && !held.reporters.contains(w))
                .map(|(w, _)| w.clone())
                .collect()
        };
        let alive = said(Seen::alive);
        if !alive.is_empty() {
            return OneMore::Refused(alive);
        }
        if let Some(gone) = said(Seen::gone).into_iter().next() {
            return OneMore::Agreed(Some(gone));
        }
        if now_ms.saturating_sub(c.asked_at_ms) >= wait {
            return OneMore::Agreed(None);
        }
        OneMore::Wait
    }
}

/// What a single reporter's verdict has of the one more it needs.
enum OneMore {
    /// Not yet: witnesses are asked, or still answering.
    Wait,
    /// A second reporter, or this witness, agrees, or no witness answered.
    Agreed(Option<NodeId>),
    /// These witnesses see the node alive.
    Refused(Vec<NodeId>),
}
