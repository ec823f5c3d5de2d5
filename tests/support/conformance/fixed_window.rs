//! Cases for GitHub's fixed window.

use super::*;

pub fn policy(quotas: &[Quota]) -> Policy {
    let mut p = Policy::fixed_window("core", quotas[0]);
    for q in &quotas[1..] {
        p = p.and(*q);
    }
    p
}

/// Fixed window's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! fixed_window_rows {
    ($factory:path) => {
        $crate::conformance_rows! { fixed_window, $factory;
            window_opens_counts_down_and_rejects => Row::new(policy(&[quota(3, 10)]), [
                (0, Check("bob", 1), pass(2, 10_000)),
                (1_000, Check("bob", 1), pass(1, 10_000)),
                (2_500, Check("bob", 1), pass(0, 10_000)),
                (3_000, Check("bob", 1), limited(10_000, 7_000)),
                (9_999, Check("bob", 1), limited(10_000, 1)),
            ]),

            // Every response of one window names the same end, whenever it comes.
            reset_at_is_stored_not_recomputed => Row::new(
                policy(&[quota(10, 60)]),
                (0..5).map(|i| (i * 1_777, Check("carol", 1), pass(9 - i, 60_000))),
            ),

            window_rolls_over_at_its_stored_end => Row::new(policy(&[quota(2, 10)]), [
                (0, Check("dan", 1), pass(1, 10_000)),
                (5_000, Check("dan", 1), pass(0, 10_000)),
                (9_999, Check("dan", 1), limited(10_000, 1)),
                // The stored end has passed: a new window opens at this request.
                (10_000, Check("dan", 1), pass(1, 20_000)),
                (25_000, Check("dan", 1), pass(1, 35_000)),
            ]),

            rejections_charge_nothing => Row::new(policy(&[quota(2, 10)]), [
                (0, Check("eve", 2), pass(0, 10_000)),
                (1, Check("eve", 1), limited(10_000, 9_999)),
                (2, Check("eve", 1), limited(10_000, 9_998)),
                (10_000, Check("eve", 1), pass(1, 20_000)),
            ]),

            cost_counts_and_cost_above_limit_is_rejected => Row::new(policy(&[quota(10, 10)]), [
                (0, Check("fay", 4), pass(6, 10_000)),
                (1, Check("fay", 7), limited(10_000, 9_999)),
                (2, Check("fay", 6), pass(0, 10_000)),
                (3, Check("gus", 11), limited(10_003, 10_000)),
            ]),

            keys_are_independent => Row::new(policy(&[quota(1, 10)]), [
                (0, Check("hal", 1), pass(0, 10_000)),
                (1, Check("hal", 1), limited(10_000, 9_999)),
                (2, Check("ida", 1), pass(0, 10_002)),
            ]),

            peek_reports_without_charging => Row::new(policy(&[quota(3, 10)]), [
                (0, Peek("jo"), pass(3, 10_000)),
                (1, Check("jo", 1), pass(2, 10_001)),
                (2, Peek("jo"), pass(2, 10_001)),
                (3, Peek("jo"), pass(2, 10_001)),
                (4, Check("jo", 1), pass(1, 10_001)),
                // A window whose stored end is past reads as empty, never exhausted
                // (replicas keep such keys until the primary expires them).
                (10_001, Peek("jo"), pass(3, 20_001)),
            ]),

            refund_gives_back_inside_the_window_only => Row::new(policy(&[quota(2, 10)]), [
                (0, Check("kim", 1), pass(1, 10_000)),
                (1, Check("kim", 1), pass(0, 10_000)),
                (2, Refund("kim", 1), Done),
                (3, Peek("kim"), pass(1, 10_000)),
                // Refunding the same receipt again never lifts Remaining above what
                // was really spent; refunding twice leaves zero spent, not less.
                (4, Refund("kim", 0), Done),
                (5, Refund("kim", 0), Done),
                (6, Peek("kim"), pass(2, 10_000)),
                (7, Check("kim", 1), pass(1, 10_000)),
                // A new window: the old window's receipt changes nothing.
                (10_000, Check("kim", 1), pass(1, 20_000)),
                (10_001, Refund("kim", 7), Done),
                (10_002, Peek("kim"), pass(1, 20_000)),
            ]),

            // 3 per second and 5 per minute: the minute quota runs out first.
            several_quotas_are_all_or_nothing => Row::new(policy(&[quota(3, 1), quota(5, 60)]), [
                (0, Check("lee", 1), pass(2, 1_000)),
                (1, Check("lee", 1), pass(1, 1_000)),
                (2, Check("lee", 1), pass(0, 1_000)),
                (3, Check("lee", 1), limited(1_000, 997)),
                // The minute quota (2 left) is now the tightest and is reported.
                (1_000, Check("lee", 1), pass(1, 60_000)),
                (1_001, Check("lee", 1), pass(0, 60_000)),
                // Both reject: the one that frees up last decides Retry-After, and
                // the per-second window is not charged by the rejection.
                (1_002, Check("lee", 1), limited(60_000, 58_998)),
            ])
            .then(|d| {
                assert_eq!(d[6].as_ref().unwrap().quota, 1);
                assert_eq!(d[6].as_ref().unwrap().limit, 5);
            }),

            // Regression (published scripts test `count == limit`): once a count
            // is above the limit, for instance after the limit was lowered, every
            // request must still be rejected.
            count_above_a_lowered_limit_keeps_rejecting => Row::new(policy(&[quota(5, 10)]), [
                (0, Check("max", 5), pass(0, 10_000)),
            ])
            .then_under(policy(&[quota(3, 10)]), [
                (1, Check("max", 1), limited(10_000, 9_999)),
                (2, Check("max", 1), limited(10_000, 9_998)),
            ]),

            // A request's real cost, known from its response: the difference is
            // charged (unchecked: the units were spent) or given back, to the
            // window the request was charged in and no other.
            settle_charges_the_difference_or_gives_it_back => Row::new(policy(&[quota(10, 10)]), [
                (0, Check("sam", 2), pass(8, 10_000)),
                (1, Settle("sam", 0, 5), Done),
                (2, Peek("sam"), pass(5, 10_000)),
                (3, Check("sam", 1), pass(4, 10_000)),
                (4, Settle("sam", 3, 0), Done),
                (5, Peek("sam"), pass(5, 10_000)),
                (6, Check("sam", 1), pass(4, 10_000)),
                // Overspent: 25 of 10. Remaining shows 0, and the caller is
                // refused until the window ends.
                (7, Settle("sam", 6, 20), Done),
                (8, Peek("sam"), limited(10_000, 9_992)),
                (9, Check("sam", 1), limited(10_000, 9_991)),
                // Regression (proptest): a rejection's receipt names no window;
                // settling it charges nothing, and no script errs.
                (10, Settle("sam", 9, 5), Done),
                (10_000, Check("sam", 1), pass(9, 20_000)),
                // A settle for the window that ended changes nothing now.
                (10_001, Settle("sam", 6, 50), Done),
                (10_002, Settle("sam", 0, 0), Done),
                (10_003, Peek("sam"), pass(9, 20_000)),
            ]),

            settle_moves_every_quota_it_charged => Row::new(policy(&[quota(5, 1), quota(10, 60)]), [
                (0, Check("tia", 1), pass(4, 1_000)),
                (1, Settle("tia", 0, 4), Done),
                (2, Peek("tia"), pass(1, 1_000)),
                // The second is over; the minute still counts the 4.
                (1_000, Peek("tia"), pass(5, 2_000)),
                (1_001, Check("tia", 1), pass(4, 2_001)),
                (2_001, Check("tia", 5), pass(0, 3_001)),
                (2_002, Check("tia", 1), limited(60_000, 57_998)),
            ]),
        }
    };
}
