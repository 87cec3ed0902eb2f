//! The one error type of this crate: why a config file could not be read,
//! parsed or accepted. It only describes problems; it must not print, log or
//! decide exit codes (the binary does that).

use std::fmt::Display;
use std::path::PathBuf;

/// Why a configuration was rejected. Every variant names where the problem
/// is (a file, or a dotted field path such as `agent.checks.readiness.timeout_ms`)
/// so an operator can fix it without reading code.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read; the OS error is the `source`.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file that was asked for.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The text is not valid TOML, has a value of the wrong type, or has a
    /// key this version does not know (every table denies unknown keys, so a
    /// typo never silently falls back to a default).
    #[error("{origin}: {message}")]
    Parse {
        /// The file path, or `<string>` when parsed from memory.
        origin: String,
        /// The TOML parser's message, with line, column and the offending text.
        message: String,
    },
    /// The file parsed but a value breaks a rule.
    #[error("{field} = {value} {reason}")]
    Invalid {
        /// Full dotted path of the field, e.g. `arbiter.distribution.coalesce_window_ms`.
        field: String,
        /// The rejected value as the operator wrote it (strings quoted).
        value: String,
        /// The rule it breaks and, where useful, why the rule exists.
        reason: String,
    },
}

impl ConfigError {
    /// Builds an [`ConfigError::Invalid`] for `field = value`.
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl Display,
        reason: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
