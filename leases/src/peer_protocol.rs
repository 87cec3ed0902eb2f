//! The replica ↔ replica protocol (one bidirectional stream per message on
//! a connection whose certificate names an arbiter of the same region):
//! Raft's own messages as openraft defines them, and what a follower hands
//! its leader. Its frames use the codec's framing (version byte, kind,
//! size limit); it sits above `raft` (whose types it carries), so the
//! agent protocol (`protocol`) does not need `raft`.

use serde::{Deserialize, Serialize};

use crate::codec::{frame, unframe, CodecError, FrameKind, MAX_PEER_MESSAGE_BYTES};
use crate::ids::{AgentEpoch, Revision, ShardId};
use crate::name::{NodeId, ServiceKey};
use crate::protocol::Response;

/// Raft's own messages as openraft defines them.
pub mod raft_rpc {
    use crate::raft::{CatalogRaft, ReplicaId};

    /// Leader → follower: log entries or a heartbeat.
    pub type AppendEntries = openraft::raft::AppendEntriesRequest<CatalogRaft>;
    /// Its answer.
    pub type AppendEntriesReply = Result<
        openraft::raft::AppendEntriesResponse<ReplicaId>,
        openraft::error::RaftError<ReplicaId>,
    >;
    /// Candidate → replica: a vote request.
    pub type Vote = openraft::raft::VoteRequest<ReplicaId>;
    /// Its answer.
    pub type VoteReply =
        Result<openraft::raft::VoteResponse<ReplicaId>, openraft::error::RaftError<ReplicaId>>;
    /// Leader → follower: one chunk of a snapshot.
    pub type InstallSnapshot = openraft::raft::InstallSnapshotRequest<CatalogRaft>;
    /// Its answer.
    pub type InstallSnapshotReply = Result<
        openraft::raft::InstallSnapshotResponse<ReplicaId>,
        openraft::error::RaftError<ReplicaId, openraft::error::InstallSnapshotError>,
    >;
}

/// A change of the replica set (`rollcall cluster add|remove`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Add a replica: it catches up as a learner, then becomes a voter.
    Add {
        /// Its id.
        id: u64,
        /// Its QUIC `host:port`.
        addr: String,
    },
    /// Remove a voter or learner.
    Remove {
        /// Its id.
        id: u64,
    },
}

/// Replica → replica, one per bidirectional stream on a connection whose
/// certificate names an arbiter of the same region. Raft's messages, and
/// what a follower hands its leader: writes its agents asked for, which
/// agents it heard from, down reports and membership changes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    /// Raft AppendEntries.
    AppendEntries(raft_rpc::AppendEntries),
    /// Raft RequestVote.
    Vote(raft_rpc::Vote),
    /// Raft InstallSnapshot (one chunk).
    InstallSnapshot(raft_rpc::InstallSnapshot),
    /// A write authorized by the follower that received it; the leader
    /// commits it and answers with the `Response` the agent gets.
    Propose(crate::command::Envelope),
    /// Sessions the follower heard since its last report. Renewals renew the
    /// lease in the leader's memory; every entry counts as "heard" for the
    /// silence signal of down verdicts (R4).
    Heard(Vec<Heard>),
    /// A gossip down report an agent made to the follower.
    ReportDown {
        /// The reporting node (its session's node).
        reporter: NodeId,
        /// Who the report was sent by.
        actor: crate::endpoint::Principal,
        /// The node reported down.
        node: NodeId,
        /// Its epoch.
        epoch: AgentEpoch,
    },
    /// A membership change, forwarded to the leader.
    Membership(MembershipChange),
    /// How many of this replica's agents subscribed to `service` have
    /// acknowledged `revision`; answered (`Propagated`) when all have or
    /// after `timeout_ms`.
    Propagation {
        /// The service.
        service: ServiceKey,
        /// The revision.
        revision: Revision,
        /// The longest wait.
        timeout_ms: u64,
    },
    /// Witnesses' answers the follower's agents gave (the leader's to
    /// weigh, `LeaderMemory::witnessed`); answered `Refused(vec![])`.
    Witnessed(Vec<crate::witness::WitnessAnswer>),
    /// Writes a follower's agents asked for meanwhile, each authorized by
    /// the follower, in one request (at most `MAX_FORWARDED` of them): the
    /// leader commits them as `Propose` would, in their group commits, and
    /// answers `Answers` with each one's `Response`, in order. A follower
    /// hands a lone write over as `Propose`.
    ProposeBatch(Vec<crate::command::Envelope>),
    /// From the leader to a replica whose removal from the group just
    /// committed: it serves nothing as a member from now on
    /// (`server::removal`). Appended last, so the variants before keep
    /// their wire numbers.
    Removed(crate::server::removal::Removal),
    /// A message of shard `shard`'s Raft group, for a shard other than 0
    /// (shard 0's go as the variants above, as before shards, so a replica
    /// of one shard speaks as it always did). Appended last.
    Shard {
        /// The shard (1 or more).
        shard: ShardId,
        /// The message.
        rpc: ShardRpc,
    },
}

/// A message to one shard's Raft group (`PeerRequest::Shard`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ShardRpc {
    /// Raft AppendEntries.
    AppendEntries(raft_rpc::AppendEntries),
    /// Raft RequestVote.
    Vote(raft_rpc::Vote),
    /// Raft InstallSnapshot (one chunk).
    InstallSnapshot(raft_rpc::InstallSnapshot),
    /// From the shard's leader placing leadership elsewhere
    /// (`server::shards`): the receiver calls an election for the shard
    /// once the leader's heartbeats have lapsed. Answered
    /// `Refused(vec![])` at once.
    Campaign {
        /// Wait this long (the leader lease of the voters) before
        /// campaigning, in ms.
        after_ms: u64,
    },
    /// From shard 0's leader: make this membership change in the shard's
    /// group (every shard's group has the same members). Answered
    /// `Answer(Committed)` or why not.
    Membership(MembershipChange),
}

/// Most writes in one `ProposeBatch`.
pub const MAX_FORWARDED: usize = 1_024;

/// One session a follower heard from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heard {
    /// The node.
    pub node: NodeId,
    /// Its agent's epoch.
    pub epoch: AgentEpoch,
    /// How long before the report it was last heard, in ms (an age, so the
    /// replicas' clocks need not agree).
    pub ago_ms: u64,
    /// Whether it renewed its lease since the last report.
    pub renewed: bool,
}

/// The answer to a `PeerRequest`.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerResponse {
    /// To `AppendEntries`.
    AppendEntries(raft_rpc::AppendEntriesReply),
    /// To `Vote`.
    Vote(raft_rpc::VoteReply),
    /// To `InstallSnapshot`.
    InstallSnapshot(raft_rpc::InstallSnapshotReply),
    /// To `Propose`, `ReportDown` and `Membership`: what the agent or
    /// operator is told.
    Answer(Response),
    /// To `Heard`: the renewals the leader refused (an older epoch, a lease
    /// gone); the follower ends those sessions with the reason.
    Refused(Vec<(NodeId, String)>),
    /// To `Heard`, from a leader asking witnesses: the refused renewals,
    /// and the silent leases the follower's agents should witness.
    HeardAsks {
        /// As `Refused`.
        refused: Vec<(NodeId, String)>,
        /// The silent leases.
        asks: Vec<crate::witness::WitnessAsk>,
    },
    /// To `ProposeBatch`: each write's answer, in the request's order (or
    /// one `Answer` for all when the replica does not lead).
    Answers(Vec<Response>),
    /// To `Heard`, from a leader holding down reports (and perhaps asking
    /// witnesses): as `HeardAsks`, and the nodes whose sessions the
    /// follower probes (`SessionDown::Probe`), telling the leader at once
    /// of each answer.
    HeardProbes {
        /// As `Refused`.
        refused: Vec<(NodeId, String)>,
        /// The silent leases.
        asks: Vec<crate::witness::WitnessAsk>,
        /// The nodes to probe, with the agent run reported down.
        probes: Vec<(NodeId, crate::ids::AgentEpoch)>,
    },
}

/// Encodes a message to a peer replica.
pub fn encode_peer_request(m: &PeerRequest) -> Vec<u8> {
    frame(FrameKind::PeerRequest, m)
}

/// Decodes a message from a peer replica.
pub fn decode_peer_request(bytes: &[u8]) -> Result<PeerRequest, CodecError> {
    unframe(bytes, FrameKind::PeerRequest, MAX_PEER_MESSAGE_BYTES)
}

/// Encodes an answer to a peer replica.
pub fn encode_peer_response(m: &PeerResponse) -> Vec<u8> {
    frame(FrameKind::PeerResponse, m)
}

/// Decodes an answer from a peer replica.
pub fn decode_peer_response(bytes: &[u8]) -> Result<PeerResponse, CodecError> {
    unframe(bytes, FrameKind::PeerResponse, MAX_PEER_MESSAGE_BYTES)
}
