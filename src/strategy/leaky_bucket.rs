//! A leaky bucket that shapes traffic, as "virtual scheduling".
//!
//! Mirrors `lua/leaky_bucket.lua` line for line; change them together. A
//! give-back moves `next_free` back as GCRA's TAT (`strategy/bucket.rs`).
//!
//! The state is `next_free` (with what refunds gave back, kept for them):
//! the time (µs) at which the bucket will be
//! empty, which is also the earliest time the next request may leave. A
//! request of cost `c` arriving at `now` leaves at `start = max(now,
//! next_free)` and pushes `next_free` to `start + c·T`, where `T` is the
//! interval between two requests. The bucket's *level* is `next_free - now`
//! (in µs of queue); a request fits when the level after it is at most
//! `capacity·T`. So a burst of `capacity` requests into an empty bucket is
//! accepted and they leave at `now, now + T, now + 2T, ...`: never faster
//! than the rate, across every app server sharing the store.

use std::num::NonZeroU32;
use std::sync::Arc;

use super::bucket::{charge, refund, Bucket};
#[cfg(feature = "redis")]
use super::fixed_window::signed;
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

/// Keys live one second past the time the bucket empties (cleanup only).
pub(crate) const EXPIRY_GRACE_MICROS: u64 = 1_000_000;

/// The longest queue a bucket may describe, so that every time it stores
/// stays an exact integer in Lua's doubles.
const MAX_QUEUE_MICROS: u64 = 366 * 24 * 3600 * 1_000_000;

/// The interval between two requests: the quota's window over its limit,
/// rounded *up* to the microsecond so the rate is never exceeded.
pub(crate) fn interval_micros(quota: &Quota) -> u64 {
    quota
        .window_micros()
        .div_ceil(u64::from(quota.limit()))
        .max(1)
}

pub(crate) fn validate(quota: &Quota, capacity: NonZeroU32) -> Result<(), ConfigError> {
    let queue = interval_micros(quota).saturating_mul(u64::from(capacity.get()));
    if queue > MAX_QUEUE_MICROS {
        return Err(ConfigError::LeakyBucketTooLong {
            capacity,
            limit: quota.limit(),
            window: quota.window(),
        });
    }
    Ok(())
}

/// Decides, and on a pass with `cost > 0` moves `next_free`.
///
/// A stored `next_free` that is not after `now` is an empty bucket. The
/// pass's receipt stamps are the time its slot ends (the new `next_free`)
/// and the bucket's `given` (see `strategy/bucket.rs`).
pub(crate) fn check(
    bucket: &mut Option<Bucket>,
    capacity: u64,
    interval: u64,
    now: u64,
    cost: u64,
) -> Decision {
    let given = bucket.map_or(0, |b| b.given);
    let free_at = bucket.map(|b| b.tat).filter(|&t| t > now).unwrap_or(now);
    let level = free_at - now;
    let full = capacity * interval;
    let after = level + cost * interval;
    if after > full {
        let used = level.div_ceil(interval).min(capacity);
        return Decision::rejected(capacity, used, free_at, now, after - full);
    }
    let end = free_at + cost * interval;
    if cost > 0 {
        *bucket = Some(Bucket { tat: end, given });
    }
    Decision::allowed(capacity, after.div_ceil(interval), end, now)
        .delayed(level)
        .with_receipt(Receipt::of(cost, [end, given]).in_units_of(interval))
}

/// The µs a unit of `receipt` was charged as: the interval of the policy
/// in force at the charge, which the receipt carries; `quota`'s only for
/// a receipt built without it.
fn unit_of(receipt: &Receipt, quota: &Quota) -> u64 {
    receipt
        .unit_micros()
        .unwrap_or_else(|| interval_micros(quota))
}

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    Trio::new(
        "leaky_bucket",
        concat!(
            include_str!("../../lua/tat.lua"),
            include_str!("../../lua/leaky_bucket.lua")
        ),
        Some(concat!(
            include_str!("../../lua/tat.lua"),
            include_str!("../../lua/kept.lua"),
            include_str!("../../lua/leaky_bucket_batch.lua")
        )),
        LuaScript::refund("leaky_bucket_refund", super::bucket::REFUND_LUA),
    )
});

/// The leaky bucket's home (see [`Algorithm`]).
pub(crate) struct LeakyBucket;

/// The capacity of `strategy`, a leaky bucket.
fn capacity_of(strategy: &Strategy) -> NonZeroU32 {
    match strategy {
        Strategy::LeakyBucket { capacity } => *capacity,
        other => unreachable!("the leaky bucket called for {other:?}"),
    }
}

impl Algorithm for LeakyBucket {
    /// An override's (or a request's) quota sets the capacity too: `limit`
    /// units per `window`, up to `limit` at once.
    fn strategy_for(&self, strategy: &Strategy, quotas: &[Quota]) -> Strategy {
        match quotas
            .first()
            .and_then(|q| std::num::NonZeroU32::new(q.limit()))
        {
            Some(capacity) => Strategy::LeakyBucket { capacity },
            None => strategy.clone(),
        }
    }

    fn max_quotas(&self) -> usize {
        1
    }

    /// The level only drains at the rate, and only other requests raise it.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// A place frees one interval later, long before the bucket is empty.
    fn exhaustion_is_stable(&self) -> bool {
        false
    }

    fn validate(&self, strategy: &Strategy, quotas: &[Quota]) -> Result<(), ConfigError> {
        let capacity = capacity_of(strategy);
        quotas.iter().try_for_each(|q| validate(q, capacity))
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        let capacity = capacity_of(policy.strategy());
        let interval = interval_micros(&policy.quotas()[0]);
        let mut bucket = match shard.get(keys.first(), now) {
            Some(State::Leaky(b)) => Some(*b),
            _ => None,
        };
        let capacity = u64::from(capacity.get());
        let d = check(&mut bucket, capacity, interval, now, cost);
        if let (true, Some(b)) = (d.allowed && cost > 0, bucket) {
            let expires = b.tat + EXPIRY_GRACE_MICROS;
            shard.put(keys.first(), State::Leaky(b), expires);
        }
        d
    }

    fn give_back(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        let interval = unit_of(receipt, &policy.quotas()[0]);
        if let Some(State::Leaky(b)) = shard.get_mut(keys.first(), now) {
            let mut bucket = Some(*b);
            refund(&mut bucket, interval, now, receipt.stamps(), receipt.cost());
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
        let interval = unit_of(receipt, &policy.quotas()[0]);
        let mut bucket = match shard.get(keys.first(), now) {
            Some(State::Leaky(b)) => Some(*b),
            _ => None,
        };
        let stamp = receipt.stamps().first().copied().unwrap_or(0);
        if charge(&mut bucket, interval, now, stamp, extra)
            && let Some(b) = bucket
        {
            shard.put(keys.first(), State::Leaky(b), b.tat + EXPIRY_GRACE_MICROS);
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
        let capacity = capacity_of(policy.strategy());
        let script = LUA.decide(read_only);
        let args = Args::from_slice(&[
            now.arg(),
            int(cost),
            int(capacity.get()),
            int(interval_micros(&policy.quotas()[0])),
        ]);
        (script, args)
    }

    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (
            2,
            Args::from_slice(&[
                int(capacity_of(policy.strategy()).get()),
                int(interval_micros(&policy.quotas()[0])),
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

    /// The reply of a shaping decision, with its delay.
    #[cfg(feature = "redis")]
    fn reply(&self, decided: Decided, cost: u64) -> Result<Decision, StoreError> {
        decided.shaped(cost)
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
    /// A leaky bucket that shapes traffic to `rate` (`rate.limit()` per
    /// `rate.window()`, evenly spaced) and holds at most `capacity` requests:
    /// a request that fits waits for its turn, one that does not gets a 429.
    /// See [`Strategy::LeakyBucket`].
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, Strategy};
    ///
    /// // 10 per second, one every 100 ms; at most 20 waiting (2 s of queue).
    /// let rate = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// let policy = Policy::leaky_bucket("feeding", rate, NonZeroU32::new(20).unwrap());
    /// assert!(matches!(policy.strategy(), Strategy::LeakyBucket { .. }));
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn leaky_bucket(name: impl Into<Arc<str>>, rate: Quota, capacity: NonZeroU32) -> Self {
        Self::new(name, Strategy::LeakyBucket { capacity }, rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const T: u64 = 100_000; // 10 per second

    #[test]
    fn a_burst_of_capacity_is_spaced_by_the_interval_and_the_rest_rejected() {
        let mut nf = None;
        let mut starts = Vec::new();
        for _ in 0..4 {
            let d = check(&mut nf, 4, T, 1_000_000, 1);
            assert!(d.allowed);
            starts.push(1_000_000 + d.delay.map_or(0, |d| d.as_micros() as u64));
        }
        assert_eq!(starts, [1_000_000, 1_100_000, 1_200_000, 1_300_000]);
        let d = check(&mut nf, 4, T, 1_000_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_micros(T)));
        assert_eq!(d.reset_at_micros, 1_400_000);
    }

    #[test]
    fn the_interval_rounds_up_so_the_rate_is_never_exceeded() {
        let q = Quota::new(3, Duration::from_secs(1)).unwrap();
        assert_eq!(interval_micros(&q), 333_334);
    }

    #[test]
    fn a_year_long_queue_cannot_be_built() {
        let q = Quota::new(1, Duration::from_secs(3600)).unwrap();
        assert!(validate(&q, NonZeroU32::new(10_000).unwrap()).is_err());
        assert!(validate(&q, NonZeroU32::new(100).unwrap()).is_ok());
    }
}
