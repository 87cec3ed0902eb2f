//! HTTPS beside plain HTTP on one port: the first byte a client sends
//! tells them apart (a TLS record of type handshake starts with 0x16; an
//! HTTP request line starts with a method's letter), the way etcd serves
//! both on its client port. The byte read to decide is handed back to
//! whichever side reads the connection.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// A connection after its first byte was read: that byte comes first again.
pub struct Sniffed<T> {
    first: Option<u8>,
    inner: T,
}

/// A connection sorted by its first byte.
pub enum Accepted<T> {
    /// Plain HTTP.
    Plain(Sniffed<T>),
    /// TLS, handshake done; the identity of the client's verified
    /// certificate when it offered one.
    Tls(
        Box<tokio_rustls::server::TlsStream<Sniffed<T>>>,
        Option<crate::identity::Identity>,
    ),
}

/// Reads `io`'s first byte (within `wait`) and, when it opens a TLS
/// handshake, completes the handshake with `config` (within `wait` again).
/// `None` when the client sent nothing in time, closed, or failed the
/// handshake: the connection is dropped (logged at debug level).
pub async fn accept<T>(
    mut io: T,
    config: Arc<rustls::ServerConfig>,
    wait: Duration,
) -> Option<Accepted<T>>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let mut first = [0u8; 1];
    let read = tokio::time::timeout(wait, io.read(&mut first)).await;
    let Ok(Ok(1)) = read else {
        return None;
    };
    let io = Sniffed {
        first: Some(first[0]),
        inner: io,
    };
    if first[0] != TLS_HANDSHAKE {
        return Some(Accepted::Plain(io));
    }
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    match tokio::time::timeout(wait, acceptor.accept(io)).await {
        Ok(Ok(stream)) => {
            let client = crate::tls::identity_of(stream.get_ref().1.peer_certificates());
            Some(Accepted::Tls(Box::new(stream), client))
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake on an HTTP listener failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake on an HTTP listener timed out");
            None
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sniffed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(first) = self.first {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            buf.put_slice(&[first]);
            self.first = None;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Sniffed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
