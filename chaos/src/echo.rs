//! `rollcall echo`: the chaos harness's test backend. A TCP server that
//! answers every connection with one line, its instance id, then holds the
//! connection open until the client closes it (so in-flight connections
//! can be watched through a drain), or closes it at once when `hold` is
//! off; optionally an HTTP health endpoint on a second port, which the
//! harness can make fail (a not-ready file). Nothing else: it must be
//! simple enough that any failure seen through a proxy is rollcall's, not
//! the backend's.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves `id` on `listen` until the task is dropped. `hold`: keep each
/// connection open until the client closes it.
pub async fn serve(listen: SocketAddr, id: String, hold: bool) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    serve_on(listener, id, hold).await
}

/// Like `serve`, on a bound listener.
pub async fn serve_on(listener: TcpListener, id: String, hold: bool) -> std::io::Result<()> {
    let line: std::sync::Arc<[u8]> = format!("{id}\n").into_bytes().into();
    loop {
        let (mut stream, _) = listener.accept().await?;
        let line = line.clone();
        tokio::spawn(async move {
            if stream.write_all(&line).await.is_err() || !hold {
                return;
            }
            // Hold until the client closes; whatever it sends is ignored.
            let mut sink = [0u8; 512];
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    return;
                }
            }
        });
    }
}

/// Serves `GET /ready` (200, or 503 while `not_ready_file` exists) and
/// `GET /live` (200) on `listen` until the task is dropped.
pub async fn serve_health(
    listen: SocketAddr,
    not_ready_file: Option<std::path::PathBuf>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    serve_health_on(listener, not_ready_file).await
}

/// Like `serve_health`, on a bound listener.
pub async fn serve_health_on(
    listener: TcpListener,
    not_ready_file: Option<std::path::PathBuf>,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    let ready = move || {
        let file = not_ready_file.clone();
        async move {
            match file.filter(|f| f.exists()) {
                Some(f) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {} exists\n", f.display()),
                ),
                None => (StatusCode::OK, "ready\n".to_owned()),
            }
        }
    };
    let app = axum::Router::new()
        .route("/ready", axum::routing::get(ready))
        .route("/live", axum::routing::get(|| async { "live\n" }));
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_its_id_and_holds_until_the_client_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_on(listener, "web-7".into(), true));
        let answer = crate::traffic::ask(addr, None, std::time::Duration::from_secs(5)).await;
        assert_eq!(answer.as_deref(), Some("web-7"));

        // Held: after the line, the server sends nothing and does not close.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut line = [0u8; 6];
        stream.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"web-7\n");
        let mut more = [0u8; 1];
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            stream.read(&mut more),
        )
        .await;
        assert!(waited.is_err(), "the connection is held open");
        server.abort();
    }

    #[tokio::test]
    async fn health_is_ready_until_the_not_ready_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("web-7.not-ready");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_health_on(listener, Some(flag.clone())));
        let status = |path: &'static str| async move {
            reqwest::get(format!("http://{addr}{path}"))
                .await
                .unwrap()
                .status()
                .as_u16()
        };
        assert_eq!(status("/ready").await, 200);
        std::fs::write(&flag, b"").unwrap();
        assert_eq!(status("/ready").await, 503);
        assert_eq!(status("/live").await, 200, "liveness is not readiness");
        std::fs::remove_file(&flag).unwrap();
        assert_eq!(status("/ready").await, 200);
        assert_eq!(status("/other").await, 404);
        server.abort();
    }

    #[tokio::test]
    async fn nothing_listening_is_no_answer() {
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        assert_eq!(
            crate::traffic::ask(port, None, std::time::Duration::from_secs(2)).await,
            None
        );
    }
}
