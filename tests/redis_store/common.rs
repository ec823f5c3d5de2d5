//! Helpers shared by the topics: stores, policies, and the state of keys.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use redis::Commands;
use tollgate::decision::Receipt;
use tollgate::{Decision, Key, Policy, Quota, RedisStore, Store, Strategy};

use crate::support::redis::RedisServer;

/// A concurrency limit of `limit` slots, each presumed crashed after a minute.
pub fn slots(name: &str, limit: u32) -> Policy {
    let limit = NonZeroU32::new(limit).unwrap();
    Policy::concurrency(name.to_owned(), limit, Duration::from_secs(60)).unwrap()
}

pub fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n).unwrap())
}

pub async fn store_on(url: &str, prefix: &str) -> RedisStore {
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
pub fn strategies() -> Vec<(Policy, i64)> {
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

/// One policy per strategy, small enough to exhaust in a few calls.
pub fn one_policy_per_strategy() -> [Policy; 7] {
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

pub async fn batching_store(url: &str, batching: bool) -> RedisStore {
    store_with(url, "batch", None, batching).await
}

/// A store on its own multiplexed connection, under `prefix`, on `clock`
/// if given, batching or not.
///
/// The connection waits 10 s for an answer, not redis-rs's default 500 ms:
/// a batch of thousands of slots, or an answer behind a `CLIENT PAUSE`, can
/// take longer than that on a loaded machine, and nothing here tests the
/// client's own timeout.
pub async fn store_with(
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

/// Every key under `prefix` (the prefix cut off): what it holds, and its
/// expiry in ms (-1: none), so two runs' states can be compared. A sliding
/// log's members, "<time>:<request id>:<unit>", are named by `ids` instead
/// (see [`request_ids`]), for request ids are random.
pub fn key_states(
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
pub fn request_ids(decisions: &[(Strategy, Decision)]) -> BTreeMap<u64, usize> {
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
pub fn with_named_ids(
    decisions: &[(Strategy, Decision)],
    ids: &BTreeMap<u64, usize>,
) -> Vec<Decision> {
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
pub fn caller_and_cost(i: u64, too_much: u64) -> (String, u64) {
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

/// Four checks on `key`, sent: while Redis is paused they hold every one of
/// the batcher's slots, so whatever comes next queues.
pub async fn take_every_slot(
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
