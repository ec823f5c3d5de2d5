//! Errors: bad configuration, unusable keys, and store trouble.
//!
//! Being rate limited is not an error; it is a [`Decision`](crate::Decision)
//! with `allowed == false`.

use std::error::Error as StdError;
use std::fmt;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Configuration that cannot work, reported when the layer or store is built.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let err = Quota::new(0, Duration::from_secs(1)).unwrap_err();
/// assert!(err.to_string().contains("limit"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid rate limit configuration: {}", self.0)
    }
}

impl StdError for ConfigError {}

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
        Self::new(StoreErrorKind::of(&err), err)
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

/// Why [`RateLimitLayer::peek`](crate::RateLimitLayer::peek) has no answer.
///
/// ```
/// use tollgate::{error::PeekError, KeyError};
/// let err = PeekError::Key(KeyError::Missing("x-api-key"));
/// assert_eq!(err.to_string(), "request has no x-api-key");
/// ```
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
