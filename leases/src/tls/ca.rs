//! A region's certificate authority and the certificates it issues
//! (`rollcall certs`): the CA's own certificate, each role's leaf with the
//! names and key usages it needs, and the bundles written to disk.

use std::collections::BTreeSet;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::{
    pem_certificate_blocks, read_text, write_file, Secrecy, TlsError, BACKDATE, CA_CERT_FILE,
    CA_KEY_FILE, CA_LIFETIME, LEAF_LIFETIME, MAX_COMMON_NAME_CHARS,
};
use crate::endpoint::Role;
use crate::identity::Identity;
use crate::name::Label;

/// A region's certificate authority: its key and self-signed certificate.
/// It signs the leaf certificate of every agent, arbiter, bridge,
/// controller and operator of the region.
#[derive(Debug)]
pub struct Ca {
    region: Label,
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
}

impl Ca {
    /// Generates a new CA for `region` (common name "rollcall <region> CA",
    /// valid for `CA_LIFETIME`, may sign leaves only).
    pub fn generate(region: &Label) -> Result<Ca, TlsError> {
        let generate = |reason| TlsError::Generate {
            what: format!("the CA of region {region}"),
            reason,
        };
        let key = KeyPair::generate().map_err(generate)?;
        let mut params = ca_params(region);
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + CA_LIFETIME).into();
        let cert = params.self_signed(&key).map_err(generate)?;
        Ok(Ca {
            region: region.clone(),
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The region this CA certifies.
    pub fn region(&self) -> &Label {
        &self.region
    }

    /// The CA certificate, DER-encoded: the one trust anchor of the region.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The CA certificate and key, PEM-encoded, in that order, for storing
    /// and reloading with `from_pem`.
    pub fn to_pem(&self) -> (String, String) {
        (self.cert_pem.clone(), self.issuer.key().serialize_pem())
    }

    /// Reloads a CA saved with `to_pem`, checking that the certificate is a
    /// rollcall CA and that the key belongs to it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, TlsError> {
        Ca::from_pem_named(cert_pem, key_pem, "CA certificate", "CA key")
    }

    /// Reads `dir/ca.crt` and `dir/ca.key`, as written by `write`.
    pub fn read(dir: &Path) -> Result<Ca, TlsError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = read_text(&cert_path)?;
        let key_pem = read_text(&key_path)?;
        Ca::from_pem_named(
            &cert_pem,
            &key_pem,
            &cert_path.display().to_string(),
            &key_path.display().to_string(),
        )
    }

    /// Writes `dir/ca.crt` and `dir/ca.key` (mode 0600 on unix) and returns
    /// their paths. Refuses to overwrite either file: replacing a CA would
    /// invalidate every certificate it signed.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, TlsError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        for path in [&cert_path, &key_path] {
            if path.exists() {
                return Err(TlsError::CaExists { path: path.clone() });
            }
        }
        let (cert_pem, key_pem) = self.to_pem();
        write_file(&key_path, key_pem.as_bytes(), Secrecy::Secret)?;
        write_file(&cert_path, cert_pem.as_bytes(), Secrecy::Public)?;
        Ok(vec![cert_path, key_path])
    }

    /// Issues a leaf certificate for `identity`, valid for `LEAF_LIFETIME`
    /// for both client and server authentication, with a fresh key.
    ///
    /// The identity goes in the URI SAN; `dns_names` and `ip_addrs` become
    /// DNS and IP SANs so the holder can also serve. Arbiters and bridges
    /// always get `localhost`, 127.0.0.1 and ::1 as well, because they are
    /// reached by address on loopback in development and tests. The identity
    /// must belong to this CA's region.
    pub fn issue(
        &self,
        identity: &Identity,
        dns_names: &[String],
        ip_addrs: &[IpAddr],
    ) -> Result<IssuedCert, TlsError> {
        self.issue_for(identity, dns_names, ip_addrs, LEAF_LIFETIME)
    }

    /// [`Ca::issue`] with another lifetime than `LEAF_LIFETIME` (from now;
    /// validity starts an hour back): short-lived certificates, and tests
    /// of what happens when one expires.
    pub fn issue_for(
        &self,
        identity: &Identity,
        dns_names: &[String],
        ip_addrs: &[IpAddr],
        lifetime: Duration,
    ) -> Result<IssuedCert, TlsError> {
        if identity.region != self.region {
            return Err(TlsError::RegionMismatch {
                identity: Box::new(identity.clone()),
                ca_region: self.region.clone(),
            });
        }
        let generate = |reason| TlsError::Generate {
            what: format!("a certificate for {identity}"),
            reason,
        };
        let mut dns_names: BTreeSet<String> = dns_names.iter().cloned().collect();
        let mut ip_addrs: BTreeSet<IpAddr> = ip_addrs.iter().copied().collect();
        if matches!(identity.principal.role, Role::Arbiter | Role::Bridge) {
            dns_names.insert("localhost".to_owned());
            ip_addrs.insert(IpAddr::V4(Ipv4Addr::LOCALHOST));
            ip_addrs.insert(IpAddr::V6(Ipv6Addr::LOCALHOST));
        }

        let uri = identity.to_uri();
        let mut sans = vec![SanType::URI(uri.as_str().try_into().map_err(generate)?)];
        for name in dns_names {
            // DnsName applies the rules rustls will check names against.
            let ia5 = DnsName::try_from(name.as_str())
                .ok()
                .and_then(|_| Ia5String::try_from(name.as_str()).ok())
                .ok_or_else(|| TlsError::BadDnsName { name: name.clone() })?;
            sans.push(SanType::DnsName(ia5));
        }
        sans.extend(ip_addrs.into_iter().map(SanType::IpAddress));

        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let common_name: String = format!(
            "{} {}",
            identity.principal.role.as_str(),
            identity.principal.name
        )
        .chars()
        .take(MAX_COMMON_NAME_CHARS)
        .collect();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // Each role gets the usages it needs (issue 38, item 4): arbiters
        // serve agents and dial their peers, bridges serve and dial each
        // other; agents, controllers and operators only dial, so their
        // certificates cannot serve anyone (TLS checks the usage).
        params.extended_key_usages = match identity.principal.role {
            Role::Arbiter | Role::Bridge => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Role::Agent | Role::Controller | Role::Operator => {
                vec![ExtendedKeyUsagePurpose::ClientAuth]
            }
        };
        params.use_authority_key_identifier_extension = true;
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + lifetime).into();

        let key = KeyPair::generate().map_err(generate)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(generate)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        })
    }

    /// `from_pem` with the names errors should use for the two inputs.
    fn from_pem_named(
        cert_pem: &str,
        key_pem: &str,
        cert_what: &str,
        key_what: &str,
    ) -> Result<Ca, TlsError> {
        let not_ours = |problem: String| TlsError::NotOurCa {
            what: cert_what.to_owned(),
            problem,
        };
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|error| not_ours(format!("not valid PEM: {error}")))?;
        if certs.is_empty() {
            return Err(not_ours("no PEM certificate".to_owned()));
        }
        let key = KeyPair::from_pem(key_pem).map_err(|reason| TlsError::BadCaKey {
            what: key_what.to_owned(),
            reason,
        })?;
        // The file may be a bundle (a CA rotation): the issuer is the
        // certificate whose public key is the key's.
        let (index, cert_der) = certs
            .into_iter()
            .enumerate()
            .find(|(_, der)| {
                x509_parser::parse_x509_certificate(der).is_ok_and(|(_, cert)| {
                    key.der_bytes() == cert.public_key().subject_public_key.data.as_ref()
                })
            })
            .ok_or_else(|| TlsError::CaKeyMismatch {
                cert: cert_what.to_owned(),
                key: key_what.to_owned(),
            })?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|error| not_ours(format!("not X.509: {error}")))?;
        if !parsed.is_ca() {
            return Err(not_ours("it is not a CA certificate".to_owned()));
        }
        let common_name = parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .ok_or_else(|| not_ours("it has no common name".to_owned()))?;
        let region = common_name
            .strip_prefix("rollcall ")
            .and_then(|rest| rest.strip_suffix(" CA"))
            .and_then(|region| Label::new(region).ok())
            .ok_or_else(|| {
                not_ours(format!(
                    "its common name {common_name:?} is not \"rollcall <region> CA\""
                ))
            })?;

        // Leaves name their issuer by the CA's subject, byte for byte: make
        // sure the rebuilt issuer encodes the same subject as the stored
        // certificate, or every leaf it signs would fail to chain.
        let params = ca_params(&region);
        let probe = params
            .self_signed(&key)
            .map_err(|reason| TlsError::Generate {
                what: format!("a check of {cert_what}"),
                reason,
            })?;
        let same_subject = x509_parser::parse_x509_certificate(probe.der())
            .is_ok_and(|(_, probe)| probe.subject().as_raw() == parsed.subject().as_raw());
        if !same_subject {
            return Err(not_ours(
                "its subject has more than the rollcall common name".to_owned(),
            ));
        }

        let cert_pem = pem_certificate_blocks(cert_pem)
            .get(index)
            .map(|block| format!("{block}\n"))
            .ok_or_else(|| not_ours("its PEM blocks do not parse alike".to_owned()))?;
        Ok(Ca {
            region,
            cert_pem,
            cert_der: cert_der.clone(),
            issuer: Issuer::new(params, key),
        })
    }
}

/// The parameters of a region's CA that its issuer needs: subject, key
/// usages and a path length of zero (it signs leaves only).
fn ca_params(region: &Label) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("rollcall {region} CA"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A leaf certificate and its private key, in both encodings. Its `Debug`
/// output leaves the key out.
pub struct IssuedCert {
    /// The certificate, PEM-encoded.
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM-encoded.
    pub key_pem: String,
    /// The certificate, DER-encoded.
    pub cert_der: CertificateDer<'static>,
    /// The private key, DER-encoded.
    pub key_der: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[secret key elided]")
            .field("key_der", &self.key_der)
            .finish_non_exhaustive()
    }
}

/// Writes `dir/<name>.crt` and `dir/<name>.key` (mode 0600 on unix),
/// replacing older files of that name, and returns their paths. `name` must
/// be a plain file name and not `ca`, so a bundle can never replace the CA.
pub fn write_bundle(dir: &Path, name: &str, cert: &IssuedCert) -> Result<Vec<PathBuf>, TlsError> {
    let mut components = Path::new(name).components();
    let plain = matches!(
        (components.next(), components.next()),
        (Some(Component::Normal(_)), None)
    ) && !name.contains(['/', '\\']);
    if !plain || name == "ca" {
        return Err(TlsError::BadFileName {
            name: name.to_owned(),
        });
    }
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    write_file(&key_path, cert.key_pem.as_bytes(), Secrecy::Secret)?;
    write_file(&cert_path, cert.cert_pem.as_bytes(), Secrecy::Public)?;
    Ok(vec![cert_path, key_path])
}

/// What `write_certs` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenCerts {
    /// Whether the directory's existing CA was used (else one was generated
    /// and its files are among `files`).
    pub ca_reused: bool,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
}

/// The file stem of an identity's bundle: `<role>-<name>`, e.g.
/// `agent-node-17`.
pub fn bundle_name(identity: &Identity) -> String {
    format!(
        "{}-{}",
        identity.principal.role.as_str(),
        identity.principal.name
    )
}

/// Extra names put in server certificates (arbiters and bridges), beyond
/// `localhost`, 127.0.0.1 and ::1: the host names and addresses peers dial,
/// which the TLS handshake checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerNames {
    /// DNS names.
    pub dns: Vec<String>,
    /// IP addresses.
    pub ips: Vec<IpAddr>,
    /// Each agent's node addresses, by node name, put in its certificate as
    /// IP SANs: what the arbiter lets that node register
    /// (`registration.addresses = "declared"`).
    pub agent_ips: std::collections::BTreeMap<String, Vec<IpAddr>>,
    /// Each arbiter's own addresses, by replica name, put in its
    /// certificate only (beside `dns` and `ips`): the address its peers dial,
    /// which binds the certificate to that member of the group (a peer
    /// whose certificate names no member's address is refused).
    pub arbiter_ips: std::collections::BTreeMap<String, Vec<IpAddr>>,
}

/// Issues a bundle for each identity into `out` (created if missing), named
/// by `bundle_name`. Reuses `out/ca.crt` and `out/ca.key` when both exist,
/// so certificates can be added later; generates and writes a CA when
/// neither does; refuses when only one does. Every identity must belong to
/// `region`, and so must a reused CA. Arbiter and bridge certificates also carry
/// `server_names`.
pub fn write_certs(
    out: &Path,
    region: &Label,
    identities: &[Identity],
    server_names: &ServerNames,
) -> Result<WrittenCerts, TlsError> {
    if let Some(stranger) = identities.iter().find(|id| &id.region != region) {
        return Err(TlsError::RegionMismatch {
            identity: Box::new(stranger.clone()),
            ca_region: region.clone(),
        });
    }
    fs::create_dir_all(out).map_err(|reason| TlsError::Io {
        action: "create directory",
        path: out.to_owned(),
        reason,
    })?;
    let cert_path = out.join(CA_CERT_FILE);
    let key_path = out.join(CA_KEY_FILE);
    let mut files = Vec::new();
    let ca_reused = match (cert_path.exists(), key_path.exists()) {
        (true, true) => true,
        (false, false) => false,
        (true, false) => {
            return Err(TlsError::IncompleteCa {
                present: cert_path,
                missing: key_path,
            })
        }
        (false, true) => {
            return Err(TlsError::IncompleteCa {
                present: key_path,
                missing: cert_path,
            })
        }
    };
    let ca = if ca_reused {
        let ca = Ca::read(out)?;
        if ca.region() != region {
            return Err(TlsError::CaOfOtherRegion {
                dir: out.to_owned(),
                wanted: region.clone(),
                found: ca.region().clone(),
            });
        }
        ca
    } else {
        let ca = Ca::generate(region)?;
        files.extend(ca.write(out)?);
        ca
    };
    let mut done = BTreeSet::new();
    for identity in identities {
        if done.insert(identity) {
            let issued = match identity.principal.role {
                Role::Arbiter => {
                    let mut ips = server_names.ips.clone();
                    if let Some(own) = server_names
                        .arbiter_ips
                        .get(identity.principal.name.as_str())
                    {
                        ips.extend(own);
                    }
                    ca.issue(identity, &server_names.dns, &ips)?
                }
                Role::Bridge => ca.issue(identity, &server_names.dns, &server_names.ips)?,
                Role::Agent => {
                    let ips = server_names
                        .agent_ips
                        .get(identity.principal.name.as_str())
                        .map_or(&[][..], Vec::as_slice);
                    ca.issue(identity, &[], ips)?
                }
                _ => ca.issue(identity, &[], &[])?,
            };
            files.extend(write_bundle(out, &bundle_name(identity), &issued)?);
        }
    }
    Ok(WrittenCerts { ca_reused, files })
}
