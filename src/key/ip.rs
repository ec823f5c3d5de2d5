//! Client addresses: the TCP peer, or the client behind trusted proxies.
//!
//! **Spoofing.** `X-Forwarded-For` and `Forwarded` are written by whoever sent
//! the request. [`ForwardedIp`] believes them only when the TCP peer is one of
//! your proxies, and then takes the rightmost hop that is *not* a trusted
//! proxy: the address your outermost proxy actually saw. Everything to the
//! left of it was written by the client and is ignored.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::extract::connect_info::MockConnectInfo;
use axum::extract::ConnectInfo;
use http::request::Parts;
use ipnet::IpNet;

use super::{Key, KeyExtractor};
use crate::error::{ConfigError, KeyError};

const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Keys by the TCP peer's address, from axum's `ConnectInfo<SocketAddr>`.
///
/// Serve with `into_make_service_with_connect_info::<SocketAddr>()` (tests:
/// axum's `MockConnectInfo` works too). IPv6 callers are grouped by prefix (default `/64`, one
/// customer's usual allocation), so rotating through a subnet does not buy
/// fresh budgets; IPv4-mapped IPv6 addresses count as IPv4.
///
/// Behind a reverse proxy every request has the proxy's address: use
/// [`ForwardedIp`] there.
///
/// With feature `tonic` it also reads the address a tonic server records
/// (`tonic::transport::server::TcpConnectInfo`), so a caller has the same
/// key over axum and over gRPC: one budget across both. A tonic server that
/// terminates TLS itself records `TlsConnectInfo` instead, which this does
/// not read: key such calls with a closure over it, or terminate TLS in
/// front.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::{extract::ConnectInfo, http::Request};
/// use tollgate::{KeyExtractor, PeerIp};
///
/// let mut req = Request::get("/").body(()).unwrap();
/// req.extensions_mut().insert(ConnectInfo("[2001:db8:1:2:3:4:5:6]:443".parse::<SocketAddr>().unwrap()));
/// let (parts, ()) = req.into_parts();
/// assert_eq!(PeerIp::new().extract(&parts).unwrap().as_str(), "ip:2001:db8:1:2::/64");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// Peer address, IPv6 grouped by `/64`.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use axum::{extract::ConnectInfo, http::Request};
    /// use tollgate::{KeyExtractor, PeerIp};
    ///
    /// let mut req = Request::get("/").body(()).unwrap();
    /// req.extensions_mut().insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 7], 5000))));
    /// let (parts, ()) = req.into_parts();
    /// assert_eq!(PeerIp::new().extract(&parts).unwrap().as_str(), "ip:192.0.2.7");
    /// ```
    pub fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 peers by `/bits` instead (1 to 128; 128 keys each address).
    pub fn ipv6_prefix(self, bits: u8) -> Result<Self, ConfigError> {
        Ok(Self {
            ipv6_prefix: check_prefix(bits)?,
        })
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        Ok(ip_key(peer(parts)?, self.ipv6_prefix))
    }
}

/// Which header carries the proxy chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// Keys by the client address behind trusted reverse proxies.
///
/// The forwarding header is read only when the TCP peer is inside one of the
/// `trusted` networks; from any other peer it is ignored and the peer address
/// is the key. Through trusted peers, hops are read right to left, skipping
/// trusted proxies, and the first untrusted hop is the client. A hop that is
/// not an address (`for=unknown`, an obfuscated identifier) is a
/// [`KeyError`]; chain `.or(PeerIp::new())` to fall back instead.
///
/// ```
/// use std::net::SocketAddr;
/// use axum::{extract::ConnectInfo, http::Request};
/// use tollgate::{ForwardedIp, KeyExtractor};
///
/// let key = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
/// let mut req = Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2")
///     .body(()).unwrap();
/// req.extensions_mut().insert(ConnectInfo("10.0.0.1:5000".parse::<SocketAddr>().unwrap()));
/// let (parts, ()) = req.into_parts();
/// // 6.6.6.6 was written by the client itself; 203.0.113.9 is who our proxy saw.
/// assert_eq!(key.extract(&parts).unwrap().as_str(), "ip:203.0.113.9");
/// ```
#[derive(Debug, Clone)]
pub struct ForwardedIp {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    ipv6_prefix: u8,
}

impl ForwardedIp {
    /// Trusts proxies in these networks (`"10.0.0.0/8"`, `"::1/128"`, or a
    /// bare address for one host).
    ///
    /// ```
    /// use tollgate::ForwardedIp;
    /// assert!(ForwardedIp::trusting(["10.0.0.0/8", "fd00::/8", "::1"]).is_ok());
    /// assert!(ForwardedIp::trusting(["10.0.0.0/33"]).is_err());
    /// ```
    pub fn trusting<I, S>(networks: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = parse_networks(networks)?;
        Ok(Self {
            trusted,
            header: ForwardedHeader::default(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// Reads this header instead of `X-Forwarded-For`.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by `/bits` instead of `/64`.
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        self.ipv6_prefix = check_prefix(bits)?;
        Ok(self)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address: the rightmost hop that is not a trusted proxy.
    pub(crate) fn client(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer(parts)?;
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        let (name, what) = match self.header {
            ForwardedHeader::XForwardedFor => ("x-forwarded-for", "X-Forwarded-For hop"),
            ForwardedHeader::Forwarded => ("forwarded", "Forwarded for= hop"),
        };
        let mut hops = Vec::new();
        for value in parts.headers.get_all(name) {
            let value = value.to_str().map_err(|_| KeyError::Invalid(what))?;
            for element in value.split(',') {
                hops.push(match self.header {
                    ForwardedHeader::XForwardedFor => Some(element.trim()),
                    ForwardedHeader::Forwarded => forwarded_for(element),
                });
            }
        }
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            let ip = hop.and_then(parse_hop).ok_or(KeyError::Invalid(what))?;
            client = ip;
            if !self.is_trusted(ip) {
                break;
            }
        }
        Ok(client)
    }
}

impl KeyExtractor for ForwardedIp {
    fn extract(&self, parts: &Parts) -> Result<Key, KeyError> {
        Ok(ip_key(self.client(parts)?, self.ipv6_prefix))
    }
}

fn check_prefix(bits: u8) -> Result<u8, ConfigError> {
    if (1..=128).contains(&bits) {
        Ok(bits)
    } else {
        Err(ConfigError::Ipv6Prefix { bits })
    }
}

/// Networks (`"10.0.0.0/8"`) or bare addresses (one host each).
pub(crate) fn parse_networks<I, S>(networks: I) -> Result<Vec<IpNet>, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    networks
        .into_iter()
        .map(|s| {
            let s = s.as_ref().trim();
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| ConfigError::Network {
                    given: s.to_owned(),
                })
        })
        .collect()
}

pub(crate) fn peer(parts: &Parts) -> Result<IpAddr, KeyError> {
    let extensions = &parts.extensions;
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
        // What axum's `ConnectInfo` extractor falls back to in tests.
        .or_else(|| {
            extensions
                .get::<MockConnectInfo<SocketAddr>>()
                .map(|m| m.0.ip())
        })
        // What tonic's server records for a call over TCP.
        .or_else(|| tonic_peer(extensions))
        .ok_or(KeyError::Missing(
            "peer address (serve with into_make_service_with_connect_info)",
        ))
}

#[cfg(feature = "tonic")]
fn tonic_peer(extensions: &http::Extensions) -> Option<IpAddr> {
    use tonic::transport::server::TcpConnectInfo;
    let info = extensions.get::<TcpConnectInfo>()?;
    info.remote_addr().map(|addr| addr.ip())
}

#[cfg(not(feature = "tonic"))]
fn tonic_peer(_: &http::Extensions) -> Option<IpAddr> {
    None
}

/// The `for=` value of one RFC 7239 element, unquoted.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("for")
            .then(|| v.trim().trim_matches('"'))
    })
}

/// An address with or without port: `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]:80`.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    // `[v6]` without a port, or with RFC 7239's obfuscated one (`_x`): the
    // bracket must close, and only a port may follow it.
    let (inner, after) = hop.strip_prefix('[')?.split_once(']')?;
    if !(after.is_empty() || after.starts_with(':')) {
        return None;
    }
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> Key {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => ipv4_key(v4),
        IpAddr::V6(v6) if ipv6_prefix >= 128 => Key::trusted(&format!("ip:{v6}")),
        IpAddr::V6(v6) => {
            let mask = u128::MAX << (128 - u32::from(ipv6_prefix));
            let net = Ipv6Addr::from(u128::from(v6) & mask);
            Key::trusted(&format!("ip:{net}/{ipv6_prefix}"))
        }
    }
}

/// `ip:a.b.c.d`, each octet by `itoa`, in a buffer on the stack.
fn ipv4_key(v4: Ipv4Addr) -> Key {
    let mut text = *b"ip:255.255.255.255";
    let mut len = 3;
    let mut digits = itoa::Buffer::new();
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            text[len] = b'.';
            len += 1;
        }
        let octet = digits.format(octet).as_bytes();
        text[len..len + octet.len()].copy_from_slice(octet);
        len += octet.len();
    }
    // Only ASCII digits, dots and "ip:": valid text, nothing to escape.
    Key::trusted(std::str::from_utf8(&text[..len]).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::get("/");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        req.into_parts().0
    }

    fn key(x: &impl KeyExtractor, p: &Parts) -> String {
        x.extract(p).unwrap().as_str().to_owned()
    }

    #[test]
    fn spoofed_forwarded_for_from_untrusted_peer_is_ignored() {
        let x = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
        let p = parts("198.51.100.7:1", &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(key(&x, &p), "ip:198.51.100.7");
    }

    #[test]
    fn rightmost_untrusted_hop_wins_across_repeated_headers() {
        let x = ForwardedIp::trusting(["10.0.0.0/8", "192.168.0.0/16"]).unwrap();
        let p = parts(
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", "9.9.9.9, 203.0.113.5"),
                ("x-forwarded-for", "192.168.1.1"),
            ],
        );
        assert_eq!(key(&x, &p), "ip:203.0.113.5");
    }

    #[test]
    fn rfc7239_forwarded_with_quoted_ipv6_and_port() {
        let x = ForwardedIp::trusting(["::1"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        let p = parts(
            "[::1]:1",
            &[(
                "forwarded",
                r#"for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https"#,
            )],
        );
        assert_eq!(key(&x, &p), "ip:2001:db8:cafe::/64");
    }

    #[test]
    fn garbage_hop_is_a_key_error_not_a_panic() {
        let x = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
        let p = parts("10.0.0.1:1", &[("x-forwarded-for", "not-an-ip")]);
        assert!(x.extract(&p).is_err());
        let p = parts("10.0.0.1:1", &[("x-forwarded-for", "")]);
        assert!(x.extract(&p).is_err());
    }

    #[test]
    fn unclosed_bracket_hop_is_refused_not_read_as_its_address() {
        let x = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
        for hop in ["[::1", "[::1:80", "[::1]x", "[1.2.3.4]"] {
            let p = parts("10.0.0.1:1", &[("x-forwarded-for", hop)]);
            assert!(x.extract(&p).is_err(), "{hop:?} was read as an address");
        }
        for (hop, ip) in [("[::1]", "ip:::1"), ("[::1]:80", "ip:::1")] {
            let p = parts("10.0.0.1:1", &[("x-forwarded-for", hop)]);
            assert_eq!(key(&x.clone().ipv6_prefix(128).unwrap(), &p), ip, "{hop:?}");
        }
    }

    #[test]
    fn only_trusted_hops_means_the_leftmost_one() {
        let x = ForwardedIp::trusting(["10.0.0.0/8"]).unwrap();
        let p = parts("10.0.0.1:1", &[("x-forwarded-for", "10.1.1.1, 10.2.2.2")]);
        assert_eq!(key(&x, &p), "ip:10.1.1.1");
        let p = parts("10.0.0.1:1", &[]);
        assert_eq!(key(&x, &p), "ip:10.0.0.1");
    }

    #[test]
    fn ipv4_keys_spell_every_octet() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.0.1",
            "1.22.133.4",
            "192.168.100.9",
        ] {
            let key = PeerIp::new()
                .extract(&parts(&format!("{ip}:80"), &[]))
                .unwrap();
            assert_eq!(key.as_str(), format!("ip:{ip}"));
        }
    }

    #[test]
    fn ipv6_prefix_groups_and_mapped_ipv4_unwraps() {
        let p = parts("[2001:db8:1:2:ffff::1]:1", &[]);
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(48).unwrap(), &p),
            "ip:2001:db8:1::/48"
        );
        let p = parts("[::ffff:192.0.2.1]:1", &[]);
        assert_eq!(key(&PeerIp::new(), &p), "ip:192.0.2.1");
        assert!(PeerIp::new().ipv6_prefix(0).is_err());
        assert!(ForwardedIp::trusting(["nope"]).is_err());
    }

    #[test]
    fn an_ip_key_is_the_key_of_its_text() {
        use std::hash::BuildHasher;
        let hasher = std::collections::hash_map::RandomState::new();
        let ip = PeerIp::new().extract(&parts("1.2.3.4:80", &[])).unwrap();
        let text = Key::new("ip:1.2.3.4");
        assert_eq!(ip.as_str(), "ip:1.2.3.4");
        assert_eq!(ip, text);
        // As `str` hashes: a map keyed by keys can be looked up by text.
        assert_eq!(hasher.hash_one(&ip), hasher.hash_one(&text));
        assert_eq!(hasher.hash_one(&ip), hasher.hash_one("ip:1.2.3.4"));
        assert_ne!(ip, Key::new("ip:1.2.3."));
        assert_eq!(format!("{ip} {ip:?}"), format!("{text} {text:?}"));
        assert_eq!(ip.hashed(), text.hashed());
        assert_eq!(ip.join(&text).as_str(), "ip:1.2.3.4|ip:1.2.3.4");
    }

    #[test]
    fn an_ipv4_key_spells_every_octet_as_display_does() {
        for n in 0..=255u8 {
            for ip in [
                Ipv4Addr::new(n, 0, 255, 9),
                Ipv4Addr::new(9, n, n, 100),
                Ipv4Addr::new(255, 255, 10, n),
            ] {
                assert_eq!(ipv4_key(ip).as_str(), format!("ip:{ip}"));
            }
        }
    }
}
