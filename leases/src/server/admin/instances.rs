//! An operator frees an instance id (issue 38, item 1): `DELETE
//! /v1/instances/{id}` (optionally `?generation=N`) deregisters the record
//! whoever holds it, so that another node may register the id. The owner's
//! own deregistration, or its expiry, frees it too; this is for the case
//! where the owner cannot (a node that is gone for good before its lease
//! ended, or an id claimed by mistake). Audited as the operator's.

use super::*;

/// `?generation=N`: free only that generation (the call is refused as
/// stale if the record moved on).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FreeQuery {
    generation: Option<u64>,
}

/// `DELETE /v1/instances/{id}`.
pub(super) async fn free(
    State(state): State<AdminState>,
    headers: HeaderMap,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    query: Result<Query<FreeQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let Path(id) =
        path.map_err(|e| error(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let Query(query) =
        query.map_err(|e| error(StatusCode::BAD_REQUEST, "bad_request", e.body_text()))?;
    let instance_id = InstanceId::new(&id).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("instance id {id:?}: {e}"),
        )
    })?;
    let held = state.applied.lock().instance(&instance_id);
    let Some(record) = held else {
        return Err(error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("instance {instance_id} is not registered: there is nothing to free"),
        ));
    };
    let generation = query.generation.map_or(record.generation, Generation);
    let command = Command::Deregister {
        instance_id: instance_id.clone(),
        generation,
    };
    match propose(&state, vec![command]).await?.pop() {
        Some(Answer::Committed { revision, .. }) => Ok(Json(serde_json::json!({
            "instance_id": instance_id.to_string(),
            "node": record.node_id.to_string(),
            "generation": generation.0,
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
