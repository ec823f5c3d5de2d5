//! GitHub's fixed window, over one or more quotas, all-or-nothing.
//!
//! Mirrors `lua/fixed_window.lua` line for line; change both together.

#[cfg(feature = "redis")]
use super::lease::{LeaseScripts, Spending};
use super::{Algorithm, Settles};
use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::policy::Strategy;
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::with_slots;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::{State, Window};
#[cfg(feature = "redis")]
use crate::store::redis::args::{int, quota_ints, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::LazyLock;

/// Expiry is cleanup only: keys live one second past their window's end.
pub(crate) const EXPIRY_GRACE_MICROS: u64 = 1_000_000;

/// Decides, and on a pass charges `cost` to every window in `windows`.
///
/// `windows[i]` is quota `i`'s stored state (`None` when absent). A window
/// whose stored end is not after `now` counts as empty, whether or not the
/// store has expired it yet. With `cost == 0` nothing is written (a peek).
#[inline]
pub(crate) fn check(
    windows: &mut [Option<Window>],
    quotas: &[Quota],
    now: u64,
    cost: u64,
) -> Decision {
    // A stored window that has ended counts as a fresh, empty one. Computed
    // where needed rather than collected: no allocation per decision.
    let current = |stored: &Option<Window>, quota: &Quota| match stored {
        Some(w) if w.reset_at > now => *w,
        _ => Window {
            count: 0,
            reset_at: now + quota.window_micros(),
        },
    };

    // The rejecting quota that frees up last decides Retry-After; when all
    // fit, the one with the least left is reported.
    let mut rejected: Option<(usize, Window)> = None;
    for (i, (stored, q)) in windows.iter().zip(quotas).enumerate() {
        let w = current(stored, q);
        if w.count + cost > u64::from(q.limit()) {
            let later = rejected.is_none_or(|(_, r)| w.reset_at > r.reset_at);
            if later {
                rejected = Some((i, w));
            }
        }
    }

    if let Some((i, w)) = rejected {
        let limit = u64::from(quotas[i].limit());
        return Decision::rejected(limit, w.count.min(limit), w.reset_at, now, w.reset_at - now)
            .reporting(i);
    }

    if cost > 0 {
        for (slot, q) in windows.iter_mut().zip(quotas) {
            let mut w = current(slot, q);
            w.count += cost;
            *slot = Some(w);
        }
    }

    let left = |i: usize| {
        u64::from(quotas[i].limit()).saturating_sub(current(&windows[i], &quotas[i]).count)
    };
    let mut report = 0;
    for i in 1..windows.len().min(quotas.len()) {
        if left(i) < left(report) {
            report = i;
        }
    }
    let (w, q) = (current(&windows[report], &quotas[report]), quotas[report]);
    Decision::allowed(u64::from(q.limit()), w.count, w.reset_at, now)
        .reporting(report)
        .with_receipt(Receipt::of(
            cost,
            windows
                .iter()
                .zip(quotas)
                .map(|(s, q)| current(s, q).reset_at),
        ))
}

/// Gives `units` back to each window that is still the one charged (never
/// below zero), or, for negative `units`, charges that many more to it
/// without checking the limit (a settle's overspend): the refund script's
/// signed count.
pub(crate) fn refund(windows: &mut [Option<Window>], stamps: &[u64], units: i64) {
    for (slot, stamp) in windows.iter_mut().zip(stamps) {
        if let Some(w) = slot
            && w.reset_at == *stamp
        {
            w.count = w.count.saturating_add_signed(units.saturating_neg());
        }
    }
}

/// `units` as a signed count: refunds give back up to `i64::MAX`.
pub(crate) fn signed(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

/// The memory store's half of a strategy that keeps one [`Window`] per
/// quota (this one and the aligned window): load each quota's window,
/// decide with `check`, store what a pass charged. One shard lock, no
/// allocation.
pub(crate) fn decide_windows(
    policy: &Policy,
    shard: &mut Shard,
    keys: &KeyNames<'_>,
    now: u64,
    cost: u64,
    check: impl FnOnce(&mut [Option<Window>], &[Quota], u64, u64) -> Decision,
) -> Decision {
    if let [quota] = policy.quotas() {
        // One window: read and written in one lookup.
        return shard.update(keys.first(), now, |live, write| {
            let mut window = [match live {
                Some(State::Window(w)) => Some(*w),
                _ => None,
            }];
            let decision = check(&mut window, std::slice::from_ref(quota), now, cost);
            if let (true, true, [Some(w)]) = (decision.allowed, cost > 0, window) {
                *write = Some((State::Window(w), w.reset_at + EXPIRY_GRACE_MICROS));
            }
            decision
        });
    }
    with_slots(policy.quotas().len(), |windows| {
        for (slot, k) in windows.iter_mut().zip(keys.iter()) {
            if let Some(State::Window(w)) = shard.get(k, now) {
                *slot = Some(*w);
            }
        }
        let decision = check(windows, policy.quotas(), now, cost);
        if decision.allowed && cost > 0 {
            for (k, w) in keys.iter().zip(windows.iter()) {
                if let Some(w) = *w {
                    shard.put(k, State::Window(w), w.reset_at + EXPIRY_GRACE_MICROS);
                }
            }
        }
        decision
    })
}

/// Gives `units` back to each stored window `receipt` still matches, or
/// charges `-units` more to it (see [`refund`]).
pub(crate) fn give_back_windows(
    shard: &mut Shard,
    keys: &KeyNames<'_>,
    now: u64,
    receipt: &Receipt,
    units: i64,
) {
    for (k, stamp) in keys.iter().zip(receipt.stamps()) {
        if let Some(State::Window(w)) = shard.get_mut(k, now) {
            let mut slot = [Some(*w)];
            refund(&mut slot, &[*stamp], units);
            if let Some(refunded) = slot[0] {
                *w = refunded;
            }
        }
    }
}

/// A window script's arguments: now, cost, then each quota's limit and
/// window (µs), as `lua/fixed_window.lua` and `lua/aligned_window.lua` take
/// them.
#[cfg(feature = "redis")]
pub(crate) fn window_args(policy: &Policy, now: ScriptNow, cost: u64) -> Args {
    let mut args = Args::new();
    args.push(now.arg());
    args.push(int(cost));
    args.extend(quota_ints(policy));
    args
}

/// A window refund's arguments (`lua/fixed_window_refund.lua`): the units
/// to give back (negative: to charge), then each window's stamp (its end,
/// µs).
#[cfg(feature = "redis")]
pub(crate) fn refund_args(receipt: &Receipt, units: i64) -> Vec<String> {
    let mut args = vec![units.to_string()];
    args.extend(receipt.stamps().iter().map(u64::to_string));
    args
}

/// Its lease script, built once (`strategy/lease.rs`).
#[cfg(feature = "redis")]
static LEASE: LazyLock<LeaseScripts> = LazyLock::new(|| {
    LeaseScripts::new(
        "fixed_window_lease",
        "fixed_window_lease_caller",
        include_str!("../../lua/fixed_window_lease.lua"),
    )
    .batched(LuaScript::batch_with(
        "fixed_window_batch",
        include_str!("../../lua/fixed_window_batch.lua"),
    ))
});

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    Trio::new(
        "fixed_window",
        include_str!("../../lua/fixed_window.lua"),
        Some(include_str!("../../lua/fixed_window_batch.lua")),
        LuaScript::refund(
            "fixed_window_refund",
            include_str!("../../lua/fixed_window_refund.lua"),
        ),
    )
});

/// The fixed window's home (see [`Algorithm`]).
pub(crate) struct FixedWindow;

impl Algorithm for FixedWindow {
    fn max_quotas(&self) -> usize {
        8
    }

    /// Nothing is spent back before reset.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// Nothing is spent back before reset.
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
        decide_windows(policy, shard, keys, now, cost, check)
    }

    fn give_back(
        &self,
        _policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
    ) {
        give_back_windows(shard, keys, now, receipt, signed(receipt.cost()));
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
        give_back_windows(shard, keys, now, receipt, -signed(extra));
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
        (LUA.decide(read_only), window_args(policy, now, cost))
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
        (2, quota_ints(policy).collect())
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, _policy: &Policy, _now: ScriptNow, receipt: &Receipt) -> GiveBack {
        GiveBack::Refund(&LUA.refund, refund_args(receipt, signed(receipt.cost())))
    }

    #[cfg(feature = "redis")]
    fn charge_more_call(
        &self,
        _policy: &Policy,
        _now: ScriptNow,
        receipt: &Receipt,
        extra: u64,
    ) -> Option<GiveBack> {
        let args = refund_args(receipt, -signed(extra));
        Some(GiveBack::Refund(&LUA.refund, args))
    }
}

impl Policy {
    /// GitHub's fixed window: the first request opens a window of
    /// `quota.window()`; its end is stored and read back, never recomputed.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota, Strategy};
    /// let policy = Policy::fixed_window("core", Quota::per_hour(NonZeroU32::new(5000).unwrap()));
    /// assert_eq!(policy.name(), "core");
    /// assert_eq!(policy.strategy(), &Strategy::FixedWindow);
    /// ```
    pub fn fixed_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Strategy::FixedWindow, quota)
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
    fn over_limit_count_still_rejects_unlike_equality_checks() {
        // A count above the limit (the limit was lowered) must keep rejecting:
        // published scripts test `count == limit` and never reject again.
        let mut w = [Some(Window {
            count: 7,
            reset_at: 10_000_000,
        })];
        let d = check(&mut w, &[q(5, 10)], 1_000_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.used, 5);
    }

    #[test]
    fn several_quotas_charge_all_or_none() {
        let quotas = [q(10, 1), q(2, 3600)];
        let mut w = [None, None];
        assert!(check(&mut w, &quotas, 0, 1).allowed);
        assert!(check(&mut w, &quotas, 1, 1).allowed);
        let third = check(&mut w, &quotas, 2, 1);
        assert!(!third.allowed);
        assert_eq!(third.quota, 1, "the hourly quota rejected");
        assert_eq!(
            w[0].unwrap().count,
            2,
            "the per-second window was not charged"
        );
    }
}
