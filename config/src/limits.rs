//! `[limits]` of the arbiter file (issue 20, R10): what one identity, one
//! connection or one source address may take of an arbiter replica, so a
//! broken or hostile agent cannot crowd out the others. Each limit, when
//! hit, is counted in `rollcall_arbiter_limit_hits_total{limit}`. This file
//! only holds and validates numbers; `rollcall_leases::limits` applies
//! them.

use serde::{Deserialize, Serialize};

use crate::{rules, ConfigError};

/// `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// QUIC handshakes one source address may start per second, sustained;
    /// one more is refused before any TLS work (the client retries with
    /// its backoff). Default 100: far above what one host's agent needs
    /// (it reconnects with backoff), well below what makes handshakes a
    /// cost. A fleet behind one NAT address reconnects at this rate.
    pub handshakes_per_second: u32,
    /// Handshakes one source address may start at once above that rate.
    /// Default 500.
    pub handshake_burst: u32,
    /// Connections one certificate identity (agent, controller, bridge,
    /// operator) may hold at once on a replica; one more is closed at once
    /// with the reason. Peer replicas are not counted. Default 8: an agent
    /// uses one, and a reconnect while the old connection is half dead a
    /// second.
    pub connections_per_identity: u32,
    /// Requests (each on a stream of its own) one connection may send per
    /// second, sustained; one more is answered "unavailable, retry" with
    /// the reason, and the agent keeps the write pending and retries.
    /// Default 100: an agent writes a few per second at most; a controller
    /// registering 10,000 endpoints in 2 minutes needs about 85 (and may
    /// open several connections).
    pub requests_per_second: u32,
    /// Requests one connection may send at once above that rate: a node's
    /// whole deploy at once. Default 500.
    pub request_burst: u32,
    /// Messages one session stream may carry per second, sustained
    /// (subscriptions, acknowledgements, renewals, keep-alives); beyond
    /// it the arbiter stops reading the stream until the rate allows
    /// (QUIC flow control then holds the sender back). Default 1000.
    pub session_messages_per_second: u32,
    /// Session messages at once above that rate: an agent that follows
    /// thousands of services subscribes to all of them when it connects.
    /// Default 5000.
    pub session_message_burst: u32,
    /// Calls of the admin HTTP API (`/v1/…`) per second per token (the
    /// operator token, `admin.token`, which the region bridge uses too);
    /// one more is answered 429 with `Retry-After`. `/metrics` is not
    /// counted. Default 100.
    pub admin_calls_per_second: u32,
    /// Admin calls at once above that rate. Default 500.
    pub admin_call_burst: u32,
    /// Services one session may follow at once; a subscription beyond it
    /// is denied (`ServiceUpdate::Denied`, naming this limit) and nothing
    /// is stored for it. Unknown services count as well (each is held to
    /// tell the agent when it appears). Default 4096: twice the problem
    /// statement's 2,000 services of a region.
    pub subscriptions_per_session: u32,
    /// Full snapshots one session may have in flight at once; a snapshot
    /// beyond it is answered "retry after `snapshot_retry_ms`", as one
    /// beyond `distribution.max_concurrent_snapshots` is, so one agent
    /// that lost its cache cannot take every slot. Default 8.
    pub snapshots_per_session: u32,
    /// `AwaitPropagation` requests one identity may hold open at once on a
    /// replica; one more is answered "unavailable" naming this limit (a
    /// drain with `wait=propagated` then answers without the sums).
    /// Default 64.
    pub propagation_waits_per_identity: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            handshakes_per_second: 100,
            handshake_burst: 500,
            connections_per_identity: 8,
            requests_per_second: 100,
            request_burst: 500,
            session_messages_per_second: 1_000,
            session_message_burst: 5_000,
            admin_calls_per_second: 100,
            admin_call_burst: 500,
            subscriptions_per_session: 4_096,
            snapshots_per_session: 8,
            propagation_waits_per_identity: 64,
        }
    }
}

/// The largest rate or burst accepted: a million per second is no limit
/// on any machine, so larger values are typos.
const MAX_RATE: u32 = 1_000_000;

impl LimitsConfig {
    /// Checks the rules, naming fields as `{prefix}.handshakes_per_second`
    /// and so on.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        for (name, value) in [
            ("handshakes_per_second", self.handshakes_per_second),
            ("handshake_burst", self.handshake_burst),
            ("requests_per_second", self.requests_per_second),
            ("request_burst", self.request_burst),
            (
                "session_messages_per_second",
                self.session_messages_per_second,
            ),
            ("session_message_burst", self.session_message_burst),
            ("admin_calls_per_second", self.admin_calls_per_second),
            ("admin_call_burst", self.admin_call_burst),
        ] {
            rules::between(&format!("{prefix}.{name}"), value, 1, MAX_RATE)?;
        }
        rules::between(
            &format!("{prefix}.subscriptions_per_session"),
            self.subscriptions_per_session,
            1,
            1_000_000,
        )?;
        rules::between(
            &format!("{prefix}.snapshots_per_session"),
            self.snapshots_per_session,
            1,
            1_024,
        )?;
        rules::between(
            &format!("{prefix}.propagation_waits_per_identity"),
            self.propagation_waits_per_identity,
            1,
            100_000,
        )?;
        rules::between(
            &format!("{prefix}.connections_per_identity"),
            self.connections_per_identity,
            1,
            1_024,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_huge_values_are_refused_naming_the_field() {
        assert!(LimitsConfig::default().validate("arbiter.limits").is_ok());
        let zero = LimitsConfig {
            request_burst: 0,
            ..LimitsConfig::default()
        };
        let error = zero.validate("arbiter.limits").unwrap_err().to_string();
        assert!(error.contains("arbiter.limits.request_burst"), "{error}");
        let huge = LimitsConfig {
            connections_per_identity: 5_000,
            ..LimitsConfig::default()
        };
        let error = huge.validate("arbiter.limits").unwrap_err().to_string();
        assert!(
            error.contains("arbiter.limits.connections_per_identity"),
            "{error}"
        );
    }
}
