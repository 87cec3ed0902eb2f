//! Local writes: the local API's calls (who may write which instance, and
//! which generation a call names), the local registrations with the
//! intent of each (serve, drain, leave), saved before anything is sent,
//! writes kept pending while the arbiter is away, the drain window, and
//! the answers, bounded by `agent.write_answer_ms`. Each call is checked
//! first ([`super::authority`]); its request is built by
//! [`super::requests`], as the replay's are.

use std::collections::{BTreeMap, BTreeSet};

use rand::Rng;
use rollcall_leases::{Generation, InstanceId, Revision};

use super::calls::{
    deregister_pending, drain_pending, pending_reply, register_pending, Call, CallId, Caller,
    Refusal, Refused, Reply,
};
use super::requests::{intent_request, register_request};
use super::{AgentState, Output, Purpose, SaveId, WRITE_RETRY_MS};
use crate::api_types::ValidRegistration;
use crate::registrations::{Intent, LocalInstance, Registrations};

/// A local write in flight.
// Moved once per request, never stored in bulk: boxing the large variant
// would cost an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(crate) enum WriteRequest {
    /// A registration: answer `call`.
    Register {
        call: CallId,
        registration: ValidRegistration,
    },
    /// A drain or deregistration: answer `call`, if any (none after a
    /// drain window).
    Intent {
        call: Option<CallId>,
        instance: InstanceId,
        intent: Intent,
        generation: Generation,
        propagated: bool,
    },
    /// The propagation wait after a committed drain.
    Propagation { call: CallId, revision: Revision },
}

/// What a save of the registrations file is followed by.
#[derive(Clone, Debug)]
pub(super) enum Then {
    Nothing,
    Reply(CallId, Result<Reply, Refusal>),
    /// The intent is on disk: send it.
    Send {
        call: Option<CallId>,
        instance: InstanceId,
        intent: Intent,
        generation: Option<Generation>,
        propagated: bool,
    },
}

/// The local registrations and the writes about them.
pub(super) struct LocalWrites {
    pub(super) regs: Registrations,
    /// Local write calls not answered yet, by when they are answered as
    /// pending at the latest (`agent.write_answer_ms`).
    unanswered: BTreeMap<CallId, (u64, Reply)>,
    /// Calls answered as pending at their bound: the answer the machine
    /// gives later is not sent again.
    answered_early: BTreeSet<CallId>,
    next_save: SaveId,
    saves: BTreeMap<SaveId, Then>,
    /// Drain windows: when each drained instance is deregistered.
    drains: BTreeMap<u64, Vec<(InstanceId, Generation)>>,
    /// When writes the arbiter refused as unavailable are tried again.
    retry_at: Option<u64>,
}

impl LocalWrites {
    pub(super) fn new(regs: Registrations) -> LocalWrites {
        LocalWrites {
            regs,
            unanswered: BTreeMap::new(),
            answered_early: BTreeSet::new(),
            next_save: 0,
            saves: BTreeMap::new(),
            drains: BTreeMap::new(),
            retry_at: None,
        }
    }

    /// The group was unavailable: pending writes are tried again soon.
    pub(super) fn retry_soon(&mut self, now_ms: u64) {
        self.retry_at.get_or_insert(now_ms + WRITE_RETRY_MS);
    }

    /// Whether the retry is due (once).
    pub(super) fn retry_due(&mut self, now_ms: u64) -> bool {
        let due = self.retry_at.is_some_and(|t| t <= now_ms);
        if due {
            self.retry_at = None;
        }
        due
    }

    /// The session ended: the next one reconciles anyway.
    pub(super) fn retry_cancelled(&mut self) {
        self.retry_at = None;
    }

    /// Drained instances whose window is over.
    pub(super) fn drains_due(&mut self, now_ms: u64) -> Vec<(InstanceId, Generation)> {
        let later = self.drains.split_off(&(now_ms + 1));
        std::mem::replace(&mut self.drains, later)
            .into_values()
            .flatten()
            .collect()
    }

    /// The drain of `id` committed: it is deregistered after the window.
    fn open_drain_window(&mut self, id: InstanceId, generation: Generation, closes_ms: u64) {
        self.drains
            .entry(closes_ms)
            .or_default()
            .push((id, generation));
    }

    pub(super) fn next_wake(&self) -> Option<u64> {
        [
            self.retry_at,
            self.drains.keys().next().copied(),
            self.unanswered.values().map(|(by, _)| *by).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Write calls past their bound are answered as pending (their write
    /// stays in flight or pending); a call answered so gets no second
    /// answer.
    pub(super) fn bound_answers(&mut self, now_ms: u64, out: &mut Vec<Output>) {
        if !(self.answered_early.is_empty() && self.unanswered.is_empty()) {
            out.retain(|o| match o {
                Output::Reply { call, .. } => {
                    self.unanswered.remove(call);
                    !self.answered_early.remove(call)
                }
                _ => true,
            });
        }
        let due: Vec<CallId> = self
            .unanswered
            .iter()
            .filter(|(_, (by, _))| *by <= now_ms)
            .map(|(call, _)| *call)
            .collect();
        for call in due {
            if let Some((_, pending)) = self.unanswered.remove(&call) {
                tracing::info!(call, "a local call got no answer from the arbiter in agent.write_answer_ms; answered without it (a write as pending)");
                self.answered_early.insert(call);
                out.push(Output::Reply {
                    call,
                    reply: Ok(pending),
                });
            }
        }
    }
}

/// A local write is written to the audit log target with who asked: the
/// arbiter's audit log names this node's agent as the actor, this line
/// names the local caller behind it (the node token, or a workload's uid
/// and gid). Heartbeats are not: one per interval per instance.
fn audit_call(op: &Call) {
    let (what, instance, caller) = match op {
        Call::Register {
            registration,
            caller,
        } => ("register", &registration.instance_id, caller),
        Call::Drain {
            instance, caller, ..
        } => ("drain", instance, caller),
        Call::Deregister {
            instance, caller, ..
        } => ("deregister", instance, caller),
        Call::OpenSession {
            instance, caller, ..
        } => ("open-session", instance, caller),
        Call::Heartbeat { .. } | Call::Instances | Call::Services => return,
    };
    match caller {
        Caller::Operator => {
            tracing::info!(target: "rollcall::audit", call = what, instance = %instance, caller = "node-token", "local write");
        }
        Caller::Workload { uid, gid } => {
            tracing::info!(target: "rollcall::audit", call = what, instance = %instance, caller = "workload", uid, gid, "local write");
        }
    }
}

pub(super) fn reply(out: &mut Vec<Output>, call: CallId, reply: Result<Reply, Refusal>) {
    out.push(Output::Reply { call, reply });
}

impl AgentState {
    /// A local API call.
    pub(super) fn call<R: Rng + ?Sized>(
        &mut self,
        call: CallId,
        op: Call,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        audit_call(&op);
        if let Some(pending) = pending_reply(&op) {
            let config = &self.settings.config;
            let mut bound = config.write_answer_ms;
            if matches!(
                op,
                Call::Drain {
                    propagated: true,
                    ..
                }
            ) {
                bound += config.propagation_timeout_ms;
            }
            self.writes
                .unanswered
                .insert(call, (now_ms + bound, pending));
        }
        match op {
            Call::Register {
                registration,
                caller,
            } => {
                if let Err(e) = self.authorize(&caller, &registration.service) {
                    return reply(out, call, Err(e));
                }
                if let Some(local) = self
                    .writes
                    .regs
                    .get(&registration.instance_id)
                    .filter(|l| l.registration.service != registration.service)
                {
                    let e = Refusal::new(Refused::Conflict, format!(
                        "instance_id {} is registered under service {}; deregister it first, or use another instance id (an instance id never moves between services)",
                        registration.instance_id, local.registration.service
                    ));
                    return reply(out, call, Err(e));
                }
                let body = register_request(&self.settings, &registration);
                let purpose = Purpose::Write(WriteRequest::Register {
                    call,
                    registration: registration.clone(),
                });
                if !self.link.request(body, purpose, out) {
                    self.register_pending(call, registration, now_ms, rng, out);
                }
            }
            Call::Heartbeat {
                instance,
                generation,
                caller,
            } => {
                let result = self.heartbeat(&instance, generation, &caller, now_ms);
                reply(out, call, result);
            }
            Call::Drain {
                instance,
                generation,
                propagated,
                caller,
            } => self.call_intent(
                call,
                instance,
                Intent::Drain,
                (generation, propagated),
                caller,
                out,
            ),
            Call::Deregister {
                instance,
                generation,
                caller,
            } => self.call_intent(
                call,
                instance,
                Intent::Leave,
                (generation, false),
                caller,
                out,
            ),
            Call::OpenSession {
                instance,
                generation,
                caller,
            } => {
                let result = self
                    .authorize_instance(&caller, &instance, generation)
                    .and_then(|generation| match self.writes.regs.get(&instance) {
                        Some(_) => Ok(Reply::SessionOpened(generation)),
                        None => Err(Refusal::new(
                            Refused::NotFound,
                            format!("instance {instance} is not registered on this agent"),
                        )),
                    });
                reply(out, call, result);
            }
            Call::Instances => reply(out, call, Ok(Reply::Instances(self.local_entries()))),
            Call::Services => self.list_services(call, out),
        }
    }

    /// A drain or deregistration call: authorized, its intent recorded and
    /// saved, then sent.
    fn call_intent(
        &mut self,
        call: CallId,
        instance: InstanceId,
        intent: Intent,
        (given, propagated): (Option<u64>, bool),
        caller: Caller,
        out: &mut Vec<Output>,
    ) {
        match self.authorize_instance(&caller, &instance, given) {
            Err(e) => reply(out, call, Err(e)),
            Ok(generation) => {
                let then = Then::Send {
                    call: Some(call),
                    instance: instance.clone(),
                    intent,
                    generation,
                    propagated,
                };
                self.set_intent(&instance, intent, then, out);
            }
        }
    }

    fn heartbeat(
        &mut self,
        id: &InstanceId,
        generation: Option<u64>,
        caller: &Caller,
        now_ms: u64,
    ) -> Result<Reply, Refusal> {
        self.authorize_instance(caller, id, generation)?;
        self.health
            .checkers
            .update(id, |_, health| health.heartbeat(now_ms));
        let Some(local) = self.writes.regs.get(id) else {
            return Err(Refusal::new(
                Refused::NotFound,
                format!("instance {id} is not registered on this agent"),
            ));
        };
        if let (Some(g), Some(c)) = (generation, local.generation) {
            if g != c.get() {
                return Err(Refusal::new(
                    Refused::StaleGeneration,
                    format!("instance {id} is at generation {c}, not {g}; the heartbeat changes nothing"),
                ));
            }
        }
        Ok(Reply::Heartbeat {
            instance: id.clone(),
            generation: local.generation,
        })
    }

    /// Keeps a registration the arbiter did not take now (unreachable or
    /// unavailable): it is sent by the next reconcile.
    pub(super) fn register_pending<R: Rng + ?Sized>(
        &mut self,
        call: CallId,
        registration: ValidRegistration,
        now_ms: u64,
        rng: &mut R,
        out: &mut Vec<Output>,
    ) {
        let id = registration.instance_id.clone();
        self.put_local(registration, None, now_ms, rng);
        self.save(Then::Reply(call, Ok(register_pending(id))), out);
    }

    /// A local registration, serving, checked from now.
    pub(super) fn put_local<R: Rng + ?Sized>(
        &mut self,
        registration: ValidRegistration,
        generation: Option<Generation>,
        now_ms: u64,
        rng: &mut R,
    ) {
        self.health.watch(&registration, generation, now_ms, rng);
        self.health.desired.remove(&registration.instance_id);
        self.following.republish(registration.service.clone());
        self.writes.regs.put(LocalInstance {
            registration,
            committed: generation.is_some(),
            generation,
            intent: Intent::Serve,
        });
    }

    /// Saves the registrations, then does `then`.
    pub(super) fn save(&mut self, then: Then, out: &mut Vec<Output>) {
        let w = &mut self.writes;
        w.next_save += 1;
        let save = w.next_save;
        w.saves.insert(save, then);
        out.push(Output::SaveRegistrations {
            save,
            bytes: w.regs.encode(),
        });
    }

    /// Saves the registrations with nothing to do after.
    pub(super) fn save_registrations(&mut self, out: &mut Vec<Output>) {
        self.save(Then::Nothing, out);
    }

    /// A save of the registrations file ended.
    pub(super) fn saved(
        &mut self,
        save: SaveId,
        result: Result<(), String>,
        out: &mut Vec<Output>,
    ) {
        let then = self.writes.saves.remove(&save).unwrap_or(Then::Nothing);
        self.then(then, result, out);
    }

    fn then(&mut self, then: Then, result: Result<(), String>, out: &mut Vec<Output>) {
        if let Err(e) = &result {
            tracing::error!(error = %e, "saving registrations failed");
        }
        match (then, result) {
            (Then::Nothing, _) => {}
            (Then::Reply(call, answer), Ok(())) => reply(out, call, answer),
            (Then::Reply(call, _), Err(e))
            | (
                Then::Send {
                    call: Some(call), ..
                },
                Err(e),
            ) => {
                let e = Refusal::new(
                    Refused::Unavailable,
                    format!("saving the registration failed: {e}"),
                );
                reply(out, call, Err(e))
            }
            (Then::Send { call: None, .. }, Err(_)) => {}
            (
                Then::Send {
                    call,
                    instance,
                    intent,
                    generation,
                    propagated,
                },
                Ok(()),
            ) => {
                let sent = generation.is_some_and(|generation| {
                    let Some(body) = intent_request(&instance, intent, generation) else {
                        return false;
                    };
                    let purpose = Purpose::Write(WriteRequest::Intent {
                        call,
                        instance,
                        intent,
                        generation,
                        propagated,
                    });
                    self.link.request(body, purpose, out)
                });
                if let (false, Some(call)) = (sent, call) {
                    reply(out, call, Ok(pending_intent(intent)));
                }
            }
        }
    }

    /// Records the intent of a local instance (effective in this agent's
    /// own data plane at once), saves it, then does `then`.
    fn set_intent(&mut self, id: &InstanceId, intent: Intent, then: Then, out: &mut Vec<Output>) {
        if intent != Intent::Serve {
            self.health.stop(id);
        }
        match self.writes.regs.get_mut(id) {
            Some(local) => {
                local.intent = intent;
                local.committed = false;
                self.following.republish(local.registration.service.clone());
                self.save(then, out);
            }
            None => self.then(then, Ok(()), out),
        }
    }

    /// The arbiter refused an intent: the instance serves as before.
    pub(super) fn undo_intent(&mut self, id: &InstanceId, out: &mut Vec<Output>) {
        if let Some(local) = self.writes.regs.get_mut(id) {
            local.intent = Intent::Serve;
            local.committed = true;
            self.following.republish(local.registration.service.clone());
        }
        self.save(Then::Nothing, out);
    }

    /// An intent committed, on either path: a drain opens its window; a
    /// departure forgets the local registration. The caller saves.
    pub(super) fn intent_committed(
        &mut self,
        id: &InstanceId,
        intent: Intent,
        generation: Generation,
        now_ms: u64,
    ) {
        match intent {
            Intent::Serve => {}
            Intent::Drain => {
                if let Some(local) = self.writes.regs.get_mut(id) {
                    local.committed = true;
                }
                let closes = now_ms + self.settings.config.drain.max_drain_ms;
                self.writes
                    .open_drain_window(id.clone(), generation, closes);
            }
            Intent::Leave => self.forget_local(id),
        }
    }

    /// Drops a local registration (saved by the caller).
    pub(super) fn forget_local(&mut self, id: &InstanceId) {
        if let Some(local) = self.writes.regs.remove(id) {
            self.following.republish(local.registration.service);
        }
        self.health.checkers.remove(id);
    }

    /// The drain sequence after its commit: the instance's open
    /// connections may finish for `max_drain_ms`, then it is deregistered
    /// (unless it was re-registered or deregistered meanwhile). The whole
    /// window is always given: this agent sees only its own proxies'
    /// connections, not those of callers on other nodes.
    pub(super) fn drain_window_over(
        &mut self,
        id: InstanceId,
        generation: Generation,
        out: &mut Vec<Output>,
    ) {
        let still_draining = self
            .writes
            .regs
            .get(&id)
            .is_some_and(|l| l.intent == Intent::Drain && l.generation == Some(generation));
        if !still_draining {
            return;
        }
        tracing::info!(instance = %id, "drain window over; deregistering");
        let then = Then::Send {
            call: None,
            instance: id.clone(),
            intent: Intent::Leave,
            generation: Some(generation),
            propagated: false,
        };
        self.set_intent(&id, Intent::Leave, then, out);
    }
}

/// The pending answer of a drain or deregistration.
pub(super) fn pending_intent(intent: Intent) -> Reply {
    match intent {
        Intent::Drain => drain_pending(),
        Intent::Serve | Intent::Leave => deregister_pending(),
    }
}
