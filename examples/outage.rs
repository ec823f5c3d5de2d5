//! Issue 19's outage, reproduced: 50 clients against a private
//! `redis-server` that is frozen with SIGSTOP for 5 s, then resumed.
//!
//! ```text
//! cargo run --example outage            # needs redis-server on PATH
//! ```
//!
//! Two runs, each on its own key prefix:
//!
//! - **late charges**: a limit no client reaches (100,000 a minute), 50
//!   clients on 5 keys for 1 s, 5 s frozen, 1 s after. Redis's count per
//!   key, read once everything Redis found in its sockets has run, less
//!   the admissions Redis decided in time: what it charged for requests it
//!   answered too late.
//! - **the switch**: 5 per 10 s, as in the issue. Each of 5 keys gets 2
//!   requests through Redis, Redis freezes, and 50 clients keep asking for
//!   the 5 s: the admissions per key in its window, Redis's and the local
//!   fallback's.
//!
//! Each run counts the layer's WARN lines and its recovery lines. Not a
//! benchmark: a debug build is fine; it only uses the public API, so it
//! runs unchanged on earlier commits too.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::num::NonZeroU32;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use redis::AsyncCommands;
use tollgate::{Key, KeyError, KeyExtractor, Policy, Quota, RateLimitLayer, RedisStore};
use tower::ServiceExt;
use tracing_subscriber::layer::SubscriberExt;

const CLIENTS: usize = 50;
const KEYS: usize = 5;
const FROZEN: Duration = Duration::from_secs(5);

/// Counts the layer's log lines by level.
#[derive(Default)]
struct Lines {
    warn: AtomicUsize,
    recovered: AtomicUsize,
}

struct Counting(Arc<Lines>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Counting {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let level = *event.metadata().level();
        if level == tracing::Level::WARN {
            self.0.warn.fetch_add(1, Ordering::Relaxed);
        } else if level == tracing::Level::INFO {
            self.0.recovered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The caller's key from an `x-caller` header.
#[derive(Debug, Clone)]
struct Caller;

impl KeyExtractor for Caller {
    fn extract(&self, parts: &http::request::Parts) -> Result<Key, KeyError> {
        let caller = parts.headers.get("x-caller").and_then(|v| v.to_str().ok());
        Ok(Key::new(caller.unwrap_or("none")))
    }
}

/// What one key saw: admissions Redis decided, admissions the fallback
/// decided, rejections.
#[derive(Default, Debug, Clone, Copy)]
struct Seen {
    by_redis: u64,
    by_fallback: u64,
    limited: u64,
}

struct Server {
    child: Child,
    port: u16,
    _dir: std::path::PathBuf,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tollgate-outage-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let server = Server {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(ok.success());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn app(server: &Server, prefix: &str, policy: Policy) -> Router {
    let store = RedisStore::connect_builder(&server.url())
        .await
        .unwrap()
        .prefix(prefix)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .store(store)
        .key(Caller)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hi" }))
        .route_layer(layer)
        .layer(axum::extract::connect_info::MockConnectInfo(
            SocketAddr::from(([127, 0, 0, 1], 1)),
        ))
}

async fn hit(app: &Router, key: usize) -> (StatusCode, bool) {
    let req = Request::get("/")
        .header("x-caller", format!("caller-{key}"))
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let local = res.headers().contains_key("x-ratelimit-fallback");
    (res.status(), local)
}

/// 50 clients (client i on key i % 5), each asking every 10 ms until `until`.
async fn clients(app: &Router, until: Instant) -> Vec<Seen> {
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut seen = Seen::default();
                while Instant::now() < until {
                    match hit(&app, i % KEYS).await {
                        (StatusCode::OK, false) => seen.by_redis += 1,
                        (StatusCode::OK, true) => seen.by_fallback += 1,
                        _ => seen.limited += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                (i % KEYS, seen)
            })
        })
        .collect();
    let mut per_key = vec![Seen::default(); KEYS];
    for task in tasks {
        let (key, seen) = task.await.unwrap();
        per_key[key].by_redis += seen.by_redis;
        per_key[key].by_fallback += seen.by_fallback;
        per_key[key].limited += seen.limited;
    }
    per_key
}

/// Redis's count for each key under `prefix`, by key name.
async fn counts(server: &Server, prefix: &str) -> BTreeMap<String, u64> {
    // What the resumed server found in its sockets has run by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = conn.keys(format!("{prefix}:*")).await.unwrap();
    let mut out = BTreeMap::new();
    for key in keys {
        let count: Option<u64> = conn.hget(&key, "c").await.unwrap();
        out.insert(key, count.unwrap_or(0));
    }
    out
}

fn caller_of(redis_key: &str) -> Option<usize> {
    (0..KEYS).find(|k| redis_key.contains(&format!("caller-{k}")))
}

#[tokio::main]
async fn main() {
    let lines = Arc::new(Lines::default());
    let subscriber = tracing_subscriber::registry().with(Counting(lines.clone()));
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let server = Server::start();
    let minute = Quota::per_minute(NonZeroU32::new(100_000).unwrap());

    // Late charges.
    let app1 = app(&server, "late", Policy::fixed_window("late", minute)).await;
    let start = Instant::now();
    let (freeze_at, thaw_at) = (
        start + Duration::from_secs(1),
        start + Duration::from_secs(6),
    );
    let freezer = {
        let pid = server.child.id().to_string();
        tokio::spawn(async move {
            tokio::time::sleep_until(freeze_at.into()).await;
            Command::new("kill").args(["-STOP", &pid]).status().unwrap();
            tokio::time::sleep_until(thaw_at.into()).await;
            Command::new("kill").args(["-CONT", &pid]).status().unwrap();
        })
    };
    let seen = clients(&app1, thaw_at + Duration::from_secs(1)).await;
    freezer.await.unwrap();
    let counts1 = counts(&server, "late").await;
    let (warn1, info1) = (
        lines.warn.swap(0, Ordering::Relaxed),
        lines.recovered.swap(0, Ordering::Relaxed),
    );
    println!("late charges (limit 100,000/min, 50 clients, 5 keys, SIGSTOP 5 s):");
    let mut total_late = 0;
    for (key, count) in &counts1 {
        let Some(k) = caller_of(key) else { continue };
        let late = *count as i64 - seen[k].by_redis as i64;
        total_late += late;
        println!(
            "  caller-{k}: Redis count {count}, decided by Redis {}, by the fallback {}, late charges {late}",
            seen[k].by_redis, seen[k].by_fallback
        );
    }
    println!("  late charges in all: {total_late}; WARN lines: {warn1}; INFO lines: {info1}");

    // The switch: 5 per 10 s.
    let five = Quota::new(5, Duration::from_secs(10)).unwrap();
    let app2 = app(&server, "switch", Policy::fixed_window("switch", five)).await;
    for k in 0..KEYS {
        for _ in 0..2 {
            assert_eq!(hit(&app2, k).await, (StatusCode::OK, false));
        }
    }
    server.signal("-STOP");
    let seen = clients(&app2, Instant::now() + FROZEN).await;
    server.signal("-CONT");
    let counts2 = counts(&server, "switch").await;
    // One request after the outage, so that the store's recovery shows.
    hit(&app2, KEYS).await;
    let (warn2, info2) = (
        lines.warn.swap(0, Ordering::Relaxed),
        lines.recovered.swap(0, Ordering::Relaxed),
    );
    println!(
        "the switch (limit 5 per 10 s, 2 through Redis per key, then SIGSTOP 5 s, 50 clients):"
    );
    for (key, count) in &counts2 {
        let Some(k) = caller_of(key) else { continue };
        println!(
            "  caller-{k}: admitted in the window {} (2 by Redis before, {} by Redis during, {} by the fallback), Redis count {count}",
            2 + seen[k].by_redis + seen[k].by_fallback,
            seen[k].by_redis,
            seen[k].by_fallback
        );
    }
    println!("  WARN lines: {warn2}; INFO lines: {info2}");
}
