//! What a gRPC call gets from the layer, read off the HTTP response a gRPC
//! client receives (the tonic client's view is in `tests/grpc.rs`): a
//! trailers-only HTTP 200 whose headers carry the status, the message, the
//! pushback, the `RetryInfo` and the rate-limit metadata; and what a call
//! let through carries. An HTTP request to the same layer keeps its 429.

mod support;

use std::convert::Infallible;
use std::num::NonZeroU32;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tollgate::clock::ManualClock;
use tollgate::grpc::LimitedCode;
use tollgate::headers::RateLimitHeaders;
use tollgate::{
    FailurePolicy, HeaderKey, MemoryStore, Policy, Quota, RateLimitLayer, RateLimitLayerBuilder,
};
use tower::{ServiceBuilder, ServiceExt};

const T0: u64 = 1_700_000_000_000_000;

fn three_a_minute(clock: &ManualClock) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(MemoryStore::with_clock(clock.clone()))
}

fn grpc_call(api_key: Option<&str>) -> Request<()> {
    let mut request = Request::post("/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = api_key {
        request = request.header("x-api-key", key);
    }
    request.body(()).unwrap()
}

/// Answers as a tonic server does: 200, `application/grpc`, a body of frames.
async fn serve(layer: RateLimitLayer, request: Request<()>) -> (StatusCode, HeaderMap, Bytes) {
    let service = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<()>| async {
            let mut response =
                Response::new(Full::new(Bytes::from_static(b"\0\0\0\0\x02\x08\x01")));
            response
                .headers_mut()
                .insert("content-type", "application/grpc".parse().unwrap());
            Ok::<_, Infallible>(response)
        });
    let (head, body) = service.oneshot(request).await.unwrap().into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (head.status, head.headers, body)
}

#[tokio::test]
async fn a_limited_grpc_call_gets_resource_exhausted_trailers_only_with_pushback_and_metadata() {
    let clock = ManualClock::new(T0);
    let layer = three_a_minute(&clock).build().unwrap();
    for remaining in ["2", "1", "0"] {
        let (status, headers, body) = serve(layer.clone(), grpc_call(Some("k1"))).await;
        assert_eq!(status, StatusCode::OK);
        // A call let through: the rate-limit headers are its initial metadata.
        assert_eq!(headers["x-ratelimit-remaining"], remaining);
        assert_eq!(headers["x-ratelimit-limit"], "3");
        assert!(!headers.contains_key("grpc-status"));
        assert_eq!(body.len(), 7, "the inner service's messages, untouched");
    }
    clock.advance(Duration::from_millis(500));
    let (status, headers, body) = serve(layer, grpc_call(Some("k1"))).await;
    assert_eq!(status, StatusCode::OK, "gRPC statuses ride in an HTTP 200");
    assert!(body.is_empty(), "trailers-only: no body at all");
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["grpc-status"], "8");
    assert_eq!(
        headers["grpc-message"],
        "API rate limit exceeded for resource 'core'; retry in 59500 ms"
    );
    assert_eq!(headers["grpc-retry-pushback-ms"], "59500");
    assert!(headers.contains_key("grpc-status-details-bin"));
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(headers["x-ratelimit-limit"], "3");
    assert_eq!(headers["retry-after"], "60");
    assert!(!headers.contains_key("content-length"));
}

#[tokio::test]
async fn an_http_request_to_the_same_layer_still_gets_its_429() {
    let clock = ManualClock::new(T0);
    let layer = three_a_minute(&clock).build().unwrap();
    let http = || {
        Request::get("/")
            .header("x-api-key", "k1")
            .body(())
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(serve(layer.clone(), http()).await.0, StatusCode::OK);
    }
    let (status, headers, body) = serve(layer, http()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["content-type"], "application/json");
    assert!(!headers.contains_key("grpc-status"));
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["message"],
        "API rate limit exceeded for resource 'core'."
    );
}

#[tokio::test]
async fn the_limited_status_can_be_unavailable_as_envoy_answers() {
    let clock = ManualClock::new(T0);
    let layer = three_a_minute(&clock)
        .grpc_limited_code(LimitedCode::Unavailable)
        .build()
        .unwrap();
    for _ in 0..3 {
        serve(layer.clone(), grpc_call(Some("k1"))).await;
    }
    let (_, headers, _) = serve(layer, grpc_call(Some("k1"))).await;
    assert_eq!(headers["grpc-status"], "14");
    assert_eq!(headers["grpc-retry-pushback-ms"], "60000");
}

#[tokio::test]
async fn the_metadata_comes_in_the_dialect_chosen() {
    let clock = ManualClock::new(T0);
    let layer = three_a_minute(&clock)
        .headers(RateLimitHeaders::NONE.with_ietf_draft(true))
        .build()
        .unwrap();
    for _ in 0..3 {
        serve(layer.clone(), grpc_call(Some("k1"))).await;
    }
    let (_, headers, _) = serve(layer, grpc_call(Some("k1"))).await;
    assert_eq!(headers["grpc-status"], "8");
    assert!(headers.contains_key("ratelimit"), "{headers:?}");
    assert!(headers.contains_key("ratelimit-policy"));
    assert!(!headers.contains_key("x-ratelimit-remaining"));
}

#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument_never_an_http_400() {
    let clock = ManualClock::new(T0);
    let layer = three_a_minute(&clock).build().unwrap();
    let (status, headers, _) = serve(layer, grpc_call(None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["grpc-status"], "3");
    assert_eq!(
        headers["grpc-message"],
        "cannot identify the caller for rate limiting: request has no key header"
    );
    assert!(!headers.contains_key("grpc-retry-pushback-ms"));
}

use support::down::Down;

#[tokio::test]
async fn a_store_down_under_fail_closed_is_unavailable_never_an_http_503() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(3).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(Down)
        .on_store_failure(FailurePolicy::closed(Duration::from_secs(2)))
        .build()
        .unwrap();
    let (status, headers, _) = serve(layer, grpc_call(Some("k1"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["grpc-status"], "14");
    assert_eq!(headers["grpc-retry-pushback-ms"], "2000");
    assert_eq!(
        headers["grpc-message"],
        "rate limiting is unavailable; retry in 2000 ms"
    );
}

#[test]
fn the_method_of_a_grpc_call_is_its_route() {
    use tollgate::key::RouteKey;
    use tollgate::KeyExtractor;
    let (parts, ()) = grpc_call(None).into_parts();
    let key = RouteKey.extract(&parts).unwrap();
    assert_eq!(key.as_str(), "/grpc.health.v1.Health/Check");
    let odd = Request::post("/not/a/method")
        .header("content-type", "application/grpc+proto")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(
        RouteKey.extract(&odd).unwrap_err(),
        tollgate::KeyError::Invalid("gRPC method path (/package.Service/Method)")
    );
    // Not gRPC: still the matched route axum records, or none.
    let http = Request::get("/grpc.health.v1.Health/Check")
        .body(())
        .unwrap();
    assert!(RouteKey.extract(&http.into_parts().0).is_err());
}

#[test]
fn a_binary_metadata_key_is_hashed_as_bytes_never_read_as_text() {
    use tollgate::KeyExtractor;
    let token = HeaderKey::new("x-token-bin");
    let call = |value: &[u8]| {
        let mut request = grpc_call(None);
        let value = http::HeaderValue::from_bytes(value).unwrap();
        request.headers_mut().insert("x-token-bin", value);
        request.into_parts().0
    };
    let a = token.extract(&call(b"3q2+7w")).unwrap();
    assert!(a.as_str().starts_with("x-token-bin:"));
    assert!(!a.as_str().contains("3q2+7w"));
    assert_eq!(a, token.extract(&call(b"3q2+7w")).unwrap());
    assert_ne!(a, token.extract(&call(b"3q2+7A")).unwrap());
    // Bytes that are not text key all the same.
    assert!(token.extract(&call(b"\xde\xad\xbe\xef")).is_ok());
}
