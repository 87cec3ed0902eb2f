//! The agents connected to this replica: their session messages and
//! requests as the session machine reads them, the distributor's updates
//! and wake-ups, regions messages, and `AwaitPropagation` waits (answered
//! at the last ack or at the deadline, with the other replicas' sums).

use super::writes::Then;
use super::*;
use crate::distribution;
use crate::ids::AgentEpoch;
use crate::protocol::{RejectKind, ServiceUpdate};
use crate::regions::{regions_update, RegionsEpoch};
use crate::sessions::{Accepted, Step};

impl ReplicaState {
    pub(super) fn send(&mut self, agent: AgentId, message: SessionDown, out: &mut Vec<Output>) {
        out.push(Output::Send {
            agent,
            message,
            notify: false,
        });
    }

    pub(super) fn close(&mut self, agent: AgentId, reason: String, out: &mut Vec<Output>) {
        out.push(Output::Close { agent, reason });
    }

    pub(super) fn refuse(&mut self, agent: AgentId, reason: String, out: &mut Vec<Output>) {
        self.send(
            agent,
            SessionDown::Refused {
                reason: reason.clone(),
            },
            out,
        );
        self.close(agent, reason, out);
    }

    /// A refusal of `kind` (`request`, `hello`, `watch`) to `agent`'s
    /// identity: counted, and written to the audit log (repeats folded).
    pub(super) fn audit_refusal(
        &mut self,
        agent: AgentId,
        kind: &'static str,
        reason: &str,
        now: u64,
    ) {
        self.counters.refused(match kind {
            "request" => RejectKind::Forbidden.as_str(),
            other => other,
        });
        let who = self
            .sessions
            .identity(agent)
            .map_or_else(|| "a closed connection".to_owned(), ToString::to_string);
        let mut lines = Vec::new();
        self.refusals.refused(&who, kind, reason, now, &mut lines);
        lines.iter().for_each(crate::refusals::AuditLine::log);
    }

    /// One message on a session stream, as the session machine reads it.
    pub(super) fn session(
        &mut self,
        agent: AgentId,
        msg: SessionUp,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let (heard, step) = self.sessions.message(agent, msg, now);
        if let Some((node, epoch, renewed)) = heard {
            self.heard(&node, epoch, now, renewed);
        }
        match step {
            Step::Grant { envelope, replaced } => {
                for (old, reason) in replaced {
                    // Forgotten by the session machine already; it hears no
                    // more updates, and its connection closes with the reason.
                    tracing::info!(agent = old, by = agent, reason = %reason, "session replaced");
                    self.counters.sessions_replaced += 1;
                    self.dist.disconnect(old);
                    self.regions.forget(old);
                    self.close(old, reason, out);
                }
                self.writes.wake_up.push((envelope, Then::Welcome(agent)));
            }
            Step::Refuse(reason) => {
                self.audit_refusal(agent, "hello", &reason, now);
                self.refuse(agent, reason, out);
            }
            Step::Close(reason) => self.close(agent, reason, out),
            Step::Deny { service, reason } => {
                self.audit_refusal(agent, "watch", &format!("{service}: {reason}"), now);
                let update = SessionDown::Update(vec![ServiceUpdate::Denied { service, reason }]);
                self.send(agent, update, out);
            }
            Step::Subscribe { service, have } => {
                let limit = self.config.limits.subscriptions_per_session as usize;
                let (follows, already) = self.dist.follows(agent, &service);
                if follows >= limit && !already {
                    self.counters.subscriptions_refused += 1;
                    let reason = format!(
                        "this session follows {follows} services already (limits.subscriptions_per_session = {limit}); unsubscribe from one first"
                    );
                    self.audit_refusal(agent, "watch", &format!("{service}: {reason}"), now);
                    let update =
                        SessionDown::Update(vec![ServiceUpdate::Denied { service, reason }]);
                    self.send(agent, update, out);
                    return;
                }
                let mut dist = Vec::new();
                self.dist
                    .subscribe(agent, service, have, now, cat, &mut dist);
                // The service's policy goes ahead of its endpoints, so an
                // agent never routes a newly followed service without it.
                self.regions.touch(agent);
                self.push_regions(&[agent], now, cat, out);
                self.carry(dist, out);
            }
            Step::Unsubscribe(service) => {
                self.dist.unsubscribe(agent, &service);
                self.regions.touch(agent);
            }
            Step::Ack { service, revision } => {
                let mut dist = Vec::new();
                self.dist
                    .ack(agent, &service, revision, now, cat, &mut dist);
                self.carry(dist, out);
                self.answer_waiters(&service, out);
            }
            Step::Renew { node, epoch, actor } => {
                self.counters.renewals += 1;
                if !self.leads() {
                    // Noted by `heard` for the leader.
                    return;
                }
                match self.renew(&node, epoch, now, &actor, cat) {
                    Ok(Some(reinstate)) => self.writes.wake_up.push((reinstate, Then::Nothing)),
                    Ok(None) => {}
                    Err(reason) => self.refuse(agent, reason, out),
                }
            }
            Step::Witnessed {
                witness,
                node,
                epoch,
                seen,
            } => self.witnessed(agent, witness, node, epoch, seen, now, cat, out),
            Step::Alive => {
                self.counters.probes_answered += 1;
                // A follower tells the leader at once: a down report
                // waits for it.
                self.witnesses.report_now |= !self.leads();
            }
            Step::Nothing => {}
        }
    }

    /// Renews a lease in the leader's memory at `at`; a held lease whose
    /// session is back is reinstated by the returned proposal (R3).
    pub(super) fn renew(
        &mut self,
        node: &NodeId,
        epoch: AgentEpoch,
        at: u64,
        actor: &Principal,
        cat: &Catalog,
    ) -> Result<Option<Envelope>, String> {
        self.leader
            .renew(cat.leases(), node, epoch, at, actor)
            .map_err(|e| e.to_string())
    }

    /// A request on a stream of its own.
    pub(super) fn request(
        &mut self,
        agent: AgentId,
        request: Request,
        reply: ReplyId,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        match self.sessions.request(agent, request, cat, now) {
            Ok(Accepted::Propose(envelope)) => self
                .writes
                .wake_up
                .push((envelope, Then::Reply(Reply::Agent(reply)))),
            // Answered from acknowledgements, not committed: this replica's
            // agents and every other replica's.
            Ok(Accepted::Await {
                service,
                revision,
                timeout_ms,
            }) => self.await_everywhere(agent, service, revision, timeout_ms, reply, now, out),
            Ok(Accepted::Down {
                reporter,
                actor,
                node,
                epoch,
            }) => self.report_down(
                reporter,
                actor,
                node,
                epoch,
                Reply::Agent(reply),
                now,
                cat,
                out,
            ),
            Ok(Accepted::List(node)) => out.push(Output::Answer {
                reply,
                response: crate::answers::node_instances(cat, &node),
            }),
            Ok(Accepted::Answer(response)) => out.push(Output::Answer { reply, response }),
            Err(response) => {
                if let Response::Rejected { kind, message } = &response {
                    // A refused write (another node's instance, a service
                    // or an address the registration rules do not allow)
                    // is recorded with who asked: it changed nothing, so
                    // the catalog's audit log holds no entry of it.
                    if *kind == RejectKind::Forbidden {
                        self.audit_refusal(agent, "request", message, now);
                    } else {
                        self.counters.refused(kind.as_str());
                    }
                } else {
                    self.counters.rejections += 1;
                }
                out.push(Output::Answer { reply, response });
            }
        }
    }

    /// Waits for the acknowledgements of `revision` by the agents of this
    /// replica and of every other, and answers their sums; refused past
    /// `limits.propagation_waits_per_identity` open waits of the asking
    /// identity.
    #[allow(clippy::too_many_arguments)]
    fn await_everywhere(
        &mut self,
        agent: AgentId,
        service: ServiceKey,
        revision: Revision,
        timeout_ms: u64,
        reply: ReplyId,
        now: u64,
        out: &mut Vec<Output>,
    ) {
        let Some(identity) = self.sessions.identity(agent).map(|i| i.principal.clone()) else {
            return;
        };
        let limit = self.config.limits.propagation_waits_per_identity;
        if !self.waiters.admit(&identity, limit) {
            self.counters.propagation_waits_refused += 1;
            self.counters.refused(RejectKind::Unavailable.as_str());
            let reason = format!(
                "{identity} holds {limit} propagation waits open on this replica already (limits.propagation_waits_per_identity); retry when one is answered"
            );
            out.push(Output::Answer {
                reply,
                response: crate::answers::unavailable(reason),
            });
            return;
        }
        let wait = self.next_id();
        let others: Vec<String> = self.raft.others.iter().map(|(_, a)| a.clone()).collect();
        self.waiters.awaits.insert(
            wait,
            Await {
                reply,
                identity,
                here: None,
                others: others.is_empty().then_some((0, 0)),
            },
        );
        if !others.is_empty() {
            out.push(Output::AskPropagation {
                wait,
                to: others,
                request: PeerRequest::Propagation {
                    service: service.clone(),
                    revision,
                    timeout_ms,
                },
                wait_ms: timeout_ms + 1_000,
            });
        }
        self.waiters.push(Waiter {
            service: service.clone(),
            revision,
            deadline_ms: now + timeout_ms,
            to: WaitFor::Await(wait),
        });
        self.answer_waiters(&service, out);
    }

    /// A peer asks for this replica's acknowledgements of `revision`.
    pub(super) fn await_here(
        &mut self,
        service: ServiceKey,
        revision: Revision,
        timeout_ms: u64,
        reply: ReplyId,
        now: u64,
        out: &mut Vec<Output>,
    ) {
        self.waiters.push(Waiter {
            service: service.clone(),
            revision,
            deadline_ms: now + timeout_ms.min(30_000),
            to: WaitFor::Peer(reply),
        });
        self.answer_waiters(&service, out);
    }

    /// Answers the waits of `service` that every follower here
    /// acknowledged.
    pub(super) fn answer_waiters(&mut self, service: &ServiceKey, out: &mut Vec<Output>) {
        let dist = &self.dist;
        let done = self.waiters.complete(service, |w| {
            let (acked, total) = dist.propagation(&w.service, w.revision);
            acked >= total
        });
        for w in done {
            self.answer_wait(w, out);
        }
    }

    /// Answers the waits past their deadline with the sums they have.
    pub(super) fn expire_waiters(&mut self, now: u64, out: &mut Vec<Output>) {
        for w in self.waiters.expired(now) {
            self.answer_wait(w, out);
        }
    }

    /// Every sweep: every wait looked at again (a follower that went away
    /// completes one as an acknowledgement does).
    pub(super) fn recheck_waiters(&mut self, now: u64, out: &mut Vec<Output>) {
        for service in self.waiters.services() {
            self.answer_waiters(&service, out);
        }
        self.expire_waiters(now, out);
    }

    fn answer_wait(&mut self, w: Waiter, out: &mut Vec<Output>) {
        let (acked, total) = self.dist.propagation(&w.service, w.revision);
        match w.to {
            WaitFor::Peer(reply) => out.push(Output::AnswerPeer {
                reply,
                response: PeerResponse::Answer(Response::Propagated { acked, total }),
            }),
            WaitFor::Await(wait) => {
                if let Some(a) = self.waiters.awaits.get_mut(&wait) {
                    a.here = Some((acked, total));
                }
                self.finish_await(wait, out);
            }
        }
    }

    /// Answers an agent's `AwaitPropagation` once this replica and the
    /// others have their sums.
    pub(super) fn finish_await(&mut self, wait: AwaitId, out: &mut Vec<Output>) {
        let Some(Await {
            here: Some(here),
            others: Some(others),
            ..
        }) = self.waiters.awaits.get(&wait)
        else {
            return;
        };
        let (acked, total) = (here.0 + others.0, here.1 + others.1);
        let a = self.waiters.finished(wait).expect("found above");
        out.push(Output::Answer {
            reply: a.reply,
            response: Response::Propagated { acked, total },
        });
    }

    /// Sends each of `agents` that holds a session its regions message
    /// when it is due (R9: policies and other regions' summaries of the
    /// services it follows).
    pub(super) fn push_regions(
        &mut self,
        agents: &[AgentId],
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let epoch = RegionsEpoch::of(cat, &self.remote);
        for &agent in agents {
            if self.sessions.live(agent).is_none() || self.regions.unchanged(agent, epoch, now) {
                continue;
            }
            let update = regions_update(self.dist.subscriptions(agent), cat, &self.remote, now);
            if self.regions.due(agent, &update, epoch, now) {
                self.counters.regions_sent += 1;
                self.send(agent, update.into_message(), out);
            }
        }
    }

    /// The distributor's outputs, as the machine's.
    pub(super) fn carry(&mut self, dist: Vec<distribution::Output>, out: &mut Vec<Output>) {
        for o in dist {
            match o {
                distribution::Output::Send { agent, updates } => out.push(Output::Send {
                    agent,
                    message: SessionDown::Update(updates),
                    notify: true,
                }),
                distribution::Output::WakeAt { agent, at_ms } => {
                    self.wakes.entry(at_ms).or_default().push(agent)
                }
                distribution::Output::Disconnect { agent, reason } => {
                    tracing::warn!(agent, reason = %reason, "disconnecting a stalled agent");
                    self.close(agent, reason, out);
                }
            }
        }
    }

    /// The distributor's wake-ups that are due.
    pub(super) fn fire_wakes(&mut self, now: u64, cat: &Catalog, out: &mut Vec<Output>) {
        let later = self.wakes.split_off(&(now + 1));
        let due = std::mem::replace(&mut self.wakes, later);
        let mut dist = Vec::new();
        for agent in due.into_values().flatten() {
            self.dist.wake(agent, now, cat, &mut dist);
        }
        self.carry(dist, out);
    }
}
