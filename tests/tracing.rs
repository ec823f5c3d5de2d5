//! What the layer tells `tracing`: a debug span per decision with the policy,
//! the hashed key and the outcome, and warnings for store failures.
//!
//! One subscriber for the whole binary, installed before any callsite is hit:
//! per-test thread-local subscribers race over tracing's cached callsite
//! interest and made these tests flaky. Each test captures only its own
//! thread's output (tokio tests run on one thread).

mod support;

use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Once;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use tower::ServiceExt;

use tollgate::decision::Receipt;
use tollgate::store::BoxFuture;
use tollgate::{Decision, FailurePolicy, Key, Policy, Quota, RateLimitLayer, Store, StoreError};

thread_local! {
    static CAPTURED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Writes into this thread's capture buffer, if one is open.
struct ThreadCapture;

impl Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|c| {
            if let Some(out) = c.borrow_mut().as_mut() {
                out.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Starts capturing this thread's log lines (debug and up).
fn capture() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(|| ThreadCapture)
            .init();
    });
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
}

fn captured() -> String {
    CAPTURED.with(|c| String::from_utf8(c.borrow().clone().unwrap_or_default()).unwrap())
}

/// What logs show for a key: the first 16 hex digits of its SHA-256.
fn hashed(key: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..16]
        .to_owned()
}

use support::down::{down, Down};

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer)
        .layer(MockConnectInfo(
            "192.0.2.44:1".parse::<SocketAddr>().unwrap(),
        ))
}

async fn hit(app: &Router) -> StatusCode {
    let req = Request::get("/").body(Body::empty()).unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

fn one_per_minute() -> Policy {
    Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1).unwrap()))
}

#[tokio::test]
async fn each_decision_is_traced_with_policy_hashed_key_and_outcome() {
    capture();
    let app = app(RateLimitLayer::builder()
        .policy(one_per_minute())
        .build()
        .unwrap());
    assert_eq!(hit(&app).await, StatusCode::OK);
    assert_eq!(hit(&app).await, StatusCode::TOO_MANY_REQUESTS);

    let out = captured();
    let decisions: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("rate limit decision"))
        .collect();
    assert_eq!(decisions.len(), 2, "{out}");
    let key = hashed("ip:192.0.2.44");
    for (line, outcome) in decisions.iter().zip(["allowed", "limited"]) {
        assert!(line.contains("DEBUG rate_limit{"), "{line}");
        assert!(line.contains("policy=\"core\""), "{line}");
        assert!(line.contains(&format!("key=\"{key}\"")), "{line}");
        assert!(line.contains(&format!("outcome=\"{outcome}\"")), "{line}");
    }
    assert!(
        !out.contains("192.0.2.44"),
        "raw keys stay out of logs: {out}"
    );
}

#[tokio::test]
async fn store_failures_warn_with_the_hashed_key() {
    capture();
    let layer = RateLimitLayer::builder()
        .policy(one_per_minute())
        .store(Down)
        .on_store_failure(FailurePolicy::Open)
        .build()
        .unwrap();
    assert_eq!(hit(&app(layer)).await, StatusCode::OK);

    let out = captured();
    let warning = out
        .lines()
        .find(|l| l.contains("store failed"))
        .unwrap_or_else(|| panic!("no store warning in {out}"));
    assert!(warning.contains(" WARN "), "{warning}");
    // The event's own field (unquoted), not only the span's: a subscriber
    // at warn level, with the debug span off, still sees it.
    assert!(
        warning.contains(&format!(" key={}", hashed("ip:192.0.2.44"))),
        "{warning}"
    );
    assert!(warning.contains("kind=\"unavailable\""), "{warning}");
    assert!(!out.contains("192.0.2.44"), "{out}");
}

#[tokio::test]
async fn a_queued_release_that_fails_is_warned_about() {
    use redis::Commands;
    use std::time::Duration;

    let server = support::redis::RedisServer::start();
    let conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = std::sync::Arc::new(
        tollgate::RedisStore::from_connection(conn)
            .prefix("t")
            .batching(true)
            .build()
            .unwrap(),
    );
    let ten = NonZeroU32::new(10).unwrap();
    let policy = Policy::concurrency("held", ten, Duration::from_secs(60)).unwrap();
    let receipt = store
        .check(&policy, &Key::new("k"), 1)
        .await
        .unwrap()
        .receipt;
    // The slot's set replaced by a string: its release fails in Redis.
    let mut direct = server.conn();
    let keys: Vec<String> = direct.keys("t:*").unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let _: () = direct.set(&keys[0], "x").unwrap();

    // Redis paused under four calls in flight: the release queues, and no
    // one waits for it.
    server.pause_clients(Duration::from_millis(200));
    let busy: Vec<_> = (0..4)
        .map(|_| {
            let (store, policy) = (store.clone(), policy.clone());
            tokio::spawn(async move { store.check(&policy, &Key::new("other"), 1).await })
        })
        .collect();
    tokio::task::yield_now().await;
    capture();
    let answered = store.refund_now(&policy, &Key::new("k"), &receipt);
    assert!(matches!(answered, Some(Ok(()))), "{answered:?}");
    for call in busy {
        assert!(call.await.unwrap().unwrap().allowed);
    }

    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !captured().contains("rate limit release failed") {
        assert!(
            std::time::Instant::now() < deadline,
            "no warning in {}",
            captured()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = captured();
    let warning = out.lines().find(|l| l.contains("release failed")).unwrap();
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(warning.contains("WRONGTYPE"), "{warning}");
    assert!(!out.contains(&keys[0]), "raw keys stay out of logs: {out}");
}

/// A store that fails while `down` is set and otherwise decides in memory:
/// an outage with a start and an end.
#[derive(Debug, Default)]
struct Flaky {
    down: std::sync::atomic::AtomicBool,
    memory: tollgate::MemoryStore,
}

impl Flaky {
    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Store for Flaky {
    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if self.is_down() {
            return down();
        }
        self.memory.check(policy, key, cost)
    }

    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if self.is_down() {
            return down();
        }
        self.memory.peek(policy, key)
    }

    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if self.is_down() {
            return down();
        }
        self.memory.refund(policy, key, receipt)
    }
}

/// Issue 19: one warning per failed call flooded the logs (450 lines in a
/// 5-second freeze under 50 clients). An outage is one warning when it
/// starts and one info line when it ends, however many calls fail between.
#[tokio::test]
async fn an_outage_logs_one_warning_and_one_recovery_not_a_line_per_call() {
    capture();
    let store = std::sync::Arc::new(Flaky::default());
    let many = Policy::fixed_window("core", Quota::per_minute(NonZeroU32::new(1000).unwrap()));
    let app = app(RateLimitLayer::builder()
        .policy(many)
        .shared_store(store.clone())
        .failure_cooldown(std::time::Duration::ZERO)
        .build()
        .unwrap());
    for outage in 1..=2 {
        assert_eq!(hit(&app).await, StatusCode::OK);
        store.set_down(true);
        for _ in 0..30 {
            assert_eq!(hit(&app).await, StatusCode::OK);
        }
        store.set_down(false);
        assert_eq!(hit(&app).await, StatusCode::OK);
        assert_eq!(hit(&app).await, StatusCode::OK);

        let out = captured();
        let warnings: Vec<&str> = out.lines().filter(|l| l.contains(" WARN ")).collect();
        assert_eq!(warnings.len(), outage, "{out}");
        assert!(warnings[outage - 1].contains("connection refused"), "{out}");
        let recoveries: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(" INFO ") && l.contains("answers again"))
            .collect();
        assert_eq!(recoveries.len(), outage, "{out}");
        assert!(
            recoveries[outage - 1].contains("decided_without_store=30"),
            "{out}"
        );
        assert!(recoveries[outage - 1].contains("outage_ms="), "{out}");
    }
}

/// Issue 41: a server that cannot read the runtime limits from Redis
/// (it starts, or first judges an adjustable policy, during an outage)
/// judges by the quotas the policies were built with and says so once,
/// however many reads fail after.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_server_that_cannot_read_the_runtime_limits_says_so_once() {
    use std::time::Duration;
    use tollgate::RedisStore;

    capture();
    let mut redis = support::redis::RedisServer::start();
    let store = RedisStore::connect_builder(&redis.url())
        .await
        .unwrap()
        .prefix("limits-log")
        .build()
        .unwrap();
    redis.stop();
    // Connected on the real clock; the reads' half seconds on a paused one.
    tokio::time::pause();
    let policy = Policy::fixed_window("search", Quota::per_minute(NonZeroU32::new(100).unwrap()))
        .adjustable();
    assert!(
        store.policy_in_force(&policy).is_none(),
        "the quotas as built"
    );
    // Three reads, each a half second apart, all failing.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(store.policy_in_force(&policy).is_none());
    }
    let log = captured();
    let said = "cannot read the runtime limits from Redis: judging by the quotas the policies were built with";
    assert_eq!(log.matches(said).count(), 1, "{log}");
}
