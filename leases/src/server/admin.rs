//! The arbiter's admin HTTP endpoint, for operators on its host (loopback by
//! default): `GET /metrics` (Prometheus text, no credential), `GET
//! /v1/status` and `GET /v1/audit?service=&since=&limit=` (operator token as
//! `Authorization: Bearer <token>`; the token is the file `admin.token` in
//! the data directory, mode 0600).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use crate::ids::Revision;
use crate::name::ServiceKey;
use crate::server::core::{AdminQuery, CoreMsg};
use crate::server::metrics::Metrics;
use crate::store::{AuditQuery, Store};

/// Most audit entries one call returns.
const MAX_AUDIT_LIMIT: usize = 10_000;

#[derive(Clone)]
struct AdminState {
    core: mpsc::Sender<CoreMsg>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    token: Arc<str>,
}

/// The admin routes.
pub fn router(
    core: mpsc::Sender<CoreMsg>,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    token: String,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/v1/status", get(status))
        .route("/v1/audit", get(audit))
        .with_state(AdminState {
            core,
            store,
            metrics,
            token: token.into(),
        })
}

/// An error answer: status and JSON `{error, detail}`.
struct AdminError {
    status: StatusCode,
    code: &'static str,
    detail: String,
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({"error": self.code, "detail": self.detail})),
        )
            .into_response()
    }
}

fn error(status: StatusCode, code: &'static str, detail: impl Into<String>) -> AdminError {
    AdminError {
        status,
        code,
        detail: detail.into(),
    }
}

fn authorize(state: &AdminState, headers: &HeaderMap) -> Result<(), AdminError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(token) if token.trim() == &*state.token => Ok(()),
        Some(_) => Err(error(StatusCode::UNAUTHORIZED, "unauthorized", "the bearer token does not match admin.token in the arbiter's data directory")),
        None => Err(error(StatusCode::UNAUTHORIZED, "unauthorized", "send the operator token (admin.token in the arbiter's data directory) as Authorization: Bearer <token>")),
    }
}

async fn ask<T>(
    state: &AdminState,
    make: impl FnOnce(oneshot::Sender<T>) -> AdminQuery,
) -> Result<T, AdminError> {
    let (tx, rx) = oneshot::channel();
    let unavailable = || {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the arbiter core is not running",
        )
    };
    state
        .core
        .send(CoreMsg::Admin(make(tx)))
        .await
        .map_err(|_| unavailable())?;
    rx.await.map_err(|_| unavailable())
}

async fn metrics_text(State(state): State<AdminState>) -> Result<Response, AdminError> {
    ask(&state, AdminQuery::RefreshMetrics).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response())
}

async fn status(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    Ok(Json(ask(&state, AdminQuery::Status).await?).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditParams {
    service: Option<String>,
    since: Option<u64>,
    limit: Option<usize>,
}

async fn audit(
    State(state): State<AdminState>,
    headers: HeaderMap,
    params: Result<Query<AuditParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let Query(params) =
        params.map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let service = params
        .service
        .as_deref()
        .map(str::parse::<ServiceKey>)
        .transpose()
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("service: {e}"),
            )
        })?;
    let query = AuditQuery {
        service,
        since: params.since.map(Revision),
        limit: params.limit.unwrap_or(1000).min(MAX_AUDIT_LIMIT),
    };
    let store = state.store.clone();
    let entries = tokio::task::spawn_blocking(move || store.audit(&query))
        .await
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, "store", e.to_string()))?
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, "store", e.to_string()))?;
    let rows: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "revision": e.revision.0,
                "at_ms": e.at_ms,
                "actor": e.actor.to_string(),
                "command": e.command,
                "services": e.services.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "instance": e.instance.as_ref().map(|i| i.to_string()),
                "detail": e.detail,
            })
        })
        .collect();
    Ok(Json(rows).into_response())
}
