//! The arbiter's session layer (R10), sans-IO: per connection (an agent,
//! a controller, a bridge), what each session message and each request
//! means — a lease to grant or a session to refuse (with the reason), a
//! watch to start or deny, a renewal, an acknowledgement, a command to
//! propose, a down report for the leader memory — and what a settled down
//! report answers. The replica machine and the fleet simulator both decide
//! with `Sessions`; neither keeps a copy.
//!
//! It reads the applied catalog (to find an instance's node and service)
//! and the arbiter's config; time comes in as an argument; it never reads
//! a clock or a socket.

use std::collections::HashMap;
use std::net::IpAddr;

use rollcall_config::{
    AddressRule, ArbiterConfig, ControllerGrant, RegistrationConfig, RegistrationRule, WatchRule,
};

use crate::catalog::Catalog;
use crate::command::{Command, Envelope};
use crate::endpoint::{Principal, Role, State};
use crate::identity::Identity;
use crate::ids::{AgentEpoch, AgentId, Revision, ShardId};
use crate::leader::Verdict;
use crate::name::{InstanceId, Label, NodeId, PrincipalName, ServiceKey};
use crate::protocol::{RejectKind, Request, Response, SessionUp, MAX_DECLARED_ADDRESSES};

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

fn forbidden(message: String) -> Response {
    Response::Rejected {
        kind: RejectKind::Forbidden,
        message,
    }
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

    fn controller_may_write(&self, name: &PrincipalName, service: &ServiceKey) -> bool {
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
                Some(reporter) => Ok(Authorized::Down {
                    reporter,
                    node,
                    epoch,
                }),
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

/// Checks the addresses a Hello declares: at most
/// [`MAX_DECLARED_ADDRESSES`], and each one of the certificate's IP SANs
/// when it has any (the certificate is what the CA vouched for).
fn declared_addresses(certified: &[IpAddr], hello: &[IpAddr]) -> Result<(), String> {
    if hello.len() > MAX_DECLARED_ADDRESSES {
        return Err(format!(
            "Hello declares {} addresses; at most {MAX_DECLARED_ADDRESSES} (set the agent's advertise_addresses)",
            hello.len()
        ));
    }
    if certified.is_empty() {
        return Ok(());
    }
    match hello.iter().find(|a| !certified.contains(a)) {
        Some(stray) => {
            let list: Vec<String> = certified.iter().map(ToString::to_string).collect();
            Err(format!(
                "Hello declares address {stray}, which the certificate does not name (its IP SANs: {}); reissue the certificate with `rollcall certs --agent NODE=ADDR,...` or correct advertise_addresses",
                clip_list(&list)
            ))
        }
        None => Ok(()),
    }
}

/// A list for an error message: comma-separated, the first eight.
fn clip_list(items: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut text = items[..items.len().min(SHOWN)].join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    text
}

/// What the driver does for one session message.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Propose this lease grant; answer `Welcome` once it committed. A node
    /// holds one session per replica: the sessions in `replaced` (the same
    /// node's earlier ones, already forgotten here) are closed with the
    /// reason.
    Grant {
        /// The grant to propose.
        envelope: Envelope,
        /// Earlier sessions of the node, with the reason to close each.
        replaced: Vec<(AgentId, String)>,
    },
    /// Send `Refused` with the reason, then close the connection.
    Refuse(String),
    /// Close the connection with the reason.
    Close(String),
    /// Answer the subscription with `Denied`.
    Deny {
        /// The service.
        service: ServiceKey,
        /// Why.
        reason: String,
    },
    /// Start distributing the service (its policy goes ahead of it).
    Subscribe {
        /// The service.
        service: ServiceKey,
        /// The revision the agent holds.
        have: Option<Revision>,
    },
    /// Stop distributing the service.
    Unsubscribe(ServiceKey),
    /// The agent applied the service up to the revision.
    Ack {
        /// The service.
        service: ServiceKey,
        /// The revision.
        revision: Revision,
    },
    /// Renew the node's lease (on the leader; a follower reports it).
    Renew {
        /// The node.
        node: NodeId,
        /// Its agent run.
        epoch: AgentEpoch,
        /// Who renews.
        actor: Principal,
    },
    /// A witness's answer about a silent node (for the leader's memory;
    /// a follower hands it to the leader).
    Witnessed {
        /// The witness: this session's node.
        witness: NodeId,
        /// The silent node.
        node: NodeId,
        /// Its agent run asked about.
        epoch: AgentEpoch,
        /// What the witness sees.
        seen: crate::leader::Seen,
    },
    /// Nothing more (a keep-alive).
    Nothing,
}

/// One connection's session.
#[derive(Clone, Debug)]
struct Session {
    identity: Identity,
    /// Its certificate's IP SANs.
    certified: Vec<IpAddr>,
    /// The addresses its node declared: the certificate's IP SANs, or
    /// where it has none, those its Hello named.
    declared: Vec<IpAddr>,
    /// The lease it holds, once its Hello was accepted.
    held: Option<(NodeId, AgentEpoch)>,
    /// Whether its `Welcome` went out: nothing else may go down the
    /// session stream before it (the agent's handshake reads the Welcome
    /// first and ends the session on anything else).
    welcomed: bool,
}

/// Every connection's session on one replica, and the rules.
#[derive(Debug)]
pub struct Sessions {
    rules: Rules,
    shard: ShardId,
    ttl_ms: u64,
    sessions: HashMap<AgentId, Session>,
}

impl Sessions {
    /// No connection yet; leases are granted for `ttl_ms`, watches are
    /// served for `shard`.
    pub fn new(rules: Rules, shard: ShardId, ttl_ms: u64) -> Sessions {
        Sessions {
            rules,
            shard,
            ttl_ms,
            sessions: HashMap::new(),
        }
    }

    /// The rules.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// A connection whose certificate names `identity` (and carries the IP
    /// SANs `certified`) completed its handshake.
    pub fn connect(&mut self, agent: AgentId, identity: Identity, certified: Vec<IpAddr>) {
        self.sessions.insert(
            agent,
            Session {
                identity,
                declared: certified.clone(),
                certified,
                held: None,
                welcomed: false,
            },
        );
    }

    /// The connection is gone; the lease its session held, if any.
    pub fn disconnect(&mut self, agent: AgentId) -> Option<(NodeId, AgentEpoch)> {
        self.sessions.remove(&agent).and_then(|s| s.held)
    }

    /// The lease `agent`'s session holds (from its accepted Hello on,
    /// the Welcome sent or not).
    pub fn held(&self, agent: AgentId) -> Option<&(NodeId, AgentEpoch)> {
        self.sessions.get(&agent).and_then(|s| s.held.as_ref())
    }

    /// The driver sent `agent` its `Welcome`: the session may now be sent
    /// anything (witness questions, regions updates).
    pub fn welcomed(&mut self, agent: AgentId) {
        if let Some(session) = self.sessions.get_mut(&agent) {
            session.welcomed = session.held.is_some();
        }
    }

    /// The lease `agent`'s session holds, once its Welcome went out: the
    /// sessions a driver may send unasked messages to.
    pub fn live(&self, agent: AgentId) -> Option<&(NodeId, AgentEpoch)> {
        self.sessions
            .get(&agent)
            .filter(|s| s.welcomed)
            .and_then(|s| s.held.as_ref())
    }

    /// The identity `agent`'s certificate names.
    pub fn identity(&self, agent: AgentId) -> Option<&Identity> {
        self.sessions.get(&agent).map(|s| &s.identity)
    }

    /// Every connection.
    pub fn agents(&self) -> impl Iterator<Item = AgentId> + '_ {
        self.sessions.keys().copied()
    }

    /// One message on `agent`'s session stream at `now_ms`: which session
    /// it counts as heard for (every message of a session with a lease, the
    /// Hello included, and whether it renewed), and what to do.
    pub fn message(
        &mut self,
        agent: AgentId,
        message: SessionUp,
        now_ms: u64,
    ) -> (Option<(NodeId, AgentEpoch, bool)>, Step) {
        let Some(session) = self.sessions.get_mut(&agent) else {
            return (None, Step::Nothing);
        };
        if let (
            SessionUp::Hello {
                node,
                epoch,
                zone,
                addresses,
            },
            None,
        ) = (&message, &session.held)
        {
            return self.hello(agent, (node, *epoch, zone), addresses, now_ms);
        }
        let renewed = matches!(message, SessionUp::Renew);
        let heard = session
            .held
            .as_ref()
            .map(|(node, epoch)| (node.clone(), *epoch, renewed));
        let step = match (message, session.held.clone()) {
            (SessionUp::Hello { .. }, Some(_)) => {
                Step::Close("a second Hello on one session".into())
            }
            (SessionUp::Hello { .. }, None) | (_, None) => {
                Step::Close("the session must start with Hello".into())
            }
            (
                SessionUp::Subscribe {
                    service,
                    shard,
                    have,
                },
                Some((node, _)),
            ) => {
                let allowed = if shard == self.shard {
                    self.rules.may_watch(&node, &service)
                } else {
                    Err(format!(
                        "this arbiter serves shard {}, not shard {shard}",
                        self.shard
                    ))
                };
                match allowed {
                    Ok(()) => Step::Subscribe { service, have },
                    Err(reason) => Step::Deny { service, reason },
                }
            }
            (SessionUp::Unsubscribe { service }, Some(_)) => Step::Unsubscribe(service),
            (SessionUp::Ack { service, revision }, Some(_)) => Step::Ack { service, revision },
            (SessionUp::Renew, Some((node, epoch))) => Step::Renew {
                node,
                epoch,
                actor: session.identity.principal.clone(),
            },
            (SessionUp::Keepalive, Some(_)) => Step::Nothing,
            (
                SessionUp::Witnessed {
                    node,
                    epoch,
                    gossip,
                    reachable,
                },
                Some((witness, _)),
            ) => Step::Witnessed {
                witness,
                node,
                epoch,
                seen: crate::leader::Seen { gossip, reachable },
            },
        };
        (heard, step)
    }

    /// The first Hello of `agent`'s session: a lease grant, or the reason
    /// it is refused. One session per node: a Hello accepted from a node
    /// that already holds a session here replaces that session (an agent
    /// that reconnects while its old connection is half dead must get in
    /// at once, not wait for QUIC's idle timeout), unless that session is
    /// of a later agent run (a higher epoch), which an older run may not
    /// displace.
    fn hello(
        &mut self,
        agent: AgentId,
        (node, epoch, zone): (&NodeId, AgentEpoch, &Label),
        addresses: &[IpAddr],
        now_ms: u64,
    ) -> (Option<(NodeId, AgentEpoch, bool)>, Step) {
        let Some(session) = self.sessions.get(&agent) else {
            return (None, Step::Nothing);
        };
        if let Err(reason) = self.rules.may_hold_lease(&session.identity, node) {
            return (None, Step::Refuse(reason));
        }
        if let Err(reason) = declared_addresses(&session.certified, addresses) {
            return (None, Step::Refuse(reason));
        }
        let earlier: Vec<(AgentId, AgentEpoch)> = self
            .sessions
            .iter()
            .filter(|(other, _)| **other != agent)
            .filter_map(|(other, s)| match &s.held {
                Some((held, held_epoch)) if held == node => Some((*other, *held_epoch)),
                _ => None,
            })
            .collect();
        if let Some((_, later)) = earlier.iter().find(|(_, e)| *e > epoch) {
            return (
                None,
                Step::Refuse(format!(
                    "node {node} holds a session of a later agent run (epoch {later}, this Hello names {epoch}): an older run cannot replace it; stop this agent process"
                )),
            );
        }
        let replaced = earlier
            .into_iter()
            .map(|(other, _)| {
                self.sessions.remove(&other);
                (
                    other,
                    format!("replaced by a newer session of node {node} (one session per node)"),
                )
            })
            .collect();
        let Some(session) = self.sessions.get_mut(&agent) else {
            return (None, Step::Nothing);
        };
        if session.certified.is_empty() {
            session.declared = addresses.to_vec();
        }
        session.held = Some((node.clone(), epoch));
        let envelope = Envelope {
            at_ms: now_ms,
            actor: session.identity.principal.clone(),
            command: Command::GrantLease {
                node: node.clone(),
                epoch,
                zone: zone.clone(),
                ttl_ms: self.ttl_ms,
            },
        };
        (
            Some((node.clone(), epoch, false)),
            Step::Grant { envelope, replaced },
        )
    }

    /// A request on a stream of `agent`'s connection at `now_ms`: the
    /// command to propose (stamped), or what else it is, or the refusal.
    pub fn request(
        &self,
        agent: AgentId,
        request: Request,
        catalog: &Catalog,
        now_ms: u64,
    ) -> Result<Accepted, Response> {
        let Some(session) = self.sessions.get(&agent) else {
            return Err(forbidden("the connection is gone".into()));
        };
        let authorized = self.rules.authorize(
            &session.identity,
            session.held.as_ref(),
            &session.declared,
            request,
            catalog,
        )?;
        Ok(match authorized {
            Authorized::Command(command) => Accepted::Propose(Envelope {
                at_ms: now_ms,
                actor: session.identity.principal.clone(),
                command,
            }),
            Authorized::Down {
                reporter,
                node,
                epoch,
            } => Accepted::Down {
                reporter,
                actor: session.identity.principal.clone(),
                node,
                epoch,
            },
            Authorized::List(node) => Accepted::List(node),
            Authorized::Services(node) => {
                Accepted::Answer(crate::answers::services(catalog, |service| {
                    self.rules.may_watch(&node, service).is_ok()
                }))
            }
            Authorized::Await {
                service,
                revision,
                timeout_ms,
            } => Accepted::Await {
                service,
                revision,
                timeout_ms,
            },
        })
    }
}

/// What an accepted request becomes.
#[derive(Clone, Debug, PartialEq)]
pub enum Accepted {
    /// Propose this command.
    Propose(Envelope),
    /// Hand this down report to the leader memory.
    Down {
        /// The reporting node.
        reporter: NodeId,
        /// Who reported.
        actor: Principal,
        /// The node reported down.
        node: NodeId,
        /// The agent run the reporter saw.
        epoch: AgentEpoch,
    },
    /// Answer with the node's records.
    List(NodeId),
    /// Answer with this, read from the applied catalog.
    Answer(Response),
    /// Answer once the subscribers acknowledged the revision.
    Await {
        /// The service.
        service: ServiceKey,
        /// The revision.
        revision: Revision,
        /// The longest wait, ms.
        timeout_ms: u64,
    },
}

/// How a settled down report is carried out.
#[derive(Debug)]
pub enum DownOutcome<R> {
    /// Nothing to propose: answer every waiting reporter with `answer`.
    Answer {
        /// The reporters.
        waiting: Vec<R>,
        /// Their answer.
        answer: Response,
    },
    /// Propose the verdict; the first reporter is answered once it
    /// committed, the others at once with `others`.
    Propose {
        /// The `NodeDown` command's envelope.
        envelope: crate::command::Envelope,
        /// The reporter answered by the commit.
        first: Option<R>,
        /// The others.
        others: Vec<R>,
        /// What the others are answered.
        answer: Response,
    },
}

/// What a leader-memory verdict on a down report answers (R4): a node the
/// arbiter still hears is a partition inside the zone and nothing is
/// removed; a node silent to both signals is proposed down.
pub fn down_outcome<R>(verdict: Verdict<R>) -> DownOutcome<R> {
    match verdict {
        Verdict::Partition {
            node,
            heard_ago_ms,
            waiting,
            ..
        } => DownOutcome::Answer {
            waiting,
            answer: Response::Rejected {
                kind: RejectKind::Invalid,
                message: format!("node {node}'s session with this arbiter is alive (heard {heard_ago_ms} ms ago): treated as a partition inside the zone; nothing removed"),
            },
        },
        Verdict::Down { envelope, waiting } => {
            let mut waiting = waiting.into_iter();
            DownOutcome::Propose {
                envelope,
                first: waiting.next(),
                others: waiting.collect(),
                answer: Response::Committed {
                    revision: None,
                    generation: None,
                    state: None,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use rollcall_config::ServicePattern;

    use super::*;
    use crate::command::{Envelope, Registration};
    use crate::endpoint::{Principal, State, Weight};
    use crate::ids::Generation;
    use crate::name::{Reason, Version};
    use crate::params::CatalogParams;

    fn rules() -> Rules {
        let mut config = ArbiterConfig {
            controllers: vec![ControllerGrant {
                name: "deployer".into(),
                services: vec![ServicePattern::try_from("default/api/*".to_owned()).unwrap()],
            }],
            ..ArbiterConfig::default()
        };
        config.watch_rules = vec![WatchRule {
            nodes: vec!["n2".into()],
            services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
        }];
        Rules::new(&config, Label::new("r1").unwrap())
    }

    fn identity(role: Role, name: &str) -> Identity {
        Identity::new(
            Label::new("r1").unwrap(),
            role,
            PrincipalName::new(name).unwrap(),
        )
    }

    fn svc(s: &str) -> ServiceKey {
        ServiceKey::new("default", s, "default").unwrap()
    }

    fn registration(node: &str, service: &str) -> Registration {
        Registration {
            instance_id: InstanceId::new(&format!("{service}-1")).unwrap(),
            service: svc(service),
            node: NodeId::new(node).unwrap(),
            epoch: AgentEpoch(1),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 80,
            zone: None,
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            initial: State::Ready,
        }
    }

    /// A catalog holding web-1 on n1.
    fn catalog() -> Catalog {
        let mut cat = Catalog::new(CatalogParams::with_region(Label::new("r1").unwrap()));
        let actor = Principal {
            role: Role::Operator,
            name: PrincipalName::new("t").unwrap(),
        };
        for command in [
            Command::GrantLease {
                node: NodeId::new("n1").unwrap(),
                epoch: AgentEpoch(1),
                zone: Label::new("z1").unwrap(),
                ttl_ms: 10_000,
            },
            Command::Register(registration("n1", "web")),
        ] {
            cat.apply(&Envelope {
                at_ms: 1,
                actor: actor.clone(),
                command,
            })
            .unwrap();
        }
        cat
    }

    fn refusal(result: Result<Authorized, Response>) -> (RejectKind, String) {
        match result {
            Err(Response::Rejected { kind, message }) => (kind, message),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_instance_id_does_not_move_between_services() {
        let r = rules();
        let cat = catalog();
        let mut moved = registration("n1", "web");
        moved.service = svc("api");
        let (kind, message) = refusal(r.authorize(
            &identity(Role::Agent, "n1"),
            None,
            &LOOPBACK,
            Request::Register(moved),
            &cat,
        ));
        assert_eq!(kind, RejectKind::Invalid);
        assert!(message.contains("deregister it first"), "{message}");
        // The same service again is a new generation, as before.
        assert!(r
            .authorize(
                &identity(Role::Agent, "n1"),
                None,
                &LOOPBACK,
                Request::Register(registration("n1", "web")),
                &cat,
            )
            .is_ok());
    }

    #[test]
    fn an_instance_id_belongs_to_the_node_holding_it_until_it_expires() {
        let r = rules();
        let mut cat = catalog();
        let taken = |cat: &Catalog| {
            r.authorize(
                &identity(Role::Agent, "n3"),
                None,
                &LOOPBACK,
                Request::Register(registration("n3", "web")),
                cat,
            )
        };
        let (kind, message) = refusal(taken(&cat));
        assert_eq!(kind, RejectKind::Forbidden);
        assert!(
            message.contains("instance web-1 is held by node n1 (READY, generation 1)")
                && message.contains("rollcall instance free web-1"),
            "{message}"
        );
        // A controller is held to the same rule.
        let mut r = rules();
        r.controllers = vec![rollcall_config::ControllerGrant {
            name: "deployer".into(),
            services: vec!["default/web/*".to_owned().try_into().unwrap()],
        }];
        let (kind, _) = refusal(r.authorize(
            &identity(Role::Controller, "deployer"),
            None,
            &LOOPBACK,
            Request::Register(registration("n3", "web")),
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
        // Once n1's lease ends and the record is EXPIRED, n3 may take it.
        cat.apply(&Envelope {
            at_ms: 20_000,
            actor: identity(Role::Operator, "t").principal,
            command: Command::RevokeLease {
                node: NodeId::new("n1").unwrap(),
                epoch: AgentEpoch(1),
            },
        })
        .unwrap();
        assert_eq!(
            cat.instance(&InstanceId::new("web-1").unwrap())
                .unwrap()
                .state,
            State::Expired
        );
        assert!(taken(&cat).is_ok());
    }

    #[test]
    fn a_lease_is_only_for_the_agent_of_that_node_in_this_region() {
        let r = rules();
        let n1 = NodeId::new("n1").unwrap();
        assert!(r.may_hold_lease(&identity(Role::Agent, "n1"), &n1).is_ok());
        let e = r
            .may_hold_lease(&identity(Role::Agent, "n2"), &n1)
            .unwrap_err();
        assert!(e.contains("only its own node's lease"), "{e}");
        let e = r
            .may_hold_lease(&identity(Role::Controller, "n1"), &n1)
            .unwrap_err();
        assert!(e.contains("cannot hold a node lease"), "{e}");
        let other = Identity::new(
            Label::new("r2").unwrap(),
            Role::Agent,
            PrincipalName::new("n1").unwrap(),
        );
        let e = r.may_hold_lease(&other, &n1).unwrap_err();
        assert!(e.contains("this arbiter serves region r1"), "{e}");
    }

    #[test]
    fn watch_rules_bind_only_the_nodes_they_name() {
        let r = rules();
        let (n1, n2) = (NodeId::new("n1").unwrap(), NodeId::new("n2").unwrap());
        assert!(r.may_watch(&n1, &svc("db")).is_ok());
        assert!(r.may_watch(&n2, &svc("web")).is_ok());
        let e = r.may_watch(&n2, &svc("db")).unwrap_err();
        assert!(e.contains("watch_rules"), "{e}");
    }

    #[test]
    fn every_write_refusal_names_its_reason_and_changes_nothing() {
        let r = rules();
        let cat = catalog();
        let session = (NodeId::new("n1").unwrap(), AgentEpoch(1));
        // Another node's instance.
        let (kind, message) = refusal(r.authorize(
            &identity(Role::Agent, "n1"),
            Some(&session),
            &LOOPBACK,
            Request::Register(registration("n2", "web")),
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
        assert!(
            message.contains("only instances on its own node"),
            "{message}"
        );
        // A controller outside its grant, and inside it.
        let (kind, message) = refusal(r.authorize(
            &identity(Role::Controller, "deployer"),
            None,
            &LOOPBACK,
            Request::Register(registration("n1", "web")),
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
        assert!(message.contains("no grant for service"), "{message}");
        assert!(matches!(
            r.authorize(
                &identity(Role::Controller, "deployer"),
                None,
                &LOOPBACK,
                Request::Register(registration("n1", "api")),
                &cat
            ),
            Ok(Authorized::Command(Command::Register(_)))
        ));
        // An operator or bridge certificate writes no instances.
        let (kind, _) = refusal(r.authorize(
            &identity(Role::Bridge, "b"),
            None,
            &LOOPBACK,
            Request::Register(registration("n1", "web")),
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
        // An instance that is not registered.
        let (kind, _) = refusal(r.authorize(
            &identity(Role::Agent, "n1"),
            Some(&session),
            &LOOPBACK,
            Request::Deregister {
                instance_id: InstanceId::new("ghost").unwrap(),
                generation: Generation(1),
            },
            &cat,
        ));
        assert_eq!(kind, RejectKind::NotFound);
        // Another node's agent may not touch web-1.
        let n2 = (NodeId::new("n2").unwrap(), AgentEpoch(1));
        let (kind, _) = refusal(r.authorize(
            &identity(Role::Agent, "n2"),
            Some(&n2),
            &LOOPBACK,
            Request::Transition {
                instance_id: InstanceId::new("web-1").unwrap(),
                generation: Generation(1),
                to: State::Draining,
                reason: Reason::new("x").unwrap(),
            },
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
        // Session-only requests without a session.
        for request in [
            Request::NodeInstances,
            Request::Leave {
                epoch: AgentEpoch(1),
            },
            Request::ReportDown {
                node: NodeId::new("n2").unwrap(),
                epoch: AgentEpoch(1),
            },
        ] {
            let (kind, message) =
                refusal(r.authorize(&identity(Role::Agent, "n1"), None, &LOOPBACK, request, &cat));
            assert_eq!(kind, RejectKind::Forbidden);
            assert!(
                message.contains("only an agent with a session"),
                "{message}"
            );
        }
        // A certificate of another region.
        let other = Identity::new(
            Label::new("r2").unwrap(),
            Role::Agent,
            PrincipalName::new("n1").unwrap(),
        );
        let (kind, _) = refusal(r.authorize(
            &other,
            Some(&session),
            &LOOPBACK,
            Request::NodeInstances,
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
    }

    #[test]
    fn a_session_may_list_report_and_wait() {
        let r = rules();
        let cat = catalog();
        let session = (NodeId::new("n1").unwrap(), AgentEpoch(1));
        let me = identity(Role::Agent, "n1");
        assert_eq!(
            r.authorize(&me, Some(&session), &LOOPBACK, Request::NodeInstances, &cat),
            Ok(Authorized::List(NodeId::new("n1").unwrap()))
        );
        assert_eq!(
            r.authorize(
                &me,
                Some(&session),
                &LOOPBACK,
                Request::AwaitPropagation {
                    service: svc("web"),
                    revision: Revision(3),
                    timeout_ms: 120_000,
                },
                &cat
            ),
            Ok(Authorized::Await {
                service: svc("web"),
                revision: Revision(3),
                timeout_ms: 30_000,
            })
        );
    }

    /// The addresses a test session declared: its registrations' address.
    const LOOPBACK: [IpAddr; 1] = [IpAddr::V4(Ipv4Addr::LOCALHOST)];

    fn sessions() -> Sessions {
        Sessions::new(rules(), ShardId(0), 10_000)
    }

    fn hello(node: &str) -> SessionUp {
        SessionUp::Hello {
            node: NodeId::new(node).unwrap(),
            epoch: AgentEpoch(4),
            zone: Label::new("z1").unwrap(),
            addresses: LOOPBACK.to_vec(),
        }
    }

    #[test]
    fn a_session_starts_with_an_accepted_hello_and_nothing_else() {
        let mut s = sessions();
        s.connect(1, identity(Role::Agent, "n1"), Vec::new());
        // Anything before Hello closes the connection.
        let (heard, step) = s.message(1, SessionUp::Keepalive, 5);
        assert_eq!(heard, None);
        assert_eq!(
            step,
            Step::Close("the session must start with Hello".into())
        );
        // Hello for another node is refused with the reason.
        let (heard, step) = s.message(1, hello("n2"), 5);
        assert_eq!(heard, None);
        assert!(matches!(step, Step::Refuse(r) if r.contains("only its own node's lease")));
        assert!(s.held(1).is_none(), "a refused Hello holds nothing");
        // Its own node: a lease grant, stamped now, for the configured TTL.
        let (heard, step) = s.message(1, hello("n1"), 7);
        assert_eq!(
            heard,
            Some((NodeId::new("n1").unwrap(), AgentEpoch(4), false))
        );
        let Step::Grant { envelope, .. } = step else {
            panic!("{step:?}")
        };
        assert_eq!(envelope.at_ms, 7);
        assert!(matches!(
            envelope.command,
            Command::GrantLease {
                ttl_ms: 10_000,
                epoch: AgentEpoch(4),
                ..
            }
        ));
        // A second Hello on the same session closes it.
        let (_, step) = s.message(1, hello("n1"), 8);
        assert_eq!(step, Step::Close("a second Hello on one session".into()));
        // Every message of the session counts as heard; a renewal says so.
        let (heard, step) = s.message(1, SessionUp::Renew, 9);
        assert_eq!(
            heard,
            Some((NodeId::new("n1").unwrap(), AgentEpoch(4), true))
        );
        assert!(matches!(step, Step::Renew { .. }));
        assert_eq!(
            s.disconnect(1),
            Some((NodeId::new("n1").unwrap(), AgentEpoch(4)))
        );
    }

    #[test]
    fn a_session_is_live_only_once_its_welcome_went_out() {
        let mut s = sessions();
        s.connect(1, identity(Role::Agent, "n1"), Vec::new());
        s.welcomed(1);
        assert!(s.live(1).is_none(), "no Hello yet: nothing to welcome");
        let (_, step) = s.message(1, hello("n1"), 7);
        assert!(matches!(step, Step::Grant { .. }));
        // The grant is proposed, not committed: the session holds the
        // lease, but nothing may go down its stream before the Welcome.
        assert!(s.held(1).is_some());
        assert!(s.live(1).is_none());
        s.welcomed(1);
        assert_eq!(
            s.live(1),
            Some(&(NodeId::new("n1").unwrap(), AgentEpoch(4)))
        );
        s.disconnect(1);
        assert!(s.live(1).is_none());
    }

    #[test]
    fn a_new_session_of_a_node_replaces_the_old_one_unless_it_is_an_older_run() {
        let mut s = sessions();
        let with_epoch = |epoch| SessionUp::Hello {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(epoch),
            zone: Label::new("z1").unwrap(),
            addresses: LOOPBACK.to_vec(),
        };
        s.connect(1, identity(Role::Agent, "n1"), Vec::new());
        let (_, step) = s.message(1, with_epoch(4), 1);
        assert!(matches!(step, Step::Grant { ref replaced, .. } if replaced.is_empty()));
        // Another node's session is nobody's business here.
        s.connect(9, identity(Role::Agent, "n9"), Vec::new());
        s.message(9, hello("n9"), 1);
        // The same run reconnecting: the old session goes, with the reason.
        s.connect(2, identity(Role::Agent, "n1"), Vec::new());
        let (_, step) = s.message(2, with_epoch(4), 2);
        let Step::Grant { replaced, .. } = step else {
            panic!("{step:?}")
        };
        assert_eq!(replaced.len(), 1);
        assert_eq!(replaced[0].0, 1);
        assert!(replaced[0]
            .1
            .contains("replaced by a newer session of node n1"));
        assert!(
            s.held(1).is_none() && s.identity(1).is_none(),
            "forgotten at once"
        );
        assert_eq!(s.message(1, SessionUp::Renew, 3), (None, Step::Nothing));
        // An older run cannot push out a later one, and holds nothing.
        s.connect(3, identity(Role::Agent, "n1"), Vec::new());
        let (heard, step) = s.message(3, with_epoch(3), 4);
        assert_eq!(heard, None);
        assert!(
            matches!(&step, Step::Refuse(r) if r.contains("later agent run (epoch 4")),
            "{step:?}"
        );
        assert!(s.held(2).is_some() && s.held(3).is_none());
        // A later run does.
        s.connect(4, identity(Role::Agent, "n1"), Vec::new());
        let (_, step) = s.message(4, with_epoch(5), 5);
        assert!(
            matches!(step, Step::Grant { ref replaced, .. } if replaced.iter().map(|r| r.0).collect::<Vec<_>>() == vec![2])
        );
        assert!(s.held(9).is_some(), "n9 untouched");
    }

    #[test]
    fn a_controller_certificate_holds_no_lease() {
        let mut s = sessions();
        s.connect(2, identity(Role::Controller, "deployer"), Vec::new());
        let (_, step) = s.message(2, hello("deployer"), 1);
        assert!(matches!(step, Step::Refuse(r) if r.contains("cannot hold a node lease")));
    }

    #[test]
    fn watches_outside_the_rules_or_the_shard_are_denied() {
        let mut s = sessions();
        s.connect(3, identity(Role::Agent, "n2"), Vec::new());
        s.message(3, hello("n2"), 1);
        let subscribe = |service: &str, shard: u16| SessionUp::Subscribe {
            shard: ShardId(shard),
            service: svc(service),
            have: None,
        };
        assert_eq!(
            s.message(3, subscribe("web", 0), 2).1,
            Step::Subscribe {
                service: svc("web"),
                have: None
            }
        );
        assert!(matches!(
            s.message(3, subscribe("db", 0), 2).1,
            Step::Deny { reason, .. } if reason.contains("watch_rules")
        ));
        assert!(matches!(
            s.message(3, subscribe("web", 1), 2).1,
            Step::Deny { reason, .. } if reason.contains("serves shard 0, not shard 1")
        ));
    }

    #[test]
    fn the_services_listed_are_those_the_node_may_watch() {
        let mut s = sessions();
        let mut cat = catalog();
        cat.apply(&Envelope {
            at_ms: 2,
            actor: identity(Role::Agent, "n1").principal,
            command: Command::Register(registration("n1", "db")),
        })
        .unwrap();
        let listed = |s: &Sessions, agent| match s.request(agent, Request::Services, &cat, 3) {
            Ok(Accepted::Answer(Response::Services {
                services,
                revision,
                truncated,
            })) => {
                assert_eq!((revision, truncated), (cat.revision(), false));
                services
                    .iter()
                    .map(|c| (c.service.service.to_string(), c.ready, c.total))
                    .collect::<Vec<_>>()
            }
            other => panic!("{other:?}"),
        };
        // Without a session, nothing is listed.
        s.connect(1, identity(Role::Agent, "n1"), Vec::new());
        assert!(s.request(1, Request::Services, &cat, 3).is_err());
        s.message(1, hello("n1"), 3);
        assert_eq!(
            listed(&s, 1),
            vec![("db".to_owned(), 1, 1), ("web".to_owned(), 1, 1)]
        );
        // n2 may watch web only.
        s.connect(2, identity(Role::Agent, "n2"), Vec::new());
        s.message(2, hello("n2"), 3);
        assert_eq!(listed(&s, 2), vec![("web".to_owned(), 1, 1)]);
    }

    #[test]
    fn requests_are_stamped_with_who_and_when_or_refused() {
        let mut s = sessions();
        let cat = catalog();
        s.connect(1, identity(Role::Agent, "n1"), Vec::new());
        // No session yet: listing is refused.
        assert!(s.request(1, Request::NodeInstances, &cat, 5).is_err());
        s.message(1, hello("n1"), 5);
        let Ok(Accepted::Propose(envelope)) =
            s.request(1, Request::Register(registration("n1", "web")), &cat, 9)
        else {
            panic!("an agent registers on its own node")
        };
        assert_eq!(envelope.at_ms, 9);
        assert_eq!(envelope.actor, identity(Role::Agent, "n1").principal);
        assert!(matches!(
            s.request(
                1,
                Request::ReportDown {
                    node: NodeId::new("n2").unwrap(),
                    epoch: AgentEpoch(1)
                },
                &cat,
                9
            ),
            Ok(Accepted::Down { reporter, .. }) if reporter.as_str() == "n1"
        ));
        // A connection that is gone.
        assert!(s.request(7, Request::NodeInstances, &cat, 9).is_err());
    }

    /// The two-signal rule (R4) as the core and the simulator carry it: a
    /// report about a node the arbiter still hears answers "partition",
    /// removes nothing; about a node silent long enough, it proposes the
    /// verdict and answers the first reporter once committed.
    #[test]
    fn a_down_report_needs_the_arbiters_own_silence_too() {
        use crate::leader::{agent_principal, LeaderMemory, LeaderParams};
        let cat = catalog();
        let params = LeaderParams::from(&ArbiterConfig::default());
        let silence = params.silence_ms;
        let me = Principal {
            role: Role::Arbiter,
            name: PrincipalName::new("a").unwrap(),
        };
        let mut leader: LeaderMemory<u32> = LeaderMemory::new(params, me, 0);
        leader.take_office(0, cat.leases());
        let (n1, n2) = (NodeId::new("n1").unwrap(), NodeId::new("n2").unwrap());
        // n1 was heard just now: the report is held, then heard again →
        // partition.
        leader.heard(&n1, 1_000);
        let held = leader.report_down(
            n2.clone(),
            agent_principal(&n2),
            n1.clone(),
            AgentEpoch(1),
            1_000,
            Some(1),
        );
        assert!(held.is_empty(), "held for the arbiter's own signal");
        leader.heard(&n1, 1_500);
        let verdicts = leader.sweep(1_600, cat.leases()).verdicts;
        let [verdict] = <[_; 1]>::try_from(verdicts).expect("one verdict");
        match down_outcome(verdict) {
            DownOutcome::Answer { waiting, answer } => {
                assert_eq!(waiting, vec![1]);
                assert!(
                    matches!(answer, Response::Rejected { kind: RejectKind::Invalid, message } if message.contains("partition"))
                );
            }
            other => panic!("a heard node is a partition: {other:?}"),
        }
        // Silent since 1.5 s: a new report settles once silence has passed.
        leader.report_down(
            n2.clone(),
            agent_principal(&n2),
            n1.clone(),
            AgentEpoch(1),
            2_000,
            Some(2),
        );
        leader.report_down(
            n2.clone(),
            agent_principal(&n2),
            n1.clone(),
            AgentEpoch(1),
            2_100,
            Some(3),
        );
        let verdicts = leader.sweep(1_500 + silence + 1, cat.leases()).verdicts;
        let [verdict] = <[_; 1]>::try_from(verdicts).expect("one verdict");
        match down_outcome(verdict) {
            DownOutcome::Propose {
                envelope,
                first,
                others,
                answer,
            } => {
                assert!(
                    matches!(envelope.command, Command::NodeDown { ref node, .. } if *node == n1)
                );
                assert_eq!(first, Some(2));
                assert_eq!(others, vec![3]);
                assert!(matches!(answer, Response::Committed { .. }));
            }
            other => panic!("a silent node is proposed down: {other:?}"),
        }
    }

    fn rules_with(registration_rules: Vec<RegistrationRule>) -> Rules {
        let config = ArbiterConfig {
            registration_rules,
            ..ArbiterConfig::default()
        };
        Rules::new(&config, Label::new("r1").unwrap())
    }

    fn rule(
        nodes: &[&str],
        zones: &[&str],
        services: &[&str],
        any_address: bool,
    ) -> RegistrationRule {
        RegistrationRule {
            nodes: nodes
                .iter()
                .map(|n| rollcall_config::NodePattern::try_from((*n).to_owned()).unwrap())
                .collect(),
            zones: zones.iter().map(|z| (*z).to_owned()).collect(),
            services: services
                .iter()
                .map(|p| ServicePattern::try_from((*p).to_owned()).unwrap())
                .collect(),
            any_address,
        }
    }

    #[test]
    fn registration_rules_bind_the_nodes_and_zones_they_name() {
        let r = rules_with(vec![
            rule(&["edge-*"], &[], &["default/web/*"], false),
            rule(&[], &["z1"], &["default/api/*"], false),
        ]);
        let at = IpAddr::V4(Ipv4Addr::LOCALHOST);
        // n1's lease is in z1: it may register only api.
        let n1 = NodeId::new("n1").unwrap();
        let e = r
            .may_register(&n1, Some("z1"), &svc("web"), at, &LOOPBACK)
            .unwrap_err();
        assert!(
            e.contains("node n1 may not register default/web/default")
                && e.contains("default/api/*"),
            "{e}"
        );
        assert!(r
            .may_register(&n1, Some("z1"), &svc("api"), at, &LOOPBACK)
            .is_ok());
        // edge-3 is named by prefix.
        let edge = NodeId::new("edge-3").unwrap();
        assert!(r
            .may_register(&edge, Some("z2"), &svc("web"), at, &LOOPBACK)
            .is_ok());
        assert!(r
            .may_register(&edge, Some("z2"), &svc("db"), at, &LOOPBACK)
            .is_err());
        // A node no rule applies to registers every service.
        let other = NodeId::new("db-1").unwrap();
        assert!(r
            .may_register(&other, Some("z2"), &svc("db"), at, &LOOPBACK)
            .is_ok());
        // Through authorize, with the zone of the node's lease in the
        // catalog: refused as forbidden, so nothing is proposed.
        let cat = catalog();
        let session = (n1.clone(), AgentEpoch(1));
        let (kind, message) = refusal(r.authorize(
            &identity(Role::Agent, "n1"),
            Some(&session),
            &LOOPBACK,
            Request::Register(registration("n1", "web")),
            &cat,
        ));
        assert_eq!(kind, RejectKind::Forbidden);
        assert!(message.contains("registration_rules"), "{message}");
        // Controllers keep their grants: the rules and the address check
        // bind agents only.
        let granted = Rules::new(
            &ArbiterConfig {
                controllers: vec![ControllerGrant {
                    name: "deployer".into(),
                    services: vec![ServicePattern::try_from("default/web/*".to_owned()).unwrap()],
                }],
                registration_rules: vec![rule(&[], &["z1"], &["default/api/*"], false)],
                ..ArbiterConfig::default()
            },
            Label::new("r1").unwrap(),
        );
        assert!(granted
            .authorize(
                &identity(Role::Controller, "deployer"),
                None,
                &[],
                Request::Register(registration("n1", "web")),
                &cat,
            )
            .is_ok());
    }

    #[test]
    fn an_agent_registers_only_addresses_its_node_declared() {
        let r = rules_with(Vec::new());
        let n1 = NodeId::new("n1").unwrap();
        let here = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let there = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        assert!(r
            .may_register(&n1, None, &svc("web"), here, &[here])
            .is_ok());
        let e = r
            .may_register(&n1, None, &svc("web"), there, &[here])
            .unwrap_err();
        assert!(
            e.contains("address 10.0.0.2 is not one of node n1's declared addresses (10.0.0.1)"),
            "{e}"
        );
        let e = r
            .may_register(&n1, None, &svc("web"), there, &[])
            .unwrap_err();
        assert!(e.contains("declared none"), "{e}");
        // A rule's any_address, or registration.addresses = "any".
        let lenient = rules_with(vec![rule(&["n1"], &[], &["default/web/*"], true)]);
        assert!(lenient
            .may_register(&n1, None, &svc("web"), there, &[here])
            .is_ok());
        let mut config = ArbiterConfig::default();
        config.registration.addresses = AddressRule::Any;
        let any = Rules::new(&config, Label::new("r1").unwrap());
        assert!(any.may_register(&n1, None, &svc("web"), there, &[]).is_ok());
    }

    #[test]
    fn a_hello_declares_addresses_within_the_certificate() {
        let here = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let there = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let hello_at = |addresses: Vec<IpAddr>| SessionUp::Hello {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(4),
            zone: Label::new("z1").unwrap(),
            addresses,
        };
        let register_at = |address: IpAddr| {
            let mut reg = registration("n1", "web");
            reg.address = address;
            Request::Register(reg)
        };
        let cat = catalog();
        let mut s = Sessions::new(rules_with(Vec::new()), ShardId(0), 10_000);
        // The certificate names 10.0.0.1: a Hello naming 10.0.0.2 is refused.
        s.connect(1, identity(Role::Agent, "n1"), vec![here]);
        let (_, step) = s.message(1, hello_at(vec![there]), 1);
        assert!(
            matches!(&step, Step::Refuse(r) if r.contains("which the certificate does not name")),
            "{step:?}"
        );
        // A Hello that names none: the certificate's addresses are the node's.
        s.connect(2, identity(Role::Agent, "n1"), vec![here]);
        assert!(matches!(
            s.message(2, hello_at(Vec::new()), 1).1,
            Step::Grant { .. }
        ));
        assert!(s.request(2, register_at(here), &cat, 2).is_ok());
        assert!(s.request(2, register_at(there), &cat, 2).is_err());
        // A certificate without IP SANs: the Hello's addresses are the node's.
        s.connect(3, identity(Role::Agent, "n1"), Vec::new());
        assert!(matches!(
            s.message(3, hello_at(vec![there]), 1).1,
            Step::Grant { .. }
        ));
        assert!(s.request(3, register_at(there), &cat, 2).is_ok());
        assert!(s.request(3, register_at(here), &cat, 2).is_err());
        // Too many addresses.
        s.connect(4, identity(Role::Agent, "n1"), Vec::new());
        let many: Vec<IpAddr> = (0..=MAX_DECLARED_ADDRESSES)
            .map(|i| IpAddr::V4(Ipv4Addr::new(10, 1, 0, i as u8)))
            .collect();
        assert!(matches!(
            s.message(4, hello_at(many), 1).1,
            Step::Refuse(r) if r.contains("at most")
        ));
    }
}
