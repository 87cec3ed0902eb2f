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
//!
//! For the region bridge (R9), with the same token: `GET /v1/summaries`
//! (per service: revision, READY count, summed READY weight; nothing per
//! instance), `PUT /v1/remote/{region}/policies` (store other regions'
//! policies as their home committed them, or drop the ones their home
//! deleted: `ReplicatePolicy` / `DropReplicatedPolicy` commands), and the
//! remote view, which lives in this replica's memory only, never in the
//! log: `PUT /v1/remote/{region}` (replace one region's view), `POST
//! /v1/remote/{region}/heard` (that region confirmed the view at a version
//! is current) and `GET /v1/remote` (every view with its age).
//!
//! Writer epochs (`admin/writers.rs`): `POST
//! /v1/policies/{namespace}/{service}/transfer` (`rollcall policy
//! transfer`), and for the bridge `GET /v1/writers` and `PUT /v1/writers`.
//! Policy answers carry the service's `writer` (its epoch), `null` for a
//! service with no single writer. A policy document naming
//! `single_writer.transfer_to` (superseded by the transfer) is refused.
//!
//! An operator frees an instance id another node holds: `DELETE
//! /v1/instances/{id}[?generation=N]` deregisters its record (audited as
//! the operator's).
//!
//! The region bridge has a token of its own (issue 38, item 8): the file
//! `bridge.token` beside `admin.token`. It opens the bridge's calls only
//! (`GET /v1/summaries`, `/v1/remote`, `/v1/policies`, `/v1/writers`;
//! `PUT /v1/remote/{region}`, `/v1/remote/{region}/policies`,
//! `/v1/writers`; `POST /v1/remote/{region}/heard`), anything else is
//! answered 403, and what it writes is audited as `bridge:bridge-token`.
//! The operator token opens everything, the bridge's calls included.
//!
//! Calls with a token are bounded by `[limits] admin_calls_per_second`,
//! per token (one more is answered 429 with `Retry-After`); `/metrics` is
//! not.
//! `/v1/status` also shows the TLS material this replica presents and
//! trusts (`tls`), as last reloaded.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use rollcall_config::{ConfigFile, LimitsConfig, PolicyFile};

use crate::catalog::Rejection;
use crate::command::Command;
use crate::endpoint::{Principal, Role};
use crate::http::TlsPeer;
use crate::ids::{Generation, Revision};
use crate::limits::{Bucket, Limit, Rate};
use crate::name::{InstanceId, Label, PrincipalName, ServiceKey};
use crate::peer_protocol::{MembershipChange, PeerRequest, PeerResponse};
use crate::policy::{Policy, PolicyKey, RemotePolicy, ReplicatedPolicy, StoredPolicy};
use crate::protocol::{RejectKind, Response as Answer};
use crate::raft::{AppliedCatalog, CatalogRaftNode};
use crate::remote::RegionView;
use crate::server::messages::{AdminQuery, CoreMsg};
use crate::server::metrics::Metrics;
use crate::server::peer::Peers;
use crate::server::status::raft_json;

mod audit;
mod instances;
mod policies;
mod remote;
mod writers;

/// What the admin endpoint reads and drives.
#[derive(Clone)]
pub struct AdminState {
    /// The core.
    pub core: mpsc::Sender<CoreMsg>,
    /// The applied catalog (its audit log).
    pub applied: AppliedCatalog,
    /// This replica's Raft node.
    pub raft: CatalogRaftNode,
    /// Every shard's group on this replica (shard 0's is `raft`).
    pub shards: super::shards::Shards,
    /// The client to the other replicas.
    pub peers: Arc<Peers>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The operator token.
    pub token: Arc<str>,
    /// The region bridge's token (its calls only).
    pub bridge_token: Arc<str>,
    /// How long one write may take (`raft.write_timeout_ms`).
    pub write_timeout: std::time::Duration,
    /// The TLS material this replica presents (`tls` in `/v1/status`, the
    /// certificate expiry metrics).
    pub tls: Arc<crate::tls::LiveTls>,
    /// `limits.admin_calls_per_second` of the operator token.
    pub calls: Arc<AdminCalls>,
    /// The same limit, of the bridge's token.
    pub bridge_calls: Arc<AdminCalls>,
    /// Whether this replica was removed from its group: then every call
    /// but `/metrics` answers `410 removed`.
    pub removed: super::removal::Removed,
}

/// The admin calls made with one token (`admin.token` or
/// `bridge.token`): at most `limits.admin_calls_per_second`,
/// `admin_call_burst` at once.
pub struct AdminCalls {
    per_second: u32,
    origin: std::time::Instant,
    bucket: std::sync::Mutex<Bucket>,
}

impl AdminCalls {
    /// A full bucket under `limits`.
    pub fn new(limits: &LimitsConfig) -> Arc<AdminCalls> {
        Arc::new(AdminCalls {
            per_second: limits.admin_calls_per_second,
            origin: std::time::Instant::now(),
            bucket: std::sync::Mutex::new(Bucket::new(
                Rate::new(limits.admin_calls_per_second, limits.admin_call_burst),
                0,
            )),
        })
    }

    /// Takes one call; `Err` with the ms until one is due.
    fn take(&self) -> Result<(), u64> {
        let now = self.origin.elapsed().as_millis() as u64;
        self.bucket
            .lock()
            .expect("admin call bucket lock")
            .take(now)
    }
}

/// The admin routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/v1/status", get(status))
        .route("/v1/audit", get(audit::audit))
        .route("/v1/cluster", get(cluster))
        .route("/v1/cluster/members", axum::routing::post(add_member))
        .route("/v1/cluster/members/{id}", delete(remove_member))
        .route("/v1/instances/{id}", delete(instances::free))
        .merge(policies::routes())
        .merge(remote::routes())
        .merge(writers::routes())
        .with_state(state)
        .layer(axum::middleware::map_response(crate::http::json_errors))
}

/// A body that is not the JSON expected: 400, or 413 over the size limit.
fn json_rejected(e: axum::extract::rejection::JsonRejection) -> AdminError {
    let status = match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    };
    error(status, crate::http::code_for(status), e.body_text())
}

async fn cluster(
    State(state): State<AdminState>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let metrics = state.raft.metrics().borrow().clone();
    let mut cluster = raft_json(&metrics);
    cluster["shards"] = state.shards.status_json();
    Ok(Json(cluster).into_response())
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
    let Json(body) = body.map_err(json_rejected)?;
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
    let audited = change.clone();
    let metrics = state.raft.metrics().borrow().clone();
    let leader = metrics.current_leader;
    let answer = if leader == Some(metrics.id) {
        super::membership::change_membership(
            &state.shards,
            &state.peers,
            change,
            state.write_timeout,
        )
        .await
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
            Ok(_) => crate::answers::unavailable(format!(
                "the leader at {addr} answered out of protocol"
            )),
            Err(e) => crate::answers::unavailable(e.to_string()),
        }
    };
    match &answer {
        crate::protocol::Response::Committed { .. } => {
            tracing::info!(target: "rollcall::audit", identity = %operator(), change = ?audited, "membership changed");
        }
        crate::protocol::Response::Rejected { message, .. } => {
            tracing::warn!(target: "rollcall::audit", identity = %operator(), change = ?audited, reason = %message, "membership change refused");
        }
        _ => {}
    }
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
    /// Seconds a caller should wait (`Retry-After`), for 429.
    retry_after_s: Option<u64>,
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let body = Json(serde_json::json!({"error": self.code, "detail": self.detail}));
        match self.retry_after_s {
            Some(seconds) => (
                self.status,
                [(header::RETRY_AFTER, seconds.to_string())],
                body,
            )
                .into_response(),
            None => (self.status, body).into_response(),
        }
    }
}

fn error(status: StatusCode, code: &'static str, detail: impl Into<String>) -> AdminError {
    AdminError {
        status,
        code,
        detail: detail.into(),
        retry_after_s: None,
    }
}

/// 429 for a token over its rate, `wait_ms` before its next call is
/// allowed. `Retry-After` counts whole seconds, so the wait is rounded up
/// to them and the detail says the same number.
fn rate_limited(per_second: impl std::fmt::Display, wait_ms: u64) -> AdminError {
    let seconds = wait_ms.div_ceil(1_000).max(1);
    AdminError {
        retry_after_s: Some(seconds),
        ..error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "the operator token made more than {per_second} calls per second (arbiter limits.admin_calls_per_second); retry after {seconds} s (Retry-After)"
            ),
        )
    }
}

/// Who called, by the token they sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caller {
    /// The operator token, `admin.token`: every call.
    Operator,
    /// The bridge's token, `bridge.token`: the bridge's calls only.
    Bridge,
}

impl Caller {
    /// The actor of the caller's writes: the token's, or, on HTTPS with a
    /// client certificate of this region and of the token's role, the
    /// certificate's (`bridge:bridge-r1` rather than
    /// `bridge:bridge-token`). A certificate of another role or region
    /// names nobody: the token alone decides what the call may do.
    fn principal(self, region: &Label, peer: Option<&TlsPeer>) -> Principal {
        let role = match self {
            Caller::Operator => Role::Operator,
            Caller::Bridge => Role::Bridge,
        };
        if let Some(TlsPeer(identity)) = peer {
            if identity.principal.role == role && &identity.region == region {
                return identity.principal.clone();
            }
        }
        match self {
            Caller::Operator => operator(),
            Caller::Bridge => Principal {
                role: Role::Bridge,
                name: PrincipalName::new("bridge-token").expect("a valid constant"),
            },
        }
    }
}

/// The caller a request's bearer token names, within its token's rate.
fn caller(state: &AdminState, headers: &HeaderMap) -> Result<Caller, AdminError> {
    if let Some(removal) = state.removed.get() {
        return Err(error(StatusCode::GONE, "removed", removal.describe()));
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let (caller, calls) = match given.map(str::trim) {
        Some(token) if crate::secret::token_matches(token, &state.token) => {
            (Caller::Operator, &state.calls)
        }
        Some(token) if crate::secret::token_matches(token, &state.bridge_token) => {
            (Caller::Bridge, &state.bridge_calls)
        }
        Some(_) => return Err(error(StatusCode::UNAUTHORIZED, "unauthorized", "the bearer token matches neither admin.token nor bridge.token in the arbiter's data directory")),
        None => return Err(error(StatusCode::UNAUTHORIZED, "unauthorized", "send the operator token (admin.token in the arbiter's data directory) as Authorization: Bearer <token>")),
    };
    calls.take().map_err(|wait_ms| {
        state.metrics.hit(Limit::AdminCalls);
        rate_limited(calls.per_second, wait_ms)
    })?;
    Ok(caller)
}

/// An operator's call: the bridge's token is refused `403`.
fn authorize(state: &AdminState, headers: &HeaderMap) -> Result<(), AdminError> {
    match caller(state, headers)? {
        Caller::Operator => Ok(()),
        Caller::Bridge => Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the bridge's token (bridge.token) opens only the region bridge's calls (summaries, remote views and policies, writer epochs); use the operator token (admin.token)",
        )),
    }
}

/// One of the region bridge's calls: either token; the actor of what it
/// writes (named by the client certificate on HTTPS, see
/// `Caller::principal`).
fn authorize_bridge(
    state: &AdminState,
    headers: &HeaderMap,
    peer: Option<&TlsPeer>,
) -> Result<Principal, AdminError> {
    let region = state.tls.identity().region;
    caller(state, headers).map(|caller| caller.principal(&region, peer))
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
    state.shards.set_metrics(&state.metrics);
    crate::server::metrics::set_certificate_expiry(
        &state.metrics.certificate_expiry,
        &state.tls.status(),
        crate::clock::now_ms() as i64 / 1_000,
    );
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
    let mut status = ask(&state, AdminQuery::Status).await?;
    status["tls"] = serde_json::to_value(state.tls.status()).unwrap_or_default();
    status["shards"] = state.shards.status_json();
    Ok(Json(status).into_response())
}

/// The actor of writes made with the operator token (the audit log's
/// `operator:admin-token`).
fn operator() -> Principal {
    Principal {
        role: Role::Operator,
        name: PrincipalName::new("admin-token").expect("a valid constant"),
    }
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

/// Proposes each command as the operator's (`propose_as`).
async fn propose(state: &AdminState, commands: Vec<Command>) -> Result<Vec<Answer>, AdminError> {
    propose_as(state, operator(), commands).await
}

/// Proposes each command through the core as `actor`'s, all at once (they
/// share a Raft batch), and answers each in order once committed and
/// applied here.
async fn propose_as(
    state: &AdminState,
    actor: Principal,
    commands: Vec<Command>,
) -> Result<Vec<Answer>, AdminError> {
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
            actor: actor.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37, item 6: a 429's `Retry-After` and its detail name the same
    /// wait (a 3 ms wait was "Retry-After: 1" and "retry in 3 ms").
    #[test]
    fn a_429_says_the_same_wait_in_its_header_and_its_detail() {
        for (wait_ms, seconds) in [(3, 1), (1_000, 1), (1_001, 2), (0, 1)] {
            let answer = rate_limited(100, wait_ms).into_response();
            assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                answer.headers()[header::RETRY_AFTER],
                seconds.to_string(),
                "{wait_ms} ms"
            );
            let detail = rate_limited(100, wait_ms).detail;
            assert!(
                detail.ends_with(&format!("retry after {seconds} s (Retry-After)")),
                "{detail}"
            );
        }
    }
}
