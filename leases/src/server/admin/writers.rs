//! Writer epochs over the admin API (R9, `crate::writer`), with the
//! operator token:
//!
//! - `POST /v1/policies/{namespace}/{service}/transfer` with `{"to":
//!   "r2"}` (or `{"to": "r2", "force": true, "reason": "r1 is cut off"}`):
//!   an operator moves a single-writer service's writes (`rollcall policy
//!   transfer`). Answers the epoch committed.
//! - `GET /v1/writers`: every writer epoch this region stores (past the
//!   first), for the region bridge to publish.
//! - `PUT /v1/writers` with `{"writers": [WriterEpoch, …]}`: the bridge
//!   stores epochs other regions committed; one not newer than the epoch
//!   held changes nothing.

use super::*;
use crate::name::Reason;
use crate::writer::{Transfer, WriterEpoch};

/// Most writer epochs one `PUT /v1/writers` carries.
const MAX_WRITERS_PER_CALL: usize = 4_096;

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route(
            "/v1/policies/{namespace}/{service}/transfer",
            post(transfer),
        )
        .route("/v1/writers", get(list_writers).put(put_writers))
}

/// The body of a transfer.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    /// The region to take the writes.
    to: String,
    /// Forced past an unreachable owner.
    #[serde(default)]
    force: bool,
    /// Why, required with `force`.
    #[serde(default)]
    reason: Option<String>,
}

/// A writer epoch as JSON (the `writer` of a policy answer too).
pub(super) fn writer_json(w: &WriterEpoch) -> serde_json::Value {
    serde_json::json!({
        "service": w.service.to_string(),
        "epoch": w.epoch,
        "owner": w.owner.to_string(),
        "from": w.from.as_ref().map(|f| f.to_string()),
        "settled": w.settled,
        "at_ms": w.at_ms,
        "by": w.by.to_string(),
        "committed_in": w.committed_in.to_string(),
        "forced": w.forced.as_ref().map(|r| r.as_str().to_owned()),
        "summary": w.summary(),
    })
}

async fn transfer(
    State(state): State<AdminState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    body: Result<Json<TransferBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let service = policy_key(path)?;
    let Json(body) = body.map_err(json_rejected)?;
    let invalid = |detail: String| error(StatusCode::BAD_REQUEST, "invalid_request", detail);
    let to = Label::new(&body.to).map_err(|e| invalid(format!("to: {e}")))?;
    let forced = match (body.force, body.reason.as_deref().map(str::trim)) {
        (true, Some(reason)) if !reason.is_empty() => {
            Some(Reason::new(reason).map_err(|e| invalid(format!("reason: {e}")))?)
        }
        (true, _) => {
            return Err(invalid(
                "a forced transfer needs a reason (--reason TEXT): it is written to the audit log of every region".into(),
            ))
        }
        (false, Some(_)) => {
            return Err(invalid(
                "a reason goes with a forced transfer only (--force)".into(),
            ))
        }
        (false, None) => None,
    };
    let command = Command::TransferWriter(Box::new(Transfer {
        service: service.clone(),
        to,
        forced,
    }));
    match propose(&state, vec![command]).await?.pop() {
        Some(Answer::Committed { revision, .. }) => {
            let cat = state.applied.lock();
            let writer = cat.writer(&service).map(|w| writer_json(&w));
            drop(cat);
            Ok(Json(serde_json::json!({
                "service": service.to_string(),
                "revision": revision.map(|r| r.0),
                "writer": writer,
            }))
            .into_response())
        }
        Some(Answer::Rejected { kind, message }) => Err(match kind {
            RejectKind::Unavailable => refused(kind, message),
            _ => error(StatusCode::CONFLICT, "transfer_refused", message),
        }),
        other => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("unexpected answer {other:?}"),
        )),
    }
}

async fn list_writers(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
) -> Result<Response, AdminError> {
    authorize_bridge(&state, &headers, peer.as_deref())?;
    let cat = state.applied.lock();
    let body = serde_json::json!({
        "region": cat.params().region.to_string(),
        "revision": cat.revision().0,
        "writers": cat.writers().map(|s| serde_json::json!({
            "revision": s.revision.0,
            "writer": s.writer,
        })).collect::<Vec<_>>(),
    });
    drop(cat);
    Ok(Json(body).into_response())
}

/// The body of `PUT /v1/writers`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Writers {
    writers: Vec<WriterEpoch>,
}

async fn put_writers(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
    body: Result<Json<Writers>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    let actor = authorize_bridge(&state, &headers, peer.as_deref())?;
    let Json(body) = body.map_err(json_rejected)?;
    if body.writers.len() > MAX_WRITERS_PER_CALL {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many",
            format!(
                "{} writer epochs in one call; at most {MAX_WRITERS_PER_CALL}",
                body.writers.len()
            ),
        ));
    }
    if let Some((i, w)) = body.writers.iter().enumerate().find(|(_, w)| w.epoch < 2) {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_writer",
            format!(
                "writers[{i}] ({}) has epoch {}: only transfers (epoch 2 and on) travel; nothing was applied",
                w.service, w.epoch
            ),
        ));
    }
    let keys: Vec<PolicyKey> = body.writers.iter().map(|w| w.service.clone()).collect();
    let commands = body
        .writers
        .into_iter()
        .map(|w| Command::ReplicateWriter(Box::new(w)))
        .collect();
    let mut rows = Vec::new();
    for (key, answer) in keys.iter().zip(propose_as(&state, actor, commands).await?) {
        match answer {
            Answer::Committed { revision, .. } => rows.push(serde_json::json!({
                "service": key.to_string(),
                "changed": revision.is_some(),
            })),
            Answer::Rejected { kind, message } => return Err(refused(kind, message)),
            other => {
                return Err(error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("unexpected answer {other:?}"),
                ))
            }
        }
    }
    Ok(Json(serde_json::json!({"writers": rows})).into_response())
}
