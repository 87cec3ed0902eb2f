//! Certificates and the mutual-TLS configuration of control-plane links
//! (R10): a per-region CA, leaf certificates that carry an `Identity` URI
//! SAN, the files they are kept in (a CA file may be a bundle of several
//! CAs, all trusted), and quinn configurations that accept only peers
//! holding a certificate signed by a CA of the bundle. Submodules: `live`
//! (material replaceable at run time), `watch` (reloading it when the
//! files change or on request), `rotation` (renewing certificates and
//! rotating a CA in a certificate directory).
//!
//! This module authenticates; it never authorises. `peer_identity` says who
//! the peer is, and what that peer may do is the policy's decision. It holds
//! no protocol logic; it reads the clock only for certificates' validity
//! (stamping it when issuing, checking it when loading, and waiting for a
//! peer's to end).

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, SystemTime};

use quinn::crypto::rustls::NoInitialCipherSuite;
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::RootCertStore;

use crate::endpoint::Role;
use crate::identity::{identity_from_cert_der, Identity, IdentityError};
use crate::name::Label;

mod https;
mod live;
pub mod revoked;
mod rotation;
mod watch;

pub use https::{identity_of, HTTP1_ALPN};
pub use live::{CertStatus, LiveTls, TlsStatus};
pub use rotation::{renew_certs, retire_old_cas, rotate_ca, RotationStep, PREVIOUS_CA_KEY_FILE};
pub use watch::{expiring, FileReload, Reload, Watcher, EXPIRY_WARNING};

/// The ALPN protocol every rollcall control-plane connection negotiates; a
/// peer speaking anything else is refused during the handshake.
pub const ALPN: &[u8] = b"rollcall/1";

/// How long an issued leaf certificate is valid: 90 days. Short enough
/// that a leaked key nobody revoked dies within a quarter, and that
/// renewing (`rollcall certs --renew`, reloaded without a restart) is a
/// routine job rather than a yearly surprise; long enough that the 7 days
/// of expiry warnings leave a renewal plenty of room.
pub const LEAF_LIFETIME: Duration = Duration::from_secs(90 * 24 * 60 * 60);

/// How long a CA certificate is valid: long enough that leaves issued
/// later from a reused CA do not outlive it.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// How far before "now" validity starts, so a host whose clock is slightly
/// behind the issuer's still accepts a fresh certificate.
const BACKDATE: Duration = Duration::from_secs(60 * 60);

/// The longest certificate or key file read; real ones are a few KiB.
const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// Longest common name written into a leaf (the X.509 upper bound). The
/// common name is informational only; the identity is the URI SAN.
const MAX_COMMON_NAME_CHARS: usize = 64;

/// File name of a CA certificate inside a certificate directory.
pub const CA_CERT_FILE: &str = "ca.crt";

/// File name of a CA key inside a certificate directory.
pub const CA_KEY_FILE: &str = "ca.key";

/// Everything that can go wrong creating, storing, loading or using
/// certificates. Messages name the file or value and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A line of the deny list is neither an identity URI nor a serial.
    #[error("{}, line {line}: {reason}", path.display())]
    BadRevocation {
        /// The deny list.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// rcgen could not produce a key or certificate.
    #[error("could not generate {what}: {reason}")]
    Generate {
        /// What was being generated ("CA certificate", "certificate for …").
        what: String,
        /// rcgen's explanation.
        reason: rcgen::Error,
    },
    /// A DNS name given for a server certificate is not a valid DNS name.
    #[error("DNS name {name:?} cannot go in a certificate: use a host name such as arbiter-1.example.net")]
    BadDnsName {
        /// The refused name.
        name: String,
    },
    /// A CA was asked to certify an identity of another region.
    #[error("cannot issue a certificate for {identity}: this CA belongs to region {ca_region}; use the CA of region {}", identity.region)]
    RegionMismatch {
        /// The identity that was refused.
        identity: Box<Identity>,
        /// The region of the CA.
        ca_region: Label,
    },
    /// A file could not be read or written.
    #[error("could not {action} {}: {reason}", path.display())]
    Io {
        /// What was being done ("read", "create", …).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's explanation.
        reason: io::Error,
    },
    /// A certificate or key file is implausibly large.
    #[error("{} is larger than {MAX_PEM_FILE_BYTES} bytes, which no certificate or key file is; point at the file written by `rollcall certs`", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// A file that should hold a certificate holds none.
    #[error("{kind} file {} holds no PEM certificate; generate one with `rollcall certs`", path.display())]
    NoCertificate {
        /// "certificate" or "CA certificate".
        kind: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A certificate of a CA bundle is not a CA certificate.
    #[error("certificate {position} of the CA bundle {} is not a CA certificate ({problem}); a CA file holds only CA certificates, such as the ca.crt written by `rollcall certs`", path.display())]
    NotACa {
        /// The file.
        path: PathBuf,
        /// Its place in the file, from 1.
        position: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A private key is not the key of the certificate beside it.
    #[error("{} is not the key of {}: {reason}; install the pair `rollcall certs` wrote together (a reload retries when the files change again)", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's explanation.
        reason: rustls::Error,
    },
    /// A process's own certificate is not valid under its own CA bundle.
    #[error("{} is not valid under the CAs in {}: {reason}; renew it (`rollcall certs --renew`) or put the CA that signed it in the bundle", cert.display(), ca.display())]
    NotTrusted {
        /// The certificate file.
        cert: PathBuf,
        /// The CA bundle file.
        ca: PathBuf,
        /// Why it does not verify (expired, not yet valid, unknown issuer).
        reason: rustls::Error,
    },
    /// `--renew`, `--rotate-ca` or `--retire-old-ca` found no CA to work from.
    #[error("{} holds no CA (ca.crt and ca.key); renewing and rotating work from an existing CA: run `rollcall certs` with identities first, or point --out at the region's certificate directory", dir.display())]
    NoCa {
        /// The certificate directory.
        dir: PathBuf,
    },
    /// A leaf certificate in a directory names another region than its CA.
    #[error("{} names {identity}, but this directory's CA is of region {region}; move it to region {}'s directory", path.display(), identity.region)]
    LeafOfOtherRegion {
        /// The certificate file.
        path: PathBuf,
        /// The identity it names.
        identity: Box<Identity>,
        /// The region of the directory's CA.
        region: Label,
    },
    /// A CA rotation was asked for while one is under way.
    #[error("{} holds {count} CA certificates: a rotation is under way; finish it (`rollcall certs --renew`, then `--retire-old-ca`) before starting another", path.display())]
    RotationUnderWay {
        /// The CA bundle.
        path: PathBuf,
        /// How many CAs it holds.
        count: usize,
    },
    /// Retiring the old CA would orphan a certificate it still vouches for.
    #[error("{} is not valid under the current CA alone ({reason}): retiring the old CA would cut it off; run `rollcall certs --renew` first and copy the renewed certificates to their hosts", path.display())]
    LeafOfRetiredCa {
        /// The certificate file.
        path: PathBuf,
        /// Why it does not verify under the current CA.
        reason: rustls::Error,
    },
    /// A reload named another identity than the process runs as.
    #[error("{} names {found}, but this process runs as {running}; a reload may change the certificate, not who the process is (restart it to change that)", cert.display())]
    IdentityChanged {
        /// The certificate file.
        cert: PathBuf,
        /// The identity the process runs as.
        running: Box<Identity>,
        /// The identity the new certificate names.
        found: Box<Identity>,
    },
    /// A file that should hold a private key holds none.
    #[error("key file {} holds no PEM private key; generate one with `rollcall certs`", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// A file is not well-formed PEM.
    #[error("{} is not valid PEM ({detail}); regenerate it with `rollcall certs`", path.display())]
    BadPem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser reported.
        detail: String,
    },
    /// A certificate offered as a CA is not one rollcall made.
    #[error("{what} is not a rollcall CA certificate ({problem}); use the ca.crt written by `rollcall certs`")]
    NotOurCa {
        /// The file, or "CA certificate" when given in memory.
        what: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A CA key could not be parsed.
    #[error(
        "{what} is not a usable private key ({reason}); use the ca.key written by `rollcall certs`"
    )]
    BadCaKey {
        /// The file, or "CA key" when given in memory.
        what: String,
        /// rcgen's explanation.
        reason: rcgen::Error,
    },
    /// The CA key does not belong to the CA certificate.
    #[error("{key} is not the key of {cert}; restore the matching ca.crt and ca.key pair")]
    CaKeyMismatch {
        /// The certificate file or description.
        cert: String,
        /// The key file or description.
        key: String,
    },
    /// Only half of a CA is present in a certificate directory.
    #[error("{} exists but {} does not; restore the missing file, or use an empty directory and reissue every certificate", present.display(), missing.display())]
    IncompleteCa {
        /// The CA file that exists.
        present: PathBuf,
        /// The CA file that is missing.
        missing: PathBuf,
    },
    /// A CA file would be overwritten, orphaning every certificate it signed.
    #[error("{} already exists; refusing to overwrite a CA (every certificate it signed would stop working); reuse it or choose another directory", path.display())]
    CaExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A bundle name is not a plain file name.
    #[error("certificate name {name:?} is not usable as a file name: use letters, digits, '-' or '.', and not \"ca\"")]
    BadFileName {
        /// The refused name.
        name: String,
    },
    /// A CA of another region was found where this region's CA should be.
    #[error("the CA in {} belongs to region {found}, not {wanted}; use a directory for region {wanted}", dir.display())]
    CaOfOtherRegion {
        /// The certificate directory.
        dir: PathBuf,
        /// The region asked for.
        wanted: Label,
        /// The region of the CA found there.
        found: Label,
    },
    /// rustls refused a certificate or key while building a configuration.
    #[error("TLS configuration refused the {what}: {reason}; regenerate it with `rollcall certs`")]
    Rustls {
        /// "CA certificate" or "certificate and key".
        what: &'static str,
        /// rustls's explanation.
        reason: rustls::Error,
    },
    /// The client-certificate verifier could not be built.
    #[error("cannot build the client certificate verifier: {0}; check the CA certificate")]
    Verifier(VerifierBuilderError),
    /// The crypto provider lacks the cipher suite QUIC's initial packets use.
    #[error("the TLS crypto provider lacks TLS13_AES_128_GCM_SHA256, which QUIC requires: {0}")]
    NoInitialCipherSuite(NoInitialCipherSuite),
    /// A `TlsMaterial` was built by hand with no certificate in its chain.
    #[error("the TLS material holds no certificate; load it with TlsMaterial::load")]
    EmptyChain,
    /// The peer presented no certificate (impossible when our configs did
    /// the handshake, which require one).
    #[error("the peer presented no certificate; control-plane connections must use configs from rollcall_leases::tls")]
    NoPeerCertificate,
    /// A certificate does not name a rollcall identity.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// Installs rustls's *ring* crypto provider as the process default, once.
/// Safe to call any number of times from any thread; if another provider was
/// installed first, that one stays.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // An Err only means a provider is already installed, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

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

/// Where a process finds its TLS material.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The region's CA bundle (PEM): every CA certificate trusted to vouch
    /// for peers; one, or during a CA rotation the old and the new.
    pub ca: PathBuf,
    /// This process's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// This process's private key (PEM, PKCS#8).
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files `write_certs` wrote for `identity` into `dir`.
    pub fn in_dir(dir: &Path, identity: &Identity) -> TlsFiles {
        let name = bundle_name(identity);
        TlsFiles {
            ca: dir.join(CA_CERT_FILE),
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        }
    }
}

/// Decoded TLS material: what a [`LiveTls`] presents and trusts.
#[derive(Debug)]
pub struct TlsMaterial {
    /// The CA bundle: every CA certificate trusted to vouch for peers (the
    /// region's CA; during a CA rotation the old one and the new one).
    pub cas: Vec<CertificateDer<'static>>,
    /// This process's certificate chain, leaf first.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// This process's private key.
    pub key: PrivateKeyDer<'static>,
    /// The certificates no one may use (`revoked.txt` beside the CA
    /// bundle; none when it is missing).
    pub revoked: revoked::Revoked,
}

impl TlsMaterial {
    /// Reads and decodes the three files, then checks that they make a
    /// usable whole now: the key is the certificate's, and the certificate
    /// is valid under the bundle's CAs (not expired, signed by one of them).
    /// Errors name the file at fault.
    pub fn load(files: &TlsFiles) -> Result<TlsMaterial, TlsError> {
        let cas = read_ca_bundle(&files.ca)?;
        let cert_chain = read_certs(&files.cert, "certificate")?;
        crate::secret::owner_only(&files.key).map_err(|reason| TlsError::Io {
            action: "restrict to its owner",
            path: files.key.clone(),
            reason,
        })?;
        let key_pem = read_limited(&files.key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| match error {
            pem::Error::NoItemsFound => TlsError::NoKey {
                path: files.key.clone(),
            },
            other => bad_pem(&files.key, &other),
        })?;
        let material = TlsMaterial {
            cas,
            cert_chain,
            key,
            revoked: revoked::Revoked::load(&revoked::beside(&files.ca))?,
        };
        material.check(files, SystemTime::now())?;
        Ok(material)
    }

    /// Material straight from a CA and a certificate it issued, without
    /// files: for `rollcall dev` and tests.
    pub fn from_issued(ca: &Ca, cert: &IssuedCert) -> TlsMaterial {
        TlsMaterial {
            cas: vec![ca.cert_der().clone()],
            cert_chain: vec![cert.cert_der.clone()],
            key: cert.key_der.clone_key(),
            revoked: revoked::Revoked::none(),
        }
    }

    /// The identity this material's own certificate names.
    pub fn identity(&self) -> Result<Identity, TlsError> {
        let leaf = self.cert_chain.first().ok_or(TlsError::EmptyChain)?;
        Ok(identity_from_cert_der(leaf)?)
    }

    /// Whether the material loaded from `files` is usable at `now`.
    fn check(&self, files: &TlsFiles, now: SystemTime) -> Result<(), TlsError> {
        live::certified_key(&self.cert_chain, &self.key).map_err(|reason| {
            TlsError::KeyMismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
                reason,
            }
        })?;
        let (leaf, intermediates) = self.cert_chain.split_first().ok_or(TlsError::EmptyChain)?;
        let verifier = WebPkiClientVerifier::builder(Arc::new(roots(&self.cas)?))
            .build()
            .map_err(TlsError::Verifier)?;
        let at = UnixTime::since_unix_epoch(
            now.duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
        );
        verifier
            .verify_client_cert(leaf, intermediates, at)
            .map(|_| ())
            .map_err(|reason| TlsError::NotTrusted {
                cert: files.cert.clone(),
                ca: files.ca.clone(),
                reason,
            })
    }
}

/// A QUIC server configuration for a control-plane listener over fixed
/// material (see [`LiveTls::server_config`], which the servers use so that
/// their material can be replaced).
pub fn server_config(material: &TlsMaterial) -> Result<quinn::ServerConfig, TlsError> {
    LiveTls::new(material)?.server_config(ALPN)
}

/// A QUIC client configuration for control-plane connections over fixed
/// material (see [`LiveTls::client_config`]).
pub fn client_config(material: &TlsMaterial) -> Result<quinn::ClientConfig, TlsError> {
    LiveTls::new(material)?.client_config(ALPN)
}

/// The verified certificate chain a QUIC peer presented (none when it
/// presented none).
fn peer_chain(conn: &quinn::Connection) -> Option<Vec<CertificateDer<'static>>> {
    conn.peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .map(|chain| *chain)
}

/// Who is at the other end of an established connection, from the leaf of
/// the certificate chain the handshake verified.
pub fn peer_identity(conn: &quinn::Connection) -> Result<Identity, TlsError> {
    let chain = peer_chain(conn).ok_or(TlsError::NoPeerCertificate)?;
    let leaf = chain.first().ok_or(TlsError::NoPeerCertificate)?;
    Ok(identity_from_cert_der(leaf)?)
}

/// The IP SANs of the certificate a verified QUIC peer presented (none
/// when it presented none).
pub fn peer_ip_sans(conn: &quinn::Connection) -> Vec<std::net::IpAddr> {
    peer_chain(conn)
        .and_then(|chain| {
            chain
                .first()
                .map(|leaf| crate::identity::ip_sans_from_cert_der(leaf))
        })
        .unwrap_or_default()
}

/// Resolves once the certificate a verified QUIC peer presented has
/// expired, with the reason to close the connection with; never when the
/// peer presented none. A handshake checks validity only once, so every
/// driver of a long-lived connection waits on this beside its streams: a
/// session whose peer certificate expired is closed, and its peer must
/// come back with a renewed one.
pub async fn peer_certificate_expired(conn: &quinn::Connection) -> String {
    let leaf = peer_chain(conn).and_then(|chain| chain.into_iter().next());
    let Some(status) = leaf.and_then(|leaf| CertStatus::of(&leaf)) else {
        return std::future::pending().await;
    };
    // Slept in steps, so a wall clock set forward is noticed within one.
    const STEP_S: i64 = 3_600;
    loop {
        let left = status.not_after_unix_s - crate::clock::now_ms() as i64 / 1_000;
        if left < 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(left.clamp(0, STEP_S) as u64 + 1)).await;
    }
    let who = peer_identity(conn).map_or_else(|_| "the peer".to_owned(), |id| id.to_string());
    format!(
        "the certificate of {who} expired at {}; renew it (`rollcall certs --renew`) and reconnect",
        status.not_after
    )
}

/// The trust store of a CA bundle: every CA in it.
fn roots(cas: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone()).map_err(|reason| TlsError::Rustls {
            what: "CA certificate",
            reason,
        })?;
    }
    Ok(roots)
}

/// The transport of a configuration nobody overrides (the region
/// bridge's); the agent, the arbiter and the peer links set their own.
fn transport() -> Arc<quinn::TransportConfig> {
    crate::transport::config(crate::transport::Link::Bridge)
}

/// Whether a file may be readable by others.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Secrecy {
    Public,
    Secret,
}

/// Creates or replaces `path` with `contents`, whole: written to a
/// temporary file beside it, synced and renamed over it, so a process
/// reloading the file never reads half of it. A secret file is restricted
/// to its owner (0600 on unix) before anything is written into it.
fn write_file(path: &Path, contents: &[u8], secrecy: Secrecy) -> Result<(), TlsError> {
    let io_error = |action, at: &Path| {
        let at = at.to_owned();
        move |reason| TlsError::Io {
            action,
            path: at,
            reason,
        }
    };
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.tmp"));
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secrecy == Secrecy::Secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&temporary)
        .map_err(io_error("create", &temporary))?;
    #[cfg(unix)]
    if secrecy == Secrecy::Secret {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(io_error("restrict permissions of", &temporary))?;
    }
    #[cfg(not(unix))]
    let _ = secrecy;
    file.write_all(contents)
        .map_err(io_error("write", &temporary))?;
    file.sync_all().map_err(io_error("sync", &temporary))?;
    fs::rename(&temporary, path).map_err(io_error("replace", path))?;
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        fs::File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error("sync", dir))?;
    }
    Ok(())
}

/// Reads at most `MAX_PEM_FILE_BYTES` of a file, refusing larger ones.
fn read_limited(path: &Path) -> Result<Vec<u8>, TlsError> {
    let io_error = |reason| TlsError::Io {
        action: "read",
        path: path.to_owned(),
        reason,
    };
    let file = fs::File::open(path).map_err(io_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(TlsError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

/// `read_limited` for a file that must be UTF-8 text.
fn read_text(path: &Path) -> Result<String, TlsError> {
    String::from_utf8(read_limited(path)?).map_err(|_| TlsError::BadPem {
        path: path.to_owned(),
        detail: "not UTF-8 text".to_owned(),
    })
}

/// Every certificate in a PEM file; at least one.
fn read_certs(path: &Path, kind: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_limited(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| bad_pem(path, &error))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            kind,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Every certificate of a CA bundle file: at least one, each a CA
/// certificate. A bundle of several is how a CA rotation is carried out:
/// while it lasts, peers certified by either CA are accepted.
pub fn read_ca_bundle(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let cas = read_certs(path, "CA certificate")?;
    for (i, ca) in cas.iter().enumerate() {
        let problem = match x509_parser::parse_x509_certificate(ca) {
            Ok((_, cert)) if cert.is_ca() => continue,
            Ok(_) => "it is a leaf certificate".to_owned(),
            Err(error) => format!("not X.509: {error}"),
        };
        return Err(TlsError::NotACa {
            path: path.to_owned(),
            position: i + 1,
            problem,
        });
    }
    Ok(cas)
}

/// The PEM blocks of the certificates in `text`, in order, each from its
/// BEGIN line to its END line.
fn pem_certificate_blocks(text: &str) -> Vec<&str> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        blocks.push(&rest[start..end]);
        rest = &rest[end..];
    }
    blocks
}

/// The error for a file the PEM parser refused.
fn bad_pem(path: &Path, error: &pem::Error) -> TlsError {
    TlsError::BadPem {
        path: path.to_owned(),
        detail: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::name::PrincipalName;

    /// Bounds every network step so a broken handshake fails the test
    /// instead of hanging it; generous because the machine may be busy.
    const STEP: Duration = Duration::from_secs(20);

    fn region(name: &str) -> Label {
        Label::new(name).expect("valid region")
    }

    fn id(region_name: &str, role: Role, name: &str) -> Identity {
        Identity::new(
            region(region_name),
            role,
            PrincipalName::new(name).expect("valid name"),
        )
    }

    fn material(ca: &Ca, identity: &Identity) -> TlsMaterial {
        let issued = ca.issue(identity, &[], &[]).expect("issue");
        TlsMaterial::from_issued(ca, &issued)
    }

    /// What each side saw of one connection attempt.
    struct Outcome {
        /// The client's identity as the server saw it, or why it failed.
        server: Result<Identity, String>,
        /// The server's identity and the echoed bytes, or why it failed.
        client: Result<(Identity, Vec<u8>), String>,
    }

    /// Runs an echo server with `server` material and connects to it with
    /// `client_config`, sending `hello` over one bi stream.
    async fn exchange(server: &TlsMaterial, client: quinn::ClientConfig, name: &str) -> Outcome {
        let listen: SocketAddr = "127.0.0.1:0".parse().expect("address");
        let endpoint =
            quinn::Endpoint::server(server_config(server).expect("server config"), listen)
                .expect("server endpoint");
        let addr = endpoint.local_addr().expect("bound address");
        let server_task = tokio::spawn(async move {
            let incoming = tokio::time::timeout(STEP, endpoint.accept())
                .await
                .map_err(|_| "no connection arrived".to_owned())?
                .ok_or("endpoint closed")?;
            let conn = tokio::time::timeout(STEP, incoming)
                .await
                .map_err(|_| "handshake timed out".to_owned())?
                .map_err(|e| format!("handshake failed: {e}"))?;
            let identity = peer_identity(&conn).map_err(|e| e.to_string())?;
            let (mut send, mut recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
            let data = recv.read_to_end(64).await.map_err(|e| e.to_string())?;
            send.write_all(&data).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            let _ = tokio::time::timeout(STEP, conn.closed()).await;
            Ok::<_, String>(identity)
        });

        let mut client_endpoint =
            quinn::Endpoint::client("127.0.0.1:0".parse().expect("address")).expect("client");
        client_endpoint.set_default_client_config(client);
        let client_result = tokio::time::timeout(STEP, async {
            let conn = client_endpoint
                .connect(addr, name)
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let server_identity = peer_identity(&conn).map_err(|e| e.to_string())?;
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(b"hello").await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            let echoed = recv.read_to_end(64).await.map_err(|e| e.to_string())?;
            conn.close(0u32.into(), b"done");
            Ok::<_, String>((server_identity, echoed))
        })
        .await
        .unwrap_or_else(|_| Err("client timed out".to_owned()));
        client_endpoint.close(0u32.into(), b"done");

        let server_result = server_task.await.expect("server task ran");
        Outcome {
            server: server_result,
            client: client_result,
        }
    }

    #[tokio::test]
    async fn mutual_tls_handshake_echoes_and_names_both_ends() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let arbiter = id("r1", Role::Arbiter, "arb-1");
        let agent = id("r1", Role::Agent, "node-1");
        let server = material(&ca, &arbiter);
        let client = client_config(&material(&ca, &agent)).expect("client config");

        let outcome = exchange(&server, client, "127.0.0.1").await;
        assert_eq!(outcome.server, Ok(agent.clone()));
        assert_eq!(outcome.client, Ok((arbiter.clone(), b"hello".to_vec())));
        assert_eq!(
            outcome.server.expect("checked").to_uri(),
            "rollcall://r1/agent/node-1"
        );

        let client = client_config(&material(&ca, &agent)).expect("client config");
        let outcome = exchange(&server, client, "localhost").await;
        assert_eq!(outcome.server, Ok(agent));
    }

    #[tokio::test]
    async fn client_certificate_from_another_ca_is_refused() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let impostor_ca = Ca::generate(&region("r1")).expect("other CA");
        let server = material(&ca, &id("r1", Role::Arbiter, "arb-1"));
        let impostor = material(&impostor_ca, &id("r1", Role::Agent, "node-1"));
        // The impostor trusts the real CA, so only the server can refuse.
        let client = client_config(&TlsMaterial {
            cas: vec![ca.cert_der().clone()],
            ..impostor
        })
        .expect("client config");

        let outcome = exchange(&server, client, "127.0.0.1").await;
        assert!(
            outcome.server.is_err(),
            "server accepted {:?}",
            outcome.server
        );
        assert!(outcome.client.is_err(), "client got {:?}", outcome.client);
    }

    #[tokio::test]
    async fn client_without_certificate_is_refused() {
        install_crypto_provider();
        let ca = Ca::generate(&region("r1")).expect("CA");
        let server = material(&ca, &id("r1", Role::Arbiter, "arb-1"));
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert_der().clone()).expect("CA is a root");
        let mut tls =
            rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS13])
                .with_root_certificates(roots)
                .with_no_client_auth();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let quic =
            quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("QUIC-capable config");
        let client = quinn::ClientConfig::new(Arc::new(quic));

        let outcome = exchange(&server, client, "127.0.0.1").await;
        assert!(
            outcome.server.is_err(),
            "server accepted {:?}",
            outcome.server
        );
        assert!(outcome.client.is_err(), "client got {:?}", outcome.client);
    }

    #[tokio::test]
    async fn server_certificate_from_another_ca_is_refused_by_the_client() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let impostor_ca = Ca::generate(&region("r1")).expect("other CA");
        let server = material(&impostor_ca, &id("r1", Role::Arbiter, "arb-1"));
        let client =
            client_config(&material(&ca, &id("r1", Role::Agent, "node-1"))).expect("client config");

        let outcome = exchange(&server, client, "127.0.0.1").await;
        assert!(outcome.client.is_err(), "client got {:?}", outcome.client);
        assert!(
            outcome.server.is_err(),
            "server accepted {:?}",
            outcome.server
        );
    }

    #[tokio::test]
    async fn reloaded_ca_issues_certificates_the_original_trusts() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let (cert_pem, key_pem) = ca.to_pem();
        let reloaded = Ca::from_pem(&cert_pem, &key_pem).expect("reload");
        assert_eq!(reloaded.region(), &region("r1"));
        assert_eq!(reloaded.cert_der(), ca.cert_der());

        let server = material(&ca, &id("r1", Role::Arbiter, "arb-1"));
        let agent = id("r1", Role::Agent, "node-2");
        let client = client_config(&material(&reloaded, &agent)).expect("client config");
        let outcome = exchange(&server, client, "127.0.0.1").await;
        assert_eq!(outcome.server, Ok(agent));
    }

    /// The SANs of a certificate, written as `URI(..)`, `DNS(..)`, `IP(..)`.
    fn sans(der: &[u8]) -> Vec<String> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).expect("X.509");
        let Some(ext) = cert
            .subject_alternative_name()
            .expect("SAN extension parses")
        else {
            return Vec::new();
        };
        ext.value
            .general_names
            .iter()
            .map(|name| match name {
                GeneralName::URI(uri) => format!("URI({uri})"),
                GeneralName::DNSName(dns) => format!("DNS({dns})"),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*bytes).expect("4 bytes")),
                        _ => IpAddr::from(<[u8; 16]>::try_from(*bytes).expect("16 bytes")),
                    };
                    format!("IP({ip})")
                }
                other => format!("{other}"),
            })
            .collect()
    }

    #[test]
    fn write_certs_puts_server_names_in_server_certificates_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = ServerNames {
            dns: vec!["arb-1.r1.example".to_owned()],
            ips: vec!["10.0.0.5".parse().expect("ip")],
            agent_ips: [("node-2".to_owned(), vec!["10.0.0.12".parse().expect("ip")])].into(),
            arbiter_ips: [("arb-1".to_owned(), vec!["10.0.0.21".parse().expect("ip")])].into(),
        };
        let arbiter = id("r1", Role::Arbiter, "arb-1");
        let agent = id("r1", Role::Agent, "node-1");
        let addressed = id("r1", Role::Agent, "node-2");
        let other = id("r1", Role::Arbiter, "arb-2");
        write_certs(
            dir.path(),
            &region("r1"),
            &[
                arbiter.clone(),
                agent.clone(),
                addressed.clone(),
                other.clone(),
            ],
            &names,
        )
        .expect("write");
        let der = |identity: &Identity| {
            let files = TlsFiles::in_dir(dir.path(), identity);
            TlsMaterial::load(&files).expect("load").cert_chain[0].to_vec()
        };
        let arbiter_sans = sans(&der(&arbiter));
        assert!(
            arbiter_sans.contains(&"DNS(arb-1.r1.example)".to_owned()),
            "{arbiter_sans:?}"
        );
        assert!(
            arbiter_sans.contains(&"IP(10.0.0.5)".to_owned()),
            "{arbiter_sans:?}"
        );
        // An arbiter given its own address gets it, and only it does.
        assert!(
            arbiter_sans.contains(&"IP(10.0.0.21)".to_owned()),
            "{arbiter_sans:?}"
        );
        let other_sans = sans(&der(&other));
        assert!(
            other_sans.contains(&"IP(10.0.0.5)".to_owned())
                && !other_sans.contains(&"IP(10.0.0.21)".to_owned()),
            "{other_sans:?}"
        );
        let agent_sans = sans(&der(&agent));
        assert!(
            !agent_sans
                .iter()
                .any(|s| s.contains("arb-1.r1.example") || s.contains("10.0.0.5")),
            "{agent_sans:?}"
        );
        // An agent given addresses gets them, and only its own.
        assert!(
            !agent_sans.iter().any(|s| s.contains("10.0.0.12")),
            "{agent_sans:?}"
        );
        let leaf = der(&addressed);
        assert_eq!(
            crate::identity::ip_sans_from_cert_der(&leaf),
            vec!["10.0.0.12".parse::<IpAddr>().expect("ip")]
        );
    }

    #[test]
    fn servers_get_loopback_names_and_agents_do_not() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let arbiter = ca
            .issue(
                &id("r1", Role::Arbiter, "arb-1"),
                &["arb-1.example.net".to_owned(), "localhost".to_owned()],
                &["10.0.0.7".parse().expect("ip")],
            )
            .expect("issue");
        let names = sans(&arbiter.cert_der);
        for expected in [
            "URI(rollcall://r1/arbiter/arb-1)",
            "DNS(arb-1.example.net)",
            "DNS(localhost)",
            "IP(127.0.0.1)",
            "IP(::1)",
            "IP(10.0.0.7)",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} not in {names:?}"
            );
        }
        assert_eq!(names.iter().filter(|n| *n == "DNS(localhost)").count(), 1);

        let bridge = ca
            .issue(&id("r1", Role::Bridge, "br-1"), &[], &[])
            .expect("issue");
        assert!(sans(&bridge.cert_der).contains(&"IP(127.0.0.1)".to_owned()));

        let agent = ca
            .issue(&id("r1", Role::Agent, "node-1"), &[], &[])
            .expect("issue");
        assert_eq!(
            sans(&agent.cert_der),
            vec!["URI(rollcall://r1/agent/node-1)"]
        );
        assert_eq!(
            identity_from_cert_der(&agent.cert_der),
            Ok(id("r1", Role::Agent, "node-1"))
        );
    }

    #[test]
    fn issue_refuses_bad_dns_names_and_other_regions() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let error = ca
            .issue(&id("r1", Role::Arbiter, "a"), &["bad name".to_owned()], &[])
            .expect_err("space in DNS name");
        assert!(matches!(error, TlsError::BadDnsName { .. }), "{error}");

        let error = ca
            .issue(&id("r2", Role::Agent, "a"), &[], &[])
            .expect_err("other region");
        assert!(error.to_string().contains("region r1"), "{error}");
    }

    #[test]
    fn from_pem_refuses_leaves_and_mismatched_keys() {
        let ca = Ca::generate(&region("r1")).expect("CA");
        let other = Ca::generate(&region("r1")).expect("CA");
        let (cert_pem, _) = ca.to_pem();
        let (_, other_key) = other.to_pem();
        let error = Ca::from_pem(&cert_pem, &other_key).expect_err("wrong key");
        assert!(matches!(error, TlsError::CaKeyMismatch { .. }), "{error}");

        let leaf = ca
            .issue(&id("r1", Role::Agent, "a"), &[], &[])
            .expect("issue");
        let error = Ca::from_pem(&leaf.cert_pem, &leaf.key_pem).expect_err("leaf");
        assert!(matches!(error, TlsError::NotOurCa { .. }), "{error}");

        let error = Ca::from_pem("garbage", "garbage").expect_err("garbage");
        assert!(matches!(error, TlsError::NotOurCa { .. }), "{error}");
    }

    #[test]
    fn write_certs_then_load_and_reuse_the_ca() {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("certs");
        let agent = id("r1", Role::Agent, "node-17");
        let written = write_certs(
            &out,
            &region("r1"),
            &[agent.clone(), agent.clone()],
            &ServerNames::default(),
        )
        .expect("write");
        assert!(!written.ca_reused);
        let names: Vec<_> = written
            .files
            .iter()
            .map(|p| p.file_name().expect("file").to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["ca.crt", "ca.key", "agent-node-17.crt", "agent-node-17.key"]
        );

        #[cfg(unix)]
        for key in ["ca.key", "agent-node-17.key"] {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(out.join(key))
                .expect("key exists")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{key}");
        }

        let loaded = TlsMaterial::load(&TlsFiles::in_dir(&out, &agent)).expect("load");
        assert_eq!(loaded.identity().expect("identity"), agent);
        client_config(&loaded).expect("loaded material makes a client config");

        let ca_before = fs::read(out.join("ca.crt")).expect("ca.crt");
        let arbiter = id("r1", Role::Arbiter, "arb-1");
        let written = write_certs(
            &out,
            &region("r1"),
            std::slice::from_ref(&arbiter),
            &ServerNames::default(),
        )
        .expect("again");
        assert!(written.ca_reused);
        assert_eq!(written.files.len(), 2);
        assert_eq!(fs::read(out.join("ca.crt")).expect("ca.crt"), ca_before);
        let loaded = TlsMaterial::load(&TlsFiles::in_dir(&out, &arbiter)).expect("load");
        server_config(&loaded).expect("loaded material makes a server config");

        let error = write_certs(
            &out,
            &region("r2"),
            &[id("r2", Role::Agent, "a")],
            &ServerNames::default(),
        )
        .expect_err("CA of r1");
        assert!(matches!(error, TlsError::CaOfOtherRegion { .. }), "{error}");
        let error = write_certs(
            &out,
            &region("r1"),
            &[id("r2", Role::Agent, "a")],
            &ServerNames::default(),
        )
        .expect_err("identity of r2");
        assert!(matches!(error, TlsError::RegionMismatch { .. }), "{error}");
    }

    #[test]
    fn half_a_ca_is_refused_and_a_ca_is_never_overwritten() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::generate(&region("r1")).expect("CA");
        ca.write(dir.path()).expect("write CA");
        let error = ca.write(dir.path()).expect_err("second write");
        assert!(matches!(error, TlsError::CaExists { .. }), "{error}");

        fs::remove_file(dir.path().join("ca.key")).expect("remove key");
        let error = write_certs(
            dir.path(),
            &region("r1"),
            &[id("r1", Role::Agent, "a")],
            &ServerNames::default(),
        )
        .expect_err("key missing");
        assert!(matches!(error, TlsError::IncompleteCa { .. }), "{error}");
        assert!(error.to_string().contains("ca.key"), "{error}");
    }

    #[test]
    fn write_bundle_refuses_names_that_are_not_plain_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::generate(&region("r1")).expect("CA");
        let issued = ca
            .issue(&id("r1", Role::Agent, "a"), &[], &[])
            .expect("issue");
        for name in ["ca", "../x", "a/b", "", ".", ".."] {
            let error = write_bundle(dir.path(), name, &issued).expect_err(name);
            assert!(
                matches!(error, TlsError::BadFileName { .. }),
                "{name}: {error}"
            );
        }
    }

    #[test]
    fn load_errors_name_the_file_and_the_remedy() {
        let dir = tempfile::tempdir().expect("temp dir");
        let agent = id("r1", Role::Agent, "a");
        write_certs(
            dir.path(),
            &region("r1"),
            std::slice::from_ref(&agent),
            &ServerNames::default(),
        )
        .expect("write");
        let files = TlsFiles::in_dir(dir.path(), &agent);

        fs::write(&files.cert, "no pem here\n").expect("overwrite cert");
        let error = TlsMaterial::load(&files).expect_err("empty cert file");
        let message = error.to_string();
        assert!(matches!(error, TlsError::NoCertificate { .. }), "{message}");
        assert!(message.contains("agent-a.crt"), "{message}");
        assert!(message.contains("rollcall certs"), "{message}");

        fs::write(&files.key, "").expect("overwrite key");
        let files = TlsFiles {
            cert: files.ca.clone(),
            ..files
        };
        let error = TlsMaterial::load(&files).expect_err("empty key file");
        assert!(matches!(error, TlsError::NoKey { .. }), "{error}");
        assert!(error.to_string().contains("agent-a.key"), "{error}");

        let missing = TlsFiles {
            ca: dir.path().join("nope.crt"),
            ..files
        };
        let error = TlsMaterial::load(&missing).expect_err("missing CA");
        assert!(error.to_string().contains("nope.crt"), "{error}");
    }

    #[test]
    fn load_takes_a_bundle_and_checks_key_issuer_and_validity() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (agent, other) = (id("r1", Role::Agent, "a"), id("r1", Role::Agent, "b"));
        write_certs(
            dir.path(),
            &region("r1"),
            &[agent.clone(), other.clone()],
            &ServerNames::default(),
        )
        .expect("write");
        let files = TlsFiles::in_dir(dir.path(), &agent);
        let ca_pem = fs::read_to_string(&files.ca).expect("ca.crt");
        let second = Ca::generate(&region("r1")).expect("CA");
        let (second_pem, _) = second.to_pem();

        // A bundle of two CAs: both are trusted.
        fs::write(&files.ca, format!("{second_pem}{ca_pem}")).expect("bundle");
        let loaded = TlsMaterial::load(&files).expect("a bundle loads");
        assert_eq!(loaded.cas.len(), 2);
        // And `rollcall certs` keeps issuing from the CA of ca.key.
        let reread = Ca::read(dir.path()).expect("the bundle's CA of ca.key");
        assert_eq!(reread.cert_der(), &loaded.cas[1]);

        // A leaf in the bundle is refused, naming its place.
        let leaf_pem = fs::read_to_string(&files.cert).expect("leaf");
        fs::write(&files.ca, format!("{ca_pem}{leaf_pem}")).expect("bad bundle");
        let error = TlsMaterial::load(&files).expect_err("a leaf is no CA");
        assert!(
            matches!(error, TlsError::NotACa { position: 2, .. }),
            "{error}"
        );
        fs::write(&files.ca, &ca_pem).expect("restore");

        // Another identity's key.
        let mismatched = TlsFiles {
            key: TlsFiles::in_dir(dir.path(), &other).key,
            ..files.clone()
        };
        let error = TlsMaterial::load(&mismatched).expect_err("not its key");
        assert!(matches!(error, TlsError::KeyMismatch { .. }), "{error}");
        assert!(error.to_string().contains("agent-b.key"), "{error}");

        // A certificate no CA of the bundle signed.
        let strangers = dir.path().join("second.crt");
        fs::write(&strangers, &second_pem).expect("other CA");
        let untrusted = TlsFiles {
            ca: strangers,
            ..files.clone()
        };
        let error = TlsMaterial::load(&untrusted).expect_err("unknown issuer");
        assert!(matches!(error, TlsError::NotTrusted { .. }), "{error}");

        // An expired certificate (checked as of two years from now).
        let material = TlsMaterial::load(&files).expect("valid now");
        let later = SystemTime::now() + Duration::from_secs(2 * 365 * 24 * 3_600);
        let error = material.check(&files, later).expect_err("expired by then");
        assert!(matches!(error, TlsError::NotTrusted { .. }), "{error}");
        assert!(
            error.to_string().to_lowercase().contains("expired"),
            "{error}"
        );
    }

    #[test]
    fn install_crypto_provider_is_idempotent() {
        install_crypto_provider();
        install_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
