//! What one decision costs, per strategy in `examples/support/lineup.rs`.
//!
//! - `memory_single_key`, `memory_100k_keys`, `memory_rejecting`: the memory
//!   store's `check`, on one hot key, round-robin over 100,000 keys, and on a
//!   key whose budget is spent. For the concurrency limit a passing decision
//!   is a check and the release of its slot, as a request makes them.
//! - `layer`: a request through an axum `Router` in-process (no sockets) with
//!   no limiter, with a limiter that passes, and with one that rejects; the
//!   handler is the zoo's.
//! - `redis_c1`, `redis_c64`: `RedisStore::check` over one multiplexed
//!   connection with 1 and 64 decisions in flight, each strategy beside
//!   `bare/<strategy>`: a plain redis-rs client sending, through the same
//!   kind of connection, the very commands the store sends for one decision
//!   alone (read back from Redis's SLOWLOG: the strategy's script by
//!   `EVALSHA` with the same arguments, and a concurrency slot's release),
//!   so the store's own cost shows as a ratio measured in the same run. Both
//!   decide for one caller (one key each).
//! - `redis_c64_crowd`: the same at 64 in flight for 10,000 callers taking
//!   turns, fixed window only, where batching cannot lean on one key.
//!
//! ```text
//! cargo bench --bench decision              # everything, a few minutes
//! cargo bench --bench decision -- memory    # criterion's name filter
//! REDIS_URL=redis://127.0.0.1:7000/ cargo bench --bench decision -- redis
//! ```
//!
//! Without `REDIS_URL` the bench starts its own `redis-server` (no
//! persistence) on a free port. Give it a server of its own either way: to
//! capture the store's commands it sets `slowlog-log-slower-than` to 0 for a
//! moment and resets the slow log, and another client's scripts would be
//! captured too. After criterion's output it prints a summary
//! with medians and the ratios that `BENCHMARKS.md` tracks.

#[path = "../examples/support/lineup.rs"]
mod lineup;
#[allow(dead_code, unused_imports)]
#[path = "../tests/support/redis.rs"]
mod redis_support;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{body::Body, Json, Router};
use criterion::{Bencher, Criterion, Throughput};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tollgate::{Key, MemoryStore, Policy, Quota, RateLimitLayer, RedisStore, Store, Strategy};
use tower::ServiceExt;

/// Criterion's samples per benchmark; the summary keeps the last this many.
const SAMPLES: usize = 60;
/// Decisions in flight for the concurrent Redis benchmarks.
const IN_FLIGHT: usize = 64;
/// Distinct keys for the many-keys benchmark.
const MANY_KEYS: usize = 100_000;
/// Distinct callers taking turns in the Redis crowd benchmark.
const CROWD: usize = 10_000;

/// A budget no benchmark run spends: every check passes, except where a
/// strategy cannot pass that fast on one key (the uniform gate passes one
/// call per millisecond; the sliding log keeps at most a million entries).
fn roomy() -> Quota {
    // One unit per microsecond: the fastest GCRA and leaky bucket allowed,
    // faster than anything measured here, so the leaky bucket never delays.
    Quota::new(3_600_000_000, Duration::from_secs(3600)).unwrap()
}

/// One unit an hour: after the first check, every check is rejected.
fn tight() -> Quota {
    Quota::new(1, Duration::from_secs(3600)).unwrap()
}

/// ns per iteration of every sample criterion took, by benchmark id.
static RECORDED: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// Times `run(iters)` as criterion asks, and remembers each sample for the
/// summary (criterion's own estimates are printed as usual).
fn sampled(b: &mut Bencher, id: String, mut run: impl FnMut(u64) -> Duration) {
    b.iter_custom(|iters| {
        let took = run(iters);
        let ns = took.as_nanos() as f64 / iters.max(1) as f64;
        RECORDED
            .lock()
            .unwrap()
            .entry(id.clone())
            .or_default()
            .push(ns);
        took
    });
}

/// The median ns per iteration of a benchmark's measured samples (warm-up
/// samples come first and are left out).
fn median_ns(id: &str) -> Option<f64> {
    let recorded = RECORDED.lock().unwrap();
    let all = recorded.get(id)?;
    let mut last: Vec<f64> = all[all.len().saturating_sub(SAMPLES)..].to_vec();
    last.sort_by(f64::total_cmp);
    last.get(last.len() / 2).copied()
}

fn memory(c: &mut Criterion) {
    let hot = Key::new("hot");
    let many: Vec<Key> = (0..MANY_KEYS)
        .map(|i| Key::new(format!("caller-{i}")))
        .collect();

    let mut group = c.benchmark_group("memory_single_key");
    group.throughput(Throughput::Elements(1));
    for policy in lineup::lineup(roomy()) {
        let store = MemoryStore::new();
        let id = format!("memory_single_key/{}", policy.name());
        group.bench_function(policy.name(), |b| {
            sampled(b, id.clone(), |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(decide_now(&store, &policy, &hot));
                }
                start.elapsed()
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("memory_100k_keys");
    group.throughput(Throughput::Elements(1));
    for policy in lineup::lineup(roomy()) {
        let store = MemoryStore::new();
        for key in &many {
            decide_now(&store, &policy, key);
        }
        let id = format!("memory_100k_keys/{}", policy.name());
        let mut next = 0;
        group.bench_function(policy.name(), |b| {
            sampled(b, id.clone(), |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(decide_now(&store, &policy, &many[next]));
                    next = (next + 1) % MANY_KEYS;
                }
                start.elapsed()
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("memory_rejecting");
    group.throughput(Throughput::Elements(1));
    for policy in lineup::lineup(tight()) {
        let store = MemoryStore::new();
        // Spend the budget of 1 (a concurrency slot stays held).
        store
            .check(&policy, &hot, 1)
            .now_or_never()
            .unwrap()
            .unwrap();
        let id = format!("memory_rejecting/{}", policy.name());
        group.bench_function(policy.name(), |b| {
            sampled(b, id.clone(), |iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(decide_now(&store, &policy, &hot));
                }
                start.elapsed()
            })
        });
    }
    group.finish();
}

/// One decision, as a request makes it: a concurrency slot taken on a pass
/// is given back, as the layer does when the response ends. The memory
/// store answers without waiting; anything else is a bug here.
fn decide_now(store: &MemoryStore, policy: &Policy, key: &Key) -> bool {
    let decision = store
        .check(policy, key, 1)
        .now_or_never()
        .expect("the memory store decides without waiting")
        .expect("the memory store does not fail");
    if decision.allowed && holds(policy) {
        store
            .refund(policy, key, &decision.receipt)
            .now_or_never()
            .expect("the memory store releases without waiting")
            .expect("the memory store does not fail");
    }
    decision.allowed
}

/// Whether a pass holds its charge until the response ends (and a decision
/// therefore costs a check and a release).
fn holds(policy: &Policy) -> bool {
    matches!(policy.strategy(), Strategy::Concurrency)
}

/// The zoo's limited handler, so the layer's cost is measured against the
/// same work the load test serves.
async fn tigerfeeding(headers: HeaderMap) -> Response {
    const ETAG: &str = "\"tiger-feeding-v1\"";
    if headers
        .get("if-none-match")
        .is_some_and(|v| v.as_bytes() == ETAG.as_bytes())
    {
        return (StatusCode::NOT_MODIFIED, [("etag", ETAG)]).into_response();
    }
    (
        [("etag", ETAG), ("cache-control", "no-cache")],
        Json(serde_json::json!({ "feeding": "tigers", "at": "12:00", "zone": "big cats" })),
    )
        .into_response()
}

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let peer = ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40000)));
    let request = move || {
        let mut req = Request::get("/t").body(Body::empty()).unwrap();
        req.extensions_mut().insert(peer);
        req
    };
    let serve = |app: &Router, expect: StatusCode, iters: u64| {
        rt.block_on(async {
            let start = Instant::now();
            for i in 0..iters {
                let response = app.clone().oneshot(request()).await.unwrap();
                debug_assert_eq!(response.status(), expect);
                drop(black_box(response));
                if i % 16 == 15 {
                    // Lets concurrency slots' releases (spawned tasks) run,
                    // as a server's runtime would; the same for every variant.
                    // (Every 64 was not enough: the current-thread scheduler
                    // runs only part of the queue per yield, and the
                    // in-flight set grew without end.)
                    tokio::task::yield_now().await;
                }
            }
            start.elapsed()
        })
    };

    let mut group = c.benchmark_group("layer");
    group.throughput(Throughput::Elements(1));
    let bare = Router::new().route("/t", get(tigerfeeding));
    group.bench_function("none", |b| {
        sampled(b, "layer/none".into(), |iters| {
            serve(&bare, StatusCode::OK, iters)
        })
    });
    let mut held = Vec::new();
    for (how, quota, status) in [
        ("pass", roomy(), StatusCode::OK),
        ("reject", tight(), StatusCode::TOO_MANY_REQUESTS),
    ] {
        for policy in lineup::lineup(quota) {
            let name = format!("{how}/{}", policy.name());
            let limit = RateLimitLayer::builder()
                .policy(policy)
                .store(MemoryStore::new())
                .build()
                .unwrap();
            let app = Router::new().route("/t", get(tigerfeeding).layer(limit));
            // Spend the tight budget so that every measured call is a 429
            // (a concurrency slot stays held: the response is kept).
            let first = rt.block_on(app.clone().oneshot(request())).unwrap();
            held.push(first);
            group.bench_function(&name, |b| {
                sampled(b, format!("layer/{name}"), |iters| {
                    serve(&app, status, iters)
                })
            });
        }
    }
    group.finish();
}

fn redis(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Our own server unless one is given; it lives until this function ends.
    let (_server, url) = match std::env::var("REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => (None, url),
        _ => {
            let server = redis_support::RedisServer::start();
            let url = server.url();
            (Some(server), url)
        }
    };
    // TCP_NODELAY, as the store's own constructors set it.
    let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
        .unwrap()
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info).unwrap();
    let conn = rt
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();

    let store = RedisStore::from_connection(conn.clone())
        .prefix("tollgate-bench")
        .build()
        .unwrap();

    let quota = roomy();
    let policies = lineup::lineup(quota);
    let key = Key::new("127.0.0.1");
    // The bare client replays what the store sends for a decision, on keys
    // of its own (another prefix), so the two never share a counter.
    let capturing = RedisStore::from_connection(conn.clone())
        .prefix("tollgate-bare")
        .build()
        .unwrap();
    let replays: Vec<Replay> = policies
        .iter()
        .map(|policy| rt.block_on(Replay::capture(&conn, &capturing, policy, &key)))
        .collect();
    let fresh = std::cell::Cell::new(1u64);
    let next_id = || {
        let id = fresh.get();
        fresh.set(id + 1);
        id
    };

    for (group_name, window) in [("redis_c1", 1), ("redis_c64", IN_FLIGHT)] {
        let mut group = c.benchmark_group(group_name);
        group.throughput(Throughput::Elements(1));
        for (policy, replay) in policies.iter().zip(&replays) {
            let bare = format!("bare/{}", policy.name());
            group.bench_function(&bare, |b| {
                sampled(b, format!("{group_name}/{bare}"), |iters| {
                    rt.block_on(windowed(iters, window, || replay.send(&conn, next_id())))
                })
            });
            group.bench_function(policy.name(), |b| {
                sampled(b, format!("{group_name}/{}", policy.name()), |iters| {
                    rt.block_on(windowed(iters, window, || passes(&store, policy, &key)))
                })
            });
        }
        group.finish();
    }

    // A crowd: 64 in flight again, the callers taking turns, so no two
    // decisions in a row share a key and the batch's shortcuts for one
    // caller's flood (a repeated decision sent as `=`, one read and write of
    // the key per batch) never fire. Fixed window only.
    let name = |i: usize| format!("10.0.{}.{}", i / 256, i % 256);
    let callers: Vec<Key> = (0..CROWD).map(|i| Key::new(name(i))).collect();
    let fixed_window = &policies[0];
    let stand_in = Key::new("crowd-caller");
    let crowd_replay = rt.block_on(Replay::capture(&conn, &capturing, fixed_window, &stand_in));
    let bare_callers: Vec<Replay> = (0..CROWD)
        .map(|i| crowd_replay.for_caller(stand_in.as_str(), &name(i)))
        .collect();
    let turn = std::cell::Cell::new(0usize);
    let next = || {
        let i = turn.get();
        turn.set((i + 1) % CROWD);
        i
    };
    let mut group = c.benchmark_group("redis_c64_crowd");
    group.throughput(Throughput::Elements(1));
    let bare = format!("bare/{}", fixed_window.name());
    group.bench_function(&bare, |b| {
        sampled(b, format!("redis_c64_crowd/{bare}"), |iters| {
            rt.block_on(windowed(iters, IN_FLIGHT, || {
                bare_callers[next()].send(&conn, next_id())
            }))
        })
    });
    group.bench_function(fixed_window.name(), |b| {
        sampled(
            b,
            format!("redis_c64_crowd/{}", fixed_window.name()),
            |iters| {
                rt.block_on(windowed(iters, IN_FLIGHT, || {
                    passes(&store, fixed_window, &callers[next()])
                }))
            },
        )
    });
    group.finish();
}

/// The commands one decision by the store sends Redis (a check, and for a
/// concurrency slot its release), read back from Redis's SLOWLOG while it
/// logs every command, so the bare client sends the same scripts with the
/// same arguments as the store, by construction. Request ids (the sliding
/// log's, the concurrency limit's) are the values that differ between two
/// captured decisions: each replay gets a fresh one, the same wherever one
/// id appears (a check and its release).
struct Replay {
    /// Each command's words: name, SHA, key count, keys, arguments.
    commands: Vec<Vec<Vec<u8>>>,
    /// (command, word) that carries a request id, and which of the ids.
    ids: Vec<(usize, usize, u64)>,
    /// How many distinct ids one decision carries.
    distinct: u64,
}

/// The commands, one per line, each request id shown as `<id N>`.
impl std::fmt::Display for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, words) in self.commands.iter().enumerate() {
            for (j, word) in words.iter().enumerate() {
                match self.ids.iter().find(|&&(c, w, _)| (c, w) == (i, j)) {
                    Some((_, _, which)) => write!(f, " <id {which}>")?,
                    None => write!(f, " {}", String::from_utf8_lossy(word))?,
                }
            }
            write!(f, ";")?;
        }
        Ok(())
    }
}

impl Replay {
    async fn capture(
        conn: &redis::aio::MultiplexedConnection,
        store: &RedisStore,
        policy: &Policy,
        key: &Key,
    ) -> Replay {
        let mut admin = conn.clone();
        // Once unlogged, so the scripts are loaded and EVALSHA is what the
        // store sends from then on.
        passes(store, policy, key).await;
        let (_, threshold): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg("slowlog-log-slower-than")
            .query_async(&mut admin)
            .await
            .unwrap();
        let set_threshold = |value: &str| {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("SET").arg("slowlog-log-slower-than").arg(value);
            cmd
        };
        let () = set_threshold("0").query_async(&mut admin).await.unwrap();
        let () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut admin)
            .await
            .unwrap();
        passes(store, policy, key).await;
        passes(store, policy, key).await;
        let () = set_threshold(&threshold)
            .query_async(&mut admin)
            .await
            .unwrap();
        type Entry = (i64, i64, i64, Vec<Vec<u8>>, redis::Value, redis::Value);
        let log: Vec<Entry> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(100)
            .query_async(&mut admin)
            .await
            .unwrap();
        // Newest first; the scripts only.
        let sent: Vec<Vec<Vec<u8>>> = log
            .into_iter()
            .rev()
            .map(|entry| entry.3)
            .filter(|words| {
                words
                    .first()
                    .is_some_and(|w| w.eq_ignore_ascii_case(b"EVALSHA"))
            })
            .collect();
        let (first, second) = sent.split_at(sent.len() / 2);
        assert!(
            !first.is_empty() && first.len() == second.len(),
            "{}: two decisions sent {} scripts",
            policy.name(),
            sent.len()
        );
        let mut ids = Vec::new();
        let mut seen: Vec<&[u8]> = Vec::new();
        for (i, (a, b)) in first.iter().zip(second).enumerate() {
            assert_eq!(a.len(), b.len(), "{}: the decisions differ", policy.name());
            for (j, (x, y)) in a.iter().zip(b).enumerate() {
                if x != y {
                    let id = match seen.iter().position(|s| s == x) {
                        Some(at) => at,
                        None => {
                            seen.push(x);
                            seen.len() - 1
                        }
                    };
                    ids.push((i, j, id as u64));
                }
            }
        }
        let replay = Replay {
            commands: first.to_vec(),
            ids,
            distinct: seen.len() as u64,
        };
        println!("bare/{}: {}", policy.name(), replay);
        replay
    }

    /// The same commands for another caller: `stand_in`, the key captured,
    /// replaced by `caller` wherever it appears.
    fn for_caller(&self, stand_in: &str, caller: &str) -> Replay {
        let replace = |word: &Vec<u8>| match std::str::from_utf8(word) {
            Ok(text) if text.contains(stand_in) => text.replace(stand_in, caller).into_bytes(),
            _ => word.clone(),
        };
        Replay {
            commands: self
                .commands
                .iter()
                .map(|words| words.iter().map(replace).collect())
                .collect(),
            ids: self.ids.clone(),
            distinct: self.distinct,
        }
    }

    /// Sends the commands in order, ids numbered from `id` up.
    fn send(
        &self,
        conn: &redis::aio::MultiplexedConnection,
        id: u64,
    ) -> impl std::future::Future<Output = ()> {
        let commands: Vec<redis::Cmd> = self
            .commands
            .iter()
            .enumerate()
            .map(|(i, words)| {
                let name = std::str::from_utf8(&words[0]).unwrap();
                let mut cmd = redis::cmd(name);
                for (j, word) in words.iter().enumerate().skip(1) {
                    match self.ids.iter().find(|&&(c, w, _)| (c, w) == (i, j)) {
                        Some(&(_, _, which)) => cmd.arg(id * self.distinct + which),
                        None => cmd.arg(word.as_slice()),
                    };
                }
                cmd
            })
            .collect();
        let mut conn = conn.clone();
        async move {
            for cmd in commands {
                let reply: redis::Value = cmd.query_async(&mut conn).await.unwrap();
                black_box(reply);
            }
        }
    }
}

/// One check, and the release of a concurrency slot: two round trips for
/// that strategy.
async fn passes(store: &RedisStore, policy: &Policy, key: &Key) {
    let decision = store.check(policy, key, 1).await.unwrap();
    if decision.allowed && holds(policy) {
        store.refund(policy, key, &decision.receipt).await.unwrap();
    }
}

/// Runs `iters` futures from `make`, keeping `window` of them in flight, and
/// returns the wall time taken.
async fn windowed<F: std::future::Future<Output = ()>>(
    iters: u64,
    window: usize,
    mut make: impl FnMut() -> F,
) -> Duration {
    let start = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut issued = 0;
    while issued < iters && in_flight.len() < window {
        in_flight.push(make());
        issued += 1;
    }
    while in_flight.next().await.is_some() {
        if issued < iters {
            in_flight.push(make());
            issued += 1;
        }
    }
    start.elapsed()
}

/// The medians and the ratios `BENCHMARKS.md` tracks.
fn summary() {
    let recorded: Vec<String> = RECORDED.lock().unwrap().keys().cloned().collect();
    if recorded.is_empty() {
        return;
    }
    println!("\nsummary: median per decision (decisions/s), last {SAMPLES} samples");
    for id in &recorded {
        if let Some(ns) = median_ns(id) {
            println!("  {id:<40} {:>10.0} ns  {:>12.0}/s", ns, 1e9 / ns);
        }
    }
    let ratio = |a: &str, b: &str| Some(median_ns(b)? / median_ns(a)?);
    let names: Vec<String> = lineup::lineup(roomy())
        .iter()
        .map(|p| p.name().to_owned())
        .collect();
    println!("\nratios (throughput of the first to the second; targets in BENCHMARKS.md)");
    println!("  (the uniform gate passes one call per millisecond per key: on one key its");
    println!("  'pass' and Redis figures are mostly rejections)");
    for name in &names {
        for (what, a, b) in [
            (
                "layer pass / no limiter",
                format!("layer/pass/{name}"),
                "layer/none".to_owned(),
            ),
            (
                "layer reject / no limiter",
                format!("layer/reject/{name}"),
                "layer/none".to_owned(),
            ),
            (
                "redis c1 / bare client",
                format!("redis_c1/{name}"),
                format!("redis_c1/bare/{name}"),
            ),
            (
                "redis c64 / bare client (>= 0.9)",
                format!("redis_c64/{name}"),
                format!("redis_c64/bare/{name}"),
            ),
            (
                "redis c64, 10k callers / bare (>= 0.9)",
                format!("redis_c64_crowd/{name}"),
                format!("redis_c64_crowd/bare/{name}"),
            ),
        ] {
            if let Some(r) = ratio(&a, &b) {
                println!("  {name:<16} {what:<40} {r:.3}");
            }
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(SAMPLES)
        .configure_from_args();
    memory(&mut c);
    layer(&mut c);
    redis(&mut c);
    c.final_summary();
    summary();
}
