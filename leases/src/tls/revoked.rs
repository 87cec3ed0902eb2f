//! Revocation (issue 38, item 6): a deny list of certificates the region's
//! CA issued but no one may use any more (a node's key leaked, a machine
//! retired before its certificate expired). It lives beside the CA bundle
//! as `revoked.txt` (`rollcall certs --revoke` writes it) and is read with
//! the TLS material, so a reload (the file watch, SIGHUP) applies it: a
//! handshake presenting a revoked certificate is refused, and sessions
//! already established with one are closed with the reason.
//!
//! One entry per line: an identity URI (`rollcall://r1/agent/node-7`,
//! every certificate of that identity) or `serial:HEX` (one certificate;
//! hex with or without colons, as the status endpoints show it).
//! `#` starts a comment. A line that is neither is an error naming the
//! file and the line, and the material is not loaded (a reload keeps what
//! it had).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;

use super::{read_limited, TlsError};
use crate::identity::{identity_from_cert_der, Identity};

/// The deny list's file name, in the directory of the CA bundle.
pub const REVOKED_FILE: &str = "revoked.txt";

/// The deny list beside the CA bundle `ca`.
pub fn beside(ca: &Path) -> PathBuf {
    ca.with_file_name(REVOKED_FILE)
}

/// The certificates no one may use: by identity, or by serial.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Revoked {
    identities: BTreeSet<String>,
    serials: BTreeSet<String>,
}

impl Revoked {
    /// Nothing revoked.
    pub fn none() -> Revoked {
        Revoked::default()
    }

    /// Reads the deny list at `path`; a missing file revokes nothing.
    pub fn load(path: &Path) -> Result<Revoked, TlsError> {
        if !path.exists() {
            return Ok(Revoked::none());
        }
        let bytes = read_limited(path)?;
        Revoked::parse(&String::from_utf8_lossy(&bytes), path)
    }

    /// Parses a deny list (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Revoked, TlsError> {
        let mut revoked = Revoked::none();
        for (i, line) in text.lines().enumerate() {
            let entry = line.split('#').next().unwrap_or("").trim();
            if entry.is_empty() {
                continue;
            }
            let bad = |reason: String| TlsError::BadRevocation {
                path: path.to_owned(),
                line: i + 1,
                reason,
            };
            if let Some(serial) = entry.strip_prefix("serial:") {
                // With or without colons (`/v1/status` shows 13:2f:…).
                let serial = serial.trim().to_ascii_lowercase().replace(':', "");
                if serial.is_empty() || !serial.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(bad(format!(
                        "{entry:?} is no serial: write serial:HEX (the serial in hex, with or without colons, as the status endpoints or openssl x509 -serial show it)"
                    )));
                }
                revoked
                    .serials
                    .insert(serial.trim_start_matches('0').to_owned());
            } else {
                let identity = Identity::parse_uri(entry).map_err(|e| bad(e.to_string()))?;
                revoked.identities.insert(identity.to_uri());
            }
        }
        Ok(revoked)
    }

    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.identities.is_empty() && self.serials.is_empty()
    }

    /// Why the certificate `leaf` may not be used, if it is revoked.
    pub fn check(&self, leaf: &CertificateDer<'_>) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        if let Ok(identity) = identity_from_cert_der(leaf) {
            if self.identities.contains(&identity.to_uri()) {
                return Err(format!(
                    "the certificate of {identity} is revoked ({REVOKED_FILE} names the identity)"
                ));
            }
        }
        if let Some(status) = super::CertStatus::of(leaf) {
            let serial = status.serial.to_ascii_lowercase().replace(':', "");
            if self.serials.contains(serial.trim_start_matches('0')) {
                return Err(format!(
                    "the certificate with serial {} is revoked ({REVOKED_FILE} names the serial)",
                    status.serial
                ));
            }
        }
        Ok(())
    }
}

/// Adds `entry` (an identity URI or `serial:HEX`) to the deny list of the
/// certificate directory `dir`, checked first; an entry already there is
/// not added twice. Written whole (temporary file, fsync, rename), so a
/// process reloading it never reads half of it.
pub fn append(dir: &Path, entry: &str) -> Result<PathBuf, TlsError> {
    let path = dir.join(REVOKED_FILE);
    let mut text = if path.exists() {
        String::from_utf8_lossy(&read_limited(&path)?).into_owned()
    } else {
        "# Certificates no one may use (rollcall certs --revoke); one identity URI or serial:HEX per line.\n".to_owned()
    };
    Revoked::parse(entry, &path)?;
    if !text.lines().any(|l| l.trim() == entry) {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(entry);
        text.push('\n');
        Revoked::parse(&text, &path)?;
        super::write_file(&path, text.as_bytes(), super::Secrecy::Public)?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deny_list_names_identities_and_serials_and_refuses_anything_else() {
        let path = Path::new("/etc/rollcall/certs/revoked.txt");
        let revoked = Revoked::parse(
            "# leaked\nrollcall://r1/agent/node-7  # node-7's disk\n\nserial:00AB12\n",
            path,
        )
        .unwrap();
        assert!(revoked.identities.contains("rollcall://r1/agent/node-7"));
        assert!(revoked.serials.contains("ab12"));
        for (bad, said) in [
            ("node-7", "line 1"),
            ("rollcall://r1/wizard/x", "line 1"),
            ("serial:xyz", "is no serial"),
        ] {
            let e = Revoked::parse(bad, path).unwrap_err().to_string();
            assert!(e.contains(said) && e.contains("revoked.txt"), "{bad}: {e}");
        }
        assert!(Revoked::load(Path::new("/nonexistent/revoked.txt"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_revoked_identity_or_serial_is_refused_and_others_are_not() {
        use crate::endpoint::Role;
        use crate::name::{Label, PrincipalName};
        let ca = super::super::Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let issue = |name: &str| {
            let identity = Identity::new(
                Label::new("r1").unwrap(),
                Role::Agent,
                PrincipalName::new(name).unwrap(),
            );
            ca.issue(&identity, &[], &[]).unwrap().cert_der
        };
        let (seven, eight) = (issue("node-7"), issue("node-8"));
        let dir = tempfile::tempdir().unwrap();
        append(dir.path(), "rollcall://r1/agent/node-7").unwrap();
        append(dir.path(), "rollcall://r1/agent/node-7").unwrap();
        let revoked = Revoked::load(&beside(&dir.path().join("ca.crt"))).unwrap();
        let e = revoked.check(&seven).unwrap_err();
        assert!(e.contains("rollcall://r1/agent/node-7 is revoked"), "{e}");
        assert!(revoked.check(&eight).is_ok());
        // By serial: only that one certificate.
        let serial = super::super::CertStatus::of(&eight).unwrap().serial;
        append(dir.path(), &format!("serial:{serial}")).unwrap();
        let revoked = Revoked::load(&beside(&dir.path().join("ca.crt"))).unwrap();
        assert!(revoked.check(&eight).unwrap_err().contains("serial"));
        assert!(
            revoked.check(&issue("node-8")).is_ok(),
            "a new certificate of node-8"
        );
        let text = std::fs::read_to_string(dir.path().join(REVOKED_FILE)).unwrap();
        assert_eq!(text.matches("node-7").count(), 1, "added once: {text}");
        // A bad entry is refused and the file is left as it was.
        assert!(append(dir.path(), "node-9").is_err());
        assert_eq!(
            std::fs::read_to_string(dir.path().join(REVOKED_FILE)).unwrap(),
            text
        );
    }
}
