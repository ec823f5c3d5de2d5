//! High-volume mode: throttling with active-caller filters shared through
//! Redis, and the local cache of rejections. Every test that shares the
//! binary's Redis keeps to its own prefix; those that count commands or stop
//! Redis start their own.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use support::redis::{evalsha_calls, shared_url, unique_prefix, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::layer::LocalCache;
use tollgate::throttle::Throttle;
use tollgate::{HeaderKey, Key, MemoryStore, Policy, Quota, RateLimitLayer, RedisStore};
use tower::ServiceExt;

const MINUTE: Duration = Duration::from_secs(60);
/// A Monday, 00:00 UTC, in µs: slot boundaries fall on whole minutes.
const T0: u64 = 1_795_000_000 * 1_000_000 - (1_795_000_000 % 60) * 1_000_000;

async fn store_on(url: &str, prefix: &str) -> RedisStore {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_manager_with_config(
            redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(300)))
                .set_response_timeout(Some(Duration::from_millis(300)))
                .set_number_of_retries(0),
        )
        .await
        .unwrap();
    RedisStore::from_manager(conn)
        .prefix(prefix)
        .build()
        .unwrap()
}

/// One simulated app server's throttle.
async fn server(url: &str, prefix: &str, clock: &ManualClock, threshold: u64) -> Throttle {
    Throttle::builder("sessions")
        .threshold(threshold)
        .capacity(10_000)
        .clock(clock.clone())
        .redis(&store_on(url, prefix).await)
        .build()
        .unwrap()
}

fn callers(range: std::ops::Range<usize>) -> Vec<Key> {
    range.map(|i| Key::new(format!("caller-{i}"))).collect()
}

#[tokio::test]
async fn a_caller_seen_on_server_a_is_recognised_on_server_b_after_one_sync() {
    let (url, prefix) = (shared_url(), unique_prefix("ab"));
    let clock = ManualClock::new(T0);
    let a = server(&url, &prefix, &clock, 1000).await;
    let b = server(&url, &prefix, &clock, 1000).await;
    let alice = Key::new("alice");

    assert!(a.admit(&alice));
    assert!(!b.is_known(&alice));
    a.sync_once().await.unwrap();
    b.sync_once().await.unwrap();
    assert!(b.is_known(&alice));
    assert_eq!(b.active_callers(), 1);
}

/// Five servers, each with its own 300 callers and 100 shared ones.
async fn five_busy_servers(prefix: &str, clock: &ManualClock) -> (Vec<Throttle>, Vec<Key>) {
    let url = shared_url();
    let mut servers = Vec::new();
    for i in 0..5 {
        let s = server(&url, prefix, clock, 5_000).await;
        for k in callers(i * 300..(i + 1) * 300)
            .iter()
            .chain(&callers(5000..5100))
        {
            assert!(s.admit(k));
        }
        servers.push(s);
    }
    (servers, [callers(0..1500), callers(5000..5100)].concat())
}

fn all_know(servers: &[Throttle], keys: &[Key]) -> bool {
    servers.iter().all(|s| keys.iter().all(|k| s.is_known(k)))
}

#[tokio::test]
async fn several_servers_converge_on_the_same_active_set_within_a_few_sync_rounds() {
    // Each server's task starts at its own phase within the second, so
    // their rounds interleave rather than collide: here, one after another.
    let clock = ManualClock::new(T0);
    let (servers, everyone) = five_busy_servers(&unique_prefix("converge"), &clock).await;
    for s in &servers {
        s.sync_once().await.unwrap();
    }
    assert!(
        !all_know(&servers, &everyone),
        "the first servers lack the later ones' callers"
    );
    let mut estimates = Vec::new();
    for s in &servers {
        estimates.push(s.sync_once().await.unwrap().active_callers);
    }
    assert!(all_know(&servers, &everyone), "converged in two rounds");
    for e in &estimates {
        assert!(e.abs_diff(1600) < 40, "estimates {estimates:?}");
    }
    assert!(estimates.windows(2).all(|w| w[0] == w[1]), "{estimates:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_in_lockstep_give_up_on_conflict_and_still_converge() {
    // The worst case: every round of every server at the same instant. Each
    // round one write wins and the others give up (one script call each, no
    // retry), absorbing the winner's bits; so N servers need at most N + 1.
    let clock = ManualClock::new(T0);
    let (servers, everyone) = five_busy_servers(&unique_prefix("lockstep"), &clock).await;
    let mut rounds = 0;
    let mut conflicts = 0;
    while !all_know(&servers, &everyone) {
        rounds += 1;
        assert!(
            rounds <= servers.len() + 1,
            "not converged after {rounds} rounds"
        );
        for report in all_at_once(&servers).await {
            assert!(report.redis_calls <= 3, "{report:?}: a retry?");
            conflicts += report.conflicts;
        }
    }
    println!("lockstep: converged in {rounds} rounds with {conflicts} conflicts");
    // Had the scheduler run the rounds one after another instead, they
    // would not collide, and two rounds would do.
    assert!(conflicts > 0 || rounds <= 2, "{rounds} rounds, no conflict");
}

async fn all_at_once(servers: &[Throttle]) -> Vec<tollgate::throttle::SyncReport> {
    let handles: Vec<_> = servers
        .iter()
        .map(|s| {
            let s = s.clone();
            tokio::spawn(async move { s.sync_once().await.unwrap() })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[test]
fn the_merge_script_writes_only_over_the_version_it_was_given() {
    let mut conn = redis::Client::open(shared_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let key = format!("{}:{{~throttle|t}}:m:1", unique_prefix("script"));
    let script = redis::Script::new(include_str!("../lua/bloom_merge.lua"));
    let merge = |conn: &mut redis::Connection, expected: i64, bits: &[u8]| -> redis::Value {
        script
            .key(&key)
            .arg(expected)
            .arg(bits)
            .arg(60_000)
            .invoke(conn)
            .unwrap()
    };
    use redis::Value::{Array, BulkString, Int};

    assert_eq!(
        merge(&mut conn, -1, b""),
        Array(vec![Int(0), Int(-1)]),
        "nothing yet"
    );
    assert_eq!(
        merge(&mut conn, -1, b"A"),
        Array(vec![Int(1), Int(1)]),
        "first write"
    );
    // Another server merged version -1 too and writes late: refused, and
    // told what is stored so it can merge it.
    assert_eq!(
        merge(&mut conn, -1, b"B"),
        Array(vec![Int(-1), Int(1), BulkString(b"A".to_vec())])
    );
    assert_eq!(
        merge(&mut conn, 1, b""),
        Array(vec![Int(0), Int(1)]),
        "no news"
    );
    assert_eq!(merge(&mut conn, 1, b"AB"), Array(vec![Int(1), Int(2)]));
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
    assert!(
        ttl > 0 && ttl <= 60_000,
        "every write sets an expiry: {ttl}"
    );
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    assert_eq!(
        merge(&mut conn, 2, b"AB"),
        Array(vec![Int(-1), Int(-1)]),
        "gone: not written"
    );
}

#[tokio::test]
async fn a_server_started_late_learns_the_sessions_of_the_whole_window() {
    let (url, prefix) = (shared_url(), unique_prefix("late"));
    let clock = ManualClock::new(T0);
    let a = server(&url, &prefix, &clock, 1000).await;
    a.admit(&Key::new("early"));
    a.sync_once().await.unwrap();
    clock.advance(10 * MINUTE);
    a.sync_once().await.unwrap();

    let late = server(&url, &prefix, &clock, 1000).await;
    late.sync_once().await.unwrap();
    assert!(late.is_known(&Key::new("early")));
}

#[tokio::test]
async fn rotation_forgets_a_caller_after_thirty_minutes() {
    let clock = ManualClock::new(T0);
    let throttle = Throttle::builder("sessions")
        .threshold(0) // always throttling once anyone is active
        .capacity(1000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (alice, bob) = (Key::new("alice"), Key::new("bob"));
    assert!(throttle.admit(&alice));
    assert!(throttle.admit(&bob));
    throttle.sync_once().await.unwrap();
    assert!(throttle.is_throttling());

    // Bob keeps his session alive; Alice stops calling.
    for minute in 1..30 {
        clock.advance(MINUTE);
        throttle.sync_once().await.unwrap();
        assert!(throttle.admit(&bob));
        assert!(throttle.is_known(&alice), "minute {minute}");
    }
    clock.advance(MINUTE);
    throttle.sync_once().await.unwrap();
    assert!(
        !throttle.is_known(&alice),
        "forgotten 30 minutes after her last call"
    );
    assert!(
        !throttle.admit(&alice),
        "and refused as new while throttling"
    );
    assert!(throttle.admit(&bob));
    assert_eq!(throttle.active_callers(), 1);
}

#[tokio::test]
async fn false_positive_rate_at_capacity_is_within_the_design_bound() {
    let clock = ManualClock::new(T0);
    let capacity = 20_000;
    let throttle = Throttle::builder("fp")
        .threshold(1)
        .capacity(capacity)
        .false_positive_rate(0.01)
        .clock(clock.clone())
        .build()
        .unwrap();
    // The window holds `capacity` callers: all seen last minute, half of
    // them again this minute (the worst case fills both filters).
    for k in callers(0..capacity) {
        throttle.admit(&k);
    }
    clock.advance(MINUTE);
    throttle.sync_once().await.unwrap();
    for k in callers(0..capacity / 2) {
        throttle.admit(&k);
    }
    assert!(callers(0..capacity).iter().all(|k| throttle.is_known(k)));

    let probes = 200_000;
    let false_positives = callers(1_000_000..1_000_000 + probes)
        .iter()
        .filter(|k| throttle.is_known(k))
        .count();
    let rate = false_positives as f64 / probes as f64;
    let bound = throttle.false_positive_bound(capacity);
    println!("false positives at capacity: {rate:.4} (bound {bound:.4})");
    // 200k probes: one standard deviation is about 0.03 points.
    assert!(rate <= bound + 0.001, "{rate} > {bound}");
    assert!(rate > 0.002, "{rate}: the test would pass with any filter");
}

#[tokio::test]
async fn losing_redis_leaves_local_decisions_working() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let throttle = server(&redis.url(), "lost", &clock, 1).await;
    let (a, b) = (Key::new("a"), Key::new("b"));
    throttle.admit(&a);
    throttle.admit(&b);
    throttle.sync_once().await.unwrap();
    assert!(throttle.is_throttling());

    redis.stop();
    assert!(throttle.sync_once().await.is_err());
    assert!(throttle.admit(&a), "known callers still pass");
    assert!(
        !throttle.admit(&Key::new("new")),
        "new ones are still refused"
    );
    assert_eq!(throttle.active_callers(), 2, "the estimate still updates");

    // Rotation goes on without Redis.
    for _ in 0..30 {
        clock.advance(MINUTE);
        assert!(throttle.sync_once().await.is_err());
    }
    assert!(!throttle.is_known(&a));
    assert!(!throttle.is_throttling());
    assert!(throttle.stats().errors >= 31);
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/cached", get(|| async { (StatusCode::NOT_MODIFIED, "") }))
        .layer(layer)
}

fn get_as(who: &str, path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-api-key", who)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn throttling_through_the_layer_serves_sessions_and_refuses_new_callers() {
    let clock = ManualClock::new(T0);
    let throttle = Throttle::builder("sessions")
        .threshold(2)
        .capacity(1000)
        .clock(clock.clone())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(100).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(MemoryStore::with_clock(clock.clone()))
        .throttle(throttle.clone())
        .build()
        .unwrap();
    let app = app(layer);
    for who in ["ann", "bob", "cid"] {
        let r = app.clone().oneshot(get_as(who, "/")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    throttle.sync_once().await.unwrap();
    assert!(throttle.is_throttling());

    let known = app.clone().oneshot(get_as("bob", "/")).await.unwrap();
    assert_eq!(known.status(), StatusCode::OK);
    assert_eq!(known.headers()["x-ratelimit-remaining"], "98");

    let new = app.clone().oneshot(get_as("dan", "/")).await.unwrap();
    assert_eq!(new.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(new.headers()["retry-after"], "60");
    assert!(new.headers().get("x-ratelimit-remaining").is_none());
    assert_eq!(throttle.stats().refused, 1);
}

#[tokio::test]
async fn throttling_mode_makes_no_redis_call_on_the_request_path() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let throttle = server(&redis.url(), "quiet", &clock, 10).await;
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(1000).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(MemoryStore::with_clock(clock.clone()))
        .throttle(throttle.clone())
        .build()
        .unwrap();
    let app = app(layer);
    throttle.sync_once().await.unwrap(); // loads the scripts
    let before = evalsha_calls(&redis);
    for i in 0..2000 {
        let who = format!("c{}", i % 50);
        app.clone().oneshot(get_as(&who, "/")).await.unwrap();
    }
    assert_eq!(evalsha_calls(&redis), before, "no call per request");
    let report = throttle.sync_once().await.unwrap();
    assert_eq!(report.redis_calls, 2, "look + publish");
    assert_eq!(evalsha_calls(&redis), before + 2);
    let idle = throttle.sync_once().await.unwrap();
    assert_eq!(idle.redis_calls, 1, "nothing new: look only");
    assert!(throttle.is_throttling());
}

fn limited_layer(store: RedisStore, cache: Option<LocalCache>) -> RateLimitLayer {
    let builder = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(2).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(store);
    match cache {
        Some(cache) => builder.local_cache(cache),
        None => builder,
    }
    .build()
    .unwrap()
}

async fn snapshot(app: &Router, who: &str) -> (StatusCode, Vec<(String, String)>, String) {
    let r = app.clone().oneshot(get_as(who, "/")).await.unwrap();
    let status = r.status();
    let mut headers: Vec<(String, String)> = r
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_local_cache_rejects_exhausted_keys_without_redis_and_with_the_same_response() {
    let redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = RedisStore::from_manager(
        redis::Client::open(redis.url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap(),
    )
    .clock(clock.clone())
    .build()
    .unwrap();
    let cached = app(limited_layer(
        store.clone(),
        Some(LocalCache::new(100).clock(clock.clone())),
    ));
    let plain = app(limited_layer(store, None));

    assert_eq!(snapshot(&cached, "bob").await.0, StatusCode::OK);
    clock.advance(Duration::from_millis(1500));
    assert_eq!(snapshot(&cached, "bob").await.0, StatusCode::OK); // last unit
    clock.advance(Duration::from_millis(20_200));

    let before = evalsha_calls(&redis);
    let from_cache = snapshot(&cached, "bob").await;
    assert_eq!(evalsha_calls(&redis), before, "answered locally");
    let from_redis = snapshot(&plain, "bob").await;
    assert_eq!(evalsha_calls(&redis), before + 1);
    assert_eq!(from_cache.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(from_cache, from_redis, "same status, headers and body");

    // At the window's end the cache lets go and Redis decides again.
    clock.set(T0 + 60_000_000);
    assert_eq!(snapshot(&cached, "bob").await.0, StatusCode::OK);
    assert_eq!(evalsha_calls(&redis), before + 2);
}

#[tokio::test]
async fn a_refund_frees_a_cached_last_unit() {
    let (url, prefix) = (shared_url(), unique_prefix("refund"));
    let clock = ManualClock::new(T0);
    let store = RedisStore::from_manager(
        redis::Client::open(url)
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap(),
    )
    .prefix(prefix)
    .clock(clock.clone())
    .build()
    .unwrap();
    let app = app(limited_layer(
        store,
        Some(LocalCache::new(100).clock(clock.clone())),
    ));
    assert_eq!(snapshot(&app, "eve").await.0, StatusCode::OK);
    // The last unit goes to a 304, which is refunded: nothing is spent.
    let r = app.clone().oneshot(get_as("eve", "/cached")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(r.headers()["x-ratelimit-remaining"], "1");
    assert_eq!(snapshot(&app, "eve").await.0, StatusCode::OK);
    assert_eq!(snapshot(&app, "eve").await.0, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn shadow_mode_neither_throttles_nor_answers_from_the_cache() {
    let clock = ManualClock::new(T0);
    let throttle = Throttle::builder("sessions")
        .threshold(0)
        .capacity(100)
        .clock(clock.clone())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window(
            "core",
            Quota::per_minute(NonZeroU32::new(1).unwrap()),
        ))
        .key(HeaderKey::new("x-api-key"))
        .store(MemoryStore::with_clock(clock.clone()))
        .throttle(throttle.clone())
        .local_cache(LocalCache::new(100).clock(clock.clone()))
        .shadow(true)
        .build()
        .unwrap();
    let app = app(layer.clone());
    assert_eq!(snapshot(&app, "ann").await.0, StatusCode::OK);
    throttle.sync_once().await.unwrap();
    assert!(throttle.is_throttling());
    let (status, headers, _) = snapshot(&app, "new").await;
    assert_eq!(status, StatusCode::OK, "would have been throttled");
    assert!(headers
        .iter()
        .any(|(k, v)| k == "x-ratelimit-remaining" && v == "0"));
    assert_eq!(
        throttle.stats().refused,
        1,
        "but the would-be refusal is counted"
    );
    assert_eq!(snapshot(&app, "ann").await.0, StatusCode::OK);
    assert_eq!(layer.local_cache_hits(), 0);
}

#[cfg(feature = "metrics")]
mod metrics {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[tokio::test]
    async fn throttled_and_cached_decisions_and_the_active_callers_gauge_are_reported() {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let snapshotter = recorder.snapshotter();
        let _guard = ::metrics::set_default_local_recorder(recorder);

        let clock = ManualClock::new(T0);
        let throttle = Throttle::builder("sessions")
            .threshold(1)
            .capacity(100)
            .clock(clock.clone())
            .build()
            .unwrap();
        let app = app(RateLimitLayer::builder()
            .policy(Policy::fixed_window(
                "core",
                Quota::per_minute(NonZeroU32::new(1).unwrap()),
            ))
            .key(HeaderKey::new("x-api-key"))
            .store(MemoryStore::with_clock(clock.clone()))
            .throttle(throttle.clone())
            .local_cache(LocalCache::new(100).clock(clock.clone()))
            .build()
            .unwrap());
        assert_eq!(snapshot(&app, "ann").await.0, StatusCode::OK);
        assert_eq!(snapshot(&app, "bob").await.0, StatusCode::OK);
        assert_eq!(snapshot(&app, "ann").await.0, StatusCode::TOO_MANY_REQUESTS);
        throttle.sync_once().await.unwrap();
        assert_eq!(snapshot(&app, "cid").await.0, StatusCode::TOO_MANY_REQUESTS);

        let seen: Vec<(String, Vec<String>, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (key.key().name().to_owned(), labels, value)
            })
            .collect();
        let value = |name: &str, label: &str| {
            seen.iter()
                .find(|(n, l, _)| n == name && l.iter().any(|x| x == label))
                .map(|(_, _, v)| format!("{v:?}"))
        };
        let outcome = |o: &str| {
            value(tollgate::metrics::DECISIONS, &format!("outcome={o}")).unwrap_or_default()
        };
        assert_eq!(outcome("allowed"), format!("{:?}", DebugValue::Counter(2)));
        assert_eq!(outcome("limited"), format!("{:?}", DebugValue::Counter(1)));
        assert_eq!(
            outcome("throttled"),
            format!("{:?}", DebugValue::Counter(1))
        );
        assert_eq!(
            value(tollgate::metrics::LOCAL_CACHE_HITS, "policy=core"),
            Some(format!("{:?}", DebugValue::Counter(1)))
        );
        assert_eq!(
            value(tollgate::metrics::ACTIVE_CALLERS, "policy=core"),
            Some(format!("{:?}", DebugValue::Gauge(2.0.into())))
        );
    }
}
