//! Limits operators change at runtime, through the `RateLimiter` handle and
//! the layer: per-caller overrides, the penalty box and limits that come
//! with the request, across two app servers on one Redis.

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use support::conformance::T0;
use support::redis::{evalsha_calls, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::layer::LocalCache;
use tollgate::{
    AdminError, ConfigError, Key, MemoryStore, Override, PenaltyBox, Policy, Quota, RateLimitLayer,
    RateLimiter, RedisStore,
};
use tower::ServiceExt;

fn n(x: u32) -> NonZeroU32 {
    NonZeroU32::new(x).unwrap()
}

fn per_minute(x: u32) -> Quota {
    Quota::per_minute(n(x))
}

/// A store on `server` under `prefix`, on `clock`: one app server's.
async fn app_server(server: &RedisServer, prefix: &str, clock: &ManualClock) -> RedisStore {
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    RedisStore::from_manager(conn)
        .prefix(prefix)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The caller as `Key::new` of its `X-Api-Key`, so the handle names it as
/// the layer does.
fn api_key(parts: &axum::http::request::Parts) -> Result<Key, tollgate::KeyError> {
    let key = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok());
    key.map(Key::new)
        .ok_or(tollgate::KeyError::Missing("X-Api-Key"))
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn get_as(app: &Router, who: &str, plan: Option<&str>) -> axum::response::Response {
    let mut request = Request::get("/").header("x-api-key", who);
    if let Some(plan) = plan {
        request = request.header("x-plan", plan);
    }
    app.clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn header(response: &axum::response::Response, name: &str) -> String {
    response.headers()[name].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_override_set_through_one_server_applies_on_the_other_at_its_next_decision() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = Policy::fixed_window("api", per_minute(2)).overridable();
    let a = RateLimiter::new(policy.clone(), app_server(&redis, "rt", &clock).await).unwrap();
    let b = RateLimiter::new(policy, app_server(&redis, "rt", &clock).await).unwrap();
    let acme = Key::new("acme");

    assert!(a.check(&acme, 2).await.unwrap().allowed);
    assert!(!b.check(&acme, 1).await.unwrap().allowed);
    a.set_override(&acme, Override::new(per_minute(5)))
        .await
        .unwrap();
    let next = b.check(&acme, 1).await.unwrap();
    assert!(next.allowed, "{next:?}");
    assert_eq!(
        (next.limit, next.remaining),
        (5, 2),
        "the same window, judged by 5"
    );
    assert_eq!(
        b.get_override(&acme).await.unwrap(),
        Some(Override::new(per_minute(5)))
    );
    assert_eq!(
        b.list_overrides().await.unwrap(),
        vec![(acme.clone(), Override::new(per_minute(5)))]
    );
    assert!(b.peek(&acme).await.unwrap().limit == 5, "peeks show it");

    assert!(b.clear_override(&acme).await.unwrap());
    let back = a.check(&acme, 1).await.unwrap();
    assert!(!back.allowed);
    assert_eq!(back.limit, 2);
    assert!(a.list_overrides().await.unwrap().is_empty());
    assert!(
        !a.clear_override(&acme).await.unwrap(),
        "nothing left to clear"
    );
}

#[tokio::test]
async fn a_block_started_by_one_server_is_refused_by_both_and_cached_until_it_ends() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let one_strike = PenaltyBox::new(n(1), Duration::from_secs(60), Duration::from_secs(300))
        .unwrap()
        .doubling_up_to(Duration::from_secs(3600))
        .unwrap();
    let policy = Policy::fixed_window("login", per_minute(1)).with_penalty_box(one_strike);
    let layer = |store| {
        RateLimitLayer::builder()
            .policy(policy.clone())
            .key(api_key)
            .store(store)
            .local_cache(LocalCache::new(100).clock(clock.clone()))
            .build()
            .unwrap()
    };
    let a = app(layer(app_server(&redis, "pb", &clock).await));
    let b_layer = layer(app_server(&redis, "pb", &clock).await);
    let b_limiter = b_layer.limiter();
    let b = app(b_layer);

    assert_eq!(get_as(&a, "eve", None).await.status(), StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    // Rejected, and that strike is the last one allowed: a block starts.
    let struck = get_as(&a, "eve", None).await;
    assert_eq!(struck.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&struck, "retry-after"), "300");
    let block_end = (T0 + 301_000_000).div_ceil(1_000_000);
    assert_eq!(header(&struck, "x-ratelimit-reset"), block_end.to_string());

    // The other server asks Redis once, then repeats the block locally.
    clock.advance(Duration::from_secs(100));
    let calls = evalsha_calls(&redis);
    let refused = get_as(&b, "eve", None).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "retry-after"), "200");
    assert_eq!(header(&refused, "x-ratelimit-reset"), block_end.to_string());
    assert_eq!(evalsha_calls(&redis), calls + 1);
    let again = get_as(&b, "eve", None).await;
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        evalsha_calls(&redis),
        calls + 1,
        "the block from the local cache"
    );

    // An operator's reset on one server lets the caller out on that one.
    b_limiter.reset(&Key::new("eve")).await.unwrap();
    assert_eq!(get_as(&b, "eve", None).await.status(), StatusCode::OK);

    // A block by hand on one server is refused by the other.
    b_limiter
        .block(&Key::new("mallory"), Duration::from_secs(60))
        .await
        .unwrap();
    let blocked = get_as(&a, "mallory", None).await;
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&blocked, "retry-after"), "60");
}

#[tokio::test]
async fn the_local_cache_lets_a_caller_through_after_its_limit_was_raised() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = Policy::fixed_window("api", per_minute(1)).overridable();
    let cached = |store| {
        RateLimitLayer::builder()
            .policy(policy.clone())
            .key(api_key)
            .store(store)
            .local_cache(LocalCache::new(100).clock(clock.clone()))
            .build()
            .unwrap()
    };
    let here_layer = cached(app_server(&redis, "lc", &clock).await);
    let here_limiter = here_layer.limiter();
    let here = app(here_layer);
    let elsewhere =
        RateLimiter::new(policy.clone(), app_server(&redis, "lc", &clock).await).unwrap();

    // Raised on this server: its cache forgets the caller at once.
    assert_eq!(get_as(&here, "ann", None).await.status(), StatusCode::OK);
    assert_eq!(
        get_as(&here, "ann", None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    here_limiter
        .set_override(&Key::new("ann"), Override::new(per_minute(3)))
        .await
        .unwrap();
    let through = get_as(&here, "ann", None).await;
    assert_eq!(through.status(), StatusCode::OK);
    assert_eq!(header(&through, "x-ratelimit-limit"), "3");

    // Raised on another server: this cache keeps the rejection at most a
    // second (Envoy ratelimit #1077 kept it until the window's end).
    assert_eq!(get_as(&here, "bob", None).await.status(), StatusCode::OK);
    assert_eq!(
        get_as(&here, "bob", None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let calls = evalsha_calls(&redis);
    assert_eq!(
        get_as(&here, "bob", None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(evalsha_calls(&redis), calls, "from the cache");
    elsewhere
        .set_override(&Key::new("bob"), Override::new(per_minute(3)))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(1));
    let through = get_as(&here, "bob", None).await;
    assert_eq!(through.status(), StatusCode::OK);
    assert_eq!(header(&through, "x-ratelimit-limit"), "3");
}

#[tokio::test]
async fn bad_overrides_and_blocks_are_refused_and_nothing_is_stored() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = app_server(&redis, "bad", &clock).await;
    let fixed = RateLimiter::new(
        Policy::fixed_window("api", per_minute(5)).overridable(),
        store.clone(),
    )
    .unwrap();
    let plain =
        RateLimiter::new(Policy::fixed_window("plain", per_minute(5)), store.clone()).unwrap();
    let gate = RateLimiter::new(
        Policy::uniform_gate("gate", Duration::from_secs(10))
            .unwrap()
            .overridable(),
        store.clone(),
    )
    .unwrap();
    let gcra = RateLimiter::new(
        Policy::gcra("gcra", per_minute(5), n(5)).overridable(),
        store.clone(),
    )
    .unwrap();
    let who = Key::new("who");

    assert_eq!(
        Quota::new(0, Duration::from_secs(60)),
        Err(ConfigError::LimitZero)
    );
    let too_many = Override::new(per_minute(5)).and(per_minute(50));
    let too_fast = Override::new(Quota::new(u32::MAX, Duration::from_millis(1)).unwrap());
    let two_per_span = Override::new(Quota::new(2, Duration::from_secs(10)).unwrap());
    for (limiter, bad) in [
        (&plain, Override::new(per_minute(50))),
        (&fixed, too_many),
        (&gate, two_per_span),
        (&gcra, too_fast),
    ] {
        let err = limiter.set_override(&who, bad).await.unwrap_err();
        assert!(
            matches!(err, AdminError::Invalid(ConfigError::Override { .. })),
            "{err}"
        );
        assert!(!err.to_string().is_empty());
    }
    for limiter in [&fixed, &gate, &gcra] {
        assert_eq!(limiter.get_override(&who).await.unwrap(), None);
        assert!(limiter.list_overrides().await.unwrap().is_empty());
    }
    let err = fixed
        .block(&who, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AdminError::Invalid(ConfigError::PenaltyBox { .. })),
        "{err}"
    );
    let boxed = RateLimiter::new(
        Policy::fixed_window("boxed", per_minute(5)).with_penalty_box(
            PenaltyBox::new(n(1), Duration::from_secs(1), Duration::from_secs(1)).unwrap(),
        ),
        store,
    )
    .unwrap();
    let err = boxed.block(&who, Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(err, AdminError::Invalid(ConfigError::PenaltyBox { .. })),
        "{err}"
    );
    assert!(
        boxed.check(&who, 1).await.unwrap().allowed,
        "no block stored"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("bad:*")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(keys.len(), 1, "only the one check's counter: {keys:?}");

    // A store that keeps no overrides says so.
    use support::counters_only::CountersOnly as Plain;
    let yours = RateLimiter::new(
        Policy::fixed_window("api", per_minute(5)).overridable(),
        Plain(MemoryStore::new()),
    )
    .unwrap();
    let err = yours
        .set_override(&who, Override::new(per_minute(50)))
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::Store(_)), "{err}");
    assert!(err.to_string().contains("cannot keep overrides"), "{err}");
}

#[tokio::test]
async fn a_limit_from_the_request_judges_the_caller_and_an_override_beats_it() {
    for store in [
        None,
        Some(app_server(&RedisServer::start(), "plan", &ManualClock::new(T0)).await),
    ] {
        let builder = RateLimitLayer::builder()
            .policy(Policy::fixed_window("api", per_minute(2)).overridable())
            .key(api_key)
            .limit_from_request(1..=10, |parts| {
                parts.headers.get("x-plan")?.to_str().ok()?.parse().ok()
            });
        let layer = match store {
            Some(store) => builder.store(store),
            None => builder.store(MemoryStore::new()),
        }
        .build()
        .unwrap();
        let limiter = layer.limiter();
        let app = app(layer);

        let plan = get_as(&app, "ann", Some("3")).await;
        assert_eq!(header(&plan, "x-ratelimit-limit"), "3");
        assert_eq!(header(&plan, "x-ratelimit-remaining"), "2");
        // One state whatever limit judges it; out of bounds is clamped.
        let clamped = get_as(&app, "ann", Some("1000")).await;
        assert_eq!(header(&clamped, "x-ratelimit-limit"), "10");
        assert_eq!(header(&clamped, "x-ratelimit-remaining"), "8");
        let none = get_as(&app, "ann", None).await;
        assert_eq!(
            none.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "the policy's 2"
        );
        assert_eq!(header(&none, "x-ratelimit-limit"), "2");
        // A stored override beats what the request brings.
        limiter
            .set_override(&Key::new("ann"), Override::new(per_minute(50)))
            .await
            .unwrap();
        let over = get_as(&app, "ann", Some("3")).await;
        assert_eq!(over.status(), StatusCode::OK);
        assert_eq!(header(&over, "x-ratelimit-limit"), "50");
        assert_eq!(header(&over, "x-ratelimit-remaining"), "47");
    }
    for (min, max) in [(0, 5), (6, 5)] {
        let err = RateLimitLayer::builder()
            .policy(Policy::fixed_window("api", per_minute(2)))
            .limit_from_request(min..=max, |_| None)
            .build()
            .unwrap_err();
        assert!(matches!(err, ConfigError::RequestLimits { .. }), "{err}");
    }
    let err = RateLimitLayer::builder()
        .policy(Policy::uniform_gate("gate", Duration::from_secs(1)).unwrap())
        .limit_from_request(1..=2, |_| None)
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::UniformGateLimit { .. }), "{err}");
}

/// Issue 39's sequence through the layer, on the memory store and on Redis:
/// 3 per minute, and 3 rejections within a minute block for 5 s. The
/// rejection that starts the block, and those during it, name the moment a
/// request would pass (the window's end, 55 s after the block's), in
/// `Retry-After` and in `X-RateLimit-Reset`, which never moves back; their
/// message is GitHub's secondary rate limit's; Limit, Used and Remaining
/// agree. A client that waits `Retry-After` is admitted.
#[tokio::test]
async fn a_blocked_client_that_waits_retry_after_is_admitted() {
    let redis = RedisServer::start();
    for on_redis in [false, true] {
        let clock = ManualClock::new(T0);
        let penalty =
            PenaltyBox::new(n(3), Duration::from_secs(60), Duration::from_secs(5)).unwrap();
        let builder = RateLimitLayer::builder()
            .policy(Policy::fixed_window("penalty", per_minute(3)).with_penalty_box(penalty))
            .key(api_key);
        let layer = match on_redis {
            true => builder.store(app_server(&redis, "honest", &clock).await),
            false => builder.store(MemoryStore::with_clock(clock.clone())),
        };
        let app = app(layer.build().unwrap());
        let store = if on_redis { "redis" } else { "memory" };
        let window_end = (T0 + 60_000_000).div_ceil(1_000_000).to_string();

        for _ in 0..3 {
            let pass = get_as(&app, "joe", None).await;
            assert_eq!(pass.status(), StatusCode::OK, "{store}");
            assert_eq!(header(&pass, "x-ratelimit-reset"), window_end, "{store}");
        }
        for strike in 1..=3 {
            clock.advance(Duration::from_secs(1));
            let refused = get_as(&app, "joe", None).await;
            assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "{store}");
            let wait = (60 - strike).to_string();
            assert_eq!(
                header(&refused, "retry-after"),
                wait,
                "{store}: strike {strike}"
            );
            assert_eq!(
                header(&refused, "x-ratelimit-reset"),
                window_end,
                "{store}: strike {strike}"
            );
            assert_eq!(header(&refused, "x-ratelimit-remaining"), "0", "{store}");
            let body = axum::body::to_bytes(refused.into_body(), 4096)
                .await
                .unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let message = body["message"].as_str().unwrap();
            assert_eq!(
                message.contains("secondary rate limit"),
                strike == 3,
                "{store}: strike {strike}: {message}"
            );
        }
        // During the block: the same moment, and the three numbers agree.
        clock.advance(Duration::from_secs(2));
        let blocked = get_as(&app, "joe", None).await;
        assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS, "{store}");
        assert_eq!(header(&blocked, "retry-after"), "55", "{store}");
        assert_eq!(header(&blocked, "x-ratelimit-reset"), window_end, "{store}");
        let numbers =
            ["limit", "used", "remaining"].map(|h| header(&blocked, &format!("x-ratelimit-{h}")));
        assert_eq!(numbers, ["3", "3", "0"].map(String::from), "{store}");

        // The client waits what it was told, and is admitted.
        clock.advance(Duration::from_secs(55));
        let back = get_as(&app, "joe", None).await;
        assert_eq!(back.status(), StatusCode::OK, "{store}: after Retry-After");
    }
}

/// Issue 39: an override set under `Key::new("acme")` never met a request
/// keyed by `HeaderKey` (its key is `x-api-key:<hash>`). `key_of` names a
/// caller as each extractor sees it, and the request honours what was set
/// through it.
#[tokio::test]
async fn an_override_set_for_a_caller_named_by_key_of_is_honoured_by_its_requests() {
    use axum::extract::ConnectInfo;
    use std::net::SocketAddr;
    use tollgate::key::{Caller, RouteKey};
    use tollgate::{ForwardedIp, HeaderKey, KeyExtractor, PeerIp};

    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let tenant = |parts: &axum::http::request::Parts| {
        let tenant = parts.headers.get("x-tenant").and_then(|v| v.to_str().ok());
        tenant
            .map(|t| Key::new(format!("tenant:{t}")))
            .ok_or(tollgate::KeyError::Missing("x-tenant"))
    };
    // (what it is, the extractor, the caller as an operator names it, the
    // peer and headers of one of its requests)
    type Row<'a> = (
        &'a str,
        Arc<dyn KeyExtractor>,
        Caller,
        &'a str,
        Vec<(&'a str, &'a str)>,
    );
    let rows: Vec<Row> = vec![
        (
            "a token header",
            Arc::new(HeaderKey::new("x-api-key")),
            Caller::new().header("x-api-key", "acme-secret").unwrap(),
            "192.0.2.1",
            vec![("x-api-key", "acme-secret")],
        ),
        (
            "a peer's IPv6 address, grouped by /64",
            Arc::new(PeerIp::new()),
            Caller::new().ip(ip("2001:db8:1:2::7")),
            "2001:db8:1:2::99",
            vec![],
        ),
        (
            "the client behind a trusted proxy",
            Arc::new(ForwardedIp::trusting(["10.0.0.0/8"]).unwrap()),
            Caller::new().ip(ip("203.0.113.9")),
            "10.1.2.3",
            vec![("x-forwarded-for", "203.0.113.9, 10.9.9.9")],
        ),
        (
            "a route and the peer",
            Arc::new(RouteKey.and(PeerIp::new())),
            Caller::new().route("/search").ip(ip("192.0.2.7")),
            "192.0.2.7",
            vec![],
        ),
        (
            "a closure",
            Arc::new(tenant),
            Caller::new().header("x-tenant", "acme").unwrap(),
            "192.0.2.8",
            vec![("x-tenant", "acme")],
        ),
    ];
    for (what, extractor, caller, peer, headers) in rows {
        let layer = RateLimitLayer::builder()
            .policy(Policy::fixed_window("api", per_minute(1)).overridable())
            .key(extractor)
            .store(MemoryStore::new())
            .build()
            .unwrap();
        let limiter = layer.limiter();
        let key = limiter.key_of(&caller).unwrap();
        assert_eq!(layer.key_of(&caller).unwrap(), key, "{what}");
        limiter
            .set_override(&key, Override::new(per_minute(5)))
            .await
            .unwrap();
        let app = Router::new()
            .route("/search", get(|| async { "ok" }))
            .route_layer(layer);
        let mut request = Request::get("/search");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let mut request = request.body(Body::empty()).unwrap();
        let peer = SocketAddr::new(peer.parse().unwrap(), 4000);
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{what}");
        assert_eq!(
            header(&response, "x-ratelimit-limit"),
            "5",
            "{what}: the override"
        );
        assert_eq!(header(&response, "x-ratelimit-remaining"), "4", "{what}");
    }
}

/// Issue 41: a limit for every caller of a policy, set through one app
/// server, is in force there at once and on another server on one Redis
/// at its next read of the limits (every half second): within a second.
/// Clearing it goes back to the quotas the policy was built with; the cap
/// beats a caller's override. Headers and peeks show the limit in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_limit_set_through_one_server_reaches_the_other_within_a_second() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = Policy::fixed_window("search", per_minute(100))
        .overridable()
        .adjustable();
    let layer = |store| {
        RateLimitLayer::builder()
            .policy(policy.clone())
            .key(api_key)
            .store(store)
            .build()
            .unwrap()
    };
    let a_layer = layer(app_server(&redis, "pl", &clock).await);
    let b_layer = layer(app_server(&redis, "pl", &clock).await);
    let (a, b) = (a_layer.limiter(), b_layer.limiter());
    let (a_app, b_app) = (app(a_layer), app(b_layer));
    // Both read the limits once before the change.
    assert_eq!(
        header(&get_as(&b_app, "ann", None).await, "x-ratelimit-limit"),
        "100"
    );

    a.set_policy_limit(Override::new(per_minute(10)))
        .await
        .unwrap();
    let set_at = std::time::Instant::now();
    assert_eq!(
        header(&get_as(&a_app, "ann", None).await, "x-ratelimit-limit"),
        "10",
        "at once on the server that set it"
    );
    let seen = loop {
        let limit = header(&get_as(&b_app, "bob", None).await, "x-ratelimit-limit");
        if limit == "10" || set_at.elapsed() > Duration::from_secs(5) {
            break set_at.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        seen < Duration::from_millis(1_500),
        "the other server saw it after {seen:?}"
    );
    assert_eq!(
        b.peek(&Key::new("ann")).await.unwrap().limit,
        10,
        "peeks show it"
    );
    assert_eq!(
        b.policy_limits().await.unwrap().limit,
        Some(Override::new(per_minute(10)))
    );

    // A cap over an override: the override above it is set aside.
    a.set_override(&Key::new("vip"), Override::new(per_minute(1_000)))
        .await
        .unwrap();
    assert_eq!(
        header(&get_as(&a_app, "vip", None).await, "x-ratelimit-limit"),
        "1000"
    );
    a.set_policy_cap(Override::new(per_minute(5)))
        .await
        .unwrap();
    assert_eq!(
        header(&get_as(&a_app, "vip", None).await, "x-ratelimit-limit"),
        "5"
    );

    assert!(a.clear_policy_cap().await.unwrap());
    assert!(a.clear_policy_limit().await.unwrap());
    assert!(
        !a.clear_policy_limit().await.unwrap(),
        "nothing left to clear"
    );
    assert_eq!(
        header(&get_as(&a_app, "ann", None).await, "x-ratelimit-limit"),
        "100"
    );
    assert_eq!(
        a.policy_limits().await.unwrap(),
        tollgate::PolicyLimits::default()
    );
}

/// Issue 41: while Redis cannot be reached, a server keeps judging by the
/// last runtime limits it read (its local fallback too).
#[tokio::test]
async fn during_an_outage_a_server_keeps_the_last_limits_it_knew() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let policy = Policy::fixed_window("search", per_minute(100)).adjustable();
    let layer = RateLimitLayer::builder()
        .policy(policy.clone())
        .key(api_key)
        .store(app_server(&redis, "out", &clock).await)
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let app = app(layer);
    limiter
        .set_policy_limit(Override::new(per_minute(7)))
        .await
        .unwrap();
    assert_eq!(
        header(&get_as(&app, "ann", None).await, "x-ratelimit-limit"),
        "7"
    );
    redis.stop();
    // Past a read of the limits that fails, on a paused clock.
    tokio::time::pause();
    tokio::time::sleep(Duration::from_millis(700)).await;
    tokio::time::resume();
    let during = get_as(&app, "ann", None).await;
    assert_eq!(during.status(), StatusCode::OK);
    assert_eq!(header(&during, "x-ratelimit-fallback"), "local");
    assert_eq!(
        header(&during, "x-ratelimit-limit"),
        "7",
        "the last limit known"
    );
}

/// Issue 41's precedence with a limit that came with the request: it beats
/// the policy's runtime limit, and the cap beats it.
#[tokio::test]
async fn a_limit_from_the_request_beats_the_policy_limit_and_the_cap_beats_it() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("api", per_minute(100)).adjustable())
        .key(api_key)
        .limit_from_request(1..=1_000, |parts| {
            parts.headers.get("x-plan")?.to_str().ok()?.parse().ok()
        })
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let app = app(layer);
    limiter
        .set_policy_limit(Override::new(per_minute(10)))
        .await
        .unwrap();
    let limit = |r: axum::response::Response| header(&r, "x-ratelimit-limit");
    assert_eq!(
        limit(get_as(&app, "ann", None).await),
        "10",
        "the runtime limit"
    );
    assert_eq!(
        limit(get_as(&app, "ann", Some("500")).await),
        "500",
        "the request's beats it"
    );
    limiter
        .set_policy_cap(Override::new(per_minute(50)))
        .await
        .unwrap();
    assert_eq!(
        limit(get_as(&app, "ann", Some("500")).await),
        "50",
        "the cap beats the request's"
    );
    assert_eq!(
        limit(get_as(&app, "ann", None).await),
        "10",
        "under the cap, the runtime limit"
    );
    limiter
        .set_policy_limit(Override::new(per_minute(80)))
        .await
        .unwrap();
    assert_eq!(
        limit(get_as(&app, "ann", None).await),
        "50",
        "the cap beats the runtime limit"
    );
    limiter.clear_policy_cap().await.unwrap();
    limiter.clear_policy_limit().await.unwrap();
    assert_eq!(
        limit(get_as(&app, "ann", None).await),
        "100",
        "the quotas it was built with"
    );
}

/// Issue 44's sequence through the layer: GCRA as built 5 per 10 s, judged
/// at 100 per 10 s (by a runtime limit, or by a limit the request brings),
/// one caller sending a request the handler answers `304` (refunded) then
/// three it answers `200`, over and over at one instant. The full bucket
/// holds 100: at most 100 charged passes, whatever the refunds. A `304`
/// refunded with the policy as built gave back 2 s of the bucket (20 units
/// at the limit in force) for the 0.1 s it charged: no request was ever
/// refused. On the memory store and on Redis.
#[tokio::test]
async fn a_304_under_a_raised_limit_gives_back_what_it_charged_through_the_layer() {
    let redis = RedisServer::start();
    for (source, on_redis) in [
        ("runtime", false),
        ("runtime", true),
        ("request", false),
        ("request", true),
    ] {
        let clock = ManualClock::new(T0);
        let builder = RateLimitLayer::builder()
            .policy(
                Policy::gcra(
                    "gcra",
                    Quota::new(5, Duration::from_secs(10)).unwrap(),
                    n(5),
                )
                .adjustable(),
            )
            .key(api_key)
            .limit_from_request(1..=1_000, |parts| {
                parts.headers.get("x-plan")?.to_str().ok()?.parse().ok()
            });
        let builder = match on_redis {
            true => builder.store(app_server(&redis, &format!("{source}-304"), &clock).await),
            false => builder.store(MemoryStore::with_clock(clock.clone())),
        };
        let layer = builder.build().unwrap();
        let limiter = layer.limiter();
        if source == "runtime" {
            let per_10s = Quota::new(100, Duration::from_secs(10)).unwrap();
            limiter
                .set_policy_limit(Override::new(per_10s))
                .await
                .unwrap();
        }
        let app = Router::new()
            .route(
                "/",
                get(|headers: axum::http::HeaderMap| async move {
                    match headers.contains_key("if-none-match") {
                        true => StatusCode::NOT_MODIFIED,
                        false => StatusCode::OK,
                    }
                }),
            )
            .layer(layer);
        let (mut charged, mut refunded, mut refused) = (0, 0, 0);
        for i in 0..400 {
            let mut request = Request::get("/").header("x-api-key", "ann");
            if source == "request" {
                request = request.header("x-plan", "100");
            }
            if i % 4 == 0 {
                request = request.header("if-none-match", "\"v1\"");
            }
            let response = app
                .clone()
                .oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap();
            match response.status() {
                StatusCode::OK => charged += 1,
                StatusCode::NOT_MODIFIED => refunded += 1,
                _ => refused += 1,
            }
        }
        assert_eq!(
            charged, 100,
            "{source} limit on {}: a full bucket of 100 at one instant ({refunded} refunded, {refused} refused)",
            if on_redis { "Redis" } else { "memory" }
        );
        assert!(refused > 0);
    }
}
