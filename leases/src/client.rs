//! The agent's side of the arbiter protocol: a QUIC connection with mutual
//! TLS, the session stream, and one stream per request. Thin: what to send
//! and what an answer means is the agent's business.

use std::net::SocketAddr;
use std::time::Duration;

use crate::codec::{self, CodecError, FrameError, MAX_RESPONSE_BYTES, MAX_SESSION_DOWN_BYTES};
use crate::endpoint::Role;
use crate::protocol::{Request, Response, SessionDown, SessionUp};
use std::sync::Arc;

use crate::tls::{LiveTls, TlsError, TlsMaterial, ALPN};
use crate::transport::{self, Link};

/// QUIC keep-alive interval of a client's connections unless
/// [`ArbiterClient::with_keep_alive`] says otherwise: `agent.keepalive_ms`'s
/// default.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Longest wait of a client's connect (name resolution, QUIC handshake and
/// the arbiter's identity check) unless [`ArbiterClient::with_connect_timeout`]
/// says otherwise: `agent.connect_timeout_ms`'s default. Without it a
/// replica that is gone (no CONNECTION_CLOSE, no ICMP) holds a connect for
/// the whole QUIC idle timeout, 10 s, and an agent trying it first after a
/// failover would sit that long without a session.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an arbiter may leave a message the agent sent without one
/// datagram back unless [`ArbiterClient::with_arbiter_silence`] says
/// otherwise: `agent.arbiter_silence_ms`'s default. A live replica
/// acknowledges within a round trip and its ACK delay (25 ms); a replica
/// whose host died says nothing, and without this bound its agents would
/// hear of it only at the 10 s QUIC idle timeout.
pub const DEFAULT_ARBITER_SILENCE: Duration = Duration::from_millis(1_500);

/// Why talking to the arbiter failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address could not be resolved or bound.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// TLS material is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The QUIC connection could not be made.
    #[error("connecting to arbiter {addr}: {detail}")]
    Connect {
        /// The arbiter.
        addr: String,
        /// What failed.
        detail: String,
    },
    /// The connection or a stream failed.
    #[error("arbiter connection: {0}")]
    Connection(String),
    /// A frame could not be read.
    #[error("arbiter stream: {0}")]
    Frame(#[from] FrameError),
    /// A frame did not decode.
    #[error("arbiter sent a bad message: {0}")]
    Codec(#[from] CodecError),
}

/// A QUIC client endpoint able to connect to arbiters (cheap to clone:
/// clones share the endpoint and the TLS material).
#[derive(Clone)]
pub struct ArbiterClient {
    endpoint: quinn::Endpoint,
    tls: Arc<LiveTls>,
    connect_timeout: Duration,
    silence: Duration,
}

impl ArbiterClient {
    /// A client presenting `material`'s certificate, from a socket on any
    /// address.
    pub fn new(material: &TlsMaterial) -> Result<Self, ClientError> {
        Self::with_tls(LiveTls::new(material)?)
    }

    /// A client presenting `material`'s certificate, from a socket bound to
    /// `bind`: a load generator gives each simulated agent its own loopback
    /// address (127.0.0.0/8), so the arbiter sees as many sources as a
    /// fleet has hosts.
    pub fn bound(material: &TlsMaterial, bind: SocketAddr) -> Result<Self, ClientError> {
        Self::with_tls_bound(LiveTls::new(material)?, bind)
    }

    /// A client presenting what `tls` holds at each handshake, so material
    /// replaced there is used from the next connection on.
    pub fn with_tls(tls: Arc<LiveTls>) -> Result<Self, ClientError> {
        Self::with_tls_bound(tls, ([0, 0, 0, 0], 0).into())
    }

    /// [`ArbiterClient::with_tls`] from a socket bound to `bind`.
    pub fn with_tls_bound(tls: Arc<LiveTls>, bind: SocketAddr) -> Result<Self, ClientError> {
        let mut config = tls.client_config(ALPN)?;
        config.transport_config(transport::config(Link::Agent {
            keepalive: DEFAULT_KEEP_ALIVE,
        }));
        let mut endpoint = quinn::Endpoint::client(bind).map_err(|source| ClientError::Io {
            what: format!("binding a QUIC client socket on {bind}"),
            source,
        })?;
        endpoint.set_default_client_config(config);
        Ok(ArbiterClient {
            endpoint,
            tls,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            silence: DEFAULT_ARBITER_SILENCE,
        })
    }

    /// The same client sending QUIC keep-alives every `interval` on its
    /// connections (`agent.keepalive_ms`) instead of every
    /// [`DEFAULT_KEEP_ALIVE`], from the next connection on.
    pub fn with_keep_alive(mut self, interval: Duration) -> Result<Self, ClientError> {
        let mut config = self.tls.client_config(ALPN)?;
        config.transport_config(transport::config(Link::Agent {
            keepalive: interval,
        }));
        self.endpoint.set_default_client_config(config);
        Ok(self)
    }

    /// The same client giving up a connect after `timeout`
    /// (`agent.connect_timeout_ms`) instead of [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The same client telling its sessions to give up on an arbiter
    /// that sends nothing back within `silence` of a message
    /// (`agent.arbiter_silence_ms`) instead of [`DEFAULT_ARBITER_SILENCE`].
    pub fn with_arbiter_silence(mut self, silence: Duration) -> Self {
        self.silence = silence;
        self
    }

    /// How long an arbiter may leave a message without a datagram back
    /// (the session actor ends the session past it).
    pub fn arbiter_silence(&self) -> Duration {
        self.silence
    }

    /// The TLS material it presents (its `replace` takes effect at the next
    /// connection).
    pub fn tls(&self) -> &Arc<LiveTls> {
        &self.tls
    }

    /// Connects to `address` (`host:port`); the host is also the name the
    /// arbiter's certificate must carry. Gives up after the client's
    /// connect timeout.
    pub async fn connect(&self, address: &str) -> Result<ArbiterConn, ClientError> {
        let timeout = self.connect_timeout;
        tokio::time::timeout(timeout, self.connect_unbounded(address))
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Connect {
                    addr: address.into(),
                    detail: format!(
                        "no QUIC handshake within {} ms (agent.connect_timeout_ms)",
                        timeout.as_millis()
                    ),
                })
            })
    }

    async fn connect_unbounded(&self, address: &str) -> Result<ArbiterConn, ClientError> {
        let (host, _) = address
            .rsplit_once(':')
            .ok_or_else(|| ClientError::Connect {
                addr: address.into(),
                detail: "not host:port".into(),
            })?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = tokio::net::lookup_host(address)
            .await
            .map_err(|source| ClientError::Io {
                what: format!("resolving {address}"),
                source,
            })?
            .next()
            .ok_or_else(|| ClientError::Connect {
                addr: address.into(),
                detail: "the name resolves to no address".into(),
            })?;
        let connecting = self
            .endpoint
            .connect(addr, host)
            .map_err(|e| ClientError::Connect {
                addr: address.into(),
                detail: e.to_string(),
            })?;
        let conn = connecting.await.map_err(|e| ClientError::Connect {
            addr: address.into(),
            detail: e.to_string(),
        })?;
        // The CA vouches for every role of the region; only an arbiter of
        // this client's own region may serve it (issue 38, item 4).
        let region = self.tls.identity().region;
        let server = crate::tls::peer_identity(&conn)?;
        if server.principal.role != Role::Arbiter || server.region != region {
            let detail = format!(
                "its certificate names {server}, not an arbiter of region {region}: refusing to talk to it"
            );
            conn.close(
                quinn::VarInt::from_u32(crate::protocol::close_code::UNAUTHENTICATED),
                detail.as_bytes(),
            );
            return Err(ClientError::Connect {
                addr: address.into(),
                detail,
            });
        }
        Ok(ArbiterConn {
            conn,
            address: address.to_owned(),
        })
    }
}

/// One connection to an arbiter.
#[derive(Clone)]
pub struct ArbiterConn {
    conn: quinn::Connection,
    address: String,
}

impl ArbiterConn {
    /// The arbiter's address as configured.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Opens the session stream and says `Hello`.
    pub async fn open_session(
        &self,
        hello: &SessionUp,
    ) -> Result<(SessionWriter, SessionReader), ClientError> {
        let (send, recv) = self
            .conn
            .open_bi()
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))?;
        let mut writer = SessionWriter { send };
        writer.send(hello).await?;
        Ok((writer, SessionReader { recv }))
    }

    /// Sends one request on a stream of its own and reads the response.
    pub async fn request(&self, request: &Request) -> Result<Response, ClientError> {
        let (mut send, mut recv) = self
            .conn
            .open_bi()
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))?;
        codec::write_frame(&mut send, &codec::encode_request(request))
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))?;
        let _ = send.finish();
        let bytes = codec::read_frame(&mut recv, MAX_RESPONSE_BYTES).await?;
        Ok(codec::decode_response(&bytes)?)
    }

    /// How many UDP datagrams have arrived from the arbiter on this
    /// connection: any of them (an acknowledgement included) shows the
    /// replica alive.
    pub fn datagrams_heard(&self) -> u64 {
        self.conn.stats().udp_rx.datagrams
    }

    /// Closes the connection.
    pub fn close(&self, reason: &str) {
        self.conn
            .close(quinn::VarInt::from_u32(0), reason.as_bytes());
    }

    /// Why the connection closed, once it has.
    pub async fn closed(&self) -> String {
        self.conn.closed().await.to_string()
    }

    /// Resolves once the arbiter's certificate (as the handshake verified
    /// it) has expired, with the reason to close the session with.
    pub async fn certificate_expired(&self) -> String {
        crate::tls::peer_certificate_expired(&self.conn).await
    }
}

/// The agent's half of the session stream.
pub struct SessionWriter {
    send: quinn::SendStream,
}

impl SessionWriter {
    /// Sends one session message.
    pub async fn send(&mut self, msg: &SessionUp) -> Result<(), ClientError> {
        codec::write_frame(&mut self.send, &codec::encode_session_up(msg))
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))
    }
}

/// The arbiter's half of the session stream.
pub struct SessionReader {
    recv: quinn::RecvStream,
}

impl SessionReader {
    /// The next message from the arbiter.
    pub async fn next(&mut self) -> Result<SessionDown, ClientError> {
        let bytes = codec::read_frame(&mut self.recv, MAX_SESSION_DOWN_BYTES).await?;
        Ok(codec::decode_session_down(&bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;
    use crate::name::{Label, PrincipalName};
    use crate::tls::{install_crypto_provider, server_config, Ca};

    fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
        let identity = Identity::new(
            Label::new("r1").unwrap(),
            role,
            PrincipalName::new(name).unwrap(),
        );
        TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
    }

    /// A QUIC server on loopback presenting `server`, accepting whatever
    /// connects until the test ends.
    fn serve(server: &TlsMaterial) -> (quinn::Endpoint, SocketAddr) {
        let endpoint =
            quinn::Endpoint::server(server_config(server).unwrap(), ([127, 0, 0, 1], 0).into())
                .unwrap();
        let addr = endpoint.local_addr().unwrap();
        let accepting = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = accepting.accept().await {
                tokio::spawn(async move {
                    if let Ok(conn) = incoming.await {
                        let _ = conn.closed().await;
                    }
                });
            }
        });
        (endpoint, addr)
    }

    /// Issue 38, item 4: the region's CA vouches for every role, so an
    /// agent checks that what answers is an arbiter, not (say) a bridge or
    /// another agent's stolen server-capable certificate.
    #[tokio::test]
    async fn only_an_arbiter_certificate_may_serve_an_agent() {
        install_crypto_provider();
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let client = ArbiterClient::new(&material(&ca, Role::Agent, "node-1")).unwrap();

        let (_bridge, at) = serve(&material(&ca, Role::Bridge, "br-1"));
        let err = client
            .connect(&at.to_string())
            .await
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("names rollcall://r1/bridge/br-1, not an arbiter of region r1"),
            "{err}"
        );

        let (_arbiter, at) = serve(&material(&ca, Role::Arbiter, "arb-1"));
        assert!(client.connect(&at.to_string()).await.is_ok());
    }

    /// Issue 38, item 4: an agent's, controller's or operator's
    /// certificate carries the client usage alone, so TLS itself refuses
    /// it as a server, before any role check.
    #[tokio::test]
    async fn a_certificate_without_the_server_usage_cannot_serve() {
        install_crypto_provider();
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        let client = ArbiterClient::new(&material(&ca, Role::Agent, "node-1")).unwrap();
        for role in [Role::Agent, Role::Controller, Role::Operator] {
            let (_server, at) = serve(&material(&ca, role, "stolen"));
            let err = client
                .connect(&at.to_string())
                .await
                .err()
                .expect("refused");
            let err = err.to_string();
            assert!(!err.contains("not an arbiter"), "{role:?}: {err}");
            assert!(
                err.to_lowercase().contains("purpose") || err.to_lowercase().contains("usage"),
                "{role:?}: {err}"
            );
        }
    }

    /// A replica that is gone answers nothing: the connect gives up after
    /// the client's connect timeout and says so, instead of holding the
    /// agent for the whole QUIC idle timeout (a CI run saw an agent sit
    /// 10 s on a stopped replica after a failover and lose its lease).
    #[tokio::test]
    async fn a_connect_to_a_silent_address_gives_up_after_the_connect_timeout() {
        install_crypto_provider();
        let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
        // A bound UDP socket that reads nothing: no handshake, no ICMP.
        let silent = std::net::UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        let at = silent.local_addr().unwrap();
        let client = ArbiterClient::new(&material(&ca, Role::Agent, "node-1"))
            .unwrap()
            .with_connect_timeout(Duration::from_millis(200));
        let err = client
            .connect(&at.to_string())
            .await
            .err()
            .expect("nothing answers");
        assert!(
            err.to_string().contains("no QUIC handshake within 200 ms"),
            "{err}"
        );
    }
}
