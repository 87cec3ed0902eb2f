//! Mutual TLS between bridges (R10). Each bridge presents its own region's
//! `bridge` certificate. It trusts each peer region's CA for that region's
//! bridge only: a dialled peer must present a certificate of the region it
//! was dialled as, signed by that region's CA; an accepted peer must name
//! a configured peer region and is verified again against that region's
//! CA alone, so one region's CA can never vouch for another region. Only
//! the `bridge` role is accepted: an agent, arbiter, controller or operator
//! certificate is refused with the reason in the close frame.
//!
//! This module authenticates; it holds no protocol logic.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;

use rollcall_config::{BridgeConfig, TlsPaths};
use rollcall_leases::identity::{identity_from_cert_der, Identity};
use rollcall_leases::tls::{self as leases_tls, TlsError, TlsFiles, TlsMaterial};
use rollcall_leases::{Label, Role};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::error::BridgeError;

/// The ALPN protocol of bridge links; an arbiter's or agent's endpoint
/// speaks another, so a misdirected connection fails its handshake.
pub const ALPN: &[u8] = b"rollcall-bridge/1";

/// The largest CA file read.
const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;

/// A bridge's TLS material: its own certificate and region CA, and each
/// peer region's CA.
#[derive(Debug)]
pub struct BridgeTls {
    /// This bridge's certificate, key and its own region's CA.
    pub material: TlsMaterial,
    /// Each peer region's CA certificate.
    pub peer_cas: BTreeMap<Label, CertificateDer<'static>>,
}

impl BridgeTls {
    /// Reads `[tls]` and every `[[peers]]` CA file of `config`, and checks
    /// that the certificate names a bridge of the configured region.
    pub fn load(config: &BridgeConfig) -> Result<BridgeTls, BridgeError> {
        let TlsPaths { ca, cert, key } = config.tls.clone().ok_or_else(|| {
            BridgeError::Config(
                "bridge.tls is not set: issue a certificate with `rollcall certs --bridge NAME` and name it in [tls] (ca, cert, key)".to_owned(),
            )
        })?;
        let material = TlsMaterial::load(&TlsFiles { ca, cert, key })?;
        let mut peer_cas = BTreeMap::new();
        for peer in &config.peers {
            let region =
                Label::new(&peer.region).map_err(|e| BridgeError::Config(e.to_string()))?;
            let bad = |detail: String| BridgeError::PeerCa {
                region: peer.region.clone(),
                path: peer.ca.clone(),
                detail,
            };
            let mut bytes = Vec::new();
            std::fs::File::open(&peer.ca)
                .and_then(|f| f.take(MAX_CA_FILE_BYTES + 1).read_to_end(&mut bytes))
                .map_err(|e| bad(e.to_string()))?;
            if bytes.len() as u64 > MAX_CA_FILE_BYTES {
                return Err(bad(format!("larger than {MAX_CA_FILE_BYTES} bytes")));
            }
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<_, _>>()
                .map_err(|e| bad(format!("not valid PEM ({e})")))?;
            match <[CertificateDer<'static>; 1]>::try_from(certs) {
                Ok([ca]) => {
                    peer_cas.insert(region, ca);
                }
                Err(certs) => {
                    return Err(bad(format!(
                        "holds {} certificates; exactly one (the region's CA) is expected",
                        certs.len()
                    )))
                }
            }
        }
        let tls = BridgeTls { material, peer_cas };
        let identity = tls.identity()?;
        if identity.principal.role != Role::Bridge || identity.region.as_str() != config.region {
            return Err(BridgeError::Config(format!(
                "bridge.tls.cert names {identity}, not a bridge of region {}; issue one with `rollcall certs --region {} --bridge {}`",
                config.region, config.region, config.name
            )));
        }
        Ok(tls)
    }

    /// The identity this bridge's certificate names.
    pub fn identity(&self) -> Result<Identity, TlsError> {
        self.material.identity()
    }

    /// The QUIC server configuration peers dial: requires a client
    /// certificate signed by this region's CA or a peer region's CA (who
    /// may then speak is `PeerCheck::accepted`'s decision).
    pub fn server_config(&self) -> Result<quinn::ServerConfig, BridgeError> {
        let mut roots = roots(&self.material.ca_der)?;
        for ca in self.peer_cas.values() {
            add_root(&mut roots, ca)?;
        }
        Ok(leases_tls::server_config_with(&self.material, roots, ALPN)?)
    }

    /// The QUIC client configuration for dialling `region`'s bridge: that
    /// region's CA is the only one trusted to vouch for the server.
    pub fn client_config(&self, region: &Label) -> Result<quinn::ClientConfig, BridgeError> {
        let ca = self.peer_cas.get(region).ok_or_else(|| {
            BridgeError::Config(format!("no CA is configured for peer region {region}"))
        })?;
        Ok(leases_tls::client_config_with(
            &self.material,
            roots(ca)?,
            ALPN,
        )?)
    }
}

/// Decides who may speak on an accepted connection.
pub struct PeerCheck {
    own: Label,
    verifiers: BTreeMap<Label, Arc<dyn ClientCertVerifier>>,
}

impl PeerCheck {
    /// One verifier per peer region, each trusting that region's CA alone.
    pub fn new(tls: &BridgeTls, own: Label) -> Result<PeerCheck, BridgeError> {
        leases_tls::install_crypto_provider();
        let mut verifiers = BTreeMap::new();
        for (region, ca) in &tls.peer_cas {
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots(ca)?))
                .build()
                .map_err(TlsError::Verifier)?;
            verifiers.insert(region.clone(), verifier);
        }
        Ok(PeerCheck { own, verifiers })
    }

    /// The peer of an accepted connection, when it is a bridge of a peer
    /// region whose certificate that region's CA signed; else why not (the
    /// reason to close with).
    pub fn accepted(&self, conn: &quinn::Connection) -> Result<Identity, String> {
        let chain = peer_chain(conn)?;
        let (leaf, intermediates) = chain.split_first().ok_or("no certificate was presented")?;
        let identity = identity_from_cert_der(leaf).map_err(|e| e.to_string())?;
        if identity.principal.role != Role::Bridge {
            return Err(format!(
                "{identity} is not a bridge: only region bridges sync here (role {} refused)",
                identity.principal.role.as_str()
            ));
        }
        if identity.region == self.own {
            return Err(format!(
                "{identity} is of this bridge's own region {}: only other regions' bridges sync here",
                self.own
            ));
        }
        let verifier = self.verifiers.get(&identity.region).ok_or_else(|| {
            format!(
                "{identity} is of region {}, which is not among this bridge's peers",
                identity.region
            )
        })?;
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| {
                format!(
                    "{identity} is not signed by region {}'s CA: {e}",
                    identity.region
                )
            })?;
        Ok(identity)
    }
}

/// The peer of a dialled connection, when it is the bridge of `region`
/// (the handshake already checked that `region`'s CA signed it).
pub fn dialed(conn: &quinn::Connection, region: &Label) -> Result<Identity, String> {
    let identity = leases_tls::peer_identity(conn).map_err(|e| e.to_string())?;
    if identity.principal.role != Role::Bridge || identity.region != *region {
        return Err(format!(
            "the server's certificate names {identity}, not a bridge of region {region}"
        ));
    }
    Ok(identity)
}

fn peer_chain(conn: &quinn::Connection) -> Result<Vec<CertificateDer<'static>>, String> {
    conn.peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .map(|chain| *chain)
        .ok_or_else(|| "no certificate was presented".to_owned())
}

fn roots(ca: &CertificateDer<'static>) -> Result<RootCertStore, BridgeError> {
    let mut roots = RootCertStore::empty();
    add_root(&mut roots, ca)?;
    Ok(roots)
}

fn add_root(roots: &mut RootCertStore, ca: &CertificateDer<'static>) -> Result<(), BridgeError> {
    roots.add(ca.clone()).map_err(|reason| {
        BridgeError::Tls(TlsError::Rustls {
            what: "CA certificate",
            reason,
        })
    })
}
