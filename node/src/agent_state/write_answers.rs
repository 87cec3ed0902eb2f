//! What the arbiter's answer to a local write means: a registration
//! committed (checked from now) or kept pending, a drain that opens its
//! window (and waits for propagation when the caller asked), a departure
//! that forgets the local registration, a refusal that leaves the
//! instance as it was; and the answer the local caller gets.

use rand::Rng;
use rollcall_leases::protocol::{RejectKind, Request, Response};
use rollcall_leases::{InstanceId, Revision, State};

use super::calls::{
    CallId, Drained, Propagation, Refusal, Refused, Registered, Reply, WriteOutcome,
};
use super::writes::{pending_intent, reply, Then, WriteRequest};
use super::{AgentState, Output, Purpose, Verdict};
use crate::registrations::Intent;

impl AgentState {
    /// The arbiter's answer to a local write.
    pub(super) fn write_answered<R: Rng + ?Sized>(
        &mut self,
        request: WriteRequest,
        result: Result<Response, String>,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        match request {
            WriteRequest::Register { call, registration } => match Verdict::of(result) {
                Verdict::Committed {
                    generation: Some(g),
                    state,
                    ..
                } => {
                    let answer = Reply::Registered(WriteOutcome::Committed(Registered {
                        instance: registration.instance_id.clone(),
                        generation: Some(g),
                        state: Some(state.unwrap_or(State::Ready)),
                    }));
                    self.put_local(registration, Some(g), now_ms, rng);
                    self.save(Then::Reply(call, Ok(answer)), out);
                }
                Verdict::Refused(kind, message) => {
                    reply(out, call, Err(Refusal::by_arbiter(kind, message)))
                }
                Verdict::Committed { .. } | Verdict::Unknown(_) => {
                    tracing::warn!(instance = %registration.instance_id, "registration not committed; kept pending");
                    self.register_pending(call, registration, now_ms, rng, out);
                }
            },
            WriteRequest::Intent {
                call,
                instance,
                intent,
                generation,
                propagated,
            } => match Verdict::of(result) {
                Verdict::Committed { revision, .. } => {
                    let revision = revision.or_else(|| self.record_of(&instance).map(|r| r.1));
                    self.intent_committed(&instance, intent, generation, now_ms);
                    self.save(Then::Nothing, out);
                    let Some(call) = call else { return };
                    match (intent, propagated, revision) {
                        (Intent::Drain, true, Some(revision)) => {
                            self.await_propagation(call, &instance, revision, out)
                        }
                        (Intent::Drain, _, _) => {
                            let drained = Drained {
                                revision,
                                propagated: None,
                            };
                            reply(
                                out,
                                call,
                                Ok(Reply::Drained(WriteOutcome::Committed(drained))),
                            )
                        }
                        _ => reply(
                            out,
                            call,
                            Ok(Reply::Deregistered(WriteOutcome::Committed(revision))),
                        ),
                    }
                }
                // A departure the catalog no longer holds a record for is
                // done (another path of this agent deregistered it first,
                // or an operator freed it): forgotten here too, not kept
                // to be registered again.
                Verdict::Refused(RejectKind::NotFound, _) if intent == Intent::Leave => {
                    self.intent_committed(&instance, intent, generation, now_ms);
                    self.save(Then::Nothing, out);
                    if let Some(call) = call {
                        reply(
                            out,
                            call,
                            Ok(Reply::Deregistered(WriteOutcome::Committed(None))),
                        );
                    }
                }
                Verdict::Refused(kind, message) => {
                    self.undo_intent(&instance, out);
                    match call {
                        Some(call) => reply(out, call, Err(Refusal::by_arbiter(kind, message))),
                        None => {
                            tracing::warn!(instance = %instance, reason = %message, "deregistration after the drain failed")
                        }
                    }
                }
                Verdict::Unknown(e) => {
                    tracing::warn!(instance = %instance, error = %e, "{} not sent; kept pending", intent_word(intent));
                    if let Some(call) = call {
                        reply(out, call, Ok(pending_intent(intent)));
                    }
                }
            },
            WriteRequest::Propagation { call, revision } => {
                let answer = match result {
                    Ok(Response::Propagated { acked, total }) => {
                        Ok(Reply::Drained(WriteOutcome::Committed(Drained {
                            revision: Some(revision),
                            propagated: Some(Propagation { acked, total }),
                        })))
                    }
                    Ok(Response::Rejected { kind, message }) => {
                        Err(Refusal::by_arbiter(kind, message))
                    }
                    Ok(other) => Err(Refusal::new(
                        Refused::Unavailable,
                        format!("unexpected answer from the arbiter: {other:?}"),
                    )),
                    Err(e) => Err(Refusal::new(
                        Refused::Unavailable,
                        format!("the drain committed but waiting for propagation failed: {e}"),
                    )),
                };
                reply(out, call, answer);
            }
        }
    }

    fn await_propagation(
        &mut self,
        call: CallId,
        instance: &InstanceId,
        revision: Revision,
        out: &mut Vec<Output>,
    ) {
        let Some(service) = self.service_of(instance) else {
            let e = Refusal::new(
                Refused::NotFound,
                format!("the service of instance {instance} is not known here"),
            );
            return reply(out, call, Err(e));
        };
        let body = Request::AwaitPropagation {
            service,
            revision,
            timeout_ms: self.settings.config.propagation_timeout_ms,
        };
        let purpose = Purpose::Write(WriteRequest::Propagation { call, revision });
        if !self.link.request(body, purpose, out) {
            let e = Refusal::new(
                Refused::Unavailable,
                "the drain committed but the arbiter session ended before propagation",
            );
            reply(out, call, Err(e));
        }
    }
}

fn intent_word(intent: Intent) -> &'static str {
    match intent {
        Intent::Serve => "registration",
        Intent::Drain => "drain",
        Intent::Leave => "deregistration",
    }
}
