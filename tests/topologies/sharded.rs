//! Application sharding: each caller on one shard, writes to its primary,
//! peeks from its replica, rejections from the one call that decided them.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http::request::Parts;
use tower::ServiceExt;

use crate::load::{app, CALLER};
use crate::support::conformance::T0;
use crate::support::redis::{
    as_served, replicas_run_scripts, unique_prefix, wait_for_replication, RedisServer,
};
use crate::{redis_key, reset_stats, script_calls, shared_shards, Pair};
use tollgate::clock::ManualClock;
use tollgate::store::Shard;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut server.conn())
        .unwrap()
        == 1
}

#[tokio::test]
async fn every_caller_lives_on_exactly_one_shard_and_both_shards_get_callers() {
    let pairs = shared_shards();
    let prefix = unique_prefix("spread");
    let store = RedisStore::sharded([pairs[0].shard("a"), pairs[1].shard("b")])
        .connect()
        .await
        .unwrap()
        .prefix(&prefix)
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()))
        .and(Quota::per_hour(NonZeroU32::new(50).unwrap()));
    let mut on = [0usize; 2];
    for i in 0..200 {
        let caller = format!("caller-{i}");
        assert!(
            store
                .check(&policy, &Key::new(&caller), 1)
                .await
                .unwrap()
                .allowed
        );
        let homes: Vec<usize> = (0..2)
            .filter(|&s| exists(&pairs[s].primary, &redis_key(&prefix, "core", &caller, 0)))
            .collect();
        assert_eq!(homes.len(), 1, "{caller} is on shards {homes:?}");
        // Both quota keys of one decision are on the same shard.
        assert!(exists(
            &pairs[homes[0]].primary,
            &redis_key(&prefix, "core", &caller, 1)
        ));
        on[homes[0]] += 1;
    }
    // 200 callers, each shard 100 ± 3 sigma (about 21).
    assert!(on.iter().all(|&n| (75..=125).contains(&n)), "{on:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_is_one_call_to_the_primary_and_a_peek_one_call_to_a_replica() {
    let pair = tokio::task::block_in_place(Pair::start);
    let clock = ManualClock::new(T0);
    let prefix = unique_prefix("one-call");
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::sharded([pair.shard("only")])
            .read_from_replicas(true)
            .connect()
            .await
            .unwrap()
            .prefix(&prefix)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(2).unwrap()));
    let app = app(store.clone(), policy.clone(), Duration::from_millis(500));
    let request = || {
        Request::get("/")
            .header(CALLER, "greedy")
            .body(Body::empty())
            .unwrap()
    };
    for _ in 0..2 {
        assert_eq!(
            app.clone().oneshot(request()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    // Warm the replica's script cache, then count from zero.
    store.peek(&policy, &Key::new("greedy")).await.unwrap();
    tokio::task::block_in_place(|| {
        wait_for_replication(&pair.primary, &pair.replica);
        reset_stats(&pair.primary);
        reset_stats(&pair.replica);
    });

    let limited = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(limited.headers()["x-ratelimit-used"], "2");
    let reset: u64 = limited.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(reset, (T0 + 60_000_000).div_ceil(1_000_000));
    assert_eq!(
        script_calls(&pair.primary).into_iter().collect::<Vec<_>>(),
        [("evalsha".to_owned(), 1)],
        "the 429 and its headers come from one script call on the primary"
    );
    assert!(script_calls(&pair.replica).is_empty());

    // GET /rate_limit's peek: one read-only call, on the replica.
    let layer_peek = tollgate::RateLimitLayer::builder()
        .policy(policy.clone())
        .shared_store(store.clone())
        .key(|parts: &Parts| Ok(Key::new(parts.headers[CALLER].to_str().unwrap())))
        .build()
        .unwrap();
    let (parts, ()) = Request::get("/")
        .header(CALLER, "greedy")
        .body(())
        .unwrap()
        .into_parts();
    let seen = layer_peek.peek(&parts).await.unwrap();
    assert_eq!((seen.used, seen.remaining), (2, 0));
    if replicas_run_scripts() {
        assert_eq!(
            script_calls(&pair.replica).into_iter().collect::<Vec<_>>(),
            [("evalsha_ro".to_owned(), 1)]
        );
        assert_eq!(script_calls(&pair.primary).get("evalsha"), Some(&1));
    } else {
        // Before 7.0 the peek is a plain `EVALSHA`, which only a primary runs.
        assert!(script_calls(&pair.replica).is_empty());
        assert_eq!(script_calls(&pair.primary).get("evalsha"), Some(&2));
    }

    // After the window's end by the store's clock, with the key still alive
    // on the replica, the replica reports a fresh window.
    clock.advance(Duration::from_secs(61));
    assert!(exists(
        &pair.replica,
        &redis_key(&prefix, "core", "greedy", 0)
    ));
    let fresh = store.peek(&policy, &Key::new("greedy")).await.unwrap();
    assert_eq!((fresh.used, fresh.remaining), (0, 2), "{fresh:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_falls_back_to_the_primary_when_the_replica_is_down() {
    let (primary, dead_url) = tokio::task::block_in_place(|| {
        let primary = RedisServer::start();
        let mut gone = RedisServer::start();
        let url = gone.url();
        gone.stop();
        (primary, url)
    });
    let store = RedisStore::sharded([Shard::new("a", primary.url()).replica(dead_url)])
        .read_from_replicas(true)
        .connect()
        .await
        .expect("a replica that is down does not stop the store")
        .prefix(unique_prefix("fallback"))
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(3).unwrap()));
    let key = Key::new("k");
    assert!(store.check(&policy, &key, 1).await.unwrap().allowed);
    for _ in 0..3 {
        let seen = store.peek(&policy, &key).await.unwrap();
        assert_eq!(seen.used, 1, "{seen:?}");
    }
    let read_only = as_served(&[("evalsha_ro", 1)]);
    let command = read_only.keys().next().unwrap();
    assert!(script_calls(&primary).contains_key(command));
}

#[tokio::test]
async fn a_bad_shard_list_is_refused_when_connecting() {
    let url = shared_shards()[0].primary.url();
    for shards in [
        vec![],
        vec![Shard::new("a", url.clone()), Shard::new("a", url.clone())],
        vec![Shard::new("", url.clone())],
        vec![Shard::new("a", "not a url")],
    ] {
        assert!(RedisStore::sharded(shards).connect().await.is_err());
    }
}

/// On one thread, as the zoo runs with one core: every decision queues
/// before the batching task looks.
#[tokio::test]
async fn concurrent_decisions_are_batched_per_shard_and_keep_every_limit() {
    let pairs = [Pair::start(), Pair::start()];
    let store = Arc::new(
        RedisStore::sharded([pairs[0].shard("a"), pairs[1].shard("b")])
            .connect()
            .await
            .unwrap()
            .prefix(unique_prefix("batched"))
            .build()
            .unwrap(),
    );
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()));
    store.check(&policy, &Key::new("warm"), 1).await.unwrap();
    pairs.iter().for_each(|p| reset_stats(&p.primary));
    let decisions: Vec<_> = (0..400)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            let caller = format!("caller-{}", i % 20);
            tokio::spawn(async move {
                let d = store.check(&policy, &Key::new(&caller), 1).await.unwrap();
                (caller, d.allowed)
            })
        })
        .collect();
    let mut admitted = std::collections::BTreeMap::new();
    for d in decisions {
        let (caller, allowed) = d.await.unwrap();
        *admitted.entry(caller).or_insert(0) += u32::from(allowed);
    }
    assert_eq!(admitted.len(), 20);
    assert!(admitted.values().all(|&n| n == 5), "{admitted:?}");
    let calls: u64 = pairs
        .iter()
        .flat_map(|p| script_calls(&p.primary).into_values())
        .sum();
    println!("400 concurrent decisions over 2 shards: {calls} script calls");
    assert!(calls <= 40, "{calls} script calls for 400 decisions");
}
