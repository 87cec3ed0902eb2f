//! Service policies over the admin API (R9), with the operator token:
//! `PUT /v1/policies` (validated whole, every home region checked, before
//! anything is proposed), `GET /v1/policies`, `GET` and `DELETE
//! /v1/policies/{namespace}/{service}`. Policy answers carry the service's
//! writer epoch (`writer`).

use super::*;

pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/v1/policies", get(list_policies).put(put_policies))
        .route(
            "/v1/policies/{namespace}/{service}",
            get(get_policy).delete(delete_policy),
        )
}

/// A stored policy as JSON: the document as written, with the revision,
/// time and actor of the change that set it. A policy homed here is its
/// own home version (`home_revision` = `revision`).
fn policy_json(stored: &StoredPolicy) -> serde_json::Value {
    serde_json::json!({
        "service": stored.policy.key().to_string(),
        "home_region": stored.policy.home_region().to_string(),
        "revision": stored.revision.0,
        "set_at_ms": stored.set_at_ms,
        "set_by": stored.set_by.to_string(),
        "replicated": false,
        "home_revision": stored.revision.0,
        "home_set_at_ms": stored.set_at_ms,
        "policy": stored.policy.document(),
    })
}

/// A policy replicated from its home region as JSON: like `policy_json`,
/// with the home's revision and time next to the local ones.
fn replicated_json(held: &ReplicatedPolicy) -> serde_json::Value {
    let policy = &held.remote.policy;
    serde_json::json!({
        "service": policy.key().to_string(),
        "home_region": policy.home_region().to_string(),
        "revision": held.revision.0,
        "set_at_ms": held.set_at_ms,
        "set_by": held.set_by.to_string(),
        "replicated": true,
        "home_revision": held.remote.home_revision.0,
        "home_set_at_ms": held.remote.home_set_at_ms,
        "policy": policy.document(),
    })
}

async fn put_policies(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Json<PolicyFile>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize(&state, &headers)?;
    let Json(file) = body.map_err(json_rejected)?;
    file.validate().map_err(|e| {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_policy",
            e.to_string(),
        )
    })?;
    if let Some((i, p)) = file.policy.iter().enumerate().find(|(_, p)| {
        p.single_writer
            .as_ref()
            .is_some_and(|w| w.transfer_to.is_some())
    }) {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_policy",
            format!(
                "policy[{i}].single_writer.transfer_to ({}) is superseded: remove it and move the writes with `rollcall policy transfer {} --to REGION` (nothing in this document was applied)",
                p.service, p.service
            ),
        ));
    }
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
    peer: Option<Extension<TlsPeer>>,
) -> Result<Response, AdminError> {
    authorize_bridge(&state, &headers, peer.as_deref())?;
    let cat = state.applied.lock();
    let mut rows: Vec<(PolicyKey, serde_json::Value)> = cat
        .policies()
        .map(|p| (p.policy.key().clone(), policy_json(p)))
        .chain(
            cat.replicated_policies()
                .map(|p| (p.remote.policy.key().clone(), replicated_json(p))),
        )
        .collect();
    for (key, row) in &mut rows {
        row["writer"] = cat
            .writer(key)
            .map_or(serde_json::Value::Null, |w| writers::writer_json(&w));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let body = serde_json::json!({
        "region": cat.params().region.to_string(),
        "revision": cat.revision().0,
        "policies": rows.into_iter().map(|(_, row)| row).collect::<Vec<_>>(),
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
    let found = cat
        .policy(&key)
        .map(policy_json)
        .or_else(|| cat.replicated_policy(&key).map(replicated_json))
        .map(|mut row| {
            row["writer"] = cat
                .writer(&key)
                .map_or(serde_json::Value::Null, |w| writers::writer_json(&w));
            row
        });
    let answer = match found {
        Some(row) => Ok(Json(row).into_response()),
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
