//! Cases for the fixed window aligned on the epoch. `T0` is a multiple of
//! 10 s and falls 20 s into a minute.

use super::*;

pub fn policy(quotas: &[Quota]) -> Policy {
    let mut p = Policy::aligned_window("daily", quotas[0]);
    for q in &quotas[1..] {
        p = p.and(*q);
    }
    p
}

/// The aligned window's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! aligned_window_rows {
    ($factory:path) => {
        $crate::conformance_rows! { aligned_window, $factory;
            // Not ten seconds after the first request: at the boundary.
            windows_end_at_multiples_of_their_length => Row::new(policy(&[quota(3, 10)]), [
                (2_500, Check("bob", 1), pass(2, 10_000)),
                (9_000, Check("bob", 1), pass(1, 10_000)),
                (9_999, Check("bob", 1), pass(0, 10_000)),
                (10_000, Check("bob", 1), pass(2, 20_000)),
            ]),

            // T0 is 20 s into a minute: its window ends 40 s later.
            a_window_joined_late_still_ends_on_the_boundary => Row::new(policy(&[quota(3, 60)]), [
                (0, Check("cy", 1), pass(2, 40_000)),
                (39_999, Check("cy", 2), pass(0, 40_000)),
                (40_000, Check("cy", 1), pass(2, 100_000)),
            ]),

            every_caller_is_told_the_same_reset => Row::new(policy(&[quota(3, 10)]), [
                (0, Check("amy", 1), pass(2, 10_000)),
                (7_000, Check("dan", 1), pass(2, 10_000)),
            ]),

            rejections_charge_nothing_and_wait_for_the_boundary => Row::new(policy(&[quota(2, 10)]), [
                (0, Check("eve", 2), pass(0, 10_000)),
                (4_000, Check("eve", 1), limited(10_000, 6_000)),
                (4_001, Check("eve", 1), limited(10_000, 5_999)),
                (10_000, Check("eve", 1), pass(1, 20_000)),
            ]),

            peek_and_cost => Row::new(policy(&[quota(3, 10)]), [
                (0, Peek("jo"), pass(3, 10_000)),
                (1, Check("jo", 2), pass(1, 10_000)),
                (2, Peek("jo"), pass(1, 10_000)),
                (3, Check("jo", 2), limited(10_000, 9_997)),
                // A count of an ended window reads as zero, expired or not.
                (10_001, Peek("jo"), pass(3, 20_000)),
            ]),

            refund_gives_back_inside_its_window_only => Row::new(policy(&[quota(2, 10)]), [
                (0, Check("kim", 1), pass(1, 10_000)),
                (1, Check("kim", 1), pass(0, 10_000)),
                (2, Refund("kim", 1), Done),
                (3, Peek("kim"), pass(1, 10_000)),
                (10_000, Check("kim", 1), pass(1, 20_000)),
                // The first window's receipt changes nothing in the second.
                (10_001, Refund("kim", 0), Done),
                (10_002, Peek("kim"), pass(1, 20_000)),
            ]),

            // 3 per second and 5 per minute; the minute ends 40 s after T0.
            several_quotas_are_all_or_nothing => Row::new(policy(&[quota(3, 1), quota(5, 60)]), [
                (0, Check("lee", 1), pass(2, 1_000)),
                (1, Check("lee", 1), pass(1, 1_000)),
                (2, Check("lee", 1), pass(0, 1_000)),
                (3, Check("lee", 1), limited(1_000, 997)),
                (1_000, Check("lee", 1), pass(1, 40_000)),
                (1_001, Check("lee", 1), pass(0, 40_000)),
                // Both reject: the minute, which frees up last, decides.
                (1_002, Check("lee", 1), limited(40_000, 38_998)),
            ])
            .then(|d| {
                assert_eq!(d[6].as_ref().unwrap().quota, 1);
                assert_eq!(d[6].as_ref().unwrap().limit, 5);
            }),

            count_above_a_lowered_limit_keeps_rejecting => Row::new(policy(&[quota(5, 10)]), [
                (0, Check("max", 5), pass(0, 10_000)),
            ])
            .then_under(policy(&[quota(3, 10)]), [
                (1, Check("max", 1), limited(10_000, 9_999)),
            ]),

            settle_charges_the_difference_or_gives_it_back => Row::new(policy(&[quota(10, 10)]), [
                (0, Check("sam", 2), pass(8, 10_000)),
                (1, Settle("sam", 0, 12), Done),
                (2, Peek("sam"), limited(10_000, 9_998)),
                (3, Settle("sam", 0, 0), Done),
                (4, Peek("sam"), pass(0, 10_000)),
                (10_000, Check("sam", 1), pass(9, 20_000)),
                (10_001, Settle("sam", 0, 7), Done),
                (10_002, Peek("sam"), pass(9, 20_000)),
            ]),
        }
    };
}
