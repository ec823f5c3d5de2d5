//! The metrics without the `metrics` feature: what `recorded.rs` offers the
//! rest of the crate, doing nothing, so callers need no `cfg` of their own.

use super::outcome::Outcome;
use crate::error::StoreErrorKind;
use crate::policy::Policy;

pub(crate) struct PolicyMetrics;

impl PolicyMetrics {
    pub(crate) fn new(_policy: &Policy) -> Self {
        Self
    }

    #[inline]
    pub(crate) fn decision(&self, _outcome: Outcome) {}

    #[inline]
    pub(crate) fn store_error(&self, _kind: StoreErrorKind) {}

    #[inline]
    pub(crate) fn store_latency(&self, _watch: Stopwatch) {}
}

/// Reads no clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch;

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Self {
        Self
    }

    #[inline]
    pub(crate) fn idle() -> Self {
        Self
    }
}

#[inline]
pub(crate) fn local_cache_hit(_policy: &Policy) {}

#[inline]
pub(crate) fn settled(_policy: &Policy, _charged: u64, _actual: u64) {}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[inline]
pub(crate) fn script_reload(_script: &'static str) {}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[inline]
pub(crate) fn replica_fallback() {}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[inline]
pub(crate) fn lease_taken(_policy: &Policy, _units: u64) {}

#[derive(Debug, Clone)]
pub(crate) struct LeaseDecisions;

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl LeaseDecisions {
    pub(crate) fn of(_policy: &Policy) -> Self {
        Self
    }

    #[inline]
    pub(crate) fn count(&self) {}
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[inline]
pub(crate) fn lease_returned(_policy: &Policy, _units: u64) {}

#[cfg_attr(not(feature = "throttle"), allow(dead_code))]
#[inline]
pub(crate) fn active_callers(_policy: &Policy, _estimate: f64) {}

#[inline]
pub(crate) fn override_changed(_policy: &Policy, _change: &'static str) {}

#[inline]
pub(crate) fn policy_limit_changed(_policy: &Policy, _limit: &'static str, _change: &'static str) {}

#[inline]
pub(crate) fn block_started(_policy: &Policy, _by: &'static str) {}
