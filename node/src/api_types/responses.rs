//! The answers of the local API: registration and drain, the resolve
//! API's endpoints, other regions, this node's instances, the region's
//! services and the agent's status.

use std::net::IpAddr;

use rollcall_leases::{EndpointRecord, InstanceId, Label, NodeId, ServiceKey, Version};
use serde::{Deserialize, Serialize};

use super::key_text;

/// Answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    /// The instance.
    pub instance_id: InstanceId,
    /// The generation the catalog assigned; `null` while pending.
    pub generation: Option<u64>,
    /// The record's state (`STARTING`, `READY`, …).
    pub state: String,
    /// True when the arbiter was unreachable: accepted locally, not yet
    /// committed. Always present.
    pub pending: bool,
}

/// Answer to a drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainResponse {
    /// The revision that committed the drain; `null` while pending.
    pub revision: Option<u64>,
    /// True when accepted locally only (it already applies to this agent's
    /// own proxy).
    pub pending: bool,
    /// How far the drain has reached other agents, when the caller waited.
    pub propagated: Option<Propagated>,
}

/// How many subscribed agents acknowledged a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Propagated {
    /// Agents that acknowledged the revision.
    pub acked: u32,
    /// Agents subscribed to the service.
    pub total: u32,
    /// Whether every one of them did.
    pub complete: bool,
}

/// Answer of the resolve API: one service's endpoints as this agent sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointsResponse {
    /// The service.
    pub service: Label,
    /// Its namespace.
    pub namespace: Label,
    /// Its port name.
    pub port_name: Label,
    /// The catalog shard it lives in.
    pub shard: u16,
    /// The revision of the service's last change held.
    pub revision: u64,
    /// Age of the held copy, in ms since it was last confirmed by the arbiter.
    pub age_ms: u64,
    /// Whether the copy is older than the service's maximum age, or was
    /// loaded from the cache and not yet confirmed.
    pub stale: bool,
    /// How the agent is serving it (its outage policy or protection in effect).
    pub mode: String,
    /// The region the answer comes from: this agent's own, or the region
    /// the service failed over to (then `endpoints` is empty and
    /// `failover.ingress` lists where to connect).
    pub region: Label,
    /// The endpoints.
    pub endpoints: Vec<EndpointJson>,
    /// Whether the copy is past its maximum age and served degraded
    /// (staleness behaviour `degrade`): only endpoints this agent has
    /// fresh local evidence of, no failover to other regions (README,
    /// "Stale copies").
    #[serde(default)]
    pub degraded: bool,
    /// Why, when `degraded`: the copy's age and limit, and which set is
    /// served (the endpoints with fresh local evidence, or the whole copy
    /// when none has any).
    #[serde(default)]
    pub degraded_reason: Option<String>,
    /// Set when the service has no usable endpoint in this region: where
    /// its traffic goes instead, or why it goes nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverJson>,
    /// For a single-writer service: its writer epoch as this agent holds
    /// it, the fencing token to hand the database (README, "Single
    /// writer"); absent for other services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<WriterJson>,
    /// A fingerprint of what this answer routes to (its mode, region,
    /// failover, and each endpoint's instance, generation, state and
    /// address; not the weights, which slow start moves continuously):
    /// pass it back as `?index=` to wait until the answer changes.
    pub index: String,
}

impl EndpointsResponse {
    /// The fingerprint `index` holds, of the other fields.
    pub fn fingerprint(&self) -> String {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut put = |s: &str| {
            h.update(s.as_bytes());
            h.update(&[0]);
        };
        put(&self.mode);
        put(if self.degraded { "degraded" } else { "" });
        put(self.region.as_str());
        if let Some(f) = &self.failover {
            put(f.region.as_ref().map_or("", |r| r.as_str()));
            put(f.refused.as_deref().unwrap_or(""));
            for i in &f.ingress {
                put(i);
            }
        }
        if let Some(w) = &self.writer {
            put(&w.epoch.to_string());
            put(w.owner.as_str());
            put(if w.settled { "settled" } else { "moving" });
        }
        for e in &self.endpoints {
            put(e.instance_id.as_str());
            put(&e.generation.to_string());
            put(&e.state);
            put(&e.address.to_string());
            put(&e.port.to_string());
        }
        format!("{:016x}", h.digest())
    }
}

/// A single-writer service's writer epoch (R9, `rollcall_leases::writer`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterJson {
    /// The epoch number: the fencing token. A database that refuses writes
    /// stamped with an older epoch than it has seen refuses a late writer.
    pub epoch: u64,
    /// The region that owns the writes of this epoch.
    pub owner: Label,
    /// False while the writes are moving (the new owner has not
    /// confirmed): no region takes them then.
    pub settled: bool,
    /// The owner before (`null` at epoch 1).
    pub from: Option<Label>,
    /// The region whose arbiter committed the epoch.
    pub committed_in: Label,
    /// When it was committed, ms since the Unix epoch (0 when only the
    /// policy's first owner is known).
    pub at_ms: u64,
    /// Who asked for it.
    pub by: String,
    /// The operator's reason, when the transfer was forced past an
    /// unreachable owner.
    pub forced: Option<String>,
}

impl From<rollcall_leases::WriterEpoch> for WriterJson {
    fn from(w: rollcall_leases::WriterEpoch) -> Self {
        WriterJson {
            epoch: w.epoch,
            owner: w.owner,
            settled: w.settled,
            from: w.from,
            committed_in: w.committed_in,
            at_ms: w.at_ms,
            by: w.by.to_string(),
            forced: w.forced.map(|r| r.as_str().to_owned()),
        }
    }
}

/// Failover of an answer to another region (R9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailoverJson {
    /// The region the traffic goes to; `null` when it goes nowhere.
    pub region: Option<Label>,
    /// That region's ingress addresses (`host:port`): connect there and
    /// open with the ingress preamble (the agent's proxy does this).
    pub ingress: Vec<String>,
    /// READY instances of the service in that region, by its summary.
    pub ready: u32,
    /// Why the traffic stays here with no backend (a
    /// `rollcall_agent_failover_refusals_total` reason); `null` when it moves.
    pub refused: Option<String>,
    /// The same in words.
    pub detail: String,
}

/// Answer of `GET /v1/regions`: what this agent holds of other regions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionsResponse {
    /// This agent's region.
    pub region: String,
    /// Every other region its arbiter holds a view of, with the summaries
    /// of the services this agent follows.
    pub regions: Vec<crate::failover::RegionStatus>,
    /// The policies of the services this agent follows.
    pub policies: Vec<RegionsPolicy>,
}

/// One policy in a [`RegionsResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionsPolicy {
    /// The document, as its home region committed it.
    pub policy: rollcall_config::ServicePolicy,
    /// Its revision in its home region.
    pub home_revision: u64,
}

impl Eq for RegionsPolicy {}

/// One endpoint in an [`EndpointsResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointJson {
    /// The instance.
    pub instance_id: InstanceId,
    /// Its registration's generation.
    pub generation: u64,
    /// Where to connect.
    pub address: IpAddr,
    /// The port to connect to.
    pub port: u16,
    /// Its zone.
    pub zone: Label,
    /// Its software version.
    pub version: Version,
    /// Its relative weight.
    pub weight: u32,
    /// `STARTING`, `READY`, `DRAINING`, `UNHEALTHY` or `EXPIRED`.
    pub state: String,
    /// `unknown`, `passing` or `failing` (informational, never routes).
    pub liveness: String,
}

impl EndpointJson {
    /// The API form of a catalog record.
    pub fn from_record(record: &EndpointRecord) -> Self {
        EndpointJson {
            instance_id: record.instance_id.clone(),
            generation: record.generation.get(),
            address: record.address,
            port: record.port,
            zone: record.zone.clone(),
            version: record.version.clone(),
            weight: record.weight.get(),
            state: record.state.as_str().to_string(),
            liveness: record.liveness.as_str().to_string(),
        }
    }
}

/// Answer of `GET /v1/agent/instances`: this node's registrations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstancesResponse {
    /// Every local registration, in instance id order.
    pub instances: Vec<LocalInstanceJson>,
}

/// One of this node's registrations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalInstanceJson {
    /// The instance.
    pub instance_id: InstanceId,
    /// Its service, as `namespace/service/port_name`.
    #[serde(with = "key_text")]
    pub service: ServiceKey,
    /// Where callers connect.
    pub address: IpAddr,
    /// The port callers connect to.
    pub port: u16,
    /// The generation the catalog gave it; `null` while its registration
    /// is pending.
    pub generation: Option<u64>,
    /// What the agent wants for it: `serve`, `drain` or `leave`.
    pub intent: String,
    /// Whether the arbiter has committed that intent (`false`: pending,
    /// sent when the arbiter answers or is back).
    pub committed: bool,
    /// The state its health checks give it (`STARTING`, `READY`,
    /// `UNHEALTHY`); `null` when it has no checks.
    pub checked: Option<String>,
}

/// Answer of `GET /v1/services`: the region's services, listed by the
/// arbiter; or, when it cannot be asked, the services this agent holds a
/// copy of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicesResponse {
    /// `catalog` (the arbiter listed the region's services) or `held` (the
    /// arbiter could not be asked: only the copies this agent holds).
    pub source: String,
    /// The revision of the catalog listed (`null` for `held`).
    pub revision: Option<u64>,
    /// More services than the arbiter lists at once (10,000): the list
    /// holds the first ones in key order.
    pub truncated: bool,
    /// Each service, in key order.
    pub services: Vec<ServiceJson>,
}

/// One service with its counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceJson {
    /// The service key, as `namespace/service/port_name`.
    #[serde(with = "key_text")]
    pub service: ServiceKey,
    /// The revision of its last change (held, for `held`).
    pub revision: u64,
    /// Endpoints READY (in the catalog, or in the copy).
    pub ready: usize,
    /// Every endpoint, whatever its state.
    pub total: usize,
    /// Whether the copy is not confirmed by the arbiter in this session
    /// (always `false` for `catalog`).
    pub stale: bool,
    /// Age of the copy, ms (0 while the session keeps it current, and
    /// for `catalog`).
    pub age_ms: u64,
}

/// Answer of the agent's status endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// This node.
    pub node: NodeId,
    /// Its zone.
    pub zone: Label,
    /// This run of the agent.
    pub agent_epoch: u64,
    /// The connection to the arbiter.
    pub arbiter: ArbiterStatus,
    /// The node lease, when one is held.
    pub lease: Option<LeaseStatus>,
    /// Every subscribed service.
    pub subscriptions: Vec<SubscriptionStatus>,
    /// Writes accepted locally and not yet committed.
    pub pending_writes: u32,
    /// This node's view of its zone's gossip; `null` when gossip is off
    /// (no `gossip.key_file`). Gossip that is on and has heard of no peer
    /// yet (a zone's lone member) shows empty lists.
    pub gossip: Option<GossipStatus>,
    /// The certificate this agent presents to the arbiter (its identity,
    /// serial and notAfter) and the CAs it trusts; `null` when it has no
    /// arbiter (no TLS material).
    #[serde(default)]
    pub tls: Option<rollcall_leases::tls::TlsStatus>,
}

/// The zone peers this node's gossip knows (like `consul members`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GossipStatus {
    /// Peers seen alive, by node id (this node excluded).
    pub alive: Vec<NodeId>,
    /// Peers gossip declared down and not seen since.
    pub down: Vec<NodeId>,
}

/// The agent's connection to the arbiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArbiterStatus {
    /// Whether a session is up.
    pub connected: bool,
    /// The arbiter it talks to (or last talked to).
    pub address: Option<String>,
    /// Milliseconds since the last successful contact; `null` if never.
    pub last_contact_ms: Option<u64>,
    /// The identity of the arbiter's catalog (16 hex digits) as of the last
    /// session; `null` before any, or while the arbiter group has not named
    /// it yet.
    #[serde(default)]
    pub catalog: Option<String>,
    /// Why the last session (or connect) ended, as the agent's log says
    /// it: a replica gone silent, a refusal, a closed connection; `null`
    /// before any ended.
    #[serde(default)]
    pub last_end: Option<String>,
}

/// The node lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// The lease id.
    pub id: u64,
    /// Its time to live, in ms.
    pub ttl_ms: u64,
}

/// One subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionStatus {
    /// The service key, as `namespace/service/port_name`.
    #[serde(with = "key_text")]
    pub service: ServiceKey,
    /// The revision held.
    pub revision: u64,
    /// Revisions behind the newest the arbiter announced for the service's
    /// shard (0 when caught up).
    pub lag: u64,
    /// Whether the held copy is stale.
    pub stale: bool,
    /// Age of the held copy, ms: 0 while the session keeps it current,
    /// else the time since it was last known current (since the agent
    /// started, for a copy from the disk cache not confirmed yet).
    #[serde(default)]
    pub age_ms: u64,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rollcall_leases::{
        AgentEpoch, Generation, LeaseId, Liveness, Principal, PrincipalName, Reason, Revision,
        Role, State, Weight,
    };
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn endpoint_json_matches_the_contract() {
        let record = EndpointRecord {
            instance_id: InstanceId::new("checkout-1").unwrap(),
            generation: Generation(3),
            node_id: NodeId::new("node-1").unwrap(),
            epoch: AgentEpoch(1),
            lease: LeaseId(1),
            address: "10.0.0.1".parse().unwrap(),
            port: 8080,
            region: Label::new("r1").unwrap(),
            zone: Label::new("z1").unwrap(),
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            state: State::Ready,
            reason: Reason::new("registered").unwrap(),
            origin: Principal {
                role: Role::Agent,
                name: PrincipalName::new("node-1").unwrap(),
            },
            liveness: Liveness::Passing,
            revision: Revision(9),
            changed_at_ms: 1,
        };
        let value = serde_json::to_value(EndpointJson::from_record(&Arc::new(record))).unwrap();
        assert_eq!(
            value,
            json!({
                "instance_id": "checkout-1",
                "generation": 3,
                "address": "10.0.0.1",
                "port": 8080,
                "zone": "z1",
                "version": "v1",
                "weight": 100,
                "state": "READY",
                "liveness": "passing"
            })
        );
    }

    #[test]
    fn responses_have_the_contract_keys() {
        let keys = |v: Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let register = RegisterResponse {
            instance_id: InstanceId::new("checkout-1").unwrap(),
            generation: None,
            state: State::Starting.as_str().to_string(),
            pending: false,
        };
        assert_eq!(
            serde_json::to_value(&register).unwrap(),
            json!({"instance_id": "checkout-1", "generation": null, "state": "STARTING", "pending": false})
        );
        let drain = DrainResponse {
            revision: Some(12),
            pending: false,
            propagated: Some(Propagated {
                acked: 3,
                total: 4,
                complete: false,
            }),
        };
        assert_eq!(
            serde_json::to_value(&drain).unwrap(),
            json!({"revision": 12, "pending": false, "propagated": {"acked": 3, "total": 4, "complete": false}})
        );
        let endpoints = EndpointsResponse {
            service: Label::new("checkout").unwrap(),
            namespace: Label::new("default").unwrap(),
            port_name: Label::new("default").unwrap(),
            shard: 0,
            revision: 7,
            age_ms: 120,
            stale: false,
            mode: "serve".into(),
            degraded: false,
            degraded_reason: None,
            region: Label::new("r1").unwrap(),
            endpoints: Vec::new(),
            failover: None,
            writer: None,
            index: "00000000000000ff".into(),
        };
        assert_eq!(
            keys(serde_json::to_value(&endpoints).unwrap()),
            [
                "age_ms",
                "degraded",
                "degraded_reason",
                "endpoints",
                "index",
                "mode",
                "namespace",
                "port_name",
                "region",
                "revision",
                "service",
                "shard",
                "stale"
            ]
        );
        let status = StatusResponse {
            node: NodeId::new("node-1").unwrap(),
            zone: Label::new("z1").unwrap(),
            agent_epoch: 5,
            arbiter: ArbiterStatus {
                connected: true,
                address: Some("10.0.0.9:7443".into()),
                last_contact_ms: Some(40),
                catalog: Some("0123456789abcdef".into()),
                last_end: None,
            },
            lease: Some(LeaseStatus {
                id: 2,
                ttl_ms: 10_000,
            }),
            subscriptions: vec![SubscriptionStatus {
                service: ServiceKey::new("shop", "cart", "http").unwrap(),
                revision: 7,
                lag: 0,
                stale: false,
                age_ms: 0,
            }],
            pending_writes: 0,
            gossip: Some(GossipStatus {
                alive: vec![NodeId::new("node-2").unwrap()],
                down: vec![NodeId::new("node-3").unwrap()],
            }),
            tls: None,
        };
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(
            value["gossip"],
            json!({"alive": ["node-2"], "down": ["node-3"]})
        );
        assert_eq!(
            keys(value.clone()),
            [
                "agent_epoch",
                "arbiter",
                "gossip",
                "lease",
                "node",
                "pending_writes",
                "subscriptions",
                "tls",
                "zone"
            ]
        );
        assert_eq!(
            value["subscriptions"][0],
            json!({"service": "shop/cart/http", "revision": 7, "lag": 0, "stale": false, "age_ms": 0})
        );
        assert_eq!(value["lease"], json!({"id": 2, "ttl_ms": 10_000}));
        assert_eq!(
            value["arbiter"],
            json!({"connected": true, "address": "10.0.0.9:7443", "last_contact_ms": 40, "catalog": "0123456789abcdef", "last_end": null})
        );
        let back: StatusResponse = serde_json::from_value(value).unwrap();
        assert_eq!(back, status);
    }
}
