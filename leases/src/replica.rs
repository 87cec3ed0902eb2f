//! One arbiter replica's decisions, as one deterministic state machine
//! (quinn-proto style): everything a replica of a Raft group decides, and
//! nothing it does.
//!
//! One door: [`ReplicaState::handle`] takes an [`Input`] (a session
//! message, an agent's or an operator's request, a peer replica's request,
//! a batch's outcome, a forwarded write's answer, an applied revision,
//! openraft's view of the group, the end of a wake-up) with the time, an
//! rng and the applied catalog, read-only, and pushes [`Output`]s: what to send or
//! close on a session, what to answer (by the id the driver gave the
//! question), which batch to propose to openraft, what to hand the leader,
//! which other replicas to ask. [`ReplicaState::poll_timeout`] says when it
//! must next be woken. The arbiter's core task (`server::core`) carries the
//! outputs out; tests step it by hand.
//!
//! What it decides:
//! - its standing (`Standing`): leader, follower of a known leader or of
//!   none, and whether a leader's quorum answers (`office`): taking office
//!   (every lease one TTL from now, every session heard now, the catalog's
//!   identity proposed), stepping down, quorum lost and back;
//! - the leader's memory, lease deadlines inside it (`leader::LeaderMemory`):
//!   renewals, down reports held for the second signal, expiries, purges;
//! - witnesses of silent leases (`witnesses`): which sessions are asked, and
//!   on a follower the sessions heard and answers to hand to the leader;
//! - writes (`writes`): group commits (at most two batches in flight, 1,024
//!   commands each), a follower's writes of one wake-up handed to the
//!   leader in one request, answers held until the revision is applied
//!   here (read-your-writes), writes refused while stopping;
//! - sessions and distribution (`agents`): the session machine
//!   (`sessions::Sessions`), the distributor, regions messages, and
//!   `AwaitPropagation` waits, answered at the last ack or the deadline;
//! - what peers hand it (`peers`).
//!
//! It never reads a clock, a socket, a file, a lock or an rng of its own, keeps no
//! statics, and holds one Raft group's state: a replica that runs several
//! groups runs one machine per group. Its outputs come in an order that
//! depends only on its inputs (what it walks of its hash maps is sorted
//! first), so a seeded replay gives the same outputs.

use std::collections::BTreeMap;

use foldhash::HashMap;
use rand::Rng;
use rollcall_config::ArbiterConfig;

use crate::catalog::{Applied, Catalog, Rejection};
use crate::command::{Command, Envelope};
use crate::distribution::{DistParams, Distributor};
use crate::endpoint::{Principal, Role};
use crate::identity::Identity;
use crate::ids::{AgentId, Revision};
use crate::leader::{LeaderMemory, LeaderParams};
use crate::name::{NodeId, PrincipalName, ServiceKey};
use crate::peer_protocol::{Heard, PeerRequest, PeerResponse};
use crate::protocol::{Request, Response, SessionDown, SessionUp};
use crate::raft::{AppliedMark, ReplicaId};
use crate::refusals::RefusalAudit;
use crate::regions::RegionsFeed;
use crate::remote::{RegionView, RemoteViews};
use crate::sessions::{Rules, Sessions};
use crate::witness::WitnessAsk;

mod agents;
mod counters;
mod messages;
mod office;
mod peers;
mod waiters;
mod witnesses;
mod writes;

#[cfg(test)]
mod tests;

pub use counters::Counters;
pub use messages::{propagation_sums, Forwarded, Input, Output, RaftView};
pub use office::Standing;
pub use writes::BatchOutcome;

use waiters::{Await, WaitFor, Waiter, Waiters};
use witnesses::Witnesses;
use writes::Writes;

/// A question the driver holds the answer channel of, numbered by it.
pub type ReplyId = u64;
/// A batch proposed to openraft, numbered here.
pub type BatchId = u64;
/// A request handed to the leader, numbered here.
pub type ForwardId = u64;
/// An `AwaitPropagation` asked of the other replicas, numbered here.
pub type AwaitId = u64;

/// How often every session's regions message is looked at, ms.
const REGIONS_INTERVAL_MS: u64 = 1_000;

/// One arbiter replica of one Raft group.
pub struct ReplicaState {
    config: ArbiterConfig,
    me: ReplicaId,
    /// Every connection's session, and who may hold, watch and write
    /// what (R10).
    sessions: Sessions,
    dist: Distributor,
    /// Session silence, lease deadlines, held down reports, expiries (R3,
    /// R4).
    leader: LeaderMemory<Reply>,
    standing: Standing,
    /// The latest view of the group.
    raft: RaftView,
    /// Since when (ms) this leader has had no quorum acknowledgement for
    /// longer than `lease.silence_ms`; `None` while it has one.
    quorum_lost_at: Option<u64>,
    /// What this replica has applied.
    mark: AppliedMark,
    writes: Writes,
    witnesses: Witnesses,
    /// Propagation waits on this replica's agents, and the agents'
    /// `AwaitPropagation` requests waiting for them and the other
    /// replicas' sums.
    waiters: Waiters,
    /// The remote views the region bridge reports (memory only).
    remote: RemoteViews,
    /// What each session was last told of regions and policies.
    regions: RegionsFeed,
    /// The distributor's wake-ups, by time.
    wakes: BTreeMap<u64, Vec<AgentId>>,
    next_sweep_ms: u64,
    next_regions_ms: u64,
    /// The catalog's policy revision the last regions messages were built
    /// at: a newer one (a policy or writer epoch changed) sends them at
    /// once rather than at the next interval.
    regions_policy_revision: Revision,
    /// When this leader may next propose the catalog's identity (ms).
    identify_after_ms: u64,
    /// Since when (ms) the process is stopping.
    stopping_since: Option<u64>,
    next_id: u64,
    counters: Counters,
    /// Refusals for the audit log, repeats folded.
    refusals: RefusalAudit,
}

/// Who waits for an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    /// An agent's request or an operator's write.
    Agent(ReplyId),
    /// A peer's request with one answer.
    Peer(ReplyId),
    /// One write of a peer's `ProposeBatch`: its place in the answers.
    Gather(u64, usize),
}

impl ReplicaState {
    /// A follower's machine at `now_ms` over `catalog` as applied at
    /// `mark`, replica `me` of its group.
    pub fn new(
        config: ArbiterConfig,
        me: ReplicaId,
        catalog: &Catalog,
        mark: AppliedMark,
        now_ms: u64,
    ) -> Self {
        let region = catalog.params().region.clone();
        let shard = catalog.params().shard;
        let principal = Principal {
            role: Role::Arbiter,
            name: PrincipalName::new(&config.name)
                .unwrap_or_else(|_| PrincipalName::new("arbiter").expect("a valid constant")),
        };
        ReplicaState {
            leader: LeaderMemory::new(LeaderParams::from(&config), principal, now_ms),
            remote: RemoteViews::new(region.clone()),
            sessions: Sessions::new(Rules::new(&config, region), shard, config.lease.ttl_ms),
            dist: Distributor::new(
                DistParams::from(&config),
                crate::codec::shared_service_snapshot,
            ),
            next_sweep_ms: now_ms + config.lease.sweep_interval_ms,
            config,
            me,
            standing: Standing::Follower { leader: None },
            raft: RaftView::default(),
            quorum_lost_at: None,
            mark,
            writes: Writes::default(),
            witnesses: Witnesses::default(),
            waiters: Waiters::default(),
            regions: RegionsFeed::new(),
            wakes: BTreeMap::new(),
            next_regions_ms: now_ms,
            regions_policy_revision: Revision(0),
            identify_after_ms: 0,
            stopping_since: None,
            next_id: 1,
            counters: Counters::default(),
            refusals: RefusalAudit::default(),
        }
    }

    /// Takes one input at `now_ms`, with the catalog as applied; `rng`
    /// draws what must differ between groups (a new catalog's identity).
    pub fn handle<R: Rng + ?Sized>(
        &mut self,
        input: Input,
        now_ms: u64,
        rng: &mut R,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        match input {
            Input::Connected {
                agent,
                identity,
                certified,
            } => {
                self.dist.connect(agent);
                self.sessions.connect(agent, identity, certified);
            }
            Input::Session { agent, msg } => self.session(agent, msg, now_ms, cat, out),
            Input::Sent { agent } => {
                let mut dist = Vec::new();
                self.dist.sent(agent, now_ms, cat, &mut dist);
                self.carry(dist, out);
            }
            Input::Closed { agent } => {
                self.dist.disconnect(agent);
                self.regions.forget(agent);
                if let Some((node, _)) = self.sessions.disconnect(agent) {
                    tracing::info!(node = %node, agent, "agent session closed");
                    // A connection known closed is silence at once, where
                    // no other replica may hold the node's session.
                    let elsewhere = !self.raft.others.is_empty()
                        || self
                            .sessions
                            .agents()
                            .any(|a| self.sessions.held(a).is_some_and(|(n, _)| *n == node));
                    if self.leads() && !elsewhere {
                        let verdicts = self.leader.session_closed(&node, now_ms);
                        self.verdicts(verdicts, now_ms, cat, out);
                    }
                }
            }
            Input::Request {
                agent,
                request,
                reply,
            } => self.request(agent, request, reply, now_ms, cat, out),
            Input::Write {
                actor,
                command,
                reply,
            } => {
                let envelope = Envelope {
                    at_ms: now_ms,
                    actor,
                    command,
                };
                self.writes
                    .wake_up
                    .push((envelope, writes::Then::Reply(Reply::Agent(reply))));
            }
            Input::Peer { request, reply } => self.peer(request, reply, now_ms, cat, out),
            Input::Committed { batch, outcome } => self.committed(batch, outcome, cat, out),
            Input::Forwarded { forward, outcome } => {
                self.forwarded(forward, outcome, now_ms, cat, out)
            }
            Input::HeardAnswered {
                refused,
                asks,
                probes,
            } => {
                self.refused_renewals(refused, out);
                if !self.leads() {
                    self.carry_asks(asks, now_ms, cat, out);
                    self.carry_probes(probes, now_ms, out);
                }
            }
            Input::Propagated { wait, acked, total } => {
                if let Some(a) = self.waiters.awaits.get_mut(&wait) {
                    a.others = Some((acked, total));
                }
                self.finish_await(wait, out);
            }
            Input::Applied(mark) => self.applied(mark, now_ms, cat, out),
            Input::Raft(view) => self.raft(view, now_ms, rng, cat, out),
            Input::Tick => self.tick(now_ms, rng, cat, out),
            Input::Stop => {
                if self.stopping_since.is_none() {
                    tracing::info!(
                        batches = self.writes.in_flight(),
                        queued = self.writes.queued(),
                        "arbiter shutting down: answering the batches in flight, refusing new writes"
                    );
                    self.stopping_since = Some(now_ms);
                }
            }
        }
    }

    /// When the machine must next be given a `Tick`, ms.
    pub fn poll_timeout(&self) -> u64 {
        let mut at = self.next_sweep_ms;
        if let Some(wake) = self.wakes.keys().next() {
            at = at.min(*wake);
        }
        if let Some(due) = self.writes.next_due() {
            at = at.min(due);
        }
        if let Some(deadline) = self.down_deadline() {
            at = at.min(deadline);
        }
        at
    }

    /// When a held down report's probe deadline falls, on a leader that
    /// may decide it (one with a quorum).
    fn down_deadline(&self) -> Option<u64> {
        if !self.leads() || self.quorum_lost_at.is_some() {
            return None;
        }
        self.leader.next_down_deadline()
    }

    /// The writes this wake-up has queued so far (the driver stops taking
    /// more mailbox messages into one wake-up past a bound).
    pub fn queued_this_wake_up(&self) -> usize {
        self.writes.wake_up.len()
    }

    /// Whether this replica leads.
    pub fn leads(&self) -> bool {
        matches!(self.standing, Standing::Leader)
    }

    /// This replica's standing in its group.
    pub fn standing(&self) -> &Standing {
        &self.standing
    }

    /// Since when (ms) this leader has had no quorum, if it has none.
    pub fn quorum_lost_at(&self) -> Option<u64> {
        self.quorum_lost_at
    }

    /// The counts the driver publishes.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The sessions (read).
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The distributor (read).
    pub fn distributor(&self) -> &Distributor {
        &self.dist
    }

    /// When `node`'s session was last heard on this replica (or reported
    /// heard by a follower, on the leader), ms.
    pub fn last_heard(&self, node: &NodeId) -> Option<u64> {
        self.leader.last_heard(node)
    }

    /// When `node`'s lease is due, as this replica's leader memory counts
    /// it (meaningful on the leader).
    pub fn deadline(&self, cat: &Catalog, node: &NodeId) -> Option<u64> {
        self.leader.deadline(cat.leases(), node)
    }

    /// How many silent leases witnesses hold alive now.
    pub fn held_alive(&self) -> usize {
        self.leader.held_alive()
    }

    /// The remote region views held (read).
    pub fn remote(&self) -> &RemoteViews {
        &self.remote
    }

    /// `PUT /v1/remote/{region}`: the region bridge's whole view of one
    /// region, or why it does not check.
    pub fn put_remote(
        &mut self,
        view: RegionView,
        heard_ms_ago: u64,
        max_age_ms: u64,
        now_ms: u64,
    ) -> Result<(), String> {
        self.remote
            .put(view, heard_ms_ago, max_age_ms, now_ms)
            .map_err(|e| e.to_string())
    }

    /// `POST /v1/remote/{region}/heard`: whether the view held at
    /// `version` is confirmed current.
    pub fn confirm_remote(
        &mut self,
        region: &crate::name::Label,
        version: Revision,
        as_of_ms: u64,
        heard_ms_ago: u64,
        now_ms: u64,
    ) -> bool {
        self.remote
            .confirm(region, version, as_of_ms, heard_ms_ago, now_ms)
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The end of a wake-up.
    fn tick<R: Rng + ?Sized>(
        &mut self,
        now: u64,
        rng: &mut R,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        if now >= self.next_sweep_ms {
            self.next_sweep_ms = now + self.config.lease.sweep_interval_ms;
            self.sweep(now, rng, cat, out);
            let mut dist = Vec::new();
            self.dist.sweep(now, cat, &mut dist);
            self.carry(dist, out);
            self.report_heard(now, out);
            self.expire_held_answers(now, cat, out);
            self.recheck_waiters(now, out);
            let mut lines = Vec::new();
            self.refusals.flush(now, &mut lines);
            lines.iter().for_each(crate::refusals::AuditLine::log);
        }
        if now >= self.next_regions_ms || cat.policy_revision() > self.regions_policy_revision {
            self.next_regions_ms = now + REGIONS_INTERVAL_MS;
            self.regions_policy_revision = cat.policy_revision();
            let mut agents: Vec<AgentId> = self.sessions.agents().collect();
            agents.sort_unstable();
            self.push_regions(&agents, now, cat, out);
        }
        if self.witnesses.report_now {
            self.report_heard(now, out);
        }
        // A probe unanswered by its deadline is decided then, not at the
        // next sweep (up to `lease.sweep_interval_ms` later).
        if self.down_deadline().is_some_and(|deadline| now >= deadline) {
            let verdicts = self.leader.decide_downs(now);
            self.verdicts(verdicts, now, cat, out);
        }
        self.fire_wakes(now, cat, out);
        self.expire_waiters(now, out);
        self.counters.snapshots_limited = self.dist.stats().snapshots_limited;
        self.forwards_due(now, cat, out);
        let proposals = std::mem::take(&mut self.writes.wake_up);
        if !proposals.is_empty() {
            self.propose(proposals, now, cat, out);
        }
        if let Some(since) = self.stopping_since {
            let drained = self.writes.in_flight() == 0 && self.writes.queued() == 0;
            if drained || now >= since + self.config.raft.write_timeout_ms {
                if !drained {
                    tracing::warn!(
                        batches = self.writes.in_flight(),
                        "arbiter shutting down with batches unanswered after raft.write_timeout_ms"
                    );
                }
                out.push(Output::Stopped);
            }
        }
    }

    /// Answers `to` with `response`.
    fn answer(&mut self, to: Reply, response: Response, out: &mut Vec<Output>) {
        match to {
            Reply::Agent(reply) => out.push(Output::Answer { reply, response }),
            Reply::Peer(reply) => out.push(Output::AnswerPeer {
                reply,
                response: PeerResponse::Answer(response),
            }),
            Reply::Gather(gather, index) => self.gathered(gather, index, response, out),
        }
    }
}
