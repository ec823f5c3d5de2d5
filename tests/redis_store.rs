//! What only a real Redis can show: round trips, expiries, script reloads,
//! and what the layer does when Redis is gone or slow.

mod support;

use std::collections::BTreeMap;
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
    as_served, client_calls, command_calls, reset_stats, script_loads, shared_url, unique_prefix,
    RedisServer,
};
use tollgate::decision::Receipt;
use tollgate::error::StoreErrorKind;
use tollgate::{
    Decision, FailurePolicy, Key, Policy, Quota, RateLimitLayer, RedisStore, Store, Strategy,
};
use tower::ServiceExt;

/// A concurrency limit of `limit` slots, each presumed crashed after a minute.
fn slots(name: &str, limit: u32) -> Policy {
    let limit = NonZeroU32::new(limit).unwrap();
    Policy::concurrency(name.to_owned(), limit, Duration::from_secs(60)).unwrap()
}

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
///
/// The thread connects first and says so; the 50 ms that follow then only
/// have to cover sending one command, not a connection's set-up as well,
/// which on a loaded machine can take most of them.
async fn put_to_sleep(server: &RedisServer, secs: &'static str) -> std::thread::JoinHandle<()> {
    let url = server.url();
    let (connected, ready) = tokio::sync::oneshot::channel();
    let sleeper = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        connected.send(()).unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(secs)
            .query(&mut conn)
            .unwrap();
    });
    ready.await.expect("the sleeper thread connects to Redis");
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

async fn batching_store(url: &str, batching: bool) -> RedisStore {
    store_with(url, "batch", None, batching).await
}

/// A store on its own multiplexed connection, under `prefix`, on `clock`
/// if given, batching or not.
///
/// The connection waits 10 s for an answer, not redis-rs's default 500 ms:
/// a batch of thousands of slots, or an answer behind a `DEBUG SLEEP`, can
/// take longer than that on a loaded machine, and nothing here tests the
/// client's own timeout.
async fn store_with(
    url: &str,
    prefix: &str,
    clock: Option<&tollgate::clock::ManualClock>,
    batching: bool,
) -> RedisStore {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    let conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
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
    let clock = tollgate::clock::ManualClock::new(1_800_000_000_000_000);
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
/// expiry in ms (-1: none), so two runs' states can be compared. A sliding
/// log's members, "<time>:<request id>:<unit>", are named by `ids` instead
/// (see [`request_ids`]), for request ids are random.
fn key_states(
    server: &RedisServer,
    prefix: &str,
    ids: &BTreeMap<u64, usize>,
) -> Vec<(String, String, i64)> {
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
                    let fields: BTreeMap<String, String> = conn.hgetall(&name).unwrap();
                    format!("{fields:?}")
                }
                "zset" => {
                    let members: Vec<(String, f64)> = conn.zrange_withscores(&name, 0, -1).unwrap();
                    let mut members: Vec<(u64, String)> = members
                        .into_iter()
                        .map(|(member, score)| {
                            // A log's "<time>:<id>:<unit>", a slot's "<id>:<unit>".
                            let parts: Vec<&str> = member.split(':').collect();
                            let (time, id, unit) = match parts[..] {
                                [time, id, unit] => (Some(time), id, unit),
                                [id, unit] => (None, id, unit),
                                _ => panic!("{name}: member {member}"),
                            };
                            let pass = id.parse().ok().and_then(|id: u64| ids.get(&id));
                            let pass = pass.unwrap_or_else(|| {
                                panic!("{name}: member {member} of no pass seen")
                            });
                            (score as u64, format!("{time:?}:pass {pass}:{unit}"))
                        })
                        .collect();
                    members.sort();
                    format!("{members:?}")
                }
                other => panic!("{name}: unexpected type {other}"),
            };
            let pttl: i64 = redis::cmd("PTTL").arg(&name).query(&mut conn).unwrap();
            (name[prefix.len()..].to_owned(), value, pttl)
        })
        .collect()
}

/// Each sliding-log pass's request id (its receipt's second stamp) by the
/// pass's place in `decisions`: the same in every run of the same decisions,
/// where the ids are random.
fn request_ids(decisions: &[(Strategy, Decision)]) -> BTreeMap<u64, usize> {
    let mut ids = BTreeMap::new();
    for (i, (strategy, d)) in decisions.iter().enumerate() {
        if *strategy == Strategy::SlidingLog && d.allowed {
            let id = d.receipt.stamps()[1];
            assert!(ids.insert(id, i).is_none(), "request id {id} twice");
        }
    }
    ids
}

/// `decisions` with each sliding-log pass's request id replaced by its name
/// in `ids`; every other field, and every other decision, as they are.
fn with_named_ids(decisions: &[(Strategy, Decision)], ids: &BTreeMap<u64, usize>) -> Vec<Decision> {
    decisions
        .iter()
        .map(|(strategy, d)| {
            let mut d = d.clone();
            if *strategy == Strategy::SlidingLog && d.allowed {
                let stamps = d.receipt.stamps();
                assert_eq!(stamps.len(), 2, "{d:?}");
                let named = vec![stamps[0], ids[&stamps[1]] as u64];
                d.receipt = Receipt::new(d.receipt.cost(), named);
            }
            d
        })
        .collect()
}

/// Who makes a round's decision `i`, and at what cost: the first few go out
/// alone; then "k" and a new caller, first seen inside a batch, with mixed
/// costs: a look (0), and `too_much`, more than any quota can take.
fn caller_and_cost(i: u64, too_much: u64) -> (String, u64) {
    let key = match i {
        0..4 => format!("alone{i}"),
        _ if i.is_multiple_of(3) => "new".to_owned(),
        _ => "k".to_owned(),
    };
    let cost = match i {
        7 => 0,
        8 => too_much,
        _ => 1 + i % 2,
    };
    (key, cost)
}

/// The rounds of [`decide_rounds`], at these seconds after the warm-up: the
/// first rolls "k"'s window over; the second runs on a clock set back 30 s,
/// before the windows the first one opened (a stored window later than
/// now's stays current; a log's entries in the future stay inside); the
/// third, half-way into the window after, where the previous window, full,
/// still weighs half; the last, set back to where it weighs more, so more is
/// used than the limit.
const ROUNDS: [u64; 4] = [61, 31, 150, 125];

/// Decisions per policy per round.
const PER_ROUND: u64 = 24;

/// What one run of [`decide_rounds`] saw.
struct Rounds {
    /// Every decision in the order it was made, sliding-log request ids
    /// named (see [`request_ids`]), beside its policy's index.
    decisions: Vec<(Decision, usize)>,
    /// Per policy: script calls; reads of a key's state (GET, HMGET, or
    /// ZCOUNT of a log's units in the window, then ZRANGE of the newest if
    /// there are any); and a log's rejections' look-ups of the entry their
    /// Retry-After waits on (ZRANGEBYSCORE).
    counted: Vec<[u64; 3]>,
    /// Every key at the end (see [`key_states`]).
    states: Vec<(String, String, i64)>,
}

/// A warm-up decision per policy, then [`ROUNDS`] of [`PER_ROUND`]
/// concurrent decisions per policy, on a store of its own under `prefix`,
/// batching or not, on the app's clock: a round's decision `i` is made at
/// the round's second plus `offset(i)` µs.
async fn decide_rounds(
    server: &RedisServer,
    prefix: &str,
    policies: &[Policy],
    offset: fn(u64) -> i64,
    batching: bool,
) -> Rounds {
    const START: u64 = 1_800_000_000_000_000;
    let clock = tollgate::clock::ManualClock::new(START);
    let store =
        std::sync::Arc::new(store_with(&server.url(), prefix, Some(&clock), batching).await);
    let (mut seen, mut policy_of) = (Vec::new(), Vec::new());
    for (i, policy) in policies.iter().enumerate() {
        // Warm: scripts loaded, and a key that already holds state.
        let d = store.check(policy, &Key::new("k"), 1).await.unwrap();
        seen.push((policy.strategy().clone(), d));
        policy_of.push(i);
    }
    let mut counted = vec![[0; 3]; policies.len()];
    for secs in ROUNDS {
        for (p, (policy, counted)) in policies.iter().zip(&mut counted).enumerate() {
            reset_stats(server);
            let decisions: Vec<_> = (0..PER_ROUND)
                .map(|i| {
                    let (store, policy, clock) = (store.clone(), policy.clone(), clock.clone());
                    let (key, cost) = caller_and_cost(i, 11);
                    let at = (START + secs * 1_000_000).saturating_add_signed(offset(i));
                    // The store reads the clock before the task first waits.
                    tokio::spawn(async move {
                        clock.set(at);
                        (at, store.check(&policy, &Key::new(key), cost).await)
                    })
                })
                .collect();
            for d in decisions {
                let (at, d) = d.await.unwrap();
                let d = d.unwrap();
                assert_eq!(d.now_micros, at, "{d:?}");
                // Every field: the reported quota and the refund stamps too.
                seen.push((policy.strategy().clone(), d));
                policy_of.push(p);
            }
            let calls = command_calls(server);
            let count = |name: &str| calls.get(name).copied().unwrap_or(0);
            counted[0] += count("evalsha");
            counted[1] += count("get") + count("hmget") + count("zcount");
            counted[2] += count("zrangebyscore");
        }
    }
    let ids = request_ids(&seen);
    Rounds {
        decisions: with_named_ids(&seen, &ids)
            .into_iter()
            .zip(policy_of)
            .collect(),
        counted,
        states: key_states(server, prefix, &ids),
    }
}

/// Asserts that the batched run decided and left exactly what the lone one
/// did: every decision, every key's content, and its expiry (set from
/// Redis's own clock, so a few ms apart); `keys`, how many there are.
fn assert_same_rounds(alone: &Rounds, batched: &Rounds, keys: usize) {
    // Decision by decision, in the order they were sent (a batch keeps it).
    assert_eq!(alone.decisions, batched.decisions);
    let (alone, batched) = (&alone.states, &batched.states);
    assert_eq!(alone.len(), batched.len(), "{alone:?}\n{batched:?}");
    assert_eq!(alone.len(), keys, "{alone:?}");
    for (a, b) in alone.iter().zip(batched) {
        assert_eq!((&a.0, &a.1), (&b.0, &b.1));
        assert!(a.2 > 0 && (a.2 - b.2).abs() < 500, "{a:?} {b:?}");
    }
}

/// Asserts that `rounds` had what the batches must get right: passes (some,
/// not most) and rejections, and for the sliding logs passes and rejections
/// reporting either log.
fn assert_mixed_outcomes(rounds: &Rounds, policies: &[Policy]) {
    let mut logs = BTreeMap::new();
    for (d, p) in &rounds.decisions {
        if *policies[*p].strategy() == Strategy::SlidingLog {
            *logs.entry((d.allowed, d.quota)).or_insert(0) += 1;
        }
    }
    let passes = rounds.decisions.iter().filter(|(d, _)| d.allowed).count();
    assert!(
        (60..rounds.decisions.len() * 3 / 4).contains(&passes),
        "{passes} passes"
    );
    let every = [(false, 0), (false, 1), (true, 0), (true, 1)];
    assert!(every.iter().all(|o| logs.contains_key(o)), "{logs:?}");
}

#[tokio::test]
async fn batched_decisions_read_and_write_each_key_once_and_leave_what_lone_ones_do() {
    let server = RedisServer::start();
    let three = NonZeroU32::new(3).unwrap();
    // Each policy with the most keys one call of its decisions can read: two
    // callers' ("k" and "new"), each with a key per quota, and the sliding
    // log's resource log, shared by every caller.
    let policies = [
        (Policy::gcra("gcra", per_minute(6), three), 2),
        (
            Policy::sliding_window("window", per_minute(10)).and(per_minute(100)),
            4,
        ),
        // One quota: lua/sliding_window_batch.lua's path without tables.
        (Policy::sliding_window("one", per_minute(10)), 2),
        // Two quotas as full as each other in the first round (the 60 s
        // one's previous window weighs 1, the 120 s one's current holds the
        // same 1): a pass reports the first, the tie broken as alone.
        (
            Policy::sliding_window("tie", per_minute(10))
                .and(Quota::new(10, Duration::from_secs(120)).unwrap()),
            4,
        ),
        (Policy::leaky_bucket("leaky", per_minute(6), three), 2),
        // Six callers share the resource's log: each one's own log rejects
        // first, the shared one as it fills; costs of 2 and 11 units wait
        // for more than the oldest entry.
        (Policy::sliding_log("log", per_minute(20), per_minute(6)), 3),
        // Once the four lone callers have spent 6 units, "k"'s first pass
        // leaves both logs 9 units: it reports the resource's, the tie broken
        // as alone; the cost of 11 then waits as long on both logs (their
        // entries all share the round's time), and the resource's is
        // reported, the tie broken as alone.
        (
            Policy::sliding_log("tie", per_minute(16), per_minute(10)),
            3,
        ),
        // The shared log binds, over a longer window than each caller's, so
        // the two logs of a decision have different cutoffs.
        (
            Policy::sliding_log(
                "shared",
                Quota::new(12, Duration::from_secs(120)).unwrap(),
                per_minute(8),
            ),
            3,
        ),
    ];
    let (policies, most_keys): (Vec<Policy>, Vec<u64>) = policies.into_iter().unzip();
    // One clock for every decision of a round.
    let alone = decide_rounds(&server, "state-false", &policies, |_| 0, false).await;
    let batched = decide_rounds(&server, "state-true", &policies, |_| 0, true).await;
    let decisions = ROUNDS.len() as u64 * PER_ROUND;
    for (((policy, most_keys), alone), batched) in policies
        .iter()
        .zip(most_keys)
        .zip(&alone.counted)
        .zip(&batched.counted)
    {
        let name = policy.name();
        assert_eq!(alone[0], decisions, "{name}");
        assert!(
            batched[0] < decisions,
            "{name}: the decisions went out together: {batched:?}"
        );
        // Each call reads each of its keys at most once, where alone each
        // decision reads each of its keys.
        assert!(batched[1] <= most_keys * batched[0], "{name}: {batched:?}");
        assert!(
            batched[1] * 3 < alone[1],
            "{name}: {batched:?} against {alone:?}"
        );
        // A rejection's look-up of the entry it waits for serves the
        // call's other rejections of the same cost.
        assert!(
            batched[2] * 2 <= alone[2],
            "{name}: {batched:?} against {alone:?}"
        );
    }
    // Six callers per policy, two keys each for the two-quota windows, and
    // a log per caller beside the resource's for the sliding logs.
    assert_same_rounds(&alone, &batched, 6 * (1 + 2 + 1 + 2 + 1) + 3 * 7);
    assert_mixed_outcomes(&batched, &policies);
}

#[tokio::test]
async fn batched_decisions_on_the_apps_clock_leave_what_lone_ones_do() {
    // On the app's clock, each decision brings its own `now`, so one batch
    // holds several: a microsecond apart, seconds back, a window on. A
    // sliding log's state read at one cutoff does not hold at another: its
    // pending writes go out and it is read again.
    let server = RedisServer::start();
    let three = NonZeroU32::new(3).unwrap();
    let policies = [
        Policy::fixed_window("fixed", per_minute(10)).and(per_minute(100)),
        Policy::gcra("gcra", per_minute(6), three),
        Policy::sliding_window("window", per_minute(10)).and(per_minute(100)),
        Policy::leaky_bucket("leaky", per_minute(6), three),
        Policy::sliding_log("log", per_minute(20), per_minute(6)),
        Policy::sliding_log("tie", per_minute(16), per_minute(10)),
        Policy::sliding_log(
            "shared",
            Quota::new(12, Duration::from_secs(120)).unwrap(),
            per_minute(8),
        ),
    ];
    fn offset(i: u64) -> i64 {
        match i % 8 {
            1 => 1,
            3 => -2_000_000,
            5 => 61_000_000,
            6 => 30_000_000,
            _ => 0,
        }
    }
    let alone = decide_rounds(&server, "clock-false", &policies, offset, false).await;
    let batched = decide_rounds(&server, "clock-true", &policies, offset, true).await;
    let decisions = ROUNDS.len() as u64 * PER_ROUND;
    for (policy, batched) in policies.iter().zip(&batched.counted) {
        assert!(batched[0] < decisions, "{}: {batched:?}", policy.name());
    }
    assert_same_rounds(&alone, &batched, 6 * (2 + 1 + 2 + 1) + 3 * 7);
    assert_mixed_outcomes(&batched, &policies);
}

/// A small deterministic generator (xorshift64*), for decisions that differ
/// by seed and replay the same in every run.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// Lets a script's PEXPIREs be compared exactly: each also SETs
/// `px|<key>` to the milliseconds it was given.
/// A strategy's own batch file (`lua/*_batch.lua`) put together as the
/// store does (see src/store/redis/script.rs), with PEXPIRE recorded.
fn shimmed_batch(own: &str) -> String {
    format!(
        "{PEXPIRE_SHIM}{}\n{own}\n{}",
        include_str!("../lua/batch_prelude.lua"),
        include_str!("../lua/batch.lua")
    )
}

/// Runs a lone script with `keys` and `args`: its reply.
fn eval_alone(conn: &mut redis::Connection, script: &str, keys: &[String], args: &[i64]) -> Reply {
    let reply: redis::RedisResult<Vec<i64>> = redis::cmd("EVAL")
        .arg(script)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query(conn);
    match reply {
        Ok(ints) => Reply::Ints(ints),
        // Before 7.0 an error inside a script comes back as `ERR Error
        // running script ...: WRONGTYPE ...`; from 7.0 with its own code.
        Err(err) if err.to_string().contains("WRONGTYPE") => Reply::Error("WRONGTYPE".to_owned()),
        Err(err) => Reply::Error(err.code().unwrap_or("?").to_owned()),
    }
}

/// Runs `decisions` (each its keys and arguments) in one call of `batch`,
/// encoded as the store encodes them (lua/batch.lua): a decision with the
/// keys and arguments of the one before but for its request id (at
/// `id_at(args)`) sends `#` and the id alone, one with all of them `=`;
/// any other sends it all. The replies, how many decisions went by their
/// id alone and how many as `=`.
fn eval_batch(
    conn: &mut redis::Connection,
    batch: &str,
    decisions: &[(Vec<String>, Vec<i64>)],
    id_at: impl Fn(&[i64]) -> Option<usize>,
) -> (Vec<Reply>, usize, usize) {
    // No deadline ("0"): see lua/batch.lua's ARGV[2].
    let (mut keys, mut args) = (
        Vec::new(),
        vec![decisions.len().to_string(), "0".to_owned()],
    );
    for (i, (k, a)) in decisions.iter().enumerate() {
        let before = i.checked_sub(1).map(|p| &decisions[p]);
        if before.is_some_and(|(pk, pa)| pk == k && pa == a) {
            args.push("=".to_owned());
            continue;
        }
        let fresh = before.zip(id_at(a)).filter(|((pk, pa), at)| {
            pk == k && pa.len() == a.len() && pa[..*at] == a[..*at] && pa[at + 1..] == a[at + 1..]
        });
        if let Some((_, at)) = fresh {
            args.extend(["#".to_owned(), a[at].to_string()]);
            continue;
        }
        keys.extend(k.iter().cloned());
        args.extend([k.len().to_string(), a.len().to_string()]);
        args.extend(a.iter().map(i64::to_string));
    }
    let fresh = args.iter().filter(|a| *a == "#").count();
    let same = args.iter().filter(|a| *a == "=").count();
    let reply: Vec<u8> = redis::cmd("EVAL")
        .arg(batch)
        .arg(keys.len())
        .arg(&keys)
        .arg(&args)
        .query(conn)
        .unwrap();
    (unpack_batch(&reply), fresh, same)
}

const PEXPIRE_SHIM: &str = "local real = redis\n\
    local redis = setmetatable({ call = function(cmd, ...)\n\
      if cmd == 'PEXPIRE' then real.call('SET', 'px|' .. (select(1, ...)), (select(2, ...))) end\n\
      return real.call(cmd, ...)\n\
    end }, { __index = real })\n";

/// A decision's reply: its integers, or its error's code.
#[derive(Debug, PartialEq)]
enum Reply {
    Ints(Vec<i64>),
    Error(String),
}

/// `lua/batch.lua`'s packed reply, one [`Reply`] per decision.
fn unpack_batch(mut bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    let take = |n: usize, bytes: &mut &[u8]| {
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        head.to_vec()
    };
    while !bytes.is_empty() {
        let n = u16::from_be_bytes(take(2, &mut bytes).try_into().unwrap()) as usize;
        if n == 0 {
            let len = u16::from_be_bytes(take(2, &mut bytes).try_into().unwrap()) as usize;
            let message = String::from_utf8(take(len, &mut bytes)).unwrap();
            replies.push(Reply::Error(message.split(' ').next().unwrap().to_owned()));
        } else {
            let ints = (0..n)
                .map(|_| i64::from_be_bytes(take(8, &mut bytes).try_into().unwrap()))
                .collect();
            replies.push(Reply::Ints(ints));
        }
    }
    replies
}

/// One sliding-log decision below the store: its keys (under a prefix) and
/// lua/sliding_log.lua's arguments (now, cost, request id, the resource's
/// limit and window, the consumer's).
type LogDecision = ([String; 2], [i64; 7]);

/// Random sliding-log calls for [`the_sliding_log_batch_decides_and_writes_what_its_lone_script_does`]:
/// each call's clock, some decisions on clocks of their own (a microsecond
/// on, seconds back, a window on, or one that keeps the cutoff with a
/// longer window), costs from a look to hundreds of units (several ZADDs),
/// one or two resources, and up to four callers, with "bad" among them if
/// `bad`.
fn random_log_calls(dice: &mut Dice, bad: bool) -> Vec<Vec<LogDecision>> {
    let mut callers: Vec<String> = (0..=dice.below(4)).map(|i| format!("c{i}")).collect();
    if bad {
        callers.push("bad".to_owned());
    }
    let resources = if dice.one_in(3) {
        &["r1", "r2"][..]
    } else {
        &["r1"][..]
    };
    let mut clock: i64 = 1_800_000_000_000_000;
    let mut id: i64 = 1_000_000_000_000;
    let mut calls = Vec::new();
    for _ in 0..=dice.below(8) {
        clock += dice.pick(&[0, 1, 500_000, 3_000_000, 10_000_000, -5_000_000, 30_000_000]);
        let mut decisions = Vec::new();
        for _ in 0..=dice.below(40) {
            let mut now = clock;
            if dice.below(100) < 15 {
                now += dice.pick(&[1, -1, 2_000_000, -7_000_000, 11_000_000]);
            }
            let resource = dice.pick(resources);
            let mut limits = [
                if resource == "r1" {
                    dice.pick(&[5, 8, 20])
                } else {
                    6
                },
                dice.pick(&[3, 4, 10, 1000]),
            ];
            let mut windows = [
                dice.pick(&[10_000_000, 10_000_000, 4_000_000, 3_000_000]),
                dice.pick(&[10_000_000, 7_000_000]),
            ];
            let cost = if dice.one_in(10) {
                limits = [1000, 1000];
                dice.below(700) as i64
            } else {
                dice.pick(&[0, 1, 1, 1, 2, 3, 12])
            };
            if dice.one_in(10) {
                // The cutoff of the call's clock with a 10 s window.
                let later = dice.pick(&[1, 1_000_000, 2_500_000]);
                now = clock + later;
                windows = [10_000_000 + later; 2];
            }
            id += 1 + dice.below(1000) as i64;
            let caller = &callers[dice.below(callers.len() as u64) as usize];
            let keys = [resource.to_owned(), format!("consumer:{caller}")];
            let args = [now, cost, id, limits[0], windows[0], limits[1], windows[1]];
            decisions.push((keys, args));
        }
        calls.push(decisions);
    }
    calls
}

#[test]
fn the_sliding_log_batch_decides_and_writes_what_its_lone_script_does() {
    // Below the store, where each call's decisions are chosen: lone
    // lua/sliding_log.lua, one decision after the other, under "a:", against
    // calls of lua/sliding_log_batch.lua (as the store builds it, see
    // src/store/redis/script.rs) under "b:". Every reply, every member and
    // score, and every PEXPIRE's milliseconds must be the same.
    let server = RedisServer::start();
    let mut conn = server.conn();
    let lone = format!("{PEXPIRE_SHIM}{}", include_str!("../lua/sliding_log.lua"));
    let batch = shimmed_batch(include_str!("../lua/sliding_log_batch.lua"));
    // First, by hand: a log whose entries lie ahead of the call's clock (an
    // app server's clock ahead of another's). A rejection waits on the
    // oldest, 5 s ahead; a pass then adds one older still, which the next
    // rejection waits on instead.
    let t: i64 = 1_800_000_000_000_000;
    let keys = || ["r1".to_owned(), "consumer:c0".to_owned()];
    let ahead = vec![
        vec![(
            keys(),
            [t + 5_000_000, 2, 11, 100, 10_000_000, 3, 10_000_000],
        )],
        vec![
            (keys(), [t, 2, 12, 100, 10_000_000, 3, 10_000_000]),
            (keys(), [t, 1, 13, 100, 10_000_000, 3, 10_000_000]),
            (keys(), [t, 1, 14, 100, 10_000_000, 3, 10_000_000]),
        ],
    ];
    // A flood of one caller: each decision differs from the one before in
    // its request id alone, which the batch then sends by itself.
    let flood = (0..3)
        .map(|call| {
            (0..40)
                .map(|i| {
                    (
                        keys(),
                        [
                            t + call,
                            1,
                            100 + call * 40 + i,
                            1000,
                            10_000_000,
                            90,
                            10_000_000,
                        ],
                    )
                })
                .collect()
        })
        .collect();
    let mut cases = vec![(ahead, false), (flood, false)];
    // Then random calls, a third with a caller's log of another type.
    for seed in 1..=60u64 {
        let mut dice = Dice(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let bad = dice.one_in(3);
        cases.push((random_log_calls(&mut dice, bad), bad));
    }
    let (mut decided, mut passed, mut failed, mut fresh_ids) = (0, 0, 0, 0);
    for (case, (calls, bad)) in cases.into_iter().enumerate() {
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        if bad {
            for side in ["a", "b"] {
                let _: () = conn.rpush(format!("{side}:consumer:bad"), "x").unwrap();
            }
        }
        let (mut alone, mut batched) = (Vec::new(), Vec::new());
        for decisions in calls {
            let mut sent = Vec::new();
            for (k, a) in &decisions {
                let a_keys: Vec<String> = k.iter().map(|k| format!("a:{k}")).collect();
                alone.push(eval_alone(&mut conn, &lone, &a_keys, &a[..]));
                sent.push((k.iter().map(|k| format!("b:{k}")).collect(), a.to_vec()));
            }
            // The request id is the third argument.
            let (replies, fresh, _) = eval_batch(&mut conn, &batch, &sent, |_| Some(2));
            batched.extend(replies);
            fresh_ids += fresh;
        }
        assert_eq!(alone.len(), batched.len(), "case {case}");
        for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
            assert_eq!(a, b, "case {case}, decision {i}");
        }
        decided += alone.len();
        passed += alone
            .iter()
            .filter(|r| matches!(r, Reply::Ints(i) if i[0] == 1))
            .count();
        failed += alone
            .iter()
            .filter(|r| matches!(r, Reply::Error(_)))
            .count();

        let mut names: Vec<String> = conn.keys("a:*").unwrap();
        names.extend(conn.keys::<_, Vec<String>>("b:*").unwrap());
        let mut names: Vec<String> = names.into_iter().map(|n| n[2..].to_owned()).collect();
        names.sort();
        names.dedup();
        for name in names {
            let (a, b) = (format!("a:{name}"), format!("b:{name}"));
            let kind: [String; 2] =
                [&a, &b].map(|k| redis::cmd("TYPE").arg(k).query(&mut conn).unwrap());
            assert_eq!(kind[0], kind[1], "case {case}: {name}");
            if kind[0] == "zset" {
                let members: [Vec<(String, i64)>; 2] =
                    [&a, &b].map(|k| conn.zrange_withscores(k, 0, -1).unwrap());
                assert_eq!(members[0], members[1], "case {case}: {name}");
                let px: [Option<String>; 2] =
                    [&a, &b].map(|k| conn.get(format!("px|{k}")).unwrap());
                assert_eq!(px[0], px[1], "case {case}: {name}'s PEXPIRE");
                let pttl: [i64; 2] =
                    [&a, &b].map(|k| redis::cmd("PTTL").arg(k).query(&mut conn).unwrap());
                assert!(
                    pttl[0] > 0 && (pttl[0] - pttl[1]).abs() < 1000,
                    "case {case}: {name} {pttl:?}"
                );
            }
        }
    }
    // The cases cover what they should: passes, rejections, failures.
    assert!(
        passed > decided / 10 && passed < decided / 2,
        "{passed} of {decided}"
    );
    assert!(failed > 20, "{failed} failed of {decided}");
    assert!(fresh_ids > 50, "{fresh_ids} sent by their id alone");
}

#[test]
fn the_concurrency_batch_with_releases_decides_and_writes_what_its_lone_scripts_do() {
    // lua/concurrency.lua and lua/concurrency_release.lua run one after the
    // other under "a:", against the same decisions and releases in calls of
    // lua/concurrency_batch.lua under "b:", in any order (the store sends a
    // batch's releases first; the script must not rely on it). Releases give
    // back slots taken in earlier calls or in the same one, or never taken.
    // Every reply, member, score and PEXPIRE must be the same.
    let server = RedisServer::start();
    let mut conn = server.conn();
    let lone = format!("{PEXPIRE_SHIM}{}", include_str!("../lua/concurrency.lua"));
    let release = format!(
        "{PEXPIRE_SHIM}{}",
        include_str!("../lua/concurrency_release.lua")
    );
    let batch = shimmed_batch(include_str!("../lua/concurrency_batch.lua"));
    let (mut decided, mut passed, mut released, mut failed) = (0, 0, 0, 0);
    let (mut fresh_ids, mut repeated) = (0, 0);
    for seed in 1..=60u64 {
        let mut dice = Dice(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
        let mut keys = vec!["k1", "k2"];
        if dice.one_in(3) {
            keys.push("bad");
            for side in ["a", "b"] {
                let _: () = conn.rpush(format!("{side}:bad"), "x").unwrap();
            }
        }
        let (mut clock, mut id) = (1_800_000_000_000_000i64, 1i64);
        // Slots taken so far: key, id, cost; and the last slot released,
        // released again at times (a receipt given back twice by hand).
        let mut taken: Vec<(&str, i64, i64)> = Vec::new();
        let mut last_released = None;
        let (mut alone, mut batched) = (Vec::new(), Vec::new());
        for _ in 0..8 {
            let mut call: Vec<(Vec<String>, Vec<i64>)> = Vec::new();
            for _ in 0..=dice.below(12) {
                let (key, script, args) = if dice.one_in(3) && !taken.is_empty() {
                    let (key, id, cost) = match last_released {
                        Some(again) if dice.one_in(3) => again,
                        _ => taken[dice.below(taken.len() as u64) as usize],
                    };
                    let id = if dice.one_in(8) { id + 7_000_000 } else { id };
                    last_released = Some((key, id, cost));
                    (key, &release, vec![id, cost])
                } else {
                    clock += dice.pick(&[0, 0, 0, 1, 1_000_000, 20_000_000]);
                    let (cost, limit) = if dice.one_in(15) {
                        (1200 + dice.below(100) as i64, 2000)
                    } else {
                        (dice.pick(&[0, 1, 1, 1, 2, 3]), dice.pick(&[3, 5]))
                    };
                    let timeout = dice.pick(&[10_000_000, 10_000_000, 5_000_000]);
                    id += 1 + dice.below(100) as i64;
                    let key = keys[dice.below(keys.len() as u64) as usize];
                    (key, &lone, vec![clock, cost, limit, timeout, id])
                };
                let reply = eval_alone(&mut conn, script, &[format!("a:{key}")], &args);
                match (&reply, args.len()) {
                    (Reply::Ints(ints), 5) if ints[0] == 1 && args[1] > 0 => {
                        taken.push((key, args[4], args[1]));
                        passed += 1;
                    }
                    (Reply::Ints(ints), 2) => released += ints[0],
                    (Reply::Error(_), _) => failed += 1,
                    _ => {}
                }
                alone.push(reply);
                call.push((vec![format!("b:{key}")], args));
            }
            decided += call.len();
            // A check's request id is its fifth argument, a release's its first.
            let id_at = |a: &[i64]| Some(if a.len() == 5 { 4 } else { 0 });
            let (replies, fresh, same) = eval_batch(&mut conn, &batch, &call, id_at);
            batched.extend(replies);
            fresh_ids += fresh;
            repeated += same;
        }
        assert_eq!(alone, batched, "seed {seed}");
        for key in &keys[..2] {
            let (a, b) = (format!("a:{key}"), format!("b:{key}"));
            let members: [Vec<(String, i64)>; 2] =
                [&a, &b].map(|k| conn.zrange_withscores(k, 0, -1).unwrap());
            assert_eq!(members[0], members[1], "seed {seed}: {key}");
            let px: [Option<String>; 2] = [&a, &b].map(|k| conn.get(format!("px|{k}")).unwrap());
            assert_eq!(px[0], px[1], "seed {seed}: {key}'s PEXPIRE");
        }
    }
    // The cases cover what they should: passes, releases, failures.
    assert!(passed > decided / 5, "{passed} passed of {decided}");
    assert!(released > 100, "{released} slots released");
    assert!(failed > 20, "{failed} failed of {decided}");
    assert!(fresh_ids > 20, "{fresh_ids} sent by their id alone");
    assert!(repeated > 5, "{repeated} sent as the one before");
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
        slots("slots", 100),
        // The bad key is the caller's log, read after the resource's.
        Policy::sliding_log("log", per_minute(100), per_minute(100)),
    ];
    for policy in &policies {
        store.check(policy, &Key::new("warm"), 1).await.unwrap();
        let name = match policy.strategy() {
            Strategy::SlidingLog => format!("batch:{{{}}}:sliding_log:consumer:bad", policy.name()),
            _ => format!(
                "batch:{{{}|bad}}:{}:0",
                policy.name(),
                policy.strategy().as_str()
            ),
        };
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
        if *policy.strategy() == Strategy::SlidingLog {
            // The failed decision charged neither log: the resource's holds
            // the warm-up's unit and the twenty passes', no more.
            let mut conn = server.conn();
            let resource: u64 = conn.zcard("batch:{log}:sliding_log:resource").unwrap();
            assert_eq!(resource, 21);
            let twice: u64 = conn
                .zcard("batch:{log}:sliding_log:consumer:twice")
                .unwrap();
            assert_eq!(twice, 2);
        }
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
        script_loads(&stats, 1),
        Some(2),
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

/// Four checks on `key`, sent: while Redis sleeps they hold every one of
/// the batcher's slots, so whatever comes next queues.
async fn take_every_slot(
    store: &std::sync::Arc<RedisStore>,
    policy: &Policy,
    key: &Key,
) -> Vec<tokio::task::JoinHandle<Result<tollgate::Decision, tollgate::StoreError>>> {
    let sent = (0..4)
        .map(|_| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.check(&policy, &key, 1).await })
        })
        .collect();
    tokio::task::yield_now().await;
    sent
}

#[tokio::test]
async fn a_queued_decision_whose_request_gave_up_is_never_charged() {
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = Policy::fixed_window("core", per_minute(100));
    store.check(&policy, &Key::new("k"), 1).await.unwrap();

    let sleeper = put_to_sleep(&server, "0.3").await;
    // The rest queue, and their requests give up (as the layer's deadline
    // would).
    let sent = take_every_slot(&store, &policy, &Key::new("k")).await;
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
async fn calls_in_flight_sets_how_many_decisions_go_out_before_the_rest_queue() {
    // Six decisions while Redis sleeps: as many as the store allows in
    // flight go out alone, the rest queue and go out as one batch.
    let server = RedisServer::start();
    let policy = Policy::fixed_window("core", per_minute(100));
    for (calls, expected) in [(Some(1), 2), (Some(3), 4), (None, 5)] {
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
        let conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let mut builder = RedisStore::from_connection(conn).prefix(format!("calls{calls:?}"));
        if let Some(calls) = calls {
            builder = builder.calls_in_flight(std::num::NonZeroUsize::new(calls).unwrap());
        }
        let store = std::sync::Arc::new(builder.build().unwrap());
        // The first round loads the lone and the batch scripts.
        for key in ["warm-up", "k"] {
            reset_stats(&server);
            let sleeper = put_to_sleep(&server, "0.1").await;
            let sent: Vec<_> = (0..6)
                .map(|_| {
                    let (store, policy) = (store.clone(), policy.clone());
                    tokio::spawn(async move { store.check(&policy, &Key::new(key), 1).await })
                })
                .collect();
            tokio::task::yield_now().await;
            sleeper.join().unwrap();
            let mut used = Vec::new();
            for d in sent {
                let d = d.await.unwrap().unwrap();
                assert!(d.allowed);
                used.push(d.used);
            }
            used.sort_unstable();
            assert_eq!(used, (1..=6).collect::<Vec<u64>>(), "{calls:?} in flight");
        }
        assert_eq!(
            support::redis::evalsha_calls(&server),
            expected,
            "{calls:?} in flight: that many alone, then one batch"
        );
    }
}

/// A batching store on `server` with `n` slots of `policy` taken on key
/// "k": the store, the policy and the slots' receipts.
async fn holding(
    server: &RedisServer,
    policy: Policy,
    n: usize,
) -> (std::sync::Arc<RedisStore>, Policy, Vec<Receipt>) {
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(
            store
                .check(&policy, &Key::new("k"), 1)
                .await
                .unwrap()
                .receipt,
        );
    }
    (store, policy, held)
}

#[tokio::test]
async fn a_queued_release_goes_out_even_after_its_caller_gave_up() {
    let server = RedisServer::start();
    let (store, policy, held) = holding(&server, slots("held", 10), 3).await;
    let (slots, other) = (Key::new("k"), Key::new("other"));

    let sleeper = put_to_sleep(&server, "0.3").await;
    // The releases queue, and their callers give up (as a release guard's
    // deadline would).
    let sent = take_every_slot(&store, &policy, &other).await;
    for receipt in &held {
        let gave_up = tokio::time::timeout(
            Duration::from_millis(10),
            store.refund(&policy, &slots, receipt),
        )
        .await;
        assert!(gave_up.is_err(), "Redis is asleep: nothing can answer yet");
    }
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    sleeper.join().unwrap();
    // The releases go out in the next call (from a task of the batcher's).
    until_slots_held(&store, &policy, &slots, 0).await;
}

/// Waits (ten seconds at most) until `key` holds `n` slots of `policy`:
/// releases queued behind a sleeping Redis go out in a task of their own.
/// A slot never given back stays held for the policy's timeout (a minute
/// in these tests), far past the wait, which only absorbs a slow machine.
async fn until_slots_held(store: &RedisStore, policy: &Policy, key: &Key, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = store.peek(policy, key).await.unwrap().used;
        if used == n {
            return;
        }
        assert!(Instant::now() < deadline, "{used} slots held, not {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes and gives back a slot of `policy` (on a key of its own), so that
/// its scripts are loaded and a call needs no second try.
async fn warm_up(store: &RedisStore, policy: &Policy) {
    let key = Key::new("warm-up");
    let taken = store.check(policy, &key, 1).await.unwrap();
    store.refund(policy, &key, &taken.receipt).await.unwrap();
}

#[tokio::test]
async fn a_concurrency_check_given_up_on_its_way_gives_its_slot_back() {
    // The check reaches Redis, but its request has gone (a client that hung
    // up) before the answer comes: the slot it took is given back, batching
    // or not, rather than held until its timeout.
    let server = RedisServer::start();
    for batching in [true, false] {
        let store = store_with(&server.url(), &format!("gone{batching}"), None, batching).await;
        let (policy, key) = (slots("gone", 5), Key::new("k"));
        warm_up(&store, &policy).await;
        reset_stats(&server);
        let sleeper = put_to_sleep(&server, "0.3").await;
        let check = tokio::time::timeout(Duration::from_millis(50), store.check(&policy, &key, 1));
        assert!(
            check.await.is_err(),
            "Redis is asleep: the check is still on its way"
        );
        sleeper.join().unwrap();
        until_slots_held(&store, &policy, &key, 0).await;
        let calls = command_calls(&server);
        assert_eq!(calls.get("zadd"), Some(&1), "the slot was taken: {calls:?}");
        assert_eq!(calls.get("zrem"), Some(&1), "and given back: {calls:?}");
    }
}

/// A concurrency check goes from a task of its own, which must not outlive
/// a Redis that hangs: on a connection without a response timeout of its
/// own, the task gives up after 10 s (time paused and moved by hand once
/// the checks wait on a paused Redis).
#[tokio::test]
async fn a_check_on_a_task_of_its_own_waits_ten_seconds_for_a_hung_redis() {
    let server = RedisServer::start();
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    for batching in [true, false] {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap();
        let store = RedisStore::from_connection(conn)
            .prefix(format!("hung{batching}"))
            .batching(batching)
            .build()
            .unwrap();
        let (policy, key) = (slots("hung", 5), Key::new("k"));
        warm_up(&store, &policy).await;
        let before = alive();
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(400)
            .arg("ALL")
            .query(&mut server.conn())
            .unwrap();
        for _ in 0..3 {
            let check =
                tokio::time::timeout(Duration::from_millis(50), store.check(&policy, &key, 1));
            assert!(check.await.is_err(), "Redis is paused: no answer");
        }
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(9)).await;
        // Tasks whose timer fired run now (a bound under 9 s fails here).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(alive(), before + 3, "the checks' tasks wait for Redis");
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(alive(), before, "and give up after 10 s");
        // Redis wakes within 400 ms and runs the checks; their slots time
        // out in Redis, as documented for answers past 10 s.
        tokio::time::resume();
    }
}

#[tokio::test]
async fn a_concurrency_pass_that_comes_back_unread_is_given_back() {
    // The answer is in, but the request is dropped before it runs again to
    // read it (a client that hung up meanwhile): the pass is given back,
    // sent alone or not, batching or not, and queued in a batch.
    let server = RedisServer::start();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for batching in [true, false] {
        let store = store_with(&server.url(), &format!("unread{batching}"), None, batching).await;
        let (policy, key) = (slots("unread", 5), Key::new("k"));
        warm_up(&store, &policy).await;
        let mut check = store.check(&policy, &key, 1);
        assert!(check.as_mut().poll(&mut cx).is_pending());
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(check);
        until_slots_held(&store, &policy, &key, 0).await;
    }
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let (policy, key) = (slots("unread_queued", 500), Key::new("k"));
    warm_up(&store, &policy).await;
    let sleeper = put_to_sleep(&server, "0.2").await;
    let sent = take_every_slot(&store, &policy, &Key::new("other")).await;
    let (mut a, mut b) = (store.check(&policy, &key, 1), store.check(&policy, &key, 1));
    assert!(a.as_mut().poll(&mut cx).is_pending() && b.as_mut().poll(&mut cx).is_pending());
    sleeper.join().unwrap();
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    // Both pass, unread, once their batch has gone out (however long that
    // takes), and stay held while their requests live.
    until_slots_held(&store, &policy, &key, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        store.peek(&policy, &key).await.unwrap().used,
        2,
        "both passed, unread"
    );
    drop((a, b));
    until_slots_held(&store, &policy, &key, 0).await;
}

#[tokio::test]
async fn concurrency_checks_given_up_at_random_leave_no_slot_taken() {
    // Redis kept slow, so checks queue, batch and fly while their requests
    // give up at every stage; every pass that is heard is released by its
    // request, every other is given back by the store. None stays taken.
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let (policy, key) = (slots("random", 100_000), Key::new("k"));
    warm_up(&store, &policy).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slowing = {
        let (url, stop) = (server.url(), stop.clone());
        std::thread::spawn(move || {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.001")
                    .query(&mut conn)
                    .unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    // Patience is measured against this machine's own check under the slow
    // Redis, so a loaded CI runner still sees some give up and some pass;
    // every eighth request waits for its answer whatever it takes.
    let typical = typical_check_time(&store, &policy).await;
    let requests: Vec<_> = (0..600u64)
        .map(|i| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(i * 20)).await;
                let patience = if i % 8 == 0 {
                    Duration::from_secs(10)
                } else {
                    typical * (3 + ((i * 7919) % 300) as u32) / 10
                };
                match tokio::time::timeout(patience, store.check(&policy, &key, 1)).await {
                    Ok(Ok(d)) => {
                        assert!(d.allowed);
                        store.refund(&policy, &key, &d.receipt).await.unwrap();
                        false
                    }
                    Ok(Err(err)) => panic!("{err}"),
                    Err(_) => true,
                }
            })
        })
        .collect();
    let mut gave_up = 0;
    for request in requests {
        gave_up += u32::from(request.await.unwrap());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    slowing.join().unwrap();
    println!("{gave_up} of 600 gave up; a lone check takes {typical:?}");
    assert!(gave_up >= 20, "only {gave_up} of 600 gave up ({typical:?})");
    until_slots_held(&store, &policy, &key, 0).await;
}

/// The median time a lone check takes on `store`, on a key of its own.
async fn typical_check_time(store: &RedisStore, policy: &Policy) -> Duration {
    let key = Key::new("timed");
    let mut times = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let taken = store.check(policy, &key, 1).await.unwrap();
        times.push(started.elapsed());
        store.refund(policy, &key, &taken.receipt).await.unwrap();
    }
    times.sort();
    times[times.len() / 2]
}

#[tokio::test]
async fn a_release_behind_busy_calls_is_queued_and_answered_at_once() {
    let server = RedisServer::start();
    let (store, policy, mut held) = holding(&server, slots("held", 10), 4).await;
    let (slots, other) = (Key::new("k"), Key::new("other"));
    let kept = held.pop().unwrap();
    assert!(
        store.refund_now(&policy, &slots, &kept).is_none(),
        "with a slot free a release is sent by its caller, not queued"
    );
    assert!(store
        .refund_now(&Policy::fixed_window("core", per_minute(5)), &slots, &kept)
        .is_none());

    let sleeper = put_to_sleep(&server, "0.3").await;
    let sent = take_every_slot(&store, &policy, &other).await;
    for receipt in &held {
        let answered = store.refund_now(&policy, &slots, receipt);
        assert!(
            matches!(answered, Some(Ok(()))),
            "Redis is asleep, yet a queued release needs no wait: {answered:?}"
        );
    }
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    sleeper.join().unwrap();
    // The queued releases go out in the next call; the kept slot stays.
    until_slots_held(&store, &policy, &slots, 1).await;
}

#[tokio::test]
async fn a_release_queued_after_a_check_goes_out_before_it() {
    // Both wait in one batch; the release only frees room, so it goes first
    // and the check finds the slot free (either order is a valid history of
    // two concurrent calls; this one never rejects for nothing).
    let server = RedisServer::start();
    let (store, policy, mut held) = holding(&server, slots("one", 1), 1).await;
    let (slot, other) = (Key::new("k"), Key::new("other"));
    let held = held.pop().unwrap();
    let unrelated = slots("many", 10);

    let sleeper = put_to_sleep(&server, "0.2").await;
    let sent = take_every_slot(&store, &unrelated, &other).await;
    let check = {
        let (store, policy, slot) = (store.clone(), policy.clone(), slot.clone());
        tokio::spawn(async move { store.check(&policy, &slot, 1).await })
    };
    tokio::task::yield_now().await;
    let release = {
        let (store, policy) = (store.clone(), policy.clone());
        tokio::spawn(async move { store.refund(&policy, &slot, &held).await })
    };
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    sleeper.join().unwrap();
    release.await.unwrap().unwrap();
    let d = check.await.unwrap().unwrap();
    assert!(d.allowed, "the release went first: {d:?}");
}

#[tokio::test]
async fn queued_releases_and_checks_of_a_concurrency_limit_share_one_call() {
    // Three slots held; two releases and three checks queue together. They
    // go out in one script call, the releases first, and decide as they
    // would one by one: two checks take the freed slots, the third waits.
    let server = RedisServer::start();
    let (store, policy, held) = holding(&server, slots("shared", 3), 3).await;
    let (slot, other) = (Key::new("k"), Key::new("other"));
    reset_stats(&server);

    let sleeper = put_to_sleep(&server, "0.3").await;
    let sent = take_every_slot(&store, &slots("many", 10), &other).await;
    for receipt in &held[..2] {
        let answered = store.refund_now(&policy, &slot, receipt);
        assert!(matches!(answered, Some(Ok(()))), "queued: {answered:?}");
    }
    let checks: Vec<_> = (0..3)
        .map(|_| {
            let (store, policy, slot) = (store.clone(), policy.clone(), slot.clone());
            tokio::spawn(async move { store.check(&policy, &slot, 1).await })
        })
        .collect();
    tokio::task::yield_now().await;
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    sleeper.join().unwrap();
    let mut allowed = 0;
    for check in checks {
        let d = check.await.unwrap().unwrap();
        allowed += u32::from(d.allowed);
    }
    assert_eq!(allowed, 2, "the two released slots, and no more");

    let calls = command_calls(&server);
    assert_eq!(calls.get("zrem"), Some(&2), "{calls:?}");
    // The batch script's first call meets NOSCRIPT, loads it and goes again.
    let loads = script_loads(&calls, 0).unwrap_or(0);
    assert_eq!(
        calls.get("evalsha").copied().unwrap_or(0) - loads,
        5,
        "four lone calls, then the releases and checks in one: {calls:?}"
    );
    assert_eq!(calls.get("time"), Some(&5), "{calls:?}");
    until_slots_held(&store, &policy, &slot, 3).await;
}

#[tokio::test]
async fn thousands_of_concurrency_slots_are_taken_and_given_back_alone_or_batched() {
    // More members than one `unpack` may hold, alone and in a batch.
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = slots("big", 100_000);
    let key = Key::new("k");
    let alone = store.check(&policy, &key, 9_000).await.unwrap();
    assert!(alone.allowed, "{alone:?}");
    let batched: Vec<_> = (0..8)
        .map(|_| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.check(&policy, &key, 9_000).await })
        })
        .collect();
    let mut receipts = vec![alone.receipt];
    for d in batched {
        let d = d.await.unwrap().unwrap();
        assert!(d.allowed, "{d:?}");
        receipts.push(d.receipt);
    }
    let name = "batch:{big|k}:concurrency:0";
    let members: u64 = server.conn().zcard(name).unwrap();
    assert_eq!(members, 9 * 9_000);
    let releases: Vec<_> = receipts
        .into_iter()
        .map(|receipt| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.refund(&policy, &key, &receipt).await })
        })
        .collect();
    for r in releases {
        r.await.unwrap().unwrap();
    }
    let members: u64 = server.conn().zcard(name).unwrap();
    assert_eq!(members, 0, "every slot given back");
}

#[tokio::test]
async fn concurrency_decisions_at_time_zero_batch_as_alone() {
    // On an app clock at 0 the floor (now - timeout, at least 0) is 0 too:
    // slots started then never count, alone or batched.
    let server = RedisServer::start();
    let policy = slots("zero", 2);
    let mut runs = Vec::new();
    for batching in [false, true] {
        let clock = tollgate::clock::ManualClock::new(0);
        let prefix = format!("zero-{batching}");
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        let decisions: Vec<_> = (0..12)
            .map(|_| {
                let store = store.clone();
                let policy = policy.clone();
                tokio::spawn(async move { store.check(&policy, &Key::new("k"), 1).await })
            })
            .collect();
        let mut seen = Vec::new();
        for d in decisions {
            let mut d = d.await.unwrap().unwrap();
            d.receipt = Receipt::default();
            seen.push(d);
        }
        runs.push(seen);
    }
    assert_eq!(runs[0], runs[1]);
    assert!(runs[1].iter().all(|d| d.allowed), "{:?}", runs[1]);
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
        let clock = tollgate::clock::ManualClock::new(1_800_000_000_000_000);
        let store =
            std::sync::Arc::new(store_with(&server.url(), &prefix, Some(&clock), batching).await);
        store.check(&policy, &Key::new("warm"), 1).await.unwrap();
        reset_stats(&server);
        // Each pass's id, by the order of its decision, so two runs' random
        // ids compare.
        let mut ids = BTreeMap::new();
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
                    let (key, cost) = caller_and_cost(i, 6);
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
                    let pass = seen.len();
                    assert!(ids.insert(id, pass).is_none(), "request id {id} twice");
                    d.receipt = Receipt::new(d.receipt.cost(), vec![pass as u64]);
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
        // The warm-up's slot, held, is the one member of no pass seen.
        let warm: Vec<String> = server
            .conn()
            .keys(format!("{prefix}:{{slots|warm}}*"))
            .unwrap();
        let _: () = server.conn().del(warm).unwrap();
        let state = key_states(&server, &prefix, &ids);
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
