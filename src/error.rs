//! Errors: bad configuration, unusable keys, store trouble, and why a peek
//! has no answer.
//!
//! Being rate limited is not an error; it is a [`Decision`](crate::Decision)
//! with `allowed == false`.

use std::error::Error as StdError;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use http::StatusCode;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Configuration that cannot work, reported when the layer or store is built.
///
/// One variant per kind of mistake, carrying the values that make it one;
/// `Display` says the same for people.
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use tollgate::{ConfigError, Policy, Quota};
///
/// let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
/// assert!(matches!(err, ConfigError::LimitZero));
/// assert_eq!(
///     err.to_string(),
///     "invalid rate limit configuration: limit must be at least 1"
/// );
///
/// let q = Quota::per_second(NonZeroU32::new(1).unwrap());
/// match Policy::fixed_window("bad name", q).validate() {
///     Err(ConfigError::PolicyName { name }) => assert_eq!(name, "bad name"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    // ---- quotas
    /// A quota's limit is zero.
    LimitZero,
    /// A quota's window is shorter than 1 ms.
    WindowTooShort {
        /// The window given.
        window: Duration,
    },
    /// A quota's window is longer than a year.
    WindowTooLong {
        /// The window given.
        window: Duration,
    },

    // ---- policies and strategies
    /// A policy's name is empty, longer than 64 bytes, or has characters
    /// outside `[A-Za-z0-9-_./]`.
    PolicyName {
        /// The name given.
        name: String,
    },
    /// A policy has more quotas than its strategy can check at once.
    TooManyQuotas {
        /// The strategy's name, as [`Strategy::as_str`](crate::Strategy::as_str) gives it.
        strategy: &'static str,
        /// The policy's name.
        policy: String,
        /// How many quotas the strategy takes.
        max: usize,
        /// How many the policy has.
        got: usize,
    },
    /// A uniform gate was given other than exactly one quota.
    UniformGateQuotas {
        /// How many quotas it was given.
        got: usize,
    },
    /// A uniform gate's quota has a limit other than 1.
    UniformGateLimit {
        /// The limit given.
        limit: u32,
    },
    /// GCRA was given other than exactly one quota.
    GcraQuotas {
        /// How many quotas it was given.
        got: usize,
    },
    /// GCRA's rate is above one unit per microsecond.
    QuotaTooFast {
        /// The quota's limit.
        limit: u32,
        /// The quota's window.
        window: Duration,
    },
    /// A GCRA bucket takes more than a year to refill.
    GcraRefillTooLong {
        /// The bucket's size.
        burst: NonZeroU32,
        /// The quota's limit.
        limit: u32,
        /// The quota's window.
        window: Duration,
    },
    /// A leaky bucket, full, would queue for more than a year.
    LeakyBucketTooLong {
        /// The bucket's capacity.
        capacity: NonZeroU32,
        /// The drain rate's limit.
        limit: u32,
        /// The drain rate's window.
        window: Duration,
    },
    /// A sliding log was given other than two quotas.
    SlidingLogQuotas {
        /// How many quotas it was given.
        got: usize,
    },
    /// A sliding log's limit is above what it keeps entries for.
    SlidingLogLimit {
        /// The largest limit a sliding log takes.
        max: u32,
        /// The limit given.
        got: u32,
    },

    // ---- layers
    /// A layer was built without a policy.
    NoPolicy,
    /// A deadline is zero.
    DeadlineZero {
        /// Whose deadline: `"store"` or `"queue"`.
        what: &'static str,
    },
    /// A status the layer answers with is not a 4xx or 5xx.
    StatusNotAnError {
        /// Which status: `"limited"`, `"key error"` or `"unplaced"`.
        what: &'static str,
        /// The status given.
        status: StatusCode,
    },
    /// An allow- or deny-list entry is neither a network (CIDR) nor an address.
    Network {
        /// The entry given, trimmed.
        given: String,
    },
    /// An IPv6 prefix length outside 1 to 128.
    Ipv6Prefix {
        /// The length given.
        bits: u8,
    },

    // ---- tiered layers
    /// A tiered layer was built without tiers.
    NoTiers,
    /// A tiered layer was built without a chooser.
    NoChooser,
    /// One tier's layer cannot be built; the cause is the
    /// [`source`](StdError::source).
    Tier {
        /// The tier's place, counting from 1.
        tier: usize,
        /// Why it cannot be built.
        source: Box<ConfigError>,
    },
    /// Two tiers' policies have the same name.
    DuplicateTier {
        /// The name they share.
        name: String,
    },
    /// The unplaced requests are sent to a tier the layer does not have.
    UnknownUnplacedTier {
        /// The tier named.
        name: String,
    },

    // ---- stores
    /// A Redis key prefix is empty, longer than 64 bytes, or has braces,
    /// `'|'` or control characters.
    KeyPrefix {
        /// The prefix given.
        prefix: String,
    },

    // ---- queues
    /// A queue's capacity is zero.
    QueueCapacityZero,
    /// A queue's ttl is under 1 s or over a year.
    QueueTtl {
        /// The ttl given.
        ttl: Duration,
    },
    /// A stream processor's group or consumer name is empty, longer than
    /// 128 bytes, or has control characters.
    ProcessorName {
        /// Which name: `"group"` or `"consumer"`.
        what: &'static str,
        /// The name given.
        name: String,
    },

    // ---- throttles
    /// A throttle's name is empty, longer than 64 bytes, or has characters
    /// outside `[A-Za-z0-9-_./]`.
    ThrottleName {
        /// The name given.
        name: String,
    },
    /// A throttle was built without a threshold.
    NoThreshold,
    /// A throttle's capacity is below its threshold.
    CapacityBelowThreshold {
        /// The capacity.
        capacity: usize,
        /// The threshold.
        threshold: u64,
    },
    /// A false positive rate outside `(0, 1)`.
    FalsePositiveRate {
        /// The rate given.
        rate: f64,
    },
    /// A throttle's slot count outside 1 to 1440.
    ThrottleSlots {
        /// The count given.
        slots: usize,
    },
    /// A throttle's slot length is under 1 ms or its sync interval is zero.
    ThrottleTiming {
        /// The slot length given.
        slot_length: Duration,
        /// The sync interval given.
        sync_every: Duration,
    },
    /// A throttle's filters would take more memory than allowed.
    ThrottleMemory {
        /// The bytes they would take.
        bytes: usize,
    },
    /// `Throttle::start` was called outside a Tokio runtime.
    NoRuntime,
    /// A [`PenaltyBox`](crate::PenaltyBox) out of bounds.
    PenaltyBox {
        /// What is wrong.
        why: String,
    },
    /// An [`Override`](crate::Override) the policy cannot take.
    Override {
        /// The policy.
        policy: String,
        /// What is wrong.
        why: String,
    },
    /// A runtime limit or cap ([`PolicyLimits`](crate::PolicyLimits)) the
    /// policy cannot take.
    PolicyLimit {
        /// The policy.
        policy: String,
        /// `"limit"` or `"cap"`.
        which: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Quotas from the request with bounds that hold no limit.
    RequestLimits {
        /// The lowest limit allowed.
        min: u32,
        /// The highest.
        max: u32,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError::*;
        f.write_str("invalid rate limit configuration: ")?;
        match self {
            LimitZero => f.write_str("limit must be at least 1"),
            WindowTooShort { window } => {
                write!(f, "window must be at least 1 ms, got {window:?}")
            }
            WindowTooLong { window } => write!(f, "window must be at most a year, got {window:?}"),
            PolicyName { name } => write!(
                f,
                "policy name {name:?} must be 1-64 characters of [A-Za-z0-9-_./]"
            ),
            TooManyQuotas {
                strategy,
                policy,
                max,
                got,
            } => write!(
                f,
                "strategy {strategy} takes at most {max} quota(s), policy {policy:?} has {got}"
            ),
            UniformGateQuotas { .. } => f.write_str("a uniform gate takes exactly one quota"),
            UniformGateLimit { limit } => write!(
                f,
                "a uniform gate lets one call through per span; its quota's limit must be 1, got {limit}"
            ),
            GcraQuotas { .. } => f.write_str("GCRA takes exactly one quota (its rate)"),
            QuotaTooFast { limit, window } => write!(
                f,
                "GCRA emits at most one unit per microsecond; {limit} per {window:?} is faster"
            ),
            GcraRefillTooLong {
                burst,
                limit,
                window,
            } => write!(
                f,
                "a GCRA bucket of {burst} units at {limit} per {window:?} takes more than a year to refill"
            ),
            LeakyBucketTooLong {
                capacity,
                limit,
                window,
            } => write!(
                f,
                "a leaky bucket of capacity {capacity} at {limit} per {window:?} would queue for more than a year"
            ),
            SlidingLogQuotas { .. } => f.write_str(
                "a sliding log takes two quotas, the resource's and each consumer's: use Policy::sliding_log",
            ),
            SlidingLogLimit { max, got } => write!(
                f,
                "a sliding log keeps one entry per unit, so its limits are at most {max}, got {got}; \
                 the sliding-window counter takes any limit in constant memory"
            ),
            NoPolicy => f.write_str("a policy is required: call .policy(..)"),
            DeadlineZero { what } => write!(f, "the {what} deadline must be longer than zero"),
            StatusNotAnError { what, status } => {
                write!(f, "the {what} status must be a 4xx or 5xx, got {status}")
            }
            Network { given } => write!(f, "{given:?} is not a network (CIDR) or address"),
            Ipv6Prefix { bits } => write!(f, "IPv6 prefix must be 1 to 128 bits, got {bits}"),
            NoTiers => f.write_str("a tiered layer needs at least one tier: call .tier(..)"),
            NoChooser => f.write_str("a tiered layer needs a chooser: call .choose(..)"),
            Tier { tier, source } => write!(f, "tier {tier}: {source}"),
            DuplicateTier { name } => write!(
                f,
                "two tiers are named {name:?}: each tier's policy needs a name of its own, \
                 which keeps its counters apart in the store"
            ),
            UnknownUnplacedTier { name } => {
                write!(f, "the unplaced tier {name:?} is not one of the layer's tiers")
            }
            KeyPrefix { prefix } => write!(
                f,
                "key prefix {prefix:?} must be 1-64 characters without braces, '|' or control characters"
            ),
            QueueCapacityZero => f.write_str("a queue's capacity must be at least 1"),
            QueueTtl { ttl } => write!(
                f,
                "a queue's ttl must be between 1 s and a year, got {ttl:?}"
            ),
            ProcessorName { what, name } => write!(
                f,
                "a {what} name must be 1-128 characters without control characters, got {name:?}"
            ),
            ThrottleName { name } => write!(
                f,
                "throttle name {name:?} must be 1-64 characters of [A-Za-z0-9-_./]"
            ),
            NoThreshold => f.write_str("a throttle needs a threshold: call .threshold(..)"),
            CapacityBelowThreshold {
                capacity,
                threshold,
            } => write!(
                f,
                "throttle capacity {capacity} is below its threshold {threshold}: the estimate would saturate first"
            ),
            FalsePositiveRate { rate } => write!(
                f,
                "false positive rate must be between 0 and 1, got {rate}"
            ),
            ThrottleSlots { slots } => write!(f, "a throttle takes 1 to 1440 slots, got {slots}"),
            ThrottleTiming { .. } => {
                f.write_str("slot length must be at least 1 ms and sync_every above zero")
            }
            ThrottleMemory { bytes } => write!(
                f,
                "the filters would take {} MiB; lower the capacity, the slots or raise the false positive rate",
                bytes >> 20
            ),
            PenaltyBox { why } => write!(f, "penalty box: {why}"),
            Override { policy, why } => write!(f, "override for policy {policy:?}: {why}"),
            PolicyLimit { policy, which, why } => {
                write!(f, "runtime {which} for policy {policy:?}: {why}")
            }
            RequestLimits { min, max } => write!(
                f,
                "limits from the request must lie in 1..=u32::MAX with min <= max, got {min}..={max}"
            ),
            NoRuntime => f.write_str("Throttle::start needs a Tokio runtime"),
        }
    }
}

impl StdError for ConfigError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            ConfigError::Tier { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

/// Why no key could be taken from a request.
///
/// The layer answers such requests with the configured key-error response
/// (400 by default) and never asks the store.
///
/// ```
/// use tollgate::KeyError;
/// let err = KeyError::Missing("x-api-key");
/// assert_eq!(err.to_string(), "request has no x-api-key");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The part of the request the extractor reads is absent.
    Missing(&'static str),
    /// The part is there but cannot be used (not UTF-8, not an address, ...).
    Invalid(&'static str),
    /// Any other reason, from a custom extractor.
    Other(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing(what) => write!(f, "request has no {what}"),
            KeyError::Invalid(what) => write!(f, "request has an unusable {what}"),
            KeyError::Other(why) => f.write_str(why),
        }
    }
}

impl StdError for KeyError {}

/// Why an operator's change through a [`RateLimiter`](crate::RateLimiter)
/// (an override, a block) was not made: it was invalid, and nothing was
/// stored, or the store failed.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::error::AdminError;
/// use tollgate::{ConfigError, Key, MemoryStore, Override, Policy, Quota, RateLimiter};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let q = Quota::per_hour(NonZeroU32::new(10).unwrap());
/// let limiter = RateLimiter::new(Policy::fixed_window("api", q), MemoryStore::new()).unwrap();
/// let err = limiter.set_override(&Key::new("ann"), Override::new(q)).await.unwrap_err();
/// assert!(matches!(err, AdminError::Invalid(ConfigError::Override { .. })));
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum AdminError {
    /// The change does not fit the policy; nothing was stored.
    Invalid(ConfigError),
    /// The store failed.
    Store(StoreError),
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminError::Invalid(e) => e.fmt(f),
            AdminError::Store(e) => e.fmt(f),
        }
    }
}

impl StdError for AdminError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            AdminError::Invalid(e) => Some(e),
            AdminError::Store(e) => Some(e),
        }
    }
}

impl From<ConfigError> for AdminError {
    fn from(e: ConfigError) -> Self {
        AdminError::Invalid(e)
    }
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        AdminError::Store(e)
    }
}

/// Why [`RateLimitLayer::peek`](crate::RateLimitLayer::peek) has no answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum PeekError {
    /// No key could be taken from the request.
    Key(KeyError),
    /// The store failed or missed the deadline.
    Store(StoreError),
    /// A [tiered layer](crate::TieredLayer) could not place the request in
    /// any of its tiers, and answers such requests with a status.
    Unplaced,
}

impl fmt::Display for PeekError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeekError::Key(e) => e.fmt(f),
            PeekError::Store(e) => e.fmt(f),
            PeekError::Unplaced => f.write_str("the request fits no rate-limit tier"),
        }
    }
}

impl StdError for PeekError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            PeekError::Key(e) => Some(e),
            PeekError::Store(e) => Some(e),
            PeekError::Unplaced => None,
        }
    }
}

/// What kind of store failure happened; the failure policy treats all alike,
/// metrics and logs tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer before the deadline.
    Timeout,
    /// The store could not be reached or the connection broke.
    Unavailable,
    /// The store answered something this crate does not understand.
    Protocol,
    /// The store refused the request (script error, wrong type, ...).
    Rejected,
    /// The server is older than the store supports; reported at connect,
    /// naming the version found and the one needed.
    Unsupported,
}

impl StoreErrorKind {
    /// A short stable name for logs and metric labels.
    ///
    /// ```
    /// assert_eq!(tollgate::error::StoreErrorKind::Timeout.as_str(), "timeout");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Protocol => "protocol",
            StoreErrorKind::Rejected => "rejected",
            StoreErrorKind::Unsupported => "unsupported",
        }
    }
}

/// A store could not decide. The cause is kept as the error's `source`.
///
/// ```
/// use tollgate::StoreError;
/// use tollgate::error::StoreErrorKind;
/// let err = StoreError::timeout();
/// assert_eq!(err.kind(), StoreErrorKind::Timeout);
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<BoxError>,
    /// Whether a failed write may have changed the store, when the kind
    /// alone does not tell: `Some(false)` when the call was never sent (a
    /// connection refused), `Some(true)` when an earlier step of the same
    /// change landed.
    written: Option<bool>,
}

impl StoreError {
    /// An error of `kind` caused by `source`.
    ///
    /// ```
    /// use tollgate::StoreError;
    /// use tollgate::error::StoreErrorKind;
    /// let err = StoreError::new(StoreErrorKind::Unavailable, "connection refused");
    /// assert_eq!(err.kind(), StoreErrorKind::Unavailable);
    /// assert_eq!(err.to_string(), "rate limit store unavailable: connection refused");
    /// ```
    pub fn new(kind: StoreErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            source: Some(source.into()),
            written: None,
        }
    }

    /// The deadline passed before the store answered.
    ///
    /// ```
    /// use std::error::Error;
    /// use tollgate::StoreError;
    /// let err = StoreError::timeout();
    /// assert_eq!(err.to_string(), "rate limit store timeout");
    /// assert!(err.source().is_none());
    /// ```
    pub fn timeout() -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            source: None,
            written: None,
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    /// The store ran the call after its deadline and charged nothing.
    pub(crate) fn late() -> Self {
        Self::new(
            StoreErrorKind::Timeout,
            "reached the store after its deadline; nothing was charged",
        )
    }

    /// The store failed moments ago and is being given time to recover.
    pub(crate) fn cooling_down() -> Self {
        Self::new(
            StoreErrorKind::Unavailable,
            "skipped: the store failed within the cooldown",
        )
    }

    /// The answer could not be understood.
    ///
    /// ```
    /// use tollgate::StoreError;
    /// use tollgate::error::StoreErrorKind;
    /// let err = StoreError::protocol("expected 3 integers");
    /// assert_eq!(err.kind(), StoreErrorKind::Protocol);
    /// assert_eq!(err.to_string(), "rate limit store protocol: expected 3 integers");
    /// ```
    pub fn protocol(why: impl Into<String>) -> Self {
        Self::new(StoreErrorKind::Protocol, why.into())
    }

    /// What went wrong, broadly.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// Whether a write that failed this way may still have changed the
    /// store: it was sent and no answer came back (a timeout, a broken
    /// connection, an answer that made no sense), or an earlier step of
    /// the same change had landed. `false` only when nothing can have been
    /// written: the store refused the first step, or it was never sent.
    ///
    /// ```
    /// use tollgate::StoreError;
    /// use tollgate::error::StoreErrorKind;
    /// assert!(StoreError::timeout().may_have_written());
    /// assert!(!StoreError::new(StoreErrorKind::Rejected, "READONLY").may_have_written());
    /// ```
    pub fn may_have_written(&self) -> bool {
        self.written.unwrap_or(match self.kind {
            StoreErrorKind::Timeout | StoreErrorKind::Unavailable | StoreErrorKind::Protocol => {
                true
            }
            StoreErrorKind::Rejected | StoreErrorKind::Unsupported => false,
        })
    }

    /// This error, from a later step of a change whose first step landed:
    /// whatever its kind, the store may have been changed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn after_a_write(mut self) -> Self {
        self.written = Some(true);
        self
    }

    /// This error, from a call that never reached the store (the
    /// connection was refused): nothing was written.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn unsent(mut self) -> Self {
        self.written = Some(false);
        self
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "rate limit store {}: {source}", self.kind.as_str()),
            None => write!(f, "rate limit store {}", self.kind.as_str()),
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for StoreError {
    fn from(err: redis::RedisError) -> Self {
        let refused = err.is_connection_refusal();
        let this = Self::new(StoreErrorKind::of(&err), err);
        if refused {
            this.unsent()
        } else {
            this
        }
    }
}

#[cfg(feature = "redis")]
impl StoreErrorKind {
    /// What kind of failure a redis-rs error is.
    pub(crate) fn of(err: &redis::RedisError) -> Self {
        if err.is_timeout() {
            StoreErrorKind::Timeout
        } else if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_unrecoverable_error()
        {
            StoreErrorKind::Unavailable
        } else {
            StoreErrorKind::Rejected
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, Quota, RateLimitLayer, Strategy, TieredLayer};

    fn quota(limit: u32, secs: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(secs)).unwrap()
    }

    #[test]
    fn the_constructors_report_variants_a_caller_can_match() {
        let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
        assert_eq!(err, ConfigError::LimitZero);
        let err = Quota::new(1, Duration::from_micros(10)).unwrap_err();
        assert_eq!(
            err,
            ConfigError::WindowTooShort {
                window: Duration::from_micros(10)
            }
        );
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: window must be at least 1 ms, got 10µs"
        );

        let err = Policy::fixed_window("bad name", quota(1, 1))
            .validate()
            .unwrap_err();
        assert!(matches!(&err, ConfigError::PolicyName { name } if name == "bad name"));
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: policy name \"bad name\" must be 1-64 characters of [A-Za-z0-9-_./]"
        );

        let burst = NonZeroU32::new(2).unwrap();
        let err = Policy::gcra("g", quota(2_000_000, 1), burst)
            .validate()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::QuotaTooFast {
                limit: 2_000_000,
                window: Duration::from_secs(1)
            }
        );

        let err = Policy::gcra("g", quota(1, 1), burst)
            .and(quota(5, 60))
            .validate()
            .unwrap_err();
        assert!(matches!(
            &err,
            ConfigError::TooManyQuotas { strategy: "gcra", policy, max: 1, got: 2 } if policy == "g"
        ));
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: strategy gcra takes at most 1 quota(s), policy \"g\" has 2"
        );

        let err = Policy::new("gate", Strategy::UniformGate, quota(2, 10))
            .validate()
            .unwrap_err();
        assert_eq!(err, ConfigError::UniformGateLimit { limit: 2 });

        let err = crate::PeerIp::new().ipv6_prefix(0).unwrap_err();
        assert_eq!(err, ConfigError::Ipv6Prefix { bits: 0 });
    }

    #[test]
    fn layer_mistakes_are_variants_too() {
        let err = RateLimitLayer::builder().build().unwrap_err();
        assert_eq!(err, ConfigError::NoPolicy);
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: a policy is required: call .policy(..)"
        );
        let err = RateLimitLayer::builder()
            .policy(Policy::fixed_window("core", quota(1, 1)))
            .limited_status(http::StatusCode::OK)
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            ConfigError::StatusNotAnError {
                what: "limited",
                status: http::StatusCode::OK
            }
        );
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: the limited status must be a 4xx or 5xx, got 200 OK"
        );
    }

    #[test]
    fn a_tier_keeps_its_layers_error_as_the_source() {
        let err = TieredLayer::builder()
            .tier(RateLimitLayer::builder())
            .choose(|_| None)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::Tier { tier: 1, source } if **source == ConfigError::NoPolicy)
        );
        assert_eq!(
            err.source().map(ToString::to_string),
            Some(ConfigError::NoPolicy.to_string())
        );
        // Today's message, the inner one repeated whole.
        assert_eq!(
            err.to_string(),
            "invalid rate limit configuration: tier 1: \
             invalid rate limit configuration: a policy is required: call .policy(..)"
        );
    }
}
