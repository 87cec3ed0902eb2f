//! Packet authentication and encryption with the zone key (R10): every
//! gossip datagram is `[key id: u8][nonce: 12 bytes][ChaCha20-Poly1305
//! ciphertext + 16-byte tag]`. The key id is bound to the ciphertext as
//! associated data, so it cannot be swapped either.
//!
//! Nonces are `[random 8-byte prefix][4-byte big-endian counter]`. The
//! prefix is drawn from the seeded RNG at start and again whenever the
//! counter wraps, so one sealer never repeats a nonce, and two sealers of a
//! zone (who share the key) collide only if they draw the same 64-bit
//! prefix: about m²/2⁶⁵ for m prefixes drawn under one key, negligible
//! even for thousands of agents restarting for years. Fully random 96-bit
//! nonces would reach a birthday risk of 2⁻³² after about 2³² packets per
//! key, which a zone of 5,000 agents sends in hours.
//!
//! An authentic datagram opened before is dropped (`replay`, see
//! [`crate::replay`]): the nonce's prefix names the sender's run and its
//! counter the datagram.
//!
//! This module only calls the `chacha20poly1305` crate; it must not
//! implement any cryptography itself, and nothing it fails to open may be
//! passed on.

use std::fmt;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::replay::ReplayWindows;

/// Largest datagram we send or accept, in bytes: fits a 1,500-byte
/// Ethernet MTU with room for IP and UDP headers without fragmentation.
pub const MAX_PACKET: usize = 1400;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const HEADER_LEN: usize = 1 + NONCE_LEN;

/// Bytes a sealed packet adds to its payload.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;

/// Largest foca payload that still fits [`MAX_PACKET`] once sealed.
pub const MAX_PAYLOAD: usize = MAX_PACKET - OVERHEAD;

/// A 32-byte zone key and the id that names it on the wire, so members
/// can tell which key a packet was sealed with during a rotation.
#[derive(Clone)]
pub struct ZoneKey {
    id: u8,
    cipher: ChaCha20Poly1305,
}

/// Why a zone key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// It could not be read.
    #[error("cannot read zone key file {path}: {source}; copy the zone's key file there (every agent of a zone holds the same one), or make a zone's first with `rollcall gossip-key`")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// It does not hold `<id> <64 hex digits>`.
    #[error("zone key file {path} must hold one line `<key id 0-255> <64 hex digits>`; generate one with `rollcall gossip-key`")]
    Format {
        /// The file.
        path: std::path::PathBuf,
    },
}

impl ZoneKey {
    /// Reads a key file: one line `<key id 0-255> <64 hex digits>`.
    pub fn load(path: &std::path::Path) -> Result<ZoneKey, KeyFileError> {
        let io = |source| KeyFileError::Io {
            path: path.to_owned(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(io)?;
        rollcall_leases::secret::owner_only(path).map_err(io)?;
        let format = || KeyFileError::Format {
            path: path.to_owned(),
        };
        let mut words = text.split_whitespace();
        let (Some(id), Some(secret), None) = (words.next(), words.next(), words.next()) else {
            return Err(format());
        };
        let id: u8 = id.parse().map_err(|_| format())?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(secret, &mut bytes).map_err(|_| format())?;
        Ok(ZoneKey::new(id, bytes))
    }

    /// A fresh key file line for key id `id`, from 32 random bytes.
    pub fn generate_line(id: u8) -> String {
        let secret: [u8; 32] = rand::random();
        format!("{id} {}", hex::encode(secret))
    }

    /// Wraps 32 secret bytes under a key id. Ids only need to differ
    /// between the current and the previous key of one rotation.
    pub fn new(id: u8, secret: [u8; 32]) -> Self {
        ZoneKey {
            id,
            cipher: ChaCha20Poly1305::new(Key::from_slice(&secret)),
        }
    }

    /// The id written in front of each packet sealed with this key.
    pub fn id(&self) -> u8 {
        self.id
    }
}

impl fmt::Debug for ZoneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZoneKey({}, <secret>)", self.id)
    }
}

/// Why a datagram was dropped before reaching foca.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Larger than [`MAX_PACKET`]: nobody in the zone sends that.
    #[error("gossip packet of {len} bytes is over the {MAX_PACKET}-byte limit; dropped")]
    TooLarge {
        /// Its size in bytes.
        len: usize,
    },
    /// Too short to hold a key id, a nonce and a tag.
    #[error("gossip packet of {len} bytes is shorter than the {OVERHEAD}-byte seal; dropped")]
    TooShort {
        /// Its size in bytes.
        len: usize,
    },
    /// Sealed with a key id this member does not hold: a member with a
    /// rotated-out key, or another zone. Check that every agent of the zone
    /// has the current key.
    #[error("gossip packet sealed with unknown key id {key_id}; check the zone key rotation")]
    UnknownKey {
        /// The key id it carried.
        key_id: u8,
    },
    /// Authentication failed: tampered, corrupted or forged.
    #[error("gossip packet under key id {key_id} failed authentication; dropped")]
    Forged {
        /// The key id it carried.
        key_id: u8,
    },
    /// Authentic, but opened before (or older than its sender's replay
    /// window): a captured datagram sent again, or one the network
    /// duplicated.
    #[error("gossip packet under key id {key_id} was seen before (replay); dropped")]
    Replayed {
        /// The key id it carried.
        key_id: u8,
    },
}

/// Counts of datagrams [`Sealer::open`] refused, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenDrops {
    /// See [`OpenError::TooLarge`].
    pub too_large: u64,
    /// See [`OpenError::TooShort`].
    pub too_short: u64,
    /// See [`OpenError::UnknownKey`].
    pub unknown_key: u64,
    /// See [`OpenError::Forged`].
    pub forged: u64,
    /// See [`OpenError::Replayed`].
    pub replay: u64,
}

/// Seals outgoing payloads with the current zone key and opens incoming
/// packets sealed with the current or, during a rotation, the previous key.
pub struct Sealer {
    current: ZoneKey,
    previous: Option<ZoneKey>,
    rng: StdRng,
    prefix: [u8; 8],
    counter: u32,
    drops: OpenDrops,
    replay: ReplayWindows,
}

impl Sealer {
    /// A sealer using `current` for everything it sends and accepting
    /// `previous` as well while a rotation is under way. `nonce_seed` feeds
    /// the nonce prefixes (see the module comment); in production it comes
    /// from the OS, in tests and the simulator from the scenario seed.
    pub fn new(current: ZoneKey, previous: Option<ZoneKey>, nonce_seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(nonce_seed);
        let mut prefix = [0; 8];
        rng.fill_bytes(&mut prefix);
        Sealer {
            current,
            previous,
            rng,
            prefix,
            counter: 0,
            drops: OpenDrops::default(),
            replay: ReplayWindows::default(),
        }
    }

    /// Seals `payload` into a datagram. Returns `None` only when the result
    /// would be over [`MAX_PACKET`], which foca never produces when its
    /// `max_packet_size` is [`MAX_PAYLOAD`].
    pub fn seal(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        if payload.len() > MAX_PAYLOAD {
            return None;
        }
        let mut nonce = [0; NONCE_LEN];
        nonce[..8].copy_from_slice(&self.prefix);
        nonce[8..].copy_from_slice(&self.counter.to_be_bytes());
        self.advance_nonce();
        let key_id = [self.current.id];
        let sealed = self
            .current
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: payload,
                    aad: &key_id,
                },
            )
            .ok()?;
        let mut packet = Vec::with_capacity(HEADER_LEN + sealed.len());
        packet.push(self.current.id);
        packet.extend_from_slice(&nonce);
        packet.extend_from_slice(&sealed);
        Some(packet)
    }

    fn advance_nonce(&mut self) {
        match self.counter.checked_add(1) {
            Some(next) => self.counter = next,
            None => {
                self.rng.fill_bytes(&mut self.prefix);
                self.counter = 0;
            }
        }
    }

    /// Checks and decrypts a datagram, and drops a replay of one opened
    /// before (`replay`), counting it by reason if refused.
    pub fn open(&mut self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        let opened = self.try_open(packet).and_then(|payload| {
            // Authentic: its nonce is the sender's own (prefix, counter).
            let mut prefix = [0; 8];
            prefix.copy_from_slice(&packet[1..9]);
            let mut counter = [0; 4];
            counter.copy_from_slice(&packet[9..HEADER_LEN]);
            if self.replay.accept(prefix, u32::from_be_bytes(counter)) {
                Ok(payload)
            } else {
                Err(OpenError::Replayed { key_id: packet[0] })
            }
        });
        if let Err(error) = &opened {
            let counter = match error {
                OpenError::TooLarge { .. } => &mut self.drops.too_large,
                OpenError::TooShort { .. } => &mut self.drops.too_short,
                OpenError::UnknownKey { .. } => &mut self.drops.unknown_key,
                OpenError::Forged { .. } => &mut self.drops.forged,
                OpenError::Replayed { .. } => &mut self.drops.replay,
            };
            *counter += 1;
        }
        opened
    }

    fn try_open(&self, packet: &[u8]) -> Result<Vec<u8>, OpenError> {
        let len = packet.len();
        if len > MAX_PACKET {
            return Err(OpenError::TooLarge { len });
        }
        if len < OVERHEAD {
            return Err(OpenError::TooShort { len });
        }
        let key_id = packet[0];
        let key = std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .find(|key| key.id == key_id)
            .ok_or(OpenError::UnknownKey { key_id })?;
        let (nonce, sealed) = packet[1..].split_at(NONCE_LEN);
        key.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &packet[..1],
                },
            )
            .map_err(|_| OpenError::Forged { key_id })
    }

    /// How many datagrams were refused so far, by reason.
    pub fn drops(&self) -> OpenDrops {
        self.drops
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn key_files_round_trip_and_bad_ones_say_how_to_fix_them() {
        let dir = std::env::temp_dir().join(format!("rollcall-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("zone.key");
        std::fs::write(&path, ZoneKey::generate_line(7)).unwrap();
        assert_eq!(ZoneKey::load(&path).unwrap().id(), 7);
        for bad in [
            "",
            "7",
            "300 00",
            "7 abcd",
            "x 0000000000000000000000000000000000000000000000000000000000000000",
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = ZoneKey::load(&path).unwrap_err();
            assert!(
                err.to_string().contains("rollcall gossip-key"),
                "{bad:?}: {err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    use super::*;

    fn key(id: u8, fill: u8) -> ZoneKey {
        ZoneKey::new(id, [fill; 32])
    }

    #[test]
    fn round_trip() {
        let mut sealer = Sealer::new(key(1, 7), None, 1);
        let packet = sealer.seal(b"hello zone").expect("fits");
        assert_eq!(packet.len(), 10 + OVERHEAD);
        assert_eq!(sealer.open(&packet).expect("opens"), b"hello zone");
    }

    #[test]
    fn nonces_do_not_repeat() {
        let mut sealer = Sealer::new(key(1, 7), None, 1);
        let a = sealer.seal(b"x").expect("fits");
        let b = sealer.seal(b"x").expect("fits");
        assert_ne!(a[1..HEADER_LEN], b[1..HEADER_LEN]);
        assert_ne!(a, b);
    }

    #[test]
    fn every_tampered_byte_is_rejected() {
        let mut sealer = Sealer::new(key(1, 7), None, 1);
        let packet = sealer.seal(b"member down: node-3").expect("fits");
        // Byte 0 is the key id: flipping it names an unknown key instead.
        for i in 1..packet.len() {
            let mut tampered = packet.clone();
            tampered[i] ^= 0x01;
            assert_eq!(
                sealer.open(&tampered),
                Err(OpenError::Forged { key_id: 1 }),
                "byte {i}"
            );
        }
        assert_eq!(sealer.drops().forged, packet.len() as u64 - 1);
    }

    #[test]
    fn unknown_key_is_rejected() {
        let mut other_zone = Sealer::new(key(9, 3), None, 2);
        let mut sealer = Sealer::new(key(1, 7), None, 1);
        let packet = other_zone.seal(b"hi").expect("fits");
        assert_eq!(
            sealer.open(&packet),
            Err(OpenError::UnknownKey { key_id: 9 })
        );
        assert_eq!(sealer.drops().unknown_key, 1);
    }

    #[test]
    fn same_key_id_with_other_secret_is_forged() {
        let mut impostor = Sealer::new(key(1, 3), None, 2);
        let mut sealer = Sealer::new(key(1, 7), None, 1);
        let packet = impostor.seal(b"hi").expect("fits");
        assert_eq!(sealer.open(&packet), Err(OpenError::Forged { key_id: 1 }));
    }

    #[test]
    fn previous_key_is_accepted_during_rotation() {
        let mut not_yet_rotated = Sealer::new(key(1, 7), None, 2);
        let mut rotated = Sealer::new(key(2, 8), Some(key(1, 7)), 1);
        let old = not_yet_rotated.seal(b"old key").expect("fits");
        assert_eq!(rotated.open(&old).expect("opens"), b"old key");
        // The rotated member seals with the new key, which the other does
        // not know yet: rotation must install the new key everywhere as
        // "previous" first, then promote it.
        let new = rotated.seal(b"new key").expect("fits");
        assert_eq!(
            not_yet_rotated.open(&new),
            Err(OpenError::UnknownKey { key_id: 2 })
        );
    }

    #[test]
    fn a_replayed_datagram_is_dropped_and_counted() {
        let mut sender = Sealer::new(key(1, 7), None, 2);
        let mut receiver = Sealer::new(key(1, 7), None, 1);
        let first = sender.seal(b"member down: node-3").expect("fits");
        let second = sender.seal(b"member up: node-3").expect("fits");
        assert!(receiver.open(&second).is_ok());
        // Reordered by the network: the earlier one still passes.
        assert!(receiver.open(&first).is_ok());
        for packet in [&first, &second] {
            assert_eq!(
                receiver.open(packet),
                Err(OpenError::Replayed { key_id: 1 })
            );
        }
        assert_eq!(receiver.drops().replay, 2);
        // A forged copy does not move the window: the next real one opens.
        let mut forged = sender.seal(b"x").expect("fits");
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert_eq!(receiver.open(&forged), Err(OpenError::Forged { key_id: 1 }));
        forged[last] ^= 1;
        assert!(receiver.open(&forged).is_ok());
    }

    #[test]
    fn size_limits() {
        let mut sealer = Sealer::new(key(1, 7), None, 1);
        assert!(sealer.seal(&[0; MAX_PAYLOAD]).is_some());
        assert!(sealer.seal(&[0; MAX_PAYLOAD + 1]).is_none());
        let full = sealer.seal(&[0; MAX_PAYLOAD]).expect("fits");
        assert_eq!(full.len(), MAX_PACKET);
        assert_eq!(
            sealer.open(&[0; MAX_PACKET + 1]),
            Err(OpenError::TooLarge {
                len: MAX_PACKET + 1
            })
        );
        assert_eq!(
            sealer.open(&[1; OVERHEAD - 1]),
            Err(OpenError::TooShort { len: OVERHEAD - 1 })
        );
        let drops = sealer.drops();
        assert_eq!((drops.too_large, drops.too_short), (1, 1));
    }
}
