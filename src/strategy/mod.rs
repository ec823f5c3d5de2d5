//! The algorithms, as plain Rust: the reference model.
//!
//! Every strategy exists twice: here, run by [`MemoryStore`](crate::MemoryStore)
//! under a lock, and as a Lua script in `lua/`, run atomically by Redis. The
//! conformance suite in `tests/` proves the two decide alike.

pub(crate) mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod leaky_bucket;

use std::num::NonZeroU32;

use crate::error::ConfigError;
use crate::quota::Quota;

/// Which algorithm a [`Policy`](crate::Policy) uses.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::Strategy;
/// assert_eq!(Strategy::FixedWindow.as_str(), "fixed_window");
/// let capacity = NonZeroU32::new(10).unwrap();
/// assert_eq!(Strategy::LeakyBucket { capacity }.as_str(), "leaky_bucket");
/// assert_eq!(Strategy::Concurrency.as_str(), "concurrency");
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
    /// Costs one `EVALSHA` per request (`ZREMRANGEBYSCORE`, `ZCOUNT`, two
    /// `ZRANGEBYSCORE`, and for a pass `ZADD` + `PEXPIRE`) and one for the
    /// release (`ZREM`); one sorted set per key holding at most `limit`
    /// members (about 150 bytes for one, 30 more per slot up to 128 slots,
    /// about 120 per slot beyond), expiring one timeout after the last
    /// admission. Build with [`Policy::concurrency`](crate::Policy::concurrency).
    Concurrency,
}

impl Strategy {
    /// A short stable name, for logs, metrics and Redis keys.
    pub fn as_str(&self) -> &'static str {
        match self {
            Strategy::FixedWindow => "fixed_window",
            Strategy::LeakyBucket { .. } => "leaky_bucket",
            Strategy::Concurrency => "concurrency",
        }
    }

    /// How many quotas one decision of this strategy can check at once.
    pub(crate) fn max_quotas(&self) -> usize {
        match self {
            Strategy::FixedWindow => 8,
            Strategy::LeakyBucket { .. } | Strategy::Concurrency => 1,
        }
    }

    /// Whether a rejection stays true until its `retry_after` for requests
    /// costing at least as much, whatever else happens to the key (refunds
    /// aside), so the layer's local cache may repeat it without the store.
    /// Fixed window: nothing is spent back before reset. Leaky bucket: the
    /// level only drains at the rate, and only other requests raise it.
    /// Concurrency: no, a slot frees whenever a response ends. (Sliding
    /// windows and GCRA would be yes, for the same reason as the bucket.)
    pub(crate) fn rejection_is_stable(&self) -> bool {
        match self {
            Strategy::FixedWindow | Strategy::LeakyBucket { .. } => true,
            Strategy::Concurrency => false,
        }
    }

    /// Whether a pass with nothing left means every request is rejected
    /// until `reset_at`. Fixed window: yes. Leaky bucket: no, a place frees
    /// one interval later, long before the bucket is empty. Concurrency: no.
    pub(crate) fn exhaustion_is_stable(&self) -> bool {
        match self {
            Strategy::FixedWindow => true,
            Strategy::LeakyBucket { .. } | Strategy::Concurrency => false,
        }
    }

    /// Whether a pass holds its charge until the response ends (and gives it
    /// back then), rather than spending it.
    pub(crate) fn holds_until_response_ends(&self) -> bool {
        matches!(self, Strategy::Concurrency)
    }

    pub(crate) fn validate(&self, quotas: &[Quota]) -> Result<(), ConfigError> {
        match self {
            Strategy::FixedWindow | Strategy::Concurrency => Ok(()),
            Strategy::LeakyBucket { capacity } => quotas
                .iter()
                .try_for_each(|q| leaky_bucket::validate(q, *capacity)),
        }
    }
}
