//! The agent's local HTTP API (axum), a public contract:
//! - `PUT /v1/agent/instances` — register
//! - `PUT /v1/agent/instances/{id}/heartbeat?generation=N`
//! - `POST /v1/agent/instances/{id}/session?generation=N` — held open by
//!   the instance; when it closes without a drain, the instance is
//!   UNHEALTHY at once ("process exited")
//! - `PUT /v1/agent/instances/{id}/drain?generation=N[&wait=committed|propagated]`
//! - `DELETE /v1/agent/instances/{id}?generation=N`
//! - `GET /v1/endpoints/{service}[?namespace=&port_name=&zone=&all=true&traffic=read_only|read_write]`
//!   — with `region` and, when nothing here is usable, `failover`
//! - `GET /v1/regions` — other regions and policies this agent holds (R9)
//! - `GET /v1/status`
//! - `GET /metrics` (Prometheus text)
//!
//! Served on loopback TCP and on the unix socket `agent.sock` in the data
//! directory. Writes need the node token as `Authorization: Bearer <token>`
//! or, on the unix socket, a workload identity (peer uid/gid) granted the
//! service; reads need none. Errors are JSON `{error, detail}`; bad input
//! gets a 4xx and changes nothing. This module only parses, authorizes and
//! shapes answers; the agent does the work.

use std::convert::Infallible;
use std::path::Path as FsPath;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::serve::IncomingStream;
use axum::{Json, Router};
use rollcall_config::ConnTraffic;
use rollcall_leases::{InstanceId, Label, ServiceKey};
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio_stream::StreamExt;

use crate::agent::{Agent, Caller, WriteOutcome};
use crate::api_types::{parse_json, ApiError, RegisterRequest};

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How often a registration session's response sends a keep-alive line.
const SESSION_KEEPALIVE: Duration = Duration::from_secs(1);

/// The API's routes.
pub fn router(agent: Agent) -> Router {
    Router::new()
        .route("/v1/agent/instances", put(register))
        .route("/v1/agent/instances/{id}/heartbeat", put(heartbeat))
        .route("/v1/agent/instances/{id}/session", post(session))
        .route("/v1/agent/instances/{id}/drain", put(drain))
        .route("/v1/agent/instances/{id}", delete(deregister))
        .route("/v1/endpoints/{service}", get(endpoints))
        .route("/v1/status", get(status))
        .route("/v1/regions", get(regions))
        .route("/metrics", get(metrics))
        // Our own limit answers 413 with a JSON body; axum's would answer first.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES + 1))
        .with_state(agent)
}

/// Serves the API on a unix socket at `path` (replacing a stale socket
/// file), identifying each caller by its peer credentials. The socket is
/// open to every local user (mode 0666): what a caller may do is decided by
/// its uid/gid, not by who can connect.
pub async fn serve_unix(
    agent: Agent,
    path: &FsPath,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
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
    let app = router(agent).into_make_service_with_connect_info::<PeerCred>();
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "agent unix socket API stopped");
        }
    }))
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

impl Connected<IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        // A socket whose credentials cannot be read gets an identity no
        // grant can match.
        match stream.io().peer_cred() {
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
}

/// Who is calling: the node token, or a workload's peer credentials.
struct CallerOf(Caller);

impl FromRequestParts<Agent> for CallerOf {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, agent: &Agent) -> Result<Self, ApiError> {
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

fn outcome<T: Serialize>(outcome: WriteOutcome<T>) -> Response {
    match outcome {
        WriteOutcome::Committed(body) => (StatusCode::OK, Json(body)).into_response(),
        WriteOutcome::Pending(body) => (StatusCode::ACCEPTED, Json(body)).into_response(),
    }
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

fn instance_id(raw: &str) -> Result<InstanceId, ApiError> {
    InstanceId::new(raw).map_err(|e| ApiError::bad_request(e.to_string()))
}

async fn register(
    State(agent): State<Agent>,
    CallerOf(caller): CallerOf,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: RegisterRequest = parse_json(&body, MAX_BODY_BYTES)?;
    let registration = request.validate(&agent.checks_defaults())?;
    Ok(outcome(agent.register(registration, &caller).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerationQuery {
    generation: Option<u64>,
}

async fn heartbeat(
    State(agent): State<Agent>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    Ok(Json(agent.heartbeat(&instance_id(&id)?, q.generation, &caller)?).into_response())
}

/// Holds a registration session: a streaming answer of one line per second
/// while the instance's process keeps the connection open. When the
/// connection closes, the stream is dropped, and with it the guard that
/// tells the agent.
async fn session(
    State(agent): State<Agent>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let guard = agent.open_session(&instance_id(&id)?, q.generation, &caller)?;
    let ticks =
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(SESSION_KEEPALIVE));
    let lines = ticks.map(move |_| {
        let _held = &guard;
        Ok::<_, Infallible>(Bytes::from_static(b"session open\n"))
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(lines),
    )
        .into_response())
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Wait {
    Committed,
    Propagated,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainQuery {
    generation: Option<u64>,
    wait: Option<Wait>,
}

async fn drain(
    State(agent): State<Agent>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<DrainQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let propagated = q.wait == Some(Wait::Propagated);
    Ok(outcome(
        agent
            .drain(&instance_id(&id)?, q.generation, propagated, &caller)
            .await?,
    ))
}

async fn deregister(
    State(agent): State<Agent>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    Ok(outcome(
        agent
            .deregister(&instance_id(&id)?, q.generation, &caller)
            .await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointsQuery {
    namespace: Option<String>,
    port_name: Option<String>,
    zone: Option<String>,
    all: Option<bool>,
    traffic: Option<String>,
}

async fn endpoints(
    State(agent): State<Agent>,
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
    Ok(Json(
        agent
            .resolve(key, zone, q.all.unwrap_or(false), traffic)
            .await?,
    )
    .into_response())
}

async fn regions(State(agent): State<Agent>) -> Response {
    Json(agent.regions_status()).into_response()
}

async fn status(State(agent): State<Agent>) -> Response {
    Json(agent.status()).into_response()
}

async fn metrics(State(agent): State<Agent>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        agent.metrics_text(),
    )
        .into_response()
}
