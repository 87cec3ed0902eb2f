//! The core's calls to the other replicas of its group: requests handed
//! to the leader, answers to peers, propagation waits across replicas and
//! the sessions a follower heard.

use super::*;

impl Core {
    /// Sends `request` to the leader on another task; `then` gets its
    /// `Answer`, or why there was none. While no request has reached a
    /// leader (none known, or its address does not answer a handshake) it
    /// keeps looking until `wait` is over; a leader change while waiting for
    /// the answer ends the wait with "retry", since the old leader may be
    /// gone.
    pub(super) fn forward(
        &self,
        request: PeerRequest,
        wait: Duration,
        then: impl FnOnce(Forwarded) + Send + 'static,
    ) {
        let peers = self.replica.peers.clone();
        let mut metrics = self.replica.raft.metrics();
        let me = self.replica.id;
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + wait;
            let answer = loop {
                let leader = {
                    let m = metrics.borrow_and_update();
                    if m.current_leader == Some(me) {
                        drop(m);
                        break Forwarded::NowLeader(request);
                    }
                    m.current_leader.and_then(|id| {
                        m.membership_config
                            .nodes()
                            .find(|(n, _)| **n == id)
                            .map(|(_, node)| (id, node.addr.clone()))
                    })
                };
                let Some((leader, addr)) = leader else {
                    // No leader known: wait for news.
                    if tokio::time::timeout_at(deadline, metrics.changed())
                        .await
                        .is_err()
                    {
                        break Forwarded::Answer(no_leader());
                    }
                    continue;
                };
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let moved = async {
                    loop {
                        if metrics.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                        if metrics.borrow().current_leader != Some(leader) {
                            return;
                        }
                    }
                };
                tokio::select! {
                    answer = peers.call(&addr, &request, left) => match answer {
                        Ok(PeerResponse::Answer(response)) => break Forwarded::Answer(response),
                        Ok(PeerResponse::Answers(responses)) => break Forwarded::Answers(responses),
                        Ok(_) => break Forwarded::Answer(crate::answers::unavailable(format!("the leader at {addr} answered out of protocol"))),
                        Err(PeerError::Unreachable { .. }) if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => break Forwarded::Answer(crate::answers::unavailable(format!("the leader did not answer: {e}; retry"))),
                    },
                    _ = moved => break Forwarded::Answer(crate::answers::unavailable(format!(
                        "leadership moved away from replica {leader} while it held this write; retry"
                    ))),
                }
            };
            then(answer);
        });
    }

    /// Waits for the acknowledgements of `revision` by the agents of this
    /// replica and of every other, and answers their sums.
    pub(super) fn await_everywhere(
        &mut self,
        service: ServiceKey,
        revision: Revision,
        timeout_ms: u64,
        now: u64,
        reply: oneshot::Sender<Response>,
    ) {
        let (local_tx, local_rx) = oneshot::channel();
        self.waiters.push(Waiter {
            service: service.clone(),
            revision,
            deadline_ms: now + timeout_ms,
            reply: local_tx,
        });
        self.answer_waiters(now);
        let others: Vec<String> = self.other_replicas().into_iter().map(|(_, a)| a).collect();
        let peers = self.replica.peers.clone();
        tokio::spawn(async move {
            let request = PeerRequest::Propagation {
                service,
                revision,
                timeout_ms,
            };
            let wait = Duration::from_millis(timeout_ms + 1_000);
            let mut calls = tokio::task::JoinSet::new();
            for addr in others {
                let (peers, request) = (peers.clone(), request.clone());
                calls.spawn(async move { peers.call(&addr, &request, wait).await });
            }
            let answers = calls.join_all().await;
            let (mut acked, mut total) = match local_rx.await {
                Ok(Response::Propagated { acked, total }) => (acked, total),
                _ => (0, 0),
            };
            for answer in answers {
                match answer {
                    Ok(PeerResponse::Answer(Response::Propagated { acked: a, total: t })) => {
                        acked += a;
                        total += t;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "a replica did not report propagation"),
                }
            }
            let _ = reply.send(Response::Propagated { acked, total });
        });
    }

    /// The other replicas of the group, with their QUIC addresses.
    pub(super) fn other_replicas(&self) -> Vec<(ReplicaId, String)> {
        let metrics = self.replica.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .nodes()
            .filter(|(id, _)| **id != self.replica.id)
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect()
    }

    /// What a peer replica hands this one.
    pub(super) fn peer(
        &mut self,
        request: PeerRequest,
        reply: oneshot::Sender<PeerResponse>,
        now: u64,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        let answer = |reply: oneshot::Sender<PeerResponse>| {
            let (tx, rx) = oneshot::channel::<Response>();
            tokio::spawn(async move {
                let response = rx.await.unwrap_or_else(|_| {
                    crate::answers::unavailable("the write was dropped; retry".into())
                });
                let _ = reply.send(PeerResponse::Answer(response));
            });
            tx
        };
        match request {
            PeerRequest::Propose(envelope) => {
                if !self.is_leader() {
                    let _ = reply.send(PeerResponse::Answer(self.not_leader()));
                    return;
                }
                proposals.push((envelope, Then::Reply(answer(reply))));
            }
            PeerRequest::ProposeBatch(envelopes) => {
                if !self.is_leader() {
                    let _ = reply.send(PeerResponse::Answer(self.not_leader()));
                    return;
                }
                // Each write joins the group commits as a lone one would;
                // one task gathers the answers, in order.
                let mut answers = Vec::with_capacity(envelopes.len());
                for envelope in envelopes {
                    let (tx, rx) = oneshot::channel::<Response>();
                    answers.push(rx);
                    proposals.push((envelope, Then::Reply(tx)));
                }
                tokio::spawn(async move {
                    let mut out = Vec::with_capacity(answers.len());
                    for rx in answers {
                        out.push(rx.await.unwrap_or_else(|_| {
                            crate::answers::unavailable("the write was dropped; retry".into())
                        }));
                    }
                    let _ = reply.send(PeerResponse::Answers(out));
                });
            }
            PeerRequest::ReportDown {
                reporter,
                actor,
                node,
                epoch,
            } => {
                if !self.is_leader() {
                    let _ = reply.send(PeerResponse::Answer(self.not_leader()));
                    return;
                }
                self.report_down(reporter, actor, node, epoch, now, answer(reply), proposals);
            }
            PeerRequest::Heard(heard) => {
                let mut refused = Vec::new();
                if self.is_leader() {
                    for h in heard {
                        let at = now.saturating_sub(h.ago_ms);
                        self.leader.heard(&h.node, at);
                        if h.renewed {
                            let actor = agent_principal(&h.node);
                            match self.renew(&h.node, h.epoch, at, &actor) {
                                Ok(Some(reinstate)) => proposals.push((reinstate, Then::Nothing)),
                                Ok(None) => {}
                                Err(reason) => refused.push((h.node, reason)),
                            }
                        }
                    }
                }
                let asks: Vec<WitnessAsk> = if self.is_leader() {
                    self.witness_asks.iter().map(|(a, _)| a.clone()).collect()
                } else {
                    Vec::new()
                };
                let answer = if asks.is_empty() {
                    PeerResponse::Refused(refused)
                } else {
                    PeerResponse::HeardAsks { refused, asks }
                };
                let _ = reply.send(answer);
            }
            PeerRequest::Witnessed(answers) => {
                if self.is_leader() {
                    for a in answers {
                        let seen = crate::leader::Seen {
                            gossip: a.gossip,
                            reachable: a.reachable,
                        };
                        self.leader.witnessed(a.witness, &a.node, a.epoch, seen);
                    }
                }
                let _ = reply.send(PeerResponse::Refused(Vec::new()));
            }
            PeerRequest::Propagation {
                service,
                revision,
                timeout_ms,
            } => {
                self.waiters.push(Waiter {
                    service,
                    revision,
                    deadline_ms: now + timeout_ms.min(30_000),
                    reply: answer(reply),
                });
                self.answer_waiters(now);
            }
            PeerRequest::AppendEntries(_)
            | PeerRequest::Vote(_)
            | PeerRequest::InstallSnapshot(_)
            | PeerRequest::Membership(_) => {
                let _ = reply.send(PeerResponse::Answer(crate::answers::unavailable(
                    "Raft messages are not the core's".into(),
                )));
            }
        }
    }

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

    /// A follower tells the leader which sessions it heard, and hands it
    /// its witnesses' answers.
    pub(super) fn report_heard(&mut self, now: u64) {
        if self.is_leader() {
            self.witnessed_out.clear();
            return;
        }
        let Standing::Follower {
            leader: Some((_, addr)),
        } = &self.standing
        else {
            return;
        };
        if !self.witnessed_out.is_empty() {
            let answers = std::mem::take(&mut self.witnessed_out);
            let addr = addr.clone();
            let peers = self.replica.peers.clone();
            let wait = Duration::from_millis(self.config.raft.write_timeout_ms);
            tokio::spawn(async move {
                if let Err(e) = peers
                    .call(&addr, &PeerRequest::Witnessed(answers), wait)
                    .await
                {
                    tracing::debug!(error = %e, "could not hand witnesses' answers to the leader");
                }
            });
        }
        if self.heard_out.is_empty() {
            return;
        }
        let heard: Vec<Heard> = self
            .heard_out
            .drain()
            .map(|(node, note)| Heard {
                node,
                epoch: note.epoch,
                ago_ms: now.saturating_sub(note.at_ms),
                renewed: note.renewed,
            })
            .collect();
        let addr = addr.clone();
        let peers = self.replica.peers.clone();
        let done = self.done_tx.clone();
        let wait = Duration::from_millis(self.config.raft.write_timeout_ms);
        tokio::spawn(async move {
            match peers.call(&addr, &PeerRequest::Heard(heard), wait).await {
                Ok(PeerResponse::Refused(refused)) if !refused.is_empty() => {
                    let _ = done.send(Done::Refused(refused));
                }
                Ok(PeerResponse::HeardAsks { refused, asks }) => {
                    if !refused.is_empty() {
                        let _ = done.send(Done::Refused(refused));
                    }
                    let _ = done.send(Done::Asks(asks));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "could not report heard sessions to the leader")
                }
            }
        });
    }
}

pub(super) fn no_leader() -> Response {
    crate::answers::unavailable(
        "this region's arbiter group has no leader now (an election is running, or fewer than a \
         majority of replicas are reachable); the write is not committed; retry"
            .into(),
    )
}
