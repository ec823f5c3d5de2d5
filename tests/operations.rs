//! Operations: shadow mode, allow- and deny-lists and metrics (tracing is
//! in `tests/tracing.rs`, which needs a process-wide subscriber),
//! exercised through an axum router the way an application uses the layer.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::BodyExt;
use tower::ServiceExt;

mod support;

use support::counting::Counting;
use tollgate::decision::Receipt;
use tollgate::store::BoxFuture;
use tollgate::{
    Decision, FailurePolicy, ForwardedIp, HeaderKey, Key, Policy, Quota, RateLimitLayer,
    RateLimitLayerBuilder, Store, StoreError,
};

// ---------------------------------------------------------------- doubles

use support::down::Down;

// ---------------------------------------------------------------- helpers

fn per_minute(n: u32) -> Policy {
    Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(n).unwrap()))
}

/// A layer that hands handlers its decision, which [`app`] answers with.
fn limit(n: u32) -> RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .policy(per_minute(n))
        .decision_extension(true)
}

/// A router whose handler answers `allowed=<bool>` from the decision the
/// layer put in the request, or `no-decision`.
fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/",
            get(|decision: Option<Extension<Decision>>| async move {
                match decision {
                    Some(Extension(d)) => format!("allowed={}", d.allowed),
                    None => "no-decision".to_owned(),
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .layer(layer)
}

async fn send(app: &Router, peer: &str, path: &str, headers: &[(&str, &str)]) -> Response<Body> {
    let mut req = Request::get(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let peer: SocketAddr = peer.parse().unwrap();
    app.clone()
        .layer(MockConnectInfo(peer))
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

async fn get_from(app: &Router, peer: &str) -> Response<Body> {
    send(app, peer, "/", &[]).await
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

async fn text(response: Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

// ---------------------------------------------------------------- shadow mode

#[tokio::test]
async fn shadow_mode_lets_over_limit_requests_through_showing_remaining_zero() {
    let store = Counting::new();
    let shadow = app(limit(2).store(store.clone()).shadow(true).build().unwrap());
    let peer = "192.0.2.1:1";

    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = get_from(&shadow, peer).await;
        seen.push((
            r.status(),
            header(&r, "x-ratelimit-remaining").map(str::to_owned),
            header(&r, "x-ratelimit-used").map(str::to_owned),
            r.headers().contains_key("retry-after"),
            text(r).await,
        ));
    }
    let expected = |remaining: &str, used: &str, body: &str| {
        (
            StatusCode::OK,
            Some(remaining.to_owned()),
            Some(used.to_owned()),
            false,
            body.to_owned(),
        )
    };
    assert_eq!(
        seen,
        vec![
            expected("1", "1", "allowed=true"),
            expected("0", "2", "allowed=true"),
            // Over the limit: through anyway, told Remaining 0, not charged
            // (Used stays 2), and the handler can tell from the decision.
            expected("0", "2", "allowed=false"),
            expected("0", "2", "allowed=false"),
        ]
    );
    assert_eq!(store.checks(), 4, "shadow mode still asks the store");
}

#[tokio::test]
async fn without_shadow_mode_the_same_limit_rejects() {
    let enforced = app(limit(2).store(Counting::new()).build().unwrap());
    let peer = "192.0.2.1:1";
    let statuses = [
        get_from(&enforced, peer).await.status(),
        get_from(&enforced, peer).await.status(),
        get_from(&enforced, peer).await.status(),
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

#[tokio::test]
async fn shadow_mode_fails_open_where_fail_closed_would_refuse() {
    let closed = || {
        limit(5)
            .store(Down)
            .on_store_failure(FailurePolicy::closed(Duration::from_secs(2)))
    };
    let enforced = app(closed().build().unwrap());
    assert_eq!(
        get_from(&enforced, "192.0.2.1:1").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );

    let shadow = app(closed().shadow(true).build().unwrap());
    let r = get_from(&shadow, "192.0.2.1:1").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-fallback"), Some("open"));
}

#[tokio::test]
async fn shadow_mode_lets_unidentified_callers_through() {
    let by_api_key = || limit(5).key(HeaderKey::new("x-api-key"));
    let enforced = app(by_api_key().build().unwrap());
    assert_eq!(
        get_from(&enforced, "192.0.2.1:1").await.status(),
        StatusCode::BAD_REQUEST
    );

    let shadow = app(by_api_key().shadow(true).build().unwrap());
    let r = get_from(&shadow, "192.0.2.1:1").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(!r.headers().contains_key("x-ratelimit-remaining"));
}

#[tokio::test]
async fn shadow_mode_still_enforces_deny_lists() {
    let store = Counting::new();
    let shadow = app(limit(5)
        .store(store.clone())
        .shadow(true)
        .deny_cidrs(["203.0.113.0/24"])
        .build()
        .unwrap());
    let r = get_from(&shadow, "203.0.113.7:1").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.checks(), 0);
}

// ---------------------------------------------------------------- deny- and allow-lists

#[tokio::test]
async fn deny_listed_network_is_refused_without_asking_the_store() {
    let store = Counting::new();
    let app = app(limit(5)
        .store(store.clone())
        .deny_cidrs(["203.0.113.0/24", "2001:db8:bad::/48"])
        .build()
        .unwrap());

    for peer in ["203.0.113.7:1", "[2001:db8:bad:1::9]:1"] {
        let r = get_from(&app, peer).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{peer}");
        assert_eq!(header(&r, "content-type"), Some("application/json"));
        assert!(!r.headers().contains_key("x-ratelimit-remaining"));
        assert!(
            !r.headers().contains_key("retry-after"),
            "waiting does not help"
        );
        let body: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
        assert_eq!(body["resource"], "core");
        assert!(body["message"].as_str().unwrap().contains("refused"));
    }
    assert_eq!(store.checks(), 0, "denied requests never reach the store");

    assert_eq!(
        get_from(&app, "198.51.100.1:1").await.status(),
        StatusCode::OK
    );
    assert_eq!(store.checks(), 1);
}

#[tokio::test]
async fn deny_uses_the_configured_limited_status_and_closures() {
    let store = Counting::new();
    let app = app(limit(5)
        .store(store.clone())
        .limited_status(StatusCode::FORBIDDEN)
        .deny(|parts| {
            parts
                .headers
                .get("user-agent")
                .is_some_and(|ua| ua == "BadBot/1.0")
        })
        .build()
        .unwrap());
    let bot = send(&app, "192.0.2.1:1", "/", &[("user-agent", "BadBot/1.0")]).await;
    assert_eq!(bot.status(), StatusCode::FORBIDDEN);
    let browser = send(&app, "192.0.2.1:1", "/", &[("user-agent", "Mozilla/5.0")]).await;
    assert_eq!(browser.status(), StatusCode::OK);
    assert_eq!(store.checks(), 1);
}

#[tokio::test]
async fn handlers_are_handed_the_decision_only_when_asked() {
    for (asked, expected) in [
        (None, "no-decision"),
        (Some(false), "no-decision"),
        (Some(true), "allowed=true"),
    ] {
        let builder = RateLimitLayer::builder().policy(per_minute(5));
        let builder = match asked {
            Some(on) => builder.decision_extension(on),
            None => builder,
        };
        let app = app(builder.build().unwrap());
        let r = get_from(&app, "192.0.2.1:1").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            r.headers()["x-ratelimit-remaining"],
            "4",
            "the headers are sent either way"
        );
        assert_eq!(text(r).await, expected, "decision_extension: {asked:?}");
    }
}

#[tokio::test]
async fn allow_listed_requests_skip_the_store_and_the_limit() {
    let store = Counting::new();
    let app = app(limit(1)
        .store(store.clone())
        .allow_cidrs(["10.0.0.0/8"])
        .allow(|parts| parts.uri.path() == "/healthz")
        .build()
        .unwrap());

    for _ in 0..5 {
        let r = get_from(&app, "10.1.2.3:1").await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(!r.headers().contains_key("x-ratelimit-remaining"));
        assert_eq!(text(r).await, "no-decision");
        let r = send(&app, "192.0.2.1:1", "/healthz", &[]).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    assert_eq!(
        store.checks(),
        0,
        "allow-listed requests never reach the store"
    );

    // Everyone else is limited as usual.
    assert_eq!(get_from(&app, "192.0.2.1:1").await.status(), StatusCode::OK);
    assert_eq!(
        get_from(&app, "192.0.2.1:1").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(store.checks(), 2);
}

#[tokio::test]
async fn a_request_on_both_lists_is_denied() {
    let app = app(limit(5)
        .allow_cidrs(["10.0.0.0/8"])
        .deny_cidrs(["10.6.6.0/24"])
        .build()
        .unwrap());
    assert_eq!(
        get_from(&app, "10.6.6.6:1").await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(get_from(&app, "10.1.1.1:1").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn lists_match_the_client_behind_trusted_proxies_only() {
    let store = Counting::new();
    let proxies = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
    let app = app(limit(1)
        .store(store.clone())
        .key(proxies.clone())
        .allow_cidrs(["192.0.2.0/24"])
        .cidr_address(proxies)
        .build()
        .unwrap());
    let xff = [("x-forwarded-for", "192.0.2.5")];

    // Through our proxy, the allow-listed client skips the limit.
    for _ in 0..3 {
        assert_eq!(
            send(&app, "10.0.0.1:1", "/", &xff).await.status(),
            StatusCode::OK
        );
    }
    assert_eq!(store.checks(), 0);

    // A stranger claiming the same address is not believed.
    let spoofer = "198.51.100.9:1";
    assert_eq!(
        send(&app, spoofer, "/", &xff).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, spoofer, "/", &xff).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(store.checks(), 2);
}

#[test]
fn an_invalid_network_fails_the_build_with_the_culprit_named() {
    let err = limit(5)
        .allow_cidrs(["10.0.0.0/8"])
        .deny_cidrs(["300.1.2.3"])
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("300.1.2.3"), "{err}");
}

// ---------------------------------------------------------------- metrics

#[cfg(feature = "metrics")]
mod metrics {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    /// A recorder for this thread only, so tests running in parallel do
    /// not see each other's counts.
    struct Recorded {
        snapshotter: Snapshotter,
        _guard: ::metrics::LocalRecorderGuard<'static>,
    }

    fn record() -> Recorded {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        Recorded {
            snapshotter: recorder.snapshotter(),
            _guard: ::metrics::set_default_local_recorder(recorder),
        }
    }

    /// Every series of one snapshot as `(name, sorted "k=v" labels, value)`.
    struct Seen(Vec<(String, Vec<String>, DebugValue)>);

    impl Recorded {
        /// What was recorded so far (the recorder starts again from zero).
        fn take(&self) -> Seen {
            Seen(
                self.snapshotter
                    .snapshot()
                    .into_vec()
                    .into_iter()
                    .map(|(key, _, _, value)| {
                        let mut labels: Vec<String> = key
                            .key()
                            .labels()
                            .map(|l| format!("{}={}", l.key(), l.value()))
                            .collect();
                        labels.sort();
                        (key.key().name().to_owned(), labels, value)
                    })
                    .collect(),
            )
        }
    }

    impl Seen {
        /// The counter with exactly these labels (0 when absent).
        fn counter(&self, name: &str, labels: &[&str]) -> u64 {
            let mut want: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
            want.sort();
            self.0
                .iter()
                .find(|(n, l, _)| n == name && *l == want)
                .map_or(0, |(_, _, v)| match v {
                    DebugValue::Counter(n) => *n,
                    other => panic!("{name} is not a counter: {other:?}"),
                })
        }

        fn decisions(&self, outcome: &str) -> u64 {
            self.counter(
                tollgate::metrics::DECISIONS,
                &["policy=core", &format!("outcome={outcome}")],
            )
        }

        /// Latency samples per label set.
        fn latency(&self) -> Vec<(Vec<String>, usize)> {
            self.0
                .iter()
                .filter(|(n, ..)| n == tollgate::metrics::STORE_LATENCY)
                .map(|(_, labels, v)| match v {
                    DebugValue::Histogram(samples) => (labels.clone(), samples.len()),
                    other => panic!("latency is not a histogram: {other:?}"),
                })
                .collect()
        }

        fn latency_samples(&self) -> usize {
            self.latency().iter().map(|(_, n)| n).sum()
        }
    }

    /// Three requests of one caller (a budget of 1: one passes, two are
    /// limited), one from the allow list and one from the deny list.
    async fn one_of_each(app: &Router) {
        for peer in [
            "192.0.2.1:1",
            "192.0.2.1:1",
            "192.0.2.1:1",
            "10.0.0.1:1",
            "203.0.113.1:1",
        ] {
            get_from(app, peer).await;
        }
    }

    #[tokio::test]
    async fn decisions_are_counted_by_policy_and_outcome() {
        let recorded = record();
        let app = app(limit(1)
            .allow_cidrs(["10.0.0.0/8"])
            .deny_cidrs(["203.0.113.0/24"])
            .build()
            .unwrap());
        one_of_each(&app).await;

        let seen = recorded.take();
        assert_eq!(seen.decisions("allowed"), 1);
        assert_eq!(seen.decisions("limited"), 2);
        assert_eq!(seen.decisions("allow_listed"), 1);
        assert_eq!(seen.decisions("deny_listed"), 1);
        assert_eq!(seen.decisions("shadow_limited"), 0);
        // The memory store answers in process: nothing was waited for, so
        // nothing is timed (the histogram measures a remote store's waits).
        assert_eq!(seen.latency_samples(), 0);
    }

    #[tokio::test]
    async fn only_the_requests_that_asked_an_awaited_store_are_timed() {
        let recorded = record();
        let app = app(limit(1)
            .store(Counting::new()) // awaited: no `check_now`
            .allow_cidrs(["10.0.0.0/8"])
            .deny_cidrs(["203.0.113.0/24"])
            .build()
            .unwrap());
        one_of_each(&app).await;

        let seen = recorded.take();
        assert_eq!(seen.decisions("allowed"), 1);
        assert_eq!(seen.decisions("limited"), 2);
        // Only the three requests that asked the store were timed.
        assert_eq!(seen.latency(), vec![(vec!["policy=core".to_owned()], 3)]);
    }

    #[tokio::test]
    async fn shadow_rejections_are_counted_apart() {
        let recorded = record();
        let app = app(limit(1).shadow(true).build().unwrap());
        for _ in 0..3 {
            assert_eq!(get_from(&app, "192.0.2.1:1").await.status(), StatusCode::OK);
        }
        let seen = recorded.take();
        assert_eq!(seen.decisions("allowed"), 1);
        assert_eq!(seen.decisions("shadow_limited"), 2);
        assert_eq!(seen.decisions("limited"), 0);
    }

    #[tokio::test]
    async fn key_errors_are_counted() {
        let recorded = record();
        let app = app(limit(1).key(HeaderKey::new("x-api-key")).build().unwrap());
        get_from(&app, "192.0.2.1:1").await;
        let seen = recorded.take();
        assert_eq!(seen.decisions("key_error"), 1);
        assert_eq!(seen.latency_samples(), 0);
    }

    #[tokio::test]
    async fn store_errors_are_counted_by_kind_with_what_the_failure_policy_did() {
        let recorded = record();
        let fallback = app(limit(1).store(Down).build().unwrap());
        let open = app(limit(1)
            .store(Down)
            .on_store_failure(FailurePolicy::Open)
            .build()
            .unwrap());
        let closed = app(limit(1)
            .store(Down)
            .on_store_failure(FailurePolicy::closed(Duration::from_secs(1)))
            .build()
            .unwrap());
        get_from(&fallback, "192.0.2.1:1").await; // the local fallback allows
        get_from(&fallback, "192.0.2.1:1").await; // and then limits
        get_from(&open, "192.0.2.1:1").await;
        get_from(&closed, "192.0.2.1:1").await;

        let seen = recorded.take();
        assert_eq!(seen.decisions("fallback"), 1);
        assert_eq!(seen.decisions("limited"), 1);
        assert_eq!(seen.decisions("fail_open"), 1);
        assert_eq!(seen.decisions("fail_closed"), 1);
        // The fallback's second request fell in the failure cooldown: the
        // store was not called, so there is no error and no latency for it.
        assert_eq!(
            seen.counter(
                tollgate::metrics::STORE_ERRORS,
                &["policy=core", "kind=unavailable"]
            ),
            3
        );
        assert_eq!(seen.latency_samples(), 3, "failures are timed too");
    }

    #[tokio::test]
    async fn store_timeouts_are_counted_as_timeouts() {
        #[derive(Debug)]
        struct Slow;
        impl Store for Slow {
            fn check<'a>(
                &'a self,
                _: &'a Policy,
                _: &'a Key,
                _: u64,
            ) -> BoxFuture<'a, Result<Decision, StoreError>> {
                Box::pin(std::future::pending())
            }
            fn peek<'a>(
                &'a self,
                _: &'a Policy,
                _: &'a Key,
            ) -> BoxFuture<'a, Result<Decision, StoreError>> {
                Box::pin(std::future::pending())
            }
            fn refund<'a>(
                &'a self,
                _: &'a Policy,
                _: &'a Key,
                _: &'a Receipt,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(std::future::pending())
            }
        }
        let recorded = record();
        let app = app(limit(1)
            .store(Slow)
            .deadline(Duration::from_millis(5))
            .on_store_failure(FailurePolicy::Open)
            .build()
            .unwrap());
        assert_eq!(get_from(&app, "192.0.2.1:1").await.status(), StatusCode::OK);
        let seen = recorded.take();
        assert_eq!(
            seen.counter(
                tollgate::metrics::STORE_ERRORS,
                &["policy=core", "kind=timeout"]
            ),
            1
        );
        assert_eq!(seen.decisions("fail_open"), 1);
    }
}
