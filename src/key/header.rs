use http::header::HeaderName;
use http::request::Parts;

use super::{hex_digest, Key, KeyExtractor};
use crate::error::KeyError;

/// Keys by a request header such as `X-Api-Key` or `Authorization`.
///
/// The value is hashed (SHA-256, 128 bits kept) so a secret never appears in
/// clear as a store key, in logs or in metrics.
///
/// gRPC metadata are headers, so this reads a gRPC call's metadata key as
/// it reads an HTTP header. Its bytes are hashed as they came, never read
/// as text: a binary key (`x-token-bin`) works, and is keyed by its base64
/// as the client sent it (a client that pads it one time and not the next
/// gets two keys).
///
/// ```
/// use axum::http::Request;
/// use tollgate::{HeaderKey, KeyExtractor};
///
/// let (parts, ()) = Request::get("/").header("x-api-key", "s3cret").body(()).unwrap().into_parts();
/// let key = HeaderKey::new("x-api-key").extract(&parts).unwrap();
/// assert!(!key.as_str().contains("s3cret"));
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys by the header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name; use [`HeaderKey::from_name`] for
    /// names known only at run time.
    ///
    /// ```
    /// use axum::http::Request;
    /// use tollgate::{HeaderKey, KeyExtractor};
    ///
    /// let (parts, ()) = Request::get("/").header("authorization", "Bearer t0ken").body(()).unwrap().into_parts();
    /// let key = HeaderKey::new("authorization").extract(&parts).unwrap();
    /// assert!(key.as_str().starts_with("authorization:"));
    /// ```
    pub fn new(name: &'static str) -> Self {
        Self {
            name: HeaderName::from_static(name),
        }
    }

    /// Keys by an already parsed header name.
    ///
    /// ```
    /// use axum::http::{HeaderName, Request};
    /// use tollgate::{HeaderKey, KeyExtractor};
    ///
    /// let name = HeaderName::from_bytes(b"X-Tenant").unwrap(); // e.g. read from a config file
    /// let (parts, ()) = Request::get("/").header("x-tenant", "acme").body(()).unwrap().into_parts();
    /// let key = HeaderKey::from_name(name).extract(&parts).unwrap();
    /// assert!(key.as_str().starts_with("x-tenant:"));
    /// ```
    pub fn from_name(name: HeaderName) -> Self {
        Self { name }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        let value = parts
            .headers
            .get(&self.name)
            .filter(|v| !v.is_empty())
            .ok_or(KeyError::Missing("key header"))?;
        Ok(Key::trusted(&format!(
            "{}:{}",
            self.name.as_str(),
            hex_digest(value.as_bytes(), 32)
        )))
    }
}
