//! This region's arbiter as the bridge uses it: its admin API with the
//! bridge's token, over HTTPS with the bridge's certificate (`https.rs`)
//! or plain HTTP. Reads the policies homed here and the per-service
//! summaries (what the bridge publishes), reads what this region still
//! holds of another region (to resume from it), stores other regions'
//! policies through the catalog, and hands every replica the remote view.
//!
//! Thin: it moves JSON, every decision is the publisher's, the
//! subscriber's or the arbiter's.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use rollcall_leases::{
    Label, Policy, PolicyKey, RegionView, RemotePolicy, Revision, ServiceKey, WriterEpoch,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::publisher::Observation;

mod https;
pub use https::Https;

/// Longest wait for one admin call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to the arbiter failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ArbiterError {
    /// No replica answered.
    #[error("no arbiter replica answered ({detail})")]
    Unreachable {
        /// What each address said.
        detail: String,
    },
    /// A replica answered with an error.
    #[error("arbiter {addr} answered {status}: {detail}")]
    Status {
        /// The replica.
        addr: String,
        /// The HTTP status.
        status: u16,
        /// Its `detail`.
        detail: String,
    },
    /// A replica answered something this bridge cannot read.
    #[error("arbiter {addr} answered badly: {detail}")]
    BadAnswer {
        /// The replica.
        addr: String,
        /// What was wrong.
        detail: String,
    },
}

/// The arbiter replicas of this region.
pub struct ArbiterApi {
    http: reqwest::Client,
    /// HTTPS with the bridge's certificate (`bridge.arbiter.https`), or
    /// plain HTTP.
    https: Option<Https>,
    admin: Vec<String>,
    token: String,
    region: Label,
}

/// One row of `GET /v1/policies`.
#[derive(Deserialize)]
struct PolicyRow {
    policy: Policy,
    replicated: bool,
    home_revision: Revision,
    home_set_at_ms: u64,
}

impl PolicyRow {
    fn remote(self) -> RemotePolicy {
        RemotePolicy {
            policy: self.policy,
            home_revision: self.home_revision,
            home_set_at_ms: self.home_set_at_ms,
        }
    }
}

/// One row of `GET /v1/writers`.
#[derive(Deserialize)]
struct WriterRow {
    writer: WriterEpoch,
}

/// One row of `GET /v1/summaries`.
#[derive(Deserialize)]
struct SummaryRow {
    service: String,
    revision: Revision,
    ready: u32,
    weight: u64,
}

impl ArbiterApi {
    /// The replicas at `admin` (host:port) of region `region`, over
    /// `https` when given, else plain HTTP.
    pub fn new(
        admin: Vec<String>,
        token: String,
        region: Label,
        https: Option<Https>,
    ) -> ArbiterApi {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .unwrap_or_default();
        ArbiterApi {
            http,
            https,
            admin,
            token,
            region,
        }
    }

    /// One call to one replica: the JSON answer, or why not.
    async fn call(
        &self,
        addr: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ArbiterError> {
        let (status, answer) = match &self.https {
            Some(https) => {
                let body = body.map(|b| b.to_string().into_bytes());
                let (status, bytes) = https
                    .call(addr, method, path, &self.token, body, CALL_TIMEOUT)
                    .await
                    .map_err(|detail| ArbiterError::Unreachable {
                        detail: format!("https://{addr}: {detail}"),
                    })?;
                let answer: Value =
                    serde_json::from_slice(&bytes).map_err(|e| ArbiterError::BadAnswer {
                        addr: addr.to_owned(),
                        detail: e.to_string(),
                    })?;
                (
                    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                    answer,
                )
            }
            None => self.plain(addr, method, path, body).await?,
        };
        if !status.is_success() {
            return Err(ArbiterError::Status {
                addr: addr.to_owned(),
                status: status.as_u16(),
                detail: answer["detail"].as_str().unwrap_or("no detail").to_owned(),
            });
        }
        Ok(answer)
    }

    /// One call over plain HTTP: the status and the JSON answer.
    async fn plain(
        &self,
        addr: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), ArbiterError> {
        let mut request = self
            .http
            .request(method, format!("http://{addr}{path}"))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| ArbiterError::Unreachable {
                detail: format!("{addr}: {e}"),
            })?;
        let status = response.status();
        let answer: Value = response.json().await.map_err(|e| ArbiterError::BadAnswer {
            addr: addr.to_owned(),
            detail: e.to_string(),
        })?;
        Ok((status, answer))
    }

    /// The first replica that answers `calls` (tried in order, moving on
    /// when one is unreachable or unavailable), with its answers.
    async fn first<T, F, Fut>(&self, calls: F) -> Result<T, ArbiterError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, ArbiterError>>,
    {
        let mut failures = Vec::new();
        for addr in &self.admin {
            match calls(addr.clone()).await {
                Err(ArbiterError::Unreachable { detail }) => failures.push(detail),
                Err(ArbiterError::Status {
                    status: 503,
                    detail,
                    ..
                }) => failures.push(format!("{addr}: {detail}")),
                other => return other,
            }
        }
        Err(ArbiterError::Unreachable {
            detail: failures.join("; "),
        })
    }

    /// This region's policies and summaries, read from one replica.
    pub async fn observe(&self) -> Result<Observation, ArbiterError> {
        self.first(|addr| async move {
            let policies = self.call(&addr, Method::GET, "/v1/policies", None).await?;
            let summaries = self.call(&addr, Method::GET, "/v1/summaries", None).await?;
            // An arbiter of an earlier release has no writer epochs.
            let writers = match self.call(&addr, Method::GET, "/v1/writers", None).await {
                Ok(answer) => answer,
                Err(ArbiterError::Status { status: 404, .. }) => json!({"writers": []}),
                Err(e) => return Err(e),
            };
            let bad = |detail: String| ArbiterError::BadAnswer {
                addr: addr.clone(),
                detail,
            };
            let rows: Vec<PolicyRow> = serde_json::from_value(policies["policies"].clone())
                .map_err(|e| bad(format!("policies: {e}")))?;
            let rows_s: Vec<SummaryRow> = serde_json::from_value(summaries["summaries"].clone())
                .map_err(|e| bad(format!("summaries: {e}")))?;
            let rows_w: Vec<WriterRow> = serde_json::from_value(writers["writers"].clone())
                .map_err(|e| bad(format!("writers: {e}")))?;
            let revision = |v: &Value| {
                v["revision"]
                    .as_u64()
                    .ok_or_else(|| bad("no revision".into()))
            };
            let version = Revision(revision(&policies)?.min(revision(&summaries)?));
            let mut out = Vec::with_capacity(rows_s.len());
            for row in rows_s {
                let service: ServiceKey = row
                    .service
                    .parse()
                    .map_err(|e| bad(format!("summaries: {e}")))?;
                out.push((service, row.revision, row.ready, row.weight));
            }
            Ok(Observation {
                version,
                policies: rows
                    .into_iter()
                    .filter(|r| !r.replicated && r.policy.home_region() == &self.region)
                    .map(PolicyRow::remote)
                    .collect(),
                summaries: out,
                writers: rows_w.into_iter().map(|r| r.writer).collect(),
            })
        })
        .await
    }

    /// What this region still holds of `region`: its view (if this
    /// replica has one) and the policies of that home in the catalog.
    pub async fn load(
        &self,
        region: &Label,
    ) -> Result<(Option<RegionView>, Vec<RemotePolicy>), ArbiterError> {
        self.first(|addr| async move {
            let remote = self.call(&addr, Method::GET, "/v1/remote", None).await?;
            let policies = self.call(&addr, Method::GET, "/v1/policies", None).await?;
            let bad = |detail: String| ArbiterError::BadAnswer {
                addr: addr.clone(),
                detail,
            };
            let views: Vec<RegionView> = serde_json::from_value(remote["regions"].clone())
                .map_err(|e| bad(format!("remote view: {e}")))?;
            let rows: Vec<PolicyRow> = serde_json::from_value(policies["policies"].clone())
                .map_err(|e| bad(format!("policies: {e}")))?;
            Ok((
                views.into_iter().find(|v| &v.region == region),
                rows.into_iter()
                    .filter(|r| r.replicated && r.policy.home_region() == region)
                    .map(PolicyRow::remote)
                    .collect(),
            ))
        })
        .await
    }

    /// Stores writer epochs other regions committed (`PUT /v1/writers`);
    /// the arbiter keeps only those newer than what it holds.
    pub async fn store_writers(&self, writers: &[WriterEpoch]) -> Result<(), ArbiterError> {
        let body = json!({ "writers": writers });
        self.first(|addr| {
            let body = &body;
            async move {
                self.call(&addr, Method::PUT, "/v1/writers", Some(body))
                    .await
            }
        })
        .await
        .map(|_| ())
    }

    /// Stores `region`'s policies as their home committed them and drops
    /// the ones it deleted. Answers the services the arbiter refused, with
    /// why (the others are stored or were already).
    pub async fn store_policies(
        &self,
        region: &Label,
        upserted: &[RemotePolicy],
        removed: &[(PolicyKey, Revision)],
    ) -> Result<Vec<(String, String)>, ArbiterError> {
        let removed: Vec<Value> = removed
            .iter()
            .map(|(key, rev)| json!({"service": key.to_string(), "home_revision": rev.0}))
            .collect();
        let body = json!({"policies": upserted, "removed": removed});
        let path = format!("/v1/remote/{region}/policies");
        let answer = self
            .first(|addr| {
                let (body, path) = (&body, &path);
                async move { self.call(&addr, Method::PUT, path, Some(body)).await }
            })
            .await?;
        Ok(answer["refused"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|r| {
                (
                    r["service"].as_str().unwrap_or("?").to_owned(),
                    r["detail"].as_str().unwrap_or("no detail").to_owned(),
                )
            })
            .collect())
    }

    /// Hands `view` whole to every replica (each holds its own copy in
    /// memory). Succeeds when at least one stored it.
    pub async fn put_view(
        &self,
        view: &RegionView,
        heard_ms_ago: u64,
        max_age_ms: u64,
    ) -> Result<(), ArbiterError> {
        let body = json!({"view": view, "heard_ms_ago": heard_ms_ago, "max_age_ms": max_age_ms});
        let path = format!("/v1/remote/{}", view.region);
        let mut last = None;
        let mut stored = false;
        for addr in &self.admin {
            match self.call(addr, Method::PUT, &path, Some(&body)).await {
                Ok(_) => stored = true,
                Err(e) => last = Some(e),
            }
        }
        match (stored, last) {
            (false, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Tells every replica that `view` is still current; a replica that
    /// does not hold it at this version (it restarted) gets it whole.
    pub async fn confirm(
        &self,
        view: &RegionView,
        heard_ms_ago: u64,
        max_age_ms: u64,
    ) -> Result<(), ArbiterError> {
        let heard = json!({
            "version": view.version.0,
            "as_of_ms": view.as_of_ms,
            "heard_ms_ago": heard_ms_ago,
        });
        let whole = json!({"view": view, "heard_ms_ago": heard_ms_ago, "max_age_ms": max_age_ms});
        let heard_path = format!("/v1/remote/{}/heard", view.region);
        let put_path = format!("/v1/remote/{}", view.region);
        let mut last = None;
        let mut confirmed = false;
        for addr in &self.admin {
            let result = match self
                .call(addr, Method::POST, &heard_path, Some(&heard))
                .await
            {
                Err(ArbiterError::Status { status, .. })
                    if status == StatusCode::CONFLICT.as_u16() =>
                {
                    self.call(addr, Method::PUT, &put_path, Some(&whole)).await
                }
                other => other,
            };
            match result {
                Ok(_) => confirmed = true,
                Err(e) => last = Some(e),
            }
        }
        match (confirmed, last) {
            (false, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }
}
