//! What goes into a replica machine and what comes out: [`Input`],
//! [`Output`], and what they carry ([`RaftView`], [`Forwarded`]).

use super::*;

/// What openraft says of the group, as the driver reads its metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftView {
    /// The current term.
    pub term: u64,
    /// Whether this replica leads (openraft's state is Leader and it
    /// names this replica as the leader).
    pub leads: bool,
    /// The leader, with its QUIC address, if one is known.
    pub leader: Option<(ReplicaId, String)>,
    /// The other members, with their QUIC addresses.
    pub others: Vec<(ReplicaId, String)>,
    /// How long ago a quorum last acknowledged this leader, ms (`None`
    /// on a follower).
    pub quorum_ack_ms_ago: Option<u64>,
}

/// How handing a request to the leader ended, as the driver saw it.
#[derive(Clone, Debug)]
pub enum Forwarded {
    /// The leader's answer, or why there was none.
    Answer(Response),
    /// The leader's answers to a `ProposeBatch`, in order.
    Answers(Vec<Response>),
    /// The leader's address did not answer a handshake (it may be gone):
    /// tried again while the wait lasts.
    Unreachable(String),
}

impl Forwarded {
    /// What the leader at `to` answered to a forwarded request.
    pub fn from_answer(to: &str, response: PeerResponse) -> Forwarded {
        match response {
            PeerResponse::Answer(response) => Forwarded::Answer(response),
            PeerResponse::Answers(responses) => Forwarded::Answers(responses),
            _ => Forwarded::Answer(crate::answers::unavailable(format!(
                "the leader at {to} answered out of protocol"
            ))),
        }
    }
}

impl Input {
    /// The leader's answer to a heard report, as this follower's input:
    /// `None` when it refuses nothing and asks nothing.
    pub fn heard_answered(response: PeerResponse) -> Option<Input> {
        let (refused, asks, probes) = match response {
            PeerResponse::Refused(refused) if !refused.is_empty() => {
                (refused, Vec::new(), Vec::new())
            }
            PeerResponse::HeardAsks { refused, asks } => (refused, asks, Vec::new()),
            PeerResponse::HeardProbes {
                refused,
                asks,
                probes,
            } => (refused, asks, probes),
            _ => return None,
        };
        Some(Input::HeardAnswered {
            refused,
            asks,
            probes,
        })
    }
}

/// One replica's sums in its answer to a `PeerRequest::Propagation`
/// (acknowledged, following); `None` for any other answer.
pub fn propagation_sums(response: &PeerResponse) -> Option<(u32, u32)> {
    match response {
        PeerResponse::Answer(Response::Propagated { acked, total }) => Some((*acked, *total)),
        _ => None,
    }
}

/// Everything that happens to a replica.
#[derive(Debug)]
pub enum Input {
    /// A connection completed its handshake.
    Connected {
        /// Its number.
        agent: AgentId,
        /// The identity its certificate names.
        identity: Identity,
        /// Its certificate's IP SANs.
        certified: Vec<std::net::IpAddr>,
    },
    /// A message on its session stream.
    Session {
        /// The connection.
        agent: AgentId,
        /// The message.
        msg: SessionUp,
    },
    /// An update sent with `notify` was written.
    Sent {
        /// The connection.
        agent: AgentId,
    },
    /// The connection is gone.
    Closed {
        /// The connection.
        agent: AgentId,
    },
    /// A request on a stream of its own.
    Request {
        /// The connection.
        agent: AgentId,
        /// The request.
        request: Request,
        /// Where the answer goes.
        reply: ReplyId,
    },
    /// An operator's catalog write, stamped with the time here.
    Write {
        /// Who asks.
        actor: Principal,
        /// What to change.
        command: Command,
        /// Where the answer goes.
        reply: ReplyId,
    },
    /// What a peer replica hands this one.
    Peer {
        /// The request.
        request: PeerRequest,
        /// Where the answer goes (an `Output::AnswerPeer`).
        reply: ReplyId,
    },
    /// How openraft answered a proposed batch.
    Committed {
        /// The batch.
        batch: BatchId,
        /// Its outcome.
        outcome: BatchOutcome,
    },
    /// A request handed to the leader ended.
    Forwarded {
        /// The request.
        forward: ForwardId,
        /// How.
        outcome: Forwarded,
    },
    /// The leader's answer to this follower's heard report: renewals it
    /// refused, the witness asks it holds open, and the nodes whose
    /// sessions it wants probed.
    HeardAnswered {
        /// Nodes whose renewals were refused, with why.
        refused: Vec<(NodeId, String)>,
        /// Open witness asks.
        asks: Vec<WitnessAsk>,
        /// Nodes to probe, with the agent run asked about.
        probes: Vec<(NodeId, crate::ids::AgentEpoch)>,
    },
    /// The other replicas' sums of an `AwaitPropagation`.
    Propagated {
        /// The wait.
        wait: AwaitId,
        /// Their agents that acknowledged.
        acked: u32,
        /// Their agents that follow the service.
        total: u32,
    },
    /// This replica applied more of the log, or installed a snapshot.
    Applied(AppliedMark),
    /// openraft's view of the group (given whenever it may have changed,
    /// and before every `Tick`).
    Raft(RaftView),
    /// The end of a wake-up: what its inputs queued is proposed, and what
    /// is due by now is done.
    Tick,
    /// The process is stopping: new writes are refused, and
    /// `Output::Stopped` comes once the batches in flight are answered (at
    /// most `raft.write_timeout_ms`).
    Stop,
}

/// What the driver must do.
#[derive(Debug)]
pub enum Output {
    /// Write `message` on `agent`'s session; when `notify`, report
    /// `Input::Sent` once written.
    Send {
        /// The connection.
        agent: AgentId,
        /// The message.
        message: SessionDown,
        /// Report completion.
        notify: bool,
    },
    /// Close `agent`'s connection.
    Close {
        /// The connection.
        agent: AgentId,
        /// Why.
        reason: String,
    },
    /// Answer a request or an operator's write.
    Answer {
        /// The question.
        reply: ReplyId,
        /// The answer.
        response: Response,
    },
    /// Answer a peer's request.
    AnswerPeer {
        /// The question.
        reply: ReplyId,
        /// The answer.
        response: PeerResponse,
    },
    /// Propose these commands to openraft as one entry; the outcome comes
    /// back as `Input::Committed` (the driver bounds the wait with
    /// `raft.write_timeout_ms`).
    Propose {
        /// The batch.
        batch: BatchId,
        /// Its commands, in order.
        envelopes: Vec<Envelope>,
    },
    /// Hand `request` to the leader at `to`; its answer comes back as
    /// `Input::Forwarded` (within `wait_ms`).
    Forward {
        /// The request.
        forward: ForwardId,
        /// The leader's QUIC address.
        to: String,
        /// What to hand over.
        request: PeerRequest,
        /// How long to wait for the answer, ms.
        wait_ms: u64,
    },
    /// Tell the leader at `to` which sessions this follower heard; its
    /// answer comes back as `Input::HeardAnswered`.
    ReportHeard {
        /// The leader's QUIC address.
        to: String,
        /// The sessions.
        heard: Vec<Heard>,
        /// How long to wait for the answer, ms.
        wait_ms: u64,
    },
    /// Hand `request` to the replica at `to`, no answer needed (witnesses'
    /// answers for the leader).
    Tell {
        /// The replica's QUIC address.
        to: String,
        /// What to hand over.
        request: PeerRequest,
        /// How long to try, ms.
        wait_ms: u64,
    },
    /// Ask each replica at `to` for its agents' acknowledgements; the sums
    /// of those that answered come back as `Input::Propagated`.
    AskPropagation {
        /// The wait.
        wait: AwaitId,
        /// The replicas' QUIC addresses.
        to: Vec<String>,
        /// The question (`PeerRequest::Propagation`).
        request: PeerRequest,
        /// How long to wait for them, ms.
        wait_ms: u64,
    },
    /// Stopping is over: the driver may end.
    Stopped,
}
