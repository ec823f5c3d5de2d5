//! Stripe's concurrent-request limiter: at most `limit` in flight per key.
//!
//! Mirrors `lua/concurrency.lua` and `lua/concurrency_release.lua` line for
//! line; change them together.
//!
//! In Redis the state is a sorted set of in-flight requests scored by their
//! start (µs); a request of cost `c` adds `c` members `{id}:0 .. {id}:c-1`.
//! Entries older than the timeout belong to app servers that crashed before
//! releasing them: they stop counting, and a writing check removes them.

use crate::error::ConfigError;
use crate::policy::Strategy;
use crate::quota::Quota;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use super::{Algorithm, Settles};
use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::{InFlight, Slot, State};
#[cfg(feature = "redis")]
use crate::store::redis::args::{int, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};

/// A rejection's `Retry-After` hint: slots free when responses end, which
/// no store can foresee.
pub(crate) const RETRY_HINT_MICROS: u64 = 1_000_000;

/// A fresh id for a request's slot: random, below 2^53 so Lua returns it
/// exactly, and never chosen by the caller.
pub(crate) fn new_id() -> u64 {
    static KEYS: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    KEYS.hash_one(COUNTER.fetch_add(1, Ordering::Relaxed)) >> 11
}

/// Decides for `cost` slots; on a pass with `cost > 0` records request `id`
/// as started at `now`. Entries started at or before `now - timeout` do not
/// count and, when writing, are dropped.
pub(crate) fn check(
    set: &mut InFlight,
    limit: u64,
    timeout: u64,
    now: u64,
    cost: u64,
    id: u64,
) -> Decision {
    let floor = now.saturating_sub(timeout);
    if cost > 0 {
        set.slots.retain(|s| s.started > floor);
    }
    let live = || set.slots.iter().filter(|s| s.started > floor);
    let count: u64 = live().map(|s| s.cost).sum();
    let oldest = live().map(|s| s.started).min();
    let newest = live().map(|s| s.started).max();

    if count + cost > limit {
        let reset = newest.map_or(now, |t| t + timeout);
        let retry = oldest.map_or(RETRY_HINT_MICROS, |t| {
            (t + timeout - now).min(RETRY_HINT_MICROS)
        });
        return Decision::rejected(limit, count.min(limit), reset, now, retry);
    }
    let (count, newest) = if cost > 0 {
        set.slots.push(Slot {
            id,
            started: now,
            cost,
        });
        (count + cost, Some(newest.map_or(now, |t| t.max(now))))
    } else {
        (count, newest)
    };
    let reset = newest.map_or(now, |t| t + timeout);
    Decision::allowed(limit, count, reset, now).with_receipt(Receipt::of(cost, [id]))
}

/// Frees request `id`'s slots (a no-op when they are gone already).
pub(crate) fn release(set: &mut InFlight, id: u64) {
    set.slots.retain(|s| s.id != id);
}

/// How long a key lives after an admission: one timeout, in whole ms as
/// `PEXPIRE` takes it, by which every entry it holds is stale.
pub(crate) fn expiry_micros(timeout: u64) -> u64 {
    timeout.div_ceil(1000) * 1000
}

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    let batch = include_str!("../../lua/concurrency_batch.lua");
    // Not a check, but the release batches as one, in the checks' own
    // batch script: a crowd releases its slots as fast as it takes them,
    // and both go out in one call. Its request id is `ARGV[1]` of
    // `lua/concurrency_release.lua`.
    let release = LuaScript::packed(
        "concurrency_release",
        include_str!("../../lua/concurrency_release.lua"),
    )
    .batched(LuaScript::batch_with("concurrency_batch", batch))
    .taking_id_at(0);
    let trio = Trio::new(
        "concurrency",
        include_str!("../../lua/concurrency.lua"),
        Some(batch),
        release,
    );
    // The request id is `ARGV[5]` of `lua/concurrency.lua`.
    Trio {
        check: trio.check.taking_id_at(4).holding(release_of),
        // No request id for batches: each decision of a caller with rules
        // runs alone in its batch, with its own arguments.
        caller_check: trio.caller_check.holding(release_of),
        ..trio
    }
});

/// What gives back the slots a pass of `lua/concurrency.lua` took with
/// `args`: `lua/concurrency_release.lua` with the id and cost (the check's
/// `ARGV[5]` and `ARGV[2]`).
#[cfg(feature = "redis")]
fn release_of(args: &[i64]) -> Option<(&'static LuaScript, Args)> {
    let (&cost, &id) = (args.get(1)?, args.get(4)?);
    Some((&LUA.refund, Args::from_slice(&[id, cost])))
}

/// `lua/concurrency_release.lua`, which frees a slot (the batcher's tests
/// send it directly).
#[cfg(all(test, feature = "deadpool"))]
pub(crate) fn release_script() -> &'static LuaScript {
    &LUA.refund
}

/// The concurrency limit's home (see [`Algorithm`]).
pub(crate) struct Concurrency;

impl Algorithm for Concurrency {
    fn max_quotas(&self) -> usize {
        1
    }

    /// A slot frees whenever a response ends.
    fn rejection_is_stable(&self) -> bool {
        false
    }

    /// A slot frees whenever a response ends.
    fn exhaustion_is_stable(&self) -> bool {
        false
    }

    fn holds_until_response_ends(&self) -> bool {
        true
    }

    /// A slot is held, not spent, and given back when the response ends:
    /// there is no cost to settle.
    fn settles(&self) -> Settles {
        Settles::Nothing
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        let quota = policy.quotas()[0];
        let (limit, timeout) = (u64::from(quota.limit()), quota.window_micros());
        let mut set = match shard.get(keys.first(), now) {
            Some(State::InFlight(set)) => set.clone(),
            _ => InFlight::default(),
        };
        let id = new_id();
        let d = check(&mut set, limit, timeout, now, cost, id);
        if d.allowed && cost > 0 {
            let expires = now + expiry_micros(timeout);
            shard.put(keys.first(), State::InFlight(set), expires);
        }
        d
    }

    fn give_back(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        if let Some(State::InFlight(set)) = shard.get_mut(keys.first(), now) {
            let id = receipt.stamps().first().copied().unwrap_or(0);
            release(set, id);
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
        let script = LUA.decide(read_only);
        let quota = policy.quotas()[0];
        let args = Args::from_slice(&[
            now.arg(),
            int(cost),
            int(quota.limit()),
            int(quota.window_micros()),
            int(new_id()),
        ]);
        (script, args)
    }

    /// `lua/concurrency_release.lua`'s arguments: the slot's id and cost.
    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (
            2,
            Args::from_slice(&[
                int(policy.quotas()[0].limit()),
                int(policy.quotas()[0].window_micros()),
            ]),
        )
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, _policy: &Policy, _now: ScriptNow, receipt: &Receipt) -> GiveBack {
        let id = receipt.stamps().first().copied().unwrap_or(0);
        let args = Args::from_slice(&[int(id), int(receipt.cost())]);
        GiveBack::Release(&LUA.refund, args)
    }
}

impl Policy {
    /// At most `limit` requests of a key in flight at once (Stripe's
    /// concurrent-request limiter). An app server that crashes holding slots
    /// gets them back after `timeout`, which must be longer than your slowest
    /// response. See [`Strategy::Concurrency`].
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::Policy;
    ///
    /// let policy = Policy::concurrency("uploads", NonZeroU32::new(3).unwrap(), Duration::from_secs(60))
    ///     .unwrap();
    /// assert_eq!(policy.quotas()[0].limit(), 3);
    /// assert!(Policy::concurrency("uploads", NonZeroU32::new(3).unwrap(), Duration::ZERO).is_err());
    /// ```
    pub fn concurrency(
        name: impl Into<Arc<str>>,
        limit: NonZeroU32,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let slots = Quota::with_window(limit, timeout)?;
        Ok(Self::new(name, Strategy::Concurrency, slots))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TIMEOUT: u64 = 60_000_000;

    #[test]
    fn admits_up_to_the_limit_and_releases_by_id() {
        let mut set = InFlight::default();
        let a = check(&mut set, 2, TIMEOUT, 1_000, 1, 7);
        let b = check(&mut set, 2, TIMEOUT, 2_000, 1, 8);
        assert!(a.allowed && b.allowed);
        assert_eq!(b.remaining, 0);
        assert!(!check(&mut set, 2, TIMEOUT, 3_000, 1, 9).allowed);
        release(&mut set, 7);
        let c = check(&mut set, 2, TIMEOUT, 4_000, 1, 9);
        assert!(c.allowed);
        assert_eq!(c.receipt.stamps(), &[9]);
    }

    #[test]
    fn entries_of_crashed_servers_stop_counting_after_the_timeout() {
        let (mut set, t0) = (InFlight::default(), 1_000_000);
        assert!(check(&mut set, 1, TIMEOUT, t0, 1, 1).allowed);
        let d = check(&mut set, 1, TIMEOUT, t0 + TIMEOUT - 1, 1, 2);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_micros(1)));
        assert!(check(&mut set, 1, TIMEOUT, t0 + TIMEOUT, 1, 3).allowed);
        assert_eq!(set.slots.len(), 1, "the stale entry was dropped");
    }

    #[test]
    fn ids_differ_and_fit_a_lua_number() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| new_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|&id| id < 1 << 53));
    }
}
