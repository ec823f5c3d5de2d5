//! The responses the layer writes itself: 429, key errors, fail-closed 503;
//! their [`Body`], and what each refuses ([`Refusal`]), from which a gRPC
//! caller's status is made.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body::{Frame, SizeHint};
use serde_json::json;

use crate::decision::{Decision, Scope};
use crate::error::KeyError;
use crate::headers::PolicyHeaders;
use crate::policy::Policy;

/// What a response the layer wrote refuses, and what a client needs to
/// know of it beyond the HTTP status: a gRPC caller gets its status from it
/// (`layer/grpc.rs`). Carried in the [`Body`], so knowing it costs no
/// allocation.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "grpc"), allow(dead_code))]
pub(crate) enum Refusal {
    /// A quota is used up, or the caller is in the penalty box (`blocked`).
    Limited {
        retry_after: Duration,
        scope: Scope,
        blocked: bool,
    },
    /// A new caller refused while throttling.
    Throttled { retry_after: Duration },
    /// On the deny list.
    Denied,
    /// No key could be taken from the request.
    Unidentified(KeyError),
    /// The store failed and the policy is to fail closed.
    Unavailable { retry_after: Duration },
    /// No tier counts the caller.
    Unplaced,
    /// The request itself was refused (a work queue's body too large).
    #[cfg_attr(not(feature = "queue"), allow(dead_code))]
    Malformed,
}

/// The body of a response the layer writes itself: its JSON message in one
/// frame, and the [`Refusal`] it says.
#[derive(Debug)]
pub(crate) struct Body {
    data: Option<Bytes>,
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    pub(crate) refusal: Refusal,
}

impl Body {
    pub(crate) fn new(data: impl Into<Bytes>, refusal: Refusal) -> Self {
        Self {
            data: Some(data.into()),
            refusal,
        }
    }

    /// No data at all: a gRPC answer is its headers only.
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    pub(crate) fn empty(refusal: Refusal) -> Self {
        Self {
            data: None,
            refusal,
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.data.take().map(|data| Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

fn json(status: StatusCode, body: serde_json::Value, refusal: Refusal) -> Response<Body> {
    let mut response = Response::new(Body::new(body.to_string(), refusal));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A rejection: `status` (429 by default), the decision's headers with
/// `Remaining: 0` and `Retry-After`, and a short JSON message that names
/// whose budget ran out (`"scope": "consumer"` or `"resource"`), or, for a
/// caller in the penalty box, says it met a secondary rate limit.
pub(crate) fn limited(
    status: StatusCode,
    policy: &Policy,
    decision: &Decision,
    headers: &PolicyHeaders,
) -> Response<Body> {
    let retry_after = decision.retry_after_secs().unwrap_or(1);
    // Room for content-type, every rate-limit header and Retry-After at
    // once: the map is allocated once instead of growing twice.
    let mut map = HeaderMap::with_capacity(12);
    map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.apply(&mut map, policy, decision);
    if !map.contains_key(RETRY_AFTER) {
        map.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    let refusal = Refusal::Limited {
        retry_after: decision
            .retry_after
            .unwrap_or(Duration::from_secs(retry_after)),
        scope: decision.scope,
        blocked: decision.blocked,
    };
    let body = limited_body(policy.name(), decision, retry_after);
    let mut response = Response::new(Body::new(body, refusal));
    *response.status_mut() = status;
    *response.headers_mut() = map;
    response
}

/// `{"limit":..,"message":"..","reset":..,"resource":"..","retry_after":..,"scope":".."}`
/// (the keys in the order `serde_json::json!` gave them), written straight
/// into one string without `fmt`: a rejection must cost no more than a
/// pass, and building a `json!` map took more time than the store's decision.
fn limited_body(name: &str, decision: &Decision, retry_after: u64) -> String {
    // Policy names are checked to be [A-Za-z0-9-_./]: nothing to escape. Any
    // other name still comes out as valid JSON.
    let escaped: String;
    let name = if name
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    {
        name
    } else {
        escaped = serde_json::Value::from(name).to_string();
        &escaped[1..escaped.len() - 1]
    };
    // A block is GitHub's secondary rate limit: clients (octokit's
    // throttling plugin) tell it by "secondary rate" in the message and
    // wait `Retry-After`, which covers the block and the quota's own wait.
    let message = match decision.scope {
        _ if decision.blocked => [
            "You have exceeded a secondary rate limit for resource '",
            "': this caller is blocked after repeated rejections. Wait for Retry-After before retrying.",
        ],
        Scope::Resource => [
            "Rate limit exceeded for resource '",
            "': the limit shared by all callers is used up.",
        ],
        _ => ["API rate limit exceeded for resource '", "'."],
    };
    let mut digits = itoa::Buffer::new();
    let mut body = String::with_capacity(192 + 2 * name.len());
    for part in [
        "{\"limit\":",
        digits.format(decision.limit),
        ",\"message\":\"",
        message[0],
        name,
        message[1],
        "\",\"reset\":",
    ] {
        body.push_str(part);
    }
    body.push_str(digits.format(decision.reset_epoch_secs()));
    for part in [",\"resource\":\"", name, "\",\"retry_after\":"] {
        body.push_str(part);
    }
    body.push_str(digits.format(retry_after));
    for part in [",\"scope\":\"", decision.scope.as_str(), "\"}"] {
        body.push_str(part);
    }
    body
}

/// No key could be taken from the request.
pub(crate) fn unidentified(status: StatusCode, why: &KeyError) -> Response<Body> {
    json(
        status,
        json!({ "message": format!("cannot identify the caller for rate limiting: {why}") }),
        Refusal::Unidentified(why.clone()),
    )
}

/// The store failed and the policy is to fail closed.
pub(crate) fn unavailable(retry_after_secs: u64) -> Response<Body> {
    let mut response = json(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({ "message": "rate limiting is unavailable; try again shortly" }),
        Refusal::Unavailable {
            retry_after: Duration::from_secs(retry_after_secs.max(1)),
        },
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
        Refusal::Denied,
    )
}

/// A new caller refused while throttling: `status` (429 by default),
/// `Retry-After`, and a short JSON message. No `X-RateLimit-*` headers: no
/// quota was consulted.
pub(crate) fn throttled(status: StatusCode, retry_after: std::time::Duration) -> Response<Body> {
    let secs = (retry_after.as_micros() as u64).div_ceil(1_000_000).max(1);
    let body = serde_json::json!({
        "message": "The service is busy: sessions in progress are served, new ones are refused for now.",
        "retry_after": secs,
    });
    let refusal = Refusal::Throttled { retry_after };
    let mut response = Response::new(Body::new(body.to_string(), refusal));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(RETRY_AFTER, HeaderValue::from(secs));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_429_body_is_the_json_it_always_was() {
        let mut decision = Decision::rejected(5, 5, 10_500_000, 1_000_000, 9_500_000);
        let expected = json!({
            "message": "API rate limit exceeded for resource 'core'.",
            "resource": "core",
            "scope": "consumer",
            "limit": 5,
            "reset": 11,
            "retry_after": 10,
        });
        assert_eq!(limited_body("core", &decision, 10), expected.to_string());
        decision.scope = Scope::Resource;
        let expected = json!({
            "message": "Rate limit exceeded for resource 'core': the limit shared by all callers is used up.",
            "resource": "core",
            "scope": "resource",
            "limit": 5,
            "reset": 11,
            "retry_after": 10,
        });
        assert_eq!(limited_body("core", &decision, 10), expected.to_string());
        let blocked =
            Decision::rejected(5, 5, 10_500_000, 1_000_000, 9_500_000).blocked_until(31_000_000);
        let expected = json!({
            "message": "You have exceeded a secondary rate limit for resource 'core': this caller is blocked after repeated rejections. Wait for Retry-After before retrying.",
            "resource": "core",
            "scope": "consumer",
            "limit": 5,
            "reset": 31,
            "retry_after": 30,
        });
        assert_eq!(limited_body("core", &blocked, 30), expected.to_string());
        let odd: serde_json::Value =
            serde_json::from_str(&limited_body("a\"b\\", &decision, 10)).unwrap();
        assert_eq!(odd["resource"], "a\"b\\");
    }
}
