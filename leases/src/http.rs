//! What the workspace's HTTP APIs (the agent's local API, the arbiter's
//! admin API) share: every error answer is the documented JSON body
//! `{"error": code, "detail": text}`, including the ones the framework
//! makes itself (an unknown path, a wrong method, a body over the limit, a
//! path that is not UTF-8), and every listener is served with the same
//! connection limits and timeouts (`serve`). The only error answers that
//! are not JSON are hyper's own, written before a request exists (400 for
//! bytes that are not a request head, 408, 414, 431): hyper has no hook
//! for their body, and the README lists them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::shutdown::Shutdown;

mod tls;

/// The stable error code of a status the framework answers with.
pub fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "invalid_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "invalid_request",
    }
}

/// A JSON error answer.
pub fn error_response(status: StatusCode, code: &str, detail: &str) -> Response {
    (
        status,
        Json(serde_json::json!({"error": code, "detail": detail})),
    )
        .into_response()
}

/// Largest framework error text carried into the JSON detail.
const MAX_DETAIL_BYTES: usize = 4096;

/// Middleware (`axum::middleware::map_response`): turns an error answer
/// that is not JSON (a rejection the framework wrote as plain text, or an
/// empty 404/405) into the JSON body, keeping its status and headers (such
/// as `Allow` on a 405). JSON answers and successes pass unchanged.
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let allow = parts
        .headers
        .get(header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let detail = match (text.is_empty(), status, &allow) {
        (false, ..) => text,
        (true, StatusCode::METHOD_NOT_ALLOWED, Some(allow)) => {
            format!("this path does not take that method; it takes {allow}")
        }
        (true, StatusCode::METHOD_NOT_ALLOWED, None) => {
            "this path does not take that method".to_string()
        }
        (true, StatusCode::NOT_FOUND, _) => {
            "no such path; the API's paths are listed in the README".to_string()
        }
        (true, ..) => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let mut answer = error_response(status, code_for(status), &detail);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

/// Connection limits and timeouts of one HTTP listener
/// (`[http_limits]`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest wait for a request's headers (from the connection's start
    /// or the end of the previous answer).
    pub header_read_timeout: Duration,
    /// Longest time with nothing read or written.
    pub idle_timeout: Duration,
}

impl From<&rollcall_config::HttpLimits> for Limits {
    fn from(c: &rollcall_config::HttpLimits) -> Self {
        Limits {
            max_connections: c.max_connections,
            header_read_timeout: Duration::from_millis(c.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms),
        }
    }
}

/// How long connections still open at shutdown may finish their answer.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` (TCP or unix) over HTTP/1.1 until `stop`
/// fires, holding at most `limits.max_connections` connections (one more is
/// closed as soon as it is accepted) and closing a connection whose
/// request headers take longer than `limits.header_read_timeout`, or on
/// which nothing moves for `limits.idle_timeout`. `info` gives each
/// connection's `ConnectInfo` (the peer address, or a unix socket's peer
/// credentials), which handlers read with the `ConnectInfo` extractor.
/// At `stop`, the listener closes and open connections get
/// [`SHUTDOWN_GRACE`] to finish the answer in progress. With `tls`, a
/// connection whose first byte opens a TLS handshake is served over TLS
/// with that configuration (a verified client certificate reaches the
/// handlers as [`TlsPeer`]); any other is plain HTTP, as without.
pub async fn serve<L, C>(
    mut listener: L,
    router: axum::Router,
    limits: Limits,
    info: impl Fn(&L::Io, &L::Addr) -> C,
    name: &'static str,
    mut stop: Shutdown,
    tls: Option<Arc<rustls::ServerConfig>>,
) where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
    C: Clone + Send + Sync + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    let mut refused: u64 = 0;
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stop.fired() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            // One line per power of two, not one per connection.
            if refused.is_power_of_two() {
                tracing::warn!(listener = name, peer = ?addr, max_connections = limits.max_connections, refused, "too many connections: closed one as soon as it was accepted ([http_limits] max_connections)");
            }
            drop(io);
            continue;
        };
        let peer = info(&io, &addr);
        let io = Idle::new(io, limits.idle_timeout);
        let (router, stop, tls) = (router.clone(), stop.clone(), tls.clone());
        connections.spawn(async move {
            let _slot = slot;
            match tls {
                None => drive(io, router, peer, None, limits, stop).await,
                Some(config) => match tls::accept(io, config, limits.header_read_timeout).await {
                    Some(tls::Accepted::Plain(io)) => {
                        drive(io, router, peer, None, limits, stop).await
                    }
                    Some(tls::Accepted::Tls(io, client)) => {
                        drive(io, router, peer, client, limits, stop).await
                    }
                    None => {}
                },
            }
        });
    }
    drop(listener);
    let grace = tokio::time::sleep(SHUTDOWN_GRACE + Duration::from_millis(100));
    tokio::pin!(grace);
    while !connections.is_empty() {
        tokio::select! {
            _ = connections.join_next() => {}
            _ = &mut grace => break,
        }
    }
}

/// The identity a request's TLS client certificate names (a request
/// extension, present only on a TLS connection whose client offered a
/// verified rollcall certificate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPeer(pub crate::identity::Identity);

/// Serves one connection until it ends, or until `stop` (then the answer in
/// progress gets [`SHUTDOWN_GRACE`]).
async fn drive<I, C>(
    io: I,
    router: axum::Router,
    peer: C,
    client: Option<crate::identity::Identity>,
    limits: Limits,
    mut stop: Shutdown,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    C: Clone + Send + Sync + 'static,
{
    let service = router.map_request(move |request: hyper::Request<hyper::body::Incoming>| {
        let mut request = request.map(axum::body::Body::new);
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer.clone()));
        if let Some(client) = &client {
            request.extensions_mut().insert(TlsPeer(client.clone()));
        }
        request
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = stop.fired() => {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
    }
}

/// A connection that fails with `TimedOut` once nothing was read or
/// written on it for `limit`.
struct Idle<T> {
    inner: T,
    limit: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl<T> Idle<T> {
    fn new(inner: T, limit: Duration) -> Self {
        Idle {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
        }
    }

    /// Something moved: the idle clock starts again.
    fn moved(&mut self) {
        let next = tokio::time::Instant::now() + self.limit;
        self.deadline.as_mut().reset(next);
    }

    /// Nothing moved: whether the limit passed (the timer is registered to
    /// wake the task when it does).
    fn expired(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "nothing read or written within [http_limits] idle_timeout_ms",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Idle<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.moved();
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.expired(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Idle<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending => match self.expired(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A router as the agent's and the admin API's: `json_errors` over it,
    /// served by `serve`.
    async fn start() -> (SocketAddr, crate::shutdown::Trigger) {
        let router = axum::Router::new()
            .route("/v1/status", get(|| async { "ok" }))
            .layer(axum::middleware::map_response(json_errors));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (trigger, stop) = crate::shutdown::channel();
        let limits = Limits {
            max_connections: 8,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(10),
        };
        tokio::spawn(serve(
            listener,
            router,
            limits,
            |_, a| *a,
            "test",
            stop,
            None,
        ));
        (addr, trigger)
    }

    /// Sends `request` as raw bytes; the answer's status line and body.
    async fn raw(addr: SocketAddr, request: &[u8]) -> (String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        // hyper may answer (and close) before it read everything.
        let _ = stream.write_all(request).await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        (
            head.lines().next().unwrap_or("").to_owned(),
            body.to_owned(),
        )
    }

    /// Issue 37, item 3: the answers hyper writes itself, before there is a
    /// request to route (README, "The agent's local HTTP API"), are the
    /// only error answers that are not the JSON error: each comes with an
    /// empty body, and every other error is JSON.
    #[tokio::test]
    async fn only_hypers_own_answers_are_not_json() {
        let (addr, _stop) = start().await;
        let long_url = format!(
            "GET /v1/status?{} HTTP/1.1\r\nHost: x\r\n\r\n",
            "a".repeat(100 * 1024)
        );
        let many_headers = format!(
            "GET /v1/status HTTP/1.1\r\nHost: x\r\n{}\r\n",
            (0..101)
                .map(|i| format!("x-h{i}: v\r\n"))
                .collect::<String>()
        );
        let large_header = format!(
            "GET /v1/status HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n",
            "v".repeat(500 * 1024)
        );
        let cases = [
            ("garbage", b"\x01\x02 not http\r\n\r\n".to_vec(), "400"),
            ("a 100 KB URL", long_url.into_bytes(), "414"),
            ("101 header fields", many_headers.into_bytes(), "431"),
            ("a 500 KB header", large_header.into_bytes(), "431"),
        ];
        for (what, request, status) in cases {
            let (line, body) = raw(addr, &request).await;
            assert!(
                line.starts_with(&format!("HTTP/1.1 {status} ")),
                "{what}: {line}"
            );
            assert_eq!(body, "", "{what}: hyper's own answer has no body");
        }
        // Anything that reaches the router is JSON, the framework's own
        // answers included.
        let (line, body) = raw(
            addr,
            b"DELETE /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(line.starts_with("HTTP/1.1 405 "), "{line}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"], "method_not_allowed");
    }
}
