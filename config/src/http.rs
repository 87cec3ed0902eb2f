//! `[http_limits]` of the agent's local API and the arbiter's admin API:
//! how many connections one listener holds and how long an idle or
//! half-sent one may stay. Anyone on the host can open connections to the
//! local API without a token, so these bound what they can hold. This file
//! only holds and validates numbers.

use serde::{Deserialize, Serialize};

use crate::{rules, ConfigError};

/// `[http_limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpLimits {
    /// Most connections open at once; one more is closed as soon as it is
    /// accepted. Default 1024.
    pub max_connections: usize,
    /// Longest time for a request's headers to arrive, from the connection's
    /// start or the end of its previous answer, in ms: a half-sent request,
    /// or a kept-alive connection with no next request, is closed then.
    /// Default 10000.
    pub header_read_timeout_ms: u64,
    /// A connection on which nothing is read or written for this long, in
    /// ms, is closed (a request body that stops arriving). Default 60000.
    /// Registration sessions (`POST …/session`) write a line every second,
    /// so they stay open.
    pub idle_timeout_ms: u64,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 1024,
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
        }
    }
}

impl HttpLimits {
    /// Checks the rules, naming fields as `{prefix}.max_connections` and so on.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        rules::between(
            &format!("{prefix}.max_connections"),
            self.max_connections,
            1,
            1_000_000,
        )?;
        rules::between(
            &format!("{prefix}.header_read_timeout_ms"),
            self.header_read_timeout_ms,
            100,
            3_600_000,
        )?;
        rules::between(
            &format!("{prefix}.idle_timeout_ms"),
            self.idle_timeout_ms,
            11_000,
            86_400_000,
        )
    }
}
