//! A fixed window aligned on the Unix epoch, over one or more quotas,
//! all-or-nothing: the fixed window of limits (Python) and Upstash.
//!
//! Mirrors `lua/aligned_window.lua`; change both together. A quota's
//! windows end at multiples of its length since the epoch, so `Reset` is
//! known in advance and is the same for every caller and every server. The
//! decision is the fixed window's, over windows whose ends are aligned.

use super::fixed_window;
#[cfg(feature = "redis")]
use super::lease::{LeaseScripts, Spending};
use super::{Algorithm, Settles};
use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::policy::Strategy;
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::Window;
#[cfg(feature = "redis")]
use crate::store::redis::args::{GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::LazyLock;

/// The end of the window of `length` µs that holds `now`.
fn window_end(now: u64, length: u64) -> u64 {
    now - now % length + length
}

/// Decides, and on a pass charges `cost` to every window in `windows`.
///
/// `windows[i]` is quota `i`'s stored window (`None` when absent); a stored
/// count counts only if its stored end is the current window's, so a count
/// of an earlier window reads as zero whether or not it has expired.
pub(crate) fn check(
    windows: &mut [Option<Window>],
    quotas: &[Quota],
    now: u64,
    cost: u64,
) -> Decision {
    for (slot, quota) in windows.iter_mut().zip(quotas) {
        let reset_at = window_end(now, quota.window_micros());
        *slot = match *slot {
            Some(w) if w.reset_at == reset_at => Some(w),
            _ => Some(Window { count: 0, reset_at }),
        };
    }
    fixed_window::check(windows, quotas, now, cost)
}

/// This strategy's scripts, built once; a refund is the fixed window's.
/// Its lease script, built once (`strategy/lease.rs`).
#[cfg(feature = "redis")]
static LEASE: LazyLock<LeaseScripts> = LazyLock::new(|| {
    LeaseScripts::new(
        "aligned_window_lease",
        "aligned_window_lease_caller",
        include_str!("../../lua/aligned_window_lease.lua"),
    )
});

#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    Trio::new(
        "aligned_window",
        include_str!("../../lua/aligned_window.lua"),
        None,
        LuaScript::refund(
            "aligned_window_refund",
            include_str!("../../lua/fixed_window_refund.lua"),
        ),
    )
});

/// The aligned window's home (see [`Algorithm`]).
pub(crate) struct AlignedWindow;

impl Algorithm for AlignedWindow {
    fn max_quotas(&self) -> usize {
        8
    }

    /// Nothing is spent back before the window's end.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// Nothing is spent back before the window's end.
    fn exhaustion_is_stable(&self) -> bool {
        true
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        fixed_window::decide_windows(policy, shard, keys, now, cost, check)
    }

    fn give_back(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        let units = fixed_window::signed(receipt.cost());
        fixed_window::give_back_windows(shard, keys, now, receipt, units);
    }

    /// Gives back, and charges an overspend.
    fn settles(&self) -> Settles {
        Settles::Both
    }

    /// Charged to the windows the pass was charged in, while they last.
    fn charge_more(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
        extra: u64,
    ) {
        let units = -fixed_window::signed(extra);
        fixed_window::give_back_windows(shard, keys, now, receipt, units);
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
        (
            LUA.decide(read_only),
            fixed_window::window_args(policy, now, cost),
        )
    }

    #[cfg(feature = "redis")]
    fn lease_scripts(&self) -> Option<&'static LeaseScripts> {
        Some(&LEASE)
    }

    /// One quota leases (see `strategy/lease.rs`).
    #[cfg(feature = "redis")]
    fn lease_spending(&self, policy: &Policy) -> Option<Spending> {
        match policy.quotas() {
            [_] => Some(Spending::Window),
            _ => None,
        }
    }

    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (2, crate::store::redis::args::quota_ints(policy).collect())
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, _policy: &Policy, _now: ScriptNow, receipt: &Receipt) -> GiveBack {
        let units = fixed_window::signed(receipt.cost());
        GiveBack::Refund(&LUA.refund, fixed_window::refund_args(receipt, units))
    }

    #[cfg(feature = "redis")]
    fn charge_more_call(
        &self,
        _policy: &Policy,
        _now: ScriptNow,
        receipt: &Receipt,
        extra: u64,
    ) -> Option<GiveBack> {
        let units = -fixed_window::signed(extra);
        let args = fixed_window::refund_args(receipt, units);
        Some(GiveBack::Refund(&LUA.refund, args))
    }
}

impl Policy {
    /// A fixed window aligned on the Unix epoch: windows of `quota.window()`
    /// end at its multiples, so `Reset` is known in advance and the same for
    /// everyone ("1,000 per UTC day, reset at midnight").
    ///
    /// ```
    /// use std::{num::NonZeroU32, time::Duration};
    /// use tollgate::{Policy, Quota, Strategy};
    /// let daily = Quota::new(1000, Duration::from_secs(86_400)).unwrap();
    /// let policy = Policy::aligned_window("daily", daily);
    /// assert_eq!(policy.strategy(), &Strategy::AlignedWindow);
    /// ```
    pub fn aligned_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Strategy::AlignedWindow, quota)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_window_ends_at_a_multiple_of_its_length() {
        let day = Quota::new(1000, Duration::from_secs(86_400)).unwrap();
        let noon = 1_800_000_000_000_000 - 1_800_000_000_000_000 % 86_400_000_000 + 43_200_000_000;
        let d = check(&mut [None], &[day], noon, 1);
        assert_eq!(d.reset_at_micros % 86_400_000_000, 0, "midnight UTC");
        assert_eq!(d.reset_at_micros - noon, 43_200_000_000);
    }
}
