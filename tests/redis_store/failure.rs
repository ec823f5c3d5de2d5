//! Failure: Redis down, slow, restarted or flushed, and keys of the wrong
//! type, are store errors or the failure policy, never panics or hangs.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use redis::Commands;
use tollgate::decision::Receipt;
use tollgate::error::StoreErrorKind;
use tollgate::{FailurePolicy, Key, Policy, RateLimitLayer, RedisStore, Store};
use tower::ServiceExt;

use crate::common::*;
use crate::support::redis::{client_calls, script_loads, shared_url, unique_prefix, RedisServer};

#[tokio::test]
async fn script_flush_is_recovered_without_a_failed_decision() {
    let server = RedisServer::start();
    let store = store_on(&server.url(), "flush").await;
    let policy = Policy::fixed_window("core", per_minute(10));
    let key = Key::new("bob");
    assert_eq!(store.check(&policy, &key, 1).await.unwrap().remaining, 9);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(store.check(&policy, &key, 1).await.unwrap().remaining, 8);
    let stats = client_calls(&server);
    assert_eq!(
        script_loads(&stats, 1),
        Some(2),
        "loaded on first use and after the flush: {stats:?}"
    );
}

#[tokio::test]
async fn a_receipt_without_stamps_is_never_a_panic() {
    // Receipt::new is public: a refund may carry anything.
    let memory = tollgate::MemoryStore::new();
    let redis = store_on(&shared_url(), &unique_prefix("stampless")).await;
    for (policy, _) in strategies() {
        let key = Key::new("bob");
        for store in [&memory as &dyn Store, &redis] {
            store.check(&policy, &key, 1).await.unwrap();
            // Ok or a store error, never a panic or a changed decision.
            let _ = store.refund(&policy, &key, &Receipt::new(1, vec![])).await;
            let _ = store.refund(&policy, &key, &Receipt::new(2, vec![7])).await;
        }
        let (m, r) = (
            memory.peek(&policy, &key).await.unwrap(),
            redis.peek(&policy, &key).await.unwrap(),
        );
        assert_eq!(m.remaining, r.remaining, "{}", policy.name());
    }
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_a_store_error_not_a_panic() {
    let url = shared_url();
    let prefix = unique_prefix("wrongtype");
    let store = store_on(&url, &prefix).await;
    let policy = Policy::fixed_window("core", per_minute(10));
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = conn
        .set_ex(format!("{prefix}:{{core|bob}}:fixed_window:0"), "x", 60)
        .unwrap();
    let err = store.check(&policy, &Key::new("bob"), 1).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rejected, "{err}");
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1234))))
}

async fn get_root(app: &Router) -> (axum::http::Response<Body>, Duration) {
    let started = Instant::now();
    let res = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    (res, started.elapsed())
}

fn layer(store: RedisStore, failure: FailurePolicy) -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", per_minute(2)))
        .store(store)
        .deadline(Duration::from_millis(100))
        .on_store_failure(failure)
        .build()
        .unwrap()
}

#[tokio::test]
async fn redis_down_applies_each_failure_policy_without_hanging() {
    let mut server = RedisServer::start();
    let store = store_on(&server.url(), "down").await;
    server.stop();

    let open = app(layer(store.clone(), FailurePolicy::Open));
    let (res, took) = get_root(&open).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-fallback"], "open");
    assert!(res.headers().get("x-ratelimit-remaining").is_none());
    assert!(took < Duration::from_millis(500), "took {took:?}");

    let closed = app(layer(
        store.clone(),
        FailurePolicy::closed(Duration::from_millis(1500)),
    ));
    let (res, took) = get_root(&closed).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "2");
    assert!(took < Duration::from_millis(500), "took {took:?}");

    let local = app(layer(store, FailurePolicy::local()));
    for remaining in ["1", "0"] {
        let (res, _) = get_root(&local).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-fallback"], "local");
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
    }
    let (res, took) = get_root(&local).await;
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the local limit holds meanwhile"
    );
    assert!(took < Duration::from_millis(500), "took {took:?}");
}

#[tokio::test]
async fn a_redis_slower_than_the_deadline_applies_the_failure_policy() {
    let server = RedisServer::start();
    // `connect`'s own connection has no redis-rs response timeout: the
    // layer's deadline alone bounds the wait.
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let policy = Policy::fixed_window("core", per_minute(2));
    store.check(&policy, &Key::new("warm-up"), 1).await.unwrap(); // loads the script
    let app = app(layer(store.clone(), FailurePolicy::Open));
    assert_eq!(
        get_root(&app).await.0.headers()["x-ratelimit-remaining"],
        "1"
    );

    server.pause_clients(Duration::from_millis(600));
    let (res, took) = get_root(&app).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-fallback"], "open");
    assert!(
        took < Duration::from_millis(300),
        "answered after the 100 ms deadline, not after Redis: {took:?}"
    );
    // The late reply is read and dropped; the connection goes on.
    let decision = store.check(&policy, &Key::new("after"), 1).await.unwrap();
    assert_eq!(decision.remaining, 1);
}

#[tokio::test]
async fn decisions_resume_after_a_redis_restart() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let policy = Policy::fixed_window("core", per_minute(100));
    let key = Key::new("bob");
    assert!(store.check(&policy, &key, 1).await.unwrap().allowed);

    server.stop();
    let err = store.check(&policy, &key, 1).await.unwrap_err();
    assert_ne!(err.kind(), StoreErrorKind::Protocol, "{err}");
    server.restart(); // an empty Redis: no keys, no scripts

    let deadline = Instant::now() + Duration::from_secs(5);
    let decision = loop {
        match store.check(&policy, &key, 1).await {
            Ok(d) => break d,
            Err(err) if Instant::now() < deadline => {
                tracing::debug!(%err, "still reconnecting");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("no decision 5 s after the restart: {err}"),
        }
    };
    assert!(decision.allowed);
    assert_eq!(
        decision.remaining, 99,
        "a fresh Redis starts a fresh window"
    );
}
