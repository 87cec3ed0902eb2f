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
use std::path::PathBuf;
use std::sync::Arc;

use rollcall_config::{BridgeConfig, TlsPaths};
use rollcall_leases::identity::{identity_from_cert_der, Identity};
use rollcall_leases::tls::{
    self as leases_tls, LiveTls, Reload, TlsError, TlsFiles, TlsMaterial, TlsStatus,
};
use rollcall_leases::{Label, Role};
use rustls::pki_types::CertificateDer;

use crate::error::BridgeError;

/// The ALPN protocol of bridge links; an arbiter's or agent's endpoint
/// speaks another, so a misdirected connection fails its handshake.
pub const ALPN: &[u8] = b"rollcall-bridge/1";

/// A bridge's TLS material as loaded: its own certificate and region CA
/// bundle, and each peer region's CA bundle (one CA, or two while that
/// region rotates its CA).
#[derive(Debug)]
pub struct BridgeTls {
    /// This bridge's certificate, key and its own region's CA bundle.
    pub material: TlsMaterial,
    /// Each peer region's CA bundle.
    pub peer_cas: BTreeMap<Label, Vec<CertificateDer<'static>>>,
}

impl BridgeTls {
    /// Reads `[tls]` and every `[[peers]]` CA file of `config`, and checks
    /// that the certificate names a bridge of the configured region.
    pub fn load(config: &BridgeConfig) -> Result<BridgeTls, BridgeError> {
        let TlsPaths { ca, cert, key, .. } = config.tls.clone().ok_or_else(|| {
            BridgeError::Config(
                "bridge.tls is not set: issue a certificate with `rollcall certs --bridge NAME` and name it in [tls] (ca, cert, key)".to_owned(),
            )
        })?;
        let material = TlsMaterial::load(&TlsFiles { ca, cert, key })?;
        let mut peer_cas = BTreeMap::new();
        for peer in &config.peers {
            let region =
                Label::new(&peer.region).map_err(|e| BridgeError::Config(e.to_string()))?;
            let cas = leases_tls::read_ca_bundle(&peer.ca).map_err(|e| BridgeError::PeerCa {
                region: peer.region.clone(),
                path: peer.ca.clone(),
                detail: e.to_string(),
            })?;
            peer_cas.insert(region, cas);
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

    /// This bridge's certificate trusting `cas`.
    fn trusting(&self, cas: Vec<CertificateDer<'static>>) -> TlsMaterial {
        TlsMaterial {
            cas,
            cert_chain: self.material.cert_chain.clone(),
            key: self.material.key.clone_key(),
            revoked: self.material.revoked.clone(),
        }
    }

    /// What the listener trusts: this region's CAs and every peer
    /// region's (who may then speak is `PeerCheck::accepted`'s decision).
    fn listener(&self) -> TlsMaterial {
        let mut cas = self.material.cas.clone();
        cas.extend(self.peer_cas.values().flatten().cloned());
        self.trusting(cas)
    }

    /// What dialling `region`'s bridge trusts: that region's CAs alone.
    fn dialer(&self, region: &Label) -> Result<TlsMaterial, BridgeError> {
        let cas = self.peer_cas.get(region).ok_or_else(|| {
            BridgeError::Config(format!("no CA is configured for peer region {region}"))
        })?;
        Ok(self.trusting(cas.clone()))
    }

    /// A QUIC server configuration over this material as it is (the
    /// bridge itself serves from `LiveBridgeTls`, which can be replaced).
    pub fn server_config(&self) -> Result<quinn::ServerConfig, BridgeError> {
        Ok(LiveTls::new(&self.listener())?.server_config(ALPN)?)
    }

    /// A QUIC client configuration for dialling `region`'s bridge over
    /// this material as it is.
    pub fn client_config(&self, region: &Label) -> Result<quinn::ClientConfig, BridgeError> {
        Ok(LiveTls::new(&self.dialer(region)?)?.client_config(ALPN)?)
    }
}

/// A running bridge's TLS material, replaceable while it runs: the
/// listener's (trusting this region's and every peer region's CAs) and,
/// per peer region, the dialler's (trusting that region's CAs alone).
#[derive(Debug)]
pub struct LiveBridgeTls {
    listener: Arc<LiveTls>,
    dialers: BTreeMap<Label, Arc<LiveTls>>,
    /// Dialling this region's arbiter (its admin API over HTTPS): this
    /// region's CAs alone.
    home: Arc<LiveTls>,
}

impl LiveBridgeTls {
    /// Holds `tls`.
    pub fn new(tls: &BridgeTls) -> Result<LiveBridgeTls, BridgeError> {
        let mut dialers = BTreeMap::new();
        for region in tls.peer_cas.keys() {
            dialers.insert(region.clone(), LiveTls::new(&tls.dialer(region)?)?);
        }
        Ok(LiveBridgeTls {
            listener: LiveTls::new(&tls.listener())?,
            dialers,
            home: LiveTls::new(&tls.trusting(tls.material.cas.clone()))?,
        })
    }

    /// Replaces the material for every handshake from now on (the peer
    /// regions stay those of the config the bridge started with).
    pub fn replace(
        &self,
        tls: &BridgeTls,
        cert: &std::path::Path,
    ) -> Result<TlsStatus, BridgeError> {
        // Everything is built before anything is swapped.
        let dialers = self
            .dialers
            .keys()
            .map(|region| tls.dialer(region).map(|material| (region, material)))
            .collect::<Result<Vec<_>, _>>()?;
        let status = self.listener.replace(&tls.listener(), cert)?;
        self.home
            .replace(&tls.trusting(tls.material.cas.clone()), cert)?;
        for (region, material) in dialers {
            if let Some(live) = self.dialers.get(region) {
                live.replace(&material, cert)?;
            }
        }
        Ok(status)
    }

    /// What the listener presents and trusts now.
    pub fn status(&self) -> TlsStatus {
        self.listener.status()
    }

    /// The listener's QUIC server configuration.
    pub fn server_config(&self) -> Result<quinn::ServerConfig, BridgeError> {
        Ok(self.listener.server_config(ALPN)?)
    }

    /// The TLS client configuration for this region's arbiter admin API
    /// (HTTPS): presents this bridge's certificate, trusts this region's
    /// CAs; reloads reach it.
    pub fn arbiter_config(&self) -> Arc<rustls::ClientConfig> {
        self.home.https_client_config()
    }

    /// The QUIC client configuration for dialling `region`'s bridge.
    pub fn client_config(&self, region: &Label) -> Result<quinn::ClientConfig, BridgeError> {
        let live = self.dialers.get(region).ok_or_else(|| {
            BridgeError::Config(format!("no CA is configured for peer region {region}"))
        })?;
        Ok(live.client_config(ALPN)?)
    }
}

/// The bridge's `tls::Reload`: its config's `[tls]` and `[[peers]] ca`
/// files.
pub struct BridgeReload {
    /// The config the bridge runs with.
    pub config: BridgeConfig,
    /// Its material.
    pub live: Arc<LiveBridgeTls>,
}

impl Reload for BridgeReload {
    fn files(&self) -> Vec<PathBuf> {
        let own = self.config.tls.iter().flat_map(|t| {
            [
                t.ca.clone(),
                t.cert.clone(),
                t.key.clone(),
                rollcall_leases::tls::revoked::beside(&t.ca),
            ]
        });
        own.chain(self.config.peers.iter().map(|p| p.ca.clone()))
            .collect()
    }

    fn reload(&self) -> Result<TlsStatus, Box<dyn std::error::Error + Send + Sync>> {
        let tls = BridgeTls::load(&self.config)?;
        let cert = self
            .config
            .tls
            .as_ref()
            .map(|t| t.cert.clone())
            .unwrap_or_default();
        Ok(self.live.replace(&tls, &cert)?)
    }

    fn status(&self) -> TlsStatus {
        self.live.status()
    }
}

/// Decides who may speak on an accepted connection.
pub struct PeerCheck {
    own: Label,
    live: Arc<LiveBridgeTls>,
}

impl PeerCheck {
    /// Checks accepted peers against `live`'s CAs of their region, as they
    /// are at each check.
    pub fn new(live: Arc<LiveBridgeTls>, own: Label) -> PeerCheck {
        PeerCheck { own, live }
    }

    /// Resolves, with the reason, once the deny list this bridge holds
    /// (its own `revoked.txt`, reloaded with its TLS files) names the
    /// certificate `conn`'s peer presented: a session already up is
    /// closed at the reload, not at the next handshake (issue 38, item 6).
    pub async fn revoked(&self, conn: &quinn::Connection) -> String {
        // Every dialler holds the same deny list as the listener.
        self.live.listener.peer_revoked(conn).await
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
        let verifier = self.live.dialers.get(&identity.region).ok_or_else(|| {
            format!(
                "{identity} is of region {}, which is not among this bridge's peers",
                identity.region
            )
        })?;
        verifier.verify_client(leaf, intermediates).map_err(|e| {
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
