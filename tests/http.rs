//! The layer as a client sees it: statuses, headers, bodies, refunds and
//! whose address counts, through an axum `Router`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::num::NonZeroU32;
use tollgate::clock::ManualClock;
use tollgate::headers::RateLimitHeaders;
use tollgate::key::RouteKey;
use tollgate::layer::LocalCache;
use tollgate::{
    ForwardedIp, HeaderKey, KeyExtractor, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer,
    Strategy,
};
use tower::ServiceExt;

const T0: u64 = 1_700_000_000_000_000;

fn quota(n: u32, secs: u64) -> Quota {
    Quota::new(n, Duration::from_secs(secs)).unwrap()
}

fn builder(n: u32, secs: u64, clock: &ManualClock) -> tollgate::RateLimitLayerBuilder {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", quota(n, secs)))
        .store(MemoryStore::with_clock(clock.clone()))
}

/// Answers 304 when `If-None-Match` matches the ETag, as conditional GETs do.
async fn tiger(headers: HeaderMap) -> impl IntoResponse {
    if headers.get("if-none-match").is_some_and(|v| v == "\"t1\"") {
        return (StatusCode::NOT_MODIFIED, [("etag", "\"t1\"")], "").into_response();
    }
    (StatusCode::OK, [("etag", "\"t1\"")], "feeding at noon").into_response()
}

fn app(layer: RateLimitLayer, peer: [u8; 4]) -> Router {
    Router::new()
        .route("/tiger", get(tiger))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from((peer, 4000))))
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

fn get_tiger() -> Request<Body> {
    Request::get("/tiger").body(Body::empty()).unwrap()
}

fn h<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn passes_carry_github_headers_with_one_reset_per_window() {
    let clock = ManualClock::new(T0);
    let app = app(builder(3, 60, &clock).build().unwrap(), [192, 0, 2, 1]);
    let mut resets = Vec::new();
    for (i, remaining) in ["2", "1", "0"].into_iter().enumerate() {
        clock.advance(Duration::from_millis(333));
        let (status, headers, body) = send(&app, get_tiger()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "feeding at noon");
        assert_eq!(h(&headers, "x-ratelimit-limit"), "3");
        assert_eq!(h(&headers, "x-ratelimit-remaining"), remaining);
        assert_eq!(h(&headers, "x-ratelimit-used"), (i + 1).to_string());
        assert_eq!(h(&headers, "x-ratelimit-resource"), "core");
        assert!(headers.get("retry-after").is_none());
        resets.push(h(&headers, "x-ratelimit-reset").to_owned());
    }
    // The window opened at T0 + 0.333 s and ends 60 s later; rounded up.
    assert_eq!(resets, vec![(T0 / 1_000_000 + 61).to_string(); 3]);
}

#[tokio::test]
async fn rejection_is_429_with_remaining_zero_retry_after_and_a_json_message() {
    let clock = ManualClock::new(T0);
    let app = app(builder(1, 10, &clock).build().unwrap(), [192, 0, 2, 2]);
    send(&app, get_tiger()).await;
    clock.advance(Duration::from_millis(9_100));
    let (status, headers, body) = send(&app, get_tiger()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h(&headers, "x-ratelimit-remaining"), "0");
    assert_eq!(h(&headers, "x-ratelimit-used"), "1");
    assert_eq!(
        h(&headers, "x-ratelimit-reset"),
        (T0 / 1_000_000 + 10).to_string()
    );
    assert_eq!(
        h(&headers, "retry-after"),
        "1",
        "0.9 s rounds up to 1, never 0"
    );
    assert_eq!(h(&headers, "content-type"), "application/json");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("rate limit exceeded"),
        "{json}"
    );
    assert_eq!(json["resource"], "core");
}

#[tokio::test]
async fn rejection_status_can_be_403_as_github_sends() {
    let clock = ManualClock::new(T0);
    let layer = builder(1, 10, &clock)
        .limited_status(StatusCode::FORBIDDEN)
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 3]);
    send(&app, get_tiger()).await;
    assert_eq!(send(&app, get_tiger()).await.0, StatusCode::FORBIDDEN);
}

/// What `@octokit/plugin-throttling` 11 and urllib3's `Retry` read from a
/// rejection (checked against the real clients by `scripts/clients/check.sh`):
/// octokit retries a 403 or 429 as a *primary* limit only when
/// `x-ratelimit-remaining` is exactly "0" and the message does not match
/// `/\bsecondary rate\b/i`, and then waits until `x-ratelimit-reset` + 1 s;
/// urllib3 sleeps `Retry-After` (integer seconds). Either wait must land in
/// the next window.
#[tokio::test]
async fn rejections_read_as_a_primary_limit_and_either_clients_wait_gets_through() {
    for (status, peer) in [
        (StatusCode::TOO_MANY_REQUESTS, [192, 0, 2, 40]),
        (StatusCode::FORBIDDEN, [192, 0, 2, 41]),
    ] {
        for octokit_wait in [false, true] {
            let clock = ManualClock::new(T0);
            let layer = builder(1, 10, &clock)
                .limited_status(status)
                .build()
                .unwrap();
            let app = app(layer, peer);
            clock.advance(Duration::from_millis(250)); // window ends at T0 + 10.25 s
            assert_eq!(send(&app, get_tiger()).await.0, StatusCode::OK);
            clock.advance(Duration::from_millis(3_250));

            let (got, headers, body) = send(&app, get_tiger()).await;
            assert_eq!(got, status);
            assert_eq!(h(&headers, "x-ratelimit-remaining"), "0");
            let message = serde_json::from_str::<serde_json::Value>(&body).unwrap()["message"]
                .as_str()
                .unwrap()
                .to_lowercase();
            assert!(!message.contains("secondary rate"), "{message}");
            let retry_after: u64 = h(&headers, "retry-after").parse().unwrap();
            let reset: u64 = h(&headers, "x-ratelimit-reset").parse().unwrap();
            assert_eq!((retry_after, reset), (7, T0 / 1_000_000 + 11));

            if octokit_wait {
                clock.set(reset * 1_000_000 + 1_000_000);
            } else {
                clock.advance(Duration::from_secs(retry_after));
            }
            let (got, headers, _) = send(&app, get_tiger()).await;
            assert_eq!(
                got,
                StatusCode::OK,
                "{status}, octokit's wait: {octokit_wait}"
            );
            assert_eq!(h(&headers, "x-ratelimit-used"), "1");
        }
    }
}

#[tokio::test]
async fn not_modified_is_refunded_and_says_so_in_its_headers() {
    let clock = ManualClock::new(T0);
    let app = app(builder(2, 60, &clock).build().unwrap(), [192, 0, 2, 4]);
    let conditional = || {
        Request::get("/tiger")
            .header("if-none-match", "\"t1\"")
            .body(Body::empty())
            .unwrap()
    };
    for _ in 0..5 {
        let (status, headers, _) = send(&app, conditional()).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "2");
        assert_eq!(h(&headers, "x-ratelimit-used"), "0");
    }
    assert_eq!(
        h(&send(&app, get_tiger()).await.1, "x-ratelimit-remaining"),
        "1"
    );
    assert_eq!(
        h(&send(&app, get_tiger()).await.1, "x-ratelimit-remaining"),
        "0"
    );
    assert_eq!(
        send(&app, conditional()).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn refund_predicate_is_configurable() {
    let clock = ManualClock::new(T0);
    let layer = builder(1, 60, &clock)
        .refund_when(|s| s.is_server_error())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/boom", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route("/tiger", get(tiger))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 5], 1))));
    for _ in 0..3 {
        let (status, headers, _) =
            send(&app, Request::get("/boom").body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "1");
    }
    let cond = Request::get("/tiger")
        .header("if-none-match", "\"t1\"")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        h(&send(&app, cond).await.1, "x-ratelimit-remaining"),
        "0",
        "304 no longer refunded"
    );
}

#[tokio::test]
async fn spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let clock = ManualClock::new(T0);
    let layer = builder(1, 60, &clock)
        .key(ForwardedIp::trusting(["10.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let direct = app(layer.clone(), [203, 0, 113, 50]);
    let spoofed = |ip: &str| {
        Request::get("/tiger")
            .header("x-forwarded-for", ip)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&direct, spoofed("1.1.1.1")).await.0, StatusCode::OK);
    // A fresh fake address each time buys nothing: the peer is the key.
    assert_eq!(
        send(&direct, spoofed("2.2.2.2")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    let via_proxy = app(layer, [10, 0, 0, 7]);
    assert_eq!(
        send(&via_proxy, spoofed("1.1.1.1, 198.51.100.9")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        send(&via_proxy, spoofed("3.3.3.3, 198.51.100.9")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&via_proxy, spoofed("198.51.100.10")).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn api_key_callers_have_their_own_budget_and_others_fall_back_to_the_ip() {
    let clock = ManualClock::new(T0);
    let layer = builder(1, 60, &clock)
        .key(HeaderKey::new("x-api-key").or(PeerIp::new()))
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 6]);
    let with_key = |k: &str| {
        Request::get("/tiger")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, with_key("alice")).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, with_key("alice")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, with_key("bob")).await.0, StatusCode::OK);
    assert_eq!(send(&app, get_tiger()).await.0, StatusCode::OK);
    assert_eq!(
        send(&app, get_tiger()).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_request_without_a_key_gets_400_and_never_a_panic() {
    let clock = ManualClock::new(T0);
    let layer = builder(5, 60, &clock)
        .key(HeaderKey::new("x-api-key"))
        .build()
        .unwrap();
    let (status, _, body) = send(&app(layer, [192, 0, 2, 7]), get_tiger()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("cannot identify the caller"), "{body}");

    // No ConnectInfo at all (served without connect info): still an answer.
    let layer = builder(5, 60, &clock).build().unwrap();
    let bare = Router::new().route("/tiger", get(tiger)).layer(layer);
    assert_eq!(send(&bare, get_tiger()).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn route_layer_keys_by_route_template_not_raw_path() {
    let clock = ManualClock::new(T0);
    let layer = builder(2, 60, &clock)
        .key(RouteKey.and(PeerIp::new()))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .route_layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 8], 1))));
    let user = |id: u32| {
        Request::get(format!("/users/{id}"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, user(1)).await.0, StatusCode::OK);
    assert_eq!(send(&app, user(2)).await.0, StatusCode::OK);
    assert_eq!(send(&app, user(3)).await.0, StatusCode::TOO_MANY_REQUESTS);
    // Unmatched routes never reach a route_layer: 404, not limited.
    let (status, headers, _) = send(&app, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(headers.get("x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn ietf_draft_headers_on_request_and_github_ones_can_be_switched_off() {
    let clock = ManualClock::new(T0);
    let layer = builder(100, 60, &clock)
        .headers(RateLimitHeaders::NONE.with_ietf_draft(true))
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 9]);
    clock.advance(Duration::from_millis(1));
    let (_, headers, _) = send(&app, get_tiger()).await;
    assert_eq!(h(&headers, "ratelimit-policy"), "\"core\";q=100;w=60");
    assert_eq!(h(&headers, "ratelimit"), "\"core\";r=99;t=60");
    assert!(headers.get("x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn cost_comes_from_the_request() {
    let clock = ManualClock::new(T0);
    let layer = builder(10, 60, &clock)
        .cost(|parts| {
            if parts.uri.query() == Some("search") {
                7
            } else {
                1
            }
        })
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 10]);
    let search = || Request::get("/tiger?search").body(Body::empty()).unwrap();
    assert_eq!(
        h(&send(&app, search()).await.1, "x-ratelimit-remaining"),
        "3"
    );
    assert_eq!(send(&app, search()).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        h(&send(&app, get_tiger()).await.1, "x-ratelimit-remaining"),
        "2"
    );
}

#[test]
fn bad_configuration_is_an_error_at_build_time() {
    let q = quota(1, 1);
    assert!(RateLimitLayer::builder()
        .build()
        .unwrap_err()
        .to_string()
        .contains("policy is required"));
    assert!(RateLimitLayer::builder()
        .policy(Policy::fixed_window("has space", q))
        .build()
        .is_err());
    assert!(RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", q))
        .limited_status(StatusCode::OK)
        .build()
        .is_err());
    assert!(RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", q))
        .deadline(Duration::ZERO)
        .build()
        .is_err());
}

#[tokio::test]
async fn every_strategy_sends_the_headers_and_refunds_a_304() {
    let gcra = Policy::gcra("gcra", quota(1, 1), NonZeroU32::new(2).unwrap());
    let policies = [
        Policy::uniform_gate("gate", Duration::from_secs(10)).unwrap(),
        Policy::sliding_log("log", quota(100, 10), quota(2, 10)),
        Policy::sliding_window("window", quota(2, 8)),
        gcra,
    ];
    for policy in policies {
        let clock = ManualClock::new(T0);
        let name = policy.name().to_owned();
        let limit = RateLimitLayer::builder()
            .policy(policy)
            .store(MemoryStore::with_clock(clock.clone()))
            .build()
            .unwrap();
        let app = app(limit, [192, 0, 2, 20]);
        let conditional = Request::get("/tiger")
            .header("if-none-match", "\"t1\"")
            .body(Body::empty())
            .unwrap();
        let (status, headers, _) = send(&app, conditional).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED, "{name}");
        let full = h(&headers, "x-ratelimit-limit").to_owned();
        assert_eq!(
            h(&headers, "x-ratelimit-remaining"),
            full,
            "{name}: refunded"
        );
        assert_eq!(h(&headers, "x-ratelimit-used"), "0", "{name}");
        assert_eq!(h(&headers, "x-ratelimit-resource"), name);
        // The refund reached the store: the whole limit is still there.
        for _ in 0..full.parse::<u32>().unwrap() {
            assert_eq!(send(&app, get_tiger()).await.0, StatusCode::OK, "{name}");
        }
        let (status, headers, _) = send(&app, get_tiger()).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name}");
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "0", "{name}");
        assert!(h(&headers, "retry-after").parse::<u64>().unwrap() >= 1);
    }
}

#[tokio::test]
async fn sliding_log_rejections_say_whether_the_resource_or_the_caller_ran_out() {
    let clock = ManualClock::new(T0);
    let layer = RateLimitLayer::builder()
        .policy(Policy::sliding_log(
            "tigerfeeding",
            quota(3, 10),
            quota(2, 10),
        ))
        .store(MemoryStore::with_clock(clock.clone()))
        .key(HeaderKey::new("x-api-key"))
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 21]);
    let from = |who: &str| {
        Request::get("/tiger")
            .header("x-api-key", who)
            .body(Body::empty())
            .unwrap()
    };
    let scope = |headers: &HeaderMap| h(headers, "x-ratelimit-scope").to_owned();

    let (status, headers, _) = send(&app, from("bob")).await;
    assert_eq!(
        (status, scope(&headers)),
        (StatusCode::OK, "consumer".into())
    );
    send(&app, from("bob")).await;
    let (status, headers, body) = send(&app, from("bob")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(scope(&headers), "consumer");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["scope"], "consumer", "{json}");
    assert_eq!(json["resource"], "tigerfeeding");

    // Ann takes the resource's third and last ticket; then nobody gets one.
    let (status, headers, _) = send(&app, from("ann")).await;
    assert_eq!(
        (status, scope(&headers)),
        (StatusCode::OK, "resource".into())
    );
    let (status, headers, body) = send(&app, from("cat")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(scope(&headers), "resource");
    assert_eq!(h(&headers, "x-ratelimit-limit"), "3");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["scope"], "resource", "{json}");
    assert!(
        json["message"].as_str().unwrap().contains("all callers"),
        "{json}"
    );
}

#[test]
fn strategy_parameters_are_checked_at_build_time() {
    let build = |policy: Policy| RateLimitLayer::builder().policy(policy).build();
    let err = |policy: Policy| build(policy).unwrap_err().to_string();
    assert!(
        err(Policy::new("gate", Strategy::UniformGate, quota(2, 10))).contains("limit must be 1")
    );
    assert!(err(Policy::new("log", Strategy::SlidingLog, quota(2, 10))).contains("two quotas"));
    assert!(err(Policy::sliding_log(
        "log",
        quota(2_000_000, 10),
        quota(2, 10)
    ))
    .contains("at most"));
    let burst = NonZeroU32::new(2).unwrap();
    assert!(err(Policy::gcra("gcra", quota(1, 1), burst).and(quota(5, 60))).contains("at most 1"));
    let slow = Policy::gcra("gcra", quota(1, 366 * 24 * 3600), burst);
    assert!(err(slow).contains("more than a year"));
    assert!(build(Policy::sliding_window("window", quota(10, 1)).and(quota(100, 60))).is_ok());
}

#[tokio::test]
async fn the_local_cache_answers_as_the_store_would_for_every_strategy() {
    // The cache repeats a rejection (or a pass that spent the last unit)
    // without asking the store, only where each strategy says the answer
    // cannot change meanwhile. Replay one trace with and without it.
    let ms = Duration::from_millis;
    let policies = [
        Policy::uniform_gate("gate", ms(700)).unwrap(),
        Policy::sliding_log("log", quota(4, 2), quota(2, 1)),
        Policy::sliding_window("window", quota(3, 1)),
        Policy::gcra("gcra", quota(2, 1), NonZeroU32::new(3).unwrap()),
    ];
    for policy in policies {
        let clock = ManualClock::new(T0);
        let layer = |cache: bool| {
            let builder = RateLimitLayer::builder()
                .policy(policy.clone())
                .store(MemoryStore::with_clock(clock.clone()))
                .key(HeaderKey::new("x-api-key"));
            let builder = match cache {
                true => builder.local_cache(LocalCache::new(100).clock(clock.clone())),
                false => builder,
            };
            builder.build().unwrap()
        };
        let (plain, cached) = (layer(false), layer(true));
        let (a, b) = (
            app(plain, [192, 0, 2, 30]),
            app(cached.clone(), [192, 0, 2, 30]),
        );
        let steps = [0, 1, 20, 50, 137, 0, 3, 400];
        for i in 0..300usize {
            clock.advance(ms(steps[(i * 7 + i / 5) % steps.len()]));
            // Runs of four from one caller, so rejections are followed up.
            let who = ["ann", "bob", "cat"][(i / 4 + i / 13) % 3];
            let req = || {
                Request::get("/tiger")
                    .header("x-api-key", who)
                    .body(Body::empty())
                    .unwrap()
            };
            let (sa, ha, _) = send(&a, req()).await;
            let (sb, hb, _) = send(&b, req()).await;
            let seen = |h: &HeaderMap| {
                ["retry-after", "x-ratelimit-remaining", "x-ratelimit-reset"]
                    .map(|n| h.get(n).map(|v| v.to_str().unwrap().to_owned()))
            };
            let here = format!("{} step {i} ({who})", policy.name());
            assert_eq!(sa, sb, "{here}");
            // Only the sliding log's shared limit can move a rejection's
            // Retry-After later meanwhile (other callers filling it); the
            // status stays right, the cached headers are then early.
            if ha.get("x-ratelimit-scope").is_none_or(|s| s == "consumer") {
                assert_eq!(seen(&ha), seen(&hb), "{here}");
            }
        }
        assert!(
            cached.local_cache_hits() > 0,
            "{}: the cache was used",
            policy.name()
        );
    }
}
