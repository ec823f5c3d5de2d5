//! The responses the layer writes itself: 429, key errors, fail-closed 503.

use axum::body::Body;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde_json::json;

use crate::decision::{Decision, Scope};
use crate::headers::RateLimitHeaders;
use crate::quota::Policy;

fn json(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A rejection: `status` (429 by default), the decision's headers with
/// `Remaining: 0` and `Retry-After`, and a short JSON message that names
/// whose budget ran out (`"scope": "consumer"` or `"resource"`).
pub(crate) fn limited(
    status: StatusCode,
    policy: &Policy,
    decision: &Decision,
    headers: RateLimitHeaders,
) -> Response<Body> {
    let retry_after = decision.retry_after_secs().unwrap_or(1);
    let message = match decision.scope {
        Scope::Resource => format!(
            "Rate limit exceeded for resource '{}': the limit shared by all callers is used up.",
            policy.name()
        ),
        _ => format!("API rate limit exceeded for resource '{}'.", policy.name()),
    };
    let mut response = json(
        status,
        json!({
            "message": message,
            "resource": policy.name(),
            "scope": decision.scope.as_str(),
            "limit": decision.limit,
            "reset": decision.reset_epoch_secs(),
            "retry_after": retry_after,
        }),
    );
    headers.apply(response.headers_mut(), policy, decision);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// No key could be taken from the request.
pub(crate) fn unidentified(status: StatusCode, why: &crate::KeyError) -> Response<Body> {
    json(
        status,
        json!({ "message": format!("cannot identify the caller for rate limiting: {why}") }),
    )
}

/// The store failed and the policy is to fail closed.
pub(crate) fn unavailable(retry_after_secs: u64) -> Response<Body> {
    let mut response = json(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({ "message": "rate limiting is unavailable; try again shortly" }),
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs.max(1)));
    response
}

/// The request is on the deny-list: `status` (the limited status) and a
/// short JSON message. No rate-limit headers and no `Retry-After`: waiting
/// will not help.
pub(crate) fn denied(status: StatusCode, policy: &Policy) -> Response<Body> {
    json(
        status,
        json!({
            "message": format!("requests from this caller are refused for resource '{}'.", policy.name()),
            "resource": policy.name(),
        }),
    )
}
