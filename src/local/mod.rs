//! Decisions made in this process before (or instead of) asking the store:
//! throttling mode's active-caller gate and the cache of known rejections.
//! The limiter calls in here at three points; everything else about
//! high-volume mode lives in this module and in [`throttle`](crate::throttle).

mod cache;
pub(crate) mod seed;

pub use self::cache::LocalCache;

use axum::body::Body;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use self::cache::DecisionCache;
#[cfg(not(feature = "throttle"))]
use self::no_throttle::Throttle;
use crate::decision::Decision;
use crate::key::Key;
use crate::limiter::Limiter;
use crate::metrics::Outcome;
use crate::policy::Policy;
#[cfg(feature = "throttle")]
use crate::throttle::Throttle;

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

    /// Before the store: a response if this request is decided here, with
    /// its metrics outcome. In shadow mode nothing is refused here: the
    /// throttle only notes the caller (counting a would-be refusal in
    /// `Throttle::stats`), and the cache is not asked.
    #[inline]
    pub(crate) fn before_store(
        &self,
        limiter: &Limiter,
        key: &Key,
        cost: u64,
    ) -> Option<(Response<Body>, Outcome)> {
        // Most layers have neither: their requests skip the call.
        if self.throttle.is_none() && self.cache.is_none() {
            return None;
        }
        self.decide_here(limiter, key, cost)
    }

    /// [`before_store`](Self::before_store) with a throttle or a cache.
    fn decide_here(
        &self,
        limiter: &Limiter,
        key: &Key,
        cost: u64,
    ) -> Option<(Response<Body>, Outcome)> {
        let policy = &limiter.policy;
        if let Some(throttle) = &self.throttle {
            if !throttle.admit(key) && !limiter.shadow {
                tracing::debug!(policy = policy.name(), "throttling: new caller refused");
                return Some((
                    throttled(limiter.limited_status, throttle),
                    Outcome::Throttled,
                ));
            }
        }
        if limiter.shadow {
            return None;
        }
        let rejection = self.cache.as_ref()?.rejection(key, cost)?;
        crate::metrics::local_cache_hit(policy);
        tracing::debug!(
            policy = policy.name(),
            "rate limit decision from the local cache"
        );
        let response =
            crate::response::limited(limiter.limited_status, policy, &rejection, &limiter.headers);
        Some((response, Outcome::Limited))
    }

    /// After the (main) store decided: remember what will hold.
    #[inline]
    pub(crate) fn after_store(&self, policy: &Policy, key: &Key, cost: u64, decision: &Decision) {
        if let Some(cache) = &self.cache {
            cache.learn(policy.strategy(), key, cost, decision);
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

/// A new caller refused while throttling: `status` (429 by default),
/// `Retry-After`, and a short JSON message. No `X-RateLimit-*` headers: no
/// quota was consulted.
fn throttled(status: StatusCode, throttle: &Throttle) -> Response<Body> {
    let secs = (throttle.retry_after().as_micros() as u64)
        .div_ceil(1_000_000)
        .max(1);
    let body = serde_json::json!({
        "message": "The service is busy: sessions in progress are served, new ones are refused for now.",
        "retry_after": secs,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(RETRY_AFTER, HeaderValue::from(secs));
    response
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
