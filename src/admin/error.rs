//! What the admin API answers when it changes nothing, or cannot say
//! whether it did: one JSON shape, `{"error": {"field": .., "message": ..}}`,
//! and a status an operator's script can act on.

use std::error::Error as StdError;
use std::fmt;

use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde::Serialize;
use serde_json::Value;

use crate::error::{StoreError, StoreErrorKind};

/// An admin request that changed nothing (bad input, an unknown policy, a
/// store that refused), or whose change may or may not have landed (a
/// store that timed out): its status and a JSON body naming the field at
/// fault.
///
/// ```json
/// {"error": {"field": "limit", "message": "must be at least 1, got 0"}}
/// ```
///
/// A write the store may have run (a timeout, a broken connection, a
/// later step refused after an earlier one landed) answers `504` with
/// `"applied": "unknown"`: repeat it, admin writes are idempotent. A write
/// of which nothing can have been written (the store refused its first
/// step; the connection was refused) answers `503` with `"applied": false`
/// ([`StoreError::may_have_written`]).
///
/// ```
/// use tollgate::admin::ApiError;
/// use tollgate::StoreError;
///
/// let invalid = ApiError::invalid("limit", "must be at least 1, got 0");
/// assert_eq!((invalid.status().as_u16(), invalid.field()), (400, Some("limit")));
///
/// let late = ApiError::write_failed(&StoreError::timeout());
/// assert_eq!(late.status().as_u16(), 504);
/// assert!(late.message().contains("may or may not have been applied"));
/// ```
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    field: Option<String>,
    message: String,
    /// For store failures of a write: `false` (refused, nothing written)
    /// or `None` in JSON as `"unknown"`.
    applied: Option<Applied>,
}

#[derive(Debug, Clone, Copy)]
enum Applied {
    No,
    Unknown,
}

impl ApiError {
    fn new(status: StatusCode, field: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            status,
            field: field.map(str::to_owned),
            message: message.into(),
            applied: None,
        }
    }

    /// `400`: `field` (a query parameter, a body field, `body`, `caller`)
    /// cannot be used, for the reason `message` gives; nothing was stored.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Some(field), message)
    }

    /// `404`: no such policy (`field` `"policy"`) or route (no field).
    pub(crate) fn not_found(field: Option<&str>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, field, message)
    }

    /// `405`: the route takes other methods.
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            None,
            "this route does not take that method; see openapi.json",
        )
    }

    /// `409`: the policy cannot do what was asked (take overrides, block).
    pub(crate) fn conflict(field: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, Some(field), message)
    }

    /// `413`: the body is over the limit.
    pub(crate) fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("body"),
            format!("the body is larger than {limit} bytes"),
        )
    }

    /// A change the store did not confirm: `504` when the store may have
    /// run it or part of it ([`StoreError::may_have_written`]), saying so
    /// and that repeating it is safe; `503` when nothing can have been
    /// written.
    pub fn write_failed(err: &StoreError) -> Self {
        if err.may_have_written() {
            Self {
                applied: Some(Applied::Unknown),
                ..Self::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    None,
                    format!(
                        "{err}: the change may or may not have been applied; \
                         admin writes are idempotent, so repeat the request"
                    ),
                )
            }
        } else {
            Self {
                applied: Some(Applied::No),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    None,
                    format!(
                        "{err}: the store refused the change; repeat it once the store takes it"
                    ),
                )
            }
        }
    }

    /// A read the store did not answer: `504` after a timeout, `503`
    /// otherwise. Nothing was changed either way.
    pub fn read_failed(err: &StoreError) -> Self {
        let status = match err.kind() {
            StoreErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, None, format!("{err}; nothing was changed"))
    }

    /// The status answered.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The query parameter or body field at fault, if one is.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// What went wrong, for people.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The JSON body, `{"error": {"field", "message", "applied"?}}`.
    fn body(&self) -> Value {
        let shown = ErrorBody {
            error: ErrorFields {
                field: self.field.as_deref(),
                message: &self.message,
                applied: self.applied.map(|applied| match applied {
                    Applied::No => AppliedShown::Flag(false),
                    Applied::Unknown => AppliedShown::Word("unknown"),
                }),
            },
        };
        serde_json::to_value(shown).expect("an error body serializes")
    }
}

/// The JSON shape of every error: one type, as `openapi.json`'s `Error`.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorFields<'a>,
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    field: Option<&'a str>,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    applied: Option<AppliedShown>,
}

/// `"applied"`: `false` (nothing written) or `"unknown"`.
#[derive(Serialize)]
#[serde(untagged)]
enum AppliedShown {
    Flag(bool),
    Word(&'static str),
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: {field}: {}", self.status, self.message),
            None => write!(f, "{}: {}", self.status, self.message),
        }
    }
}

impl StdError for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_store_failure_of_a_write_says_whether_it_may_have_landed() {
        for (kind, status, applied) in [
            (StoreErrorKind::Timeout, 504, json!("unknown")),
            (StoreErrorKind::Unavailable, 504, json!("unknown")),
            (StoreErrorKind::Protocol, 504, json!("unknown")),
            (StoreErrorKind::Rejected, 503, json!(false)),
            (StoreErrorKind::Unsupported, 503, json!(false)),
        ] {
            let err = ApiError::write_failed(&StoreError::new(kind, "x"));
            assert_eq!(err.status().as_u16(), status, "{kind:?}");
            assert_eq!(err.body()["error"]["applied"], applied, "{kind:?}");
        }
    }

    #[test]
    fn a_refusal_after_an_earlier_step_landed_is_a_504_and_a_refused_connection_a_503() {
        let refused_late = StoreError::new(StoreErrorKind::Rejected, "READONLY").after_a_write();
        let err = ApiError::write_failed(&refused_late);
        assert_eq!(err.status().as_u16(), 504);
        assert_eq!(err.body()["error"]["applied"], json!("unknown"));
        let never_sent = StoreError::new(StoreErrorKind::Unavailable, "refused").unsent();
        let err = ApiError::write_failed(&never_sent);
        assert_eq!(err.status().as_u16(), 503);
        assert_eq!(err.body()["error"]["applied"], json!(false));
    }

    #[test]
    fn a_read_that_timed_out_is_a_504_and_changed_nothing() {
        let err = ApiError::read_failed(&StoreError::timeout());
        assert_eq!(err.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(err.message().ends_with("nothing was changed"));
        assert!(err.body()["error"].get("applied").is_none());
    }
}
