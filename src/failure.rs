//! What to do when the store cannot decide in time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::monotonic_nanos;
use crate::store::{MemoryStore, Store};

/// The layer's answer when the store errs or misses its deadline.
///
/// The first failure after the store answered logs a `tracing` warning with
/// its error, and the first answer after failures an info line with how long
/// the outage lasted and how many decisions were made without the store; the
/// calls in between are debug events and counted in metrics. No request ever
/// waits on a store past the layer's deadline.
///
/// ```
/// use std::time::Duration;
/// use tollgate::FailurePolicy;
///
/// let _ = FailurePolicy::Open;                          // let requests through
/// let _ = FailurePolicy::closed(Duration::from_secs(2)); // 503, Retry-After: 2
/// let _ = FailurePolicy::local();                       // limit in this process meanwhile
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let the request through, marked with `X-RateLimit-Fallback: open`
    /// and a [`Fallback`](crate::layer::Fallback) request extension.
    Open,
    /// Answer `503 Service Unavailable` with this `Retry-After`.
    Closed {
        /// How long clients are told to wait, rounded up to whole seconds.
        retry_after: Duration,
    },
    /// Decide with this store instead (usually a [`MemoryStore`]): limits
    /// then hold per app server until the main store is back. Responses carry
    /// `X-RateLimit-Fallback: local`, and peeks are answered from it too
    /// ([`Decision::fallback`](crate::Decision::fallback)). The default.
    ///
    /// A key's first local decision starts from what the main store last
    /// said was spent in its open window (charged to this store first, if it
    /// answers at once as the memory store does), so the switch hands out no
    /// fresh budget; `docs/operations.md` says what holds per strategy.
    Local(Arc<dyn Store>),
}

impl FailurePolicy {
    /// Fail closed with `Retry-After: retry_after`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::FailurePolicy;
    /// let policy = FailurePolicy::closed(Duration::from_secs(2));
    /// assert!(matches!(policy, FailurePolicy::Closed { retry_after } if retry_after.as_secs() == 2));
    /// ```
    pub fn closed(retry_after: Duration) -> Self {
        Self::Closed { retry_after }
    }

    /// Fall back to a fresh in-process [`MemoryStore`].
    ///
    /// ```
    /// use tollgate::FailurePolicy;
    /// assert!(matches!(FailurePolicy::local(), FailurePolicy::Local(_)));
    /// assert!(matches!(FailurePolicy::default(), FailurePolicy::Local(_)));
    /// ```
    pub fn local() -> Self {
        Self::Local(Arc::new(MemoryStore::new()))
    }
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self::local()
    }
}

/// Whether the main store is failing: an outage is logged when it starts and
/// when it ends, not on every call it fails (a flood would turn each failed
/// call into a line). Per-call failures go to metrics and debug events.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// When the store started failing (ns since [`EPOCH`](crate::clock::EPOCH), at least 1); 0
    /// while it answers.
    failing_since: AtomicU64,
    /// Decisions made without the store (fallback, open, closed) since.
    decided_without: AtomicU64,
}

impl Health {
    /// Notes a failed call; `true` when it starts an outage (the caller logs
    /// it once, with its error).
    pub(crate) fn failed(&self) -> bool {
        if self.failing_since.load(Ordering::Relaxed) != 0 {
            return false;
        }
        let now = monotonic_nanos().max(1);
        self.failing_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Counts a decision made without the store during an outage.
    pub(crate) fn decided_without_store(&self) {
        self.decided_without.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes a call the store answered: when it ends an outage, how long
    /// that lasted and how many decisions were made without the store. One
    /// relaxed load while healthy.
    pub(crate) fn answered(&self) -> Option<(Duration, u64)> {
        if self.failing_since.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let since = self.failing_since.swap(0, Ordering::AcqRel);
        if since == 0 {
            return None;
        }
        let without = self.decided_without.swap(0, Ordering::Relaxed);
        let lasted = Duration::from_nanos(monotonic_nanos().saturating_sub(since));
        Some((lasted, without))
    }
}
