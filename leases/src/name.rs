//! Validated names: every string that comes from outside (network, local
//! API, files) becomes one of these types at the edge, so the rest of the
//! code never sees an invalid name.
//!
//! Names are held as `Arc<str>` so that records, deltas and snapshots share
//! one allocation per name instead of copying it on every change.
//! This module must not accept a value it cannot also print back unchanged.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string was refused as a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {value:?} is invalid: {rule}")]
pub struct NameError {
    /// Which kind of name was being parsed ("service name", "node id", …).
    pub kind: &'static str,
    /// The refused input, cut to 80 characters.
    pub value: String,
    /// The rule it broke, phrased as what to do instead.
    pub rule: &'static str,
}

impl NameError {
    fn new(kind: &'static str, value: &str, rule: &'static str) -> Self {
        let value = value.chars().take(80).collect();
        NameError { kind, value, rule }
    }
}

/// Defines a string newtype with a validation function, `Display`, serde
/// (validated on the way in) and cheap clones.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `value` and wraps it.
            pub fn new(value: &str) -> Result<Self, NameError> {
                Self::from_arc(Arc::from(value))
            }

            /// Validates an already shared string without copying it.
            pub fn from_arc(value: Arc<str>) -> Result<Self, NameError> {
                let check: fn(&str) -> Result<(), &'static str> = $check;
                match check(&value) {
                    Ok(()) => Ok($name(value)),
                    Err(rule) => Err(NameError::new($kind, &value, rule)),
                }
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The shared string, for interning.
            pub fn as_arc(&self) -> &Arc<str> {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:?}", &*self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::new(&raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

const DNS_LABEL_RULE: &str =
    "use 1 to 63 lowercase letters, digits or '-', not starting or ending with '-'";

fn check_dns_label(s: &str) -> Result<(), &'static str> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(DNS_LABEL_RULE)
    }
}

name_type!(
    /// One DNS label (RFC 1123, lowercase): namespaces, services, port
    /// names, zones, regions and label keys, so each can appear in a DNS name.
    Label,
    "name",
    check_dns_label
);

name_type!(
    /// A node agent's stable identity, usually its host name (lowercase
    /// letters, digits, '-' and '.', at most 253 characters).
    NodeId,
    "node id",
    |s| {
        let ok = !s.is_empty()
            && s.len() <= 253
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !s.starts_with(['-', '.'])
            && !s.ends_with(['-', '.']);
        if ok {
            Ok(())
        } else {
            Err("use 1 to 253 lowercase letters, digits, '-' or '.', not starting or ending with '-' or '.'")
        }
    }
);

name_type!(
    /// An instance's stable id (a process slot such as
    /// `checkout-7d9f8b6c4-x2k9p`): letters, digits, '.', '_', ':' and '-',
    /// at most 128 characters.
    InstanceId,
    "instance id",
    |s| {
        let ok = !s.is_empty()
            && s.len() <= 128
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if ok {
            Ok(())
        } else {
            Err("use 1 to 128 letters, digits, '.', '_', ':' or '-'")
        }
    }
);

name_type!(
    /// The name of a principal (an agent's node, a controller, an operator):
    /// same rules as a node id.
    PrincipalName,
    "principal name",
    |s| NodeId::new(s).map(|_| ()).map_err(|e| e.rule)
);

name_type!(
    /// A software version such as `v1.42.0` or `2024.11.3+build7`: at most
    /// 64 letters, digits, '.', '_', '+' or '-'; may be empty (unknown).
    Version,
    "version",
    |s| {
        if s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-')) {
            Ok(())
        } else {
            Err("use at most 64 letters, digits, '.', '_', '+' or '-'")
        }
    }
);

name_type!(
    /// A label value (for example `canary` or `blue`): at most 63 letters,
    /// digits, '.', '_' or '-'; may be empty.
    LabelValue,
    "label value",
    |s| {
        if s.len() <= 63 && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            Ok(())
        } else {
            Err("use at most 63 letters, digits, '.', '_' or '-'")
        }
    }
);

name_type!(
    /// Why a record is in its state, in words an operator can act on
    /// ("readiness GET /healthz returned 503 3 times"): printable text,
    /// at most 256 bytes.
    Reason,
    "reason",
    |s| {
        if s.len() <= 256 && s.chars().all(|c| !c.is_control()) {
            Ok(())
        } else {
            Err("use at most 256 bytes of printable text")
        }
    }
);

impl Reason {
    /// A reason written by rollcall itself; the text is a constant of ours.
    pub(crate) fn fixed(text: &'static str) -> Reason {
        Reason(Arc::from(text))
    }
}

/// A service key: `namespace/service/port_name`, each a DNS label (R2).
///
/// Ordered by namespace, then service, then port name, which is also the
/// order of services in a snapshot.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceKey {
    /// The namespace, "default" unless given.
    pub namespace: Label,
    /// The logical service.
    pub service: Label,
    /// The named port of the service, "default" unless given.
    pub port_name: Label,
}

impl ServiceKey {
    /// Builds a key from its three parts, validating each.
    pub fn new(namespace: &str, service: &str, port_name: &str) -> Result<Self, NameError> {
        let part = |kind: &'static str, v: &str| {
            Label::new(v).map_err(|e| NameError::new(kind, v, e.rule))
        };
        Ok(ServiceKey {
            namespace: part("namespace", namespace)?,
            service: part("service name", service)?,
            port_name: part("port name", port_name)?,
        })
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.service, self.port_name)
    }
}

impl fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl std::str::FromStr for ServiceKey {
    type Err = NameError;
    /// Parses `namespace/service/port_name`.
    fn from_str(s: &str) -> Result<Self, NameError> {
        let mut parts = s.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(ns), Some(svc), Some(port), None) => ServiceKey::new(ns, svc, port),
            _ => Err(NameError::new(
                "service key",
                s,
                "write it as namespace/service/port_name",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_follow_rfc1123_lowercase() {
        assert!(Label::new("checkout").is_ok());
        assert!(Label::new("a-1").is_ok());
        assert!(Label::new(&"a".repeat(63)).is_ok());
        for bad in ["", "-a", "a-", "Checkout", "a_b", "a.b", &"a".repeat(64)] {
            assert!(Label::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn service_key_errors_name_the_part() {
        let err = ServiceKey::new("default", "Bad_Name", "http").unwrap_err();
        assert_eq!(err.kind, "service name");
        assert!(err.to_string().contains("Bad_Name"));
        let key: ServiceKey = "shop/checkout/http".parse().unwrap();
        assert_eq!(key.to_string(), "shop/checkout/http");
        assert!("shop/checkout".parse::<ServiceKey>().is_err());
    }

    #[test]
    fn deserializing_validates() {
        let ok: Result<InstanceId, _> = serde_json_like("checkout-7d9f8b6c4-x2k9p");
        assert!(ok.is_ok());
        let bad: Result<InstanceId, _> = serde_json_like("has space");
        assert!(bad.is_err());
    }

    fn serde_json_like<T: serde::de::DeserializeOwned>(s: &str) -> Result<T, postcard::Error> {
        let bytes = postcard::to_allocvec(&s).unwrap();
        postcard::from_bytes(&bytes)
    }

    #[test]
    fn reasons_refuse_control_characters() {
        assert!(Reason::new("readiness failed 3 times").is_ok());
        assert!(Reason::new("line\nbreak").is_err());
        assert!(Reason::new(&"x".repeat(257)).is_err());
    }
}
