//! Throttling mode; the design is described on [`Throttle`].

mod builder;
#[cfg(feature = "redis")]
mod codec;
pub(crate) mod ring;
#[cfg(feature = "redis")]
mod sync;
#[cfg(not(feature = "redis"))]
#[path = "unsynced.rs"]
mod sync;

pub use self::builder::ThrottleBuilder;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use self::ring::Ring;
use self::sync::RedisSync;
use crate::clock::Clock;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::Policy;

/// What one round did with Redis, for tests and stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RoundCounts {
    /// Script calls made.
    pub(crate) calls: u64,
    /// Publishes that went through.
    pub(crate) written: u64,
    /// Publishes given up because another server wrote first.
    pub(crate) conflicts: u64,
    /// Stored values merged in.
    pub(crate) merged: u64,
}

/// Largest memory the filters of one throttle may take, in bytes.
const MAX_MEMORY: usize = 1 << 30;

/// The active-caller gate of throttling mode: when too many callers are
/// active, keep serving the ones already in a session and refuse new ones,
/// without asking Redis per request.
///
/// Each app server remembers who called in the last `slots × slot_length`
/// (30 × 1 minute by default) in a ring of bloom filters of fixed size, one
/// per slot. The number of active callers is estimated from how
/// full the filters are. Above the [`threshold`](ThrottleBuilder::threshold)
/// the service is *throttling*: a caller seen in the window passes, a caller
/// never seen gets `429` with `Retry-After` until the estimate drops.
///
/// Once per round (every second by default) a background task moves the ring
/// to the current slot and ORs this server's current filter with the one
/// shared in Redis, so every server soon knows every caller and
/// estimates the same count. The request path never waits on Redis; when
/// Redis is gone, each server carries on with what it knows.
///
/// The design follows the talk "High Volume Ratelimiting with Redis".
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use tollgate::Key;
/// use tollgate::clock::ManualClock;
/// use tollgate::throttle::Throttle;
///
/// let clock = ManualClock::new(0);
/// let throttle = Throttle::builder("sessions")
///     .threshold(2)
///     .capacity(1_000)
///     .clock(clock.clone())
///     .build()
///     .unwrap();
/// for caller in ["ann", "bob", "cid"] {
///     assert!(throttle.admit(&Key::new(caller)));
/// }
/// throttle.sync_once().await.unwrap(); // the background task does this every second
/// assert!(throttle.is_throttling());
/// assert!(throttle.admit(&Key::new("bob")), "in session: still served");
/// assert!(!throttle.admit(&Key::new("dan")), "new: refused while throttling");
/// # }
/// ```
///
/// Cheap to clone: clones share one ring.
///
/// **Redis cost** per app server and round, whatever the request rate: one
/// script call to look for news, one more to publish when this server saw
/// new callers, one more the round after a slot ends, and one read of the
/// whole window on the first round (so a server started during a flood
/// knows the sessions in progress). A write that loses the optimistic
/// version check is given up until the next round, never retried, so more
/// servers never means a retry storm; servers whose rounds interleave
/// converge in two rounds, and `n` servers in perfect lockstep (the worst
/// case; [`start`](Self::start) picks a random phase to avoid it) in `n + 1`.
///
/// Put it in front of a [`RateLimitLayer`](crate::RateLimitLayer) with
/// [`RateLimitLayerBuilder::throttle`](crate::RateLimitLayerBuilder::throttle),
/// and keep the [`SyncTask`] from [`start`](Self::start) alive.
///
/// **Memory** is fixed at build time: `(slots + 2)` filters of
/// `-capacity · ln(p) / ln(2)²` bits each; 100,000 callers at 1 % take
/// 32 × 117 KiB ≈ 3.7 MiB.
///
/// **Security.** Bloom filters answer "maybe seen" for some keys never seen.
/// Callers who can choose their key freely and know the hash seed could
/// search for such keys; set a secret [`seed`](ThrottleBuilder::seed)
/// (the same on every app server) when keys are caller-chosen.
///
/// ```
/// use std::time::Duration;
/// use tollgate::throttle::Throttle;
///
/// let throttle = Throttle::builder("sessions")
///     .threshold(50_000)             // active callers that switch throttling on
///     .capacity(200_000)             // callers the filters are sized for
///     .false_positive_rate(0.001)    // at capacity
///     .slots(30)
///     .slot_length(Duration::from_secs(60))
///     .build()
///     .unwrap();
/// assert_eq!(throttle.active_callers(), 0);
/// ```
#[derive(Clone)]
pub struct Throttle {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    ring: Ring,
    clock: Arc<dyn Clock>,
    slot_micros: u64,
    threshold: u64,
    capacity: usize,
    retry_after: Duration,
    sync_every: Duration,
    throttling: AtomicBool,
    estimate: AtomicU64,
    round: tokio::sync::Mutex<Option<RedisSync>>,
    rounds: AtomicU64,
    redis_calls: AtomicU64,
    conflicts: AtomicU64,
    errors: AtomicU64,
    refused: AtomicU64,
    /// Policies whose layers this throttle gates: the active-caller gauge is
    /// set under each.
    policies: std::sync::Mutex<Vec<Policy>>,
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("name", &self.inner.name)
            .field("threshold", &self.inner.threshold)
            .field("active_callers", &self.active_callers())
            .field("throttling", &self.is_throttling())
            .finish_non_exhaustive()
    }
}

impl Throttle {
    /// Starts configuring a throttle named `name` (1-64 characters of
    /// `[A-Za-z0-9-_./]`; servers with the same name and Redis share callers).
    ///
    /// ```
    /// use tollgate::throttle::Throttle;
    /// let throttle = Throttle::builder("sessions").threshold(10_000).build().unwrap();
    /// assert!(!throttle.is_throttling());
    /// assert!(Throttle::builder("bad name").threshold(10).build().is_err());
    /// ```
    pub fn builder(name: impl Into<Arc<str>>) -> ThrottleBuilder {
        ThrottleBuilder::new(name.into())
    }

    /// The request path: whether `key` may pass, noting it as active if so.
    ///
    /// Not throttling: always `true`. Throttling: `true` only for callers
    /// seen in the window (and, rarely, a false positive). A refused caller
    /// is not noted, so retrying does not make it known. No I/O, no lock,
    /// no allocation: a hash and a few bit probes.
    pub fn admit(&self, key: &Key) -> bool {
        let inner = &*self.inner;
        let hash = inner.ring.hash(key.as_str().as_bytes());
        let pass = inner.ring.admit(hash, inner.throttling.load(Relaxed));
        if !pass {
            inner.refused.fetch_add(1, Relaxed);
        }
        pass
    }

    /// Whether `key` was seen in the window, without noting it.
    ///
    /// ```
    /// use tollgate::Key;
    /// use tollgate::throttle::Throttle;
    /// let t = Throttle::builder("s").threshold(10).build().unwrap();
    /// assert!(!t.is_known(&Key::new("ann")));
    /// t.admit(&Key::new("ann"));
    /// assert!(t.is_known(&Key::new("ann")));
    /// ```
    pub fn is_known(&self, key: &Key) -> bool {
        let ring = &self.inner.ring;
        ring.seen(ring.hash(key.as_str().as_bytes()))
    }

    /// The estimated number of distinct callers in the window, across every
    /// server that shares this throttle's Redis: the metric to watch. Updated
    /// by each round.
    pub fn active_callers(&self) -> u64 {
        self.inner.estimate.load(Relaxed)
    }

    /// Whether the last round found more active callers than the threshold.
    pub fn is_throttling(&self) -> bool {
        self.inner.throttling.load(Relaxed)
    }

    /// How long refused callers are told to wait.
    pub fn retry_after(&self) -> Duration {
        self.inner.retry_after
    }

    /// The design bound on how often an unseen caller is taken for a known
    /// one when the window holds `callers` distinct callers: the check asks
    /// the current slot's filter and the union of the others, each holding
    /// at most `callers` keys, so `1 - (1 - p)²` with `p` one filter's rate.
    ///
    /// ```
    /// use tollgate::throttle::Throttle;
    /// let t = Throttle::builder("s").threshold(1000).capacity(10_000)
    ///     .false_positive_rate(0.01).build().unwrap();
    /// assert!(t.false_positive_bound(10_000) < 0.021);
    /// assert!(t.false_positive_bound(1_000) < 0.0001);
    /// ```
    pub fn false_positive_bound(&self, callers: usize) -> f64 {
        let p = self.inner.ring.shape().false_positive_rate(callers);
        1.0 - (1.0 - p) * (1.0 - p)
    }

    /// Counters since the throttle was built.
    pub fn stats(&self) -> ThrottleStats {
        let i = &*self.inner;
        ThrottleStats {
            active_callers: self.active_callers(),
            throttling: self.is_throttling(),
            capacity: i.capacity as u64,
            rounds: i.rounds.load(Relaxed),
            redis_calls: i.redis_calls.load(Relaxed),
            conflicts: i.conflicts.load(Relaxed),
            errors: i.errors.load(Relaxed),
            refused: i.refused.load(Relaxed),
        }
    }

    /// One round, as the background task runs it every
    /// [`sync_every`](ThrottleBuilder::sync_every): move the ring to the
    /// clock's slot, share the current slot's filter through Redis (if one
    /// was given), and re-estimate the active callers.
    ///
    /// Tests call this directly with a [`ManualClock`](crate::clock::ManualClock)
    /// instead of starting the task. On a Redis error the local part is
    /// still done and the error returned (the task logs it and goes on).
    pub async fn sync_once(&self) -> Result<SyncReport, StoreError> {
        let inner = &*self.inner;
        let mut sync = inner.round.lock().await;
        let now_slot = inner.clock.now_micros() / inner.slot_micros;
        let before = inner.ring.slot_no();
        if now_slot > before {
            inner.ring.advance(now_slot);
            if let Some(sync) = sync.as_mut() {
                sync.slot_ended(before);
            }
        }
        let mut counts = RoundCounts::default();
        let result = match sync.as_mut() {
            Some(sync) => {
                let deadline = inner.sync_every.max(Duration::from_millis(100));
                match tokio::time::timeout(deadline, sync.round(&inner.ring, &mut counts)).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::timeout()),
                }
            }
            None => Ok(()),
        };
        drop(sync);

        let estimate = inner.ring.estimate();
        let active = if estimate.is_finite() {
            estimate.round() as u64
        } else {
            u64::MAX
        };
        inner.estimate.store(active, Relaxed);
        for policy in inner
            .policies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            crate::metrics::active_callers(policy, active as f64);
        }
        let throttling = active > inner.threshold;
        if inner.throttling.swap(throttling, Relaxed) != throttling {
            tracing::info!(
                throttle = &*inner.name,
                active_callers = active,
                threshold = inner.threshold,
                throttling,
                "throttling mode changed"
            );
        }
        tracing::debug!(
            throttle = &*inner.name,
            active_callers = active,
            throttling,
            redis_calls = counts.calls,
            conflicts = counts.conflicts,
            "throttle round"
        );
        inner.rounds.fetch_add(1, Relaxed);
        inner.redis_calls.fetch_add(counts.calls, Relaxed);
        inner.conflicts.fetch_add(counts.conflicts, Relaxed);
        match result {
            Ok(()) => Ok(SyncReport {
                redis_calls: counts.calls,
                written: counts.written,
                conflicts: counts.conflicts,
                merged: counts.merged,
                active_callers: active,
                throttling,
            }),
            Err(err) => {
                inner.errors.fetch_add(1, Relaxed);
                Err(err)
            }
        }
    }

    /// Reports the active-caller estimate under `policy` too (the layer
    /// calls this when the throttle gates its policy).
    pub(crate) fn report_under(&self, policy: &Policy) {
        let mut policies = self
            .inner
            .policies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !policies.iter().any(|p| p.name() == policy.name()) {
            policies.push(policy.clone());
        }
    }

    /// Starts the background task that runs [`sync_once`](Self::sync_once)
    /// every round. The task stops when the returned [`SyncTask`] is dropped.
    /// Fails outside a Tokio runtime.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let throttle = tollgate::throttle::Throttle::builder("sessions").threshold(10_000).build().unwrap();
    /// let task = throttle.start().unwrap();
    /// // ... serve; dropping `task` stops the rounds.
    /// drop(task);
    /// # }
    /// ```
    pub fn start(&self) -> Result<SyncTask, ConfigError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ConfigError::NoRuntime)?;
        let throttle = self.clone();
        let every = self.inner.sync_every;
        // Servers whose rounds start at the same instant collide on every
        // write (each round only one wins); a random phase spreads them out.
        let phase = every.mul_f64(random_fraction());
        let handle = runtime.spawn(async move {
            let start = tokio::time::Instant::now() + phase;
            let mut interval = tokio::time::interval_at(start, every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if let Err(err) = throttle.sync_once().await {
                    tracing::warn!(throttle = &*throttle.inner.name, error = %err,
                        "throttle sync failed; deciding locally meanwhile");
                }
            }
        });
        Ok(SyncTask { handle })
    }
}

/// The running rounds of a [`Throttle`]; dropping it stops them.
#[derive(Debug)]
#[must_use = "the throttle's rounds stop when this is dropped"]
pub struct SyncTask {
    handle: tokio::task::JoinHandle<()>,
}

impl Drop for SyncTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// What one [`Throttle::sync_once`] did.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let t = tollgate::throttle::Throttle::builder("s").threshold(1).build().unwrap();
/// let report = t.sync_once().await.unwrap();
/// assert_eq!(report.redis_calls, 0); // no Redis configured
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncReport {
    /// Scripts run on Redis this round.
    pub redis_calls: u64,
    /// Filters this server wrote.
    pub written: u64,
    /// Writes given up because another server wrote first.
    pub conflicts: u64,
    /// Stored filters merged into this server's.
    pub merged: u64,
    /// The new estimate of active callers.
    pub active_callers: u64,
    /// Whether the service is now throttling.
    pub throttling: bool,
}

/// Counters of a [`Throttle`], for metrics.
///
/// ```
/// let t = tollgate::throttle::Throttle::builder("s").threshold(1).build().unwrap();
/// assert_eq!(t.stats().refused, 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThrottleStats {
    /// Estimated distinct callers in the window.
    pub active_callers: u64,
    /// Whether throttling mode is on.
    pub throttling: bool,
    /// The callers the filters were sized for.
    pub capacity: u64,
    /// Rounds run.
    pub rounds: u64,
    /// Scripts run on Redis, all rounds together.
    pub redis_calls: u64,
    /// Writes given up because another server wrote first.
    pub conflicts: u64,
    /// Rounds whose Redis part failed.
    pub errors: u64,
    /// Requests refused as new callers while throttling.
    pub refused: u64,
}

/// A number in `[0, 1)`, different per call and process.
fn random_fraction() -> f64 {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
