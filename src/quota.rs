//! How much, how often, and under which name.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::ConfigError;

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
            return Err(ConfigError::WindowTooShort { window });
        }
        if window > Duration::from_secs(366 * 24 * 3600) {
            return Err(ConfigError::WindowTooLong { window });
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
        let limit = NonZeroU32::new(limit).ok_or(ConfigError::LimitZero)?;
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
