//! The wall clock, read only at the edges: drivers stamp "now" into the
//! inputs of the state machines, which never read it themselves. The one
//! copy for the whole workspace.

use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock in ms since the Unix epoch (0 if the clock is set before
/// 1970): the time stamped on commands, leases and views.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
