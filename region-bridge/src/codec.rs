//! The only place bridge messages become bytes and back: postcard frames
//! `[format version][kind][body]`, each sent with the 4-byte length prefix
//! of `rollcall_leases::codec::write_frame`. Sizes are checked before
//! anything is decoded, and decoding validates every name, policy and
//! address (the leases types refuse invalid values on the way in), so a
//! malformed or oversized frame is an error and never a value.

use rollcall_leases::codec::FrameError;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::message::{Hello, Update};

/// The format version written in the first byte of every frame (the
/// one of every rollcall frame).
pub use rollcall_leases::codec::FORMAT_VERSION;

/// Largest `Hello` frame: a region name and a revision fit in far less.
pub const MAX_HELLO_BYTES: usize = 1024;

/// Largest `Update` frame. A full state of 2,000 services with their
/// policies is a few hundred KiB; the bound leaves room for
/// `MAX_REGION_SUMMARIES` summaries and keeps one peer from making a
/// bridge allocate without limit.
pub const MAX_UPDATE_BYTES: usize = 16 * 1024 * 1024;

/// What a frame holds (its second byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A `Hello`.
    Hello = 1,
    /// An `Update` without writer epochs (every release reads it).
    Update = 2,
    /// An `Update` and its writer epochs: `(Update, Vec<WriterEpoch>)`.
    UpdateWithWriters = 3,
}

impl FrameKind {
    fn name(self) -> &'static str {
        match self {
            FrameKind::Hello => "bridge hello",
            FrameKind::Update | FrameKind::UpdateWithWriters => "bridge update",
        }
    }
}

/// Why a frame could not be read or decoded. Nothing was changed by it.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The stream failed, ended, or announced a frame over the limit.
    #[error("{what}: {source}")]
    Frame {
        /// What was expected.
        what: &'static str,
        /// What went wrong reading it.
        source: FrameError,
    },
    /// The frame is over its limit, of another version or kind, or its
    /// body does not decode (the same checks as every rollcall frame).
    #[error(transparent)]
    Decode(#[from] rollcall_leases::codec::CodecError),
}

fn frame<T: Serialize>(kind: FrameKind, value: &T) -> Vec<u8> {
    rollcall_leases::codec::frame_as(kind as u8, value)
}

fn unframe<T: DeserializeOwned>(
    bytes: &[u8],
    kind: FrameKind,
    limit: usize,
) -> Result<T, CodecError> {
    Ok(rollcall_leases::codec::unframe_as(
        bytes,
        kind as u8,
        kind.name(),
        limit,
    )?)
}

/// Encodes a `Hello`.
pub fn encode_hello(hello: &Hello) -> Vec<u8> {
    frame(FrameKind::Hello, hello)
}

/// Decodes a `Hello`.
pub fn decode_hello(bytes: &[u8]) -> Result<Hello, CodecError> {
    unframe(bytes, FrameKind::Hello, MAX_HELLO_BYTES)
}

/// Encodes an `Update`: as kind `Update` when it carries no writer epoch
/// (so a bridge of an earlier release reads it), else as
/// `UpdateWithWriters`.
pub fn encode_update(update: &Update) -> Vec<u8> {
    if update.writers.is_empty() {
        frame(FrameKind::Update, update)
    } else {
        frame(FrameKind::UpdateWithWriters, &(update, &update.writers))
    }
}

/// Decodes an `Update` of either kind.
pub fn decode_update(bytes: &[u8]) -> Result<Update, CodecError> {
    if bytes.get(1) == Some(&(FrameKind::UpdateWithWriters as u8)) {
        let (mut update, writers): (Update, Vec<rollcall_leases::WriterEpoch>) =
            unframe(bytes, FrameKind::UpdateWithWriters, MAX_UPDATE_BYTES)?;
        update.writers = writers;
        return Ok(update);
    }
    unframe(bytes, FrameKind::Update, MAX_UPDATE_BYTES)
}

/// Reads one length-prefixed `Hello` from a stream (the length is refused
/// before anything is read when over `MAX_HELLO_BYTES`).
pub async fn read_hello<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> Result<Hello, CodecError> {
    let bytes = rollcall_leases::codec::read_frame(r, MAX_HELLO_BYTES)
        .await
        .map_err(|source| CodecError::Frame {
            what: FrameKind::Hello.name(),
            source,
        })?;
    decode_hello(&bytes)
}

/// Reads one length-prefixed `Update` from a stream.
pub async fn read_update<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> Result<Update, CodecError> {
    read_update_sized(r).await.map(|(update, _)| update)
}

/// [`read_update`], also answering the frame's length in bytes.
pub async fn read_update_sized<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
) -> Result<(Update, usize), CodecError> {
    let bytes = rollcall_leases::codec::read_frame(r, MAX_UPDATE_BYTES)
        .await
        .map_err(|source| CodecError::Frame {
            what: FrameKind::Update.name(),
            source,
        })?;
    decode_update(&bytes).map(|update| (update, bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rollcall_config::ServicePolicy;
    use rollcall_leases::codec::CodecError as LeasesCodecError;
    use rollcall_leases::{Ingress, Label, Policy, RemotePolicy, Revision, ServiceSummary};

    fn update() -> Update {
        Update {
            region: Label::new("r1").unwrap(),
            full: false,
            base: Revision(4),
            version: Revision(9),
            as_of_ms: 1_000,
            ingress: Some(vec![Ingress::new("edge.r1:443").unwrap()]),
            policies: vec![RemotePolicy {
                policy: Policy::new(ServicePolicy::new("shop/cart", "r1")).unwrap(),
                home_revision: Revision(8),
                home_set_at_ms: 900,
            }],
            removed_policies: vec!["shop/old".parse().unwrap()],
            summaries: vec![ServiceSummary {
                service: "shop/cart/http".parse().unwrap(),
                revision: Revision(9),
                ready: 3,
                weight: 300,
                taken_at_ms: 1_000,
            }],
            removed_services: vec!["shop/old/http".parse().unwrap()],
            writers: Vec::new(),
        }
    }

    #[test]
    fn an_update_with_writer_epochs_is_its_own_kind_and_round_trips() {
        let plain = update();
        assert_eq!(encode_update(&plain)[1], FrameKind::Update as u8);
        let mut with = update();
        with.writers.push(rollcall_leases::WriterEpoch {
            service: "shop/cart".parse().unwrap(),
            epoch: 3,
            owner: Label::new("r2").unwrap(),
            from: Some(Label::new("r1").unwrap()),
            settled: false,
            at_ms: 7,
            by: rollcall_leases::Principal {
                role: rollcall_leases::Role::Operator,
                name: rollcall_leases::PrincipalName::new("admin-token").unwrap(),
            },
            committed_in: Label::new("r1").unwrap(),
            forced: Some(rollcall_leases::Reason::new("r2 drill").unwrap()),
        });
        let bytes = encode_update(&with);
        assert_eq!(bytes[1], FrameKind::UpdateWithWriters as u8);
        assert_eq!(decode_update(&bytes).unwrap(), with);
        assert_eq!(decode_update(&encode_update(&plain)).unwrap(), plain);
    }

    #[test]
    fn messages_round_trip() {
        let u = update();
        assert_eq!(decode_update(&encode_update(&u)).unwrap(), u);
        assert_eq!(u.items(), 4);
        let hello = Hello {
            region: Label::new("r2").unwrap(),
            have: Some(Revision(4)),
        };
        assert_eq!(decode_hello(&encode_hello(&hello)).unwrap(), hello);
    }

    #[test]
    fn every_damaged_frame_is_an_error() {
        let bytes = encode_update(&update());
        assert!(matches!(
            decode_update(&[]),
            Err(CodecError::Decode(LeasesCodecError::Empty { .. }))
        ));
        let mut version = bytes.clone();
        version[0] = 9;
        assert!(matches!(
            decode_update(&version),
            Err(CodecError::Decode(LeasesCodecError::Version { got: 9, .. }))
        ));
        assert!(matches!(
            decode_hello(&bytes),
            Err(CodecError::Decode(LeasesCodecError::TooLarge { .. }))
                | Err(CodecError::Decode(LeasesCodecError::WrongKind { .. }))
        ));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(matches!(
            decode_update(&trailing),
            Err(CodecError::Decode(LeasesCodecError::Malformed { .. }))
        ));
        for cut in [3, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode_update(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let big = vec![0u8; MAX_HELLO_BYTES + 1];
        assert!(matches!(
            decode_hello(&big),
            Err(CodecError::Decode(LeasesCodecError::TooLarge { .. }))
        ));
    }

    #[test]
    fn decoding_validates_policies_and_addresses() {
        // A policy failing its rules (failover into its data boundary).
        let mut doc = ServicePolicy::new("shop/cart", "r1");
        doc.failover_order = vec!["r2".into()];
        doc.data_boundary = vec!["r2".into()];
        let body = (
            Label::new("r1").unwrap(),
            true,
            Revision(0),
            Revision(1),
            0u64,
            None::<Vec<String>>,
            vec![(doc, Revision(1), 0u64)],
            Vec::<String>::new(),
            Vec::<String>::new(),
            Vec::<String>::new(),
        );
        let bytes =
            postcard::to_extend(&body, vec![FORMAT_VERSION, FrameKind::Update as u8]).unwrap();
        assert!(matches!(
            decode_update(&bytes),
            Err(CodecError::Decode(LeasesCodecError::Malformed { .. }))
        ));
        // An ingress address without a port.
        let body = (
            Label::new("r1").unwrap(),
            true,
            Revision(0),
            Revision(1),
            0u64,
            Some(vec!["edge".to_owned()]),
            Vec::<u8>::new(),
            Vec::<u8>::new(),
            Vec::<u8>::new(),
            Vec::<u8>::new(),
        );
        let bytes =
            postcard::to_extend(&body, vec![FORMAT_VERSION, FrameKind::Update as u8]).unwrap();
        assert!(matches!(
            decode_update(&bytes),
            Err(CodecError::Decode(LeasesCodecError::Malformed { .. }))
        ));
    }
}
