//! One admin call over HTTPS (issue 38, item 4): the bridge presents its
//! own certificate, trusts its region's CAs, and talks only to a server
//! whose certificate names an arbiter of its region. One connection per
//! call: the bridge makes a few calls a second at most, and a fresh
//! handshake each time picks up a reloaded certificate at once.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use reqwest::Method;
use rollcall_leases::{Label, Role};

/// Largest answer read (a region's summaries or views in JSON).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The bridge's HTTPS client to its region's arbiter replicas.
pub struct Https {
    config: Arc<rustls::ClientConfig>,
    region: Label,
}

impl Https {
    /// A client presenting and trusting what `config` holds, talking only to
    /// arbiters of `region`.
    pub fn new(config: Arc<rustls::ClientConfig>, region: Label) -> Https {
        Https { config, region }
    }

    /// `method path` on the replica at `addr` (`host:port`; the host is
    /// the name its certificate must carry) with `token` and a JSON
    /// `body`: the status and the answer's bytes, or why there is none,
    /// within `timeout`.
    pub async fn call(
        &self,
        addr: &str,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), String> {
        match tokio::time::timeout(timeout, self.exchange(addr, method, path, token, body)).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        }
    }

    async fn exchange(
        &self,
        addr: &str,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Vec<u8>), String> {
        let host = addr
            .rsplit_once(':')
            .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
            .ok_or_else(|| format!("{addr:?} is not host:port"))?;
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host:?} cannot be a TLS server name: {e}"))?;
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let server = rollcall_leases::tls::identity_of(tls.get_ref().1.peer_certificates());
        match server {
            Some(id) if id.principal.role == Role::Arbiter && id.region == self.region => {}
            other => {
                let named = other.map_or_else(|| "no identity".to_owned(), |id| id.to_string());
                return Err(format!(
                    "its certificate names {named}, not an arbiter of region {}",
                    self.region
                ));
            }
        }
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr)
            .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(axum::body::Body::from(body.unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        let answer = sender.send_request(request).await;
        let outcome = match answer {
            Ok(response) => {
                let status = response.status().as_u16();
                axum::body::to_bytes(
                    axum::body::Body::new(response.into_body()),
                    MAX_ANSWER_BYTES,
                )
                .await
                .map(|bytes| (status, bytes.to_vec()))
                .map_err(|e| format!("reading the answer: {e}"))
            }
            Err(e) => Err(e.to_string()),
        };
        driver.abort();
        outcome
    }
}
