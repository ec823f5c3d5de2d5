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
