//! Throttling mode; the design is described on [`Throttle`].

#[cfg(feature = "redis")]
mod codec;
pub(crate) mod ring;
#[cfg(feature = "redis")]
mod sync;
#[cfg(not(feature = "redis"))]
#[path = "unsynced.rs"]
mod sync;

#[cfg(feature = "redis")]
pub(crate) use self::sync::scripts as sync_scripts;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use self::ring::{Ring, Shape};
use self::sync::RedisSync;
use crate::clock::{Clock, SystemClock};
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::quota::Policy;
#[cfg(feature = "redis")]
use crate::store::RedisStore;

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
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| ConfigError::new("Throttle::start needs a Tokio runtime"))?;
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

/// Configures a [`Throttle`]; only the threshold is required.
///
/// | option | default |
/// |---|---|
/// | [`capacity`](Self::capacity) | twice the threshold |
/// | [`false_positive_rate`](Self::false_positive_rate) | 0.01 at capacity |
/// | [`slots`](Self::slots) × [`slot_length`](Self::slot_length) | 30 × 1 minute |
/// | [`sync_every`](Self::sync_every) | 1 second |
/// | [`retry_after`](Self::retry_after) | one slot |
/// | [`redis`](Self::redis) | none: each server on its own |
/// | [`clock`](Self::clock) | [`SystemClock`] |
/// | [`seed`](Self::seed) | derived from the name |
///
/// ```
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::RedisStore;
/// use tollgate::throttle::Throttle;
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let throttle = Throttle::builder("sessions").threshold(50_000).redis(&store).build()?;
/// # Ok(()) }
/// ```
#[must_use]
pub struct ThrottleBuilder {
    name: Arc<str>,
    threshold: Option<u64>,
    capacity: Option<usize>,
    false_positive_rate: f64,
    slots: usize,
    slot_length: Duration,
    sync_every: Duration,
    retry_after: Option<Duration>,
    #[cfg(feature = "redis")]
    redis: Option<RedisStore>,
    clock: Arc<dyn Clock>,
    seed: Option<u128>,
}

impl fmt::Debug for ThrottleBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleBuilder")
            .field("name", &self.name)
            .field("threshold", &self.threshold)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl ThrottleBuilder {
    fn new(name: Arc<str>) -> Self {
        Self {
            name,
            threshold: None,
            capacity: None,
            false_positive_rate: 0.01,
            slots: 30,
            slot_length: Duration::from_secs(60),
            sync_every: Duration::from_secs(1),
            retry_after: None,
            #[cfg(feature = "redis")]
            redis: None,
            clock: Arc::new(SystemClock),
            seed: None,
        }
    }

    /// Throttling starts when more than this many callers are active (required).
    pub fn threshold(mut self, callers: u64) -> Self {
        self.threshold = Some(callers);
        self
    }

    /// How many distinct callers in the window the filters are sized for;
    /// at least the threshold. Past it, false positives grow and the
    /// estimate saturates (and reads as throttling).
    pub fn capacity(mut self, callers: usize) -> Self {
        self.capacity = Some(callers);
        self
    }

    /// One filter's false-positive rate at capacity, in `(0, 1)`.
    pub fn false_positive_rate(mut self, rate: f64) -> Self {
        self.false_positive_rate = rate;
        self
    }

    /// How many slots the window has (1 to 1440).
    pub fn slots(mut self, slots: usize) -> Self {
        self.slots = slots;
        self
    }

    /// How long one slot lasts (at least 1 ms). The window is
    /// `slots × slot_length`.
    pub fn slot_length(mut self, length: Duration) -> Self {
        self.slot_length = length;
        self
    }

    /// How often the background task runs a round.
    pub fn sync_every(mut self, every: Duration) -> Self {
        self.sync_every = every;
        self
    }

    /// The `Retry-After` of refused callers (rounded up to whole seconds).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Shares callers with every app server using the same Redis, prefix and
    /// throttle name, over `store`'s connection. Needs the `redis` feature.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis(mut self, store: &RedisStore) -> Self {
        self.redis = Some(store.clone());
        self
    }

    /// Where slot boundaries come from. App servers should agree on time
    /// within a small part of a slot; a [`ManualClock`](crate::clock::ManualClock)
    /// lets tests move through slots without waiting.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The key hash's seed; must be the same on every app server.
    pub fn seed(mut self, seed: u128) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The throttle, or why this configuration cannot work.
    pub fn build(self) -> Result<Throttle, ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !name_ok {
            return Err(ConfigError::new(format!(
                "throttle name {:?} must be 1-64 characters of [A-Za-z0-9-_./]",
                self.name
            )));
        }
        let threshold = self
            .threshold
            .ok_or_else(|| ConfigError::new("a throttle needs a threshold: call .threshold(..)"))?;
        let capacity = self
            .capacity
            .unwrap_or_else(|| usize::try_from(threshold.saturating_mul(2)).unwrap_or(usize::MAX))
            .max(1);
        if (capacity as u64) < threshold {
            return Err(ConfigError::new(format!(
                "throttle capacity {capacity} is below its threshold {threshold}: the estimate would saturate first"
            )));
        }
        let p = self.false_positive_rate;
        if !(p > 0.0 && p < 1.0) {
            return Err(ConfigError::new(format!(
                "false positive rate must be between 0 and 1, got {p}"
            )));
        }
        if !(1..=1440).contains(&self.slots) {
            return Err(ConfigError::new(format!(
                "a throttle takes 1 to 1440 slots, got {}",
                self.slots
            )));
        }
        if self.slot_length < Duration::from_millis(1) || self.sync_every.is_zero() {
            return Err(ConfigError::new(
                "slot length must be at least 1 ms and sync_every above zero",
            ));
        }
        let seed = self.seed.unwrap_or_else(|| default_seed(&self.name));
        let shape = Shape::for_capacity(capacity, p, seed);
        let memory = shape.bits / 8 * (self.slots + 2);
        if memory > MAX_MEMORY {
            return Err(ConfigError::new(format!(
                "the filters would take {} MiB; lower the capacity, the slots or raise the false positive rate",
                memory >> 20
            )));
        }
        let slot_micros = self.slot_length.as_micros() as u64;
        let slot_no = self.clock.now_micros() / slot_micros;
        #[cfg(not(feature = "redis"))]
        let redis: Option<RedisSync> = None;
        #[cfg(feature = "redis")]
        let redis = self.redis.map(|store| {
            let ttl_ms = (self.slot_length * (self.slots as u32 + 1)).as_millis() as u64;
            RedisSync::new(
                store.connection().clone(),
                store.scripting().clone(),
                store.keyspace().throttle_tag(&self.name),
                ttl_ms,
            )
        });
        Ok(Throttle {
            inner: Arc::new(Inner {
                name: self.name,
                ring: Ring::new(shape, self.slots, slot_no),
                clock: self.clock,
                slot_micros,
                threshold,
                capacity,
                retry_after: self.retry_after.unwrap_or(self.slot_length),
                sync_every: self.sync_every,
                throttling: AtomicBool::new(false),
                estimate: AtomicU64::new(0),
                round: tokio::sync::Mutex::new(redis),
                rounds: AtomicU64::new(0),
                redis_calls: AtomicU64::new(0),
                conflicts: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                policies: Default::default(),
            }),
        })
    }
}

/// A number in `[0, 1)`, different per call and process.
fn random_fraction() -> f64 {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// FNV-1a of the name, widened: the same on every server, different per name.
fn default_seed(name: &str) -> u128 {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in name.bytes() {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013B);
    }
    h
}
