//! Limits an operator sets at runtime for every caller of a policy (or a
//! tier): [`PolicyLimits`], a replacement of its quotas and a cap.

use std::sync::Arc;

use crate::overrides::Override;
use crate::policy::Policy;

/// What an operator set at runtime for every caller of a policy, beside
/// the quotas it was built with: on every app server within a second (see
/// [`RateLimiter::set_policy_limit`](crate::RateLimiter::set_policy_limit)).
///
/// - **`limit`** replaces the policy's quotas (as many as it has, windows
///   of the operator's choosing), optionally until a time: lowering
///   `/search` during an incident, raising the free plan for a launch.
/// - **`cap`** is a ceiling that nothing exceeds, optionally until a time:
///   each quota's limit is at most the cap's (give the policy's windows),
///   whatever judges the caller. Load shedding.
///
/// Precedence, from the strongest: the cap; a caller's
/// [`Override`]; a limit that came with the request
/// ([`limit_from_request`](crate::RateLimitLayerBuilder::limit_from_request));
/// the runtime `limit`; the quotas the policy was built with. An override
/// above the cap is set aside while the cap lasts (the caller is judged by
/// the policy's quotas under the cap).
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::{Override, PolicyLimits, Quota};
/// let per_min = |n| Quota::per_minute(NonZeroU32::new(n).unwrap());
/// let incident = PolicyLimits { limit: Some(Override::new(per_min(10))), cap: None };
/// assert!(incident.limit.is_some() && incident.cap.is_none());
/// assert_eq!(PolicyLimits::default(), PolicyLimits { limit: None, cap: None });
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyLimits {
    /// Replaces the policy's build-time quotas for every caller.
    pub limit: Option<Override>,
    /// Each quota's highest limit, for every caller.
    pub cap: Option<Override>,
}

/// Which of a policy's runtime limits a change is for.
///
/// ```
/// use tollgate::PolicyLimit;
/// assert_eq!(PolicyLimit::Cap.as_str(), "cap");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyLimit {
    /// [`PolicyLimits::limit`].
    Limit,
    /// [`PolicyLimits::cap`].
    Cap,
}

impl PolicyLimit {
    /// `"limit"` or `"cap"`: metric labels, the admin API, store fields.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyLimit::Limit => "limit",
            PolicyLimit::Cap => "cap",
        }
    }
}

impl PolicyLimits {
    /// Those in force at `now` (µs since the epoch).
    pub(crate) fn in_force(&self, now: u64) -> PolicyLimits {
        let keep = |o: &Option<Override>| o.clone().filter(|o| o.in_force(now));
        PolicyLimits {
            limit: keep(&self.limit),
            cap: keep(&self.cap),
        }
    }

    /// One of them.
    pub(crate) fn get(&self, which: PolicyLimit) -> Option<&Override> {
        match which {
            PolicyLimit::Limit => self.limit.as_ref(),
            PolicyLimit::Cap => self.cap.as_ref(),
        }
    }

    /// Sets (or clears, `None`) one of them.
    pub(crate) fn set(&mut self, which: PolicyLimit, value: Option<Override>) {
        match which {
            PolicyLimit::Limit => self.limit = value,
            PolicyLimit::Cap => self.cap = value,
        }
    }

    /// When the first of them still in force after `now` ends (µs), if
    /// one has an end: one that ended already is no longer a change to
    /// come.
    pub(crate) fn next_end_after(&self, now: u64) -> Option<u64> {
        [&self.limit, &self.cap]
            .into_iter()
            .filter_map(|o| o.as_ref()?.until_micros())
            .filter(|&end| end > now)
            .min()
    }

    /// `policy` with those in force at `now`: its quotas replaced by the
    /// limit, then capped. `None` when none is in force.
    pub(crate) fn policy_in_force(&self, policy: &Policy, now: u64) -> Option<Policy> {
        let limits = self.in_force(now);
        if limits.limit.is_none() && limits.cap.is_none() {
            return None;
        }
        let base = match &limits.limit {
            Some(limit) => policy.with_quotas(limit.shared_quotas().clone()),
            None => policy.clone(),
        };
        Some(match &limits.cap {
            Some(cap) => {
                let most: Arc<[u32]> = cap.quotas().iter().map(|q| q.limit()).collect();
                base.with_cap(most)
            }
            None => base,
        })
    }
}
