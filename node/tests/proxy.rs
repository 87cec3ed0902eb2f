//! The local TCP proxy (R8) against real backends on loopback: a real
//! arbiter and agent, instances registered through the agent API, and
//! small TCP servers standing in for the instances.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, Cluster, Http};
use rollcall_config::ProxyEntry;
use rollcall_leases::{InstanceId, ServiceKey};
use rollcall_node::metrics::ServiceLabel;
use rollcall_node::process::AgentHandle;
use rollcall_node::proxy::ProxyHandle;
use rollcall_node::shutdown::{self, Trigger};
use rollcall_node::view::Lookup;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const SERVICE: &str = "default/web/default";

/// What a test backend does with a connection.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Writes its instance id and "\n", then echoes what it reads.
    Echo,
    /// Accepts and then neither reads nor writes, holding the connection.
    Stall,
}

/// A TCP server standing in for one instance.
struct Backend {
    id: String,
    port: u16,
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
    /// Every byte read from any connection.
    seen: Arc<Mutex<Vec<u8>>>,
    listener: JoinHandle<()>,
}

impl Backend {
    async fn start(id: &str, behaviour: Behaviour) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (line, count, log) = (format!("{id}\n"), accepted.clone(), seen.clone());
        let listener = tokio::spawn(async move {
            let mut stalled = Vec::new();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                match behaviour {
                    Behaviour::Stall => stalled.push(stream),
                    Behaviour::Echo => {
                        let (line, log) = (line.clone(), log.clone());
                        tokio::spawn(async move {
                            if stream.write_all(line.as_bytes()).await.is_err() {
                                return;
                            }
                            let mut buf = [0u8; 4096];
                            loop {
                                match stream.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => {
                                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                                        if stream.write_all(&buf[..n]).await.is_err() {
                                            return;
                                        }
                                    }
                                }
                            }
                        });
                    }
                }
            }
        });
        Backend {
            id: id.to_owned(),
            port,
            accepted,
            seen,
            listener,
        }
    }

    /// Drops the listener: new connects are refused (connections already
    /// accepted keep running).
    async fn kill(&mut self) {
        self.listener.abort();
        let _ = (&mut self.listener).await;
    }

    fn saw(&self, needle: &[u8]) -> bool {
        self.seen
            .lock()
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
    }
}

/// A connected, confirmed agent with `slow_start_ms = 0` (weights do not
/// ramp), and its API.
async fn agent(cluster: &Cluster) -> (AgentHandle, Http) {
    let mut config = cluster.agent_config("node-a");
    config.data_plane.slow_start_ms = 0;
    let handle = cluster.agent_with(config).await;
    let http = Http::of(&handle);
    http.wait_connected().await;
    (handle, http)
}

/// Starts backends and registers them as instances of web with weights.
async fn backends(http: &Http, spec: &[(&str, u32, Behaviour)]) -> Vec<Backend> {
    let mut out = Vec::new();
    for &(id, weight, behaviour) in spec {
        let backend = Backend::start(id, behaviour).await;
        let (status, body) = http
            .register_weighted("web", id, backend.port, weight)
            .await;
        assert_eq!(status, 200, "{body}");
        out.push(backend);
    }
    out
}

/// A proxy of its own, stopped by its own shutdown signal.
struct TestProxy {
    handle: ProxyHandle,
    local_addr: SocketAddr,
    trigger: Trigger,
}

impl TestProxy {
    async fn shutdown(self) {
        self.trigger.fire();
        self.handle.stopped().await;
    }
}

/// Starts the proxy for web and waits until the agent's view serves
/// exactly `ready` candidates. The proxy counts its connections in the
/// agent's `active`.
async fn proxy(handle: &AgentHandle, ready: usize) -> TestProxy {
    let entry = ProxyEntry {
        service: SERVICE.into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        traffic: Default::default(),
    };
    let (trigger, signal) = shutdown::channel();
    let bound = rollcall_node::proxy::bind(&entry).await.unwrap();
    let proxy = rollcall_node::proxy::start(handle.agent.views().clone(), bound, signal);
    let proxy = TestProxy {
        local_addr: proxy.local_addr,
        handle: proxy,
        trigger,
    };
    let key = key();
    eventually(&format!("the view serves {ready} candidates"), || async {
        match handle.agent.lookup(&key) {
            Lookup::Serve(a) if a.selection.candidates.len() == ready => Some(()),
            _ => None,
        }
    })
    .await;
    proxy
}

fn key() -> ServiceKey {
    SERVICE.parse().unwrap()
}

fn id(s: &str) -> InstanceId {
    InstanceId::new(s).unwrap()
}

/// Connects through the proxy and reads the backend's id line.
async fn open(proxy: SocketAddr) -> (BufReader<TcpStream>, String) {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    let n = stream.read_line(&mut line).await.unwrap();
    assert!(n > 0, "the proxy closed the connection without a backend");
    (stream, line.trim_end().to_owned())
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn held_connections_spread_in_proportion_to_weight() {
    let cluster = Cluster::start().await;
    let (handle, http) = agent(&cluster).await;
    let spec = [
        ("web-a", 100, Behaviour::Echo),
        ("web-b", 100, Behaviour::Echo),
        ("web-c", 200, Behaviour::Echo),
        ("web-d", 400, Behaviour::Echo),
    ];
    let _backends = backends(&http, &spec).await;
    let active = handle.agent.views().active().clone();
    let proxy = proxy(&handle, 4).await;

    let mut held = Vec::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for _ in 0..400 {
        let (stream, who) = open(proxy.local_addr).await;
        *counts.entry(who).or_default() += 1;
        held.push(stream);
    }
    for (name, weight, _) in spec {
        let want = 400.0 * f64::from(weight) / 800.0;
        let got = counts.get(name).copied().unwrap_or(0);
        assert!(
            (got as f64 - want).abs() <= 0.1 * want,
            "{name} got {got} connections, want {want} ± 10 %: {counts:?}"
        );
        assert_eq!(active.count(&id(name)), got, "active count of {name}");
    }
    drop(held);
    eventually("every connection is off the active counts", || async {
        spec.iter()
            .all(|(name, _, _)| active.count(&id(name)) == 0)
            .then_some(())
    })
    .await;
    proxy.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_drained_backend_gets_no_new_connections_and_keeps_its_open_ones() {
    let cluster = Cluster::start().await;
    let (handle, http) = agent(&cluster).await;
    let spec = [
        ("web-a", 100, Behaviour::Echo),
        ("web-b", 100, Behaviour::Echo),
    ];
    let _backends = backends(&http, &spec).await;
    let active = handle.agent.views().active().clone();
    let proxy = proxy(&handle, 2).await;

    // Held connections alternate between the two; keep one to web-a.
    let mut before = Vec::new();
    let mut to_a = None;
    while to_a.is_none() {
        let (stream, who) = open(proxy.local_addr).await;
        if who == "web-a" {
            to_a = Some(stream);
        } else {
            before.push(stream);
        }
    }
    let mut to_a = to_a.unwrap();

    let (status, body) = http.drain("web-a", "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pending"], false, "the drain committed: {body}");

    for _ in 0..20 {
        let (stream, who) = open(proxy.local_addr).await;
        assert_eq!(who, "web-b", "a new connection reached the drained backend");
        before.push(stream);
    }
    to_a.get_mut().write_all(b"still here\n").await.unwrap();
    let mut echo = String::new();
    to_a.read_line(&mut echo).await.unwrap();
    assert_eq!(echo, "still here\n", "the open connection to web-a broke");
    assert_eq!(active.count(&id("web-a")), 1);
    drop(to_a);
    eventually(
        "the drained backend's connection is off the count",
        || async { (active.count(&id("web-a")) == 0).then_some(()) },
    )
    .await;
    proxy.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_refusing_backend_is_retried_around_and_ejected() {
    let cluster = Cluster::start().await;
    let (handle, http) = agent(&cluster).await;
    let spec = [
        ("web-a", 100, Behaviour::Echo),
        ("web-b", 100, Behaviour::Echo),
        ("web-c", 100, Behaviour::Echo),
    ];
    let mut backends = backends(&http, &spec).await;
    let proxy = proxy(&handle, 3).await;
    backends[2].kill().await;

    for _ in 0..50 {
        let (_stream, who) = open(proxy.local_addr).await;
        assert!(who == "web-a" || who == "web-b", "{who}");
    }
    let metrics = handle.agent.metrics();
    let label = ServiceLabel {
        service: SERVICE.into(),
    };
    assert!(metrics.connect_failures.get() > 0, "web-c was never tried");
    assert!(
        metrics.ejections.get_or_create(&label).get() > 0,
        "web-c was not ejected"
    );
    assert_eq!(metrics.no_backend.get_or_create(&label).get(), 0);
    proxy.shutdown().await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn a_backend_that_accepts_and_stalls_never_causes_a_duplicate() {
    let cluster = Cluster::start().await;
    let (handle, http) = agent(&cluster).await;
    // With two candidates both are drawn, and the stalling one's load
    // (active + 1) / 10000 stays below the other's 1 / 1: it gets every
    // connection while the healthy one stays a candidate for retries.
    let spec = [
        ("web-stall", 10_000, Behaviour::Stall),
        ("web-ok", 1, Behaviour::Echo),
    ];
    let backends = backends(&http, &spec).await;
    let (stall, ok) = (&backends[0], &backends[1]);
    let active = handle.agent.views().active().clone();
    let proxy = proxy(&handle, 2).await;

    let mut clients = Vec::new();
    for n in 0..5 {
        let mut client = TcpStream::connect(proxy.local_addr).await.unwrap();
        client
            .write_all(format!("token-{n}\n").as_bytes())
            .await
            .unwrap();
        clients.push(client);
    }
    eventually("the stalling backend accepted every connection", || async {
        (stall.accepted.load(Ordering::SeqCst) == 5).then_some(())
    })
    .await;
    // Time for every connect attempt a wrongful retry could make.
    let dp = &handle.agent.config().data_plane;
    let attempts = u64::from(dp.retries) + 2;
    tokio::time::sleep(Duration::from_millis(attempts * dp.connect_timeout_ms)).await;
    for n in 0..5 {
        let token = format!("token-{n}");
        assert!(
            !ok.saw(token.as_bytes()),
            "{token} was sent again to {}",
            ok.id
        );
    }
    assert_eq!(handle.agent.metrics().proxied_connections.get(), 5);
    assert_eq!(active.count(&id("web-stall")), 5);
    proxy.shutdown().await;
    eventually("shutdown ended the connections", || async {
        (active.count(&id("web-stall")) == 0).then_some(())
    })
    .await;
}

#[actix_rt::test(system = "crate::common::AgentSystem")]
async fn no_ready_endpoint_closes_the_connection_at_once() {
    let cluster = Cluster::start().await;
    let (handle, http) = agent(&cluster).await;
    let _backends = backends(&http, &[("web-a", 100, Behaviour::Echo)]).await;
    let (status, body) = http.drain("web-a", "").await;
    assert_eq!(status, 200, "{body}");
    eventually("web has no READY endpoint", || async {
        (http.ready_ids("web").await == Some(Vec::new())).then_some(())
    })
    .await;
    let proxy = proxy(&handle, 0).await;

    let mut client = TcpStream::connect(proxy.local_addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = client.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "the proxy sent bytes with no backend");
    let label = ServiceLabel {
        service: SERVICE.into(),
    };
    assert_eq!(
        handle
            .agent
            .metrics()
            .no_backend
            .get_or_create(&label)
            .get(),
        1
    );
    assert_eq!(handle.agent.metrics().proxied_connections.get(), 0);
    proxy.shutdown().await;
}
