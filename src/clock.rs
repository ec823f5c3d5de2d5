//! Where "now" comes from.
//!
//! A store owns its clock, never the layer: the memory store reads it for every
//! decision, and a Redis store only uses it when one is given explicitly
//! (otherwise the scripts read Redis `TIME`, so every app server shares one
//! clock). Tests hand a [`ManualClock`] to both and move time without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in microseconds since the Unix epoch.
///
/// Microseconds, because leaky buckets and GCRA at thousands of requests per
/// second need finer steps than milliseconds; the value still fits a Lua
/// double exactly (2^53 µs is about 285 years).
///
/// ```
/// use tollgate::clock::{Clock, SystemClock};
/// assert!(SystemClock.now_micros() > 1_600_000_000_000_000);
/// ```
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Microseconds since 1970-01-01T00:00:00Z.
    fn now_micros(&self) -> u64;
}

/// The operating system's wall clock.
///
/// ```
/// use tollgate::clock::{Clock, SystemClock};
/// let a = SystemClock.now_micros();
/// assert!(SystemClock.now_micros() >= a);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        // Seconds and microseconds apart: `as_micros` goes through u128.
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
            d.as_secs() * 1_000_000 + u64::from(d.subsec_micros())
        })
    }
}

/// A clock that only moves when told to; clones share one time.
///
/// Give the same `ManualClock` to several stores to simulate app servers that
/// agree on time, or two different ones to simulate clock skew.
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000_000);
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(shared.now_micros(), 2_500_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `micros` since the epoch.
    ///
    /// ```
    /// use tollgate::clock::{Clock, ManualClock};
    /// let clock = ManualClock::new(1_000_000);
    /// assert_eq!(clock.now_micros(), 1_000_000);
    /// ```
    pub fn new(micros: u64) -> Self {
        Self(Arc::new(AtomicU64::new(micros)))
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Sets the time to `micros` since the epoch (it may go backwards).
    pub fn set(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A process-wide monotonic origin for the limiter's timestamps.
pub(crate) static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// Nanoseconds since [`EPOCH`].
pub(crate) fn monotonic_nanos() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}
