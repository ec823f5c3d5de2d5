//! Decisions per second and Redis commands per decision on one Redis (alone,
//! and with a replica), a 3-primary Redis Cluster (one replica each; with
//! batching and without) and 2 application shards (one replica each), with
//! the same load, in one run.
//!
//! ```sh
//! cargo run --release --all-features --example topology_bench   # 3 rounds of 4 s per topology, 64 in flight
//! BENCH_ROUNDS=5 BENCH_SECS=5 BENCH_CONCURRENCY=128 cargo run --release --all-features --example topology_bench
//! BENCH_CALLERS=1 cargo run --release --all-features --example topology_bench   # one caller's flood (default 10,000)
//! BENCH_ONLY=cluster cargo run --release --all-features --example topology_bench # the topologies named so
//! ```
//!
//! It starts its own `redis-server` processes on free loopback ports (the
//! test harness's), never the system Redis, and runs the topologies in turn,
//! round after round, so that other load on the machine hits them alike;
//! it prints the median rate of the rounds and every round's rate. Every process shares this
//! machine's cores with the load generator, so the ratios say what these
//! topologies cost per decision here, not how they scale over machines: the
//! CPU line shows where the time went.

#[allow(dead_code, unused_imports)]
#[path = "../tests/support/redis.rs"]
mod harness;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{start_replica_of, RedisCluster, RedisServer};
use tollgate::store::Shard;
use tollgate::{Key, Policy, Quota, RedisStore, Store};

/// Commands our scripts run inside Redis, and what replicas and this
/// program's own bookkeeping send to primaries: not what a decision costs a
/// client.
const NOT_SENT_BY_CLIENTS: &[&str] = &[
    "time",
    "hmget",
    "hset",
    "pexpire",
    "hincrby",
    "info",
    "config|resetstat",
    "replconf",
    "psync",
    "sync",
];

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One topology under test: its store, the servers clients talk to (whose
/// commands are counted) and every server (whose CPU is counted).
struct Topology<'a> {
    name: &'static str,
    store: Arc<dyn Store>,
    primaries: Vec<&'a RedisServer>,
    all: Vec<&'a RedisServer>,
}

/// What one round measured.
struct Round {
    rate: f64,
    commands: BTreeMap<String, u64>,
    decisions: u64,
    failures: u64,
    client_cpu: f64,
    redis_cpu: f64,
    wall: f64,
}

fn main() {
    let secs = env("BENCH_SECS", 4);
    let rounds = env("BENCH_ROUNDS", 3) as usize;
    let concurrency = env("BENCH_CONCURRENCY", 64) as usize;
    // Few callers (a flood) is where batching on a cluster shows: a batch
    // holds decisions of one hash slot.
    let callers = env("BENCH_CALLERS", 10_000).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    let single = RedisServer::start();
    let replicated = RedisServer::start();
    let replicated_replica = start_replica_of(&replicated);
    let cluster = RedisCluster::start(3, 1);
    let pairs: Vec<(RedisServer, RedisServer)> = (0..2)
        .map(|_| {
            let primary = RedisServer::start();
            let replica = start_replica_of(&primary);
            (primary, replica)
        })
        .collect();

    let topologies = runtime.block_on(async {
        let single_store = RedisStore::connect(&single.url()).await.expect("connect");
        let replicated_store = RedisStore::connect(&replicated.url())
            .await
            .expect("connect");
        let cluster_store = RedisStore::cluster(cluster.urls())
            .connect()
            .await
            .expect("connect")
            .build()
            .expect("store");
        let cluster_alone = RedisStore::cluster(cluster.urls())
            .connect()
            .await
            .expect("connect")
            .batching(false)
            .build()
            .expect("store");
        let sharded_store = RedisStore::sharded([
            Shard::new("a", pairs[0].0.url()).replica(pairs[0].1.url()),
            Shard::new("b", pairs[1].0.url()).replica(pairs[1].1.url()),
        ])
        .connect()
        .await
        .expect("connect")
        .build()
        .expect("store");
        vec![
            Topology {
                name: "single Redis",
                store: Arc::new(single_store),
                primaries: vec![&single],
                all: vec![&single],
            },
            Topology {
                name: "single Redis + 1 replica",
                store: Arc::new(replicated_store),
                primaries: vec![&replicated],
                all: vec![&replicated, &replicated_replica],
            },
            Topology {
                name: "cluster, batching off",
                store: Arc::new(cluster_alone),
                primaries: cluster.nodes()[..3].iter().collect(),
                all: cluster.nodes().iter().collect(),
            },
            Topology {
                name: "cluster, 3 primaries x 1",
                store: Arc::new(cluster_store),
                primaries: cluster.nodes()[..3].iter().collect(),
                all: cluster.nodes().iter().collect(),
            },
            Topology {
                name: "2 shards x 1 replica",
                store: Arc::new(sharded_store),
                primaries: pairs.iter().map(|(p, _)| p).collect(),
                all: pairs.iter().flat_map(|(p, r)| [p, r]).collect(),
            },
        ]
    });
    // BENCH_ONLY: run the topologies whose name holds this text.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let topologies: Vec<Topology> = topologies
        .into_iter()
        .filter(|t| t.name.contains(only.as_str()))
        .collect();

    println!(
        "tollgate topology bench: fixed window, {callers} callers, {concurrency} decisions in \
         flight, {rounds} interleaved rounds of {secs} s per topology, {cores} cores, client \
         runtime with 2 workers"
    );
    let mut results: Vec<Vec<Round>> = topologies.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (t, topology) in topologies.iter().enumerate() {
            let round = runtime.block_on(measure(topology, secs, concurrency, callers));
            results[t].push(round);
        }
    }

    println!(
        "{:<26} {:>12} {:>10} {:>9} {:>14}  rounds; CPU s (client / redis) of core-s; \
         commands per decision",
        "topology", "decisions/s", "vs single", "cmds/dec", "CPU µs/dec"
    );
    let median = |rounds: &[Round]| {
        let mut rates: Vec<f64> = rounds.iter().map(|r| r.rate).collect();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let baseline = median(&results[0]);
    for (topology, rounds) in topologies.iter().zip(&results) {
        let rate = median(rounds);
        let decisions: u64 = rounds.iter().map(|r| r.decisions).sum();
        let failures: u64 = rounds.iter().map(|r| r.failures).sum();
        let mut commands: BTreeMap<&str, u64> = BTreeMap::new();
        for round in rounds {
            for (c, n) in &round.commands {
                *commands.entry(c).or_default() += n;
            }
        }
        let per_decision = commands.values().sum::<u64>() as f64 / decisions.max(1) as f64;
        let breakdown: Vec<String> = commands
            .iter()
            .map(|(c, n)| format!("{c} {:.4}", *n as f64 / decisions.max(1) as f64))
            .collect();
        let each: Vec<String> = rounds.iter().map(|r| format!("{:.0}", r.rate)).collect();
        let client_cpu: f64 = rounds.iter().map(|r| r.client_cpu).sum();
        let redis_cpu: f64 = rounds.iter().map(|r| r.redis_cpu).sum();
        let core_secs: f64 = rounds.iter().map(|r| r.wall).sum::<f64>() * cores as f64;
        let micros = |cpu: f64| cpu * 1e6 / decisions.max(1) as f64;
        println!(
            "{:<26} {rate:>12.0} {:>10.2} {per_decision:>9.4} {:>14}  [{}]; {client_cpu:.1} / {redis_cpu:.1} of {core_secs:.1}; {}{}",
            topology.name,
            rate / baseline,
            format!("{:.1} + {:.1}", micros(client_cpu), micros(redis_cpu)),
            each.join(" "),
            breakdown.join(", "),
            if failures > 0 {
                format!("; {failures} FAILED")
            } else {
                String::new()
            }
        );
    }
}

/// Runs the load on one topology for `secs` seconds.
async fn measure(topology: &Topology<'_>, secs: u64, concurrency: usize, callers: u64) -> Round {
    let policy = Arc::new(Policy::fixed_window(
        "bench",
        Quota::per_minute(NonZeroU32::new(1_000_000_000).unwrap()),
    ));
    // Warm up: connections open, scripts cached on every node.
    run(
        &topology.store,
        &policy,
        concurrency,
        callers,
        Duration::from_millis(300),
    )
    .await;
    for node in &topology.primaries {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut node.conn())
            .expect("CONFIG RESETSTAT");
    }
    let redis_cpu_before: f64 = topology.all.iter().map(|n| redis_cpu(n)).sum();
    let client_cpu_before = own_cpu();
    let started = Instant::now();
    let (decisions, failures) = run(
        &topology.store,
        &policy,
        concurrency,
        callers,
        Duration::from_secs(secs),
    )
    .await;
    let wall = started.elapsed().as_secs_f64();
    let client_cpu = own_cpu() - client_cpu_before;
    let redis_cpu = topology.all.iter().map(|n| redis_cpu(n)).sum::<f64>() - redis_cpu_before;
    let mut commands: BTreeMap<String, u64> = BTreeMap::new();
    for node in &topology.primaries {
        for (command, calls) in command_calls(node) {
            *commands.entry(command).or_default() += calls;
        }
    }
    Round {
        rate: decisions as f64 / wall,
        commands,
        decisions,
        failures,
        client_cpu,
        redis_cpu,
        wall,
    }
}

/// `concurrency` tasks deciding for random callers until `time` is up:
/// (decisions, failures).
async fn run(
    store: &Arc<dyn Store>,
    policy: &Arc<Policy>,
    concurrency: usize,
    callers: u64,
    time: Duration,
) -> (u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let decisions = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let (store, policy, stop, decisions, failures) = (
                store.clone(),
                policy.clone(),
                stop.clone(),
                decisions.clone(),
                failures.clone(),
            );
            tokio::spawn(async move {
                let mut x =
                    0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = Key::new(format!("caller-{}", x % callers));
                    match store.check(&policy, &key, 1).await {
                        Ok(_) => decisions.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failures.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    tokio::time::sleep(time).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("a load task");
    }
    (
        decisions.load(Ordering::Relaxed),
        failures.load(Ordering::Relaxed),
    )
}

/// Client-sent `calls` per command on `server`, from `INFO commandstats`.
fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| !NOT_SENT_BY_CLIENTS.contains(&name.as_str()))
        .collect()
}

/// CPU seconds `server` has used (user + system, all its threads).
fn redis_cpu(server: &RedisServer) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query(&mut server.conn())
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

/// CPU seconds this process has used, from `/proc/self/stat` (0 elsewhere).
fn own_cpu() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses: utime is the
    // 12th and stime the 13th of them, in clock ticks (100 per second).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
