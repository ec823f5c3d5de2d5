//! The algorithms, as plain Rust: the reference model.
//!
//! Every strategy exists twice: here, run by [`MemoryStore`](crate::MemoryStore)
//! under a lock, and as a Lua script in `lua/`, run atomically by Redis. The
//! conformance suite in `tests/` proves the two decide alike.

pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod uniform_gate;

use std::num::NonZeroU32;

use crate::decision::Scope;
use crate::error::ConfigError;
use crate::quota::Quota;

/// The longest any state may matter: a year and a day, in µs.
pub(crate) const MAX_SPAN_MICROS: u64 = 366 * 24 * 3600 * 1_000_000;

/// Which algorithm a [`Policy`](crate::Policy) uses.
///
/// Each variant documents what `X-RateLimit-Remaining` and `-Reset` mean for
/// it, and what it costs in Redis. The constructors on
/// [`Policy`](crate::Policy) (`fixed_window`, `uniform_gate`, `sliding_log`,
/// `sliding_window`, `gcra`) are the usual way to pick one.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::Strategy;
/// assert_eq!(Strategy::FixedWindow.as_str(), "fixed_window");
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
    /// again. Costs one `EVALSHA` running one `SET NX PX GET` (a second `SET`
    /// only when a stale value outlived its time) and one short string per key.
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
        }
    }

    /// How many quotas one decision of this strategy can check at once.
    pub(crate) fn max_quotas(&self) -> usize {
        match self {
            Strategy::FixedWindow => 8,
            Strategy::UniformGate => 1,
            Strategy::SlidingLog => 2,
            Strategy::SlidingWindow => 8,
            Strategy::Gcra { .. } => 1,
        }
    }

    /// Whose budget quota `i` is.
    pub(crate) fn scope_of(&self, quota: usize) -> Scope {
        match self {
            Strategy::SlidingLog if quota == sliding_log::RESOURCE => Scope::Resource,
            _ => Scope::Consumer,
        }
    }

    /// Whether some quota is shared by every caller: then all keys of the
    /// policy share one hash tag (one Redis Cluster slot, one memory shard).
    pub(crate) fn has_resource_quota(&self) -> bool {
        matches!(self, Strategy::SlidingLog)
    }

    pub(crate) fn validate(&self, quotas: &[Quota]) -> Result<(), ConfigError> {
        match self {
            Strategy::FixedWindow | Strategy::SlidingWindow => Ok(()),
            Strategy::UniformGate => uniform_gate::validate(quotas),
            Strategy::SlidingLog => sliding_log::validate(quotas),
            Strategy::Gcra { burst } => gcra::validate(quotas, *burst),
        }
    }
}
