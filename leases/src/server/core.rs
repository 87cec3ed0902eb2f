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
//! and touches no socket (connections hold those); as the driver of
//! sans-IO state machines it reads the clock, once per wake-up in `run`.

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
use crate::ids::{AgentEpoch, AgentId, CatalogId, Revision};
use crate::leader::{agent_principal, LeaderMemory, LeaderParams, Verdict};
use crate::name::{NodeId, PrincipalName, ServiceKey};
use crate::peer_protocol::{Heard, PeerRequest, PeerResponse};
use crate::protocol::{RejectKind, Request, Response, ServiceUpdate, SessionDown, SessionUp};
use crate::raft::{AppliedCatalog, AppliedMark, CatalogRaftNode, Proposal, ReplicaId};
use crate::regions::{regions_update, RegionsEpoch, RegionsFeed};
use crate::remote::RemoteViews;
use crate::server::messages::{AdminQuery, CoreMsg, Outbound};
use crate::server::metrics::{
    KindLabel, Metrics, NodeLabel, RegionLabel, ReplicaLabel, ServiceLabel,
};
use crate::server::peer::{self, PeerError, Peers};
use crate::sessions::{down_outcome, Accepted, DownOutcome, Rules, Sessions, Step};
use crate::shutdown::Shutdown;
use crate::witness::{self, WitnessAnswer, WitnessAsk};

mod commit;
mod replication;
mod status;

pub use status::raft_json;

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

/// What woke the core up.
enum Wake {
    Message(CoreMsg),
    Done(Done),
    Applied(AppliedMark),
    Raft(openraft::RaftMetrics<ReplicaId, openraft::BasicNode>),
    Timer,
    Stop,
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
    /// The leader wants witnesses for these silent leases (this replica
    /// follows): its agents are asked too.
    Asks(Vec<WitnessAsk>),
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
    /// The leader's answers to a `ProposeBatch`, in order.
    Answers(Vec<Response>),
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
    /// Since when (ms) the process is shutting down: new proposals are
    /// refused, and the core ends once its batches are answered.
    stopping_since: Option<u64>,
    /// The remote view the region bridge reports (memory only; the admin
    /// endpoint reads and writes it through this core's mailbox).
    remote: RemoteViews,
    /// What each session was last told of regions and policies.
    regions: RegionsFeed,
    /// When the sessions' regions messages are next looked at (ms).
    next_regions_ms: u64,
    /// When this leader may next propose the catalog's identity (ms).
    identify_after_ms: u64,
    /// Leader: the witness asks still open, with when, handed to the
    /// followers with their `Heard` answers.
    witness_asks: Vec<(WitnessAsk, u64)>,
    /// Follower: asks already carried to this replica's agents, with when.
    witness_asked: HashMap<(NodeId, AgentEpoch), u64>,
    /// Follower: witnesses' answers to hand to the leader.
    witnessed_out: Vec<WitnessAnswer>,
}

/// How often every session's regions message is looked at, ms.
const REGIONS_INTERVAL_MS: u64 = 1_000;

/// How long a leader waits for its proposed catalog identity to commit
/// before it proposes one again, ms.
const IDENTIFY_RETRY_MS: u64 = 1_000;

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
            stopping_since: None,
            regions: RegionsFeed::new(),
            next_regions_ms: now,
            identify_after_ms: 0,
            witness_asks: Vec::new(),
            witness_asked: HashMap::default(),
            witnessed_out: Vec::new(),
        }
    }

    fn is_leader(&self) -> bool {
        matches!(self.standing, Standing::Leader)
    }

    /// Runs until every sender of `rx` is gone, or until `stop` fired and
    /// the batches sent to Raft are answered (new proposals are refused as
    /// unavailable meanwhile; at most `raft.write_timeout_ms`). The clock is
    /// read once per wake-up, at this edge, and handed to everything the
    /// wake-up carries out (a batch of mailbox messages shares that one
    /// reading).
    pub async fn run(mut self, mut rx: mpsc::Receiver<CoreMsg>, mut stop: Shutdown) {
        let sweep_ms = self.config.lease.sweep_interval_ms;
        let mut now = now_ms();
        let mut next_sweep_ms = now + sweep_ms;
        let mut marks = self.replica.applied.watch();
        let mut raft_metrics = self.replica.raft.metrics();
        let mut done_rx = self.done_rx.take().expect("run is called once");
        self.on_raft_metrics(&raft_metrics.borrow_and_update().clone(), now);
        if self.is_leader() {
            let mut proposals = Vec::new();
            self.identify(now, &mut proposals);
            self.propose(proposals);
        }
        loop {
            // Sleep until the earliest timer, as of the previous reading.
            let due_ms = self
                .wakes
                .keys()
                .next()
                .map_or(next_sweep_ms, |at| (*at).min(next_sweep_ms));
            let sleep = Duration::from_millis(due_ms.saturating_sub(now));
            let wake = tokio::select! {
                msg = rx.recv() => match msg {
                    Some(msg) => Wake::Message(msg),
                    None => return,
                },
                Some(done) = done_rx.recv() => Wake::Done(done),
                changed = marks.changed() => {
                    if changed.is_err() { return }
                    Wake::Applied(*marks.borrow_and_update())
                }
                changed = raft_metrics.changed() => {
                    if changed.is_err() { return }
                    Wake::Raft(raft_metrics.borrow_and_update().clone())
                }
                _ = tokio::time::sleep(sleep) => Wake::Timer,
                _ = stop.fired(), if self.stopping_since.is_none() => Wake::Stop,
            };
            now = now_ms();
            let mut proposals: Vec<(Envelope, Then)> = Vec::new();
            match wake {
                Wake::Message(msg) => {
                    self.handle(msg, now, &mut proposals);
                    while proposals.len() < 4096 {
                        match rx.try_recv() {
                            Ok(msg) => self.handle(msg, now, &mut proposals),
                            Err(_) => break,
                        }
                    }
                }
                Wake::Done(done) => self.done(done, now),
                Wake::Applied(mark) => self.on_applied(mark, now),
                Wake::Raft(m) => {
                    let led = self.is_leader();
                    self.on_raft_metrics(&m, now);
                    if !led && self.is_leader() {
                        // Before any grant this leader proposes, so the
                        // first Welcome of a new group names its catalog.
                        self.identify(now, &mut proposals);
                    }
                }
                Wake::Timer => {}
                Wake::Stop => {
                    tracing::info!(
                        batches = self.in_flight,
                        queued = self.queue.len(),
                        "arbiter shutting down: answering the batches in flight, refusing new writes"
                    );
                    self.stopping_since = Some(now);
                }
            }
            if now >= next_sweep_ms {
                next_sweep_ms = now + sweep_ms;
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
            if let Some(since) = self.stopping_since {
                let drained = self.in_flight == 0 && self.queue.is_empty();
                if drained || now >= since + self.config.raft.write_timeout_ms {
                    if !drained {
                        tracing::warn!(batches = self.in_flight, "arbiter shutting down with batches unanswered after raft.write_timeout_ms");
                    }
                    return;
                }
            }
        }
    }

    fn handle(&mut self, msg: CoreMsg, now: u64, proposals: &mut Vec<(Envelope, Then)>) {
        match msg {
            CoreMsg::Connected {
                agent,
                identity,
                certified,
                tx,
            } => {
                self.dist.connect(agent);
                self.sessions.connect(agent, identity, certified);
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
                self.refresh_metrics(now);
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
            Step::Grant { envelope, replaced } => {
                for (old, reason) in replaced {
                    // Forgotten by the session layer already; it hears no
                    // more updates, and its connection closes with the reason.
                    tracing::info!(agent = old, by = agent, reason = %reason, "session replaced");
                    self.metrics.hit(crate::limits::Limit::SessionsPerNode);
                    self.dist.disconnect(old);
                    self.regions.forget(old);
                    self.close(old, reason);
                }
                proposals.push((envelope, Then::Welcome(agent)));
            }
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
            Step::Witnessed {
                witness,
                node,
                epoch,
                seen,
            } => {
                if self.is_leader() {
                    self.leader.witnessed(witness, &node, epoch, seen);
                } else {
                    self.witnessed_out.push(WitnessAnswer {
                        witness,
                        node,
                        epoch,
                        gossip: seen.gossip,
                        reachable: seen.reachable,
                    });
                }
            }
            Step::Nothing => {}
        }
    }

    /// Asks this replica's witnesses about a silent lease
    /// (`witness::choose` among the sessions it heard within
    /// `lease.silence_ms`).
    fn ask_witnesses(&mut self, ask: &WitnessAsk, now: u64) {
        let silence = self.config.lease.silence_ms;
        let chosen = {
            let cat = self.replica.applied.lock();
            let candidates: Vec<(AgentId, NodeId, crate::name::Label)> = self
                .conns
                .keys()
                .filter_map(|agent| {
                    let (node, _) = self.sessions.live(*agent)?;
                    let heard = self.leader.last_heard(node)?;
                    if now.saturating_sub(heard) > silence {
                        return None;
                    }
                    let zone = cat.leases().get(node)?.zone.clone();
                    Some((*agent, node.clone(), zone))
                })
                .collect();
            witness::choose(ask, candidates.iter().map(|(a, n, z)| (*a, n, z)))
        };
        for agent in chosen {
            self.send(
                agent,
                SessionDown::Witness {
                    node: ask.node.clone(),
                    epoch: ask.epoch,
                    addresses: ask.addresses.clone(),
                },
            );
        }
    }

    /// A follower carries the leader's open witness asks to its own
    /// agents, each once while it is open (`lease.witness_wait_ms`; the
    /// leader asks again, every TTL, while it holds a lease alive).
    fn carry_asks(&mut self, asks: Vec<WitnessAsk>, now: u64) {
        let keep = self.config.lease.witness_wait_ms;
        self.witness_asked
            .retain(|_, at| now.saturating_sub(*at) < keep);
        for ask in asks {
            let key = (ask.node.clone(), ask.epoch);
            if self.witness_asked.contains_key(&key) {
                continue;
            }
            self.witness_asked.insert(key, now);
            self.ask_witnesses(&ask, now);
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
        self.leader
            .renew(self.replica.applied.lock().leases(), node, epoch, at, actor)
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
                if let Response::Rejected { kind, message } = &response {
                    self.metrics
                        .refusals
                        .get_or_create(&KindLabel {
                            kind: kind.as_str(),
                        })
                        .inc();
                    // A refused write (another node's instance, a service
                    // or an address the registration rules do not allow)
                    // is recorded with who asked: it changed nothing, so
                    // the catalog's audit log holds no entry of it.
                    if *kind == RejectKind::Forbidden {
                        let who = self
                            .sessions
                            .identity(agent)
                            .map_or_else(|| "a closed connection".to_owned(), ToString::to_string);
                        tracing::warn!(target: "rollcall::audit", identity = %who, reason = %message, "request refused");
                    }
                }
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
                Forwarded::NowLeader(_) | Forwarded::Answers(_) => {
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

    fn on_raft_metrics(
        &mut self,
        m: &openraft::RaftMetrics<ReplicaId, openraft::BasicNode>,
        now: u64,
    ) {
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
                self.leader
                    .take_office(now, self.replica.applied.lock().leases());
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
                self.leader
                    .take_office(now, self.replica.applied.lock().leases());
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
        let asks: Vec<WitnessAsk> = sweep
            .asks
            .iter()
            .filter_map(|(node, epoch)| witness::ask(&cat, node, *epoch))
            .collect();
        drop(cat);
        self.verdicts(sweep.verdicts, proposals);
        proposals.extend(sweep.proposals.into_iter().map(|e| (e, Then::Nothing)));
        for held in sweep.held {
            tracing::warn!(
                node = %held.node,
                silent_ms = held.silent_ms,
                witnesses = ?held.witnesses.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                "a lease past its deadline is held: witnesses see the node alive, so this arbiter may be cut off from it; held at most guard.max_hold_ms"
            );
        }
        // An ask is open for the wait: answers later than that are not
        // waited for (a held lease is asked about again every TTL).
        let keep = self.config.lease.witness_wait_ms;
        self.witness_asks
            .retain(|(_, at)| now.saturating_sub(*at) < keep);
        for ask in asks {
            self.ask_witnesses(&ask, now);
            self.witness_asks.push((ask, now));
        }
        if now >= self.identify_after_ms {
            self.identify(now, proposals);
        }
    }

    /// A new group's first leader names the catalog (and a leader of a
    /// group older than identities names it on upgrade): proposed when this
    /// replica takes office and again at sweeps while none is committed;
    /// the first committed one wins.
    fn identify(&mut self, now: u64, proposals: &mut Vec<(Envelope, Then)>) {
        if self.replica.applied.lock().identity().is_some() {
            // Named for good: no sweep looks again.
            self.identify_after_ms = u64::MAX;
        } else {
            self.identify_after_ms = now + IDENTIFY_RETRY_MS;
            proposals.push((
                Envelope {
                    at_ms: now,
                    actor: self.leader.principal().clone(),
                    command: Command::Identify {
                        catalog: CatalogId::random(),
                    },
                },
                Then::Nothing,
            ));
        }
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
            if self.sessions.live(agent).is_none() || self.regions.unchanged(agent, epoch, now) {
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
}
