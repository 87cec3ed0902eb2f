//! Helpers shared by the arbiter's integration tests.

use rollcall_config::ArbiterConfig;
use rollcall_leases::server::ArbiterServer;

/// Starts an arbiter; a restart in the same process may find the previous
/// run's store still open for a moment (its last tasks are being dropped),
/// so "already open" is retried for up to 5 s. Another process never
/// holds it: a real restart is a new process.
pub async fn start_when_released(
    config: ArbiterConfig,
    tls: &rollcall_leases::tls::TlsMaterial,
) -> ArbiterServer {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match ArbiterServer::start(config.clone(), tls).await {
            Ok(server) => return server,
            Err(e)
                if e.to_string().contains("already open")
                    || format!("{e:?}").contains("Locked") =>
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "store still open: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("arbiter start: {e}"),
        }
    }
}
