//! Batching: concurrent decisions share script calls, decide as they would
//! alone, and leave the same keys; queued decisions whose request gave up
//! cost nothing.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use redis::Commands;
use tollgate::error::StoreErrorKind;
use tollgate::{Decision, Key, Policy, Quota, RedisStore, Store, Strategy};

use crate::common::*;
use crate::support;
use crate::support::redis::{client_calls, command_calls, reset_stats, RedisServer};

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
async fn a_queued_decision_whose_request_gave_up_is_never_charged() {
    let server = RedisServer::start();
    let store = std::sync::Arc::new(batching_store(&server.url(), true).await);
    let policy = Policy::fixed_window("core", per_minute(100));
    store.check(&policy, &Key::new("k"), 1).await.unwrap();

    server.pause_clients(Duration::from_millis(300));
    // The rest queue, and their requests give up (as the layer's deadline
    // would).
    let sent = take_every_slot(&store, &policy, &Key::new("k")).await;
    for _ in 0..10 {
        let gave_up = tokio::time::timeout(
            Duration::from_millis(10),
            store.check(&policy, &Key::new("k"), 1),
        )
        .await;
        assert!(gave_up.is_err(), "Redis is paused: nothing can answer yet");
    }
    for d in sent {
        assert!(d.await.unwrap().unwrap().allowed);
    }
    let after = store.check(&policy, &Key::new("k"), 1).await.unwrap();
    assert_eq!(
        after.used, 6,
        "1 + 4 sent + this one; the 10 that gave up cost nothing"
    );
}

#[tokio::test]
async fn calls_in_flight_sets_how_many_decisions_go_out_before_the_rest_queue() {
    // Six decisions while Redis is paused: as many as the store allows in
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
            server.pause_clients(Duration::from_millis(100));
            let sent: Vec<_> = (0..6)
                .map(|_| {
                    let (store, policy) = (store.clone(), policy.clone());
                    tokio::spawn(async move { store.check(&policy, &Key::new(key), 1).await })
                })
                .collect();
            tokio::task::yield_now().await;
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
