//! The rules a session's requests are held to (R10), from the arbiter's
//! config: who may hold which node's lease, write which instance, register
//! which service at which address, and watch which service; and what an
//! authorized request becomes.

use std::net::IpAddr;

use rollcall_config::{
    AddressRule, ArbiterConfig, ControllerGrant, NodeZone, RegistrationConfig, RegistrationRule,
    WatchRule, ZoneRule,
};

use crate::catalog::Catalog;
use crate::command::Command;
use crate::endpoint::{Role, State};
use crate::identity::Identity;
use crate::ids::{AgentEpoch, Revision};
use crate::name::{InstanceId, Label, NodeId, PrincipalName, ServiceKey};
use crate::protocol::{RejectKind, Request, Response};

use super::clip_list;

/// What the rules read of the arbiter's config.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The region this arbiter serves.
    pub region: Label,
    /// `[[controllers]]`.
    pub controllers: Vec<ControllerGrant>,
    /// `[[watch_rules]]`.
    pub watch_rules: Vec<WatchRule>,
    /// `[registration]`.
    pub registration: RegistrationConfig,
    /// `[[registration_rules]]`.
    pub registration_rules: Vec<RegistrationRule>,
    /// `[[node_zones]]`.
    pub node_zones: Vec<NodeZone>,
}

impl Rules {
    /// The rules of `config`; `region` is its validated region.
    pub fn new(config: &ArbiterConfig, region: Label) -> Rules {
        Rules {
            region,
            controllers: config.controllers.clone(),
            watch_rules: config.watch_rules.clone(),
            registration: config.registration.clone(),
            registration_rules: config.registration_rules.clone(),
            node_zones: config.node_zones.clone(),
        }
    }

    /// The `[[node_zones]]` entry that binds `node`, if any (the first that
    /// names it).
    pub fn bound_zone(&self, node: &NodeId) -> Option<&NodeZone> {
        self.node_zones
            .iter()
            .find(|z| z.nodes.iter().any(|p| p.matches(node.as_str())))
    }

    /// Whether `node`'s Hello may declare `zone`: a node a `[[node_zones]]`
    /// entry names is in that zone; others are where they say, unless
    /// `registration.zones = "bound"`.
    pub fn may_declare_zone(&self, node: &NodeId, zone: &Label) -> Result<(), String> {
        match self.bound_zone(node) {
            Some(bound) if bound.zone != zone.as_str() => Err(format!(
                "node {node} is in zone {} by the arbiter's [[node_zones]], but its Hello declares zone {zone}: set the agent's zone to {}",
                bound.zone, bound.zone
            )),
            Some(_) => Ok(()),
            None if self.registration.zones == ZoneRule::Bound => Err(format!(
                "node {node} is named by no [[node_zones]] entry and registration.zones = \"bound\": add it to the entry of its zone"
            )),
            None => Ok(()),
        }
    }

    /// Whether `node`'s agent may ask for `weight` (its `[[node_zones]]`
    /// entry's `max_weight`).
    pub fn may_weigh(&self, node: &NodeId, weight: u32) -> Result<(), String> {
        match self.bound_zone(node) {
            Some(bound) if bound.max_weight.is_some_and(|max| weight > max) => Err(format!(
                "weight {weight} is above node {node}'s max_weight {} ([[node_zones]] of zone {})",
                bound.max_weight.unwrap_or_default(),
                bound.zone
            )),
            _ => Ok(()),
        }
    }
}

/// What an authorized request is.
#[derive(Clone, Debug, PartialEq)]
pub enum Authorized {
    /// A command to propose.
    Command(Command),
    /// A gossip down report (the leader memory holds it for the second
    /// signal).
    Down {
        /// The reporting node.
        reporter: NodeId,
        /// The node reported down.
        node: NodeId,
        /// The agent run the reporter saw.
        epoch: AgentEpoch,
    },
    /// The records on the caller's node.
    List(NodeId),
    /// The region's services the caller's node may watch.
    Services(NodeId),
    /// Wait until the subscribers of `service` acknowledged `revision`.
    Await {
        /// The service.
        service: ServiceKey,
        /// The revision.
        revision: Revision,
        /// How long to wait at most, ms (capped at 30 s).
        timeout_ms: u64,
    },
}

pub(super) fn forbidden(message: String) -> Response {
    Response::Rejected {
        kind: RejectKind::Forbidden,
        message,
    }
}

/// Whether `reporter` may report `node` down: only a node of its zone
/// (gossip runs inside a zone, so nothing else can have seen it go), by
/// the zones their leases were granted in, which `[[node_zones]]` binds
/// (R10). A node without a lease is left to the catalog to refuse.
fn may_report(catalog: &Catalog, reporter: &NodeId, node: &NodeId) -> Result<(), Response> {
    let zone = |n: &NodeId| catalog.leases().get(n).map(|l| l.zone.clone());
    let (Some(theirs), Some(mine)) = (zone(node), zone(reporter)) else {
        return Ok(());
    };
    if theirs == mine {
        return Ok(());
    }
    Err(forbidden(format!(
        "node {reporter} is in zone {mine} and may not report node {node} of zone {theirs} down: only a node of its own zone may (gossip runs inside a zone)"
    )))
}

impl Rules {
    /// Whether `identity` may hold `node`'s lease (a `Hello`).
    pub fn may_hold_lease(&self, identity: &Identity, node: &NodeId) -> Result<(), String> {
        if identity.region != self.region {
            return Err(format!(
                "certificate is for region {}, this arbiter serves region {}",
                identity.region, self.region
            ));
        }
        if identity.principal.role != Role::Agent {
            return Err(format!(
                "a {} certificate cannot hold a node lease; use an agent certificate",
                identity.principal.role.as_str()
            ));
        }
        if identity.principal.name.as_str() != node.as_str() {
            return Err(format!("certificate names node {}, not {node}: an agent may hold only its own node's lease", identity.principal.name));
        }
        Ok(())
    }

    /// Whether `node`'s agent may watch `service` (`[[watch_rules]]`:
    /// nodes no rule names may watch everything).
    pub fn may_watch(&self, node: &NodeId, service: &ServiceKey) -> Result<(), String> {
        let rules: Vec<_> = self
            .watch_rules
            .iter()
            .filter(|r| r.nodes.iter().any(|n| n == node.as_str()))
            .collect();
        if rules.is_empty() {
            return Ok(());
        }
        let allowed = rules.iter().flat_map(|r| &r.services).any(|p| {
            p.matches(
                service.namespace.as_str(),
                service.service.as_str(),
                service.port_name.as_str(),
            )
        });
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "node {node} may not watch {service} (arbiter watch_rules)"
            ))
        }
    }

    /// Whether `node`'s agent (the node's lease in `zone`, its declared
    /// addresses `declared`) may register an instance of `service` at
    /// `address` (`[[registration_rules]]` and `[registration]`).
    pub fn may_register(
        &self,
        node: &NodeId,
        zone: Option<&str>,
        service: &ServiceKey,
        address: IpAddr,
        declared: &[IpAddr],
    ) -> Result<(), String> {
        let (namespace, name, port) = (
            service.namespace.as_str(),
            service.service.as_str(),
            service.port_name.as_str(),
        );
        let applying: Vec<&RegistrationRule> = self
            .registration_rules
            .iter()
            .filter(|r| r.applies_to(node.as_str(), zone))
            .collect();
        let listing: Vec<&RegistrationRule> = applying
            .iter()
            .copied()
            .filter(|r| r.lists(namespace, name, port))
            .collect();
        if !applying.is_empty() && listing.is_empty() {
            let allowed: Vec<String> = applying
                .iter()
                .flat_map(|r| &r.services)
                .map(ToString::to_string)
                .collect();
            return Err(format!(
                "node {node} may not register {service} (arbiter registration_rules allow it only {})",
                clip_list(&allowed)
            ));
        }
        let any = self.registration.addresses == AddressRule::Any
            || listing.iter().any(|r| r.any_address);
        if any || declared.contains(&address) {
            return Ok(());
        }
        Err(if declared.is_empty() {
            format!(
                "address {address} is not an address of node {node}: the node declared none; issue its certificate with `rollcall certs --agent {node}=ADDR`, set the agent's advertise_addresses, or let the arbiter allow any (registration.addresses = \"any\")"
            )
        } else {
            let list: Vec<String> = declared.iter().map(ToString::to_string).collect();
            format!(
                "address {address} is not one of node {node}'s declared addresses ({}); register one of them, or let the arbiter allow any (registration.addresses = \"any\", or any_address in a registration rule)",
                clip_list(&list)
            )
        })
    }

    pub(super) fn controller_may_write(&self, name: &PrincipalName, service: &ServiceKey) -> bool {
        self.controllers
            .iter()
            .filter(|c| c.name == name.as_str())
            .flat_map(|c| &c.services)
            .any(|p| {
                p.matches(
                    service.namespace.as_str(),
                    service.service.as_str(),
                    service.port_name.as_str(),
                )
            })
    }

    /// Checks that `identity` (holding `session`, a node's lease, if any)
    /// may make `request`, and says what it is (R10). Agents write only
    /// their own node's instances; controllers only the services their
    /// grant names; only an agent with a session may list its node's
    /// records, report a down verdict or leave.
    /// `declared` are the addresses the agent's node declared (its
    /// session's); registration rules bind agents only.
    pub fn authorize(
        &self,
        identity: &Identity,
        session: Option<&(NodeId, AgentEpoch)>,
        declared: &[IpAddr],
        request: Request,
        catalog: &Catalog,
    ) -> Result<Authorized, Response> {
        if identity.region != self.region {
            return Err(forbidden(format!(
                "certificate is for region {}, this arbiter serves region {}",
                identity.region, self.region
            )));
        }
        let role = identity.principal.role;
        let name = &identity.principal.name;
        let owner_check = |node: &NodeId, service: &ServiceKey| -> Result<(), Response> {
            match role {
                Role::Agent if node.as_str() == name.as_str() => Ok(()),
                Role::Agent => Err(forbidden(format!("agent {name} may write only instances on its own node, not on {node}"))),
                Role::Controller if self.controller_may_write(name, service) => Ok(()),
                Role::Controller => Err(forbidden(format!("controller {name} has no grant for service {service} (arbiter [[controllers]])"))),
                other => Err(forbidden(format!("a {} certificate cannot write instances", other.as_str()))),
            }
        };
        let existing = |id: &InstanceId| -> Result<(), Response> {
            match (catalog.instance(id), catalog.service_of(id)) {
                (Some(r), Some(key)) => owner_check(&r.node_id, key),
                _ => Err(Response::Rejected {
                    kind: RejectKind::NotFound,
                    message: format!("instance {id} is not registered"),
                }),
            }
        };
        let agent_session = || match (role, session) {
            (Role::Agent, Some((node, _))) => Some(node.clone()),
            _ => None,
        };
        match request {
            Request::Register(reg) => {
                owner_check(&reg.node, &reg.service)?;
                if role == Role::Agent {
                    let zone = catalog.leases().get(&reg.node).map(|l| l.zone.as_str());
                    self.may_register(&reg.node, zone, &reg.service, reg.address, declared)
                        .map_err(forbidden)?;
                    self.may_weigh(&reg.node, reg.weight.get())
                        .map_err(forbidden)?;
                }
                // An instance id never moves between services, and belongs
                // to the node that holds it: a live record under another
                // service, or on another node, must be deregistered (by its
                // owner or an operator) or expire first. Checked here,
                // against what is applied, not in `apply`, so logs written
                // before stay replayable.
                if let (Some(record), Some(held)) = (
                    catalog.instance(&reg.instance_id),
                    catalog.service_of(&reg.instance_id),
                ) {
                    if record.node_id != reg.node && record.state != State::Expired {
                        return Err(forbidden(format!(
                            "instance {} is held by node {} ({}, generation {}): an instance id belongs to the node that holds it until that node deregisters it, it expires, or an operator frees it (rollcall instance free {})",
                            reg.instance_id,
                            record.node_id,
                            record.state.as_str(),
                            record.generation,
                            reg.instance_id,
                        )));
                    }
                    if held != &reg.service && record.state != State::Expired {
                        return Err(Response::Rejected {
                            kind: RejectKind::Invalid,
                            message: format!(
                                "instance {} is registered under service {held} ({}); deregister it first, or use another instance id (an instance id never moves between services)",
                                reg.instance_id,
                                record.state.as_str()
                            ),
                        });
                    }
                }
                Ok(Authorized::Command(Command::Register(reg)))
            }
            Request::Transition {
                instance_id,
                generation,
                to,
                reason,
            } => {
                existing(&instance_id)?;
                Ok(Authorized::Command(Command::Transition {
                    instance_id,
                    generation,
                    to,
                    reason,
                }))
            }
            Request::SetLiveness {
                instance_id,
                generation,
                liveness,
            } => {
                existing(&instance_id)?;
                Ok(Authorized::Command(Command::SetLiveness {
                    instance_id,
                    generation,
                    liveness,
                }))
            }
            Request::Deregister {
                instance_id,
                generation,
            } => {
                existing(&instance_id)?;
                Ok(Authorized::Command(Command::Deregister {
                    instance_id,
                    generation,
                }))
            }
            Request::Leave { epoch } => match agent_session() {
                Some(node) => Ok(Authorized::Command(Command::RevokeLease { node, epoch })),
                None => Err(forbidden("only an agent with a session can leave".into())),
            },
            Request::ReportDown { node, epoch } => match agent_session() {
                Some(reporter) => {
                    may_report(catalog, &reporter, &node)?;
                    Ok(Authorized::Down {
                        reporter,
                        node,
                        epoch,
                    })
                }
                None => Err(forbidden(
                    "only an agent with a session can report a down verdict".into(),
                )),
            },
            Request::NodeInstances => match agent_session() {
                Some(node) => Ok(Authorized::List(node)),
                None => Err(forbidden(
                    "only an agent with a session can list its node's records".into(),
                )),
            },
            Request::Services => match agent_session() {
                Some(node) => Ok(Authorized::Services(node)),
                None => Err(forbidden(
                    "only an agent with a session can list the region's services".into(),
                )),
            },
            Request::AwaitPropagation {
                service,
                revision,
                timeout_ms,
            } => Ok(Authorized::Await {
                service,
                revision,
                timeout_ms: timeout_ms.min(30_000),
            }),
        }
    }
}
