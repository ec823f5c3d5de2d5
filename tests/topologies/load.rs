//! Steady load through the real layer, for failover and resharding tests:
//! bounded in count and time, every request timed and classified.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use tollgate::{FailurePolicy, Key, KeyError, Policy, RateLimitLayer, Store};
use tower::ServiceExt;

/// The header that names the caller; its value is the key, escaped.
pub const CALLER: &str = "x-caller";

/// An app with `policy` on `store`, keyed by [`CALLER`], failing over to a
/// local limiter (the default policy) after `deadline`.
pub fn app(store: Arc<dyn Store>, policy: Policy, deadline: Duration) -> Router {
    // `RUST_LOG=tollgate=debug` shows why a decision fell back.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let layer = RateLimitLayer::builder()
        .policy(policy)
        .shared_store(store)
        .key(|parts: &Parts| {
            parts
                .headers
                .get(CALLER)
                .and_then(|v| v.to_str().ok())
                .map(Key::new)
                .ok_or(KeyError::Missing("x-caller header"))
        })
        .deadline(deadline)
        .on_store_failure(FailurePolicy::local())
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// Who answered one request, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Redis decided: allowed or limited.
    Redis { allowed: bool },
    /// The local fallback decided (`X-RateLimit-Fallback: local`).
    Local { allowed: bool },
    /// Anything else: a failed decision.
    Failed(StatusCode),
}

/// One request's record.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// When it started, since the load began.
    pub at: Duration,
    pub caller: usize,
    pub outcome: Outcome,
    pub latency: Duration,
}

/// A running load; [`stop`](Self::stop) it to get the samples.
pub struct Load {
    start: Instant,
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    samples: Arc<Mutex<Vec<Sample>>>,
}

impl Load {
    /// `workers` tasks send requests for `callers` round-robin, each pausing
    /// `pause` between requests, until stopped, `max_requests` were sent, or
    /// `max_time` passed.
    pub fn start(
        app: Router,
        callers: Vec<String>,
        workers: usize,
        pause: Duration,
        max_requests: usize,
        max_time: Duration,
    ) -> Load {
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(Mutex::new(Vec::with_capacity(max_requests.min(1 << 20))));
        let callers = Arc::new(callers);
        let workers = (0..workers)
            .map(|_| {
                let (app, stop, next, samples, callers) = (
                    app.clone(),
                    stop.clone(),
                    next.clone(),
                    samples.clone(),
                    callers.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < max_time {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= max_requests {
                            break;
                        }
                        let caller = n % callers.len();
                        let request = Request::get("/")
                            .header(CALLER, callers[caller].as_str())
                            .body(Body::empty())
                            .unwrap();
                        let at = start.elapsed();
                        let sent = Instant::now();
                        let response = app.clone().oneshot(request).await.unwrap();
                        let latency = sent.elapsed();
                        let local = response
                            .headers()
                            .get("x-ratelimit-fallback")
                            .is_some_and(|v| v == "local");
                        let outcome = match (response.status(), local) {
                            (StatusCode::OK, false) => Outcome::Redis { allowed: true },
                            (StatusCode::TOO_MANY_REQUESTS, false) => {
                                Outcome::Redis { allowed: false }
                            }
                            (StatusCode::OK, true) => Outcome::Local { allowed: true },
                            (StatusCode::TOO_MANY_REQUESTS, true) => {
                                Outcome::Local { allowed: false }
                            }
                            (status, _) => Outcome::Failed(status),
                        };
                        samples.lock().unwrap().push(Sample {
                            at,
                            caller,
                            outcome,
                            latency,
                        });
                        if !pause.is_zero() {
                            tokio::time::sleep(pause).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            start,
            stop,
            workers,
            samples,
        }
    }

    /// Time since the load began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits until Redis has decided `n` more requests after now, or `limit`
    /// passed; true if it did.
    pub async fn wait_for_redis_decisions(&self, n: usize, limit: Duration) -> bool {
        let from = self.elapsed();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let seen = self
                .samples
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.at >= from && matches!(s.outcome, Outcome::Redis { .. }))
                .count();
            if seen >= n {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Waits until the last `n` requests were all decided by Redis, or
    /// `limit` passed; true if they were.
    pub async fn wait_for_redis_tail(&self, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            {
                let samples = self.samples.lock().unwrap();
                let tail = &samples[samples.len().saturating_sub(n)..];
                if tail.len() == n
                    && tail
                        .iter()
                        .all(|s| matches!(s.outcome, Outcome::Redis { .. }))
                {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Stops the workers and returns every sample.
    pub async fn stop(self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            worker.await.unwrap();
        }
        let samples = std::mem::take(&mut *self.samples.lock().unwrap());
        Report { samples }
    }
}

/// What a load saw.
pub struct Report {
    pub samples: Vec<Sample>,
}

impl Report {
    pub fn total(&self) -> usize {
        self.samples.len()
    }

    pub fn count(&self, pred: impl Fn(&Outcome) -> bool) -> usize {
        self.samples.iter().filter(|s| pred(&s.outcome)).count()
    }

    pub fn failed(&self) -> Vec<Sample> {
        self.samples
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Failed(_)))
            .copied()
            .collect()
    }

    pub fn max_latency(&self) -> Duration {
        self.samples
            .iter()
            .map(|s| s.latency)
            .max()
            .unwrap_or_default()
    }

    /// First and last request the local fallback decided.
    pub fn local_span(&self) -> Option<(Duration, Duration)> {
        let local = self
            .samples
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Local { .. }));
        let first = local.clone().map(|s| s.at).min()?;
        let last = local.map(|s| s.at).max()?;
        Some((first, last))
    }

    /// Requests allowed for `caller`, by Redis and by the local fallback.
    pub fn admitted(&self, caller: usize) -> (u64, u64) {
        let mut by = (0, 0);
        for s in self.samples.iter().filter(|s| s.caller == caller) {
            match s.outcome {
                Outcome::Redis { allowed: true } => by.0 += 1,
                Outcome::Local { allowed: true } => by.1 += 1,
                _ => {}
            }
        }
        by
    }

    /// One line for the test log.
    pub fn summary(&self) -> String {
        let redis = self.count(|o| matches!(o, Outcome::Redis { .. }));
        let local = self.count(|o| matches!(o, Outcome::Local { .. }));
        let span = self.local_span().map_or("none".to_owned(), |(a, b)| {
            format!(
                "{:.2}s..{:.2}s ({} ms)",
                a.as_secs_f64(),
                b.as_secs_f64(),
                (b - a).as_millis()
            )
        });
        format!(
            "{} requests: {redis} decided by Redis, {local} by the local fallback (span {span}), \
             {} failed; max latency {} ms",
            self.total(),
            self.failed().len(),
            self.max_latency().as_millis()
        )
    }
}
