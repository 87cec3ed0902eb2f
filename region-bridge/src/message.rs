//! What bridges say to each other (R9), and nothing else: policy documents
//! versioned by home region and revision, per-service summaries, and the
//! region's declared ingress addresses. No heartbeat of an instance and no
//! instance record has a place here.
//!
//! The bridge that dials a peer subscribes to the peer's region: it says
//! `Hello` with the version it already holds, and the peer answers with a
//! stream of `Update`s, the first a delta from that version when it can
//! (else the full state), then a delta per change and a bare confirmation
//! per sync interval when nothing changed. This module only defines the
//! vocabulary; `publisher` and `subscriber` decide what it means.

use rollcall_leases::{
    Ingress, Label, PolicyKey, RemotePolicy, Revision, ServiceKey, ServiceSummary, WriterEpoch,
};
use serde::{Deserialize, Serialize};

/// Subscriber → publisher, once, first on the stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The subscriber's region (must be the region of its certificate).
    pub region: Label,
    /// The publisher's version the subscriber already holds (a revision of
    /// the publisher region's catalog); `None` asks for the full state.
    pub have: Option<Revision>,
}

/// Publisher → subscriber: the publisher region's state, whole or as a
/// delta.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    /// The publisher's region: every policy here has it as home region,
    /// every summary is of it.
    pub region: Label,
    /// True: this replaces everything the subscriber holds of the region.
    /// False: a delta on top of exactly `base`.
    pub full: bool,
    /// The version a delta applies to (ignored when `full`).
    pub base: Revision,
    /// The version the subscriber holds once this is applied.
    pub version: Revision,
    /// When the publisher last read its arbiter, ms since the Unix epoch by
    /// its clock.
    pub as_of_ms: u64,
    /// The region's ingress addresses, when they are new to this
    /// subscriber (always on a session's first update).
    pub ingress: Option<Vec<Ingress>>,
    /// Policies set or changed, as the home committed them.
    pub policies: Vec<RemotePolicy>,
    /// Policies the home deleted.
    pub removed_policies: Vec<PolicyKey>,
    /// Service summaries new or changed, sorted by service.
    pub summaries: Vec<ServiceSummary>,
    /// Services the region no longer has.
    pub removed_services: Vec<ServiceKey>,
    /// Every writer epoch the region stores (committed there or adopted
    /// from another region), whole in every update: a handful of
    /// single-writer services. Not in this struct's own encoding, which
    /// bridges of earlier releases read: an update with writer epochs
    /// travels as another frame kind (`codec::encode_update`).
    #[serde(skip)]
    pub writers: Vec<WriterEpoch>,
}

impl Update {
    /// How many policies, summaries and removals it carries (what "only
    /// what changed" counts; the ingress list rides along on a session's
    /// first update and is not counted).
    pub fn items(&self) -> usize {
        self.policies.len()
            + self.removed_policies.len()
            + self.summaries.len()
            + self.removed_services.len()
    }
}
