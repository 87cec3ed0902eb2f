//! Health (R4): the local instances' checkers (when each check is due,
//! what its results mean) and the state each local instance should have in
//! the catalog until the arbiter has it.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use rand::Rng;
use rollcall_leases::protocol::{NodeInstance, Request};
use rollcall_leases::{Generation, InstanceId, Liveness, Reason, State};

use super::checkers::Checkers;
use super::requests::desired_request;
use super::{AgentState, Output, Purpose, Verdict};
use crate::api_types::ValidRegistration;
use crate::health::{HealthEvent, InstanceHealth, Which};
use crate::link::resend_health;
use crate::registrations::Intent;

/// A request about a local instance's health.
#[derive(Clone, Debug)]
pub(crate) enum HealthRequest {
    /// Its desired state.
    Desired {
        instance: InstanceId,
        want: (State, Reason),
        in_plan: bool,
    },
    /// A liveness change.
    Liveness { instance: InstanceId },
}

/// The checkers and the states they want.
#[derive(Default)]
pub(super) struct Health {
    pub(super) checkers: Checkers,
    /// The state and reason each local instance's health (or its session)
    /// wants in the catalog, until the arbiter has it.
    pub(super) desired: BTreeMap<InstanceId, (State, Reason)>,
}

impl Health {
    /// Starts checking a local instance's health (a registration with
    /// checks, at registration or at agent start). Replaces any earlier
    /// checker of the same instance, so results of an old generation's
    /// probes are never counted against the new one.
    pub(super) fn watch<R: Rng + ?Sized>(
        &mut self,
        reg: &ValidRegistration,
        generation: Option<Generation>,
        now_ms: u64,
        rng: &mut R,
    ) {
        let Some(checks) = reg.checks.as_ref() else {
            self.checkers.remove(&reg.instance_id);
            return;
        };
        let target = SocketAddr::new(reg.address, reg.port);
        let health = InstanceHealth::new(Some(checks), target, now_ms, rng);
        self.checkers
            .insert(reg.instance_id.clone(), (generation, health));
    }

    /// Keeps a checker the driver passed warm at start.
    pub(super) fn keep(
        &mut self,
        reg: &ValidRegistration,
        generation: Option<Generation>,
        checker: InstanceHealth,
    ) {
        self.checkers
            .insert(reg.instance_id.clone(), (generation, checker));
    }

    /// A leaving instance's probes no longer move it (DRAINING is one-way).
    pub(super) fn stop(&mut self, id: &InstanceId) {
        self.checkers.remove(id);
        self.desired.remove(id);
    }

    /// A probe's outcome; a result for a checker replaced since is dropped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn probed<R: Rng + ?Sized>(
        &mut self,
        id: &InstanceId,
        generation: Option<Generation>,
        which: Which,
        passed: bool,
        detail: &str,
        now_ms: u64,
        rng: &mut R,
    ) -> Vec<HealthEvent> {
        self.checkers
            .update(id, |g, health| {
                if *g == generation {
                    health.result(which, passed, detail, now_ms, rng)
                } else {
                    Vec::new()
                }
            })
            .unwrap_or_default()
    }

    /// The probes due now, and what the TTL checks that ran out mean.
    pub(super) fn due<R: Rng + ?Sized>(
        &mut self,
        now_ms: u64,
        rng: &mut R,
    ) -> (Vec<Output>, Vec<(InstanceId, HealthEvent)>) {
        let mut probes = Vec::new();
        let mut events = Vec::new();
        for id in self.checkers.due_at(now_ms) {
            let Some((generation, due)) = self.checkers.update(&id, |generation, health| {
                (*generation, health.due(now_ms, rng))
            }) else {
                continue;
            };
            probes.extend(due.probes.into_iter().map(|task| Output::Probe {
                instance: id.clone(),
                generation,
                task,
            }));
            events.extend(due.events.into_iter().map(|e| (id.clone(), e)));
        }
        (probes, events)
    }

    pub(super) fn next_due_ms(&self) -> Option<u64> {
        self.checkers.next_due_ms()
    }

    /// Health verdicts reached while the arbiter was away, or that a down
    /// verdict overwrote (the catalog's records on this node are
    /// `listed`), become desired states.
    pub(super) fn resend_after(&mut self, listed: &[NodeInstance]) {
        let mut wanted = Vec::new();
        for (id, (_, health)) in self.checkers.iter() {
            let current = listed
                .iter()
                .find(|l| &l.instance_id == id)
                .map(|l| l.state);
            let state = health.state();
            if resend_health(state, current, self.desired.contains_key(id)) {
                let reason = bounded_reason(
                    health.reason().unwrap_or("health check verdict"),
                    "health check verdict",
                );
                wanted.push((id.clone(), (state, reason)));
            }
        }
        self.desired.extend(wanted);
    }
}

impl AgentState {
    pub(super) fn health_event(
        &mut self,
        id: &InstanceId,
        event: HealthEvent,
        out: &mut Vec<Output>,
    ) {
        let (state, reason) = match event {
            HealthEvent::Ready => (State::Ready, format!("{} passed", Which::Readiness)),
            HealthEvent::Unhealthy { reason } => (State::Unhealthy, reason),
            HealthEvent::StartupFailing { reason } => {
                tracing::warn!(instance = %id, reason = %reason, "startup check failing");
                return;
            }
            HealthEvent::Liveness(liveness) => {
                tracing::info!(instance = %id, liveness = liveness.as_str(), "liveness changed");
                return self.push_liveness(id, liveness, out);
            }
        };
        tracing::info!(instance = %id, state = state.as_str(), reason = %reason, "health changed");
        self.counters.health_flaps += 1;
        self.want(id, state, &reason, out);
    }

    /// A workload's registration session closed: a serving instance whose
    /// process exited without a drain is unhealthy.
    pub(super) fn workload_session_closed(
        &mut self,
        instance: &InstanceId,
        generation: Option<Generation>,
        out: &mut Vec<Output>,
    ) {
        let still_serving = self
            .writes
            .regs
            .get(instance)
            .is_some_and(|l| l.intent == Intent::Serve && l.generation == generation);
        if still_serving {
            tracing::warn!(instance = %instance, "registration session closed without a drain: process exited");
            self.want(instance, State::Unhealthy, "process exited", out);
        }
    }

    /// Records the state a local instance should have in the catalog and
    /// sends it when connected; the reconcile plan sends what is left
    /// after an outage.
    pub(super) fn want(
        &mut self,
        id: &InstanceId,
        state: State,
        reason: &str,
        out: &mut Vec<Output>,
    ) {
        let reason = bounded_reason(reason, "health check changed");
        self.health.desired.insert(id.clone(), (state, reason));
        let in_flight = self.link.in_flight().any(|p| {
            matches!(p, Purpose::Health(HealthRequest::Desired { instance, .. }) if instance == id)
        });
        if !in_flight {
            self.push_desired(id, false, out);
        }
    }

    /// Sends a local instance's desired state, if any; whether it was sent.
    pub(super) fn push_desired(
        &mut self,
        id: &InstanceId,
        in_plan: bool,
        out: &mut Vec<Output>,
    ) -> bool {
        let Some(want) = self.health.desired.get(id).cloned() else {
            return false;
        };
        let Some(generation) = self
            .writes
            .regs
            .get(id)
            .filter(|l| l.intent == Intent::Serve)
            .and_then(|l| l.generation)
        else {
            return false;
        };
        let body = desired_request(id, generation, &want);
        let purpose = Purpose::Health(HealthRequest::Desired {
            instance: id.clone(),
            want,
            in_plan,
        });
        self.link.request(body, purpose, out)
    }

    fn push_liveness(&mut self, id: &InstanceId, liveness: Liveness, out: &mut Vec<Output>) {
        let Some(generation) = self.writes.regs.get(id).and_then(|l| l.generation) else {
            return;
        };
        let body = Request::SetLiveness {
            instance_id: id.clone(),
            generation,
            liveness,
        };
        let purpose = Purpose::Health(HealthRequest::Liveness {
            instance: id.clone(),
        });
        self.link.request(body, purpose, out);
    }

    /// The arbiter's answer to a health request.
    pub(super) fn health_answered(
        &mut self,
        request: HealthRequest,
        verdict: Verdict,
        out: &mut Vec<Output>,
    ) {
        let (instance, want, in_plan) = match request {
            HealthRequest::Liveness { instance } => {
                if let Verdict::Unknown(e) = verdict {
                    tracing::warn!(instance = %instance, error = %e, "liveness not sent");
                }
                return;
            }
            HealthRequest::Desired {
                instance,
                want,
                in_plan,
            } => (instance, want, in_plan),
        };
        let desired = &mut self.health.desired;
        let ok = match verdict {
            Verdict::Committed { .. } => {
                if desired.get(&instance) == Some(&want) {
                    desired.remove(&instance);
                }
                true
            }
            Verdict::Refused(kind, message) => {
                tracing::warn!(instance = %instance, ?kind, reason = %message, "the arbiter refused a health transition");
                desired.remove(&instance);
                true
            }
            Verdict::Unknown(e) => {
                tracing::warn!(instance = %instance, error = %e, "health change kept until the arbiter is back");
                false
            }
        };
        if in_plan {
            self.plan_step_done(ok, out);
        } else if ok && desired.get(&instance).is_some_and(|w| *w != want) {
            // It changed while this one was in flight.
            self.push_desired(&instance, false, out);
        }
    }
}

/// A reason from free text: cut to the catalog's 256 bytes at a character
/// boundary, control characters dropped; `fallback` if nothing is left.
pub(super) fn bounded_reason(text: &str, fallback: &'static str) -> Reason {
    let mut cut = String::new();
    for c in text.chars().filter(|c| !c.is_control()) {
        if cut.len() + c.len_utf8() > 256 {
            break;
        }
        cut.push(c);
    }
    Reason::new(&cut).unwrap_or_else(|_| Reason::new(fallback).expect("a valid constant"))
}
