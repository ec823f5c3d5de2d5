//! Cases for Cloudflare's sliding-window counter.
//!
//! Windows are aligned on the epoch, and `T0` is a multiple of 8 s, so
//! windows of 1, 2, 4 and 8 s start at `T0`; their weights are exact in
//! binary, which keeps the tables readable.

use super::*;

pub fn counter(quotas: &[Quota]) -> Policy {
    let mut p = Policy::sliding_window("core", quotas[0]);
    for q in &quotas[1..] {
        p = p.and(*q);
    }
    p
}

/// Sliding window's rows, each one `#[tokio::test]` per backend (see
/// `conformance_suite!`).
#[macro_export]
macro_rules! sliding_window_rows {
    ($factory:path) => {
        $crate::conformance_rows! { sliding_window, $factory;
            the_previous_window_weighs_by_its_overlap => Row::new(counter(&[quota(4, 8)]), [
                // Reset: when the estimate is back to zero, the end of the next window.
                (0, Check("bob", 1), pass(3, 16_000)),
                (1, Check("bob", 1), pass(2, 16_000)),
                (2, Check("bob", 1), pass(1, 16_000)),
                (3, Check("bob", 1), pass(0, 16_000)),
                // Full; in the next window the 4 weigh 4 × (8 − x)/8 ≤ 3 once x ≥ 2 s.
                (4, Check("bob", 1), limited(16_000, 9_996)),
                (10_000, Check("bob", 1), pass(0, 24_000)),
                // Now 1 + 4 × (8 − x)/8 ≤ 3 once x ≥ 4 s.
                (10_001, Check("bob", 1), limited(24_000, 1_999)),
                (12_000, Check("bob", 1), pass(0, 24_000)),
                // A new window: the previous 2 weigh in fully, then decay.
                (16_000, Check("bob", 1), pass(1, 32_000)),
                // Two windows later nothing counts.
                (33_000, Check("bob", 1), pass(3, 48_000)),
            ]),

            peek_and_cost => Row::new(counter(&[quota(10, 8)]), [
                (0, Peek("fay"), pass(10, 0)),
                (0, Check("fay", 4), pass(6, 16_000)),
                // 4 + 7 > 10: next window, once 4 × (8 − x)/8 ≤ 3, at x = 2 s.
                (1, Check("fay", 7), limited(16_000, 9_999)),
                // More than the limit never fits; both windows are clear at 16 s.
                (2, Check("fay", 11), limited(16_000, 15_998)),
                (3, Peek("fay"), pass(6, 16_000)),
                (4, Check("fay", 6), pass(0, 16_000)),
            ]),

            // 2 per second and 4 per 8 s.
            several_quotas_are_all_or_nothing => Row::new(counter(&[quota(2, 1), quota(4, 8)]), [
                (0, Check("lee", 1), pass(1, 2_000)),
                (1, Check("lee", 1), pass(0, 2_000)),
                // Only the per-second quota rejects: 2 × (1 − x)/1 ≤ 1 at x = 0.5 s.
                (2, Check("lee", 1), limited(2_000, 1_498)),
                (1_500, Check("lee", 1), pass(0, 3_000)),
                // The per-second quota rejects (0.5 > 0 left) until its window ends.
                (1_750, Check("lee", 1), limited(3_000, 250)),
                // Had the rejection at 1.75 s charged the 8 s quota, this would fail.
                (2_000, Check("lee", 1), pass(0, 4_000)),
                // Both reject; the 8 s quota lets it through last (at 10 s), so it
                // is reported.
                (2_001, Check("lee", 1), limited(16_000, 7_999)),
                (3_000, Check("lee", 1), limited(16_000, 7_000)),
                (10_000, Check("lee", 1), pass(0, 24_000)),
            ])
            .then(|d| {
                assert_eq!(d[2].as_ref().unwrap().quota, 0);
                assert_eq!(d[6].as_ref().unwrap().quota, 1);
                assert_eq!(d[8].as_ref().unwrap().quota, 1);
            }),

            refund_goes_back_to_the_charged_window => Row::new(counter(&[quota(2, 1)]), [
                (0, Check("kim", 1), pass(1, 2_000)),
                (1, Check("kim", 1), pass(0, 2_000)),
                (2, Refund("kim", 1), Done),
                (3, Peek("kim"), pass(1, 2_000)),
                (4, Check("kim", 1), pass(0, 2_000)),
                // Still the stored current window: its count goes down.
                (1_000, Refund("kim", 4), Done),
                // One unit left from the window before, weighing 0.999: 1 counted.
                (1_001, Peek("kim"), pass(1, 2_000)),
                (1_002, Check("kim", 1), pass(0, 3_000)),
                // The window of step 0 is now the previous one: it goes down there.
                (1_003, Refund("kim", 0), Done),
                (1_004, Peek("kim"), pass(1, 3_000)),
            ]),

            count_above_a_lowered_limit_keeps_rejecting => Row::new(counter(&[quota(5, 8)]), [
                (0, Check("max", 5), pass(0, 16_000)),
            ])
            .then_under(counter(&[quota(3, 8)]), [
                // Next window: 5 × (8 − x)/8 ≤ 2 once x ≥ 4.8 s.
                (1, Check("max", 1), limited(16_000, 12_799)),
                (2, Check("max", 1), limited(16_000, 12_798)),
            ]),

            // Settled to the window the request was charged in, current or, once
            // the window turned, previous.
            settle_charges_the_difference_or_gives_it_back => Row::new(counter(&[quota(10, 8)]), [
                (0, Check("sam", 2), pass(8, 16_000)),
                (1, Settle("sam", 0, 5), Done),
                (2, Peek("sam"), pass(5, 16_000)),
                (3, Check("sam", 2), pass(3, 16_000)),
                (4, Settle("sam", 3, 0), Done),
                (5, Peek("sam"), pass(5, 16_000)),
                (6, Check("sam", 1), pass(4, 16_000)),
                // The previous 6 weigh in fully at the start of the next window.
                (8_000, Check("sam", 1), pass(3, 24_000)),
                (8_000, Settle("sam", 6, 3), Done),
                (8_000, Peek("sam"), pass(1, 24_000)),
                // Nothing in the current window: the estimate is zero when it ends.
                (8_000, Settle("sam", 7, 0), Done),
                (8_000, Peek("sam"), pass(2, 16_000)),
            ]),
        }
    };
}
