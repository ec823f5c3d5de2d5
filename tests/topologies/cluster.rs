//! Redis Cluster: hash tags callers cannot steer, scripts on nodes that never
//! saw them, and peeks served by replicas.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::support::conformance::T0;
use crate::support::redis::{
    key_slot, replicas_run_scripts, unique_prefix, wait_for_replication, RedisCluster, RedisServer,
};
use crate::{redis_key, reset_stats, script_calls, shared_cluster};
use tollgate::clock::ManualClock;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

fn exists(server: &RedisServer, key: &str, replica: bool) -> bool {
    let mut conn = server.conn();
    if replica {
        // A cluster replica redirects reads to its primary unless told not to.
        let _: () = redis::cmd("READONLY").query(&mut conn).unwrap();
    }
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(&mut conn)
        .unwrap()
        == 1
}

/// The node index of the primary serving `caller`'s keys, and of its replica
/// (the harness puts primary p's replica at 3 + p).
fn owners(policy: &str, caller: &str) -> (usize, usize) {
    let cluster = shared_cluster();
    let slot = key_slot(&format!("{{{policy}|{}}}", Key::new(caller).as_str()));
    let primary = cluster.node_for_slot(slot);
    (primary, primary + 3)
}

#[tokio::test]
async fn keys_with_braces_cannot_choose_a_slot_and_never_cross_slots() {
    let cluster = shared_cluster();
    let prefix = unique_prefix("tags");
    let store = RedisStore::cluster(cluster.urls())
        .connect()
        .await
        .unwrap()
        .prefix(&prefix)
        .build()
        .unwrap();
    // Two quotas: two keys per decision, which must share a slot.
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()))
        .and(Quota::per_hour(NonZeroU32::new(100).unwrap()));
    for raw in [
        "{victim}",
        "core|victim",
        "}{",
        "a{b}c",
        "{}",
        "{core|victim}",
    ] {
        let decision = store.check(&policy, &Key::new(raw), 1).await.unwrap();
        assert!(decision.allowed, "{raw}: {decision:?}");
        let (primary, _) = owners("core", raw);
        for i in 0..2 {
            let key = redis_key(&prefix, "core", raw, i);
            assert!(
                exists(&cluster.nodes()[primary], &key, false),
                "{raw}: {key} is not on the primary of its escaped tag's slot"
            );
        }
    }
    // None of them reached the victim's budget.
    let victim = store.peek(&policy, &Key::new("victim")).await.unwrap();
    assert_eq!(victim.used, 0, "{victim:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_saw_the_script_runs_it_after_one_eval() {
    let cluster = shared_cluster();
    let store = RedisStore::cluster(cluster.urls())
        .connect()
        .await
        .unwrap()
        .prefix(unique_prefix("noscript"))
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()));
    let (primary, _) = owners("core", "fresh");
    let node = &cluster.nodes()[primary];
    // Stats first: other tests share this node, and one of them may be the
    // first to meet the flushed cache; its EVAL must stay counted.
    tokio::task::block_in_place(|| {
        for n in cluster.nodes() {
            reset_stats(n);
        }
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut node.conn())
            .unwrap();
    });

    let decision = store.check(&policy, &Key::new("fresh"), 1).await.unwrap();
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 4);

    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut node.conn())
        .unwrap();
    let cached = info
        .lines()
        .find_map(|l| l.strip_prefix("number_of_cached_scripts:"))
        .map(|n| n.trim().parse::<u64>().unwrap());
    assert_eq!(cached, Some(1), "the owning node has the script now");
    let calls = script_calls(node);
    assert!(calls.get("eval").copied().unwrap_or(0) >= 1, "{calls:?}");
    for n in cluster.nodes() {
        let calls = script_calls(n);
        assert!(
            !calls.contains_key("script|load"),
            "no SCRIPT LOAD fan-out on a cluster: :{} saw {calls:?}",
            n.port()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peeks_go_to_replicas_which_read_an_ended_window_as_empty() {
    let cluster = shared_cluster();
    let clock = ManualClock::new(T0);
    let prefix = unique_prefix("replica-reads");
    let store = RedisStore::cluster(cluster.urls())
        .read_from_replicas(true)
        .connect()
        .await
        .unwrap()
        .prefix(&prefix)
        .clock(clock.clone())
        .build()
        .unwrap();
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(3).unwrap()));
    let reader = Key::new("reader");
    for _ in 0..3 {
        assert!(store.check(&policy, &reader, 1).await.unwrap().allowed);
    }
    let rejected = store.check(&policy, &reader, 1).await.unwrap();
    assert!(!rejected.allowed);

    let (p, r) = owners("core", "reader");
    let (primary, replica) = (&cluster.nodes()[p], &cluster.nodes()[r]);
    tokio::task::block_in_place(|| {
        wait_for_replication(primary, replica);
        reset_stats(replica);
    });

    let seen = store.peek(&policy, &reader).await.unwrap();
    assert_eq!((seen.used, seen.remaining), (3, 0), "{seen:?}");

    assert_eq!(seen.reset_at_micros, rejected.reset_at_micros);
    if !replicas_run_scripts() {
        // Before Redis 7.0 no replica runs a script: the primary answered.
        let calls = script_calls(replica);
        assert!(calls.is_empty(), "a replica answered a peek: {calls:?}");
        return;
    }
    let calls = script_calls(replica);
    assert!(
        calls.keys().any(|c| c == "evalsha_ro" || c == "eval_ro"),
        "the replica answered the peek: {calls:?}"
    );

    // A minute later by the store's clock the window has ended, but in real
    // time its key lives on (and replicas never expire keys themselves): the
    // replica must report a fresh window, not an exhausted one.
    clock.advance(Duration::from_secs(61));
    assert!(exists(
        replica,
        &redis_key(&prefix, "core", "reader", 0),
        true
    ));
    let fresh = store.peek(&policy, &reader).await.unwrap();
    assert_eq!((fresh.used, fresh.remaining), (0, 3), "{fresh:?}");
    assert!(fresh.allowed);
    assert!(fresh.reset_at_micros > rejected.reset_at_micros);
}

/// The script calls every primary of `cluster` has served since its stats
/// were reset.
fn cluster_script_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .flat_map(|n| script_calls(n).into_values())
        .sum()
}

/// A batching store on `cluster`, its keys under a prefix of its own.
async fn own_store(cluster: &RedisCluster, name: &str) -> Arc<RedisStore> {
    let builder = RedisStore::cluster(cluster.urls()).connect().await.unwrap();
    Arc::new(builder.prefix(unique_prefix(name)).build().unwrap())
}

/// On one thread, as the zoo runs: every decision queues before the first
/// call comes back. A cluster of its own, so no other test's calls count.
#[tokio::test]
async fn a_flood_on_a_cluster_is_batched_per_caller_and_keeps_every_limit() {
    let cluster = RedisCluster::start(3, 0);
    let store = own_store(&cluster, "cluster-batch").await;
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(5).unwrap()))
        .and(Quota::per_hour(NonZeroU32::new(50).unwrap()));
    // Four callers on four slots.
    let callers = ["ann", "bob", "cy", "dee"];
    let slots: BTreeSet<u16> = callers
        .iter()
        .map(|c| key_slot(&format!("{{core|{}}}", Key::new(*c).as_str())))
        .collect();
    assert_eq!(slots.len(), 4, "the callers share a slot: {slots:?}");
    // Scripts cached on their nodes first: one unit of each budget.
    for caller in callers {
        assert!(
            store
                .check(&policy, &Key::new(caller), 1)
                .await
                .unwrap()
                .allowed
        );
    }
    cluster.nodes().iter().for_each(reset_stats);
    let decisions: Vec<_> = (0..400)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            let caller = callers[i % callers.len()];
            tokio::spawn(async move {
                let d = store.check(&policy, &Key::new(caller), 1).await.unwrap();
                (caller, d.allowed)
            })
        })
        .collect();
    let mut admitted = BTreeMap::new();
    for d in decisions {
        let (caller, allowed) = d.await.unwrap();
        *admitted.entry(caller).or_insert(0) += u32::from(allowed);
    }
    assert_eq!(admitted.len(), 4);
    assert!(admitted.values().all(|&n| n == 4), "{admitted:?}");
    let calls = cluster_script_calls(&cluster);
    println!("400 decisions of 4 callers on a cluster: {calls} script calls");
    // Alone, 400; per slot, one goes alone and the rest queue behind it.
    assert!(calls <= 40, "{calls} script calls for 400 decisions");
}

/// A concurrency limit's checks and releases batch on their slot too: the
/// limit holds, and every released slot is free again.
#[tokio::test]
async fn a_concurrency_flood_on_a_cluster_takes_and_frees_slots_in_batches() {
    let cluster = RedisCluster::start(1, 0);
    let store = own_store(&cluster, "cluster-conc").await;
    let ten = NonZeroU32::new(10).unwrap();
    let policy = Policy::concurrency("jobs", ten, Duration::from_secs(60)).unwrap();
    let key = Key::new("flood");
    let warm = store.check(&policy, &key, 1).await.unwrap();
    store.refund(&policy, &key, &warm.receipt).await.unwrap();
    cluster.nodes().iter().for_each(reset_stats);
    let checks: Vec<_> = (0..200)
        .map(|_| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.check(&policy, &key, 1).await.unwrap() })
        })
        .collect();
    let mut passes = Vec::new();
    for check in checks {
        let d = check.await.unwrap();
        if d.allowed {
            passes.push(d);
        }
    }
    assert_eq!(passes.len(), 10, "passes past a limit of 10");
    let releases: Vec<_> = passes
        .into_iter()
        .map(|d| {
            let (store, policy, key) = (store.clone(), policy.clone(), key.clone());
            tokio::spawn(async move { store.refund(&policy, &key, &d.receipt).await.unwrap() })
        })
        .collect();
    for release in releases {
        release.await.unwrap();
    }
    let calls = cluster_script_calls(&cluster);
    println!("200 checks and 10 releases on a cluster: {calls} script calls");
    assert!(calls <= 30, "{calls} script calls for 210 decisions");
    // Every slot is free again: ten more pass.
    for _ in 0..10 {
        assert!(store.check(&policy, &key, 1).await.unwrap().allowed);
    }
    assert!(!store.check(&policy, &key, 1).await.unwrap().allowed);
}

/// The keys of every script call since `server`'s slow log was emptied (it
/// logs every command), for the calls whose keys begin with `prefix`: the
/// first 28 or so of a long call's, as the log keeps them.
fn keys_per_call(server: &RedisServer, prefix: &str) -> Vec<BTreeSet<String>> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(&mut server.conn())
        .unwrap();
    let text = |v: &redis::Value| redis::from_redis_value::<String>(v.clone()).unwrap_or_default();
    entries
        .iter()
        .filter_map(|entry| {
            let redis::Value::Array(fields) = entry else {
                return None;
            };
            let redis::Value::Array(args) = fields.get(3)? else {
                return None;
            };
            let name = text(args.first()?).to_lowercase();
            if !name.starts_with("eval") {
                return None;
            }
            // The slow log keeps 32 arguments of a call, the last saying
            // how many more there were.
            let n: usize = text(args.get(2)?).parse().ok()?;
            let shown = &args[3..(3 + n).min(args.len())];
            let keys: BTreeSet<String> = shown
                .iter()
                .map(text)
                .filter(|k| !k.starts_with("... ("))
                .collect();
            keys.iter().all(|k| k.starts_with(prefix)).then_some(keys)
        })
        .collect()
}

/// Callers of a sliding log share its resource key, one slot: on a cluster
/// their decisions batch apart, each call on one caller's keys, so no call
/// holds keys a slot migration could split beyond one decision's own, and
/// callers do not queue behind one another's calls.
#[tokio::test]
async fn callers_sharing_a_slot_never_share_a_call() {
    let cluster = RedisCluster::start(1, 0);
    let node = &cluster.nodes()[0];
    for (setting, value) in [
        ("slowlog-log-slower-than", "0"),
        ("slowlog-max-len", "100000"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(setting)
            .arg(value)
            .query(&mut node.conn())
            .unwrap();
    }
    let prefix = unique_prefix("one-caller");
    let builder = RedisStore::cluster(cluster.urls()).connect().await.unwrap();
    let store = Arc::new(builder.prefix(&prefix).build().unwrap());
    let hourly = |n| Quota::per_hour(NonZeroU32::new(n).unwrap());
    let policy = Policy::sliding_log("log", hourly(1_000), hourly(10));
    for caller in ["a", "b", "c", "d", "e"] {
        store.check(&policy, &Key::new(caller), 1).await.unwrap();
    }
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query(&mut node.conn())
        .unwrap();
    let decisions: Vec<_> = (0..200)
        .map(|i| {
            let (store, policy) = (store.clone(), policy.clone());
            let caller = ["a", "b", "c", "d", "e"][i % 5];
            tokio::spawn(async move { store.check(&policy, &Key::new(caller), 1).await.unwrap() })
        })
        .collect();
    let mut admitted = 0;
    for d in decisions {
        admitted += u32::from(d.await.unwrap().allowed);
    }
    assert_eq!(admitted, 5 * 9, "nine more each, after the first");
    let calls = keys_per_call(node, &prefix);
    assert!(
        calls.len() < 200,
        "the callers' floods batch: {} calls",
        calls.len()
    );
    for keys in &calls {
        assert_eq!(
            keys.len(),
            2,
            "one caller's resource and consumer keys: {keys:?}"
        );
    }
}

/// A runtime that shuts down while a batch's task holds a call in flight
/// (a second runtime, dropped mid-flood) must not leave that call counted:
/// with one call at a time per caller, later decisions on the caller's keys
/// would queue for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_shut_down_mid_batch_leaves_no_caller_stuck() {
    let cluster = RedisCluster::start(1, 0);
    let store = own_store(&cluster, "shut-down").await;
    let policy = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(100_000).unwrap()));
    let key = Key::new("bob");
    store.check(&policy, &key, 1).await.unwrap();
    for round in 0..20u64 {
        let (store2, policy2, key2) = (store.clone(), policy.clone(), key.clone());
        tokio::task::spawn_blocking(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                for _ in 0..20 {
                    let (store, policy, key) = (store2.clone(), policy2.clone(), key2.clone());
                    tokio::spawn(async move { store.check(&policy, &key, 1).await });
                }
                // Let the first call go out, and at times come back.
                tokio::time::sleep(Duration::from_micros(100 * (round % 10))).await;
            });
        })
        .await
        .unwrap();
        let later = tokio::time::timeout(Duration::from_secs(2), store.check(&policy, &key, 1));
        assert!(
            later.await.is_ok(),
            "round {round}: bob's decisions are stuck"
        );
    }
}
