//! Failovers under steady load: a Redis Cluster primary handing over to its
//! replica (`CLUSTER FAILOVER`) or killed. Decisions never fail (the local
//! fallback covers the gap), never hang past the deadline, Redis decides
//! again once the client has noticed, and what the switch cost is measured:
//! admissions Redis never counted (lost charges, local-fallback passes).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::load::{app, Load, Report};
use crate::support::redis::{unique_prefix, RedisCluster};
use crate::{client_calls, HEAVY};
use tollgate::layer::DEFAULT_DEADLINE;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

/// Slack over the layer's deadline for a local decision and scheduling on
/// two busy cores: "nothing hangs" means no request takes longer than this.
const MARGIN: Duration = Duration::from_millis(300);

/// Large enough never to be reached, so every admission should be counted
/// and lost charges show up as `admitted - used`.
pub fn counting_policy() -> Policy {
    Policy::fixed_window("fo", Quota::per_hour(NonZeroU32::new(1_000_000).unwrap()))
}

/// What a disruption under load cost.
pub struct Cost {
    pub report: Report,
    /// Time from the start of the disruption until it was over (the
    /// topology healthy again, as the servers see it).
    pub disruption: Duration,
    /// Admissions by Redis that its counters no longer hold (writes the old
    /// primary had not replicated).
    pub lost: u64,
    /// Charges Redis holds for requests the layer had already given up on
    /// (the script ran after the deadline); these only make callers wait.
    pub extra: u64,
    /// Passes granted by the local fallback, which Redis never counted.
    pub local_passes: u64,
}

impl Cost {
    /// Admissions Redis does not know about: the most that callers could get
    /// beyond their limits because of the switch (with one app server).
    pub fn over_admission(&self) -> u64 {
        self.lost + self.local_passes
    }

    pub fn line(&self, name: &str) -> String {
        format!(
            "[{name}] {}; disruption {} ms; over-admission {} (lost charges {}, \
             local-fallback passes {}); extra charges {}",
            self.report.summary(),
            self.disruption.as_millis(),
            self.over_admission(),
            self.lost,
            self.local_passes,
            self.extra
        )
    }
}

/// Runs steady load for `callers` on `store`, calls `disrupt` (blocking; it
/// returns once the topology is healthy again), and checks that decisions
/// never failed, never hung, and came from Redis again afterwards.
pub async fn under_load(
    name: &str,
    store: Arc<dyn Store>,
    callers: Vec<String>,
    disrupt: impl FnOnce(),
) -> Cost {
    let policy = counting_policy();
    let app = app(store.clone(), policy.clone(), DEFAULT_DEADLINE);
    let load = Load::start(
        app,
        callers.clone(),
        8,
        Duration::from_millis(2),
        200_000,
        Duration::from_secs(60),
    );
    assert!(
        load.wait_for_redis_decisions(300, Duration::from_secs(10))
            .await,
        "[{name}] Redis did not decide before the disruption"
    );
    let started = Instant::now();
    tokio::task::block_in_place(disrupt);
    let disruption = started.elapsed();
    let resumed = load
        .wait_for_redis_decisions(500, Duration::from_secs(15))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A machine starved by the other topology tests can miss a deadline
    // after the switch, and the cooldown then decides locally for a while:
    // wait for that to end too.
    let settled = load.wait_for_redis_tail(100, Duration::from_secs(15)).await;
    let report = load.stop().await;

    let (mut lost, mut extra, mut local_passes) = (0, 0, 0);
    for (i, caller) in callers.iter().enumerate() {
        let (by_redis, by_local) = report.admitted(i);
        let used = store.peek(&policy, &Key::new(caller)).await.unwrap().used;
        lost += by_redis.saturating_sub(used);
        extra += used.saturating_sub(by_redis);
        local_passes += by_local;
    }
    let cost = Cost {
        report,
        disruption,
        lost,
        extra,
        local_passes,
    };
    println!("{}", cost.line(name));

    assert!(
        resumed,
        "[{name}] Redis never decided again: {}",
        cost.report.summary()
    );
    assert!(
        cost.report.failed().is_empty(),
        "[{name}] failed decisions: {:?}",
        &cost.report.failed()[..cost.report.failed().len().min(5)]
    );
    assert!(
        cost.report.max_latency() <= DEFAULT_DEADLINE + MARGIN,
        "[{name}] a request hung: {}",
        cost.report.summary()
    );
    // After the switch, the requests were Redis's again.
    assert!(
        settled,
        "[{name}] still falling back 15 s after the switch: {}",
        cost.report.summary()
    );
    cost
}

/// Callers whose keys live on primary `p` of a fresh harness cluster (which
/// gives primary p the p-th third of the slots), plus a few elsewhere.
fn callers(cluster_primaries: usize, p: usize, on_p: usize, elsewhere: usize) -> Vec<String> {
    let range = |q: usize| q * 16384 / cluster_primaries..(q + 1) * 16384 / cluster_primaries;
    let (mut mine, mut others) = (Vec::new(), Vec::new());
    for i in 0.. {
        let caller = format!("c{i}");
        let slot = usize::from(crate::support::redis::key_slot(&format!("{{fo|{caller}}}")));
        if range(p).contains(&slot) {
            if mine.len() < on_p {
                mine.push(caller);
            }
        } else if others.len() < elsewhere {
            others.push(caller);
        }
        if mine.len() == on_p && others.len() == elsewhere {
            break;
        }
    }
    mine.extend(others);
    mine
}

async fn cluster_store(cluster: &RedisCluster) -> Arc<dyn Store> {
    Arc::new(
        RedisStore::cluster(cluster.urls())
            .connect()
            .await
            .unwrap()
            .prefix(unique_prefix("failover"))
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_on_the_replica_under_load() {
    let _heavy = HEAVY.lock().await;
    let cluster = tokio::task::block_in_place(|| {
        RedisCluster::start_with_timeout(3, 1, Duration::from_millis(1000))
    });
    let store = cluster_store(&cluster).await;
    let cost = under_load(
        "cluster: CLUSTER FAILOVER",
        store,
        callers(3, 0, 24, 8),
        || {
            // Node 3 replicates primary 0; a manual failover waits for it to
            // catch up, so no write is lost.
            let _: () = redis::cmd("CLUSTER")
                .arg("FAILOVER")
                .query(&mut cluster.nodes()[3].conn())
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while cluster.node_for_slot(0) != 3 {
                assert!(Instant::now() < deadline, "the replica never took over");
                std::thread::sleep(Duration::from_millis(25));
            }
            cluster.wait_healthy();
        },
    )
    .await;
    assert_eq!(cost.lost, 0, "a manual failover loses no write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_primary_killed_under_load() {
    let _heavy = HEAVY.lock().await;
    let mut cluster = tokio::task::block_in_place(|| {
        RedisCluster::start_with_timeout(3, 1, Duration::from_millis(1000))
    });
    let store = cluster_store(&cluster).await;
    let cost = under_load(
        "cluster: primary killed",
        store,
        callers(3, 0, 24, 8),
        || {
            cluster.nodes_mut()[0].stop();
            cluster.wait_healthy();
        },
    )
    .await;
    assert_eq!(cluster.node_for_slot(0), 3);
    // Redis 7 does not replicate scripts: the promoted replica had never run
    // ours, answered NOSCRIPT, and got the source by EVAL while the dead
    // node was still in everyone's view.
    let calls = client_calls(&cluster.nodes()[3]);
    assert!(calls.get("eval").copied().unwrap_or(0) >= 1, "{calls:?}");
    assert!(cost.disruption < Duration::from_secs(20));
}
