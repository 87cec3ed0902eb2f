//! The identity a certificate carries (R10): one URI SAN of the form
//! `rollcall://<region>/<role>/<name>`, for example
//! `rollcall://r1/agent/node-17`.
//!
//! This module only names and parses identities. It does not decide what an
//! identity may do (that is policy), and it does not verify signatures or
//! chains: `identity_from_cert_der` must only be called on a certificate the
//! TLS layer has already verified against the region's CA.

use std::fmt;

use crate::endpoint::{Principal, Role};
use crate::name::{Label, NameError, PrincipalName};

/// The URI scheme of rollcall identities.
pub const SCHEME: &str = "rollcall";

/// Every role, in the order used in error messages.
const ROLES: [Role; 5] = [
    Role::Agent,
    Role::Controller,
    Role::Operator,
    Role::Arbiter,
    Role::Bridge,
];

/// Longest piece of outside input quoted back in an error message.
const QUOTE_LIMIT: usize = 300;

/// Who a certificate says its holder is: a principal within one region.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Identity {
    /// The region whose CA issued the certificate.
    pub region: Label,
    /// The role and name of the holder.
    pub principal: Principal,
}

/// Why a URI or a certificate does not name a rollcall identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The URI is not a `rollcall://` URI.
    #[error("identity URI {uri:?} does not start with `rollcall://`; expected rollcall://<region>/<role>/<name>")]
    WrongScheme {
        /// The refused URI, cut to a readable length.
        uri: String,
    },
    /// The URI does not have exactly a region, a role and a name.
    #[error(
        "identity URI {uri:?} is malformed: {problem}; expected rollcall://<region>/<role>/<name>"
    )]
    Malformed {
        /// The refused URI, cut to a readable length.
        uri: String,
        /// What is wrong with its shape.
        problem: &'static str,
    },
    /// The role segment names no known role.
    #[error("identity URI {uri:?} names unknown role {role:?}; use one of agent, controller, operator, arbiter, bridge")]
    UnknownRole {
        /// The refused URI, cut to a readable length.
        uri: String,
        /// The unknown role, cut to a readable length.
        role: String,
    },
    /// The region segment is not a valid region label.
    #[error("identity URI {uri:?} has a bad region: {reason}")]
    BadRegion {
        /// The refused URI, cut to a readable length.
        uri: String,
        /// Why the region was refused.
        reason: NameError,
    },
    /// The name segment is not a valid principal name.
    #[error("identity URI {uri:?} has a bad principal name: {reason}")]
    BadName {
        /// The refused URI, cut to a readable length.
        uri: String,
        /// Why the name was refused.
        reason: NameError,
    },
    /// The bytes are not one DER-encoded X.509 certificate.
    #[error("peer certificate cannot be parsed as X.509: {detail}")]
    NotACertificate {
        /// What the parser reported.
        detail: String,
    },
    /// The certificate has no `rollcall://` URI SAN.
    #[error("certificate carries no rollcall:// URI SAN; issue it with `rollcall certs`")]
    NoIdentity,
    /// The certificate has more than one `rollcall://` URI SAN, so who it
    /// names is ambiguous.
    #[error("certificate carries {count} rollcall:// URI SANs ({uris}); a certificate must name exactly one identity")]
    SeveralIdentities {
        /// How many rollcall URIs were found.
        count: usize,
        /// The URIs, comma-separated and cut to a readable length.
        uris: String,
    },
}

impl Identity {
    /// An identity for `role`/`name` in `region`.
    pub fn new(region: Label, role: Role, name: PrincipalName) -> Identity {
        Identity {
            region,
            principal: Principal { role, name },
        }
    }

    /// The URI SAN that carries this identity in a certificate.
    pub fn to_uri(&self) -> String {
        format!(
            "{SCHEME}://{}/{}/{}",
            self.region,
            self.principal.role.as_str(),
            self.principal.name
        )
    }

    /// Parses `rollcall://<region>/<role>/<name>`. The scheme and role are
    /// matched exactly (lowercase), as `to_uri` writes them; region and name
    /// follow the rules of `Label` and `PrincipalName`.
    pub fn parse_uri(uri: &str) -> Result<Identity, IdentityError> {
        let quoted = || clip(uri);
        let rest = uri
            .strip_prefix(SCHEME)
            .and_then(|rest| rest.strip_prefix("://"))
            .ok_or_else(|| IdentityError::WrongScheme { uri: quoted() })?;
        let mut segments = rest.split('/');
        let (Some(region), Some(role), Some(name), None) = (
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
        ) else {
            return Err(IdentityError::Malformed {
                uri: quoted(),
                problem: "it must have exactly three path segments",
            });
        };
        let region = Label::new(region).map_err(|reason| IdentityError::BadRegion {
            uri: quoted(),
            reason,
        })?;
        let role = ROLES
            .into_iter()
            .find(|known| known.as_str() == role)
            .ok_or_else(|| IdentityError::UnknownRole {
                uri: quoted(),
                role: clip(role),
            })?;
        let name = PrincipalName::new(name).map_err(|reason| IdentityError::BadName {
            uri: quoted(),
            reason,
        })?;
        Ok(Identity::new(region, role, name))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_uri())
    }
}

impl std::str::FromStr for Identity {
    type Err = IdentityError;
    fn from_str(s: &str) -> Result<Self, IdentityError> {
        Identity::parse_uri(s)
    }
}

/// The identity named by a DER-encoded X.509 certificate: its one URI SAN
/// with the `rollcall` scheme. URI SANs of other schemes are ignored; none or
/// several rollcall URIs is an error, as is anything after the certificate.
///
/// This does not check the signature or validity period: call it only on a
/// certificate the TLS handshake has verified.
pub fn identity_from_cert_der(der: &[u8]) -> Result<Identity, IdentityError> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der).map_err(|error| {
        IdentityError::NotACertificate {
            detail: error.to_string(),
        }
    })?;
    if !rest.is_empty() {
        return Err(IdentityError::NotACertificate {
            detail: format!("{} bytes follow the certificate", rest.len()),
        });
    }
    let sans = cert
        .subject_alternative_name()
        .map_err(|error| IdentityError::NotACertificate {
            detail: format!("subject alternative names: {error}"),
        })?;
    let ours: Vec<&str> = sans
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|general| match general {
            x509_parser::extensions::GeneralName::URI(uri) if has_our_scheme(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    match ours.as_slice() {
        [] => Err(IdentityError::NoIdentity),
        [uri] => Identity::parse_uri(uri),
        several => Err(IdentityError::SeveralIdentities {
            count: several.len(),
            uris: clip(&several.join(", ")),
        }),
    }
}

/// The IP SANs of a certificate: the addresses its holder's node declared
/// when the certificate was issued (`rollcall certs --ip`). Like
/// [`identity_from_cert_der`], only for a certificate the TLS layer has
/// already verified; an unparsable one has none.
pub fn ip_sans_from_cert_der(der: &[u8]) -> Vec<std::net::IpAddr> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(sans)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    let mut addresses: Vec<std::net::IpAddr> = sans
        .value
        .general_names
        .iter()
        .filter_map(|general| match general {
            x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(std::net::IpAddr::from),
                16 => <[u8; 16]>::try_from(*bytes)
                    .ok()
                    .map(std::net::IpAddr::from),
                _ => None,
            },
            _ => None,
        })
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

/// The DNS SANs of a certificate (the names a server certificate answers
/// to), in order; an unparsable certificate has none. For reissuing a
/// certificate as it was (`rollcall certs --renew`).
pub fn dns_sans_from_cert_der(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(sans)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    sans.value
        .general_names
        .iter()
        .filter_map(|general| match general {
            x509_parser::extensions::GeneralName::DNSName(name) => Some((*name).to_owned()),
            _ => None,
        })
        .collect()
}

/// Whether a URI's scheme is `rollcall` in any case, so a miscased rollcall
/// URI is reported rather than silently ignored.
fn has_our_scheme(uri: &str) -> bool {
    uri.split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case(SCHEME))
}

/// Outside input cut to a length fit for an error message.
fn clip(text: &str) -> String {
    text.chars().take(QUOTE_LIMIT).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(region: &str, role: Role, name: &str) -> Identity {
        Identity::new(
            Label::new(region).expect("valid region"),
            role,
            PrincipalName::new(name).expect("valid name"),
        )
    }

    fn cert_with_uris(uris: &[&str]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|uri| rcgen::SanType::URI((*uri).try_into().expect("ascii uri")))
            .collect();
        let key = rcgen::KeyPair::generate().expect("key");
        params
            .self_signed(&key)
            .expect("self-signed certificate")
            .der()
            .to_vec()
    }

    #[test]
    fn every_role_round_trips_through_its_uri() {
        for role in ROLES {
            let id = identity("r1", role, "node-17.example");
            let uri = id.to_uri();
            assert_eq!(
                uri,
                format!("rollcall://r1/{}/node-17.example", role.as_str())
            );
            assert_eq!(Identity::parse_uri(&uri), Ok(id.clone()));
            assert_eq!(id.to_string(), uri);
            assert_eq!(uri.parse::<Identity>(), Ok(id));
        }
    }

    #[test]
    fn wrong_scheme_is_named() {
        for uri in [
            "spiffe://r1/agent/n",
            "rollcall:/r1/agent/n",
            "r1/agent/n",
            "",
        ] {
            let error = Identity::parse_uri(uri).expect_err(uri);
            assert!(
                matches!(error, IdentityError::WrongScheme { .. }),
                "{uri}: {error}"
            );
            assert!(error.to_string().contains("rollcall://"), "{error}");
        }
    }

    #[test]
    fn wrong_shape_is_malformed() {
        for uri in [
            "rollcall://r1/agent",
            "rollcall://r1/agent/n/extra",
            "rollcall://r1/agent/n/",
            "rollcall://",
        ] {
            let error = Identity::parse_uri(uri).expect_err(uri);
            assert!(
                matches!(error, IdentityError::Malformed { .. }),
                "{uri}: {error}"
            );
        }
    }

    #[test]
    fn unknown_role_is_named() {
        let error = Identity::parse_uri("rollcall://r1/admin/n").expect_err("admin is no role");
        assert_eq!(
            error,
            IdentityError::UnknownRole {
                uri: "rollcall://r1/admin/n".into(),
                role: "admin".into()
            }
        );
        assert!(error.to_string().contains("\"admin\""), "{error}");
        assert!(Identity::parse_uri("rollcall://r1/Agent/n").is_err());
    }

    #[test]
    fn bad_region_and_bad_name_say_which() {
        let error = Identity::parse_uri("rollcall://R_1/agent/n").expect_err("bad region");
        assert!(matches!(error, IdentityError::BadRegion { .. }), "{error}");
        assert!(error.to_string().contains("region"), "{error}");

        let error = Identity::parse_uri("rollcall://r1/agent/Bad Name").expect_err("bad name");
        assert!(matches!(error, IdentityError::BadName { .. }), "{error}");
        assert!(error.to_string().contains("principal name"), "{error}");

        let error = Identity::parse_uri("rollcall://r1/agent/").expect_err("empty name");
        assert!(matches!(error, IdentityError::BadName { .. }), "{error}");
    }

    #[test]
    fn long_input_is_clipped_in_errors() {
        let uri = format!("spiffe://{}", "x".repeat(10_000));
        let error = Identity::parse_uri(&uri).expect_err("wrong scheme");
        assert!(
            error.to_string().len() < 1_000,
            "{}",
            error.to_string().len()
        );
    }

    #[test]
    fn certificate_with_one_rollcall_uri_names_it() {
        let der = cert_with_uris(&["spiffe://other/thing", "rollcall://r1/arbiter/arb-2"]);
        assert_eq!(
            identity_from_cert_der(&der),
            Ok(identity("r1", Role::Arbiter, "arb-2"))
        );
    }

    #[test]
    fn certificate_without_rollcall_uri_is_refused() {
        let der = cert_with_uris(&["spiffe://other/thing"]);
        assert_eq!(identity_from_cert_der(&der), Err(IdentityError::NoIdentity));
        let der = cert_with_uris(&[]);
        assert_eq!(identity_from_cert_der(&der), Err(IdentityError::NoIdentity));
    }

    #[test]
    fn certificate_with_two_rollcall_uris_is_ambiguous() {
        let der = cert_with_uris(&["rollcall://r1/agent/a", "ROLLCALL://r1/agent/b"]);
        let error = identity_from_cert_der(&der).expect_err("ambiguous");
        assert!(
            matches!(error, IdentityError::SeveralIdentities { count: 2, .. }),
            "{error}"
        );
    }

    #[test]
    fn certificate_with_malformed_rollcall_uri_reports_why() {
        let der = cert_with_uris(&["rollcall://r1/wizard/a"]);
        let error = identity_from_cert_der(&der).expect_err("unknown role");
        assert!(
            matches!(error, IdentityError::UnknownRole { .. }),
            "{error}"
        );
    }

    #[test]
    fn garbage_and_trailing_bytes_are_not_certificates() {
        let error = identity_from_cert_der(b"not a certificate").expect_err("garbage");
        assert!(
            matches!(error, IdentityError::NotACertificate { .. }),
            "{error}"
        );

        let mut der = cert_with_uris(&["rollcall://r1/agent/a"]);
        der.push(0);
        let error = identity_from_cert_der(&der).expect_err("trailing byte");
        assert!(
            matches!(error, IdentityError::NotACertificate { .. }),
            "{error}"
        );
    }
}
