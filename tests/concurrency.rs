//! Under concurrency a limit of 50 admits exactly 50, in one process and
//! across app servers sharing one Redis, whatever the strategy.

mod support;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use support::redis::{shared_url, unique_prefix};
use tollgate::{Key, MemoryStore, Policy, Quota, RateLimitLayer, RedisStore, Store};
use tower::ServiceExt;

const LIMIT: u32 = 50;
const REQUESTS: usize = 200;

fn policy() -> Policy {
    Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(LIMIT).unwrap()))
}

/// Fires `REQUESTS` checks for one key at once, spread round-robin over
/// `stores`, and counts the passes.
async fn admitted(stores: Vec<Arc<dyn Store>>) -> usize {
    let policy = Arc::new(policy());
    let gate = Arc::new(tokio::sync::Barrier::new(REQUESTS));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (store, policy, gate) = (
                stores[i % stores.len()].clone(),
                policy.clone(),
                gate.clone(),
            );
            tokio::spawn(async move {
                gate.wait().await;
                store
                    .check(&policy, &Key::new("hot"), 1)
                    .await
                    .unwrap()
                    .allowed
            })
        })
        .collect();
    let mut passes = 0;
    for t in tasks {
        passes += usize::from(t.await.unwrap());
    }
    passes
}

async fn redis_store(prefix: &str) -> Arc<dyn Store> {
    // Each store gets its own connection, as separate app servers would.
    let conn = redis::Client::open(shared_url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    Arc::new(
        RedisStore::from_manager(conn)
            .prefix(prefix)
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_admits_exactly_the_limit() {
    assert_eq!(
        admitted(vec![Arc::new(MemoryStore::new())]).await,
        LIMIT as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_redis_store_admits_exactly_the_limit() {
    let prefix = unique_prefix("conc1");
    assert_eq!(
        admitted(vec![redis_store(&prefix).await]).await,
        LIMIT as usize
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_app_servers_sharing_one_redis_admit_exactly_the_limit() {
    let prefix = unique_prefix("conc2");
    let stores = vec![redis_store(&prefix).await, redis_store(&prefix).await];
    assert_eq!(admitted(stores).await, LIMIT as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_under_axum_clones_shares_one_budget() {
    // Regression for limiting inside the service (axum#2634): every clone got
    // its own budget and a 5 req/s cap let 1,500 concurrent requests through.
    let layer = RateLimitLayer::builder()
        .policy(policy())
        // A loaded CI machine must not turn slow decisions into local ones
        // (the failure policy would admit more): wait, and fail closed.
        .deadline(std::time::Duration::from_secs(5))
        .on_store_failure(tollgate::FailurePolicy::closed(
            std::time::Duration::from_secs(1),
        ))
        .store(redis_store(&unique_prefix("conc3")).await)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 1], 1))));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                app.oneshot(Request::get("/").body(Body::empty()).unwrap())
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        let status = t.await.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{status}"
        );
        ok += usize::from(status == StatusCode::OK);
    }
    assert_eq!(ok, LIMIT as usize);
}

/// Fires `REQUESTS` checks at once under `policy`, spread round-robin over
/// `stores`, the `i`-th for caller `who(i)`; the passes per caller.
async fn admitted_by(
    policy: Policy,
    stores: Vec<Arc<dyn Store>>,
    who: fn(usize) -> String,
) -> std::collections::BTreeMap<String, usize> {
    let policy = Arc::new(policy);
    let gate = Arc::new(tokio::sync::Barrier::new(REQUESTS));
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (store, policy, gate) = (
                stores[i % stores.len()].clone(),
                policy.clone(),
                gate.clone(),
            );
            tokio::spawn(async move {
                gate.wait().await;
                let key = who(i);
                let d = store.check(&policy, &Key::new(&key), 1).await.unwrap();
                (key, d.allowed)
            })
        })
        .collect();
    let mut passes = std::collections::BTreeMap::new();
    for t in tasks {
        let (key, allowed) = t.await.unwrap();
        *passes.entry(key).or_default() += usize::from(allowed);
    }
    passes
}

/// `REQUESTS` (at least 4× the limit) at once on one key admit exactly
/// `expected`: in memory, with one `RedisStore`, and with two app servers
/// sharing one Redis.
async fn admits_exactly(policy: Policy, expected: usize) {
    let hot = |_| "hot".to_owned();
    let name = policy.strategy().as_str();
    assert!(REQUESTS >= 4 * expected);
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let total = |m: std::collections::BTreeMap<String, usize>| m.values().sum::<usize>();
    assert_eq!(
        total(admitted_by(policy.clone(), vec![memory], hot).await),
        expected,
        "{name}: memory"
    );
    let one = vec![redis_store(&unique_prefix("conc-one")).await];
    assert_eq!(
        total(admitted_by(policy.clone(), one, hot).await),
        expected,
        "{name}: one RedisStore"
    );
    let prefix = unique_prefix("conc-two");
    let two = vec![redis_store(&prefix).await, redis_store(&prefix).await];
    assert_eq!(
        total(admitted_by(policy, two, hot).await),
        expected,
        "{name}: two RedisStores on one Redis"
    );
}

fn hourly(n: u32) -> Quota {
    Quota::per_hour(NonZeroU32::new(n).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uniform_gate_checks_and_sets_in_one_step_so_racers_get_one_pass() {
    // Regression: published gates check (TTL) and then set in two round
    // trips, so racing requests all see an open gate.
    let gate = Policy::uniform_gate("gate", std::time::Duration::from_secs(3600)).unwrap();
    admits_exactly(gate, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_log_admits_exactly_the_limit() {
    admits_exactly(
        Policy::sliding_log("log", hourly(1000), hourly(LIMIT)),
        LIMIT as usize,
    )
    .await;
    admits_exactly(
        Policy::sliding_log("log", hourly(LIMIT), hourly(1000)),
        LIMIT as usize,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_log_resource_limit_holds_across_many_consumers() {
    // 20 callers may take 5 each (100), but the resource sells only 50.
    let policy = Policy::sliding_log("log", hourly(LIMIT), hourly(5));
    let caller = |i: usize| format!("caller{}", i % 20);
    let prefix = unique_prefix("conc-many");
    let stores = vec![redis_store(&prefix).await, redis_store(&prefix).await];
    let passes = admitted_by(policy, stores, caller).await;
    assert_eq!(passes.values().sum::<usize>(), LIMIT as usize, "{passes:?}");
    assert!(passes.values().all(|&n| n <= 5), "{passes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sliding_window_admits_exactly_the_limit() {
    admits_exactly(
        Policy::sliding_window("window", hourly(LIMIT)),
        LIMIT as usize,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gcra_admits_exactly_its_burst() {
    // One unit per 72 s: nothing refills while the requests race.
    let burst = NonZeroU32::new(LIMIT).unwrap();
    admits_exactly(Policy::gcra("gcra", hourly(LIMIT), burst), LIMIT as usize).await;
}

// ----------------------------------------------------------------------------
// Leaky bucket and concurrency limit: 4× the limit at once on one key.

/// Fires `4 × limit` checks of `policy` for one key at once, spread
/// round-robin over `stores`, and returns the passes.
async fn passes(
    policy: Policy,
    limit: usize,
    stores: Vec<Arc<dyn Store>>,
) -> Vec<tollgate::Decision> {
    let policy = Arc::new(policy);
    let requests = 4 * limit;
    let gate = Arc::new(tokio::sync::Barrier::new(requests));
    let tasks: Vec<_> = (0..requests)
        .map(|i| {
            let (store, policy, gate) = (
                stores[i % stores.len()].clone(),
                policy.clone(),
                gate.clone(),
            );
            tokio::spawn(async move {
                gate.wait().await;
                store.check(&policy, &Key::new("hot"), 1).await.unwrap()
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let d = t.await.unwrap();
        if d.allowed {
            out.push(d);
        }
    }
    out
}

/// 50 per hour (one every 72 s), so the bucket cannot drain during the
/// burst: exactly `capacity` fit.
fn leaky_policy() -> Policy {
    Policy::leaky_bucket(
        "shape",
        Quota::per_hour(NonZeroU32::new(LIMIT).unwrap()),
        NonZeroU32::new(LIMIT).unwrap(),
    )
}

/// Exactly `LIMIT` admitted, and their start times (decision time plus
/// wait) at least one interval apart: never faster than the rate.
fn assert_leaky_burst(passes: Vec<tollgate::Decision>) {
    assert_eq!(passes.len(), LIMIT as usize);
    let interval = 3_600_000_000 / u64::from(LIMIT);
    let mut starts: Vec<u64> = passes
        .iter()
        .map(|d| d.now_micros + d.delay.map_or(0, |w| w.as_micros() as u64))
        .collect();
    starts.sort_unstable();
    for pair in starts.windows(2) {
        assert!(
            pair[1] - pair[0] >= interval,
            "{pair:?} closer than {interval} µs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaky_bucket_memory_store_admits_capacity_spaced_by_the_rate() {
    let stores: Vec<Arc<dyn Store>> = vec![Arc::new(MemoryStore::new())];
    assert_leaky_burst(passes(leaky_policy(), LIMIT as usize, stores).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaky_bucket_one_redis_store_admits_capacity_spaced_by_the_rate() {
    let stores = vec![redis_store(&unique_prefix("leaky1")).await];
    assert_leaky_burst(passes(leaky_policy(), LIMIT as usize, stores).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaky_bucket_two_app_servers_admit_capacity_spaced_by_the_rate() {
    let prefix = unique_prefix("leaky2");
    let stores = vec![redis_store(&prefix).await, redis_store(&prefix).await];
    assert_leaky_burst(passes(leaky_policy(), LIMIT as usize, stores).await);
}

fn concurrency_policy() -> Policy {
    Policy::concurrency(
        "slots",
        NonZeroU32::new(LIMIT).unwrap(),
        std::time::Duration::from_secs(60),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_memory_store_admits_exactly_the_limit() {
    let stores: Vec<Arc<dyn Store>> = vec![Arc::new(MemoryStore::new())];
    let admitted = passes(concurrency_policy(), LIMIT as usize, stores).await;
    assert_eq!(admitted.len(), LIMIT as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_one_redis_store_admits_exactly_the_limit() {
    let stores = vec![redis_store(&unique_prefix("slots1")).await];
    let admitted = passes(concurrency_policy(), LIMIT as usize, stores).await;
    assert_eq!(admitted.len(), LIMIT as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_two_app_servers_admit_exactly_the_limit() {
    let prefix = unique_prefix("slots2");
    let stores = vec![redis_store(&prefix).await, redis_store(&prefix).await];
    let admitted = passes(concurrency_policy(), LIMIT as usize, stores).await;
    assert_eq!(admitted.len(), LIMIT as usize);
    // Every pass holds its own slot: all ids differ.
    let ids: std::collections::HashSet<_> = admitted
        .iter()
        .map(|d| d.receipt.stamps().to_vec())
        .collect();
    assert_eq!(ids.len(), LIMIT as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrency_through_the_layer_holds_exactly_the_limit_in_flight() {
    // 4× the limit concurrent requests whose handlers do not finish until
    // the test says so: exactly the limit get in, the rest get 429.
    let policy = concurrency_policy();
    let layer = RateLimitLayer::builder()
        .policy(policy)
        // A loaded CI machine must not turn slow decisions into local ones
        // (the failure policy would admit more): wait, and fail closed.
        .deadline(std::time::Duration::from_secs(5))
        .on_store_failure(tollgate::FailurePolicy::closed(
            std::time::Duration::from_secs(1),
        ))
        .store(redis_store(&unique_prefix("slots3")).await)
        .build()
        .unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (g, n) = (gate.clone(), inside.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let (g, n) = (g.clone(), n.clone());
                async move {
                    n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _permit = g.acquire().await;
                    "done"
                }
            }),
        )
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([198, 51, 100, 2], 1))));
    let mut pending: Vec<_> = (0..4 * LIMIT)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                app.oneshot(Request::get("/").body(Body::empty()).unwrap())
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    // The rejected ones finish on their own while the admitted are held.
    let mut limited = 0;
    for _ in 0..500 {
        if limited == 3 * LIMIT as usize {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let mut still = Vec::new();
        for t in pending {
            if t.is_finished() {
                assert_eq!(t.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
                limited += 1;
            } else {
                still.push(t);
            }
        }
        pending = still;
    }
    assert_eq!(limited, 3 * LIMIT as usize);
    assert_eq!(
        inside.load(std::sync::atomic::Ordering::SeqCst),
        LIMIT as usize
    );
    gate.add_permits(4 * LIMIT as usize);
    assert_eq!(pending.len(), LIMIT as usize);
    for t in pending {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
}
