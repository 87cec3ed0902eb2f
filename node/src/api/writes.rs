//! The local API's writes: register, heartbeat, registration sessions,
//! drain and deregister. Each handler validates its input at the edge,
//! hands the agent's state machine one `Call` and maps its answer (a
//! `Reply` or a `Refusal`, in the machine's terms) onto a status code and
//! the JSON body (200 committed, 202 pending).

use std::convert::Infallible;

use actix::Recipient;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rollcall_leases::{Generation, InstanceId};
use serde::{Deserialize, Serialize};
use tokio_stream::StreamExt;

use super::{
    instance_id, query, unexpected, ApiContext, CallerOf, SessionClosedMessage, MAX_BODY_BYTES,
    SESSION_KEEPALIVE,
};
use crate::agent_state::{Call, Drained, Registered, Reply, WriteOutcome};
use crate::api_types::{
    parse_json, ApiError, DrainResponse, Propagated, RegisterRequest, RegisterResponse,
};

/// A write's answer: 200 when committed, 202 when pending, with the body
/// `body` builds from the outcome and whether it is pending.
fn outcome<T, B: Serialize>(outcome: WriteOutcome<T>, body: impl FnOnce(T, bool) -> B) -> Response {
    match outcome {
        WriteOutcome::Committed(t) => (StatusCode::OK, Json(body(t, false))).into_response(),
        WriteOutcome::Pending(t) => (StatusCode::ACCEPTED, Json(body(t, true))).into_response(),
    }
}

fn registered(r: Registered, pending: bool) -> RegisterResponse {
    RegisterResponse {
        instance_id: r.instance,
        generation: r.generation.map(|g| g.get()),
        state: r.state.map_or("PENDING", |s| s.as_str()).to_owned(),
        pending,
    }
}

fn drained(d: Drained, pending: bool) -> DrainResponse {
    DrainResponse {
        revision: d.revision.map(|r| r.get()),
        pending,
        propagated: d.propagated.map(|p| Propagated {
            acked: p.acked,
            total: p.total,
            complete: p.acked >= p.total,
        }),
    }
}

fn deregistered(revision: Option<rollcall_leases::Revision>, pending: bool) -> serde_json::Value {
    serde_json::json!({"revision": revision.map(|r| r.get()), "pending": pending})
}

pub(super) async fn register(
    State(agent): State<ApiContext>,
    CallerOf(caller): CallerOf,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: RegisterRequest = parse_json(&body, MAX_BODY_BYTES)?;
    let registration = request.validate(&agent.checks)?;
    match agent
        .call(Call::Register {
            registration,
            caller,
        })
        .await?
    {
        Reply::Registered(answer) => Ok(outcome(answer, registered)),
        other => Err(unexpected(other)),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GenerationQuery {
    generation: Option<u64>,
}

pub(super) async fn heartbeat(
    State(agent): State<ApiContext>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let call = Call::Heartbeat {
        instance: instance_id(&id)?,
        generation: q.generation,
        caller,
    };
    match agent.call(call).await? {
        Reply::Heartbeat {
            instance,
            generation,
        } => Ok(Json(serde_json::json!({
            "instance_id": instance.as_str(),
            "generation": generation.map(|g| g.get()),
        }))
        .into_response()),
        other => Err(unexpected(other)),
    }
}

/// Holds a registration session: a streaming answer of one line per second
/// while the instance's process keeps the connection open. When the
/// connection closes, the stream is dropped, and with it the guard that
/// tells the agent.
pub(super) async fn session(
    State(agent): State<ApiContext>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let instance = instance_id(&id)?;
    let call = Call::OpenSession {
        instance: instance.clone(),
        generation: q.generation,
        caller,
    };
    let generation = match agent.call(call).await? {
        Reply::SessionOpened(generation) => generation,
        other => return Err(unexpected(other)),
    };
    let guard = SessionGuard {
        sessions: agent.sessions.clone(),
        instance,
        generation,
    };
    let ticks =
        tokio_stream::wrappers::IntervalStream::new(tokio::time::interval(SESSION_KEEPALIVE));
    let lines = ticks.map(move |_| {
        let _held = &guard;
        Ok::<_, Infallible>(Bytes::from_static(b"session open\n"))
    });
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(lines),
    )
        .into_response())
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Wait {
    Committed,
    Propagated,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainQuery {
    generation: Option<u64>,
    wait: Option<Wait>,
}

pub(super) async fn drain(
    State(agent): State<ApiContext>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<DrainQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let call = Call::Drain {
        instance: instance_id(&id)?,
        generation: q.generation,
        propagated: q.wait == Some(Wait::Propagated),
        caller,
    };
    match agent.call(call).await? {
        Reply::Drained(answer) => Ok(outcome(answer, drained)),
        other => Err(unexpected(other)),
    }
}

pub(super) async fn deregister(
    State(agent): State<ApiContext>,
    CallerOf(caller): CallerOf,
    Path(id): Path<String>,
    q: Result<Query<GenerationQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let call = Call::Deregister {
        instance: instance_id(&id)?,
        generation: q.generation,
        caller,
    };
    match agent.call(call).await? {
        Reply::Deregistered(answer) => Ok(outcome(answer, deregistered)),
        other => Err(unexpected(other)),
    }
}

/// Held by an open registration session; dropping it (the connection
/// closed) tells the agent, which marks the instance UNHEALTHY unless it
/// was drained or replaced.
struct SessionGuard {
    sessions: Recipient<SessionClosedMessage>,
    instance: InstanceId,
    generation: Option<Generation>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions.do_send(SessionClosedMessage {
            instance: self.instance.clone(),
            generation: self.generation,
        });
    }
}
