//! [`StoreError`] and its [`StoreErrorKind`]: a store that could not
//! decide.

use std::error::Error as StdError;
use std::fmt;

type BoxError = Box<dyn StdError + Send + Sync>;

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
    /// Whether a failed write may have changed the store, when the kind
    /// alone does not tell: `Some(false)` when the call was never sent (a
    /// connection refused), `Some(true)` when an earlier step of the same
    /// change landed.
    written: Option<bool>,
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
            written: None,
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
            written: None,
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

    /// Whether a write that failed this way may still have changed the
    /// store: it was sent and no answer came back (a timeout, a broken
    /// connection, an answer that made no sense), or an earlier step of
    /// the same change had landed. `false` only when nothing can have been
    /// written: the store refused the first step, or it was never sent.
    ///
    /// ```
    /// use tollgate::StoreError;
    /// use tollgate::error::StoreErrorKind;
    /// assert!(StoreError::timeout().may_have_written());
    /// assert!(!StoreError::new(StoreErrorKind::Rejected, "READONLY").may_have_written());
    /// ```
    pub fn may_have_written(&self) -> bool {
        self.written.unwrap_or(match self.kind {
            StoreErrorKind::Timeout | StoreErrorKind::Unavailable | StoreErrorKind::Protocol => {
                true
            }
            StoreErrorKind::Rejected | StoreErrorKind::Unsupported => false,
        })
    }

    /// This error, from a later step of a change whose first step landed:
    /// whatever its kind, the store may have been changed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn after_a_write(mut self) -> Self {
        self.written = Some(true);
        self
    }

    /// This error, from a call that never reached the store (the
    /// connection was refused): nothing was written.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn unsent(mut self) -> Self {
        self.written = Some(false);
        self
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
        let refused = err.is_connection_refusal();
        let this = Self::new(StoreErrorKind::of(&err), err);
        if refused {
            this.unsent()
        } else {
            this
        }
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
