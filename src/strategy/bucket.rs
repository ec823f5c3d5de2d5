//! What GCRA and the leaky bucket share: a bucket kept as one time, the
//! TAT (the leaky bucket's `next_free`), and how a give-back moves it.
//!
//! A pass moves the TAT on by its cost in time, and its receipt carries
//! the TAT it set and the bucket's `given`: the µs refunds of charges with
//! others behind them have moved the TAT back over the bucket's life. Such
//! a refund moves every charge made after the one it gives back earlier,
//! so a charge ends at its stamp less what was given back since (or
//! sooner: the count cannot tell the charges before a refunded one from
//! those after); a refund gives back only what of its charge is still in
//! the bucket, and never what has drained.
//!
//! Mirrors `lua/tat.lua` and `lua/bucket_refund.lua`; change them together.

#[cfg(feature = "redis")]
use crate::decision::Receipt;
pub(crate) use crate::store::memory::state::Bucket;
#[cfg(feature = "redis")]
use crate::store::redis::args::{stamps, GiveBack, ScriptNow};
#[cfg(feature = "redis")]
use crate::store::redis::script::LuaScript;

/// Both strategies' refund script, after the helpers that read and write
/// a bucket's value.
#[cfg(feature = "redis")]
pub(crate) const REFUND_LUA: &str = concat!(
    include_str!("../../lua/tat.lua"),
    include_str!("../../lua/bucket_refund.lua")
);

/// `lua/bucket_refund.lua`'s call by `script` (either strategy's): now,
/// `units` to give back (negative: to charge), the `unit` µs they were
/// charged in, the receipt's stamps (the TAT set, `given` then).
#[cfg(feature = "redis")]
pub(crate) fn refund_call(
    script: &'static LuaScript,
    now: ScriptNow,
    unit: u64,
    receipt: &Receipt,
    units: i64,
) -> GiveBack {
    let mut args = vec![now.arg().to_string(), units.to_string(), unit.to_string()];
    args.extend(stamps(receipt));
    GiveBack::Refund(script, args)
}

/// Gives back what is still in the bucket of a charge of `cost` units of
/// `unit` µs (the T the charge was made with), whose receipt `stamps` are
/// the TAT it set and the bucket's `given` then.
///
/// The charge ended at its stamp, less what refunds gave back since (they
/// moved everything charged after them earlier; a refund of the last
/// charge moves nothing and is not counted): only the part of it
/// still ahead of `now` goes back, so a late refund, or one of a charge
/// moved up by other refunds, cannot give back units that have already
/// drained. The TAT moves back by that, never before `now`, nor before the
/// start the charge was stamped with (so refunding one receipt twice gives
/// back nothing the second time while nothing was charged after it).
///
/// A receipt without `given` counts every refund in the bucket's life. A
/// bucket whose `given` is below the receipt's, or that ends before the
/// charge does, was made after it (a reset, an expiry): it holds none of
/// it.
pub(crate) fn refund(bucket: &mut Option<Bucket>, unit: u64, now: u64, stamps: &[u64], cost: u64) {
    let (&stamp, given_then) = match stamps {
        [stamp, given] => (stamp, *given),
        [stamp] => (stamp, 0),
        _ => return,
    };
    let Some(b) = bucket.as_mut().filter(|b| b.tat > now) else {
        return;
    };
    let Some(since) = b.given.checked_sub(given_then) else {
        return;
    };
    let end = stamp.saturating_sub(since);
    if end > b.tat {
        return;
    }
    let charged = cost.saturating_mul(unit);
    let back = charged.min(end.saturating_sub(now));
    let tat = b
        .tat
        .saturating_sub(back)
        .max(stamp.saturating_sub(charged))
        .max(now)
        .min(b.tat);
    // Giving back the last charge moves up nothing charged after it.
    if end < b.tat {
        b.given += b.tat - tat;
    }
    b.tat = tat;
}

/// Charges `extra` units more than the pass stamped `stamp` charged, in
/// the pass's own units of `unit` µs, without checking the limit (a
/// settle's overspend): the TAT moves `extra × T` past itself (or past
/// `now`, for a full bucket). Only while that charge would not yet have
/// drained had it come with the pass (`stamp + extra × T > now`): a settle
/// that arrives later changes nothing, as a late refund does. Whether it
/// moved.
pub(crate) fn charge(
    bucket: &mut Option<Bucket>,
    unit: u64,
    now: u64,
    stamp: u64,
    extra: u64,
) -> bool {
    let more = extra.saturating_mul(unit);
    if stamp.saturating_add(more) <= now {
        return false;
    }
    let b = bucket.get_or_insert_default();
    b.tat = b.tat.max(now).saturating_add(more);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 100_000;

    fn at(tat: u64, given: u64) -> Option<Bucket> {
        Some(Bucket { tat, given })
    }

    #[test]
    fn refunds_never_move_the_bucket_before_now_nor_touch_drained_charges() {
        let mut b = at(1_500_000, 0);
        refund(&mut b, T, 1_200_000, &[1_500_000, 0], 10);
        assert_eq!(b, at(1_200_000, 0), "only what is ahead of now");
        let mut b = at(1_500_000, 0);
        refund(&mut b, T, 1_200_000, &[1_100_000, 0], 1);
        assert_eq!(b, at(1_500_000, 0), "that charge has drained");
    }

    #[test]
    fn a_charge_partly_drained_gives_back_only_what_is_left_of_it() {
        // 3 units charged to end at 1.0 s; at 0.9 s a tenth of a second of
        // it is left, behind later charges up to 1.4 s.
        let mut b = at(1_400_000, 0);
        refund(&mut b, 250_000, 900_000, &[1_000_000, 0], 3);
        assert_eq!(b, at(1_300_000, 100_000));
    }

    #[test]
    fn a_charge_moved_up_by_an_earlier_refund_ends_that_much_sooner() {
        // Charged to end at 1.0 s when nothing had been given back; since,
        // refunds gave back 0.4 s, so it ends at 0.6 s: at 0.55 s only
        // 0.05 s of it is left, however late the bucket runs.
        let mut b = at(1_350_000, 400_000);
        refund(&mut b, 250_000, 550_000, &[1_000_000, 0], 2);
        assert_eq!(b, at(1_300_000, 450_000));
    }

    #[test]
    fn a_bucket_made_after_the_charge_gives_nothing_back() {
        let mut b = at(1_300_000, 0);
        refund(&mut b, T, 1_000_000, &[1_200_000, 50_000], 1);
        assert_eq!(b, at(1_300_000, 0), "given below the receipt's");
        let mut b = at(1_100_000, 0);
        refund(&mut b, T, 1_000_000, &[1_200_000, 0], 1);
        assert_eq!(b, at(1_100_000, 0), "the bucket ends before the charge");
    }

    #[test]
    fn refunding_one_receipt_twice_gives_back_once() {
        let mut b = at(2_000_000, 0);
        refund(&mut b, T, 1_000_000, &[2_000_000, 0], 2);
        assert_eq!(b, at(1_800_000, 0), "the last charge moves up nothing");
        refund(&mut b, T, 1_000_000, &[2_000_000, 0], 2);
        assert_eq!(b, at(1_800_000, 0));
    }

    #[test]
    fn a_late_overspend_charges_nothing() {
        let mut b = at(1_000_000, 7);
        assert!(!charge(&mut b, T, 1_500_000, 1_200_000, 2));
        assert!(charge(&mut b, T, 1_100_000, 1_200_000, 2));
        assert_eq!(b, at(1_300_000, 7), "past the TAT, given kept");
    }
}
