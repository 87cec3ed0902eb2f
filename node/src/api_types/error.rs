//! The API's error body ([`ApiError`]) and the parsing of a request body,
//! which answers with it. Describes errors only; which call answers which
//! error is `api`'s business.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rollcall_leases::NameError;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An API error: an HTTP status and the JSON body `{"error", "detail"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{error} ({status}): {detail}")]
pub struct ApiError {
    /// The HTTP status code (not part of the body).
    #[serde(skip)]
    pub status: u16,
    /// A short stable code clients can switch on: `invalid_request`,
    /// `too_large`, `conflict`, `stale_generation`, `not_found`,
    /// `unavailable`, `forbidden`, `unauthorized`.
    pub error: &'static str,
    /// What was wrong and what to do about it, naming the field if any.
    pub detail: String,
}

impl ApiError {
    fn new(status: StatusCode, error: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status: status.as_u16(),
            error,
            detail: detail.into(),
        }
    }

    /// 400 `invalid_request`: the body is not valid JSON of the expected shape.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", detail)
    }

    /// 422 `invalid_request`: the body parses but a value breaks a rule.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", detail)
    }

    /// 413 `too_large`: the body is over the size limit.
    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", detail)
    }

    /// 409 `conflict`: the request contradicts the current state.
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    /// 409 `stale_generation`: the caller named a generation that is no
    /// longer the instance's current one (a replaced process).
    pub fn stale_generation(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "stale_generation", detail)
    }

    /// 404 `not_found`.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    /// 503 `unavailable`: the agent cannot answer now (for example it is
    /// not subscribed to the service and the arbiter is unreachable).
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// 403 `forbidden`: the caller is known but may not do this.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    /// 401 `unauthorized`: the caller did not prove who it is.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self)).into_response()
    }
}

/// Parses a JSON request body of at most `max` bytes: 413 over the limit,
/// 400 with serde_json's message (which names the unknown field, or the line
/// and column of the syntax error) when it does not parse.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8], max: usize) -> Result<T, ApiError> {
    if bytes.len() > max {
        return Err(ApiError::too_large(format!(
            "request body of {} bytes exceeds the {max}-byte limit",
            bytes.len()
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A 422 naming `field` for a name that failed validation.
pub(super) fn name_error(field: &str, e: NameError) -> ApiError {
    ApiError::unprocessable(format!("{field} = {:?} is invalid: {}", e.value, e.rule))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api_types::RegisterRequest;

    #[test]
    fn parse_json_limits_size_and_reports_syntax() {
        let err = parse_json::<RegisterRequest>(&[b' '; 100], 99).unwrap_err();
        assert_eq!((err.status, err.error), (413, "too_large"));
        assert!(err.detail.contains("99-byte limit"), "{}", err.detail);
        let err = parse_json::<RegisterRequest>(b"{\"service\": ", 1024).unwrap_err();
        assert_eq!((err.status, err.error), (400, "invalid_request"));
        assert!(err.detail.contains("line 1"), "{}", err.detail);
        let err = parse_json::<RegisterRequest>(b"{\"service\": \"x\"}", 1024).unwrap_err();
        assert!(err.detail.contains("instance_id"), "{}", err.detail);
    }

    #[test]
    fn api_errors_serialize_as_error_and_detail() {
        let err = ApiError::not_found("no instance checkout-1 on this node");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"error": "not_found", "detail": "no instance checkout-1 on this node"})
        );
        let response = ApiError::stale_generation("x").into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let codes = [
            (ApiError::bad_request(""), 400),
            (ApiError::unprocessable(""), 422),
            (ApiError::conflict(""), 409),
            (ApiError::unavailable(""), 503),
            (ApiError::forbidden(""), 403),
            (ApiError::unauthorized(""), 401),
        ];
        for (err, status) in codes {
            assert_eq!(err.status, status);
            assert_eq!(err.into_response().status().as_u16(), status);
        }
    }
}
