//! The commit path: proposals queued and sent to Raft in batches (at most
//! two in flight), their outcomes answered, forwarded answers held until
//! this replica applied them, and what an applied revision distributes.

use super::*;

impl Core {
    /// Proposes: on the leader the proposals join the queue of the next
    /// batch, which is one Raft entry (group commit: one fsynced append and
    /// one replication round for all of them) with at most two batches in
    /// flight and at most 1,024 commands each; a follower hands them to
    /// the leader, those of one wake-up in one request (`ProposeBatch`, a
    /// lone one as `Propose`); with no leader known each is refused as
    /// unavailable once `write_timeout_ms` has passed. The answers come
    /// back as `Done`.
    pub(super) fn propose(&mut self, proposals: Vec<(Envelope, Then)>) {
        if self.stopping_since.is_some() {
            let refused = crate::answers::unavailable(
                "this arbiter replica is shutting down; the write is not committed; retry (another replica of the group answers)".into(),
            );
            for (envelope, then) in proposals {
                self.leader.settled(&envelope.command);
                self.finish(then, &envelope, Decided::Remote(refused.clone()));
            }
            return;
        }
        if self.is_leader() {
            self.queue.extend(proposals);
            self.send_batches();
            return;
        }
        let wait =
            Duration::from_millis(self.config.raft.write_timeout_ms) + Duration::from_secs(1);
        let mut proposals = proposals;
        while !proposals.is_empty() {
            let take = proposals.len().min(crate::peer_protocol::MAX_FORWARDED);
            let items: Vec<(Envelope, Then)> = proposals.drain(..take).collect();
            let done = self.done_tx.clone();
            let request = match &items[..] {
                [(envelope, _)] => PeerRequest::Propose(envelope.clone()),
                _ => PeerRequest::ProposeBatch(items.iter().map(|(e, _)| e.clone()).collect()),
            };
            self.forward(request, wait, move |forwarded| {
                let n = items.len();
                let responses = match forwarded {
                    Forwarded::NowLeader(_) => {
                        for (envelope, then) in items {
                            let _ = done.send(Done::ProposeAgain { envelope, then });
                        }
                        return;
                    }
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
                };
                for ((envelope, then), response) in items.into_iter().zip(responses) {
                    let _ = done.send(Done::Forwarded {
                        envelope,
                        then,
                        response,
                    });
                }
            });
        }
    }

    /// Sends queued proposals as batches while fewer than two are in
    /// flight.
    pub(super) fn send_batches(&mut self) {
        const MAX_IN_FLIGHT: usize = 2;
        const MAX_BATCH: usize = 1_024;
        let timeout = Duration::from_millis(self.config.raft.write_timeout_ms);
        while self.in_flight < MAX_IN_FLIGHT && !self.queue.is_empty() {
            let take = self.queue.len().min(MAX_BATCH);
            let items: Vec<(Envelope, Then)> = self.queue.drain(..take).collect();
            self.in_flight += 1;
            let proposal = Proposal {
                envelopes: items.iter().map(|(e, _)| e.clone()).collect(),
            };
            let raft = self.replica.raft.clone();
            let metrics = self.metrics.clone();
            let done = self.done_tx.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let outcome = match tokio::time::timeout(timeout, raft.client_write(proposal)).await {
                    Ok(Ok(written)) if written.data.results.len() == items.len() => {
                        metrics
                            .commit_latency
                            .observe(started.elapsed().as_secs_f64());
                        metrics.batch_size.observe(items.len() as f64);
                        Ok(written.data.results)
                    }
                    Ok(Ok(written)) => Err(crate::answers::unavailable(format!(
                        "the batch applied {} results for {} commands",
                        written.data.results.len(),
                        items.len()
                    ))),
                    Ok(Err(e)) if peer::is_forward(&e) => Err(crate::answers::unavailable(format!(
                        "leadership moved while committing: {e}; retry"
                    ))),
                    Ok(Err(e)) => Err(crate::answers::unavailable(format!("not committed: {e}"))),
                    Err(_) => Err(crate::answers::unavailable(format!(
                        "not committed within {} ms: this region's arbiter group has no quorum \
                         (fewer than a majority of replicas reachable); writes resume when it has one",
                        timeout.as_millis()
                    ))),
                };
                let _ = done.send(Done::Batch { items, outcome });
            });
        }
    }

    pub(super) fn done(&mut self, done: Done, now: u64) {
        match done {
            Done::Forwarded {
                envelope,
                then,
                response,
            } => {
                self.leader.settled(&envelope.command);
                // Answer once this replica has applied the revision, so the
                // agent reads its own write here.
                if let Response::Committed {
                    revision: Some(revision),
                    ..
                } = &response
                {
                    if *revision > self.mark.revision {
                        self.deferred.push(Deferred {
                            revision: *revision,
                            deadline_ms: now + self.config.raft.write_timeout_ms,
                            envelope,
                            then,
                            response,
                        });
                        return;
                    }
                }
                self.finish(then, &envelope, Decided::Remote(response));
            }
            Done::Batch { items, outcome } => {
                self.in_flight = self.in_flight.saturating_sub(1);
                match outcome {
                    Ok(results) => {
                        for ((envelope, then), result) in items.into_iter().zip(results) {
                            match &result {
                                Ok(applied) => {
                                    self.metrics.commits.inc();
                                    self.after_commit(&envelope, applied);
                                }
                                Err(rejection) => {
                                    self.metrics.rejections.inc();
                                    self.metrics
                                        .refusals
                                        .get_or_create(&crate::server::metrics::KindLabel {
                                            kind: crate::answers::kind_of(rejection).as_str(),
                                        })
                                        .inc();
                                }
                            }
                            self.finish(then, &envelope, Decided::Local(result));
                        }
                    }
                    Err(response) => {
                        for (envelope, then) in items {
                            self.leader.settled(&envelope.command);
                            self.finish(then, &envelope, Decided::Remote(response.clone()));
                        }
                    }
                }
                self.send_batches();
            }
            Done::ProposeAgain { envelope, then } => self.propose(vec![(envelope, then)]),
            Done::ReportAgain {
                reporter,
                actor,
                node,
                epoch,
                reply,
            } => {
                let mut proposals = Vec::new();
                self.report_down(reporter, actor, node, epoch, now, reply, &mut proposals);
                if !proposals.is_empty() {
                    self.propose(proposals);
                }
            }
            Done::Asks(asks) => {
                if !self.is_leader() {
                    self.carry_asks(asks, now);
                }
            }
            Done::Refused(refused) => {
                for (node, reason) in refused {
                    let agents: Vec<AgentId> = self
                        .sessions
                        .agents()
                        .filter(|a| self.sessions.held(*a).is_some_and(|(n, _)| *n == node))
                        .collect();
                    for agent in agents {
                        self.refuse(agent, reason.clone());
                    }
                }
            }
        }
    }

    pub(super) fn after_commit(&mut self, env: &Envelope, applied: &Applied) {
        match (&env.command, &applied.effect) {
            (Command::Register(_), Effect::Registered { .. }) => {
                self.metrics.registrations.inc();
            }
            (Command::GrantLease { node, epoch, .. }, Effect::Unchanged) => {
                // The agent's run asked again for the lease it holds: a
                // renewal, which the catalog does not record.
                let cat = self.replica.applied.lock();
                let _ = self
                    .leader
                    .renew(cat.leases(), node, *epoch, env.at_ms, &env.actor);
            }
            (Command::ExpireLease { node, .. }, Effect::ExpiryHeld) => {
                tracing::warn!(node = %node, "mass-expiry guard holds this lease expiry: too many of its zone's sessions are silent at once");
            }
            _ => {}
        }
        self.leader.settled(&env.command);
    }

    pub(super) fn finish(&mut self, then: Then, env: &Envelope, decided: Decided) {
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
                    Decided::Local(result) => {
                        crate::answers::response(&self.replica.applied.lock(), env, result)
                    }
                    Decided::Remote(response) => response,
                };
                let _ = reply.send(response);
            }
            Then::Welcome(agent) => {
                let refusal = match decided {
                    Decided::Local(Ok(_)) | Decided::Remote(Response::Committed { .. }) => None,
                    Decided::Local(Err(e)) => Some(e.to_string()),
                    Decided::Remote(Response::Rejected { message, .. }) => Some(message),
                    Decided::Remote(other) => Some(format!("unexpected answer {other:?}")),
                };
                if let Some(reason) = refusal {
                    self.refuse(agent, reason);
                    return;
                }
                let Command::GrantLease { node, ttl_ms, .. } = &env.command else {
                    return;
                };
                let cat = self.replica.applied.lock();
                let lease = cat.leases().get(node).map(|l| l.id).unwrap_or_default();
                let welcome = SessionDown::Welcome {
                    region: self.sessions.rules().region.clone(),
                    shard: cat.params().shard,
                    catalog: cat.identity(),
                    revision: cat.revision(),
                    lease,
                    ttl_ms: *ttl_ms,
                };
                drop(cat);
                tracing::info!(node = %node, lease = %lease, "agent session started");
                self.send(agent, welcome);
                self.sessions.welcomed(agent);
            }
        }
    }

    /// The replica applied more of the log (or installed a snapshot):
    /// distributes what changed and answers what waited for it.
    pub(super) fn on_applied(&mut self, mark: AppliedMark, now: u64) {
        let previous = std::mem::replace(&mut self.mark, mark);
        let cat = self.replica.applied.lock();
        let changed = if mark.installs != previous.installs {
            None
        } else {
            cat.delta_log().services_after(previous.revision)
        };
        let changed = changed.unwrap_or_else(|| cat.services());
        let mut out = Vec::new();
        self.dist.committed(&changed, now, &cat, &mut out);
        drop(cat);
        self.carry(out);
        if mark.installs != previous.installs && self.is_leader() {
            self.leader
                .extend_all(now, self.replica.applied.lock().leases());
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.revision <= mark.revision);
        self.deferred = waiting;
        for d in ready {
            self.finish(d.then, &d.envelope, Decided::Remote(d.response));
        }
        self.answer_waiters(now);
    }

    /// Answers deferred writes whose revision has not arrived in time (this
    /// replica lags): the write is committed, the answer says so.
    pub(super) fn expire_deferred(&mut self, now: u64) {
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| now >= d.deadline_ms);
        self.deferred = waiting;
        for d in late {
            tracing::warn!(revision = %d.revision, applied = %self.mark.revision, "this replica lags the leader; answering a committed write before applying it");
            self.finish(d.then, &d.envelope, Decided::Remote(d.response));
        }
    }
}
