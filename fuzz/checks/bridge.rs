//! What the fuzz target of the region bridge's frames asserts (issue 20),
//! shared by `fuzz/fuzz_targets/bridge_frame.rs` and the stable replay of
//! the committed corpus in `region-bridge/tests/fuzz_corpus.rs`.
//!
//! Every input goes to both decoders, `Hello` and `Update` (the frame's
//! kind byte tells them apart, so the kind check is fuzzed too). Neither
//! panics; what decodes encodes, and decodes again to the same value and
//! the same bytes.

use rollcall_config::ServicePolicy;
use rollcall_leases::{Ingress, Label, Policy, RemotePolicy, Revision, ServiceSummary};
use rollcall_region_bridge::codec::{self, CodecError};
use rollcall_region_bridge::message::{Hello, Update};

fn stable<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    decode: fn(&[u8]) -> Result<T, CodecError>,
    encode: fn(&T) -> Vec<u8>,
) {
    let Ok(value) = decode(data) else {
        return;
    };
    let bytes = encode(&value);
    let again = decode(&bytes).unwrap_or_else(|e| panic!("re-encoded {value:?} fails: {e}"));
    assert_eq!(again, value, "decode → encode → decode changed the value");
    assert_eq!(encode(&again), bytes, "encoding is not stable");
}

/// `bridge_frame`: see the module comment.
pub fn bridge_frame(data: &[u8]) {
    stable(data, codec::decode_hello, codec::encode_hello);
    stable(data, codec::decode_update, codec::encode_update);
}

/// A `Hello` and two `Update`s (a delta with everything, a bare full one).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let region = Label::new("r1").expect("seed label");
    let mut doc = ServicePolicy::new("shop/cart", "r1");
    doc.cross_region = true;
    doc.failover_order = vec!["r2".into()];
    let update = Update {
        region: region.clone(),
        full: false,
        base: Revision(4),
        version: Revision(9),
        as_of_ms: 1_000,
        ingress: Some(vec![Ingress::new("edge.r1:443").expect("seed ingress")]),
        policies: vec![RemotePolicy {
            policy: Policy::new(doc).expect("seed policy"),
            home_revision: Revision(8),
            home_set_at_ms: 900,
        }],
        removed_policies: vec!["shop/old".parse().expect("seed policy key")],
        summaries: vec![ServiceSummary {
            service: "shop/cart/http".parse().expect("seed service"),
            revision: Revision(9),
            ready: 3,
            weight: 300,
            taken_at_ms: 1_000,
        }],
        removed_services: vec!["shop/old/http".parse().expect("seed service")],
        writers: Vec::new(),
    };
    let bare = Update {
        full: true,
        ingress: None,
        policies: Vec::new(),
        removed_policies: Vec::new(),
        summaries: Vec::new(),
        removed_services: Vec::new(),
        ..update.clone()
    };
    let hello = Hello {
        region,
        have: Some(Revision(4)),
    };
    vec![
        ("bridge_frame", codec::encode_hello(&hello)),
        ("bridge_frame", codec::encode_update(&update)),
        ("bridge_frame", codec::encode_update(&bare)),
    ]
}

/// A fuzz target: its name and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target of this module and its check, by target name.
pub const TARGETS: &[Target] = &[("bridge_frame", bridge_frame)];
