//! Writes: a wake-up's proposals, group commits on the leader (at most two
//! batches in flight, 1,024 commands each), a follower's writes and down
//! reports handed to the leader (those of one wake-up in one request),
//! what each outcome answers, and a forwarded write's answer held until
//! this replica applied its revision, so the agent reads its own write
//! here.

use super::*;
use crate::ids::AgentEpoch;
use crate::peer_protocol::MAX_FORWARDED;

/// Batches sent to openraft and not yet answered, at most.
const MAX_IN_FLIGHT: usize = 2;
/// Commands in one batch, at most.
const MAX_BATCH: usize = 1_024;
/// How soon a request is handed again to a leader whose address did not
/// answer a handshake, ms.
const UNREACHABLE_RETRY_MS: u64 = 50;

/// What to do once a proposal is decided.
#[derive(Debug)]
pub(super) enum Then {
    Reply(Reply),
    Welcome(AgentId),
    Nothing,
}

/// How a proposal ended.
enum Decided {
    /// Committed and applied here (this replica leads).
    Local(Result<Applied, Rejection>),
    /// The leader's answer to a forwarded proposal, or why none came.
    Remote(Response),
}

/// What a follower hands the leader.
pub(super) enum Handed {
    /// Writes (one `Propose`, or a `ProposeBatch`).
    Writes(Vec<(Envelope, Then)>),
    /// A gossip down report.
    Down {
        reporter: NodeId,
        actor: Principal,
        node: NodeId,
        epoch: AgentEpoch,
        reply: Reply,
    },
}

impl Handed {
    fn request(&self) -> PeerRequest {
        match self {
            Handed::Writes(items) => match &items[..] {
                [(envelope, _)] => PeerRequest::Propose(envelope.clone()),
                _ => PeerRequest::ProposeBatch(items.iter().map(|(e, _)| e.clone()).collect()),
            },
            Handed::Down {
                reporter,
                actor,
                node,
                epoch,
                ..
            } => PeerRequest::ReportDown {
                reporter: reporter.clone(),
                actor: actor.clone(),
                node: node.clone(),
                epoch: *epoch,
            },
        }
    }
}

/// A request handed to `leader`, waiting for its answer.
struct Forward {
    leader: ReplicaId,
    handed: Handed,
    deadline_ms: u64,
}

/// A request waiting for a leader to hand it to.
struct Parked {
    handed: Handed,
    deadline_ms: u64,
    /// Handed again then (the leader's address did not answer).
    retry_at_ms: Option<u64>,
    last_error: Option<String>,
}

/// A forwarded write's answer, held until this replica applied it.
struct Held {
    revision: Revision,
    deadline_ms: u64,
    envelope: Envelope,
    then: Then,
    response: Response,
}

/// A peer's `ProposeBatch`: its answers, in order, as they come.
struct Gather {
    reply: ReplyId,
    answers: Vec<Option<Response>>,
    left: usize,
}

/// How openraft answered a batch, as the driver saw it.
#[derive(Debug)]
pub enum BatchOutcome {
    /// Committed and applied here: each command's result, in order.
    Applied(Vec<Result<Applied, Rejection>>),
    /// openraft says this replica does not lead (any more).
    NotLeader(String),
    /// openraft refused it otherwise.
    Failed(String),
    /// Not committed within `raft.write_timeout_ms`.
    TimedOut,
}

/// The write path's state.
#[derive(Default)]
pub(super) struct Writes {
    /// Proposals of the current wake-up.
    pub(super) wake_up: Vec<(Envelope, Then)>,
    /// Leader: proposals waiting for the next batch.
    queue: Vec<(Envelope, Then)>,
    /// Leader: batches sent to openraft and not yet answered.
    batches: HashMap<BatchId, Vec<(Envelope, Then)>>,
    /// Follower: requests handed to the leader.
    forwards: HashMap<ForwardId, Forward>,
    /// Follower: requests waiting for a leader.
    parked: Vec<Parked>,
    /// Follower: answers held until their revision is applied here.
    held: Vec<Held>,
    /// Leader: peers' batches being answered.
    gathers: HashMap<u64, Gather>,
}

impl Writes {
    pub(super) fn in_flight(&self) -> usize {
        self.batches.len()
    }

    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn take_queue(&mut self) -> Vec<(Envelope, Then)> {
        std::mem::take(&mut self.queue)
    }

    /// When a parked request must next be looked at, ms.
    pub(super) fn next_due(&self) -> Option<u64> {
        self.parked
            .iter()
            .map(|p| p.retry_at_ms.unwrap_or(u64::MAX).min(p.deadline_ms))
            .min()
    }
}

impl ReplicaState {
    /// Proposes: on the leader the proposals join the queue of the next
    /// batch, which is one Raft entry (group commit: one fsynced append and
    /// one replication round for all of them); a follower hands them to
    /// the leader, at most `MAX_FORWARDED` in one request; with no leader
    /// known they wait for one until `write_timeout_ms` has passed.
    pub(super) fn propose(
        &mut self,
        proposals: Vec<(Envelope, Then)>,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        if self.stopping_since.is_some() {
            let refused = crate::answers::unavailable(
                "this arbiter replica is shutting down; the write is not committed; retry (another replica of the group answers)".into(),
            );
            for (envelope, then) in proposals {
                self.leader.settled(&envelope.command);
                self.finish(then, &envelope, Decided::Remote(refused.clone()), cat, out);
            }
            return;
        }
        if self.leads() {
            self.writes.queue.extend(proposals);
            self.send_batches(out);
            return;
        }
        let deadline = now + self.config.raft.write_timeout_ms + 1_000;
        let mut proposals = proposals;
        while !proposals.is_empty() {
            let take = proposals.len().min(MAX_FORWARDED);
            let items: Vec<(Envelope, Then)> = proposals.drain(..take).collect();
            self.hand_over(Handed::Writes(items), deadline, now, cat, out);
        }
    }

    /// Sends queued proposals as batches while fewer than two are in
    /// flight.
    fn send_batches(&mut self, out: &mut Vec<Output>) {
        while self.writes.batches.len() < MAX_IN_FLIGHT && !self.writes.queue.is_empty() {
            let take = self.writes.queue.len().min(MAX_BATCH);
            let items: Vec<(Envelope, Then)> = self.writes.queue.drain(..take).collect();
            let batch = self.next_id();
            out.push(Output::Propose {
                batch,
                envelopes: items.iter().map(|(e, _)| e.clone()).collect(),
            });
            self.writes.batches.insert(batch, items);
        }
    }

    /// A batch's outcome: each proposal answered, the next batch sent.
    pub(super) fn committed(
        &mut self,
        batch: BatchId,
        outcome: BatchOutcome,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let Some(items) = self.writes.batches.remove(&batch) else {
            return;
        };
        let n = items.len();
        let failed = match outcome {
            BatchOutcome::Applied(results) if results.len() == n => {
                for ((envelope, then), result) in items.into_iter().zip(results) {
                    match &result {
                        Ok(applied) => {
                            self.counters.commits += 1;
                            self.after_commit(&envelope, applied, cat);
                        }
                        Err(rejection) => self
                            .counters
                            .refused(crate::answers::kind_of(rejection).as_str()),
                    }
                    self.finish(then, &envelope, Decided::Local(result), cat, out);
                }
                None
            }
            BatchOutcome::Applied(results) => Some((
                items,
                format!(
                    "the batch applied {} results for {n} commands",
                    results.len()
                ),
            )),
            BatchOutcome::NotLeader(e) => Some((
                items,
                format!("leadership moved while committing: {e}; retry"),
            )),
            BatchOutcome::Failed(e) => Some((items, format!("not committed: {e}"))),
            BatchOutcome::TimedOut => Some((
                items,
                format!(
                    "not committed within {} ms: this region's arbiter group has no quorum \
                     (fewer than a majority of replicas reachable); writes resume when it has one",
                    self.config.raft.write_timeout_ms
                ),
            )),
        };
        if let Some((items, why)) = failed {
            let response = crate::answers::unavailable(why);
            for (envelope, then) in items {
                self.leader.settled(&envelope.command);
                self.finish(then, &envelope, Decided::Remote(response.clone()), cat, out);
            }
        }
        self.send_batches(out);
    }

    fn after_commit(&mut self, env: &Envelope, applied: &Applied, cat: &Catalog) {
        match (&env.command, &applied.effect) {
            (Command::Register(_), crate::catalog::Effect::Registered { .. }) => {
                self.counters.registrations += 1;
            }
            (Command::GrantLease { node, epoch, .. }, crate::catalog::Effect::Unchanged) => {
                // The agent's run asked again for the lease it holds: a
                // renewal, which the catalog does not record.
                let _ = self
                    .leader
                    .renew(cat.leases(), node, *epoch, env.at_ms, &env.actor);
            }
            (Command::ExpireLease { node, .. }, crate::catalog::Effect::ExpiryHeld) => {
                tracing::warn!(node = %node, "mass-expiry guard holds this lease expiry: too many of its zone's sessions are silent at once");
            }
            _ => {}
        }
        self.leader.settled(&env.command);
    }

    fn finish(
        &mut self,
        then: Then,
        env: &Envelope,
        decided: Decided,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        match then {
            Then::Nothing => match decided {
                Decided::Local(Err(e)) => {
                    tracing::debug!(command = env.command.kind(), error = %e, "internal proposal refused")
                }
                Decided::Remote(Response::Rejected { message, .. }) => {
                    tracing::debug!(command = env.command.kind(), error = %message, "internal proposal refused")
                }
                _ => {}
            },
            Then::Reply(reply) => {
                let response = match decided {
                    Decided::Local(result) => crate::answers::response(cat, env, result),
                    Decided::Remote(response) => response,
                };
                self.answer(reply, response, out);
            }
            Then::Welcome(agent) => {
                let refusal = match decided {
                    Decided::Local(Ok(_)) | Decided::Remote(Response::Committed { .. }) => None,
                    Decided::Local(Err(e)) => Some(e.to_string()),
                    Decided::Remote(Response::Rejected { message, .. }) => Some(message),
                    Decided::Remote(other) => Some(format!("unexpected answer {other:?}")),
                };
                if let Some(reason) = refusal {
                    self.refuse(agent, reason, out);
                    return;
                }
                let Command::GrantLease { node, ttl_ms, .. } = &env.command else {
                    return;
                };
                let lease = cat.leases().get(node).map(|l| l.id).unwrap_or_default();
                let welcome = SessionDown::Welcome {
                    region: self.sessions.rules().region.clone(),
                    shard: cat.params().shard,
                    catalog: cat.identity(),
                    revision: cat.revision(),
                    lease,
                    ttl_ms: *ttl_ms,
                };
                tracing::info!(node = %node, lease = %lease, "agent session started");
                self.send(agent, welcome, out);
                self.sessions.welcomed(agent);
            }
        }
    }

    /// Hands a request to the leader, or keeps it until one is known
    /// (until `deadline_ms`); back here if this replica leads.
    pub(super) fn hand_over(
        &mut self,
        handed: Handed,
        deadline_ms: u64,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let parked = Parked {
            handed,
            deadline_ms,
            retry_at_ms: None,
            last_error: None,
        };
        self.try_forward(parked, now, cat, out);
    }

    fn try_forward(&mut self, parked: Parked, now: u64, cat: &Catalog, out: &mut Vec<Output>) {
        match self.standing.clone() {
            Standing::Leader => match parked.handed {
                // This replica became the leader first: handled here.
                Handed::Writes(items) => self.propose(items, now, cat, out),
                Handed::Down {
                    reporter,
                    actor,
                    node,
                    epoch,
                    reply,
                } => self.report_down(reporter, actor, node, epoch, reply, now, cat, out),
            },
            Standing::Follower {
                leader: Some((leader, addr)),
            } => {
                let forward = self.next_id();
                out.push(Output::Forward {
                    forward,
                    to: addr,
                    request: parked.handed.request(),
                    wait_ms: parked.deadline_ms.saturating_sub(now).max(1),
                });
                self.writes.forwards.insert(
                    forward,
                    Forward {
                        leader,
                        handed: parked.handed,
                        deadline_ms: parked.deadline_ms,
                    },
                );
            }
            Standing::Follower { leader: None } => self.writes.parked.push(Parked {
                retry_at_ms: None,
                ..parked
            }),
        }
    }

    /// The leader answered a request handed to it (or did not).
    pub(super) fn forwarded(
        &mut self,
        forward: ForwardId,
        outcome: Forwarded,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        // A request whose leader moved was answered then.
        let Some(f) = self.writes.forwards.remove(&forward) else {
            return;
        };
        match outcome {
            Forwarded::Unreachable(e) if now < f.deadline_ms => {
                self.writes.parked.push(Parked {
                    handed: f.handed,
                    deadline_ms: f.deadline_ms,
                    retry_at_ms: Some(now + UNREACHABLE_RETRY_MS),
                    last_error: Some(e),
                });
            }
            Forwarded::Unreachable(e) => {
                let answer =
                    crate::answers::unavailable(format!("the leader did not answer: {e}; retry"));
                self.answer_handed(f.handed, Forwarded::Answer(answer), now, cat, out);
            }
            answered => self.answer_handed(f.handed, answered, now, cat, out),
        }
    }

    fn answer_handed(
        &mut self,
        handed: Handed,
        answered: Forwarded,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        match handed {
            Handed::Writes(items) => {
                let n = items.len();
                let responses = match answered {
                    Forwarded::Answers(responses) if responses.len() == n => responses,
                    Forwarded::Answers(responses) => vec![
                        crate::answers::unavailable(format!(
                            "the leader answered {} of {n} writes handed over; retry",
                            responses.len()
                        ));
                        n
                    ],
                    // One answer for all: why none committed (no leader,
                    // not the leader, no answer), or a lone write's.
                    Forwarded::Answer(response) => vec![response; n],
                    Forwarded::Unreachable(e) => vec![
                        crate::answers::unavailable(format!(
                            "the leader did not answer: {e}; retry"
                        ));
                        n
                    ],
                };
                for ((envelope, then), response) in items.into_iter().zip(responses) {
                    self.forwarded_write(envelope, then, response, now, cat, out);
                }
            }
            Handed::Down { reply, .. } => {
                let response = match answered {
                    Forwarded::Answer(response) => response,
                    _ => crate::answers::unavailable("retry".into()),
                };
                self.answer(reply, response, out);
            }
        }
    }

    /// The leader's answer to one forwarded write: held until this replica
    /// applied its revision, so the agent reads its own write here.
    fn forwarded_write(
        &mut self,
        envelope: Envelope,
        then: Then,
        response: Response,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        self.leader.settled(&envelope.command);
        if let Response::Committed {
            revision: Some(revision),
            ..
        } = &response
        {
            if *revision > self.mark.revision {
                self.writes.held.push(Held {
                    revision: *revision,
                    deadline_ms: now + self.config.raft.write_timeout_ms,
                    envelope,
                    then,
                    response,
                });
                return;
            }
        }
        self.finish(then, &envelope, Decided::Remote(response), cat, out);
    }

    /// The standing changed: a request handed to a leader that no longer
    /// leads is answered "retry" (the old leader may be gone), and the
    /// requests waiting for a leader go to the new one (or are handled
    /// here).
    pub(super) fn leader_moved(&mut self, now: u64, cat: &Catalog, out: &mut Vec<Output>) {
        let current = match &self.standing {
            Standing::Follower {
                leader: Some((id, _)),
            } => Some(*id),
            _ => None,
        };
        let mut moved: Vec<ForwardId> = self
            .writes
            .forwards
            .iter()
            .filter(|(_, f)| Some(f.leader) != current)
            .map(|(id, _)| *id)
            .collect();
        moved.sort_unstable();
        for id in moved {
            let f = self.writes.forwards.remove(&id).expect("listed above");
            let answer = crate::answers::unavailable(format!(
                "leadership moved away from replica {} while it held this write; retry",
                f.leader
            ));
            self.answer_handed(f.handed, Forwarded::Answer(answer), now, cat, out);
        }
        for parked in std::mem::take(&mut self.writes.parked) {
            self.try_forward(parked, now, cat, out);
        }
    }

    /// Parked requests past their wait are answered; those due for
    /// another try are handed again.
    pub(super) fn forwards_due(&mut self, now: u64, cat: &Catalog, out: &mut Vec<Output>) {
        if self.writes.next_due().is_none_or(|at| at > now) {
            return;
        }
        for parked in std::mem::take(&mut self.writes.parked) {
            if now >= parked.deadline_ms {
                let answer = match &parked.last_error {
                    Some(e) => crate::answers::unavailable(format!(
                        "the leader did not answer: {e}; retry"
                    )),
                    None => office::no_leader(),
                };
                self.answer_handed(parked.handed, Forwarded::Answer(answer), now, cat, out);
            } else if parked.retry_at_ms.is_some_and(|at| at <= now) {
                self.try_forward(parked, now, cat, out);
            } else {
                self.writes.parked.push(parked);
            }
        }
    }

    /// This replica applied more of the log (or installed a snapshot):
    /// distributes what changed and answers what waited for it.
    pub(super) fn applied(
        &mut self,
        mark: AppliedMark,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let previous = std::mem::replace(&mut self.mark, mark);
        let installed = mark.installs != previous.installs;
        let changed = if installed {
            None
        } else {
            cat.delta_log().services_after(previous.revision)
        };
        let changed = changed.unwrap_or_else(|| cat.services());
        let mut dist = Vec::new();
        self.dist.committed(&changed, now, cat, &mut dist);
        self.carry(dist, out);
        if installed && self.leads() {
            // Leases the snapshot brought had no deadline here.
            self.leader.extend_all(now, cat.leases());
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.writes.held)
            .into_iter()
            .partition(|h| h.revision <= mark.revision);
        self.writes.held = waiting;
        for h in ready {
            self.finish(h.then, &h.envelope, Decided::Remote(h.response), cat, out);
        }
        self.expire_waiters(now, out);
    }

    /// Answers held writes whose revision has not arrived in time (this
    /// replica lags): the write is committed, the answer says so.
    pub(super) fn expire_held_answers(&mut self, now: u64, cat: &Catalog, out: &mut Vec<Output>) {
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.writes.held)
            .into_iter()
            .partition(|h| now >= h.deadline_ms);
        self.writes.held = waiting;
        for h in late {
            tracing::warn!(revision = %h.revision, applied = %self.mark.revision, "this replica lags the leader; answering a committed write before applying it");
            self.finish(h.then, &h.envelope, Decided::Remote(h.response), cat, out);
        }
    }

    /// A peer's `ProposeBatch`: each write joins the group commits as a
    /// lone one would; the answers go back together, in order.
    /// A peer's batch: each write checked by the leader (`check_forwarded`)
    /// is proposed, each refused one answered at once, and the peer is
    /// answered once every write is.
    pub(super) fn gather(
        &mut self,
        envelopes: Vec<Result<Envelope, Response>>,
        reply: ReplyId,
        out: &mut Vec<Output>,
    ) {
        if envelopes.is_empty() {
            out.push(Output::AnswerPeer {
                reply,
                response: PeerResponse::Answers(Vec::new()),
            });
            return;
        }
        let gather = self.next_id();
        self.writes.gathers.insert(
            gather,
            Gather {
                reply,
                answers: vec![None; envelopes.len()],
                left: envelopes.len(),
            },
        );
        for (index, envelope) in envelopes.into_iter().enumerate() {
            match envelope {
                Ok(envelope) => self
                    .writes
                    .wake_up
                    .push((envelope, Then::Reply(Reply::Gather(gather, index)))),
                Err(refused) => self.gathered(gather, index, refused, out),
            }
        }
    }

    pub(super) fn gathered(
        &mut self,
        gather: u64,
        index: usize,
        response: Response,
        out: &mut Vec<Output>,
    ) {
        let Some(g) = self.writes.gathers.get_mut(&gather) else {
            return;
        };
        if let Some(slot) = g.answers.get_mut(index) {
            if slot.replace(response).is_none() {
                g.left -= 1;
            }
        }
        if g.left == 0 {
            let g = self.writes.gathers.remove(&gather).expect("found above");
            out.push(Output::AnswerPeer {
                reply: g.reply,
                response: PeerResponse::Answers(g.answers.into_iter().flatten().collect()),
            });
        }
    }
}
