//! The arbiter's core task on one replica: the distributor, the sessions,
//! and (on the leader) the lease deadlines and session silence. Everything
//! reaches it as a `CoreMsg`.
//!
//! The catalog itself is the Raft group's replicated state machine; the core
//! reads it as applied (`AppliedCatalog`) and never applies anything. Writes
//! are proposed to openraft on the leader (`Raft::client_write`, which
//! answers once the entry is committed by a quorum, fsynced, and applied
//! here); a follower hands them to the leader (`PeerRequest::Propose`) and
//! answers its agent once it has applied the revision itself, so the agent's
//! next read on this replica sees its write. Every replica distributes what
//! it has applied to the agents connected to it (R6): revisions are the
//! same everywhere because they come from the one log.
//!
//! Renewals and silence are leader memory (R3): a follower reports which
//! sessions it heard to the leader every sweep interval. A new leader
//! extends every lease by one TTL and counts every session as heard at the
//! moment it took over, so it expires nothing and accepts no down verdict
//! for one silence window after an election.
//!
//! It decides nothing about the catalog itself (that is `Catalog::apply`)
//! and touches no socket (connections hold those); it does read the clock,
//! as the driver of sans-IO state machines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use openraft::ServerState;
use rollcall_config::ArbiterConfig;
use tokio::sync::{mpsc, oneshot};

use crate::catalog::{Applied, Effect, Rejection};
use crate::clock::now_ms;
use crate::command::{Command, Envelope};
use crate::distribution::{DistParams, Distributor, Output};
use crate::endpoint::{Principal, Role};
use crate::ids::{AgentEpoch, AgentId, Revision};
use crate::leader::{agent_principal, LeaderMemory, LeaderParams, Verdict};
use crate::name::{NodeId, PrincipalName, ServiceKey};
use crate::peer_protocol::{Heard, PeerRequest, PeerResponse};
use crate::protocol::{Request, Response, ServiceUpdate, SessionDown, SessionUp};
use crate::raft::{AppliedCatalog, AppliedMark, CatalogRaftNode, Proposal, ReplicaId};
use crate::regions::{regions_update, RegionsEpoch, RegionsFeed};
use crate::remote::RemoteViews;
use crate::server::messages::{AdminQuery, CoreMsg, Outbound};
use crate::server::metrics::{
    KindLabel, Metrics, NodeLabel, RegionLabel, ReplicaLabel, ServiceLabel,
};
use crate::server::peer::{self, PeerError, Peers};
use crate::sessions::{down_outcome, Accepted, DownOutcome, Rules, Sessions, Step};

/// What to do once a proposal is decided.
enum Then {
    Reply(oneshot::Sender<Response>),
    Welcome(AgentId),
    Nothing,
}

/// How a proposal ended.
enum Decided {
    /// Committed and applied here (this replica leads).
    Local(Result<Applied, Rejection>),
    /// The leader's answer to a forwarded proposal.
    Remote(Response),
}

/// Results of work the core started on other tasks.
enum Done {
    /// The leader's answer to a proposal this follower handed over.
    Forwarded {
        envelope: Envelope,
        then: Then,
        response: Response,
    },
    /// A batch was committed and applied here (this replica leads), with
    /// each command's result, or failed as a whole with this answer.
    Batch {
        items: Vec<(Envelope, Then)>,
        outcome: Result<Vec<Result<Applied, Rejection>>, Response>,
    },
    /// The leader refused these renewals.
    Refused(Vec<(NodeId, String)>),
    /// A proposal being handed over when this replica became the leader.
    ProposeAgain { envelope: Envelope, then: Then },
    /// A down report being handed over when this replica became the leader.
    ReportAgain {
        reporter: NodeId,
        actor: Principal,
        node: NodeId,
        epoch: AgentEpoch,
        reply: oneshot::Sender<Response>,
    },
}

/// How handing a request to the leader ended.
enum Forwarded {
    /// The leader's answer, or why there was none.
    Answer(Response),
    /// This replica became the leader first: the request is back, to be
    /// handled here.
    NowLeader(PeerRequest),
}

struct Waiter {
    service: ServiceKey,
    revision: Revision,
    deadline_ms: u64,
    reply: oneshot::Sender<Response>,
}

/// A forwarded write's answer, held until this replica applied it.
struct Deferred {
    revision: Revision,
    deadline_ms: u64,
    envelope: Envelope,
    then: Then,
    response: Response,
}

/// What this replica is in its Raft group. Since when it leads is the
/// leader memory's.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Standing {
    /// It leads.
    Leader,
    /// It follows `leader` (id and QUIC address), if one is known.
    Follower { leader: Option<(ReplicaId, String)> },
}

/// What a follower heard since its last report to the leader.
struct HeardNote {
    epoch: AgentEpoch,
    at_ms: u64,
    renewed: bool,
}

/// The parts of a replica the core drives.
pub struct Replica {
    /// This replica's id.
    pub id: ReplicaId,
    /// Its Raft node.
    pub raft: CatalogRaftNode,
    /// Its applied catalog.
    pub applied: AppliedCatalog,
    /// Its client to the other replicas.
    pub peers: Arc<Peers>,
}

/// The core's state.
pub struct Core {
    config: ArbiterConfig,
    /// Every connection's session, and who may hold, watch and write
    /// what (R10).
    sessions: Sessions,
    replica: Replica,
    standing: Standing,
    mark: AppliedMark,
    dist: Distributor,
    metrics: Arc<Metrics>,
    /// Where each connection's messages go.
    conns: HashMap<AgentId, mpsc::UnboundedSender<Outbound>>,
    /// Session silence, held down reports, expiries (R3, R4).
    leader: LeaderMemory<oneshot::Sender<Response>>,
    heard_out: HashMap<NodeId, HeardNote>,
    wakes: BTreeMap<u64, Vec<AgentId>>,
    waiters: Vec<Waiter>,
    deferred: Vec<Deferred>,
    /// Since when (ms) this leader has had no quorum acknowledgement for
    /// longer than `lease.silence_ms`; `None` while it has one.
    quorum_lost_at: Option<u64>,
    snapshots_seen: Option<crate::raft::LogId>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: Option<mpsc::UnboundedReceiver<Done>>,
    /// Leader: proposals waiting for the next batch.
    queue: Vec<(Envelope, Then)>,
    /// Leader: batches sent to openraft and not yet answered.
    in_flight: usize,
    /// The remote view the region bridge reports (memory only; the admin
    /// endpoint reads and writes it through this core's mailbox).
    remote: RemoteViews,
    /// What each session was last told of regions and policies.
    regions: RegionsFeed,
    /// When the sessions' regions messages are next looked at (ms).
    next_regions_ms: u64,
}

/// How often every session's regions message is looked at, ms.
const REGIONS_INTERVAL_MS: u64 = 1_000;

impl Core {
    /// A core over a replica whose Raft node is running.
    pub fn new(config: ArbiterConfig, replica: Replica, metrics: Arc<Metrics>) -> Self {
        let now = now_ms();
        let dist = Distributor::new(
            DistParams::from(&config),
            crate::codec::shared_service_snapshot,
        );
        let (region, shard) = {
            let cat = replica.applied.lock();
            (cat.params().region.clone(), cat.params().shard)
        };
        let me = Principal {
            role: Role::Arbiter,
            name: PrincipalName::new(&config.name)
                .unwrap_or_else(|_| PrincipalName::new("arbiter").expect("a valid constant")),
        };
        let mark = replica.applied.mark();
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Core {
            leader: LeaderMemory::new(LeaderParams::from(&config), me, now),
            remote: RemoteViews::new(region.clone()),
            sessions: Sessions::new(Rules::new(&config, region), shard, config.lease.ttl_ms),
            config,
            replica,
            standing: Standing::Follower { leader: None },
            mark,
            dist,
            metrics,
            conns: HashMap::default(),
            heard_out: HashMap::default(),
            wakes: BTreeMap::new(),
            waiters: Vec::new(),
            deferred: Vec::new(),
            quorum_lost_at: None,
            snapshots_seen: None,
            done_tx,
            done_rx: Some(done_rx),
            queue: Vec::new(),
            in_flight: 0,
            regions: RegionsFeed::new(),
            next_regions_ms: now,
        }
    }

    fn is_leader(&self) -> bool {
        matches!(self.standing, Standing::Leader)
    }

    /// Runs until every sender of `rx` is gone.
    pub async fn run(mut self, mut rx: mpsc::Receiver<CoreMsg>) {
        let sweep = Duration::from_millis(self.config.lease.sweep_interval_ms);
        let mut next_sweep = Instant::now() + sweep;
        let mut marks = self.replica.applied.watch();
        let mut raft_metrics = self.replica.raft.metrics();
        let mut done_rx = self.done_rx.take().expect("run is called once");
        self.on_raft_metrics(&raft_metrics.borrow_and_update().clone());
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
                    while proposals.len() < 4096 {
                        match rx.try_recv() {
                            Ok(msg) => self.handle(msg, &mut proposals),
                            Err(_) => break,
                        }
                    }
                }
                Some(done) = done_rx.recv() => self.done(done),
                changed = marks.changed() => {
                    if changed.is_err() { return }
                    let mark = *marks.borrow_and_update();
                    self.on_applied(mark);
                }
                changed = raft_metrics.changed() => {
                    if changed.is_err() { return }
                    let m = raft_metrics.borrow_and_update().clone();
                    self.on_raft_metrics(&m);
                }
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
            let now = now_ms();
            if Instant::now() >= next_sweep {
                next_sweep = Instant::now() + sweep;
                self.sweep(now, &mut proposals);
                self.resend_unacked(now);
                self.report_heard(now);
                self.expire_deferred(now);
            }
            if now >= self.next_regions_ms {
                self.next_regions_ms = now + REGIONS_INTERVAL_MS;
                let agents: Vec<AgentId> = self.conns.keys().copied().collect();
                self.push_regions(&agents, now);
            }
            self.fire_wakes(now);
            self.answer_waiters(now);
            if !proposals.is_empty() {
                self.propose(proposals);
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
                self.sessions.connect(agent, identity);
                self.conns.insert(agent, tx);
            }
            CoreMsg::Session { agent, msg } => self.session(agent, msg, now, proposals),
            CoreMsg::Request {
                agent,
                request,
                reply,
            } => self.request(agent, request, reply, now, proposals),
            CoreMsg::Sent { agent } => {
                let mut out = Vec::new();
                let cat = self.replica.applied.lock();
                self.dist.sent(agent, now, &cat, &mut out);
                drop(cat);
                self.carry(out);
            }
            CoreMsg::Closed { agent } => {
                self.dist.disconnect(agent);
                self.regions.forget(agent);
                self.conns.remove(&agent);
                if let Some((node, _)) = self.sessions.disconnect(agent) {
                    tracing::info!(node = %node, agent, "agent session closed");
                }
            }
            CoreMsg::Admin(AdminQuery::Status(reply)) => {
                let _ = reply.send(self.status(now));
            }
            CoreMsg::Admin(AdminQuery::Remote(reply)) => {
                let _ = reply.send(self.remote_json(now));
            }
            CoreMsg::Admin(AdminQuery::PutRemote {
                view,
                heard_ms_ago,
                max_age_ms,
                reply,
            }) => {
                let put = self
                    .remote
                    .put(view, heard_ms_ago, max_age_ms, now)
                    .map_err(|e| e.to_string());
                let _ = reply.send(put);
            }
            CoreMsg::Admin(AdminQuery::RemoteHeard {
                region,
                version,
                as_of_ms,
                heard_ms_ago,
                reply,
            }) => {
                let confirmed = self
                    .remote
                    .confirm(&region, version, as_of_ms, heard_ms_ago, now);
                let _ = reply.send(confirmed);
            }
            CoreMsg::Admin(AdminQuery::RefreshMetrics(reply)) => {
                self.refresh_metrics();
                let _ = reply.send(());
            }
            CoreMsg::Admin(AdminQuery::Propose {
                actor,
                command,
                reply,
            }) => {
                let envelope = Envelope {
                    at_ms: now,
                    actor,
                    command,
                };
                proposals.push((envelope, Then::Reply(reply)));
            }
            CoreMsg::Peer { request, reply } => self.peer(request, reply, now, proposals),
        }
    }

    fn send(&self, agent: AgentId, message: SessionDown) {
        if let Some(tx) = self.conns.get(&agent) {
            let _ = tx.send(Outbound::Message {
                message,
                notify: false,
            });
        }
    }

    fn close(&mut self, agent: AgentId, reason: String) {
        if let Some(tx) = self.conns.get(&agent) {
            let _ = tx.send(Outbound::Close(reason));
        }
    }

    fn refuse(&mut self, agent: AgentId, reason: String) {
        self.send(
            agent,
            SessionDown::Refused {
                reason: reason.clone(),
            },
        );
        self.close(agent, reason);
    }

    /// Notes that `node` was heard now; a follower also queues it for its
    /// next report to the leader.
    fn heard(&mut self, node: &NodeId, epoch: AgentEpoch, now: u64, renewed: bool) {
        self.leader.heard(node, now);
        if !self.is_leader() {
            let note = self.heard_out.entry(node.clone()).or_insert(HeardNote {
                epoch,
                at_ms: now,
                renewed: false,
            });
            note.epoch = epoch;
            note.at_ms = now;
            note.renewed |= renewed;
        }
    }

    /// One message on a session stream, as the session layer reads it.
    fn session(
        &mut self,
        agent: AgentId,
        msg: SessionUp,
        now: u64,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        let (heard, step) = self.sessions.message(agent, msg, now);
        if let Some((node, epoch, renewed)) = heard {
            self.heard(&node, epoch, now, renewed);
        }
        match step {
            Step::Grant(envelope) => proposals.push((envelope, Then::Welcome(agent))),
            Step::Refuse(reason) => self.refuse(agent, reason),
            Step::Close(reason) => self.close(agent, reason),
            Step::Deny { service, reason } => {
                let update = SessionDown::Update(vec![ServiceUpdate::Denied { service, reason }]);
                self.send(agent, update);
            }
            Step::Subscribe { service, have } => {
                let mut out = Vec::new();
                let cat = self.replica.applied.lock();
                self.dist
                    .subscribe(agent, service, have, now, &cat, &mut out);
                drop(cat);
                // The service's policy goes ahead of its endpoints, so an
                // agent never routes a newly followed service without it.
                self.regions.touch(agent);
                self.push_regions(&[agent], now);
                self.carry(out);
            }
            Step::Unsubscribe(service) => {
                self.dist.unsubscribe(agent, &service);
                self.regions.touch(agent);
            }
            Step::Ack { service, revision } => {
                self.dist.ack(agent, &service, revision);
                self.answer_waiters(now);
            }
            Step::Renew { node, epoch, actor } => {
                self.metrics.renewals.inc();
                if !self.is_leader() {
                    // Queued by `heard` for the leader.
                    return;
                }
                match self.renew(&node, epoch, now, &actor) {
                    Ok(Some(reinstate)) => proposals.push((reinstate, Then::Nothing)),
                    Ok(None) => {}
                    Err(reason) => self.refuse(agent, reason),
                }
            }
            Step::Nothing => {}
        }
    }

    /// Renews a lease in the leader's memory at `at`; a held lease whose
    /// session is back is reinstated by the returned proposal (R3).
    fn renew(
        &mut self,
        node: &NodeId,
        epoch: AgentEpoch,
        at: u64,
        actor: &Principal,
    ) -> Result<Option<Envelope>, String> {
        let leader = &self.leader;
        self.replica
            .applied
            .with_lease_memory(|leases| leader.renew(leases, node, epoch, at, actor))
            .map_err(|e| e.to_string())
    }

    fn request(
        &mut self,
        agent: AgentId,
        request: Request,
        reply: oneshot::Sender<Response>,
        now: u64,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        let accepted = {
            let cat = self.replica.applied.lock();
            self.sessions.request(agent, request, &cat, now)
        };
        match accepted {
            Ok(Accepted::Propose(envelope)) => proposals.push((envelope, Then::Reply(reply))),
            // Answered from acknowledgements, not committed: this replica's
            // agents and every other replica's.
            Ok(Accepted::Await {
                service,
                revision,
                timeout_ms,
            }) => self.await_everywhere(service, revision, timeout_ms, now, reply),
            Ok(Accepted::Down {
                reporter,
                actor,
                node,
                epoch,
            }) => self.report_down(reporter, actor, node, epoch, now, reply, proposals),
            Ok(Accepted::List(node)) => {
                let cat = self.replica.applied.lock();
                let _ = reply.send(crate::answers::node_instances(&cat, &node));
            }
            Err(response) => {
                self.metrics.rejections.inc();
                let _ = reply.send(response);
            }
        }
    }

    /// A gossip down report: the leader holds it for the second signal, a
    /// follower hands it to the leader.
    #[allow(clippy::too_many_arguments)]
    fn report_down(
        &mut self,
        reporter: NodeId,
        actor: Principal,
        node: NodeId,
        epoch: AgentEpoch,
        now: u64,
        reply: oneshot::Sender<Response>,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        if !self.is_leader() {
            let request = PeerRequest::ReportDown {
                reporter,
                actor,
                node,
                epoch,
            };
            // The leader may hold it for up to silence_ms.
            let wait = Duration::from_millis(
                self.config.lease.silence_ms + self.config.raft.write_timeout_ms,
            );
            let done = self.done_tx.clone();
            self.forward(request, wait, move |answer| match answer {
                Forwarded::Answer(answer) => {
                    let _ = reply.send(answer);
                }
                Forwarded::NowLeader(PeerRequest::ReportDown {
                    reporter,
                    actor,
                    node,
                    epoch,
                }) => {
                    let _ = done.send(Done::ReportAgain {
                        reporter,
                        actor,
                        node,
                        epoch,
                        reply,
                    });
                }
                Forwarded::NowLeader(_) => {
                    let _ = reply.send(crate::answers::unavailable("retry".into()));
                }
            });
            return;
        }
        // The second signal (R4): this arbiter's own session with the node
        // must be silent for silence_ms; the leader memory holds the report
        // until it is, or until the node is heard (a partition).
        let verdicts = self
            .leader
            .report_down(reporter, actor, node, epoch, now, Some(reply));
        self.verdicts(verdicts, proposals);
    }

    /// Sends `request` to the leader on another task; `then` gets its
    /// `Answer`, or why there was none. While no request has reached a
    /// leader (none known, or its address does not answer a handshake) it
    /// keeps looking until `wait` is over; a leader change while waiting for
    /// the answer ends the wait with "retry", since the old leader may be
    /// gone.
    fn forward(
        &self,
        request: PeerRequest,
        wait: Duration,
        then: impl FnOnce(Forwarded) + Send + 'static,
    ) {
        let peers = self.replica.peers.clone();
        let mut metrics = self.replica.raft.metrics();
        let me = self.replica.id;
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + wait;
            let answer = loop {
                let leader = {
                    let m = metrics.borrow_and_update();
                    if m.current_leader == Some(me) {
                        drop(m);
                        break Forwarded::NowLeader(request);
                    }
                    m.current_leader.and_then(|id| {
                        m.membership_config
                            .nodes()
                            .find(|(n, _)| **n == id)
                            .map(|(_, node)| (id, node.addr.clone()))
                    })
                };
                let Some((leader, addr)) = leader else {
                    // No leader known: wait for news.
                    if tokio::time::timeout_at(deadline, metrics.changed())
                        .await
                        .is_err()
                    {
                        break Forwarded::Answer(no_leader());
                    }
                    continue;
                };
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let moved = async {
                    loop {
                        if metrics.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                        if metrics.borrow().current_leader != Some(leader) {
                            return;
                        }
                    }
                };
                tokio::select! {
                    answer = peers.call(&addr, &request, left) => match answer {
                        Ok(PeerResponse::Answer(response)) => break Forwarded::Answer(response),
                        Ok(_) => break Forwarded::Answer(crate::answers::unavailable(format!("the leader at {addr} answered out of protocol"))),
                        Err(PeerError::Unreachable { .. }) if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => break Forwarded::Answer(crate::answers::unavailable(format!("the leader did not answer: {e}; retry"))),
                    },
                    _ = moved => break Forwarded::Answer(crate::answers::unavailable(format!(
                        "leadership moved away from replica {leader} while it held this write; retry"
                    ))),
                }
            };
            then(answer);
        });
    }

    /// Waits for the acknowledgements of `revision` by the agents of this
    /// replica and of every other, and answers their sums.
    fn await_everywhere(
        &mut self,
        service: ServiceKey,
        revision: Revision,
        timeout_ms: u64,
        now: u64,
        reply: oneshot::Sender<Response>,
    ) {
        let (local_tx, local_rx) = oneshot::channel();
        self.waiters.push(Waiter {
            service: service.clone(),
            revision,
            deadline_ms: now + timeout_ms,
            reply: local_tx,
        });
        self.answer_waiters(now);
        let others: Vec<String> = self.other_replicas().into_iter().map(|(_, a)| a).collect();
        let peers = self.replica.peers.clone();
        tokio::spawn(async move {
            let request = PeerRequest::Propagation {
                service,
                revision,
                timeout_ms,
            };
            let wait = Duration::from_millis(timeout_ms + 1_000);
            let mut calls = tokio::task::JoinSet::new();
            for addr in others {
                let (peers, request) = (peers.clone(), request.clone());
                calls.spawn(async move { peers.call(&addr, &request, wait).await });
            }
            let answers = calls.join_all().await;
            let (mut acked, mut total) = match local_rx.await {
                Ok(Response::Propagated { acked, total }) => (acked, total),
                _ => (0, 0),
            };
            for answer in answers {
                match answer {
                    Ok(PeerResponse::Answer(Response::Propagated { acked: a, total: t })) => {
                        acked += a;
                        total += t;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "a replica did not report propagation"),
                }
            }
            let _ = reply.send(Response::Propagated { acked, total });
        });
    }

    /// The other replicas of the group, with their QUIC addresses.
    fn other_replicas(&self) -> Vec<(ReplicaId, String)> {
        let metrics = self.replica.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .nodes()
            .filter(|(id, _)| **id != self.replica.id)
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect()
    }

    /// What a peer replica hands this one.
    fn peer(
        &mut self,
        request: PeerRequest,
        reply: oneshot::Sender<PeerResponse>,
        now: u64,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        let answer = |reply: oneshot::Sender<PeerResponse>| {
            let (tx, rx) = oneshot::channel::<Response>();
            tokio::spawn(async move {
                let response = rx.await.unwrap_or_else(|_| {
                    crate::answers::unavailable("the write was dropped; retry".into())
                });
                let _ = reply.send(PeerResponse::Answer(response));
            });
            tx
        };
        match request {
            PeerRequest::Propose(envelope) => {
                if !self.is_leader() {
                    let _ = reply.send(PeerResponse::Answer(self.not_leader()));
                    return;
                }
                proposals.push((envelope, Then::Reply(answer(reply))));
            }
            PeerRequest::ReportDown {
                reporter,
                actor,
                node,
                epoch,
            } => {
                if !self.is_leader() {
                    let _ = reply.send(PeerResponse::Answer(self.not_leader()));
                    return;
                }
                self.report_down(reporter, actor, node, epoch, now, answer(reply), proposals);
            }
            PeerRequest::Heard(heard) => {
                let mut refused = Vec::new();
                if self.is_leader() {
                    for h in heard {
                        let at = now.saturating_sub(h.ago_ms);
                        self.leader.heard(&h.node, at);
                        if h.renewed {
                            let actor = agent_principal(&h.node);
                            match self.renew(&h.node, h.epoch, at, &actor) {
                                Ok(Some(reinstate)) => proposals.push((reinstate, Then::Nothing)),
                                Ok(None) => {}
                                Err(reason) => refused.push((h.node, reason)),
                            }
                        }
                    }
                }
                let _ = reply.send(PeerResponse::Refused(refused));
            }
            PeerRequest::Propagation {
                service,
                revision,
                timeout_ms,
            } => {
                self.waiters.push(Waiter {
                    service,
                    revision,
                    deadline_ms: now + timeout_ms.min(30_000),
                    reply: answer(reply),
                });
                self.answer_waiters(now);
            }
            PeerRequest::AppendEntries(_)
            | PeerRequest::Vote(_)
            | PeerRequest::InstallSnapshot(_)
            | PeerRequest::Membership(_) => {
                let _ = reply.send(PeerResponse::Answer(crate::answers::unavailable(
                    "Raft messages are not the core's".into(),
                )));
            }
        }
    }

    fn not_leader(&self) -> Response {
        match &self.standing {
            Standing::Follower {
                leader: Some((id, addr)),
            } => crate::answers::unavailable(format!(
                "this replica is not the leader; the leader is replica {id} at {addr}; retry"
            )),
            _ => no_leader(),
        }
    }

    /// Proposes: on the leader the proposals join the queue of the next
    /// batch, which is one Raft entry (group commit: one fsynced append and
    /// one replication round for all of them) with at most two batches in
    /// flight and at most 1,024 commands each; a follower hands each to
    /// the leader; with no leader known
    /// each is refused as unavailable once `write_timeout_ms` has passed.
    /// The answers come back as `Done`.
    fn propose(&mut self, proposals: Vec<(Envelope, Then)>) {
        if self.is_leader() {
            self.queue.extend(proposals);
            self.send_batches();
            return;
        }
        let timeout = Duration::from_millis(self.config.raft.write_timeout_ms);
        for (envelope, then) in proposals {
            let done = self.done_tx.clone();
            let request = PeerRequest::Propose(envelope.clone());
            self.forward(
                request,
                timeout + Duration::from_secs(1),
                move |forwarded| {
                    let _ = done.send(match forwarded {
                        Forwarded::Answer(response) => Done::Forwarded {
                            envelope,
                            then,
                            response,
                        },
                        Forwarded::NowLeader(_) => Done::ProposeAgain { envelope, then },
                    });
                },
            );
        }
    }

    /// Sends queued proposals as batches while fewer than two are in
    /// flight.
    fn send_batches(&mut self) {
        const MAX_IN_FLIGHT: usize = 2;
        const MAX_BATCH: usize = 1_024;
        let timeout = Duration::from_millis(self.config.raft.write_timeout_ms);
        while self.in_flight < MAX_IN_FLIGHT && !self.queue.is_empty() {
            let take = self.queue.len().min(MAX_BATCH);
            let items: Vec<(Envelope, Then)> = self.queue.drain(..take).collect();
            self.in_flight += 1;
            let proposal = Proposal {
                envelopes: items.iter().map(|(e, _)| e.clone()).collect(),
            };
            let raft = self.replica.raft.clone();
            let metrics = self.metrics.clone();
            let done = self.done_tx.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let outcome = match tokio::time::timeout(timeout, raft.client_write(proposal)).await {
                    Ok(Ok(written)) if written.data.results.len() == items.len() => {
                        metrics
                            .commit_latency
                            .observe(started.elapsed().as_secs_f64());
                        metrics.batch_size.observe(items.len() as f64);
                        Ok(written.data.results)
                    }
                    Ok(Ok(written)) => Err(crate::answers::unavailable(format!(
                        "the batch applied {} results for {} commands",
                        written.data.results.len(),
                        items.len()
                    ))),
                    Ok(Err(e)) if peer::is_forward(&e) => Err(crate::answers::unavailable(format!(
                        "leadership moved while committing: {e}; retry"
                    ))),
                    Ok(Err(e)) => Err(crate::answers::unavailable(format!("not committed: {e}"))),
                    Err(_) => Err(crate::answers::unavailable(format!(
                        "not committed within {} ms: this region's arbiter group has no quorum \
                         (fewer than a majority of replicas reachable); writes resume when it has one",
                        timeout.as_millis()
                    ))),
                };
                let _ = done.send(Done::Batch { items, outcome });
            });
        }
    }

    fn done(&mut self, done: Done) {
        match done {
            Done::Forwarded {
                envelope,
                then,
                response,
            } => {
                self.leader.settled(&envelope.command);
                // Answer once this replica has applied the revision, so the
                // agent reads its own write here.
                if let Response::Committed {
                    revision: Some(revision),
                    ..
                } = &response
                {
                    if *revision > self.mark.revision {
                        self.deferred.push(Deferred {
                            revision: *revision,
                            deadline_ms: now_ms() + self.config.raft.write_timeout_ms,
                            envelope,
                            then,
                            response,
                        });
                        return;
                    }
                }
                self.finish(then, &envelope, Decided::Remote(response));
            }
            Done::Batch { items, outcome } => {
                self.in_flight = self.in_flight.saturating_sub(1);
                match outcome {
                    Ok(results) => {
                        for ((envelope, then), result) in items.into_iter().zip(results) {
                            match &result {
                                Ok(applied) => {
                                    self.metrics.commits.inc();
                                    self.after_commit(&envelope, applied);
                                }
                                Err(_) => {
                                    self.metrics.rejections.inc();
                                }
                            }
                            self.finish(then, &envelope, Decided::Local(result));
                        }
                    }
                    Err(response) => {
                        for (envelope, then) in items {
                            self.leader.settled(&envelope.command);
                            self.finish(then, &envelope, Decided::Remote(response.clone()));
                        }
                    }
                }
                self.send_batches();
            }
            Done::ProposeAgain { envelope, then } => self.propose(vec![(envelope, then)]),
            Done::ReportAgain {
                reporter,
                actor,
                node,
                epoch,
                reply,
            } => {
                let mut proposals = Vec::new();
                self.report_down(
                    reporter,
                    actor,
                    node,
                    epoch,
                    now_ms(),
                    reply,
                    &mut proposals,
                );
                if !proposals.is_empty() {
                    self.propose(proposals);
                }
            }
            Done::Refused(refused) => {
                for (node, reason) in refused {
                    let agents: Vec<AgentId> = self
                        .sessions
                        .agents()
                        .filter(|a| self.sessions.held(*a).is_some_and(|(n, _)| *n == node))
                        .collect();
                    for agent in agents {
                        self.refuse(agent, reason.clone());
                    }
                }
            }
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
        self.leader.settled(&env.command);
    }

    fn finish(&mut self, then: Then, env: &Envelope, decided: Decided) {
        match then {
            Then::Nothing => match decided {
                Decided::Local(Err(e)) => {
                    tracing::debug!(command = env.command.kind(), error = %e, "internal proposal refused")
                }
                Decided::Remote(Response::Rejected { message, .. }) => {
                    tracing::debug!(command = env.command.kind(), error = %message, "internal proposal refused")
                }
                _ => {}
            },
            Then::Reply(reply) => {
                let response = match decided {
                    Decided::Local(result) => {
                        crate::answers::response(&self.replica.applied.lock(), env, result)
                    }
                    Decided::Remote(response) => response,
                };
                let _ = reply.send(response);
            }
            Then::Welcome(agent) => {
                let refusal = match decided {
                    Decided::Local(Ok(_)) | Decided::Remote(Response::Committed { .. }) => None,
                    Decided::Local(Err(e)) => Some(e.to_string()),
                    Decided::Remote(Response::Rejected { message, .. }) => Some(message),
                    Decided::Remote(other) => Some(format!("unexpected answer {other:?}")),
                };
                if let Some(reason) = refusal {
                    self.refuse(agent, reason);
                    return;
                }
                let Command::GrantLease { node, ttl_ms, .. } = &env.command else {
                    return;
                };
                let cat = self.replica.applied.lock();
                let lease = cat.leases().get(node).map(|l| l.id).unwrap_or_default();
                let welcome = SessionDown::Welcome {
                    region: self.sessions.rules().region.clone(),
                    shard: cat.params().shard,
                    revision: cat.revision(),
                    lease,
                    ttl_ms: *ttl_ms,
                };
                drop(cat);
                tracing::info!(node = %node, lease = %lease, "agent session started");
                self.send(agent, welcome);
            }
        }
    }

    /// The replica applied more of the log (or installed a snapshot):
    /// distributes what changed and answers what waited for it.
    fn on_applied(&mut self, mark: AppliedMark) {
        let now = now_ms();
        let previous = std::mem::replace(&mut self.mark, mark);
        let cat = self.replica.applied.lock();
        let changed = if mark.installs != previous.installs {
            None
        } else {
            cat.delta_log().services_after(previous.revision)
        };
        let changed = changed.unwrap_or_else(|| cat.services());
        let mut out = Vec::new();
        self.dist.committed(&changed, now, &cat, &mut out);
        drop(cat);
        self.carry(out);
        if mark.installs != previous.installs && self.is_leader() {
            let now = now_ms();
            self.replica
                .applied
                .with_lease_memory(|leases| leases.extend_all(now));
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.revision <= mark.revision);
        self.deferred = waiting;
        for d in ready {
            self.finish(d.then, &d.envelope, Decided::Remote(d.response));
        }
        self.answer_waiters(now);
    }

    /// Answers deferred writes whose revision has not arrived in time (this
    /// replica lags): the write is committed, the answer says so.
    fn expire_deferred(&mut self, now: u64) {
        let (late, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| now >= d.deadline_ms);
        self.deferred = waiting;
        for d in late {
            tracing::warn!(revision = %d.revision, applied = %self.mark.revision, "this replica lags the leader; answering a committed write before applying it");
            self.finish(d.then, &d.envelope, Decided::Remote(d.response));
        }
    }

    fn on_raft_metrics(&mut self, m: &openraft::RaftMetrics<ReplicaId, openraft::BasicNode>) {
        let now = now_ms();
        let leads = m.state == ServerState::Leader && m.current_leader == Some(self.replica.id);
        let standing = if leads {
            Standing::Leader
        } else {
            let leader = m.current_leader.and_then(|id| {
                m.membership_config
                    .nodes()
                    .find(|(n, _)| **n == id)
                    .map(|(_, node)| (id, node.addr.clone()))
            });
            Standing::Follower { leader }
        };
        if m.snapshot != self.snapshots_seen && m.snapshot.is_some() {
            self.snapshots_seen = m.snapshot;
            self.metrics.raft_snapshots.inc();
        }
        if standing == self.standing {
            return;
        }
        match (&self.standing, &standing) {
            (Standing::Follower { .. }, Standing::Leader) => {
                // R3: no lease expires and no down verdict is accepted for
                // having been silent towards the previous leader.
                let leader = &mut self.leader;
                self.replica
                    .applied
                    .with_lease_memory(|leases| leader.take_office(now, leases));
                self.heard_out.clear();
                tracing::info!(
                    replica = self.replica.id,
                    term = m.current_term,
                    "this replica leads; every lease extended by one TTL"
                );
            }
            (Standing::Leader, Standing::Follower { leader }) => {
                tracing::warn!(replica = self.replica.id, leader = ?leader, "this replica no longer leads");
                let queued = std::mem::take(&mut self.queue);
                if !queued.is_empty() {
                    self.standing = standing.clone();
                    self.propose(queued);
                }
                for held in self.leader.step_down() {
                    for reply in held.waiting {
                        let _ = reply.send(crate::answers::unavailable(
                            "this replica stopped leading while holding the down report; report again".into(),
                        ));
                    }
                }
            }
            (_, Standing::Follower { leader }) => {
                tracing::info!(replica = self.replica.id, leader = ?leader, "leader changed");
            }
            _ => {}
        }
        self.standing = standing;
    }

    /// A follower tells the leader which sessions it heard.
    fn report_heard(&mut self, now: u64) {
        if self.is_leader() || self.heard_out.is_empty() {
            return;
        }
        let Standing::Follower {
            leader: Some((_, addr)),
        } = &self.standing
        else {
            return;
        };
        let heard: Vec<Heard> = self
            .heard_out
            .drain()
            .map(|(node, note)| Heard {
                node,
                epoch: note.epoch,
                ago_ms: now.saturating_sub(note.at_ms),
                renewed: note.renewed,
            })
            .collect();
        let addr = addr.clone();
        let peers = self.replica.peers.clone();
        let done = self.done_tx.clone();
        let wait = Duration::from_millis(self.config.raft.write_timeout_ms);
        tokio::spawn(async move {
            match peers.call(&addr, &PeerRequest::Heard(heard), wait).await {
                Ok(PeerResponse::Refused(refused)) if !refused.is_empty() => {
                    let _ = done.send(Done::Refused(refused));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "could not report heard sessions to the leader")
                }
            }
        });
    }

    /// Carries settled down reports: a partition answers its reporters,
    /// a verdict is proposed (answering the first reporter when committed,
    /// the others at once).
    fn verdicts(
        &mut self,
        verdicts: Vec<Verdict<oneshot::Sender<Response>>>,
        proposals: &mut Vec<(Envelope, Then)>,
    ) {
        for verdict in verdicts {
            if let Verdict::Partition {
                node, reporters, ..
            } = &verdict
            {
                self.metrics.down_reports_ignored.inc();
                tracing::warn!(node = %node, reporters = ?reporters, "gossip says down but the arbiter still hears the node: a partition inside the zone; nothing removed");
            }
            match down_outcome(verdict) {
                DownOutcome::Answer { waiting, answer } => {
                    for reply in waiting {
                        let _ = reply.send(answer.clone());
                    }
                }
                DownOutcome::Propose {
                    envelope,
                    first,
                    others,
                    answer,
                } => {
                    let then = first.map_or(Then::Nothing, Then::Reply);
                    proposals.push((envelope, then));
                    for reply in others {
                        let _ = reply.send(answer.clone());
                    }
                }
            }
        }
    }

    /// Whether this leader's quorum answers. A leader that has had no
    /// quorum acknowledgement for `lease.silence_ms` commits nothing, so no
    /// agent could hold a session: silence then says nothing about the
    /// nodes (R3). It proposes no expiry or down verdict meanwhile, and
    /// when the quorum answers again it starts over as a new leader would:
    /// every lease extended by one TTL, every session counted as heard now.
    fn has_quorum(&mut self, now: u64) -> bool {
        let age = self.replica.raft.metrics().borrow().millis_since_quorum_ack;
        let lost = age.is_some_and(|ms| ms > self.config.lease.silence_ms);
        match (self.quorum_lost_at, lost) {
            (None, true) => {
                tracing::warn!(
                    replica = self.replica.id,
                    "this leader has no quorum: no lease expires and no down verdict is taken until it returns"
                );
                self.quorum_lost_at = Some(now);
            }
            (Some(since), false) => {
                self.quorum_lost_at = None;
                let leader = &mut self.leader;
                self.replica
                    .applied
                    .with_lease_memory(|leases| leader.take_office(now, leases));
                tracing::info!(
                    replica = self.replica.id,
                    without_ms = now.saturating_sub(since),
                    "quorum back; every lease extended by one TTL"
                );
            }
            _ => {}
        }
        !lost
    }

    /// Held down reports, lease deadlines and purges: the leader's own
    /// proposals.
    fn sweep(&mut self, now: u64, proposals: &mut Vec<(Envelope, Then)>) {
        if !self.is_leader() || !self.has_quorum(now) {
            return;
        }
        let cat = self.replica.applied.lock();
        let sweep = self.leader.sweep(now, cat.leases());
        drop(cat);
        self.verdicts(sweep.verdicts, proposals);
        proposals.extend(sweep.proposals.into_iter().map(|e| (e, Then::Nothing)));
    }

    /// Sends again what agents have not acknowledged in time. Every
    /// replica serves watches, so this runs on followers too.
    fn resend_unacked(&mut self, now: u64) {
        let mut out = Vec::new();
        let cat = self.replica.applied.lock();
        self.dist.sweep(now, &cat, &mut out);
        drop(cat);
        self.carry(out);
    }

    fn fire_wakes(&mut self, now: u64) {
        let later = self.wakes.split_off(&(now + 1));
        let due = std::mem::replace(&mut self.wakes, later);
        let mut out = Vec::new();
        let cat = self.replica.applied.lock();
        for agent in due.into_values().flatten() {
            self.dist.wake(agent, now, &cat, &mut out);
        }
        drop(cat);
        self.carry(out);
    }

    /// Sends each of `agents` that holds a session its regions message
    /// when it is due (R9: policies and other regions' summaries of the
    /// services it follows).
    fn push_regions(&mut self, agents: &[AgentId], now: u64) {
        let cat = self.replica.applied.lock();
        let remote = &self.remote;
        let epoch = RegionsEpoch::of(&cat, remote);
        let mut due = Vec::new();
        for &agent in agents {
            if self.sessions.held(agent).is_none() || self.regions.unchanged(agent, epoch, now) {
                continue;
            }
            let update = regions_update(self.dist.subscriptions(agent), &cat, remote, now);
            if self.regions.due(agent, &update, epoch, now) {
                due.push((agent, update));
            }
        }
        drop(cat);
        for (agent, update) in due {
            self.metrics.regions_sent.inc();
            self.send(agent, SessionDown::Regions(update));
        }
    }

    fn carry(&mut self, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Send { agent, updates } => {
                    if let Some(tx) = self.conns.get(&agent) {
                        let _ = tx.send(Outbound::Message {
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
        let cat = self.replica.applied.lock();
        m.policy_revision.clear();
        let home = cat.policies().map(|p| (p.policy.home_region(), p.revision));
        let replicated = cat
            .replicated_policies()
            .map(|p| (p.remote.policy.home_region(), p.remote.home_revision));
        for (region, revision) in home.chain(replicated) {
            let gauge = m.policy_revision.get_or_create(&RegionLabel {
                region: region.to_string(),
            });
            gauge.set(gauge.get().max(revision.get() as i64));
        }
        m.remote_view_age.clear();
        m.remote_view_fresh.clear();
        let now = now_ms();
        for held in self.remote.iter() {
            let label = RegionLabel {
                region: held.view.region.to_string(),
            };
            m.remote_view_age
                .get_or_create(&label)
                .set(held.age_ms(now) as f64 / 1000.0);
            m.remote_view_fresh
                .get_or_create(&label)
                .set(i64::from(held.fresh(now)));
        }
        m.ready.clear();
        for key in cat.services() {
            if let Some(info) = cat.service(&key) {
                m.ready
                    .get_or_create(&ServiceLabel {
                        service: key.to_string(),
                    })
                    .set(info.ready as i64);
            }
        }
        m.ack_lag.clear();
        for agent in self.sessions.agents() {
            if let Some((node, _)) = self.sessions.held(agent) {
                m.ack_lag
                    .get_or_create(&NodeLabel {
                        node: node.to_string(),
                    })
                    .set(self.dist.ack_lag(agent, &cat) as i64);
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
        for (kind, total) in [
            ("delta", stats.resent_as_deltas),
            ("snapshot", stats.resent_as_snapshots),
        ] {
            let counter = m.resends.get_or_create(&KindLabel { kind });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        m.connected_agents.set(
            self.sessions
                .agents()
                .filter(|a| self.sessions.held(*a).is_some())
                .count() as i64,
        );
        m.held_leases.set(cat.leases().held() as i64);
        m.leases.set(cat.leases().len() as i64);
        m.revision.set(cat.revision().0 as i64);
        drop(cat);
        let raft = self.replica.raft.metrics().borrow().clone();
        m.raft_term.set(raft.current_term as i64);
        m.raft_leader
            .set(raft.current_leader.map_or(0, |l| l as i64));
        m.raft_is_leader.set(i64::from(self.is_leader()));
        m.raft_last_log_index
            .set(raft.last_log_index.unwrap_or(0) as i64);
        m.raft_applied_index
            .set(raft.last_applied.map_or(0, |l| l.index) as i64);
        m.raft_apply_lag.clear();
        if let Some(replication) = &raft.replication {
            let last = raft.last_log_index.unwrap_or(0);
            for (id, matched) in replication {
                m.raft_apply_lag
                    .get_or_create(&ReplicaLabel {
                        replica: id.to_string(),
                    })
                    .set(last.saturating_sub(matched.map_or(0, |l| l.index)) as i64);
            }
        }
    }

    /// `GET /v1/remote`.
    fn remote_json(&self, now: u64) -> serde_json::Value {
        let regions: Vec<serde_json::Value> = self
            .remote
            .iter()
            .map(|held| {
                let view = &held.view;
                serde_json::json!({
                    "region": view.region.to_string(),
                    "version": view.version.0,
                    "as_of_ms": view.as_of_ms,
                    "age_ms": held.age_ms(now),
                    "max_age_ms": held.max_age_ms,
                    "fresh": held.fresh(now),
                    "ingress": view.ingress,
                    "summaries": view.summaries,
                })
            })
            .collect();
        serde_json::json!({"region": self.sessions.rules().region.to_string(), "regions": regions})
    }

    fn status(&self, now: u64) -> serde_json::Value {
        let cat = self.replica.applied.lock();
        let agents: Vec<serde_json::Value> = self
            .sessions
            .agents()
            .filter_map(|agent| {
                let (node, epoch) = self.sessions.held(agent)?;
                Some(serde_json::json!({
                    "node": node.as_str(),
                    "epoch": epoch.0,
                    "last_heard_ms_ago": self.leader.last_heard(node).map(|t| now.saturating_sub(t)),
                    "ack_lag": self.dist.ack_lag(agent, &cat),
                }))
            })
            .collect();
        let raft = self.replica.raft.metrics().borrow().clone();
        serde_json::json!({
            "name": self.config.name,
            "region": self.sessions.rules().region.as_str(),
            "shard": cat.params().shard.0,
            "revision": cat.revision().0,
            "services": cat.services().len(),
            "leases": cat.leases().len(),
            "held_leases": cat.leases().held(),
            "snapshots_in_flight": self.dist.snapshots_in_flight(),
            "agents": agents,
            "raft": raft_json(&raft),
        })
    }
}

/// A replica's Raft state as the admin API shows it.
pub fn raft_json(m: &openraft::RaftMetrics<ReplicaId, openraft::BasicNode>) -> serde_json::Value {
    let membership = m.membership_config.membership();
    let voters: std::collections::BTreeSet<ReplicaId> = membership.voter_ids().collect();
    let last = m.last_log_index.unwrap_or(0);
    let members: Vec<serde_json::Value> = membership
        .nodes()
        .map(|(id, node)| {
            let matched = m
                .replication
                .as_ref()
                .and_then(|r| r.get(id))
                .map(|l| l.map_or(0, |l| l.index));
            serde_json::json!({
                "id": id,
                "addr": node.addr,
                "voter": voters.contains(id),
                "leader": m.current_leader == Some(*id),
                "matched_index": matched,
                "lag": matched.map(|i| last.saturating_sub(i)),
            })
        })
        .collect();
    serde_json::json!({
        "id": m.id,
        "state": format!("{:?}", m.state),
        "term": m.current_term,
        "leader": m.current_leader,
        "last_log_index": m.last_log_index,
        "applied_index": m.last_applied.map(|l| l.index),
        "snapshot_index": m.snapshot.map(|l| l.index),
        "millis_since_quorum_ack": m.millis_since_quorum_ack,
        "members": members,
    })
}

fn no_leader() -> Response {
    crate::answers::unavailable(
        "this region's arbiter group has no leader now (an election is running, or fewer than a \
         majority of replicas are reachable); the write is not committed; retry"
            .into(),
    )
}
