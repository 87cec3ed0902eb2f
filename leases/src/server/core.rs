//! The arbiter's core task: the one owner of the catalog, the distributor,
//! the lease deadlines and session silence. Everything reaches it as a
//! `CoreMsg`; it applies proposals in batches, makes each batch durable with
//! one fsync (group commit) before answering anyone or publishing anything,
//! and carries the distributor's outputs to the connections.
//!
//! It decides nothing about the catalog itself (that is `Catalog::apply`)
//! and touches no socket (connections hold those); it does read the clock,
//! as the driver of sans-IO state machines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use foldhash::HashMap;
use rollcall_config::ArbiterConfig;
use tokio::sync::{mpsc, oneshot};

use crate::catalog::{Applied, Catalog, Effect, Rejection};
use crate::command::{Command, Envelope};
use crate::distribution::{AgentId, DistParams, Distributor, Output};
use crate::endpoint::{Principal, Role};
use crate::identity::Identity;
use crate::ids::{AgentEpoch, Revision};
use crate::name::{Label, NodeId, PrincipalName, ServiceKey};
use crate::protocol::{
    NodeInstance, RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp,
};
use crate::server::metrics::{Metrics, NodeLabel, ServiceLabel};
use crate::store::{LogEntry, Store};

/// Most proposals applied in one group commit.
const MAX_BATCH: usize = 4096;

/// What a connection's writer must do.
#[derive(Debug)]
pub enum Outbound {
    /// Write this message; when `notify`, report `CoreMsg::Sent` after it is
    /// written (only the distributor's updates are accounted for).
    Message {
        /// The message.
        message: SessionDown,
        /// Report completion.
        notify: bool,
    },
    /// Close the connection with this reason.
    Close(String),
}

/// A question from the admin endpoint.
pub enum AdminQuery {
    /// `GET /v1/status`.
    Status(oneshot::Sender<serde_json::Value>),
    /// `GET /metrics`: refresh the gauges, then answer.
    RefreshMetrics(oneshot::Sender<()>),
}

/// Everything the core hears.
pub enum CoreMsg {
    /// A connection completed its handshake.
    Connected {
        /// Its number.
        agent: AgentId,
        /// The identity its certificate names.
        identity: Identity,
        /// Where to send its messages.
        tx: mpsc::UnboundedSender<Outbound>,
    },
    /// A message on its session stream.
    Session {
        /// The connection.
        agent: AgentId,
        /// The message.
        msg: SessionUp,
    },
    /// A request on a stream of its own.
    Request {
        /// The connection.
        agent: AgentId,
        /// The request.
        request: Request,
        /// Where the answer goes.
        reply: oneshot::Sender<Response>,
    },
    /// An update message marked `notify` was written.
    Sent {
        /// The connection.
        agent: AgentId,
    },
    /// The connection is gone.
    Closed {
        /// The connection.
        agent: AgentId,
    },
    /// An admin question.
    Admin(AdminQuery),
}

/// The wall clock in ms since the Unix epoch: the time stamped on commands.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Conn {
    identity: Identity,
    tx: mpsc::UnboundedSender<Outbound>,
    session: Option<(NodeId, AgentEpoch)>,
}

/// What to do once a proposal is durable.
enum Then {
    Reply(oneshot::Sender<Response>),
    Welcome(AgentId),
    Nothing,
}

/// A gossip down report waiting for the arbiter's own silence signal.
struct PendingDown {
    epoch: AgentEpoch,
    reporters: Vec<NodeId>,
    reported_at: u64,
    identity: Identity,
    replies: Vec<oneshot::Sender<Response>>,
}

struct Waiter {
    service: ServiceKey,
    revision: Revision,
    deadline_ms: u64,
    reply: oneshot::Sender<Response>,
}

/// The core's state.
pub struct Core {
    config: ArbiterConfig,
    region: Label,
    catalog: Catalog,
    dist: Distributor,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    conns: HashMap<AgentId, Conn>,
    last_heard: HashMap<NodeId, u64>,
    wakes: BTreeMap<u64, Vec<AgentId>>,
    waiters: Vec<Waiter>,
    pending_downs: HashMap<NodeId, PendingDown>,
    expiring: HashMap<NodeId, u64>,
    log_since_compaction: u64,
    next_purge_ms: u64,
    me: Principal,
}

impl Core {
    /// A core over a recovered catalog. Every lease gets one TTL of grace
    /// from now (R3), so a restart never mass-expires a fleet.
    pub fn new(
        config: ArbiterConfig,
        mut catalog: Catalog,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        log_len: u64,
    ) -> Self {
        let now = now_ms();
        catalog.leases_mut().extend_all(now);
        let d = &config.distribution;
        let dist = Distributor::new(DistParams {
            coalesce_window_ms: d.coalesce_window_ms,
            max_concurrent_snapshots: d.max_concurrent_snapshots as usize,
            stall_timeout_ms: d.stall_timeout_ms,
            snapshot_retry_ms: d.snapshot_retry_ms,
        });
        let region = catalog.params().region.clone();
        let me = Principal {
            role: Role::Arbiter,
            name: PrincipalName::new(&config.name)
                .unwrap_or_else(|_| PrincipalName::new("arbiter").expect("a valid constant")),
        };
        Core {
            next_purge_ms: now + config.store.purge_interval_ms,
            config,
            region,
            catalog,
            dist,
            store,
            metrics,
            conns: HashMap::default(),
            last_heard: HashMap::default(),
            wakes: BTreeMap::new(),
            waiters: Vec::new(),
            pending_downs: HashMap::default(),
            expiring: HashMap::default(),
            log_since_compaction: log_len,
            me,
        }
    }

    /// Runs until every sender of `rx` is gone.
    pub async fn run(mut self, mut rx: mpsc::Receiver<CoreMsg>) {
        let sweep = Duration::from_millis(self.config.lease.sweep_interval_ms);
        let mut next_sweep = Instant::now() + sweep;
        loop {
            let next_wake = self.wakes.keys().next().map(|at| {
                let now = now_ms();
                Instant::now() + Duration::from_millis(at.saturating_sub(now))
            });
            let deadline = next_wake.map_or(next_sweep, |w| w.min(next_sweep));
            let mut proposals: Vec<(Envelope, Then)> = Vec::new();
            tokio::select! {
                msg = rx.recv() => {
                    let Some(msg) = msg else { return };
                    self.handle(msg, &mut proposals);
                    while proposals.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(msg) => self.handle(msg, &mut proposals),
                            Err(_) => break,
                        }
                    }
                }
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
            let now = now_ms();
            if Instant::now() >= next_sweep {
                next_sweep = Instant::now() + sweep;
                self.sweep(now, &mut proposals);
            }
            self.fire_wakes(now);
            self.answer_waiters(now);
            if !proposals.is_empty() {
                self.commit(proposals).await;
            }
        }
    }

    fn handle(&mut self, msg: CoreMsg, proposals: &mut Vec<(Envelope, Then)>) {
        let now = now_ms();
        match msg {
            CoreMsg::Connected {
                agent,
                identity,
                tx,
            } => {
                self.dist.connect(agent);
                self.conns.insert(
                    agent,
                    Conn {
                        identity,
                        tx,
                        session: None,
                    },
                );
            }
            CoreMsg::Session { agent, msg } => self.session(agent, msg, now, proposals),
            CoreMsg::Request {
                agent,
                request,
                reply,
            } => self.request(agent, request, reply, now, proposals),
            CoreMsg::Sent { agent } => {
                let mut out = Vec::new();
                self.dist.sent(agent, now, &self.catalog, &mut out);
                self.carry(out);
            }
            CoreMsg::Closed { agent } => {
                self.dist.disconnect(agent);
                if let Some(conn) = self.conns.remove(&agent) {
                    if let Some((node, _)) = conn.session {
                        tracing::info!(node = %node, agent, "agent session closed");
                    }
                }
            }
            CoreMsg::Admin(AdminQuery::Status(reply)) => {
                let _ = reply.send(self.status(now));
            }
            CoreMsg::Admin(AdminQuery::RefreshMetrics(reply)) => {
                self.refresh_metrics();
                let _ = reply.send(());
            }
        }
    }

    fn send(&self, agent: AgentId, message: SessionDown) {
        if let Some(conn) = self.conns.get(&agent) {
            let _ = conn.tx.send(Outbound::Message {
                message,
                notify: false,
            });
        }
    }

    fn close(&mut self, agent: AgentId, reason: String) {
        if let Some(conn) = self.conns.get(&agent) {
            let _ = conn.tx.send(Outbound::Close(reason));
        }
    }

    fn session(
        &mut self,
        agent: AgentId,
        msg: SessionUp,
        now: u64,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        let Some(conn) = self.conns.get(&agent) else {
            return;
        };
        let identity = conn.identity.clone();
        let session = conn.session.clone();
        if let Some((node, _)) = &session {
            self.last_heard.insert(node.clone(), now);
        }
        match (msg, session) {
            (SessionUp::Hello { node, epoch, zone }, None) => {
                if let Err(reason) = self.may_hold_lease(&identity, &node) {
                    self.send(
                        agent,
                        SessionDown::Refused {
                            reason: reason.clone(),
                        },
                    );
                    self.close(agent, reason);
                    return;
                }
                self.last_heard.insert(node.clone(), now);
                if let Some(conn) = self.conns.get_mut(&agent) {
                    conn.session = Some((node.clone(), epoch));
                }
                let command = Command::GrantLease {
                    node,
                    epoch,
                    zone,
                    ttl_ms: self.config.lease.ttl_ms,
                };
                proposals.push((self.envelope(&identity, command, now), Then::Welcome(agent)));
            }
            (SessionUp::Hello { .. }, Some(_)) => {
                self.close(agent, "a second Hello on one session".into())
            }
            (_, None) => self.close(agent, "the session must start with Hello".into()),
            (
                SessionUp::Subscribe {
                    service,
                    shard,
                    have,
                },
                Some((node, _)),
            ) => {
                let ours = self.catalog.params().shard;
                let allowed = if shard == ours {
                    self.may_watch(&node, &service)
                } else {
                    Err(format!(
                        "this arbiter serves shard {ours}, not shard {shard}"
                    ))
                };
                if let Err(reason) = allowed {
                    let update =
                        SessionDown::Update(vec![ServiceUpdate::Denied { service, reason }]);
                    self.send(agent, update);
                    return;
                }
                let mut out = Vec::new();
                self.dist
                    .subscribe(agent, service, have, now, &self.catalog, &mut out);
                self.carry(out);
            }
            (SessionUp::Unsubscribe { service }, Some(_)) => self.dist.unsubscribe(agent, &service),
            (SessionUp::Ack { service, revision }, Some(_)) => {
                self.dist.ack(agent, &service, revision);
                self.answer_waiters(now);
            }
            (SessionUp::Renew, Some((node, epoch))) => {
                self.metrics.renewals.inc();
                match self.catalog.leases_mut().renew(&node, epoch, now) {
                    Ok(renewal) if renewal.held => {
                        // The session is back: reinstate the held lease (R3).
                        let zone = self.catalog.leases().get(&node).map(|l| l.zone.clone());
                        if let Some(zone) = zone {
                            let command = Command::GrantLease {
                                node,
                                epoch,
                                zone,
                                ttl_ms: self.config.lease.ttl_ms,
                            };
                            proposals.push((self.envelope(&identity, command, now), Then::Nothing));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let reason = e.to_string();
                        self.send(
                            agent,
                            SessionDown::Refused {
                                reason: reason.clone(),
                            },
                        );
                        self.close(agent, reason);
                    }
                }
            }
            (SessionUp::Keepalive, Some(_)) => {}
        }
    }

    fn may_hold_lease(&self, identity: &Identity, node: &NodeId) -> Result<(), String> {
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

    fn may_watch(&self, node: &NodeId, service: &ServiceKey) -> Result<(), String> {
        let rules: Vec<_> = self
            .config
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

    fn controller_may_write(&self, name: &PrincipalName, service: &ServiceKey) -> bool {
        self.config
            .controllers
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

    fn request(
        &mut self,
        agent: AgentId,
        request: Request,
        reply: oneshot::Sender<Response>,
        now: u64,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        let Some(conn) = self.conns.get(&agent) else {
            return;
        };
        let identity = conn.identity.clone();
        let session = conn.session.clone();
        match self.authorize(&identity, session.as_ref(), request) {
            Ok(Authorized::Command(command)) => {
                proposals.push((self.envelope(&identity, command, now), Then::Reply(reply)))
            }
            // Answered from acknowledgements, not committed.
            Ok(Authorized::Await {
                service,
                revision,
                timeout_ms,
            }) => {
                self.waiters.push(Waiter {
                    service,
                    revision,
                    deadline_ms: now + timeout_ms,
                    reply,
                });
                self.answer_waiters(now);
            }
            Ok(Authorized::Down {
                reporter,
                node,
                epoch,
            }) => {
                // The second signal (R4): this arbiter's own session with the
                // node must be silent for silence_ms. Gossip may be faster
                // than that, so the report waits until the silence would be
                // long enough; hearing the node meanwhile means a partition.
                let held = self
                    .pending_downs
                    .entry(node.clone())
                    .or_insert_with(|| PendingDown {
                        epoch,
                        reporters: Vec::new(),
                        reported_at: now,
                        identity: identity.clone(),
                        replies: Vec::new(),
                    });
                if !held.reporters.contains(&reporter)
                    && held.reporters.len() < crate::command::MAX_REPORTERS
                {
                    held.reporters.push(reporter);
                }
                held.replies.push(reply);
                self.decide_downs(now, proposals);
            }
            Ok(Authorized::List(node)) => {
                let instances = self
                    .catalog
                    .instances_on(&node)
                    .into_iter()
                    .map(|(service, r)| NodeInstance {
                        service,
                        instance_id: r.instance_id.clone(),
                        generation: r.generation,
                        state: r.state,
                        reason: r.reason.clone(),
                        origin: r.origin.role,
                    })
                    .collect();
                let _ = reply.send(Response::Instances(instances));
            }
            Err(response) => {
                self.metrics.rejections.inc();
                let _ = reply.send(response);
            }
        }
    }

    /// Checks that `identity` may make `request` (R10) and turns it into a
    /// command. Agents write only their own node's instances; controllers
    /// only the services their grant names.
    fn authorize(
        &self,
        identity: &Identity,
        session: Option<&(NodeId, AgentEpoch)>,
        request: Request,
    ) -> Result<Authorized, Response> {
        let forbidden = |message: String| Response::Rejected {
            kind: RejectKind::Forbidden,
            message,
        };
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
        let existing = |id: &crate::name::InstanceId| -> Result<(NodeId, ServiceKey), Response> {
            match (self.catalog.instance(id), self.catalog.service_of(id)) {
                (Some(r), Some(key)) => Ok((r.node_id.clone(), key.clone())),
                _ => Err(Response::Rejected {
                    kind: RejectKind::NotFound,
                    message: format!("instance {id} is not registered"),
                }),
            }
        };
        let command = match request {
            Request::Register(reg) => {
                owner_check(&reg.node, &reg.service)?;
                Command::Register(reg)
            }
            Request::Transition {
                instance_id,
                generation,
                to,
                reason,
            } => {
                let (node, service) = existing(&instance_id)?;
                owner_check(&node, &service)?;
                Command::Transition {
                    instance_id,
                    generation,
                    to,
                    reason,
                }
            }
            Request::SetLiveness {
                instance_id,
                generation,
                liveness,
            } => {
                let (node, service) = existing(&instance_id)?;
                owner_check(&node, &service)?;
                Command::SetLiveness {
                    instance_id,
                    generation,
                    liveness,
                }
            }
            Request::Deregister {
                instance_id,
                generation,
            } => {
                let (node, service) = existing(&instance_id)?;
                owner_check(&node, &service)?;
                Command::Deregister {
                    instance_id,
                    generation,
                }
            }
            Request::Leave { epoch } => match (role, session) {
                (Role::Agent, Some((node, _))) => Command::RevokeLease {
                    node: node.clone(),
                    epoch,
                },
                _ => return Err(forbidden("only an agent with a session can leave".into())),
            },
            Request::ReportDown { node, epoch } => match (role, session) {
                (Role::Agent, Some((reporter, _))) => {
                    return Ok(Authorized::Down {
                        reporter: reporter.clone(),
                        node,
                        epoch,
                    })
                }
                _ => {
                    return Err(forbidden(
                        "only an agent with a session can report a down verdict".into(),
                    ))
                }
            },
            Request::NodeInstances => match (role, session) {
                (Role::Agent, Some((node, _))) => return Ok(Authorized::List(node.clone())),
                _ => {
                    return Err(forbidden(
                        "only an agent with a session can list its node's records".into(),
                    ))
                }
            },
            Request::AwaitPropagation {
                service,
                revision,
                timeout_ms,
            } => {
                return Ok(Authorized::Await {
                    service,
                    revision,
                    timeout_ms: timeout_ms.min(30_000),
                });
            }
        };
        Ok(Authorized::Command(command))
    }

    fn envelope(&self, identity: &Identity, command: Command, now: u64) -> Envelope {
        Envelope {
            at_ms: now,
            actor: identity.principal.clone(),
            command,
        }
    }

    /// Applies a batch, makes it durable with one fsync, then answers and
    /// publishes. A storage failure ends the process: the catalog in memory
    /// is ahead of the disk and must not be served.
    async fn commit(&mut self, proposals: Vec<(Envelope, Then)>) {
        let started = Instant::now();
        let mut results = Vec::with_capacity(proposals.len());
        let mut entries = Vec::new();
        for (env, then) in proposals {
            let result = self.catalog.apply(&env);
            if let Some(entry) = result
                .as_ref()
                .ok()
                .and_then(|applied| LogEntry::committed(&env, applied))
            {
                entries.push(entry);
            }
            results.push((env, result, then));
        }
        if !entries.is_empty() {
            let store = self.store.clone();
            let count = entries.len() as u64;
            let written = tokio::task::spawn_blocking(move || store.append(&entries)).await;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "arbiter store write failed; exiting so no undurable change is ever served");
                    std::process::exit(70);
                }
                Err(e) => {
                    tracing::error!(error = %e, "arbiter store writer panicked; exiting");
                    std::process::exit(70);
                }
            }
            self.metrics.commits.inc_by(count);
            self.metrics.batch_size.observe(count as f64);
            self.log_since_compaction += count;
        }
        self.metrics
            .commit_latency
            .observe(started.elapsed().as_secs_f64());
        let now = now_ms();
        let mut changed: Vec<ServiceKey> = Vec::new();
        for (env, result, then) in results {
            if let Ok(applied) = &result {
                changed.extend(applied.services.iter().cloned());
                self.after_commit(&env, applied);
            } else {
                self.metrics.rejections.inc();
            }
            self.answer(then, &env, result);
        }
        changed.sort();
        changed.dedup();
        let mut out = Vec::new();
        self.dist.committed(&changed, now, &self.catalog, &mut out);
        self.carry(out);
        if self.log_since_compaction >= self.config.store.compact_every {
            self.compact().await;
        }
    }

    fn after_commit(&mut self, env: &Envelope, applied: &Applied) {
        match (&env.command, &applied.effect) {
            (Command::Register(_), Effect::Registered { .. }) => {
                self.metrics.registrations.inc();
            }
            (Command::ExpireLease { node, .. }, Effect::ExpiryHeld) => {
                tracing::warn!(node = %node, "mass-expiry guard holds this lease expiry: too many of its zone's sessions are silent at once");
            }
            _ => {}
        }
        if let Command::ExpireLease { node, .. } = &env.command {
            self.expiring.remove(node);
        }
    }

    fn answer(&mut self, then: Then, env: &Envelope, result: Result<Applied, Rejection>) {
        match then {
            Then::Nothing => {
                if let Err(e) = result {
                    tracing::debug!(command = env.command.kind(), error = %e, "internal proposal refused");
                }
            }
            Then::Reply(reply) => {
                let _ = reply.send(response_of(&self.catalog, env, result));
            }
            Then::Welcome(agent) => match result {
                Ok(_) => {
                    let Command::GrantLease { node, ttl_ms, .. } = &env.command else {
                        return;
                    };
                    let lease = self
                        .catalog
                        .leases()
                        .get(node)
                        .map(|l| l.id)
                        .unwrap_or_default();
                    let welcome = SessionDown::Welcome {
                        region: self.region.clone(),
                        shard: self.catalog.params().shard,
                        revision: self.catalog.revision(),
                        lease,
                        ttl_ms: *ttl_ms,
                    };
                    tracing::info!(node = %node, lease = %lease, "agent session started");
                    self.send(agent, welcome);
                }
                Err(e) => {
                    let reason = e.to_string();
                    self.send(
                        agent,
                        SessionDown::Refused {
                            reason: reason.clone(),
                        },
                    );
                    self.close(agent, reason);
                }
            },
        }
    }

    async fn compact(&mut self) {
        let snapshot = self.catalog.export();
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.compact(&snapshot)).await {
            Ok(Ok(())) => {
                self.log_since_compaction = 0;
                tracing::info!(revision = %self.catalog.revision(), "catalog snapshot written; log truncated");
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "snapshot failed; the log keeps growing until the next try")
            }
            Err(e) => tracing::warn!(error = %e, "snapshot task failed"),
        }
    }

    /// Lease deadlines and purges: the leader's own proposals.
    /// Settles held down reports: heard again since the report → a
    /// partition inside the zone, nothing removed; silent for silence_ms →
    /// the verdict is proposed (both signals agree).
    fn decide_downs(&mut self, now: u64, proposals: &mut Vec<(Envelope, Then)>) {
        let silence = self.config.lease.silence_ms;
        let nodes: Vec<NodeId> = self.pending_downs.keys().cloned().collect();
        for node in nodes {
            let heard = self.last_heard.get(&node).copied();
            let reported_at = self.pending_downs[&node].reported_at;
            if heard.is_some_and(|t| t > reported_at) {
                let held = self.pending_downs.remove(&node).expect("listed above");
                self.metrics.down_reports_ignored.inc();
                let ago = now.saturating_sub(heard.unwrap_or(now));
                tracing::warn!(node = %node, reporters = ?held.reporters, "gossip says down but the arbiter still hears the node: a partition inside the zone; nothing removed");
                let message = format!("node {node}'s session with this arbiter is alive (heard {ago} ms ago): treated as a partition inside the zone; nothing removed");
                for reply in held.replies {
                    let _ = reply.send(Response::Rejected {
                        kind: RejectKind::Invalid,
                        message: message.clone(),
                    });
                }
            } else if heard.is_none_or(|t| now.saturating_sub(t) >= silence) {
                let held = self.pending_downs.remove(&node).expect("listed above");
                let command = Command::NodeDown {
                    node,
                    epoch: held.epoch,
                    reporters: held.reporters,
                };
                let mut replies = held.replies.into_iter();
                let first = replies.next();
                let envelope = self.envelope(&held.identity, command, now);
                match first {
                    Some(reply) => proposals.push((envelope, Then::Reply(reply))),
                    None => proposals.push((envelope, Then::Nothing)),
                }
                for reply in replies {
                    let _ = reply.send(Response::Committed {
                        revision: None,
                        generation: None,
                        state: None,
                    });
                }
            }
        }
    }

    fn sweep(&mut self, now: u64, proposals: &mut Vec<(Envelope, Then)>) {
        self.decide_downs(now, proposals);
        let due = self
            .catalog
            .leases()
            .due(now, self.config.guard.max_hold_ms);
        for (node, epoch) in due {
            // One proposal per lease until it commits or is refused.
            if self
                .expiring
                .get(&node)
                .is_some_and(|at| now < at + self.config.lease.ttl_ms)
            {
                continue;
            }
            let silent_in_zone = self.silent_in_zone(&node, now);
            self.expiring.insert(node.clone(), now);
            let command = Command::ExpireLease {
                node,
                epoch,
                silent_in_zone,
            };
            proposals.push((
                Envelope {
                    at_ms: now,
                    actor: self.me.clone(),
                    command,
                },
                Then::Nothing,
            ));
        }
        if now >= self.next_purge_ms {
            self.next_purge_ms = now + self.config.store.purge_interval_ms;
            proposals.push((
                Envelope {
                    at_ms: now,
                    actor: self.me.clone(),
                    command: Command::Purge,
                },
                Then::Nothing,
            ));
        }
    }

    /// How many of `node`'s zone's leaseholders have had silent sessions for
    /// longer than the silence threshold (the node itself included).
    fn silent_in_zone(&self, node: &NodeId, now: u64) -> u32 {
        let leases = self.catalog.leases();
        let Some(zone) = leases.get(node).map(|l| l.zone.clone()) else {
            return 1;
        };
        let silence = self.config.lease.silence_ms;
        leases
            .sorted()
            .into_iter()
            .filter(|l| l.zone == zone)
            .filter(|l| {
                self.last_heard
                    .get(&l.node)
                    .is_none_or(|t| now.saturating_sub(*t) > silence)
            })
            .count()
            .max(1) as u32
    }

    fn fire_wakes(&mut self, now: u64) {
        let later = self.wakes.split_off(&(now + 1));
        let due = std::mem::replace(&mut self.wakes, later);
        let mut out = Vec::new();
        for agent in due.into_values().flatten() {
            self.dist.wake(agent, now, &self.catalog, &mut out);
        }
        self.carry(out);
    }

    fn carry(&mut self, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Send { agent, updates } => {
                    if let Some(conn) = self.conns.get(&agent) {
                        let _ = conn.tx.send(Outbound::Message {
                            message: SessionDown::Update(updates),
                            notify: true,
                        });
                    }
                }
                Output::WakeAt { agent, at_ms } => self.wakes.entry(at_ms).or_default().push(agent),
                Output::Disconnect { agent, reason } => {
                    tracing::warn!(agent, reason = %reason, "disconnecting a stalled agent");
                    self.close(agent, reason);
                }
            }
        }
    }

    /// Answers propagation waits that are complete or past their deadline.
    fn answer_waiters(&mut self, now: u64) {
        let mut still = Vec::new();
        for w in std::mem::take(&mut self.waiters) {
            let (acked, total) = self.dist.propagation(&w.service, w.revision);
            if acked >= total || now >= w.deadline_ms {
                let _ = w.reply.send(Response::Propagated { acked, total });
            } else {
                still.push(w);
            }
        }
        self.waiters = still;
    }

    fn refresh_metrics(&self) {
        let m = &self.metrics;
        m.ready.clear();
        for key in self.catalog.services() {
            if let Some(info) = self.catalog.service(&key) {
                m.ready
                    .get_or_create(&ServiceLabel {
                        service: key.to_string(),
                    })
                    .set(info.ready as i64);
            }
        }
        m.ack_lag.clear();
        for (agent, conn) in &self.conns {
            if let Some((node, _)) = &conn.session {
                m.ack_lag
                    .get_or_create(&NodeLabel {
                        node: node.to_string(),
                    })
                    .set(self.dist.ack_lag(*agent, &self.catalog) as i64);
            }
        }
        let stats = self.dist.stats();
        m.snapshots_sent.set(stats.snapshots_sent as i64);
        m.snapshots_refused.set(stats.snapshots_refused as i64);
        m.snapshots_in_flight
            .set(self.dist.snapshots_in_flight() as i64);
        m.snapshots_in_flight_max
            .set(stats.max_concurrent_snapshots_seen as i64);
        m.stalled_agents.set(stats.stalled_agents as i64);
        m.connected_agents
            .set(self.conns.values().filter(|c| c.session.is_some()).count() as i64);
        m.held_leases.set(self.catalog.leases().held() as i64);
        m.leases.set(self.catalog.leases().len() as i64);
        m.revision.set(self.catalog.revision().0 as i64);
    }

    fn status(&self, now: u64) -> serde_json::Value {
        let agents: Vec<serde_json::Value> = self
            .conns
            .iter()
            .filter_map(|(agent, c)| {
                let (node, epoch) = c.session.as_ref()?;
                Some(serde_json::json!({
                    "node": node.as_str(),
                    "epoch": epoch.0,
                    "last_heard_ms_ago": self.last_heard.get(node).map(|t| now.saturating_sub(*t)),
                    "ack_lag": self.dist.ack_lag(*agent, &self.catalog),
                }))
            })
            .collect();
        serde_json::json!({
            "name": self.config.name,
            "region": self.region.as_str(),
            "shard": self.catalog.params().shard.0,
            "revision": self.catalog.revision().0,
            "services": self.catalog.services().len(),
            "leases": self.catalog.leases().len(),
            "held_leases": self.catalog.leases().held(),
            "snapshots_in_flight": self.dist.snapshots_in_flight(),
            "agents": agents,
        })
    }
}

enum Authorized {
    Command(Command),
    Down {
        reporter: NodeId,
        node: NodeId,
        epoch: AgentEpoch,
    },
    List(NodeId),
    Await {
        service: ServiceKey,
        revision: Revision,
        timeout_ms: u64,
    },
}

/// The answer to a committed or rejected request.
fn response_of(catalog: &Catalog, env: &Envelope, result: Result<Applied, Rejection>) -> Response {
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
            let state = instance
                .and_then(|id| catalog.instance(id))
                .map(|r| r.state);
            Response::Committed {
                revision: applied.revision,
                generation,
                state,
            }
        }
        Err(rejection) => {
            let kind = match rejection {
                Rejection::StaleGeneration { .. } => RejectKind::StaleGeneration,
                Rejection::UnknownInstance { .. } | Rejection::UnknownService { .. } => {
                    RejectKind::NotFound
                }
                _ => RejectKind::Invalid,
            };
            Response::Rejected {
                kind,
                message: rejection.to_string(),
            }
        }
    }
}
