//! A copy past its maximum age under `degrade` (README, "Stale copies"):
//! the endpoints of the selection this agent has fresh local evidence of.

use std::sync::Arc;

use rollcall_leases::InstanceId;

use super::{Degraded, ServiceView, Views};
use crate::endpoints::{Candidate, Selection};

impl ServiceView {
    /// The degraded selection: `selection`'s candidates this agent has
    /// fresh local evidence of, or all of them (said so) when none has.
    pub(super) fn degrade(
        &self,
        views: &Views,
        selection: &Arc<Selection>,
        age_ms: u64,
        max_age_ms: u64,
        now_ms: u64,
    ) -> (Arc<Selection>, Degraded) {
        let alive = views.inner.alive.load();
        let window_ms = views.inner.settings.data_plane.base_ejection_ms;
        let fresh: Vec<Candidate> = {
            let memory = self.lock();
            let failed_lately = |id: &InstanceId| {
                memory
                    .recent_failures
                    .iter()
                    .any(|(f, t)| f == id && now_ms.saturating_sub(*t) <= window_ms)
            };
            selection
                .candidates
                .iter()
                .filter(|c| {
                    alive.contains(&c.record.node_id) && !failed_lately(&c.record.instance_id)
                })
                .cloned()
                .collect()
        };
        let old = format!("the copy is {age_ms} ms old, past its maximum age of {max_age_ms} ms");
        if fresh.is_empty() && !selection.candidates.is_empty() {
            let reason = format!("{old}; no endpoint has fresh local evidence (their node this agent's own or alive in its zone's gossip, no failed connect in the last {window_ms} ms), so the whole copy is served as under keep");
            return (
                selection.clone(),
                Degraded {
                    fallback: true,
                    reason,
                },
            );
        }
        let reason = format!("{old}: only endpoints with fresh local evidence (their node this agent's own or alive in its zone's gossip, no failed connect in the last {window_ms} ms)");
        let degraded = Selection {
            mode: selection.mode,
            candidates: fresh,
        };
        (
            Arc::new(degraded),
            Degraded {
                fallback: false,
                reason,
            },
        )
    }
}
