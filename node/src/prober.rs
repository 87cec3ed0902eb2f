//! Runs the probes that `health.rs` asks for (R4): an HTTP GET or a TCP
//! connect against an instance, under one cap on how many run at once for
//! the whole agent, measuring how long each waited for its turn and took.
//!
//! A thin async driver: it turns a [`ProbeKind`] into pass or fail with a
//! short detail ("status 503", "connection refused", "timed out after
//! 500 ms"). It must not decide anything about health (thresholds, state,
//! scheduling, TTL checks: all in `health.rs`, which never hands it a TTL
//! check since [`ProbeKind`] has no such variant), and must not retry: a
//! retry would hide the failures the thresholds are there to count.
//!
//! What each kind detects:
//! - `http` passes on 2xx and 3xx. Redirects are not followed (a redirect
//!   proves the app answers; its target may be another host), no proxy is
//!   used whatever the environment says, and every probe opens a fresh
//!   connection, so it exercises the app's accept path as a new caller would.
//! - `tcp` passes once the handshake completes. The kernel completes
//!   handshakes from the listen backlog without the process, so **a tcp
//!   check passes against a FROZEN process** (stopped, deadlocked, stuck in
//!   a pause) as long as its listening socket is open. Only http and ttl
//!   checks detect a freeze; tcp detects a process that exited or never
//!   listened.
//!
//! The actor also answers the arbiter's witness questions (is a silent
//! node reachable?): a TCP connect to each of the node's addresses side
//! by side, reachable when any completes within `WITNESS_CONNECT_MS`.
//! These do not wait under the probe cap: the arbiter waits for the answer
//! only `lease.witness_wait_ms`, and the budget counts the connect timeout
//! alone.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use rollcall_leases::{AgentEpoch, NodeId};

use crate::agent_state::Input;
use crate::health::{ProbeKind, ProbeTask};
use crate::metrics::AgentMetrics;

/// Why a [`Prober`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ProberError {
    /// A cap of zero would stop every probe forever.
    #[error("max_concurrent = 0 would never run a probe; allow at least 1 concurrent probe")]
    ZeroConcurrency,
    /// The HTTP client could not be set up (its TLS or DNS backend failed).
    #[error("building the HTTP client for health probes failed: {0}")]
    Client(#[source] reqwest::Error),
}

/// The result of one probe.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOutcome {
    /// Whether the probe passed.
    pub passed: bool,
    /// What happened, for reasons and logs: "status 200", "connected",
    /// "connection refused", "timed out after 500 ms", …
    pub detail: String,
    /// How long the probe itself took, in ms (from getting its turn).
    pub latency_ms: f64,
    /// How long it waited for its turn under the concurrency cap, in ms.
    pub waited_ms: f64,
}

/// Count, sum and maximum of a series of durations, in ms: enough for the
/// agent to export a mean and a maximum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// How many durations were recorded.
    pub count: u64,
    /// Their sum, in ms.
    pub total_ms: f64,
    /// The longest, in ms.
    pub max_ms: f64,
}

impl Timings {
    fn record(&mut self, ms: f64) {
        self.count += 1;
        self.total_ms += ms;
        self.max_ms = self.max_ms.max(ms);
    }
}

#[derive(Debug, Default)]
struct Stats {
    waited: Timings,
    latency: Timings,
}

/// Runs probes for the whole agent, at most `max_concurrent` at once; the
/// others wait their turn in arrival order. Share one (in an `Arc`) across
/// all instances.
#[derive(Debug)]
pub struct Prober {
    client: reqwest::Client,
    permits: Semaphore,
    waiting: AtomicUsize,
    stats: Mutex<Stats>,
}

impl Prober {
    /// A prober that runs at most `max_concurrent` probes at once.
    pub fn new(max_concurrent: usize) -> Result<Self, ProberError> {
        if max_concurrent == 0 {
            return Err(ProberError::ZeroConcurrency);
        }
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .user_agent(concat!("rollcall-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ProberError::Client)?;
        Ok(Prober {
            client,
            permits: Semaphore::new(max_concurrent.min(Semaphore::MAX_PERMITS)),
            waiting: AtomicUsize::new(0),
            stats: Mutex::new(Stats::default()),
        })
    }

    /// Runs one probe against `target`, failing it after `timeout_ms` (which
    /// starts when the probe gets its turn, not while it waits for one).
    pub async fn run(&self, target: SocketAddr, kind: &ProbeKind, timeout_ms: u64) -> ProbeOutcome {
        let queued = Instant::now();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let permit = self.permits.acquire().await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        let _permit = permit.expect("the prober never closes its semaphore");
        let started = Instant::now();
        let waited_ms = millis(started - queued);
        let timeout = Duration::from_millis(timeout_ms);
        let (passed, detail) = match kind {
            ProbeKind::Http { path } => self.http(target, path, timeout).await,
            ProbeKind::Tcp => tcp(target, timeout).await,
        };
        let latency_ms = millis(started.elapsed());
        {
            let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.waited.record(waited_ms);
            stats.latency.record(latency_ms);
        }
        tracing::debug!(%target, ?kind, passed, %detail, latency_ms, waited_ms, "probe finished");
        ProbeOutcome {
            passed,
            detail,
            latency_ms,
            waited_ms,
        }
    }

    /// How long finished probes waited for their turn.
    pub fn wait_stats(&self) -> Timings {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waited
    }

    /// How long finished probes took once they had their turn.
    pub fn latency_stats(&self) -> Timings {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .latency
    }

    /// How many probes are waiting for their turn right now: a cap that is
    /// too low shows here first.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    async fn http(&self, target: SocketAddr, path: &str, timeout: Duration) -> (bool, String) {
        let url = format!("http://{target}{path}");
        match tokio::time::timeout(timeout, self.client.get(&url).send()).await {
            Err(_) => (false, timed_out(timeout)),
            Ok(Ok(response)) => {
                let status = response.status();
                (
                    status.is_success() || status.is_redirection(),
                    format!("status {}", status.as_u16()),
                )
            }
            Ok(Err(e)) => (false, describe_http_error(&e)),
        }
    }
}

async fn tcp(target: SocketAddr, timeout: Duration) -> (bool, String) {
    match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
        Err(_) => (false, timed_out(timeout)),
        Ok(Ok(_stream)) => (true, "connected".into()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
            (false, "connection refused".into())
        }
        Ok(Err(e)) => (false, format!("connect failed: {e}")),
    }
}

fn timed_out(timeout: Duration) -> String {
    format!("timed out after {} ms", timeout.as_millis())
}

/// "connection refused" when that is the cause, otherwise the error with
/// its chain of causes (reqwest's own message is only "error sending
/// request").
fn describe_http_error(e: &reqwest::Error) -> String {
    let mut causes = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::ConnectionRefused)
        {
            return "connection refused".into();
        }
        causes.push(err.to_string());
        source = err.source();
    }
    let what = if e.is_connect() {
        "connect failed"
    } else {
        "request failed"
    };
    format!("{what}: {}", causes.join(": "))
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000.0
}

// ----- the prober actor -----

/// Run one probe.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RunProbe {
    /// The instance.
    pub instance: rollcall_leases::InstanceId,
    /// Its checker's generation.
    pub generation: Option<rollcall_leases::Generation>,
    /// What to probe.
    pub task: ProbeTask,
}

/// Owns the prober; each probe runs on its own task and its outcome goes
/// back to the agent as a message.
pub struct ProberActor {
    /// The prober.
    pub prober: Arc<Prober>,
    /// Where outcomes go.
    pub agent: Recipient<Input>,
    /// Probe latency and queue wait are observed here.
    pub metrics: Arc<AgentMetrics>,
}

impl Actor for ProberActor {
    type Context = Context<Self>;
}

impl Handler<RunProbe> for ProberActor {
    type Result = ();

    fn handle(&mut self, probe: RunProbe, _: &mut Context<Self>) {
        let (prober, agent, metrics) = (
            self.prober.clone(),
            self.agent.clone(),
            self.metrics.clone(),
        );
        tokio::spawn(async move {
            let task = probe.task;
            let outcome = prober.run(task.target, &task.kind, task.timeout_ms).await;
            metrics.probe_latency.observe(outcome.latency_ms / 1000.0);
            metrics.probe_queue_wait.observe(outcome.waited_ms / 1000.0);
            agent.do_send(Input::Probed {
                instance: probe.instance,
                generation: probe.generation,
                which: task.which,
                passed: outcome.passed,
                detail: outcome.detail,
            });
        });
    }
}

/// How long a witness's connect to a silent node's address may take: an
/// answer must reach the arbiter within its `lease.witness_wait_ms` (the
/// budget calculator counts this).
pub const WITNESS_CONNECT_TIMEOUT: Duration =
    Duration::from_millis(rollcall_config::WITNESS_CONNECT_MS);

/// Whether any of `addresses` accepts a TCP connection within `timeout`,
/// all tried side by side; false for none.
pub async fn reach(addresses: Vec<SocketAddr>, timeout: Duration) -> bool {
    let mut set = tokio::task::JoinSet::new();
    for address in addresses {
        set.spawn(async move {
            tokio::time::timeout(timeout, TcpStream::connect(address))
                .await
                .is_ok_and(|connected| connected.is_ok())
        });
    }
    while let Some(done) = set.join_next().await {
        if done.unwrap_or(false) {
            return true;
        }
    }
    false
}

/// The arbiter's witness question about a silent node: answered to the
/// agent as `Input::Reached`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reach {
    /// The node asked about.
    pub node: NodeId,
    /// Its agent run.
    pub epoch: AgentEpoch,
    /// Its endpoints' addresses.
    pub addresses: Vec<SocketAddr>,
}

impl Handler<Reach> for ProberActor {
    type Result = ();

    fn handle(&mut self, question: Reach, _: &mut Context<Self>) {
        let agent = self.agent.clone();
        tokio::spawn(async move {
            let reachable = reach(question.addresses, WITNESS_CONNECT_TIMEOUT).await;
            agent.do_send(Input::Reached {
                node: question.node,
                epoch: question.epoch,
                reachable,
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::get;
    use axum::Router;
    use tokio::net::TcpListener;

    async fn serve(router: Router) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local address");
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    }

    fn http(path: &str) -> ProbeKind {
        ProbeKind::Http { path: path.into() }
    }

    /// An address with nothing listening.
    fn closed_port() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("local address")
    }

    #[tokio::test]
    async fn a_node_is_reachable_when_any_of_its_addresses_accepts() {
        let listening = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let open = listening.local_addr().expect("local address");
        let timeout = Duration::from_secs(5);
        assert!(reach(vec![closed_port(), open, closed_port()], timeout).await);
        assert!(!reach(vec![closed_port(), closed_port()], timeout).await);
        assert!(!reach(Vec::new(), timeout).await);
    }

    #[tokio::test]
    async fn http_passes_on_2xx_and_3xx_and_fails_otherwise() {
        let router = Router::new()
            .route("/ok", get(|| async { StatusCode::NO_CONTENT }))
            .route(
                "/moved",
                get(|| async {
                    (
                        StatusCode::FOUND,
                        [(header::LOCATION, "http://127.0.0.1:1/elsewhere")],
                    )
                        .into_response()
                }),
            )
            .route("/down", get(|| async { StatusCode::SERVICE_UNAVAILABLE }))
            .route(
                "/hang",
                get(|| async { std::future::pending::<StatusCode>().await }),
            );
        let target = serve(router).await;
        let prober = Prober::new(4).expect("prober");
        let cases = [
            ("/ok", true, "status 204"),
            ("/moved", true, "status 302"),
            ("/down", false, "status 503"),
            ("/missing", false, "status 404"),
            ("/hang", false, "timed out after 300 ms"),
        ];
        for (path, passed, detail) in cases {
            let outcome = prober.run(target, &http(path), 300).await;
            assert_eq!(
                (outcome.passed, outcome.detail.as_str()),
                (passed, detail),
                "{path}"
            );
        }
        let latency = prober.latency_stats();
        assert_eq!(latency.count, 5);
        assert!(latency.max_ms >= 300.0, "the hang took the whole timeout");
        assert_eq!(prober.wait_stats().count, 5);
    }

    #[tokio::test]
    async fn refused_connections_fail_both_kinds() {
        let prober = Prober::new(1).expect("prober");
        let target = closed_port();
        for kind in [ProbeKind::Tcp, http("/")] {
            let outcome = prober.run(target, &kind, 2_000).await;
            assert!(!outcome.passed);
            assert_eq!(outcome.detail, "connection refused", "{kind:?}");
        }
    }

    #[tokio::test]
    async fn tcp_passes_against_a_listener_that_accepts() {
        let prober = Prober::new(1).expect("prober");
        let target = serve(Router::new()).await;
        let outcome = prober.run(target, &ProbeKind::Tcp, 2_000).await;
        assert!(outcome.passed);
        assert_eq!(outcome.detail, "connected");
    }

    /// The module doc's warning: a process that listens but never runs again
    /// (here: never accepts, never reads) passes tcp and fails http.
    #[tokio::test]
    async fn a_frozen_process_passes_tcp_and_fails_http() {
        let frozen = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = frozen.local_addr().expect("local address");
        let prober = Prober::new(2).expect("prober");
        let tcp = prober.run(target, &ProbeKind::Tcp, 2_000).await;
        assert!(tcp.passed, "{tcp:?}");
        let http = prober.run(target, &http("/healthz"), 300).await;
        assert!(!http.passed);
        assert_eq!(http.detail, "timed out after 300 ms");
        drop(frozen);
    }

    #[tokio::test]
    async fn concurrency_is_capped_and_waits_are_measured() {
        #[derive(Clone)]
        struct Server {
            arrived: Arc<AtomicUsize>,
            active: Arc<AtomicUsize>,
            peak: Arc<AtomicUsize>,
            gate: Arc<Semaphore>,
        }
        let server = Server {
            arrived: Arc::default(),
            active: Arc::default(),
            peak: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        };
        let s = server.clone();
        let router = Router::new().route(
            "/slow",
            get(move || async move {
                s.arrived.fetch_add(1, Ordering::SeqCst);
                let now = s.active.fetch_add(1, Ordering::SeqCst) + 1;
                s.peak.fetch_max(now, Ordering::SeqCst);
                if let Ok(permit) = s.gate.acquire().await {
                    permit.forget();
                }
                s.active.fetch_sub(1, Ordering::SeqCst);
                StatusCode::OK
            }),
        );
        let target = serve(router).await;
        let prober = Arc::new(Prober::new(2).expect("prober"));
        let mut probes = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let prober = prober.clone();
            probes.spawn(async move { prober.run(target, &http("/slow"), 10_000).await });
        }
        // Two probes reach the server, four queue at the prober.
        let settled = async {
            while server.arrived.load(Ordering::SeqCst) < 2 || prober.waiting() < 4 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), settled)
            .await
            .expect("two probes at the server and four waiting");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(server.arrived.load(Ordering::SeqCst), 2);
        assert_eq!(prober.waiting(), 4);
        server.gate.add_permits(6);
        let mut outcomes = Vec::new();
        while let Some(outcome) = probes.join_next().await {
            outcomes.push(outcome.expect("probe task"));
        }
        assert!(outcomes.iter().all(|o| o.passed), "{outcomes:?}");
        assert_eq!(server.arrived.load(Ordering::SeqCst), 6);
        assert!(server.peak.load(Ordering::SeqCst) <= 2);
        // The four that queued waited through the 50 ms hold at least.
        let waited = outcomes.iter().filter(|o| o.waited_ms >= 50.0).count();
        assert!(waited >= 4, "{outcomes:?}");
        let stats = prober.wait_stats();
        assert_eq!(stats.count, 6);
        assert!(stats.max_ms >= 50.0 && stats.total_ms >= 200.0, "{stats:?}");
    }

    #[test]
    fn zero_concurrency_is_refused() {
        let err = Prober::new(0).expect_err("a cap of zero");
        assert!(err.to_string().contains("max_concurrent = 0"), "{err}");
    }
}
