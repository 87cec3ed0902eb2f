//! The arbiter's core task on one replica: the driver of its replica
//! machine (`replica::ReplicaState`), which decides everything. This task
//! owns the IO around it and decides nothing:
//! - the mailbox (`CoreMsg` from connections, the admin API and peers),
//!   applied revisions and openraft's metrics, turned into `Input`s, each
//!   handed to the machine with the clock read once per wake-up and the
//!   applied catalog read-locked for that one call;
//! - the answer channels, held by the id the machine answers by, and each
//!   connection's writer;
//! - the IO the machine asks for: batches proposed to openraft
//!   (`Raft::client_write`, bounded by `raft.write_timeout_ms`), requests
//!   handed to the leader, heard reports, propagation questions. Each runs
//!   in the task's `JoinSet` and its result comes back to the machine as
//!   an `Input` in this loop, not through a channel of its own;
//! - the metrics: the machine's counts, published after every wake-up.
//!
//! The catalog is the Raft group's replicated state machine; this task
//! never applies anything and writes nothing of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use openraft::ServerState;
use rollcall_config::ArbiterConfig;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::clock::now_ms;
use crate::ids::AgentId;
use crate::peer_protocol::{PeerRequest, PeerResponse};
use crate::protocol::Response;
use crate::raft::{Proposal, ReplicaId};
use crate::replica::{
    propagation_sums, BatchOutcome, Counters, Forwarded, Input, Output, RaftView, ReplicaState,
    ReplyId,
};
use crate::server::messages::{AdminQuery, CoreMsg, Outbound};
use crate::server::metrics::{KindLabel, Metrics};
use crate::server::peer::{self, PeerError, Peers};
use crate::shutdown::Shutdown;

/// Mailbox messages taken into one wake-up stop once it queued this many
/// writes.
const MAX_WAKE_UP_WRITES: usize = 4_096;

/// The parts of a replica the core drives.
pub struct Replica {
    /// This replica's id.
    pub id: ReplicaId,
    /// Its group (shard 0's): the Raft node, the applied catalog, and the
    /// write path batches are proposed through, so a hand-over of the
    /// group's leadership holds them (`ShardGroup::write`).
    pub group: super::shards::ShardGroup,
    /// Its client to the other replicas.
    pub peers: Arc<Peers>,
}

/// What woke the core up.
enum Wake {
    Message(CoreMsg),
    Done(Option<Input>),
    Applied(crate::raft::AppliedMark),
    Raft,
    Timer,
    Stop,
}

/// The core's state: the machine and the IO around it.
pub struct Core {
    config: ArbiterConfig,
    machine: ReplicaState,
    replica: Replica,
    metrics: Arc<Metrics>,
    /// Where each connection's messages go.
    conns: HashMap<AgentId, mpsc::UnboundedSender<Outbound>>,
    /// Answers the machine owes, by the id it was given.
    replies: HashMap<ReplyId, oneshot::Sender<Response>>,
    peer_replies: HashMap<ReplyId, oneshot::Sender<PeerResponse>>,
    next_reply: ReplyId,
    /// The IO in progress; each ends in an input (or nothing).
    io: JoinSet<Option<Input>>,
    snapshots_seen: Option<crate::raft::LogId>,
    /// The machine's counts as last published.
    published: Counters,
}

impl Core {
    /// A core over a replica whose Raft node is running.
    pub fn new(config: ArbiterConfig, replica: Replica, metrics: Arc<Metrics>) -> Self {
        let machine = {
            let cat = replica.group.catalog.lock();
            ReplicaState::new(
                config.clone(),
                replica.id,
                &cat,
                replica.group.catalog.mark(),
                now_ms(),
            )
        };
        Core {
            config,
            machine,
            replica,
            metrics,
            conns: HashMap::default(),
            replies: HashMap::default(),
            peer_replies: HashMap::default(),
            next_reply: 0,
            io: JoinSet::new(),
            snapshots_seen: None,
            published: Counters::default(),
        }
    }

    /// Runs until every sender of `rx` is gone, or until `stop` fired and
    /// the machine says the batches sent to Raft are answered. The clock
    /// is read once per wake-up, at this edge, and handed with every input
    /// of that wake-up.
    pub async fn run(mut self, mut rx: mpsc::Receiver<CoreMsg>, mut stop: Shutdown) {
        let mut marks = self.replica.group.catalog.watch();
        let mut raft_metrics = self.replica.group.raft.metrics();
        let mut now = now_ms();
        let mut stopping = false;
        raft_metrics.borrow_and_update();
        loop {
            if self.end_of_wake_up(now) {
                return;
            }
            let sleep = Duration::from_millis(self.machine.poll_timeout().saturating_sub(now));
            let wake = tokio::select! {
                msg = rx.recv() => match msg {
                    Some(msg) => Wake::Message(msg),
                    None => return,
                },
                Some(done) = self.io.join_next() => Wake::Done(done.unwrap_or_default()),
                changed = marks.changed() => {
                    if changed.is_err() { return }
                    Wake::Applied(*marks.borrow_and_update())
                }
                changed = raft_metrics.changed() => {
                    if changed.is_err() { return }
                    raft_metrics.borrow_and_update();
                    Wake::Raft
                }
                _ = tokio::time::sleep(sleep) => Wake::Timer,
                _ = stop.fired(), if !stopping => Wake::Stop,
            };
            now = now_ms();
            match wake {
                Wake::Message(msg) => {
                    self.message(msg, now);
                    while self.machine.queued_this_wake_up() < MAX_WAKE_UP_WRITES {
                        match rx.try_recv() {
                            Ok(msg) => self.message(msg, now),
                            Err(_) => break,
                        }
                    }
                }
                Wake::Done(Some(input)) => self.step(input, now),
                Wake::Applied(mark) => self.step(Input::Applied(mark), now),
                Wake::Stop => {
                    stopping = true;
                    self.step(Input::Stop, now);
                }
                Wake::Done(None) | Wake::Raft | Wake::Timer => {}
            }
        }
    }

    /// openraft's view, then the machine's `Tick`; the counts published.
    /// Whether the machine is done stopping.
    fn end_of_wake_up(&mut self, now: u64) -> bool {
        let view = {
            let m = self.replica.group.raft.metrics();
            let m = m.borrow();
            if m.snapshot != self.snapshots_seen && m.snapshot.is_some() {
                self.snapshots_seen = m.snapshot;
                self.metrics.raft_snapshots.inc();
            }
            raft_view(&m, self.replica.id)
        };
        self.step(Input::Raft(view), now);
        let stopped = self.step_out(Input::Tick, now);
        self.publish();
        stopped
    }

    fn step(&mut self, input: Input, now: u64) {
        self.step_out(input, now);
    }

    /// One input, then its outputs carried; whether one said `Stopped`.
    fn step_out(&mut self, input: Input, now: u64) -> bool {
        let mut out = Vec::new();
        {
            let cat = self.replica.group.catalog.lock();
            self.machine
                .handle(input, now, &mut rand::rng(), &cat, &mut out);
        }
        let mut stopped = false;
        for o in out {
            stopped |= self.carry(o);
        }
        stopped
    }

    fn reply_id(&mut self) -> ReplyId {
        self.next_reply += 1;
        self.next_reply
    }

    fn message(&mut self, msg: CoreMsg, now: u64) {
        let input = match msg {
            CoreMsg::Connected {
                agent,
                identity,
                certified,
                tx,
            } => {
                self.conns.insert(agent, tx);
                Input::Connected {
                    agent,
                    identity,
                    certified,
                }
            }
            CoreMsg::Session { agent, msg } => Input::Session { agent, msg },
            CoreMsg::Request {
                agent,
                request,
                reply,
            } => {
                let id = self.reply_id();
                self.replies.insert(id, reply);
                Input::Request {
                    agent,
                    request,
                    reply: id,
                }
            }
            CoreMsg::Sent { agent } => Input::Sent { agent },
            CoreMsg::Closed { agent } => {
                self.conns.remove(&agent);
                Input::Closed { agent }
            }
            CoreMsg::Peer { request, reply } => {
                let id = self.reply_id();
                self.peer_replies.insert(id, reply);
                Input::Peer { request, reply: id }
            }
            CoreMsg::Admin(AdminQuery::Propose {
                actor,
                command,
                reply,
            }) => {
                let id = self.reply_id();
                self.replies.insert(id, reply);
                Input::Write {
                    actor,
                    command,
                    reply: id,
                }
            }
            CoreMsg::Admin(query) => return self.admin(query, now),
        };
        self.step(input, now);
    }

    /// Admin questions: read from the machine and the applied catalog.
    fn admin(&mut self, query: AdminQuery, now: u64) {
        let status = crate::server::status::Reader {
            config: &self.config,
            machine: &self.machine,
            raft: &self.replica.group.raft,
            metrics: &self.metrics,
        };
        match query {
            AdminQuery::Status(reply) => {
                let _ = reply.send(status.status(&self.replica.group.catalog.lock(), now));
            }
            AdminQuery::Remote(reply) => {
                let _ = reply.send(status.remote_json(now));
            }
            AdminQuery::RefreshMetrics(reply) => {
                status.refresh_metrics(&self.replica.group.catalog.lock(), now);
                let _ = reply.send(());
            }
            AdminQuery::PutRemote {
                view,
                heard_ms_ago,
                max_age_ms,
                reply,
            } => {
                let put = self.machine.put_remote(view, heard_ms_ago, max_age_ms, now);
                let _ = reply.send(put);
            }
            AdminQuery::RemoteHeard {
                region,
                version,
                as_of_ms,
                heard_ms_ago,
                reply,
            } => {
                let confirmed =
                    self.machine
                        .confirm_remote(&region, version, as_of_ms, heard_ms_ago, now);
                let _ = reply.send(confirmed);
            }
            AdminQuery::Propose { .. } => unreachable!("taken as a write in `message`"),
        }
    }

    /// Carries one output out; whether it was `Stopped`.
    fn carry(&mut self, output: Output) -> bool {
        match output {
            Output::Send {
                agent,
                message,
                notify,
            } => {
                if let Some(tx) = self.conns.get(&agent) {
                    let _ = tx.send(Outbound::Message { message, notify });
                }
            }
            Output::Close { agent, reason } => {
                if let Some(tx) = self.conns.get(&agent) {
                    let _ = tx.send(Outbound::Close(reason));
                }
            }
            Output::Answer { reply, response } => {
                if let Some(tx) = self.replies.remove(&reply) {
                    let _ = tx.send(response);
                }
            }
            Output::AnswerPeer { reply, response } => {
                if let Some(tx) = self.peer_replies.remove(&reply) {
                    let _ = tx.send(response);
                }
            }
            Output::Propose { batch, envelopes } => self.propose(batch, envelopes),
            Output::Forward {
                forward,
                to,
                request,
                wait_ms,
            } => {
                let peers = self.replica.peers.clone();
                self.io.spawn(async move {
                    let wait = Duration::from_millis(wait_ms);
                    let outcome = match peers.call(&to, &request, wait).await {
                        Ok(response) => Forwarded::from_answer(&to, response),
                        Err(e @ PeerError::Unreachable { .. }) => {
                            Forwarded::Unreachable(e.to_string())
                        }
                        Err(e) => Forwarded::Answer(crate::answers::unavailable(format!(
                            "the leader did not answer: {e}; retry"
                        ))),
                    };
                    Some(Input::Forwarded { forward, outcome })
                });
            }
            Output::ReportHeard { to, heard, wait_ms } => {
                let peers = self.replica.peers.clone();
                self.io.spawn(async move {
                    let wait = Duration::from_millis(wait_ms);
                    match peers.call(&to, &PeerRequest::Heard(heard), wait).await {
                        Ok(response) => Input::heard_answered(response),
                        Err(e) => {
                            tracing::debug!(error = %e, "could not report heard sessions to the leader");
                            None
                        }
                    }
                });
            }
            Output::Tell {
                to,
                request,
                wait_ms,
            } => {
                let peers = self.replica.peers.clone();
                self.io.spawn(async move {
                    let wait = Duration::from_millis(wait_ms);
                    if let Err(e) = peers.call(&to, &request, wait).await {
                        tracing::debug!(error = %e, "could not hand witnesses' answers to the leader");
                    }
                    None
                });
            }
            Output::AskPropagation {
                wait,
                to,
                request,
                wait_ms,
            } => {
                let peers = self.replica.peers.clone();
                self.io.spawn(async move {
                    let timeout = Duration::from_millis(wait_ms);
                    let mut calls = JoinSet::new();
                    for addr in to {
                        let (peers, request) = (peers.clone(), request.clone());
                        calls.spawn(async move { peers.call(&addr, &request, timeout).await });
                    }
                    let (mut acked, mut total) = (0, 0);
                    for answer in calls.join_all().await {
                        match answer {
                            Ok(response) => {
                                if let Some((a, t)) = propagation_sums(&response) {
                                    acked += a;
                                    total += t;
                                }
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, "a replica did not report propagation")
                            }
                        }
                    }
                    Some(Input::Propagated { wait, acked, total })
                });
            }
            Output::Stopped => return true,
        }
        false
    }

    /// One batch to openraft as one entry, its wait bounded by
    /// `raft.write_timeout_ms`.
    fn propose(
        &mut self,
        batch: crate::replica::BatchId,
        envelopes: Vec<crate::command::Envelope>,
    ) {
        let group = self.replica.group.clone();
        let metrics = self.metrics.clone();
        let timeout = Duration::from_millis(self.config.raft.write_timeout_ms);
        self.io.spawn(async move {
            let started = Instant::now();
            let size = envelopes.len();
            let outcome =
                match tokio::time::timeout(timeout, group.write(Proposal { envelopes })).await {
                    Ok(Ok(written)) => {
                        metrics
                            .commit_latency
                            .observe(started.elapsed().as_secs_f64());
                        metrics.batch_size.observe(size as f64);
                        BatchOutcome::Applied(written.data.results)
                    }
                    Ok(Err(e)) if peer::is_forward(&e) => BatchOutcome::NotLeader(e.to_string()),
                    Ok(Err(e)) => BatchOutcome::Failed(e.to_string()),
                    Err(_) => BatchOutcome::TimedOut,
                };
            Some(Input::Committed { batch, outcome })
        });
    }

    /// The machine's counts as Prometheus counters.
    fn publish(&mut self) {
        let now = self.machine.counters().clone();
        let was = std::mem::replace(&mut self.published, now.clone());
        let m = &self.metrics;
        m.renewals.inc_by(now.renewals - was.renewals);
        m.commits.inc_by(now.commits - was.commits);
        m.registrations
            .inc_by(now.registrations - was.registrations);
        m.rejections.inc_by(now.rejections - was.rejections);
        m.down_reports_ignored
            .inc_by(now.down_reports_ignored - was.down_reports_ignored);
        m.down_reports_uncorroborated
            .inc_by(now.down_reports_uncorroborated - was.down_reports_uncorroborated);
        m.probes_sent.inc_by(now.probes_sent - was.probes_sent);
        m.probes_answered
            .inc_by(now.probes_answered - was.probes_answered);
        m.regions_sent.inc_by(now.regions_sent - was.regions_sent);
        for (kind, total) in &now.refusals {
            let before = was.refusals.get(kind).copied().unwrap_or(0);
            if *total > before {
                m.refusals
                    .get_or_create(&KindLabel { kind })
                    .inc_by(total - before);
            }
        }
        use crate::limits::Limit;
        for (limit, hits) in [
            (
                Limit::SessionsPerNode,
                now.sessions_replaced - was.sessions_replaced,
            ),
            (
                Limit::SubscriptionsPerSession,
                now.subscriptions_refused - was.subscriptions_refused,
            ),
            (
                Limit::PropagationWaits,
                now.propagation_waits_refused - was.propagation_waits_refused,
            ),
            (
                Limit::SnapshotsPerSession,
                now.snapshots_limited - was.snapshots_limited,
            ),
        ] {
            m.hit_by(limit, hits);
        }
    }
}

/// openraft's metrics as the machine reads them.
fn raft_view(m: &openraft::RaftMetrics<ReplicaId, openraft::BasicNode>, me: ReplicaId) -> RaftView {
    let addr = |id: ReplicaId| {
        m.membership_config
            .nodes()
            .find(|(n, _)| **n == id)
            .map(|(_, node)| (id, node.addr.clone()))
    };
    RaftView {
        term: m.current_term,
        leads: m.state == ServerState::Leader && m.current_leader == Some(me),
        leader: m.current_leader.and_then(addr),
        others: m
            .membership_config
            .nodes()
            .filter(|(id, _)| **id != me)
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect(),
        quorum_ack_ms_ago: m.millis_since_quorum_ack,
    }
}
