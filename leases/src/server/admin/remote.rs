//! The admin calls of the region bridge (R9), with its token or the
//! operator's:
//! this region's per-service summaries for the other regions, the other
//! regions' views (kept in this replica's memory, never in the log) and
//! their policies (replicated through the log).

use super::*;

/// Largest body of a bridge's remote-view or remote-policy call: a region's
/// whole view (up to `MAX_REGION_SUMMARIES` summaries) in JSON.
const MAX_REMOTE_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The bridge's routes.
pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/v1/summaries", get(summaries))
        .route("/v1/remote", get(list_remote))
        .route(
            "/v1/remote/{region}",
            put(put_remote).layer(DefaultBodyLimit::max(MAX_REMOTE_BODY_BYTES)),
        )
        .route("/v1/remote/{region}/heard", post(remote_heard))
        .route(
            "/v1/remote/{region}/policies",
            put(put_remote_policies).layer(DefaultBodyLimit::max(MAX_REMOTE_BODY_BYTES)),
        )
}

async fn summaries(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
) -> Result<Response, AdminError> {
    authorize_bridge(&state, &headers, peer.as_deref())?;
    let cat = state.applied.lock();
    let rows: Vec<serde_json::Value> = cat
        .ready_summaries()
        .into_iter()
        .map(|s| {
            serde_json::json!({
                "service": s.service.to_string(),
                "revision": s.revision.0,
                "ready": s.ready,
                "weight": s.ready_weight,
            })
        })
        .collect();
    let body = serde_json::json!({
        "region": cat.params().region.to_string(),
        "revision": cat.revision().0,
        "summaries": rows,
    });
    drop(cat);
    Ok(Json(body).into_response())
}

/// The region of a `/v1/remote/{region}` path: another region than this
/// arbiter's.
fn remote_region(
    state: &AdminState,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Label, AdminError> {
    let Path(region) =
        path.map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let region = Label::new(&region)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))?;
    let here = state.applied.lock().params().region.clone();
    if region == here {
        return Err(error(
            StatusCode::FORBIDDEN,
            "own_region",
            format!("region {region} is this arbiter's own region; the remote view and replicated policies are of other regions only"),
        ));
    }
    Ok(region)
}

async fn list_remote(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
) -> Result<Response, AdminError> {
    authorize_bridge(&state, &headers, peer.as_deref())?;
    Ok(Json(ask(&state, AdminQuery::Remote).await?).into_response())
}

/// `PUT /v1/remote/{region}`: one region's whole view.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ViewReport {
    view: RegionView,
    heard_ms_ago: u64,
    max_age_ms: u64,
}

async fn put_remote(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    body: Result<Json<ViewReport>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    let actor = authorize_bridge(&state, &headers, peer.as_deref())?;
    let region = remote_region(&state, path)?;
    let Json(report) = body.map_err(json_rejected)?;
    if report.view.region != region {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "the view is of region {}, but the path names region {region}",
                report.view.region
            ),
        ));
    }
    remote_values(report.view.version, report.heard_ms_ago)?;
    let most = rollcall_config::MAX_SUMMARY_MAX_AGE_MS;
    if !(1..=most).contains(&report.max_age_ms) {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!(
                "max_age_ms = {} must be between 1 and {most}",
                report.max_age_ms
            ),
        ));
    }
    let version = report.view.version;
    ask(&state, |reply| AdminQuery::PutRemote {
        view: report.view,
        heard_ms_ago: report.heard_ms_ago,
        max_age_ms: report.max_age_ms,
        reply,
    })
    .await?
    .map_err(|e| error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_view", e))?;
    // The remote view lives in memory, never in the log: the audit of a
    // write to it is this line.
    tracing::info!(target: "rollcall::audit", identity = %actor, region = %region, version = version.0, "remote view replaced");
    Ok(
        Json(serde_json::json!({"region": region.to_string(), "version": version.0}))
            .into_response(),
    )
}

/// Largest view version accepted: the largest integer JSON carries exactly
/// (2^53 − 1). A version is a home region's catalog revision, one per
/// commit, so no real one comes near it.
const MAX_REMOTE_VERSION: u64 = (1 << 53) - 1;

/// Refuses (422, naming the field, changing nothing) a remote view's
/// version beyond [`MAX_REMOTE_VERSION`] and a `heard_ms_ago` above the
/// longest summary age: a view heard longer ago than any view may be old
/// is stale on arrival, and u64::MAX made its age "56 years".
fn remote_values(version: Revision, heard_ms_ago: u64) -> Result<(), AdminError> {
    let most = rollcall_config::MAX_SUMMARY_MAX_AGE_MS;
    if version.0 > MAX_REMOTE_VERSION {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!(
                "version = {} must be at most {MAX_REMOTE_VERSION}",
                version.0
            ),
        ));
    }
    if heard_ms_ago > most {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("heard_ms_ago = {heard_ms_ago} must be at most {most}"),
        ));
    }
    Ok(())
}

/// `POST /v1/remote/{region}/heard`: the view at `version` is current.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Heard {
    version: Revision,
    as_of_ms: u64,
    heard_ms_ago: u64,
}

async fn remote_heard(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    body: Result<Json<Heard>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    authorize_bridge(&state, &headers, peer.as_deref())?;
    let region = remote_region(&state, path)?;
    let Json(heard) = body.map_err(json_rejected)?;
    remote_values(heard.version, heard.heard_ms_ago)?;
    let confirmed = ask(&state, |reply| AdminQuery::RemoteHeard {
        region: region.clone(),
        version: heard.version,
        as_of_ms: heard.as_of_ms,
        heard_ms_ago: heard.heard_ms_ago,
        reply,
    })
    .await?;
    if !confirmed {
        return Err(error(
            StatusCode::CONFLICT,
            "unknown_version",
            format!(
                "this replica holds no view of region {region} at version {}; send the whole view (PUT /v1/remote/{region})",
                heard.version
            ),
        ));
    }
    Ok(
        Json(serde_json::json!({"region": region.to_string(), "version": heard.version.0}))
            .into_response(),
    )
}

/// `PUT /v1/remote/{region}/policies`: policies of `region` to store as
/// their home committed them, and ones their home deleted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemotePolicies {
    #[serde(default)]
    policies: Vec<RemotePolicy>,
    #[serde(default)]
    removed: Vec<RemovedPolicy>,
}

/// A policy its home region deleted, by the home's revision then.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemovedPolicy {
    service: String,
    home_revision: Revision,
}

async fn put_remote_policies(
    State(state): State<AdminState>,
    headers: HeaderMap,
    peer: Option<Extension<TlsPeer>>,
    path: Result<Path<String>, axum::extract::rejection::PathRejection>,
    body: Result<Json<RemotePolicies>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, AdminError> {
    let actor = authorize_bridge(&state, &headers, peer.as_deref())?;
    let region = remote_region(&state, path)?;
    let Json(body) = body.map_err(json_rejected)?;
    let mut commands = Vec::with_capacity(body.policies.len() + body.removed.len());
    let mut keys = Vec::with_capacity(commands.capacity());
    for (i, remote) in body.policies.into_iter().enumerate() {
        if remote.policy.home_region() != &region {
            return Err(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_policy",
                format!(
                    "policies[{i}] ({}) has home region {}, not {region}; nothing was applied",
                    remote.policy.key(),
                    remote.policy.home_region()
                ),
            ));
        }
        keys.push(remote.policy.key().clone());
        commands.push(Command::ReplicatePolicy(Box::new(remote)));
    }
    let replicated = commands.len();
    for (i, removed) in body.removed.into_iter().enumerate() {
        let service = removed.service.parse::<PolicyKey>().map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("removed[{i}].service: {e}"),
            )
        })?;
        keys.push(service.clone());
        commands.push(Command::DropReplicatedPolicy {
            service,
            home: region.clone(),
            home_revision: removed.home_revision,
        });
    }
    let answers = propose_as(&state, actor, commands).await?;
    let mut policies = Vec::new();
    let mut removed = Vec::new();
    let mut refused = Vec::new();
    for (i, (key, answer)) in keys.iter().zip(answers).enumerate() {
        let rows = if i < replicated {
            &mut policies
        } else {
            &mut removed
        };
        match answer {
            Answer::Committed { revision, .. } => rows.push(serde_json::json!({
                "service": key.to_string(),
                "changed": revision.is_some(),
                "revision": revision.map(|r| r.0),
            })),
            Answer::Rejected {
                kind: RejectKind::Unavailable,
                message,
            } => {
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    message,
                ))
            }
            Answer::Rejected { message, .. } => refused.push(serde_json::json!({
                "service": key.to_string(),
                "detail": message,
            })),
            other => refused.push(serde_json::json!({
                "service": key.to_string(),
                "detail": format!("unexpected answer {other:?}"),
            })),
        }
    }
    let revision = state.applied.lock().revision().0;
    Ok(Json(serde_json::json!({
        "revision": revision,
        "policies": policies,
        "removed": removed,
        "refused": refused,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37, item 6: a remote view's version and age are bounded.
    #[test]
    fn remote_view_values_out_of_bounds_are_refused_by_name() {
        let hour = rollcall_config::MAX_SUMMARY_MAX_AGE_MS;
        assert!(remote_values(Revision(MAX_REMOTE_VERSION), hour).is_ok());
        for (version, heard, field) in [
            (u64::MAX, 0, "version = 18446744073709551615"),
            (MAX_REMOTE_VERSION + 1, 0, "version = "),
            (1, u64::MAX, "heard_ms_ago = 18446744073709551615"),
            (1, hour + 1, "heard_ms_ago = "),
        ] {
            let e = remote_values(Revision(version), heard).unwrap_err();
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
            assert!(e.detail.starts_with(field), "{}", e.detail);
        }
    }
}
