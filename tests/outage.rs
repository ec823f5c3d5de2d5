//! Issue 19: the edges of an outage, against a real `redis-server` frozen
//! with SIGSTOP (as a stalled host or a long `DEBUG SLEEP` would freeze it):
//! calls Redis runs after their requests stopped waiting charge nothing, the
//! local fallback starts from what this server last learned, and a peek
//! keeps answering.

mod support;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use redis::Commands;
use support::redis::{command_calls, reset_stats, RedisServer};
use tollgate::{Decision, Key, Policy, Quota, RateLimitLayer, RedisStore};
use tower::ServiceExt;

/// `redis-server` stopped (SIGSTOP) until dropped (SIGCONT): its sockets
/// stay open, and what clients send meanwhile runs when it resumes.
struct Frozen(String);

fn redis_pid(server: &RedisServer) -> String {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("INFO server names the process")
        .trim()
        .to_owned()
}

fn signal(pid: &str, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

impl Frozen {
    fn new(server: &RedisServer) -> Frozen {
        let pid = redis_pid(server);
        signal(&pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.0, "-CONT");
    }
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

async fn layer(server: &RedisServer, limit: u32) -> RateLimitLayer {
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .prefix("o")
        .build()
        .unwrap();
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", per_minute(limit)))
        .store(store)
        .deadline(Duration::from_millis(100))
        .build()
        .unwrap()
}

fn app(layer: &RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hi" }))
        .route_layer(layer.clone())
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 19], 1))))
}

/// The status, and whether the local fallback decided.
async fn hit(app: &Router) -> (StatusCode, bool) {
    let req = Request::get("/").body(Body::empty()).unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let local = res
        .headers()
        .get("x-ratelimit-fallback")
        .is_some_and(|v| v == "local");
    (res.status(), local)
}

/// `n` requests at once: how many passed, and how many the fallback decided.
async fn crowd(app: &Router, n: usize) -> (usize, usize) {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { hit(&app).await })
        })
        .collect();
    let (mut passed, mut local) = (0, 0);
    for call in calls {
        let (status, fallback) = call.await.unwrap();
        passed += usize::from(status == StatusCode::OK);
        local += usize::from(fallback);
    }
    (passed, local)
}

/// The caller's count in Redis, once Redis has run what waited for it.
fn redis_count(server: &RedisServer) -> u64 {
    // What the frozen server found in its sockets runs as it resumes; a
    // moment later it is done.
    std::thread::sleep(Duration::from_millis(300));
    let mut conn = server.conn();
    let keys: Vec<String> = conn.keys("o:*").unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl: i64 = conn.pttl(&keys[0]).unwrap();
    assert!(ttl > 0, "every key keeps an expiry, not {ttl}");
    conn.hget(&keys[0], "c").unwrap()
}

/// Issue 19, edge 1: when a frozen Redis resumed it ran every `EVALSHA`
/// queued in its sockets, charging requests the fallback had already
/// decided (a count of 1,000's limit rose by 7 for requests Redis never
/// answered in time). Each call now carries its deadline in Redis time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_redis_runs_after_their_deadline_charge_nothing() {
    let server = RedisServer::start();
    let layer = layer(&server, 1000).await;
    let app = app(&layer);
    for _ in 0..2 {
        assert_eq!(hit(&app).await, (StatusCode::OK, false));
    }
    {
        let _frozen = Frozen::new(&server);
        let (passed, local) = crowd(&app, 20).await;
        assert_eq!((passed, local), (20, 20));
    }
    assert_eq!(
        redis_count(&server),
        2,
        "only the requests Redis decided in time are charged"
    );
}

/// Issue 19, edge 2: with 5 per window, 2 went through Redis, Redis froze,
/// and the fallback admitted 5 more: 7 in one window from one server. It
/// now starts from the 2 it last learned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_switch_to_the_fallback_hands_out_no_fresh_budget() {
    let server = RedisServer::start();
    let layer = layer(&server, 5).await;
    let app = app(&layer);
    for _ in 0..2 {
        assert_eq!(hit(&app).await, (StatusCode::OK, false));
    }
    {
        let _frozen = Frozen::new(&server);
        let (passed, local) = crowd(&app, 10).await;
        assert_eq!(local, 10, "all decided by the fallback");
        assert_eq!(passed, 3, "5 in the window: 2 by Redis, 3 by the fallback");
    }
    assert_eq!(redis_count(&server), 2);
}

/// Issue 19, edge 4: `GET /rate_limit` answered 503 while Redis was frozen,
/// though the layer kept deciding. A peek follows the failure policy: the
/// local fallback answers, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_during_an_outage_answers_from_the_fallback() {
    let server = RedisServer::start();
    let layer = layer(&server, 5).await;
    let app = app(&layer);
    let parts = || {
        let mut req = Request::get("/rate_limit").body(()).unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::from((
                [192, 0, 2, 19],
                1,
            ))));
        req.into_parts().0
    };
    assert_eq!(hit(&app).await, (StatusCode::OK, false));
    let before = layer.peek(&parts()).await.unwrap();
    assert!(!before.fallback);
    assert_eq!(before.used, 1);

    let _frozen = Frozen::new(&server);
    let during = layer.peek(&parts()).await.expect("the fallback answers");
    assert!(during.fallback, "{during:?}");
    assert_eq!(
        (during.used, during.remaining),
        (1, 4),
        "the fallback starts from what Redis said"
    );
    assert_eq!(hit(&app).await, (StatusCode::OK, true));
    let after_one = layer.peek(&parts()).await.unwrap();
    assert!(after_one.fallback);
    assert_eq!(after_one.used, 2);
}

/// Every policy whose fallback is seeded (all but the concurrency limit),
/// each at 50 per 30 s for its caller; two quotas of a fixed window share
/// the key, and an aligned window is an hour long so that it does not turn
/// over on this machine's clock while the test runs.
fn seeded_policies() -> Vec<Policy> {
    let fifty = NonZeroU32::new(50).unwrap();
    let per_30s = Quota::new(50, Duration::from_secs(30)).unwrap();
    let hourly = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    vec![
        Policy::fixed_window("fixed", per_30s),
        Policy::fixed_window("fixed-two", per_30s).and(hourly(1000)),
        Policy::aligned_window("aligned", hourly(50)),
        Policy::sliding_window("window", per_30s),
        Policy::sliding_log("log", hourly(1000), per_30s),
        Policy::gcra("gcra", per_30s, fifty),
        Policy::leaky_bucket("leaky", per_30s, fifty),
    ]
}

/// `n` checks of `key` at once on each of `servers`: per server, the
/// decisions.
async fn burst(servers: &[tollgate::RateLimiter], key: &str, n: usize) -> Vec<Vec<Decision>> {
    let calls: Vec<Vec<_>> = servers
        .iter()
        .map(|server| {
            (0..n)
                .map(|_| {
                    let server = server.clone();
                    let key = Key::new(key);
                    tokio::spawn(async move { server.check(&key, 1).await.unwrap() })
                })
                .collect()
        })
        .collect();
    let mut decided = Vec::new();
    for server in calls {
        let mut decisions = Vec::new();
        for call in server {
            decisions.push(call.await.unwrap());
        }
        decided.push(decisions);
    }
    decided
}

/// Issue 35: 20 requests at once went to Redis in batches, Redis froze, and
/// one server's fallback then admitted up to 39 of a limit of 50 that had
/// 30 left (two servers together up to 75, against a documented 60). The
/// replies of a batch reach their requests in no particular order, and the
/// fallback's seed kept whichever was handled last. It now keeps the
/// newest in Redis's order: the highest count Redis told this server, so
/// each server's fallback admits at most what was left of the limit when
/// it last heard from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_burst_before_an_outage_seeds_the_fallback_with_the_highest_count() {
    use tollgate::clock::ManualClock;

    let server = RedisServer::start();
    // Redis's time stands still: every reply of the burst is at one instant,
    // and its count alone says which came last.
    let clock = ManualClock::new(1_800_000_000_000_000);
    let limit = 50;
    for policy in seeded_policies() {
        for servers in [1, 2] {
            let prefix = format!("i35-{}-{servers}", policy.name());
            let mut limiters = Vec::new();
            for _ in 0..servers {
                let store = RedisStore::connect_builder(&server.url())
                    .await
                    .unwrap()
                    .prefix(prefix.clone())
                    .clock(clock.clone())
                    .build()
                    .unwrap();
                let layer = RateLimitLayer::builder()
                    .policy(policy.clone())
                    .store(store)
                    .deadline(Duration::from_millis(300))
                    .build()
                    .unwrap();
                let limiter = layer.limiter();
                // Loads the lone script; the batch's loads in the burst.
                assert!(limiter.check(&Key::new("warm"), 1).await.unwrap().allowed);
                limiters.push(limiter);
            }
            let what = format!("{} on {servers} server(s)", policy.name());

            // 20 at once, split among the servers, while Redis holds its
            // clients: as many go alone as a store has calls in flight
            // (4), the rest queue and go out together.
            reset_stats(&server);
            server.pause_clients(Duration::from_millis(50));
            let before = burst(&limiters, "k", 20 / servers).await;
            let decisions: Vec<&Decision> = before.iter().flatten().collect();
            assert!(decisions.iter().all(|d| d.allowed && !d.fallback), "{what}");
            let mut used: Vec<u64> = decisions.iter().map(|d| d.used).collect();
            used.sort_unstable();
            assert_eq!(used, (1..=20).collect::<Vec<_>>(), "{what}");
            let evalsha = command_calls(&server).get("evalsha").copied().unwrap_or(0);
            assert!(
                evalsha < 20,
                "{what}: 20 decisions in {evalsha} calls, so some were batched"
            );
            // What Redis last told each server: its highest count.
            let known: Vec<u64> = before
                .iter()
                .map(|ds| ds.iter().map(|d| d.used).max().unwrap())
                .collect();

            let frozen = Frozen::new(&server);
            let during = burst(&limiters, "k", 200 / servers).await;
            drop(frozen);
            let mut together = 0;
            for ((decisions, known), before) in during.iter().zip(&known).zip(&before) {
                assert!(decisions.iter().all(|d| d.fallback), "{what}");
                let admitted = decisions.iter().filter(|d| d.allowed).count() as u64;
                assert!(
                    before.len() as u64 + admitted <= limit,
                    "{what}: {} before the outage and {admitted} during it",
                    before.len()
                );
                let left = limit - known;
                if policy.name().starts_with("fixed") {
                    assert_eq!(admitted, left, "{what}: Redis said {known} were spent");
                } else {
                    assert!(admitted <= left, "{what}: {admitted} of {left} left");
                }
                together += admitted;
            }
            let bound: u64 = known.iter().map(|k| limit - k).sum();
            assert!(together <= bound, "{what}: together {together}");
        }
    }
}

/// A batch that reaches Redis after the earliest deadline among its charges
/// charges none of them (a concurrency check takes no slot), while a
/// release queued in it still frees its slot: giving back is always safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_batch_charges_nothing_and_still_gives_back() {
    use std::time::Instant;
    use tollgate::error::StoreErrorKind;
    use tollgate::{Key, Store};

    let server = RedisServer::start();
    let store = std::sync::Arc::new(
        RedisStore::connect_builder(&server.url())
            .await
            .unwrap()
            .prefix("b")
            .calls_in_flight(std::num::NonZeroUsize::MIN)
            .build()
            .unwrap(),
    );
    let three = NonZeroU32::new(3).unwrap();
    let policy = Policy::concurrency("slots", three, Duration::from_secs(60)).unwrap();
    let soon = || Instant::now() + Duration::from_millis(100);
    // A first answer teaches the store Redis's time; this one holds a slot.
    let held = store
        .check_before(&policy, &Key::new("k"), 1, soon())
        .await
        .unwrap();
    assert!(held.allowed);

    let frozen = Frozen::new(&server);
    let spawn_check = |key: &'static str| {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move { store.check_before(&policy, &Key::new(key), 1, soon()).await })
    };
    // The one call in flight; then a release and three checks queue.
    let alone = spawn_check("other");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let release = {
        let (store, policy, receipt) = (store.clone(), policy.clone(), held.receipt.clone());
        tokio::spawn(async move { store.refund(&policy, &Key::new("k"), &receipt).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let queued: Vec<_> = (0..3).map(|_| spawn_check("k")).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(frozen);

    let late = alone.await.unwrap().unwrap_err();
    assert_eq!(late.kind(), StoreErrorKind::Timeout, "{late}");
    release.await.unwrap().unwrap();
    for check in queued {
        let late = check.await.unwrap().unwrap_err();
        assert_eq!(late.kind(), StoreErrorKind::Timeout, "{late}");
    }
    let mut conn = server.conn();
    let keys: Vec<String> = conn.keys("b:*").unwrap();
    for key in &keys {
        let held: u64 = conn.zcard(key).unwrap();
        assert_eq!(
            held, 0,
            "{key} holds slots of late checks or of the release"
        );
    }
}

/// `NOSCRIPT` reloads are counted, not logged one by one: the first use of
/// a script on a server and each `SCRIPT FLUSH` after it count one.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn noscript_reloads_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tollgate::{Key, Store};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // This test's runtime has one thread: every call below records here.
    let _local = metrics::set_default_local_recorder(&recorder);
    let server = RedisServer::start();
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .prefix("n")
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", per_minute(10));
    for flush in [false, true, false] {
        if flush {
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut server.conn())
                .unwrap();
        }
        assert!(
            store
                .check(&policy, &Key::new("k"), 1)
                .await
                .unwrap()
                .allowed
        );
    }
    let reloads: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == tollgate::metrics::SCRIPT_RELOADS)
        .map(|(key, _, _, value)| {
            (
                key.key()
                    .labels()
                    .map(|l| l.value().to_owned())
                    .collect::<Vec<_>>(),
                value,
            )
        })
        .collect();
    assert_eq!(
        reloads,
        vec![(vec!["fixed_window".to_owned()], DebugValue::Counter(2))]
    );
}
