//! Cloudflare's sliding-window counter, over one or more quotas,
//! all-or-nothing.
//!
//! Mirrors `lua/sliding_window.lua` line for line; change both together.
//!
//! Time is cut into fixed windows aligned on the epoch. A key keeps the
//! count of the current window and of the previous one; the rate over the
//! sliding window ending now is estimated as
//! `prev × (window − elapsed) / window + cur`, assuming the previous window's
//! requests were spread evenly. A request of `cost` fits when
//! `prev × weight ≤ limit − cur − cost`. The weight is the one floating-point
//! step, computed by the same IEEE-754 operations in Rust and in Lua, so both
//! stores decide identically.

use crate::policy::Strategy;
use smallvec::SmallVec;
use std::sync::Arc;

use super::fixed_window::signed;
use super::fixed_window::EXPIRY_GRACE_MICROS;
use super::{Algorithm, Settles};

use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::memory::names::KeyNames;
use crate::store::memory::shard::with_slots;
use crate::store::memory::shard::Shard;
use crate::store::memory::state::{Counter, State};
#[cfg(feature = "redis")]
use crate::store::redis::args::{int, quota_ints, stamps, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::{Args, LuaScript, Trio};
#[cfg(feature = "redis")]
use std::sync::LazyLock;

/// The counters as seen at `now`: rolled forward when a window has passed.
/// A stored window later than now's (a clock that went back) stays current,
/// with nothing of it elapsed, so no count is ever lost.
fn view(stored: Option<Counter>, now: u64, window: u64) -> (Counter, u64) {
    let start = now - now % window;
    match stored {
        Some(c) if c.start > start => (c, 0),
        Some(c) if c.start == start => (c, now - start),
        Some(c) if c.start + window == start => (
            Counter {
                start,
                cur: 0,
                prev: c.cur,
            },
            now - start,
        ),
        _ => (
            Counter {
                start,
                cur: 0,
                prev: 0,
            },
            now - start,
        ),
    }
}

/// The previous window's count weighted by how much of it the sliding
/// window still covers. Lua computes `prev * ((window - elapsed) / window)`
/// in the same order, on the same doubles.
fn weighted(prev: u64, window: u64, elapsed: u64) -> f64 {
    prev as f64 * ((window - elapsed) as f64 / window as f64)
}

/// The smallest `x` in `lo..=hi` with `fits(x)`; `fits(hi)` must hold and
/// `fits` must not turn false again once true.
fn first(mut lo: u64, mut hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// One quota's verdict.
struct Verdict {
    counter: Counter,
    fits: bool,
    /// Units counted: current window plus the weighted previous, rounded up.
    used: u64,
    /// When a request of this cost would fit (on rejections), µs.
    fits_at: u64,
}

fn judge(stored: Option<Counter>, quota: &Quota, now: u64, cost: u64) -> Verdict {
    let (window, limit) = (quota.window_micros(), u64::from(quota.limit()));
    let (c, elapsed) = view(stored, now, window);
    let prev_weighted = weighted(c.prev, window, elapsed);
    let used = c.cur.saturating_add(prev_weighted.ceil() as u64);
    let room = limit.checked_sub(c.cur.saturating_add(cost));
    let fits = room.is_some_and(|room| prev_weighted <= room as f64);
    let fits_at = if fits {
        now
    } else if cost > limit {
        // Never fits; the counters are clear at the end of the next window.
        c.stale_at(window)
    } else if let Some(room) = room {
        // Fits later in this window, once the previous one weighs less.
        c.start
            + first(elapsed + 1, window, |x| {
                weighted(c.prev, window, x) <= room as f64
            })
    } else {
        // Fits in the next window, once this one (then the previous) weighs less.
        let room = limit - cost;
        c.start + window + first(1, window, |x| weighted(c.cur, window, x) <= room as f64)
    };
    Verdict {
        counter: c,
        fits,
        used,
        fits_at,
    }
}

/// When the estimate is back to zero: the end of the next window once the
/// current one has a charge, the end of this one if only the previous has.
fn reset_at(c: &Counter, window: u64, now: u64) -> u64 {
    if c.cur > 0 {
        c.start + 2 * window
    } else if c.prev > 0 {
        c.start + window
    } else {
        now
    }
}

/// Decides, and on a pass charges `cost` to every quota's current window.
///
/// `counters[i]` is quota `i`'s stored state (`None` when absent). With
/// `cost == 0` nothing is written (a peek).
pub(crate) fn check(
    counters: &mut [Option<Counter>],
    quotas: &[Quota],
    now: u64,
    cost: u64,
) -> Decision {
    if let ([stored], [quota]) = (&mut *counters, quotas) {
        return check_one(stored, quota, now, cost);
    }
    // Inline up to the most quotas a policy may have: no allocation.
    let verdicts: SmallVec<[Verdict; 8]> = counters
        .iter()
        .zip(quotas)
        .map(|(stored, q)| judge(*stored, q, now, cost))
        .collect();

    // The rejecting quota that lets this request through last decides.
    let mut rejected: Option<usize> = None;
    for (i, v) in verdicts.iter().enumerate() {
        if !v.fits && rejected.is_none_or(|r| v.fits_at > verdicts[r].fits_at) {
            rejected = Some(i);
        }
    }
    if let Some(i) = rejected {
        let (v, q) = (&verdicts[i], quotas[i]);
        let limit = u64::from(q.limit());
        let reset = reset_at(&v.counter, q.window_micros(), now);
        return Decision::rejected(limit, v.used.min(limit), reset, now, v.fits_at - now)
            .reporting(i);
    }

    let mut charged: SmallVec<[Counter; 8]> = verdicts.iter().map(|v| v.counter).collect();
    if cost > 0 {
        for (slot, c) in counters.iter_mut().zip(charged.iter_mut()) {
            c.cur += cost;
            *slot = Some(*c);
        }
    }
    // When all fit, the quota with the least left is reported.
    let left = |j: usize| u64::from(quotas[j].limit()) - verdicts[j].used - cost;
    let report = (1..quotas.len()).fold(0, |best, i| if left(i) < left(best) { i } else { best });
    let q = quotas[report];
    let reset = reset_at(&charged[report], q.window_micros(), now);
    Decision::allowed(
        u64::from(q.limit()),
        verdicts[report].used + cost,
        reset,
        now,
    )
    .reporting(report)
    .with_receipt(Receipt::of(cost, charged.iter().map(|c| c.start)))
}

/// [`check`] for one quota, the usual policy: the same decision, without
/// the lists that several quotas need.
#[inline]
fn check_one(stored: &mut Option<Counter>, quota: &Quota, now: u64, cost: u64) -> Decision {
    let v = judge(*stored, quota, now, cost);
    let (window, limit) = (quota.window_micros(), u64::from(quota.limit()));
    if !v.fits {
        let reset = reset_at(&v.counter, window, now);
        return Decision::rejected(limit, v.used.min(limit), reset, now, v.fits_at - now);
    }
    let mut charged = v.counter;
    if cost > 0 {
        charged.cur += cost;
        *stored = Some(charged);
    }
    let reset = reset_at(&charged, window, now);
    Decision::allowed(limit, v.used + cost, reset, now)
        .with_receipt(Receipt::of(cost, [charged.start]))
}

/// Gives `units` back to the window each stamp names (its start), whether
/// it is still the current window or has become the previous one, never
/// below zero; negative `units` charge that many more to it, unchecked (a
/// settle's overspend).
pub(crate) fn refund(
    counters: &mut [Option<Counter>],
    quotas: &[Quota],
    stamps: &[u64],
    units: i64,
) {
    let moved = |n: u64| n.saturating_add_signed(units.saturating_neg());
    for ((slot, q), &stamp) in counters.iter_mut().zip(quotas).zip(stamps) {
        if let Some(c) = slot {
            if c.start == stamp {
                c.cur = moved(c.cur);
            } else if c.start == stamp + q.window_micros() {
                c.prev = moved(c.prev);
            }
        }
    }
}

/// This strategy's scripts, built once.
#[cfg(feature = "redis")]
static LUA: LazyLock<Trio> = LazyLock::new(|| {
    Trio::new(
        "sliding_window",
        include_str!("../../lua/sliding_window.lua"),
        Some(include_str!("../../lua/sliding_window_batch.lua")),
        LuaScript::refund(
            "sliding_window_refund",
            include_str!("../../lua/sliding_window_refund.lua"),
        ),
    )
});

/// The sliding-window counter's home (see [`Algorithm`]).
pub(crate) struct SlidingWindow;

impl Algorithm for SlidingWindow {
    fn max_quotas(&self) -> usize {
        8
    }

    /// The previous window decays only with time, and other requests only
    /// add, so the first moment the request fits can only move later.
    fn rejection_is_stable(&self) -> bool {
        true
    }

    /// `reset_at` is when the limit is whole again, but one unit frees
    /// earlier, as the previous window decays.
    fn exhaustion_is_stable(&self) -> bool {
        false
    }

    fn decide(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        cost: u64,
    ) -> Decision {
        if let [quota] = policy.quotas() {
            // One counter: read and written in one lookup.
            return shard.update(keys.first(), now, |live, write| {
                let mut counter = [match live {
                    Some(State::Counter(c)) => Some(*c),
                    _ => None,
                }];
                let decision = check(&mut counter, std::slice::from_ref(quota), now, cost);
                if let (true, true, [Some(c)]) = (decision.allowed, cost > 0, counter) {
                    let expires_at = c.stale_at(quota.window_micros()) + EXPIRY_GRACE_MICROS;
                    *write = Some((State::Counter(c), expires_at));
                }
                decision
            });
        }
        with_slots(policy.quotas().len(), |counters| {
            for (slot, k) in counters.iter_mut().zip(keys.iter()) {
                if let Some(State::Counter(c)) = shard.get(k, now) {
                    *slot = Some(*c);
                }
            }
            let decision = check(counters, policy.quotas(), now, cost);
            if decision.allowed && cost > 0 {
                let counters = counters.iter().copied();
                for ((k, c), q) in keys.iter().zip(counters).zip(policy.quotas()) {
                    if let Some(c) = c {
                        let expires_at = c.stale_at(q.window_micros()) + EXPIRY_GRACE_MICROS;
                        shard.put(k, State::Counter(c), expires_at);
                    }
                }
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
        move_counters(policy, shard, keys, now, receipt, signed(receipt.cost()));
    }

    /// Gives back, and charges an overspend.
    fn settles(&self) -> Settles {
        Settles::Both
    }

    /// Charged to the windows the pass was charged in, current or previous.
    fn charge_more(
        &self,
        policy: &Policy,
        shard: &mut Shard,
        keys: &KeyNames<'_>,
        now: u64,
        receipt: &Receipt,
        extra: u64,
    ) {
        move_counters(policy, shard, keys, now, receipt, -signed(extra));
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
        let mut args = Args::from_slice(&[now.arg(), int(cost)]);
        args.extend(quota_ints(policy));
        (LUA.decide(read_only), args)
    }

    #[cfg(feature = "redis")]
    fn quota_args(&self, policy: &Policy) -> (usize, Args) {
        (2, quota_ints(policy).collect())
    }

    #[cfg(feature = "redis")]
    fn give_back_call(&self, policy: &Policy, _now: ScriptNow, receipt: &Receipt) -> GiveBack {
        refund_call(policy, receipt, signed(receipt.cost()))
    }

    #[cfg(feature = "redis")]
    fn charge_more_call(
        &self,
        policy: &Policy,
        _now: ScriptNow,
        receipt: &Receipt,
        extra: u64,
    ) -> Option<GiveBack> {
        Some(refund_call(policy, receipt, -signed(extra)))
    }
}

/// The memory store's [`refund`] of `units` (negative: a charge) to each
/// stored counter `receipt` names.
fn move_counters(
    policy: &Policy,
    shard: &mut Shard,
    keys: &KeyNames<'_>,
    now: u64,
    receipt: &Receipt,
    units: i64,
) {
    for ((k, q), stamp) in keys.iter().zip(policy.quotas()).zip(receipt.stamps()) {
        if let Some(State::Counter(c)) = shard.get_mut(k, now) {
            let mut slot = [Some(*c)];
            refund(&mut slot, &[*q], &[*stamp], units);
            *c = slot[0].unwrap_or(*c);
        }
    }
}

/// `lua/sliding_window_refund.lua`'s call: `units` to give back (negative:
/// to charge), each quota's stamp, each quota's window.
#[cfg(feature = "redis")]
fn refund_call(policy: &Policy, receipt: &Receipt, units: i64) -> GiveBack {
    let mut args = vec![units.to_string()];
    args.extend(stamps(receipt));
    args.extend(
        policy
            .quotas()
            .iter()
            .map(|q| q.window_micros().to_string()),
    );
    GiveBack::Refund(&LUA.refund, args)
}

impl Policy {
    /// Cloudflare's sliding-window counter: `quota` over a window that slides,
    /// estimated from two fixed-window counters in constant memory per key.
    /// Takes more quotas with [`and`](Self::and), all-or-nothing.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use tollgate::{Policy, Quota};
    ///
    /// let per_sec = Quota::per_second(NonZeroU32::new(10).unwrap());
    /// let per_hour = Quota::per_hour(NonZeroU32::new(1000).unwrap());
    /// let policy = Policy::sliding_window("search", per_sec).and(per_hour);
    /// assert!(policy.validate().is_ok());
    /// ```
    pub fn sliding_window(name: impl Into<Arc<str>>, quota: Quota) -> Self {
        Self::new(name, Strategy::SlidingWindow, quota)
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
    fn the_previous_window_weighs_by_its_overlap() {
        // 10 per minute; 10 spent in the previous minute; 15 s into this one
        // the previous still weighs 7.5, so 2 more fit and a third does not.
        let quota = [q(10, 60)];
        let mut c = [Some(Counter {
            start: 0,
            cur: 10,
            prev: 0,
        })];
        let now = 75_000_000;
        assert_eq!(check(&mut c, &quota, now, 1).remaining, 1);
        assert_eq!(check(&mut c, &quota, now, 1).remaining, 0);
        let d = check(&mut c, &quota, now, 1);
        assert!(!d.allowed);
        // 10 × (60 − x)/60 ≤ 7 once x ≥ 18 s: the retry is 3 s away.
        assert_eq!(d.retry_after, Some(Duration::from_secs(3)));
        assert_eq!(d.reset_at_micros, 180_000_000);
    }

    #[test]
    fn retry_after_is_the_first_microsecond_that_fits() {
        let quota = [q(7, 1)];
        let mut c = [Some(Counter {
            start: 1_000_000,
            cur: 3,
            prev: 7,
        })];
        let now = 1_100_000;
        let d = check(&mut c, &quota, now, 1);
        let at = now + d.retry_after.unwrap().as_micros() as u64;
        assert!(!check(&mut c, &quota, at - 1, 1).allowed);
        assert!(check(&mut c, &quota, at, 1).allowed);
    }
}
