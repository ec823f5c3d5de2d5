//! Telling clients where they stand: GitHub-style `X-RateLimit-*` headers,
//! `Retry-After`, and optionally the IETF draft's `RateLimit` fields.

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
            headers.insert(LIMIT.clone(), HeaderValue::from(decision.limit));
            headers.insert(REMAINING.clone(), HeaderValue::from(decision.remaining));
            headers.insert(USED.clone(), HeaderValue::from(decision.used));
            headers.insert(
                RESET.clone(),
                HeaderValue::from(decision.reset_epoch_secs()),
            );
            if let Ok(name) = HeaderValue::from_str(policy.name()) {
                headers.insert(RESOURCE.clone(), name);
            }
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

/// The policy's name, suffixed with the quota index when it has several.
fn ietf_name(policy: &Policy, quota: usize) -> String {
    if policy.quotas().len() == 1 {
        policy.name().to_owned()
    } else {
        format!("{}.{quota}", policy.name())
    }
}
