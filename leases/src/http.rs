//! What the workspace's HTTP APIs (the agent's local API, the arbiter's
//! admin API) share: every error answer is the documented JSON body
//! `{"error": code, "detail": text}`, including the ones the framework
//! makes itself (an unknown path, a wrong method, a body over the limit, a
//! path that is not UTF-8).

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The stable error code of a status the framework answers with.
pub fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "invalid_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "invalid_request",
    }
}

/// A JSON error answer.
pub fn error_response(status: StatusCode, code: &str, detail: &str) -> Response {
    (
        status,
        Json(serde_json::json!({"error": code, "detail": detail})),
    )
        .into_response()
}

/// The answer for a path no route serves.
pub async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such path; the API's paths are listed in the README",
    )
}

/// Largest framework error text carried into the JSON detail.
const MAX_DETAIL_BYTES: usize = 4096;

/// Middleware (`axum::middleware::map_response`): turns an error answer
/// that is not JSON (a rejection the framework wrote as plain text, or an
/// empty 404/405) into the JSON body, keeping its status and headers (such
/// as `Allow` on a 405). JSON answers and successes pass unchanged.
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let allow = parts
        .headers
        .get(header::ALLOW)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let detail = match (text.is_empty(), status, &allow) {
        (false, ..) => text,
        (true, StatusCode::METHOD_NOT_ALLOWED, Some(allow)) => {
            format!("this path does not take that method; it takes {allow}")
        }
        (true, StatusCode::METHOD_NOT_ALLOWED, None) => {
            "this path does not take that method".to_string()
        }
        (true, StatusCode::NOT_FOUND, _) => {
            "no such path; the API's paths are listed in the README".to_string()
        }
        (true, ..) => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let mut answer = error_response(status, code_for(status), &detail);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}
