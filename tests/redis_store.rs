//! What only a real Redis can show: round trips, expiries, script reloads,
//! and what the layer does when Redis is gone or slow.

mod support;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use redis::Commands;
use support::redis::{
    client_calls, command_calls, reset_stats, shared_url, unique_prefix, RedisServer,
};
use tollgate::{
    FailurePolicy, Key, Policy, Quota, RateLimitLayer, Receipt, RedisStore, Store, StoreErrorKind,
};
use tower::ServiceExt;

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

async fn store_on(url: &str, prefix: &str) -> RedisStore {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    RedisStore::from_manager(conn)
        .prefix(prefix)
        .build()
        .unwrap()
}

/// One policy per strategy beyond the fixed window, with the longest a key
/// of it may live (ms): the moment its state stops mattering, plus 1 s.
fn strategies() -> Vec<(Policy, i64)> {
    let ten_secs = Quota::new(20, Duration::from_secs(10)).unwrap();
    vec![
        (
            // Costs go up to 3 below: closed for up to 3 spans.
            Policy::uniform_gate("gate", Duration::from_secs(10)).unwrap(),
            31_000,
        ),
        (
            Policy::sliding_log("log", per_minute(1000), ten_secs),
            61_000,
        ),
        (
            Policy::sliding_window("window", ten_secs).and(per_minute(1000)),
            121_000,
        ),
        (
            // One unit per 60 ms, 50 at once: full again within 3 s.
            Policy::gcra("gcra", per_minute(1000), NonZeroU32::new(50).unwrap()),
            4_000,
        ),
    ]
}

/// Blocks `server` for `secs` seconds (`DEBUG SLEEP` from another thread),
/// once the command has started.
async fn put_to_sleep(server: &RedisServer, secs: &'static str) -> std::thread::JoinHandle<()> {
    let url = server.url();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(secs)
            .query(&mut conn)
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    sleeper
}

/// One policy per strategy, small enough to exhaust in a few calls.
fn one_policy_per_strategy() -> [Policy; 7] {
    let three = NonZeroU32::new(3).unwrap();
    [
        Policy::fixed_window("fixed", per_minute(3)).and(per_minute(100)),
        Policy::sliding_window("window", per_minute(3)),
        Policy::sliding_log("log", per_minute(100), per_minute(3)),
        Policy::gcra("gcra", per_minute(3), three),
        Policy::uniform_gate("gate", Duration::from_secs(10)).unwrap(),
        Policy::leaky_bucket("leaky", per_minute(3), three),
        Policy::concurrency("concurrency", three, Duration::from_secs(60)).unwrap(),
    ]
}

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
        [("evalsha".to_owned(), 10), ("evalsha_ro".to_owned(), 1)].into()
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
            [("evalsha".to_owned(), 10), ("evalsha_ro".to_owned(), 1)].into(),
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
            [("evalsha".to_owned(), passes + 1)].into()
        } else {
            [
                ("evalsha".to_owned(), passes),
                ("evalsha_ro".to_owned(), passes + 1),
            ]
            .into()
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
            assert_eq!(calls.get("evalsha_ro"), Some(&1), "{name}: {calls:?}");
            assert!(!calls.contains_key("evalsha"), "{name}: {calls:?}");
            let wrote: Vec<_> = calls
                .keys()
                .filter(|c| WRITES.contains(&c.as_str()))
                .collect();
            assert!(wrote.is_empty(), "{name} wrote {wrote:?}");
        }
    }
}

async fn batching_store(url: &str, batching: bool) -> RedisStore {
    store_with(url, "batch", None, batching).await
}

/// A store on its own multiplexed connection, under `prefix`, on `clock`
/// if given, batching or not.
async fn store_with(
    url: &str,
    prefix: &str,
    clock: Option<&tollgate::ManualClock>,
    batching: bool,
) -> RedisStore {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let builder = RedisStore::from_connection(conn).prefix(prefix);
    let builder = match clock {
        Some(clock) => builder.clock(clock.clone()),
        None => builder,
    };
    builder.batching(batching).build().unwrap()
}

#[tokio::test]
async fn concurrent_decisions_share_script_calls_and_decide_as_if_alone() {
    let server = RedisServer::start();
    for batching in [true, false] {
        let store = std::sync::Arc::new(batching_store(&server.url(), batching).await);
        let policy = Policy::fixed_window(format!("crowd-{batching}"), per_minute(50));
        store.check(&policy, &Key::new("warm"), 1).await.unwrap();
        let decisions: Vec<_> = (0..200)
            .map(|_| {
                let (store, policy) = (store.clone(), policy.clone());
                tokio::spawn(async move { store.check(&policy, &Key::new("k"), 1).await })
            })
            .collect();
        reset_stats(&server);
        let mut used = Vec::new();
        for d in decisions {
            let d = d.await.unwrap().unwrap();
            if d.allowed {
                used.push(d.used);
            }
        }
        used.sort_unstable();
        assert_eq!(used, (1..=50).collect::<Vec<u64>>(), "batching {batching}");
        let calls: u64 = client_calls(&server)
            .iter()
            .filter(|(c, _)| c.starts_with("eval"))
            .map(|(_, n)| n)
            .sum();
        if batching {
            assert!(calls < 50, "200 concurrent decisions took {calls} calls");
        } else {
            assert_eq!(calls, 200);
        }
    }
}

#[tokio::test]
async fn every_strategy_decides_the_same_batched_or_alone() {
    let server = RedisServer::start();
    let clock = tollgate::ManualClock::new(1_800_000_000_000_000);
    let policies = one_policy_per_strategy();
    let mut outcomes = Vec::new();
    for batching in [false, true] {
        let prefix = format!("same-{batching}");
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        let mut seen = Vec::new();
        for policy in &policies {
            let decisions: Vec<_> = (0..20)
                .map(|i| {
                    let (store, policy) = (store.clone(), policy.clone());
                    let cost = 1 + i % 2;
                    tokio::spawn(async move { store.check(&policy, &Key::new("k"), cost).await })
                })
                .collect();
            let mut summary = Vec::new();
            for d in decisions {
                let d = d.await.unwrap().unwrap();
                summary.push((d.allowed, d.used, d.remaining, d.reset_at_micros));
            }
            summary.sort_unstable();
            seen.push((policy.strategy().as_str(), summary));
        }
        outcomes.push(seen);
    }
    assert_eq!(outcomes[0], outcomes[1]);
}

#[tokio::test]
async fn a_fixed_window_batch_touches_each_key_once_and_sets_its_expiry() {
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = Policy::fixed_window("flood", per_minute(10))
        .and(Quota::per_hour(NonZeroU32::new(100).unwrap()));
    store.check(&policy, &Key::new("warm"), 1).await.unwrap();
    reset_stats(&server);
    let decisions: Vec<_> = (0..40)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move { store.check(&policy, &Key::new("k"), 1).await })
        })
        .collect();
    let mut allowed = 0;
    for d in decisions {
        allowed += u32::from(d.await.unwrap().unwrap().allowed);
    }
    assert_eq!(allowed, 10);

    let calls = command_calls(&server);
    let scripts = calls.get("evalsha").copied().unwrap_or(0);
    let reads = calls.get("hmget").copied().unwrap_or(0);
    assert!(scripts < 40, "{calls:?}");
    assert!(
        reads <= 2 * scripts,
        "two keys, read once per call: {calls:?}"
    );

    let mut conn = server.conn();
    for (i, ttl_ms) in [(0, 61_000), (1, 3_601_000)] {
        let key = format!("batch:{{flood|k}}:fixed_window:{i}");
        let count: u64 = conn.hget(&key, "c").unwrap();
        assert_eq!(count, 10, "{key}");
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl_ms - 2_000 < pttl && pttl <= ttl_ms, "{key}: {pttl} ms");
    }
}

/// Every key under `prefix` (the prefix cut off): what it holds, and its
/// expiry in ms (-1: none), so two runs' states can be compared.
fn key_states(server: &RedisServer, prefix: &str) -> Vec<(String, String, i64)> {
    let mut conn = server.conn();
    let mut names: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let kind: String = redis::cmd("TYPE").arg(&name).query(&mut conn).unwrap();
            let value = match kind.as_str() {
                "string" => conn.get::<_, String>(&name).unwrap(),
                "hash" => {
                    let fields: std::collections::BTreeMap<String, String> =
                        conn.hgetall(&name).unwrap();
                    format!("{fields:?}")
                }
                other => panic!("{name}: unexpected type {other}"),
            };
            let pttl: i64 = redis::cmd("PTTL").arg(&name).query(&mut conn).unwrap();
            (name[prefix.len()..].to_owned(), value, pttl)
        })
        .collect()
}

#[tokio::test]
async fn batched_decisions_read_and_write_each_key_once_and_leave_what_lone_ones_do() {
    let server = RedisServer::start();
    let three = NonZeroU32::new(3).unwrap();
    let policies = [
        Policy::gcra("gcra", per_minute(6), three),
        Policy::sliding_window("window", per_minute(10)).and(per_minute(100)),
        // One quota: lua/sliding_window_batch.lua's path without tables.
        Policy::sliding_window("one", per_minute(10)),
        // Two quotas as full as each other in the first round (the 60 s
        // one's previous window weighs 1, the 120 s one's current holds the
        // same 1): a pass reports the first, the tie broken as alone.
        Policy::sliding_window("tie", per_minute(10))
            .and(Quota::new(10, Duration::from_secs(120)).unwrap()),
        Policy::leaky_bucket("leaky", per_minute(6), three),
    ];
    let n = policies.len() as u64;
    let rounds = [61, 31, 150, 125];
    let (mut states, mut decisions_seen) = (Vec::new(), Vec::new());
    for batching in [false, true] {
        let prefix = format!("state-{batching}");
        let clock = tollgate::ManualClock::new(1_800_000_000_000_000);
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        for policy in &policies {
            // Warm: scripts loaded, and a key that already holds state.
            store.check(policy, &Key::new("k"), 1).await.unwrap();
        }
        reset_stats(&server);
        let mut seen = Vec::new();
        // The rounds, at these seconds after the warm-up: the first rolls "k"'s
        // window over; the second runs on a clock set back 30 s, before the
        // windows the first one opened (a stored window later than now's
        // stays current); the third, half-way into the window after, where
        // the previous window, full, still weighs half; the last, set back
        // to where it weighs more, so more is used than the limit.
        for secs in rounds {
            clock.set(1_800_000_000_000_000 + secs * 1_000_000);
            for policy in &policies {
                let decisions: Vec<_> = (0..24)
                    .map(|i| {
                        let (store, policy) = (store.clone(), policy.clone());
                        // The first few go out alone; then "k" and a new caller,
                        // first seen inside a batch, with mixed costs: a look
                        // (0) and one no quota can ever take among them.
                        let key = match i {
                            0..4 => format!("alone{i}"),
                            _ if i % 3 == 0 => "new".to_owned(),
                            _ => "k".to_owned(),
                        };
                        let cost = match i {
                            7 => 0,
                            8 => 11,
                            _ => 1 + i % 2,
                        };
                        tokio::spawn(
                            async move { store.check(&policy, &Key::new(key), cost).await },
                        )
                    })
                    .collect();
                for d in decisions {
                    // Every field: the reported quota and the refund stamps too.
                    seen.push(d.await.unwrap().unwrap());
                }
            }
        }
        let calls = command_calls(&server);
        let scripts = calls.get("evalsha").copied().unwrap_or(0);
        let reads =
            calls.get("get").copied().unwrap_or(0) + calls.get("hmget").copied().unwrap_or(0);
        if batching {
            assert!(
                scripts < rounds.len() as u64 * n * 24,
                "the decisions went out together: {calls:?}"
            );
            // Each call reads each of its keys at most once.
            assert!(reads <= 3 * scripts, "{calls:?}");
            assert!(reads < rounds.len() as u64 * n * 24 / 2, "{calls:?}");
        } else {
            assert_eq!(scripts, rounds.len() as u64 * n * 24, "{calls:?}");
        }
        states.push(key_states(&server, &prefix));
        decisions_seen.push(seen);
    }
    // Decision by decision, in the order they were sent (a batch keeps it).
    assert_eq!(decisions_seen[0], decisions_seen[1]);
    let passes = decisions_seen[1].iter().filter(|d| d.allowed).count();
    assert!(
        (60..rounds.len() * policies.len() * 24).contains(&passes),
        "{passes} passes"
    );
    let (alone, batched) = (&states[0], &states[1]);
    assert_eq!(alone.len(), batched.len(), "{alone:?}\n{batched:?}");
    // Six callers per policy, two keys each for the two-quota windows.
    assert_eq!(alone.len(), 6 * (1 + 2 + 1 + 2 + 1), "{alone:?}");
    for (a, b) in alone.iter().zip(batched) {
        assert_eq!((&a.0, &a.1), (&b.0, &b.1));
        // Expiries are set from Redis's own clock, a few ms apart.
        assert!(a.2 > 0 && (a.2 - b.2).abs() < 500, "{a:?} {b:?}");
    }
}

#[tokio::test]
async fn a_policy_of_three_hundred_quotas_decides_in_a_batch_as_alone() {
    // A pass replies with 307 integers: more than a byte can count.
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = (1..300).fold(Policy::fixed_window("many", per_minute(5)), |p, i| {
        p.and(per_minute(5 + i))
    });
    store.check(&policy, &Key::new("warm"), 1).await.unwrap();
    reset_stats(&server);
    let decisions: Vec<_> = (0..12)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move { store.check(&policy, &Key::new("k"), 1).await })
        })
        .collect();
    let mut used = Vec::new();
    for d in decisions {
        let d = d.await.unwrap().unwrap();
        assert_eq!(d.allowed, used.len() < 5, "{d:?}");
        if d.allowed {
            assert_eq!(d.receipt.stamps().len(), 300);
            used.push(d.used);
        }
    }
    assert_eq!(used, [1, 2, 3, 4, 5]);
    let calls = client_calls(&server);
    assert!(calls.get("evalsha").copied().unwrap_or(0) < 12, "{calls:?}");
}

#[tokio::test]
async fn a_decision_on_a_key_of_another_type_fails_alone_in_every_kind_of_batch() {
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let three = NonZeroU32::new(3).unwrap();
    let policies = [
        Policy::fixed_window("fixed", per_minute(100)),
        Policy::gcra("gcra", per_minute(100), three),
        Policy::sliding_window("window", per_minute(100)),
        Policy::leaky_bucket("leaky", per_minute(100), three),
        Policy::concurrency(
            "slots",
            NonZeroU32::new(100).unwrap(),
            Duration::from_secs(60),
        )
        .unwrap(),
    ];
    for policy in &policies {
        store.check(policy, &Key::new("warm"), 1).await.unwrap();
        let name = format!(
            "batch:{{{}|bad}}:{}:0",
            policy.name(),
            policy.strategy().as_str()
        );
        let _: () = server.conn().rpush(&name, "x").unwrap();
        reset_stats(&server);
        let decisions: Vec<_> = (0..21)
            .map(|i| {
                let (store, policy) = (store.clone(), policy.clone());
                // The bad key in the middle, and a good one used twice.
                let key = match i {
                    10 => "bad".to_owned(),
                    11 | 12 => "twice".to_owned(),
                    _ => format!("good{i}"),
                };
                tokio::spawn(async move { store.check(&policy, &Key::new(key), 1).await })
            })
            .collect();
        for (i, d) in decisions.into_iter().enumerate() {
            let d = d.await.unwrap();
            if i == 10 {
                assert_eq!(
                    d.unwrap_err().kind(),
                    StoreErrorKind::Rejected,
                    "{policy:?}"
                );
            } else {
                assert!(d.unwrap().allowed, "{policy:?} {i}");
            }
        }
        let calls = client_calls(&server);
        assert!(
            calls.get("evalsha").copied().unwrap_or(0) < 21,
            "the decisions went out together: {calls:?}"
        );
        let len: u64 = server.conn().llen(&name).unwrap();
        assert_eq!(len, 1, "{name} untouched");
    }
}

#[tokio::test]
async fn script_flush_is_recovered_without_a_failed_decision() {
    let server = RedisServer::start();
    let store = store_on(&server.url(), "flush").await;
    let policy = Policy::fixed_window("core", per_minute(10));
    let key = Key::new("bob");
    assert_eq!(store.check(&policy, &key, 1).await.unwrap().remaining, 9);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(store.check(&policy, &key, 1).await.unwrap().remaining, 8);
    let stats = client_calls(&server);
    assert_eq!(
        stats.get("script|load"),
        Some(&2),
        "loaded on first use and after the flush: {stats:?}"
    );
}

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
    let source = format!("{shim}{}", include_str!("../lua/sliding_log.lua"));
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

#[tokio::test]
async fn a_receipt_without_stamps_is_never_a_panic() {
    // Receipt::new is public: a refund may carry anything.
    let memory = tollgate::MemoryStore::new();
    let redis = store_on(&shared_url(), &unique_prefix("stampless")).await;
    for (policy, _) in strategies() {
        let key = Key::new("bob");
        for store in [&memory as &dyn Store, &redis] {
            store.check(&policy, &key, 1).await.unwrap();
            // Ok or a store error, never a panic or a changed decision.
            let _ = store.refund(&policy, &key, &Receipt::new(1, vec![])).await;
            let _ = store.refund(&policy, &key, &Receipt::new(2, vec![7])).await;
        }
        let (m, r) = (
            memory.peek(&policy, &key).await.unwrap(),
            redis.peek(&policy, &key).await.unwrap(),
        );
        assert_eq!(m.remaining, r.remaining, "{}", policy.name());
    }
}

#[tokio::test]
async fn a_key_of_the_wrong_type_is_a_store_error_not_a_panic() {
    let url = shared_url();
    let prefix = unique_prefix("wrongtype");
    let store = store_on(&url, &prefix).await;
    let policy = Policy::fixed_window("core", per_minute(10));
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = conn
        .set_ex(format!("{prefix}:{{core|bob}}:fixed_window:0"), "x", 60)
        .unwrap();
    let err = store.check(&policy, &Key::new("bob"), 1).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rejected, "{err}");
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(MockConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1234))))
}

async fn get_root(app: &Router) -> (axum::http::Response<Body>, Duration) {
    let started = Instant::now();
    let res = app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    (res, started.elapsed())
}

fn layer(store: RedisStore, failure: FailurePolicy) -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(Policy::fixed_window("core", per_minute(2)))
        .store(store)
        .deadline(Duration::from_millis(100))
        .on_store_failure(failure)
        .build()
        .unwrap()
}

#[tokio::test]
async fn redis_down_applies_each_failure_policy_without_hanging() {
    let mut server = RedisServer::start();
    let store = store_on(&server.url(), "down").await;
    server.stop();

    let open = app(layer(store.clone(), FailurePolicy::Open));
    let (res, took) = get_root(&open).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-fallback"], "open");
    assert!(res.headers().get("x-ratelimit-remaining").is_none());
    assert!(took < Duration::from_millis(500), "took {took:?}");

    let closed = app(layer(
        store.clone(),
        FailurePolicy::closed(Duration::from_millis(1500)),
    ));
    let (res, took) = get_root(&closed).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "2");
    assert!(took < Duration::from_millis(500), "took {took:?}");

    let local = app(layer(store, FailurePolicy::local()));
    for remaining in ["1", "0"] {
        let (res, _) = get_root(&local).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["x-ratelimit-fallback"], "local");
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
    }
    let (res, took) = get_root(&local).await;
    assert_eq!(
        res.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the local limit holds meanwhile"
    );
    assert!(took < Duration::from_millis(500), "took {took:?}");
}

#[tokio::test]
async fn a_redis_slower_than_the_deadline_applies_the_failure_policy() {
    let server = RedisServer::start();
    // `connect`'s own connection has no redis-rs response timeout: the
    // layer's deadline alone bounds the wait.
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let policy = Policy::fixed_window("core", per_minute(2));
    store.check(&policy, &Key::new("warm-up"), 1).await.unwrap(); // loads the script
    let app = app(layer(store.clone(), FailurePolicy::Open));
    assert_eq!(
        get_root(&app).await.0.headers()["x-ratelimit-remaining"],
        "1"
    );

    let sleeper = put_to_sleep(&server, "0.6").await;
    let (res, took) = get_root(&app).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-ratelimit-fallback"], "open");
    assert!(
        took < Duration::from_millis(300),
        "answered after the 100 ms deadline, not after Redis: {took:?}"
    );
    sleeper.join().unwrap();
    // The late reply is read and dropped; the connection goes on.
    let decision = store.check(&policy, &Key::new("after"), 1).await.unwrap();
    assert_eq!(decision.remaining, 1);
}

#[tokio::test]
async fn a_queued_decision_whose_request_gave_up_is_never_charged() {
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = Policy::fixed_window("core", per_minute(100));
    store.check(&policy, &Key::new("k"), 1).await.unwrap();

    let sleeper = put_to_sleep(&server, "0.3").await;
    // Four calls take every slot while Redis sleeps; the rest queue, and
    // their requests give up (as the layer's deadline would).
    let sent: Vec<_> = (0..4)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move { store.check(&policy, &Key::new("k"), 1).await })
        })
        .collect();
    tokio::task::yield_now().await;
    for _ in 0..10 {
        let gave_up = tokio::time::timeout(
            Duration::from_millis(10),
            store.check(&policy, &Key::new("k"), 1),
        )
        .await;
        assert!(gave_up.is_err(), "Redis is asleep: nothing can answer yet");
    }
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    sleeper.join().unwrap();
    let after = store.check(&policy, &Key::new("k"), 1).await.unwrap();
    assert_eq!(
        after.used, 6,
        "1 + 4 sent + this one; the 10 that gave up cost nothing"
    );
}

#[tokio::test]
async fn decisions_resume_after_a_redis_restart() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let policy = Policy::fixed_window("core", per_minute(100));
    let key = Key::new("bob");
    assert!(store.check(&policy, &key, 1).await.unwrap().allowed);

    server.stop();
    let err = store.check(&policy, &key, 1).await.unwrap_err();
    assert_ne!(err.kind(), StoreErrorKind::Protocol, "{err}");
    server.restart(); // an empty Redis: no keys, no scripts

    let deadline = Instant::now() + Duration::from_secs(5);
    let decision = loop {
        match store.check(&policy, &key, 1).await {
            Ok(d) => break d,
            Err(err) if Instant::now() < deadline => {
                tracing::debug!(%err, "still reconnecting");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("no decision 5 s after the restart: {err}"),
        }
    };
    assert!(decision.allowed);
    assert_eq!(
        decision.remaining, 99,
        "a fresh Redis starts a fresh window"
    );
}

#[tokio::test]
async fn batched_concurrency_checks_and_releases_leave_what_lone_ones_do() {
    let server = RedisServer::start();
    let policy = Policy::concurrency(
        "slots",
        NonZeroU32::new(5).unwrap(),
        Duration::from_secs(10),
    )
    .unwrap();
    // Seconds after the start, each round's second half 6 s later: a round
    // 4 s on, when the first's slots are held unless given back, and whose
    // second half finds the first's first half stale (a crashed server's,
    // left out and removed); one 11 s after it; one set back before the
    // last, on a clock that stepped back.
    let rounds = [0, 4, 15, 13];
    let (mut states, mut decisions_seen) = (Vec::new(), Vec::new());
    for batching in [false, true] {
        let prefix = format!("slots-{batching}");
        let clock = tollgate::ManualClock::new(1_800_000_000_000_000);
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        store.check(&policy, &Key::new("warm"), 1).await.unwrap();
        reset_stats(&server);
        // Each pass's id, by the order of its decision, so two runs' random
        // ids compare.
        let mut ids = Vec::new();
        let mut seen = Vec::new();
        for secs in rounds {
            clock.set(1_800_000_000_000_000 + secs * 1_000_000);
            let mut decisions = Vec::new();
            for i in 0..24 {
                if i == 12 {
                    // The first half on its way (four alone, the rest
                    // queued), the second half 6 s later: a batch then
                    // holds decisions at two times.
                    tokio::task::yield_now().await;
                    clock.set(1_800_000_000_000_000 + (secs + 6) * 1_000_000);
                }
                decisions.push({
                    let (store, policy) = (store.clone(), policy.clone());
                    let key = match i {
                        0..4 => format!("alone{i}"),
                        _ if i % 3 == 0 => "new".to_owned(),
                        _ => "k".to_owned(),
                    };
                    // A look (0), and one more than the limit among them.
                    let cost = match i {
                        7 => 0,
                        8 => 6,
                        _ => 1 + i % 2,
                    };
                    tokio::spawn(async move {
                        let d = store.check(&policy, &Key::new(&key), cost).await;
                        (key, d)
                    })
                });
            }
            let mut passed = Vec::new();
            for d in decisions {
                let (key, d) = d.await.unwrap();
                let mut d = d.unwrap();
                if !d.receipt.is_empty() {
                    passed.push((key, d.receipt.clone()));
                }
                // A look's pass carries an id too, though it holds nothing.
                if let Some(&id) = d.receipt.stamps().first() {
                    ids.push(id);
                    d.receipt = Receipt::new(d.receipt.cost(), vec![ids.len() as u64]);
                }
                seen.push(d);
            }
            // Every other pass gives its slots back, all at once.
            let releases: Vec<_> = passed
                .into_iter()
                .step_by(2)
                .map(|(key, receipt)| {
                    let (store, policy) = (store.clone(), policy.clone());
                    tokio::spawn(
                        async move { store.refund(&policy, &Key::new(key), &receipt).await },
                    )
                })
                .collect();
            for r in releases {
                r.await.unwrap().unwrap();
            }
        }
        let calls = command_calls(&server);
        let scripts = calls.get("evalsha").copied().unwrap_or(0);
        if batching {
            assert!(scripts < 4 * 24, "checks and releases batched: {calls:?}");
        } else {
            assert!(scripts > 4 * 24, "{calls:?}");
        }
        // Each key's members, scored, ids replaced by their decision's order.
        let mut conn = server.conn();
        let mut names: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
        names.sort();
        let state: Vec<_> = names
            .into_iter()
            .map(|name| {
                let members: Vec<(String, i64)> = conn.zrange_withscores(&name, 0, -1).unwrap();
                let mut members: Vec<(i64, String)> = members
                    .into_iter()
                    .map(|(member, score)| {
                        let (id, unit) = member.split_once(':').unwrap();
                        let id: u64 = id.parse().unwrap();
                        let order = ids.iter().position(|&i| i == id);
                        (score, format!("{order:?}:{unit}"))
                    })
                    .collect();
                members.sort();
                let pttl: i64 = redis::cmd("PTTL").arg(&name).query(&mut conn).unwrap();
                (name[prefix.len()..].to_owned(), members, pttl)
            })
            .collect();
        states.push(state);
        decisions_seen.push(seen);
    }
    for (i, (a, b)) in decisions_seen[0].iter().zip(&decisions_seen[1]).enumerate() {
        assert_eq!(a, b, "decision {i}");
    }
    let passes = decisions_seen[1].iter().filter(|d| d.allowed).count();
    let rejections = decisions_seen[1].len() - passes;
    assert!(passes > 30 && rejections > 10, "{passes} passes");
    let (alone, batched) = (&states[0], &states[1]);
    assert_eq!(alone.len(), batched.len(), "{alone:?}\n{batched:?}");
    // The held slots of "k", "new", the four lone callers and the warm-up.
    assert!(alone.len() >= 3, "{alone:?}");
    for (a, b) in alone.iter().zip(batched) {
        assert_eq!((&a.0, &a.1), (&b.0, &b.1));
        assert!(a.2 > 0 && (a.2 - b.2).abs() < 500, "{a:?} {b:?}");
    }
}
