//! A policy: a name, the strategy that decides, and its quotas. Plain
//! data; each strategy's constructor (`Policy::fixed_window`, ...) lives
//! in that strategy's file, `strategy/<name>.rs`, and so does what it
//! checks in [`Policy::validate`].

use std::num::NonZeroU32;
use std::sync::Arc;

use crate::penalty::PenaltyBox;
use crate::quota::Quota;

/// Which algorithm a [`Policy`] uses.
///
/// Each variant documents what `X-RateLimit-Remaining` and `-Reset` mean for
/// it, and what it costs in Redis. The constructors on
/// [`Policy`] (`fixed_window`, `aligned_window`, `uniform_gate`,
/// `sliding_log`, `sliding_window`, `gcra`, `leaky_bucket`, `concurrency`)
/// are the usual way to pick one.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::Strategy;
/// assert_eq!(Strategy::FixedWindow.as_str(), "fixed_window");
/// let capacity = NonZeroU32::new(10).unwrap();
/// assert_eq!(Strategy::LeakyBucket { capacity }.as_str(), "leaky_bucket");
/// assert_eq!(Strategy::Concurrency.as_str(), "concurrency");
/// assert_eq!(Strategy::Gcra { burst: NonZeroU32::new(5).unwrap() }.as_str(), "gcra");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// GitHub's fixed window. The first request opens a window and stores its
    /// end (`reset_at`) beside the counter; later requests read it back.
    /// `Remaining` is what is left in this window, `Reset` its stored end.
    /// Costs one `EVALSHA` (an `HMGET`, and for a pass `HSET` + `PEXPIRE` per
    /// quota) and one small hash per quota and key.
    FixedWindow,
    /// One call per caller per span (the quota's window; its limit must be 1).
    /// A pass closes the gate until `now + cost × span`, to the microsecond.
    /// `Remaining` is 1 while open, 0 while closed; `Reset` is when it opens
    /// again. Costs one `EVALSHA` running a `GET` (and for a pass a `SET PX`)
    /// and one short string per key.
    UniformGate,
    /// An exact sliding-window log with two limits at once: quota 0 is shared
    /// by every caller of the resource, quota 1 is each caller's own. Both
    /// logs are checked and charged together, or neither is. `Remaining` is
    /// what is left of the tighter limit; `Reset` is when that log is empty
    /// again (its newest entry leaves the window). Costs one `EVALSHA` (per
    /// log a `ZCOUNT` and a `ZRANGE`; on a pass `ZREMRANGEBYSCORE`, `ZADD`,
    /// `PEXPIRE`), and one sorted-set entry per unit spent in the window, so
    /// at most `limit` entries per log.
    SlidingLog,
    /// Cloudflare's sliding-window counter: two fixed-window counters (the
    /// windows aligned on the epoch), the previous one weighted by how much
    /// of it the sliding window still covers. `Remaining` is the limit minus
    /// that estimate, rounded down; `Reset` is when the estimate is back to
    /// zero (the end of the next window once this one has a charge).
    /// Costs one `EVALSHA` (`HMGET`; on a pass `HSET` + `PEXPIRE` per quota)
    /// and one three-field hash per quota and key, whatever the traffic.
    SlidingWindow,
    /// The generic cell rate algorithm, a token bucket as in redis-cell: the
    /// quota's rate (`limit` per `window`) refills a bucket of `burst` units.
    /// `Remaining` is how many units could pass right now; `Reset` is when the
    /// bucket is full again (the theoretical arrival time). Costs one
    /// `EVALSHA` (`GET`; on a pass `SET PX`) and one short string per key.
    Gcra {
        /// How many units may pass at once from a full bucket (redis-cell's
        /// `max_burst + 1`), and `X-RateLimit-Limit`.
        burst: NonZeroU32,
    },
    /// A leaky bucket that shapes traffic: requests leave at the quota's
    /// rate (one every `window / limit`, rounded up to the microsecond, so
    /// never faster), across all app servers. A request that finds the
    /// bucket holding `capacity` requests is rejected; any other waits for
    /// its turn (the layer sleeps without blocking the runtime) and then
    /// proceeds. A burst of `capacity` is accepted, spaced out by the rate.
    /// The longest wait is `capacity - 1` intervals: keep your server's and
    /// clients' request timeouts above it.
    ///
    /// `Limit` is `capacity`, `Remaining` the free places in the bucket,
    /// `Used` the places taken (requests waiting or leaving), `Reset` when the
    /// bucket will be empty. A rejection's `Retry-After` is when one more
    /// request fits. The decision's [`delay`](crate::Decision::delay) is the
    /// wait.
    ///
    /// Costs one `EVALSHA` (`GET`, and for a pass `SET .. PX`), one more to
    /// give a place back, and one string per key (the time the bucket
    /// empties, µs; about 100 bytes), expiring a second after the bucket
    /// empties. Build with
    /// [`Policy::leaky_bucket`](crate::Policy::leaky_bucket).
    LeakyBucket {
        /// How many requests the bucket holds: the longest wait is
        /// `capacity - 1` intervals.
        capacity: NonZeroU32,
    },
    /// Stripe's concurrent-request limiter: at most `limit` requests of a
    /// key in flight at once, across all app servers. The quota's window is
    /// the timeout after which an entry of a crashed app server stops
    /// counting; it must be longer than your slowest response. A slot is
    /// released when the response body ends or is dropped, when the request
    /// is cancelled, or after the timeout.
    ///
    /// `Limit` is the number of slots, `Remaining` the free slots, `Used`
    /// the requests in flight, `Reset` the time by which every slot held now
    /// is certain to be free (the newest in-flight request's start plus the
    /// timeout; now when none is in flight). Slots free when responses end,
    /// which no store can foresee, so a rejection's `Retry-After` is a hint:
    /// one second, or sooner if the oldest entry times out sooner.
    ///
    /// Costs one `EVALSHA` per request (`ZREMRANGEBYSCORE`, `ZCOUNT`,
    /// `ZREVRANGEBYSCORE`, and for a rejection a `ZRANGEBYSCORE`, for a pass
    /// `ZADD` + `PEXPIRE`) and one for the
    /// release (`ZREM`); one sorted set per key holding at most `limit`
    /// members (about 150 bytes for one, 30 more per slot up to 128 slots,
    /// about 120 per slot beyond), expiring one timeout after the last
    /// admission. Build with [`Policy::concurrency`](crate::Policy::concurrency).
    Concurrency,
    /// A fixed window aligned on the Unix epoch, as limits (Python) and
    /// Upstash ship it: a quota's windows end at multiples of its length,
    /// so every server and client knows `Reset` in advance ("1,000 per UTC
    /// day, reset at midnight"). `Remaining` is what is left in this
    /// window, `Reset` its end. Costs one `EVALSHA` (an `HMGET`, and for a
    /// pass `HINCRBY`, or `HSET` + `PEXPIRE` when the window is new, per
    /// quota) and one small hash per quota and key.
    AlignedWindow,
}

impl Strategy {
    /// A short stable name, for logs, metrics and Redis keys.
    pub fn as_str(&self) -> &'static str {
        match self {
            Strategy::FixedWindow => "fixed_window",
            Strategy::UniformGate => "uniform_gate",
            Strategy::SlidingLog => "sliding_log",
            Strategy::SlidingWindow => "sliding_window",
            Strategy::Gcra { .. } => "gcra",
            Strategy::LeakyBucket { .. } => "leaky_bucket",
            Strategy::Concurrency => "concurrency",
            Strategy::AlignedWindow => "aligned_window",
        }
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
    overridable: bool,
    adjustable: bool,
    penalty: Option<PenaltyBox>,
    /// An operator's cap in force (see [`PolicyLimits`](crate::PolicyLimits)):
    /// each quota's highest limit, which no override exceeds.
    cap: Option<Arc<[u32]>>,
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
            overridable: false,
            adjustable: false,
            penalty: None,
            cap: None,
        }
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

    /// Lets an operator give single callers quotas of their own at runtime
    /// ([`RateLimiter::set_override`](crate::RateLimiter::set_override)).
    /// Each decision then also reads the caller's override: on Redis one
    /// `GET` more inside the same script call, in its hash slot.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    /// let q = Quota::per_hour(NonZeroU32::new(100).unwrap());
    /// assert!(Policy::fixed_window("api", q).overridable().is_overridable());
    /// assert!(!Policy::fixed_window("api", q).is_overridable());
    /// ```
    pub fn overridable(self) -> Self {
        Self {
            overridable: true,
            ..self
        }
    }

    /// Whether callers may have quotas of their own.
    pub fn is_overridable(&self) -> bool {
        self.overridable
    }

    /// Lets an operator change the limits of every caller at runtime: a
    /// limit replacing the policy's quotas and a cap nothing exceeds (see
    /// [`PolicyLimits`](crate::PolicyLimits),
    /// [`RateLimiter::set_policy_limit`](crate::RateLimiter::set_policy_limit)).
    /// A Redis store then reads every adjustable policy's limits, one
    /// `HGETALL` of one hash every half second per app server, apart from
    /// the decisions; a decision costs no more.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    /// let q = Quota::per_minute(NonZeroU32::new(100).unwrap());
    /// assert!(Policy::fixed_window("search", q).adjustable().is_adjustable());
    /// assert!(!Policy::fixed_window("search", q).is_adjustable());
    /// ```
    pub fn adjustable(self) -> Self {
        Self {
            adjustable: true,
            ..self
        }
    }

    /// Whether an operator may change every caller's limits at runtime
    /// (see [`adjustable`](Self::adjustable)).
    pub fn is_adjustable(&self) -> bool {
        self.adjustable
    }

    /// Refuses a caller for a while after repeated rejections: see
    /// [`PenaltyBox`]. On Redis each decision also reads the caller's
    /// entry (`HMGET`), and a rejection writes it (`HSET` + `PEXPIRE`),
    /// inside the same script call.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{PenaltyBox, Policy, Quota};
    /// let q = Quota::per_minute(NonZeroU32::new(5).unwrap());
    /// let b = PenaltyBox::new(NonZeroU32::MIN, Duration::from_secs(60), Duration::from_secs(600)).unwrap();
    /// assert!(Policy::fixed_window("login", q).with_penalty_box(b).penalty_box().is_some());
    /// ```
    pub fn with_penalty_box(self, penalty: PenaltyBox) -> Self {
        Self {
            penalty: Some(penalty),
            ..self
        }
    }

    /// The penalty box, if the policy has one.
    pub fn penalty_box(&self) -> Option<&PenaltyBox> {
        self.penalty.as_ref()
    }

    /// Whether a decision reads the caller's own rules (an override, the
    /// penalty box) besides its counters.
    pub(crate) fn has_caller_rules(&self) -> bool {
        self.overridable || self.penalty.is_some()
    }

    /// This policy with `strategy` and `quotas` instead (an override, a
    /// limit that came with the request): the same name, so the same
    /// state. Built by `Policy::with_quotas` (`strategy/mod.rs`), which
    /// asks the strategy what the quotas make of its parameters.
    pub(crate) fn with_parts(&self, strategy: Strategy, quotas: Arc<[Quota]>) -> Self {
        Self {
            name: self.name.clone(),
            strategy,
            quotas,
            overridable: self.overridable,
            adjustable: self.adjustable,
            penalty: self.penalty,
            cap: self.cap.clone(),
        }
    }

    /// The cap in force: each quota's highest limit, which an override
    /// above it does not pass (it is set aside while the cap lasts).
    pub(crate) fn cap(&self) -> Option<&[u32]> {
        self.cap.as_deref()
    }

    /// This policy under `cap` (a limit per quota): each quota's limit at
    /// most the cap's, and the cap kept for the caller's own rules.
    pub(crate) fn with_cap(&self, cap: Arc<[u32]>) -> Policy {
        let quotas: Vec<Quota> = self
            .quotas
            .iter()
            .zip(cap.iter())
            .map(|(q, &most)| match q.limit() > most {
                true => Quota::new(most, q.window()).unwrap_or(*q),
                false => *q,
            })
            .collect();
        let mut capped = self.with_quotas(quotas.into());
        capped.cap = Some(cap);
        capped
    }
}
