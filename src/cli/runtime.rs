//! How a command runs: the async runtime, logs on stderr, the TLS crypto
//! provider, and the signals that stop a long-running command.

use std::process::ExitCode;

use rollcall_leases::tls;

/// Runs an async command on a multi-thread runtime, with logs on stderr
/// (`RUST_LOG` sets the level; default `info`, openraft's and hickory's own
/// at `warn`).
pub(crate) fn serve(
    command: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    init_process();
    // An actix System over one multi-thread tokio runtime: the agent's
    // actors need the System, and everything else shares the runtime.
    rollcall_node::runtime::block_on(None, command)
}

/// The log filter without `RUST_LOG`. openraft's `core::raft_core` warns
/// only that it ignores a stale message (a vote answer or a replication
/// result from an earlier term or membership), which every election
/// produces, e.g. five at each `dev --replicas 3` start: errors only there.
const DEFAULT_LOG_FILTER: &str =
    "info,hickory_server=warn,openraft=warn,openraft::core::raft_core=error";

/// Logs on stderr and the one TLS crypto provider, once per process.
pub(crate) fn init_process() {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal, never into a log file or pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    tls::install_crypto_provider();
}

/// Waits for Ctrl-C or SIGTERM.
pub(crate) async fn stop_signal() {
    serve_until_stopped(&[]).await;
}

/// Waits for Ctrl-C or SIGTERM; each SIGHUP meanwhile reloads the TLS
/// material every one of `watchers` keeps (without watchers SIGHUP keeps
/// its default action, so `rollcall dev` still ends with its terminal).
pub(crate) async fn serve_until_stopped(watchers: &[tls::Watcher]) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            let _ = ctrl_c.await;
            return;
        };
        let mut hup = match watchers.is_empty() {
            true => None,
            false => signal(SignalKind::hangup()).ok(),
        };
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                _ = &mut ctrl_c => return,
                _ = term.recv() => return,
                Some(_) = async { hup.as_mut()?.recv().await } => {
                    tracing::info!(watchers = watchers.len(), "SIGHUP: reloading the TLS material");
                    for watcher in watchers {
                        watcher.reload_now();
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = watchers;
        let _ = ctrl_c.await;
    }
}
