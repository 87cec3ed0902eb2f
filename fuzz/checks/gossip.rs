//! What the fuzz target of sealed gossip packets asserts (issue 20),
//! shared by `fuzz/fuzz_targets/gossip_packet.rs` and the stable replay of
//! the committed corpus in `gossip/tests/fuzz_corpus.rs`.
//!
//! The input's first byte says how the rest reaches the member: as a raw
//! datagram (0: the seal refuses it, as it refuses anything forged), or
//! sealed first with the zone's current key (1), its previous key during
//! a rotation (2) or a key the member does not hold (3), so the foca
//! decode behind a valid seal is fuzzed too. It asserts that the seal
//! opens what it sealed, that what it refuses never reaches foca, and that
//! a refused datagram changes nothing: no output and the same members.

use std::net::SocketAddr;

use rollcall_config::GossipPreset;
use rollcall_gossip::identity::MemberId;
use rollcall_gossip::membership::{DropReason, Membership, Output};
use rollcall_gossip::seal::{OpenError, Sealer, ZoneKey, MAX_PAYLOAD};
use rollcall_leases::{AgentEpoch, NodeId};

const CURRENT: (u8, [u8; 32]) = (1, [7; 32]);
const PREVIOUS: (u8, [u8; 32]) = (2, [9; 32]);
const UNKNOWN: (u8, [u8; 32]) = (3, [5; 32]);

fn key((id, secret): (u8, [u8; 32])) -> ZoneKey {
    ZoneKey::new(id, secret)
}

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i], 7946))
}

fn id(i: u8) -> MemberId {
    MemberId::new(
        NodeId::new(&format!("node-{i}")).expect("valid node id"),
        addr(i),
        AgentEpoch(u64::from(i)),
    )
}

/// Member 1 of a zone of three, with members 2 and 3 known alive.
fn member() -> Membership {
    let sealer = Sealer::new(key(CURRENT), Some(key(PREVIOUS)), 11);
    let settings = GossipPreset::default().settings();
    let mut member = Membership::new(id(1), &settings, sealer, 12);
    member.preload(vec![id(2), id(3)]);
    member.drain_outputs();
    member
}

fn members(member: &Membership) -> Vec<MemberId> {
    member.members().cloned().collect()
}

/// `gossip_packet`: see the module comment.
pub fn gossip_packet(data: &[u8]) {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    let mode = mode % 4;
    let packet = match mode {
        0 => payload.to_vec(),
        _ => {
            let with = [CURRENT, CURRENT, PREVIOUS, UNKNOWN][usize::from(mode)];
            let mut sealer = Sealer::new(key(with), None, 13);
            let Some(packet) = sealer.seal(payload) else {
                assert!(
                    payload.len() > MAX_PAYLOAD,
                    "the seal refused a payload that fits"
                );
                return;
            };
            if mode != 3 {
                let mut opener = Sealer::new(key(CURRENT), Some(key(PREVIOUS)), 14);
                assert_eq!(opener.open(&packet).as_deref(), Ok(payload), "seal → open");
            }
            packet
        }
    };
    let mut member = member();
    let before = members(&member);
    match member.handle_packet(addr(2), &packet) {
        Ok(()) => {}
        Err(DropReason::Open(error)) => {
            assert!(
                mode == 0 || (mode == 3 && matches!(error, OpenError::UnknownKey { .. })),
                "a packet sealed with mode {mode} was refused by the seal: {error}"
            );
            let outputs: Vec<Output> = member.drain_outputs();
            assert!(
                outputs.is_empty(),
                "a packet the seal refused produced {outputs:?}"
            );
            assert_eq!(
                members(&member),
                before,
                "a refused packet changed the members"
            );
        }
        Err(DropReason::Refused { reason }) => {
            let outputs: Vec<Output> = member.drain_outputs();
            assert!(
                outputs.is_empty(),
                "a packet foca refused ({reason}) produced {outputs:?}"
            );
            assert_eq!(
                members(&member),
                before,
                "a refused packet changed the members"
            );
        }
    }
}

/// Packets member 2 and 3 send when they join member 1, and member 1's
/// answers, unsealed and prefixed with mode 1 (seal with the current key).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let settings = GossipPreset::default().settings();
    let mut zone: Vec<Membership> = (1..=3)
        .map(|i| {
            let sealer = Sealer::new(key(CURRENT), None, u64::from(i));
            Membership::new(id(i), &settings, sealer, u64::from(i) + 100)
        })
        .collect();
    zone[1].join(&[addr(1)]);
    zone[2].join(&[addr(1)]);
    let mut opener = Sealer::new(key(CURRENT), None, 0);
    let mut out = Vec::new();
    for _round in 0..3 {
        let mut sent = Vec::new();
        for (i, member) in zone.iter_mut().enumerate() {
            for output in member.drain_outputs() {
                if let Output::Send { to, bytes } = output {
                    sent.push((addr(i as u8 + 1), to, bytes));
                }
            }
        }
        for (from, to, bytes) in sent {
            if let Ok(payload) = opener.open(&bytes) {
                let mut seed = vec![1];
                seed.extend_from_slice(&payload);
                out.push(("gossip_packet", seed));
            }
            out.push(("gossip_packet", [&[0u8][..], &bytes].concat()));
            if let Some(member) = zone.iter_mut().find(|m| m.id().addr == to) {
                let _ = member.handle_packet(from, &bytes);
            }
        }
    }
    out
}

/// A fuzz target: its name and its check.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target of this module and its check, by target name.
pub const TARGETS: &[Target] = &[("gossip_packet", gossip_packet)];
