//! Why a bridge could not start. Failures while running (a peer down, the
//! arbiter unreachable, a bad frame) are never errors of this kind: the
//! bridge logs them and retries.

use std::path::PathBuf;

use rollcall_leases::tls::TlsError;

/// Why `Bridge::start` or `BridgeTls::load` failed. Messages name the field
/// or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The config holds a value this crate cannot use.
    #[error("bridge config: {0}")]
    Config(String),
    /// This bridge's own TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A peer region's CA file is unusable.
    #[error("CA certificate {} of peer region {region}: {detail}; copy that region's ca.crt (written by `rollcall certs --region {region}`)", path.display())]
    PeerCa {
        /// The peer region.
        region: String,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The operator token file could not be read.
    #[error("cannot read the token {} (bridge.arbiter.token_file: bridge.token, or the operator's admin.token, in the arbiter's data directory): {source}", path.display())]
    Token {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A socket could not be bound.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}
