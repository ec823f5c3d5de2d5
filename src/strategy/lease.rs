//! What each strategy knows about leases: whether it can lease, its lease
//! script (`lua/<name>_lease.lua`, one `EVALSHA` that decides the request
//! and charges the lease), and how a lease is spent in memory.
//!
//! A lease is a slice of one caller's budget, charged in Redis before a
//! unit of it is spent, so every unit a server admits from its lease was
//! counted in Redis first. Which strategies can lease, and why:
//!
//! - **Fixed window, aligned window** (one quota): a unit charged in a
//!   window and spent in the same window counts exactly as if it had been
//!   charged when spent. A lease ends with its window.
//! - **GCRA**: units charged early would bank: the bucket refills while a
//!   lease sits unspent, and the two together could pass more than `burst`
//!   at once. A lease therefore decays by one unit per emission interval
//!   from the moment it was asked for, as fast as the bucket refills: the
//!   bucket and every lease together never hold more than `burst`.
//! - **Sliding window** could lease as the fixed window does (a unit charged
//!   early in its window weighs the same in the next window's estimate);
//!   not built yet.
//! - **Sliding log** cannot: a logged unit leaves the log one period after
//!   it was charged, so a unit spent later would be forgotten early.
//! - **Leaky bucket, uniform gate**: each pass is given its own place in
//!   time (a delay, a gap since the last pass), which a slice of units
//!   cannot carry.
//! - **Concurrency**: a slot is held until its response ends and released
//!   by that response; there is no rate to slice.
//!
//! Policies with several quotas do not lease (their decisions go to Redis
//! as without leases). A policy with a caller's own rules (an override, a
//! penalty box) leases through the same scripts wrapped by
//! `lua/caller.lua`: a lease script takes the strategy's own arguments
//! with the units wanted after them, so the wrapper's override replaces
//! the quota arguments as it does for the decision, and the lease is
//! granted against the limit the decision is judged by.

use super::ALL;
use crate::decision::Receipt;
use crate::policy::Policy;
use crate::store::redis::args::{int, ScriptNow};
use crate::store::redis::script::{Args, LuaScript};

/// How a lease is spent in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spending {
    /// Unit by unit until the window it was charged in ends.
    Window,
    /// Unit by unit while it decays by one unit per `interval` µs (the
    /// GCRA's emission interval) from the moment it was asked for.
    Decaying { interval: u64 },
}

impl Spending {
    /// The receipt of a pass of `cost` that leaves `left` units in a
    /// lease charged at `stamp` (for GCRA, with the bucket's `given` then):
    /// stamped with the window's end, or for GCRA with the TAT the pass
    /// would have left without the units still leased and `given`, as the
    /// memory store stamps a pass (`strategy/bucket.rs`). With `left` 0,
    /// the receipt of the lease's own unspent units given back.
    pub(crate) fn pass_receipt(self, stamp: u64, given: u64, left: u64, cost: u64) -> Receipt {
        let receipt = match self {
            Spending::Window => Receipt::of(cost, [stamp]),
            Spending::Decaying { interval } => Receipt::of(
                cost,
                [stamp.saturating_sub(left.saturating_mul(interval)), given],
            ),
        };
        receipt.in_units_of(self.unit_micros())
    }

    /// The µs each unit of a pass from the lease is charged as (see
    /// [`Receipt::unit_micros`](crate::decision::Receipt::unit_micros)):
    /// the GCRA's interval, 0 for a window's units.
    pub(crate) fn unit_micros(self) -> u64 {
        match self {
            Spending::Window => 0,
            Spending::Decaying { interval } => interval,
        }
    }

    /// The same spending, its units of `unit` µs each when the lease's
    /// reply says so (a caller's override judged it with another
    /// interval than the policy's).
    pub(crate) fn in_units_of(self, unit: Option<u64>) -> Self {
        match (self, unit) {
            (Spending::Decaying { .. }, Some(interval)) => Spending::Decaying { interval },
            (spending, _) => spending,
        }
    }

    /// Units of a lease of `units` decayed `elapsed` µs after it was asked
    /// for: rounded up, so a lease never outlives what the bucket refilled.
    pub(crate) fn decayed(self, elapsed: u64) -> u64 {
        match self {
            Spending::Window => 0,
            Spending::Decaying { interval } => elapsed.div_ceil(interval.max(1)),
        }
    }
}

/// One strategy's lease script (`lua/<name>_lease.lua`), alone and wrapped
/// by a caller's rules; the strategy's file builds it once
/// ([`Algorithm::lease_scripts`](super::Algorithm::lease_scripts)).
pub(crate) struct LeaseScripts {
    alone: LuaScript,
    with_caller: LuaScript,
}

impl LeaseScripts {
    pub(crate) fn new(name: &'static str, caller: &'static str, source: &str) -> Self {
        Self {
            alone: LuaScript::decision(name, source),
            with_caller: LuaScript::decision_with_caller(caller, source),
        }
    }

    /// The same, the lease script sent in the strategy's batches by `batch`
    /// (its batch twin, which knows a lease request by its arguments): a
    /// crowd's leases then cost Redis a batched decision's share, not a
    /// call each.
    pub(crate) fn batched(self, batch: LuaScript) -> Self {
        Self {
            alone: self.alone.batched(batch),
            ..self
        }
    }

    fn for_policy(&self, policy: &Policy) -> &LuaScript {
        if policy.has_caller_rules() {
            &self.with_caller
        } else {
            &self.alone
        }
    }
}

/// Every lease script, alone and wrapped, in the order of [`ALL`].
pub(crate) fn scripts() -> Vec<&'static LuaScript> {
    let leasing = ALL.iter().filter_map(|a| a.lease_scripts());
    let (alone, wrapped): (Vec<_>, Vec<_>) = leasing.map(|l| (&l.alone, &l.with_caller)).unzip();
    alone.into_iter().chain(wrapped).collect()
}

/// How `policy`'s leases are spent, if it can lease at all (its strategy
/// says: [`Algorithm::lease_spending`](super::Algorithm::lease_spending)).
pub(crate) fn spending(policy: &Policy) -> Option<Spending> {
    policy.strategy().algorithm().lease_spending(policy)
}

/// The lease script for `policy` (which [`spending`] accepted) and its
/// arguments: the strategy's decision's own (`now`, µs or -1 for Redis
/// `TIME`, then `cost`, then its quota arguments), then the units wanted
/// beyond `cost` and the `span` (µs) they would last at the caller's
/// rate, by which a window's lease asks for less near the window's end. For a policy with a caller's own rules the script is
/// wrapped by `lua/caller.lua`, whose keys and arguments the store adds
/// after these.
pub(crate) fn call(
    policy: &Policy,
    now: ScriptNow,
    cost: u64,
    want: u64,
    span: u64,
) -> (&'static LuaScript, Args) {
    let algorithm = policy.strategy().algorithm();
    let scripts = algorithm
        .lease_scripts()
        .expect("only a strategy that leases is asked for a lease");
    let mut args = Args::from_slice(&[now.arg(), int(cost)]);
    args.extend(algorithm.quota_args(policy).1);
    args.push(int(want));
    args.push(int(span));
    (scripts.for_policy(policy), args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decaying_lease_loses_a_unit_per_interval_rounded_up() {
        let gcra = Spending::Decaying { interval: 100 };
        assert_eq!(gcra.decayed(0), 0);
        assert_eq!(gcra.decayed(1), 1);
        assert_eq!(gcra.decayed(100), 1);
        assert_eq!(gcra.decayed(101), 2);
        assert_eq!(Spending::Window.decayed(1_000_000), 0);
    }
}
