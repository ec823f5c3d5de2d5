//! Stores that answer at once (`Store::check_now`, `Store::refund_now`): the
//! layer decides inside `call` and never awaits them, and a failure there
//! still reaches a fallback store that must be awaited.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::get;
use axum::Router;
use tower::ServiceExt;

mod support;

use support::counting::Counting;
use tollgate::clock::ManualClock;
use tollgate::decision::Receipt;
use tollgate::error::StoreErrorKind;
use tollgate::store::BoxFuture;
use tollgate::{
    Decision, FailurePolicy, Key, MemoryStore, Policy, Quota, RateLimitLayer, Store, StoreError,
};

/// Answers at once through a memory store; its awaited methods only count
/// that they were called, and never finish.
#[derive(Debug, Clone, Default)]
struct AtOnce {
    inner: MemoryStore,
    awaited: Arc<AtomicUsize>,
}

impl AtOnce {
    fn never<'a, T: Send + 'a>(&self) -> BoxFuture<'a, T> {
        self.awaited.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::pending())
    }
}

impl Store for AtOnce {
    fn check<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
        _: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.never()
    }

    fn peek<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.never()
    }

    fn refund<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
        _: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.never()
    }

    fn check_now(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
    ) -> Option<Result<Decision, StoreError>> {
        self.inner.check_now(policy, key, cost)
    }

    fn refund_now(
        &self,
        policy: &Policy,
        key: &Key,
        receipt: &Receipt,
    ) -> Option<Result<(), StoreError>> {
        self.inner.refund_now(policy, key, receipt)
    }
}

/// Fails at once, as a store might that knows its connection is gone.
#[derive(Debug)]
struct FailsAtOnce;

impl Store for FailsAtOnce {
    fn check<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
        _: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        unreachable!("answered at once")
    }

    fn peek<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        unreachable!("not peeked")
    }

    fn refund<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
        _: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        unreachable!("never charged")
    }

    fn check_now(&self, _: &Policy, _: &Key, _: u64) -> Option<Result<Decision, StoreError>> {
        Some(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

/// A handler that answers 304 to `If-None-Match`, as the zoo's does.
async fn etagged(headers: HeaderMap) -> StatusCode {
    if headers.contains_key("if-none-match") {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    }
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(etagged))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([10, 0, 0, 1], 1))))
}

async fn get_status(app: &Router, conditional: bool) -> (StatusCode, HeaderMap) {
    let mut request = Request::get("/");
    if conditional {
        request = request.header("if-none-match", "\"v1\"");
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    (response.status(), response.headers().clone())
}

#[tokio::test]
async fn a_store_that_answers_at_once_is_never_awaited_for_decisions_or_refunds() {
    let store = AtOnce {
        inner: MemoryStore::with_clock(ManualClock::new(1_000_000)),
        ..AtOnce::default()
    };
    let quota = Quota::per_minute(NonZeroU32::new(2).unwrap());
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", quota))
        .store(store.clone())
        .build()
        .unwrap();
    let app = app(layer);

    // A 304 is refunded: it leaves both units for the next two requests.
    let (status, headers) = get_status(&app, true).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!(headers["x-ratelimit-remaining"], "2");
    assert_eq!(get_status(&app, false).await.0, StatusCode::OK);
    let (status, headers) = get_status(&app, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(
        get_status(&app, false).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Every one of them finished although the awaited methods never do.
    assert_eq!(store.awaited.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_store_failing_at_once_falls_back_to_an_awaited_local_store() {
    // No `check_now`: the fallback must be awaited.
    let fallback = Counting::new();
    let quota = Quota::per_minute(NonZeroU32::new(1).unwrap());
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", quota))
        .store(FailsAtOnce)
        .on_store_failure(FailurePolicy::Local(Arc::new(fallback.clone())))
        .build()
        .unwrap();
    let app = app(layer);

    let (status, headers) = get_status(&app, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-ratelimit-fallback"], "local");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    let (status, headers) = get_status(&app, false).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["x-ratelimit-fallback"], "local");
    assert_eq!(fallback.checks(), 2);
}
