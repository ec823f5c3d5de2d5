//! How much, how often, and under which name.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::strategy::Strategy;

/// `limit` units per `window`. Zero limits and windows cannot be built.
///
/// `Quota::per_second(n)` means *n per second*, never "one every n seconds".
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let q = Quota::per_hour(NonZeroU32::new(5000).unwrap());
/// assert_eq!(q.limit(), 5000);
/// assert_eq!(q.window(), Duration::from_secs(3600));
///
/// // From runtime values (environment, config files), with a clear error:
/// assert!(Quota::new(5, Duration::from_secs(10)).is_ok());
/// assert!(Quota::new(5, Duration::ZERO).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: NonZeroU32,
    window: Duration,
}

impl Quota {
    /// `limit` per second.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::Quota;
    /// let q = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// assert_eq!((q.limit(), q.window()), (10, Duration::from_secs(1)));
    /// ```
    pub const fn per_second(limit: NonZeroU32) -> Self {
        Self::of(limit, Duration::from_secs(1))
    }

    /// `limit` per minute.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::Quota;
    /// // `const`, so a quota can be a constant:
    /// const SEARCH: Quota = Quota::per_minute(NonZeroU32::new(30).unwrap());
    /// assert_eq!((SEARCH.limit(), SEARCH.window()), (30, Duration::from_secs(60)));
    /// ```
    pub const fn per_minute(limit: NonZeroU32) -> Self {
        Self::of(limit, Duration::from_secs(60))
    }

    /// `limit` per hour.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::Quota;
    /// let q = Quota::per_hour(NonZeroU32::new(5000).unwrap());
    /// assert_eq!((q.limit(), q.window()), (5000, Duration::from_secs(3600)));
    /// ```
    pub const fn per_hour(limit: NonZeroU32) -> Self {
        Self::of(limit, Duration::from_secs(3600))
    }

    /// `limit` per `window`; the window must be at least one millisecond.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::Quota;
    /// let ten = NonZeroU32::new(10).unwrap();
    /// let q = Quota::with_window(ten, Duration::from_secs(10)).unwrap();
    /// assert_eq!(q.window(), Duration::from_secs(10));
    /// assert!(Quota::with_window(ten, Duration::from_micros(500)).is_err(), "under 1 ms");
    /// ```
    pub fn with_window(limit: NonZeroU32, window: Duration) -> Result<Self, ConfigError> {
        if window < Duration::from_millis(1) {
            return Err(ConfigError::new(format!(
                "window must be at least 1 ms, got {window:?}"
            )));
        }
        if window > Duration::from_secs(366 * 24 * 3600) {
            return Err(ConfigError::new(format!(
                "window must be at most a year, got {window:?}"
            )));
        }
        Ok(Self::of(limit, window))
    }

    /// `limit` per `window` from plain numbers, for values read at run time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// let q = Quota::new(100, Duration::from_secs(60)).unwrap();
    /// assert_eq!(q.limit(), 100);
    /// assert!(Quota::new(0, Duration::from_secs(60)).is_err());
    /// ```
    pub fn new(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        let limit =
            NonZeroU32::new(limit).ok_or_else(|| ConfigError::new("limit must be at least 1"))?;
        Self::with_window(limit, window)
    }

    const fn of(limit: NonZeroU32, window: Duration) -> Self {
        Self { limit, window }
    }

    /// Units allowed per window.
    pub fn limit(&self) -> u32 {
        self.limit.get()
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The window in whole microseconds, the unit the stores work in.
    pub(crate) fn window_micros(&self) -> u64 {
        self.window.as_micros() as u64
    }
}

/// A named limit: a strategy and one or more quotas checked together.
///
/// The name is what clients see in `X-RateLimit-Resource` and what separates
/// this policy's counters from other policies' in the store. With several
/// quotas, a request must fit all of them; when one rejects, none is charged.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{Policy, Quota};
///
/// let per_sec = Quota::per_second(NonZeroU32::new(10).unwrap());
/// let per_hour = Quota::per_hour(NonZeroU32::new(1000).unwrap());
/// let policy = Policy::fixed_window("core", per_sec).and(per_hour);
/// assert_eq!(policy.name(), "core");
/// assert_eq!(policy.quotas().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    name: Arc<str>,
    strategy: Strategy,
    quotas: Arc<[Quota]>,
}

impl Policy {
    /// A policy named `name` using `strategy` with one `quota`.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, Strategy};
    /// let per_min = Quota::per_minute(NonZeroU32::new(30).unwrap());
    /// let policy = Policy::new("search", Strategy::SlidingWindow, per_min);
    /// assert_eq!(policy.strategy(), &Strategy::SlidingWindow);
    /// assert_eq!(policy.quotas(), [per_min]);
    /// ```
    pub fn new(name: impl Into<Arc<str>>, strategy: Strategy, quota: Quota) -> Self {
        Self {
            name: name.into(),
            strategy,
            quotas: Arc::from([quota]),
        }
    }

    /// GitHub's fixed window: the first request opens a window of
    /// `quota.window()`; its end is stored and read back, never recomputed.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, Strategy};
    /// let policy = Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(5000).unwrap()));
    /// assert_eq!(policy.name(), "core");
    /// assert_eq!(policy.strategy(), &Strategy::FixedWindow);
    /// ```
    pub fn fixed_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Strategy::FixedWindow, quota)
    }

    /// A fixed window aligned on the Unix epoch: windows of `quota.window()`
    /// end at its multiples, so `Reset` is known in advance and the same for
    /// everyone ("1,000 per UTC day, reset at midnight").
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Policy, Quota, Strategy};
    /// let daily = Quota::new(1000, Duration::from_secs(86_400)).unwrap();
    /// let policy = Policy::aligned_window("daily", daily);
    /// assert_eq!(policy.strategy(), &Strategy::AlignedWindow);
    /// ```
    pub fn aligned_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Strategy::AlignedWindow, quota)
    }

    /// A uniform gate: one call per caller per `span`, to the microsecond
    /// (Bob may buy tiger-feeding tickets once every 10 s). A request of cost
    /// `c` closes the gate for `c` spans. The span must be 1 ms to a year.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    ///
    /// let policy = Policy::uniform_gate("tigerfeeding", Duration::from_secs(10)).unwrap();
    /// assert_eq!(policy.quotas()[0].limit(), 1);
    /// assert!(Policy::uniform_gate("tigerfeeding", Duration::ZERO).is_err());
    /// ```
    pub fn uniform_gate(name: impl Into<Arc<str>>, span: Duration) -> Result<Self, ConfigError> {
        let once = Quota::with_window(NonZeroU32::MIN, span)?;
        Ok(Self::new(name, Strategy::UniformGate, once))
    }

    /// An exact sliding-window log with two limits checked and charged
    /// together: `resource` is shared by every caller of the policy (the
    /// tiger feeding sells 100 tickets per 10 s to everyone), `consumer` is
    /// each caller's own (at most 3 of them each). When either rejects,
    /// nothing is charged, and [`Decision::scope`](crate::Decision::scope)
    /// says which one did. Limits are at most 1,000,000: the log keeps one
    /// entry per unit.
    ///
    /// All of a policy's keys share one Redis Cluster hash tag (the policy's
    /// name), because the resource log is checked with every caller's.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Policy, Quota};
    ///
    /// let everyone = Quota::new(100, Duration::from_secs(10)).unwrap();
    /// let each = Quota::new(3, Duration::from_secs(10)).unwrap();
    /// let policy = Policy::sliding_log("tigerfeeding", everyone, each);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn sliding_log(name: impl Into<Arc<str>>, resource: Quota, consumer: Quota) -> Self {
        Self::new(name, Strategy::SlidingLog, resource).and(consumer)
    }

    /// Cloudflare's sliding-window counter: `quota` over a window that slides,
    /// estimated from two fixed-window counters in constant memory per key.
    /// Takes more quotas with [`and`](Self::and), all-or-nothing.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    ///
    /// let per_sec = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// let per_hour = Quota::per_hour(NonZeroU32::new(1000).unwrap());
    /// let policy = Policy::sliding_window("search", per_sec).and(per_hour);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn sliding_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Strategy::SlidingWindow, quota)
    }

    /// GCRA, a token bucket as in redis-cell: refilled at `rate` (`limit` per
    /// `window`), holding up to `burst` units (redis-cell's `max_burst + 1`).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    ///
    /// // 1 per second on average, up to 5 at once.
    /// let rate = Quota::per_second(NonZeroU32::new(1).unwrap());
    /// let policy = Policy::gcra("feeding", rate, NonZeroU32::new(5).unwrap());
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn gcra(name: impl Into<Arc<str>>, rate: Quota, burst: NonZeroU32) -> Self {
        Self::new(name, Strategy::Gcra { burst }, rate)
    }

    /// A leaky bucket that shapes traffic to `rate` (`rate.limit()` per
    /// `rate.window()`, evenly spaced) and holds at most `capacity` requests:
    /// a request that fits waits for its turn, one that does not gets a 429.
    /// See [`Strategy::LeakyBucket`].
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, Strategy};
    ///
    /// // 10 per second, one every 100 ms; at most 20 waiting (2 s of queue).
    /// let rate = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// let policy = Policy::leaky_bucket("feeding", rate, NonZeroU32::new(20).unwrap());
    /// assert!(matches!(policy.strategy(), Strategy::LeakyBucket { .. }));
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn leaky_bucket(name: impl Into<Arc<str>>, rate: Quota, capacity: NonZeroU32) -> Self {
        Self::new(name, Strategy::LeakyBucket { capacity }, rate)
    }

    /// At most `limit` requests of a key in flight at once (Stripe's
    /// concurrent-request limiter). An app server that crashes holding slots
    /// gets them back after `timeout`, which must be longer than your slowest
    /// response. See [`Strategy::Concurrency`].
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::Policy;
    ///
    /// let policy = Policy::concurrency("uploads", NonZeroU32::new(3).unwrap(), Duration::from_secs(60))
    ///     .unwrap();
    /// assert_eq!(policy.quotas()[0].limit(), 3);
    /// assert!(Policy::concurrency("uploads", NonZeroU32::new(3).unwrap(), Duration::ZERO).is_err());
    /// ```
    pub fn concurrency(
        name: impl Into<Arc<str>>,
        limit: NonZeroU32,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let slots = Quota::with_window(limit, timeout)?;
        Ok(Self::new(name, Strategy::Concurrency, slots))
    }

    /// Adds another quota that every request must also fit.
    pub fn and(mut self, quota: Quota) -> Self {
        let mut quotas = self.quotas.to_vec();
        quotas.push(quota);
        self.quotas = quotas.into();
        self
    }

    /// The resource name, as sent in `X-RateLimit-Resource`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as shared text, for labels and store entries that
    /// outlive a request: cloning it bumps a reference count.
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// The algorithm.
    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// The quotas, in the order they were given.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// Checks what the types cannot: a usable name and a quota count the
    /// strategy supports. Called by the layer's and the stores' builders.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    /// let q = Quota::per_second(NonZeroU32::new(1).unwrap());
    /// assert!(Policy::fixed_window("core", q).validate().is_ok());
    /// assert!(Policy::fixed_window("", q).validate().is_err());
    /// assert!(Policy::fixed_window("bad name", q).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !name_ok {
            return Err(ConfigError::new(format!(
                "policy name {:?} must be 1-64 characters of [A-Za-z0-9-_./]",
                self.name
            )));
        }
        let max = self.strategy.max_quotas();
        if self.quotas.len() > max {
            return Err(ConfigError::new(format!(
                "strategy {} takes at most {max} quota(s), policy {:?} has {}",
                self.strategy.as_str(),
                self.name,
                self.quotas.len()
            )));
        }
        self.strategy.validate(&self.quotas)
    }
}
