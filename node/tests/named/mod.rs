//! Named TCP backends for the data-plane tests and benchmarks: each writes
//! its name and a newline to every connection, so a caller going through
//! a proxy can tell which backend answered.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

/// A backend that writes `name` and a newline to every connection; abort
/// the handle to kill it (its port then refuses connections).
pub async fn backend(name: &'static str) -> (u16, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = conn.write_all(format!("{name}\n").as_bytes()).await;
                let mut sink = [0u8; 64];
                let _ = conn.read(&mut sink).await;
            });
        }
    });
    (port, task)
}

/// Reads one line, or `None` when the connection closes first.
pub async fn line(conn: &mut tokio::net::TcpStream) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while conn.read(&mut byte).await.ok()? == 1 {
        if byte[0] == b'\n' {
            return Some(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
    }
    None
}

/// Connects through `proxy`: the name of the backend that answered, or
/// `None` when the proxy closed the connection (no backend).
pub async fn through(proxy: SocketAddr) -> Option<String> {
    let mut conn = tokio::net::TcpStream::connect(proxy).await.ok()?;
    line(&mut conn).await
}
