//! Who is calling: turning a request into the key its budget is kept under.
//!
//! Keys are escaped when built, so no caller can pick another caller's key or
//! steer a Redis Cluster slot with `{hash tags}` of its own.

mod caller;
mod header;
mod ip;
mod route;

pub use caller::Caller;
pub use header::HeaderKey;
pub(crate) use ip::{parse_networks, peer};
pub use ip::{ForwardedHeader, ForwardedIp, PeerIp};
pub use route::RouteKey;

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use sha2::{Digest, Sha256};
use smol_str::{SmolStr, SmolStrBuilder};

use crate::error::KeyError;

/// Longer keys are replaced by their hash, bounding the store's memory per key.
const MAX_KEY_LEN: usize = 128;

/// A caller's identity as the store sees it.
///
/// Built with [`Key::new`], which escapes `%`, `{`, `}`, `|` and control
/// characters, so that user input can neither carry a Redis Cluster hash tag
/// nor forge the `|` that [`Key::join`] puts between parts. Very long input is
/// replaced by its SHA-256.
///
/// A key of up to 23 bytes (an IPv4 peer's `ip:a.b.c.d`, most custom keys)
/// is kept inline, with no allocation of its own; a longer one is shared
/// behind a reference count, so cloning never copies the text. Keys are
/// equal, and hash alike, exactly when their text is.
///
/// ```
/// use tollgate::Key;
///
/// assert_eq!(Key::new("bob").as_str(), "bob");
/// assert_eq!(Key::new("{alice}").as_str(), "%7Balice%7D");
/// assert_eq!(Key::new("a").join(&Key::new("b|c")).as_str(), "a|b%7Cc");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key(SmolStr);

impl Key {
    /// A key from text that is one already (a store's record of a
    /// [`Key::as_str`]), kept as it is.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn escaped(text: impl Into<SmolStr>) -> Self {
        Self(text.into())
    }

    /// Escapes `raw` into a key.
    ///
    /// ```
    /// use tollgate::Key;
    /// assert_eq!(Key::new("tenant:acme").as_str(), "tenant:acme");
    /// assert_eq!(Key::new("50%").as_str(), "50%25");
    /// assert!(Key::new("x".repeat(200)).as_str().starts_with("sha256:"));
    /// ```
    pub fn new(raw: impl AsRef<str>) -> Self {
        let raw = raw.as_ref();
        let mut out = SmolStrBuilder::new();
        for c in raw.chars() {
            let escaped = match c {
                '%' | '{' | '}' | '|' => c as u32,
                c if c.is_control() => c as u32 & 0xff,
                c => {
                    out.push(c);
                    continue;
                }
            };
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(HEX[(escaped >> 4) as usize & 0xf] as char);
            out.push(HEX[escaped as usize & 0xf] as char);
        }
        if out.len() > MAX_KEY_LEN {
            return Self(format!("sha256:{}", hex_digest(raw.as_bytes(), 32)).into());
        }
        Self(out.finish())
    }

    /// `self` and `other` as one key, e.g. a route and a caller.
    pub fn join(&self, other: &Key) -> Self {
        let mut joined = SmolStrBuilder::new();
        joined.push_str(self.as_str());
        joined.push('|');
        joined.push_str(other.as_str());
        Self(joined.finish())
    }

    /// The escaped text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// What logs show instead of the key, which may be an address or an API
    /// key: the first 16 hex digits of its SHA-256. Enough to follow one
    /// caller through the logs; not anonymous (IPv4 space is small enough to
    /// hash whole).
    pub(crate) fn hashed(&self) -> String {
        hex_digest(self.0.as_bytes(), 16)
    }

    /// Builds from text already known to be safe (addresses, digests).
    pub(crate) fn trusted(text: &str) -> Self {
        debug_assert!(!text.contains(['{', '}', '|']));
        Self(SmolStr::new(text))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Key").field(&self.as_str()).finish()
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first `hex_len` hex digits of SHA-256 over `bytes`.
pub(crate) fn hex_digest(bytes: &[u8], hex_len: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(hex_len);
    // By hand, not `write!("{b:02x}")`: the formatter cost a hashed
    // header key as much as the hash (issue 47).
    for b in digest.iter().take(hex_len.div_ceil(2)) {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out.truncate(hex_len);
    out
}

/// Takes the key from a request's head. Closures implement it.
///
/// Extractors never panic on odd input: they answer [`KeyError`], and the
/// layer turns that into its key-error response without asking the store.
///
/// ```
/// use http::request::Parts;
/// use tollgate::{Key, KeyError, KeyExtractor, HeaderKey, PeerIp};
///
/// // Any closure over the request head:
/// let by_tenant = |parts: &Parts| {
///     parts.headers.get("x-tenant")
///         .and_then(|v| v.to_str().ok())
///         .map(Key::new)
///         .ok_or(KeyError::Missing("x-tenant header"))
/// };
/// // Combinators: an API key when present, else the peer address.
/// let by_caller = HeaderKey::new("x-api-key").or(PeerIp::new());
/// # fn takes(_: impl KeyExtractor) {}
/// # takes(by_tenant); takes(by_caller);
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key for this request.
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError>;

    /// The key a request of `caller` gets: what an operator passes to
    /// `set_override`, `block`, `reset` and `peek` to reach that caller.
    /// By default the key of [`Caller::parts`], the request head such a
    /// caller sends; an extractor that reads what a head cannot carry (the
    /// matched route) reads it from `caller`.
    ///
    /// ```
    /// use tollgate::{key::Caller, HeaderKey, KeyExtractor, PeerIp};
    /// let ip = Caller::new().ip("203.0.113.9".parse().unwrap());
    /// assert_eq!(PeerIp::new().key_of(&ip).unwrap().as_str(), "ip:203.0.113.9");
    /// assert!(HeaderKey::new("x-api-key").key_of(&ip).is_err(), "no key header");
    /// ```
    fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        self.extract(caller.parts())
    }

    /// Uses `fallback` when this extractor finds no key.
    fn or<B: KeyExtractor>(self, fallback: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or(self, fallback)
    }

    /// Keys by both parts, e.g. `RouteKey.and(PeerIp::new())`: one budget per
    /// caller per route.
    fn and<B: KeyExtractor>(self, other: B) -> And<Self, B>
    where
        Self: Sized,
    {
        And(self, other)
    }
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Result<Key, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        self(parts)
    }
}

impl KeyExtractor for Arc<dyn KeyExtractor> {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        (**self).extract(parts)
    }

    fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        (**self).key_of(caller)
    }
}

/// The first extractor's key, or the second's when the first has none.
/// Built by [`KeyExtractor::or`].
///
/// ```
/// use tollgate::{HeaderKey, KeyExtractor, PeerIp};
/// let _ = HeaderKey::new("x-api-key").or(PeerIp::new());
/// ```
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        self.0.extract(parts).or_else(|_| self.1.extract(parts))
    }

    fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        self.0.key_of(caller).or_else(|_| self.1.key_of(caller))
    }
}

/// Both extractors' keys joined; fails when either fails.
/// Built by [`KeyExtractor::and`].
///
/// ```
/// use tollgate::{KeyExtractor, PeerIp};
/// use tollgate::key::RouteKey;
/// let _ = RouteKey.and(PeerIp::new());
/// ```
#[derive(Debug, Clone)]
pub struct And<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for And<A, B> {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        Ok(self.0.extract(parts)?.join(&self.1.extract(parts)?))
    }

    fn key_of(&self, caller: &Caller) -> Result<Key, KeyError> {
        Ok(self.0.key_of(caller)?.join(&self.1.key_of(caller)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hex_digest_is_sha256_in_lowercase_hex_cut_to_length() {
        // FIPS 180-2's example: SHA-256("abc").
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hex_digest(b"abc", 64), abc);
        assert_eq!(hex_digest(b"abc", 32), &abc[..32]);
        assert_eq!(hex_digest(b"abc", 5), &abc[..5]);
    }

    #[test]
    fn hash_tags_and_separators_in_input_are_escaped() {
        let k = Key::new("x}{evil}|y%");
        assert!(!k.as_str().contains(['{', '}', '|']));
        assert_ne!(Key::new("a|b"), Key::new("a").join(&Key::new("b")));
        assert_ne!(Key::new("%7B"), Key::new("{"));
    }

    #[test]
    fn long_input_is_hashed_to_a_bounded_key() {
        let k = Key::new("x".repeat(10_000));
        assert!(k.as_str().len() <= MAX_KEY_LEN);
        assert_ne!(k, Key::new("x".repeat(10_001)));
    }
}
