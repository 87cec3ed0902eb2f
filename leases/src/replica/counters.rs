//! What a replica counts for the driver to publish as metrics.

use std::collections::BTreeMap;

/// Counts the driver publishes as metrics (totals since start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Sessions' renewals heard.
    pub renewals: u64,
    /// Commands committed by this leader.
    pub commits: u64,
    /// Registrations committed by this leader.
    pub registrations: u64,
    /// Requests and commands refused.
    pub rejections: u64,
    /// Refusals by kind (`RejectKind::as_str`).
    pub refusals: BTreeMap<&'static str, u64>,
    /// Down reports settled as a partition.
    pub down_reports_ignored: u64,
    /// Single reporters' down reports an asked witness saw alive (vetoed).
    pub down_reports_uncorroborated: u64,
    /// Witness answers from sessions that were not asked.
    pub witness_answers_unasked: u64,
    /// Probes sent down this replica's sessions (R4).
    pub probes_sent: u64,
    /// Probes answered on this replica's sessions.
    pub probes_answered: u64,
    /// Regions messages sent.
    pub regions_sent: u64,
    /// Sessions replaced by another of the same node
    /// (`Limit::SessionsPerNode`).
    pub sessions_replaced: u64,
    /// Subscriptions denied by `limits.subscriptions_per_session`.
    pub subscriptions_refused: u64,
    /// `AwaitPropagation` requests refused by
    /// `limits.propagation_waits_per_identity`.
    pub propagation_waits_refused: u64,
    /// Snapshots told to retry by `limits.snapshots_per_session` (the
    /// distributor's count, as of the last wake-up).
    pub snapshots_limited: u64,
}

impl Counters {
    pub(super) fn refused(&mut self, kind: &'static str) {
        self.rejections += 1;
        *self.refusals.entry(kind).or_default() += 1;
    }
}
