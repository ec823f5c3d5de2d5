//! The limiter handle: `check`, `peek`, `refund` and `reset` outside HTTP,
//! on the memory store and on Redis (single server and Cluster), with the
//! layer's budget, deadline and failure policy.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use support::redis::{unique_prefix, RedisCluster, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::{
    FailurePolicy, Key, MemoryStore, Policy, Quota, RateLimitLayer, RateLimiter, RedisStore, Store,
};

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// One policy per strategy, each with a budget of three for a caller.
fn lineup() -> Vec<Policy> {
    let three = NonZeroU32::new(3).unwrap();
    vec![
        Policy::fixed_window("fixed", per_minute(3)).and(per_minute(100)),
        Policy::sliding_window("window", per_minute(3)),
        Policy::sliding_log("log", per_minute(100), per_minute(3)),
        Policy::gcra("gcra", per_minute(3), three),
        Policy::uniform_gate("gate", Duration::from_secs(10)).unwrap(),
        Policy::leaky_bucket("leaky", per_minute(3), three),
        Policy::concurrency("concurrency", three, Duration::from_secs(60)).unwrap(),
    ]
}

/// Spends `key`'s whole budget, resets it, and checks that the key starts
/// afresh while another caller's state and shared state are untouched.
async fn reset_unblocks_every_strategy(store: impl Store + Clone) {
    for policy in lineup() {
        let name = policy.strategy().as_str();
        let limiter = RateLimiter::new(policy.clone(), store.clone()).unwrap();
        let (blocked, other) = (Key::new("blocked"), Key::new("other"));
        assert!(limiter.check(&other, 1).await.unwrap().allowed, "{name}");
        let mut passes = 0;
        while limiter.check(&blocked, 1).await.unwrap().allowed {
            passes += 1;
            assert!(passes <= 3, "{name}: more than the budget passed");
        }
        let other_before = limiter.peek(&other).await.unwrap();

        limiter.reset(&blocked).await.unwrap();
        let fresh = limiter.peek(&blocked).await.unwrap();
        assert!(fresh.allowed, "{name}: {fresh:?}");
        assert!(
            limiter.check(&blocked, 1).await.unwrap().allowed,
            "{name}: reset did not unblock"
        );
        let other_after = limiter.peek(&other).await.unwrap();
        assert_eq!(
            (other_after.used, other_after.remaining),
            (other_before.used, other_before.remaining),
            "{name}: another caller's state moved"
        );
        if name == "sliding_log" {
            // The resource quota is every caller's: a reset keeps it.
            let shared = limiter.check(&Key::new("third"), 0).await.unwrap();
            assert!(shared.allowed, "{name}");
        }
    }
}

#[tokio::test]
async fn reset_unblocks_a_caller_on_every_strategy_in_memory() {
    reset_unblocks_every_strategy(MemoryStore::with_clock(ManualClock::new(1_000_000))).await;
}

#[tokio::test]
async fn reset_unblocks_a_caller_on_every_strategy_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .prefix(unique_prefix("reset"))
        .build()
        .unwrap();
    reset_unblocks_every_strategy(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_is_one_del_of_the_callers_own_keys_on_a_cluster() {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0));
    let store = RedisStore::cluster(cluster.urls())
        .connect()
        .await
        .unwrap()
        .prefix(unique_prefix("reset-cluster"))
        .build()
        .unwrap();
    reset_unblocks_every_strategy(store).await;
}

#[tokio::test]
async fn the_resource_log_is_kept_and_the_consumer_log_cleared() {
    let store = MemoryStore::with_clock(ManualClock::new(1_000_000));
    let policy = Policy::sliding_log("tickets", per_minute(4), per_minute(2));
    let limiter = RateLimiter::new(policy, store).unwrap();
    let (ann, bob) = (Key::new("ann"), Key::new("bob"));
    for _ in 0..2 {
        assert!(limiter.check(&ann, 1).await.unwrap().allowed);
        assert!(limiter.check(&bob, 1).await.unwrap().allowed);
    }
    // Four of four tickets sold: nobody gets a fifth, reset or not.
    limiter.reset(&ann).await.unwrap();
    let after = limiter.check(&ann, 1).await.unwrap();
    assert!(
        !after.allowed,
        "the shared resource quota was reset: {after:?}"
    );
    assert_eq!(after.quota, 0, "the resource quota rejects, not ann's own");
}

#[tokio::test]
async fn a_layers_limiter_spends_the_layers_budget() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", per_minute(5)))
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let limiter = layer.limiter();
    let caller = Key::new("10.0.0.1");
    assert_eq!(limiter.check(&caller, 4).await.unwrap().remaining, 1);
    let another = layer.limiter();
    assert_eq!(another.check(&caller, 1).await.unwrap().remaining, 0);
    assert!(!limiter.check(&caller, 1).await.unwrap().allowed);
}

#[tokio::test]
async fn a_refund_gives_back_to_the_store_that_decided() {
    let server = RedisServer::start();
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .prefix(unique_prefix("refund"))
        .build()
        .unwrap();
    let limiter = RateLimiter::new(Policy::fixed_window("jobs", per_minute(10)), store).unwrap();
    let tenant = Key::new("tenant");
    let charged = limiter.check(&tenant, 3).await.unwrap();
    assert!(!charged.fallback);
    assert_eq!(limiter.peek(&tenant).await.unwrap().used, 3);
    limiter.refund(&tenant, &charged).await.unwrap();
    assert_eq!(limiter.peek(&tenant).await.unwrap().used, 0);
    let rejected = limiter.check(&tenant, 11).await.unwrap();
    limiter.refund(&tenant, &rejected).await.unwrap();
    assert_eq!(
        limiter.peek(&tenant).await.unwrap().used,
        0,
        "a rejection gives nothing back"
    );
}

/// Freezes `server` for `ms` with `CLIENT PAUSE` (in effect when it returns).
fn pause(server: &RedisServer, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .query(&mut server.conn())
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_follows_the_failure_policy_when_redis_hangs() {
    let server = RedisServer::start();
    let connect = || async {
        RedisStore::connect_builder(&server.url())
            .await
            .unwrap()
            .prefix(unique_prefix("hang"))
            .build()
            .unwrap()
    };
    let policy = Policy::fixed_window("core", per_minute(5));
    let local = RateLimitLayer::builder()
        .policy(policy.clone())
        .store(connect().await)
        .deadline(Duration::from_millis(50))
        .build()
        .unwrap()
        .limiter();
    let closed = RateLimitLayer::builder()
        .policy(policy)
        .store(connect().await)
        .deadline(Duration::from_millis(50))
        .on_store_failure(FailurePolicy::closed(Duration::from_secs(1)))
        .build()
        .unwrap()
        .limiter();
    let caller = Key::new("caller");
    assert!(!local.check(&caller, 2).await.unwrap().fallback);

    tokio::task::block_in_place(|| pause(&server, 1_000));
    let started = std::time::Instant::now();
    let fallback = local.check(&caller, 1).await.unwrap();
    assert!(fallback.fallback, "{fallback:?}");
    assert_eq!(fallback.used, 3, "the fallback starts from what Redis said");
    let peek = local.peek(&caller).await.unwrap();
    assert!(peek.fallback && peek.used == 3, "{peek:?}");
    assert!(
        closed.check(&caller, 1).await.is_err(),
        "closed: the error comes back"
    );
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "every call kept to its deadline: {:?}",
        started.elapsed()
    );
}
