//! The open proxied connections per instance, which the selector balances
//! on.

use std::sync::Arc;

use dashmap::DashMap;
use rollcall_leases::InstanceId;

/// How many proxied connections are open to each instance, across every
/// proxy and the ingress gateway. The selector balances on it. A connect
/// in progress already counts, so a burst of new connections spreads
/// instead of piling onto one endpoint. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ActiveConnections {
    counts: Arc<DashMap<InstanceId, usize>>,
}

impl ActiveConnections {
    /// Connections open (or connecting) to `id` through the proxy.
    pub fn count(&self, id: &InstanceId) -> usize {
        self.counts.get(id).map_or(0, |c| *c)
    }

    /// Counts one more connection to `id` until the guard is dropped.
    pub(crate) fn open(&self, id: &InstanceId) -> ActiveGuard {
        *self.counts.entry(id.clone()).or_default() += 1;
        ActiveGuard {
            counts: self.counts.clone(),
            id: id.clone(),
        }
    }
}

/// One counted connection; dropping it (the connection ended, failed, or
/// its task ended) takes it off the count.
pub(crate) struct ActiveGuard {
    counts: Arc<DashMap<InstanceId, usize>>,
    id: InstanceId,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.counts.remove_if_mut(&self.id, |_, count| {
            *count = count.saturating_sub(1);
            *count == 0
        });
    }
}
