//! Issue 4 benchmark (not a test): the agent's data plane on loopback. A
//! real arbiter and one agent run in this process with a `[[proxy]]` for
//! `default/web/default`, its DNS server and its HTTP API; three tokio echo
//! servers are registered as the instances of web (weight 100 each,
//! `data_plane.slow_start_ms = 0`).
//!
//! Measured, each through the proxy and directly to one echo backend, in
//! several rounds that take the two ways in turn (so both see the same
//! background load; the table gives each figure's median over the rounds):
//! - 100-byte request/response round trips on an established connection
//!   (p50, p99, p99 the proxy adds; target ≤ 200 µs);
//! - new connections per second: connect, write 1 byte, read its echo,
//!   close, from 64 concurrent clients for 2 s;
//! - bulk throughput: 128 MiB echoed in 64 KiB chunks, the client writing
//!   and reading at once (target: the proxy ≥ 70 % of direct; the proxy
//!   splices bulk on Linux, `node/src/relay.rs`).
//!
//! And the other two ways to resolve a service:
//! - the resolve API: 5,000 sequential `GET /v1/endpoints/web` on one
//!   keep-alive connection;
//! - DNS: A queries for `web.default.svc.rollcall.` from 16 concurrent
//!   tasks for 5 s over UDP, each with its own resolver that caches nothing;
//! - memory: the process's resident set (agent, arbiter and this client
//!   together) before and after the agent follows 200 more services of one
//!   instance each (registered through its API, each resolved once).
//!
//! Client, proxy, agent, arbiter and backends share one tokio runtime with
//! two workers on (normally) two shared cores, so every number includes
//! the other side's work: the ratios to direct matter more than the
//! absolute figures.
//!
//! Run: `cargo bench -p rollcall-node --bench data_plane`. `cargo test`
//! runs it as a smoke test (fewer samples, 1 s loops, 8 MiB of bulk): it
//! fails unless every figure has its samples, every echo came back whole
//! and no connection or query failed.

#[path = "../../leases/benches/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RecordType};
use hickory_resolver::{Resolver, TokioResolver};
use rollcall_config::{AgentConfig, ArbiterConfig, ProxyEntry};
use rollcall_leases::identity::Identity;
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role, ServiceKey};
use rollcall_node::process::{self, AgentHandle};
use rollcall_node::view::Lookup;
use support::Better;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SERVICE: &str = "default/web/default";
const DNS_NAME: &str = "web.default.svc.rollcall.";
const BACKENDS: usize = 3;

const RTT_BYTES: usize = 100;
const CONNECT_CLIENTS: usize = 64;
const BULK_CHUNK: usize = 64 * 1024;
const DNS_TASKS: usize = 16;

/// Sample counts and loop lengths: the full run's, or the smoke run's.
#[derive(Clone, Copy)]
struct Sizes {
    /// Rounds of the round-trip, connection and bulk figures.
    rounds: usize,
    rtt_warmup: usize,
    rtt_samples: usize,
    connect_secs: u64,
    bulk_total: usize,
    resolve_warmup: usize,
    resolve_samples: usize,
    dns_secs: u64,
    followed: usize,
}

const FULL: Sizes = Sizes {
    rounds: 5,
    rtt_warmup: 1_000,
    rtt_samples: 5_000,
    connect_secs: 2,
    bulk_total: 128 * 1024 * 1024,
    resolve_warmup: 100,
    resolve_samples: 5_000,
    dns_secs: 5,
    followed: 200,
};

const SMOKE: Sizes = Sizes {
    rounds: 2,
    rtt_warmup: 50,
    rtt_samples: 500,
    connect_secs: 1,
    bulk_total: 8 * 1024 * 1024,
    resolve_warmup: 10,
    resolve_samples: 200,
    dns_secs: 1,
    followed: 10,
};

/// How long setup may wait for the agent to connect and serve web.
const SETUP_PATIENCE: Duration = Duration::from_secs(20);

fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
    let identity = Identity::new(
        Label::new("r1").unwrap(),
        role,
        PrincipalName::new(name).unwrap(),
    );
    TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
}

/// p50 and p99 of the figure `name`, in µs; it fails without samples.
fn p50_p99(name: &str, us: Vec<f64>) -> (f64, f64) {
    let s = support::summarize(name, us);
    (s.p50, s.p99)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A TCP server that echoes every byte it reads on every connection, with
/// a 64 KiB buffer. Returns its port.
async fn echo_backend() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; BULK_CHUNK];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    port
}

/// Polls `check` every 25 ms until it is true; panics naming `what` after
/// `SETUP_PATIENCE`.
async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + SETUP_PATIENCE;
    while !check().await {
        assert!(Instant::now() < deadline, "setup gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn main() {
    rollcall_leases::tls::install_crypto_provider();
    support::announce("data_plane");
    let sizes = if support::full_run() { FULL } else { SMOKE };
    rollcall_node::runtime::block_on(Some(2), run(sizes));
}

async fn run(sizes: Sizes) {
    let ca = Ca::generate(&Label::new("r1").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let arbiter_config = ArbiterConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin: SocketAddr::from(([127, 0, 0, 1], 0)),
        data_dir: dir.path().join("arbiter"),
        ..ArbiterConfig::default()
    };
    let arbiter = ArbiterServer::start(arbiter_config, &material(&ca, Role::Arbiter, "arbiter-1"))
        .await
        .unwrap();

    let mut config = AgentConfig {
        node_id: "node-a".into(),
        region: "r1".into(),
        data_dir: dir.path().join("agent"),
        http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        dns_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        arbiters: vec![arbiter.quic_addr.to_string()],
        proxy: vec![ProxyEntry {
            service: SERVICE.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            traffic: Default::default(),
        }],
        ..AgentConfig::default()
    };
    config.data_plane.slow_start_ms = 0;
    let handle = process::start(config, Some(&material(&ca, Role::Agent, "node-a")))
        .await
        .unwrap();

    let mut ports = Vec::new();
    for _ in 0..BACKENDS {
        ports.push(echo_backend().await);
    }
    register_backends(&handle, &ports).await;
    let proxy = handle.proxies[0].local_addr;
    let direct = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    println!(
        "setup: 1 agent, proxy {proxy} for {SERVICE} -> {BACKENDS} echo backends (weight 100 each, slow start off); direct = backend 1 at {direct}"
    );
    println!(
        "setup: client, proxy, agent, arbiter and backends share one tokio runtime with 2 workers"
    );

    let mut table = support::Table::new("data_plane");
    for round in 0..sizes.rounds {
        println!("round {} of {}:", round + 1, sizes.rounds);
        round_trips(proxy, direct, sizes, &mut table).await;
        let mut rates = Vec::new();
        for (name, target) in [("proxy", proxy), ("direct", direct)] {
            rates.push(connection_rate(name, target, sizes.connect_secs).await);
        }
        table.add(
            "new connections/s via proxy",
            "conn/s",
            Better::Higher,
            rates[0],
        );
        table.add(
            "new connections/s direct",
            "conn/s",
            Better::Higher,
            rates[1],
        );
        table.add(
            "new connections: proxy / direct",
            "%",
            Better::Higher,
            100.0 * rates[0] / rates[1],
        );
        let mut mibs = Vec::new();
        for (name, target) in [("proxy", proxy), ("direct", direct)] {
            mibs.push(bulk(name, target, sizes.bulk_total).await);
        }
        table.add("bulk via proxy", "MiB/s", Better::Higher, mibs[0]);
        table.add("bulk direct", "MiB/s", Better::Higher, mibs[1]);
        table.add(
            "bulk: proxy / direct",
            "%",
            Better::Higher,
            100.0 * mibs[0] / mibs[1],
        );
    }
    table.note("round trip p99 added by the proxy", "target <= 200 µs");
    table.note(
        "bulk: proxy / direct",
        "target >= 70 %; the median of each round's ratio",
    );
    resolve_api(&handle, sizes, &mut table).await;
    dns_rate(handle.dns_addr, sizes.dns_secs, &mut table).await;
    followed_memory(&handle, sizes.followed).await;
    table.finish();

    handle.shutdown().await;
    arbiter.shutdown().await;
}

/// Registers one instance of web per echo backend through the agent's HTTP
/// API, then waits until the proxy's view serves all of them.
async fn register_backends(handle: &AgentHandle, ports: &[u16]) {
    let base = format!("http://{}", handle.http_addr);
    let token = handle.agent.token().to_owned();
    let client = reqwest::Client::new();
    wait_for("the agent connects to the arbiter", async || {
        let status: serde_json::Value = client
            .get(format!("{base}/v1/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        status["arbiter"]["connected"].as_bool() == Some(true)
    })
    .await;
    for (i, port) in ports.iter().enumerate() {
        let body = serde_json::json!({
            "service": "web",
            "instance_id": format!("web-{}", i + 1),
            "address": "127.0.0.1",
            "port": port,
            "weight": 100,
        });
        let resp = client
            .put(format!("{base}/v1/agent/instances"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        assert!(
            status.is_success(),
            "registering web-{}: {status} {}",
            i + 1,
            resp.text().await.unwrap_or_default()
        );
    }
    let key: ServiceKey = SERVICE.parse().unwrap();
    wait_for("the agent's view serves every backend", async || {
        matches!(handle.agent.lookup(&key),
            Lookup::Serve(a) if a.selection.candidates.len() == ports.len())
    })
    .await;
}

/// One 100-byte request and its echo on `stream`; the time it took.
async fn round_trip(stream: &mut TcpStream, request: &[u8], reply: &mut [u8]) -> Duration {
    let start = Instant::now();
    stream.write_all(request).await.unwrap();
    stream.read_exact(reply).await.unwrap();
    start.elapsed()
}

/// Round trips on one established connection through the proxy and one
/// direct, taken in turn so both see the same background load.
async fn round_trips(
    proxy: SocketAddr,
    direct: SocketAddr,
    sizes: Sizes,
    table: &mut support::Table,
) {
    let Sizes {
        rtt_warmup,
        rtt_samples,
        ..
    } = sizes;
    let mut via_proxy = TcpStream::connect(proxy).await.unwrap();
    let mut via_direct = TcpStream::connect(direct).await.unwrap();
    via_proxy.set_nodelay(true).unwrap();
    via_direct.set_nodelay(true).unwrap();
    let request = [0x5au8; RTT_BYTES];
    let mut reply = [0u8; RTT_BYTES];
    let mut proxy_us = Vec::with_capacity(rtt_samples);
    let mut direct_us = Vec::with_capacity(rtt_samples);
    for i in 0..rtt_warmup + rtt_samples {
        let p = round_trip(&mut via_proxy, &request, &mut reply).await;
        assert_eq!(reply, request, "the proxy's echo differs");
        let d = round_trip(&mut via_direct, &request, &mut reply).await;
        assert_eq!(reply, request, "the direct echo differs");
        if i >= rtt_warmup {
            proxy_us.push(micros(p));
            direct_us.push(micros(d));
        }
    }
    let (p50, p99) = p50_p99("round trip via proxy", proxy_us);
    let (d50, d99) = p50_p99("round trip direct", direct_us);
    let config = format!("{RTT_BYTES}-byte request/response, 1 established connection each, {rtt_samples} round trips after {rtt_warmup} warm-up, interleaved");
    println!("round trip ({config}):");
    println!("  round trip via proxy: p50={p50:.1} µs p99={p99:.1} µs");
    println!("  round trip direct:    p50={d50:.1} µs p99={d99:.1} µs");
    println!("  round trip proxy / direct p50 ratio: {:.2}x", p50 / d50);
    println!(
        "  round trip p99 added by the proxy: {:.1} µs (target <= 200 µs)",
        p99 - d99
    );
    table.add("round trip p50 via proxy", "µs", Better::Lower, p50);
    table.add("round trip p50 direct", "µs", Better::Lower, d50);
    table.add("round trip p99 via proxy", "µs", Better::Lower, p99);
    table.add("round trip p99 direct", "µs", Better::Lower, d99);
    table.add(
        "round trip p99 added by the proxy",
        "µs",
        Better::Lower,
        p99 - d99,
    );
}

/// New connections per second to `target`: each of 64 clients loops
/// connect, write 1 byte, read its echo, close, for `secs`. Returns the
/// rate; fails if a connection failed.
async fn connection_rate(name: &str, target: SocketAddr, secs: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONNECT_CLIENTS {
        let (done, failed, latencies) = (done.clone(), failed.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let ok = async {
                    let mut stream = TcpStream::connect(target).await?;
                    stream.set_nodelay(true)?;
                    stream.write_all(b"x").await?;
                    let mut byte = [0u8; 1];
                    stream.read_exact(&mut byte).await?;
                    Ok::<_, std::io::Error>(())
                }
                .await;
                match ok {
                    Ok(()) => {
                        done.fetch_add(1, Ordering::Relaxed);
                        mine.push(micros(t.elapsed()));
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies.lock().unwrap().extend(mine);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let failed = failed.load(Ordering::Relaxed);
    let (p50, p99) = p50_p99(
        &format!("new connections {name}"),
        std::mem::take(&mut *latencies.lock().unwrap()),
    );
    println!(
        "new connections {name}: {:.0} connections/s ({n} in {secs:.2} s, {failed} failed; {CONNECT_CLIENTS} concurrent clients, connect + 1-byte echo + close); per connection p50={p50:.0} µs p99={p99:.0} µs",
        n as f64 / secs,
    );
    assert_eq!(failed, 0, "new connections {name}: {failed} failed");
    n as f64 / secs
}

/// Echoes `total` bytes (128 MiB in the full run) in 64 KiB chunks
/// through `target`, writing and reading at once; returns MiB/s.
async fn bulk(name: &str, target: SocketAddr, total: usize) -> f64 {
    let stream = TcpStream::connect(target).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let start = Instant::now();
    let write = tokio::spawn(async move {
        let chunk = vec![0xa5u8; BULK_CHUNK];
        for _ in 0..total / BULK_CHUNK {
            writer.write_all(&chunk).await.unwrap();
        }
        writer
    });
    let mut buf = vec![0u8; BULK_CHUNK];
    let mut received = 0;
    while received < total {
        let n = reader.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "bulk {name}: the connection closed after {received} bytes"
        );
        received += n;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(write.await.unwrap());
    let mibs = (total / (1024 * 1024)) as f64 / secs;
    println!(
        "bulk {name}: {mibs:.0} MiB/s ({} MiB echoed in {BULK_CHUNK}-byte chunks in {secs:.2} s, 1 connection)",
        total / (1024 * 1024)
    );
    mibs
}

/// Sequential `GET /v1/endpoints/web` on one keep-alive connection.
async fn resolve_api(handle: &AgentHandle, sizes: Sizes, table: &mut support::Table) {
    let Sizes {
        resolve_warmup,
        resolve_samples,
        ..
    } = sizes;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let url = format!("http://{}/v1/endpoints/web", handle.http_addr);
    let mut us = Vec::with_capacity(resolve_samples);
    for i in 0..resolve_warmup + resolve_samples {
        let start = Instant::now();
        let resp = client.get(&url).send().await.unwrap();
        let status = resp.status();
        let body = resp.bytes().await.unwrap();
        let took = start.elapsed();
        assert!(status.is_success(), "resolve: {status} {body:?}");
        if i >= resolve_warmup {
            us.push(micros(took));
        }
    }
    let (p50, p99) = p50_p99("resolve API", us);
    table.add("resolve API p50", "µs", Better::Lower, p50);
    table.add("resolve API p99", "µs", Better::Lower, p99);
    println!(
        "resolve API (GET /v1/endpoints/web, {BACKENDS} endpoints, {resolve_samples} sequential requests after {resolve_warmup} warm-up, 1 keep-alive connection): p50={p50:.0} µs p99={p99:.0} µs"
    );
}

/// A resolver that asks only `server` over UDP and caches nothing.
fn uncached_resolver(server: SocketAddr) -> TokioResolver {
    let mut connection = ConnectionConfig::udp();
    connection.port = server.port();
    let name_server = NameServerConfig::new(server.ip(), true, vec![connection]);
    let config = ResolverConfig::from_parts(None, Vec::new(), vec![name_server]);
    let mut builder = Resolver::builder_with_config(config, TokioRuntimeProvider::default());
    let options = builder.options_mut();
    options.cache_size = 0;
    // The cache enforces its size lazily, so cache_size 0 alone may still
    // serve an answer from it for a moment; a zero TTL bound makes every
    // entry stale at once, so every query goes to the agent.
    options.positive_max_ttl = Some(Duration::ZERO);
    options.negative_max_ttl = Some(Duration::ZERO);
    options.use_hosts_file = ResolveHosts::Never;
    builder.build().unwrap()
}

/// A queries from 16 concurrent tasks for `secs`, each with its own
/// resolver: one resolver hands an identical query already in flight to
/// every caller that asks meanwhile, so 16 tasks sharing one would mostly
/// count the same answer many times instead of asking the agent.
async fn dns_rate(server: SocketAddr, secs: u64, table: &mut support::Table) {
    let name = Name::from_ascii(DNS_NAME).unwrap();
    let resolver = uncached_resolver(server);
    let first = resolver.lookup(name.clone(), RecordType::A).await.unwrap();
    assert_eq!(first.answers().len(), BACKENDS, "DNS answers every backend");
    let failed = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..DNS_TASKS {
        let (resolver, name) = (uncached_resolver(server), name.clone());
        let (failed, latencies) = (failed.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                match resolver.lookup(name.clone(), RecordType::A).await {
                    Ok(answer) if !answer.answers().is_empty() => mine.push(micros(t.elapsed())),
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            latencies.lock().unwrap().extend(mine);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let us = std::mem::take(&mut *latencies.lock().unwrap());
    let n = us.len();
    let failed = failed.load(Ordering::Relaxed);
    let (p50, p99) = p50_p99("DNS", us);
    table.add(
        "DNS queries/s",
        "queries/s",
        Better::Higher,
        n as f64 / elapsed,
    );
    println!(
        "DNS (A {DNS_NAME}, {BACKENDS} endpoints, UDP, {DNS_TASKS} concurrent tasks with a resolver each, cache_size 0 and TTL bound 0, {secs} s): {:.0} queries/s ({n} answered, {failed} failed); p50={p50:.0} µs p99={p99:.0} µs",
        n as f64 / elapsed,
    );
    assert_eq!(failed, 0, "DNS: {failed} queries failed");
}

/// This process's resident set size, from /proc/self/status, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Registers `n` services of one instance each and resolves each once
/// (which makes the agent follow it); prints the resident set before and
/// after.
async fn followed_memory(handle: &AgentHandle, n: usize) {
    let base = format!("http://{}", handle.http_addr);
    let token = handle.agent.token().to_owned();
    let client = reqwest::Client::new();
    let before = rss_kib();
    for i in 0..n {
        let body = serde_json::json!({
            "service": format!("mem-{i:03}"),
            "instance_id": format!("mem-{i:03}-1"),
            "address": "127.0.0.1",
            "port": 9,
        });
        let status = client
            .put(format!("{base}/v1/agent/instances"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap()
            .status();
        assert!(status.is_success(), "registering mem-{i:03}: {status}");
        let resolved = client
            .get(format!("{base}/v1/endpoints/mem-{i:03}"))
            .send()
            .await
            .unwrap();
        let status = resolved.status();
        let body: serde_json::Value = resolved.json().await.unwrap();
        assert!(
            status.is_success() && body["endpoints"].as_array().is_some_and(|e| e.len() == 1),
            "resolving mem-{i:03}: {status} {body}"
        );
    }
    let after = rss_kib();
    println!(
        "memory: process RSS {} KiB before, {} KiB after the agent follows {n} more services ({:+} KiB, {:.1} KiB per service; agent, arbiter and client share the process)",
        before,
        after,
        after as i64 - before as i64,
        (after as f64 - before as f64) / n as f64
    );
}
