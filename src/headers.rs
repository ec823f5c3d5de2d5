//! Telling clients where they stand: GitHub-style `X-RateLimit-*` headers,
//! `Retry-After`, and optionally the IETF draft's `RateLimit` fields.

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::Decision;
use crate::quota::Policy;

static LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static USED: HeaderName = HeaderName::from_static("x-ratelimit-used");
static RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static RESOURCE: HeaderName = HeaderName::from_static("x-ratelimit-resource");
static SCOPE: HeaderName = HeaderName::from_static("x-ratelimit-scope");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// Which header dialects the layer sends. `Retry-After` goes on every
/// rejection whatever is chosen here.
///
/// - **GitHub** (default): `X-RateLimit-Limit`, `-Remaining`, `-Used`,
///   `-Reset` (UTC epoch seconds, rounded up; the same on every response of a
///   window) and `-Resource` (the policy name). Policies with a limit shared
///   by every caller (the sliding log) add `-Scope`: `resource` when the
///   numbers are that shared limit's, `consumer` when they are the caller's.
/// - **IETF draft** (draft-ietf-httpapi-ratelimit-headers-11, still a draft):
///   `RateLimit-Policy: "core";q=5000;w=3600` and `RateLimit: "core";r=4999;t=3599`,
///   where `t` is seconds until reset, a delta, rounded up.
///
/// ```
/// use tollgate::RateLimitHeaders;
/// let both = RateLimitHeaders::GITHUB.with_ietf_draft(true);
/// assert!(both.ietf_draft() && both.github());
/// assert!(!RateLimitHeaders::NONE.github());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitHeaders {
    github: bool,
    ietf_draft: bool,
}

impl Default for RateLimitHeaders {
    fn default() -> Self {
        Self::GITHUB
    }
}

impl RateLimitHeaders {
    /// GitHub's `X-RateLimit-*` only.
    pub const GITHUB: Self = Self {
        github: true,
        ietf_draft: false,
    };
    /// No rate-limit headers (rejections still carry `Retry-After`).
    pub const NONE: Self = Self {
        github: false,
        ietf_draft: false,
    };

    /// Turns GitHub's headers on or off.
    pub const fn with_github(mut self, on: bool) -> Self {
        self.github = on;
        self
    }

    /// Turns the IETF draft's `RateLimit` / `RateLimit-Policy` on or off.
    pub const fn with_ietf_draft(mut self, on: bool) -> Self {
        self.ietf_draft = on;
        self
    }

    /// Whether GitHub's headers are sent.
    pub const fn github(&self) -> bool {
        self.github
    }

    /// Whether the IETF draft's headers are sent.
    pub const fn ietf_draft(&self) -> bool {
        self.ietf_draft
    }

    /// Writes the chosen headers for `decision` into `headers`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, policy: &Policy, decision: &Decision) {
        if self.github {
            headers.reserve(7);
            github(headers, policy, decision);
            if policy.strategy().has_resource_quota() {
                let scope = HeaderValue::from_static(decision.scope.as_str());
                headers.insert(SCOPE.clone(), scope);
            }
        }
        if self.ietf_draft {
            let name = ietf_name(policy, decision.quota);
            let t = (decision.reset_after().as_micros() as u64).div_ceil(1_000_000);
            let fields = format!("\"{name}\";r={};t={t}", decision.remaining);
            let policies = policy
                .quotas()
                .iter()
                .enumerate()
                .map(|(i, q)| {
                    let w = (q.window().as_micros() as u64).div_ceil(1_000_000).max(1);
                    format!("\"{}\";q={};w={w}", ietf_name(policy, i), q.limit())
                })
                .collect::<Vec<_>>()
                .join(", ");
            if let Ok(v) = HeaderValue::from_str(&fields) {
                headers.insert(RATELIMIT.clone(), v);
            }
            if let Ok(v) = HeaderValue::from_str(&policies) {
                headers.insert(RATELIMIT_POLICY.clone(), v);
            }
        }
        if let Some(secs) = decision.retry_after_secs() {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
    }
}

/// GitHub's five headers, written into one buffer and sliced: one allocation
/// per response instead of one per value (they were a third of the layer's
/// own cost on a pass).
fn github(headers: &mut HeaderMap, policy: &Policy, decision: &Decision) {
    let name = policy.name().as_bytes();
    let mut buf = BytesMut::with_capacity(4 * 20 + name.len());
    let mut ends = [0; 4];
    for (end, n) in ends.iter_mut().zip([
        decision.limit,
        decision.remaining,
        decision.used,
        decision.reset_epoch_secs(),
    ]) {
        push_u64(&mut buf, n);
        *end = buf.len();
    }
    buf.extend_from_slice(name);
    let buf = buf.freeze();
    let mut start = 0;
    for (header, end) in [&LIMIT, &REMAINING, &USED, &RESET].into_iter().zip(ends) {
        if let Ok(value) = HeaderValue::from_maybe_shared(buf.slice(start..end)) {
            headers.insert(header.clone(), value);
        }
        start = end;
    }
    if let Ok(value) = HeaderValue::from_maybe_shared(buf.slice(start..)) {
        headers.insert(RESOURCE.clone(), value);
    }
}

/// Appends `n` in decimal, without `fmt`.
fn push_u64(buf: &mut BytesMut, n: u64) {
    buf.extend_from_slice(decimal(n, &mut [0; 20]).as_bytes());
}

/// `n` in decimal, written at the end of `digits`, without `fmt` (which
/// costs more than the rest of a header's or a 429 body's number).
pub(crate) fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &str {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&digits[at..]).unwrap_or("0")
}

/// The policy's name, suffixed with the quota index when it has several.
fn ietf_name(policy: &Policy, quota: usize) -> String {
    if policy.quotas().len() == 1 {
        policy.name().to_owned()
    } else {
        format!("{}.{quota}", policy.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;
    use std::time::Duration;

    #[test]
    fn github_headers_carry_each_number_and_the_name() {
        let policy = Policy::fixed_window("core", Quota::new(5, Duration::from_secs(60)).unwrap());
        let decision = Decision::allowed(u64::MAX, 0, 10_000_001, 1);
        let mut headers = HeaderMap::new();
        RateLimitHeaders::GITHUB.apply(&mut headers, &policy, &decision);
        assert_eq!(headers["x-ratelimit-limit"], u64::MAX.to_string().as_str());
        assert_eq!(
            headers["x-ratelimit-remaining"],
            u64::MAX.to_string().as_str()
        );
        assert_eq!(headers["x-ratelimit-used"], "0");
        assert_eq!(headers["x-ratelimit-reset"], "11");
        assert_eq!(headers["x-ratelimit-resource"], "core");
        assert!(!headers.contains_key(RETRY_AFTER));
    }

    #[test]
    fn decimal_writes_every_digit() {
        for n in [0, 7, 10, 1_234_567_890, u64::MAX] {
            assert_eq!(decimal(n, &mut [0; 20]), n.to_string());
        }
    }
}
