//! A real cluster on loopback for integration tests: a region CA, an
//! arbiter that can be stopped and restarted on the same QUIC port, agents
//! with their own data directories, and an HTTP client for the agent API.
//! Waits poll a condition with a generous deadline; they assert what
//! happens, never how fast.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rollcall_config::{AgentConfig, ArbiterConfig};
use rollcall_leases::identity::Identity;
use rollcall_leases::server::ArbiterServer;
use rollcall_leases::tls::{Ca, TlsMaterial};
use rollcall_leases::{Label, PrincipalName, Role};
use rollcall_node::process::{self, AgentHandle};
use serde_json::Value;

/// The runtime agents run in (`rollcall_node::runtime`): an actix System
/// over a two-worker tokio runtime, for
/// `#[actix_rt::test(system = "crate::common::AgentSystem")]`.
pub struct AgentSystem;

impl AgentSystem {
    #[allow(clippy::new_ret_no_self)] // the name actix_rt's test macro calls
    pub fn new() -> actix::SystemRunner {
        rollcall_node::runtime::system(Some(2))
    }
}

/// How long a test waits for something that should happen in milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A UDP port free now on 127.0.0.1 for a server that binds it later.
/// Drawn below Linux's ephemeral range (32768–60999): a port the kernel
/// hands out to `bind(:0)` (every client socket of the tests running
/// alongside) could be taken between this call and the server's bind.
pub fn free_udp_port() -> u16 {
    // xorshift seeded by the clock and a counter: this module is also
    // compiled into packages without a rand dependency.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        ^ (u64::from(std::process::id()) << 32)
        ^ CALLS
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        | 1;
    for _ in 0..1_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let port = 20_000 + (seed % 12_000) as u16;
        if std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free UDP port below the ephemeral range");
}

pub struct Cluster {
    pub ca: Ca,
    pub dir: tempfile::TempDir,
    pub arbiter_config: ArbiterConfig,
    pub arbiter: Option<ArbiterServer>,
    arbiter_tls: TlsMaterial,
}

impl Cluster {
    /// A CA for region r1 and a running arbiter.
    pub async fn start() -> Cluster {
        Self::start_with(|_| {}).await
    }

    /// Like `start`, after `tune` adjusts the arbiter config.
    pub async fn start_with(tune: impl FnOnce(&mut ArbiterConfig)) -> Cluster {
        let region = Label::new("r1").unwrap();
        let ca = Ca::generate(&region).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut arbiter_config = ArbiterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], free_udp_port())),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.path().join("arbiter"),
            ..ArbiterConfig::default()
        };
        tune(&mut arbiter_config);
        let arbiter_tls = Self::material(&ca, Role::Arbiter, "arbiter-1");
        let mut cluster = Cluster {
            ca,
            dir,
            arbiter_config,
            arbiter: None,
            arbiter_tls,
        };
        cluster.start_arbiter().await;
        cluster
    }

    pub fn material(ca: &Ca, role: Role, name: &str) -> TlsMaterial {
        let identity = Identity::new(
            Label::new("r1").unwrap(),
            role,
            PrincipalName::new(name).unwrap(),
        );
        TlsMaterial::from_issued(ca, &ca.issue(&identity, &[], &[]).unwrap())
    }

    pub fn tls(&self, role: Role, name: &str) -> TlsMaterial {
        Self::material(&self.ca, role, name)
    }

    /// The arbiter's own material, deny list included.
    pub fn arbiter_material(&self) -> TlsMaterial {
        TlsMaterial {
            cas: self.arbiter_tls.cas.clone(),
            cert_chain: self.arbiter_tls.cert_chain.clone(),
            key: self.arbiter_tls.key.clone_key(),
            revoked: self.arbiter_tls.revoked.clone(),
        }
    }

    pub async fn start_arbiter(&mut self) {
        let server = ArbiterServer::start(self.arbiter_config.clone(), &self.arbiter_tls)
            .await
            .unwrap();
        self.arbiter = Some(server);
    }

    pub async fn stop_arbiter(&mut self) {
        if let Some(server) = self.arbiter.take() {
            server.shutdown().await;
        }
    }

    pub fn quic_addr(&self) -> SocketAddr {
        self.arbiter_config.listen
    }

    pub fn admin(&self) -> Admin {
        let server = self.arbiter.as_ref().expect("arbiter running");
        let token = std::fs::read_to_string(&server.token_file)
            .unwrap()
            .trim()
            .to_owned();
        Admin {
            base: format!("http://{}", server.admin_addr),
            token,
            client: reqwest::Client::new(),
        }
    }

    pub fn agent_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join("agents").join(node)
    }

    pub fn agent_config(&self, node: &str) -> AgentConfig {
        AgentConfig {
            node_id: node.into(),
            region: "r1".into(),
            data_dir: self.agent_dir(node),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            dns_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            arbiters: vec![self.quic_addr().to_string()],
            reconnect_min_ms: 50,
            reconnect_max_ms: 500,
            ..AgentConfig::default()
        }
    }

    /// Starts an agent for `node` with its own certificate.
    pub async fn agent(&self, node: &str) -> AgentHandle {
        self.agent_with(self.agent_config(node)).await
    }

    pub async fn agent_with(&self, config: AgentConfig) -> AgentHandle {
        let tls = self.tls(Role::Agent, &config.node_id);
        process::start(config, Some(&tls)).await.unwrap()
    }
}

/// The agent's HTTP API.
#[derive(Clone)]
pub struct Http {
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
}

impl Http {
    pub fn of(handle: &AgentHandle) -> Http {
        Http {
            base: format!("http://{}", handle.http_addr),
            token: handle.agent.token().to_owned(),
            client: reqwest::Client::new(),
        }
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn register(&self, service: &str, id: &str, port: u16) -> (u16, Value) {
        let body = serde_json::json!({"service": service, "instance_id": id, "address": "127.0.0.1", "port": port});
        self.send(reqwest::Method::PUT, "/v1/agent/instances", Some(body))
            .await
    }

    /// The agent's `/metrics` text.
    pub async fn metrics(&self) -> String {
        metrics_text(&self.client, &self.base).await
    }

    pub async fn resolve(&self, service: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::GET,
            &format!("/v1/endpoints/{service}"),
            None,
        )
        .await
    }

    pub async fn drain(&self, id: &str, query: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::PUT,
            &format!("/v1/agent/instances/{id}/drain{query}"),
            None,
        )
        .await
    }

    pub async fn status(&self) -> Value {
        self.send(reqwest::Method::GET, "/v1/status", None).await.1
    }

    /// The instance ids in a resolve answer.
    pub async fn ready_ids(&self, service: &str) -> Option<Vec<String>> {
        let (status, body) = self.resolve(service).await;
        (status == 200).then(|| {
            body["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["instance_id"].as_str().unwrap().to_owned())
                .collect()
        })
    }
}

impl Http {
    /// Whether the agent reports a live arbiter session.
    pub async fn connected(&self) -> bool {
        self.status().await["arbiter"]["connected"]
            .as_bool()
            .unwrap()
    }

    pub async fn wait_connected(&self) {
        eventually("agent connected to the arbiter", || async {
            self.connected().await.then_some(())
        })
        .await;
    }

    pub async fn wait_disconnected(&self) {
        eventually("agent noticed the arbiter is gone", || async {
            (!self.connected().await).then_some(())
        })
        .await;
    }

    pub async fn heartbeat(&self, id: &str, query: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::PUT,
            &format!("/v1/agent/instances/{id}/heartbeat{query}"),
            None,
        )
        .await
    }

    pub async fn deregister(&self, id: &str, query: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::DELETE,
            &format!("/v1/agent/instances/{id}{query}"),
            None,
        )
        .await
    }

    /// Every endpoint of `service`, whatever its state (`?all=true`).
    pub async fn resolve_all(&self, service: &str) -> (u16, Value) {
        self.send(
            reqwest::Method::GET,
            &format!("/v1/endpoints/{service}?all=true"),
            None,
        )
        .await
    }

    /// A request with raw body bytes, with or without the node token.
    pub async fn send_raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
        with_token: bool,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{}", self.base, path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if with_token {
            req = req.bearer_auth(&self.token);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// The arbiter's admin endpoint.
pub struct Admin {
    pub base: String,
    pub token: String,
    pub client: reqwest::Client,
}

impl Admin {
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, path).await
    }

    /// A call with the operator token: its status and JSON body (`null`
    /// when there is none).
    async fn send(&self, method: reqwest::Method, path: &str) -> (u16, Value) {
        let resp = self
            .client
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `GET /v1/status`, which must answer 200.
    pub async fn status(&self) -> Value {
        let (status, body) = self.get("/v1/status").await;
        assert_eq!(status, 200, "admin status: {body}");
        body
    }

    /// The catalog revision the arbiter reports.
    pub async fn revision(&self) -> u64 {
        self.status().await["revision"].as_u64().unwrap()
    }

    /// The status code of a GET without any credential.
    pub async fn get_without_token(&self, path: &str) -> u16 {
        self.client
            .get(format!("{}{}", self.base, path))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// One metric's value from `/metrics` (first series matching the prefix).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = metrics_text(&self.client, &self.base).await;
        metric_in(&text, name).unwrap_or_else(|| panic!("metric {name} not found in:\n{text}"))
    }
}

/// The `/metrics` text of the HTTP API at `base`.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the first series of a `/metrics` text whose name (and
/// labels) start with `name`.
pub fn metric_in(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.trim().split(' ').next_back())
            .and_then(|v| v.parse().ok())
    })
}

/// Polls `check` until it returns `Some`, or panics naming `what` after
/// `PATIENCE`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("gave up waiting: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

impl Http {
    /// Registers `id` of `service` on 127.0.0.1:`port` with a weight.
    pub async fn register_weighted(
        &self,
        service: &str,
        id: &str,
        port: u16,
        weight: u32,
    ) -> (u16, Value) {
        let body = serde_json::json!({"service": service, "instance_id": id, "address": "127.0.0.1", "port": port, "weight": weight});
        self.send(reqwest::Method::PUT, "/v1/agent/instances", Some(body))
            .await
    }
}

impl Http {
    /// Registers `id` of `service` (port name "default") at `address`:`port`
    /// with a weight.
    pub async fn register_at(
        &self,
        service: &str,
        id: &str,
        address: &str,
        port: u16,
        weight: u32,
    ) -> (u16, Value) {
        let body = serde_json::json!({"service": service, "instance_id": id, "address": address, "port": port, "weight": weight});
        self.send(reqwest::Method::PUT, "/v1/agent/instances", Some(body))
            .await
    }
}
