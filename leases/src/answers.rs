//! What the arbiter answers an agent's request, from the catalog: the
//! response to a decided command, and the list of a node's records. Pure:
//! the replica machine and the fleet simulator both answer with these.

use crate::catalog::{Applied, Catalog, Effect, Rejection};
use crate::command::{Command, Envelope};
use crate::name::{NodeId, ServiceKey};
use crate::protocol::{NodeInstance, RejectKind, Response, ServiceCount, MAX_LISTED_SERVICES};

/// The answer to a command decided by the catalog: committed (with the
/// revision, a registration's generation and the instance's state after
/// it) or rejected with the class of refusal.
pub fn response(catalog: &Catalog, env: &Envelope, result: Result<Applied, Rejection>) -> Response {
    match result {
        Ok(applied) => {
            let generation = match applied.effect {
                Effect::Registered { generation, .. } => Some(generation),
                _ => None,
            };
            let instance = match &env.command {
                Command::Register(r) => Some(&r.instance_id),
                Command::Transition { instance_id, .. }
                | Command::SetLiveness { instance_id, .. } => Some(instance_id),
                _ => None,
            };
            let state = instance.and_then(|id| catalog.instance_state(id));
            Response::Committed {
                revision: applied.revision,
                generation,
                state,
            }
        }
        Err(rejection) => Response::Rejected {
            kind: kind_of(&rejection),
            message: rejection.to_string(),
        },
    }
}

/// How a catalog refusal is answered.
pub fn kind_of(rejection: &Rejection) -> RejectKind {
    match rejection {
        Rejection::StaleGeneration { .. } => RejectKind::StaleGeneration,
        Rejection::UnknownInstance { .. }
        | Rejection::UnknownService { .. }
        | Rejection::UnknownPolicy { .. } => RejectKind::NotFound,
        Rejection::NotHomeRegion { .. } | Rejection::HomeHere { .. } => RejectKind::Forbidden,
        _ => RejectKind::Invalid,
    }
}

/// `NodeInstances`: every record on `node`, for its agent's reconcile.
pub fn node_instances(catalog: &Catalog, node: &NodeId) -> Response {
    Response::Instances(
        catalog
            .instances_on(node)
            .into_iter()
            .map(|(service, r)| NodeInstance {
                service,
                instance_id: r.instance_id.clone(),
                generation: r.generation,
                state: r.state,
                reason: r.reason.clone(),
                origin: r.origin.role,
            })
            .collect(),
    )
}

/// `Services`: the services `may_watch` lets the caller see, in key
/// order, at most [`MAX_LISTED_SERVICES`] of them.
pub fn services(catalog: &Catalog, may_watch: impl Fn(&ServiceKey) -> bool) -> Response {
    let mut visible = catalog.services().into_iter().filter(|s| may_watch(s));
    let services: Vec<ServiceCount> = visible
        .by_ref()
        .take(MAX_LISTED_SERVICES)
        .filter_map(|service| {
            let info = catalog.service(&service)?;
            Some(ServiceCount {
                service,
                revision: info.revision,
                ready: u32::try_from(info.ready).unwrap_or(u32::MAX),
                total: u32::try_from(info.records).unwrap_or(u32::MAX),
            })
        })
        .collect();
    Response::Services {
        services,
        revision: catalog.revision(),
        truncated: visible.next().is_some(),
    }
}

/// A refusal the caller should retry (HTTP 503).
pub fn unavailable(message: String) -> Response {
    Response::Rejected {
        kind: RejectKind::Unavailable,
        message,
    }
}
