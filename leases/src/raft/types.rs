//! The Raft type configuration of a catalog shard: what the replicated log
//! carries (a `Proposal`: one `Envelope`), what applying an entry answers
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

/// A replica's id in its Raft group. Stable for the replica's life: a wiped
/// replica that rejoins keeps it, a replacement gets a new one.
pub type ReplicaId = u64;
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

/// What a leader proposes: one catalog command with its time and actor.
///
/// It serializes as the `codec::encode_command` frame, so a log entry or a
/// Raft message holds the same bytes as the single-replica store's log, and a
/// peer's entry is size-checked and validated by `codec::decode_command`
/// before anything applies it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The command.
    #[serde(with = "command_frame")]
    pub envelope: Envelope,
}

/// What applying one log entry gave, handed back by
/// `Raft::client_write` to the proposer on the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The catalog's revision once this entry applied; the same on every
    /// replica, because every replica applies the same log.
    pub revision: Revision,
    /// What the catalog answered a `Normal` entry (`None` for the blank and
    /// membership entries openraft writes itself). A rejection is an answer,
    /// not a failure: the entry is committed and every replica rejects it
    /// alike, changing nothing.
    ///
    /// Only the proposer in this process reads it. openraft requires `R` to
    /// be serializable but never sends it, so it is not serialized, and a
    /// deserialized `Outcome` holds `None` here.
    #[serde(skip)]
    pub result: Option<Result<Applied, Rejection>>,
}

/// `Envelope` as its codec frame, a byte sequence.
mod command_frame {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::codec;
    use crate::command::Envelope;

    pub fn serialize<S: Serializer>(env: &Envelope, s: S) -> Result<S::Ok, S::Error> {
        codec::encode_command(env).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Envelope, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        codec::decode_command(&bytes).map_err(D::Error::custom)
    }
}
