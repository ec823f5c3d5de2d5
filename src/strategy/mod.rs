//! The algorithms, as plain Rust: the reference model.
//!
//! Every strategy exists twice: here, run by [`MemoryStore`](crate::MemoryStore)
//! under a lock, and as a Lua script in `lua/`, run atomically by Redis. The
//! conformance suite in `tests/` proves the two decide alike.
//!
//! `<name>.rs` is everything one strategy knows: its model, its memory
//! state's handling, its scripts and how their arguments are encoded and
//! their replies read, its refund, its flags. The stores reach it only
//! through [`Algorithm`], found by [`Strategy::algorithm`]. A new strategy
//! is that file, its Lua (`lua/<name>.lua`, the body of a function
//! `decide(KEYS, ARGV, dry_run)`; optionally `lua/<name>_batch.lua`, a batch
//! that reads and writes each key once per call), its conformance rows, a
//! variant of [`Strategy`], a [`Policy`] constructor, a line in [`ALL`]
//! and in [`Strategy::algorithm`], and, if its state is of a new shape, a
//! variant of the memory store's [`State`](crate::store::memory::State)
//! (`store/memory/shard.rs`); `docs/strategies.md` says how the scripts
//! are put together.

pub(crate) mod aligned_window;
pub(crate) mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod uniform_gate;

use std::num::NonZeroU32;

use crate::decision::{Decision, Receipt, Scope};
use crate::error::ConfigError;
#[cfg(feature = "redis")]
use crate::error::StoreError;
use crate::quota::{Policy, Quota};
use crate::store::memory::KeyNames;
use crate::store::memory::Shard;
#[cfg(feature = "redis")]
use crate::store::redis::{
    reply::Ints,
    script::{LuaScript, Trio},
    Args, GiveBack,
};

/// The longest any state may matter: a year and a day, in µs.
pub(crate) const MAX_SPAN_MICROS: u64 = 366 * 24 * 3600 * 1_000_000;

/// Which algorithm a [`Policy`] uses.
///
/// Each variant documents what `X-RateLimit-Remaining` and `-Reset` mean for
/// it, and what it costs in Redis. The constructors on
/// [`Policy`] (`fixed_window`, `aligned_window`, `uniform_gate`,
/// `sliding_log`, `sliding_window`, `gcra`, `leaky_bucket`, `concurrency`)
/// are the usual way to pick one.
///
/// ```
/// use std::num::NonZeroU32;
/// use tollgate::Strategy;
/// assert_eq!(Strategy::FixedWindow.as_str(), "fixed_window");
/// let capacity = NonZeroU32::new(10).unwrap();
/// assert_eq!(Strategy::LeakyBucket { capacity }.as_str(), "leaky_bucket");
/// assert_eq!(Strategy::Concurrency.as_str(), "concurrency");
/// assert_eq!(Strategy::Gcra { burst: NonZeroU32::new(5).unwrap() }.as_str(), "gcra");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// GitHub's fixed window. The first request opens a window and stores its
    /// end (`reset_at`) beside the counter; later requests read it back.
    /// `Remaining` is what is left in this window, `Reset` its stored end.
    /// Costs one `EVALSHA` (an `HMGET`, and for a pass `HSET` + `PEXPIRE` per
    /// quota) and one small hash per quota and key.
    FixedWindow,
    /// One call per caller per span (the quota's window; its limit must be 1).
    /// A pass closes the gate until `now + cost × span`, to the microsecond.
    /// `Remaining` is 1 while open, 0 while closed; `Reset` is when it opens
    /// again. Costs one `EVALSHA` running a `GET` (and for a pass a `SET PX`)
    /// and one short string per key.
    UniformGate,
    /// An exact sliding-window log with two limits at once: quota 0 is shared
    /// by every caller of the resource, quota 1 is each caller's own. Both
    /// logs are checked and charged together, or neither is. `Remaining` is
    /// what is left of the tighter limit; `Reset` is when that log is empty
    /// again (its newest entry leaves the window). Costs one `EVALSHA` (per
    /// log a `ZCOUNT` and a `ZRANGE`; on a pass `ZREMRANGEBYSCORE`, `ZADD`,
    /// `PEXPIRE`), and one sorted-set entry per unit spent in the window, so
    /// at most `limit` entries per log.
    SlidingLog,
    /// Cloudflare's sliding-window counter: two fixed-window counters (the
    /// windows aligned on the epoch), the previous one weighted by how much
    /// of it the sliding window still covers. `Remaining` is the limit minus
    /// that estimate, rounded down; `Reset` is when the estimate is back to
    /// zero (the end of the next window once this one has a charge).
    /// Costs one `EVALSHA` (`HMGET`; on a pass `HSET` + `PEXPIRE` per quota)
    /// and one three-field hash per quota and key, whatever the traffic.
    SlidingWindow,
    /// The generic cell rate algorithm, a token bucket as in redis-cell: the
    /// quota's rate (`limit` per `window`) refills a bucket of `burst` units.
    /// `Remaining` is how many units could pass right now; `Reset` is when the
    /// bucket is full again (the theoretical arrival time). Costs one
    /// `EVALSHA` (`GET`; on a pass `SET PX`) and one short string per key.
    Gcra {
        /// How many units may pass at once from a full bucket (redis-cell's
        /// `max_burst + 1`), and `X-RateLimit-Limit`.
        burst: NonZeroU32,
    },
    /// A leaky bucket that shapes traffic: requests leave at the quota's
    /// rate (one every `window / limit`, rounded up to the microsecond, so
    /// never faster), across all app servers. A request that finds the
    /// bucket holding `capacity` requests is rejected; any other waits for
    /// its turn (the layer sleeps without blocking the runtime) and then
    /// proceeds. A burst of `capacity` is accepted, spaced out by the rate.
    /// The longest wait is `capacity - 1` intervals: keep your server's and
    /// clients' request timeouts above it.
    ///
    /// `Limit` is `capacity`, `Remaining` the free places in the bucket,
    /// `Used` the places taken (requests waiting or leaving), `Reset` when the
    /// bucket will be empty. A rejection's `Retry-After` is when one more
    /// request fits. The decision's [`delay`](crate::Decision::delay) is the
    /// wait.
    ///
    /// Costs one `EVALSHA` (`GET`, and for a pass `SET .. PX`), one more to
    /// give a place back, and one string per key (the time the bucket
    /// empties, µs; about 100 bytes), expiring a second after the bucket
    /// empties. Build with
    /// [`Policy::leaky_bucket`](crate::Policy::leaky_bucket).
    LeakyBucket {
        /// How many requests the bucket holds: the longest wait is
        /// `capacity - 1` intervals.
        capacity: NonZeroU32,
    },
    /// Stripe's concurrent-request limiter: at most `limit` requests of a
    /// key in flight at once, across all app servers. The quota's window is
    /// the timeout after which an entry of a crashed app server stops
    /// counting; it must be longer than your slowest response. A slot is
    /// released when the response body ends or is dropped, when the request
    /// is cancelled, or after the timeout.
    ///
    /// `Limit` is the number of slots, `Remaining` the free slots, `Used`
    /// the requests in flight, `Reset` the time by which every slot held now
    /// is certain to be free (the newest in-flight request's start plus the
    /// timeout; now when none is in flight). Slots free when responses end,
    /// which no store can foresee, so a rejection's `Retry-After` is a hint:
    /// one second, or sooner if the oldest entry times out sooner.
    ///
    /// Costs one `EVALSHA` per request (`ZREMRANGEBYSCORE`, `ZCOUNT`,
    /// `ZREVRANGEBYSCORE`, and for a rejection a `ZRANGEBYSCORE`, for a pass
    /// `ZADD` + `PEXPIRE`) and one for the
    /// release (`ZREM`); one sorted set per key holding at most `limit`
    /// members (about 150 bytes for one, 30 more per slot up to 128 slots,
    /// about 120 per slot beyond), expiring one timeout after the last
    /// admission. Build with [`Policy::concurrency`](crate::Policy::concurrency).
    Concurrency,
    /// A fixed window aligned on the Unix epoch, as limits (Python) and
    /// Upstash ship it: a quota's windows end at multiples of its length,
    /// so every server and client knows `Reset` in advance ("1,000 per UTC
    /// day, reset at midnight"). `Remaining` is what is left in this
    /// window, `Reset` its end. Costs one `EVALSHA` (an `HMGET`, and for a
    /// pass `HINCRBY`, or `HSET` + `PEXPIRE` when the window is new, per
    /// quota) and one small hash per quota and key.
    AlignedWindow,
}

/// Every strategy's home, in the order of [`Strategy`]'s variants: what
/// lists every script ([`RedisStore::scripts`](crate::RedisStore::scripts)).
/// A new strategy adds a line here and an arm to [`Strategy::algorithm`].
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const ALL: [&dyn Algorithm; 8] = [
    &fixed_window::FixedWindow,
    &uniform_gate::UniformGate,
    &sliding_log::SlidingLog,
    &sliding_window::SlidingWindow,
    &gcra::Gcra,
    &leaky_bucket::LeakyBucket,
    &concurrency::Concurrency,
    &aligned_window::AlignedWindow,
];

impl Strategy {
    /// A short stable name, for logs, metrics and Redis keys.
    pub fn as_str(&self) -> &'static str {
        self.algorithm().name()
    }

    /// The one home of this strategy, which the stores call: the one
    /// registration of each strategy. A call through it is one indirect
    /// call, where a `match` was a jump table.
    pub(crate) fn algorithm(&self) -> &'static dyn Algorithm {
        match self {
            Strategy::FixedWindow => &fixed_window::FixedWindow,
            Strategy::UniformGate => &uniform_gate::UniformGate,
            Strategy::SlidingLog => &sliding_log::SlidingLog,
            Strategy::SlidingWindow => &sliding_window::SlidingWindow,
            Strategy::Gcra { .. } => &gcra::Gcra,
            Strategy::LeakyBucket { .. } => &leaky_bucket::LeakyBucket,
            Strategy::Concurrency => &concurrency::Concurrency,
            Strategy::AlignedWindow => &aligned_window::AlignedWindow,
        }
    }

    /// How many quotas one decision of this strategy can check at once.
    pub(crate) fn max_quotas(&self) -> usize {
        self.algorithm().max_quotas()
    }

    /// Whose budget quota `i` is.
    pub(crate) fn scope_of(&self, quota: usize) -> Scope {
        self.algorithm().scope_of(quota)
    }

    /// Whether some quota is shared by every caller: then all keys of the
    /// policy share one hash tag (one Redis Cluster slot, one memory shard).
    pub(crate) fn has_resource_quota(&self) -> bool {
        self.algorithm().has_resource_quota()
    }

    /// See [`Algorithm::rejection_is_stable`].
    pub(crate) fn rejection_is_stable(&self) -> bool {
        self.algorithm().rejection_is_stable()
    }

    /// See [`Algorithm::exhaustion_is_stable`].
    pub(crate) fn exhaustion_is_stable(&self) -> bool {
        self.algorithm().exhaustion_is_stable()
    }

    /// Whether a pass holds its charge until the response ends (and gives it
    /// back then), rather than spending it.
    pub(crate) fn holds_until_response_ends(&self) -> bool {
        self.algorithm().holds_until_response_ends()
    }

    pub(crate) fn validate(&self, quotas: &[Quota]) -> Result<(), ConfigError> {
        self.algorithm().validate(self, quotas)
    }
}

/// Everything the rest of the crate asks of one strategy, answered in the
/// strategy's own file: its flags, its memory state, its Redis calls.
/// Each strategy is a unit struct; a strategy with parameters reads them
/// from the [`Strategy`] it is given.
pub(crate) trait Algorithm: Sync {
    /// See [`Strategy::as_str`].
    fn name(&self) -> &'static str;

    /// How many quotas one decision of this strategy can check at once.
    fn max_quotas(&self) -> usize;

    /// Whose budget quota `i` is.
    fn scope_of(&self, _quota: usize) -> Scope {
        Scope::Consumer
    }

    /// Whether some quota is shared by every caller: then all keys of the
    /// policy share one hash tag (one Redis Cluster slot, one memory shard).
    fn has_resource_quota(&self) -> bool {
        false
    }

    /// Whether a rejection stays true until its `retry_after` for requests
    /// costing at least as much, whatever else happens to the key (refunds
    /// aside), so the layer's local cache may repeat it without the store.
    fn rejection_is_stable(&self) -> bool;

    /// Whether a pass with nothing left means every request is rejected
    /// until `reset_at`.
    fn exhaustion_is_stable(&self) -> bool;

    /// Whether a pass holds its charge until the response ends (and gives it
    /// back then), rather than spending it.
    fn holds_until_response_ends(&self) -> bool {
        false
    }

    /// Whether `quotas` suit `strategy` (this strategy, with its parameters).
    fn validate(&self, _strategy: &Strategy, _quotas: &[Quota]) -> Result<(), ConfigError> {
        Ok(())
    }

    /// The memory store's decision, under the lock of `shard`, which holds
    /// the decision's keys (named `keys`, one per quota): this strategy's
    /// [`State`](crate::store::memory::State) read, checked by the model
    /// and written back with its expiry. The decision says whose budget its
    /// reported quota is ([`Decision::scoped`], by
    /// [`scope_of`](Self::scope_of)).
    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision;

    /// The memory store's refund of `receipt`, under the lock of `shard`.
    fn give_back(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    );

    /// The strategy's scripts: its decision, its no-writes twin, its refund
    /// or release.
    #[cfg(feature = "redis")]
    fn lua(&self) -> &'static Trio;

    /// The Redis store's decision: the script to run (the no-writes twin
    /// when `read_only`) and its arguments, `now` (µs, or -1 for Redis
    /// `TIME`) and `cost` first. The keys are the policy's quota keys.
    #[cfg(feature = "redis")]
    fn call(
        &self,
        policy: &Policy,
        now: i64,
        cost: u64,
        read_only: bool,
    ) -> (&'static LuaScript, Args);

    /// The Redis store's refund of `receipt`, at `now` (µs, or -1 for Redis
    /// `TIME`), on the policy's quota keys.
    #[cfg(feature = "redis")]
    fn give_back_call(&self, policy: &Policy, now: i64, receipt: &Receipt) -> GiveBack;

    /// What a decision script's reply `ints` means.
    #[cfg(feature = "redis")]
    fn reply(&self, ints: Ints, cost: u64) -> Result<Decision, StoreError> {
        crate::store::redis::reply::decision(ints, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_strategy_once_in_the_variants_order() {
        let one = NonZeroU32::MIN;
        let every = [
            Strategy::FixedWindow,
            Strategy::UniformGate,
            Strategy::SlidingLog,
            Strategy::SlidingWindow,
            Strategy::Gcra { burst: one },
            Strategy::LeakyBucket { capacity: one },
            Strategy::Concurrency,
            Strategy::AlignedWindow,
        ];
        assert_eq!(every.len(), ALL.len());
        for (strategy, algorithm) in every.iter().zip(ALL) {
            assert_eq!(strategy.as_str(), algorithm.name());
        }
    }
}
