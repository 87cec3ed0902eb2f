//! TLS material that can be replaced while a process runs (issue 20): the
//! quinn configurations of every control-plane endpoint hold a `LiveTls`
//! as their certificate resolver and as their peer verifier, so a handshake
//! that starts after `replace` presents the new certificate and trusts the
//! new CA bundle, while connections already established keep what they
//! negotiated. Nothing here closes a connection: a session whose peer's
//! certificate expires is closed by its driver (`peer_certificate_expired`).
//!
//! It decides nothing about who may do what, and it reads no file: loading
//! is `TlsMaterial::load`'s, watching `watch`'s.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use serde::{Deserialize, Serialize};

use super::revoked::Revoked;
use super::{install_crypto_provider, roots, transport, TlsError, TlsMaterial};
use crate::identity::Identity;

/// The key of `chain`'s leaf, checked to be that leaf's.
pub(super) fn certified_key(
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
) -> Result<Arc<CertifiedKey>, rustls::Error> {
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain.to_vec(), key.clone_key(), &provider).map(Arc::new)
}

/// One certificate's validity, as operators read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertStatus {
    /// Its serial number, hex (tells a renewed certificate from the one it
    /// replaced).
    pub serial: String,
    /// Its notAfter, RFC 3339 in UTC.
    pub not_after: String,
    /// Its notAfter in seconds since the Unix epoch.
    pub not_after_unix_s: i64,
}

impl CertStatus {
    /// The validity of a DER certificate; `None` when it does not parse
    /// (material that loaded always does).
    pub fn of(der: &[u8]) -> Option<CertStatus> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let not_after_unix_s = cert.validity().not_after.timestamp();
        Some(CertStatus {
            serial: cert.raw_serial_as_string(),
            not_after: rfc3339(not_after_unix_s),
            not_after_unix_s,
        })
    }

    /// Seconds from `now_unix_s` until it expires (negative once it has).
    pub fn expires_in_s(&self, now_unix_s: i64) -> i64 {
        self.not_after_unix_s - now_unix_s
    }
}

/// `unix_s` as RFC 3339 in UTC, to the second.
fn rfc3339(unix_s: i64) -> String {
    chrono::DateTime::from_timestamp(unix_s, 0).map_or_else(
        || format!("{unix_s} s after the Unix epoch"),
        |at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// What a process presents and trusts now: `/v1/status`'s `tls` object,
/// and the source of the `…_certificate_expiry_seconds` metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsStatus {
    /// The identity its certificate names (`rollcall://region/role/name`).
    pub identity: String,
    /// Its own certificate (the leaf).
    pub leaf: CertStatus,
    /// Every CA of the bundle it trusts, in file order.
    pub cas: Vec<CertStatus>,
}

impl TlsStatus {
    fn of(material: &TlsMaterial, identity: &Identity) -> TlsStatus {
        TlsStatus {
            identity: identity.to_uri(),
            leaf: material
                .cert_chain
                .first()
                .and_then(|leaf| CertStatus::of(leaf))
                .unwrap_or_else(|| CertStatus {
                    serial: String::new(),
                    not_after: rfc3339(0),
                    not_after_unix_s: 0,
                }),
            cas: material
                .cas
                .iter()
                .filter_map(|ca| CertStatus::of(ca))
                .collect(),
        }
    }
}

/// What one handshake uses: built whole, swapped whole.
struct Loaded {
    identity: Identity,
    certified: Arc<CertifiedKey>,
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<WebPkiServerVerifier>,
    status: TlsStatus,
    revoked: Revoked,
}

impl Loaded {
    fn new(material: &TlsMaterial) -> Result<Loaded, TlsError> {
        install_crypto_provider();
        let identity = material.identity()?;
        let certified = certified_key(&material.cert_chain, &material.key).map_err(|reason| {
            TlsError::Rustls {
                what: "certificate and key",
                reason,
            }
        })?;
        let roots = Arc::new(roots(&material.cas)?);
        let clients = WebPkiClientVerifier::builder(roots.clone())
            .build()
            .map_err(TlsError::Verifier)?;
        let servers = WebPkiServerVerifier::builder(roots)
            .build()
            .map_err(TlsError::Verifier)?;
        Ok(Loaded {
            status: TlsStatus::of(material, &identity),
            identity,
            certified,
            clients,
            servers,
            revoked: material.revoked.clone(),
        })
    }
}

/// A process's certificate, key and CA bundle, replaceable at run time;
/// the resolver and verifier of every quinn configuration made from it.
pub struct LiveTls {
    loaded: ArcSwap<Loaded>,
    /// Counts replacements, so connection drivers waiting on
    /// [`LiveTls::peer_revoked`] look at the deny list again.
    replaced: tokio::sync::watch::Sender<u64>,
}

impl fmt::Debug for LiveTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveTls")
            .field("identity", &self.loaded.load().identity.to_uri())
            .finish_non_exhaustive()
    }
}

impl LiveTls {
    /// Holds `material` (its key must be its certificate's).
    pub fn new(material: &TlsMaterial) -> Result<Arc<LiveTls>, TlsError> {
        Ok(Arc::new(LiveTls {
            loaded: ArcSwap::from_pointee(Loaded::new(material)?),
            replaced: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// Replaces the material for every handshake from now on; connections
    /// already established are not touched. Refused, changing nothing,
    /// when `material` names another identity (`cert` is the file named in
    /// that error).
    pub fn replace(
        &self,
        material: &TlsMaterial,
        cert: &std::path::Path,
    ) -> Result<TlsStatus, TlsError> {
        let loaded = Loaded::new(material)?;
        let running = self.identity();
        if loaded.identity != running {
            return Err(TlsError::IdentityChanged {
                cert: cert.to_owned(),
                running: Box::new(running),
                found: Box::new(loaded.identity),
            });
        }
        let status = loaded.status.clone();
        self.loaded.store(Arc::new(loaded));
        self.replaced.send_modify(|n| *n += 1);
        Ok(status)
    }

    /// Why `leaf` may not be used, if the current deny list revokes it.
    pub fn revoked(&self, leaf: &CertificateDer<'_>) -> Result<(), String> {
        self.loaded.load().revoked.check(leaf)
    }

    /// Resolves, with the reason to close it with, once the material in
    /// use revokes the certificate `conn`'s peer presented (at once when it
    /// already does); never when the peer presented none. Every driver of
    /// a long-lived connection waits on this beside its streams.
    pub async fn peer_revoked(&self, conn: &quinn::Connection) -> String {
        let leaf = super::peer_chain(conn).and_then(|chain| chain.into_iter().next());
        let Some(leaf) = leaf else {
            return std::future::pending().await;
        };
        let mut replaced = self.replaced.subscribe();
        loop {
            if let Err(reason) = self.revoked(&leaf) {
                return reason;
            }
            if replaced.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// The identity this process runs as.
    pub fn identity(&self) -> Identity {
        self.loaded.load().identity.clone()
    }

    /// What it presents and trusts now.
    pub fn status(&self) -> TlsStatus {
        self.loaded.load().status.clone()
    }

    /// Whether a client certificate chain is valid under the CAs trusted
    /// now (for a second check after the handshake, as the region bridge
    /// does per peer region).
    pub fn verify_client(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        let loaded = self.loaded.load();
        loaded
            .clients
            .verify_client_cert(leaf, intermediates, UnixTime::now())?;
        loaded.revoked.check(leaf).map_err(rustls::Error::General)
    }

    /// A QUIC server configuration for a control-plane listener: presents
    /// the current certificate, requires every client to present one signed
    /// by a CA of the current bundle, negotiates `alpn` over TLS 1.3 only,
    /// with the shared keep-alive and idle timeout. 0-RTT is off:
    /// replayable early data has no place in a control plane.
    pub fn server_config(self: &Arc<Self>, alpn: &[u8]) -> Result<quinn::ServerConfig, TlsError> {
        install_crypto_provider();
        let mut tls =
            rustls::ServerConfig::builder_with_protocol_versions(&[&rustls::version::TLS13])
                .with_client_cert_verifier(self.clone())
                .with_cert_resolver(self.clone());
        tls.alpn_protocols = vec![alpn.to_vec()];
        let quic = QuicServerConfig::try_from(tls).map_err(TlsError::NoInitialCipherSuite)?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        config.transport_config(transport());
        Ok(config)
    }

    /// A QUIC client configuration: trusts the current bundle's CAs to
    /// vouch for servers, presents the current certificate, negotiates
    /// `alpn` over TLS 1.3, with the same transport settings.
    pub fn client_config(self: &Arc<Self>, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        install_crypto_provider();
        let mut tls =
            rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS13])
                .dangerous()
                .with_custom_certificate_verifier(self.clone())
                .with_client_cert_resolver(self.clone());
        tls.alpn_protocols = vec![alpn.to_vec()];
        let quic = QuicClientConfig::try_from(tls).map_err(TlsError::NoInitialCipherSuite)?;
        let mut config = quinn::ClientConfig::new(Arc::new(quic));
        config.transport_config(transport());
        Ok(config)
    }
}

/// The signature checks both verifier traits share, handed to the
/// current verifier `$verifier` of `Loaded` (they depend on the crypto
/// provider only, never on the CAs).
macro_rules! signatures_of {
    ($verifier:ident) => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.loaded
                .load()
                .$verifier
                .verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.loaded
                .load()
                .$verifier
                .verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.loaded.load().$verifier.supported_verify_schemes()
        }
    };
}

impl ResolvesServerCert for LiveTls {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.loaded.load().certified.clone())
    }
}

impl ResolvesClientCert for LiveTls {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.loaded.load().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The current bundle's WebPKI verifier, looked up per handshake.
impl ClientCertVerifier for LiveTls {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Every client holds one certificate: hints would choose nothing.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let loaded = self.loaded.load();
        let verified = loaded
            .clients
            .verify_client_cert(end_entity, intermediates, now)?;
        loaded
            .revoked
            .check(end_entity)
            .map_err(rustls::Error::General)?;
        Ok(verified)
    }

    signatures_of!(clients);
}

impl ServerCertVerifier for LiveTls {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let loaded = self.loaded.load();
        let verified = loaded.servers.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        loaded
            .revoked
            .check(end_entity)
            .map_err(rustls::Error::General)?;
        Ok(verified)
    }

    signatures_of!(servers);
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;
    use crate::endpoint::Role;
    use crate::name::{Label, PrincipalName};
    use crate::tls::{peer_certificate_expired, Ca, ALPN};

    /// Bounds every network step so a refused handshake fails the step
    /// instead of hanging the test.
    const STEP: Duration = Duration::from_secs(20);

    fn ca() -> Ca {
        Ca::generate(&Label::new("r1").unwrap()).unwrap()
    }

    fn id(role: Role, name: &str) -> Identity {
        Identity::new(
            Label::new("r1").unwrap(),
            role,
            PrincipalName::new(name).unwrap(),
        )
    }

    /// A certificate from `issuer`, trusting every CA of `trusted`.
    fn material(issuer: &Ca, trusted: &[&Ca], identity: &Identity) -> TlsMaterial {
        let issued = issuer.issue(identity, &[], &[]).unwrap();
        TlsMaterial {
            cas: trusted.iter().map(|ca| ca.cert_der().clone()).collect(),
            ..TlsMaterial::from_issued(issuer, &issued)
        }
    }

    /// An echo server over `live`: every stream of every connection gets
    /// its bytes back. With `close_on_expiry`, each connection is closed
    /// when its peer's certificate expires, as the arbiter does.
    fn echo_server(live: &Arc<LiveTls>, close_on_expiry: bool) -> SocketAddr {
        let endpoint = quinn::Endpoint::server(
            live.server_config(ALPN).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap();
        let addr = endpoint.local_addr().unwrap();
        tokio::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    let streams = async {
                        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                            let Ok(bytes) = recv.read_to_end(64).await else {
                                return;
                            };
                            let _ = send.write_all(&bytes).await;
                            let _ = send.finish();
                        }
                    };
                    tokio::select! {
                        _ = streams => {}
                        reason = peer_certificate_expired(&conn), if close_on_expiry => {
                            conn.close(1u32.into(), reason.as_bytes());
                        }
                    }
                });
            }
        });
        addr
    }

    /// A connection to `addr` presenting `client`'s material.
    async fn connect(client: &Arc<LiveTls>, addr: SocketAddr) -> Result<quinn::Connection, String> {
        let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        endpoint.set_default_client_config(client.client_config(ALPN).unwrap());
        let connecting = endpoint
            .connect(addr, "localhost")
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(STEP, connecting)
            .await
            .map_err(|_| "handshake timed out".to_owned())?
            .map_err(|e| e.to_string())
    }

    /// One echo over a new stream of `conn` (a server that refused the
    /// client's certificate has closed the connection by then).
    async fn echo(conn: &quinn::Connection) -> Result<(), String> {
        let exchange = async {
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            send.write_all(b"ping").await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())?;
            let back = recv.read_to_end(64).await.map_err(|e| e.to_string())?;
            if back == b"ping" {
                Ok(())
            } else {
                Err(format!("echoed {back:?}"))
            }
        };
        tokio::time::timeout(STEP, exchange)
            .await
            .map_err(|_| "no echo in time".to_owned())?
    }

    async fn session(client: &Arc<LiveTls>, addr: SocketAddr) -> Result<quinn::Connection, String> {
        let conn = connect(client, addr).await?;
        echo(&conn).await?;
        Ok(conn)
    }

    #[tokio::test]
    async fn a_ca_rotation_changes_new_handshakes_and_keeps_established_sessions() {
        let (old, new) = (ca(), ca());
        let server_id = id(Role::Arbiter, "arb-1");
        let server = LiveTls::new(&material(&old, &[&old], &server_id)).unwrap();
        let addr = echo_server(&server, false);
        let established = session(
            &LiveTls::new(&material(&old, &[&old], &id(Role::Agent, "n1"))).unwrap(),
            addr,
        )
        .await
        .expect("a client of the old CA gets in");
        let of_new = LiveTls::new(&material(&new, &[&new, &old], &id(Role::Agent, "n2"))).unwrap();
        assert!(
            session(&of_new, addr).await.is_err(),
            "the new CA is not trusted yet"
        );

        // Step 1 and 2: the server trusts both, and presents a certificate
        // of the new CA.
        let replaced = server
            .replace(
                &material(&new, &[&new, &old], &server_id),
                std::path::Path::new("arb.crt"),
            )
            .unwrap();
        assert_eq!(replaced.cas.len(), 2);
        assert_eq!(server.status(), replaced);
        session(&of_new, addr)
            .await
            .expect("a client of the new CA gets in");
        let of_old_with_bundle =
            LiveTls::new(&material(&old, &[&new, &old], &id(Role::Agent, "n3"))).unwrap();
        session(&of_old_with_bundle, addr)
            .await
            .expect("a client of the old CA still gets in during the rotation");
        echo(&established)
            .await
            .expect("the established session is untouched");

        // Step 3: the old CA retired. New handshakes of its clients fail;
        // the established session stays.
        server
            .replace(
                &material(&new, &[&new], &server_id),
                std::path::Path::new("arb.crt"),
            )
            .unwrap();
        assert!(session(&of_old_with_bundle, addr).await.is_err());
        session(&of_new, addr).await.expect("the new CA's client");
        echo(&established).await.expect("still untouched");
    }

    #[test]
    fn a_replace_never_changes_who_the_process_is() {
        let ca = ca();
        let live = LiveTls::new(&material(&ca, &[&ca], &id(Role::Agent, "n1"))).unwrap();
        let before = live.status();
        let error = live
            .replace(
                &material(&ca, &[&ca], &id(Role::Agent, "n2")),
                std::path::Path::new("agent-n2.crt"),
            )
            .unwrap_err();
        assert!(matches!(error, TlsError::IdentityChanged { .. }), "{error}");
        assert!(error.to_string().contains("agent-n2.crt"), "{error}");
        assert_eq!(live.status(), before, "nothing changed");
    }

    #[tokio::test]
    async fn a_session_is_closed_with_the_reason_when_its_peer_certificate_expires() {
        let ca = ca();
        let server = LiveTls::new(&material(&ca, &[&ca], &id(Role::Arbiter, "arb-1"))).unwrap();
        let addr = echo_server(&server, true);
        let agent = id(Role::Agent, "n1");
        let short = ca
            .issue_for(&agent, &[], &[], Duration::from_secs(2))
            .unwrap();
        let client = LiveTls::new(&TlsMaterial::from_issued(&ca, &short)).unwrap();
        let conn = session(&client, addr)
            .await
            .expect("valid for two more seconds");
        let closed = tokio::time::timeout(STEP, conn.closed())
            .await
            .expect("closed once the certificate expired");
        let reason = closed.to_string();
        assert!(reason.contains("rollcall://r1/agent/n1"), "{reason}");
        assert!(reason.contains("expired at"), "{reason}");
        assert!(
            session(&client, addr).await.is_err(),
            "and cannot come back"
        );
    }

    #[test]
    fn status_names_the_identity_and_every_certificate() {
        let (a, b) = (ca(), ca());
        let live = LiveTls::new(&material(&a, &[&a, &b], &id(Role::Agent, "n1"))).unwrap();
        let status = live.status();
        assert_eq!(status.identity, "rollcall://r1/agent/n1");
        assert_eq!(status.cas.len(), 2);
        assert_ne!(status.cas[0].serial, status.cas[1].serial);
        let now = crate::clock::now_ms() as i64 / 1_000;
        let left = status.leaf.expires_in_s(now);
        assert!(
            (89 * 86_400..=90 * 86_400).contains(&left),
            "90 days: {left} s"
        );
        assert!(
            status.leaf.not_after.ends_with('Z'),
            "{}",
            status.leaf.not_after
        );
    }
}
