//! A caller as an operator names it (an address, an API key, a route), so
//! that the operator's calls reach the key its requests get.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::header::{HeaderName, HeaderValue};
use http::request::Parts;
use http::Request;

use crate::error::KeyError;

/// A caller described by what its requests carry: its address, its
/// headers, the route it calls. [`KeyExtractor::key_of`](super::KeyExtractor::key_of)
/// (and [`RateLimiter::key_of`](crate::RateLimiter::key_of),
/// [`RateLimitLayer::key_of`](crate::RateLimitLayer::key_of)) turn it into
/// the [`Key`](super::Key) a request of that caller gets, which is what
/// `set_override`, `block`, `reset` and `peek` take: an API key is hashed,
/// an IPv6 address grouped, parts joined, exactly as for the request.
///
/// Each extractor the crate ships reads it as it reads a request:
/// [`PeerIp`](super::PeerIp) and [`ForwardedIp`](super::ForwardedIp) the
/// [`ip`](Self::ip) (for `ForwardedIp`, the client behind the proxies),
/// [`HeaderKey`](super::HeaderKey) the [`header`](Self::header),
/// [`RouteKey`](super::RouteKey) the [`route`](Self::route) template. A
/// closure is given [`parts`](Self::parts): a `GET` of the route (or `/`)
/// with the headers, the address as its `ConnectInfo`, and no
/// `MatchedPath` (axum builds that only when routing; read the route from
/// the URI's path instead).
///
/// ```
/// use tollgate::{key::Caller, HeaderKey, KeyExtractor, PeerIp};
///
/// let by_key = HeaderKey::new("x-api-key").or(PeerIp::new());
/// let acme = Caller::new().header("x-api-key", "acme-secret").unwrap();
/// let key = by_key.key_of(&acme).unwrap();
/// assert!(key.as_str().starts_with("x-api-key:") && !key.as_str().contains("acme"));
///
/// let v6 = Caller::new().ip("2001:db8:1:2::7".parse().unwrap());
/// assert_eq!(by_key.key_of(&v6).unwrap().as_str(), "ip:2001:db8:1:2::/64");
/// ```
#[derive(Debug)]
pub struct Caller {
    parts: Parts,
    route: Option<Arc<str>>,
}

impl Default for Caller {
    fn default() -> Self {
        Self::new()
    }
}

impl Caller {
    /// A caller with no address, header or route yet.
    ///
    /// ```
    /// use tollgate::{key::Caller, KeyExtractor, PeerIp};
    /// assert!(PeerIp::new().key_of(&Caller::new()).is_err(), "no address to key by");
    /// ```
    pub fn new() -> Self {
        let (parts, ()) = Request::new(()).into_parts();
        Self { parts, route: None }
    }

    /// The caller's address, as the extractor sees the client: the TCP
    /// peer for [`PeerIp`](super::PeerIp), the client behind the trusted
    /// proxies for [`ForwardedIp`](super::ForwardedIp).
    ///
    /// ```
    /// use tollgate::{key::Caller, ForwardedIp, KeyExtractor};
    /// let behind_proxies = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
    /// let caller = Caller::new().ip("203.0.113.9".parse().unwrap());
    /// assert_eq!(behind_proxies.key_of(&caller).unwrap().as_str(), "ip:203.0.113.9");
    /// ```
    pub fn ip(mut self, ip: IpAddr) -> Self {
        let peer = ConnectInfo(SocketAddr::new(ip, 0));
        self.parts.extensions.insert(peer);
        self
    }

    /// A header the caller sends (an API key, a token): a name and value
    /// that are not valid HTTP are [`KeyError::Invalid`].
    ///
    /// ```
    /// use tollgate::key::Caller;
    /// assert!(Caller::new().header("x-api-key", "acme").is_ok());
    /// assert!(Caller::new().header("x-api-key", "line\nbreak").is_err());
    /// assert!(Caller::new().header("bad name", "acme").is_err());
    /// ```
    pub fn header(mut self, name: &str, value: &str) -> Result<Self, KeyError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| KeyError::Invalid("header name"))?;
        let value = HeaderValue::from_str(value).map_err(|_| KeyError::Invalid("header value"))?;
        self.parts.headers.append(name, value);
        Ok(self)
    }

    /// The route template the caller calls (`/users/{id}`), for
    /// [`RouteKey`](super::RouteKey); also the path of [`parts`](Self::parts).
    ///
    /// ```
    /// use tollgate::{key::{Caller, RouteKey}, KeyExtractor, PeerIp};
    /// let per_route = RouteKey.and(PeerIp::new());
    /// let caller = Caller::new().route("/search").ip("192.0.2.1".parse().unwrap());
    /// assert_eq!(per_route.key_of(&caller).unwrap().as_str(), "/search|ip:192.0.2.1");
    /// ```
    pub fn route(mut self, template: &str) -> Self {
        if let Ok(uri) = template.parse() {
            self.parts.uri = uri;
        }
        self.route = Some(template.into());
        self
    }

    /// The route template given to [`route`](Self::route).
    ///
    /// ```
    /// use tollgate::key::Caller;
    /// assert_eq!(Caller::new().route("/users/{id}").route_template(), Some("/users/{id}"));
    /// assert_eq!(Caller::new().route_template(), None);
    /// ```
    pub fn route_template(&self) -> Option<&str> {
        self.route.as_deref()
    }

    /// The request head a request of this caller would have, for
    /// extractors that read it (closures).
    ///
    /// ```
    /// use tollgate::key::Caller;
    /// let caller = Caller::new().route("/search").header("x-tenant", "acme").unwrap();
    /// assert_eq!(caller.parts().uri.path(), "/search");
    /// assert_eq!(caller.parts().headers["x-tenant"], "acme");
    /// ```
    pub fn parts(&self) -> &Parts {
        &self.parts
    }
}
