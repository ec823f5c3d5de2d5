//! The caller an admin request names, read from its query as the policy's
//! extractor sees callers: `?ip=203.0.113.9`, `?route=/search`,
//! `?header.x-api-key=acme`, or an alias the API was built with
//! (`?api_key=acme` for the header `x-api-key`). Never a stored key or
//! hash: the API turns the [`Caller`] into the key with
//! [`RateLimiter::key_of`], exactly as a request of that caller is keyed.

use std::net::IpAddr;

use http::header::HeaderName;
use http::Uri;

use super::error::ApiError;
use crate::error::KeyError;
use crate::key::{Caller, Key};
use crate::rate_limiter::RateLimiter;

/// Query parameters that name headers for short: `api_key` for
/// `x-api-key`.
#[derive(Debug, Clone, Default)]
pub(super) struct Aliases(Vec<(String, HeaderName)>);

impl Aliases {
    /// Adds `name` for `header`.
    ///
    /// # Panics
    ///
    /// If `header` is not a header name, or `name` is empty, taken
    /// (`ip`, `route`, an alias given before) or starts with `header.`.
    pub(super) fn add(&mut self, name: &str, header: &str) {
        let header = HeaderName::from_bytes(header.as_bytes())
            .unwrap_or_else(|_| panic!("admin alias {name:?}: {header:?} is not a header name"));
        assert!(
            !name.is_empty()
                && !matches!(name, "ip" | "route")
                && !name.starts_with("header.")
                && self.header(name).is_none(),
            "admin alias {name:?} is empty, taken, or starts with \"header.\""
        );
        self.0.push((name.to_owned(), header));
    }

    /// Each alias and the header it names.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &HeaderName)> {
        self.0.iter().map(|(n, h)| (n.as_str(), h))
    }

    fn header(&self, name: &str) -> Option<&HeaderName> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, h)| h)
    }

    /// The names an operator may use, for messages.
    fn hint(&self) -> String {
        let mut hint = String::from("ip, route, header.NAME");
        for (name, header) in &self.0 {
            hint.push_str(&format!(", {name} (header {header})"));
        }
        hint
    }
}

/// One part of a caller, as the query named it.
#[derive(Debug, Clone)]
enum Part {
    Ip(IpAddr),
    Route(String),
    Header(HeaderName, String),
}

impl Part {
    /// The same part with another value, to see whether a key changes
    /// with it.
    fn altered(&self) -> Part {
        match self {
            Part::Ip(IpAddr::V4(_)) => Part::Ip("192.0.2.254".parse().expect("an address")),
            Part::Ip(IpAddr::V6(_)) => {
                Part::Ip("2001:db8:ffff:ffff::1".parse().expect("an address"))
            }
            Part::Route(route) => Part::Route(format!("{route}/~other")),
            Part::Header(name, value) => Part::Header(name.clone(), format!("{value}~other")),
        }
    }

    /// Whether `other` names the same part (another value, maybe).
    fn same_kind(&self, other: &Part) -> bool {
        match (self, other) {
            (Part::Ip(_), Part::Ip(_)) | (Part::Route(_), Part::Route(_)) => true,
            (Part::Header(a, _), Part::Header(b, _)) => a == b,
            _ => false,
        }
    }

    /// A value of this kind for a probe of what an extractor reads.
    fn probe(field: &str) -> Option<Part> {
        match field {
            "ip" => Some(Part::Ip("192.0.2.1".parse().expect("an address"))),
            "route" => Some(Part::Route("/probe".to_owned())),
            _ => None,
        }
    }
}

/// A caller built of `parts`.
fn caller(parts: &[(String, Part)]) -> Caller {
    let mut caller = Caller::new();
    for (_, part) in parts {
        caller = match part {
            Part::Ip(ip) => caller.ip(*ip),
            Part::Route(route) => caller.route(route),
            Part::Header(name, value) => match caller.header(name.as_str(), value) {
                Ok(with) => with,
                // Checked when read from the query.
                Err(_) => unreachable!("a header checked when parsed"),
            },
        };
    }
    caller
}

/// Whether `limiter`'s extractor keys `parts` differently when the one at
/// `at` changes: whether it reads that part for this caller.
fn reads(limiter: &RateLimiter, parts: &[(String, Part)], at: usize) -> bool {
    let Ok(key) = limiter.key_of(&caller(parts)) else {
        return false;
    };
    let mut altered = parts.to_vec();
    altered[at].1 = parts[at].1.altered();
    limiter
        .key_of(&caller(&altered))
        .map_or(true, |other| other != key)
}

/// The parts `limiter`'s extractor reads, of those an operator can name
/// here (`ip`, `route`, the aliases' headers, and `named`'s headers): each
/// one it keys a caller by, alone or with the others; with how to name it.
fn parts_read(
    limiter: &RateLimiter,
    aliases: &Aliases,
    named: &[(String, Part)],
) -> Vec<(Part, String)> {
    let mut every: Vec<(String, Part)> = ["ip", "route"]
        .iter()
        .filter_map(|f| Some(((*f).to_owned(), Part::probe(f)?)))
        .collect();
    for (alias, header) in aliases.iter() {
        every.push((
            alias.to_owned(),
            Part::Header(header.clone(), "probe".to_owned()),
        ));
    }
    for (field, part) in named {
        if matches!(part, Part::Header(..)) && !every.iter().any(|(_, p)| p.same_kind(part)) {
            every.push((field.clone(), part.clone()));
        }
    }
    (0..every.len())
        .filter(|&i| reads(limiter, &every, i) || reads(limiter, &every[i..=i], 0))
        .map(|i| {
            let (field, part) = &every[i];
            let shown = match part {
                Part::Header(name, _) if *field != format!("header.{name}") => {
                    format!("{field} (header.{name})")
                }
                _ => field.clone(),
            };
            (part.clone(), shown)
        })
        .collect()
}

/// `read`, for a message.
fn listed(read: &[(Part, String)]) -> String {
    if read.is_empty() {
        return "none of ip, route or a header named here (a closure may read others)".to_owned();
    }
    read.iter()
        .map(|(_, shown)| shown.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The key `limiter` gives the caller that `uri`'s query names. Every part
/// named must be one the policy's extractor keys this caller by: a part it
/// does not read, or a second name for a caller it keys by the first (an
/// API key and an address, under "the key, else the address"), is a `400`
/// naming it and the parts the extractor reads.
pub(super) fn key_of(uri: &Uri, aliases: &Aliases, limiter: &RateLimiter) -> Result<Key, ApiError> {
    let named = parts_of(uri.query().unwrap_or(""), aliases)?;
    let policy = limiter.policy().name();
    let unread = |read: &[(Part, String)]| {
        named
            .iter()
            .find(|(_, part)| !read.iter().any(|(p, _)| p.same_kind(part)))
    };
    let not_read = |field: &str, read: &[(Part, String)]| {
        ApiError::invalid(
            field,
            format!(
                "is not part of a caller's key under policy {policy:?}: its key extractor reads {}",
                listed(read)
            ),
        )
    };
    let key = match limiter.key_of(&caller(&named)) {
        Ok(key) => key,
        Err(err) => {
            let read = parts_read(limiter, aliases, &named);
            // No key at all: the caller is at fault, named by the part
            // the extractor does not read.
            if let Some((field, _)) = unread(&read) {
                let err = not_read(field, &read);
                return Err(ApiError::invalid(
                    "caller",
                    format!("{field} {}", err.message()),
                ));
            }
            return Err(ApiError::invalid(
                "caller",
                format!(
                    "policy {policy:?}'s key extractor cannot key this caller: {}; it reads {}",
                    missing(&err),
                    listed(&read),
                ),
            ));
        }
    };
    if let Some(at) = (0..named.len()).find(|&at| !reads(limiter, &named, at)) {
        let read = parts_read(limiter, aliases, &named);
        let field = &named[at].0;
        if unread(&read).is_some_and(|(f, _)| f == field) {
            return Err(not_read(field, &read));
        }
        return Err(ApiError::invalid(
            field,
            format!(
                "names the caller a second way: policy {policy:?}'s key extractor keys this \
                 caller by the other parts given and ignores {field}; name it one way"
            ),
        ));
    }
    Ok(key)
}

/// What a key extractor found missing, in an operator's words: the
/// extractor's message speaks of a request served without its peer's
/// address, which a named caller is not.
fn missing(err: &KeyError) -> String {
    match err {
        KeyError::Missing(what) if what.starts_with("peer address") => {
            "no address was given (name it with ip=)".to_owned()
        }
        KeyError::Missing(what) => format!("no {what} was given"),
        other => other.to_string(),
    }
}

/// The parts a query names; every parameter must name part of a caller,
/// once, without hash-tag characters.
fn parts_of(query: &str, aliases: &Aliases) -> Result<Vec<(String, Part)>, ApiError> {
    let mut named: Vec<(String, Part)> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let field = name.as_ref();
        if named.iter().any(|(s, _)| s == field) {
            return Err(ApiError::invalid(field, "given twice; name each part once"));
        }
        if value.is_empty() {
            return Err(ApiError::invalid(field, "is empty"));
        }
        if value.contains(['{', '}']) {
            return Err(ApiError::invalid(
                field,
                "has '{' or '}', which no caller's request can make part of its key",
            ));
        }
        let part = match field {
            "ip" => Part::Ip(value.parse::<IpAddr>().map_err(|_| {
                ApiError::invalid("ip", format!("{value:?} is not an IPv4 or IPv6 address"))
            })?),
            "route" if value.starts_with('/') => Part::Route(value.clone().into_owned()),
            "route" => {
                return Err(ApiError::invalid(
                    "route",
                    format!("{value:?} is not a route template (it starts with '/')"),
                ))
            }
            _ => {
                let header = match field.strip_prefix("header.") {
                    Some(header) => HeaderName::from_bytes(header.as_bytes())
                        .map_err(|_| ApiError::invalid(field, "is not a header name"))?,
                    None => match aliases.header(field) {
                        Some(header) => header.clone(),
                        None => {
                            return Err(ApiError::invalid(
                                field,
                                format!("names no part of a caller; use {}", aliases.hint()),
                            ))
                        }
                    },
                };
                if let Some((other, _)) = named
                    .iter()
                    .find(|(_, p)| matches!(p, Part::Header(h, _) if *h == header))
                {
                    return Err(ApiError::invalid(
                        field,
                        format!("names the header {header} that {other} names: name it once"),
                    ));
                }
                Caller::new()
                    .header(header.as_str(), &value)
                    .map_err(|err| ApiError::invalid(field, err.to_string()))?;
                Part::Header(header, value.into_owned())
            }
        };
        named.push((field.to_owned(), part));
    }
    if named.is_empty() {
        return Err(ApiError::invalid(
            "caller",
            format!("name the caller in the query: {}", aliases.hint()),
        ));
    }
    Ok(named)
}

/// The [`Caller`] a query names.
#[cfg(test)]
fn caller_of(query: &str, aliases: &Aliases) -> Result<Caller, ApiError> {
    Ok(caller(&parts_of(query, aliases)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{HeaderKey, KeyExtractor, PeerIp};

    fn aliases() -> Aliases {
        let mut aliases = Aliases::default();
        aliases.add("api_key", "x-api-key");
        aliases
    }

    fn field_of(query: &str) -> String {
        let err = caller_of(query, &aliases()).unwrap_err();
        assert_eq!(err.status().as_u16(), 400, "{query}");
        err.field().unwrap().to_owned()
    }

    #[test]
    fn a_caller_is_keyed_as_its_requests_are() {
        let by_key = HeaderKey::new("x-api-key").or(PeerIp::new());
        let aliased = caller_of("api_key=acme", &aliases()).unwrap();
        let spelled = caller_of("header.x-api-key=acme", &aliases()).unwrap();
        let direct = Caller::new().header("x-api-key", "acme").unwrap();
        assert_eq!(by_key.key_of(&aliased), by_key.key_of(&direct));
        assert_eq!(by_key.key_of(&spelled), by_key.key_of(&direct));
        let v6 = caller_of("ip=2001:db8::7", &aliases()).unwrap();
        assert_eq!(by_key.key_of(&v6).unwrap().as_str(), "ip:2001:db8::/64");
    }

    #[test]
    fn bad_parts_name_their_parameter() {
        assert_eq!(field_of(""), "caller");
        assert_eq!(field_of("ip=300.1.1.1"), "ip");
        assert_eq!(field_of("ip=1.2.3.4&ip=1.2.3.5"), "ip");
        assert_eq!(field_of("api_key=%7Bacme%7D"), "api_key");
        assert_eq!(field_of("header.x-api-key=a%7Db"), "header.x-api-key");
        assert_eq!(field_of("ipp=1.2.3.4"), "ipp");
        assert_eq!(field_of("api_key="), "api_key");
        assert_eq!(field_of("route=search"), "route");
        assert_eq!(field_of("header.bad%20name=x"), "header.bad name");
        assert_eq!(field_of("api_key=line%0Abreak"), "api_key");
    }

    #[test]
    #[should_panic(expected = "taken")]
    fn an_alias_cannot_hide_ip() {
        aliases().add("ip", "x-real-ip");
    }
}
