//! Replay protection for sealed gossip (R10): a captured datagram sent
//! again is dropped, not handed to foca a second time.
//!
//! Every sealer numbers its datagrams: the nonce is `[8-byte prefix][4-byte
//! counter]` (see `seal`), and the AEAD authenticates the nonce, so an
//! opened datagram's (prefix, counter) is the sender's own. Each prefix is
//! one sender's run; per prefix the receiver keeps the highest counter seen
//! and a bitmap of the [`WINDOW`] counters below it, as IPsec's and
//! WireGuard's anti-replay windows do: a counter seen before, or older than
//! the window, is a replay. Datagrams reordered by less than the window
//! still pass. No wire change: members that do not check accept the same
//! datagrams as before.
//!
//! At most [`MAX_SENDERS`] prefixes are remembered; past that the one heard
//! from least recently is forgotten. A zone has one prefix per running
//! agent (a new one per restart, and per 2³² datagrams), so eviction only
//! happens when far more prefixes appear than a zone has members — which
//! only a holder of the zone key can cause, since unauthenticated datagrams
//! never reach this table. A holder of the key can already speak as any
//! member (README, "Security model"); what eviction gives up is replays of
//! a forgotten sender's old datagrams, after such a flood.
//!
//! Only datagrams that authenticated are recorded, so a forged datagram
//! cannot move a window.

use std::collections::{BTreeSet, HashMap};

/// Counters below a sender's highest that are still told apart, as
/// datagrams reordered by the network may arrive late.
pub const WINDOW: u32 = 128;

/// Senders (nonce prefixes) remembered at most.
pub const MAX_SENDERS: usize = 16_384;

/// One sender's window.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// The highest counter seen.
    top: u32,
    /// Bit `i` set: counter `top - i` was seen (bit 0 is `top` itself).
    seen: u128,
    /// When it was last heard from, in datagrams opened (for eviction).
    heard: u64,
}

/// The windows of every sender heard from.
#[derive(Debug, Default)]
pub struct ReplayWindows {
    senders: HashMap<[u8; 8], Window>,
    /// `(heard, prefix)` of every sender: the first is evicted first.
    by_age: BTreeSet<(u64, [u8; 8])>,
    opened: u64,
}

impl ReplayWindows {
    /// Records the authentic datagram `(prefix, counter)`; false when it is
    /// a replay (seen before, or older than the sender's window).
    pub fn accept(&mut self, prefix: [u8; 8], counter: u32) -> bool {
        self.opened += 1;
        let heard = self.opened;
        let Some(w) = self.senders.get_mut(&prefix) else {
            if self.senders.len() >= MAX_SENDERS {
                if let Some((_, oldest)) = self.by_age.pop_first() {
                    self.senders.remove(&oldest);
                }
            }
            self.senders.insert(
                prefix,
                Window {
                    top: counter,
                    seen: 1,
                    heard,
                },
            );
            self.by_age.insert((heard, prefix));
            return true;
        };
        let fresh = if counter > w.top {
            let shift = counter - w.top;
            w.seen = if shift >= WINDOW { 0 } else { w.seen << shift };
            w.seen |= 1;
            w.top = counter;
            true
        } else {
            let behind = w.top - counter;
            let bit = 1u128.checked_shl(behind).unwrap_or(0);
            let fresh = behind < WINDOW && w.seen & bit == 0;
            w.seen |= bit;
            fresh
        };
        if fresh {
            self.by_age.remove(&(w.heard, prefix));
            w.heard = heard;
            self.by_age.insert((heard, prefix));
        }
        fresh
    }

    /// Senders remembered now.
    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const A: [u8; 8] = [1; 8];
    const B: [u8; 8] = [2; 8];

    #[test]
    fn a_datagram_is_accepted_once() {
        let mut w = ReplayWindows::default();
        assert!(w.accept(A, 5));
        assert!(!w.accept(A, 5));
        // Another sender's counters are its own.
        assert!(w.accept(B, 5));
    }

    #[test]
    fn late_datagrams_pass_within_the_window_only() {
        let mut w = ReplayWindows::default();
        assert!(w.accept(A, 1_000));
        assert!(w.accept(A, 1_000 - (WINDOW - 1)));
        assert!(!w.accept(A, 1_000 - (WINDOW - 1)));
        assert!(!w.accept(A, 1_000 - WINDOW), "older than the window");
        assert!(w.accept(A, 999));
        // A jump past the window forgets what was below it.
        assert!(w.accept(A, 1_000 + 10 * WINDOW));
        assert!(!w.accept(A, 1_000));
    }

    #[test]
    fn the_sender_heard_from_least_recently_is_forgotten_first() {
        let mut w = ReplayWindows::default();
        for i in 0..MAX_SENDERS as u64 {
            assert!(w.accept(i.to_be_bytes(), 0));
        }
        // Sender 0 speaks again: sender 1 is now the oldest.
        assert!(w.accept(0u64.to_be_bytes(), 1));
        assert!(w.accept(u64::MAX.to_be_bytes(), 0));
        assert_eq!(w.senders(), MAX_SENDERS);
        assert!(!w.accept(0u64.to_be_bytes(), 1), "sender 0 was kept");
        assert!(w.accept(1u64.to_be_bytes(), 0), "sender 1 was forgotten");
    }

    proptest! {
        /// Against a record of every counter ever accepted: nothing is
        /// accepted twice, and a counter not seen before is accepted unless
        /// it is older than the window below the highest.
        #[test]
        fn matches_a_full_record(counters in proptest::collection::vec(0u32..600, 1..400)) {
            let mut w = ReplayWindows::default();
            let mut seen = BTreeSet::new();
            let mut top: Option<u32> = None;
            for c in counters {
                let expected = !seen.contains(&c)
                    && top.is_none_or(|t| c > t || t - c < WINDOW);
                prop_assert_eq!(w.accept(A, c), expected, "counter {}", c);
                if expected {
                    seen.insert(c);
                    top = Some(top.map_or(c, |t| t.max(c)));
                }
            }
        }
    }
}
