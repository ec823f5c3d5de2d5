//! Expiry: every key written expires once its state stops mattering, and
//! the scores Redis time builds are whole microseconds.

use std::time::Duration;

use redis::Commands;
use tollgate::{Key, Policy, Quota, Store};

use crate::common::*;
use crate::support::redis::{shared_url, unique_prefix};

#[tokio::test]
async fn every_key_written_has_an_expiry_one_second_past_its_window() {
    let url = shared_url();
    let prefix = unique_prefix("ttl");
    let store = store_on(&url, &prefix).await;
    let policy = Policy::fixed_window("core", Quota::new(5, Duration::from_secs(10)).unwrap())
        .and(per_minute(20));
    for i in 0..20 {
        let key = Key::new(format!("caller{}", i % 7));
        let d = store.check(&policy, &key, 1).await.unwrap();
        if i % 3 == 0 && d.allowed {
            store.refund(&policy, &key, &d.receipt).await.unwrap();
        }
    }
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = conn
        .scan_match(format!("{prefix}:*"))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(keys.len(), 14, "7 callers x 2 quotas: {keys:?}");
    for key in keys {
        let ttl: i64 = conn.pttl(&key).unwrap();
        let window_ms = if key.ends_with(":0") { 10_000 } else { 60_000 };
        assert!(
            ttl > window_ms - 1_000 && ttl <= window_ms + 1_000,
            "{key} has PTTL {ttl}"
        );
    }
}

/// Every key under `prefix`, with its PTTL in ms.
fn ttls(url: &str, prefix: &str) -> Vec<(String, i64)> {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = conn
        .scan_match(format!("{prefix}:*"))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    keys.into_iter()
        .map(|k| {
            let ttl: i64 = conn.pttl(&k).unwrap();
            (k, ttl)
        })
        .collect()
}

#[tokio::test]
async fn consumer_keys_get_an_expiry() {
    // Regression: published sliding logs expire the resource's key but write
    // consumer keys without expiry, so memory grows with every caller ever
    // seen. Here both expire one second after their newest entry leaves the
    // window (on Redis TIME, as in production).
    let url = shared_url();
    let prefix = unique_prefix("logttl");
    let store = store_on(&url, &prefix).await;
    let policy = Policy::sliding_log(
        "tigerfeeding",
        per_minute(100),
        Quota::new(3, Duration::from_secs(10)).unwrap(),
    );
    for i in 0..21 {
        let key = Key::new(format!("caller{}", i % 7));
        let d = store.check(&policy, &key, 1).await.unwrap();
        if i % 5 == 0 && d.allowed {
            store.refund(&policy, &key, &d.receipt).await.unwrap();
        }
    }
    let keys = ttls(&url, &prefix);
    assert_eq!(keys.len(), 8, "the resource and 7 consumers: {keys:?}");
    for (key, ttl) in keys {
        let window_ms = if key.ends_with(":resource") {
            60_000
        } else {
            10_000
        };
        assert!(
            ttl > window_ms - 1_000 && ttl <= window_ms + 1_000,
            "{key} has PTTL {ttl}"
        );
    }
}

#[tokio::test]
async fn every_key_of_every_strategy_has_an_expiry() {
    let url = shared_url();
    let prefix = unique_prefix("allttl");
    let store = store_on(&url, &prefix).await;
    for (policy, longest) in strategies() {
        for i in 0..30 {
            let key = Key::new(format!("caller{}", i % 7));
            let d = store.check(&policy, &key, 1 + i % 3).await.unwrap();
            if i % 4 == 0 && d.allowed {
                store.refund(&policy, &key, &d.receipt).await.unwrap();
            }
        }
        let name = policy.strategy().as_str();
        let keys: Vec<_> = ttls(&url, &prefix)
            .into_iter()
            .filter(|(k, _)| k.contains(&format!(":{name}:")))
            .collect();
        assert!(!keys.is_empty(), "{name} wrote no key");
        for (key, ttl) in keys {
            assert!(ttl > 0 && ttl <= longest, "{key} has PTTL {ttl}");
        }
    }
}

#[tokio::test]
async fn sliding_log_scores_do_not_concatenate_seconds_and_micros() {
    // Regression: published logs build the score by gluing TIME's seconds
    // and microseconds together as strings, so 5,000 µs (four digits) gives
    // 17000000005000 instead of 1700000000005000. Redis TIME cannot be set,
    // so the real script runs here under a `redis` whose TIME answers
    // 1700000000 s and 5000 µs; every other command goes to Redis.
    let shim = "local real = redis\n\
        local redis = setmetatable({ call = function(cmd, ...)\n\
          if cmd == 'TIME' then return {'1700000000', '5000'} end\n\
          return real.call(cmd, ...)\n\
        end }, { __index = real })\n";
    // A charge, after the helpers the store puts first (lua/prelude.lua):
    // the store passes the script `dry_run` false (lua/timed.lua).
    let source = format!(
        "{shim}{}local dry_run = false\n{}",
        include_str!("../../lua/prelude.lua"),
        include_str!("../../lua/sliding_log.lua")
    );
    let prefix = unique_prefix("concat");
    let keys = [
        format!("{prefix}:{{log}}:resource"),
        format!("{prefix}:{{log}}:consumer:bob"),
    ];
    let mut conn = redis::Client::open(shared_url())
        .unwrap()
        .get_connection()
        .unwrap();
    // now = -1 (Redis TIME), cost 1, request id 42, 100 and 3 per 10 s.
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(source)
        .arg(2)
        .arg(&keys)
        .arg(&["-1", "1", "42", "100", "10000000", "3", "10000000"])
        .query(&mut conn)
        .unwrap();
    assert_eq!(reply[0], 1, "allowed: {reply:?}");
    assert_eq!(reply[5], 1_700_000_000_005_000, "now, in µs");
    for key in &keys {
        let score: Option<f64> = conn.zscore(key, "1700000000005000:42:0").unwrap();
        assert_eq!(score, Some(1_700_000_000_005_000.0), "{key}");
        let _: () = conn.del(key).unwrap();
    }
}
