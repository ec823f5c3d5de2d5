//! The zoo's routes for strategies that hold on to a request after admitting
//! it: the leaky bucket (shaping, and as a work queue) and the concurrency
//! limit. Each reads its settings from the environment.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Extension;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tollgate::queue::{
    Enqueued, ListQueue, MemoryQueue, QueueLayer, QueueSpec, StreamQueue, WorkQueue,
};
use tollgate::{Decision, KeyExtractor, Policy, Quota, RateLimitLayer, Store};

use super::env_or;

/// The queue's name: the zoo pushes to it, `examples/queue_processor.rs`
/// drains it.
pub const QUEUE_NAME: &str = "tigerfeeding.queue";

/// Which Redis structure holds the work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    Stream,
    List,
}

/// Settings for the leaky, concurrency and queue routes.
pub struct HoldingSettings {
    leaky_rate: Quota,
    leaky_capacity: NonZeroU32,
    concurrency_limit: NonZeroU32,
    concurrency_timeout: Duration,
    concurrency_hold: Duration,
    pub queue: QueueSpec,
    pub queue_rate: Quota,
    pub queue_kind: QueueKind,
}

fn non_zero(name: &str, default: u32) -> Result<NonZeroU32, String> {
    NonZeroU32::new(env_or(name, default)?).ok_or_else(|| format!("{name} must be at least 1"))
}

impl HoldingSettings {
    pub fn from_env() -> Result<Self, String> {
        let leaky_rate = Quota::new(
            env_or("ZOO_LEAKY_LIMIT", 2)?,
            Duration::from_secs(env_or("ZOO_LEAKY_WINDOW_SECS", 1)?),
        )
        .map_err(|e| e.to_string())?;
        let queue_capacity = non_zero("ZOO_QUEUE_CAPACITY", 10)?;
        let queue = QueueSpec::new(QUEUE_NAME, queue_capacity).map_err(|e| e.to_string())?;
        let queue_kind = match env_or("ZOO_QUEUE_KIND", "stream".to_owned())?.as_str() {
            "stream" => QueueKind::Stream,
            "list" => QueueKind::List,
            other => return Err(format!("ZOO_QUEUE_KIND={other:?} must be stream or list")),
        };
        Ok(Self {
            leaky_rate,
            leaky_capacity: non_zero("ZOO_LEAKY_CAPACITY", 5)?,
            concurrency_limit: non_zero("ZOO_CONCURRENCY_LIMIT", 2)?,
            concurrency_timeout: Duration::from_secs(env_or("ZOO_CONCURRENCY_TIMEOUT_SECS", 60)?),
            concurrency_hold: Duration::from_millis(env_or("ZOO_CONCURRENCY_HOLD_MS", 2000)?),
            queue,
            queue_rate: Quota::per_second(non_zero("ZOO_QUEUE_RATE", 1)?),
            queue_kind,
        })
    }

    /// One line per route, for the start-up banner.
    pub fn describe(&self, redis: bool) -> Vec<String> {
        let queue = match (redis, self.queue_kind) {
            (false, _) => "memory",
            (true, QueueKind::Stream) => "Redis Stream",
            (true, QueueKind::List) => "Redis List",
        };
        vec![
            format!(
                "/leaky/tigerfeeding: {} per {:?}, evenly spaced, at most {} waiting",
                self.leaky_rate.limit(),
                self.leaky_rate.window(),
                self.leaky_capacity
            ),
            format!(
                "/concurrency/tigerfeeding: {} in flight per caller, each taking {:?}",
                self.concurrency_limit, self.concurrency_hold
            ),
            format!(
                "/queue/tigerfeeding: a {queue} queue of {}, drained at {} per second",
                self.queue.capacity(),
                self.queue_rate.limit()
            ),
        ]
    }
}

/// The routes and the layers `/rate_limit` should peek with.
pub struct Holding<S> {
    pub router: Router<S>,
    pub limits: Vec<RateLimitLayer>,
}

/// Shaped: the handler runs when the caller's turn comes; the JSON says how
/// long it waited.
async fn leaky_feeding(Extension(decision): Extension<Decision>) -> Response {
    let waited = decision.delay.unwrap_or_default().as_millis() as u64;
    Json(json!({ "feeding": "tigers", "zone": "big cats", "waited_ms": waited })).into_response()
}

/// Queued: the keepers will get to it.
async fn queued(Extension(entry): Extension<Enqueued>) -> Response {
    let body = json!({
        "queued": entry.id,
        "in_queue": entry.len,
        "capacity": entry.capacity,
    });
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

pub async fn routes<S: Clone + Send + Sync + 'static>(
    settings: &HoldingSettings,
    store: Arc<dyn Store>,
    key: Arc<dyn KeyExtractor>,
    redis_url: Option<&str>,
) -> Result<Holding<S>, String> {
    let leaky = RateLimitLayer::builder()
        .headers(super::dialect())
        // The handler says how long the caller waited.
        .decision_extension(true)
        .policy(Policy::leaky_bucket(
            "tigerfeeding.leaky",
            settings.leaky_rate,
            settings.leaky_capacity,
        ))
        .shared_store(store.clone())
        .key(key.clone())
        .build()
        .map_err(|e| e.to_string())?;

    let policy = Policy::concurrency(
        "tigerfeeding.concurrency",
        settings.concurrency_limit,
        settings.concurrency_timeout,
    )
    .map_err(|e| e.to_string())?;
    let concurrency = RateLimitLayer::builder()
        .headers(super::dialect())
        .policy(policy)
        .shared_store(store)
        .key(key.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let hold = settings.concurrency_hold;
    let slow_feeding = move || async move {
        tokio::time::sleep(hold).await;
        Json(json!({ "feeding": "tigers", "took_ms": hold.as_millis() as u64 }))
    };

    let queue = work_queue(settings, redis_url).await?;
    let queue_layer = QueueLayer::builder(queue, settings.queue_rate)
        .key(key)
        .build()
        .map_err(|e| e.to_string())?;

    let router = Router::new()
        .route(
            "/leaky/tigerfeeding",
            get(leaky_feeding).layer(leaky.clone()),
        )
        .route(
            "/concurrency/tigerfeeding",
            get(slow_feeding).layer(concurrency.clone()),
        )
        .route(
            "/queue/tigerfeeding",
            get(queued).post(queued).layer(queue_layer),
        );
    Ok(Holding {
        router,
        limits: vec![leaky, concurrency],
    })
}

/// The work queue: in Redis when there is one (drain it with
/// `cargo run --all-features --example queue_processor`), else in memory, drained here.
async fn work_queue(
    settings: &HoldingSettings,
    redis_url: Option<&str>,
) -> Result<Arc<dyn WorkQueue>, String> {
    let Some(url) = redis_url else {
        let queue = MemoryQueue::new(settings.queue.clone());
        let keeper = queue.clone();
        let every = Duration::from_secs(1) / settings.queue_rate.limit();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                for entry in keeper.pop(1) {
                    tracing::info!(id = %entry.id, caller = ?entry.job.get_str("key"), "a keeper fed the tigers");
                }
            }
        });
        return Ok(Arc::new(queue));
    };
    let conn = redis::Client::open(url)
        .map_err(|e| format!("bad REDIS_URL {url}: {e}"))?
        .get_connection_manager()
        .await
        .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?;
    Ok(match settings.queue_kind {
        QueueKind::Stream => Arc::new(StreamQueue::new(conn, settings.queue.clone())),
        QueueKind::List => Arc::new(ListQueue::new(conn, settings.queue.clone())),
    })
}
