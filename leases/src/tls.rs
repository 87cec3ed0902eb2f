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

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, SystemTime};

use quinn::crypto::rustls::NoInitialCipherSuite;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::RootCertStore;

use crate::identity::{identity_from_cert_der, Identity, IdentityError};
use crate::name::Label;

mod ca;
mod https;
mod live;
pub mod revoked;
mod rotation;
mod watch;

pub use ca::{bundle_name, write_bundle, write_certs, Ca, IssuedCert, ServerNames, WrittenCerts};
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
mod tests;
