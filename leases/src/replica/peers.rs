//! What a peer replica hands this one: writes and down reports for the
//! leader, sessions a follower heard (answered with the renewals refused
//! and the witness asks open), witnesses' answers, and propagation
//! questions.

use super::writes::Then;
use super::*;
use crate::leader::{agent_principal, Seen};

impl ReplicaState {
    pub(super) fn peer(
        &mut self,
        request: PeerRequest,
        reply: ReplyId,
        now: u64,
        cat: &Catalog,
        out: &mut Vec<Output>,
    ) {
        let leader_only = matches!(
            request,
            PeerRequest::Propose(_) | PeerRequest::ProposeBatch(_) | PeerRequest::ReportDown { .. }
        );
        if leader_only && !self.leads() {
            out.push(Output::AnswerPeer {
                reply,
                response: PeerResponse::Answer(self.not_leader()),
            });
            return;
        }
        match request {
            PeerRequest::Propose(envelope) => match self.check_forwarded(&envelope, now, cat) {
                Ok(()) => self
                    .writes
                    .wake_up
                    .push((envelope, Then::Reply(Reply::Peer(reply)))),
                Err(refused) => out.push(Output::AnswerPeer {
                    reply,
                    response: PeerResponse::Answer(refused),
                }),
            },
            PeerRequest::ProposeBatch(envelopes) => {
                let checked = envelopes
                    .into_iter()
                    .map(|e| self.check_forwarded(&e, now, cat).map(|()| e))
                    .collect();
                self.gather(checked, reply, out)
            }
            PeerRequest::ReportDown {
                reporter,
                actor,
                node,
                epoch,
            } => self.report_down(
                reporter,
                actor,
                node,
                epoch,
                Reply::Peer(reply),
                now,
                cat,
                out,
            ),
            PeerRequest::Heard(heard) => {
                let mut refused = Vec::new();
                if self.leads() {
                    for h in heard {
                        let at = now.saturating_sub(h.ago_ms);
                        self.leader.heard(&h.node, at);
                        if h.renewed {
                            let actor = agent_principal(&h.node);
                            match self.renew(&h.node, h.epoch, at, &actor, cat) {
                                Ok(Some(reinstate)) => {
                                    self.writes.wake_up.push((reinstate, Then::Nothing))
                                }
                                Ok(None) => {}
                                Err(reason) => refused.push((h.node, reason)),
                            }
                        }
                    }
                }
                let (asks, probes) = if self.leads() {
                    (self.witnesses.open(), self.witnesses.open_probes())
                } else {
                    (Vec::new(), Vec::new())
                };
                let response = if !probes.is_empty() {
                    PeerResponse::HeardProbes {
                        refused,
                        asks,
                        probes,
                    }
                } else if asks.is_empty() {
                    PeerResponse::Refused(refused)
                } else {
                    PeerResponse::HeardAsks { refused, asks }
                };
                out.push(Output::AnswerPeer { reply, response });
            }
            PeerRequest::Witnessed(answers) => {
                // The follower took only answers its sessions were asked
                // for (`ReplicaState::witnessed`).
                if self.leads() {
                    let mut downs = false;
                    for a in answers {
                        let seen = Seen {
                            gossip: a.gossip,
                            reachable: a.reachable,
                        };
                        downs |= self.leader.witnessed(a.witness, &a.node, a.epoch, seen);
                    }
                    if downs {
                        let verdicts = self.leader.decide_downs(now);
                        self.verdicts(verdicts, now, cat, out);
                    }
                }
                out.push(Output::AnswerPeer {
                    reply,
                    response: PeerResponse::Refused(Vec::new()),
                });
            }
            PeerRequest::Propagation {
                service,
                revision,
                timeout_ms,
            } => self.await_here(service, revision, timeout_ms, reply, now, out),
            PeerRequest::AppendEntries(_)
            | PeerRequest::Vote(_)
            | PeerRequest::InstallSnapshot(_)
            | PeerRequest::Membership(_)
            | PeerRequest::Removed(_)
            | PeerRequest::Shard { .. } => out.push(Output::AnswerPeer {
                reply,
                response: PeerResponse::Answer(crate::answers::unavailable(
                    "Raft and membership messages are not the replica machine's".into(),
                )),
            }),
        }
    }

    /// A write a follower forwarded, checked again against the rules and
    /// the leader's catalog (`Rules::may_propose`); a refusal is counted
    /// and audited as the actor's.
    fn check_forwarded(
        &mut self,
        envelope: &Envelope,
        now: u64,
        cat: &Catalog,
    ) -> Result<(), Response> {
        let checked = self
            .sessions
            .rules()
            .may_propose(&envelope.actor, &envelope.command, cat);
        if let Err(Response::Rejected { message, .. }) = &checked {
            self.counters
                .refused(crate::protocol::RejectKind::Forbidden.as_str());
            let who = envelope.actor.to_string();
            let mut lines = Vec::new();
            self.refusals
                .refused(&who, "request", message, now, &mut lines);
            lines.iter().for_each(crate::refusals::AuditLine::log);
        }
        checked
    }
}
