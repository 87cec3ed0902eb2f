//! The arbiter's admin HTTP endpoint, for operators on its host (loopback by
//! default): `GET /metrics` (Prometheus text, no credential); with the
//! operator token as `Authorization: Bearer <token>` (the file `admin.token`
//! in the data directory, mode 0600): `GET /v1/status`, `GET
//! /v1/audit?service=&since=&limit=`, `GET /v1/cluster` (the Raft group),
//! `POST /v1/cluster/members` (`{"id": 4, "addr": "host:port"}`: add a
//! replica) and `DELETE /v1/cluster/members/{id}` (remove one). Membership
//! changes sent to a follower are handed to the leader.
//!
//! Service policies (R9), with the same token: `PUT /v1/policies` (a policy
//! document: `{"policy": [ServicePolicy, …]}`, the JSON form of a policy
//! file), `GET /v1/policies`, `GET /v1/policies/{namespace}/{service}` and
//! `DELETE /v1/policies/{namespace}/{service}`. A document is validated
//! whole and every policy's home region checked before anything is
//! proposed, so bad input changes nothing; writes are proposed through the
//! core like agents' writes (a follower hands them to the leader).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use rollcall_config::{ConfigFile, PolicyFile};

use crate::audit::AuditQuery;
use crate::catalog::Rejection;
use crate::command::Command;
use crate::endpoint::{Principal, Role};
use crate::ids::Revision;
use crate::name::{PrincipalName, ServiceKey};
use crate::policy::{Policy, PolicyKey, StoredPolicy};
use crate::protocol::{
    MembershipChange, PeerRequest, PeerResponse, RejectKind, Response as Answer,
};
use crate::raft::{AppliedCatalog, CatalogRaftNode};
use crate::server::core::{raft_json, AdminQuery, CoreMsg};
use crate::server::metrics::Metrics;
use crate::server::peer::{self, Peers};

/// Most audit entries one call returns.
const MAX_AUDIT_LIMIT: usize = 10_000;

/// What the admin endpoint reads and drives.
#[derive(Clone)]
pub struct AdminState {
    /// The core.
    pub core: mpsc::Sender<CoreMsg>,
    /// The applied catalog (its audit log).
    pub applied: AppliedCatalog,
    /// This replica's Raft node.
    pub raft: CatalogRaftNode,
    /// The client to the other replicas.
    pub peers: Arc<Peers>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The operator token.
    pub token: Arc<str>,
    /// How long one write may take (`raft.write_timeout_ms`).
    pub write_timeout: std::time::Duration,
}

/// The admin routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/v1/status", get(status))
        .route("/v1/audit", get(audit))
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/members", axum::routing::post(add_member))
        .route("/v1/cluster/members/{id}", delete(remove_member))
        .route("/v1/policies", get(list_policies).put(put_policies))
        .route(
            "/v1/policies/{namespace}/{service}",
            get(get_policy).delete(delete_policy),
        )
        .with_state(state)
}

async fn cluster(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let metrics = state.raft.metrics().borrow().clone();
    Ok(Json(raft_json(&metrics)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMember {
    id: u64,
    addr: String,
}

async fn add_member(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Json<AddMember>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let Json(body) =
        body.map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    if body.id == 0 {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "id: must be at least 1",
        ));
    }
    let port_ok = body
        .addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "addr: {:?} must be host:port (the replica's QUIC listen address)",
                body.addr
            ),
        ));
    }
    membership(
        &state,
        MembershipChange::Add {
            id: body.id,
            addr: body.addr,
        },
    )
    .await
}

async fn remove_member(
    State(state): State<AdminState>,
    headers: HeaderMap,
    id: Result<Path<u64>, axum::extract::rejection::PathRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let Path(id) =
        id.map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    membership(&state, MembershipChange::Remove { id }).await
}

/// Applies a membership change here when this replica leads, else hands it
/// to the leader; answers the group as it is afterwards.
async fn membership(state: &AdminState, change: MembershipChange) -> Result<Response, AdminError> {
    let metrics = state.raft.metrics().borrow().clone();
    let leader = metrics.current_leader;
    let answer = if leader == Some(metrics.id) {
        peer::change_membership(&state.raft, change, state.write_timeout).await
    } else {
        let addr = leader.and_then(|id| {
            metrics
                .membership_config
                .nodes()
                .find(|(n, _)| **n == id)
                .map(|(_, node)| node.addr.clone())
        });
        let Some(addr) = addr else {
            return Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "no leader is known (an election is running, or there is no quorum); retry",
            ));
        };
        match state
            .peers
            .call(
                &addr,
                &PeerRequest::Membership(change),
                state.write_timeout * 21,
            )
            .await
        {
            Ok(PeerResponse::Answer(answer)) => answer,
            Ok(_) => peer::unavailable(format!("the leader at {addr} answered out of protocol")),
            Err(e) => peer::unavailable(e.to_string()),
        }
    };
    match answer {
        crate::protocol::Response::Committed { .. } => {
            let metrics = state.raft.metrics().borrow().clone();
            Ok(Json(raft_json(&metrics)).into_response())
        }
        crate::protocol::Response::Rejected { kind, message } => {
            let (status, code) = match kind {
                RejectKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                RejectKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
                _ => (StatusCode::UNPROCESSABLE_ENTITY, "refused"),
            };
            Err(error(status, code, message))
        }
        other => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
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
    let applied = state.applied.clone();
    let entries = tokio::task::spawn_blocking(move || applied.audit(&query))
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

/// The actor of writes made with the operator token (the audit log's
/// `operator:admin-token`).
fn operator() -> Principal {
    Principal {
        role: Role::Operator,
        name: PrincipalName::new("admin-token").expect("a valid constant"),
    }
}

/// A stored policy as JSON: the document as written, with the revision,
/// time and actor of the change that set it.
fn policy_json(stored: &StoredPolicy) -> serde_json::Value {
    serde_json::json!({
        "service": stored.policy.key().to_string(),
        "home_region": stored.policy.home_region().to_string(),
        "revision": stored.revision.0,
        "set_at_ms": stored.set_at_ms,
        "set_by": stored.set_by.to_string(),
        "policy": stored.policy.document(),
    })
}

/// The policy key of a `{namespace}/{service}` path.
fn policy_key(
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<PolicyKey, AdminError> {
    let Path((namespace, service)) =
        path.map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    PolicyKey::new(&namespace, &service)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))
}

/// An arbiter's refusal of a policy write as an HTTP error.
fn refused(kind: RejectKind, message: String) -> AdminError {
    match kind {
        RejectKind::Unavailable => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message),
        RejectKind::NotFound => error(StatusCode::NOT_FOUND, "not_found", message),
        RejectKind::Forbidden => error(StatusCode::FORBIDDEN, "not_home_region", message),
        RejectKind::StaleGeneration | RejectKind::Invalid => {
            error(StatusCode::UNPROCESSABLE_ENTITY, "refused", message)
        }
    }
}

/// Proposes each command through the core, all at once (they share a Raft
/// batch), and answers each in order once committed and applied here.
async fn propose(state: &AdminState, commands: Vec<Command>) -> Result<Vec<Answer>, AdminError> {
    let unavailable = || {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the arbiter core is not running",
        )
    };
    let mut replies = Vec::with_capacity(commands.len());
    for command in commands {
        let (reply, rx) = oneshot::channel();
        let msg = CoreMsg::Admin(AdminQuery::Propose {
            actor: operator(),
            command,
            reply,
        });
        state.core.send(msg).await.map_err(|_| unavailable())?;
        replies.push(rx);
    }
    let mut answers = Vec::with_capacity(replies.len());
    for rx in replies {
        answers.push(rx.await.map_err(|_| unavailable())?);
    }
    Ok(answers)
}

async fn put_policies(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Json<PolicyFile>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let Json(file) =
        body.map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    file.validate().map_err(|e| {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_policy",
            e.to_string(),
        )
    })?;
    let here = state.applied.lock().params().region.clone();
    let mut policies = Vec::with_capacity(file.policy.len());
    for (i, document) in file.policy.into_iter().enumerate() {
        let policy = Policy::new(document).map_err(|e| {
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_policy",
                format!("policy[{i}]: {e}"),
            )
        })?;
        if policy.home_region() != &here {
            let refusal = Rejection::NotHomeRegion {
                service: policy.key().clone(),
                home: policy.home_region().clone(),
                here: here.clone(),
            };
            return Err(error(
                StatusCode::FORBIDDEN,
                "not_home_region",
                format!(
                    "policy[{i}]: {refusal}; apply it through region {}'s arbiter (nothing in this document was applied)",
                    policy.home_region()
                ),
            ));
        }
        policies.push(policy);
    }
    let keys: Vec<PolicyKey> = policies.iter().map(|p| p.key().clone()).collect();
    let answers = propose(
        &state,
        policies
            .into_iter()
            .map(|p| Command::SetPolicy(Box::new(p)))
            .collect(),
    )
    .await?;
    let mut applied = Vec::new();
    let mut failed = Vec::new();
    for (i, (key, answer)) in keys.iter().zip(answers).enumerate() {
        match answer {
            Answer::Committed { revision, .. } => applied.push((key, revision)),
            Answer::Rejected { kind, message } => failed.push((i, key, kind, message)),
            other => failed.push((
                i,
                key,
                RejectKind::Invalid,
                format!("unexpected answer {other:?}"),
            )),
        }
    }
    if let Some((_, _, kind, _)) = failed.first() {
        let mut detail: Vec<String> = failed
            .iter()
            .map(|(i, key, _, message)| format!("policy[{i}] ({key}): {message}"))
            .collect();
        if !applied.is_empty() {
            let done: Vec<String> = applied.iter().map(|(key, _)| key.to_string()).collect();
            detail.push(format!(
                "committed: {}; applying the document again changes nothing for those",
                done.join(", ")
            ));
        }
        return Err(refused(*kind, detail.join("; ")));
    }
    let cat = state.applied.lock();
    let rows: Vec<serde_json::Value> = applied
        .iter()
        .map(|(key, revision)| {
            let current = cat.policy(key).map(|p| p.revision.0);
            serde_json::json!({
                "service": key.to_string(),
                "revision": revision.map(|r| r.0).or(current),
                "changed": revision.is_some(),
            })
        })
        .collect();
    let body = serde_json::json!({"revision": cat.revision().0, "policies": rows});
    drop(cat);
    Ok(Json(body).into_response())
}

async fn list_policies(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let cat = state.applied.lock();
    let body = serde_json::json!({
        "region": cat.params().region.to_string(),
        "revision": cat.revision().0,
        "policies": cat.policies().map(policy_json).collect::<Vec<_>>(),
    });
    drop(cat);
    Ok(Json(body).into_response())
}

async fn get_policy(
    State(state): State<AdminState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let key = policy_key(path)?;
    let cat = state.applied.lock();
    let answer = match cat.policy(&key) {
        Some(stored) => Ok(Json(policy_json(stored)).into_response()),
        None => Err(error(
            StatusCode::NOT_FOUND,
            "not_found",
            Rejection::UnknownPolicy {
                service: key,
                region: cat.params().region.clone(),
            }
            .to_string(),
        )),
    };
    drop(cat);
    answer
}

async fn delete_policy(
    State(state): State<AdminState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let key = policy_key(path)?;
    let command = Command::DeletePolicy {
        service: key.clone(),
    };
    let answer = propose(&state, vec![command]).await?.pop();
    match answer {
        Some(Answer::Committed { revision, .. }) => Ok(Json(serde_json::json!({
            "service": key.to_string(),
            "revision": revision.map(|r| r.0),
        }))
        .into_response()),
        Some(Answer::Rejected { kind, message }) => Err(refused(kind, message)),
        other => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
}
