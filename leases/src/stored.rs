//! How the catalog holds one record: the part its registration fixed
//! (`Fixed`: identity, node, lease, address, version, labels), shared by
//! the catalog and every delta-log entry made while it held, and the part
//! a transition changes (`Live`: state, reason, origin, liveness, revision,
//! time), held in place in the catalog's slot and copied into the log.
//! A transition thus changes a few fields in place: no record is cloned,
//! allocated or dropped, and the digest hash is computed from the fixed
//! part's encoding, kept once, followed by the changed fields.
//!
//! `Fixed` + `Live` is exactly an `EndpointRecord` (the same fields in the
//! same order), so the hash here equals `Digest::of_record` of the record
//! they make; the tests below check it. This module decides nothing about
//! records; `catalog.rs` does. It sits beside `catalog` and `delta_log`,
//! which both hold records this way, so neither imports the other's
//! internals (the delta log imports nothing of the catalog).

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_128;

use crate::endpoint::{EndpointRecord, Labels, Liveness, Principal, State, Weight};
use crate::ids::{AgentEpoch, Generation, LeaseId, Revision};
use crate::name::{InstanceId, Label, NodeId, Reason, Version};

/// What a registration fixes (and a lease grant that moves the record
/// replaces whole): the first twelve fields of `EndpointRecord`, with
/// their postcard encoding.
#[derive(Debug)]
pub(crate) struct Fixed {
    pub(crate) instance_id: InstanceId,
    pub(crate) generation: Generation,
    pub(crate) node_id: NodeId,
    pub(crate) epoch: AgentEpoch,
    pub(crate) lease: LeaseId,
    pub(crate) address: IpAddr,
    pub(crate) port: u16,
    pub(crate) region: Label,
    pub(crate) zone: Label,
    pub(crate) version: Version,
    pub(crate) weight: Weight,
    pub(crate) labels: Labels,
    /// The postcard encoding of the fields above, the first bytes of the
    /// record's own encoding.
    prefix: Box<[u8]>,
}

/// The fields above, borrowed, in `EndpointRecord`'s order: what the
/// prefix encodes.
#[derive(Serialize)]
struct FixedFields<'a> {
    instance_id: &'a InstanceId,
    generation: &'a Generation,
    node_id: &'a NodeId,
    epoch: &'a AgentEpoch,
    lease: &'a LeaseId,
    address: &'a IpAddr,
    port: &'a u16,
    region: &'a Label,
    zone: &'a Label,
    version: &'a Version,
    weight: &'a Weight,
    labels: &'a Labels,
}

/// What a transition, a liveness verdict or a lease's end changes: the
/// last six fields of `EndpointRecord`, in its order.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Live {
    pub(crate) state: State,
    pub(crate) reason: Reason,
    pub(crate) origin: Principal,
    pub(crate) liveness: Liveness,
    pub(crate) revision: Revision,
    pub(crate) changed_at_ms: u64,
}

impl Fixed {
    /// Splits a record into its fixed and live parts.
    pub(crate) fn split(r: EndpointRecord) -> (Fixed, Live) {
        let live = Live {
            state: r.state,
            reason: r.reason,
            origin: r.origin,
            liveness: r.liveness,
            revision: r.revision,
            changed_at_ms: r.changed_at_ms,
        };
        let fixed = Fixed::new(
            r.instance_id,
            r.generation,
            r.node_id,
            (r.epoch, r.lease),
            (r.address, r.port),
            (r.region, r.zone),
            r.version,
            r.weight,
            r.labels,
        );
        (fixed, live)
    }

    /// `self` under another lease of another agent run (a grant that moves
    /// the node's records).
    pub(crate) fn moved(&self, epoch: AgentEpoch, lease: LeaseId, zone: Label) -> Fixed {
        Fixed::new(
            self.instance_id.clone(),
            self.generation,
            self.node_id.clone(),
            (epoch, lease),
            (self.address, self.port),
            (self.region.clone(), zone),
            self.version.clone(),
            self.weight,
            self.labels.clone(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        instance_id: InstanceId,
        generation: Generation,
        node_id: NodeId,
        (epoch, lease): (AgentEpoch, LeaseId),
        (address, port): (IpAddr, u16),
        (region, zone): (Label, Label),
        version: Version,
        weight: Weight,
        labels: Labels,
    ) -> Fixed {
        let prefix = postcard::to_allocvec(&FixedFields {
            instance_id: &instance_id,
            generation: &generation,
            node_id: &node_id,
            epoch: &epoch,
            lease: &lease,
            address: &address,
            port: &port,
            region: &region,
            zone: &zone,
            version: &version,
            weight: &weight,
            labels: &labels,
        })
        .expect("records always encode")
        .into_boxed_slice();
        Fixed {
            instance_id,
            generation,
            node_id,
            epoch,
            lease,
            address,
            port,
            region,
            zone,
            version,
            weight,
            labels,
            prefix,
        }
    }

    /// The whole record of this fixed part with `live`.
    pub(crate) fn record(&self, live: &Live) -> EndpointRecord {
        EndpointRecord {
            instance_id: self.instance_id.clone(),
            generation: self.generation,
            node_id: self.node_id.clone(),
            epoch: self.epoch,
            lease: self.lease,
            address: self.address,
            port: self.port,
            region: self.region.clone(),
            zone: self.zone.clone(),
            version: self.version.clone(),
            weight: self.weight,
            labels: self.labels.clone(),
            state: live.state,
            reason: live.reason.clone(),
            origin: live.origin.clone(),
            liveness: live.liveness,
            revision: live.revision,
            changed_at_ms: live.changed_at_ms,
        }
    }

    /// `Digest::of_record(&self.record(live))`, encoding only `live`
    /// (into `buf`, which the caller reuses).
    pub(crate) fn hash(&self, live: &Live, buf: &mut Vec<u8>) -> u128 {
        buf.clear();
        buf.extend_from_slice(&self.prefix);
        let bytes = postcard::to_extend(live, std::mem::take(buf)).expect("records always encode");
        let hash = xxh3_128(&bytes);
        *buf = bytes;
        hash
    }
}

/// A record as the delta log keeps one change: the fixed part shared,
/// the live part as it was.
pub(crate) fn materialize(fixed: &Arc<Fixed>, live: &Live) -> Arc<EndpointRecord> {
    Arc::new(fixed.record(live))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::endpoint::Role;
    use crate::name::{LabelValue, PrincipalName};
    use proptest::prelude::*;

    fn record(id: &str, labels: usize, address: IpAddr, changed_at_ms: u64) -> EndpointRecord {
        EndpointRecord {
            instance_id: InstanceId::new(id).unwrap(),
            generation: Generation(3),
            node_id: NodeId::new("node-7").unwrap(),
            epoch: AgentEpoch(2),
            lease: LeaseId(19),
            address,
            port: 8443,
            region: Label::new("r1").unwrap(),
            zone: Label::new("z2").unwrap(),
            version: Version::new("v1.42.0").unwrap(),
            weight: Weight::new(250).unwrap(),
            labels: (0..labels)
                .map(|i| {
                    (
                        Label::new(["track", "tier", "cell"][i % 3]).unwrap(),
                        LabelValue::new(&format!("v{i}")).unwrap(),
                    )
                })
                .collect(),
            state: State::Draining,
            reason: Reason::new("drained by its agent").unwrap(),
            origin: Principal {
                role: Role::Agent,
                name: PrincipalName::new("node-7").unwrap(),
            },
            liveness: Liveness::Failing,
            revision: Revision(1 << 40),
            changed_at_ms,
        }
    }

    proptest! {
        /// The split record hashes as the whole record does, and makes the
        /// same record again.
        #[test]
        fn split_records_hash_as_whole_records(
            id in "[a-z][a-z0-9-]{0,40}",
            labels in 0usize..3,
            v6 in any::<bool>(),
            changed_at_ms in any::<u64>(),
        ) {
            let address = if v6 { IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]) } else { IpAddr::from([10, 1, 2, 3]) };
            let r = record(&id, labels, address, changed_at_ms);
            let (fixed, live) = Fixed::split(r.clone());
            prop_assert_eq!(fixed.hash(&live, &mut Vec::new()), Digest::of_record(&r));
            prop_assert_eq!(fixed.record(&live), r.clone());
            let moved = fixed.moved(AgentEpoch(9), LeaseId(77), Label::new("z3").unwrap());
            let mut expected = r;
            expected.epoch = AgentEpoch(9);
            expected.lease = LeaseId(77);
            expected.zone = Label::new("z3").unwrap();
            prop_assert_eq!(moved.hash(&live, &mut Vec::new()), Digest::of_record(&expected));
        }
    }
}
