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

/// The key `limiter` gives the caller that `uri`'s query names.
pub(super) fn key_of(uri: &Uri, aliases: &Aliases, limiter: &RateLimiter) -> Result<Key, ApiError> {
    let caller = caller_of(uri.query().unwrap_or(""), aliases)?;
    limiter.key_of(&caller).map_err(|err| {
        ApiError::invalid(
            "caller",
            format!("the policy's key extractor cannot key this caller: {err}"),
        )
    })
}

/// The [`Caller`] a query names; every parameter must name part of it,
/// once, without hash-tag characters.
fn caller_of(query: &str, aliases: &Aliases) -> Result<Caller, ApiError> {
    let mut caller = Caller::new();
    let mut seen: Vec<String> = Vec::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let field = name.as_ref();
        if seen.iter().any(|s| s == field) {
            return Err(ApiError::invalid(field, "given twice; name each part once"));
        }
        seen.push(field.to_owned());
        if value.is_empty() {
            return Err(ApiError::invalid(field, "is empty"));
        }
        if value.contains(['{', '}']) {
            return Err(ApiError::invalid(
                field,
                "has '{' or '}', which no caller's request can make part of its key",
            ));
        }
        caller = match field {
            "ip" => caller.ip(value.parse::<IpAddr>().map_err(|_| {
                ApiError::invalid("ip", format!("{value:?} is not an IPv4 or IPv6 address"))
            })?),
            "route" if value.starts_with('/') => caller.route(&value),
            "route" => {
                return Err(ApiError::invalid(
                    "route",
                    format!("{value:?} is not a route template (it starts with '/')"),
                ))
            }
            _ => {
                let header = match field.strip_prefix("header.") {
                    Some(header) => header.to_owned(),
                    None => match aliases.header(field) {
                        Some(header) => header.as_str().to_owned(),
                        None => {
                            return Err(ApiError::invalid(
                                field,
                                format!("names no part of a caller; use {}", aliases.hint()),
                            ))
                        }
                    },
                };
                caller
                    .header(&header, &value)
                    .map_err(|err| ApiError::invalid(field, err.to_string()))?
            }
        };
    }
    if seen.is_empty() {
        return Err(ApiError::invalid(
            "caller",
            format!("name the caller in the query: {}", aliases.hint()),
        ));
    }
    Ok(caller)
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
