//! Reconciliation (R7): after a (re)connect, or a write refused as
//! unavailable, one plan replays what is pending and brings the catalog's
//! records on this node in line with the local registrations: the
//! catalog's list first, then one step at a time, each sending at most one
//! request and waiting for its answer. One plan at a time; a trigger
//! during one runs another after it.
//!
//! The requests are the same ones the live path sends
//! ([`super::requests`]).

use std::collections::VecDeque;

use rollcall_leases::protocol::{NodeInstance, RejectKind, Request, Response};
use rollcall_leases::{AgentEpoch, Generation, InstanceId, NodeId, Role, State};

use super::requests::{intent_request, register_request};
use super::{AgentState, Output, Purpose, Verdict};
use crate::registrations::Intent;

/// The plan's requests.
#[derive(Clone, Debug)]
pub(crate) enum PlanRequest {
    /// The catalog's records on this node.
    List,
    /// A local registration the catalog lacks (pending, or gone).
    Register { instance: InstanceId },
    /// The drain or deregistration a local instance still wants.
    Intent {
        instance: InstanceId,
        intent: Intent,
        generation: Generation,
    },
    /// A record of this node no local registration backs.
    Stale,
}

/// The steps of the plan, in order.
#[derive(Clone, Debug)]
enum Step {
    /// Compare a local instance with the catalog.
    Local(InstanceId),
    /// Send the intent of a local instance.
    Intent(InstanceId),
    /// Queue the health verdicts the catalog does not hold.
    Health,
    /// Send a desired state.
    Desired(InstanceId),
    /// Report held down verdicts.
    Downs,
    /// Report one down verdict.
    Down(NodeId, AgentEpoch),
    /// Deregister records no local registration backs.
    StaleRecords,
    /// Deregister one.
    Deregister(InstanceId, Generation),
}

/// One run: the catalog's list, then the steps.
#[derive(Clone, Debug, Default)]
struct Plan {
    listed: Vec<NodeInstance>,
    steps: VecDeque<Step>,
}

/// The plan running, if any.
#[derive(Default)]
pub(super) struct Reconcile {
    plan: Option<Plan>,
    /// A plan is due again once the current one ends.
    again: bool,
}

impl Reconcile {
    /// The session ended: the next one starts a plan of its own.
    pub(super) fn stop(&mut self) {
        self.plan = None;
        self.again = false;
    }

    fn push_front(&mut self, steps: impl DoubleEndedIterator<Item = Step>) {
        if let Some(plan) = self.plan.as_mut() {
            for step in steps.rev() {
                plan.steps.push_front(step);
            }
        }
    }

    fn listed(&self) -> &[NodeInstance] {
        self.plan.as_ref().map_or(&[], |p| &p.listed)
    }
}

impl AgentState {
    /// Starts a plan (or asks for another after the current one).
    pub(super) fn start_plan(&mut self, out: &mut Vec<Output>) {
        if self.reconcile.plan.is_some() {
            self.reconcile.again = true;
            return;
        }
        let purpose = Purpose::Plan(PlanRequest::List);
        if self.link.request(Request::NodeInstances, purpose, out) {
            self.reconcile.plan = Some(Plan::default());
        }
    }

    pub(super) fn plan_answer(
        &mut self,
        step: PlanRequest,
        result: Result<Response, String>,
        now_ms: u64,
        out: &mut Vec<Output>,
    ) {
        let ok = match step {
            PlanRequest::List => match result {
                Ok(Response::Instances(listed)) => {
                    let steps = self
                        .writes
                        .regs
                        .iter()
                        .map(|l| Step::Local(l.registration.instance_id.clone()))
                        .chain([Step::Health, Step::Downs, Step::StaleRecords])
                        .collect();
                    if let Some(plan) = self.reconcile.plan.as_mut() {
                        plan.listed = listed;
                        plan.steps = steps;
                    }
                    true
                }
                Ok(other) => {
                    tracing::warn!(answer = ?other, "no list of this node's records; reconciliation skipped");
                    false
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciliation interrupted");
                    false
                }
            },
            PlanRequest::Register { instance } => match Verdict::of(result) {
                Verdict::Committed {
                    generation: Some(g),
                    ..
                } => {
                    if let Some(l) = self.writes.regs.get_mut(&instance) {
                        l.generation = Some(g);
                        l.committed = l.intent == Intent::Serve;
                    }
                    self.health
                        .checkers
                        .update(&instance, |tag, _| *tag = Some(g));
                    self.save_registrations(out);
                    self.reconcile
                        .push_front([Step::Intent(instance)].into_iter());
                    true
                }
                Verdict::Refused(_, message) => {
                    tracing::error!(instance = %instance, reason = %message, "the arbiter refused a pending registration; dropping it");
                    self.forget_local(&instance);
                    self.save_registrations(out);
                    true
                }
                Verdict::Committed { .. } | Verdict::Unknown(_) => {
                    tracing::warn!(instance = %instance, "reconciliation interrupted: the pending registration was not committed");
                    false
                }
            },
            PlanRequest::Intent {
                instance,
                intent,
                generation,
            } => {
                match Verdict::of(result) {
                    Verdict::Committed { .. } => {
                        self.intent_committed(&instance, intent, generation, now_ms)
                    }
                    // The catalog no longer holds this generation.
                    Verdict::Refused(RejectKind::NotFound | RejectKind::StaleGeneration, _) => {
                        self.forget_local(&instance)
                    }
                    Verdict::Refused(_, message) => {
                        tracing::warn!(instance = %instance, reason = %message, "a pending write was refused")
                    }
                    Verdict::Unknown(e) => {
                        tracing::warn!(error = %e, "reconciliation interrupted");
                        return self.plan_step_done(false, out);
                    }
                }
                self.save_registrations(out);
                true
            }
            PlanRequest::Stale => match Verdict::of(result) {
                Verdict::Committed { .. } | Verdict::Refused(..) => true,
                Verdict::Unknown(e) => {
                    tracing::warn!(error = %e, "reconciliation interrupted");
                    false
                }
            },
        };
        self.plan_step_done(ok, out);
    }

    /// The plan's request was answered: go on with the next step, or end
    /// the plan when it failed.
    pub(super) fn plan_step_done(&mut self, ok: bool, out: &mut Vec<Output>) {
        if self.reconcile.plan.is_none() {
            return;
        }
        if ok {
            self.run_plan(out);
        } else {
            self.end_plan(out);
        }
    }

    fn end_plan(&mut self, out: &mut Vec<Output>) {
        self.reconcile.plan = None;
        if std::mem::take(&mut self.reconcile.again) {
            self.start_plan(out);
        }
    }

    /// Runs steps until one sends a request, or the plan ends.
    fn run_plan(&mut self, out: &mut Vec<Output>) {
        loop {
            let Some(plan) = self.reconcile.plan.as_mut() else {
                return;
            };
            let Some(step) = plan.steps.pop_front() else {
                return self.end_plan(out);
            };
            let sent = match step {
                Step::Local(id) => self.plan_local(&id, out),
                Step::Intent(id) => self.plan_intent(&id, out),
                Step::Health => {
                    self.health.resend_after(self.reconcile.listed());
                    let ids: Vec<InstanceId> = self.health.desired.keys().cloned().collect();
                    self.reconcile
                        .push_front(ids.into_iter().map(Step::Desired));
                    false
                }
                Step::Desired(id) => self.push_desired(&id, true, out),
                Step::Downs => {
                    let downs = self.peers.downs.to_report();
                    self.reconcile
                        .push_front(downs.into_iter().map(|(n, e)| Step::Down(n, e)));
                    false
                }
                Step::Down(node, epoch) => self.report_down(node, epoch, true, out),
                Step::StaleRecords => {
                    let stale: Vec<Step> = self
                        .reconcile
                        .listed()
                        .iter()
                        .filter(|l| {
                            l.origin == Role::Agent
                                && l.state != State::Expired
                                && self.writes.regs.get(&l.instance_id).is_none()
                        })
                        .map(|l| Step::Deregister(l.instance_id.clone(), l.generation))
                        .collect();
                    self.reconcile.push_front(stale.into_iter());
                    false
                }
                Step::Deregister(id, generation) => {
                    tracing::warn!(instance = %id, "deregistering a record this agent has no local registration of");
                    let body = intent_request(&id, Intent::Leave, generation)
                        .expect("leaving always has a request");
                    self.link
                        .request(body, Purpose::Plan(PlanRequest::Stale), out)
                }
            };
            if sent {
                return;
            }
        }
    }

    /// Compares a local instance with the catalog's record of it.
    fn plan_local(&mut self, id: &InstanceId, out: &mut Vec<Output>) -> bool {
        let Some(local) = self.writes.regs.get(id).cloned() else {
            return false;
        };
        let in_catalog = self
            .reconcile
            .listed()
            .iter()
            .find(|l| &l.instance_id == id && l.state != State::Expired)
            .cloned();
        match (local.generation, in_catalog) {
            (Some(g), Some(c)) if c.generation == g => {
                if !local.committed {
                    return self.plan_intent(id, out);
                }
                if local.intent == Intent::Serve
                    && local.registration.checks.is_none()
                    && c.state == State::Unhealthy
                    && c.reason.as_str().starts_with("node down")
                {
                    // A down verdict marked it while this node was away;
                    // without checks it serves while the node's lease holds.
                    self.want(
                        id,
                        State::Ready,
                        "node back: its agent holds the lease again",
                        out,
                    );
                }
                false
            }
            (Some(g), Some(c)) => {
                tracing::warn!(instance = %id, local = %g, catalog = %c.generation, "the catalog holds a newer registration of this instance; dropping the local one");
                self.forget_local(id);
                self.save_registrations(out);
                false
            }
            (Some(_), None) if local.intent != Intent::Serve => {
                self.forget_local(id);
                self.save_registrations(out);
                false
            }
            _ => {
                let body = register_request(&self.settings, &local.registration);
                let purpose = Purpose::Plan(PlanRequest::Register {
                    instance: id.clone(),
                });
                self.link.request(body, purpose, out)
            }
        }
    }

    /// Sends the drain or deregistration a local instance still wants.
    fn plan_intent(&mut self, id: &InstanceId, out: &mut Vec<Output>) -> bool {
        let Some(local) = self.writes.regs.get(id) else {
            return false;
        };
        let (intent, Some(generation)) = (local.intent, local.generation) else {
            return false;
        };
        let Some(body) = intent_request(id, intent, generation) else {
            return false;
        };
        let purpose = Purpose::Plan(PlanRequest::Intent {
            instance: id.clone(),
            intent,
            generation,
        });
        self.link.request(body, purpose, out)
    }
}
