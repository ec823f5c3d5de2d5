//! The operator's errors: [`AdminError`] (a change through a
//! [`RateLimiter`](crate::RateLimiter) not made) and [`PeekError`] (a
//! layer's peek without an answer).

use std::error::Error as StdError;
use std::fmt;

use super::{ConfigError, KeyError, StoreError};

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
