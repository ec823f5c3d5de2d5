//! Sentinel: the store follows the primary through a failover, ordered
//! (`SENTINEL FAILOVER`) or forced (the primary killed).

use std::sync::Arc;
use std::time::Duration;

use crate::failover::{counting_policy, under_load};
use crate::support::redis::{unique_prefix, SentinelSet};
use crate::{reset_stats, script_calls, Pair, HEAVY};
use tollgate::{Key, RedisStore, Store};

async fn sentinel_store(sentinels: &SentinelSet) -> Arc<dyn Store> {
    Arc::new(
        RedisStore::sentinel(sentinels.urls(), sentinels.master_name())
            .timeouts(Duration::from_millis(500), Duration::from_millis(500))
            .connect()
            .await
            .unwrap()
            .prefix(unique_prefix("sentinel"))
            .build()
            .unwrap(),
    )
}

fn callers() -> Vec<String> {
    (0..16).map(|i| format!("s{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_load() {
    let _heavy = HEAVY.lock().await;
    let (pair, sentinels) = tokio::task::block_in_place(|| {
        let pair = Pair::start();
        let sentinels = SentinelSet::start(&pair.primary, &[&pair.replica], 3, "tg-ordered");
        (pair, sentinels)
    });
    let store = sentinel_store(&sentinels).await;
    // Unlike CLUSTER FAILOVER, Sentinel promotes the replica without first
    // pausing writes on the old primary, and names the new primary only
    // about a second later: whatever the old one takes meanwhile is thrown
    // away when it is demoted. No client can know earlier; `under_load`
    // measures and prints the loss.
    under_load(
        "sentinel: SENTINEL FAILOVER",
        store.clone(),
        callers(),
        || {
            let _: () = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(sentinels.master_name())
                .query(&mut sentinels.sentinels()[0].conn())
                .unwrap();
            let new = sentinels.wait_for_new_master(pair.primary.port());
            assert_eq!(new, pair.replica.port());
        },
    )
    .await;
    // The old primary stays writable until Sentinel demotes it, seconds
    // later; a store that kept writing there would have its charges thrown
    // away. Once the store's watcher (every 250 ms) has seen the switch,
    // every charge must reach the new primary and none the old.
    tokio::time::sleep(Duration::from_millis(300)).await;
    reset_stats(&pair.primary);
    reset_stats(&pair.replica);
    let policy = counting_policy();
    for caller in callers() {
        store.check(&policy, &Key::new(caller), 1).await.unwrap();
    }
    let charging = |server| {
        let calls = script_calls(server);
        calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0)
    };
    let (on_new, on_old) = (charging(&pair.replica), charging(&pair.primary));
    assert!(
        on_new > 0 && on_old == 0,
        "charging calls after the switch: {on_new} on the new primary, {on_old} on the old"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_primary_killed_under_load() {
    let _heavy = HEAVY.lock().await;
    let (mut pair, sentinels) = tokio::task::block_in_place(|| {
        let pair = Pair::start();
        let sentinels = SentinelSet::start(&pair.primary, &[&pair.replica], 3, "tg-killed");
        (pair, sentinels)
    });
    let store = sentinel_store(&sentinels).await;
    under_load("sentinel: primary killed", store, callers(), || {
        let old = pair.primary.port();
        pair.primary.stop();
        let new = sentinels.wait_for_new_master(old);
        assert_eq!(new, pair.replica.port());
    })
    .await;
}

/// Issue 41: a limit for every caller of an adjustable policy, set through
/// a store on the primary Sentinel names, judges every strategy's
/// decisions there, and a second store reads it from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_honours_a_policy_limit_on_every_strategy() {
    use std::num::NonZeroU32;
    use tollgate::{Override, Policy, PolicyLimit, Quota};

    let (pair, sentinels) = tokio::task::block_in_place(|| {
        let pair = Pair::start();
        let sentinels = SentinelSet::start(&pair.primary, &[&pair.replica], 1, "tg-limits");
        (pair, sentinels)
    });
    let _ = &pair;
    let prefix = unique_prefix("sentinel-limits");
    let on_sentinel = || async {
        RedisStore::sentinel(sentinels.urls(), sentinels.master_name())
            .connect()
            .await
            .unwrap()
            .prefix(&prefix)
            .build()
            .unwrap()
    };
    let (store, other) = (on_sentinel().await, on_sentinel().await);
    let one = Quota::per_minute(NonZeroU32::MIN);
    let ten = Quota::per_minute(NonZeroU32::new(10).unwrap());
    let policies = [
        Policy::fixed_window("s", one),
        Policy::aligned_window("s", one),
        Policy::sliding_window("s", one),
        Policy::sliding_log("s", ten, one),
        Policy::gcra("s", one, NonZeroU32::MIN),
        Policy::leaky_bucket("s", one, NonZeroU32::MIN),
        Policy::concurrency("s", NonZeroU32::MIN, Duration::from_secs(10)).unwrap(),
    ];
    for policy in policies {
        let policy = policy.adjustable();
        let limit = policy.quotas().iter().fold(None::<Override>, |o, q| {
            let q = Quota::new(10, q.window()).unwrap();
            Some(o.map_or(Override::new(q), |o| o.and(q)))
        });
        store
            .set_policy_limit(&policy, PolicyLimit::Limit, limit.as_ref())
            .await
            .unwrap();
        let judged = store.policy_in_force(&policy).expect("in force at once");
        let d = store.check(&judged, &Key::new("ann"), 1).await.unwrap();
        assert_eq!(
            (d.allowed, d.limit),
            (true, 10),
            "{}",
            policy.strategy().as_str()
        );
        let read = other.policy_limits(&policy).await.unwrap();
        assert_eq!(read.limit, limit, "read back from Redis");
    }
}
