//! A write another replica forwarded, checked again by the leader before
//! it proposes it (issue 38, item 4): the follower authorized the request
//! against its own copy of the catalog, and the envelope names the actor
//! as the follower wrote it. The leader holds the same rules and the
//! newest catalog, so it checks that the actor's role may propose such a
//! command at all, and that an agent writes only its own node's lease and
//! records, a controller only the services its grant names. A replica is
//! trusted with everything else (an arbiter's own commands, an
//! operator's), as it holds the log anyway.

use crate::catalog::Catalog;
use crate::command::Command;
use crate::endpoint::{Principal, Role, State};
use crate::name::ServiceKey;
use crate::protocol::Response;

use super::rules::forbidden;
use super::Rules;

impl Rules {
    /// Whether `actor` may have proposed `command`, against `catalog` as
    /// the leader holds it; a refusal names the actor, the command and the
    /// rule.
    pub fn may_propose(
        &self,
        actor: &Principal,
        command: &Command,
        catalog: &Catalog,
    ) -> Result<(), Response> {
        let name = actor.name.as_str();
        let refuse = |why: String| {
            Err(forbidden(format!(
                "a forwarded {} by {actor} is refused by the leader: {why}",
                command.kind()
            )))
        };
        // The node and service of the record an instance command names;
        // an unknown instance is the catalog's to refuse.
        let record = |id| {
            catalog
                .instance(id)
                .map(|r| r.node_id.clone())
                .zip(catalog.service_of(id).cloned())
        };
        let written: Option<(String, ServiceKey)> = match command {
            Command::Register(reg) => Some((reg.node.as_str().to_owned(), reg.service.clone())),
            Command::Transition { instance_id, .. }
            | Command::SetLiveness { instance_id, .. }
            | Command::Deregister { instance_id, .. } => match record(instance_id) {
                Some((node, service)) => Some((node.as_str().to_owned(), service)),
                None => return Ok(()),
            },
            _ => None,
        };
        if let (Role::Agent | Role::Controller, Command::Register(reg)) = (actor.role, command) {
            if let Some(held) = catalog.instance(&reg.instance_id) {
                if held.node_id != reg.node && held.state != State::Expired {
                    return refuse(format!(
                        "instance {} is held by node {} ({})",
                        reg.instance_id,
                        held.node_id,
                        held.state.as_str()
                    ));
                }
            }
        }
        match (actor.role, command, written) {
            (Role::Arbiter | Role::Operator, _, _) => Ok(()),
            (
                Role::Agent,
                Command::GrantLease { node, .. } | Command::RevokeLease { node, .. },
                _,
            ) if node.as_str() == name => Ok(()),
            (
                Role::Agent,
                Command::GrantLease { node, .. } | Command::RevokeLease { node, .. },
                _,
            ) => refuse(format!(
                "an agent holds only its own node's lease, not node {node}'s"
            )),
            (Role::Agent, _, Some((node, _))) if node == name => Ok(()),
            (Role::Agent, _, Some((node, _))) => refuse(format!(
                "an agent writes only its own node's records, not node {node}'s"
            )),
            (Role::Controller, _, Some((_, service)))
                if self.controller_may_write(&actor.name, &service) =>
            {
                Ok(())
            }
            (Role::Controller, _, Some((_, service))) => refuse(format!(
                "controller {name} has no grant for service {service} (arbiter [[controllers]])"
            )),
            (
                Role::Bridge,
                Command::ReplicatePolicy(_)
                | Command::DropReplicatedPolicy { .. }
                | Command::ReplicateWriter(_),
                _,
            ) => Ok(()),
            (role, _, _) => refuse(format!("the {} role may not propose it", role.as_str())),
        }
    }
}
