//! Decisions made in this process before (or instead of) asking the store:
//! throttling mode's active-caller gate and the cache of known rejections.
//! The limiter calls in here at three points; everything else about
//! high-volume mode lives in this module and in [`throttle`](crate::throttle).

mod cache;
pub(crate) mod seed;

pub use self::cache::LocalCache;

use std::time::Duration;

use self::cache::DecisionCache;
#[cfg(not(feature = "throttle"))]
use self::no_throttle::Throttle;
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::Policy;
#[cfg(feature = "throttle")]
use crate::throttle::Throttle;

/// What the local deciders concluded, before the store was asked.
pub(crate) enum LocalAnswer {
    /// A new caller refused while throttling; try again after this.
    Throttled { retry_after: Duration },
    /// The cache of rejections repeats one that still holds.
    Rejected(Decision),
}

/// The limiter's local deciders; both optional, both off by default.
#[derive(Debug, Default)]
pub(crate) struct LocalDecisions {
    throttle: Option<Throttle>,
    cache: Option<DecisionCache>,
}

impl LocalDecisions {
    #[cfg(feature = "throttle")]
    pub(crate) fn set_throttle(&mut self, throttle: Throttle) {
        self.throttle = Some(throttle);
    }

    pub(crate) fn set_cache(&mut self, options: LocalCache) {
        self.cache = (options.capacity() > 0).then(|| DecisionCache::new(options));
    }

    /// The deciders for a layer enforcing `policy`: a throttle reports its
    /// active-caller estimate under each policy it gates.
    pub(crate) fn gating(self, policy: &Policy) -> Self {
        if let Some(throttle) = &self.throttle {
            throttle.report_under(policy);
        }
        self
    }

    /// Before the store: what the local deciders say of this request, if
    /// they decide it. In shadow mode nothing is refused here: the throttle
    /// only notes the caller (counting a would-be refusal in
    /// `Throttle::stats`), and the cache is not asked.
    pub(crate) fn before_store(
        &self,
        policy: &Policy,
        key: &Key,
        cost: u64,
        shadow: bool,
    ) -> Option<LocalAnswer> {
        if let Some(throttle) = &self.throttle
            && !throttle.admit(key)
            && !shadow
        {
            tracing::debug!(policy = policy.name(), "throttling: new caller refused");
            return Some(LocalAnswer::Throttled {
                retry_after: throttle.retry_after(),
            });
        }
        if shadow {
            return None;
        }
        let rejection = self.cache.as_ref()?.rejection(key, cost)?;
        crate::metrics::local_cache_hit(policy);
        tracing::debug!(
            policy = policy.name(),
            "rate limit decision from the local cache"
        );
        Some(LocalAnswer::Rejected(rejection))
    }

    /// After the (main) store decided: remember what will hold.
    pub(crate) fn after_store(&self, policy: &Policy, key: &Key, cost: u64, decision: &Decision) {
        if let Some(cache) = &self.cache {
            cache.learn(policy, key, cost, decision);
        }
    }

    /// The store's runtime limits are at `version`: what was remembered
    /// under others is forgotten.
    pub(crate) fn limits_are(&self, version: u64) {
        if let Some(cache) = &self.cache {
            cache.limits_are(version);
        }
    }

    /// After a refund went through: what was remembered may no longer hold.
    pub(crate) fn refunded(&self, key: &Key) {
        if let Some(cache) = &self.cache {
            cache.forget(key);
        }
    }

    /// Requests the cache answered.
    pub(crate) fn cache_hits(&self) -> u64 {
        self.cache.as_ref().map_or(0, DecisionCache::hits)
    }
}

/// Without the `throttle` feature no layer has a throttle: a type with no
/// values stands in, so the throttle's paths are statically unreachable.
#[cfg(not(feature = "throttle"))]
mod no_throttle {
    use std::time::Duration;

    use crate::key::Key;
    use crate::policy::Policy;

    #[derive(Debug)]
    pub(crate) enum Throttle {}

    impl Throttle {
        pub(crate) fn report_under(&self, _policy: &Policy) {
            match *self {}
        }

        pub(crate) fn admit(&self, _key: &Key) -> bool {
            match *self {}
        }

        pub(crate) fn retry_after(&self) -> Duration {
            match *self {}
        }
    }
}
