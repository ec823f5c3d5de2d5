//! Issue 45, point 4: a peek answers as a request would. For a caller who
//! had used up its window, peek said `"retry_after_secs": null` while a
//! request at the same moment was told `Retry-After: 29`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::{MemoryStore, RedisStore, Store};
use tower::ServiceExt;

use super::{app, call, App};
use crate::support::conformance::T0;
use crate::support::redis::RedisServer;

/// `acme`'s request to `/`: its status, `Retry-After` and
/// `X-RateLimit-Reset`.
async fn request(app: &App) -> (StatusCode, Option<u64>, u64) {
    let request = Request::get("/")
        .header("x-api-key", "acme")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().parse::<u64>().unwrap())
    };
    (
        response.status(),
        header("retry-after"),
        header("x-ratelimit-reset").unwrap(),
    )
}

/// What the admin API's peek says a request would be told:
/// `retry_after_secs` and `reset`.
async fn peek(app: &App) -> (Option<u64>, u64) {
    let (status, state) = call(
        &app.router,
        &Method::GET,
        "/admin/policies/api/peek?api_key=acme",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{state}");
    (
        state["retry_after_secs"].as_u64(),
        state["reset"].as_u64().unwrap(),
    )
}

async fn peek_tells_what_a_request_is_told(store: Arc<dyn Store>, clock: &ManualClock) {
    let app = app(store);
    // `api`: 100 an hour; three rejections within a minute block for one.
    clock.advance(Duration::from_secs(600));
    for _ in 0..100 {
        assert_eq!(request(&app).await.0, StatusCode::OK);
    }
    // Used up, not blocked; windows are whole hours of the clock.
    let peeked = peek(&app).await;
    let (status, retry_after, reset) = request(&app).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after.is_some());
    assert_eq!(peeked, (retry_after, reset), "used up");

    // Two rejections more: blocked for a minute, past the window's end.
    request(&app).await;
    request(&app).await;
    clock.advance(Duration::from_secs(1));
    let peeked = peek(&app).await;
    let (status, retry_after, reset) = request(&app).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(peeked, (retry_after, reset), "blocked");

    // With room left, no wait, as a request that passes.
    clock.advance(Duration::from_secs(3_600));
    let (retry_after, _) = peek(&app).await;
    assert_eq!(retry_after, None);
}

#[tokio::test]
async fn peek_tells_what_a_request_is_told_in_memory() {
    let clock = ManualClock::new(T0);
    let store = MemoryStore::with_clock(clock.clone());
    peek_tells_what_a_request_is_told(Arc::new(store), &clock).await;
}

#[tokio::test]
async fn peek_tells_what_a_request_is_told_on_redis() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect_builder(&redis.url())
        .await
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    peek_tells_what_a_request_is_told(Arc::new(store), &clock).await;
}
