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
//! variant of the memory store's `State` (`store/memory/state.rs`);
//! `docs/strategies.md` says how the scripts are put together.
//!
//! This module stands above the stores' parts (the memory shard and its
//! state, the Redis script, arguments and reply) and below the stores,
//! which dispatch through [`Algorithm`]; `tests/layers.rs` keeps it so.

pub(crate) mod aligned_window;
pub(crate) mod bucket;
pub(crate) mod concurrency;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
pub(crate) mod leaky_bucket;
#[cfg(feature = "redis")]
pub(crate) mod lease;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod uniform_gate;

use std::sync::Arc;

use crate::decision::{Decision, Receipt, Scope};
use crate::error::ConfigError;
#[cfg(feature = "redis")]
use crate::error::StoreError;
use crate::policy::{Policy, Strategy};
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::Shard;
#[cfg(feature = "redis")]
use crate::store::redis::{
    args::{GiveBack, ScriptNow},
    reply::Decided,
    script::{Args, LuaScript, Trio},
};

/// The longest any state may matter: a year and a day, in µs.
pub(crate) const MAX_SPAN_MICROS: u64 = 366 * 24 * 3600 * 1_000_000;

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

impl Policy {
    /// Checks what the types cannot: a usable name and a quota count the
    /// strategy supports. Called by the layer's and the stores' builders.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    /// let q = Quota::per_second(NonZeroU32::new(1).unwrap());
    /// assert!(Policy::fixed_window("core", q).validate().is_ok());
    /// assert!(Policy::fixed_window("", q).validate().is_err());
    /// assert!(Policy::fixed_window("bad name", q).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = !self.name().is_empty()
            && self.name().len() <= 64
            && self
                .name()
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
        if !name_ok {
            return Err(ConfigError::PolicyName {
                name: self.name().to_owned(),
            });
        }
        let max = self.strategy().max_quotas();
        if self.quotas().len() > max {
            return Err(ConfigError::TooManyQuotas {
                strategy: self.strategy().as_str(),
                policy: self.name().to_owned(),
                max,
                got: self.quotas().len(),
            });
        }
        self.strategy().validate(self.quotas())
    }
}

/// What settling a pass to its actual cost does under a strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settles {
    /// Gives back what was charged over the actual cost, and charges what
    /// was under it, to what the pass charged.
    Both,
    /// Gives back what was charged over the actual cost; a cost above the
    /// charge is not charged (the sliding log: its entries are one per
    /// unit, bounded by its limit).
    GiveBack,
    /// Nothing to settle: what a pass holds is given back when its
    /// response ends (the concurrency limit).
    Nothing,
}

impl Strategy {
    /// Why a settle cannot apply under this strategy, if it cannot: the
    /// concurrency limit's slots are held, not spent.
    pub(crate) fn settle_refused(&self) -> Option<crate::error::StoreError> {
        (self.algorithm().settles() == Settles::Nothing).then(|| {
            crate::error::StoreError::new(
                crate::error::StoreErrorKind::Rejected,
                format!(
                    "a {} policy holds what a pass takes until its response ends: nothing to settle",
                    self.as_str()
                ),
            )
        })
    }
}

impl Policy {
    /// This policy judging by `quotas` instead (an override, a quota that
    /// came with the request): the same name, so the same state; the
    /// strategy says what they make of its parameters
    /// ([`Algorithm::strategy_for`]).
    pub(crate) fn with_quotas(&self, quotas: Arc<[Quota]>) -> Policy {
        let strategy = self
            .strategy()
            .algorithm()
            .strategy_for(self.strategy(), &quotas);
        self.with_parts(strategy, quotas)
    }

    /// This policy with `limit` for the caller's own quota (the first
    /// whose budget is the caller's), its window kept: a limit that came
    /// with the request.
    pub(crate) fn with_request_limit(&self, limit: u32) -> Policy {
        let mut quotas = self.quotas().to_vec();
        let own = (0..quotas.len())
            .find(|&i| self.strategy().scope_of(i) == Scope::Consumer)
            .unwrap_or(0);
        if let Ok(q) = Quota::new(limit, quotas[own].window()) {
            quotas[own] = q;
        }
        let limited = self.with_quotas(quotas.into());
        match self.cap() {
            // An operator's cap beats a limit from the request too.
            Some(cap) => limited.with_cap(cap.into()),
            None => limited,
        }
    }
}

/// Everything the rest of the crate asks of one strategy, answered in the
/// strategy's own file: its flags, its memory state, its Redis calls.
/// Each strategy is a unit struct; a strategy with parameters reads them
/// from the [`Strategy`] it is given.
pub(crate) trait Algorithm: Sync {
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

    /// This strategy's parameters when `quotas` judge a caller instead of
    /// the policy's (an override, a limit from the request): unchanged by
    /// default; GCRA's burst and the leaky bucket's capacity follow quota
    /// 0's limit.
    fn strategy_for(&self, strategy: &Strategy, _quotas: &[Quota]) -> Strategy {
        strategy.clone()
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

    /// What settling a pass to its actual cost can do under this strategy:
    /// by default give back; a strategy that charges an overspend
    /// ([`charge_more`](Self::charge_more) and
    /// [`charge_more_call`](Self::charge_more_call)) says [`Settles::Both`].
    fn settles(&self) -> Settles {
        Settles::GiveBack
    }

    /// The memory store's settle of `receipt` to `actual` units, under the
    /// lock of `shard`: the refund of the difference when `actual` is less,
    /// [`charge_more`](Self::charge_more) when it is more.
    fn settle(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
        actual: u64,
    ) {
        let charged = receipt.cost();
        match (actual.cmp(&charged), self.settles()) {
            (_, Settles::Nothing) | (std::cmp::Ordering::Equal, _) => {}
            (std::cmp::Ordering::Less, _) => {
                let back = receipt.for_units(charged - actual);
                self.give_back(policy, shard, keys, now, &back);
            }
            (std::cmp::Ordering::Greater, Settles::Both) => {
                self.charge_more(policy, shard, keys, now, receipt, actual - charged);
            }
            (std::cmp::Ordering::Greater, _) => {}
        }
    }

    /// The memory store's charge of `extra` units more than `receipt`
    /// charged, to what it charged (its stamps), without checking the
    /// limit; nothing when that has passed. Only asked when
    /// [`settles`](Self::settles) is [`Settles::Both`].
    fn charge_more(
        &self,
        _policy: &Policy,
        _shard: &mut Shard,
        _keys: &KeyNames<'_>,
        _now: u64,
        _receipt: &Receipt,
        _extra: u64,
    ) {
    }

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
        now: ScriptNow,
        cost: u64,
        read_only: bool,
    ) -> (&'static LuaScript, Args);

    /// This strategy's lease scripts, if it can lease (`strategy/lease.rs`
    /// says which can and why): `None`, the default, for one that cannot.
    #[cfg(feature = "redis")]
    fn lease_scripts(&self) -> Option<&'static lease::LeaseScripts> {
        None
    }

    /// How a lease of `policy` is spent in this process, if the policy can
    /// lease (one that can names its [`lease_scripts`](Self::lease_scripts)).
    #[cfg(feature = "redis")]
    fn lease_spending(&self, _policy: &Policy) -> Option<lease::Spending> {
        None
    }

    /// Where [`call`](Self::call)'s arguments for the policy's quotas start
    /// (0-based), and those arguments: what a caller's override replaces
    /// (`lua/caller.lua`).
    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args);

    /// The Redis store's refund of `receipt`, at `now` (µs, or -1 for Redis
    /// `TIME`), on the policy's quota keys.
    #[cfg(feature = "redis")]
    fn give_back_call(&self, policy: &Policy, now: ScriptNow, receipt: &Receipt) -> GiveBack;

    /// The Redis store's settle of `receipt` to `actual` units: one call of
    /// the refund script, with a negative count for a charge; `None` when
    /// there is nothing to send.
    #[cfg(feature = "redis")]
    fn settle_call(
        &self,
        policy: &Policy,
        now: ScriptNow,
        receipt: &Receipt,
        actual: u64,
    ) -> Option<GiveBack> {
        let charged = receipt.cost();
        match (actual.cmp(&charged), self.settles()) {
            (_, Settles::Nothing) | (std::cmp::Ordering::Equal, _) => None,
            (std::cmp::Ordering::Less, _) => {
                let back = receipt.for_units(charged - actual);
                Some(self.give_back_call(policy, now, &back))
            }
            (std::cmp::Ordering::Greater, Settles::Both) => {
                self.charge_more_call(policy, now, receipt, actual - charged)
            }
            (std::cmp::Ordering::Greater, _) => None,
        }
    }

    /// The Redis store's [`charge_more`](Self::charge_more): the refund
    /// script given a negative count. Only asked when
    /// [`settles`](Self::settles) is [`Settles::Both`].
    #[cfg(feature = "redis")]
    fn charge_more_call(
        &self,
        _policy: &Policy,
        _now: ScriptNow,
        _receipt: &Receipt,
        _extra: u64,
    ) -> Option<GiveBack> {
        None
    }

    /// The decision a decided script reply gives (read once, by
    /// [`Reply::read`](crate::store::redis::reply::Reply::read)).
    #[cfg(feature = "redis")]
    fn reply(&self, decided: Decided, cost: u64) -> Result<Decision, StoreError> {
        Ok(decided.decision(cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

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
        #[cfg(feature = "redis")]
        for (strategy, algorithm) in every.iter().zip(ALL) {
            let named = algorithm.lua().check.name();
            assert_eq!(named, strategy.algorithm().lua().check.name());
            assert!(named.starts_with(strategy.as_str()), "{named}");
        }
    }
}
