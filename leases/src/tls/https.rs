//! HTTPS over the same live material (issue 38, item 4): the arbiter's
//! admin port answers TLS beside plain HTTP, presenting the replica's
//! certificate and taking a client certificate when one is offered (the
//! region bridge presents its own); the bridge dials it with its
//! certificate and trusts its region's CAs. Both hold the `LiveTls`, so a
//! reload reaches them like the QUIC endpoints, deny list included.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::install_crypto_provider;
use super::live::LiveTls;

/// The ALPN id of HTTP/1.1 over TLS.
pub const HTTP1_ALPN: &[u8] = b"http/1.1";

/// `LiveTls`'s client verification with the certificate optional: a
/// client that offers one must pass every check, one that offers none is
/// served as on plain HTTP (by its token alone).
#[derive(Debug)]
struct Optional(Arc<LiveTls>);

impl ClientCertVerifier for Optional {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ClientCertVerifier::supported_verify_schemes(self.0.as_ref())
    }
}

impl LiveTls {
    /// A TLS server configuration for an HTTP/1.1 listener: presents the
    /// current certificate, verifies a client certificate when one is
    /// offered (CA bundle and deny list as they are at each handshake).
    pub fn https_server_config(self: &Arc<Self>) -> Arc<rustls::ServerConfig> {
        install_crypto_provider();
        let mut tls = rustls::ServerConfig::builder()
            .with_client_cert_verifier(Arc::new(Optional(self.clone())))
            .with_cert_resolver(self.clone());
        tls.alpn_protocols = vec![HTTP1_ALPN.to_vec()];
        Arc::new(tls)
    }

    /// A TLS client configuration for HTTP/1.1: trusts the current CA
    /// bundle to vouch for the server (deny list included) and presents
    /// the current certificate.
    pub fn https_client_config(self: &Arc<Self>) -> Arc<rustls::ClientConfig> {
        install_crypto_provider();
        let mut tls = rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(self.clone())
            .with_client_cert_resolver(self.clone());
        tls.alpn_protocols = vec![HTTP1_ALPN.to_vec()];
        Arc::new(tls)
    }
}

/// The identity a verified TLS peer's leaf certificate names, if it
/// presented one that names a rollcall identity.
pub fn identity_of(
    certificates: Option<&[CertificateDer<'_>]>,
) -> Option<crate::identity::Identity> {
    let leaf = certificates?.first()?;
    crate::identity::identity_from_cert_der(leaf).ok()
}
