//! The Raft type configuration of a catalog shard: what the replicated log
//! carries (a `Proposal`: a batch of `Envelope`s), what applying an entry answers
//! (an `Outcome`), how replicas are named (`u64` ids, `BasicNode` holding the
//! replica's QUIC `host:port`) and what a snapshot is (the bytes of
//! `codec::encode_catalog_snapshot`).
//!
//! Only types live here; nothing is stored or applied.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::catalog::{Applied, Rejection};
use crate::command::Envelope;
use crate::ids::Revision;

openraft::declare_raft_types!(
    /// The openraft type configuration of one catalog shard's Raft group.
    pub CatalogRaft:
        D = Proposal,
        R = Outcome,
        NodeId = ReplicaId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<CatalogRaft>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub use crate::ids::ReplicaId;
/// A running Raft node of a catalog shard.
pub type CatalogRaftNode = openraft::Raft<CatalogRaft>;
/// A position in the replicated log.
pub type LogId = openraft::LogId<ReplicaId>;
/// One entry of the replicated log.
pub type Entry = openraft::Entry<CatalogRaft>;
/// A storage failure as openraft sees it; openraft stops the node on any.
pub type StorageError = openraft::StorageError<ReplicaId>;
/// The replica set as of a log position.
pub type StoredMembership = openraft::StoredMembership<ReplicaId, openraft::BasicNode>;
/// What describes a snapshot: its last log id and membership.
pub type SnapshotMeta = openraft::SnapshotMeta<ReplicaId, openraft::BasicNode>;

/// What a leader proposes: a batch of catalog commands, each with its time
/// and actor, applied in order as one log entry. Batching is the arbiter's
/// group commit: concurrent writes share one fsynced append and one
/// replication round.
///
/// Each command serializes as its `codec::encode_command` frame, so a log
/// entry or a Raft message holds the same bytes as every other command
/// encoding, and a peer's entry is size-checked and validated by
/// `codec::decode_command` before anything applies it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The commands, applied in this order.
    #[serde(with = "command_frames")]
    pub envelopes: Vec<Envelope>,
}

impl Proposal {
    /// A proposal of one command.
    pub fn one(envelope: Envelope) -> Proposal {
        Proposal {
            envelopes: vec![envelope],
        }
    }
}

/// What applying one log entry gave, handed back by
/// `Raft::client_write` to the proposer on the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The catalog's revision once this entry applied; the same on every
    /// replica, because every replica applies the same log.
    pub revision: Revision,
    /// What the catalog answered each command of a `Normal` entry, in order
    /// (empty for the blank and membership entries openraft writes itself).
    /// A rejection is an answer, not a failure: the entry is committed and
    /// every replica rejects that command alike, changing nothing.
    ///
    /// Only the proposer in this process reads it. openraft requires `R` to
    /// be serializable but never sends it, so it is not serialized, and a
    /// deserialized `Outcome` holds no results.
    #[serde(skip)]
    pub results: Vec<Result<Applied, Rejection>>,
}

/// Each `Envelope` as its codec frame, a sequence of byte sequences.
mod command_frames {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::codec;
    use crate::command::Envelope;

    /// Most commands in one entry (a batch is at most the replica
    /// machine's 1,024).
    const MAX_BATCH: usize = 65_536;

    pub fn serialize<S: Serializer>(envs: &[Envelope], s: S) -> Result<S::Ok, S::Error> {
        let frames: Vec<Vec<u8>> = envs.iter().map(codec::encode_command).collect();
        frames.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Envelope>, D::Error> {
        let frames = Vec::<Vec<u8>>::deserialize(d)?;
        if frames.len() > MAX_BATCH {
            return Err(D::Error::custom(format!(
                "{} commands in one entry; at most {MAX_BATCH}",
                frames.len()
            )));
        }
        frames
            .iter()
            .map(|bytes| codec::decode_command(bytes).map_err(D::Error::custom))
            .collect()
    }
}
