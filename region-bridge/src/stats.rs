//! Counters of what a bridge sent and received, for tests and (later) its
//! metrics. Only counts; nothing reads them to decide anything.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::message::Update;

/// The live counters, shared by a bridge's tasks.
#[derive(Debug, Default)]
pub struct Stats {
    sessions_served: AtomicU64,
    sessions_active: AtomicU64,
    full_sent: AtomicU64,
    deltas_sent: AtomicU64,
    items_sent: AtomicU64,
    bytes_sent: AtomicU64,
    full_received: AtomicU64,
    deltas_received: AtomicU64,
    items_received: AtomicU64,
    refused_peers: AtomicU64,
    protocol_errors: AtomicU64,
}

/// The counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Peers that said `Hello` to this bridge.
    pub sessions_served: u64,
    /// Of those, the ones still connected.
    pub sessions_active: u64,
    /// Full states sent to peers.
    pub full_sent: u64,
    /// Deltas (including bare confirmations) sent to peers.
    pub deltas_sent: u64,
    /// Policies, summaries and removals sent (`Update::items`).
    pub items_sent: u64,
    /// Encoded bytes of the updates sent.
    pub bytes_sent: u64,
    /// Full states received from peers.
    pub full_received: u64,
    /// Deltas received from peers.
    pub deltas_received: u64,
    /// Policies, summaries and removals received.
    pub items_received: u64,
    /// Connections refused for their certificate.
    pub refused_peers: u64,
    /// Connections closed for a malformed, oversized or invalid message.
    pub protocol_errors: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    /// A peer said `Hello`.
    pub fn session(&self) {
        add(&self.sessions_served, 1);
        add(&self.sessions_active, 1);
    }

    /// A peer that said `Hello` left.
    pub fn session_ended(&self) {
        self.sessions_active.fetch_sub(1, Ordering::Relaxed);
    }

    /// `update` went out, `bytes` long.
    pub fn sent(&self, update: &Update, bytes: usize) {
        add(
            if update.full {
                &self.full_sent
            } else {
                &self.deltas_sent
            },
            1,
        );
        add(&self.items_sent, update.items() as u64);
        add(&self.bytes_sent, bytes as u64);
    }

    /// An update was accepted.
    pub fn received(&self, full: bool, items: usize) {
        add(
            if full {
                &self.full_received
            } else {
                &self.deltas_received
            },
            1,
        );
        add(&self.items_received, items as u64);
    }

    /// A connection was refused for its certificate.
    pub fn refused(&self) {
        add(&self.refused_peers, 1);
    }

    /// A connection was closed for a bad message.
    pub fn protocol_error(&self) {
        add(&self.protocol_errors, 1);
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            sessions_served: get(&self.sessions_served),
            sessions_active: get(&self.sessions_active),
            full_sent: get(&self.full_sent),
            deltas_sent: get(&self.deltas_sent),
            items_sent: get(&self.items_sent),
            bytes_sent: get(&self.bytes_sent),
            full_received: get(&self.full_received),
            deltas_received: get(&self.deltas_received),
            items_received: get(&self.items_received),
            refused_peers: get(&self.refused_peers),
            protocol_errors: get(&self.protocol_errors),
        }
    }
}
