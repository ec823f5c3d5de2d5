//! What to do when the store cannot decide in time.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{MemoryStore, Store};

/// The layer's answer when the store errs or misses its deadline.
///
/// Every case logs a `tracing` warning. No request ever waits on a store past
/// the layer's deadline.
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
    /// and a [`StoreUnavailable`](crate::StoreUnavailable) request extension.
    Open,
    /// Answer `503 Service Unavailable` with this `Retry-After`.
    Closed {
        /// How long clients are told to wait, rounded up to whole seconds.
        retry_after: Duration,
    },
    /// Decide with this store instead (usually a [`MemoryStore`]): limits
    /// then hold per app server until the main store is back. Responses carry
    /// `X-RateLimit-Fallback: local`. The default.
    Local(Arc<dyn Store>),
}

impl FailurePolicy {
    /// Fail closed with `Retry-After: retry_after`.
    pub fn closed(retry_after: Duration) -> Self {
        Self::Closed { retry_after }
    }

    /// Fall back to a fresh in-process [`MemoryStore`].
    pub fn local() -> Self {
        Self::Local(Arc::new(MemoryStore::new()))
    }
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self::local()
    }
}
