//! The one place bytes are made and read in this crate: commands, deltas
//! and snapshots, encoded with postcard (not bincode: it is unmaintained,
//! RUSTSEC-2025-0141, and foca 2 dropped it).
//!
//! Every frame is `[format version][kind][postcard body]`, checked against a
//! size limit before anything is decoded. Decoding validates every name and
//! index and never panics: malformed bytes give a `CodecError`.
//!
//! Snapshots use a compact form (R6's size budget): the strings shared by
//! many records (node ids, zones, versions, reasons, origins, label sets)
//! are stored once in tables and records refer to them by index; instance
//! ids, sorted, store only what differs from the previous id; times are
//! offsets from the snapshot's earliest time (`compact.rs`).

use foldhash::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::command::Envelope;
use crate::delta_log::ServiceDelta;
use crate::digest::Digest;
use crate::endpoint::{EndpointRecord, Labels, Liveness, Principal, Role, State, Weight};
use crate::ids::{AgentEpoch, CatalogId, Generation, LeaseId, Revision, ShardId};
use crate::lease::Lease;
use crate::name::{
    InstanceId, Label, LabelValue, NodeId, PrincipalName, Reason, ServiceKey, Version,
};
use crate::policy::{ReplicatedPolicy, StoredPolicy};
use crate::protocol::{Request, Response, SessionDown, SessionUp};
use crate::snapshot::GenerationMemory;
use crate::snapshot::{CatalogSnapshot, ServiceEntry, ServiceSnapshot};
use crate::writer::StoredWriter;

mod compact;
mod update;

pub use compact::{
    decode_catalog_snapshot, decode_service_snapshot, encode_catalog_snapshot,
    encode_service_snapshot, shared_service_snapshot,
};

/// The format version written in the first byte of every frame.
pub const FORMAT_VERSION: u8 = 1;
/// Largest encoded command.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Largest encoded delta.
pub const MAX_DELTA_BYTES: usize = 4 * 1024 * 1024;
/// Largest encoded snapshot of one service.
pub const MAX_SERVICE_SNAPSHOT_BYTES: usize = 64 * 1024 * 1024;
/// Largest encoded snapshot of a shard.
pub const MAX_CATALOG_SNAPSHOT_BYTES: usize = 512 * 1024 * 1024;
/// Largest message an agent sends on its session, and largest request.
pub const MAX_SMALL_MESSAGE_BYTES: usize = 64 * 1024;
/// Largest response: a `Services` list of `MAX_LISTED_SERVICES` keys of
/// the longest names fits.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// Largest session message from an arbiter (an update carrying snapshots).
pub const MAX_SESSION_DOWN_BYTES: usize = 64 * 1024 * 1024;
/// Largest message between replicas: a batch of log entries or one
/// snapshot chunk (openraft's `snapshot_max_chunk_size` stays below it).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What a frame holds (its second byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// An `Envelope`.
    Command = 1,
    /// A `ServiceDelta`.
    Delta = 2,
    /// A `ServiceSnapshot`.
    ServiceSnapshot = 3,
    /// A `CatalogSnapshot` written before service policies existed: read
    /// (as a catalog without policies), never written.
    CatalogSnapshotWithoutPolicies = 4,
    /// A `protocol::SessionUp`.
    SessionUp = 5,
    /// A `protocol::SessionDown`.
    SessionDown = 6,
    /// A `protocol::Request`.
    Request = 7,
    /// A `protocol::Response`.
    Response = 8,
    /// A `peer_protocol::PeerRequest`.
    PeerRequest = 9,
    /// A `peer_protocol::PeerResponse`.
    PeerResponse = 10,
    /// A `CatalogSnapshot` written before replicated policies existed:
    /// the kind-4 body followed by the service policies. Read (as a catalog
    /// without replicated policies), never written.
    CatalogSnapshotWithoutReplicas = 11,
    /// A `CatalogSnapshot`: the kind-11 body followed by the policies
    /// replicated from other regions. A new kind rather than a new format
    /// version, so every other frame stays readable by older builds and a
    /// stored kind-4 or kind-11 snapshot by this one. Read (as a catalog
    /// without an identity), never written.
    CatalogSnapshotWithoutIdentity = 12,
    /// A `CatalogSnapshot` written before writer epochs existed: the
    /// kind-12 body followed by the catalog's identity. Read (as a catalog
    /// without writer epochs), never written.
    CatalogSnapshotWithoutWriters = 13,
    /// A `CatalogSnapshot`: the kind-13 body followed by the writer epochs.
    CatalogSnapshot = 14,
}

impl FrameKind {
    fn name(self) -> &'static str {
        match self {
            FrameKind::Command => "command",
            FrameKind::Delta => "delta",
            FrameKind::ServiceSnapshot => "service snapshot",
            FrameKind::CatalogSnapshot
            | FrameKind::CatalogSnapshotWithoutWriters
            | FrameKind::CatalogSnapshotWithoutIdentity
            | FrameKind::CatalogSnapshotWithoutReplicas
            | FrameKind::CatalogSnapshotWithoutPolicies => "catalog snapshot",
            FrameKind::SessionUp => "session message from an agent",
            FrameKind::SessionDown => "session message from an arbiter",
            FrameKind::Request => "request",
            FrameKind::Response => "response",
            FrameKind::PeerRequest => "request from a peer replica",
            FrameKind::PeerResponse => "response from a peer replica",
        }
    }
}

/// Why bytes could not be decoded. Nothing was changed by them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// No bytes at all.
    #[error("empty {what} frame")]
    Empty {
        /// What was expected.
        what: &'static str,
    },
    /// Over the size limit.
    #[error("{what} frame of {len} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// What was expected.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Written by another format version.
    #[error("{what} frame has format version {got}; this build reads version {FORMAT_VERSION}")]
    Version {
        /// What was expected.
        what: &'static str,
        /// The version found.
        got: u8,
    },
    /// Another kind of frame.
    #[error("expected a {what} frame, got frame kind {got}")]
    WrongKind {
        /// What was expected.
        what: &'static str,
        /// The kind byte found.
        got: u8,
    },
    /// The body does not decode, or holds an invalid value.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was expected.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
}

fn malformed(what: &'static str, detail: impl ToString) -> CodecError {
    CodecError::Malformed {
        what,
        detail: detail.to_string(),
    }
}

pub(crate) fn frame<T: Serialize>(kind: FrameKind, value: &T) -> Vec<u8> {
    frame_as(kind as u8, value)
}

pub(crate) fn unframe<T: DeserializeOwned>(
    bytes: &[u8],
    kind: FrameKind,
    limit: usize,
) -> Result<T, CodecError> {
    unframe_as(bytes, kind as u8, kind.name(), limit)
}

/// A frame `[FORMAT_VERSION][kind][postcard body]` for a protocol of
/// another crate (the region bridge's), whose kinds are its own.
pub fn frame_as<T: Serialize>(kind: u8, value: &T) -> Vec<u8> {
    postcard::to_extend(value, vec![FORMAT_VERSION, kind]).expect("in-memory values always encode")
}

/// Decodes a frame written by [`frame_as`]: the size is checked before
/// anything is decoded, then the version, the kind (`what` names it in
/// errors) and that the body is one value with nothing after it.
pub fn unframe_as<T: DeserializeOwned>(
    bytes: &[u8],
    kind: u8,
    what: &'static str,
    limit: usize,
) -> Result<T, CodecError> {
    if bytes.len() > limit {
        return Err(CodecError::TooLarge {
            what,
            len: bytes.len(),
            limit,
        });
    }
    let [version, got, body @ ..] = bytes else {
        return Err(CodecError::Empty { what });
    };
    if *version != FORMAT_VERSION {
        return Err(CodecError::Version {
            what,
            got: *version,
        });
    }
    if *got != kind {
        return Err(CodecError::WrongKind { what, got: *got });
    }
    let (value, rest) = postcard::take_from_bytes::<T>(body).map_err(|e| malformed(what, e))?;
    if !rest.is_empty() {
        return Err(malformed(what, format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}

/// Encodes a command for the log or the wire.
pub fn encode_command(env: &Envelope) -> Vec<u8> {
    frame(FrameKind::Command, env)
}

/// Decodes a command.
pub fn decode_command(bytes: &[u8]) -> Result<Envelope, CodecError> {
    unframe(bytes, FrameKind::Command, MAX_COMMAND_BYTES)
}

/// Encodes a delta.
pub fn encode_delta(delta: &ServiceDelta) -> Vec<u8> {
    frame(FrameKind::Delta, delta)
}

/// Decodes a delta.
pub fn decode_delta(bytes: &[u8]) -> Result<ServiceDelta, CodecError> {
    unframe(bytes, FrameKind::Delta, MAX_DELTA_BYTES)
}

/// Encodes an agent's session message.
pub fn encode_session_up(m: &SessionUp) -> Vec<u8> {
    frame(FrameKind::SessionUp, m)
}

/// Decodes an agent's session message.
pub fn decode_session_up(bytes: &[u8]) -> Result<SessionUp, CodecError> {
    unframe(bytes, FrameKind::SessionUp, MAX_SMALL_MESSAGE_BYTES)
}

/// Encodes an arbiter's session message (an update's deltas each encoded
/// once, whatever number of sessions they go to: `update.rs`).
pub fn encode_session_down(m: &SessionDown) -> Vec<u8> {
    match m {
        SessionDown::Update(updates) => update::encode_update(updates),
        other => frame(FrameKind::SessionDown, other),
    }
}

/// Decodes an arbiter's session message.
pub fn decode_session_down(bytes: &[u8]) -> Result<SessionDown, CodecError> {
    unframe(bytes, FrameKind::SessionDown, MAX_SESSION_DOWN_BYTES)
}

/// Encodes a request.
pub fn encode_request(m: &Request) -> Vec<u8> {
    frame(FrameKind::Request, m)
}

/// Decodes a request.
pub fn decode_request(bytes: &[u8]) -> Result<Request, CodecError> {
    unframe(bytes, FrameKind::Request, MAX_SMALL_MESSAGE_BYTES)
}

/// Encodes a response.
pub fn encode_response(m: &Response) -> Vec<u8> {
    frame(FrameKind::Response, m)
}

/// Decodes a response.
pub fn decode_response(bytes: &[u8]) -> Result<Response, CodecError> {
    unframe(bytes, FrameKind::Response, MAX_RESPONSE_BYTES)
}

/// Why a frame could not be read from a stream.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended cleanly before a frame began.
    #[error("stream closed")]
    Closed,
    /// The peer announced a frame over the limit; nothing of it was read.
    #[error("peer announced a {len}-byte frame; the limit is {limit}")]
    TooLarge {
        /// The announced length.
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// The stream failed or ended inside a frame.
    #[error("stream error: {0}")]
    Io(#[from] std::io::Error),
}

/// Writes one frame: a 4-byte big-endian length, then the encoded bytes.
pub async fn write_frame<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let len = u32::try_from(bytes.len()).map_err(|_| std::io::Error::other("frame over 4 GiB"))?;
    w.write_all(&len.to_be_bytes()).await?;
    w.write_all(bytes).await
}

/// Reads one frame written by `write_frame`, refusing lengths over `limit`
/// before reading them.
pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
) -> Result<Vec<u8>, FrameError> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let len = u32::from_be_bytes(len) as u64;
    if len > limit as u64 {
        return Err(FrameError::TooLarge { len, limit });
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_checked_before_decoding() {
        assert!(matches!(decode_command(&[]), Err(CodecError::Empty { .. })));
        assert!(matches!(
            decode_command(&[9, 1, 0]),
            Err(CodecError::Version { got: 9, .. })
        ));
        assert!(matches!(
            decode_command(&[FORMAT_VERSION, 2, 0]),
            Err(CodecError::WrongKind { got: 2, .. })
        ));
        let big = vec![FORMAT_VERSION; MAX_COMMAND_BYTES + 1];
        assert!(matches!(
            decode_command(&big),
            Err(CodecError::TooLarge { .. })
        ));
        assert!(matches!(
            decode_command(&[FORMAT_VERSION, 1, 0xff]),
            Err(CodecError::Malformed { .. })
        ));
    }
}
