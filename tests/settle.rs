//! Issue 33, cost settled from the response: a request is charged an
//! estimate when it starts and settled to its real cost when its response
//! is done (`ActualCost` in the response, or the layer's `settle_cost`), in
//! one store call, on the memory store and on Redis; concurrent settles
//! and admissions; a settle that reaches Redis late; the metric.
//! (Each strategy's settle, on every store and topology, is in the
//! conformance rows.)

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::extract::Query;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use support::redis::{command_calls, reset_stats, shared_url, unique_prefix, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::error::StoreErrorKind;
use tollgate::{
    ActualCost, Decision, Key, MemoryStore, Policy, Quota, RateLimitLayer, RateLimiter, RedisStore,
    Store,
};
use tower::ServiceExt;

const T0: u64 = 1_700_000_000_000_000;

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

fn tokens() -> Policy {
    Policy::fixed_window("tokens", per_minute(100))
}

async fn redis_store(clock: &ManualClock, tag: &str) -> RedisStore {
    let client = redis::Client::open(shared_url()).unwrap();
    RedisStore::from_manager(client.get_connection_manager().await.unwrap())
        .prefix(unique_prefix(tag))
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Reports `?used=N` as the response's actual cost; a conditional request
/// answers 304, reporting a cost of 9 that the refund rule overrides.
async fn handler(Query(q): Query<HashMap<String, u64>>, headers: HeaderMap) -> Response {
    if headers.contains_key("if-none-match") {
        return (StatusCode::NOT_MODIFIED, Extension(ActualCost(9))).into_response();
    }
    match q.get("used") {
        Some(&n) => (Extension(ActualCost(n)), "done").into_response(),
        None => "done".into_response(),
    }
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/tokens", get(handler))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1))))
}

async fn get_tokens(app: &Router, query: &str) -> (StatusCode, HeaderMap) {
    let req = Request::get(format!("/tokens{query}"))
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    (res.status(), res.headers().clone())
}

fn remaining(headers: &HeaderMap) -> &str {
    headers["x-ratelimit-remaining"].to_str().unwrap()
}

/// The same session against any store: the estimate, then the settle.
async fn a_response_settles_its_charge(store: impl Store) {
    let layer = RateLimitLayer::builder()
        .policy(tokens())
        .shared_store(Arc::new(store))
        .cost(|_| 5) // the estimate
        .build()
        .unwrap();
    let app = app(layer);
    // No actual cost reported: the estimate stands.
    let (status, headers) = get_tokens(&app, "").await;
    assert_eq!((status, remaining(&headers)), (StatusCode::OK, "95"));
    // Cost more than estimated: the difference is charged.
    let (_, headers) = get_tokens(&app, "?used=30").await;
    assert_eq!(remaining(&headers), "65");
    // Cost less: the difference goes back.
    let (_, headers) = get_tokens(&app, "?used=1").await;
    assert_eq!(remaining(&headers), "64");
    // A 304 costs nothing, whatever the handler reported: today's refund.
    let req = Request::get("/tokens")
        .header("if-none-match", "\"t\"")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(remaining(res.headers()), "64");
    // Overspending takes Remaining to 0, never below, and the caller is
    // refused until the window frees enough. Used is the limit on the
    // response that overspent (536 spent of 100) and on the next: one rule
    // (issue 39: it was 536, then 100).
    let (status, headers) = get_tokens(&app, "?used=500").await;
    assert_eq!((status, remaining(&headers)), (StatusCode::OK, "0"));
    assert_eq!(headers["x-ratelimit-used"], "100");
    let (status, headers) = get_tokens(&app, "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(remaining(&headers), "0");
    assert_eq!(headers["x-ratelimit-used"], "100");
}

#[tokio::test]
async fn a_response_settles_its_charge_on_the_memory_store() {
    a_response_settles_its_charge(MemoryStore::with_clock(ManualClock::new(T0))).await;
}

#[tokio::test]
async fn a_response_settles_its_charge_on_redis() {
    let clock = ManualClock::new(T0);
    a_response_settles_its_charge(redis_store(&clock, "settle-layer").await).await;
}

#[tokio::test]
async fn settle_cost_reads_the_response_head() {
    let layer = RateLimitLayer::builder()
        .policy(tokens())
        .store(MemoryStore::with_clock(ManualClock::new(T0)))
        .settle_cost(|head| head.headers.get("x-used")?.to_str().ok()?.parse().ok())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { ([("x-used", "40")], "done") }))
        .route(
            "/ext",
            // The closure replaces the extension: this one is not read.
            get(|| async { (Extension(ActualCost(90)), "done") }),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1))));
    let res = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(remaining(res.headers()), "60");
    let res = app
        .oneshot(Request::get("/ext").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(remaining(res.headers()), "59", "the estimate stands");
}

/// A settle is one `EVALSHA` (the strategy's refund script), and none when
/// the response cost what was charged.
#[tokio::test]
async fn a_settle_is_one_evalsha_and_none_when_the_estimate_was_right() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let limiter = RateLimiter::new(tokens(), store).unwrap();
    // Loads the scripts, so the counts below are the calls alone.
    let warm = Key::new("warm");
    let warmed = limiter.check(&warm, 1).await.unwrap();
    limiter.settle(&warm, &warmed, 2).await.unwrap();
    let caller = Key::new("caller");
    let estimate = limiter.check(&caller, 1).await.unwrap();
    reset_stats(&server);
    let settled = limiter.settle(&caller, &estimate, 1).await.unwrap();
    assert_eq!(settled, estimate);
    assert_eq!(command_calls(&server).get("evalsha"), None);
    let settled = limiter.settle(&caller, &estimate, 7).await.unwrap();
    assert_eq!((settled.used, settled.remaining), (7, 93));
    let calls = command_calls(&server);
    assert_eq!(calls.get("evalsha"), Some(&1), "{calls:?}");
    assert_eq!(limiter.peek(&caller).await.unwrap().used, 7);
}

/// Requests that each charge an estimate and settle to their real cost,
/// all at once: the store's count ends exactly at what they really cost,
/// and the admitted requests' costs, each up to its estimate, never add up
/// to more than the limit (an overspend exceeds it by its own overage
/// only).
async fn concurrent_settles_keep_the_books(store: impl Store + Clone) {
    let limiter = RateLimiter::new(tokens(), store).unwrap();
    let caller = Key::new("crowd");
    let tasks: Vec<_> = (0..300u64)
        .map(|i| {
            let (limiter, caller) = (limiter.clone(), caller.clone());
            tokio::spawn(async move {
                let estimate = 1 + i % 3;
                let actual = (i * 7) % 6; // 0 to 5: under, at and over the estimate
                let decision = limiter.check(&caller, estimate).await.unwrap();
                if !decision.allowed {
                    return None;
                }
                let settled = limiter.settle(&caller, &decision, actual).await.unwrap();
                assert_eq!(settled.receipt.cost(), actual);
                Some((estimate, actual, settled))
            })
        })
        .collect();
    let mut admitted: Vec<(u64, u64, Decision)> = Vec::new();
    for task in tasks {
        admitted.extend(task.await.unwrap());
    }
    assert!(!admitted.is_empty());
    let spent: u64 = admitted.iter().map(|(_, actual, _)| actual).sum();
    let within_estimates: u64 = admitted.iter().map(|(e, a, _)| (*a).min(*e)).sum();
    assert!(
        within_estimates <= 100,
        "admitted {within_estimates} units within their estimates, of 100"
    );
    let peek = limiter.peek(&caller).await.unwrap();
    assert_eq!(peek.used, spent.min(100), "{peek:?}");
    // Giving every settled receipt back leaves the window exactly empty:
    // no unit was lost or counted twice.
    for (_, _, settled) in &admitted {
        limiter.refund(&caller, settled).await.unwrap();
    }
    let peek = limiter.peek(&caller).await.unwrap();
    assert_eq!((peek.used, peek.remaining), (0, 100), "{peek:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settles_and_admissions_keep_the_books_in_memory() {
    concurrent_settles_keep_the_books(MemoryStore::with_clock(ManualClock::new(T0))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settles_and_admissions_keep_the_books_on_redis() {
    let clock = ManualClock::new(T0);
    concurrent_settles_keep_the_books(redis_store(&clock, "settle-crowd").await).await;
}

/// Freezes `server` for `ms` with `CLIENT PAUSE` (in effect when it returns).
fn pause(server: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .query(&mut server.conn())
        .unwrap();
}

/// The late-call rules of refunds (docs/operations.md): a settle is sent
/// without a deadline, so one that reaches Redis after its caller stopped
/// waiting still applies, to the window its receipt names and to no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_that_reaches_redis_late_applies_to_its_own_window_only() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .clock(clock.clone())
        .build()
        .unwrap();
    let limiter = RateLimitLayer::builder()
        .policy(tokens())
        .store(store)
        .deadline(Duration::from_millis(50))
        .failure_cooldown(Duration::ZERO)
        .build()
        .unwrap()
        .limiter();
    // Loads the refund script: a late call that met NOSCRIPT would have
    // no caller left to load it and send it again.
    let warm = Key::new("warm");
    let warmed = limiter.check(&warm, 1).await.unwrap();
    limiter.settle(&warm, &warmed, 2).await.unwrap();
    let (ann, bob) = (Key::new("ann"), Key::new("bob"));
    let ann_estimate = limiter.check(&ann, 1).await.unwrap();
    let bob_estimate = limiter.check(&bob, 1).await.unwrap();

    // Redis freezes; both settles give up at their deadline and are run
    // when it answers again.
    tokio::task::block_in_place(|| pause(&server, 500));
    let late = limiter.settle(&ann, &ann_estimate, 40).await.unwrap_err();
    assert_eq!(late.kind(), StoreErrorKind::Timeout, "{late}");
    // Bob's window has ended by the time his settle runs: the clock the
    // store sends moves on, and his next request opens a new window.
    clock.advance(Duration::from_secs(60));
    let late = limiter.settle(&bob, &bob_estimate, 40).await.unwrap_err();
    assert_eq!(late.kind(), StoreErrorKind::Timeout, "{late}");

    // Once Redis answers again (a raw read waits out the pause), ann's
    // overspend is in the window it belongs to...
    let mut conn = server.conn();
    let _: () = redis::cmd("PING").query(&mut conn).unwrap();
    clock.set(T0 + 1_000_000);
    let peek = limiter.peek(&ann).await.unwrap();
    assert!(!peek.fallback, "{peek:?}");
    assert_eq!(peek.used, 40, "{peek:?}");
    // ...and bob's, for a window that has ended, moved nothing in the new one.
    clock.set(T0 + 61_000_000);
    let fresh = limiter.check(&bob, 1).await.unwrap();
    assert_eq!((fresh.used, fresh.fallback), (1, false), "{fresh:?}");
}

#[tokio::test]
async fn the_concurrency_limit_refuses_a_settle() {
    let one = NonZeroU32::new(1).unwrap();
    let policy = Policy::concurrency("slots", one, Duration::from_secs(60)).unwrap();
    let limiter = RateLimiter::new(policy, MemoryStore::new()).unwrap();
    let caller = Key::new("caller");
    let held = limiter.check(&caller, 1).await.unwrap();
    let refused = limiter.settle(&caller, &held, 3).await.unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Rejected, "{refused}");
    assert!(
        !limiter.check(&caller, 1).await.unwrap().allowed,
        "still held"
    );
}

#[test]
fn settled_units_are_counted_by_direction() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let limiter = RateLimiter::new(tokens(), MemoryStore::new()).unwrap();
            let caller = Key::new("caller");
            let d = limiter.check(&caller, 10).await.unwrap();
            limiter.settle(&caller, &d, 25).await.unwrap();
            let d = limiter.check(&caller, 10).await.unwrap();
            limiter.settle(&caller, &d, 4).await.unwrap();
        });
    });
    let mut seen = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() != tollgate::metrics::SETTLED_UNITS {
            continue;
        }
        let direction = key
            .key()
            .labels()
            .find(|l| l.key() == "direction")
            .unwrap()
            .value()
            .to_owned();
        let DebugValue::Counter(n) = value else {
            panic!("a counter")
        };
        seen.push((direction, n));
    }
    seen.sort();
    assert_eq!(
        seen,
        [("charged".to_owned(), 15), ("given_back".to_owned(), 6)]
    );
}
