//! `SessionDown::Update`, written piece by piece so that each delta is
//! encoded once, however many sessions it goes to.
//!
//! A change to a popular service goes to thousands of sessions in the
//! same few milliseconds; encoding it again for each was the arbiter's
//! largest cost in a deploy (a `perf` profile of the 5,000-agent fleet
//! bench: a fifth of its CPU in serialization and the allocations around
//! it). The bytes are exactly those `frame` writes for the same message
//! (postcard: an enum is its variant's index, then its fields; a sequence
//! is its length, then its items), and a test holds the two together for
//! every kind of update.

use std::sync::LazyLock;

use super::{FrameKind, FORMAT_VERSION};
use crate::delta_log::ServiceDelta;
use crate::protocol::{ServiceUpdate, SessionDown};

/// The encoding of `SessionDown::Update`'s tag, and of
/// `ServiceUpdate::Deltas`'s: each an empty value's encoding less the
/// empty list's length (one zero byte).
static TAGS: LazyLock<(Vec<u8>, Vec<u8>)> = LazyLock::new(|| {
    let tag = |mut bytes: Vec<u8>| {
        assert_eq!(
            bytes.pop(),
            Some(0),
            "an empty list encodes as one zero byte"
        );
        bytes
    };
    (
        tag(postcard::to_allocvec(&SessionDown::Update(Vec::new())).expect("encodes")),
        tag(postcard::to_allocvec(&ServiceUpdate::Deltas(Vec::new())).expect("encodes")),
    )
});

impl ServiceDelta {
    /// Its encoding as an item of a message, made once.
    pub(crate) fn encoded(&self) -> &[u8] {
        self.encoded.0.get_or_init(|| {
            postcard::to_allocvec(self)
                .expect("in-memory values always encode")
                .into()
        })
    }
}

/// `frame(FrameKind::SessionDown, &SessionDown::Update(updates))`, with
/// each delta's bytes shared.
pub(super) fn encode_update(updates: &[ServiceUpdate]) -> Vec<u8> {
    let (update_tag, deltas_tag) = &*TAGS;
    let mut out = vec![FORMAT_VERSION, FrameKind::SessionDown as u8];
    out.extend_from_slice(update_tag);
    out = length(updates.len(), out);
    for update in updates {
        match update {
            ServiceUpdate::Deltas(deltas) => {
                out.extend_from_slice(deltas_tag);
                out = length(deltas.len(), out);
                for delta in deltas {
                    out.extend_from_slice(delta.encoded());
                }
            }
            other => out = postcard::to_extend(other, out).expect("in-memory values always encode"),
        }
    }
    out
}

/// A sequence's length, as postcard writes it before the items.
fn length(len: usize, out: Vec<u8>) -> Vec<u8> {
    postcard::to_extend(&len, out).expect("a length always encodes")
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::Arc;

    use super::*;
    use crate::codec::{decode_session_down, encode_session_down, frame};
    use crate::delta_log::{Change, EncodedOnce};
    use crate::digest::Digest;
    use crate::endpoint::{EndpointRecord, Liveness, Principal, Role, State, Weight};
    use crate::ids::{AgentEpoch, Generation, LeaseId, Revision};
    use crate::name::{InstanceId, Label, NodeId, PrincipalName, Reason, ServiceKey, Version};

    fn key(service: &str) -> ServiceKey {
        ServiceKey::new("default", service, "http").unwrap()
    }

    fn record(k: u64) -> Arc<EndpointRecord> {
        Arc::new(EndpointRecord {
            instance_id: InstanceId::new(&format!("web-{k}")).unwrap(),
            generation: Generation(k + 1),
            node_id: NodeId::new("node-7").unwrap(),
            epoch: AgentEpoch(2),
            lease: LeaseId(19),
            address: IpAddr::from([10, 0, (k >> 8) as u8, k as u8]),
            port: 8443,
            region: Label::new("r1").unwrap(),
            zone: Label::new("z2").unwrap(),
            version: Version::new("v1.42.0").unwrap(),
            weight: Weight::new(250).unwrap(),
            labels: Default::default(),
            state: State::Draining,
            reason: Reason::new("drained by its agent").unwrap(),
            origin: Principal {
                role: Role::Agent,
                name: PrincipalName::new("node-7").unwrap(),
            },
            liveness: Liveness::Failing,
            revision: Revision(k << 20),
            changed_at_ms: k * 1_000,
        })
    }

    fn delta(service: &str, revision: u64, changes: u64) -> Arc<ServiceDelta> {
        Arc::new(ServiceDelta {
            service: key(service),
            revision: Revision(revision),
            prev_revision: Revision(revision - 1),
            changes: (0..changes)
                .map(|k| {
                    if k % 3 == 2 {
                        Change::Remove {
                            instance_id: InstanceId::new(&format!("old-{k}")).unwrap(),
                            generation: Generation(k),
                        }
                    } else {
                        Change::Upsert(record(k))
                    }
                })
                .collect(),
            digest: Digest::default(),
            exists: revision % 5 != 0,
            encoded: EncodedOnce::default(),
        })
    }

    /// Every kind of update, and lists long enough for a length of more
    /// than one byte (128 and up) at both levels.
    fn messages() -> Vec<SessionDown> {
        let many: Vec<Arc<ServiceDelta>> = (1..=200).map(|r| delta("api", r, 1)).collect();
        let every_kind = vec![
            ServiceUpdate::Deltas(vec![delta("web", 7, 3), delta("web", 8, 0)]),
            ServiceUpdate::Snapshot(Arc::from(vec![1u8, 2, 3, 200].as_slice())),
            ServiceUpdate::Current {
                service: key("db"),
                revision: Revision(9),
            },
            ServiceUpdate::Unknown {
                service: key("gone"),
            },
            ServiceUpdate::RetryAfter {
                service: key("big"),
                ms: 250,
            },
            ServiceUpdate::Denied {
                service: key("secret"),
                reason: "watch rule".into(),
            },
            ServiceUpdate::NotYet {
                service: key("ahead"),
                current: Revision(3),
            },
            ServiceUpdate::Deltas(Vec::new()),
        ];
        vec![
            SessionDown::Update(Vec::new()),
            SessionDown::Update(every_kind),
            SessionDown::Update(vec![ServiceUpdate::Deltas(many)]),
            SessionDown::Update(
                (0..150)
                    .map(|r| ServiceUpdate::Deltas(vec![delta("x", r + 1, 2)]))
                    .collect(),
            ),
        ]
    }

    #[test]
    fn an_update_is_written_exactly_as_the_generic_encoder_writes_it() {
        for message in messages() {
            let generic = frame(FrameKind::SessionDown, &message);
            // Twice: the second time every delta's bytes come from its cache.
            assert_eq!(encode_session_down(&message), generic);
            assert_eq!(encode_session_down(&message), generic);
            assert_eq!(decode_session_down(&generic).unwrap(), message);
        }
    }

    #[test]
    fn a_delta_is_encoded_once_and_its_bytes_shared_by_every_message() {
        let shared = delta("web", 7, 2);
        assert!(shared.encoded.0.get().is_none());
        let first = encode_session_down(&SessionDown::Update(vec![ServiceUpdate::Deltas(vec![
            shared.clone(),
        ])]));
        let cached = shared
            .encoded
            .0
            .get()
            .expect("encoded by the first message")
            .as_ptr();
        let second = encode_session_down(&SessionDown::Update(vec![ServiceUpdate::Deltas(vec![
            shared.clone(),
        ])]));
        assert_eq!(first, second);
        assert_eq!(shared.encoded.0.get().unwrap().as_ptr(), cached);
    }
}
