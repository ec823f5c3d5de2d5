//! [`ConfigError`]: configuration that cannot work, reported when it is
//! built.

use std::error::Error as StdError;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use http::StatusCode;

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
        f.write_str("invalid rate limit configuration: ")?;
        Reason(self).fmt(f)
    }
}

impl ConfigError {
    /// What is wrong, without the "invalid rate limit configuration: "
    /// that [`Display`](fmt::Display) starts with: for an answer that says
    /// where the mistake is itself (the admin API names the field), or a
    /// message that wraps this one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
    /// assert_eq!(err.reason().to_string(), "limit must be at least 1");
    /// ```
    pub fn reason(&self) -> impl fmt::Display + '_ {
        Reason(self)
    }
}

/// A [`ConfigError`]'s message after its common prefix.
struct Reason<'a>(&'a ConfigError);

impl fmt::Display for Reason<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError::*;
        match self.0 {
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
