//! Round trips: one script call per decision and per refund, the
//! pre-check's read-only calls, and no extra command from a pool.

use std::num::NonZeroU32;

use tollgate::{Key, Policy, Quota, RedisStore, Store};

use crate::common::*;
use crate::support::redis::{as_served, client_calls, command_calls, reset_stats, RedisServer};

#[tokio::test]
async fn one_decision_is_one_evalsha_and_one_refund_is_one_evalsha() {
    let server = RedisServer::start();
    let store = store_on(&server.url(), "rt").await;
    let policy = Policy::fixed_window("core", per_minute(1000))
        .and(Quota::per_hour(NonZeroU32::new(5000).unwrap()));
    let key = Key::new("bob");
    // First use of each script loads it (NOSCRIPT, SCRIPT LOAD, retry).
    let warm = store.check(&policy, &key, 1).await.unwrap();
    store.refund(&policy, &key, &warm.receipt).await.unwrap();
    store.peek(&policy, &key).await.unwrap();

    reset_stats(&server);
    let mut receipts = Vec::new();
    for _ in 0..100 {
        receipts.push(store.check(&policy, &key, 1).await.unwrap().receipt);
    }
    assert_eq!(client_calls(&server), [("evalsha".to_owned(), 100)].into());

    reset_stats(&server);
    for r in receipts.iter().take(10) {
        store.refund(&policy, &key, r).await.unwrap();
    }
    store.peek(&policy, &key).await.unwrap();
    assert_eq!(
        client_calls(&server),
        as_served(&[("evalsha", 10), ("evalsha_ro", 1)])
    );
}

#[tokio::test]
async fn every_strategy_decides_in_one_evalsha_and_refunds_in_one() {
    let server = RedisServer::start();
    let store = store_on(&server.url(), "rt").await;
    for (policy, _) in strategies() {
        let warm = store.check(&policy, &Key::new("warm"), 1).await.unwrap();
        store
            .refund(&policy, &Key::new("warm"), &warm.receipt)
            .await
            .unwrap();
        store.peek(&policy, &Key::new("warm")).await.unwrap();

        reset_stats(&server);
        let mut passes = Vec::new();
        for i in 0..10 {
            let key = Key::new(format!("k{i}"));
            let d = store.check(&policy, &key, 1).await.unwrap();
            assert!(d.allowed, "{}: {d:?}", policy.name());
            passes.push((key, d.receipt));
        }
        let name = policy.strategy().as_str();
        assert_eq!(
            client_calls(&server),
            [("evalsha".to_owned(), 10)].into(),
            "{name}"
        );

        reset_stats(&server);
        for (key, receipt) in &passes {
            store.refund(&policy, key, receipt).await.unwrap();
        }
        store.peek(&policy, &passes[0].0).await.unwrap();
        assert_eq!(
            client_calls(&server),
            as_served(&[("evalsha", 10), ("evalsha_ro", 1)]),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_deadpool_pool_adds_no_ping_per_decision() {
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let store = RedisStore::from_pool(pool).prefix("pool").build().unwrap();
    let policy = Policy::fixed_window("core", per_minute(1000));
    store.check(&policy, &Key::new("warm"), 1).await.unwrap();

    reset_stats(&server);
    for i in 0..50 {
        store
            .check(&policy, &Key::new(format!("k{i}")), 1)
            .await
            .unwrap();
    }
    assert_eq!(client_calls(&server), [("evalsha".to_owned(), 50)].into());
}

/// Script calls that failed (`failed_calls` and `rejected_calls` of the
/// `eval*` commands in `INFO commandstats`): a read-only script that tried
/// to write would be one.
fn failed_script_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval"))
        .flat_map(|l| l.split(','))
        .filter_map(|kv| {
            kv.strip_prefix("failed_calls=")
                .or_else(|| kv.strip_prefix("rejected_calls="))
        })
        .map(|n| n.parse::<u64>().unwrap())
        .sum()
}

/// Commands that change data, as `INFO commandstats` names them.
const WRITES: &[&str] = &[
    "set",
    "hset",
    "hincrby",
    "pexpire",
    "zadd",
    "zremrangebyscore",
    "del",
];

#[tokio::test]
async fn a_pre_check_alone_decides_a_rejection_and_never_writes() {
    let server = RedisServer::start();
    let store = RedisStore::from_manager(
        redis::Client::open(server.url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap(),
    )
    .prefix("pre")
    .pre_check(true)
    .build()
    .unwrap();
    let policies = one_policy_per_strategy();
    for policy in &policies {
        let name = policy.strategy().as_str();
        // Load both scripts first: the counts below are of decisions alone.
        store.check(policy, &Key::new("warm"), 1).await.unwrap();
        store.peek(policy, &Key::new("warm")).await.unwrap();
        reset_stats(&server);

        let key = Key::new("k");
        let mut passes = 0;
        let rejected = loop {
            let d = store.check(policy, &key, 1).await.unwrap();
            if !d.allowed {
                break d;
            }
            passes += 1;
            assert!(passes <= 3, "{name}: {d:?}");
        };
        assert_eq!(rejected.remaining, 0, "{name}: {rejected:?}");
        assert!(rejected.retry_after.is_some(), "{name}: {rejected:?}");
        let expected = if name == "concurrency" {
            // Its rejections end with any response: the primary decides.
            as_served(&[("evalsha", passes + 1)])
        } else {
            as_served(&[("evalsha", passes), ("evalsha_ro", passes + 1)])
        };
        assert_eq!(client_calls(&server), expected, "{name}");
        assert_eq!(failed_script_calls(&server), 0, "{name}");

        // Rejections after that are one read-only call that writes nothing.
        reset_stats(&server);
        let again = store.check(policy, &key, 1).await.unwrap();
        assert!(!again.allowed, "{name}");
        assert_eq!(
            (again.limit, again.used, again.reset_at_micros),
            (rejected.limit, rejected.used, rejected.reset_at_micros),
            "{name}"
        );
        if name != "concurrency" {
            let calls = command_calls(&server);
            let read_only = as_served(&[("evalsha_ro", 1)]);
            assert_eq!(
                client_calls(&server),
                read_only,
                "{name}: one read-only call, nothing else: {calls:?}"
            );
            let wrote: Vec<_> = calls
                .keys()
                .filter(|c| WRITES.contains(&c.as_str()))
                .collect();
            assert!(wrote.is_empty(), "{name} wrote {wrote:?}");
        }
    }
}
