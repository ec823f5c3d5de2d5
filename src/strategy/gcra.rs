//! The generic cell rate algorithm: a token bucket kept as one timestamp.
//!
//! Mirrors `lua/gcra.lua`; change both together.
//!
//! As in redis-cell: units are emitted every `T = window / limit` (rounded up
//! to whole µs, so the rate is never above the quota), the bucket holds
//! `burst` units, and the state is the theoretical arrival time `tat`: the
//! moment the bucket would be full again. A request of `cost` conforms when
//! `max(tat, now) + cost × T − now ≤ burst × T`.
//!
//! A give-back moves the TAT back as `strategy/bucket.rs` says.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::bucket::{charge, refund, Bucket};
#[cfg(feature = "redis")]
use super::fixed_window::signed;
use super::fixed_window::EXPIRY_GRACE_MICROS;
#[cfg(feature = "redis")]
use super::lease::{LeaseScripts, Spending};
use super::MAX_SPAN_MICROS;
use super::{Algorithm, Settles, Strategy};
use crate::decision::{Decision, Receipt};
use crate::error::ConfigError;
#[cfg(feature = "redis")]
use crate::error::StoreError;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::State;
#[cfg(feature = "redis")]
use crate::store::redis::args::{int, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::reply::Decided;
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};
#[cfg(feature = "redis")]
use std::sync::LazyLock;

/// The emission interval: µs per unit, rounded up.
pub(crate) fn interval(quota: &Quota) -> u64 {
    quota.window_micros().div_ceil(u64::from(quota.limit()))
}

pub(crate) fn validate(quotas: &[Quota], burst: NonZeroU32) -> Result<(), ConfigError> {
    let [q] = quotas else {
        return Err(ConfigError::GcraQuotas { got: quotas.len() });
    };
    if u64::from(q.limit()) > q.window_micros() {
        return Err(ConfigError::QuotaTooFast {
            limit: q.limit(),
            window: q.window(),
        });
    }
    if interval(q).saturating_mul(u64::from(burst.get())) > MAX_SPAN_MICROS {
        return Err(ConfigError::GcraRefillTooLong {
            burst,
            limit: q.limit(),
            window: q.window(),
        });
    }
    Ok(())
}

/// Decides, and on a pass moves the TAT forward by `cost × T`. A TAT in
/// the past means a full bucket. With `cost == 0` nothing is written.
/// A pass's receipt stamps are the TAT it set and the bucket's `given`.
#[inline]
pub(crate) fn check(
    bucket: &mut Option<Bucket>,
    quota: &Quota,
    burst: u32,
    now: u64,
    cost: u64,
) -> Decision {
    let t = interval(quota);
    let limit = u64::from(burst);
    let tolerance = t * limit;
    let given = bucket.map_or(0, |b| b.given);
    let start = bucket.map_or(now, |b| b.tat.max(now));
    // What could pass right now if the bucket's tat were `at`, rounded down.
    let remaining = |at: u64| tolerance.saturating_sub(at - now) / t;
    let used_now = limit - remaining(start);

    if cost > limit {
        // Never conforms; told to wait until the bucket is full, at least T.
        let retry = (start - now).max(t);
        return Decision::rejected(limit, used_now, start, now, retry);
    }
    let next = start + cost * t;
    if next - now > tolerance {
        return Decision::rejected(limit, used_now, start, now, next - tolerance - now);
    }
    if cost > 0 {
        *bucket = Some(Bucket { tat: next, given });
    }
    Decision::allowed(limit, limit - remaining(next), next, now)
        .with_receipt(Receipt::of(cost, [next, given]).in_units_of(t))
}

/// The µs a unit of `receipt` was charged as: the interval of the policy
/// in force at the charge, which the receipt carries; `quota`'s only for
/// a receipt built without it.
pub(crate) fn unit_of(receipt: &Receipt, quota: &Quota) -> u64 {
    receipt.unit_micros().unwrap_or_else(|| interval(quota))
}

/// Its lease script, built once (`strategy/lease.rs`).
#[cfg(feature = "redis")]
static LEASE: LazyLock<LeaseScripts> = LazyLock::new(|| {
    LeaseScripts::new(
        "gcra_lease",
        "gcra_lease_caller",
        concat!(
            include_str!("../../lua/tat.lua"),
            include_str!("../../lua/gcra_lease.lua")
        ),
    )
});

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    Trio::new(
        "gcra",
        concat!(
            include_str!("../../lua/tat.lua"),
            include_str!("../../lua/gcra.lua")
        ),
        Some(concat!(
            include_str!("../../lua/tat.lua"),
            include_str!("../../lua/kept.lua"),
            include_str!("../../lua/gcra_batch.lua")
        )),
        LuaScript::refund("gcra_refund", super::bucket::REFUND_LUA),
    )
});

/// The GCRA's home (see [`Algorithm`]).
pub(crate) struct Gcra;

/// The burst of `strategy`, a GCRA.
fn burst_of(strategy: &Strategy) -> NonZeroU32 {
    match strategy {
        Strategy::Gcra { burst } => *burst,
        other => unreachable!("the GCRA called for {other:?}"),
    }
}

impl Algorithm for Gcra {
    /// An override's (or a request's) quota sets the burst too: `limit`
    /// units per `window`, up to `limit` at once.
    fn strategy_for(&self, strategy: &Strategy, quotas: &[Quota]) -> Strategy {
        match quotas
            .first()
            .and_then(|q| std::num::NonZeroU32::new(q.limit()))
        {
            Some(burst) => Strategy::Gcra { burst },
            None => strategy.clone(),
        }
    }

    fn max_quotas(&self) -> usize {
        1
    }

    /// The bucket refills only with time, and other requests only drain it,
    /// so the first moment the request fits can only move later.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// `reset_at` is when the bucket is full again, but one unit frees
    /// earlier, one emission interval later.
    fn exhaustion_is_stable(&self) -> bool {
        false
    }

    fn validate(&self, strategy: &Strategy, quotas: &[Quota]) -> Result<(), ConfigError> {
        validate(quotas, burst_of(strategy))
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        let burst = burst_of(policy.strategy());
        shard.update(keys.first(), now, |live, write| {
            let mut bucket = match live {
                Some(State::Tat(b)) => Some(*b),
                _ => None,
            };
            let decision = check(&mut bucket, &policy.quotas()[0], burst.get(), now, cost);
            if let (true, true, Some(b)) = (decision.allowed, cost > 0, bucket) {
                *write = Some((State::Tat(b), b.tat + EXPIRY_GRACE_MICROS));
            }
            decision
        })
    }

    fn give_back(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        if let Some(State::Tat(b)) = shard.get_mut(keys.first(), now) {
            let mut bucket = Some(*b);
            let unit = unit_of(receipt, &policy.quotas()[0]);
            refund(&mut bucket, unit, now, receipt.stamps(), receipt.cost());
            *b = bucket.unwrap_or(*b);
        }
    }

    /// Gives back, and charges an overspend.
    fn settles(&self) -> Settles {
        Settles::Both
    }

    fn charge_more(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
        extra: u64,
    ) {
        let Some(&stamp) = receipt.stamps().first() else {
            return;
        };
        shard.update(keys.first(), now, |live, write| {
            let mut bucket = match live {
                Some(State::Tat(b)) => Some(*b),
                _ => None,
            };
            let unit = unit_of(receipt, &policy.quotas()[0]);
            if charge(&mut bucket, unit, now, stamp, extra)
                && let Some(b) = bucket
            {
                *write = Some((State::Tat(b), b.tat + EXPIRY_GRACE_MICROS));
            }
        })
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
        let burst = burst_of(policy.strategy());
        let args = Args::from_slice(&[
            now.arg(),
            int(cost),
            int(interval(&policy.quotas()[0])),
            int(burst.get()),
        ]);
        (LUA.decide(read_only), args)
    }

    /// A pass's reply carries the T its units were charged in.
    #[cfg(feature = "redis")]
    fn reply(&self, decided: Decided, cost: u64) -> Result<Decision, StoreError> {
        decided.timed(cost)
    }

    #[cfg(feature = "redis")]
    fn lease_scripts(&self) -> Option<&'static LeaseScripts> {
        Some(&LEASE)
    }

    /// One quota leases (see `strategy/lease.rs`).
    #[cfg(feature = "redis")]
    fn lease_spending(&self, policy: &Policy) -> Option<Spending> {
        match policy.quotas() {
            [quota] => Some(Spending::Decaying {
                interval: interval(quota),
            }),
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (
            2,
            Args::from_slice(&[
                int(interval(&policy.quotas()[0])),
                int(burst_of(policy.strategy()).get()),
            ]),
        )
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, policy: &Policy, now: ScriptNow, receipt: &Receipt) -> GiveBack {
        refund_call(policy, now, receipt, signed(receipt.cost()))
    }

    #[cfg(feature = "redis")]
    fn charge_more_call(
        &self,
        policy: &Policy,
        now: ScriptNow,
        receipt: &Receipt,
        extra: u64,
    ) -> Option<GiveBack> {
        Some(refund_call(policy, now, receipt, -signed(extra)))
    }
}

/// `lua/bucket_refund.lua`'s call (`strategy/bucket.rs`), in the units the
/// receipt was charged in.
#[cfg(feature = "redis")]
fn refund_call(policy: &Policy, now: ScriptNow, receipt: &Receipt, units: i64) -> GiveBack {
    let unit = unit_of(receipt, &policy.quotas()[0]);
    super::bucket::refund_call(&LUA.refund, now, unit, receipt, units)
}

impl Policy {
    /// GCRA, a token bucket as in redis-cell: refilled at `rate` (`limit` per
    /// `window`), holding up to `burst` units (redis-cell's `max_burst + 1`).
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    ///
    /// // 1 per second on average, up to 5 at once.
    /// let rate = Quota::per_second(NonZeroU32::new(1).unwrap());
    /// let policy = Policy::gcra("feeding", rate, NonZeroU32::new(5).unwrap());
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn gcra(name: impl Into<Arc<str>>, rate: Quota, burst: NonZeroU32) -> Self {
        Self::new(name, Strategy::Gcra { burst }, rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_full_bucket_passes_burst_then_one_per_interval() {
        let quota = Quota::new(1, Duration::from_secs(1)).unwrap();
        let mut bucket = None;
        for left in (0..3).rev() {
            assert_eq!(check(&mut bucket, &quota, 3, 0, 1).remaining, left);
        }
        let d = check(&mut bucket, &quota, 3, 0, 1);
        assert_eq!(d.retry_after, Some(Duration::from_secs(1)));
        assert_eq!(d.reset_at_micros, 3_000_000, "full again at tat");
        assert!(check(&mut bucket, &quota, 3, 1_000_000, 1).allowed);
    }

    #[test]
    fn interval_rounds_up_so_the_rate_is_never_above_the_quota() {
        let quota = Quota::new(3, Duration::from_secs(10)).unwrap();
        assert_eq!(interval(&quota), 3_333_334);
        assert!(validate(&[quota], NonZeroU32::new(1).unwrap()).is_ok());
        let too_fast = Quota::new(2_000, Duration::from_millis(1)).unwrap();
        assert!(validate(&[too_fast], NonZeroU32::new(1).unwrap()).is_err());
    }
}
