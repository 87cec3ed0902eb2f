//! The agent's local HTTP API (axum), a public contract:
//! - `PUT /v1/agent/instances` — register
//! - `GET /v1/agent/instances` — this node's registrations
//! - `PUT /v1/agent/instances/{id}/heartbeat?generation=N`
//! - `POST /v1/agent/instances/{id}/session?generation=N` — held open by
//!   the instance; when it closes without a drain, the instance is
//!   UNHEALTHY at once ("process exited")
//! - `PUT /v1/agent/instances/{id}/drain?generation=N[&wait=committed|propagated]`
//! - `DELETE /v1/agent/instances/{id}?generation=N`
//! - `GET /v1/endpoints/{service}[?namespace=&port_name=&zone=&all=true&traffic=read_only|read_write]`
//!   — with `region` and, when nothing here is usable, `failover`
//! - `GET /v1/services` — the services this agent holds, READY/total
//! - `GET /v1/regions` — other regions and policies this agent holds (R9)
//! - `GET /v1/status`
//! - `GET /metrics` (Prometheus text)
//!
//! Served on loopback TCP and on the unix socket `agent.sock` in the data
//! directory. Writes need the node token as `Authorization: Bearer <token>`
//! or, on the unix socket, a workload identity (peer uid/gid) granted the
//! service; reads need none. Errors are JSON `{error, detail}`; bad input
//! gets a 4xx and changes nothing. This module only parses, authorizes and
//! shapes answers: reads come from the endpoint view (`view`), writes go to
//! the agent actor's mailbox as `agent_state::Call`s, whose state machine
//! decides them.

use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use actix::{Message, Recipient};
use axum::extract::connect_info::ConnectInfo;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use rollcall_config::{ChecksConfig, ConnTraffic};
use rollcall_leases::clock::now_ms;
use rollcall_leases::secret::token_matches;
use rollcall_leases::{shard_of, EndpointRecord, Generation, InstanceId, Label, ServiceKey};
use serde::Deserialize;
use tokio::net::UnixListener;

use crate::agent_state::{Call, Caller, LocalEntry, Refusal, Refused, Reply, SHARDS};
use crate::api_types::{
    ApiError, EndpointJson, EndpointsResponse, FailoverJson, InstancesResponse, LocalInstanceJson,
    ServiceJson, ServicesResponse, StatusResponse, WriterJson,
};
use crate::failover::Decision;
use crate::shutdown::Shutdown;
use crate::view::{Lookup, Views};

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How often a registration session's response sends a keep-alive line.
const SESSION_KEEPALIVE: Duration = Duration::from_secs(1);

/// A local API call for the agent's state machine.
#[derive(Message)]
#[rtype(result = "Result<Reply, Refusal>")]
pub struct CallMessage(pub Call);

/// `GET /v1/status`.
#[derive(Message)]
#[rtype(result = "StatusResponse")]
pub struct StatusMessage;

/// `GET /metrics`: refresh the gauges, then render.
#[derive(Message)]
#[rtype(result = "String")]
pub struct MetricsMessage;

/// A registration session closed (its streaming answer was dropped).
#[derive(Message)]
#[rtype(result = "()")]
pub struct SessionClosedMessage {
    /// The instance.
    pub instance: InstanceId,
    /// The generation the session held.
    pub generation: Option<Generation>,
}

/// What the API needs of the agent: its view, its mailbox, and a few
/// settings. Cheap to clone.
#[derive(Clone)]
pub struct ApiContext {
    /// The endpoint view (reads).
    pub views: Views,
    /// The agent's mailbox for calls.
    pub calls: Recipient<CallMessage>,
    /// The agent's mailbox for status.
    pub status: Recipient<StatusMessage>,
    /// The agent's mailbox for metrics.
    pub metrics: Recipient<MetricsMessage>,
    /// The agent's mailbox for closed registration sessions.
    pub sessions: Recipient<SessionClosedMessage>,
    /// The node token.
    pub token: Arc<str>,
    /// The check timings a registration's checks default to.
    pub checks: ChecksConfig,
    /// This agent's region.
    pub region: Label,
    /// `[http_limits]` of the API's listeners.
    pub limits: rollcall_config::HttpLimits,
}

impl ApiContext {
    /// Who is calling (R10): an operator holding the node token (sent as
    /// `Authorization: Bearer <token>`), or, on the unix socket, a workload
    /// identified by its peer credentials.
    pub fn caller(
        &self,
        header: Option<&str>,
        peer: Option<(u32, u32)>,
    ) -> Result<Caller, ApiError> {
        match (header.and_then(|h| h.strip_prefix("Bearer ")), peer) {
            (Some(t), _) if token_matches(t.trim(), &self.token) => Ok(Caller::Operator),
            (Some(_), _) => Err(ApiError::unauthorized("the bearer token does not match agent.token in the agent's data directory")),
            (None, Some((uid, gid))) => Ok(Caller::Workload { uid, gid }),
            (None, None) => Err(ApiError::unauthorized(
                "writes need the node token (agent.token in the agent's data directory) as Authorization: Bearer <token>, or a workload identity on the agent's unix socket",
            )),
        }
    }

    /// Hands a call to the agent and waits for its answer.
    pub async fn call(&self, call: Call) -> Result<Reply, ApiError> {
        self.calls
            .send(CallMessage(call))
            .await
            .unwrap_or_else(|_| {
                Err(Refusal::new(
                    Refused::Unavailable,
                    "the agent is shutting down",
                ))
            })
            .map_err(api_error)
    }
}

/// The HTTP status and error code of a refusal (README, "Local API").
fn api_error(refusal: Refusal) -> ApiError {
    let Refusal { kind, message } = refusal;
    match kind {
        Refused::BadRequest => ApiError::bad_request(message),
        Refused::Forbidden => ApiError::forbidden(message),
        Refused::NotFound => ApiError::not_found(message),
        Refused::Conflict => ApiError::conflict(message),
        Refused::StaleGeneration => ApiError::stale_generation(message),
        Refused::Invalid => ApiError::unprocessable(message),
        Refused::Unavailable => ApiError::unavailable(message),
    }
}

mod writes;

use writes::{deregister, drain, heartbeat, register, session};

/// The API's routes.
pub fn router(agent: ApiContext) -> Router {
    Router::new()
        .route("/v1/agent/instances", put(register).get(instances))
        .route("/v1/agent/instances/{id}/heartbeat", put(heartbeat))
        .route("/v1/agent/instances/{id}/session", post(session))
        .route("/v1/agent/instances/{id}/drain", put(drain))
        .route("/v1/agent/instances/{id}", delete(deregister))
        .route("/v1/endpoints/{service}", get(endpoints))
        .route("/v1/services", get(services))
        .route("/v1/status", get(status))
        .route("/v1/regions", get(regions))
        .route("/metrics", get(metrics))
        // Our own limit answers 413 with a JSON body; axum's would answer first.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES + 1))
        .with_state(agent)
        .layer(axum::middleware::map_response(
            rollcall_leases::http::json_errors,
        ))
}

/// Serves the API on the unix socket `listener` ([`bind_unix`]),
/// identifying each caller by its peer credentials. The socket is open to
/// every local user (mode 0666): what a caller may do is decided by its
/// uid/gid, not by who can connect.
pub fn serve_unix(
    agent: ApiContext,
    listener: UnixListener,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    let limits = rollcall_leases::http::Limits::from(&agent.limits);
    tokio::spawn(rollcall_leases::http::serve(
        listener,
        router(agent),
        limits,
        |stream: &tokio::net::UnixStream, _| peer_cred(stream),
        "agent unix socket API",
        shutdown,
        None,
    ))
}

/// Binds the API's unix socket at `path` (a stale socket file of an
/// earlier run is replaced), open to every local user: workloads are told
/// apart by their peer credentials, not by the file's mode.
pub fn bind_unix(path: &FsPath) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    }
    Ok(listener)
}

/// Serves the API on a TCP listener until the shutdown signal.
pub fn serve_tcp(
    agent: ApiContext,
    listener: tokio::net::TcpListener,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    let limits = rollcall_leases::http::Limits::from(&agent.limits);
    tokio::spawn(rollcall_leases::http::serve(
        listener,
        router(agent),
        limits,
        |_, addr| *addr,
        "agent HTTP API",
        shutdown,
        None,
    ))
}

/// The peer credentials of a unix-socket caller (`SO_PEERCRED`), stored by
/// the unix listener for each connection.
#[derive(Clone, Copy, Debug)]
pub struct PeerCred {
    /// The caller's user id.
    pub uid: u32,
    /// The caller's group id.
    pub gid: u32,
}

/// The peer credentials of a unix-socket connection. A socket whose
/// credentials cannot be read gets an identity no grant can match.
fn peer_cred(stream: &tokio::net::UnixStream) -> PeerCred {
    match stream.peer_cred() {
        Ok(cred) => PeerCred {
            uid: cred.uid(),
            gid: cred.gid(),
        },
        Err(_) => PeerCred {
            uid: u32::MAX,
            gid: u32::MAX,
        },
    }
}

/// Who is calling: the node token, or a workload's peer credentials.
struct CallerOf(Caller);

impl FromRequestParts<ApiContext> for CallerOf {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, agent: &ApiContext) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let peer = parts
            .extensions
            .get::<ConnectInfo<PeerCred>>()
            .map(|c| (c.0.uid, c.0.gid));
        agent.caller(header, peer).map(CallerOf)
    }
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

fn instance_id(raw: &str) -> Result<InstanceId, ApiError> {
    InstanceId::new(raw).map_err(|e| ApiError::bad_request(e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointsQuery {
    namespace: Option<String>,
    port_name: Option<String>,
    zone: Option<String>,
    all: Option<bool>,
    traffic: Option<String>,
    index: Option<String>,
    wait_ms: Option<u64>,
}

/// Longest `wait_ms` of a blocking resolve, ms.
pub const MAX_RESOLVE_WAIT_MS: u64 = 300_000;

/// How often a blocking resolve looks again without a publication: a view
/// also changes when time passes (a local ejection ends).
const RESOLVE_RECHECK: Duration = Duration::from_millis(250);

async fn endpoints(
    State(agent): State<ApiContext>,
    Path(service): Path<String>,
    q: Result<Query<EndpointsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let key = ServiceKey::new(
        q.namespace.as_deref().unwrap_or("default"),
        &service,
        q.port_name.as_deref().unwrap_or("default"),
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let zone = q
        .zone
        .as_deref()
        .map(Label::new)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("zone: {e}")))?;
    let traffic = match q.traffic.as_deref() {
        None => ConnTraffic::ReadWrite,
        Some(t) => ConnTraffic::parse(t).ok_or_else(|| {
            ApiError::bad_request(format!("traffic: {t:?} is not read_only or read_write"))
        })?,
    };
    let all = q.all.unwrap_or(false);
    // A blocking resolve (as Consul's blocking queries): with `index`, wait
    // until the answer's index differs, or `wait_ms` passed.
    let Some(index) = q.index else {
        if q.wait_ms.is_some() {
            return Err(ApiError::bad_request(
                "wait_ms: only with index (the answer's index to wait past)",
            ));
        }
        return Ok(Json(resolve(&agent, key, zone, all, traffic).await?).into_response());
    };
    let idle_ms = agent.limits.idle_timeout_ms.saturating_sub(1_000);
    let wait_ms = q.wait_ms.unwrap_or(30_000.min(idle_ms));
    if wait_ms == 0 || wait_ms > MAX_RESOLVE_WAIT_MS.min(idle_ms) {
        return Err(ApiError::bad_request(format!(
            "wait_ms: {wait_ms} is not 1 to {} (at most {MAX_RESOLVE_WAIT_MS}, and 1 s below http_limits.idle_timeout_ms)",
            MAX_RESOLVE_WAIT_MS.min(idle_ms)
        )));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    loop {
        // Armed before the look, so a publication in between is not missed.
        let changed = agent.views.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let answer = resolve(&agent, key.clone(), zone.clone(), all, traffic).await?;
        let now = tokio::time::Instant::now();
        if answer.index != index || now >= deadline {
            return Ok(Json(answer).into_response());
        }
        let _ = tokio::time::timeout((deadline - now).min(RESOLVE_RECHECK), changed).await;
    }
}

/// An answer of the wrong kind: the agent and this module disagree.
fn unexpected(reply: Reply) -> ApiError {
    ApiError::unavailable(format!("the agent answered {reply:?}"))
}

/// `GET /v1/agent/instances`: what the agent's state machine holds of
/// this node's registrations, pending ones included.
async fn instances(State(agent): State<ApiContext>) -> Result<Response, ApiError> {
    match agent.call(Call::Instances).await? {
        Reply::Instances(entries) => Ok(Json(InstancesResponse {
            instances: entries.into_iter().map(local_instance).collect(),
        })
        .into_response()),
        other => Err(unexpected(other)),
    }
}

fn local_instance(entry: LocalEntry) -> LocalInstanceJson {
    let LocalEntry { local, checked } = entry;
    let r = local.registration;
    LocalInstanceJson {
        instance_id: r.instance_id,
        service: r.service,
        address: r.address,
        port: r.port,
        generation: local.generation.map(|g| g.get()),
        intent: local.intent.as_str().to_owned(),
        committed: local.committed,
        checked: checked.map(|s| s.as_str().to_owned()),
    }
}

/// `GET /v1/services`: the region's services as the arbiter lists them
/// (through the agent's session); when it cannot be asked, the services
/// this agent holds, from the published views.
async fn services(State(agent): State<ApiContext>) -> Result<Response, ApiError> {
    let listed = match agent.call(Call::Services).await? {
        Reply::Services(listed) => listed,
        other => return Err(unexpected(other)),
    };
    let answer = match listed {
        Some(region) => ServicesResponse {
            source: "catalog".to_owned(),
            revision: Some(region.revision.get()),
            truncated: region.truncated,
            services: region
                .services
                .into_iter()
                .map(|s| ServiceJson {
                    service: s.service,
                    revision: s.revision.get(),
                    ready: usize::try_from(s.ready).unwrap_or(usize::MAX),
                    total: usize::try_from(s.total).unwrap_or(usize::MAX),
                    stale: false,
                    age_ms: 0,
                })
                .collect(),
        },
        None => ServicesResponse {
            source: "held".to_owned(),
            revision: None,
            truncated: false,
            services: agent
                .views
                .held(now_ms())
                .into_iter()
                .map(|h| ServiceJson {
                    service: h.service,
                    revision: h.revision.get(),
                    ready: h.ready,
                    total: h.total,
                    stale: h.stale,
                    age_ms: h.age_ms,
                })
                .collect(),
        },
    };
    Ok(Json(answer).into_response())
}

async fn regions(State(agent): State<ApiContext>) -> Response {
    Json(agent.views.regions_status(now_ms())).into_response()
}

async fn status(State(agent): State<ApiContext>) -> Result<Response, ApiError> {
    match agent.status.send(StatusMessage).await {
        Ok(status) => Ok(Json(status).into_response()),
        Err(_) => Err(ApiError::unavailable("the agent is shutting down")),
    }
}

async fn metrics(State(agent): State<ApiContext>) -> Result<Response, ApiError> {
    let text = agent
        .metrics
        .send(MetricsMessage)
        .await
        .map_err(|_| ApiError::unavailable("the agent is shutting down"))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// Why an answer leaves this region, or goes nowhere.
#[derive(Clone, Copy)]
enum Elsewhere {
    /// The service has no usable endpoint here (failover, R9).
    NoLocalEndpoint,
    /// A write of a single-writer service whose writer is another region.
    Writer,
}

/// The API form of a failover decision, or of where a write goes.
fn failover_json(decision: Decision, why: Elsewhere) -> FailoverJson {
    match decision {
        Decision::Remote {
            region,
            ingress,
            ready,
        } => FailoverJson {
            detail: match why {
                Elsewhere::NoLocalEndpoint => format!(
                    "no usable endpoint in this region; traffic goes to region {region}'s ingress"
                ),
                Elsewhere::Writer => {
                    format!("region {region} owns the service's writes; they go to its ingress")
                }
            },
            region: Some(region),
            ingress: ingress.iter().map(|i| i.to_string()).collect(),
            ready,
            refused: None,
        },
        Decision::Refused(refusal) => FailoverJson {
            region: None,
            ingress: Vec::new(),
            ready: 0,
            refused: Some(refusal.as_str().to_owned()),
            detail: match why {
                Elsewhere::NoLocalEndpoint => format!(
                    "no usable endpoint in this region and no failover: {}",
                    refusal.describe()
                ),
                Elsewhere::Writer => {
                    format!("the service's writes go nowhere: {}", refusal.describe())
                }
            },
        },
    }
}

/// An answer with no local endpoint: `mode`, and where the traffic goes
/// instead (the failover's region, else this agent's own).
fn elsewhere_response(
    agent: &ApiContext,
    key: &ServiceKey,
    mode: &str,
    failover: FailoverJson,
    writer: Option<WriterJson>,
) -> EndpointsResponse {
    let mut response = EndpointsResponse {
        service: key.service.clone(),
        namespace: key.namespace.clone(),
        port_name: key.port_name.clone(),
        shard: shard_of(key, SHARDS).0,
        revision: 0,
        age_ms: 0,
        stale: false,
        mode: mode.into(),
        degraded: false,
        degraded_reason: None,
        region: failover
            .region
            .clone()
            .unwrap_or_else(|| agent.region.clone()),
        endpoints: Vec::new(),
        failover: Some(failover),
        writer,
        index: String::new(),
    };
    response.index = response.fingerprint();
    response
}

/// `GET /v1/endpoints/{service}`: answered from the local view only. The
/// first resolve of a service not yet followed subscribes and waits up to
/// `first_resolve_wait_ms` for it.
async fn resolve(
    agent: &ApiContext,
    key: ServiceKey,
    zone: Option<Label>,
    all: bool,
    traffic: ConnTraffic,
) -> Result<EndpointsResponse, ApiError> {
    let views = &agent.views;
    // The first resolve follows the service and waits for it: its policy
    // (and writer epoch) arrive with it.
    let looked = views.lookup_wait(&key).await;
    let writer = views.writer(&key).map(WriterJson::from);
    if let Some(decision) = views.writes_elsewhere(&key, traffic, now_ms()) {
        let failover = failover_json(decision, Elsewhere::Writer);
        return Ok(elsewhere_response(agent, &key, "writer", failover, writer));
    }
    let answer = match looked {
        Lookup::Serve(answer) => answer,
        Lookup::Unknown => {
            // The service may live only in another region.
            let decision = views.failover(&key, traffic, now_ms());
            if matches!(decision, Decision::Remote { .. }) {
                let failover = failover_json(decision, Elsewhere::NoLocalEndpoint);
                return Ok(elsewhere_response(
                    agent, &key, "failover", failover, writer,
                ));
            }
            return Err(ApiError::not_found(format!("service {key} does not exist")));
        }
        Lookup::CannotKnow(reason) | Lookup::Refused(reason) => {
            return Err(ApiError::unavailable(reason))
        }
    };
    let in_zone = |r: &EndpointRecord| zone.as_ref().is_none_or(|z| &r.zone == z);
    let endpoints = if all {
        answer
            .records
            .iter()
            .filter(|r| in_zone(r))
            .map(|r| {
                let mut e = EndpointJson::from_record(r);
                if answer.leaving.contains(&r.instance_id)
                    && r.state == rollcall_leases::State::Ready
                {
                    // A local drain applies to this agent's own data plane at once.
                    e.state = rollcall_leases::State::Draining.as_str().to_owned();
                }
                e
            })
            .collect()
    } else {
        answer
            .selection
            .candidates
            .iter()
            .filter(|c| in_zone(&c.record))
            .map(|c| EndpointJson::from_record(&c.record))
            .collect()
    };
    // No READY endpoint here: a failover the policy allows comes first;
    // refused, the answer keeps what protection or panic holds.
    let failover = (!answer.selection.holds_ready()).then(|| {
        failover_json(
            views.failover(&key, traffic, now_ms()),
            Elsewhere::NoLocalEndpoint,
        )
    });
    let moved = failover.as_ref().is_some_and(|f| f.region.is_some());
    let endpoints = if moved && !all { Vec::new() } else { endpoints };
    let region = match &failover {
        Some(FailoverJson {
            region: Some(r), ..
        }) => r.clone(),
        _ => agent.region.clone(),
    };
    let mut response = EndpointsResponse {
        service: key.service.clone(),
        namespace: key.namespace.clone(),
        port_name: key.port_name.clone(),
        shard: shard_of(&key, SHARDS).0,
        revision: answer.revision.get(),
        age_ms: answer.age_ms,
        stale: answer.stale,
        mode: if moved {
            "failover".into()
        } else {
            answer.selection.mode.as_str().into()
        },
        degraded: answer.degraded.is_some(),
        degraded_reason: answer.degraded.as_ref().map(|d| d.reason.clone()),
        region,
        endpoints,
        failover,
        writer,
        index: String::new(),
    };
    response.index = response.fingerprint();
    Ok(response)
}
