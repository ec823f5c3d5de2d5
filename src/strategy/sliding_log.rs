//! The exact sliding-window log, with a limit for the whole resource and one
//! per caller, checked and charged together.
//!
//! Mirrors `lua/sliding_log.lua`; change both together.
//!
//! Each log holds one entry per unit spent, scored by its time in integer µs
//! and named by a random id per request, so two requests in the same
//! microsecond stay two entries. A request fits a log when the units inside
//! `(now - window, now]` plus its cost are at most the limit; rejected
//! requests are not logged, so a log never holds more than its limit.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::LazyLock;

use smallvec::SmallVec;

use super::fixed_window::EXPIRY_GRACE_MICROS;
use super::{Algorithm, Settles, Strategy};
use crate::decision::{Decision, Receipt, Scope};
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::{Log, State};
#[cfg(feature = "redis")]
use crate::store::redis::args::{int, quota_ints, stamps, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};

/// Quota index of the limit shared by every caller of the resource.
pub(crate) const RESOURCE: usize = 0;
/// A log keeps one entry per unit, so its limit is its memory: bounded here.
pub(crate) const MAX_LIMIT: u32 = 1_000_000;

pub(crate) fn validate(quotas: &[Quota]) -> Result<(), ConfigError> {
    if quotas.len() != 2 {
        return Err(ConfigError::SlidingLogQuotas { got: quotas.len() });
    }
    match quotas.iter().find(|q| q.limit() > MAX_LIMIT) {
        Some(q) => Err(ConfigError::SlidingLogLimit {
            max: MAX_LIMIT,
            got: q.limit(),
        }),
        None => Ok(()),
    }
}

/// A fresh id for one request's log entries: random, below 2^53 so that Lua
/// numbers carry it exactly, and different for every call of this process.
pub(crate) fn request_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static KEY: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    KEY.hash_one(NEXT.fetch_add(1, Ordering::Relaxed)) >> 11
}

/// Decides for `cost` units against `logs[RESOURCE]` and `logs[CONSUMER]`;
/// on a pass charges both, tagged with `id`. When either rejects, nothing is
/// charged, and the one that frees up last is reported (its `quota` index
/// says which). With `cost == 0` nothing is written (a peek).
pub(crate) fn check(logs: &mut [Log], quotas: &[Quota], now: u64, cost: u64, id: u64) -> Decision {
    let counts: smallvec::SmallVec<[u64; 2]> = logs
        .iter()
        .zip(quotas)
        .map(|(log, q)| log.count(now, q.window_micros()))
        .collect();
    let reset = |log: &Log, n: u64, window: u64| match log.newest() {
        Some(newest) if n > 0 => newest + window,
        _ => now,
    };

    let mut rejected: Option<(usize, u64)> = None;
    for (i, (log, q)) in logs.iter().zip(quotas).enumerate() {
        let (n, limit, window) = (counts[i], u64::from(q.limit()), q.window_micros());
        if n.saturating_add(cost) <= limit {
            continue;
        }
        // The wait until enough of the oldest units leave the window; a cost
        // above the limit never fits, and waits for the whole log instead.
        let free = (n.saturating_add(cost) - limit).min(n);
        let retry = if free == 0 {
            window
        } else {
            log.kth_inside(now, window, free) + window - now
        };
        if rejected.is_none_or(|(_, r)| retry > r) {
            rejected = Some((i, retry));
        }
    }
    if let Some((i, retry)) = rejected {
        let (q, n) = (quotas[i], counts[i]);
        let limit = u64::from(q.limit());
        let reset_at = reset(&logs[i], n, q.window_micros());
        return Decision::rejected(limit, n.min(limit), reset_at, now, retry).reporting(i);
    }

    if cost > 0 {
        for (log, q) in logs.iter_mut().zip(quotas) {
            log.trim(now, q.window_micros());
            log.add(now, id, cost);
        }
    }
    // When both fit, the one with the least left is reported.
    let left = |j: usize| u64::from(quotas[j].limit()) - counts[j] - cost;
    let report = (1..quotas.len()).fold(0, |best, i| if left(i) < left(best) { i } else { best });
    let q = quotas[report];
    let used = counts[report] + cost;
    let reset_at = reset(&logs[report], used, q.window_micros());
    Decision::allowed(u64::from(q.limit()), used, reset_at, now)
        .reporting(report)
        .with_receipt(Receipt::of(cost, [now, id]))
}

/// Removes what the pass stamped `[at, id]` charged, from every log; units
/// that already left a window are gone anyway.
pub(crate) fn refund(logs: &mut [Log], stamps: &[u64], cost: u64) {
    if let [at, id] = *stamps {
        for log in logs {
            log.remove(at, id, cost);
        }
    }
}

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    let trio = Trio::new(
        "sliding_log",
        include_str!("../../lua/sliding_log.lua"),
        Some(include_str!("../../lua/sliding_log_batch.lua")),
        LuaScript::refund(
            "sliding_log_refund",
            include_str!("../../lua/sliding_log_refund.lua"),
        ),
    );
    // The request id is `ARGV[3]` of `lua/sliding_log.lua`.
    Trio {
        check: trio.check.taking_id_at(2),
        ..trio
    }
});

/// The sliding log's home (see [`Algorithm`]).
pub(crate) struct SlidingLog;

impl Algorithm for SlidingLog {
    fn max_quotas(&self) -> usize {
        2
    }

    fn scope_of(&self, quota: usize) -> Scope {
        if quota == RESOURCE {
            Scope::Resource
        } else {
            Scope::Consumer
        }
    }

    fn has_resource_quota(&self) -> bool {
        true
    }

    /// Entries leave only with time, and other requests only add to them, so
    /// the first moment the request fits can only move later.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// `reset_at` is when the limit is whole again, but one unit frees
    /// earlier, when the oldest entry leaves.
    fn exhaustion_is_stable(&self) -> bool {
        false
    }

    fn validate(&self, _strategy: &Strategy, quotas: &[Quota]) -> Result<(), ConfigError> {
        validate(quotas)
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        // Logs can be long: move them out of their entries, not
        // copies, and back in place (a rejection allocates nothing).
        let mut logs = SmallVec::<[Log; 2]>::new();
        let mut expiries = SmallVec::<[Option<u64>; 2]>::new();
        for k in keys.iter() {
            // The live log with its expiry, moved out: an empty log stays
            // in its place until `put` or `remove`, so the key's name is not
            // given up and allocated again.
            let (log, expires_at) = match shard.get_mut_with_expiry(k, now) {
                Some((State::Log(log), expires_at)) => {
                    (Some(std::mem::take(log)), Some(expires_at))
                }
                _ => (None, None),
            };
            logs.push(log.unwrap_or_default());
            expiries.push(expires_at);
        }
        let id = request_id();
        let decision = check(&mut logs, policy.quotas(), now, cost, id);
        let charged = decision.allowed && cost > 0;
        for ((k, log), (q, expires_at)) in keys
            .iter()
            .zip(logs)
            .zip(policy.quotas().iter().zip(expiries))
        {
            let expires_at = match (charged, log.newest()) {
                (true, Some(newest)) => Some(newest + q.window_micros() + EXPIRY_GRACE_MICROS),
                _ => expires_at,
            };
            match expires_at.filter(|_| !log.is_empty()) {
                Some(expires_at) => shard.put(k, State::Log(log), expires_at),
                None => shard.remove(k),
            }
        }
        let scope = self.scope_of(decision.quota);
        decision.scoped(scope)
    }

    fn give_back(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        for k in keys.iter() {
            if let Some(State::Log(log)) = shard.get_mut(k, now) {
                refund(std::slice::from_mut(log), receipt.stamps(), receipt.cost());
            }
        }
    }

    #[cfg(feature = "redis")]
    fn lua(&self) -> &'static Trio {
        &LUA
    }

    #[cfg(feature = "redis")]
    fn call(
        &self,
        policy: &Policy,
        now: ScriptNow,
        cost: u64,
        read_only: bool,
    ) -> (&'static LuaScript, Args) {
        let mut args = Args::from_slice(&[now.arg(), int(cost), int(request_id())]);
        args.extend(quota_ints(policy));
        (LUA.decide(read_only), args)
    }

    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (3, quota_ints(policy).collect())
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, _policy: &Policy, _now: ScriptNow, receipt: &Receipt) -> GiveBack {
        let mut args = vec![receipt.cost().to_string()];
        args.extend(stamps(receipt));
        GiveBack::Refund(&LUA.refund, args)
    }

    /// A settle gives back what was charged over `actual`; one unit is one
    /// entry in each log, bounded by its limit, so an overspend is not
    /// charged.
    fn settles(&self) -> Settles {
        Settles::GiveBack
    }

    /// Keeps `actual` of the pass's entries in each log, as the Redis
    /// settle keeps its units before `actual`.
    fn settle(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
        actual: u64,
    ) {
        let (&[at, id], true) = (receipt.stamps(), actual < receipt.cost()) else {
            return;
        };
        for k in keys.iter() {
            if let Some(State::Log(log)) = shard.get_mut(k, now) {
                log.keep(at, id, actual);
            }
        }
    }

    /// The entries of units `actual` and after, so that a later refund of
    /// the settled receipt (units before `actual`) finds its own.
    #[cfg(feature = "redis")]
    fn settle_call(
        &self,
        _policy: &Policy,
        _now: ScriptNow,
        receipt: &Receipt,
        actual: u64,
    ) -> Option<GiveBack> {
        let back = receipt.cost().checked_sub(actual).filter(|&n| n > 0)?;
        let mut args = vec![back.to_string()];
        args.extend(stamps(receipt));
        args.push(actual.to_string());
        Some(GiveBack::Refund(&LUA.refund, args))
    }
}

impl Policy {
    /// An exact sliding-window log with two limits checked and charged
    /// together: `resource` is shared by every caller of the policy (the
    /// tiger feeding sells 100 tickets per 10 s to everyone), `consumer` is
    /// each caller's own (at most 3 of them each). When either rejects,
    /// nothing is charged, and [`Decision::scope`](crate::Decision::scope)
    /// says which one did. Limits are at most 1,000,000: the log keeps one
    /// entry per unit.
    ///
    /// All of a policy's keys share one Redis Cluster hash tag (the policy's
    /// name), because the resource log is checked with every caller's.
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Policy, Quota};
    ///
    /// let everyone = Quota::new(100, Duration::from_secs(10)).unwrap();
    /// let each = Quota::new(3, Duration::from_secs(10)).unwrap();
    /// let policy = Policy::sliding_log("tigerfeeding", everyone, each);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn sliding_log(name: impl Into<Arc<str>>, resource: Quota, consumer: Quota) -> Self {
        Self::new(name, Strategy::SlidingLog, resource).and(consumer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn q(limit: u32, secs: u64) -> Quota {
        Quota::new(limit, Duration::from_secs(secs)).unwrap()
    }

    #[test]
    fn a_rejection_by_either_limit_charges_neither() {
        let quotas = [q(100, 10), q(2, 10)];
        let mut logs = vec![Log::default(), Log::default()];
        assert!(check(&mut logs, &quotas, 0, 2, 1).allowed);
        let d = check(&mut logs, &quotas, 1, 1, 2);
        assert!(!d.allowed);
        assert_eq!(d.quota, 1, "the consumer's limit rejected");
        assert_eq!(logs[RESOURCE].count(1, 10_000_000), 2);
    }

    #[test]
    fn the_log_never_holds_more_than_its_limit() {
        let quotas = [q(5, 1), q(5, 1)];
        let mut logs = vec![Log::default(), Log::default()];
        for t in 0..1_000u64 {
            check(&mut logs, &quotas, t * 10_000, 1, t);
            assert!(logs.iter().all(|l| l.len() <= 5));
        }
    }

    #[test]
    fn request_ids_differ_and_fit_a_lua_number() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| request_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|&id| id < 1 << 53));
    }
}
