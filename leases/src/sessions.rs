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

use crate::catalog::Catalog;
use crate::command::{Command, Envelope};
use crate::endpoint::Principal;
use crate::identity::Identity;
use crate::ids::{AgentEpoch, AgentId, Revision, ShardId};
use crate::leader::Verdict;
use crate::name::{Label, NodeId, ServiceKey};
use crate::protocol::{RejectKind, Request, Response, SessionUp, MAX_DECLARED_ADDRESSES};

mod forwarded;
mod rules;

use rules::forbidden;
pub use rules::{Authorized, Rules};

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
    /// A probe was answered: the session is heard (a follower tells the
    /// leader at once).
    Alive,
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
    /// Whether it sent a `Keepalive`: an agent from before probes, which
    /// cannot read one (its keep-alives answer a down report instead).
    keeps_alive: bool,
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

    /// Bytes of session state, counted from the table (at its capacity)
    /// and each session's address lists: a lower bound (names are shared
    /// `Arc<str>`, allocator overhead is not counted).
    pub fn state_bytes(&self) -> usize {
        let table = self.sessions.capacity()
            * (std::mem::size_of::<AgentId>() + std::mem::size_of::<Session>() + 1);
        let addresses: usize = self
            .sessions
            .values()
            .map(|s| {
                (s.certified.capacity() + s.declared.capacity()) * std::mem::size_of::<IpAddr>()
            })
            .sum();
        table + addresses
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
                keeps_alive: false,
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

    /// Whether `agent`'s session may be sent a `SessionDown::Probe`: it
    /// is live and its agent never sent a `Keepalive` (an agent from
    /// before probes would end its session on one; the keep-alives it
    /// sends every half second answer a down report as well).
    pub fn probes(&self, agent: AgentId) -> bool {
        self.sessions
            .get(&agent)
            .is_some_and(|s| s.welcomed && s.held.is_some() && !s.keeps_alive)
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
            (SessionUp::Keepalive, Some(_)) => {
                session.keeps_alive = true;
                Step::Nothing
            }
            (SessionUp::Alive { .. }, Some(_)) => Step::Alive,
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
        if let Err(reason) = self.rules.may_declare_zone(node, zone) {
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
/// removed; a single reporter's verdict a witness sees alive removes
/// nothing either; a node silent to both signals is proposed down.
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
        Verdict::Uncorroborated {
            node,
            reporter,
            alive,
            waiting,
        } => {
            let names: Vec<&str> = alive.iter().map(NodeId::as_str).collect();
            DownOutcome::Answer {
                waiting,
                answer: Response::Rejected {
                    kind: RejectKind::Invalid,
                    message: format!("node {node} was reported down by {reporter} alone and witnesses {} see it alive: nothing removed (if the node is dead, its lease runs out)", names.join(", ")),
                },
            }
        }
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
mod tests;
