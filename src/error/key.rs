//! [`KeyError`]: why no key could be taken from a request.

use std::error::Error as StdError;
use std::fmt;

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
