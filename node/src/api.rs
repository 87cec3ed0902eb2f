//! The agent's local HTTP API (axum), a public contract:
//! - `PUT /v1/agent/instances` — register
//! - `PUT /v1/agent/instances/{id}/heartbeat?generation=N`
//! - `PUT /v1/agent/instances/{id}/drain?generation=N[&wait=committed|propagated]`
//! - `DELETE /v1/agent/instances/{id}?generation=N`
//! - `GET /v1/endpoints/{service}[?namespace=&port_name=&zone=&all=true]`
//! - `GET /v1/status`
//! - `GET /metrics` (Prometheus text)
//!
//! Writes need the node token as `Authorization: Bearer <token>`; reads
//! need none. Errors are JSON `{error, detail}`; bad input gets a 4xx and
//! changes nothing. This module only parses, authorizes and shapes answers;
//! the agent does the work.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use rollcall_leases::{InstanceId, Label, ServiceKey};
use serde::{Deserialize, Serialize};

use crate::agent::{Agent, WriteOutcome};
use crate::api_types::{parse_json, ApiError, RegisterRequest};

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The API's routes.
pub fn router(agent: Agent) -> Router {
    Router::new()
        .route("/v1/agent/instances", put(register))
        .route("/v1/agent/instances/{id}/heartbeat", put(heartbeat))
        .route("/v1/agent/instances/{id}/drain", put(drain))
        .route("/v1/agent/instances/{id}", delete(deregister))
        .route("/v1/endpoints/{service}", get(endpoints))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        // Our own limit answers 413 with a JSON body; axum's would answer first.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES + 1))
        .with_state(agent)
}

fn authorize(agent: &Agent, headers: &HeaderMap) -> Result<(), ApiError> {
    agent.check_token(
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
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
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    authorize(&agent, &headers)?;
    let request: RegisterRequest = parse_json(&body, MAX_BODY_BYTES)?;
    let registration = request.validate(&agent.checks_defaults())?;
    Ok(outcome(agent.register(registration).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerationQuery {
    generation: Option<u64>,
}

async fn heartbeat(
    State(agent): State<Agent>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    authorize(&agent, &headers)?;
    let q = query(q)?;
    Ok(Json(agent.heartbeat(&instance_id(&id)?, q.generation)?).into_response())
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
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<DrainQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    authorize(&agent, &headers)?;
    let q = query(q)?;
    let propagated = q.wait == Some(Wait::Propagated);
    Ok(outcome(
        agent
            .drain(&instance_id(&id)?, q.generation, propagated)
            .await?,
    ))
}

async fn deregister(
    State(agent): State<Agent>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    authorize(&agent, &headers)?;
    let q = query(q)?;
    Ok(outcome(
        agent.deregister(&instance_id(&id)?, q.generation).await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointsQuery {
    namespace: Option<String>,
    port_name: Option<String>,
    zone: Option<String>,
    all: Option<bool>,
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
    Ok(Json(agent.resolve(key, zone, q.all.unwrap_or(false)).await?).into_response())
}

async fn status(State(agent): State<Agent>) -> Response {
    Json(agent.status()).into_response()
}

async fn metrics(State(agent): State<Agent>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], agent.metrics_text()).into_response()
}
