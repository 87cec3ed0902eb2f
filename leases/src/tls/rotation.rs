//! Renewing certificates and rotating a region's CA in a certificate
//! directory (`rollcall certs --renew`, `--rotate-ca`, `--retire-old-ca`;
//! issue 20). The directory keeps the format `write_certs` writes:
//! `ca.crt` and `ca.key`, one `<role>-<name>.crt/.key` pair per identity.
//! During a rotation `ca.crt` is a bundle, the new CA first, and `ca.key`
//! is the new CA's key; a process given that bundle trusts peers of both.
//!
//! A rotation, step by step (every process reloads its files by itself):
//! 1. `--rotate-ca`: a new CA; `ca.crt` holds both, `ca.key` the new key
//!    (the old one is kept as `ca.key.previous`). Copy `ca.crt` to every
//!    host: everyone trusts both CAs.
//! 2. `--renew`: every certificate reissued from the new CA. Copy each to
//!    its host: new handshakes present it; peers trust it (step 1).
//! 3. `--retire-old-ca`: `ca.crt` holds the new CA only (refused while a
//!    certificate in the directory is not the new CA's); `ca.key.previous`
//!    is deleted. Copy `ca.crt` to every host.
//!
//! Every step checks everything before it writes, so a refused step
//! changes nothing; files are replaced whole (written beside, then renamed).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;

use super::{
    install_crypto_provider, pem_certificate_blocks, read_certs, read_text, roots, write_bundle,
    write_file, Ca, IssuedCert, Secrecy, TlsError, CA_CERT_FILE, CA_KEY_FILE,
};
use crate::identity::{dns_sans_from_cert_der, identity_from_cert_der, ip_sans_from_cert_der};
use crate::name::Label;

/// Where the CA key a rotation replaced is kept until the rotation ends.
pub const PREVIOUS_CA_KEY_FILE: &str = "ca.key.previous";

/// What a rotation step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationStep {
    /// Every file written, in order.
    pub written: Vec<PathBuf>,
    /// Every file deleted.
    pub deleted: Vec<PathBuf>,
    /// How many CA certificates `ca.crt` holds afterwards.
    pub cas: usize,
}

/// The directory's CA (the one `ca.key` belongs to), checked to be of
/// `region`.
fn current_ca(dir: &Path, region: &Label) -> Result<Ca, TlsError> {
    for file in [CA_CERT_FILE, CA_KEY_FILE] {
        if !dir.join(file).exists() {
            return Err(TlsError::NoCa {
                dir: dir.to_owned(),
            });
        }
    }
    let ca = Ca::read(dir)?;
    if ca.region() != region {
        return Err(TlsError::CaOfOtherRegion {
            dir: dir.to_owned(),
            wanted: region.clone(),
            found: ca.region().clone(),
        });
    }
    Ok(ca)
}

/// The PEM blocks of `dir/ca.crt`, in order.
fn bundle_blocks(dir: &Path) -> Result<Vec<String>, TlsError> {
    let text = read_text(&dir.join(CA_CERT_FILE))?;
    Ok(pem_certificate_blocks(&text)
        .into_iter()
        .map(|block| format!("{block}\n"))
        .collect())
}

/// One leaf certificate of the directory.
struct Leaf {
    /// Its file stem (`agent-node-17`).
    stem: String,
    path: PathBuf,
    der: CertificateDer<'static>,
}

/// Every leaf certificate file in `dir` (`*.crt` but `ca.crt`; files that
/// hold a CA certificate, such as a peer region's CA, are not leaves), in
/// name order. Each must name an identity of `region`.
fn leaves(dir: &Path, region: &Label) -> Result<Vec<Leaf>, TlsError> {
    let entries = fs::read_dir(dir).map_err(|reason| TlsError::Io {
        action: "list",
        path: dir.to_owned(),
        reason,
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "crt")
                && path.file_name().is_some_and(|name| name != CA_CERT_FILE)
        })
        .collect();
    paths.sort();
    let mut found = Vec::new();
    for path in paths {
        let der = read_certs(&path, "certificate")?.remove(0);
        let is_ca = x509_parser::parse_x509_certificate(&der).is_ok_and(|(_, c)| c.is_ca());
        if is_ca {
            continue;
        }
        let identity = identity_from_cert_der(&der)?;
        if &identity.region != region {
            return Err(TlsError::LeafOfOtherRegion {
                path,
                identity: Box::new(identity),
                region: region.clone(),
            });
        }
        let stem = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_default();
        found.push(Leaf { stem, path, der });
    }
    Ok(found)
}

/// Reissues every leaf certificate in `dir` from the directory's CA, each
/// with a fresh key and its identity, DNS and IP SANs as they were. The CA
/// is never replaced. Nothing is written unless every certificate could
/// be reissued.
pub fn renew_certs(dir: &Path, region: &Label) -> Result<RotationStep, TlsError> {
    let ca = current_ca(dir, region)?;
    let issued: Vec<(String, IssuedCert)> = leaves(dir, region)?
        .into_iter()
        .map(|leaf| {
            let identity = identity_from_cert_der(&leaf.der)?;
            let issued = ca.issue(
                &identity,
                &dns_sans_from_cert_der(&leaf.der),
                &ip_sans_from_cert_der(&leaf.der),
            )?;
            Ok((leaf.stem, issued))
        })
        .collect::<Result<_, TlsError>>()?;
    let mut written = Vec::new();
    for (stem, cert) in &issued {
        written.extend(write_bundle(dir, stem, cert)?);
    }
    Ok(RotationStep {
        written,
        deleted: Vec::new(),
        cas: bundle_blocks(dir)?.len(),
    })
}

/// Starts a CA rotation: a new CA for `region`, whose key becomes
/// `ca.key` (the old key is kept as `ca.key.previous`) and whose
/// certificate goes first in `ca.crt`, ahead of the old one. Refused while
/// `ca.crt` already holds several CAs (finish that rotation first).
pub fn rotate_ca(dir: &Path, region: &Label) -> Result<RotationStep, TlsError> {
    let old = current_ca(dir, region)?;
    let blocks = bundle_blocks(dir)?;
    if blocks.len() > 1 {
        return Err(TlsError::RotationUnderWay {
            path: dir.join(CA_CERT_FILE),
            count: blocks.len(),
        });
    }
    let new = Ca::generate(region)?;
    let (old_cert, old_key) = old.to_pem();
    let (new_cert, new_key) = new.to_pem();
    let previous = dir.join(PREVIOUS_CA_KEY_FILE);
    let key = dir.join(CA_KEY_FILE);
    let bundle = dir.join(CA_CERT_FILE);
    // Key first: a crash before the bundle is written leaves a key no
    // certificate of ca.crt matches, which `Ca::read` reports, and the old
    // key in ca.key.previous to restore.
    write_file(&previous, old_key.as_bytes(), Secrecy::Secret)?;
    write_file(&key, new_key.as_bytes(), Secrecy::Secret)?;
    write_file(
        &bundle,
        format!("{new_cert}{old_cert}").as_bytes(),
        Secrecy::Public,
    )?;
    Ok(RotationStep {
        written: vec![previous, key, bundle],
        deleted: Vec::new(),
        cas: 2,
    })
}

/// Ends a CA rotation: `ca.crt` keeps only the CA of `ca.key`, and
/// `ca.key.previous` is deleted. Refused, naming the file, while a leaf
/// certificate in the directory is not valid under that CA alone (renew
/// first). With a single CA already, it changes nothing.
pub fn retire_old_cas(dir: &Path, region: &Label) -> Result<RotationStep, TlsError> {
    let ca = current_ca(dir, region)?;
    let blocks = bundle_blocks(dir)?;
    install_crypto_provider();
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots(&[ca.cert_der().clone()])?))
        .build()
        .map_err(TlsError::Verifier)?;
    for leaf in leaves(dir, region)? {
        if let Err(reason) = verifier.verify_client_cert(&leaf.der, &[], UnixTime::now()) {
            return Err(TlsError::LeafOfRetiredCa {
                path: leaf.path,
                reason,
            });
        }
    }
    let mut step = RotationStep {
        written: Vec::new(),
        deleted: Vec::new(),
        cas: 1,
    };
    if blocks.len() > 1 {
        let bundle = dir.join(CA_CERT_FILE);
        let (cert, _) = ca.to_pem();
        write_file(&bundle, cert.as_bytes(), Secrecy::Public)?;
        step.written.push(bundle);
    }
    let previous = dir.join(PREVIOUS_CA_KEY_FILE);
    if previous.exists() {
        fs::remove_file(&previous).map_err(|reason| TlsError::Io {
            action: "delete",
            path: previous.clone(),
            reason,
        })?;
        step.deleted.push(previous);
    }
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Role;
    use crate::identity::Identity;
    use crate::name::PrincipalName;
    use crate::tls::{write_certs, ServerNames, TlsFiles, TlsMaterial};

    fn region() -> Label {
        Label::new("r1").unwrap()
    }

    fn id(role: Role, name: &str) -> Identity {
        Identity::new(region(), role, PrincipalName::new(name).unwrap())
    }

    fn serial(path: &Path) -> String {
        let der = read_certs(path, "certificate").unwrap().remove(0);
        crate::tls::CertStatus::of(&der).unwrap().serial
    }

    #[test]
    fn a_rotation_renews_from_the_new_ca_and_retires_the_old_only_after() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (agent, arbiter) = (id(Role::Agent, "n1"), id(Role::Arbiter, "arb-1"));
        let names = ServerNames {
            dns: vec!["arb-1.r1.example".to_owned()],
            agent_ips: [("n1".to_owned(), vec!["10.0.0.1".parse().unwrap()])].into(),
            ..ServerNames::default()
        };
        write_certs(d, &region(), &[agent.clone(), arbiter.clone()], &names).unwrap();
        // A peer region's CA beside them is not a leaf and is left alone.
        let peer_ca = Ca::generate(&Label::new("r2").unwrap()).unwrap();
        fs::write(d.join("r2-ca.crt"), peer_ca.to_pem().0).unwrap();
        let ca_before = fs::read(d.join(CA_CERT_FILE)).unwrap();
        let agent_files = TlsFiles::in_dir(d, &agent);
        let agent_serial = serial(&agent_files.cert);

        // --renew: new certificates from the same CA, same names.
        let step = renew_certs(d, &region()).unwrap();
        assert_eq!(step.written.len(), 4, "{:?}", step.written);
        assert_eq!(
            fs::read(d.join(CA_CERT_FILE)).unwrap(),
            ca_before,
            "CA untouched"
        );
        assert_ne!(serial(&agent_files.cert), agent_serial);
        let renewed = TlsMaterial::load(&agent_files).unwrap();
        assert_eq!(renewed.identity().unwrap(), agent);
        assert_eq!(
            ip_sans_from_cert_der(&renewed.cert_chain[0]),
            vec!["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        let arbiter_files = TlsFiles::in_dir(d, &arbiter);
        let arbiter_der = TlsMaterial::load(&arbiter_files)
            .unwrap()
            .cert_chain
            .remove(0);
        assert!(dns_sans_from_cert_der(&arbiter_der).contains(&"arb-1.r1.example".to_owned()));

        // --retire-old-ca with one CA changes nothing.
        let step = retire_old_cas(d, &region()).unwrap();
        assert!(step.written.is_empty() && step.deleted.is_empty());

        // --rotate-ca: a bundle of both, the new key; old leaves still load.
        let old_ca = Ca::read(d).unwrap();
        let step = rotate_ca(d, &region()).unwrap();
        assert_eq!(step.cas, 2);
        let new_ca = Ca::read(d).unwrap();
        assert_ne!(new_ca.cert_der(), old_ca.cert_der());
        assert!(d.join(PREVIOUS_CA_KEY_FILE).exists());
        let bundle = TlsMaterial::load(&agent_files).expect("an old leaf under the bundle");
        assert_eq!(
            bundle.cas,
            vec![new_ca.cert_der().clone(), old_ca.cert_der().clone()]
        );
        let error = rotate_ca(d, &region()).unwrap_err();
        assert!(
            matches!(error, TlsError::RotationUnderWay { count: 2, .. }),
            "{error}"
        );

        // Retiring before renewing would orphan the leaves: refused.
        let error = retire_old_cas(d, &region()).unwrap_err();
        assert!(matches!(error, TlsError::LeafOfRetiredCa { .. }), "{error}");
        assert_eq!(bundle_blocks(d).unwrap().len(), 2, "nothing changed");

        // Renew, then retire: the new CA alone, the old key gone.
        renew_certs(d, &region()).unwrap();
        let step = retire_old_cas(d, &region()).unwrap();
        assert_eq!(step.cas, 1);
        assert_eq!(step.deleted, vec![d.join(PREVIOUS_CA_KEY_FILE)]);
        let after = TlsMaterial::load(&agent_files).unwrap();
        assert_eq!(after.cas, vec![new_ca.cert_der().clone()]);
        assert_eq!(TlsMaterial::load(&arbiter_files).unwrap().cas.len(), 1);
    }

    #[test]
    fn renewing_needs_a_ca_of_the_region() {
        let dir = tempfile::tempdir().unwrap();
        let error = renew_certs(dir.path(), &region()).unwrap_err();
        assert!(matches!(error, TlsError::NoCa { .. }), "{error}");
        write_certs(
            dir.path(),
            &region(),
            &[id(Role::Agent, "n1")],
            &ServerNames::default(),
        )
        .unwrap();
        let error = rotate_ca(dir.path(), &Label::new("r2").unwrap()).unwrap_err();
        assert!(matches!(error, TlsError::CaOfOtherRegion { .. }), "{error}");
    }
}
