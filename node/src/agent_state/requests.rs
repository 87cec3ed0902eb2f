//! Every request a local instance's life sends to the arbiter, one
//! function per shape. The live path (a call, a drain window that ends,
//! a health verdict) and the replay after a reconnect
//! ([`super::reconcile`]) build their requests here, so the arbiter sees
//! the same request whichever path sent it.

use rollcall_leases::protocol::Request;
use rollcall_leases::{Generation, InstanceId, Reason, Registration, State};

use super::Settings;
use crate::api_types::ValidRegistration;
use crate::registrations::Intent;

/// The request that carries a local instance's intent to the arbiter,
/// whichever path sends it; `None` for serving, which needs none.
pub(super) fn intent_request(
    instance: &InstanceId,
    intent: Intent,
    generation: Generation,
) -> Option<Request> {
    match intent {
        Intent::Serve => None,
        Intent::Drain => Some(Request::Transition {
            instance_id: instance.clone(),
            generation,
            to: State::Draining,
            reason: Reason::new("drain requested through the agent API").expect("a valid constant"),
        }),
        Intent::Leave => Some(Request::Deregister {
            instance_id: instance.clone(),
            generation,
        }),
    }
}

/// The catalog registration of a local one, on either path.
pub(super) fn register_request(settings: &Settings, r: &ValidRegistration) -> Request {
    Request::Register(Registration {
        instance_id: r.instance_id.clone(),
        service: r.service.clone(),
        node: settings.node.clone(),
        epoch: settings.epoch,
        address: r.address,
        port: r.port,
        zone: r.zone.clone(),
        version: r.version.clone(),
        weight: r.weight,
        labels: r.labels.clone(),
        // With checks an instance starts STARTING and becomes READY when
        // they pass; without, it is READY while the node's lease holds.
        initial: if r.checks.is_some() {
            State::Starting
        } else {
            State::Ready
        },
    })
}

/// The state a local instance's health (or its session) wants in the
/// catalog.
pub(super) fn desired_request(
    instance: &InstanceId,
    generation: Generation,
    (to, reason): &(State, Reason),
) -> Request {
    Request::Transition {
        instance_id: instance.clone(),
        generation,
        to: *to,
        reason: reason.clone(),
    }
}
