//! The pre-check: a replica answers "would this fit?" with the read-only
//! twin of the script, the primary charges only what the replica admits.
//! Rejections then cost the primary nothing, their headers come from the one
//! reply that decided them, and the primary alone ever admits.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

use crate::load::{app, CALLER};
use crate::support::conformance::T0;
use crate::support::redis::{
    key_slot, replicas_run_scripts, unique_prefix, wait_for_replication, SentinelSet,
};
use crate::{reset_stats, script_calls, shared_cluster, Pair};
use tollgate::clock::ManualClock;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

/// `evalsha_ro` plus `eval_ro` (a node that had not cached the script).
fn read_only_calls(calls: &std::collections::BTreeMap<String, u64>) -> u64 {
    calls.get("evalsha_ro").copied().unwrap_or(0) + calls.get("eval_ro").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_rejections_are_decided_by_the_replica_and_passes_charged_on_the_primary() {
    if !replicas_run_scripts() {
        // Before Redis 7.0 no replica runs a script: the pre-check goes to
        // the primary (`a_pre_check_alone_decides_a_rejection_and_never_writes`
        // in tests/redis_store.rs pins that on every server).
        return;
    }
    let pair = tokio::task::block_in_place(Pair::start);
    let clock = ManualClock::new(T0);
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::sharded([pair.shard("only")])
            .read_from_replicas(true)
            .connect()
            .await
            .unwrap()
            .prefix(unique_prefix("pre-sharded"))
            .clock(clock.clone())
            .pre_check(true)
            .build()
            .unwrap(),
    );
    let policy = Policy::fixed_window("core", per_minute(2));
    let app = app(store.clone(), policy.clone(), Duration::from_millis(500));
    let request = || {
        Request::get("/")
            .header(CALLER, "greedy")
            .body(Body::empty())
            .unwrap()
    };
    // Both servers load their script first; the counts are of decisions.
    store.check(&policy, &Key::new("warm"), 1).await.unwrap();
    tokio::task::block_in_place(|| {
        reset_stats(&pair.primary);
        reset_stats(&pair.replica);
    });

    for _ in 0..2 {
        let passed = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(passed.status(), StatusCode::OK);
    }
    assert_eq!(
        script_calls(&pair.primary).into_iter().collect::<Vec<_>>(),
        [("evalsha".to_owned(), 2)],
        "each pass is charged once, on the primary"
    );
    assert_eq!(
        script_calls(&pair.replica).into_iter().collect::<Vec<_>>(),
        [("evalsha_ro".to_owned(), 2)],
        "each pass was pre-checked on the replica"
    );

    tokio::task::block_in_place(|| {
        wait_for_replication(&pair.primary, &pair.replica);
        reset_stats(&pair.primary);
        reset_stats(&pair.replica);
    });
    for _ in 0..3 {
        let limited = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
        let headers = limited.headers();
        assert_eq!(headers["x-ratelimit-limit"], "2");
        assert_eq!(headers["x-ratelimit-remaining"], "0");
        assert_eq!(headers["x-ratelimit-used"], "2");
        assert_eq!(
            headers["x-ratelimit-reset"],
            (T0 + 60_000_000).div_ceil(1_000_000).to_string().as_str()
        );
        assert_eq!(headers["retry-after"], "60");
    }
    assert!(
        script_calls(&pair.primary).is_empty(),
        "rejections never reach the primary: {:?}",
        script_calls(&pair.primary)
    );
    assert_eq!(
        script_calls(&pair.replica).into_iter().collect::<Vec<_>>(),
        [("evalsha_ro".to_owned(), 3)],
        "each 429 and its headers come from one read-only call"
    );

    // A window that ended by the store's clock is empty on the replica, whose
    // copy of the key has not expired: the pre-check admits, the primary
    // charges.
    clock.advance(Duration::from_secs(61));
    let again = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["x-ratelimit-remaining"], "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_pre_checks_never_admits_past_the_limit_across_app_servers() {
    if !replicas_run_scripts() {
        // Before Redis 7.0 no replica runs a script: the pre-check goes to
        // the primary (`a_pre_check_alone_decides_a_rejection_and_never_writes`
        // in tests/redis_store.rs pins that on every server).
        return;
    }
    let cluster = shared_cluster();
    let prefix = unique_prefix("pre-cluster");
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::cluster(cluster.urls())
            .read_from_replicas(true)
            .connect()
            .await
            .unwrap()
            .prefix(&prefix)
            .pre_check(true)
            .build()
            .unwrap();
        stores.push(Arc::new(store));
    }
    let policy = Policy::fixed_window("core", per_minute(20));
    let crowd = Key::new("crowd");
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (store, policy, key) = (stores[i % 2].clone(), policy.clone(), crowd.clone());
        tasks.push(tokio::spawn(async move {
            store.check(&policy, &key, 1).await.unwrap()
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        let decision = task.await.unwrap();
        if decision.allowed {
            admitted += 1;
        } else {
            assert_eq!(decision.remaining, 0, "{decision:?}");
        }
    }
    assert_eq!(admitted, 20, "two app servers, 200 concurrent requests");

    // Once the replica has the spent window, rejections are its alone.
    let slot = key_slot(&format!("{{core|{}}}", crowd.as_str()));
    let primary = cluster.node_for_slot(slot);
    let (primary, replica) = (&cluster.nodes()[primary], &cluster.nodes()[primary + 3]);
    tokio::task::block_in_place(|| wait_for_replication(primary, replica));
    let before = read_only_calls(&script_calls(replica));
    for store in &stores {
        for _ in 0..10 {
            assert!(!store.check(&policy, &crowd, 1).await.unwrap().allowed);
        }
    }
    let after = read_only_calls(&script_calls(replica));
    assert!(
        after - before >= 20,
        "20 rejections, {} read-only calls on the replica",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_peeks_and_pre_checks_go_to_a_replica() {
    if !replicas_run_scripts() {
        // Before Redis 7.0 no replica runs a script: the pre-check goes to
        // the primary (`a_pre_check_alone_decides_a_rejection_and_never_writes`
        // in tests/redis_store.rs pins that on every server).
        return;
    }
    let (pair, sentinels) = tokio::task::block_in_place(|| {
        let pair = Pair::start();
        let sentinels = SentinelSet::start(&pair.primary, &[&pair.replica], 3, "tg-reads");
        (pair, sentinels)
    });
    let store = RedisStore::sentinel(sentinels.urls(), sentinels.master_name())
        .read_from_replicas(true)
        .connect()
        .await
        .unwrap()
        .prefix(unique_prefix("pre-sentinel"))
        .pre_check(true)
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", per_minute(2));
    let key = Key::new("greedy");
    for _ in 0..2 {
        assert!(store.check(&policy, &key, 1).await.unwrap().allowed);
    }
    tokio::task::block_in_place(|| wait_for_replication(&pair.primary, &pair.replica));

    // The store connects to a replica when the sentinels list one: at once,
    // or within a watch round (250 ms) if they had not yet.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::task::block_in_place(|| {
            reset_stats(&pair.primary);
            reset_stats(&pair.replica);
        });
        let seen = store.peek(&policy, &key).await.unwrap();
        assert_eq!((seen.used, seen.remaining), (2, 0), "{seen:?}");
        if read_only_calls(&script_calls(&pair.replica)) == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "peeks never reached the replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(script_calls(&pair.primary).is_empty());

    tokio::task::block_in_place(|| reset_stats(&pair.replica));
    let rejected = store.check(&policy, &key, 1).await.unwrap();
    assert!(!rejected.allowed);
    assert_eq!((rejected.used, rejected.remaining), (2, 0));
    assert!(
        script_calls(&pair.primary).is_empty(),
        "the replica alone rejected"
    );
    assert_eq!(read_only_calls(&script_calls(&pair.replica)), 1);
}
