//! The algorithms, as plain Rust: the reference model.
//!
//! Every strategy exists twice: here, run by [`MemoryStore`](crate::MemoryStore)
//! under a lock, and as a Lua script in `lua/`, run atomically by Redis. The
//! conformance suite in `tests/` proves the two decide alike.

pub(crate) mod fixed_window;

use crate::error::ConfigError;
use crate::quota::Quota;

/// Which algorithm a [`Policy`](crate::Policy) uses.
///
/// ```
/// use tollgate::Strategy;
/// assert_eq!(Strategy::FixedWindow.as_str(), "fixed_window");
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
}

impl Strategy {
    /// A short stable name, for logs, metrics and Redis keys.
    pub fn as_str(&self) -> &'static str {
        match self {
            Strategy::FixedWindow => "fixed_window",
        }
    }

    /// How many quotas one decision of this strategy can check at once.
    pub(crate) fn max_quotas(&self) -> usize {
        match self {
            Strategy::FixedWindow => 8,
        }
    }

    /// Whether a rejection stays true until its `retry_after` for requests
    /// costing at least as much, whatever else happens to the key (refunds
    /// aside), so the layer's local cache may repeat it without the store.
    /// Sliding windows and GCRA: yes; concurrency limits: no.
    pub(crate) fn rejection_is_stable(&self) -> bool {
        match self {
            Strategy::FixedWindow => true,
        }
    }

    /// Whether a pass with nothing left means every request is rejected
    /// until `reset_at`. Fixed window: yes; GCRA and buckets: no (a unit
    /// drips back long before the bucket is full again).
    pub(crate) fn exhaustion_is_stable(&self) -> bool {
        match self {
            Strategy::FixedWindow => true,
        }
    }

    pub(crate) fn validate(&self, _quotas: &[Quota]) -> Result<(), ConfigError> {
        match self {
            Strategy::FixedWindow => Ok(()),
        }
    }
}
