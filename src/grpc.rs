//! gRPC's words for the layer's answers (feature `grpc`): a rejection of a
//! gRPC call becomes a status a gRPC client reads, sent trailers-only in an
//! HTTP 200, as gRPC's own servers send an error.
//!
//! A call is gRPC when its `content-type` starts with `application/grpc`
//! (`application/grpc+proto`, `application/grpc-web` ...). What it gets:
//!
//! | the layer's answer | HTTP | gRPC status |
//! |---|---|---|
//! | a quota used up, or a caller in the penalty box | 429 | `RESOURCE_EXHAUSTED` (8), or [`LimitedCode::Unavailable`] (14) |
//! | a new caller refused while throttling | 429 | the same as a quota used up |
//! | no key in the request | 400 | `INVALID_ARGUMENT` (3) |
//! | no tier counts the caller | 400 | `INVALID_ARGUMENT` (3) |
//! | the store failed, the policy fails closed | 503 | `UNAVAILABLE` (14) |
//! | on the deny list | 429 | `PERMISSION_DENIED` (7) |
//!
//! Beside `grpc-status`, each has a `grpc-message` (percent-encoded as gRPC
//! says) naming the limit and when to come back; where waiting helps, the
//! wait in `grpc-retry-pushback-ms` (gRPC's retry design, A6: a client's
//! retry policy waits that long) and as a `google.rpc.RetryInfo` in
//! `grpc-status-details-bin` (what clients reading rich error details
//! read); and the rate-limit headers, in the dialect chosen, as metadata.
//! A call let through carries the rate-limit headers as its initial
//! metadata, as an HTTP response carries them.
//! [`RateLimitLayer`](crate::RateLimitLayer) and
//! [`TieredLayer`](crate::TieredLayer) answer so; the work queue's layer
//! (feature `queue`) reads HTTP bodies and answers HTTP only.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::num::NonZeroU32;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tollgate::{HeaderKey, Policy, Quota, RateLimitLayer};
//!
//! let layer = RateLimitLayer::builder()
//!     .policy(Policy::fixed_window("api", Quota::per_minute(NonZeroU32::new(1).unwrap())))
//!     .key(HeaderKey::new("x-api-key"))
//!     .build()
//!     .unwrap();
//! let service = ServiceBuilder::new().layer(layer).service_fn(|_: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! });
//! let call = || {
//!     http::Request::post("/grpc.health.v1.Health/Check")
//!         .header("content-type", "application/grpc")
//!         .header("x-api-key", "k1")
//!         .body(())
//!         .unwrap()
//! };
//! service.clone().oneshot(call()).await.unwrap();
//! let refused = service.oneshot(call()).await.unwrap();
//! assert_eq!(refused.status(), 200); // the status rides in the headers
//! assert_eq!(refused.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
//! assert!(refused.headers().contains_key("grpc-retry-pushback-ms"));
//! assert_eq!(refused.headers()["x-ratelimit-remaining"], "0");
//! # }
//! ```
//!
//! # Keys
//!
//! [`PeerIp`](crate::PeerIp) reads the address tonic's server records
//! (feature `tonic`), [`RouteKey`](crate::key::RouteKey) takes a call's
//! method (`/package.Service/Method`) as its route, and
//! [`HeaderKey`](crate::HeaderKey) reads metadata as the headers they are
//! (a `-bin` key's bytes hashed, never read as text). The same key for the
//! same caller over axum and over gRPC, on one store, is one budget.
//!
//! # Give-backs and streams
//!
//! - A call is charged when it starts, before the handler runs, whether it
//!   is unary or streaming; its initial metadata carry the headers.
//! - [`ActualCost`](crate::ActualCost) in a tonic `Response`'s extensions
//!   settles the charge, as over HTTP (tonic hands its extensions to the
//!   HTTP response); so does [`settle_cost`](crate::RateLimitLayerBuilder::settle_cost).
//! - Nothing stands in for the `304` refund by default: every gRPC answer is
//!   an HTTP 200, so the default refund never applies. To give back the
//!   charge of a call that failed at once, read its status from the head (a
//!   trailers-only answer has `grpc-status` there) with `settle_cost`:
//!   `.settle_cost(|head| (head.headers.get("grpc-status")? != "0").then_some(0))`.
//!   A status sent in the trailers, after messages, comes too late for it.
//! - The layer settles when the response's head passes it, which for a
//!   stream is when it starts. A cost known only when a stream ends is
//!   settled then by the handler: with
//!   [`decision_extension`](crate::RateLimitLayerBuilder::decision_extension)
//!   it finds the [`Decision`](crate::Decision) its call was charged in the
//!   request's extensions, and calls
//!   [`RateLimiter::settle`](crate::RateLimiter::settle) (from the layer's
//!   [`limiter`](crate::RateLimitLayer::limiter)) with the caller's key when
//!   its stream is done. Limits per message on a stream are not made here.
//!
//! Nothing here depends on a gRPC crate: the status details are a few
//! protobuf fields, written by hand below (no protoc, no prost), and
//! base64-encoded without padding, as gRPC's binary metadata is sent.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::decision::Scope;
use crate::response::{Body, Refusal};

/// The gRPC status of a call refused because a quota is used up (or the
/// caller is blocked, or throttled).
///
/// `RESOURCE_EXHAUSTED` (the default) is what gRPC names a quota used up.
/// Some operators alert on it, or run clients whose retry policies retry
/// only `UNAVAILABLE`, as Envoy's rate limit filter answers: choose
/// [`Unavailable`](Self::Unavailable) with
/// [`grpc_limited_code`](crate::RateLimitLayerBuilder::grpc_limited_code).
/// Either way the pushback says when to retry.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::grpc::LimitedCode;
/// use tollgate::{Policy, Quota, RateLimitLayer};
///
/// let layer = RateLimitLayer::builder()
///     .policy(Policy::fixed_window("core", Quota::per_second(NonZeroU32::new(5).unwrap())))
///     .grpc_limited_code(LimitedCode::Unavailable)
///     .build()
///     .unwrap();
/// assert_eq!(LimitedCode::default(), LimitedCode::ResourceExhausted);
/// assert_eq!(LimitedCode::Unavailable.code(), 14);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitedCode {
    /// `RESOURCE_EXHAUSTED` (8).
    #[default]
    ResourceExhausted,
    /// `UNAVAILABLE` (14).
    Unavailable,
}

impl LimitedCode {
    /// The status's number, as sent in `grpc-status`.
    ///
    /// ```
    /// use tollgate::grpc::LimitedCode;
    /// assert_eq!(LimitedCode::ResourceExhausted.code(), 8);
    /// assert_eq!(LimitedCode::Unavailable.code(), 14);
    /// ```
    pub fn code(self) -> u8 {
        match self {
            LimitedCode::ResourceExhausted => RESOURCE_EXHAUSTED,
            LimitedCode::Unavailable => UNAVAILABLE,
        }
    }
}

const INVALID_ARGUMENT: u8 = 3;
const PERMISSION_DENIED: u8 = 7;
const RESOURCE_EXHAUSTED: u8 = 8;
const UNAVAILABLE: u8 = 14;

/// Whether a request is a gRPC call: its `content-type` starts with
/// `application/grpc`.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|kind| kind.as_bytes().starts_with(b"application/grpc"))
}

/// The layer's `answer` (a 429, 400, 503 ...) as a gRPC status, sent
/// trailers-only: HTTP 200, `content-type: application/grpc`, the status in
/// the headers, no body. The answer's other headers (the rate-limit headers,
/// `Retry-After`) stay, as metadata.
pub(crate) fn status(answer: Response<Body>, name: &str, limited: LimitedCode) -> Response<Body> {
    let (mut head, body) = answer.into_parts();
    let (code, message, wait) = match &body.refusal {
        Refusal::Limited {
            retry_after,
            scope,
            blocked,
        } => {
            let what = match scope {
                _ if *blocked => format!(
                    "secondary rate limit exceeded for resource '{name}': this caller is blocked after repeated rejections"
                ),
                Scope::Resource => format!(
                    "rate limit exceeded for resource '{name}': the limit shared by all callers is used up"
                ),
                _ => format!("API rate limit exceeded for resource '{name}'"),
            };
            (limited.code(), what, Some(*retry_after))
        }
        Refusal::Throttled { retry_after } => (
            limited.code(),
            "the service is busy: calls in progress are served, new callers are refused for now"
                .to_owned(),
            Some(*retry_after),
        ),
        Refusal::Denied => (
            PERMISSION_DENIED,
            format!("calls from this caller are refused for resource '{name}'"),
            None,
        ),
        Refusal::Unidentified(why) => (
            INVALID_ARGUMENT,
            format!("cannot identify the caller for rate limiting: {why}"),
            None,
        ),
        Refusal::Unavailable { retry_after } => (
            UNAVAILABLE,
            "rate limiting is unavailable".to_owned(),
            Some(*retry_after),
        ),
        Refusal::Unplaced => (
            INVALID_ARGUMENT,
            "cannot place the caller in a rate-limit tier".to_owned(),
            None,
        ),
        Refusal::Malformed => (
            INVALID_ARGUMENT,
            "the request was refused by the rate limiter".to_owned(),
            None,
        ),
    };
    let wait_ms = wait.map(millis);
    let message = match wait_ms {
        Some(ms) => format!("{message}; retry in {ms} ms"),
        None => message,
    };

    head.status = StatusCode::OK;
    let headers = &mut head.headers;
    headers.remove(CONTENT_LENGTH);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    headers.insert(
        GRPC_MESSAGE,
        HeaderValue::try_from(percent_encode(&message))
            .expect("percent-encoded text is a valid header"),
    );
    if let Some(ms) = wait_ms {
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        let details = base64(&status_details(code, &message, wait.unwrap_or_default()));
        headers.insert(
            GRPC_STATUS_DETAILS_BIN,
            HeaderValue::try_from(details).expect("base64 is a valid header"),
        );
    }
    Response::from_parts(head, Body::empty(body.refusal))
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// A wait in whole milliseconds, rounded up: a client that waits it is not
/// early.
fn millis(wait: Duration) -> u64 {
    (wait.as_micros() as u64).div_ceil(1_000).max(1)
}

/// gRPC's percent-encoding of `grpc-message`: bytes outside printable
/// ASCII, and `%`, as `%XX` of the UTF-8.
fn percent_encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
    }
    out
}

/// `google.rpc.Status { code, message, details: [Any(google.rpc.RetryInfo {
/// retry_delay: google.protobuf.Duration })] }`, protobuf-encoded. Every
/// field is a varint (wire type 0) or length-delimited (wire type 2); a
/// field's tag is its number shifted left by three, or'ed with its type.
fn status_details(code: u8, message: &str, wait: Duration) -> Vec<u8> {
    // google.protobuf.Duration: 1 seconds (int64), 2 nanos (int32).
    let mut duration = Vec::with_capacity(12);
    varint_field(&mut duration, 1, wait.as_secs());
    varint_field(&mut duration, 2, u64::from(wait.subsec_nanos()));
    // google.rpc.RetryInfo: 1 retry_delay.
    let mut retry_info = Vec::with_capacity(16);
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any: 1 type_url, 2 value.
    let mut any = Vec::with_capacity(64);
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status: 1 code (int32), 2 message, 3 details.
    let mut status = Vec::with_capacity(any.len() + message.len() + 8);
    varint_field(&mut status, 1, u64::from(code));
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

/// A varint field; proto3 leaves a zero out.
fn varint_field(out: &mut Vec<u8>, number: u64, value: u64) {
    if value != 0 {
        varint(out, number << 3);
        varint(out, value);
    }
}

fn bytes_field(out: &mut Vec<u8>, number: u64, value: &[u8]) {
    varint(out, (number << 3) | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Standard base64 without padding, as gRPC sends `-bin` metadata.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 0x3f) as usize] as char);
        }
    }
    out
}

/// The status's bytes, for tests that read them back.
#[cfg(test)]
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| {
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
            .iter()
            .position(|&a| a == c)
            .unwrap() as u32
    };
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | (value(c) << (18 - 6 * i)));
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_without_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg");
        assert_eq!(base64(b"fo"), "Zm8");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xfb, 0xff]), "+/8");
        for data in [&b"hello, world"[..], b"\x00\x01\x02\xff", b"ab"] {
            assert_eq!(unbase64(&base64(data)), data);
        }
    }

    #[test]
    fn grpc_message_is_percent_encoded_as_grpc_says() {
        assert_eq!(percent_encode("retry in 5 ms"), "retry in 5 ms");
        assert_eq!(percent_encode("100% used"), "100%25 used");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
    }

    #[test]
    fn the_status_details_are_google_rpc_status_with_retry_info() {
        let bytes = status_details(8, "hi", Duration::from_millis(1_500));
        let type_url = b"type.googleapis.com/google.rpc.RetryInfo";
        let mut expected = vec![0x08, 8, 0x12, 2, b'h', b'i', 0x1a];
        // Any: type_url (2 + 40), value: RetryInfo (2 + Duration (2 + 5)).
        let duration = [0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        let retry_info_len = 2 + duration.len();
        expected.push((2 + type_url.len() + 2 + retry_info_len) as u8);
        expected.extend([0x0a, type_url.len() as u8]);
        expected.extend(type_url);
        expected.extend([0x12, retry_info_len as u8, 0x0a, duration.len() as u8]);
        expected.extend(duration);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_wait_is_rounded_up_to_the_millisecond() {
        assert_eq!(millis(Duration::from_micros(1_001)), 2);
        assert_eq!(millis(Duration::from_millis(1_500)), 1_500);
        assert_eq!(millis(Duration::ZERO), 1);
    }
}
