//! `GET /v1/audit?service=&since=&limit=`: the audit log of every shard
//! this replica applied, merged by time, each row naming its shard.

use super::*;
use crate::audit::AuditQuery;

/// Most audit entries one call returns.
const MAX_AUDIT_LIMIT: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditParams {
    service: Option<String>,
    since: Option<u64>,
    limit: Option<usize>,
}

pub(super) async fn audit(
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
    // Every shard's log (the service's shard alone when one is named),
    // merged by time; each row names its shard.
    let count = state.shards.count();
    let mut rows: Vec<(u64, u16, u64, serde_json::Value)> = Vec::new();
    for group in state.shards.iter() {
        if service
            .as_ref()
            .is_some_and(|s| crate::shard::shard_of(s, count) != group.shard)
        {
            continue;
        }
        let query = AuditQuery {
            service: service.clone(),
            since: params.since.map(Revision),
            limit: params.limit.unwrap_or(1000).min(MAX_AUDIT_LIMIT),
        };
        let applied = group.catalog.clone();
        let entries = tokio::task::spawn_blocking(move || applied.audit(&query))
            .await
            .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, "store", e.to_string()))?
            .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, "store", e.to_string()))?;
        rows.extend(entries.iter().map(|e| {
            let row = serde_json::json!({
                "shard": group.shard.0,
                "revision": e.revision.0,
                "at_ms": e.at_ms,
                "actor": e.actor.to_string(),
                "command": e.command,
                "services": e.services.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "instance": e.instance.as_ref().map(|i| i.to_string()),
                "detail": e.detail,
            });
            (e.at_ms, group.shard.0, e.revision.0, row)
        }));
    }
    let rows = merge_by_time(rows, params.limit.unwrap_or(1000).min(MAX_AUDIT_LIMIT));
    Ok(Json(rows).into_response())
}

/// Merges the shards' audit rows (`(at_ms, shard, revision, row)`, each
/// shard's in its revision order) by time: the next row is the earliest
/// head among the shards, so each shard's rows keep their revision order
/// (a proposer's clock is not monotonic across a batch or a leader
/// change); at most `limit`.
fn merge_by_time(
    rows: Vec<(u64, u16, u64, serde_json::Value)>,
    limit: usize,
) -> Vec<serde_json::Value> {
    let mut by_shard: std::collections::BTreeMap<
        u16,
        std::collections::VecDeque<(u64, serde_json::Value)>,
    > = std::collections::BTreeMap::new();
    for (at_ms, shard, _, row) in rows {
        by_shard.entry(shard).or_default().push_back((at_ms, row));
    }
    let mut merged = Vec::new();
    while merged.len() < limit {
        let next = by_shard
            .iter()
            .filter_map(|(shard, queue)| queue.front().map(|(at_ms, _)| (*at_ms, *shard)))
            .min();
        let Some((_, shard)) = next else { break };
        let (_, row) = by_shard
            .get_mut(&shard)
            .and_then(std::collections::VecDeque::pop_front)
            .expect("the head just seen");
        merged.push(row);
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The audit log merged over shards keeps each shard's revision order,
    /// even where its proposers' clocks went backwards (found by the
    /// replication test: a batch's commands carry their own times).
    #[test]
    fn audit_rows_merge_by_time_in_each_shards_revision_order() {
        let row = |shard: u16, revision: u64| serde_json::json!([shard, revision]);
        let rows = vec![
            (5, 0, 1, row(0, 1)),
            (3, 0, 2, row(0, 2)),
            (4, 1, 1, row(1, 1)),
            (9, 1, 2, row(1, 2)),
        ];
        assert_eq!(
            merge_by_time(rows.clone(), 10),
            vec![row(1, 1), row(0, 1), row(0, 2), row(1, 2)]
        );
        assert_eq!(merge_by_time(rows, 2), vec![row(1, 1), row(0, 1)]);
    }
}
