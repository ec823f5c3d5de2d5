//! Measures high-volume mode: the figures quoted in issue 5's closing note.
//!
//! ```text
//! cargo run --release --all-features --example flood            # all three parts
//! cargo run --release --all-features --example flood -- cache   # or one: cache | sync | http
//! ```
//!
//! Starts its own `redis-server` on a free loopback port (never 6379) and
//! counts what clients sent with `INFO commandstats`.
//!
//! 1. **cache**: 100,000 requests from 10,000 callers, 10 each, limit 1 per
//!    hour, so 90 % are over the limit; Redis commands per request with and
//!    without the local cache.
//! 2. **sync**: a throttle syncing through Redis once a second while 1,000
//!    and then 50,000 requests per second are offered; Redis commands per
//!    second per app server.
//! 3. **http**: requests per second through an axum server on loopback with
//!    throttling mode on, against the same server without any limiter,
//!    measured in one run (alternating, several times each).

#[path = "../tests/support/redis.rs"]
#[allow(dead_code, unused_imports)]
mod redis_support;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use axum::routing::get;
use axum::Router;
use redis_support::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::layer::LocalCache;
use tollgate::throttle::Throttle;
use tollgate::{HeaderKey, MemoryStore, Policy, Quota, RateLimitLayer, RedisStore};
use tower::ServiceExt;

/// Client-sent calls per command (Lua's own commands are counted apart by
/// Redis as well, so they are left out).
fn commands(server: &RedisServer) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .filter(|(name, _)| {
            ![
                "info",
                "config|resetstat",
                "hmget",
                "hset",
                "pexpire",
                "time",
            ]
            .contains(&name.as_str())
        })
        .collect()
}

fn reset(server: &RedisServer) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.conn())
        .unwrap();
}

fn total(c: &BTreeMap<String, u64>) -> u64 {
    c.values().sum()
}

async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    RedisStore::from_manager(conn)
        .prefix(prefix)
        .build()
        .unwrap()
}

fn request(key: &str) -> Request<Body> {
    Request::get("/")
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

async fn cache(server: &RedisServer) {
    println!("## 1. Flood: 100,000 requests, 10,000 callers, limit 1/hour (90 % over)");
    println!("| local cache | requests | allowed | Redis commands | per request | per over-limit request |");
    println!("|---|---|---|---|---|---|");
    for (label, with_cache) in [("off", false), ("on", true)] {
        let mut builder = RateLimitLayer::builder()
            .policy(Policy::fixed_window(
                "core",
                Quota::per_hour(NonZeroU32::new(1).unwrap()),
            ))
            .key(HeaderKey::new("x-api-key"))
            // A shared, loaded machine can miss the default 100 ms; the
            // figure is about Redis calls, so every decision must be Redis's.
            .deadline(Duration::from_secs(5))
            .store(store(server, &format!("flood-{label}")).await);
        if with_cache {
            builder = builder.local_cache(LocalCache::new(20_000));
        }
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(builder.build().unwrap());
        // Load the script first so SCRIPT LOAD is not counted.
        app.clone().oneshot(request("warm-up")).await.unwrap();
        reset(server);

        let allowed = Arc::new(AtomicU64::new(0));
        let degraded = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for worker in 0..64 {
            let (app, allowed, degraded) = (app.clone(), allowed.clone(), degraded.clone());
            tasks.push(tokio::spawn(async move {
                // Round after round, every caller calls once more.
                for n in (worker..100_000).step_by(64) {
                    let key = format!("caller-{}", n % 10_000);
                    let r = app.clone().oneshot(request(&key)).await.unwrap();
                    if r.status() == 200 {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                    if r.headers().contains_key("x-ratelimit-fallback") {
                        degraded.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let sent = commands(server);
        let allowed = allowed.load(Ordering::Relaxed);
        let degraded = degraded.load(Ordering::Relaxed);
        if degraded > 0 {
            println!(
                "  ({degraded} decisions fell back to the local store: Redis missed the deadline)"
            );
        }
        let over = 100_000 - allowed;
        let evalsha = sent.get("evalsha").copied().unwrap_or(0);
        println!(
            "| {label} | 100000 | {allowed} | {} ({sent:?}) | {:.3} | {:.3} |",
            total(&sent),
            total(&sent) as f64 / 100_000.0,
            evalsha.saturating_sub(allowed) as f64 / over as f64,
        );
    }
}

async fn sync(server: &RedisServer) {
    println!("\n## 2. Throttling mode: Redis traffic per app server per second");
    println!("| offered req/s | seconds | requests sent | refused | Redis commands | per second |");
    println!("|---|---|---|---|---|---|");
    for rate in [1_000u64, 50_000] {
        let throttle = Throttle::builder("sessions")
            .threshold(1_000)
            .capacity(100_000)
            .redis(&store(server, &format!("sync-{rate}")).await)
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder()
            .policy(Policy::fixed_window(
                "core",
                Quota::per_minute(NonZeroU32::new(1_000_000).unwrap()),
            ))
            .key(HeaderKey::new("x-api-key"))
            .store(MemoryStore::new())
            .throttle(throttle.clone())
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        throttle.sync_once().await.unwrap(); // loads the scripts
        reset(server);
        let task = throttle.start().unwrap();

        let secs = 10;
        let start = Instant::now();
        let mut sent = 0u64;
        let mut refused = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while start.elapsed() < Duration::from_secs(secs) {
            tick.tick().await;
            let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
            while sent < due {
                // 20,000 callers, some new every second: sessions come and go.
                let key = format!("c{}", (sent * 7919) % 20_000 + sent / rate * 500);
                let r = app.clone().oneshot(request(&key)).await.unwrap();
                refused += u64::from(r.status() == 429);
                sent += 1;
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        drop(task);
        let cmds = commands(server);
        println!(
            "| {rate} | {elapsed:.1} | {sent} | {refused} | {} ({cmds:?}) | {:.1} |",
            total(&cmds),
            total(&cmds) as f64 / elapsed,
        );
        println!(
            "  (active callers estimated {}, throttling {})",
            throttle.active_callers(),
            throttle.is_throttling()
        );
    }
}

/// Keep-alive HTTP/1.1 clients hammering `addr` for `secs`; requests done.
async fn load(addr: std::net::SocketAddr, secs: f64, connections: usize) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (stop, done) = (stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
            sock.set_nodelay(true).unwrap();
            let mut buf = vec![0u8; 4096];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = (c as u64 * 37 + n) % 1000;
                let req = format!("GET / HTTP/1.1\r\nHost: x\r\nx-api-key: k{key}\r\n\r\n");
                sock.write_all(req.as_bytes()).await.unwrap();
                // Read one response: headers, then Content-Length bytes.
                let mut have = 0;
                loop {
                    let r = sock.read(&mut buf[have..]).await.unwrap();
                    assert!(r > 0, "server closed");
                    have += r;
                    let text = &buf[..have];
                    if let Some(end) = text.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = std::str::from_utf8(&text[..end])
                            .unwrap()
                            .to_ascii_lowercase();
                        assert!(head.starts_with("http/1.1 200"), "{head}");
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if have >= end + 4 + len {
                            break;
                        }
                    }
                }
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed)
}

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn http(server: &RedisServer) {
    println!("\n## 3. Requests per second through axum (loopback, 32 keep-alive connections)");
    let bare = serve(Router::new().route("/", get(|| async { "ok" }))).await;

    let policy = Policy::fixed_window(
        "core",
        Quota::per_second(NonZeroU32::new(1_000_000).unwrap()),
    );
    let memory_only = serve(
        Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::builder()
                .policy(policy.clone())
                .key(HeaderKey::new("x-api-key"))
                .store(MemoryStore::new())
                .build()
                .unwrap(),
        ),
    )
    .await;

    let throttle = Throttle::builder("sessions")
        .threshold(10)
        .capacity(100_000)
        .redis(&store(server, "http").await)
        .build()
        .unwrap();
    let _task = throttle.start().unwrap();
    let throttled = serve(
        Router::new().route("/", get(|| async { "ok" })).layer(
            RateLimitLayer::builder()
                .policy(policy)
                .key(HeaderKey::new("x-api-key"))
                .store(MemoryStore::new())
                .throttle(throttle.clone())
                .build()
                .unwrap(),
        ),
    )
    .await;
    // Make the 1,000 callers known, then wait for throttling mode.
    load(throttled, 0.5, 32).await;
    throttle.sync_once().await.unwrap();
    assert!(throttle.is_throttling(), "{throttle:?}");

    let variants = [
        ("no limiter", bare),
        ("RateLimitLayer, MemoryStore", memory_only),
        ("RateLimitLayer, MemoryStore, throttling mode on", throttled),
    ];
    let mut totals = [0u64; 3];
    let rounds = 5;
    let secs = 2.0;
    for _ in 0..rounds {
        for (i, (_, addr)) in variants.iter().enumerate() {
            totals[i] += load(*addr, secs, 32).await;
        }
    }
    println!("| server | req/s | ratio to no limiter |");
    println!("|---|---|---|");
    for (i, (label, _)) in variants.iter().enumerate() {
        let rps = totals[i] as f64 / (rounds as f64 * secs);
        println!(
            "| {label} | {rps:.0} | {:.3} |",
            totals[i] as f64 / totals[0] as f64
        );
    }
    println!(
        "  (throttling {}, {} active callers, {} refused)",
        throttle.is_throttling(),
        throttle.active_callers(),
        throttle.stats().refused
    );
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    runtime.block_on(async {
        if which == "all" || which == "cache" {
            cache(&server).await;
        }
        if which == "all" || which == "sync" {
            sync(&server).await;
        }
        if which == "all" || which == "http" {
            http(&server).await;
        }
    });
}
