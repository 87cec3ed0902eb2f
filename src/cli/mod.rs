//! The commands of the `rollcall` binary, one module per group: each holds
//! the group's arguments (clap reads their doc comments as the help text)
//! and the functions that run them; `main.rs` lists the commands and
//! dispatches. What the commands call lives in the library crates.

pub(crate) mod audit;
pub(crate) mod bench;
pub(crate) mod budget;
pub(crate) mod certs;
pub(crate) mod chaos;
pub(crate) mod cluster;
pub(crate) mod drain;
pub(crate) mod inspect;
pub(crate) mod instance;
pub(crate) mod policy;
pub(crate) mod run;
pub(crate) mod runtime;

/// Parses a service key, completing `service` or `namespace/service` with
/// the "default" namespace and port name.
pub(crate) fn parse_service(value: &str) -> Result<rollcall_leases::ServiceKey, String> {
    let key = match value.split('/').count() {
        1 => format!("default/{value}/default"),
        2 => format!("{value}/default"),
        _ => value.to_owned(),
    };
    key.parse()
        .map_err(|e: rollcall_leases::NameError| e.to_string())
}

/// Milliseconds since the Unix epoch as RFC 3339 in UTC, to the millisecond
/// (`2026-12-02T04:36:56.277Z`).
pub(crate) fn rfc3339(at_ms: u64) -> String {
    i64::try_from(at_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(
            || format!("{at_ms} ms"),
            |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_times_are_rfc3339_utc_to_the_millisecond() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_000_000_000_007), "2001-09-09T01:46:40.007Z");
        assert_eq!(rfc3339(u64::MAX), format!("{} ms", u64::MAX));
    }

    #[test]
    fn a_service_flag_completes_the_default_namespace_and_port() {
        let key = |s: &str| parse_service(s).unwrap().to_string();
        assert_eq!(key("web"), "default/web/default");
        assert_eq!(key("shop/web"), "shop/web/default");
        assert_eq!(key("shop/web/http"), "shop/web/http");
        assert!(parse_service("Web").is_err());
    }
}
