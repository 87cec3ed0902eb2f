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

/// How a catalog refusal is answered. A node without a lease, or whose
/// lease the mass-expiry guard holds, is a state its agent's next session
/// ends (it reconnects and is granted a lease): `Unavailable`, so the
/// agent keeps the write and sends it again, rather than dropping a
/// pending registration for a passing state (seen in the fleet bench's
/// deploy, where an agent dropped one).
pub fn kind_of(rejection: &Rejection) -> RejectKind {
    match rejection {
        Rejection::NoLease { .. } | Rejection::LeaseHeld { .. } => RejectKind::Unavailable,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::AgentEpoch;

    #[test]
    fn a_node_without_a_usable_lease_is_answered_unavailable_so_its_agent_keeps_the_write() {
        let node = NodeId::new("n1").unwrap();
        assert_eq!(
            kind_of(&Rejection::NoLease { node: node.clone() }),
            RejectKind::Unavailable
        );
        assert_eq!(
            kind_of(&Rejection::LeaseHeld { node: node.clone() }),
            RejectKind::Unavailable
        );
        // Another run holds the lease: sending again changes nothing.
        let other = Rejection::OtherEpoch {
            node,
            current: AgentEpoch(2),
            given: AgentEpoch(1),
        };
        assert_eq!(kind_of(&other), RejectKind::Invalid);
    }
}
