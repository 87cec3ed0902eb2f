//! The simulated region's events: everything that happens at a time on
//! the virtual clock, as the world's queue holds it.

use rollcall_leases::peer_protocol::{PeerRequest, PeerResponse};
use rollcall_leases::protocol::{Request, Response, ServiceUpdate, SessionDown};
use rollcall_leases::replica::BatchId;
use rollcall_leases::{AgentEpoch, CatalogId, LeaseId, NodeId, Revision};

use super::world::Time;

pub(super) enum Ev {
    Step(usize),
    /// The agent process starts (with its warm cache and registrations).
    Start(u32),
    /// The time the agent's state machine asked to be woken at, ms.
    AgentWake {
        agent: u32,
        at_ms: u64,
    },
    /// The agent's heartbeating instances send what is due.
    Heartbeats(u32),
    ConnectFailed(u32),
    Handshake {
        agent: u32,
        deadline: Time,
    },
    Hello {
        agent: u32,
        session: u64,
    },
    /// The machine's Welcome reaches the agent.
    Welcome {
        agent: u32,
        session: u64,
        lease: LeaseId,
        revision: Revision,
        catalog: Option<CatalogId>,
    },
    Subscribe {
        session: u64,
        subs: Vec<(u32, Option<Revision>)>,
    },
    Update {
        agent: u32,
        session: u64,
        updates: Vec<ServiceUpdate>,
    },
    SendDone {
        session: u64,
    },
    /// The arbiter's witness question reaches an agent.
    Witness {
        agent: u32,
        session: u64,
        node: NodeId,
        epoch: AgentEpoch,
        addresses: Vec<std::net::SocketAddr>,
    },
    /// Another message of the machine's (regions, a refusal) reaches the
    /// agent on its session stream.
    Message {
        agent: u32,
        session: u64,
        message: SessionDown,
    },
    /// An agent's request reaches the arbiter.
    Request {
        agent: u32,
        session: u64,
        request: u64,
        body: Request,
    },
    /// The arbiter's answer reaches the agent.
    Answer {
        agent: u32,
        request: u64,
        response: Response,
    },
    Closed {
        agent: u32,
        session: u64,
    },
    IdleCheck {
        agent: u32,
        session: u64,
    },
    /// The Raft group commits the oldest batch in flight (of the
    /// leader in office at `generation`).
    Commit {
        generation: u64,
    },
    /// A batch's write timeout: answered `TimedOut` if still uncommitted.
    WriteTimeout {
        replica: usize,
        run: u64,
        index: u64,
        batch: BatchId,
    },
    /// A follower applies what was committed and hears of it.
    CatchUp {
        replica: usize,
    },
    /// An election timeout ran out with no leader.
    Elect,
    /// A peer call reaches its replica.
    PeerArrive {
        call: u64,
        request: PeerRequest,
    },
    /// A peer's answer reaches the caller.
    PeerAnswer {
        call: u64,
        response: PeerResponse,
    },
    /// A peer call found no handshake.
    PeerUnreachable {
        call: u64,
    },
    /// A peer call's wait ran out.
    PeerTimeout {
        call: u64,
    },
    /// A killed replica's session at the QUIC idle timeout (the bound: an
    /// agent that sends anything notices sooner, at its silence check).
    SessionLost {
        agent: u32,
        session: u64,
    },
    /// A message agent `agent` sent on session `session` got nothing back
    /// within `agent.arbiter_silence_ms` (its replica is dead, or the agent
    /// is cut off): the agent ends the session, unless the check ran late
    /// (`due` passed by more than the shipped 250 ms: the agent was
    /// paused).
    ArbiterSilent {
        agent: u32,
        session: u64,
        due: Time,
    },
    /// Replica `replica` starts again after `kill_leader` or
    /// `lose_quorum`.
    ReplicaStart {
        replica: usize,
    },
    /// The time a replica machine asked to be woken at, ms.
    ArbiterWake {
        replica: usize,
        at_ms: u64,
    },
    /// What the guard and the witnesses hold is sampled.
    ArbiterSample,
    Replace {
        inst: u32,
        drain_ms: u64,
    },
    StopOld {
        inst: u32,
    },
    Pause {
        agent: u32,
        ms: u64,
    },
    Traffic,
    ArbiterStart,
    Heal(u32),
    ConvergeCheck,
}

impl Ev {
    /// The agent this event happens on, if it runs in an agent (a paused
    /// agent runs nothing: its events wait for the resume).
    pub(super) fn on_agent(&self) -> Option<u32> {
        match self {
            Ev::Start(a)
            | Ev::AgentWake { agent: a, .. }
            | Ev::Heartbeats(a)
            | Ev::ConnectFailed(a)
            | Ev::Handshake { agent: a, .. }
            | Ev::Welcome { agent: a, .. }
            | Ev::Update { agent: a, .. }
            | Ev::Witness { agent: a, .. }
            | Ev::Message { agent: a, .. }
            | Ev::Answer { agent: a, .. }
            | Ev::Closed { agent: a, .. }
            | Ev::SessionLost { agent: a, .. }
            | Ev::ArbiterSilent { agent: a, .. } => Some(*a),
            _ => None,
        }
    }
}
