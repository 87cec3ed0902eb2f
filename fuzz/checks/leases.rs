//! What the fuzz targets of `rollcall-leases`' decoders assert (issue 20),
//! shared by the targets in `fuzz/fuzz_targets/` and by the stable replay
//! of the committed corpora in `leases/tests/fuzz_corpus.rs`, so the two
//! cannot drift. Each check takes raw bytes as they would arrive from
//! outside and panics only when a property fails:
//!
//! - a decoder never panics, whatever the bytes;
//! - what decodes, encodes, and decoding that again gives the same value
//!   and encoding it the same bytes (decode → encode → decode is stable);
//! - a snapshot accepted by a consumer's view matches its digest, and a
//!   delta the view refuses leaves the view as it was;
//! - a catalog snapshot that imports exports one that imports to the
//!   same catalog.
//!
//! `seeds` builds one valid frame of each kind for the starting corpora.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use rollcall_leases::codec::{self, CodecError, FrameKind};
use rollcall_leases::peer_protocol::{self, Heard, MembershipChange, PeerRequest, PeerResponse};
use rollcall_leases::protocol::{
    NodeInstance, RejectKind, Request, Response, ServiceCount, ServiceUpdate, SessionDown,
    SessionUp,
};
use rollcall_leases::{
    AgentEpoch, Catalog, CatalogId, CatalogParams, CatalogSnapshot, Command, Digest, Envelope,
    Generation, Label, LabelValue, LeaseId, NodeId, Principal, PrincipalName, Reason, Registration,
    Revision, Role, ServiceKey, ServiceSnapshot, ServiceView, ShardId, State, Version, Weight,
};

/// Decode → encode → decode for a frame type with `PartialEq`: the second
/// decode gives the same value and its encoding the same bytes.
fn stable<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    decode: fn(&[u8]) -> Result<T, CodecError>,
    encode: fn(&T) -> Vec<u8>,
) -> Option<T> {
    let value = decode(data).ok()?;
    let bytes = encode(&value);
    let again = decode(&bytes).unwrap_or_else(|e| panic!("re-encoded {value:?} fails: {e}"));
    assert_eq!(again, value, "decode → encode → decode changed the value");
    assert_eq!(encode(&again), bytes, "encoding is not stable");
    Some(value)
}

/// The same for a type without `PartialEq` (openraft's messages): the
/// encodings of the first and second decode agree.
fn stable_bytes<T: std::fmt::Debug>(
    data: &[u8],
    decode: fn(&[u8]) -> Result<T, CodecError>,
    encode: fn(&T) -> Vec<u8>,
) -> Option<T> {
    let value = decode(data).ok()?;
    let bytes = encode(&value);
    let again = decode(&bytes).unwrap_or_else(|e| panic!("re-encoded {value:?} fails: {e}"));
    assert_eq!(
        encode(&again),
        bytes,
        "decode → encode → decode is not stable"
    );
    Some(value)
}

/// `arbiter_rpc`: a frame on a request stream, `Request` (agent → arbiter)
/// or `Response` (the answer), told apart by the frame's kind byte as the
/// two ends never do (each reads only its own): both decoders see every
/// input, so the kind check itself is fuzzed too.
pub fn arbiter_rpc(data: &[u8]) {
    stable(data, codec::decode_request, codec::encode_request);
    stable(data, codec::decode_response, codec::encode_response);
}

/// `session_up`: an agent's message on its session stream.
pub fn session_up(data: &[u8]) {
    stable(data, codec::decode_session_up, codec::encode_session_up);
}

/// `session_down`: an arbiter's message on a session stream; the
/// snapshots and deltas of an `Update` go on to what the agent does with
/// them (a snapshot into a view, deltas applied to it).
pub fn session_down(data: &[u8]) {
    let Some(message) = stable(data, codec::decode_session_down, codec::encode_session_down) else {
        return;
    };
    let SessionDown::Update(updates) = message else {
        return;
    };
    for update in updates {
        match update {
            ServiceUpdate::Snapshot(bytes) => service_snapshot(&bytes),
            ServiceUpdate::Deltas(deltas) => {
                let Some(first) = deltas.first() else {
                    continue;
                };
                let mut view = ServiceView::empty(first.service.clone(), ShardId(0));
                for delta in &deltas {
                    let before = view.clone();
                    match view.apply(delta) {
                        Ok(()) => assert_view_matches_digest(&view),
                        Err(_) => assert_eq!(view, before, "a refused delta changed the view"),
                    }
                }
            }
            _ => {}
        }
    }
}

/// The view's digest is the digest of the records it holds.
fn assert_view_matches_digest(view: &ServiceView) {
    assert_eq!(
        view.digest(),
        Digest::of_records(view.records().map(|r| &**r)),
        "a view's digest does not match its records"
    );
}

/// `peer_frame`: a frame between replicas, `PeerRequest` or
/// `PeerResponse` (both decoders see every input, as in `arbiter_rpc`).
pub fn peer_frame(data: &[u8]) {
    stable_bytes(
        data,
        peer_protocol::decode_peer_request,
        peer_protocol::encode_peer_request,
    );
    stable_bytes(
        data,
        peer_protocol::decode_peer_response,
        peer_protocol::encode_peer_response,
    );
}

/// `service_snapshot`: one service's snapshot in the compact form (what
/// an arbiter sends and the agent's cache holds). What decodes is stable,
/// the view accepts it, and the view's digest is the snapshot's.
pub fn service_snapshot(data: &[u8]) {
    let Some(snap) = stable(
        data,
        codec::decode_service_snapshot,
        codec::encode_service_snapshot,
    ) else {
        return;
    };
    let view = ServiceView::from_snapshot(&snap)
        .unwrap_or_else(|e| panic!("a decoded snapshot (digest checked) is refused: {e}"));
    assert_eq!(view.digest(), snap.digest);
    assert_view_matches_digest(&view);
    assert_eq!(
        view.to_snapshot(),
        snap,
        "the view does not hold the snapshot"
    );
}

/// `catalog_snapshot`: a whole shard, in every frame kind the decoder
/// reads (4, 11, 12 and 13). What decodes is stable; if it imports, the
/// catalog's export encodes, decodes and imports to the same export.
pub fn catalog_snapshot(data: &[u8]) {
    let Ok(snap) = codec::decode_catalog_snapshot(data) else {
        return;
    };
    let bytes = codec::encode_catalog_snapshot(&snap);
    let again = codec::decode_catalog_snapshot(&bytes)
        .unwrap_or_else(|e| panic!("a re-encoded catalog snapshot fails: {e}"));
    assert_eq!(again, snap, "decode → encode → decode changed the snapshot");
    assert_eq!(codec::encode_catalog_snapshot(&again), bytes);
    let params = |s: &CatalogSnapshot| CatalogParams {
        shard: s.shard,
        ..CatalogParams::with_region(s.region.clone())
    };
    let Ok(catalog) = Catalog::import(params(&snap), snap) else {
        return;
    };
    let exported = catalog.export();
    let bytes = codec::encode_catalog_snapshot(&exported);
    let decoded = codec::decode_catalog_snapshot(&bytes)
        .unwrap_or_else(|e| panic!("an imported catalog's export does not decode: {e}"));
    assert_eq!(decoded, exported);
    let reimported = Catalog::import(params(&decoded), decoded)
        .unwrap_or_else(|e| panic!("an imported catalog's export does not import: {e}"));
    assert_eq!(
        reimported.export(),
        exported,
        "import → export is not stable"
    );
}

fn label(s: &str) -> Label {
    Label::new(s).expect("seed label")
}

fn node(s: &str) -> NodeId {
    NodeId::new(s).expect("seed node id")
}

fn key(service: &str) -> ServiceKey {
    ServiceKey::new("shop", service, "http").expect("seed service key")
}

/// A catalog with two nodes, a policy and a few instances in two services.
fn seed_catalog() -> Catalog {
    let mut catalog = Catalog::new(CatalogParams::with_region(label("r1")));
    let mut at_ms = 1_000_000;
    let mut run = |catalog: &mut Catalog, command: Command| {
        at_ms += 10;
        catalog
            .apply(&Envelope {
                at_ms,
                actor: Principal {
                    role: Role::Agent,
                    name: PrincipalName::new("node-1").expect("seed principal"),
                },
                command,
            })
            .expect("seed command applies");
    };
    for (n, zone) in [("node-1", "z1"), ("node-2", "z2")] {
        run(
            &mut catalog,
            Command::GrantLease {
                node: node(n),
                epoch: AgentEpoch(1),
                zone: label(zone),
                ttl_ms: 10_000,
            },
        );
    }
    for (s, service) in ["checkout", "cart"].iter().enumerate() {
        for i in 0..3u8 {
            let n = if i % 2 == 0 { "node-1" } else { "node-2" };
            let address = if i == 2 {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, s as u16, 1))
            } else {
                IpAddr::V4(Ipv4Addr::new(10, 0, s as u8, i))
            };
            run(
                &mut catalog,
                Command::Register(seed_registration(
                    &format!("{service}-7d9f8b6c4-{i}"),
                    key(service),
                    n,
                    address,
                )),
            );
        }
    }
    catalog
}

fn seed_registration(id: &str, service: ServiceKey, n: &str, address: IpAddr) -> Registration {
    Registration {
        instance_id: id.parse().expect("seed instance id"),
        service,
        node: node(n),
        epoch: AgentEpoch(1),
        address,
        port: 8080,
        zone: None,
        version: Version::new("v1.2").expect("seed version"),
        weight: Weight::DEFAULT,
        labels: vec![(
            label("track"),
            LabelValue::new("canary").expect("seed label value"),
        )],
        initial: State::Ready,
    }
}

/// One or more valid inputs per target of this crate, by target name.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let catalog = seed_catalog();
    let snapshot: ServiceSnapshot = catalog
        .service_snapshot(&key("checkout"))
        .expect("seed service exists");
    let snapshot_bytes = codec::encode_service_snapshot(&snapshot);
    let deltas = match catalog.changes_since(&key("cart"), Revision(0)) {
        rollcall_leases::catalog::SinceAnswer::Deltas(d) => d,
        _ => Vec::new(),
    };
    let instance = "checkout-7d9f8b6c4-0".parse().expect("seed instance id");
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for request in [
        Request::Register(seed_registration(
            "web-1",
            key("web"),
            "node-1",
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        )),
        Request::Transition {
            instance_id: instance,
            generation: Generation(2),
            to: State::Draining,
            reason: Reason::new("deploy").expect("seed reason"),
        },
        Request::NodeInstances,
        Request::AwaitPropagation {
            service: key("web"),
            revision: Revision(9),
            timeout_ms: 3_000,
        },
        Request::Services,
    ] {
        out.push(("arbiter_rpc", codec::encode_request(&request)));
    }
    for response in [
        Response::Committed {
            revision: Some(Revision(4)),
            generation: Some(Generation(1)),
            state: Some(State::Ready),
        },
        Response::Instances(vec![NodeInstance {
            service: key("web"),
            instance_id: "web-1".parse().expect("seed instance id"),
            generation: Generation(1),
            state: State::Ready,
            reason: Reason::new("").expect("seed reason"),
            origin: Role::Agent,
        }]),
        Response::Rejected {
            kind: RejectKind::StaleGeneration,
            message: "stale".into(),
        },
        Response::Services {
            services: vec![ServiceCount {
                service: key("web"),
                revision: Revision(4),
                ready: 1,
                total: 2,
            }],
            revision: Revision(9),
            truncated: false,
        },
    ] {
        out.push(("arbiter_rpc", codec::encode_response(&response)));
    }
    for up in [
        SessionUp::Hello {
            node: node("node-1"),
            epoch: AgentEpoch(3),
            zone: label("z1"),
            addresses: Vec::new(),
        },
        SessionUp::Subscribe {
            service: key("web"),
            shard: ShardId(0),
            have: Some(Revision(5)),
        },
        SessionUp::Witnessed {
            node: node("node-2"),
            epoch: AgentEpoch(1),
            gossip: Some(true),
            reachable: None,
        },
    ] {
        out.push(("session_up", codec::encode_session_up(&up)));
    }
    for down in [
        SessionDown::Welcome {
            region: label("r1"),
            shard: ShardId(0),
            catalog: Some(CatalogId(7)),
            revision: Revision(12),
            lease: LeaseId(3),
            ttl_ms: 10_000,
        },
        SessionDown::Update(vec![
            ServiceUpdate::Snapshot(snapshot_bytes.clone().into()),
            ServiceUpdate::Deltas(deltas),
            ServiceUpdate::Current {
                service: key("web"),
                revision: Revision(3),
            },
        ]),
        SessionDown::Witness {
            node: node("node-2"),
            epoch: AgentEpoch(1),
            addresses: vec![SocketAddr::from(([10, 0, 0, 2], 8080))],
        },
    ] {
        out.push(("session_down", codec::encode_session_down(&down)));
    }
    for request in [
        PeerRequest::Heard(vec![Heard {
            node: node("node-1"),
            epoch: AgentEpoch(1),
            ago_ms: 20,
            renewed: true,
        }]),
        PeerRequest::Membership(MembershipChange::Add {
            id: 2,
            addr: "10.0.0.2:7443".into(),
        }),
        PeerRequest::Propose(Envelope {
            at_ms: 5,
            actor: Principal {
                role: Role::Agent,
                name: PrincipalName::new("node-1").expect("seed principal"),
            },
            command: Command::Register(seed_registration(
                "web-1",
                key("web"),
                "node-1",
                IpAddr::V4(Ipv4Addr::LOCALHOST),
            )),
        }),
    ] {
        out.push(("peer_frame", peer_protocol::encode_peer_request(&request)));
    }
    for response in [
        PeerResponse::Answer(Response::Propagated { acked: 1, total: 2 }),
        PeerResponse::Refused(vec![(node("node-3"), "older epoch".into())]),
    ] {
        out.push(("peer_frame", peer_protocol::encode_peer_response(&response)));
    }
    out.push(("service_snapshot", snapshot_bytes));
    let export = catalog.export();
    out.push(("catalog_snapshot", codec::encode_catalog_snapshot(&export)));
    // The older frame kinds the decoder still reads.
    let mut older = codec::encode_catalog_snapshot(&CatalogSnapshot {
        identity: None,
        ..export
    });
    if let Some(last) = older.len().checked_sub(1) {
        older.truncate(last); // `None` is one zero byte at the end
        older[1] = FrameKind::CatalogSnapshotWithoutIdentity as u8;
        out.push(("catalog_snapshot", older));
    }
    out
}

/// A fuzz target: its name and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target of this module and its check, by target name.
pub const TARGETS: &[Target] = &[
    ("arbiter_rpc", arbiter_rpc),
    ("session_up", session_up),
    ("session_down", session_down),
    ("peer_frame", peer_frame),
    ("service_snapshot", service_snapshot),
    ("catalog_snapshot", catalog_snapshot),
];
