//! Redis beyond one server: Redis Cluster, GitHub-style application
//! sharding, Sentinel, replica reads, failovers, slot migrations and clock
//! skew between app servers.
//!
//! One binary, so that its servers start once: a 3-primary cluster (one
//! replica each) and two primary+replica shards are shared by the light tests
//! (conformance, routing, replica reads). Tests that change a topology
//! (failover, resharding) start their own servers and run one at a time
//! under [`HEAVY`], so their timings are not skewed by each other.

mod support;

#[path = "topologies/clock_skew.rs"]
mod clock_skew;
#[path = "topologies/cluster.rs"]
mod cluster;
#[path = "topologies/failover.rs"]
mod failover;
#[path = "topologies/leases.rs"]
mod leases;
#[path = "topologies/load.rs"]
mod load;
#[path = "topologies/pre_check.rs"]
mod pre_check;
#[path = "topologies/resharding.rs"]
mod resharding;
#[path = "topologies/sentinel.rs"]
mod sentinel;
#[path = "topologies/sharded.rs"]
mod sharded;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use support::conformance::{Backend, T0};
pub use support::redis::{client_calls, reset_stats};
use support::redis::{start_replica_of, unique_prefix, RedisCluster, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::store::Shard;
use tollgate::RedisStore;

/// Taken by every test that starts its own servers and disturbs them.
pub static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A 3-primary, 3-replica cluster shared by the tests that leave it as it is.
pub fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let cluster = RedisCluster::start(3, 1);
        wait_replicas_listed(&cluster);
        cluster
    })
}

/// Waits until `CLUSTER SLOTS` lists a replica for every slot range on every
/// node. Redis 7 leaves out replicas whose replication offset is still 0,
/// which on a fresh cluster lasts until the primary's first write or its
/// replica ping (every 10 s by default, 1 s here); redis-rs reads the list
/// once at connect, so replica reads need it complete first.
pub fn wait_replicas_listed(cluster: &RedisCluster) {
    for node in cluster.nodes() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-ping-replica-period")
            .arg(1)
            .query(&mut node.conn())
            .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    for node in cluster.nodes() {
        loop {
            // Each range: start, end, primary, then one entry per replica.
            let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query(&mut node.conn())
                .unwrap();
            if ranges.iter().all(|r| r.len() >= 4) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "replicas never listed: {ranges:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// A primary and its replica.
pub struct Pair {
    pub primary: RedisServer,
    pub replica: RedisServer,
}

impl Pair {
    pub fn start() -> Pair {
        let primary = RedisServer::start();
        let replica = start_replica_of(&primary);
        Pair { primary, replica }
    }

    pub fn shard(&self, name: &str) -> Shard {
        Shard::new(name, self.primary.url()).replica(self.replica.url())
    }
}

/// Two independent primary+replica pairs, shared by the sharded tests.
pub fn shared_shards() -> &'static [Pair] {
    static SHARDS: OnceLock<Vec<Pair>> = OnceLock::new();
    SHARDS.get_or_init(|| vec![Pair::start(), Pair::start()])
}

async fn cluster_backend() -> Backend {
    let clock = ManualClock::new(T0);
    let store = RedisStore::cluster(shared_cluster().urls())
        .connect()
        .await
        .unwrap()
        .prefix(unique_prefix("conf"))
        .clock(clock.clone())
        .build()
        .unwrap();
    Backend::new(store, clock)
}

async fn sharded_backend() -> Backend {
    let clock = ManualClock::new(T0);
    let pairs = shared_shards();
    // Peeks read primaries here: a replica may not have applied the check
    // made a microsecond earlier, and the tables expect read-your-writes.
    let store = RedisStore::sharded([pairs[0].shard("a"), pairs[1].shard("b")])
        .connect()
        .await
        .unwrap()
        .prefix(unique_prefix("conf"))
        .clock(clock.clone())
        .build()
        .unwrap();
    Backend::new(store, clock)
}

mod cluster_conformance {
    crate::conformance_suite!(crate::cluster_backend);
}

mod sharded_conformance {
    crate::conformance_suite!(crate::sharded_backend);
}

/// Calls of the script commands alone (`evalsha`, `evalsha_ro`, `eval`, ...).
pub fn script_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    client_calls(server)
        .into_iter()
        .filter(|(name, _)| name.starts_with("eval") || name.starts_with("script"))
        .collect()
}

/// The Redis key of quota `i` for `caller` under `policy` and `prefix`.
pub fn redis_key(prefix: &str, policy: &str, caller: &str, i: usize) -> String {
    let key = tollgate::Key::new(caller);
    format!("{prefix}:{{{policy}|{}}}:fixed_window:{i}", key.as_str())
}
