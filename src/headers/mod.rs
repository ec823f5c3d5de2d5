//! Telling clients where they stand: GitHub-style `X-RateLimit-*` headers,
//! `Retry-After`, and optionally the IETF draft's `RateLimit` fields.

mod values;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::Decision;
use crate::policy::Policy;
use values::{kept_number, number, reset_value, shared};

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
///   [`with_github_only`](Self::with_github_only) sends a subset instead.
/// - **IETF draft** (draft-ietf-httpapi-ratelimit-headers-11, still a draft):
///   `RateLimit-Policy: "core";q=5000;w=3600` and `RateLimit: "core";r=4999;t=3599`,
///   where `t` is seconds until reset, a delta, rounded up.
///
/// ```
/// use tollgate::headers::{GithubHeader, RateLimitHeaders};
/// let both = RateLimitHeaders::GITHUB.with_ietf_draft(true);
/// assert!(both.ietf_draft() && both.github());
/// assert!(!RateLimitHeaders::NONE.github());
/// let brief = RateLimitHeaders::NONE.with_github_only(&[GithubHeader::Limit, GithubHeader::Remaining]);
/// assert!(brief.sends(GithubHeader::Remaining) && !brief.sends(GithubHeader::Used));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitHeaders {
    /// Which of GitHub's headers are sent: one bit per [`GithubHeader`].
    github: u8,
    ietf_draft: bool,
}

/// One of GitHub's `X-RateLimit-*` headers, to send a subset of them with
/// [`RateLimitHeaders::with_github_only`].
///
/// ```
/// use tollgate::headers::{GithubHeader, RateLimitHeaders};
/// // What tower_governor's `use_headers()` sends on a pass, and no more.
/// let two = RateLimitHeaders::NONE.with_github_only(&[GithubHeader::Limit, GithubHeader::Remaining]);
/// assert!(two.sends(GithubHeader::Limit));
/// assert!(!two.sends(GithubHeader::Reset));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GithubHeader {
    /// `X-RateLimit-Limit`.
    Limit,
    /// `X-RateLimit-Remaining`.
    Remaining,
    /// `X-RateLimit-Used`.
    Used,
    /// `X-RateLimit-Reset`.
    Reset,
    /// `X-RateLimit-Resource`.
    Resource,
}

impl GithubHeader {
    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Every one of GitHub's headers.
const ALL_GITHUB: u8 = 0b1_1111;

impl Default for RateLimitHeaders {
    fn default() -> Self {
        Self::GITHUB
    }
}

impl RateLimitHeaders {
    /// GitHub's `X-RateLimit-*` only.
    pub const GITHUB: Self = Self {
        github: ALL_GITHUB,
        ietf_draft: false,
    };
    /// No rate-limit headers (rejections still carry `Retry-After`).
    pub const NONE: Self = Self {
        github: 0,
        ietf_draft: false,
    };

    /// Turns GitHub's headers on (all five) or off.
    pub const fn with_github(mut self, on: bool) -> Self {
        self.github = if on { ALL_GITHUB } else { 0 };
        self
    }

    /// Sends only `headers` of GitHub's (none for an empty list); a shared
    /// limit's `X-RateLimit-Scope` still goes with them. Fewer headers cost
    /// a response less, and some clients read only a few.
    pub const fn with_github_only(mut self, headers: &[GithubHeader]) -> Self {
        self.github = 0;
        let mut i = 0;
        while i < headers.len() {
            self.github |= headers[i].bit();
            i += 1;
        }
        self
    }

    /// Turns the IETF draft's `RateLimit` / `RateLimit-Policy` on or off.
    pub const fn with_ietf_draft(mut self, on: bool) -> Self {
        self.ietf_draft = on;
        self
    }

    /// Whether any of GitHub's headers is sent.
    pub const fn github(&self) -> bool {
        self.github != 0
    }

    /// Whether GitHub's `header` is sent.
    pub const fn sends(&self, header: GithubHeader) -> bool {
        self.github & header.bit() != 0
    }

    /// Whether the IETF draft's headers are sent.
    pub const fn ietf_draft(&self) -> bool {
        self.ietf_draft
    }
}

/// [`RateLimitHeaders`] for one policy, with the values that never change
/// (each quota's `X-RateLimit-Limit`, and `X-RateLimit-Resource`) built once,
/// when the layer is: cloning a prebuilt value bumps a reference count,
/// where formatting and checking it again cost more than the store's
/// decision.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHeaders {
    dialects: RateLimitHeaders,
    /// Per quota: its limit and that limit as a header value.
    limits: Box<[(u64, HeaderValue)]>,
    /// The policy's name; `None` if it cannot be a header value.
    resource: Option<HeaderValue>,
    /// Whether the policy has a limit every caller shares, whose numbers
    /// `X-RateLimit-Scope` tells apart from the caller's own.
    scoped: bool,
    /// How many GitHub headers a response gets: the map makes room for
    /// exactly these. Room for more than are sent can grow a response's
    /// map (a reallocation) that the headers themselves fit without.
    github_count: usize,
}

impl PolicyHeaders {
    pub(crate) fn new(dialects: RateLimitHeaders, policy: &Policy) -> Self {
        let limits = policy
            .quotas()
            .iter()
            .map(|q| {
                let limit = u64::from(q.limit());
                (limit, kept_number(limit))
            })
            .collect();
        let resource = HeaderValue::from_str(policy.name())
            .ok()
            .map(|_| shared(policy.name()));
        let scoped = policy.strategy().has_resource_quota();
        let github_count = if dialects.github() {
            dialects.github.count_ones() as usize + usize::from(scoped)
        } else {
            0
        };
        Self {
            dialects,
            limits,
            resource,
            scoped,
            github_count,
        }
    }

    /// Whether a pass's response gets any header: a dialect is on. (A
    /// pass carries no `Retry-After`.) Lets a layer that sends none skip
    /// the call.
    pub(crate) fn on_a_pass(&self) -> bool {
        self.dialects.github() || self.dialects.ietf_draft
    }

    /// Writes the chosen headers for `decision` into `headers`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, policy: &Policy, decision: &Decision) {
        if self.dialects.github() {
            headers.reserve(self.github_count);
            self.github(headers, decision);
            if self.scoped {
                let scope = HeaderValue::from_static(decision.scope.as_str());
                headers.insert(SCOPE.clone(), scope);
            }
        }
        if self.dialects.ietf_draft {
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
            headers.insert(RETRY_AFTER, number(secs));
        }
    }

    /// GitHub's headers, the chosen ones. Limit and Resource are
    /// prebuilt; the numbers that change come from [`values`], which
    /// allocates nothing for them per response.
    fn github(&self, headers: &mut HeaderMap, decision: &Decision) {
        let sends = |header| self.dialects.sends(header);
        if sends(GithubHeader::Limit) {
            let limit = match self.limits.get(decision.quota) {
                Some((limit, value)) if *limit == decision.limit => value.clone(),
                _ => number(decision.limit),
            };
            headers.insert(LIMIT.clone(), limit);
        }
        if sends(GithubHeader::Remaining) {
            headers.insert(REMAINING.clone(), number(decision.remaining));
        }
        if sends(GithubHeader::Used) {
            headers.insert(USED.clone(), number(decision.used));
        }
        if sends(GithubHeader::Reset) {
            headers.insert(RESET.clone(), reset_value(decision.reset_epoch_secs()));
        }
        if let Some(resource) = self
            .resource
            .as_ref()
            .filter(|_| sends(GithubHeader::Resource))
        {
            headers.insert(RESOURCE.clone(), resource.clone());
        }
    }
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
        PolicyHeaders::new(RateLimitHeaders::GITHUB, &policy).apply(
            &mut headers,
            &policy,
            &decision,
        );
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
    fn prebuilt_limits_are_used_only_for_the_quota_they_belong_to() {
        let q = |n| Quota::new(n, Duration::from_secs(60)).unwrap();
        let policy = Policy::fixed_window("core", q(5)).and(q(100));
        let headers = PolicyHeaders::new(RateLimitHeaders::GITHUB, &policy);
        for (decision, limit) in [
            (Decision::allowed(5, 1, 0, 0), "5"),
            (Decision::allowed(100, 1, 0, 0).reporting(1), "100"),
            // A store may report another limit than the policy's quota.
            (Decision::allowed(7, 1, 0, 0).reporting(1), "7"),
            (Decision::allowed(9, 1, 0, 0).reporting(5), "9"),
        ] {
            let mut map = HeaderMap::new();
            headers.apply(&mut map, &policy, &decision);
            assert_eq!(map["x-ratelimit-limit"], limit);
            assert_eq!(map["x-ratelimit-resource"], "core");
        }
    }

    #[test]
    fn a_chosen_subset_sends_those_headers_and_no_others() {
        let q = Quota::new(5, Duration::from_secs(60)).unwrap();
        let all =
            ["limit", "remaining", "used", "reset", "resource"].map(|h| format!("x-ratelimit-{h}"));
        for (chosen, names) in [
            (
                vec![GithubHeader::Limit, GithubHeader::Remaining],
                vec![0, 1],
            ),
            (vec![GithubHeader::Reset], vec![3]),
            (vec![GithubHeader::Used, GithubHeader::Resource], vec![2, 4]),
            (vec![], vec![]),
        ] {
            let dialects = RateLimitHeaders::NONE.with_github_only(&chosen);
            assert_eq!(dialects.github(), !chosen.is_empty());
            for (policy, scope) in [
                (Policy::fixed_window("core", q), false),
                (Policy::sliding_log("core", q, q), !chosen.is_empty()),
            ] {
                let headers = PolicyHeaders::new(dialects, &policy);
                let rejected = Decision::rejected(5, 5, 10_000_001, 1, 2_000_000);
                let mut map = HeaderMap::new();
                headers.apply(&mut map, &policy, &rejected);
                for (i, name) in all.iter().enumerate() {
                    assert_eq!(
                        map.contains_key(name.as_str()),
                        names.contains(&i),
                        "{name} for {chosen:?}"
                    );
                }
                assert_eq!(map.contains_key("x-ratelimit-scope"), scope, "{chosen:?}");
                assert!(
                    map.contains_key(RETRY_AFTER),
                    "a rejection says when to retry"
                );
                if names.contains(&1) {
                    assert_eq!(map["x-ratelimit-remaining"], "0");
                }
            }
        }
    }
}
