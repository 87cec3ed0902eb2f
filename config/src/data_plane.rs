//! The agent's data-plane settings (R7, R8, R10): TCP proxy listeners and
//! how they choose endpoints, the staleness policy, local workload
//! identities, drains and probes. It only describes and validates; the
//! agent does the work.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{rules, ConfigError, ServicePattern};

/// `[[proxy]]`: a local TCP listener that forwards each connection to one
/// endpoint of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyEntry {
    /// The service, `namespace/service/port_name`.
    pub service: String,
    /// Where callers on this host connect (loopback, normally).
    pub listen: SocketAddr,
    /// What its callers send: `read_write` (default) or `read_only`. Only
    /// matters when the service fails over to another region: a policy
    /// with `failover_traffic = "read_only"`, or a single-writer service
    /// without a declared transfer, moves read-only listeners' connections
    /// only.
    #[serde(default)]
    pub traffic: ConnTraffic,
}

/// What a caller's connections may do, as a proxy listener or a resolve
/// call declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnTraffic {
    /// Reads only: may move wherever the policy lets read-only traffic go.
    ReadOnly,
    /// Reads and writes (the safe assumption when nothing is declared).
    #[default]
    ReadWrite,
}

impl ConnTraffic {
    /// The name used in files, URLs and the ingress preamble.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnTraffic::ReadOnly => "read_only",
            ConnTraffic::ReadWrite => "read_write",
        }
    }

    /// Parses `read_only` / `read_write`.
    pub fn parse(text: &str) -> Option<ConnTraffic> {
        match text {
            "read_only" => Some(ConnTraffic::ReadOnly),
            "read_write" => Some(ConnTraffic::ReadWrite),
            _ => None,
        }
    }
}

/// `[ingress]`: this agent as its region's edge gateway (R9): other
/// regions' proxies send failed-over connections here, each opened by a
/// one-line preamble naming the service, and the gateway forwards them to
/// a READY local endpoint when the service's policy lets that traffic into
/// this region. List the address in the region bridge's `ingress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngressConfig {
    /// Where the gateway listens; unset (the default): no gateway.
    pub listen: Option<SocketAddr>,
    /// Longest wait for a connection's preamble, in ms. Default 2000.
    pub preamble_timeout_ms: u64,
    /// Most connections the gateway holds at once; one more is closed as
    /// soon as it is accepted (`rollcall_agent_ingress_refused_total
    /// {reason="too_many_connections"}`). Default 10000.
    pub max_connections: usize,
}

impl Default for IngressConfig {
    fn default() -> Self {
        IngressConfig {
            listen: None,
            preamble_timeout_ms: 2_000,
            max_connections: 10_000,
        }
    }
}

/// `[data_plane]`: how the proxy (and the shared endpoint view used by DNS
/// Most `data_plane.retries`: with the 250 ms default connect timeout, ten
/// retries already keep a caller waiting 2.5 s for endpoints that refuse.
pub const MAX_RETRIES: u32 = 10;

/// Longest `data_plane.slow_start_ms` (1 h): a ramp longer than that keeps
/// a deploy's new instances nearly idle for the whole deploy.
pub const MAX_SLOW_START_MS: u64 = 3_600_000;

/// and the resolve API) chooses endpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataPlaneConfig {
    /// Longest wait for a TCP connect to an endpoint, in ms. Default 250: a
    /// dead endpoint costs a caller at most this before a retry elsewhere.
    pub connect_timeout_ms: u64,
    /// Retries on another endpoint when a connect fails, only while no byte
    /// of the client's has been forwarded. Default 2; at most
    /// [`MAX_RETRIES`] (each can cost a caller `connect_timeout_ms`).
    pub retries: u32,
    /// The proxy prefers endpoints in its own zone while the zone holds at
    /// least this share of the service's READY endpoints, else spills over
    /// to all zones. Default 0.2.
    pub local_zone_min_share: f64,
    /// A newly READY endpoint's weight ramps up linearly over this many ms,
    /// so a cold instance is not flooded. Default 10000; 0 disables; at
    /// most [`MAX_SLOW_START_MS`].
    pub slow_start_ms: u64,
    /// Consecutive connect failures that eject an endpoint locally. Default 3.
    pub consecutive_failures: u32,
    /// First ejection time, in ms; doubles with each repeat. Default 5000.
    pub base_ejection_ms: u64,
    /// Longest ejection time, in ms. Default 300000.
    pub max_ejection_ms: u64,
    /// Most endpoints of one service ejected at once, in percent of its
    /// READY endpoints. Default 50.
    pub max_ejection_percent: u32,
    /// When the share of a service's known non-draining endpoints that are
    /// READY and not ejected falls below this, traffic goes to all known
    /// non-draining endpoints (panic mode). Default 0.5 (Envoy's).
    pub panic_threshold: f64,
    /// Hold the last non-empty READY set when failures or expiries (not
    /// deliberate drains) would empty it (R7). Default true.
    pub empty_set_protection: bool,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            connect_timeout_ms: 250,
            retries: 2,
            local_zone_min_share: 0.2,
            slow_start_ms: 10_000,
            consecutive_failures: 3,
            base_ejection_ms: 5_000,
            max_ejection_ms: 300_000,
            max_ejection_percent: 50,
            panic_threshold: 0.5,
            empty_set_protection: true,
        }
    }
}

/// What a service does once its copy is older than its maximum age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StaleBehaviour {
    /// Keep serving the last-known set.
    Keep,
    /// Serve a smaller, safer set: only endpoints with fresh local
    /// evidence (node alive in the zone's gossip, no failed connect within
    /// `base_ejection_ms`), one retry, 1 s DNS TTLs, no failover on the
    /// stale copy's targets; the whole copy when none has such evidence
    /// (README, "Stale copies").
    Degrade,
    /// Refuse: no backend from the proxy, SERVFAIL from DNS, 503 from the API.
    Refuse,
}

/// One service's staleness override.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StalenessOverride {
    /// The services it applies to.
    pub service: ServicePattern,
    /// Their maximum age, in ms.
    pub max_age_ms: u64,
    /// What happens past it.
    pub behaviour: StaleBehaviour,
}

/// `[staleness]`: how long a service's copy may go unconfirmed by the
/// arbiter, and what happens past it (R7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StalenessConfig {
    /// Default maximum age, in ms. Default 900000 (15 min): callers keep
    /// working through a 10-minute control-plane outage.
    pub max_age_ms: u64,
    /// Default behaviour past it. Default `degrade`.
    pub behaviour: StaleBehaviour,
    /// Per-service values; the first matching entry wins.
    pub services: Vec<StalenessOverride>,
}

impl Default for StalenessConfig {
    fn default() -> Self {
        StalenessConfig {
            max_age_ms: 900_000,
            behaviour: StaleBehaviour::Degrade,
            services: Vec::new(),
        }
    }
}

impl StalenessConfig {
    /// The maximum age and behaviour of one service.
    pub fn for_service(
        &self,
        namespace: &str,
        service: &str,
        port_name: &str,
    ) -> (u64, StaleBehaviour) {
        self.services
            .iter()
            .find(|o| o.service.matches(namespace, service, port_name))
            .map_or((self.max_age_ms, self.behaviour), |o| {
                (o.max_age_ms, o.behaviour)
            })
    }
}

/// `[[workloads]]`: local processes identified on the agent's unix socket
/// by their peer credentials, and the services they may register and drain
/// (R10). A caller matches when its uid equals `uid` (if set) and its gid
/// equals `gid` (if set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadGrant {
    /// The caller's user id.
    pub uid: Option<u32>,
    /// The caller's group id.
    pub gid: Option<u32>,
    /// Services it may register and drain.
    pub services: Vec<ServicePattern>,
}

/// `[drain]`: the drain sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrainConfig {
    /// After a drain commits, the instance's open connections through this
    /// agent's proxy may finish for at most this long, in ms; then it is
    /// deregistered. Default 30000.
    pub max_drain_ms: u64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            max_drain_ms: 30_000,
        }
    }
}

/// `[probes]`: the agent's probe runner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbesConfig {
    /// Most probes running at once on this node; the rest wait (the wait
    /// is measured). Default 32.
    pub max_concurrent: u32,
}

impl Default for ProbesConfig {
    fn default() -> Self {
        ProbesConfig { max_concurrent: 32 }
    }
}

pub(crate) fn validate(
    prefix: &str,
    proxies: &[ProxyEntry],
    dp: &DataPlaneConfig,
    st: &StalenessConfig,
    workloads: &[WorkloadGrant],
    drain: &DrainConfig,
    probes: &ProbesConfig,
) -> Result<(), ConfigError> {
    for (i, p) in proxies.iter().enumerate() {
        rules::service_key(&format!("{prefix}.proxy[{i}].service"), &p.service)?;
        if proxies[..i].iter().any(|o| o.listen == p.listen) {
            return Err(ConfigError::invalid(
                format!("{prefix}.proxy[{i}].listen"),
                p.listen,
                "is used by another proxy entry",
            ));
        }
    }
    let f = |name: &str| format!("{prefix}.data_plane.{name}");
    rules::at_least(&f("connect_timeout_ms"), dp.connect_timeout_ms, 1)?;
    rules::between(&f("retries"), dp.retries, 0, MAX_RETRIES)?;
    rules::between(&f("slow_start_ms"), dp.slow_start_ms, 0, MAX_SLOW_START_MS)?;
    rules::at_least(&f("consecutive_failures"), dp.consecutive_failures, 1)?;
    rules::at_least(&f("base_ejection_ms"), dp.base_ejection_ms, 1)?;
    rules::at_least(
        &f("max_ejection_ms"),
        dp.max_ejection_ms,
        dp.base_ejection_ms,
    )?;
    if dp.max_ejection_percent > 100 {
        return Err(ConfigError::invalid(
            f("max_ejection_percent"),
            dp.max_ejection_percent,
            "must be at most 100",
        ));
    }
    for (name, v) in [
        ("local_zone_min_share", dp.local_zone_min_share),
        ("panic_threshold", dp.panic_threshold),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(ConfigError::invalid(
                f(name),
                v,
                "must be between 0.0 and 1.0",
            ));
        }
    }
    rules::at_least(&format!("{prefix}.staleness.max_age_ms"), st.max_age_ms, 1)?;
    for (i, o) in st.services.iter().enumerate() {
        rules::at_least(
            &format!("{prefix}.staleness.services[{i}].max_age_ms"),
            o.max_age_ms,
            1,
        )?;
    }
    for (i, w) in workloads.iter().enumerate() {
        if w.uid.is_none() && w.gid.is_none() {
            return Err(ConfigError::invalid(
                format!("{prefix}.workloads[{i}]"),
                "{}",
                "must name a uid, a gid or both",
            ));
        }
    }
    rules::at_least(
        &format!("{prefix}.drain.max_drain_ms"),
        drain.max_drain_ms,
        0,
    )?;
    rules::at_least(
        &format!("{prefix}.probes.max_concurrent"),
        probes.max_concurrent,
        1,
    )
}
