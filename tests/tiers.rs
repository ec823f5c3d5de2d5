//! Tiers as a client sees them, through an axum `Router`, on the memory
//! store and on Redis: anonymous callers counted by IP, callers with an
//! `X-Api-Key` by key, `ent-` keys in a third tier.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::connect_info::MockConnectInfo;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use support::counting::Counting;
use support::redis::{evalsha_calls, reset_stats, shared_url, unique_prefix, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::layer::PeekError;
use tollgate::tier::{TieredLayerBuilder, Unplaced};
use tollgate::{
    FailurePolicy, HeaderKey, MemoryStore, PeerIp, Policy, Quota, RateLimitLayer,
    RateLimitLayerBuilder, RedisStore, Store, TieredLayer,
};
use tower::ServiceExt;

const T0: u64 = 1_700_000_000_000_000;
const ANON: u32 = 3;
const KEY: u32 = 5;
const ENT: u32 = 8;

fn quota(n: u32, secs: u64) -> Quota {
    Quota::new(n, Duration::from_secs(secs)).unwrap()
}

/// `X-Plan` (a plan an authentication layer would have set) wins; else an
/// `ent-` key is enterprise, any other key is `key`, and no key anonymous.
fn choose(parts: &Parts) -> Option<&str> {
    if let Some(plan) = parts.headers.get("x-plan") {
        return plan.to_str().ok().filter(|p| !p.is_empty());
    }
    match parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        None => Some("anonymous"),
        Some(key) if key.starts_with("ent-") => Some("enterprise"),
        Some(_) => Some("key"),
    }
}

fn tier(name: &str, limit: u32, secs: u64) -> RateLimitLayerBuilder {
    RateLimitLayer::builder().policy(Policy::fixed_window(name.to_owned(), quota(limit, secs)))
}

/// Anonymous: 3 a minute by IP; key: 5 an hour by key; enterprise: 8 an
/// hour by key. All in `store`.
fn tiers(store: Arc<dyn Store>) -> TieredLayerBuilder {
    TieredLayer::builder()
        .tier(tier("anonymous", ANON, 60).key(PeerIp::new()))
        .tier(tier("key", KEY, 3600).key(HeaderKey::new("x-api-key")))
        .tier(tier("enterprise", ENT, 3600).key(HeaderKey::new("x-api-key")))
        .choose(choose)
        .shared_store(store)
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::with_clock(ManualClock::new(T0)))
}

async fn redis(tag: &str) -> Arc<dyn Store> {
    let conn = redis::Client::open(shared_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store = RedisStore::from_manager(conn)
        .prefix(unique_prefix(tag))
        .build()
        .unwrap();
    Arc::new(store)
}

/// Answers 304 when `If-None-Match` matches the ETag, as conditional GETs do.
async fn tiger(headers: HeaderMap) -> impl IntoResponse {
    if headers.get("if-none-match").is_some_and(|v| v == "\"t1\"") {
        return (StatusCode::NOT_MODIFIED, [("etag", "\"t1\"")], "").into_response();
    }
    (StatusCode::OK, [("etag", "\"t1\"")], "feeding at noon").into_response()
}

fn app(layer: TieredLayer, peer: [u8; 4]) -> Router {
    Router::new()
        .route("/tiger", get(tiger))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from((peer, 4000))))
}

/// `GET /tiger` with these headers.
fn get_tiger(headers: &[(&str, &str)]) -> Request<Body> {
    let mut req = Request::get("/tiger");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::empty()).unwrap()
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

fn h<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// The tier a request from `peer` with `headers` falls in, and what it has
/// left there, as `GET /rate_limit` would show it.
async fn peek(layer: &TieredLayer, peer: [u8; 4], headers: &[(&str, &str)]) -> (String, u64) {
    let (mut parts, _) = get_tiger(headers).into_parts();
    parts
        .extensions
        .insert(axum::extract::ConnectInfo(SocketAddr::from((peer, 4000))));
    let (policy, decision) = layer.peek(&parts).await.unwrap();
    (policy.name().to_owned(), decision.remaining)
}

/// Runs a scenario against a fresh memory store and a Redis store.
macro_rules! on_each_store {
    ($($(#[$meta:meta])* async fn $name:ident($store:ident) $body:block)*) => {$(
        mod $name {
            use super::*;

            async fn scenario($store: Arc<dyn Store>) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                scenario(super::memory()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                scenario(super::redis("tiers").await).await
            }
        }
    )*};
}

const KEY_1: (&str, &str) = ("x-api-key", "k-1");
const ENT_1: (&str, &str) = ("x-api-key", "ent-1");

on_each_store! {
    async fn each_tier_counts_only_its_own_callers(store) {
        let layer = tiers(store).build().unwrap();
        let app = app(layer.clone(), [192, 0, 2, 1]);
        for (i, remaining) in ["2", "1", "0"].into_iter().enumerate() {
            let (status, headers, _) = send(&app, get_tiger(&[])).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(h(&headers, "x-ratelimit-limit"), "3");
            assert_eq!(h(&headers, "x-ratelimit-remaining"), remaining);
            assert_eq!(h(&headers, "x-ratelimit-used"), (i + 1).to_string());
            assert_eq!(h(&headers, "x-ratelimit-resource"), "anonymous");
        }
        let (status, headers, body) = send(&app, get_tiger(&[])).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h(&headers, "x-ratelimit-resource"), "anonymous");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["resource"], "anonymous");
        assert!(json["message"].as_str().unwrap().contains("'anonymous'"), "{json}");

        // The same address with a key, then an enterprise key: their own budgets.
        let (status, headers, _) = send(&app, get_tiger(&[KEY_1])).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h(&headers, "x-ratelimit-limit"), "5");
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "4");
        assert_eq!(h(&headers, "x-ratelimit-resource"), "key");
        let (status, headers, _) = send(&app, get_tiger(&[ENT_1])).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h(&headers, "x-ratelimit-limit"), "8");
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "7");
        assert_eq!(h(&headers, "x-ratelimit-resource"), "enterprise");

        // Another anonymous address is untouched by all of it.
        let other = app_with_peer(&layer, [192, 0, 2, 2]);
        let (_, headers, _) = send(&other, get_tiger(&[])).await;
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "2");

        assert_eq!(peek(&layer, [192, 0, 2, 1], &[]).await, ("anonymous".into(), 0));
        assert_eq!(peek(&layer, [192, 0, 2, 1], &[KEY_1]).await, ("key".into(), 4));
        assert_eq!(peek(&layer, [192, 0, 2, 1], &[ENT_1]).await, ("enterprise".into(), 7));
    }

    async fn a_caller_who_starts_sending_a_token_moves_to_its_budget(store) {
        let layer = tiers(store).build().unwrap();
        let app = app(layer.clone(), [192, 0, 2, 3]);
        for _ in 0..2 {
            assert_eq!(send(&app, get_tiger(&[])).await.0, StatusCode::OK);
        }
        for i in 1..=KEY {
            let (status, headers, _) = send(&app, get_tiger(&[KEY_1])).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(h(&headers, "x-ratelimit-resource"), "key");
            assert_eq!(h(&headers, "x-ratelimit-remaining"), (KEY - i).to_string());
        }
        let (status, headers, body) = send(&app, get_tiger(&[KEY_1])).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(h(&headers, "x-ratelimit-limit"), "5");
        assert!(body.contains("'key'"), "{body}");
        // The token's requests left the address's anonymous budget alone.
        assert_eq!(peek(&layer, [192, 0, 2, 3], &[]).await, ("anonymous".into(), 1));
        let (status, headers, _) = send(&app, get_tiger(&[])).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "0");
    }

    async fn no_double_counting_when_the_tier_changes_between_requests(store) {
        let layer = tiers(store).build().unwrap();
        let app = app(layer.clone(), [192, 0, 2, 4]);
        let order: [&[(&str, &str)]; 7] =
            [&[], &[KEY_1], &[ENT_1], &[KEY_1], &[], &[ENT_1], &[ENT_1]];
        for headers in order {
            assert_eq!(send(&app, get_tiger(headers)).await.0, StatusCode::OK);
        }
        let left = |tier: &str, limit: u32, used: u32| (tier.to_owned(), u64::from(limit - used));
        assert_eq!(peek(&layer, [192, 0, 2, 4], &[]).await, left("anonymous", ANON, 2));
        assert_eq!(peek(&layer, [192, 0, 2, 4], &[KEY_1]).await, left("key", KEY, 2));
        assert_eq!(peek(&layer, [192, 0, 2, 4], &[ENT_1]).await, left("enterprise", ENT, 3));
    }

    async fn four_times_each_limit_in_parallel_admits_exactly_each_limit(store) {
        let layer = tiers(store).build().unwrap();
        let app = app(layer, [192, 0, 2, 5]);
        let mut calls = Vec::new();
        for (headers, limit) in [(None, ANON), (Some(KEY_1), KEY), (Some(ENT_1), ENT)] {
            for _ in 0..4 * limit {
                let app = app.clone();
                calls.push(tokio::spawn(async move {
                    let req = get_tiger(headers.as_slice());
                    let (status, headers, _) = send(&app, req).await;
                    (h(&headers, "x-ratelimit-resource").to_owned(), status)
                }));
            }
        }
        let mut admitted = std::collections::BTreeMap::<String, u32>::new();
        for call in calls {
            let (tier, status) = call.await.unwrap();
            let n = admitted.entry(tier).or_default();
            match status {
                StatusCode::OK => *n += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected {other}"),
            }
        }
        let expected = [("anonymous", ANON), ("enterprise", ENT), ("key", KEY)];
        let expected: std::collections::BTreeMap<String, u32> =
            expected.into_iter().map(|(t, n)| (t.to_owned(), n)).collect();
        assert_eq!(admitted, expected);
    }

    async fn a_304_is_refunded_to_the_tier_that_counted_it(store) {
        let layer = tiers(store).build().unwrap();
        let app = app(layer.clone(), [192, 0, 2, 6]);
        assert_eq!(send(&app, get_tiger(&[KEY_1])).await.0, StatusCode::OK);
        let (status, headers, _) =
            send(&app, get_tiger(&[KEY_1, ("if-none-match", "\"t1\"")])).await;
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert_eq!(h(&headers, "x-ratelimit-resource"), "key");
        assert_eq!(h(&headers, "x-ratelimit-remaining"), "4", "the 304 was free");
        assert_eq!(peek(&layer, [192, 0, 2, 6], &[KEY_1]).await, ("key".into(), 4));
        assert_eq!(peek(&layer, [192, 0, 2, 6], &[]).await, ("anonymous".into(), 3));
    }

    async fn an_unplaced_request_is_counted_in_the_default_tier(store) {
        let layer = tiers(store).unplaced(Unplaced::tier("anonymous")).build().unwrap();
        let app = app(layer.clone(), [192, 0, 2, 7]);
        // An empty plan (None) and a plan with no tier (an unknown name).
        for (plan, remaining) in [("", "2"), ("gold", "1")] {
            let (status, headers, _) = send(&app, get_tiger(&[("x-plan", plan), KEY_1])).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(h(&headers, "x-ratelimit-resource"), "anonymous");
            assert_eq!(h(&headers, "x-ratelimit-remaining"), remaining);
        }
        let gold = [("x-plan", "gold")];
        assert_eq!(peek(&layer, [192, 0, 2, 7], &gold).await, ("anonymous".into(), 1));
        assert_eq!(peek(&layer, [192, 0, 2, 7], &[KEY_1]).await, ("key".into(), 5));
    }

    async fn an_unplaced_request_gets_the_configured_status_and_is_not_counted(store) {
        let layer = tiers(store).build().unwrap(); // 401 by default
        let app = app(layer.clone(), [192, 0, 2, 8]);
        let (status, headers, body) = send(&app, get_tiger(&[("x-plan", "gold")])).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(headers.get("x-ratelimit-remaining").is_none());
        assert_eq!(h(&headers, "content-type"), "application/json");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(json["message"].as_str().unwrap().contains("tier"), "{json}");
        let (mut parts, _) = get_tiger(&[("x-plan", "gold")]).into_parts();
        parts.extensions.insert(axum::extract::ConnectInfo(SocketAddr::from(([192, 0, 2, 8], 1))));
        assert!(matches!(layer.peek(&parts).await, Err(PeekError::Unplaced)));
        assert_eq!(peek(&layer, [192, 0, 2, 8], &[]).await, ("anonymous".into(), 3));

        let forbidden = tiers(super::memory())
            .unplaced(Unplaced::Status(StatusCode::FORBIDDEN))
            .build()
            .unwrap();
        let app = app_with_peer(&forbidden, [192, 0, 2, 8]);
        assert_eq!(send(&app, get_tiger(&[("x-plan", "")])).await.0, StatusCode::FORBIDDEN);
    }
}

/// [`app`], callable where a local `app` hides it.
fn app_with_peer(layer: &TieredLayer, peer: [u8; 4]) -> Router {
    app(layer.clone(), peer)
}

#[tokio::test]
async fn each_tier_keeps_its_own_window_and_reset() {
    let clock = ManualClock::new(T0);
    let layer = tiers(Arc::new(MemoryStore::with_clock(clock.clone())))
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 9]);
    let (_, anonymous, _) = send(&app, get_tiger(&[])).await;
    let (_, key, _) = send(&app, get_tiger(&[KEY_1])).await;
    assert_eq!(
        h(&anonymous, "x-ratelimit-reset"),
        (T0 / 1_000_000 + 60).to_string()
    );
    assert_eq!(
        h(&key, "x-ratelimit-reset"),
        (T0 / 1_000_000 + 3600).to_string()
    );
}

#[tokio::test]
async fn one_request_is_one_store_check_in_one_tier() {
    let store = Counting::new();
    let layer = tiers(Arc::new(store.clone())).build().unwrap();
    let app = app(layer, [192, 0, 2, 10]);
    for headers in [&[][..], &[KEY_1], &[ENT_1], &[("x-plan", "gold")]] {
        send(&app, get_tiger(headers)).await;
    }
    assert_eq!(store.checks(), 3, "the unplaced request reached no store");
}

#[tokio::test]
async fn on_redis_a_tiered_request_is_one_script_call() {
    let server = RedisServer::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(RedisStore::from_manager(conn).build().unwrap());
    let app = app(tiers(store).build().unwrap(), [192, 0, 2, 13]);
    let each_tier = [&[][..], &[KEY_1], &[ENT_1]];
    for headers in each_tier {
        send(&app, get_tiger(headers)).await; // loads the script
    }
    reset_stats(&server);
    for headers in each_tier {
        assert_eq!(send(&app, get_tiger(headers)).await.0, StatusCode::OK);
    }
    assert_eq!(evalsha_calls(&server), 3);
}

#[tokio::test]
async fn shadow_mode_and_deny_lists_are_each_tiers_own() {
    let layer = TieredLayer::builder()
        .tier(
            tier("anonymous", 1, 60)
                .key(PeerIp::new())
                .deny(|parts| parts.headers.contains_key("x-bad-bot")),
        )
        .tier(
            tier("key", 1, 60)
                .key(HeaderKey::new("x-api-key"))
                .shadow(true),
        )
        .choose(choose)
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 11]);
    send(&app, get_tiger(&[])).await;
    assert_eq!(
        send(&app, get_tiger(&[])).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        let (status, headers, _) = send(&app, get_tiger(&[KEY_1])).await;
        assert_eq!(status, StatusCode::OK, "the key tier is in shadow mode");
        assert_eq!(h(&headers, "x-ratelimit-resource"), "key");
    }
    // The anonymous tier's deny-list does not reach callers of the key tier.
    let (status, _, body) = send(&app, get_tiger(&[("x-bad-bot", "1")])).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("refused"), "{body}");
    let (status, _, _) = send(&app, get_tiger(&[("x-bad-bot", "1"), KEY_1])).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn each_tier_applies_its_own_failure_policy_when_redis_is_down() {
    let mut server = RedisServer::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(RedisStore::from_manager(conn).build().unwrap());
    server.stop();
    let layer = TieredLayer::builder()
        .tier(
            tier("anonymous", 2, 60)
                .key(PeerIp::new())
                .deadline(Duration::from_millis(100))
                .on_store_failure(FailurePolicy::closed(Duration::from_secs(2))),
        )
        .tier(
            tier("key", 2, 60)
                .key(HeaderKey::new("x-api-key"))
                .deadline(Duration::from_millis(100))
                .on_store_failure(FailurePolicy::local()),
        )
        .choose(choose)
        .shared_store(store)
        .build()
        .unwrap();
    let app = app(layer, [192, 0, 2, 12]);
    let (status, headers, _) = send(&app, get_tiger(&[])).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h(&headers, "retry-after"), "2");
    let (status, headers, _) = send(&app, get_tiger(&[KEY_1])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h(&headers, "x-ratelimit-fallback"), "local");
    assert_eq!(h(&headers, "x-ratelimit-resource"), "key");
    assert_eq!(h(&headers, "x-ratelimit-remaining"), "1");
}

#[test]
fn bad_tier_configurations_fail_to_build() {
    let why = |b: TieredLayerBuilder| b.build().unwrap_err().to_string();
    assert!(why(TieredLayer::builder().choose(|_| None)).contains("at least one tier"));
    assert!(why(TieredLayer::builder().tier(tier("a", 1, 60))).contains("chooser"));
    let twice = TieredLayer::builder()
        .tier(tier("a", 1, 60))
        .tier(tier("a", 2, 60))
        .choose(|_| None);
    assert!(why(twice).contains("\"a\""));
    let unknown = tiers(memory()).unplaced(Unplaced::tier("gold"));
    assert!(why(unknown).contains("gold"));
    let ok_status = tiers(memory()).unplaced(Unplaced::Status(StatusCode::OK));
    assert!(why(ok_status).contains("4xx or 5xx"));
    let bad_tier = tiers(memory()).tier(RateLimitLayer::builder());
    assert!(why(bad_tier).contains("tier 4"));
}

#[tokio::test]
async fn a_tiers_limiter_spends_and_resets_that_tier_alone() {
    let per_hour = |n| Quota::per_hour(std::num::NonZeroU32::new(n).unwrap());
    let layer = TieredLayer::builder()
        .tier(RateLimitLayer::builder().policy(Policy::fixed_window("free", per_hour(2))))
        .tier(RateLimitLayer::builder().policy(Policy::fixed_window("pro", per_hour(5))))
        .choose(|_| Some("free"))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let (free, pro) = (
        layer.limiter("free").unwrap(),
        layer.limiter("pro").unwrap(),
    );
    let caller = tollgate::Key::new("caller");
    assert_eq!(pro.check(&caller, 3).await.unwrap().remaining, 2);
    assert_eq!(
        free.peek(&caller).await.unwrap().remaining,
        2,
        "free untouched"
    );
    assert_eq!(free.check(&caller, 2).await.unwrap().remaining, 0);
    free.reset(&caller).await.unwrap();
    assert_eq!(free.peek(&caller).await.unwrap().remaining, 2);
    assert_eq!(
        pro.peek(&caller).await.unwrap().remaining,
        2,
        "pro kept its charge"
    );
    assert!(layer.limiter("gold").is_none());
}

/// Tiers of different strategies on one Redis: each tier admits exactly its
/// own budget through HTTP and counts only its callers, whatever the
/// strategy, and a caller switching tiers is counted once, in the new one.
#[tokio::test]
async fn tiers_of_every_strategy_count_only_their_own_callers_on_redis() {
    let three = std::num::NonZeroU32::new(3).unwrap();
    let candidates = [
        Policy::sliding_window("window", quota(3, 60)),
        Policy::sliding_log("log", quota(100, 60), quota(3, 60)),
        Policy::gcra("gcra", quota(3, 60), three),
        Policy::uniform_gate("gate", Duration::from_secs(60)).unwrap(),
    ];
    // (The concurrency limit frees a slot as each response ends: sequential
    // requests never meet its limit; `tests/concurrency.rs` runs it in flight.)
    for policy in candidates {
        let name = policy.name().to_owned();
        let budget = if name == "gate" { 1 } else { 3 };
        // The chooser hands back a name that lives as long as the layer.
        let keyed_tier: &'static str = Box::leak(name.clone().into_boxed_str());
        let layer = TieredLayer::builder()
            .tier(tier("anonymous", 2, 60).key(PeerIp::new()))
            .tier(
                RateLimitLayer::builder()
                    .policy(policy)
                    .key(HeaderKey::new("x-api-key")),
            )
            .choose(move |parts: &Parts| {
                Some(if parts.headers.contains_key("x-api-key") {
                    keyed_tier
                } else {
                    "anonymous"
                })
            })
            .shared_store(redis(&format!("tier-{name}")).await)
            .build()
            .unwrap();
        let app = app(layer.clone(), [10, 0, 0, 9]);
        let keyed = [("x-api-key", "sk-1")];
        let mut passed = 0;
        for _ in 0..budget + 2 {
            let (status, headers, _) = send(&app, get_tiger(&keyed)).await;
            assert_eq!(h(&headers, "x-ratelimit-resource"), name, "{name}");
            passed += u32::from(status == StatusCode::OK);
        }
        assert_eq!(passed, budget, "{name}: the tier's own budget");
        let (tier_name, left) = peek(&layer, [10, 0, 0, 9], &[]).await;
        assert_eq!(
            (tier_name.as_str(), left),
            ("anonymous", 2),
            "{name}: anonymous untouched"
        );
        let (status, headers, _) = send(&app, get_tiger(&[])).await;
        assert_eq!(status, StatusCode::OK, "{name}");
        assert_eq!(
            h(&headers, "x-ratelimit-remaining"),
            "1",
            "{name}: counted once, anonymously"
        );
    }
}
