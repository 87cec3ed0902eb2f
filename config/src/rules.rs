//! Validation rules shared by several config files (names, addresses,
//! lower bounds), each returning an error that names the field. Rules only
//! look at values; they must not resolve host names or open sockets.

use std::fmt::Display;
use std::path::Path;

use crate::ConfigError;

/// Longest DNS label (RFC 1035); names end up in DNS answers and in mTLS
/// URI SANs, so they follow DNS label rules.
const MAX_LABEL_LEN: usize = 63;

/// `value` must be a DNS-safe label: 1–63 of `a-z`, `0-9`, `-`, not starting
/// or ending with `-`.
pub(crate) fn dns_label(field: &str, value: &str) -> Result<(), ConfigError> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if value.is_empty()
        || value.len() > MAX_LABEL_LEN
        || !value.chars().all(allowed)
        || value.starts_with('-')
        || value.ends_with('-')
    {
        return Err(ConfigError::invalid(
            field,
            format!("{value:?}"),
            "must be a DNS-safe label: 1 to 63 of a-z, 0-9 and '-', not starting or ending with '-'",
        ));
    }
    Ok(())
}

/// `value` must be `host:port` with a non-empty host and a port in 1..=65535
/// (IPv6 literals in brackets, e.g. `[::1]:7443`). Host names are not
/// resolved here: that happens when the process connects.
pub(crate) fn host_port(field: &str, value: &str) -> Result<(), ConfigError> {
    let valid = value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid {
        return Err(ConfigError::invalid(
            field,
            format!("{value:?}"),
            "must be host:port with a port from 1 to 65535",
        ));
    }
    Ok(())
}

/// Every entry of `values` must be `host:port`; errors name `field[index]`.
pub(crate) fn host_ports(field: &str, values: &[String]) -> Result<(), ConfigError> {
    values
        .iter()
        .enumerate()
        .try_for_each(|(i, value)| host_port(&format!("{field}[{i}]"), value))
}

/// A directory setting must not be empty (an empty path would mean the
/// process's working directory, which is never what an operator wants).
pub(crate) fn non_empty_path(field: &str, value: &Path) -> Result<(), ConfigError> {
    if value.as_os_str().is_empty() {
        return Err(ConfigError::invalid(field, "\"\"", "must name a directory"));
    }
    Ok(())
}

/// `value` must be at least `min`.
pub(crate) fn at_least<T: PartialOrd + Display>(
    field: &str,
    value: T,
    min: T,
) -> Result<(), ConfigError> {
    if value < min {
        return Err(ConfigError::invalid(
            field,
            &value,
            format!("must be at least {min}"),
        ));
    }
    Ok(())
}

/// `value` must be between `min` and `max`, both included.
pub(crate) fn between<T: PartialOrd + Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::invalid(
            field,
            &value,
            format!("must be between {min} and {max}"),
        ));
    }
    Ok(())
}

/// A file setting must not be empty.
pub(crate) fn non_empty_file(field: &str, value: &Path) -> Result<(), ConfigError> {
    if value.as_os_str().is_empty() {
        return Err(ConfigError::invalid(field, "\"\"", "must name a file"));
    }
    Ok(())
}

/// A node or principal name: 1 to 253 of `a-z`, `0-9`, `-` and `.`, not
/// starting or ending with `-` or `.` (host names are allowed).
pub(crate) fn node_name(field: &str, value: &str) -> Result<(), ConfigError> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if value.is_empty()
        || value.len() > 253
        || !value.chars().all(allowed)
        || value.starts_with(['-', '.'])
        || value.ends_with(['-', '.'])
    {
        return Err(ConfigError::invalid(
            field,
            format!("{value:?}"),
            "must be 1 to 253 of a-z, 0-9, '-' and '.', not starting or ending with '-' or '.'",
        ));
    }
    Ok(())
}

/// A service key `namespace/service/port_name`, each part a DNS label.
pub(crate) fn service_key(field: &str, value: &str) -> Result<(), ConfigError> {
    let parts: Vec<&str> = value.split('/').collect();
    if parts.len() != 3 || parts.iter().any(|p| dns_label(field, p).is_err()) {
        return Err(ConfigError::invalid(
            field,
            format!("{value:?}"),
            "must be namespace/service/port_name, each a DNS-safe label (e.g. default/web/http)",
        ));
    }
    Ok(())
}
