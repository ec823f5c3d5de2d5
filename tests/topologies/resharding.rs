//! A slot holding live limiter keys moves between primaries while decisions
//! run: `ASK` during the migration, `TRYAGAIN` while a decision's two keys
//! are split between nodes, `MOVED` afterwards. No decision may fail, and
//! every admission must be counted exactly once.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::thread::sleep;
use std::time::Duration;

use crate::load::{app, Load, Outcome};
use crate::support::redis::{key_slot, unique_prefix, RedisCluster, RedisServer};
use crate::HEAVY;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

fn cmd(server: &RedisServer, args: &[&str]) -> redis::Value {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut server.conn())
        .unwrap_or_else(|e| panic!(":{} {args:?}: {e}", server.port()))
}

fn node_id(server: &RedisServer) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut server.conn())
        .unwrap()
}

/// What `redis-cli --cluster reshard` does for one slot, one key per
/// `MIGRATE`, pausing between steps so that decisions meet every state.
fn migrate_slot(cluster: &RedisCluster, slot: u16, from: usize, to: usize, pause: Duration) {
    let (src, dst) = (&cluster.nodes()[from], &cluster.nodes()[to]);
    let (src_id, dst_id) = (node_id(src), node_id(dst));
    let slot = slot.to_string();
    cmd(dst, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
    cmd(src, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
    sleep(pause);
    let mut moved = 0;
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(&slot)
            .arg(1)
            .query(&mut src.conn())
            .unwrap();
        let Some(key) = keys.first() else { break };
        let port = dst.port().to_string();
        cmd(
            src,
            &["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", key],
        );
        moved += 1;
        sleep(pause / 4);
    }
    assert!(moved > 0, "the slot held no live keys");
    sleep(pause);
    cmd(dst, &["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    cmd(src, &["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
    for (i, node) in cluster.nodes().iter().enumerate() {
        if i != from && i != to {
            cmd(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_live_slot_fails_no_decision_and_loses_no_count() {
    let _heavy = HEAVY.lock().await;
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0));
    let prefix = unique_prefix("reshard");
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::cluster(cluster.urls())
            .connect()
            .await
            .unwrap()
            .prefix(&prefix)
            .build()
            .unwrap(),
    );
    // Two quotas: each decision touches two keys of the slot.
    let policy = Policy::fixed_window("rs", Quota::per_hour(NonZeroU32::new(1_000_000).unwrap()))
        .and(Quota::new(1_000_000, Duration::from_secs(86_400)).unwrap());
    let slot = key_slot("{rs|r0}");
    let callers: Vec<String> = (0..)
        .map(|i| format!("r{i}"))
        .filter(|c| key_slot(&format!("{{rs|{c}}}")) == slot)
        .take(4)
        .collect();
    let from = usize::from(slot) * 3 / 16384;
    let to = (from + 1) % 3;

    // A deadline far above a redirection's cost: any local decision here
    // would mean Redis failed to decide.
    let app = app(store.clone(), policy.clone(), Duration::from_secs(2));
    let load = Load::start(
        app,
        callers.clone(),
        6,
        Duration::from_millis(2),
        200_000,
        Duration::from_secs(60),
    );
    assert!(
        load.wait_for_redis_decisions(200, Duration::from_secs(10))
            .await
    );
    tokio::task::block_in_place(|| {
        for node in cluster.nodes() {
            crate::reset_stats(node);
        }
        migrate_slot(&cluster, slot, from, to, Duration::from_millis(300));
        cluster.wait_healthy();
    });
    assert_eq!(cluster.node_for_slot(slot), to);
    assert!(
        load.wait_for_redis_decisions(300, Duration::from_secs(10))
            .await
    );
    let report = load.stop().await;
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut cluster.nodes()[from].conn())
        .unwrap();
    let asking = crate::client_calls(&cluster.nodes()[to])
        .get("asking")
        .copied()
        .unwrap_or(0);
    println!(
        "[cluster: slot {slot} moved from node {from} to {to}] {}; {asking} ASKING on the target; \
         source replied {}",
        report.summary(),
        errors
            .lines()
            .filter(|l| l.starts_with("errorstat"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(asking > 0, "decisions met the slot mid-migration");

    assert_eq!(
        report.count(|o| !matches!(o, Outcome::Redis { allowed: true })),
        0,
        "every decision came from Redis and passed: {}",
        report.summary()
    );
    for (i, caller) in callers.iter().enumerate() {
        let (by_redis, _) = report.admitted(i);
        let used = store.peek(&policy, &Key::new(caller)).await.unwrap().used;
        assert_eq!(
            used, by_redis,
            "{caller}: counted {used}, admitted {by_redis}"
        );
        let key = crate::redis_key(&prefix, "rs", caller, 0);
        let on_dst: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut cluster.nodes()[to].conn())
            .unwrap();
        assert_eq!(on_dst, 1, "{key} moved with its slot");
    }
}
