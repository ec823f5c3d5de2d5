//! Allow- and deny-lists: requests the limiter lets through untouched or
//! always refuses, decided from the request head before any store call.
//!
//! Set them on the builder with
//! [`allow`](crate::RateLimitLayerBuilder::allow),
//! [`allow_cidrs`](crate::RateLimitLayerBuilder::allow_cidrs),
//! [`deny`](crate::RateLimitLayerBuilder::deny) and
//! [`deny_cidrs`](crate::RateLimitLayerBuilder::deny_cidrs). A request on
//! both lists is denied.
//!
//! **Proxies.** Network lists match the TCP peer by default. Behind a reverse
//! proxy that is the proxy's address, so an allow-list of your proxy's network
//! would exempt everyone: match the client behind trusted proxies with
//! [`cidr_address`](crate::RateLimitLayerBuilder::cidr_address)`(ForwardedIp::trusting(..))`,
//! which ignores `X-Forwarded-For` from untrusted peers (see [`ForwardedIp`]).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use http::request::Parts;
use ipnet::IpNet;

use crate::error::ConfigError;
use crate::key::{parse_networks, peer, ForwardedIp, PeerIp};

/// Finds the client address that allow- and deny-list networks are matched
/// against. [`PeerIp`] (the default) uses the TCP peer, [`ForwardedIp`] the
/// client behind trusted proxies; closures `Fn(&Parts) -> Option<IpAddr>`
/// work too. `None` (no address) matches no network.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use axum::{extract::ConnectInfo, http::{request::Parts, Request}};
/// use tollgate::{ForwardedIp, PeerIp};
/// use tollgate::access::ClientIp;
///
/// let mut req = Request::get("/").header("x-forwarded-for", "203.0.113.9").body(()).unwrap();
/// req.extensions_mut().insert(ConnectInfo("10.0.0.1:5000".parse::<SocketAddr>().unwrap()));
/// let (parts, ()) = req.into_parts();
///
/// assert_eq!(PeerIp::new().client_ip(&parts), Some("10.0.0.1".parse().unwrap()));
/// let behind_proxy = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
/// assert_eq!(behind_proxy.client_ip(&parts), Some("203.0.113.9".parse().unwrap()));
///
/// // A closure, e.g. for an address your edge put in a header of its own:
/// let from_edge = |parts: &Parts| -> Option<IpAddr> {
///     parts.headers.get("x-edge-client")?.to_str().ok()?.parse().ok()
/// };
/// assert_eq!(from_edge.client_ip(&parts), None);
/// ```
pub trait ClientIp: Send + Sync + 'static {
    /// The client's address, if it can be told.
    fn client_ip(&self, parts: &Parts) -> Option<IpAddr>;
}

impl ClientIp for PeerIp {
    fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        peer(parts).ok()
    }
}

impl ClientIp for ForwardedIp {
    fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        self.client(parts).ok()
    }
}

impl<F> ClientIp for F
where
    F: Fn(&Parts) -> Option<IpAddr> + Send + Sync + 'static,
{
    fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        self(parts)
    }
}

/// A caller-supplied test on the request head.
pub(crate) type Predicate = dyn Fn(&Parts) -> bool + Send + Sync;

/// One list: closures and networks; a request matching any is on it.
#[derive(Default, Clone)]
struct List {
    predicates: Vec<Arc<Predicate>>,
    networks: Vec<IpNet>,
}

impl List {
    fn is_empty(&self) -> bool {
        self.predicates.is_empty() && self.networks.is_empty()
    }

    fn contains(&self, parts: &Parts, ip: &mut Resolved<'_>) -> bool {
        self.predicates.iter().any(|p| p(parts))
            || (!self.networks.is_empty()
                && ip
                    .get(parts)
                    .is_some_and(|ip| self.networks.iter().any(|net| net.contains(&ip))))
    }
}

/// The client address, looked up at most once per request.
struct Resolved<'a> {
    source: &'a dyn ClientIp,
    ip: Option<Option<IpAddr>>,
}

impl Resolved<'_> {
    fn get(&mut self, parts: &Parts) -> Option<IpAddr> {
        // IPv4-mapped IPv6 peers (`::ffff:10.0.0.1`) match IPv4 networks.
        *self
            .ip
            .get_or_insert_with(|| self.source.client_ip(parts).map(|ip| ip.to_canonical()))
    }
}

/// Which list a request is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listed {
    Allowed,
    Denied,
}

/// The layer's allow- and deny-lists, checked before the key extractor.
#[derive(Clone)]
pub(crate) struct Access {
    allow: List,
    deny: List,
    address: Arc<dyn ClientIp>,
    /// The first invalid network given, reported by `build`.
    error: Option<ConfigError>,
}

impl Default for Access {
    fn default() -> Self {
        Self {
            allow: List::default(),
            deny: List::default(),
            address: Arc::new(PeerIp::new()),
            error: None,
        }
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("allow_networks", &self.allow.networks)
            .field("allow_predicates", &self.allow.predicates.len())
            .field("deny_networks", &self.deny.networks)
            .field("deny_predicates", &self.deny.predicates.len())
            .finish_non_exhaustive()
    }
}

impl Access {
    pub(crate) fn allow(&mut self, predicate: Arc<Predicate>) {
        self.allow.predicates.push(predicate);
    }

    pub(crate) fn deny(&mut self, predicate: Arc<Predicate>) {
        self.deny.predicates.push(predicate);
    }

    pub(crate) fn allow_networks<I: IntoIterator<Item = S>, S: AsRef<str>>(&mut self, nets: I) {
        match parse_networks(nets) {
            Ok(nets) => self.allow.networks.extend(nets),
            Err(err) => {
                self.error.get_or_insert(err);
            }
        }
    }

    pub(crate) fn deny_networks<I: IntoIterator<Item = S>, S: AsRef<str>>(&mut self, nets: I) {
        match parse_networks(nets) {
            Ok(nets) => self.deny.networks.extend(nets),
            Err(err) => {
                self.error.get_or_insert(err);
            }
        }
    }

    pub(crate) fn address(&mut self, source: Arc<dyn ClientIp>) {
        self.address = source;
    }

    /// The lists, or the first network that could not be parsed.
    pub(crate) fn validate(self) -> Result<Self, ConfigError> {
        match self.error {
            Some(err) => Err(err),
            None => Ok(self),
        }
    }

    /// Whether the request is on a list; deny wins over allow.
    #[inline]
    pub(crate) fn check(&self, parts: &Parts) -> Option<Listed> {
        if self.allow.is_empty() && self.deny.is_empty() {
            return None;
        }
        let mut ip = Resolved {
            source: &*self.address,
            ip: None,
        };
        if self.deny.contains(parts, &mut ip) {
            Some(Listed::Denied)
        } else if self.allow.contains(parts, &mut ip) {
            Some(Listed::Allowed)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::extract::ConnectInfo;
    use http::Request;

    use super::*;

    fn parts(peer: &str, path: &str) -> Parts {
        let mut req = Request::get(path).body(()).unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        req.into_parts().0
    }

    #[test]
    fn empty_lists_never_match() {
        assert_eq!(Access::default().check(&parts("1.2.3.4:1", "/")), None);
    }

    #[test]
    fn deny_wins_over_allow() {
        let mut access = Access::default();
        access.allow_networks(["10.0.0.0/8"]);
        access.deny_networks(["10.6.6.6"]);
        assert_eq!(
            access.check(&parts("10.6.6.6:1", "/")),
            Some(Listed::Denied)
        );
        assert_eq!(
            access.check(&parts("10.1.1.1:1", "/")),
            Some(Listed::Allowed)
        );
        assert_eq!(access.check(&parts("11.1.1.1:1", "/")), None);
    }

    #[test]
    fn mapped_ipv6_peer_matches_ipv4_network() {
        let mut access = Access::default();
        access.deny_networks(["192.0.2.0/24"]);
        assert_eq!(
            access.check(&parts("[::ffff:192.0.2.1]:1", "/")),
            Some(Listed::Denied)
        );
    }

    #[test]
    fn missing_address_matches_no_network_but_predicates_still_apply() {
        let mut access = Access::default();
        access.deny_networks(["0.0.0.0/0", "::/0"]);
        access.allow(Arc::new(|p: &Parts| p.uri.path() == "/health"));
        let (no_peer, ()) = Request::get("/health").body(()).unwrap().into_parts();
        assert_eq!(access.check(&no_peer), Some(Listed::Allowed));
    }

    #[test]
    fn first_bad_network_is_kept_for_build() {
        let mut access = Access::default();
        access.allow_networks(["10.0.0.0/8", "10.0.0.0/33"]);
        access.deny_networks(["nope"]);
        let err = access.validate().unwrap_err().to_string();
        assert!(err.contains("10.0.0.0/33"), "{err}");
    }
}
